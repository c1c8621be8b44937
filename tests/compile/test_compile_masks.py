"""Masks compile with fullgraph=True and compiled == eager."""

from __future__ import annotations

import pytest
import torch

from esper.core import masks
from esper.core.spec import ActionSpec, Op, Stage
from tests.core.test_masks import _slots


def test_masks_compile(compile_check):
    S = Stage
    spec = ActionSpec(n_slots=3, n_blueprints=4, masked_blueprints=(0,))
    slots = _slots([[S.DORMANT, S.TRAINING, S.HOLDING], [S.BLENDING, S.DORMANT, S.PRUNED]])
    op = torch.tensor([int(Op.PRUNE), int(Op.GERMINATE)])

    def fn(slots, op):
        legal = masks.legal_masks(slots, spec, max_seeds=2, min_prune_age=1, prune_below=1.0)
        return masks.action_masks(legal, op), masks.head_relevance(op)

    compile_check(fn, slots, op)


def test_seed_pays_compiles(compile_check):
    S = Stage
    slots = _slots([[S.HOLDING, S.BLENDING], [S.HOLDING, S.TRAINING]])
    slots["alpha"] = torch.tensor([[1.0, 0.5], [0.0, 0.0]])
    slots["contribution"] = torch.tensor([[5.0, float("nan")], [9.0, 0.0]])
    compile_check(lambda slots: masks.seed_pays(slots, 1.0), slots)


@pytest.mark.parametrize("gated", [False, True], ids=["gate-always-charged", "gate-where-built"])
def test_within_param_cap_compiles(compile_check, gated):
    S = Stage
    spec = ActionSpec(n_slots=3, n_blueprints=4, masked_blueprints=(0,))
    slots = _slots([[S.DORMANT, S.TRAINING, S.DORMANT], [S.DORMANT, S.DORMANT, S.DORMANT]])
    seed_params = torch.tensor([[0.0, 50.0, 0.0], [0.0, 0.0, 0.0]])
    cost = torch.tensor([[6.0, 15.0, 45.0, 95.0]] * 3)
    gate_cost = torch.full((3,), 5.0) if gated else None  # with it, the style mask reads the blueprint
    op = torch.tensor([int(Op.GERMINATE), int(Op.GERMINATE)])
    slot, blueprint = torch.tensor([0, 2]), torch.tensor([2, 3])

    def fn(slots, seed_params, cost, op, slot, blueprint):
        legal = masks.within_param_cap(masks.legal_masks(slots, spec), seed_params, cost, 100.0, gate_cost)
        return masks.action_masks(legal, op, slot, blueprint)

    compile_check(fn, slots, seed_params, cost, op, slot, blueprint)


def test_fixed_blend_compiles(compile_check):
    S = Stage
    spec = ActionSpec(n_slots=3, n_blueprints=4)
    slots = _slots([[S.HOLDING, S.BLENDING, S.DORMANT], [S.DORMANT, S.HOLDING, S.DORMANT]])
    op = torch.tensor([int(Op.SET_ALPHA_TARGET), int(Op.GERMINATE)])
    slot = torch.tensor([0, 2])

    def fn(slots, op, slot):
        return masks.action_masks(masks.fixed_blend(masks.legal_masks(slots, spec)), op, slot)

    compile_check(fn, slots, op, slot)


def test_mask_same_alpha_compiles(compile_check):
    S = Stage
    spec = ActionSpec(n_slots=3, n_blueprints=4)
    slots = _slots([[S.HOLDING, S.BLENDING, S.DORMANT], [S.HOLDING, S.HOLDING, S.DORMANT]])
    slots["alpha"] = torch.tensor([[1.0, 0.7, 0.0], [0.5, 0.6, 0.0]])
    op = torch.tensor([int(Op.SET_ALPHA_TARGET), int(Op.GERMINATE)])
    slot = torch.tensor([0, 2])

    def fn(slots, op, slot):
        return masks.action_masks(masks.legal_masks(slots, spec, mask_same_alpha=True), op, slot)

    compile_check(fn, slots, op, slot)
