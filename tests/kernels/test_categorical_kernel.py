"""esper::masked_categorical (fused Triton log-prob + normalized entropy + k3, with a fused backward)
against the core reference and the core's autograd: shapes, masks with 0/1/all legal choices,
half-precision logits, strided logits, gradients, the op under torch.compile(fullgraph=True), and the
core fallback."""

from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import esper.kernels as K
from esper.core import distributions as D
from tests.kernels.conftest import DEVICE

categorical = importlib.import_module("esper.kernels.categorical")


def head(batch, n, *, seed=0, dtype=torch.float32, p_legal=0.6, scale=1.0, masked=True, device=DEVICE):
    """Logits, a mask with some all-illegal and single-legal rows, a legal action, an old log-prob."""
    g = torch.Generator().manual_seed(seed)
    logits = (scale * torch.randn(*batch, n, generator=g, dtype=torch.float64)).to(dtype)
    mask = None
    if masked:
        mask = torch.rand(*batch, n, generator=g) < p_legal
        flat = mask.view(-1, n)
        if flat.shape[0] > 2:
            flat[0] = False  # all illegal (finite, meaningless; the shell rejects such rows)
            flat[1] = False
            flat[1, n - 1] = True  # exactly one legal choice
        if flat.shape[0] > 3:
            flat[2] = True  # all legal
    scores = torch.rand(*batch, n, generator=g)
    if mask is not None:
        scores = torch.where(mask, scores + 1.0, scores)  # prefer a legal action where there is one
    action = scores.argmax(-1)
    old = D.log_prob(logits, action, mask).float() + 0.3 * torch.randn(*batch, generator=g)
    to = lambda x: None if x is None else x.to(device)
    return to(logits), to(action), to(mask), to(old)


def tols(dtype):
    if dtype == torch.float64:
        return dict(rtol=1e-12, atol=1e-12)
    if dtype == torch.float32:
        return dict(rtol=2e-5, atol=2e-5)
    return dict(rtol=2e-2, atol=1e-3)  # half-precision gradients: one rounding apart


def check_forward(logits, action, mask, old):
    ours = K.masked_categorical(logits, action, mask, old)
    ref = D.masked_categorical(logits, action, mask, old)
    for name, a, b in zip(("log_prob", "entropy", "k3"), ours, ref):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, **tols(a.dtype), msg=lambda m, name=name: f"{name}: {m}")
    return ours


def grads(fn, logits, action, mask, old, weights):
    x = logits.detach().clone().requires_grad_()
    o = old.detach().clone().requires_grad_()
    lp, ent, kl = fn(x, action, mask, o)
    ((lp * weights[0]).sum() + (ent * weights[1]).sum() + (kl * weights[2]).sum()).backward()
    return x.grad, o.grad


def check_grads(logits, action, mask, old, seed=0):
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(action.shape, generator=g).to(logits.device) for _ in range(3)]
    ours = grads(K.masked_categorical, logits, action, mask, old, weights)
    ref = grads(D.masked_categorical, logits, action, mask, old, weights)
    for name, a, b in zip(("logits", "old_log_prob"), ours, ref):
        assert a.dtype == b.dtype and torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, **tols(a.dtype), msg=lambda m, name=name: f"grad {name}: {m}")


# ----------------------------------------------------------------------------------------- forward
SHAPES = [((7,), 1), ((5,), 2), ((4, 25), 6), ((3, 5), 13), ((9,), 17), ((1,), 3)]


@pytest.mark.parametrize(("batch", "n"), SHAPES)
@pytest.mark.parametrize("masked", [True, False])
def test_forward_matches_core(triton_path, batch, n, masked):
    check_forward(*head(batch, n, seed=n, masked=masked))


def test_forward_float64(triton_path):
    check_forward(*head((6, 4), 7, seed=2, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_forward_upcasts_half_logits(triton_path, dtype):
    lp, _, _ = check_forward(*head((5, 6), 9, seed=3, dtype=dtype))
    assert lp.dtype == torch.float32


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    E=st.integers(1, 6),
    T=st.integers(1, 9),
    n=st.integers(1, 20),
    p_legal=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    scale=st.sampled_from([1.0, 30.0]),
    seed=st.integers(0, 1000),
)
def test_forward_and_grads_hypothesis(triton_path, E, T, n, p_legal, dtype, scale, seed):
    args = head((E, T), n, seed=seed, dtype=dtype, p_legal=p_legal, scale=scale)
    check_forward(*args)
    check_grads(*args, seed=seed)


def test_entropy_zero_with_at_most_one_legal_choice_and_never_nan(triton_path):
    logits, action, mask, old = head((8,), 5, seed=4, scale=1e4)
    mask[3:] = False
    mask[4:, 2] = True
    action[4:] = 2
    old = D.log_prob(logits, action, mask) - 0.1
    lp, ent, _ = check_forward(logits, action, mask, old)
    assert (ent[:5] == 0).all() and (lp[4:] == 0).all()
    g = grads(K.masked_categorical, logits, action, mask, old, [torch.ones_like(old)] * 3)[0]
    assert torch.isfinite(g).all() and (g[:2] == 0).all() and (g[4:] == 0).all()


def test_strided_logits_slice_of_a_wider_head_block(triton_path):
    """Per-head logits are usually slices of one [.., sum(n)] output: no copy, same results."""
    logits, action, mask, old = head((4, 6), 19, seed=5)
    wide = torch.cat([torch.randn(4, 6, 3, device=DEVICE), logits, torch.randn(4, 6, 2, device=DEVICE)], -1)
    sliced = wide[..., 3:22]
    assert not sliced.is_contiguous()
    check_forward(sliced, action, mask, old)
    check_grads(sliced, action, mask, old)


def test_errors_on_mismatched_shapes(triton_path):
    logits, action, mask, old = head((3, 4), 5)
    with pytest.raises(ValueError, match="action"):
        K.masked_categorical(logits, action[:, :3], mask, old)
    with pytest.raises(ValueError, match="mask"):
        K.masked_categorical(logits, action, mask[..., :4], old)
    with pytest.raises(ValueError, match="old_log_prob"):
        K.masked_categorical(logits, action, mask, old.unsqueeze(-1))


# ---------------------------------------------------------------------------------------- backward
@pytest.mark.parametrize(("batch", "n", "masked"), [((3, 7), 5, True), ((6,), 1, True), ((2, 4), 11, False)])
def test_grads_match_core_autograd(triton_path, batch, n, masked):
    check_grads(*head(batch, n, seed=6, masked=masked))


def test_grads_float64_gradcheck_scale(triton_path):
    check_grads(*head((5, 3), 8, seed=7, dtype=torch.float64))


def test_cpu_backward_formula_matches_core_autograd():
    """The torch-ops backward (the op's CPU kernel and the Triton backward's spec)."""
    logits, action, mask, old = head((4, 5), 7, seed=8, device="cpu")
    g = torch.Generator().manual_seed(1)
    w = [torch.randn(action.shape, generator=g) for _ in range(3)]
    ours = grads(categorical.masked_categorical_op, logits, action, mask, old, w)
    ref = grads(D.masked_categorical, logits, action, mask, old, w)
    torch.testing.assert_close(ours, ref, rtol=2e-5, atol=2e-5)


# ----------------------------------------------------------------------------------------- compile
def _loss(logits, action, mask, old):
    lp, ent, kl = K.masked_categorical(logits, action, mask, old)
    return lp.exp().mean() - 0.01 * ent.mean() + kl.mean()


@pytest.mark.parametrize("masked", [True, False])
def test_op_compiles_fullgraph_forward_and_backward(triton_path, compile_check, masked):
    """Fake impls of both ops: no graph break in the forward or in the AOT-traced backward."""
    logits, action, mask, old = head((3, 8), 6, seed=9, masked=masked)
    compile_check(K.masked_categorical, logits, action, mask, old, rtol=2e-5, atol=2e-5)
    eager_x = logits.clone().requires_grad_()
    _loss(eager_x, action, mask, old).backward()
    torch._dynamo.reset()
    comp_x = logits.clone().requires_grad_()
    torch.compile(_loss, fullgraph=True, backend="aot_eager")(comp_x, action, mask, old).backward()
    torch.testing.assert_close(comp_x.grad, eager_x.grad, rtol=2e-5, atol=2e-5)
    ref_x = logits.clone().requires_grad_()
    lp, ent, kl = D.masked_categorical(ref_x, action, mask, old)
    (lp.exp().mean() - 0.01 * ent.mean() + kl.mean()).backward()
    torch.testing.assert_close(comp_x.grad, ref_x.grad, rtol=2e-5, atol=2e-5)


def test_op_compiles_fullgraph_core_path(compile_check):
    logits, action, mask, old = head((3, 4), 5, seed=10, device="cpu")
    fn = lambda *a: torch.ops.esper.masked_categorical(*a)
    out = compile_check(fn, logits, action, mask, old)
    torch.testing.assert_close(out, D.masked_categorical(logits, action, mask, old))


# ---------------------------------------------------------------------------------------- fallback
def test_cpu_without_hook_is_the_core():
    logits, action, mask, old = head((3, 4), 5, seed=11, device="cpu")
    ours = K.masked_categorical(logits, action, mask, old)
    torch.testing.assert_close(ours, D.masked_categorical(logits, action, mask, old), rtol=0, atol=0)


def test_wide_heads_fall_back_to_the_core(triton_path, monkeypatch):
    from esper.kernels import _triton

    monkeypatch.setattr(categorical, "MAX_KERNEL_CHOICES", 4)
    monkeypatch.setattr(_triton, "masked_categorical", None)  # would fail if called
    check_forward(*head((3, 2), 5, seed=12))


def test_kernel_path_is_taken(triton_path, monkeypatch):
    """Guard against a silently untested kernel: with the fixture, the Triton launchers do run."""
    from esper.kernels import _triton

    calls = []
    for name in ("masked_categorical", "masked_categorical_backward", "gae"):
        real = getattr(_triton, name)
        spy = lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a)
        monkeypatch.setattr(_triton, name, spy)
    logits, action, mask, old = head((2, 3), 4)
    logits.requires_grad_()
    sum(K.masked_categorical(logits, action, mask, old)).sum().backward()
    r = torch.randn(2, 5, device=DEVICE)
    K.gae_tensors(r, r, r, r > 0, r > 1, gamma=0.9, lmbda=0.9)
    assert calls == ["masked_categorical", "masked_categorical_backward", "gae"]


@pytest.mark.inductor
def test_op_under_inductor_with_strided_logits(triton_path):
    """Inductor asserts the sizes and strides the fake impl promised on the real outputs."""
    logits, action, mask, old = head((4, 6), 7, seed=13)
    wide = torch.cat([logits, torch.randn(4, 6, 3, device=DEVICE)], -1)
    torch._dynamo.reset()
    x = wide.clone().requires_grad_()
    loss = torch.compile(lambda x: _loss(x[..., :7], action, mask, old), fullgraph=True, backend="inductor")(
        x
    )
    loss.backward()
    ref_x = wide.clone().requires_grad_()
    _loss(ref_x[..., :7], action, mask, old).backward()
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=2e-5, atol=2e-5)


def test_ppo_loss_through_the_kernel_equals_the_core(triton_path):
    """What the trainer does on CUDA: ``ppo_loss(..., categorical=esper.kernels.masked_categorical)``
    gives the core's losses and gradients."""
    from esper.core.loss import ppo_loss, total_loss
    from tests.core.test_loss import factored_batch

    results = []
    for fn in (D.masked_categorical, K.masked_categorical):
        td = factored_batch(3, 5, seed=9).to(triton_path)
        leaves = [td["current", h, "logits"] for h in td["current"].keys() if h != "state_value"]
        losses = ppo_loss(td, factored=True, categorical=fn)
        grads = torch.autograd.grad(total_loss(losses), leaves)
        results.append((losses.detach(), grads))
    (core_losses, core_grads), (kernel_losses, kernel_grads) = results
    for k in core_losses.keys(True, True):
        torch.testing.assert_close(kernel_losses[k], core_losses[k], rtol=1e-5, atol=1e-6, msg=str(k))
    for a, b in zip(kernel_grads, core_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
