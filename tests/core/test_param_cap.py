"""A controller's hard parameter cap (esper.core.masks.within_param_cap): the blueprint mask is
conditioned on the slot, GERMINATE is legal only where something fits, and the rest is untouched."""

from __future__ import annotations

import pytest
import torch

from esper.core import masks
from esper.core.spec import ActionSpec, Op, Stage, Style
from tests.core.test_masks import _slots

S = Stage
SPEC = ActionSpec(n_slots=3, n_blueprints=4, masked_blueprints=(0,))
#: Slot 2 is wider: its blueprints cost twice as much.
COST = torch.tensor([[1.0, 10.0, 40.0, 90.0], [1.0, 10.0, 40.0, 90.0], [2.0, 20.0, 80.0, 180.0]])


def _capped(seed_params, cap, stages=None):
    stages = stages or [[S.DORMANT, S.TRAINING, S.DORMANT]] * len(seed_params)
    legal = masks.legal_masks(_slots(stages), SPEC)
    return legal, masks.within_param_cap(legal, torch.tensor(seed_params), COST, cap)


def test_blueprints_that_would_pass_the_cap_are_masked_per_slot():
    legal, capped = _capped([[0.0, 50.0, 0.0]], 100.0)  # 50 spent: 50 left
    by_slot = capped["blueprint_by_slot"][0]
    assert by_slot[0].tolist() == [False, True, True, False]  # 10 and 40 fit, 90 does not, noop masked
    assert by_slot[2].tolist() == [False, True, False, False]  # the wide slot: only 20 fits
    germ = int(Op.GERMINATE)
    assert capped["slot_by_op"][0, germ].tolist() == [True, False, True]
    assert legal["slot_by_op"][0, germ].tolist() == [True, False, True]
    # the cap touches nothing but GERMINATE and the blueprint
    other = [o for o in range(len(Op)) if o != germ]
    assert torch.equal(capped["slot_by_op"][:, other], legal["slot_by_op"][:, other])
    for head in ("style", "tempo", "blueprint"):
        assert torch.equal(capped[head], legal[head])


def test_germinate_is_illegal_where_nothing_fits_and_the_head_keeps_a_choice():
    legal, capped = _capped([[0.0, 95.0, 0.0]], 100.0)  # 5 left: only the masked noop would fit
    assert not capped["slot_by_op"][0, int(Op.GERMINATE)].any()
    assert not capped["op"][0, int(Op.GERMINATE)] and legal["op"][0, int(Op.GERMINATE)]
    assert capped["op"][0, int(Op.WAIT)]
    # no slot affords a legal blueprint, so every row falls back to the unconditioned mask
    assert torch.equal(capped["blueprint_by_slot"][0], legal["blueprint"][0].expand(3, -1))


def test_exactly_at_the_cap_fits():
    _, capped = _capped([[0.0, 10.0, 0.0]], 100.0)
    assert capped["blueprint_by_slot"][0, 0, 3]  # 10 + 90 == 100


def test_action_masks_take_the_sampled_slots_row():
    _, capped = _capped([[0.0, 50.0, 0.0], [0.0, 0.0, 0.0]], 100.0, [[S.DORMANT, S.TRAINING, S.DORMANT]] * 2)
    op = torch.tensor([int(Op.GERMINATE)] * 2)
    used = masks.action_masks(capped, op, torch.tensor([2, 0]))
    assert used["blueprint"].tolist() == [[False, True, False, False], [False, True, True, True]]
    with pytest.raises(ValueError, match="pass the sampled slot"):
        masks.action_masks(capped, op)


def test_without_a_cap_the_slot_is_optional_and_changes_nothing():
    legal = masks.legal_masks(_slots([[S.DORMANT, S.TRAINING, S.DORMANT]]), SPEC)
    op = torch.tensor([int(Op.GERMINATE)])
    a, b = masks.action_masks(legal, op), masks.action_masks(legal, op, torch.tensor([2]))
    assert all(torch.equal(a[h], b[h]) for h in a.keys())


#: What a GATED_GATE gate adds in each slot: COST less it is what each seed adds alone.
GATE = torch.tensor([5.0, 5.0, 10.0])


def test_a_cap_counts_a_gate_only_where_one_is_built():
    """Issue 89: a budget of exactly what a gate-free plan adds must let the controller grow that plan.
    With ``gate_cost`` a blueprint is affordable where the seed alone fits, and GATED_GATE is legal
    only where its gate fits too; without it (the old behaviour) the gate is charged whatever the style,
    so the plan the judge counts as fitting was out of the controller's reach."""
    stages = [[S.DORMANT, S.TRAINING, S.DORMANT]]
    legal = masks.legal_masks(_slots(stages), SPEC)
    spent = torch.tensor([[0.0, 50.0, 0.0]])
    cap = 50.0 + (COST[0, 2] - GATE[0]).item()  # room for blueprint 2 in slot 0 without its gate
    old = masks.within_param_cap(legal, spent, COST, cap)
    new = masks.within_param_cap(legal, spent, COST, cap, GATE)
    assert not old["blueprint_by_slot"][0, 0, 2]  # the old cap: out of reach
    assert new["blueprint_by_slot"][0, 0, 2]
    assert not new["gated_by_slot"][0, 0, 2]  # ... but not with a gate
    assert new["gated_by_slot"][0, 0, 1]  # blueprint 1 fits with its gate
    op = torch.tensor([int(Op.GERMINATE)] * 2)
    two = masks.within_param_cap(
        masks.legal_masks(_slots(stages * 2), SPEC), spent.expand(2, -1), COST, cap, GATE
    )  # fmt: skip
    used = masks.action_masks(two, op, torch.tensor([0, 0]), torch.tensor([2, 1]))
    gated = int(Style.GATED_GATE)
    assert used["style"][:, gated].tolist() == [False, True]
    assert used["style"][0].sum() == len(Style) - 1  # the other styles stay legal
    assert torch.equal(used["blueprint"], two["blueprint_by_slot"][:, 0])
    with pytest.raises(ValueError, match="pass the sampled blueprint"):
        masks.action_masks(two, op, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="gate_cost"):
        masks.within_param_cap(legal, spent, COST, cap, GATE[:2])


def test_fixed_blend_never_offers_a_no_op_retarget():
    """Under ``ppo.fixed_blend`` SET_ALPHA_TARGET is not legal: a seed blended to 1.0 could only be
    "retargeted" to the 1.0 it holds, a ramp that changes nothing and holds FOSSILIZE back (seen in the
    credit-assignment run's episodes, 2026-12-06). Before, it stayed legal for a HOLDING seed."""
    stages = [[S.HOLDING, S.BLENDING, S.DORMANT]]
    slots = _slots(stages)
    slots["alpha"][..., :2] = 1.0
    legal = masks.legal_masks(slots, SPEC)
    assert legal["op"][0, int(Op.SET_ALPHA_TARGET)]  # the op itself is legal there
    fixed = masks.fixed_blend(legal)
    assert not fixed["op"][0, int(Op.SET_ALPHA_TARGET)]
    assert not fixed["slot_by_op"][0, int(Op.SET_ALPHA_TARGET)].any()
    others = [o for o in Op if o != Op.SET_ALPHA_TARGET]
    assert torch.equal(fixed["op"][0, others], legal["op"][0, others])
    assert torch.equal(fixed["slot_by_op"][0, others], legal["slot_by_op"][0, others])
    assert fixed["op"][0, int(Op.FOSSILIZE)] == legal["op"][0, int(Op.FOSSILIZE)]


def test_bad_shapes_raise():
    legal = masks.legal_masks(_slots([[S.DORMANT, S.TRAINING, S.DORMANT]]), SPEC)
    with pytest.raises(ValueError, match="seed_params"):
        masks.within_param_cap(legal, torch.zeros(1, 2), COST, 10.0)
    with pytest.raises(ValueError, match="cost"):
        masks.within_param_cap(legal, torch.zeros(1, 3), COST[:, :3], 10.0)


def test_fixed_blend_offers_only_the_fixed_schedules_blend():
    """``ppo.fixed_blend`` (issue 89): the blend heads offer only :data:`DEFAULT_BLEND`; the op, slot and
    blueprint heads, and a cap's narrowing, are untouched."""
    from esper.core.spec import DEFAULT_BLEND

    stages = [[S.DORMANT, S.TRAINING, S.DORMANT]]
    capped = masks.within_param_cap(
        masks.legal_masks(_slots(stages), SPEC, mask_same_alpha=True), torch.tensor([[0.0, 50.0, 0.0]]),
        COST, 100.0, GATE,
    )  # fmt: skip
    fixed = masks.fixed_blend(capped)
    for head, choice in DEFAULT_BLEND.items():
        assert fixed[head][0].tolist() == [i == choice for i in range(fixed[head].shape[-1])], head
    assert fixed["alpha_target_by_slot"][0].sum(-1).tolist() == [1, 1, 1]
    for key in ("op", "slot_by_op", "blueprint_by_slot", "gated_by_slot", "alpha_speed", "alpha_curve"):
        assert torch.equal(fixed[key], capped[key]), key
    used = masks.action_masks(fixed, torch.tensor([int(Op.GERMINATE)]), torch.tensor([0]), torch.tensor([1]))
    assert used["style"][0].tolist() == [s == Style(DEFAULT_BLEND["style"]) for s in Style]
