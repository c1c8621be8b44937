"""Lifecycle, observation and rewards under torch.compile(fullgraph=True): no graph break, compiled ==
eager, on a state with a seed in every stage."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch

from esper.core.lifecycle import (
    LifecycleConfig,
    alpha_at,
    clear_seeds,
    gate_readiness,
    init_slots,
    lifecycle_step,
    record_signals,
)
from esper.core.masks import legal_masks
from esper.core.observation import (
    controller_inputs,
    init_history,
    observe,
    split_observation,
    update_history,
)
from esper.core.reward_config import with_loss_calibration
from esper.core.rewards import RewardConfig, RewardFamily, RewardMode, compute_reward
from esper.core.spec import ActionSpec, AlphaCurve, Op, Stage, Tempo
from tests.core.test_lifecycle import N_BP, make_action, make_signals

LC = LifecycleConfig(g2_min_epochs=1, g3_min_epochs=1)


def busy_state():
    """Two envs x four slots, driven through a scripted episode so that every stage is present."""
    E, S = 2, 4
    slots = init_slots(E, [True, True, True, False])
    plan = {
        1: ([Op.GERMINATE, Op.GERMINATE], [0, 0]),
        2: ([Op.GERMINATE, Op.GERMINATE], [1, 1]),
        4: ([Op.ADVANCE, Op.ADVANCE], [0, 0]),
        5: ([Op.ADVANCE, Op.GERMINATE], [1, 2]),
        6: ([Op.WAIT, Op.PRUNE], [0, 1]),
        7: ([Op.ADVANCE, Op.ADVANCE], [0, 0]),
        8: ([Op.FOSSILIZE, Op.WAIT], [0, 0]),
        9: ([Op.GERMINATE, Op.WAIT], [2, 0]),
    }
    history = init_history(E)
    for t in range(1, 11):
        ops, slot = plan.get(t, ([Op.WAIT, Op.WAIT], [0, 0]))
        signals = make_signals(
            E, S, epoch=t, val_acc=30.0 + 2 * t, contribution=2.0, grad_ratio=0.5, seed_params=50.0
        )
        slots = record_signals(slots, signals, LC)
        history = update_history(history, signals)
        action = make_action(
            E, torch.tensor([int(o) for o in ops]), torch.tensor(slot), tempo=Tempo.FAST, blueprint=1
        )
        if t < 10:
            slots, _ = lifecycle_step(slots, action, signals, LC, n_blueprints=N_BP)
    stages = set(slots["stage"].flatten().tolist())
    assert len(stages) >= 5, stages
    return slots, action, signals, history


def test_lifecycle_step_compiles(compile_check):
    """One compile, every op: env k of six copies of the state applies op k."""
    slots, action, signals, _ = busy_state()
    rows = torch.tensor([0, 1] * 3)
    action = make_action(
        6, torch.arange(len(Op)), torch.tensor([0, 1, 0, 0, 0, 0]), tempo=Tempo.FAST, blueprint=1
    )
    action["alpha_speed"] = torch.tensor([0, 1, 2, 3, 1, 2])
    action["alpha_curve"] = torch.tensor([0, 1, 2, 3, 4, 2])
    fn = lambda s, a, g: lifecycle_step(s, a, g, LC, n_blueprints=N_BP)
    compile_check(fn, slots[rows], action, signals[rows])


def test_record_signals_gates_and_clear_seeds_compile(compile_check):
    slots, _, signals, _ = busy_state()
    compile_check(lambda s, g: record_signals(s, g, LC), slots, signals)
    compile_check(lambda s, v: gate_readiness(s, v, LC), slots, signals["val_acc"])
    # G2 on the seeds' own what-if gain (lifecycle.g2_evidence what_if), recorded from the signals
    what_if = dataclasses.replace(LC, g2_evidence="what_if")
    signals["slots", "whatif_gain"] = torch.full(signals["slots"].batch_size, 1.5)
    compile_check(lambda s, g: record_signals(s, g, what_if), slots, signals)
    compile_check(lambda s, v: gate_readiness(s, v, what_if), slots, signals["val_acc"])
    either = dataclasses.replace(LC, g2_evidence="either")
    compile_check(lambda s, v: gate_readiness(s, v, either), slots, signals["val_acc"])
    compile_check(clear_seeds, slots, torch.tensor([True, False]))
    compile_check(lambda n: init_slots(n, [True, False]), 3)


def test_alpha_at_compiles(compile_check):
    curve = torch.arange(len(AlphaCurve)).repeat_interleave(9)
    pos = torch.arange(9).repeat(len(AlphaCurve))
    compile_check(
        alpha_at, curve, pos, torch.full_like(pos, 8), torch.full((45,), 0.2), torch.full((45,), 0.9)
    )


def test_observe_and_history_compile(compile_check):
    slots, _, signals, history = busy_state()
    compile_check(update_history, history, signals)
    fn = lambda g, h, s: observe(g, h, s, max_epochs=25, n_blueprints=N_BP, lifecycle_cfg=LC)
    compile_check(fn, signals, history, slots)
    # with the seed gradient-health features (lifecycle.seed_grad_features, issue 47)
    on = dataclasses.replace(LC, seed_grad_features=True)
    for k, v in (("seed_grad_norm", 3.0), ("seed_grad_vanishing", 0.25), ("seed_grad_exploding", 0.0)):
        signals["slots", k] = torch.full(signals["slots"].batch_size, v)
    fn = lambda g, h, s: observe(g, h, s, max_epochs=25, n_blueprints=N_BP, lifecycle_cfg=on)
    compile_check(fn, signals, history, slots)
    # its split into the global part, the slot features and the blueprint one-hot (ppo.policy set, issue 46)
    obs = observe(signals, history, slots, max_epochs=25, n_blueprints=N_BP, lifecycle_cfg=on)
    compile_check(lambda x: split_observation(x, slots.batch_size[-1], N_BP), obs)
    # and with the slots' predicted-decrease features (lifecycle.grad_gain_features, issue 91 item 5)
    both = dataclasses.replace(on, grad_gain_features=True)
    signals["slots", "grad_gain"] = torch.rand(signals["slots"].batch_size)
    signals["slots", "grad_gain_rms"] = torch.rand(signals["slots"].batch_size)
    fn = lambda g, h, s: observe(g, h, s, max_epochs=25, n_blueprints=N_BP, lifecycle_cfg=both)
    compile_check(fn, signals, history, slots)
    obs = observe(signals, history, slots, max_epochs=25, n_blueprints=N_BP, lifecycle_cfg=both)
    compile_check(lambda x: split_observation(x, slots.batch_size[-1], N_BP), obs)


@pytest.mark.parametrize("gate_masks", [False, True])
def test_controller_inputs_compile_and_are_observe_and_the_legal_masks(compile_check, gate_masks):
    """The one rule the env and the Grower share: the observation and the legality masks."""
    slots, _, signals, history = busy_state()
    lc = dataclasses.replace(LC, gate_masks=gate_masks)
    spec = ActionSpec(slots.batch_size[-1], N_BP)
    raw, legal = controller_inputs(signals, history, slots, spec, lc)
    assert torch.equal(raw, observe(signals, history, slots, max_epochs=lc.max_epochs, n_blueprints=N_BP,
                                    lifecycle_cfg=lc))  # fmt: skip
    gates = gate_readiness(slots, signals["val_acc"], lc) if gate_masks else None
    expected = legal_masks(slots, spec, max_seeds=lc.max_seeds, min_prune_age=lc.min_prune_age, gates=gates,
                           auto_advance=lc.auto_advance, prune_below=lc.prune_floor,
                           mask_same_alpha=lc.mask_same_alpha)  # fmt: skip
    assert (legal == expected).all()
    compile_check(lambda g, h, s: controller_inputs(g, h, s, spec, lc), signals, history, slots)


@pytest.mark.parametrize(
    "cfg",
    [
        RewardConfig(),
        RewardConfig(mode=RewardMode.SHAPED),
        with_loss_calibration(RewardConfig(mode=RewardMode.SHAPED, family=RewardFamily.LOSS), math.log(10)),
        RewardConfig(mode=RewardMode.SPARSE),
        RewardConfig(mode=RewardMode.MINIMAL),
    ],
    ids=["objective", "shaped", "loss", "sparse", "minimal"],
)
def test_compute_reward_compiles(compile_check, cfg):
    slots, action, signals, history = busy_state()
    action["op"] = torch.tensor([int(Op.PRUNE), int(Op.WAIT)])
    signals["epoch"] = torch.tensor([8, 25])
    new, events = lifecycle_step(slots, action, signals, LC, n_blueprints=N_BP)
    fn = lambda *args: compute_reward(*args, gamma=0.99, cfg=cfg, max_epochs=25)
    compile_check(fn, slots, action, new, events, signals, history)


def test_busy_state_has_the_deep_stages():
    slots, *_ = busy_state()
    stages = set(slots["stage"].flatten().tolist())
    want = {
        Stage.GERMINATED,
        Stage.TRAINING,
        Stage.BLENDING,
        Stage.HOLDING,
        Stage.FOSSILIZED,
        Stage.EMBARGOED,
    }
    assert {int(s) for s in want} <= stages


def test_objective_and_its_delta_compile(compile_check):
    from esper.core.rewards import PARAM_SHARES, objective, objective_delta

    _, _, signals, _ = busy_state()
    signals["slots", "alpha"] = torch.tensor([[0.0, 0.5, 1.0, 0.0], [0.3, 0.0, 1.0, 1.0]])
    after = signals.clone()
    after["val_acc"] = after["val_acc"] + torch.tensor([3.0, -1.0])
    for share, budget in zip(PARAM_SHARES, (0.0, 300.0)):
        cfg = RewardConfig(param_share=share, param_budget=budget)
        compile_check(functools.partial(objective, cfg=cfg), signals)
        compile_check(functools.partial(objective, cfg=cfg, final=True), signals)
        compile_check(functools.partial(objective_delta, cfg=cfg, final=True), signals, after)


@pytest.mark.parametrize(
    "cfg", [RewardConfig(), RewardConfig(mode=RewardMode.SHAPED)], ids=["objective", "shaped"]
)
def test_episode_rewards_compile(compile_check, cfg):
    """The learner's reward of an episode, from the stacked step terms, measurements and panics."""
    from esper.core.rewards import episode_rewards
    from tests.core.test_rewards import _episode

    terms, meas, final, panicked = _episode(E=3, T=5, seed=4)
    panicked[1, 0] = True
    fn = lambda *args: episode_rewards(*args, cfg=cfg, rollback_penalty=7.5)
    compile_check(fn, terms, meas, final, panicked)
