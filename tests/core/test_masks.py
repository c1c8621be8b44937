"""Head relevance (one owner, P1) and op-conditioned legality masks."""

from __future__ import annotations

import pathlib

import pytest
import torch
from tensordict import TensorDict

import esper
from esper.core import masks
from esper.core.spec import HEADS, RELEVANCE, SLOT_FIELDS, ActionSpec, Op, Stage, relevance_table


def _slots(stages, *, enabled=None, age=5, ramping=None) -> TensorDict:
    stage = torch.tensor(stages, dtype=torch.int64)
    E, S = stage.shape
    td = TensorDict({k: torch.zeros(E, S, dtype=dt) for k, (dt, _) in SLOT_FIELDS.items()}, [E, S])
    td["stage"] = stage
    td["enabled"] = torch.ones(E, S, dtype=torch.bool) if enabled is None else torch.tensor(enabled)
    td["age"] = torch.full((E, S), age)
    if ramping is not None:
        td["ramp_len"] = torch.tensor(ramping, dtype=torch.int64) * 3
    return td


def test_relevance_table_is_the_design_table():
    table = relevance_table()
    for op in Op:
        for h, head in enumerate(HEADS):
            assert bool(table[op, h]) == (head == "op" or head in RELEVANCE[op]), (op, head)
    op = torch.tensor([[int(Op.WAIT), int(Op.PRUNE)]])
    rel = masks.head_relevance(op)
    assert rel.shape == (1, 2, len(HEADS))
    assert rel[0, 0].tolist() == [True] + [False] * 7
    assert rel[0, 1].tolist() == [h in ("op", "slot", "alpha_speed", "alpha_curve") for h in HEADS]


def test_P1_relevance_has_one_owner():
    """Only spec (the table) and masks (the function) may build relevance; everyone else calls
    masks.head_relevance."""
    root = pathlib.Path(esper.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        text = path.read_text()
        rel = path.relative_to(root).as_posix()
        if rel in ("core/spec.py", "core/masks.py"):
            continue
        if "relevance_table(" in text or "RELEVANCE[" in text or "RELEVANCE.items" in text:
            offenders.append(rel)
    assert not offenders, f"relevance re-derived outside esper.core.masks: {offenders}"


def test_op_slot_legality_rules():
    S = Stage
    slots = _slots(
        [
            [S.DORMANT, S.TRAINING, S.HOLDING, S.FOSSILIZED],
            [S.BLENDING, S.EMBARGOED, S.PRUNED, S.GERMINATED],
        ]
    )
    legal = masks.op_slot_legality(slots)
    assert legal.shape == (2, len(Op), 4)
    assert legal[0, Op.GERMINATE].tolist() == [True, False, False, False]
    assert legal[0, Op.ADVANCE].tolist() == [False, True, False, False]
    assert legal[0, Op.FOSSILIZE].tolist() == [False, False, True, False]
    assert legal[0, Op.PRUNE].tolist() == [False, True, True, False], "fossilized seeds cannot be pruned"
    assert legal[1, Op.SET_ALPHA_TARGET].tolist() == [True, False, False, False]
    assert legal[1, Op.PRUNE].tolist() == [True, False, False, True]
    assert legal[:, Op.WAIT].all()


def test_legality_respects_age_ramp_enabled_and_seed_budget():
    S = Stage
    young = masks.op_slot_legality(_slots([[S.TRAINING, S.DORMANT]], age=0), min_prune_age=1)
    assert not young[0, Op.PRUNE, 0]
    ramping = masks.op_slot_legality(_slots([[S.BLENDING, S.HOLDING]], ramping=[[True, False]]))
    assert ramping[0, Op.SET_ALPHA_TARGET].tolist() == [False, True]
    assert ramping[0, Op.PRUNE].tolist() == [False, True]
    assert ramping[0, Op.ADVANCE].tolist() == [True, False]
    off = masks.op_slot_legality(_slots([[S.DORMANT, S.DORMANT]], enabled=[[False, True]]))
    assert off[0, :, 0].any().item() is False, "a disabled slot allows nothing"
    full = masks.op_slot_legality(_slots([[S.TRAINING, S.DORMANT]]), max_seeds=1)
    assert not full[0, Op.GERMINATE].any()
    room = masks.op_slot_legality(_slots([[S.TRAINING, S.DORMANT]]), max_seeds=2)
    assert room[0, Op.GERMINATE].tolist() == [False, True]


def test_prune_below_keeps_seeds_that_pay():
    """``prune_below``: a blended seed contributing at least that many points cannot be pruned; one that
    contributes less, or is not blended in yet (alpha 0, no contribution measured), can. Without it
    every seed of a prunable stage can (the reference's rule)."""
    S = Stage
    slots = _slots([[S.BLENDING, S.HOLDING, S.HOLDING, S.TRAINING]])
    slots["alpha"] = torch.tensor([[0.5, 1.0, 1.0, 0.0]])
    slots["contribution"] = torch.tensor([[3.0, 0.4, float("nan"), 0.0]])
    assert masks.op_slot_legality(slots)[0, Op.PRUNE].tolist() == [True] * 4
    gated = masks.op_slot_legality(slots, prune_below=1.0)
    assert gated[0, Op.PRUNE].tolist() == [False, True, True, True]
    legal = masks.legal_masks(slots, ActionSpec(n_slots=4, n_blueprints=2), prune_below=1.0)
    assert legal["slot_by_op"][0, Op.PRUNE].tolist() == [False, True, True, True]
    assert torch.equal(legal["slot_by_op"][0, Op.FOSSILIZE], masks.op_slot_legality(slots)[0, Op.FOSSILIZE])
    slots["contribution"][0, 0] = 0.99
    assert masks.op_slot_legality(slots, prune_below=1.0)[0, Op.PRUNE, 0]


def test_action_masks_condition_slot_on_sampled_op():
    S = Stage
    spec = ActionSpec(n_slots=3, n_blueprints=4)
    slots = _slots([[S.DORMANT, S.TRAINING, S.HOLDING], [S.DORMANT, S.DORMANT, S.DORMANT]])
    legal = masks.legal_masks(slots, spec)
    assert legal["op"].tolist() == [
        [True, True, True, True, True, True],
        [True, True, False, False, False, False],
    ]
    used = masks.action_masks(legal, torch.tensor([int(Op.FOSSILIZE), int(Op.GERMINATE)]))
    assert list(used.keys()) == list(HEADS)
    assert used["slot"].tolist() == [[False, False, True], [True, True, True]]
    assert used["blueprint"].shape == (2, 4) and used["blueprint"].all()
    for head, n in spec.sizes.items():
        assert used[head].shape == (2, n)


def test_legal_masks_rejects_wrong_slot_count():
    spec = ActionSpec(n_slots=2, n_blueprints=3)
    try:
        masks.legal_masks(_slots([[0, 0, 0]]), spec)
    except ValueError as e:
        assert "[*E, 2]" in str(e)
    else:
        raise AssertionError("expected a ValueError")


def test_noop_blueprint_is_never_offered_when_the_spec_masks_it():
    """The reference masks NOOP out of the blueprint head. Offering it let a policy kept uncertain about
    its op (op-head entropy bonus) germinate noop and prune it in a loop: growth-free, cost-free and
    entropy-rich (a default-task training run, seed 3, settled there by update 13)."""
    S = Stage
    spec = ActionSpec(n_slots=3, n_blueprints=5, masked_blueprints=(0,))
    slots = _slots([[S.DORMANT, S.TRAINING, S.HOLDING], [S.DORMANT, S.DORMANT, S.DORMANT]])
    legal = masks.legal_masks(slots, spec)
    assert legal["blueprint"].tolist() == [[False, True, True, True, True]] * 2
    used = masks.action_masks(legal, torch.tensor([int(Op.GERMINATE)] * 2))
    assert not used["blueprint"][:, 0].any() and used["blueprint"][:, 1:].all()
    # nothing else changes, and an unmasked spec offers every blueprint
    plain = masks.legal_masks(slots, ActionSpec(n_slots=3, n_blueprints=5))
    assert plain["blueprint"].all()
    for head in HEADS:
        if head != "blueprint" and head in plain.keys():
            assert torch.equal(plain[head], legal[head]), head


def test_action_spec_rejects_bad_masked_blueprints():
    for bad, match in (((5,), "outside"), ((-1,), "outside"), ((0, 1, 2), "every blueprint")):
        try:
            ActionSpec(n_slots=2, n_blueprints=3 if match == "every blueprint" else 5, masked_blueprints=bad)
        except ValueError as e:
            assert match in str(e), e
        else:
            raise AssertionError(f"expected a ValueError for {bad}")


def test_seed_pays_against_a_per_slot_reference():
    """``seed_pays``: alpha > 0 and contribution >= the floor, NaN counting as 0, slot by slot."""
    S = Stage
    slots = _slots([[S.HOLDING, S.HOLDING, S.BLENDING, S.TRAINING],
                    [S.HOLDING, S.FOSSILIZED, S.HOLDING, S.DORMANT]])  # fmt: skip
    slots["alpha"] = torch.tensor([[1.0, 0.5, 0.3, 0.0], [0.7, 1.0, 1.0, 0.0]])
    slots["contribution"] = torch.tensor([[5.0, 1.0, 0.99, 40.0], [float("nan"), 1.5, -3.0, 0.0]])
    rows = zip(slots["alpha"].tolist(), slots["contribution"].tolist(), strict=True)
    want = [[a > 0 and (0.0 if c != c else c) >= 1.0 for a, c in zip(ar, cr, strict=True)] for ar, cr in rows]
    assert masks.seed_pays(slots, 1.0).tolist() == want
    assert want == [[True, True, False, False], [False, True, False, False]]


def test_mask_same_alpha_offers_set_alpha_target_only_a_new_alpha():
    """``mask_same_alpha``: under SET_ALPHA_TARGET the alpha-target mask is conditioned on the slot and
    loses the target equal to the alpha that slot's seed holds (the suite's diagnosis: the controller
    set alpha 1.0 on seeds at 1.0, ramps that changed nothing and kept FOSSILIZE illegal). Other ops'
    alpha-target masks (GERMINATE's blend-in target) and the default (off) are unchanged."""
    from esper.core.spec import ALPHA_TARGETS

    S = Stage
    spec = ActionSpec(n_slots=3, n_blueprints=4)
    slots = _slots([[S.HOLDING, S.BLENDING, S.DORMANT], [S.HOLDING, S.HOLDING, S.DORMANT]])
    slots["alpha"] = torch.tensor([[1.0, 0.7, 0.0], [0.5, 0.6, 0.0]])
    assert "alpha_target_by_slot" not in masks.legal_masks(slots, spec).keys()
    legal = masks.legal_masks(slots, spec, mask_same_alpha=True)
    held = [[[abs(a - t) < 1e-6 for t in ALPHA_TARGETS] for a in row] for row in slots["alpha"].tolist()]
    assert legal["alpha_target_by_slot"].tolist() == [[[not h for h in s] for s in row] for row in held]
    assert legal["alpha_target"].all(), "the unconditioned row (before the op is known) is unchanged"
    aset = torch.full((2,), int(Op.SET_ALPHA_TARGET))
    used = masks.action_masks(legal, aset, torch.tensor([0, 0]))
    assert used["alpha_target"].tolist() == [[True, True, False], [False, True, True]]
    assert masks.action_masks(legal, aset, torch.tensor([1, 1]))["alpha_target"].tolist() == [
        [True, False, True], [True, True, True]]  # 0.6 is no target: nothing to remove  # fmt: skip
    germ = masks.action_masks(legal, torch.full((2,), int(Op.GERMINATE)), torch.tensor([2, 2]))
    assert germ["alpha_target"].all()
    with pytest.raises(ValueError, match="pass the sampled slot"):
        masks.action_masks(legal, aset)


def test_a_ramp_to_the_alpha_held_blocks_fossilize_and_the_mask_removes_it():
    """Why the mask: SET_ALPHA_TARGET to the alpha a HOLDING seed holds leaves alpha where it is, yet
    FOSSILIZE is illegal until the ramp ends. With ``mask_same_alpha`` (through the env's config) that
    choice is never offered, whatever the policy prefers."""
    from esper.core.lifecycle import LifecycleConfig, init_slots, lifecycle_step, record_signals
    from esper.core.spec import ALPHA_TARGETS
    from tests.core.test_lifecycle import make_action, make_signals

    cfg = LifecycleConfig()
    slots = init_slots(1, [True, False, False])
    slots["stage"][0, 0] = int(Stage.HOLDING)
    slots["alpha"][0, 0] = 1.0
    slots["age"][0, 0] = 12
    signals = make_signals(1, 3, epoch=12, val_acc=80.0, contribution=5.0, grad_ratio=0.5)
    slots = record_signals(slots, signals, cfg)
    assert masks.op_slot_legality(slots)[0, Op.FOSSILIZE, 0]
    same = make_action(1, Op.SET_ALPHA_TARGET, 0, alpha_target=ALPHA_TARGETS.index(1.0), alpha_speed=2)
    after, _ = lifecycle_step(slots, same, signals, cfg, n_blueprints=4)
    assert after["alpha"][0, 0].item() == 1.0, "alpha did not move"
    assert not masks.op_slot_legality(after)[0, Op.FOSSILIZE, 0], "but FOSSILIZE waits for the ramp"
    spec = ActionSpec(n_slots=3, n_blueprints=4)
    legal = masks.legal_masks(slots, spec, mask_same_alpha=True)
    used = masks.action_masks(legal, torch.tensor([int(Op.SET_ALPHA_TARGET)]), torch.tensor([0]))
    assert not used["alpha_target"][0, ALPHA_TARGETS.index(1.0)]
    assert used["alpha_target"][0].sum().item() == len(ALPHA_TARGETS) - 1
