"""Gradient and LSTM health (findings C6, H14; M14 is in tests/shell/telemetry/test_readout.py)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from esper.core.health import GradHealthConfig, grad_health, lstm_health, seed_grad_health

NAN, INF = float("nan"), float("inf")


def ref_grad_health(grads, groups, n_groups, cfg):
    """A per-tensor Python loop in float64: the obviously-correct version."""
    norms, nan, inf = [], 0, 0
    group_sq = [0.0] * n_groups
    for g, k in zip(grads, groups):
        vals = g.double().reshape(-1).tolist()
        nan += sum(math.isnan(x) for x in vals)
        inf += sum(math.isinf(x) for x in vals)
        n = math.sqrt(sum(x * x for x in vals))
        norms.append(n)
        group_sq[k] += n * n
    p = max(len(grads), 1)
    return {
        "global_norm": math.sqrt(sum(n * n for n in norms)),
        "group_norms": [math.sqrt(s) for s in group_sq],
        "param_norms": norms,
        "nan_count": nan,
        "inf_count": inf,
        "vanishing_frac": sum(n < cfg.vanish_norm for n in norms) / p,
        "exploding_frac": sum(n > cfg.explode_norm for n in norms) / p,
        "finite": nan + inf == 0,
    }


def assert_matches_ref(out, ref):
    assert set(out.keys()) == set(ref)
    for k, v in ref.items():
        expected = torch.tensor(v, dtype=torch.float64)
        torch.testing.assert_close(out[k].double(), expected, rtol=1e-5, atol=1e-6, equal_nan=True, msg=k)


def random_grads(seed, *, n=6, inject=True):
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, 4), (7,), (2, 2, 2), (), (5, 1), (1,)][:n]
    grads = [torch.randn(s, generator=g) * 10 ** float(torch.randint(-9, 3, (), generator=g)) for s in shapes]
    if inject:
        grads[0].view(-1)[1] = NAN
        grads[2].view(-1)[0] = INF
        grads[2].view(-1)[3] = -INF
        grads[4].view(-1)[2] = NAN
    return grads


# -------------------------------------------------------------------------------------------- config
def test_H14_thresholds_configurable_and_sensible_for_clipped_ppo():
    cfg = GradHealthConfig.for_clipped_ppo(0.5)
    assert cfg.explode_norm == pytest.approx(5.0) and cfg.vanish_norm == 1e-7
    grads = [torch.full((4,), 3.0), torch.full((1,), 1e-9), torch.full((9,), 0.1)]  # norms 6, 1e-9, 0.3
    out = grad_health(grads, cfg=cfg)
    assert out["exploding_frac"] == pytest.approx(1 / 3)  # the 6.0-norm tensor is flagged
    assert out["vanishing_frac"] == pytest.approx(1 / 3)
    # the original's fixed threshold of 100 flags nothing under a clip of 0.5
    assert grad_health(grads, cfg=GradHealthConfig(explode_norm=100.0))["exploding_frac"] == 0
    # the fractions move with the thresholds
    loose = GradHealthConfig(vanish_norm=0.5, explode_norm=2.0)
    assert grad_health(grads, cfg=loose)["vanishing_frac"] == pytest.approx(2 / 3)
    tight = GradHealthConfig.for_clipped_ppo(0.01)  # explode_norm 0.1
    assert grad_health(grads, cfg=tight)["exploding_frac"] == pytest.approx(2 / 3)
    assert grad_health(grads, cfg=GradHealthConfig.for_clipped_ppo(1.0))["exploding_frac"] == 0


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"vanish_norm": 0.0}, "> 0"),
        ({"explode_norm": -1.0}, "> 0"),
        ({"vanish_norm": 2.0, "explode_norm": 1.0}, "must be <"),
    ],
)
def test_H14_config_rejects_bad_thresholds(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        GradHealthConfig(**kwargs)


def test_H14_config_is_frozen_and_slotted():
    cfg = GradHealthConfig()
    with pytest.raises(AttributeError):
        cfg.explode_norm = 1.0  # type: ignore[misc]
    with pytest.raises(ValueError, match="max_grad_norm"):
        GradHealthConfig.for_clipped_ppo(0.0)


# --------------------------------------------------------------------------------------- grad_health
def test_C6_grad_health_matches_per_tensor_loop_with_nan_inf():
    cfg = GradHealthConfig.for_clipped_ppo(0.5)
    grads = random_grads(0)
    groups = [0, 1, 1, 0, 2, 1]
    out = grad_health(grads, groups=groups, n_groups=4, cfg=cfg)
    assert_matches_ref(out, ref_grad_health(grads, groups, 4, cfg))
    assert out["nan_count"] == 2 and out["inf_count"] == 2 and not out["finite"]
    assert out["nan_count"].dtype == torch.int64 and out["finite"].dtype == torch.bool
    assert out["group_norms"][3] == 0  # empty group


@given(
    n=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    inject=st.booleans(),
    n_groups=st.integers(1, 3),
    scale=st.sampled_from([1e-9, 1.0, 1e3]),
    double=st.booleans(),
)
def test_grad_health_matches_reference_hypothesis(n, seed, inject, n_groups, scale, double):
    grads = [g * scale for g in random_grads(seed, n=n, inject=inject and n >= 5)]
    if double:
        grads[0] = grads[0].double()
    groups = [(i * 7 + seed) % n_groups for i in range(n)]
    cfg = GradHealthConfig(vanish_norm=1e-8, explode_norm=1.0)
    out = grad_health(grads, groups=groups, n_groups=n_groups, cfg=cfg)
    assert out["param_norms"].dtype == (torch.float64 if double else torch.float32)
    assert_matches_ref(out, ref_grad_health(grads, groups, n_groups, cfg))


def test_grad_health_norms_equal_the_public_norm_functions_and_the_old_foreach_norm():
    """Issue 47: the private ``torch._foreach_norm`` gave way to a segment sum over one flat copy of
    the gradients; every norm equals ``torch.linalg.vector_norm`` of its tensor (and the private op it
    replaced), the global one ``torch.nn.utils.get_total_norm``, for float32, float64 and bf16
    gradients alike."""
    g = torch.Generator().manual_seed(7)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        grads = [(torch.randn(s, generator=g) * 10.0**k).to(dtype)
                 for s, k in (((3, 5), -3), ((17,), 0), ((), 2), ((2, 2, 4), -8), ((0,), 0))]  # fmt: skip
        out = grad_health(grads, cfg=GradHealthConfig())
        want = torch.stack([torch.linalg.vector_norm(x.double()) for x in grads]).to(out["param_norms"].dtype)
        torch.testing.assert_close(out["param_norms"], want, rtol=1e-6, atol=0.0)
        old = torch.stack(torch._foreach_norm([x.float() for x in grads])).to(out["param_norms"].dtype)
        torch.testing.assert_close(out["param_norms"], old, rtol=1e-5, atol=0.0)
        total = torch.nn.utils.get_total_norm([x.double() for x in grads]).to(out["global_norm"].dtype)
        torch.testing.assert_close(out["global_norm"], total, rtol=1e-6, atol=0.0)


def test_grad_health_empty_and_zero_grads_are_finite():
    cfg = GradHealthConfig()
    for grads in ([], [torch.zeros(3), torch.zeros(2, 2)]):
        out = grad_health(grads, n_groups=2, groups=[0] * len(grads), cfg=cfg)
        for k in ("global_norm", "group_norms", "param_norms", "vanishing_frac", "exploding_frac"):
            assert torch.isfinite(out[k]).all(), k
        assert out["finite"] and out["global_norm"] == 0
    assert grad_health([], cfg=cfg)["param_norms"].shape == (0,)


def test_grad_health_large_finite_norms_do_not_overflow():
    # each norm is finite in float32 but the sum of their squares is not: summed in float64
    grads = [torch.full((1,), 1.5e19), torch.full((1,), 1.5e19)]
    out = grad_health(grads, cfg=GradHealthConfig())
    torch.testing.assert_close(out["global_norm"], torch.tensor(math.sqrt(2) * 1.5e19))
    assert out["finite"]


def test_grad_health_bad_inputs():
    cfg = GradHealthConfig()
    with pytest.raises(TypeError, match=r"grads\[1\]"):
        grad_health([torch.zeros(2), torch.zeros(2, dtype=torch.int64)], cfg=cfg)
    with pytest.raises(TypeError, match=r"grads\[0\].*NoneType"):
        grad_health([None], cfg=cfg)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="groups has 1 entries for 2"):
        grad_health([torch.zeros(2), torch.zeros(2)], groups=[0], cfg=cfg)
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        grad_health([torch.zeros(2)], groups=[2], n_groups=2, cfg=cfg)


# --------------------------------------------------------------------------------------- lstm_health
def ref_lstm_health(h, c, low, high, saturation=0.95):
    def rows(x):
        return [math.sqrt(sum(v * v for v in row)) for row in x.double().reshape(-1, x.shape[-1]).tolist()]

    hn, cn = rows(h), rows(c)
    both = hn + cn
    nonfinite = sum(not math.isfinite(v) for x in (h, c) for v in x.double().reshape(-1).tolist())
    mean = lambda xs: sum(xs) / max(len(xs), 1)
    mx = lambda xs: (math.nan if any(math.isnan(v) for v in xs) else max(xs)) if xs else 0.0
    share = lambda flags: sum(flags) / max(len(flags), 1)
    return {
        "h_norm_mean": mean(hn),
        "h_norm_max": mx(hn),
        "c_norm_mean": mean(cn),
        "c_norm_max": mx(cn),
        "nonfinite": nonfinite,
        "too_small_frac": sum(v < low for v in both) / max(len(both), 1),
        "too_large_frac": sum(v > high for v in both) / max(len(both), 1),
        "h_saturated_frac": share([abs(v) >= saturation for v in h.double().reshape(-1).tolist()]),
        "c_saturated_frac": share([abs(math.tanh(v)) >= saturation for v in c.double().reshape(-1).tolist()]),
    }


@given(
    layers=st.integers(1, 2),
    batch=st.integers(0, 4),
    hidden=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    inject=st.booleans(),
)
def test_lstm_health_matches_reference_hypothesis(layers, batch, hidden, seed, inject):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(layers, batch, hidden, generator=g)
    c = torch.randn(layers, batch, hidden, generator=g) * 60
    if batch > 1:
        h[0, 0] = 0.0  # a dead row
    if inject and batch > 0:
        c[-1, -1, 0] = NAN
        h[-1, -1, -1] = INF
    out = lstm_health(h, c, low=1e-6, high=100.0)
    assert_matches_ref(out, ref_lstm_health(h, c, 1e-6, 100.0))


def test_lstm_health_counts_saturated_units():
    """A unit is saturated where |h| (or |tanh(c)|) reaches the level: the gates then pass almost no
    gradient. Rows are [2 units]: h has 3 of 8 elements at or above 0.95, c 2 of 8 (|c| >= atanh(0.95))."""
    h = torch.tensor([[[0.99, 0.1], [-0.96, 0.0]], [[0.95, 0.94], [0.2, -0.3]]])
    c = torch.tensor([[[3.0, 0.1], [-2.0, 0.5]], [[1.0, 0.0], [0.0, float("nan")]]])
    out = lstm_health(h, c)
    assert out["h_saturated_frac"] == pytest.approx(3 / 8)
    assert out["c_saturated_frac"] == pytest.approx(2 / 8)
    assert lstm_health(h, c, saturation=0.9)["h_saturated_frac"] == pytest.approx(4 / 8)
    assert lstm_health(h, c, saturation=0.97)["h_saturated_frac"] == pytest.approx(1 / 8)
    empty = lstm_health(torch.zeros(1, 0, 4), torch.zeros(1, 0, 4))
    assert empty["h_saturated_frac"] == 0 and empty["c_saturated_frac"] == 0


def test_lstm_health_thresholds_and_errors():
    h = torch.tensor([[0.0, 0.0], [3.0, 4.0]])
    c = torch.tensor([[300.0, 400.0], [0.6, 0.8]])
    out = lstm_health(h, c, low=1e-3, high=10.0)
    assert out["too_small_frac"] == 0.25 and out["too_large_frac"] == 0.25
    assert out["h_norm_max"] == 5.0 and out["c_norm_mean"] == pytest.approx(250.5)
    with pytest.raises(ValueError, match="low"):
        lstm_health(h, c, low=5.0, high=1.0)
    with pytest.raises(ValueError, match="saturation"):
        lstm_health(h, c, saturation=1.0)
    with pytest.raises(TypeError, match="'c'"):
        lstm_health(h, c.long())
    with pytest.raises(ValueError, match=r"h must have shape \[\.\.\., H\]"):
        lstm_health(torch.tensor(1.0), c)


def test_grad_health_refuses_gradients_on_several_devices():
    cfg = GradHealthConfig()
    with pytest.raises(ValueError, match="one device"):
        grad_health([torch.ones(2), torch.ones(2, device="meta")], cfg=cfg)


# ------------------------------------------------------------------------------------ seed health
def ref_seed_grad_health(norm, vanishing, exploding, live):
    """Slot by slot in Python: the original's score ``1 - 0.5 v - 0.8 e``, the worst case for NaN."""
    out = {k: [] for k in ("norm", "vanishing", "exploding", "health")}
    for n, v, e, on in zip(norm.tolist(), vanishing.tolist(), exploding.tolist(), live.tolist()):
        v = 1.0 if math.isnan(v) else min(max(v, 0.0), 1.0)
        e = 1.0 if math.isnan(e) else min(max(e, 0.0), 1.0)
        h = min(max(1.0 - 0.5 * v - 0.8 * e, 0.0), 1.0) if math.isfinite(n) else 0.0
        for k, x in (("norm", n), ("vanishing", v), ("exploding", e), ("health", h)):
            out[k].append(x if on else 0.0)
    return out


@given(seed=st.integers(0, 2**16), n=st.integers(1, 12))
def test_seed_grad_health_matches_a_slot_by_slot_reference(seed, n):
    g = torch.Generator().manual_seed(seed)
    norm = torch.rand(n, generator=g) * 10 ** float(torch.randint(-9, 3, (), generator=g))
    vanishing = torch.rand(n, generator=g).round(decimals=1)
    exploding = torch.rand(n, generator=g).round(decimals=1)
    live = torch.rand(n, generator=g) < 0.7
    pick = torch.rand(n, generator=g)
    norm = torch.where(pick < 0.1, NAN, torch.where(pick > 0.9, INF, norm))
    vanishing = torch.where((pick > 0.4) & (pick < 0.5), NAN, vanishing)
    out = seed_grad_health(norm, vanishing, exploding, live)
    for k, v in ref_seed_grad_health(norm, vanishing, exploding, live).items():
        torch.testing.assert_close(out[k], torch.tensor(v, dtype=torch.float32), equal_nan=True, msg=k)


def test_seed_grad_health_shapes_and_the_original_score():
    live = torch.tensor([[True, False, True], [True, True, False]])
    norm = torch.full((2, 3), 0.5)
    vanishing = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0]])
    exploding = torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    out = seed_grad_health(norm, vanishing, exploding, live)
    assert out.batch_size == torch.Size([2, 3]) and all(out[k].dtype == torch.float32 for k in out.keys())
    torch.testing.assert_close(out["health"], torch.tensor([[1.0, 0.0, 0.5], [0.75, 0.2, 0.0]]))
    torch.testing.assert_close(out["norm"], torch.where(live, 0.5, 0.0))
    with pytest.raises(TypeError, match="'live' must be torch.bool"):
        seed_grad_health(norm, vanishing, exploding, live.float())


# ------------------------------------------------------------------------- learner rules on group norms
def test_M19_group_clip_scale_caps_each_group_alone():
    """Per-group clipping (``ppo.clip_per_group``; 001 M19, 000 MED-1): each group is scaled to the
    bound on its own, ``clip_grad_norm_``'s rule per group, so a dominant group no longer takes the
    others' share of a global clip; a group under the bound keeps its gradient."""
    from esper.core.health import group_clip_scale

    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(4, 3, generator=g) * s for s in (0.01, 5.0, 2.0, 0.3, 0.0)]
    groups = [0, 1, 1, 2, 3]
    norms = grad_health(grads, groups=groups, n_groups=4, cfg=GradHealthConfig())["group_norms"]
    scale = group_clip_scale(norms, 0.5)
    for k in range(4):
        params = [torch.zeros_like(x, requires_grad=True) for x, gi in zip(grads, groups) if gi == k]
        for p, x in zip(params, [x for x, gi in zip(grads, groups) if gi == k]):
            p.grad = x.clone()
        before = [p.grad.clone() for p in params]
        torch.nn.utils.clip_grad_norm_(params, 0.5)  # the group clipped alone: scaled by the same factor
        for p, x in zip(params, before):
            torch.testing.assert_close(p.grad, x * scale[k], rtol=1e-6, atol=1e-9)
    clipped = [x * scale[gi] for x, gi in zip(grads, groups)]
    after = grad_health(clipped, groups=groups, n_groups=4, cfg=GradHealthConfig())["group_norms"]
    torch.testing.assert_close(after, torch.minimum(norms, torch.tensor(0.5)), rtol=1e-5, atol=1e-6)
    assert scale[0] == 1 and scale[3] == 1  # under the bound (and an all-zero group): untouched
    assert torch.isnan(group_clip_scale(torch.tensor([float("nan"), 1.0]), 0.5)[0])
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="max_norm must be finite and > 0"):
            group_clip_scale(norms, bad)


def test_adapt_value_coef_moves_a_share_of_the_way_to_the_target_ratio_in_log_space():
    """000 MED-2: ``coef * (target / ratio) ** rate`` within ``[low, high]``; a ratio that is not
    finite and positive leaves the coefficient where it is."""
    from esper.core.health import adapt_value_coef

    coef = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    value = torch.tensor([2.0, 2.0, 0.1, 0.0, float("nan"), 1.0])
    policy = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    kw = dict(target=0.5, low=0.05, high=5.0)
    full = adapt_value_coef(coef, value, policy, rate=1.0, **kw)
    # rate 1: straight to the coefficient that would have given the target ratio (0.5 * 0.5 / 2)
    assert full[0] == pytest.approx(0.125) and full[2] == pytest.approx(2.5)
    part = adapt_value_coef(coef, value, policy, rate=0.5, **kw)
    assert part[0] == pytest.approx(0.5 * math.sqrt(0.25)) and part[2] == pytest.approx(0.5 * math.sqrt(5.0))
    assert full[3:].tolist() == [0.5, 0.5, 0.5]  # no value gradient, NaN, no policy gradient: unchanged
    tight = adapt_value_coef(coef, value, policy, rate=1.0, target=0.5, low=0.2, high=1.0)
    assert tight[:3].tolist() == pytest.approx([0.2, 0.2, 1.0])  # clamped to [low, high]
    for kwargs, msg in [
        (dict(target=0.0, rate=0.1, low=0.1, high=1.0), "target must be finite and > 0"),
        (dict(target=1.0, rate=1.5, low=0.1, high=1.0), "need rate <= 1 and low <= high"),
        (dict(target=1.0, rate=0.1, low=2.0, high=1.0), "need rate <= 1 and low <= high"),
    ]:
        with pytest.raises(ValueError, match=msg):
            adapt_value_coef(coef, value, policy, **kwargs)
