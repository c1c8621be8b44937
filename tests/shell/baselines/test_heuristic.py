"""The heuristic controller (the original system's rules) on hand-built slot states and signals: each
rule, the order of the no-seed rules, the rotation of blueprints, and legality of every action it emits."""

from __future__ import annotations

import random

import pytest
import torch
from tensordict import TensorDict

from esper.core.lifecycle import LifecycleConfig, init_slots, lifecycle_step
from esper.core.masks import legal_masks
from esper.core.spec import (
    ALPHA_TARGETS,
    HEADS,
    ActionSpec,
    AlphaCurve,
    AlphaSpeed,
    Op,
    Stage,
    Style,
    Tempo,
)
from esper.shell.baselines.heuristic import HeuristicController
from esper.shell.env.step import StepInput
from esper.shell.host.blueprints import BLUEPRINTS

CNN = BLUEPRINTS["cnn"]
LC = LifecycleConfig()


# -------------------------------------------------------------------------------------------- helpers
def slots_of(*stages: Stage, enabled: tuple[bool, ...] | None = None, n_envs: int = 1) -> TensorDict:
    """Slot state ``[n_envs, S]`` with the given stages; live seeds are old enough to prune and not
    ramping (so every op the stage allows is legal)."""
    en = enabled if enabled is not None else (True,) * len(stages)
    slots = init_slots(n_envs, en)
    for k, st in enumerate(stages):
        slots["stage"][:, k] = int(st)
        if st not in (Stage.DORMANT, Stage.EMBARGOED):
            slots["age"][:, k] = 10
            slots["alpha"][:, k] = 1.0 if st in (Stage.HOLDING, Stage.FOSSILIZED) else 0.0
        if st == Stage.EMBARGOED:
            slots["embargo"][:, k] = 3
    return slots


def put(slots: TensorDict, k: int, env: int = 0, **fields) -> TensorDict:
    for name, value in fields.items():
        slots[name][env, k] = value
    return slots


def step(slots: TensorDict, *, acc, loss, epoch, names=CNN, lc: LifecycleConfig = LC) -> StepInput:
    E = slots.batch_size[0]
    per_env = lambda v, dt: torch.tensor(v if isinstance(v, list) else [v] * E, dtype=dt)
    signals = TensorDict(
        {
            "val_acc": per_env(acc, torch.float32),
            "val_loss": per_env(loss, torch.float32),
            "epoch": per_env(epoch, torch.int64),
        },
        batch_size=[E],
    )
    spec = ActionSpec(n_slots=slots.batch_size[1], n_blueprints=len(names))
    legal = legal_masks(slots, spec, max_seeds=lc.max_seeds, min_prune_age=lc.min_prune_age)
    return StepInput(torch.zeros(E, 3), legal, slots, signals, TensorDict({}, batch_size=[E]))


def decide(ctl: HeuristicController, slots: TensorDict, **signals) -> tuple[TensorDict, StepInput]:
    s = step(slots, **signals, names=ctl.names, lc=ctl.lc)
    return ctl.act(s), s


def ready_controller(n_envs: int = 1, names=CNN, lc: LifecycleConfig = LC, **kw) -> HeuristicController:
    """A controller whose envs are stabilised and on a plateau (epochs 1-4 with calm loss, flat acc),
    so the next call at epoch >= 5 on empty slots germinates."""
    ctl = HeuristicController(names, lc, **kw)
    ctl.begin(n_envs)
    empty = slots_of(Stage.DORMANT, Stage.DORMANT, n_envs=n_envs)
    for epoch, loss in zip(range(1, 5), (1.00, 0.99, 0.98, 0.97), strict=True):
        out, _ = decide(ctl, empty, acc=50.0, loss=loss, epoch=epoch)
        assert out["op", "action"].tolist() == [int(Op.WAIT)] * n_envs
    return ctl


def op_slot(out: TensorDict, env: int = 0) -> tuple[Op, int]:
    return Op(int(out["op", "action"][env])), int(out["slot", "action"][env])


def assert_legal(out: TensorDict, s: StepInput) -> None:
    """Every env's (op, slot) is allowed by the legality masks, and every head's index is in range."""
    sizes = ActionSpec(n_slots=s.slots.batch_size[1], n_blueprints=s.legal["blueprint"].shape[-1]).sizes
    for h in HEADS:
        a = out[h, "action"]
        assert a.dtype == torch.int64 and bool(((a >= 0) & (a < sizes[h])).all()), (h, a)
    for i in range(s.slots.batch_size[0]):
        op, slot = op_slot(out, i)
        assert bool(s.legal["slot_by_op"][i, int(op), slot]), f"env {i}: {op.name} on slot {slot} is illegal"


# ---------------------------------------------------------------------------------- no live seed
def test_no_seed_rules_in_order_then_germinates_first_empty_slot():
    ctl = HeuristicController(CNN, LC)
    ctl.begin(1)
    slots = slots_of(Stage.FOSSILIZED, Stage.DORMANT, Stage.DORMANT)  # slot 0 taken: first empty is 1
    reasons = []
    for epoch, loss in zip(range(1, 6), (1.00, 0.99, 0.98, 0.97, 0.96), strict=True):
        out, s = decide(ctl, slots, acc=50.0, loss=loss, epoch=epoch)
        assert_legal(out, s)
        reasons.append(ctl.last_reasons[0])
        if epoch < 5:
            assert op_slot(out)[0] == Op.WAIT
    # stabilisation latches after 3 calm epochs (epoch 4), which is still before min_epoch 5
    assert all("not yet stabilised" in r for r in reasons[:3]), reasons
    assert "epoch 4 < 5" in reasons[3]
    assert op_slot(out) == (Op.GERMINATE, 1)
    assert CNN[int(out["blueprint", "action"])] == "conv_light"  # the rotation starts with conv_light
    assert "germinate conv_light" in reasons[4]
    assert int(out["style", "action"]) == int(Style.SIGMOID_ADD)
    assert int(out["tempo", "action"]) == int(Tempo.STANDARD)
    assert ALPHA_TARGETS[int(out["alpha_target", "action"])] == 1.0


def test_waits_while_the_host_is_not_stabilised():
    ctl = HeuristicController(CNN, LC)
    ctl.begin(1)
    empty = slots_of(Stage.DORMANT, Stage.DORMANT)
    loss = 2.0
    for epoch in range(1, 12):  # loss falls 10 % per epoch: never calm, never stabilised
        loss *= 0.9
        out, _ = decide(ctl, empty, acc=50.0, loss=loss, epoch=epoch)
        assert op_slot(out)[0] == Op.WAIT
        assert ctl.last_reasons == ["host not yet stabilised"]


def test_a_loss_rise_restarts_the_stability_count():
    ctl = HeuristicController(CNN, LC)
    ctl.begin(1)
    empty = slots_of(Stage.DORMANT)
    for epoch, loss in enumerate((1.0, 0.99, 0.98, 1.2, 1.19, 1.18), start=1):  # rise at epoch 4
        decide(ctl, empty, acc=50.0, loss=loss, epoch=epoch + 10)
        assert ctl.last_reasons == ["host not yet stabilised"], (epoch, ctl.last_reasons)
    decide(ctl, empty, acc=50.0, loss=1.17, epoch=17)  # third calm epoch after the rise
    assert "stabilised" not in ctl.last_reasons[0]


def test_waits_while_accuracy_still_improves_then_germinates_on_plateau():
    ctl = ready_controller()
    empty = slots_of(Stage.DORMANT, Stage.DORMANT)
    acc = 50.0
    for epoch in range(5, 9):  # +1 point per epoch: the plateau counter restarts each time
        acc += 1.0
        out, _ = decide(ctl, empty, acc=acc, loss=0.96, epoch=epoch)
        assert op_slot(out)[0] == Op.WAIT and "improving" in ctl.last_reasons[0]
    for epoch in range(9, 11):
        out, _ = decide(ctl, empty, acc=acc + 0.1, loss=0.96, epoch=epoch)
        assert op_slot(out)[0] == Op.WAIT  # plateau 1, 2 < 3
    out, _ = decide(ctl, empty, acc=acc + 0.1, loss=0.96, epoch=11)
    assert op_slot(out) == (Op.GERMINATE, 0)


def test_no_empty_enabled_slot_means_wait():
    ctl = ready_controller()
    slots = slots_of(Stage.FOSSILIZED, Stage.DORMANT, enabled=(True, False))
    out, s = decide(ctl, slots, acc=50.0, loss=0.96, epoch=5)
    assert op_slot(out)[0] == Op.WAIT and ctl.last_reasons == ["no empty slot"]
    assert_legal(out, s)


def test_a_germinated_seed_is_live_no_second_seed_is_germinated():
    """The step after GERMINATE the slot is GERMINATED (G1 promotes it at that step's end): the seed
    is live, so the no-seed rules (and a second germination) must not run."""
    ctl = ready_controller()
    slots = slots_of(Stage.GERMINATED, Stage.DORMANT)
    slots = put(slots, 0, blueprint=CNN.index("conv_light"), age=0)
    out, s = decide(ctl, slots, acc=50.0, loss=0.96, epoch=5)
    assert op_slot(out)[0] == Op.WAIT, ctl.last_reasons
    assert_legal(out, s)


def test_germinate_then_lifecycle_then_no_double_germination():
    """Closed loop through the core lifecycle: one germination, then the seed is left to train."""
    ctl = ready_controller()
    slots = slots_of(Stage.DORMANT, Stage.DORMANT, Stage.DORMANT)
    ops = []
    for epoch in range(5, 10):
        out, s = decide(ctl, slots, acc=50.0, loss=0.96, epoch=epoch)
        assert_legal(out, s)
        action = TensorDict({h: out[h, "action"] for h in HEADS}, batch_size=[1])
        slots, events = lifecycle_step(slots, action, s.signals, LC, n_blueprints=len(CNN))
        assert not bool(events["illegal"].any())
        ops.append(Op(int(out["op", "action"][0])))
    assert ops.count(Op.GERMINATE) == 1, ops
    assert (slots["stage"][0] != int(Stage.DORMANT)).sum() == 1


# ----------------------------------------------------------------------------- TRAINING / BLENDING
def test_prunes_a_training_seed_that_hurts():
    ctl = ready_controller()
    slots = put(slots_of(Stage.TRAINING, Stage.DORMANT), 0, epochs_in_stage=5, acc_at_stage_start=60.0)
    out, s = decide(ctl, slots, acc=57.0, loss=0.96, epoch=12)  # lost 3 points over 5 epochs
    assert op_slot(out) == (Op.PRUNE, 0)
    assert "lost 3.0 pts" in ctl.last_reasons[0]
    assert int(out["alpha_speed", "action"]) == int(AlphaSpeed.INSTANT)
    assert int(out["alpha_curve", "action"]) == int(AlphaCurve.LINEAR)
    assert_legal(out, s)


@pytest.mark.parametrize(
    ("eis", "acc", "op"),
    [
        (4, 50.0, Op.ADVANCE),  # lost 10 points but only 4 epochs in the stage: not pruned yet
        (5, 58.5, Op.ADVANCE),  # lost 1.5 points: under the 2-point threshold
        (2, 60.0, Op.WAIT),  # dwell 2 < g2_min_epochs 3
        (3, 60.0, Op.ADVANCE),  # dwell reached: ADVANCE, the G2 gate decides
    ],
)
def test_training_seed_waits_for_its_dwell_then_advances(eis, acc, op):
    ctl = ready_controller()
    slots = put(slots_of(Stage.TRAINING), 0, epochs_in_stage=eis, acc_at_stage_start=60.0)
    out, s = decide(ctl, slots, acc=acc, loss=0.96, epoch=12)
    assert op_slot(out) == (op, 0), ctl.last_reasons
    assert_legal(out, s)


@pytest.mark.parametrize(("ramp_pos", "op"), [(2, Op.WAIT), (5, Op.ADVANCE)])
def test_blending_seed_advances_only_once_its_ramp_finished(ramp_pos, op):
    ctl = ready_controller()
    slots = slots_of(Stage.BLENDING)
    slots = put(slots, 0, epochs_in_stage=LC.g3_min_epochs, ramp_pos=ramp_pos, ramp_len=5, alpha=0.5)
    out, s = decide(ctl, slots, acc=60.0, loss=0.96, epoch=12)
    assert op_slot(out) == (op, 0), ctl.last_reasons
    assert_legal(out, s)


# ------------------------------------------------------------------------------------------ HOLDING
@pytest.mark.parametrize(
    ("contribution", "acc", "op", "reason"),
    [
        (LC.g5_min_contribution, 61.0, Op.FOSSILIZE, "fossilize"),
        (3.0, 61.0, Op.FOSSILIZE, "fossilize"),
        (0.5, 61.0, Op.WAIT, "holding"),
        (0.0, 61.0, Op.PRUNE, "<= 0: prune"),
        (-1.0, 61.0, Op.PRUNE, "<= 0: prune"),
        (3.0, 59.0, Op.PRUNE, "ransomware"),  # helps by 3 points, yet the host is worse than at germination
    ],
)
def test_holding_rules(contribution, acc, op, reason):
    ctl = ready_controller()
    slots = slots_of(Stage.DORMANT, Stage.HOLDING)
    slots = put(slots, 1, contribution=contribution, acc_at_germination=60.0, epochs_in_stage=1)
    out, s = decide(ctl, slots, acc=acc, loss=0.96, epoch=15)
    assert op_slot(out) == (op, 1), ctl.last_reasons
    assert reason in ctl.last_reasons[0]
    assert_legal(out, s)


def test_a_fossilize_it_chooses_passes_the_g5_gate():
    ctl = ready_controller()
    slots = put(slots_of(Stage.HOLDING), 0, contribution=1.5, acc_at_germination=60.0)
    out, s = decide(ctl, slots, acc=61.0, loss=0.96, epoch=15)
    action = TensorDict({h: out[h, "action"] for h in HEADS}, batch_size=[1])
    new, events = lifecycle_step(slots, action, s.signals, LC, n_blueprints=len(CNN))
    assert bool(events["fossilized"][0, 0]) and int(new["stage"][0, 0]) == int(Stage.FOSSILIZED)


# ------------------------------------------------------------------------------- prune, cooldown
def test_cooldown_after_a_prune_then_next_blueprint_of_the_rotation():
    ctl = ready_controller()
    out, _ = decide(ctl, slots_of(Stage.DORMANT), acc=50.0, loss=0.96, epoch=5)
    assert CNN[int(out["blueprint", "action"])] == "conv_light"
    hurting = put(slots_of(Stage.TRAINING), 0, epochs_in_stage=6, acc_at_stage_start=60.0,
                  blueprint=CNN.index("conv_light"))  # fmt: skip
    out, _ = decide(ctl, hurting, acc=55.0, loss=0.96, epoch=6)
    assert op_slot(out) == (Op.PRUNE, 0)
    for epoch in range(7, 12):
        out, _ = decide(ctl, slots_of(Stage.DORMANT), acc=55.0, loss=0.96, epoch=epoch)
        assert op_slot(out)[0] == Op.WAIT and "cooldown" in ctl.last_reasons[0]
    out, _ = decide(ctl, slots_of(Stage.DORMANT), acc=55.0, loss=0.96, epoch=12)
    assert op_slot(out)[0] == Op.GERMINATE
    assert CNN[int(out["blueprint", "action"])] == "conv_heavy"


# ------------------------------------------------------------------------------- action space
@pytest.mark.parametrize("family", sorted(BLUEPRINTS))
def test_rotation_covers_every_blueprint_but_noop_inside_the_blueprint_head(family):
    names = BLUEPRINTS[family]
    ctl = ready_controller(names=names)
    picked = []
    for epoch in range(5, 5 + 2 * (len(names) - 1)):
        out, s = decide(ctl, slots_of(Stage.DORMANT, Stage.DORMANT), acc=50.0, loss=0.96, epoch=epoch)
        assert op_slot(out) == (Op.GERMINATE, 0)
        assert_legal(out, s)
        action = TensorDict({h: out[h, "action"] for h in HEADS}, batch_size=[1])
        _, events = lifecycle_step(s.slots, action, s.signals, LC, n_blueprints=len(names))
        assert bool(events["germinated"][0, 0])  # G0 passes: the index is in the policy's blueprint head
        picked.append(names[int(out["blueprint", "action"])])
    assert set(picked) == set(names) - {"noop"}
    assert picked[: len(names) - 1] == picked[len(names) - 1 :]  # a fixed rotation
    preferred = [n for n in ("conv_light", "conv_heavy", "attention", "norm", "depthwise") if n in names]
    assert picked[: len(preferred)] == preferred  # the reference's order comes first


def test_wait_is_emitted_on_an_enabled_slot():
    """WAIT is legal only on an enabled slot; with slot 0 disabled the heuristic must not WAIT on it
    (the lifecycle would flag it illegal and the reward would charge it)."""
    ctl = HeuristicController(CNN, LC)
    ctl.begin(1)
    slots = slots_of(Stage.DORMANT, Stage.DORMANT, Stage.DORMANT, enabled=(False, True, True))
    out, s = decide(ctl, slots, acc=50.0, loss=1.0, epoch=1)
    assert op_slot(out)[0] == Op.WAIT
    assert_legal(out, s)
    action = TensorDict({h: out[h, "action"] for h in HEADS}, batch_size=[1])
    _, events = lifecycle_step(slots, action, s.signals, LC, n_blueprints=len(CNN))
    assert not bool(events["illegal"].any())


def test_an_illegal_choice_becomes_wait_with_a_reason():
    lc = LifecycleConfig(max_seeds=1)  # a fossilized seed fills the quota: GERMINATE is illegal
    ctl = ready_controller(lc=lc)
    slots = slots_of(Stage.FOSSILIZED, Stage.DORMANT)
    out, s = decide(ctl, slots, acc=50.0, loss=0.96, epoch=5)
    assert op_slot(out)[0] == Op.WAIT
    assert "GERMINATE not legal on slot 1" in ctl.last_reasons[0]
    assert_legal(out, s)


def test_envs_are_independent_and_every_env_gets_a_reason():
    ctl = ready_controller(n_envs=3)
    slots = slots_of(Stage.DORMANT, Stage.DORMANT, n_envs=3)
    hurting = {"stage": int(Stage.TRAINING), "age": 10, "epochs_in_stage": 6, "acc_at_stage_start": 60.0}
    slots = put(slots, 0, env=1, **hurting)
    out, s = decide(ctl, slots, acc=[50.0, 50.0, 50.0], loss=[0.96, 0.96, 0.96], epoch=[5, 5, 3])
    assert [op_slot(out, i)[0] for i in range(3)] == [Op.GERMINATE, Op.PRUNE, Op.WAIT]
    assert len(ctl.last_reasons) == 3 and all(ctl.last_reasons)
    assert_legal(out, s)
    ctl.begin(3)  # a new episode forgets stabilisation
    out, _ = decide(ctl, slots_of(Stage.DORMANT, n_envs=3), acc=50.0, loss=0.96, epoch=5)
    assert ctl.last_reasons == ["host not yet stabilised"] * 3


def test_every_action_is_legal_on_random_states():
    """Random slot states (stages, enabled slots, ramps, ages, contributions, seed quota) and a warm
    controller: the emitted (op, slot) is always allowed by the masks and the lifecycle flags nothing."""
    rng = random.Random(0)
    for trial in range(60):
        lc = LifecycleConfig(max_seeds=rng.choice([0, 1, 2]), min_prune_age=rng.choice([0, 1, 3]))
        ctl = ready_controller(n_envs=4, lc=lc, cooldown=rng.choice([0, 5]))
        S = rng.randint(1, 4)
        enabled = torch.tensor([[rng.random() < 0.8 for _ in range(S)] for _ in range(4)])
        enabled[:, rng.randrange(S)] = True  # at least one enabled slot per env
        slots = init_slots(4, enabled)
        stage = torch.tensor([[rng.randrange(len(Stage)) for _ in range(S)] for _ in range(4)])
        slots["stage"] = torch.where(enabled, stage, int(Stage.DORMANT))
        slots["epochs_in_stage"] = torch.randint(0, 8, (4, S))
        slots["age"] = torch.randint(0, 8, (4, S))
        slots["ramp_len"] = torch.randint(0, 4, (4, S))
        slots["ramp_pos"] = torch.minimum(torch.randint(0, 5, (4, S)), slots["ramp_len"])
        slots["contribution"] = torch.randn(4, S) * 2
        slots["acc_at_stage_start"] = 50 + torch.randn(4, S) * 5
        slots["acc_at_germination"] = 50 + torch.randn(4, S) * 5
        slots["blueprint"] = torch.randint(0, len(CNN), (4, S))
        acc = [50 + rng.uniform(-5, 5) for _ in range(4)]
        out, s = decide(ctl, slots, acc=acc, loss=0.96, epoch=rng.randint(1, 20))
        assert_legal(out, s)
        assert len(ctl.last_reasons) == 4
        action = TensorDict({h: out[h, "action"] for h in HEADS}, batch_size=[4])
        _, events = lifecycle_step(slots, action, s.signals, lc, n_blueprints=len(CNN))
        assert not bool(events["illegal"].any()), (trial, ctl.last_reasons)


# ----------------------------------------------------------------------- the predicted-decrease trigger
GAIN_LC = LifecycleConfig(grad_init=True)


def gain_decide(ctl: HeuristicController, slots: TensorDict, gains: list[float], **signals):
    s = step(slots, **signals, names=ctl.names, lc=ctl.lc)
    s.signals["slots"] = TensorDict({"grad_gain_rms": torch.tensor([gains])}, batch_size=slots.batch_size)
    return ctl.act(s), s


def test_the_gain_trigger_needs_the_slot_statistics():
    with pytest.raises(ValueError, match="lifecycle.grad_init"):
        HeuristicController(CNN, LC, gain_trigger=0.02)
    HeuristicController(CNN, LifecycleConfig(grad_gain_features=True), gain_trigger=0.02)


def test_the_gain_trigger_germinates_where_the_predicted_decrease_per_parameter_is_largest():
    """Issue 91 item 5: after the same waits, the heuristic with ``gain_trigger`` germinates into the
    empty slot whose predicted decrease per parameter is largest once it reaches the trigger, while
    accuracy still improves (no plateau); below it, it waits; a plateau still germinates there."""
    ctl = HeuristicController(CNN, GAIN_LC, gain_trigger=0.02)
    ctl.begin(1)
    slots = slots_of(Stage.DORMANT, Stage.DORMANT, Stage.FOSSILIZED)
    for epoch, loss in zip(range(1, 5), (1.00, 0.99, 0.98, 0.97), strict=True):  # stabilise, improving
        out, _ = gain_decide(ctl, slots, [0.5, 0.9, 0.9], acc=40.0 + 2 * epoch, loss=loss, epoch=epoch)
        assert op_slot(out)[0] == Op.WAIT
    out, s = gain_decide(ctl, slots, [0.01, 0.015, 0.9], acc=50.0, loss=0.96, epoch=5)  # slot 2 is taken
    assert op_slot(out)[0] == Op.WAIT and "predicted decrease 0.0150 < 0.02" in ctl.last_reasons[0]
    out, s = gain_decide(ctl, slots, [0.01, 0.03, 0.9], acc=52.0, loss=0.95, epoch=6)
    assert_legal(out, s)
    assert op_slot(out) == (Op.GERMINATE, 1)
    assert "predicted decrease 0.0300: germinate conv_light in slot 1" in ctl.last_reasons[0]
    # the plain heuristic, on the same signals, waits for a plateau and takes the first empty slot
    plain = ready_controller(names=CNN, lc=GAIN_LC)
    two = slots_of(Stage.DORMANT, Stage.DORMANT)
    out, _ = gain_decide(plain, two, [0.0, 0.9], acc=50.0, loss=0.96, epoch=5)
    assert op_slot(out) == (Op.GERMINATE, 0)
    # on a plateau the gain heuristic germinates below its trigger, in the slot of the largest decrease
    flat = HeuristicController(CNN, GAIN_LC, gain_trigger=0.02)
    flat.begin(1)
    for epoch, loss in zip(range(1, 6), (1.00, 0.99, 0.98, 0.97, 0.96), strict=True):  # calm and flat
        out, _ = gain_decide(flat, two, [0.001, 0.002], acc=50.0, loss=loss, epoch=epoch)
    assert op_slot(out) == (Op.GERMINATE, 1) and "plateau" in flat.last_reasons[0]
