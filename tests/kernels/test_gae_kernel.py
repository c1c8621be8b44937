"""esper::gae (fused Triton GAE) against the core reference: shapes (T=1, one env, non-powers of 2,
several time chunks), dtypes, done/terminated patterns, the TensorDict entry, the op under
torch.compile(fullgraph=True), and the core fallback (CPU, inputs that need a gradient)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import esper.kernels as K
from esper.core.advantage import gae as core_gae
from esper.core.advantage import gae_tensors as core_gae_tensors
from tests.core.test_advantage import make_td, ref_gae
from tests.kernels.conftest import DEVICE


def rollout(batch, T, *, p_term=0.15, p_trunc=0.15, seed=0, dtype=torch.float32, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    shape = (*batch, T)
    r, v, nv = (torch.randn(shape, generator=g, dtype=torch.float64).to(dtype) for _ in range(3))
    term = torch.rand(shape, generator=g) < p_term
    trunc = (torch.rand(shape, generator=g) < p_trunc) & ~term
    return tuple(x.to(device) for x in (r, v, nv, term | trunc, term))


def tol(dtype):
    return {
        torch.float64: dict(rtol=1e-12, atol=1e-12),
        torch.float32: dict(rtol=1e-5, atol=2e-5),
    }.get(dtype, dict(rtol=2e-2, atol=2e-2))


def check_against_core(r, v, nv, done, term, gamma=0.99, lmbda=0.95):
    adv, tgt = K.gae_tensors(r, v, nv, done, term, gamma=gamma, lmbda=lmbda)
    ref_adv, ref_tgt = core_gae_tensors(r, v, nv, done, term, gamma=gamma, lmbda=lmbda)
    assert adv.dtype == ref_adv.dtype and adv.shape == ref_adv.shape and adv.device == r.device
    torch.testing.assert_close(adv, ref_adv, **tol(adv.dtype))
    torch.testing.assert_close(tgt, ref_tgt, **tol(adv.dtype))
    return adv, tgt


# ------------------------------------------------------------------------------------------ kernel
@pytest.mark.parametrize(
    ("batch", "T"),
    [((1,), 1), ((7,), 1), ((1,), 25), ((5,), 17), ((2, 3), 33), ((37,), 70), ((), 9), ((40,), 32)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_matches_core(triton_path, batch, T, dtype):
    check_against_core(*rollout(batch, T, seed=T, dtype=dtype))


def test_kernel_matches_slow_reference(triton_path):
    r, v, nv, done, term = rollout((6,), 45, seed=3, dtype=torch.float64)
    adv, tgt = K.gae_tensors(r, v, nv, done, term, gamma=0.97, lmbda=0.9)
    ref_adv, ref_tgt = ref_gae(*(x.cpu() for x in (r, v, nv, done, term)), 0.97, 0.9)
    torch.testing.assert_close(adv.cpu(), ref_adv, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tgt.cpu(), ref_tgt, rtol=1e-12, atol=1e-12)


@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    E=st.integers(1, 9),
    T=st.integers(1, 70),
    p_term=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
    p_trunc=st.sampled_from([0.0, 0.2, 1.0]),
    gamma=st.sampled_from([0.0, 0.5, 0.99, 1.0]),
    lmbda=st.sampled_from([0.0, 0.95, 1.0]),
    seed=st.integers(0, 1000),
)
def test_kernel_matches_core_hypothesis(triton_path, E, T, p_term, p_trunc, gamma, lmbda, seed):
    check_against_core(*rollout((E,), T, p_term=p_term, p_trunc=p_trunc, seed=seed), gamma=gamma, lmbda=lmbda)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_half_inputs(triton_path, dtype):
    adv, _ = check_against_core(*rollout((6,), 21, seed=5, dtype=dtype))
    assert adv.dtype == dtype


def test_kernel_mixed_dtypes_promote(triton_path):
    r, v, nv, done, term = rollout((4,), 12, seed=6)
    adv, _ = check_against_core(r.to(torch.bfloat16), v, nv.to(torch.float16), done, term)
    assert adv.dtype == torch.float32


def test_kernel_non_contiguous_and_empty(triton_path):
    r, v, nv, done, term = rollout((11,), 8, seed=7)
    check_against_core(*(x.t().contiguous().t() for x in (r, v, nv, done, term)))  # same layout
    tr = [x.t().contiguous() for x in (r, v, nv, done, term)]  # [T, E] storage, read as [E, T]
    check_against_core(*(x.t() for x in tr))
    empty = [x[:0] for x in (r, v, nv, done, term)]
    adv, tgt = K.gae_tensors(*empty, gamma=0.9, lmbda=0.9)
    assert adv.shape == (0, 8) and tgt.shape == (0, 8)


def test_td_entry_matches_core(triton_path):
    for drop_done in (False, True):
        td = make_td((3, 2), 19, seed=8).to(DEVICE)
        if drop_done:
            del td["next", "done"]
        ours = K.gae(td.clone(), gamma=0.98, lmbda=0.9)
        ref = core_gae(td.clone(), gamma=0.98, lmbda=0.9)
        assert ours["advantage"].shape == ref["advantage"].shape == (3, 2, 19, 1)
        torch.testing.assert_close(ours["advantage"], ref["advantage"], rtol=1e-5, atol=2e-5)
        torch.testing.assert_close(ours["value_target"], ref["value_target"], rtol=1e-5, atol=2e-5)


def test_errors_match_core(triton_path):
    r, v, nv, done, term = rollout((3,), 5)
    with pytest.raises(ValueError, match="gamma"):
        K.gae_tensors(r, v, nv, done, term, gamma=1.5, lmbda=0.9)
    with pytest.raises(ValueError, match="shape"):
        K.gae_tensors(r, v[:, :4], nv, done, term, gamma=0.9, lmbda=0.9)
    with pytest.raises(TypeError, match="bool"):
        K.gae_tensors(r, v, nv, done.float(), term, gamma=0.9, lmbda=0.9)
    td = make_td((2,), 4).to(DEVICE)
    del td["next", "done"], td["next", "truncated"]
    with pytest.raises(KeyError) as ours:
        K.gae(td.clone(), gamma=0.9, lmbda=0.9)
    with pytest.raises(KeyError) as ref:
        core_gae(td.clone(), gamma=0.9, lmbda=0.9)
    assert str(ours.value) == str(ref.value)


# --------------------------------------------------------------------------------------- compile
def test_op_compiles_fullgraph_kernel_path(triton_path, compile_check):
    """The fake impl lets dynamo/AOT trace the op: no graph break, and the kernel's result."""
    r, v, nv, done, term = rollout((4,), 23, seed=9)
    fn = lambda r, v, nv, d, t: K.gae_tensors(r, v, nv, d, t, gamma=0.99, lmbda=0.95)
    adv, _ = compile_check(fn, r, v, nv, done, term, rtol=1e-5, atol=2e-5)
    ref_adv, _ = core_gae_tensors(r, v, nv, done, term, gamma=0.99, lmbda=0.95)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-5, atol=2e-5)
    td = make_td((3,), 10, seed=10).to(DEVICE)
    compile_check(lambda td: K.gae(td, gamma=0.99, lmbda=0.95), td, rtol=1e-5, atol=2e-5)


def test_op_compiles_fullgraph_core_path(compile_check):
    """Without Triton in the way (CPU kernel = core), the registered op still traces and matches."""
    r, v, nv, done, term = rollout((3,), 11, seed=11, device="cpu")
    fn = lambda r, v, nv, d, t: torch.ops.esper.gae(r, v, nv, d, t, 0.9, 0.8)
    adv, _ = compile_check(fn, r, v, nv, done, term)
    torch.testing.assert_close(adv, core_gae_tensors(r, v, nv, done, term, gamma=0.9, lmbda=0.8)[0])


def test_op_fake_checks_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        r, d = torch.empty(4, 6, dtype=torch.bfloat16), torch.empty(4, 6, dtype=torch.bool)
        adv, _ = torch.ops.esper.gae(r, r.float(), r, d, d, 0.9, 0.9)
        assert adv.shape == (4, 6) and adv.dtype == torch.float32
        with pytest.raises(ValueError, match="shape"):
            torch.ops.esper.gae(r, r[:, :5], r, d, d, 0.9, 0.9)


# ------------------------------------------------------------------------------------- fallback
def test_grad_inputs_use_the_differentiable_core(triton_path):
    r, v, nv, done, term = rollout((3,), 7, seed=12)
    v = v.clone().requires_grad_()
    adv, _ = K.gae_tensors(r, v, nv, done, term, gamma=0.9, lmbda=0.9)
    adv.sum().backward()
    assert v.grad is not None and torch.isfinite(v.grad).all()


def test_cpu_without_hook_is_the_core():
    r, v, nv, done, term = rollout((3,), 7, seed=13, device="cpu")
    ours = K.gae_tensors(r, v, nv, done, term, gamma=0.9, lmbda=0.9)
    ref = core_gae_tensors(r, v, nv, done, term, gamma=0.9, lmbda=0.9)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    torch.testing.assert_close(torch.ops.esper.gae(r, v, nv, done, term, 0.9, 0.9), ref, rtol=0, atol=0)


@pytest.mark.inductor
def test_op_under_inductor_with_strided_inputs(triton_path):
    """Inductor asserts the sizes and strides the fake impl promised on the real outputs."""
    r, v, nv, done, term = (x.t().contiguous().t() for x in rollout((5,), 13, seed=14))  # [E, T] col-major
    torch._dynamo.reset()
    fn = lambda *a: K.gae_tensors(*a, gamma=0.97, lmbda=0.9)
    adv, tgt = torch.compile(fn, fullgraph=True, backend="inductor")(r, v, nv, done, term)
    ref_adv, ref_tgt = core_gae_tensors(r, v, nv, done, term, gamma=0.97, lmbda=0.9)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(tgt, ref_tgt, rtol=1e-5, atol=2e-5)
