"""Masks: which heads matter for a sampled op (relevance), and which choices are legal (legality).

Relevance is the single owner of the "causal mask" (finding P1): the loss, the entropy, the KL, the
advantage bookkeeping and the telemetry all call :func:`head_relevance`; nothing else re-derives it.

Legality comes from the tensorized slot state (see :data:`esper.core.spec.SLOT_FIELDS`). The op mask
is "some slot allows this op"; the slot mask is conditioned on the op that was sampled
(:func:`action_masks`), so a sampled (op, slot) pair is always executable.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from esper.core.spec import ALPHA_TARGETS, DEFAULT_BLEND, HEADS, ActionSpec, Op, Stage, Style, relevance_table


def head_relevance(op: torch.Tensor, table: torch.Tensor | None = None) -> torch.Tensor:
    """``[*B] int64 op -> [*B, len(HEADS)] bool``: column ``HEAD_INDEX[h]`` is True where head ``h``
    changed what the action did. ``table`` is :func:`relevance_table` on ``op``'s device; pass it to
    skip rebuilding it."""
    if op.dtype != torch.int64:
        raise TypeError(f"head_relevance: op must be int64 action indices, got {op.dtype}")
    if table is None:
        table = relevance_table(op.device)
    return table[op]


def seed_pays(slots: TensorDict, min_contribution: float) -> torch.Tensor:
    """``[*E, S]`` bool: the seed is blended in (alpha > 0, so its counterfactual was measured) and its
    ``contribution`` (points; NaN counts as 0) is at least ``min_contribution``. The one home of "a seed
    the host depends on": G5 (:func:`esper.core.lifecycle.gate_readiness`), the HOLDING deadline's
    keep, and the prune gate read it."""
    contribution = torch.nan_to_num(slots["contribution"].float(), nan=0.0)
    return (slots["alpha"] > 0) & (contribution >= min_contribution)


def seed_lowers_loss(slots: TensorDict, val_loss: torch.Tensor, min_drop: float) -> torch.Tensor:
    """``[*E, S]`` bool: the seed is blended in (alpha > 0) and lowers this epoch's validation loss by at
    least the share ``min_drop`` of the loss without it: with ``d = loss_contribution`` (the loss at
    alpha 0 minus the loss as blended; NaN counts as 0) and ``L = val_loss [*E]`` (as blended),
    ``d > 0`` and ``d >= min_drop * (L + d)``. What ``lifecycle.keep_by`` ``loss`` or ``either`` keeps
    at the HOLDING deadline (issue 104); no division, so a zero loss is no special case, and a
    non-finite ``L`` keeps nothing."""
    drop = torch.nan_to_num(slots["loss_contribution"].float(), nan=0.0)
    loss = val_loss.float()
    loss = torch.where(torch.isfinite(loss), loss.clamp(min=0.0), torch.full_like(loss, float("inf")))
    without = loss.unsqueeze(-1) + drop
    return (slots["alpha"] > 0) & (drop > 0) & (drop >= min_drop * without)


def op_slot_legality(
    slots: TensorDict,
    *,
    max_seeds: int = 0,
    min_prune_age: int = 0,
    gates: TensorDict | None = None,
    auto_advance: bool = False,
    prune_below: float | None = None,
) -> torch.Tensor:
    """``slots [*E, S] -> [*E, N_OPS, S] bool``: may op ``o`` be applied to slot ``s``.

    Reads ``enabled``, ``stage``, ``age``, ``ramp_pos``, ``ramp_len``. ``max_seeds = 0`` means no
    limit on live seeds. ``gates``: :func:`esper.core.lifecycle.gate_readiness` of the same state; when
    given, ADVANCE and FOSSILIZE are legal only where their gate would pass (G2 on TRAINING, G3 on
    BLENDING, G5), since a failing one changes nothing and only costs a step. With ``auto_advance``
    the lifecycle advances seeds itself (:class:`esper.core.lifecycle.LifecycleConfig`), so ADVANCE is
    never legal. With ``prune_below`` (:attr:`esper.core.lifecycle.LifecycleConfig.prune_floor`), a seed
    that pays - blended in (alpha > 0) with a counterfactual ``contribution`` of at least
    ``prune_below`` points - cannot be pruned: PRUNE is for seeds the host does not depend on. Rules
    (without ``gates``, the gates are checked at execution only):

    - WAIT: any enabled slot (the slot head does not matter under WAIT).
    - GERMINATE: enabled, DORMANT, and fewer than ``max_seeds`` live seeds in the env.
    - SET_ALPHA_TARGET: BLENDING or HOLDING, alpha not ramping.
    - PRUNE: GERMINATED, TRAINING, BLENDING or HOLDING, ``age >= min_prune_age``, not ramping (and
      not paying, with ``prune_below``).
    - FOSSILIZE: HOLDING, not ramping.
    - ADVANCE: TRAINING or BLENDING.
    """
    if max_seeds < 0 or min_prune_age < 0:
        raise ValueError(f"max_seeds and min_prune_age must be >= 0, got {max_seeds}, {min_prune_age}")
    enabled = slots["enabled"]
    stage = slots["stage"]
    holding_alpha = slots["ramp_pos"] >= slots["ramp_len"]
    is_ = lambda *stages: _stage_in(stage, stages)

    live = is_(
        Stage.GERMINATED, Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED, Stage.PRUNED
    )
    if max_seeds > 0:
        room = (live.sum(-1, keepdim=True) < max_seeds).expand_as(stage)
    else:
        room = torch.ones_like(enabled)
    per_op = {
        Op.WAIT: enabled,
        Op.GERMINATE: enabled & is_(Stage.DORMANT) & room,
        Op.SET_ALPHA_TARGET: is_(Stage.BLENDING, Stage.HOLDING) & holding_alpha,
        Op.PRUNE: is_(Stage.GERMINATED, Stage.TRAINING, Stage.BLENDING, Stage.HOLDING)
        & (slots["age"] >= min_prune_age)
        & holding_alpha,
        Op.FOSSILIZE: is_(Stage.HOLDING) & holding_alpha,
        Op.ADVANCE: is_(Stage.TRAINING, Stage.BLENDING),
    }
    if auto_advance:
        per_op[Op.ADVANCE] = torch.zeros_like(enabled)
    if prune_below is not None:
        per_op[Op.PRUNE] = per_op[Op.PRUNE] & ~seed_pays(slots, prune_below)
    if gates is not None:
        per_op[Op.ADVANCE] = per_op[Op.ADVANCE] & (
            (is_(Stage.TRAINING) & gates["g2"]) | (is_(Stage.BLENDING) & gates["g3"])
        )
        per_op[Op.FOSSILIZE] = per_op[Op.FOSSILIZE] & gates["g5"]
    return torch.stack([per_op[op] & enabled for op in Op], dim=-2)


def legal_masks(
    slots: TensorDict,
    spec: ActionSpec,
    *,
    max_seeds: int = 0,
    min_prune_age: int = 0,
    gates: TensorDict | None = None,
    auto_advance: bool = False,
    prune_below: float | None = None,
    mask_same_alpha: bool = False,
) -> TensorDict:
    """Legality of every head before the op is sampled, batch ``[*E]`` (``gates``, ``auto_advance``,
    ``prune_below``: see :func:`op_slot_legality`).

    Returns ``op [*E, N_OPS]``, ``slot_by_op [*E, N_OPS, S]``, a ``[*E, n]`` mask for every other head
    (all True but for the blueprint head's ``spec.masked_blueprints``). Feed it to
    :func:`action_masks` once the op is known.

    ``mask_same_alpha``: SET_ALPHA_TARGET is not offered the target equal to the alpha its slot's seed
    holds. Such a ramp leaves alpha where it is, and while it runs FOSSILIZE and PRUNE are illegal (the
    seed is ramping), so it only delays them. The result then holds ``alpha_target_by_slot
    [*E, S, n]``, the alpha-target mask under SET_ALPHA_TARGET conditioned on the slot (at most one
    target is removed, so every row keeps a legal choice); :func:`action_masks` takes its row.
    """
    if slots.batch_dims < 1 or slots.batch_size[-1] != spec.n_slots:
        raise ValueError(
            f"legal_masks: slot state must have batch size [*E, {spec.n_slots}], got {list(slots.batch_size)}"
        )
    by_op = op_slot_legality(
        slots, max_seeds=max_seeds, min_prune_age=min_prune_age, gates=gates, auto_advance=auto_advance,
        prune_below=prune_below,
    )  # fmt: skip
    env_shape = slots.batch_size[:-1]
    out = {"op": by_op.any(-1), "slot_by_op": by_op}
    for head, n in spec.sizes.items():
        if head not in ("op", "slot"):
            out[head] = torch.ones(*env_shape, n, dtype=torch.bool, device=by_op.device)
    if spec.masked_blueprints:
        out["blueprint"][..., list(spec.masked_blueprints)] = False
    if mask_same_alpha:
        targets = torch.tensor(ALPHA_TARGETS, dtype=slots["alpha"].dtype, device=by_op.device)
        held = (slots["alpha"].unsqueeze(-1) - targets).abs() < 1e-6  # [*E, S, n]
        out["alpha_target_by_slot"] = out["alpha_target"].unsqueeze(-2) & ~held
    return TensorDict(out, batch_size=env_shape)


def within_param_cap(
    legal: TensorDict, seed_params: torch.Tensor, cost: torch.Tensor, cap: float,
    gate_cost: torch.Tensor | None = None,
) -> TensorDict:  # fmt: skip
    """``legal`` (from :func:`legal_masks`, batch ``[*E]``) narrowed to the germinations that keep the
    env's seed parameters at most ``cap``: a controller's hard parameter budget.

    ``seed_params [*E, S]``: the parameters of each slot's seed now (the slot state's field, a live
    gate's included; a pruned or dormant slot holds 0). ``cost [S, n]`` (or ``[*E, S, n]``): the most
    blueprint ``b`` can add in slot ``s``, a GATED_GATE gate's included. Returns a new TensorDict with
    ``blueprint_by_slot [*E, S, n]`` (the blueprint mask conditioned on the slot: legal and affordable
    there), GERMINATE legal only in slots where some blueprint is affordable, and ``op`` re-derived from
    ``slot_by_op``. Where a slot affords nothing its blueprint row stays the unconditioned one:
    GERMINATE is illegal there, so the head is irrelevant and still has a legal choice to sample.

    ``gate_cost [S]`` (or ``[*E, S]``): the part of ``cost`` a GATED_GATE gate is in each slot. Without
    it a blueprint is affordable only with its gate, whatever style follows. With it a blueprint is
    affordable where the seed alone fits, and the result also holds ``gated_by_slot [*E, S, n]``: the
    gate fits as well, so GATED_GATE is legal for that (slot, blueprint) (:func:`action_masks` applies
    it to the style head). So a budget that holds exactly what a gate-free plan adds lets the
    controller grow that plan. Feed the result to :func:`action_masks` with the slot (and, with
    ``gate_cost``, the blueprint).
    """
    if seed_params.shape != legal["slot_by_op"].shape[:-2] + legal["slot_by_op"].shape[-1:]:
        raise ValueError(
            f"within_param_cap: seed_params must be [*E, S] = {list(legal['slot_by_op'].shape[:-2])} + "
            f"[{legal['slot_by_op'].shape[-1]}], got {list(seed_params.shape)}"
        )
    if cost.shape[-2:] != (seed_params.shape[-1], legal["blueprint"].shape[-1]):
        raise ValueError(
            f"within_param_cap: cost must be [S, n_blueprints] = [{seed_params.shape[-1]}, "
            f"{legal['blueprint'].shape[-1]}], got {list(cost.shape)}"
        )
    if gate_cost is not None and gate_cost.shape[-1:] != seed_params.shape[-1:]:
        raise ValueError(
            f"within_param_cap: gate_cost must be [S] = [{seed_params.shape[-1]}], "
            f"got {list(gate_cost.shape)}"
        )
    spent = seed_params.to(cost.dtype).sum(-1, keepdim=True).unsqueeze(-1)  # [*E, 1, 1]
    base = legal["blueprint"].unsqueeze(-2)  # [*E, 1, n]
    gate = None if gate_cost is None else gate_cost.to(cost.dtype).unsqueeze(-1)  # [*E, S, 1]
    bare = cost if gate is None else cost - gate  # what the seed adds without a gate
    affordable = base & (spent + bare <= cap)  # [*E, S, n]
    fits = affordable.any(-1)  # [*E, S]
    by_slot = torch.where(fits.unsqueeze(-1), affordable, base.expand_as(affordable))
    by_op = legal["slot_by_op"].clone()
    by_op[..., int(Op.GERMINATE), :] = by_op[..., int(Op.GERMINATE), :] & fits
    out = legal.clone(recurse=False)
    out["slot_by_op"] = by_op
    out["op"] = by_op.any(-1)
    out["blueprint_by_slot"] = by_slot
    if gate is not None:
        out["gated_by_slot"] = (spent + cost <= cap).expand_as(affordable)
    return out


def _row(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table [*E, K, n]``, ``index [*E]`` -> ``[*E, n]``: each env's row ``index``."""
    idx = index.reshape(*index.shape, 1, 1).expand(*index.shape, 1, table.shape[-1])
    return table.gather(-2, idx).squeeze(-2)


def slot_mask(legal: TensorDict, op: torch.Tensor) -> torch.Tensor:
    """``[*E, S]``: the slots legal for the sampled ``op [*E]`` (its row of ``slot_by_op``)."""
    return _row(legal["slot_by_op"], op)


def blueprint_mask(legal: TensorDict, slot: torch.Tensor | None = None) -> torch.Tensor:
    """``[*E, n]``: the blueprint head's mask, the sampled ``slot [*E]``'s row where ``legal`` conditions
    it on the slot (``blueprint_by_slot``, :func:`within_param_cap`); required there."""
    if "blueprint_by_slot" not in legal.keys():
        return legal["blueprint"]
    if slot is None:
        raise ValueError("blueprint_mask: a cap conditions the blueprint on the slot; pass the sampled slot")
    return _row(legal["blueprint_by_slot"], slot)


def action_masks(
    legal: TensorDict, op: torch.Tensor, slot: torch.Tensor | None = None,
    blueprint: torch.Tensor | None = None,
) -> TensorDict:  # fmt: skip
    """The mask each head was actually sampled under, given the sampled ``op [*E]``: the slot mask
    is the row of ``slot_by_op`` for that op (:func:`slot_mask`). Where ``legal`` conditions the
    blueprint on the slot (``blueprint_by_slot``, from :func:`within_param_cap`), the sampled
    ``slot [*E]`` is required and the blueprint mask is its row (:func:`blueprint_mask`); so too the
    alpha-target mask under SET_ALPHA_TARGET where ``legal`` holds ``alpha_target_by_slot``
    (:func:`legal_masks`' ``mask_same_alpha``). Where it holds ``gated_by_slot`` (a cap that counts a
    gate only where one is built), the sampled ``blueprint [*E]`` is required as well, and GATED_GATE
    is legal only where that seed's gate fits (the other styles keep the head a legal choice). Batch
    ``[*E]``, one ``[*E, n]`` bool entry per head, in :data:`HEADS` order. This is what a rollout
    stores and what the loss re-applies."""
    out = {h: legal[h] for h in HEADS if h != "slot"}
    out["slot"] = slot_mask(legal, op)
    keys = legal.keys()
    out["blueprint"] = blueprint_mask(legal, slot)  # refuses a missing slot under a cap
    if slot is None and "alpha_target_by_slot" in keys:
        raise ValueError("action_masks: these masks condition a head on the slot; pass the sampled slot")
    if "alpha_target_by_slot" in keys:
        setting = (op == int(Op.SET_ALPHA_TARGET)).unsqueeze(-1)
        by_slot = _row(legal["alpha_target_by_slot"], slot)
        out["alpha_target"] = torch.where(setting, by_slot, legal["alpha_target"])
    if "gated_by_slot" in keys:
        if blueprint is None:
            raise ValueError("action_masks: the style mask depends on the blueprint (a cap that counts "
                             "gates); pass the sampled blueprint")  # fmt: skip
        gated = _row(legal["gated_by_slot"], slot).gather(-1, blueprint.unsqueeze(-1))  # [*E, 1]
        style = out["style"].clone()
        style[..., int(Style.GATED_GATE)] = style[..., int(Style.GATED_GATE)] & gated.squeeze(-1)
        out["style"] = style
    return TensorDict({h: out[h] for h in HEADS}, batch_size=legal.batch_size)


def fixed_blend(legal: TensorDict) -> TensorDict:
    """``legal`` with the blend heads narrowed to the fixed schedules' blend (:data:`DEFAULT_BLEND`:
    LINEAR_ADD, tempo FAST, alpha target 1.0): a controller that decides what, where and when to grow,
    and blends as the fixed plans do. SET_ALPHA_TARGET is not offered: a seed blended this way ramps to 1.0
    and the op is legal only once its ramp is over, so its one target would be the alpha the seed holds, a
    ramp that changes nothing and holds FOSSILIZE and PRUNE back while it runs (a fixed plan never issues
    it). The alpha-target head keeps its one choice (and, with ``alpha_target_by_slot``, its per-slot
    rows), so it stays a legal choice where it is irrelevant. Every other head is untouched."""
    out = legal.clone(recurse=False)
    by_op = legal["slot_by_op"].clone()
    by_op[..., int(Op.SET_ALPHA_TARGET), :] = False
    out["slot_by_op"], out["op"] = by_op, by_op.any(-1)  # the op re-derived, as legal_masks derives it
    narrowed = {**DEFAULT_BLEND}
    if "alpha_target_by_slot" in legal.keys():
        narrowed["alpha_target_by_slot"] = DEFAULT_BLEND["alpha_target"]
    for key, choice in narrowed.items():
        only = torch.zeros_like(legal[key])
        only[..., choice] = True
        out[key] = only
    return out


def n_legal(mask: torch.Tensor) -> torch.Tensor:
    """``[..., n] bool -> [...] int64``: how many choices are legal."""
    return mask.sum(-1)


def _stage_in(stage: torch.Tensor, stages: tuple[Stage, ...]) -> torch.Tensor:
    out = stage == int(stages[0])
    for s in stages[1:]:
        out = out | (stage == int(s))
    return out


__all__ = [
    "action_masks",
    "blueprint_mask",
    "fixed_blend",
    "head_relevance",
    "legal_masks",
    "n_legal",
    "op_slot_legality",
    "seed_lowers_loss",
    "seed_pays",
    "slot_mask",
    "within_param_cap",
]
