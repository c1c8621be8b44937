"""Gradient-informed seeds (``lifecycle.grad_init``, :mod:`esper.shell.host.gradinit`): the slot statistics
against a direct autograd computation on a tiny host, the seed's projection against the what-if loss's own
gradient, what the init changes (the projection, nothing else) and what it leaves (the host's output at
alpha 0, training when the option is off), and the per-env and batched paths together."""

from __future__ import annotations

import math

import pytest
import torch

from esper.core.spec import Stage, Style
from esper.shell.env.config import EnvConfig
from esper.shell.host.bank import PerEnvHosts
from esper.shell.host.batched import BatchedHosts
from esper.shell.host.blueprints import BLUEPRINTS, FINAL_INIT_SCALE, build_blueprint
from esper.shell.host.gradinit import (
    GRAD_GAIN_KEYS,
    SlotStats,
    init_projection,
    init_scale_norm,
    projection,
    projection_gradient,
)
from esper.shell.host.hosts import CNN1dHost, TransformerHost
from esper.shell.host.model import EnvModel

BP = {n: i for i, n in enumerate(BLUEPRINTS["cnn1d"])}


def _batches(n: int = 3, seed: int = 0, size: int = 12):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 1, 16, generator=g), torch.randint(0, 10, (size,), generator=g))
            for _ in range(n)]  # fmt: skip


def _model(lr: float = 0.05) -> EnvModel:
    torch.manual_seed(0)
    host = CNN1dHost(1, 16, channels=(4, 4, 4), kernels=(3, 1, 1), pools=(2, 1, 1))
    return EnvModel(host, host_lr=lr, seed_lr=lr)


def _frozen() -> EnvModel:
    """A host whose training steps change nothing (learning rates 0): statistics and direct recomputation
    see the same weights."""
    m = _model()
    m.set_lr_scale(0.0)
    return m


def _direct_linear_gradient(host, batch, slot: int) -> torch.Tensor:
    """dL/dW at W = 0 for a linear residual seed ``y = h + W h`` (a 1x1 convolution) added at ``slot``,
    by autograd on the host's own forward (train mode)."""
    C = host.slot(slot).width
    W = torch.zeros(C, C, requires_grad=True)
    add = lambda mod, args, out: out + torch.einsum("dc,ncl->ndl", W, args[0])
    handle = host.slot(slot).register_forward_hook(add)
    try:
        loss, _, _ = host.loss_and_correct(batch)
        (grad,) = torch.autograd.grad(loss, [W])
    finally:
        handle.remove()
    return grad


def test_slot_statistics_match_a_direct_autograd_computation():
    m, data = _frozen(), _batches(4)
    out = m.train_epoch(data, record=2)
    stats = m.slot_stats
    for s in range(3):
        pairs = stats.slot_pairs(s)
        assert len(pairs) == 2  # the epoch's last two batches
        # the pair is the slot's input and the gradient of the batch's mean loss at the slot's output
        for (h, g), batch in zip(pairs, data[-2:]):
            kept: list[torch.Tensor] = []
            keep = lambda mod, args, o, kept=kept: kept.append(o) or o.retain_grad()
            handle = m.host.slot(s).register_forward_hook(keep)
            loss, _, _ = m.host.loss_and_correct(batch)
            loss.backward()
            handle.remove()
            torch.testing.assert_close(h, kept[0].detach())
            torch.testing.assert_close(g, kept[0].grad)
        direct = sum(_direct_linear_gradient(m.host, b, s) for b in data[-2:]) / 2
        torch.testing.assert_close(stats.cross_covariance(s), direct, rtol=1e-4, atol=1e-6)
        assert out["grad_gain"][s] == pytest.approx(float(direct.norm()), rel=1e-4)
        assert out["grad_gain_rms"][s] == pytest.approx(float(direct.norm()) / 4, rel=1e-4)


def test_recording_leaves_training_exactly_as_it_was():
    a, b, data = _model(), _model(), _batches(3)
    for m in (a, b):
        torch.manual_seed(1)
        m.germinate(0, BP["conv_light"], Style.LINEAR_ADD)
    a.host.set_slot(0, alpha=0.0, stage=Stage.TRAINING)
    b.host.set_slot(0, alpha=0.0, stage=Stage.TRAINING)
    ra, rb = a.train_epoch(data), b.train_epoch(data, record=2)
    assert set(rb) == set(ra) | set(GRAD_GAIN_KEYS) and a.slot_stats is None
    for k in ra:
        assert torch.equal(ra[k], rb[k]), k
    for (n, p), q in zip(a.host.named_parameters(), b.host.parameters()):
        assert torch.equal(p, q), n
    assert not any(s._forward_hooks for s in b.host.slots)  # the hooks are gone after the epoch


@pytest.mark.parametrize(("blueprint", "style"), [
    ("conv_heavy", Style.LINEAR_ADD), ("depthwise", Style.LINEAR_MULTIPLY), ("attention", Style.GATED_GATE),
    ("self_attention", Style.SIGMOID_ADD), ("norm", Style.LINEAR_MULTIPLY),
])  # fmt: skip
def test_the_projection_gradient_is_the_whatif_loss_gradient_at_zero(blueprint, style):
    """``G_P`` from the kept pairs equals autograd's gradient of the what-if pass's loss (the seed at alpha 1)
    with respect to the projection at ``P = 0``, averaged over the same batches."""
    m, data = _frozen(), _batches(3)
    torch.manual_seed(1)
    m.germinate(1, BP[blueprint], style)
    m.host.set_slot(1, alpha=0.0, stage=Stage.TRAINING)
    m.train_epoch(data, record=3)
    slot = m.host.slot(1)
    P = projection(slot.seed)
    G = projection_gradient(slot, m.slot_stats.slot_pairs(1))
    saved = P.detach().clone()
    with torch.no_grad():
        P.zero_()
    direct = torch.zeros_like(P)
    for batch in data:
        with m.host.incubating([1]):
            loss, _, _ = m.host.loss_and_correct(batch)
        direct += torch.autograd.grad(loss, [P])[0] / len(data)
    with torch.no_grad():
        P.copy_(saved)
    torch.testing.assert_close(G, direct, rtol=1e-4, atol=1e-7)
    assert torch.equal(P, saved)  # left as it was
    assert float(G.norm()) > 0 or blueprint == "attention"  # squeeze-excite's one hidden unit may be dead


def test_the_init_points_down_the_gradient_at_its_scale_and_leaves_alpha_zero_unchanged():
    m, data = _frozen(), _batches(3)
    m.train_epoch(data, record=3)
    x = data[0][0]
    m.host.eval()
    before = m.host(x)
    torch.manual_seed(2)
    m.germinate(0, BP["conv_heavy"], Style.LINEAR_ADD, grad_init=0.1)
    slot = m.host.slot(0)
    P = projection(slot.seed)
    G = projection_gradient(slot, m.slot_stats.slot_pairs(0))
    # the host's function at alpha 0 is exactly unchanged, incubating or blended at 0
    assert torch.equal(m.host(x), before)
    m.host.set_slot(0, alpha=0.0, stage=Stage.BLENDING)
    assert torch.equal(m.host(x), before)
    # not near zero: ten times the blueprints' near-zero start, a tenth of a default layer's norm
    assert float(P.detach().norm()) == pytest.approx(init_scale_norm(P, 0.1), rel=1e-5)
    assert float(P.detach().norm()) == pytest.approx(0.1 * math.sqrt(P.shape[0] / 3), rel=1e-5)
    assert float(P.detach().norm()) > 5 * FINAL_INIT_SCALE * math.sqrt(P.shape[0] / 3)
    # along minus the gradient's top singular directions: first order, the what-if loss falls
    cos = -(P * G).sum() / (P.norm() * G.norm())
    assert cos > 0.9
    U, S, Vh = torch.linalg.svd(G.reshape(G.shape[0], -1))
    top = (U[:, :4] * S[:4]) @ Vh[:4]
    torch.testing.assert_close(P.reshape(P.shape[0], -1), -top / top.norm() * P.norm(), rtol=1e-4, atol=1e-6)


def test_a_germination_with_the_option_differs_only_in_the_projection():
    """Two identical hosts with the same statistics: the seeds built with and without ``grad_init`` have the
    same parameters but the projection, the hosts are untouched, and the global generator is where the
    plain build leaves it (the init draws nothing)."""
    a, b, data = _frozen(), _frozen(), _batches(2)
    a.train_epoch(data, record=2)
    b.train_epoch(data, record=2)
    torch.manual_seed(5)
    a.germinate(2, BP["conv_small"], Style.SIGMOID_ADD)
    after_plain = torch.random.get_rng_state()
    torch.manual_seed(5)
    b.germinate(2, BP["conv_small"], Style.SIGMOID_ADD, grad_init=0.1)
    assert torch.equal(torch.random.get_rng_state(), after_plain)
    pa, pb = projection(a.host.slot(2).seed), projection(b.host.slot(2).seed)
    sa, sb = a.host.state_dict(), b.host.state_dict()
    assert sa.keys() == sb.keys()
    differs = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert differs == ["slots.2.seed.3.weight"]
    assert pa is not pb and not torch.equal(pa, pb)
    # the seed's optimizer holds the same parameters
    assert [p.shape for g in b.seed_opts[2].param_groups for p in g["params"]] == [
        p.shape for g in a.seed_opts[2].param_groups for p in g["params"]
    ]


def test_blueprints_with_and_without_a_projection():
    """Every built-in blueprint but noop has a projection whose zero zeroes its delta."""
    for family, names in BLUEPRINTS.items():
        width = 16
        for name in names:
            seed = build_blueprint(family, name, width)
            P = projection(seed)
            if name == "noop":
                assert P is None
                continue
            assert P is not None, (family, name)
            with torch.no_grad():
                P.zero_()
            x = (
                torch.randn(2, 6, width)
                if family in ("transformer",)
                else (
                    torch.randn(3, width)
                    if family == "mlp"
                    else torch.randn(2, width, 8, 8)
                    if family == "cnn"
                    else torch.randn(2, width, 10)
                )
            )
            assert torch.count_nonzero(seed(x)) == 0, (family, name)
    assert projection(torch.nn.Linear(3, 3)) is None  # a module of another kind keeps its own init


def test_no_statistics_or_a_zero_gradient_leaves_the_seed_as_built():
    m = _frozen()
    torch.manual_seed(3)
    m.germinate(0, BP["conv_light"], Style.LINEAR_ADD, grad_init=0.1)  # no epoch recorded yet
    torch.manual_seed(3)
    plain = build_blueprint("cnn1d", "conv_light", 4)
    for p, q in zip(m.host.slot(0).seed.parameters(), plain.parameters()):
        assert torch.equal(p, q)
    zero = [(torch.randn(2, 4, 8), torch.zeros(2, 4, 8))]
    assert init_projection(m.host.slot(0), zero) is None
    assert init_projection(m.host.slot(0), []) is None


def test_statistics_on_a_transformer_host_read_the_features_last():
    torch.manual_seed(0)
    host = TransformerHost(vocab=16, d_model=8, n_layers=2, n_heads=2, ctx=8, slot_every=1)
    m = EnvModel(host)
    m.set_lr_scale(0.0)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randint(0, 16, (3, 8), generator=g), torch.randint(0, 16, (3, 8), generator=g))
            for _ in range(2)]  # fmt: skip
    out = m.train_epoch(data, record=2)
    assert out["grad_gain"].shape == (2,) and bool((out["grad_gain"] > 0).all())
    h, grad = m.slot_stats.slot_pairs(0)[0]
    assert h.shape == grad.shape == (3, 8, 8)
    W = torch.zeros(8, 8, requires_grad=True)
    handle = host.slot(0).register_forward_hook(lambda mod, args, o: o + args[0] @ W.T)
    direct = sum(torch.autograd.grad(host.loss_and_correct(b)[0], [W])[0] for b in data) / 2
    handle.remove()
    torch.testing.assert_close(m.slot_stats.cross_covariance(0), direct, rtol=1e-4, atol=1e-7)
    m.germinate(1, BLUEPRINTS["transformer"].index("mlp_small"), Style.LINEAR_ADD, grad_init=0.1)
    P = projection(host.slot(1).seed)
    assert float(P.detach().norm()) == pytest.approx(init_scale_norm(P, 0.1), rel=1e-5)


def test_the_batched_path_keeps_the_same_statistics_and_init_as_the_per_env_path():
    cfg = EnvConfig(task="mnist1d", n_envs=2, workers=1, batch_size=16, train_batches=3, val_batches=1,
                    host_lr=1e-12, seed_lr=1e-12)  # fmt: skip
    task = cfg.build_task()
    ref, bat = PerEnvHosts(cfg, task, torch.device("cpu")), BatchedHosts(cfg, task, torch.device("cpu"))
    ref.reset([7, 8])
    bat.reset([7, 8])
    a, b = ref.measure(1.0, grad_batches=2), bat.measure(1.0, grad_batches=2)
    assert set(GRAD_GAIN_KEYS) <= a.keys() and set(GRAD_GAIN_KEYS) <= b.keys()
    for k in GRAD_GAIN_KEYS:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-7)
    assert not set(GRAD_GAIN_KEYS) & ref.measure(1.0).keys()  # off: the measurement as it was
    names = task.make_host().blueprint_names
    plan = [(0, "conv_heavy", Style.LINEAR_ADD), (2, "attention", Style.GATED_GATE)]
    for e, (s, bp, style) in enumerate(plan):
        ref.germinate(e, s, names.index(bp), style, 1, grad_init=0.1)
        bat.germinate(e, s, names.index(bp), style, 1, grad_init=0.1)
        pa, pb = projection(ref.host(e).slot(s).seed), projection(bat.host(e).slot(s).seed)
        torch.testing.assert_close(pb, pa, rtol=1e-3, atol=1e-6)
    # a rollback drops the statistics: a germination right after it keeps the blueprint's own init
    snapshot = bat.snapshot_state(1)
    bat.rollback(1, snapshot)
    ref.rollback(1, ref.snapshot_state(1))
    assert bat.slot_stats[1] is None and ref.models[1].slot_stats is None


def test_slot_stats_refuse_no_batches():
    with pytest.raises(ValueError, match="batches must be >= 1"):
        SlotStats(2, "cnn1d", 0)


def test_gain_of_a_slot_without_pairs_is_zero():
    st = SlotStats(2, "cnn1d", 2)
    st.push(1, torch.ones(2, 3, 4), torch.ones(2, 3, 4))
    gain = st.gain()
    assert gain["grad_gain"][0] == 0 and gain["grad_gain_rms"][0] == 0
    assert gain["grad_gain"][1] == pytest.approx(8.0 * 3)  # G = 8 everywhere (2 samples x 4 positions), 3x3
