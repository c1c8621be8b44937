"""Settings chosen on training hosts by a grid that widens where its choice lands on an edge:
``heuristic_tuned_wide`` (the heuristic's timing, its blueprint and a budget) and ``probe`` (its
threshold, incubation and score). :mod:`esper.shell.eval.search` runs them and caches their choices.

**The search** (:func:`coordinate_search`) is coordinate ascent over a grid of axes, from a starting
setting (the reference's, or the probe's defaults): each axis in turn is swept, every one of its values
with the other axes at the best setting so far, all on the same training hosts side by side, and the
best of the line becomes the best setting (a tie keeps the setting it had, else the one tried first).
Where the best value of an **ordered** axis is the first or the last of its values, the axis is widened
on that side by one value (:class:`Axis`'s ``widen``) and the new point tried, up to
:data:`MAX_WIDENINGS` times an axis; an axis that cannot widen there (``min_epoch`` 1, no budget, a
threshold of 0) is at its **natural bound**. The sweeps repeat until one changes nothing (at most
:data:`MAX_PASSES`). A **categorical** axis (a blueprint, a score) is swept whole and has no edge.

The result records, per axis, the values tried, the choice and where it sits (``interior``, ``bound``: a
natural bound, or ``edge``: the widenings ran out) and whether the axis was ``flat`` there (every value
scored the same with the others at the choice: it did not matter, and its position says nothing), and
``interior``: whether every ordered axis's choice is inside its values or at a natural bound. Every
setting tried is an episode on each host: ``compute_host_epochs`` = settings × hosts × ``max_epochs``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from esper.shell.baselines.heuristic import HeuristicController, HeuristicThresholds
from esper.shell.baselines.probe import PROBE_LIFECYCLE, SCORES, ProbeController, ProbeSettings
from esper.shell.config.presets import RunConfig
from esper.shell.env.tasks import Task
from esper.shell.eval.runner import run_hosts
from esper.shell.host.blueprints import BLUEPRINTS

#: Times an ordered axis may be widened on its edges, in all.
MAX_WIDENINGS = 3
#: Sweeps over every axis, at most (the search stops at the first that changes nothing).
MAX_PASSES = 3

#: ``widen(values, side)``: the value beyond ``values[0]`` (side -1) or ``values[-1]`` (side +1), or None at
#: a natural bound.
Widen = Callable[[list, int], Any]


@dataclass
class Axis:
    """One setting's values, in their order; ``widen`` None: categorical (no order, no edge)."""

    name: str
    values: list
    widen: Widen | None = None
    widened: int = field(default=0)

    @property
    def ordered(self) -> bool:
        return self.widen is not None


def steps(low: int, high: int) -> Widen:
    """Integers in ``[low, high]``, widened by the gap next to the edge."""

    def widen(values: list, side: int) -> int | None:
        if side < 0:
            gap = values[1] - values[0] if len(values) > 1 else 1
            return None if values[0] <= low else max(low, values[0] - gap)
        gap = values[-1] - values[-2] if len(values) > 1 else 1
        return None if values[-1] >= high else min(high, values[-1] + gap)

    return widen


def factor(k: float, floor: float = 0.0, least: float = 0.1) -> Widen:
    """Positive numbers widened by a factor ``k``; below ``least`` the low side goes to ``floor``, a
    natural bound."""

    def widen(values: list, side: int) -> float | None:
        if side > 0:
            return values[-1] * k
        if values[0] <= floor:
            return None
        low = values[0] / k
        return floor if low < least else low

    return widen


def shares(values: list, side: int) -> float | None:
    """Budget shares of ``grow_all``'s parameters, the last value 0 (no budget: the natural bound above);
    halved below."""
    return None if side > 0 else values[0] / 2


Evaluate = Callable[[list[dict[str, Any]]], list[dict[str, float]]]


def coordinate_search(
    axes: Sequence[Axis],
    start: dict[str, Any],
    evaluate: Evaluate,
    *,
    passes: int = MAX_PASSES,
    widenings: int = MAX_WIDENINGS,
) -> dict[str, Any]:
    """The module's search. ``evaluate(points)`` scores settings (dicts of every axis) side by side, one
    dict per point with ``val_acc_mean`` (the score) and what else it reports. Returns ``chosen``, every
    point tried in order (``points``), ``axes`` and ``interior``, ``converged`` and ``settings_tried``."""
    names = [a.name for a in axes]
    off = [a.name for a in axes if start[a.name] not in a.values]
    if off or set(start) != set(names):
        raise ValueError(f"coordinate_search: the start must set every axis to one of its values ({off})")
    key = lambda p: tuple(p[n] for n in names)
    scored: dict[tuple, dict[str, Any]] = {}
    order: list[tuple] = []

    def run(points: list[dict[str, Any]]) -> None:
        new = list({key(p): p for p in points if key(p) not in scored}.values())
        if new:
            for p, r in zip(new, evaluate(new), strict=True):
                scored[key(p)] = {"setting": dict(p), **r}
                order.append(key(p))

    best = dict(start)
    run([best])
    converged = False
    for _ in range(passes):
        moved = False
        for axis in axes:
            while True:
                line = [{**best, axis.name: v} for v in axis.values]
                run(line)
                here = best
                rank = lambda p, here=here: (scored[key(p)]["val_acc_mean"], p == here, -order.index(key(p)))
                top = max(line, key=rank)
                if top != best:
                    best, moved = top, True
                if not axis.ordered or axis.widened >= widenings:
                    break
                side = _side(axis, best[axis.name])
                new = axis.widen(axis.values, side) if side else None
                if new is None or new in axis.values:
                    break
                axis.values = [new, *axis.values] if side < 0 else [*axis.values, new]
                axis.widened += 1
        if not moved:
            converged = True
            break
    where = {a.name: {"values": list(a.values), "chosen": best[a.name],
                      "position": _position(a, best[a.name]), "flat": _flat(a, best, scored, key)}
             for a in axes}  # fmt: skip
    return {
        "chosen": best,
        "axes": where,
        "interior": all(w["position"] in ("interior", "bound", "categorical") for w in where.values()),
        "converged": converged,
        "settings_tried": len(order),
        "points": [scored[k] for k in order],
    }


def _flat(axis: Axis, best: dict[str, Any], scored: dict, key) -> bool | None:
    """Whether every value of ``axis`` scored the same with the other axes at ``best`` (the axis did not
    matter there, so where its choice sits says nothing); None where that line was not all tried."""
    line = [scored.get(key({**best, axis.name: v})) for v in axis.values]
    if any(r is None for r in line):
        return None
    return len({r["val_acc_mean"] for r in line}) == 1


def _side(axis: Axis, value: Any) -> int:
    pos = axis.values.index(value)
    if len(axis.values) == 1:
        return 1
    return -1 if pos == 0 else 1 if pos == len(axis.values) - 1 else 0


def _position(axis: Axis, value: Any) -> str:
    if not axis.ordered:
        return "categorical"
    side = _side(axis, value)
    if not side:
        return "interior"
    return "bound" if axis.widen(axis.values, side) is None else "edge"


def _rows(records: list[dict], n_points: int, hosts: int) -> list[dict[str, float]]:
    """Each point's mean final validation accuracy and parameters added over its ``hosts`` episodes."""
    out = []
    for c in range(n_points):
        recs = records[c * hosts : (c + 1) * hosts]
        out.append({"val_acc_mean": float(np.mean([r["final_val_acc"] for r in recs])),
                    "params_added_mean": float(np.mean([r["params_added"] for r in recs]))})  # fmt: skip
    return out


# ------------------------------------------------------------------------------ heuristic_tuned_wide
def heuristic_axes(blueprint_names: Sequence[str], max_epochs: int) -> list[Axis]:
    """``heuristic_tuned_wide``'s grid: when the rules germinate (the four timing thresholds of
    ``heuristic_tuned``, three values each, or two), what (the rotation, or one blueprint: every one but
    ``noop``) and how much (a budget: a share of what ``grow_all`` adds, or none)."""
    real = [b for b in blueprint_names if b != "noop"]
    return [
        Axis("min_epoch", [1, 3, 5], steps(1, max_epochs)),
        Axis("plateau_epochs", [0, 1, 3], steps(0, max_epochs)),
        Axis("plateau_threshold", [0.5, 1.0, 2.0], factor(2.0, floor=0.0, least=0.1)),
        Axis("stable_epochs", [0, 1, 3], steps(0, max_epochs)),
        Axis("blueprint", ["", *real]),
        Axis("budget_share", [0.25, 0.5, 0.75, 1.0, 0.0], shares),
    ]


def tune_heuristic_wide(cfg: RunConfig, task: Task, host_seeds: list[int],
                        priced: Callable[[int], Any]) -> dict[str, Any]:  # fmt: skip
    """:func:`coordinate_search` of :func:`heuristic_axes` from the reference's rules, every setting on
    ``host_seeds``; ``priced(host_seed)`` (:func:`esper.shell.eval.search.prices`) prices each batch's
    budget by its own host (``costs``, ``grow_all``: seed parameters)."""
    ref = HeuristicThresholds()
    axes = heuristic_axes(BLUEPRINTS[task.family], cfg.lifecycle.max_epochs)
    start = {a.name: getattr(ref, a.name) for a in axes}

    def evaluate(points: list[dict[str, Any]]) -> list[dict[str, float]]:
        settings = [HeuristicThresholds(**p) for p in points]
        pairs = [(c, h) for c in range(len(points)) for h in host_seeds]

        def make(env, batch: list[int]):
            per_env = [settings[pairs[k][0]] for k in batch]
            p = priced(pairs[batch[0]][1])  # a batch is one host (one member of a family)
            return HeuristicController(env.blueprint_names, cfg.lifecycle, per_env=per_env, costs=p.costs,
                                       grow_all_params=p.grow_all, cap=p.budget)  # fmt: skip

        return _rows(run_hosts(cfg, task, make, [h for _, h in pairs]), len(points), len(host_seeds))

    out = coordinate_search(axes, start, evaluate)
    chosen = HeuristicThresholds(**out["chosen"])
    return {"chosen": {f: getattr(chosen, f) for f in chosen.__slots__}, "changed": chosen.changed(), **out}


# ------------------------------------------------------------------------------------------- probe
def probe_axes(max_epochs: int) -> list[Axis]:
    """``probe``'s grid: how a candidate is scored, how long it incubates, the score it must reach."""
    return [
        Axis("score", list(SCORES)),
        Axis("incubate", [2, 3, 5], steps(1, max(1, max_epochs - 3))),
        Axis("threshold", [0.5, 2.0, 8.0], factor(4.0, floor=0.0, least=0.1)),
    ]


def tune_probe(cfg: RunConfig, task: Task, host_seeds: list[int], priced: Callable[[int], Any],
               enabled: int) -> dict[str, Any]:  # fmt: skip
    """:func:`coordinate_search` of :func:`probe_axes` from :class:`ProbeSettings`'s defaults, every setting
    on ``host_seeds``; ``priced(host_seed)`` (:func:`esper.shell.eval.search.prices`) gives each batch's
    host its costs, the learned controller's budget there and the score's unit (its ``grow_all`` over the
    ``enabled`` slots)."""
    axes = probe_axes(cfg.lifecycle.max_epochs)
    start = {a.name: getattr(ProbeSettings(), a.name) for a in axes}

    def evaluate(points: list[dict[str, Any]]) -> list[dict[str, float]]:
        settings = [ProbeSettings(**p) for p in points]
        pairs = [(c, h) for c in range(len(points)) for h in host_seeds]

        def make(env, batch: list[int]):
            per_env = [settings[pairs[k][0]] for k in batch]
            p = priced(pairs[batch[0]][1])  # a batch is one host (one member of a family)
            return ProbeController(env.blueprint_names, cfg.lifecycle, p.costs, unit=p.grow_all / enabled,
                                   budget=p.budget, per_env=per_env)  # fmt: skip

        return _rows(run_hosts(cfg, task, make, [h for _, h in pairs]), len(points), len(host_seeds))

    out = coordinate_search(axes, start, evaluate)
    return {**out, "lifecycle": dict(PROBE_LIFECYCLE)}


__all__ = ["MAX_PASSES", "MAX_WIDENINGS", "Axis", "coordinate_search", "factor", "heuristic_axes",
           "probe_axes", "shares", "steps", "tune_heuristic_wide", "tune_probe"]  # fmt: skip
