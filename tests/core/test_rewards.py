"""Rewards: the reference's shaping adapted to the 8-head space, and findings C1, C2, H8-H11, M3."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDict

from esper.core.lifecycle import LifecycleConfig, init_slots, lifecycle_step
from esper.core.observation import init_history, update_history
from esper.core.reward_config import LOSS_TARGET_SHARE, with_loss_calibration, with_param_budget
from esper.core.rewards import (
    COMPONENTS,
    FLAGS,
    RewardConfig,
    RewardFamily,
    RewardMode,
    compute_reward,
    pbrs,
    potential,
)
from esper.core.spec import AlphaSpeed, Op, Stage
from tests.core.test_lifecycle import N_BP, make_action, make_signals, random_rollout
from tests.core.test_observation import arbitrary_slots, extreme_signals

GAMMA = 0.99
#: The reference's shaped mode (the dataclass default is OBJECTIVE; these tests exercise SHAPED).
SHAPED = RewardMode.SHAPED
SHAPED_CFG = RewardConfig(mode=SHAPED)


def seeded(stage=Stage.HOLDING, *, contribution=0.0, acc_germ=40.0, alpha=1.0, eis=3, age=8, E=1, S=3):
    """Slot state with one seed in slot 0 (pre-action, measurements recorded)."""
    slots = init_slots(E, [True] * S)
    live = stage not in (Stage.DORMANT, Stage.EMBARGOED)
    alpha = alpha if live and stage not in (Stage.GERMINATED, Stage.TRAINING) else 0.0
    put = {"stage": int(stage), "epochs_in_stage": eis, "contribution": contribution if live else 0.0}
    if live:
        put |= {"age": age, "acc_at_germination": acc_germ, "acc_at_stage_start": acc_germ, "alpha": alpha}
        put |= {"alpha_target": max(alpha, 0.5), "ramp_from": alpha, "ramp_to": alpha, "seed_params": 100.0}
    if stage == Stage.EMBARGOED:
        put["embargo"] = 2
    for k, v in put.items():
        slots[k][:, 0] = v
    return slots


def reward(
    slots,
    op=Op.WAIT,
    slot=0,
    *,
    val_acc=41.0,
    prev_acc=40.0,
    val_loss=1.0,
    prev_loss=1.0,
    epoch=10,
    cfg=None,
    gamma=GAMMA,
    lc=None,
    **heads,
):
    E = slots.batch_size[0]
    lc = lc or LifecycleConfig(holding_timeout=100)
    sig = make_signals(E, slots.batch_size[1], epoch=epoch, val_acc=val_acc, val_loss=val_loss)
    history = update_history(
        update_history(init_history(E), make_signals(E, 1, val_acc=prev_acc, val_loss=prev_loss)), sig
    )
    action = make_action(E, op, slot, **heads)
    new, events = lifecycle_step(slots, action, sig, lc, n_blueprints=N_BP)
    out = compute_reward(
        slots, action, new, events, sig, history, gamma=gamma, cfg=cfg or SHAPED_CFG, max_epochs=25
    )
    return out, new, events


def one(out, k):
    return float(out[k][0])


def assert_all_finite(out):
    assert set(out.keys()) == {*COMPONENTS, *FLAGS, "step_total"}
    for k in (*COMPONENTS, "step_total"):
        assert out[k].dtype == torch.float32 and torch.isfinite(out[k]).all(), k
    for k in FLAGS:
        assert out[k].dtype == torch.bool
    torch.testing.assert_close(out["step_total"], sum(out[k] for k in COMPONENTS))


# ------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"mode": RewardMode.SPARSE, "family": RewardFamily.LOSS}, "requires mode SHAPED"),
        ({"rent_weight": -1.0}, "rent_weight"),
        ({"pbrs_weight": float("inf")}, "pbrs_weight"),
        ({"stage_potentials": (0.0, 1.0)}, "stage_potentials"),
        ({"loss_baseline": 0.1, "loss_target": 0.3}, "loss_baseline"),
        ({"loss_std": 0.0}, "loss_std"),
        ({"hacking_ratio": 0.0}, "hacking_ratio"),
        ({"fossilize_bonus_epochs": 0}, "fossilize_bonus_epochs"),
    ],
)
def test_config_rejects_bad_values(bad, match):
    with pytest.raises(ValueError, match=match):
        RewardConfig(**bad)


def test_config_fields_are_documented():
    assert all(f.metadata.get("doc") for f in dataclasses.fields(RewardConfig))


# -------------------------------------------------------------------------------------------- C1
def test_C1_reward_config_has_no_gamma_and_pbrs_uses_the_given_gamma():
    assert not any("gamma" in f.name for f in dataclasses.fields(RewardConfig))
    with pytest.raises(TypeError):
        RewardConfig(gamma=0.9)
    slots = seeded(Stage.TRAINING, eis=3)
    cfg = RewardConfig(mode=SHAPED)
    for gamma in (0.0, 0.5, 0.9, 1.0):
        out, new, _ = reward(slots, Op.WAIT, gamma=gamma)
        phi_next = potential(new["stage"], new["epochs_in_stage"], cfg)
        phi_prev = potential(slots["stage"], slots["epochs_in_stage"], cfg)
        torch.testing.assert_close(out["pbrs"], cfg.pbrs_weight * (gamma * phi_next - phi_prev))
    with pytest.raises(ValueError, match="gamma"):
        reward(slots, gamma=1.5)


# -------------------------------------------------------------------------------------------- C2
_real = st.floats(-1e30, 1e30, allow_nan=False)


@given(
    c=st.one_of(_real, st.sampled_from([0.0, 1.0, 1.0001, 5.0, 100.0, 1e-30])),
    ti=st.one_of(_real, st.sampled_from([0.0, 1e-30, -1e-30, 1e-7, 0.1])),
    op=st.sampled_from(list(Op)),
)
def test_C2_ratio_penalty_zero_threshold_is_finite(c, ti, op):
    cfg = RewardConfig(improvement_safe_threshold=0.0)
    val_acc = 50.0
    slots = seeded(Stage.HOLDING, contribution=c, acc_germ=val_acc - ti)
    out, _, _ = reward(slots, op, val_acc=val_acc, cfg=cfg)
    assert_all_finite(out)
    bound = max(cfg.ratio_penalty_max, cfg.ratio_low_weight)
    assert -bound * (1 + 1e-6) <= one(out, "ratio_penalty") <= 0.0


@pytest.mark.parametrize(("threshold", "c"), [(0.0, 3.0), (0.5, 6.0), (2.0, 12.0)])
def test_C2_ratio_penalty_at_exactly_the_safe_threshold_takes_the_low_improvement_form(threshold, c):
    """``ti > improvement_safe_threshold``: the ratio form; ``ti == threshold``: the low-improvement
    form. The two differ for these contributions, so the boundary is pinned (issue 10: ``>=`` in place
    of ``>`` survived the suite); every ti and threshold here is exact in float32."""
    cfg = RewardConfig(mode=SHAPED, improvement_safe_threshold=threshold)
    low = -cfg.ratio_low_weight * min(1.0, c / cfg.ratio_low_scale)

    def high(ti: float) -> float:
        ratio = c / max(ti, threshold, 1e-6)
        penalty = cfg.ratio_penalty_slope * (ratio / cfg.hacking_ratio - 1)
        return -min(cfg.ratio_penalty_max, max(0.0, penalty))

    assert abs(high(threshold) - low) > 0.02  # the branches really differ at the boundary
    val_acc = 50.0
    for ti, expected in ((threshold, low), (threshold + 0.25, high(threshold + 0.25))):
        slots = seeded(Stage.HOLDING, contribution=c, acc_germ=val_acc - ti, S=1)
        out, _, _ = reward(slots, Op.WAIT, val_acc=val_acc, cfg=cfg)
        assert bool(out["hacking"][0]), ti
        assert one(out, "ratio_penalty") == pytest.approx(expected, rel=1e-5), ti


# -------------------------------------------------------------------------------------------- H8
_state = st.tuples(st.sampled_from([int(s) for s in Stage]), st.integers(0, 30))


@given(
    traj=st.lists(st.lists(_state, min_size=3, max_size=3), min_size=2, max_size=30),
    gamma=st.floats(0.0, 1.0),
)
def test_H8_pbrs_telescopes_over_any_stage_trajectory(traj, gamma):
    """sum_t gamma^t F_t == gamma^T Phi(s_T) - Phi(s_0) for any sequence of slot states, because Phi is
    a function of the state only and both ends are read from the post-step state."""
    cfg = RewardConfig(mode=SHAPED)
    stage = torch.tensor([[s for s, _ in row] for row in traj])  # [T+1, S]
    eis = torch.tensor([[e for _, e in row] for row in traj])
    T = len(traj) - 1
    new = TensorDict(
        {
            "stage": stage[1:],
            "epochs_in_stage": eis[1:],
            "prev_stage": stage[:-1],
            "prev_epochs_in_stage": eis[:-1],
        },
        batch_size=[T, 3],
    )
    F = pbrs(new, gamma=gamma, weight=1.0, cfg=cfg).double()  # [T]: one env per step
    phi = potential(stage, eis, cfg).double()
    lhs = (gamma ** torch.arange(T, dtype=torch.float64) * F).sum()
    rhs = gamma**T * phi[-1] - phi[0]
    torch.testing.assert_close(lhs, rhs, rtol=1e-5, atol=1e-4)


@given(data=st.data(), gamma=st.sampled_from([0.9, 0.99, 1.0]))
def test_H8_pbrs_telescopes_along_real_lifecycle_rollouts(data, gamma):
    cfg = RewardConfig(mode=SHAPED)
    lc = LifecycleConfig(max_epochs=14, g2_min_epochs=1, g3_min_epochs=1, holding_timeout=3)
    first = last = None
    acc = torch.zeros(2, dtype=torch.float64)
    h = init_history(2)
    for t, (pre, action, sig, new, events) in enumerate(random_rollout(data, cfg=lc, T=14)):
        h = update_history(h, sig)
        out = compute_reward(pre, action, new, events, sig, h, gamma=gamma, cfg=cfg, max_epochs=14)
        acc += gamma**t * out["pbrs"].double()
        first = potential(pre["stage"], pre["epochs_in_stage"], cfg) if first is None else first
        last, T = new, t + 1
    rhs = (
        cfg.pbrs_weight * (gamma**T * potential(last["stage"], last["epochs_in_stage"], cfg) - first).double()
    )
    torch.testing.assert_close(acc, rhs, rtol=1e-5, atol=1e-4)


# -------------------------------------------------------------------------------------------- H9
def test_H9_reward_hacking_flag_and_penalty():
    slots = seeded(Stage.HOLDING, contribution=5.0, acc_germ=40.0, S=1)  # ti = 0.5: ratio 10 >= 5
    out, _, _ = reward(slots, Op.WAIT, val_acc=40.5)
    assert bool(out["hacking"][0]) and not bool(out["ransomware"][0])
    assert one(out, "ratio_penalty") == pytest.approx(-min(0.3, 0.1 * (10 - 5) / 5))
    low, _, _ = reward(slots, Op.WAIT, val_acc=40.05)  # ti <= 0.1: low-improvement form
    assert one(low, "ratio_penalty") == pytest.approx(-0.3 * min(1.0, 5.0 / 10))
    pruned, _, _ = reward(slots, Op.PRUNE, val_acc=40.5)  # pruning it is the fix: flagged, not penalized
    assert bool(pruned["hacking"][0]) and one(pruned, "ratio_penalty") == 0.0
    honest, _, _ = reward(seeded(Stage.HOLDING, contribution=2.0, S=1), Op.WAIT, val_acc=43.0)
    assert not bool(honest["hacking"][0]) and one(honest, "ratio_penalty") == 0.0


def test_H9_ransomware_flag_and_penalty():
    slots = seeded(Stage.HOLDING, contribution=2.0, acc_germ=40.0, S=1)
    out, _, _ = reward(slots, Op.WAIT, val_acc=39.0)  # the host got worse, the seed claims 2 points
    assert bool(out["ransomware"][0]) and not bool(out["hacking"][0])
    assert one(out, "ransomware_penalty") == pytest.approx(-0.3)
    assert one(out, "attribution") == 0.0  # c >= 0 with no progress earns nothing
    pruned, _, _ = reward(slots, Op.PRUNE, val_acc=39.0)
    assert bool(pruned["ransomware"][0]) and one(pruned, "ransomware_penalty") == 0.0
    for mode in (RewardMode.SPARSE, RewardMode.MINIMAL):  # telemetry in every mode, penalty only in SHAPED
        other, _, _ = reward(slots, Op.WAIT, val_acc=39.0, cfg=RewardConfig(mode=mode))
        assert bool(other["ransomware"][0]) and one(other, "ransomware_penalty") == 0.0


# ------------------------------------------------------------------------------------------- H10
@pytest.mark.parametrize("scale", [0.5, 1.0, 2.5])
def test_H10_sparse_scale_applies_after_the_clip(scale):
    cfg = RewardConfig(mode=RewardMode.SPARSE, sparse_scale=scale)
    empty = init_slots(1, [True] * 3)
    best, _, _ = reward(empty, val_acc=100.0, prev_acc=100.0, epoch=25, cfg=cfg)  # raw 1.0, at the clip
    assert one(best, "terminal") == pytest.approx(scale)
    heavy = seeded(Stage.FOSSILIZED, contribution=2.0)
    heavy["seed_params"][:, 0] = 5e7  # parameter cost -10: clipped to -1, then scaled
    worst, _, _ = reward(heavy, val_acc=0.0, prev_acc=0.0, epoch=25, cfg=cfg)
    assert one(worst, "terminal") == pytest.approx(-scale)
    early, _, _ = reward(empty, val_acc=100.0, epoch=24, cfg=cfg)
    assert one(early, "step_total") == 0.0


def test_minimal_mode_penalizes_pruning_young_seeds_only():
    cfg = RewardConfig(mode=RewardMode.MINIMAL)
    young, _, _ = reward(seeded(Stage.TRAINING, age=2), Op.PRUNE, cfg=cfg)
    old, _, _ = reward(seeded(Stage.TRAINING, age=6), Op.PRUNE, cfg=cfg)
    assert one(young, "op_shaping") == pytest.approx(-0.1) and one(old, "op_shaping") == 0.0
    assert one(young, "step_total") == pytest.approx(-0.1)


# ------------------------------------------------------------------------------------------- H11
def test_H11_holding_indecision_is_linear_and_bounded():
    cfg = RewardConfig(mode=SHAPED)
    pens = []
    for eis in range(0, 12):
        out, _, _ = reward(
            seeded(Stage.HOLDING, contribution=3.0, acc_germ=38.0, eis=eis), Op.WAIT, val_acc=42.0
        )
        pens.append(one(out, "holding_indecision"))
    grace = cfg.holding_grace_epochs
    assert pens[:grace] == [0.0] * grace
    steps = [pens[i] - pens[i + 1] for i in range(grace, len(pens) - 1)]
    uncapped = [s for s in steps if s > 0]
    assert uncapped and all(
        s == pytest.approx(cfg.holding_penalty_slope) for s in uncapped
    )  # linear, not 3^k
    assert min(pens) == pytest.approx(-cfg.holding_penalty_cap) and all(
        p >= -cfg.holding_penalty_cap for p in pens
    )
    acting, _, _ = reward(
        seeded(Stage.HOLDING, contribution=3.0, acc_germ=38.0, eis=6), Op.FOSSILIZE, val_acc=42.0
    )
    assert one(acting, "holding_indecision") == 0.0
    # WAIT ignores the (irrelevant) slot head: the HOLDING seed in slot 0 counts even when slot 2 is sampled
    other, _, _ = reward(
        seeded(Stage.HOLDING, contribution=3.0, acc_germ=38.0, eis=6), Op.WAIT, 2, val_acc=42.0
    )
    assert one(other, "holding_indecision") < 0
    bad, _, _ = reward(seeded(Stage.HOLDING, contribution=-1.0, eis=6), Op.WAIT)
    assert one(bad, "holding_indecision") == 0.0  # no penalty for waiting on a seed that does not help


# -------------------------------------------------------------------------------------------- M3
@given(c=st.floats(-1e30, 1e30, allow_nan=False), age=st.integers(0, 50), stage=st.sampled_from(list(Stage)))
def test_M3_prune_shaping_bounded_for_any_contribution(c, age, stage):
    cfg = RewardConfig(mode=SHAPED)
    out, _, _ = reward(seeded(stage, contribution=c, age=age), Op.PRUNE, lc=LifecycleConfig(min_prune_age=0))
    assert_all_finite(out)
    low = -(cfg.prune_young_penalty + cfg.prune_good_base + cfg.prune_good_cap + cfg.prune_cost)
    low = min(low, -(cfg.prune_fossilized_penalty + cfg.prune_cost))
    assert low - 1e-6 <= one(out, "op_shaping") <= cfg.prune_bad_bonus


# ------------------------------------------------------------------------------------- components
@pytest.mark.parametrize(
    ("c", "ti", "alpha", "op", "expected"),
    [
        (-2.0, 1.0, 1.0, Op.WAIT, -2.0),
        (-2.0, -1.0, 1.0, Op.WAIT, -2.0 / (1 + math.exp(10.0))),  # discounted by sigmoid(10 ti)
        (3.0, 2.0, 1.0, Op.WAIT, math.sqrt(6.0)),  # contribution above progress: geometric mean
        (1.0, 2.0, 1.0, Op.WAIT, 1.0),
        (2.0, 0.0, 1.0, Op.WAIT, 0.0),  # no progress since germination: nothing
        (-2.0, 1.0, 1.0, Op.PRUNE, 2.0),  # PRUNE negates
        (3.0, -0.1, 1.0, Op.FOSSILIZE, 0.0),
        (5.0, 2.0, 0.0, Op.WAIT, 0.3 * 1.0),  # alpha 0: no counterfactual, 0.3 x acc gain (1 pt)
    ],
)
def test_attribution_follows_the_reference(c, ti, alpha, op, expected):
    stage = Stage.HOLDING if alpha > 0 else Stage.TRAINING
    out, _, _ = reward(seeded(stage, contribution=c, acc_germ=41.0 - ti, alpha=alpha, S=1), op, val_acc=41.0)
    assert one(out, "attribution") == pytest.approx(expected, rel=1e-5)


def test_no_attribution_for_fossils_or_empty_slots():
    fossil, _, _ = reward(seeded(Stage.FOSSILIZED, contribution=4.0, acc_germ=30.0, S=1), Op.WAIT)
    empty, _, _ = reward(init_slots(1, [True] * 3), Op.WAIT)
    assert one(fossil, "attribution") == 0.0 and one(empty, "attribution") == 0.0


def test_blending_warning_pbrs_rent_terminal():
    cfg = RewardConfig(mode=SHAPED)
    warn, _, _ = reward(seeded(Stage.BLENDING, acc_germ=42.0, eis=4, S=1), Op.WAIT, val_acc=41.0)
    assert one(warn, "blending_warning") == pytest.approx(-(0.1 + min(0.05 * 4, 0.3)))
    ok, _, _ = reward(seeded(Stage.BLENDING, acc_germ=40.0, eis=4, S=1), Op.WAIT, val_acc=41.0)
    assert one(ok, "blending_warning") == 0.0
    out, _, _ = reward(seeded(Stage.HOLDING), Op.WAIT)  # seed 100 params, host 1000
    assert one(out, "rent") == pytest.approx(-0.5 * math.log(1.1))
    germ, _, _ = reward(init_slots(1, [True] * 3), Op.GERMINATE)
    assert one(germ, "pbrs") == pytest.approx(cfg.pbrs_weight * GAMMA * 1.0)  # DORMANT -> GERMINATED
    last, _, _ = reward(seeded(Stage.FOSSILIZED, acc_germ=38.0), Op.WAIT, val_acc=41.0, epoch=25)
    assert one(last, "terminal") == pytest.approx(0.05 * 41.0 + 3.0)
    small, _, _ = reward(seeded(Stage.FOSSILIZED, acc_germ=40.5), Op.WAIT, val_acc=41.0, epoch=25)
    assert one(small, "terminal") == pytest.approx(0.05 * 41.0)  # improved < 1 point: no bonus


def test_op_shaping_per_op():
    germ, _, _ = reward(init_slots(1, [True] * 3), Op.GERMINATE)
    assert one(germ, "op_shaping") == pytest.approx(-0.02)
    bad_germ, _, ev = reward(seeded(Stage.TRAINING), Op.GERMINATE)
    assert bool(ev["illegal"][0, 0]) and one(bad_germ, "op_shaping") == pytest.approx(-0.32)
    fossil, _, ev = reward(seeded(Stage.HOLDING, contribution=2.0, acc_germ=38.0, eis=5), Op.FOSSILIZE)
    assert bool(ev["fossilized"][0, 0]) and one(fossil, "op_shaping") == pytest.approx(0.7 - 0.01)
    failed, _, _ = reward(seeded(Stage.HOLDING, contribution=0.5, acc_germ=38.0), Op.FOSSILIZE)
    assert one(failed, "op_shaping") == pytest.approx(-0.2 - 0.01)
    regress, _, _ = reward(seeded(Stage.HOLDING, contribution=2.0, acc_germ=43.0), Op.FOSSILIZE, val_acc=41.0)
    assert one(regress, "op_shaping") == pytest.approx(-(0.5 + 0.4) - 0.01)
    not_holding, _, _ = reward(seeded(Stage.TRAINING), Op.FOSSILIZE)
    assert one(not_holding, "op_shaping") == pytest.approx(-1.01)
    adv, _, ev = reward(seeded(Stage.TRAINING, eis=0), Op.ADVANCE)
    assert bool(ev["advance_failed"][0, 0]) and one(adv, "op_shaping") == pytest.approx(-0.1)
    aset, _, ev = reward(seeded(Stage.HOLDING), Op.SET_ALPHA_TARGET, alpha_speed=AlphaSpeed.FAST)
    assert bool(ev["alpha_set"][0, 0]) and one(aset, "op_shaping") == pytest.approx(-0.01)
    good, _, _ = reward(seeded(Stage.HOLDING, contribution=4.0), Op.PRUNE)
    assert one(good, "op_shaping") == pytest.approx(-(0.3 + 0.2) - 0.005)
    harmful, _, _ = reward(seeded(Stage.HOLDING, contribution=-2.0), Op.PRUNE)
    assert one(harmful, "op_shaping") == pytest.approx(0.3 - 0.005)
    fossil_prune, _, _ = reward(seeded(Stage.FOSSILIZED), Op.PRUNE)
    assert one(fossil_prune, "op_shaping") == pytest.approx(-1.0 - 0.005)


# ------------------------------------------------------------------------------------------- LOSS
def test_loss_family_rewards_a_lower_loss():
    """The reference treated loss_delta with the wrong sign; here prev - cur > 0 (better) pays more."""
    cfg = with_loss_calibration(RewardConfig(mode=SHAPED, family=RewardFamily.LOSS), math.log(10))
    slots = init_slots(1, [True] * 3)
    progress = []
    for cur in (2.5, 2.1, 2.0, 1.99, 1.9, 1.5):
        out, _, _ = reward(slots, prev_loss=2.0, val_loss=cur, cfg=cfg)
        progress.append(one(out, "loss_progress"))
    assert progress == sorted(progress) and progress[0] < 0 < progress[-1]
    assert progress[2] == 0.0
    better, _, _ = reward(slots, prev_loss=2.0, val_loss=1.9, cfg=cfg)
    worse, _, _ = reward(slots, prev_loss=1.9, val_loss=2.0, cfg=cfg)
    assert one(better, "step_total") > one(worse, "step_total")
    assert one(better, "loss_progress") == pytest.approx(5.0 * 2.0)  # x = 0.1 / 0.05 = 2
    assert one(worse, "loss_progress") == pytest.approx(-5.0 * 0.5 * 2.0)  # regressions at half weight
    end, _, _ = reward(slots, val_loss=1.3, epoch=25, cfg=cfg)
    assert one(end, "terminal") == pytest.approx((math.log(10) - 1.3) / (math.log(10) - 0.3))


# ---------------------------------------------------------------------------------------- finite
_coef = st.floats(0.0, 100.0, allow_nan=False)


_SAMPLED_COEFFICIENTS = (
    "ratio_penalty_max",
    "holding_penalty_slope",
    "rent_weight",
    "pbrs_weight",
    "sparse_scale",
    "improvement_safe_threshold",
    "discount_steepness",
    "prune_good_slope",
    "loss_delta_weight",
)


@st.composite
def reward_configs(draw):
    mode = draw(st.sampled_from(list(RewardMode)))
    family = (
        draw(st.sampled_from(list(RewardFamily))) if mode is RewardMode.SHAPED else RewardFamily.CONTRIBUTION
    )
    kw = {"mode": mode, "family": family}
    for name in _SAMPLED_COEFFICIENTS:
        kw[name] = draw(_coef)
    kw["stage_potentials"] = tuple(draw(st.lists(st.floats(-50, 50), min_size=8, max_size=8)))
    kw["loss_std"] = draw(st.floats(1e-6, 10.0))
    return with_loss_calibration(RewardConfig(**kw), draw(st.floats(1e-3, 20.0)))


@given(
    cfg=reward_configs(),
    pre=arbitrary_slots(),
    sig=extreme_signals(),
    hist_sig=extreme_signals(),
    op=st.sampled_from(list(Op)),
    slot=st.integers(0, 2),
    gamma=st.floats(0.0, 1.0),
)
def test_every_component_finite_for_any_signals_and_config(cfg, pre, sig, hist_sig, op, slot, gamma):
    history = update_history(update_history(init_history(2), hist_sig), sig)
    action = make_action(2, op, slot, blueprint=1)
    new, events = lifecycle_step(pre, action, sig, LifecycleConfig(), n_blueprints=N_BP)
    out = compute_reward(pre, action, new, events, sig, history, gamma=gamma, cfg=cfg, max_epochs=25)
    assert_all_finite(out)


def test_compute_reward_checks_shapes():
    slots = init_slots(2, [True] * 3)
    sig = make_signals(2, 3)
    new, events = lifecycle_step(slots, make_action(2, Op.WAIT), sig, LifecycleConfig())
    h = update_history(init_history(2), sig)
    with pytest.raises(ValueError, match="action"):
        compute_reward(
            slots, make_action(3, Op.WAIT), new, events, sig, h, gamma=0.9, cfg=SHAPED_CFG, max_epochs=5
        )
    with pytest.raises(ValueError, match="max_epochs"):
        compute_reward(
            slots, make_action(2, Op.WAIT), new, events, sig, h, gamma=0.9, cfg=SHAPED_CFG, max_epochs=0
        )


def test_wait_reward_does_not_depend_on_the_ignored_slot_sample():
    """Under WAIT the slot head is sampled but does not matter: the reward is the same whichever slot
    it drew — the mean of the per-slot terms over enabled slots, not the drawn slot's."""
    slots = seeded(Stage.HOLDING, contribution=5.0, acc_germ=40.0, S=3)
    outs = [reward(slots, Op.WAIT, slot=k, val_acc=40.5)[0] for k in range(3)]
    for out in outs[1:]:
        torch.testing.assert_close(out["step_total"], outs[0]["step_total"])
    single = reward(seeded(Stage.HOLDING, contribution=5.0, acc_germ=40.0, S=1), Op.WAIT, val_acc=40.5)[0]
    assert one(outs[0], "ratio_penalty") == pytest.approx(one(single, "ratio_penalty") / 3)
    assert bool(outs[0]["hacking"][0])


# --------------------------------------------------------------------------------------- OBJECTIVE
def _objective_signals(val_acc, params, alpha, host=200.0):
    E, S = len(val_acc), len(params[0])
    return TensorDict(
        {
            "val_acc": torch.tensor(val_acc, dtype=torch.float32),
            "host_params": torch.full((E,), host),
            "slots": TensorDict(
                {"seed_params": torch.tensor(params, dtype=torch.float32), "alpha": torch.tensor(alpha)},
                batch_size=[E, S],
            ),
        },
        batch_size=[E],
    )


def _objective_reference(val_acc, params, alpha, host, weight, final, live=False, budget=0.0, over=0.0):
    """Slow reference: Phi per env with Python loops."""
    out = []
    for acc, ps, als in zip(val_acc, params, alpha):
        charged = 0.0
        for p, a in zip(ps, als):
            share = (1.0 if a > 0 else 0.0) if final or live else min(max(a, 0.0), 1.0)
            charged += share * p
        cost = weight * charged / host
        if budget > 0 and charged > budget:
            cost += over * (charged - budget) / host
        out.append(min(max(acc, 0.0), 100.0) - cost)
    return out


@given(
    acc=st.lists(st.floats(-10, 110, width=32), min_size=1, max_size=4),
    data=st.data(),
    weight=st.floats(0.0, 10.0),
    final=st.booleans(),
    share=st.sampled_from(["alpha", "live"]),
    budget=st.sampled_from([0.0, 300.0, 2000.0]),
)
def test_objective_matches_a_reference_loop(acc, data, weight, final, share, budget):
    from esper.core.rewards import objective

    S = 3
    params = [data.draw(st.lists(st.floats(0, 5000, width=32), min_size=S, max_size=S)) for _ in acc]
    alpha = [data.draw(st.lists(st.sampled_from([0.0, 0.2, 0.5, 1.0]), min_size=S, max_size=S)) for _ in acc]
    cfg = RewardConfig(param_weight=weight, param_share=share, param_budget=budget, param_over_weight=7.0)
    got = objective(_objective_signals(acc, params, alpha), cfg, final=final)
    want = _objective_reference(acc, params, alpha, 200.0, weight, final, share == "live", budget, 7.0)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32), rtol=1e-5, atol=1e-3)


def test_objective_is_finite_for_garbage_inputs():
    from esper.core.rewards import objective

    nan = float("nan")
    sig = _objective_signals([nan, 1e9], [[nan, -5.0], [1e30, 1.0]], [[1.0, 1.0], [0.5, 0.0]])
    sig["host_params"] = torch.tensor([float("nan"), 0.0])
    sig["slots", "alpha"][0, 0] = nan
    assert torch.isfinite(objective(sig, RewardConfig())).all()
    assert torch.isfinite(objective(sig, RewardConfig(), final=True)).all()


def test_objective_rewards_telescope_to_the_final_objective():
    """The OBJECTIVE return is Phi(final host, charged in full) - Phi(first measurement), whatever
    happened in between (seeds germinated, blended, pruned)."""
    from esper.core.rewards import objective, objective_delta

    cfg = RewardConfig(param_weight=3.0)
    g = torch.Generator().manual_seed(0)
    T, E, S = 12, 5, 3
    measurements = [
        _objective_signals(
            (torch.rand(E, generator=g) * 100).tolist(),
            (torch.rand(E, S, generator=g) * 500).tolist(),
            (
                torch.rand(E, S, generator=g).round(decimals=1) * (torch.rand(E, S, generator=g) > 0.4)
            ).tolist(),
        )
        for _ in range(T + 1)
    ]
    rewards = [objective_delta(measurements[t], measurements[t + 1], cfg, final=t == T - 1) for t in range(T)]
    ret = torch.stack(rewards).sum(0)
    expected = objective(measurements[T], cfg, final=True) - objective(measurements[0], cfg)
    torch.testing.assert_close(ret, expected, rtol=1e-5, atol=1e-3)


def test_objective_live_share_charges_every_alpha_target_the_same_price_at_the_same_time():
    """A seed blended to alpha 0.5 and one blended to 1.0, at the same accuracy: under the alpha share
    the 0.5 seed pays half its price during the episode and the rest only at the last step (what the
    learner discounts most); under the live share both pay in full on their first blended epoch and
    nothing at the end. Both shares telescope to the same final objective."""
    from esper.core.rewards import objective_delta

    start = _objective_signals([50.0, 50.0], [[400.0, 0.0], [400.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]])
    blended = _objective_signals([60.0, 60.0], [[400.0, 0.0], [400.0, 0.0]], [[0.5, 0.0], [1.0, 0.0]])
    for share, first_step in (("alpha", [9.0, 8.0]), ("live", [8.0, 8.0])):
        cfg = RewardConfig(param_weight=1.0, param_share=share)
        step = objective_delta(start, blended, cfg)
        torch.testing.assert_close(step, torch.tensor(first_step))
        last = objective_delta(blended, blended, cfg, final=True)
        torch.testing.assert_close(last, torch.tensor([first_step[1] - first_step[0], 0.0]))
        torch.testing.assert_close(step + last, torch.tensor([8.0, 8.0]))  # same final objective


def test_objective_budget_prefers_the_most_accurate_host_within_it():
    """With a budget of 500 seed parameters (host 200), a host 1 point more accurate with 600 pays 5
    points more than one within budget (param_over_weight 10 per host-size); at the linear price of 1
    point per host-size alone the two are worth the same."""
    from esper.core.rewards import objective

    hosts = _objective_signals([80.0, 81.0], [[400.0, 0.0], [400.0, 200.0]], [[1.0, 0.0], [1.0, 1.0]])
    linear = objective(hosts, RewardConfig(param_weight=1.0), final=True)
    budget = objective(hosts, RewardConfig(param_weight=1.0, param_budget=500.0, param_over_weight=10.0),
                       final=True)  # fmt: skip
    torch.testing.assert_close(linear, torch.tensor([78.0, 78.0]))  # 80 - 2, 81 - 3
    torch.testing.assert_close(budget, torch.tensor([78.0, 73.0]))  # 81 - 3 - 10 * 100 / 200
    with pytest.raises(ValueError, match="param_budget"):
        RewardConfig(param_budget=-1.0)
    with pytest.raises(ValueError, match="both set"):  # a budget is given one way
        RewardConfig(param_budget=720.0, param_budget_share=0.6)
    # a share is resolved into parameters once the task's grow_all is known, and only then
    resolved = with_param_budget(RewardConfig(param_budget_share=0.5), 1000)
    assert (resolved.param_budget, resolved.param_budget_share) == (500.0, 0.0)
    assert with_param_budget(RewardConfig(param_budget=300.0), 1000).param_budget == 300.0
    with pytest.raises(ValueError, match="grow_all"):
        with_param_budget(RewardConfig(param_budget_share=0.5), 0)


def test_reward_config_rejects_an_unknown_param_share():
    with pytest.raises(ValueError, match="param_share"):
        RewardConfig(param_share="half")


def test_objective_mode_leaves_every_step_term_to_episode_rewards():
    slots = seeded(Stage.HOLDING, contribution=5.0)
    for op in (Op.WAIT, Op.FOSSILIZE, Op.PRUNE):
        out, _, _ = reward(slots, op, cfg=RewardConfig(), epoch=25)
        assert all(one(out, k) == 0.0 for k in COMPONENTS), op
        assert one(out, "step_total") == 0.0


def test_objective_pays_growth_that_helps_and_charges_growth_that_does_not():
    """A farmed seed (blended, the host depends on it, accuracy unchanged) costs its parameters; a
    useful one earns its accuracy minus its parameters; with no growth, nothing."""
    from esper.core.rewards import objective_delta

    cfg = RewardConfig(param_weight=2.0)
    start = _objective_signals([50.0], [[0.0, 0.0]], [[0.0, 0.0]])
    farmed = _objective_signals([50.0], [[400.0, 0.0]], [[1.0, 0.0]])  # same accuracy, big seed
    useful = _objective_signals([65.0], [[100.0, 0.0]], [[1.0, 0.0]])
    assert float(objective_delta(start, farmed, cfg, final=True)) == pytest.approx(-4.0)
    assert float(objective_delta(start, useful, cfg, final=True)) == pytest.approx(14.0)
    assert float(objective_delta(start, start, cfg, final=True)) == 0.0


# ------------------------------------------------------------------------------ the learner's reward
def _episode(E=3, T=5, S=2, *, seed=0, panic_rate=0.3):
    """Random per-step terms ``[E, T]`` (as compute_reward returns them, stacked), the measurements
    they acted on ``[E, T]``, the final measurement ``[E]`` and the governor's panics ``[E, T]``."""
    g = torch.Generator().manual_seed(seed)
    comps = {k: torch.randn(E, T, generator=g) for k in COMPONENTS}
    total = torch.zeros(E, T)
    for k in COMPONENTS:
        total = total + comps[k]
    flags = {k: torch.rand(E, T, generator=g) > 0.5 for k in FLAGS}
    terms = TensorDict({**comps, **flags, "step_total": total}, batch_size=[E, T])
    meas = [
        _objective_signals(
            (torch.rand(E, generator=g) * 100).tolist(),
            (torch.rand(E, S, generator=g) * 500).tolist(),
            (
                torch.rand(E, S, generator=g).round(decimals=1) * (torch.rand(E, S, generator=g) > 0.4)
            ).tolist(),
        )
        for _ in range(T + 1)
    ]
    panicked = torch.rand(E, T, generator=g) < panic_rate
    return terms, torch.stack(meas[:T], 1), meas[T], panicked


def _episode_reference(terms, measurements, final, panicked, cfg, penalty):
    """Slow reference, per env and step in Python floats: the step's own terms, minus ``penalty`` for a
    panic at the next measurement (or, for the first step, at its own), plus in OBJECTIVE mode
    Phi(next measurement) - Phi(this one), the last step's against the final host charged in full."""
    from esper.core.rewards import objective

    E, T = terms.batch_size
    phi = objective(measurements, cfg).tolist()
    phi_final = objective(final, cfg, final=True).tolist()
    out = []
    for e in range(E):
        row = []
        for t in range(T):
            r = float(terms["step_total"][e, t])
            if t == 0 and panicked[e, 0]:
                r -= penalty
            if t + 1 < T and panicked[e, t + 1]:
                r -= penalty
            if cfg.mode is RewardMode.OBJECTIVE:
                r += (phi[e][t + 1] if t + 1 < T else phi_final[e]) - phi[e][t]
            row.append(r)
        out.append(row)
    return torch.tensor(out)


def _episode_before(terms, measurements, final, panicked, cfg, penalty):
    """The arithmetic the shell did before issue 88 (``esper.shell.env.rollout.episode_rewards``), kept
    to hold the core function to the same bits."""
    from esper.core.rewards import objective_delta

    total = terms["step_total"].clone()
    total[:, 0] = total[:, 0] - penalty * panicked[:, 0].float()
    total[:, :-1] = total[:, :-1] - penalty * panicked[:, 1:].float()
    objective = terms["objective"]
    if cfg.mode is RewardMode.OBJECTIVE:
        delta = torch.cat(
            [objective_delta(measurements[:, :-1], measurements[:, 1:], cfg),
             objective_delta(measurements[:, -1], final, cfg, final=True).unsqueeze(1)], dim=1,
        )  # fmt: skip
        total = total + delta
        objective = objective + delta
    return total, objective


@pytest.mark.parametrize(
    "cfg",
    [RewardConfig(param_weight=3.0), RewardConfig(param_share="live"), SHAPED_CFG],
    ids=["alpha", "live", "shaped"],
)
@pytest.mark.parametrize("T", [1, 2, 6])
def test_episode_rewards_match_a_reference_loop_and_the_arithmetic_of_before(cfg, T):
    from esper.core.rewards import episode_rewards

    for seed in range(3):
        terms, meas, final, panicked = _episode(T=T, seed=seed)
        panicked[0, 0] = True  # a panic at the first measurement charges the first step
        out = episode_rewards(terms, meas, final, panicked, cfg=cfg, rollback_penalty=7.5)
        assert out.batch_size == terms.batch_size
        assert set(out.keys()) == {*COMPONENTS, *FLAGS, "rollback", "total"}
        want = _episode_reference(terms, meas, final, panicked, cfg, 7.5)
        torch.testing.assert_close(out["total"], want, rtol=1e-5, atol=1e-4)
        total, objective = _episode_before(terms, meas, final, panicked, cfg, 7.5)
        assert torch.equal(out["total"], total) and torch.equal(out["objective"], objective)
        for k in (*COMPONENTS, *FLAGS):
            if k != "objective":
                assert torch.equal(out[k], terms[k]), k
        # the decomposition: the components and the rollback charge sum to the learner's reward
        torch.testing.assert_close(out["total"], sum(out[k] for k in COMPONENTS) + out["rollback"])
        # a panic at measurement t charges step t - 1; one at the first measurement, the first step
        into = torch.cat([panicked[:, 1:], torch.zeros_like(panicked[:, :1])], 1).float()
        at_start = torch.zeros_like(into)
        at_start[:, 0] = panicked[:, 0].float()
        torch.testing.assert_close(out["rollback"], -7.5 * (into + at_start))


def test_episode_rewards_take_any_env_dims_and_check_shapes():
    from esper.core.rewards import episode_rewards

    terms, meas, final, panicked = _episode(E=6, T=4)
    cfg = RewardConfig()
    flat = episode_rewards(terms, meas, final, panicked, cfg=cfg, rollback_penalty=2.0)
    nested = episode_rewards(
        terms.reshape(2, 3, 4), meas.reshape(2, 3, 4), final.reshape(2, 3), panicked.reshape(2, 3, 4),
        cfg=cfg, rollback_penalty=2.0,
    )  # fmt: skip
    assert torch.equal(nested["total"].reshape(6, 4), flat["total"])
    with pytest.raises(ValueError, match="panicked"):
        episode_rewards(terms, meas, final, panicked[:, :3], cfg=cfg, rollback_penalty=2.0)
    with pytest.raises(ValueError, match="final"):
        episode_rewards(terms, meas, final[:2], panicked, cfg=cfg, rollback_penalty=2.0)


# ------------------------------------------------------------------------ LOSS calibration (M4)
def test_M4_loss_terminal_is_calibrated_to_the_tasks_chance_loss():
    """Review 001 M4: the LOSS terminal's baseline was CIFAR-10's ln 10, so a byte-level LM (ln 256 = 5.55
    at the start) read 0 until its loss fell below 2.3. Unset, the baseline is the task's chance loss and
    the target LOSS_TARGET_SHARE of it (0.3 on a 10-class task, the reference's); given, they stay."""
    base = RewardConfig(mode=SHAPED, family=RewardFamily.LOSS)
    assert base.loss_baseline is None and base.loss_target is None
    ten = with_loss_calibration(base, math.log(10))
    assert ten.loss_baseline == pytest.approx(math.log(10)) and ten.loss_target == pytest.approx(0.3)
    lm = with_loss_calibration(base, math.log(256))
    assert lm.loss_baseline == pytest.approx(math.log(256))
    assert lm.loss_target == pytest.approx(LOSS_TARGET_SHARE * math.log(256))
    slots = init_slots(1, [True] * 3)
    end, _, _ = reward(slots, val_loss=4.0, epoch=25, cfg=lm)  # above ln 10: the old calibration read 0
    assert one(end, "terminal") == pytest.approx((math.log(256) - 4.0) / (math.log(256) - lm.loss_target))
    assert 0.0 < one(end, "terminal") < 1.0
    given = RewardConfig(mode=SHAPED, family=RewardFamily.LOSS, loss_baseline=3.0, loss_target=1.0)
    assert with_loss_calibration(given, math.log(256)) is given
    half = with_loss_calibration(RewardConfig(loss_target=1.0), math.log(256))
    assert (half.loss_baseline, half.loss_target) == (pytest.approx(math.log(256)), 1.0)
    with pytest.raises(ValueError, match="loss_target .* below the loss baseline"):
        with_loss_calibration(RewardConfig(loss_target=3.0), math.log(10))
    with pytest.raises(ValueError, match="chance loss"):
        with_loss_calibration(base, 0.0)
    with pytest.raises(ValueError, match="with_loss_calibration"):
        reward(slots, val_loss=4.0, epoch=25, cfg=base)
