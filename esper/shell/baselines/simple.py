"""Baseline controllers a learned controller is judged against (``python -m esper.shell.evaluate``).

- :class:`StaticController` (``static``): always WAIT; the host never grows.
- :class:`RandomController` (``random``): uniform over legal actions: the op uniformly among the
  legal ops, the slot uniformly among the slots legal for that op, every other head uniformly.
- :class:`GrowAllController` (``grow_all``): a fixed schedule: germinate one blueprint (the task's
  best, :attr:`esper.shell.env.tasks.Task.grow_all`) in every empty enabled slot, blend each seed in
  as soon as its gate allows, fossilize it as soon as G5 allows. Each step it does the first that applies,
  on the first slot where it applies: FOSSILIZE a ready HOLDING seed, ADVANCE a seed whose gate
  (G2 or G3) would pass, GERMINATE into an empty slot; else WAIT. Given a *plan* (slot -> blueprint,
  ``grow:b0=conv_heavy+b2=depthwise`` in :mod:`esper.shell.eval.controllers`) it grows only the planned
  slots, each with its own blueprint: the fixed placements a learned controller can be held against.
- :class:`BornBigController` (``born_big``): a plan's seeds present from epoch 0, FOSSILIZED at alpha 1,
  trained with the host: the static network at the plan's final size.
- ``heuristic``: the reference's rules, :class:`esper.shell.baselines.heuristic.HeuristicController`.
- ``probe``: a greedy what-if probe, :class:`esper.shell.baselines.probe.ProbeController`.

All act from the same :class:`~esper.shell.env.step.StepInput` as the policy, legal actions only, and
are vectorized over envs (no per-env Python loop).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from tensordict import TensorDict

from esper.core import distributions as dist
from esper.core.lifecycle import LifecycleConfig, gate_readiness
from esper.core.masks import action_masks, slot_mask
from esper.core.spec import ALPHA_TARGETS, DEFAULT_BLEND, HEADS, Op, Style, Tempo
from esper.shell.env.step import StepInput


def _actions(ops: dict[str, torch.Tensor], n: int, device: torch.device) -> TensorDict:
    """``{head: [E] int64}`` (missing heads 0) as the controller output TensorDict."""
    zeros = torch.zeros(n, dtype=torch.int64, device=device)
    return TensorDict(
        {h: TensorDict({"action": ops.get(h, zeros)}, batch_size=[n]) for h in HEADS}, batch_size=[n]
    )


def _first(mask: torch.Tensor) -> torch.Tensor:
    """Index of the first True along the last dim (0 where none)."""
    return mask.to(torch.int8).argmax(-1)


class FixedController:
    """The part every controller that does not learn shares: no rollout kept, no per-env sampling
    state, no reasons to give, nothing to bootstrap."""

    learns = False

    def begin(self, n_envs: int) -> None:
        self.n = n_envs

    def seed_envs(self, host_seeds: list[int]) -> None:
        return None

    def explain(self) -> list[str] | None:
        return None

    def bootstrap(self, step: StepInput) -> None:
        return None


class StaticController(FixedController):
    """Always WAIT (on the first enabled slot; the slot head is irrelevant under WAIT)."""

    def act(self, step: StepInput) -> TensorDict:
        legal = step.legal["slot_by_op"]  # [E, N_OPS, S]
        n = legal.shape[0]
        wait = torch.full((n,), int(Op.WAIT), dtype=torch.int64, device=legal.device)
        return _actions({"op": wait, "slot": _first(legal[:, int(Op.WAIT)])}, n, legal.device)


class BornBigController(StaticController):
    """``born_big``: the plan's final network from the start. Its seeds (``{slot index: blueprint
    index}``) are built into every fresh host before the first epoch, FOSSILIZED at alpha 1
    (:attr:`esper.shell.env.vecenv.VecEnv.born`, set by :meth:`prepare_env`): part of the network from
    epoch 0, reading the host's live activation, so host and seeds train together for every epoch, as a
    static network of the final size would. Then it always WAITs."""

    def __init__(self, plan: Mapping[int, int]) -> None:
        self.plan = {int(s): int(b) for s, b in plan.items()}

    def prepare_env(self, env) -> None:
        """Every env of ``env`` (a :class:`~esper.shell.env.vecenv.VecEnv`) is born with the plan."""
        env.born = [dict(self.plan) for _ in range(env.n)]


class RandomController(FixedController):
    """Uniform over legal actions, drawn from its own CPU generator: reproducible for a seed, and the
    same draws whatever device the envs are on (the draws are made on the CPU, then moved)."""

    def __init__(self, *, seed: int = 0) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def act(self, step: StepInput) -> TensorDict:
        legal = step.legal
        device = legal["op"].device
        op = self._uniform(legal["op"])
        slot = self._uniform(slot_mask(legal, op))
        used = action_masks(legal, op, slot)
        out = {"op": op, "slot": slot}
        out.update({h: self._uniform(used[h]) for h in HEADS if h not in out})  # HEADS order: same draws
        return _actions(out, op.shape[0], device)

    def _uniform(self, mask: torch.Tensor) -> torch.Tensor:
        race = torch.empty(mask.shape).exponential_(generator=self.generator).to(mask.device)
        return dist.sample(torch.zeros(mask.shape, device=mask.device), mask, race=race)


class GrowAllController(FixedController):
    """Germinate ``blueprint`` everywhere, blend and fossilize as fast as the gates allow.

    ``blueprint``: one blueprint index for every slot, or a plan ``{slot index: blueprint index}``:
    only the planned slots are grown, each with its own blueprint (in slot order, one per step); or a
    list of plans, one per env (a plan search runs its candidates side by side; an empty plan in the
    list: that env grows nothing).

    ``at`` (a timed plan, ``grow:b0=conv_heavy:3``): ``{slot index: epoch}``, or one such per env with a
    list of plans: no germination in that slot before that epoch (the epoch of the measurement it acts
    on, 1 the first; a slot not named: 1, as fast as the gates allow). ``style``, ``tempo`` and
    ``alpha_target`` may each be a list, one per env, with a list of plans."""

    def __init__(
        self,
        blueprint: int | Mapping[int, int] | Sequence[Mapping[int, int]],
        lifecycle: LifecycleConfig,
        *,
        style: Style | int | Sequence[Style | int] = DEFAULT_BLEND["style"],
        tempo: Tempo | int | Sequence[Tempo | int] = DEFAULT_BLEND["tempo"],
        alpha_target: float | Sequence[float] = ALPHA_TARGETS[DEFAULT_BLEND["alpha_target"]],
        at: Mapping[int, int] | Sequence[Mapping[int, int]] | None = None,
    ) -> None:
        self.plans: list[dict[int, int]] | None = None
        self.blueprint: int | None = None
        self.per_env = False
        self._cache: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        if isinstance(blueprint, Mapping) or (isinstance(blueprint, Sequence) and blueprint):
            plans = [blueprint] if isinstance(blueprint, Mapping) else list(blueprint)
            for plan in plans:  # in a list, an empty plan is an env that grows nothing (the static host)
                empty_ok = not isinstance(blueprint, Mapping) and isinstance(plan, Mapping) and not plan
                if not empty_ok and (
                    not isinstance(plan, Mapping) or not plan or min(plan) < 0 or min(plan.values()) < 0
                ):
                    raise ValueError(f"GrowAllController: a plan maps slot indices to blueprint indices, got "
                                     f"{plan!r}")  # fmt: skip
            self.plans = [dict(p) for p in plans]
            self.per_env = not isinstance(blueprint, Mapping)
        elif isinstance(blueprint, Sequence):
            raise ValueError("GrowAllController: an empty list of plans")
        else:
            self.blueprint = int(blueprint)
        self.lc = lifecycle
        listed = [isinstance(v, Sequence) for v in (style, tempo, alpha_target)]
        listed.append(at is not None and not isinstance(at, Mapping))
        if any(listed) and not self.per_env:
            raise ValueError("GrowAllController: per-env blends or timings go with a list of plans")
        self.style = [int(v) for v in style] if listed[0] else int(style)
        self.tempo = [int(v) for v in tempo] if listed[1] else int(tempo)
        self.alpha_target = ([ALPHA_TARGETS.index(v) for v in alpha_target] if listed[2]
                             else ALPHA_TARGETS.index(alpha_target))  # fmt: skip
        #: Per env (or for every env), each slot's first epoch of germination.
        self.at: list[dict[int, int]] | dict[int, int] = (
            {} if at is None else [dict(a) for a in at] if listed[3] else dict(at)
        )

    @property
    def plan(self) -> dict[int, int] | None:
        """The plan every env follows (None: one blueprint everywhere, or a plan per env)."""
        return self.plans[0] if self.plans is not None and not self.per_env else None

    def _planned(self, n_envs: int, n_slots: int,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """``(allowed [E, S] bool, blueprint [E, S] int64, first epoch [E, S] int64)`` of the plans (every
        slot, one blueprint without)."""
        shape = (n_envs, n_slots)
        at = torch.zeros(shape, dtype=torch.int64)
        timings = self.at if isinstance(self.at, list) else [self.at] * n_envs
        if len(timings) != n_envs:
            raise ValueError(f"GrowAllController: {len(timings)} timings for {n_envs} envs")
        for e, timing in enumerate(timings):
            for slot, epoch in timing.items():
                at[e, slot] = epoch
        if self.blueprint is not None:
            return (torch.ones(shape, dtype=torch.bool, device=device),
                    torch.full(shape, self.blueprint, dtype=torch.int64, device=device),
                    at.to(device))  # fmt: skip
        assert self.plans is not None
        plans = self.plans * n_envs if not self.per_env else self.plans
        if len(plans) != n_envs:
            raise ValueError(f"GrowAllController: {len(plans)} plans for {n_envs} envs")
        if (top := max((max(p) for p in plans if p), default=-1)) >= n_slots:
            raise ValueError(f"GrowAllController: plan names slot {top}, the host has {n_slots}")
        allowed = torch.zeros(shape, dtype=torch.bool)
        bps = torch.zeros(shape, dtype=torch.int64)
        for e, plan in enumerate(plans):
            for slot, bp in plan.items():
                allowed[e, slot], bps[e, slot] = True, bp
        return allowed.to(device), bps.to(device), at.to(device)

    def _blend(self, name: str, n: int, device: torch.device) -> torch.Tensor:
        """``[E]`` int64 of one blend head: the same choice for every env, or each env's own."""
        v = getattr(self, name)
        if isinstance(v, list):
            if len(v) != n:
                raise ValueError(f"GrowAllController: {len(v)} {name} choices for {n} envs")
            return torch.tensor(v, dtype=torch.int64, device=device)
        return torch.full((n,), v, dtype=torch.int64, device=device)

    def act(self, step: StepInput) -> TensorDict:
        legal = step.legal["slot_by_op"]  # [E, N_OPS, S]
        n, device = legal.shape[0], legal.device
        gates = gate_readiness(step.slots, step.signals["val_acc"], self.lc)
        fossilize = gates["g5"] & legal[:, int(Op.FOSSILIZE)]
        advance = (gates["g2"] | gates["g3"]) & legal[:, int(Op.ADVANCE)]
        key = (n, legal.shape[-1], device)
        if key not in self._cache:
            self._cache[key] = self._planned(n, legal.shape[-1], device)
        allowed, plan_bp, at = self._cache[key]
        germinate = legal[:, int(Op.GERMINATE)] & allowed
        if self.at:  # a timed plan: a slot germinates from its epoch on
            germinate = germinate & (step.signals["epoch"].to(device).unsqueeze(-1) >= at)
        wait = legal[:, int(Op.WAIT)]
        op = torch.full((n,), int(Op.WAIT), dtype=torch.int64, device=device)
        slot = _first(wait)
        for o, mask in ((Op.GERMINATE, germinate), (Op.ADVANCE, advance), (Op.FOSSILIZE, fossilize)):
            any_ = mask.any(-1)  # later entries take precedence
            op = torch.where(any_, int(o), op)
            slot = torch.where(any_, _first(mask), slot)
        return _actions(
            {
                "op": op,
                "slot": slot,
                "blueprint": plan_bp.gather(1, slot[:, None]).squeeze(1),
                **{h: self._blend(h, n, device) for h in ("style", "tempo", "alpha_target")},
            },
            n,
            device,
        )


__all__ = [
    "BornBigController",
    "FixedController",
    "GrowAllController",
    "RandomController",
    "StaticController",
]
