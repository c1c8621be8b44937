"""Issue 104, item 3: the lifecycle can keep a seed at its HOLDING deadline that pays in validation loss, not
only in accuracy (``lifecycle.keep_by``, an option; off, ``accuracy``, by default). The case from the issue:
a fully blended seed that more than halved the loss reached the deadline without adding a point of accuracy,
and was removed."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from esper.core.lifecycle import (
    KEEP_BY,
    LifecycleConfig,
    gate_readiness,
    init_slots,
    lifecycle_step,
    record_signals,
)
from esper.core.masks import op_slot_legality, seed_lowers_loss
from esper.core.spec import Op, Stage, Tempo
from tests.core.test_lifecycle import N_BP, fired, make_action, make_signals

#: The issue's seed: the validation loss 0.255 blended in, 0.660 with the seed at alpha 0; no accuracy.
BLENDED_LOSS, LOSS_WITHOUT = 0.255, 0.660


def _signals(t: int, *, contribution: float = 0.0, loss_drop: float = 0.0, val_loss: float = BLENDED_LOSS):
    sig = make_signals(1, 3, epoch=t, val_acc=30.0 + t, val_loss=val_loss, contribution=contribution,
                       grad_ratio=0.5)  # fmt: skip
    sig["slots", "loss_contribution"] = torch.full((1, 3), float(loss_drop))
    return sig


def _to_the_deadline(cfg: LifecycleConfig, **signals):
    """One env, slot 0: germinated at step 1 (tempo FAST, alpha target 1), blended at 6, held at 10, then
    WAIT through the HOLDING deadline (the end of step 15). Returns per step (pre_slots, new_slots,
    events)."""
    plan = {1: (Op.GERMINATE, {"tempo": Tempo.FAST, "alpha_target": 2, "blueprint": 1}), 6: (Op.ADVANCE, {}),
            10: (Op.ADVANCE, {})}  # fmt: skip
    slots = init_slots(1, [True, True, False])
    out = []
    for t in range(1, 18):
        op, heads = plan.get(t, (Op.WAIT, {}))
        sig = _signals(t, **signals)
        pre = record_signals(slots, sig, cfg)
        new, ev = lifecycle_step(pre, make_action(1, op, 0, **heads), sig, cfg, n_blueprints=N_BP)
        out.append((pre, new, ev))
        slots = new
    return out


def _deadline_cfg(keep_by: str, **kw) -> LifecycleConfig:
    return LifecycleConfig(timeout_fossilizes=True, timeout_ramp=True, keep_by=keep_by, **kw)


@pytest.mark.parametrize(("keep_by", "kept"), [("accuracy", False), ("loss", True), ("either", True)])
def test_issue104_keep_by_loss_keeps_a_seed_that_halves_the_loss(keep_by, kept):
    """A blended seed with 0 points of contribution that lowers the validation loss from 0.660 to 0.255 is
    kept at its deadline under ``loss`` and ``either`` (fossilized at the alpha it has), and pruned, ramped
    out over its tempo's epochs, under ``accuracy`` (today's rule)."""
    run = _to_the_deadline(_deadline_cfg(keep_by), loss_drop=LOSS_WITHOUT - BLENDED_LOSS)
    stages = [Stage(int(new["stage"][0, 0])) for _, new, _ in run]
    assert stages[9:14] == [Stage.HOLDING] * 5
    pre = run[14][0]  # the deadline step, as recorded
    assert float(pre["contribution"][0, 0]) == 0.0 and float(pre["alpha"][0, 0]) == 1.0
    torch.testing.assert_close(pre["loss_contribution"][0, 0], torch.tensor(LOSS_WITHOUT - BLENDED_LOSS))
    if kept:
        assert fired(run[14][2]) == {"timeout_fossilized"}
        assert stages[14:] == [Stage.FOSSILIZED] * 3
        assert [float(new["alpha"][0, 0]) for _, new, _ in run[14:]] == [1.0] * 3
    else:
        assert fired(run[14][2]) == {"timeout_pruned"} and stages[14:16] == [Stage.PRUNED] * 2
        alphas = [float(new["alpha"][0, 0]) for _, new, _ in run[13:17]]
        assert alphas[0] == 1.0 and 1.0 > alphas[1] > alphas[2] > alphas[3] == 0.0  # ramped out, as PRUNE
        assert fired(run[16][2]) == {"removed"}


@pytest.mark.parametrize(("keep_by", "kept"), [("accuracy", True), ("loss", False), ("either", True)])
def test_issue104_keep_by_either_keeps_a_seed_that_pays_in_accuracy_alone(keep_by, kept):
    """A seed worth 2 points of accuracy that leaves the loss where it was: ``either`` keeps it as
    ``accuracy`` does; ``loss`` reads the loss alone and prunes it."""
    run = _to_the_deadline(_deadline_cfg(keep_by), contribution=2.0, loss_drop=0.0)
    assert fired(run[14][2]) == ({"timeout_fossilized"} if kept else {"timeout_pruned"})


@pytest.mark.parametrize(
    ("loss_drop", "val_loss", "kept"),
    [
        (0.0530, 1.0, True),  # 0.053 / 1.053 = 5.03 % of the loss without the seed
        (0.0520, 1.0, False),  # 4.94 %
        (-0.3, 1.0, False),  # the seed raises the loss
        (0.0, 0.0, False),  # a perfect host either way: nothing lowered
        (0.5, float("nan"), False),  # no loss measured: keep nothing
    ],
)
def test_issue104_keep_by_loss_threshold_is_the_share_of_the_loss_without_the_seed(loss_drop, val_loss, kept):
    """``g5_min_loss_drop`` 0.05: kept where (loss at alpha 0 - loss blended) / loss at alpha 0 >= 5 %."""
    cfg = _deadline_cfg("loss")
    assert cfg.g5_min_loss_drop == 0.05
    run = _to_the_deadline(cfg, loss_drop=loss_drop, val_loss=val_loss)
    assert fired(run[14][2]) == ({"timeout_fossilized"} if kept else {"timeout_pruned"})


def test_issue104_seed_lowers_loss_needs_a_blended_seed():
    """``seed_lowers_loss`` slot by slot: alpha 0 never pays (no counterfactual), NaN reads as 0."""
    slots = init_slots(2, [True, True])
    slots["alpha"] = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    slots["loss_contribution"] = torch.tensor([[0.5, 0.5], [float("nan"), 0.2]])
    got = seed_lowers_loss(slots, torch.tensor([1.0, 0.1]), 0.05)
    assert got.tolist() == [[True, False], [False, True]]


def test_issue104_keep_by_reads_only_the_deadline_not_fossilize_nor_the_prune_gate():
    """Only the deadline reads ``keep_by``: FOSSILIZE's G5 (and so the gate mask and the policy's
    fossilize reward) and the prune gate still read the accuracy, so a seed that pays in loss alone is
    neither fossilized by the op nor protected from PRUNE; the controller's choices are as without the
    option until the deadline."""
    cfg = _deadline_cfg("either", prune_gate=True)
    run = _to_the_deadline(cfg, loss_drop=LOSS_WITHOUT - BLENDED_LOSS)
    holding = run[12][0]  # HOLDING, settled, not yet at the deadline
    assert int(holding["stage"][0, 0]) == Stage.HOLDING
    gates = gate_readiness(holding, torch.tensor([40.0]), cfg)
    assert not bool(gates["g5"][0, 0])
    legal = op_slot_legality(holding, gates=gates, prune_below=cfg.prune_floor)
    assert not bool(legal[0, int(Op.FOSSILIZE), 0]) and bool(legal[0, int(Op.PRUNE), 0])


def test_issue104_record_signals_records_the_loss_contribution_of_live_seeds():
    """``loss_contribution`` is recorded like ``contribution``: live seeds only, 0 where the signals hold
    none (a caller that does not measure it), and a new germination starts from 0."""
    cfg = LifecycleConfig()
    slots = init_slots(1, [True, True])
    germinate = make_action(1, Op.GERMINATE, 0)
    slots, _ = lifecycle_step(slots, germinate, make_signals(1, 2), cfg, n_blueprints=N_BP)
    sig = make_signals(1, 2)
    sig["slots", "loss_contribution"] = torch.tensor([[0.4, 0.7]])
    rec = record_signals(slots, sig, cfg)
    torch.testing.assert_close(rec["loss_contribution"], torch.tensor([[0.4, 0.0]]))
    assert record_signals(slots, make_signals(1, 2), cfg)["loss_contribution"].eq(0).all()
    regrown = rec.clone()  # the slot emptied (its field left as it was), then germinated again
    regrown["stage"][0, 0] = int(Stage.DORMANT)
    regrown, _ = lifecycle_step(regrown, germinate, sig, cfg, n_blueprints=N_BP)
    assert int(regrown["stage"][0, 0]) == Stage.GERMINATED
    assert float(regrown["loss_contribution"][0, 0]) == 0.0


@pytest.mark.parametrize("bad", [{"keep_by": "points"}, {"g5_min_loss_drop": 1.0}, {"g5_min_loss_drop": -0.1},
                                 {"g5_min_loss_drop": float("nan")}])  # fmt: skip
def test_issue104_keep_by_config_is_checked(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        LifecycleConfig(**bad)


def test_issue104_keep_by_is_off_by_default():
    assert LifecycleConfig().keep_by == "accuracy" and KEEP_BY == ("accuracy", "loss", "either")


@pytest.mark.parametrize("keep_by", KEEP_BY)
def test_issue104_the_deadline_with_keep_by_compiles(compile_check, keep_by):
    """The deadline's decision stays pure: ``lifecycle_step`` under each ``keep_by`` compiles with
    ``fullgraph=True`` and equals eager, on the deadline step of a seed that pays in loss (env 0) and of
    one that pays in nothing (env 1)."""
    cfg = dataclasses.replace(_deadline_cfg(keep_by), g5_min_loss_drop=0.1)
    pre = _to_the_deadline(cfg, loss_drop=LOSS_WITHOUT - BLENDED_LOSS)[14][0]
    slots = torch.cat([pre, pre.clone()], dim=0)
    slots["loss_contribution"][1] = 0.0
    sig = torch.cat([_signals(15), _signals(15)], dim=0)
    action = make_action(2, Op.WAIT, 0)
    fn = lambda s, a, g: lifecycle_step(s, a, g, cfg, n_blueprints=N_BP)
    _, events = compile_check(fn, slots, action, sig)  # the compiled output, checked against eager
    assert events["timeout_fossilized"][:, 0].tolist() == [keep_by != "accuracy", False]
    compile_check(lambda s, g: record_signals(s, g, cfg), slots, sig)
