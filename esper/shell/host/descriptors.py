"""A host described by features that do not depend on its shape: what the host-agnostic policy
(``ppo.policy set``, :mod:`esper.shell.agent.setpolicy`) reads besides the observation.

:func:`describe_host` computes, from any :class:`~esper.shell.host.hosts.Host` (a built-in family or the
user's own network), a :class:`HostLayout`:

- per slot (:data:`SLOT_FEATURES`): ``depth``, its position as a fraction of the host's depth (slot ``i``
  of ``S`` follows block ``i``: ``(i + 1) / S``); ``log_width``, its width against the geometric mean
  of the host's slot widths (``log2(width / mean) / 2``, clipped to +-1);
- per slot and blueprint (:data:`DESCRIPTOR_FEATURES`): the blueprint's ``kind_*`` one-hot and its
  receptive field (``reach``: ``ln(field) / ln(9)``, 1 for a global one, capped at 1; ``reach_global``)
  from :data:`~esper.shell.host.blueprints.BLUEPRINT_TRAITS`; ``kind_identity`` is the is-identity bit
  (the no-op); and its size where it would grow: ``params_vs_host``, the parameters germinating it in
  that slot adds (:meth:`~esper.shell.host.hosts.Host.germination_cost`, a gate included) against the
  host's own, ``ln(cost / host) / ln(100)``, and ``params_vs_width``, the same cost against the slot's
  width squared (a dense layer at that width), ``ln(cost / width^2) / ln(100)``. No feature is an index
  into one family's list, so a controller that reads them acts on any number of slots and blueprints.

``log_cost`` (``ln`` of each germination cost, at least 1 parameter) is the capacity prior's term
(``ppo.size_bias``: ``size_bias * ln(cost)`` on the blueprint head).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from esper.shell.host.blueprints import BLUEPRINT_KINDS, BLUEPRINT_TRAITS, GLOBAL
from esper.shell.host.hosts import Host

#: The per-slot features of a host layout, in column order.
SLOT_FEATURES = ("depth", "log_width")
#: The per-(slot, blueprint) descriptor features, in column order.
DESCRIPTOR_FEATURES = (
    *(f"kind_{k}" for k in BLUEPRINT_KINDS), "reach", "reach_global", "params_vs_host", "params_vs_width",
)  # fmt: skip
#: With a budget the controller reads (``env.budget_shares``, issue 89), one more descriptor feature after
#: :data:`DESCRIPTOR_FEATURES`: ``params_vs_budget``, the germination's parameters against the episode's
#: budget, ``ln(cost / budget) / ln(PARAMS_SCALE)`` clipped to +-1 (negative: it fits, with room).
BUDGET_FEATURES = ("params_vs_budget",)
#: ``reach`` is ``ln(field) / ln(REACH_SCALE)`` (capped at 1): a 3-wide kernel reads 0.5.
REACH_SCALE = 9.0
#: The parameter ratios are ``ln(ratio) / ln(PARAMS_SCALE)``.
PARAMS_SCALE = 100.0


@dataclass(frozen=True)
class HostLayout:
    """What the host-agnostic policy knows about a host besides the observation (module docstring)."""

    family: str
    slot_names: tuple[str, ...]
    slot_widths: tuple[int, ...]
    blueprint_names: tuple[str, ...]
    host_params: int
    #: ``[S, B]``: the most parameters each germination can add (:meth:`Host.germination_cost`).
    germination_cost: torch.Tensor
    #: ``[S, len(SLOT_FEATURES)]``.
    slot_features: torch.Tensor
    #: ``[S, B, len(DESCRIPTOR_FEATURES)]``.
    descriptors: torch.Tensor
    #: ``[S, B]``: ``ln(max(cost, 1))``.
    log_cost: torch.Tensor
    #: The seed parameters the task's ``grow_all`` adds to the host (its enabled slots): the unit of
    #: ``ppo.param_cap_share`` (:func:`esper.shell.env.tasks.grow_all_params`; 0: not known).
    grow_all_params: float = 0.0
    #: The episode's parameter budget where the controller reads one (``env.budget_shares``): the learned
    #: controller's hard cap, in place of ``ppo.param_cap_share``'s, and the descriptors'
    #: :data:`BUDGET_FEATURES` column. 0: none.
    budget_params: float = 0.0
    #: ``[S]``: the part of :attr:`germination_cost` a GATED_GATE gate is in each slot
    #: (:meth:`Host.gate_cost`), so a cap counts a gate only where one is built
    #: (:func:`esper.core.masks.within_param_cap`). None: not known; a cap then counts it always.
    gate_cost: torch.Tensor | None = None

    @property
    def n_slots(self) -> int:
        return len(self.slot_names)

    @property
    def n_blueprints(self) -> int:
        return len(self.blueprint_names)

    def to(self, device: torch.device | str) -> HostLayout:
        move = lambda t: t.to(device)
        return replace(
            self, germination_cost=move(self.germination_cost), slot_features=move(self.slot_features),
            descriptors=move(self.descriptors), log_cost=move(self.log_cost),
            gate_cost=None if self.gate_cost is None else move(self.gate_cost),
        )  # fmt: skip


def blueprint_traits(family: str, name: str) -> tuple[str, int]:
    """``(kind, receptive field)`` of blueprint ``name`` of ``family`` (one-line error if unknown)."""
    traits = BLUEPRINT_TRAITS.get(family)
    if traits is None or name not in traits:
        known = ", ".join(traits) if traits else ", ".join(BLUEPRINT_TRAITS)
        raise ValueError(f"no traits for {family} blueprint {name!r} (esper.shell.host.blueprints): {known}")
    return traits[name]


def descriptor_dim(budget: bool = False) -> int:
    """Features per (slot, blueprint) descriptor: :data:`DESCRIPTOR_FEATURES`, and with a budget the
    controller reads, :data:`BUDGET_FEATURES`."""
    return len(DESCRIPTOR_FEATURES) + (len(BUDGET_FEATURES) if budget else 0)


def describe_host(
    host: Host, germination_cost: torch.Tensor | None = None, grow_all_params: float = 0.0,
    budget_params: float | None = None,
) -> HostLayout:  # fmt: skip
    """The :class:`HostLayout` of ``host`` (``germination_cost``: its :meth:`Host.germination_cost`,
    computed when not given; ``grow_all_params``: what the task's ``grow_all`` adds to it, 0 when not
    known; ``budget_params``: the episode's budget where the controller reads one, which adds the
    :data:`BUDGET_FEATURES` column; None: no budget input). Pure bookkeeping on the CPU; builds each seed
    once for the costs."""
    if budget_params is not None and not budget_params > 0:
        raise ValueError(f"describe_host: budget_params must be > 0 (or None), got {budget_params!r}")
    cost = (host.germination_cost() if germination_cost is None else germination_cost).detach().float().cpu()
    widths = tuple(s.width for s in host.slots)
    names = host.blueprint_names
    S, B = len(widths), len(names)
    if cost.shape != (S, B):
        raise ValueError(f"germination_cost must be [{S}, {B}], got {list(cost.shape)}")
    host_params = max(sum(p.numel() for p in host.host_parameters()), 1)
    w = torch.tensor(widths, dtype=torch.float32)
    depth = torch.arange(1, S + 1, dtype=torch.float32) / S
    log_width = (torch.log2(w) - torch.log2(w).mean()).div(2.0).clamp(-1.0, 1.0)
    slot_features = torch.stack([depth, log_width], dim=-1)
    traits = [blueprint_traits(host.family, b) for b in names]
    kind = torch.zeros(B, len(BLUEPRINT_KINDS))
    for j, (k, _) in enumerate(traits):
        kind[j, BLUEPRINT_KINDS.index(k)] = 1.0
    reach = torch.tensor(
        [1.0 if r == GLOBAL else min(math.log(r) / math.log(REACH_SCALE), 1.0) for _, r in traits]
    )
    is_global = torch.tensor([float(r == GLOBAL) for _, r in traits])
    log_cost = cost.clamp(min=1.0).log()
    scale = math.log(PARAMS_SCALE)
    vs_host = (log_cost - math.log(host_params)) / scale
    vs_width = (log_cost - 2.0 * torch.log(w).unsqueeze(-1)) / scale
    per_bp = torch.cat([kind, reach.unsqueeze(-1), is_global.unsqueeze(-1)], dim=-1)  # [B, K + 2]
    descriptors = torch.cat(
        [per_bp.expand(S, B, per_bp.shape[-1]), vs_host.unsqueeze(-1), vs_width.unsqueeze(-1)], dim=-1
    )
    if budget_params is not None:
        vs_budget = ((log_cost - math.log(budget_params)) / scale).clamp(-1.0, 1.0)
        descriptors = torch.cat([descriptors, vs_budget.unsqueeze(-1)], dim=-1)
    assert descriptors.shape[-1] == descriptor_dim(budget_params is not None)
    return HostLayout(
        family=host.family, slot_names=host.slot_names, slot_widths=widths, blueprint_names=tuple(names),
        host_params=host_params, germination_cost=cost, slot_features=slot_features,
        descriptors=descriptors.contiguous(), log_cost=log_cost, grow_all_params=float(grow_all_params),
        budget_params=float(budget_params or 0.0), gate_cost=host.gate_cost(),
    )  # fmt: skip


__all__ = [
    "BUDGET_FEATURES", "DESCRIPTOR_FEATURES", "PARAMS_SCALE", "REACH_SCALE", "SLOT_FEATURES", "HostLayout",
    "blueprint_traits", "describe_host", "descriptor_dim",
]  # fmt: skip
