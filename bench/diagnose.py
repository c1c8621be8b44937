"""Diagnostics read off training runs' ``events.jsonl``: the numbers behind the README's growth notes.

    python -m bench.diagnose bench/runs/growth/seed*/events.jsonl

Three questions, each over every run given:

1. **Deadline prunes** (:func:`deadline_prunes`): every seed the HOLDING deadline pruned
   (``timeout_pruned``), whether an ``alpha_set`` on the same seed came within the ``window`` epochs
   before it, and the change of that env's validation accuracy from the deadline's epoch to the next
   (a seed the host depended on shows as a drop). Before 35152bf a seed whose alpha was still ramping
   at its deadline was pruned however much it paid.
2. **The b0 blueprint** (:func:`b0_returns`): the returns of the episodes of updates ``1..last_update``,
   grouped by the blueprint of the first seed germinated in slot 0: what an update's few samples of
   each blueprint tell the blueprint head while the rest of the policy is untrained.
3. **One-epoch dips** (:func:`dips`): an env's validation accuracy falls by at least ``drop`` points
   from one epoch to the next and is back within ``back`` points the epoch after, with what the
   controller did on the epoch before the dip (the action whose effect the dipping epoch measures),
   and whether that was an ``alpha_set`` that changed the seed's style (possible before 6365c26).
4. **Exposure to a placement** (:func:`exposure`, ``--plan b0=conv_heavy+b2=self_attention``): how many
   training episodes ended on a host that holds every seed of the plan, in updates ``1..early``, in
   all updates, and in the last update: whether a controller that misses a placement never saw what it
   pays, or saw it and left it.
5. **What FOSSILIZE is worth to the learner** (:func:`holding_credit`, ``--credit-from N``): in the
   training episodes of updates ``N..``, every step before which a slot held a HOLDING seed that pays
   (measured contribution at least ``--credit-min`` points), with what the controller chose for it
   (FOSSILIZE or another op on that slot, WAIT, or an op on another slot) and the episode's return from
   that step on. Choices read at the same epoch of the same run share the measurement they act on, so
   their mean returns differ by what followed them (the default's OBJECTIVE reward telescopes to the
   final objective); beside that difference, the spread of the return at one epoch: the noise the
   advantage of one such choice is learned against. An observational reading (which choice the
   policy sampled depends on the state), not a controlled one.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from esper.shell.eval.suite.readings import CREDIT_CHOICES, credit_contrast, holding_credit


def _events(path: str | Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def deadline_prunes(path: str | Path, window: int = 5) -> list[dict[str, Any]]:
    """One record per ``timeout_pruned`` event of the run: ``update``, ``epoch``, ``env``, ``slot``,
    ``blueprint``, ``after_alpha_set`` (an ``alpha_set`` on that env and slot within ``window`` epochs
    before, same update) and ``drop`` (validation accuracy at the next epoch minus at this one, points;
    None at an episode's last epoch)."""
    events = _events(path)
    acc = {(e["update"], e["epoch"]): e["val_acc"] for e in events if e["event"] == "epoch"}
    sets = defaultdict(list)
    for e in events:
        if e["event"] == "lifecycle" and e["kind"] == "alpha_set":
            sets[(e["update"], e["env"], e["slot"])].append(e["epoch"])
    out = []
    for e in events:
        if e["event"] != "lifecycle" or e["kind"] != "timeout_pruned":
            continue
        u, t, i = e["update"], e["epoch"], e["env"]
        after = any(t - window <= s <= t for s in sets[(u, i, e["slot"])])
        nxt, now = acc.get((u, t + 1)), acc.get((u, t))
        drop = None if nxt is None or now is None else float(nxt[i] - now[i])
        out.append({"update": u, "epoch": t, "env": i, "slot": e["slot"], "blueprint": e.get("blueprint"),
                    "after_alpha_set": after, "drop": drop})  # fmt: skip
    return out


def b0_returns(path: str | Path, last_update: int = 8) -> dict[str, list[float]]:
    """Returns of the episodes of updates ``1..last_update`` by the blueprint first germinated in slot 0
    (``"-"``: none)."""
    out: dict[str, list[float]] = defaultdict(list)
    for e in _events(path):
        if e["event"] != "episode" or e["update"] > last_update:
            continue
        b0 = [g["blueprint"] for g in e.get("germinations", []) if g["slot"] == 0]
        out[b0[0] if b0 else "-"].append(float(e["return"]))
    return dict(out)


def dips(path: str | Path, drop: float = 15.0, back: float = 5.0) -> list[dict[str, Any]]:
    """One record per one-epoch dip: ``update``, ``env``, ``epoch`` (the low one), ``depth`` (points
    below the epoch before), ``kinds`` (sorted lifecycle event kinds of that env at the epoch before)
    and ``restyled`` (one of them an ``alpha_set`` whose style differs from the style the seed last
    had in that slot: at its germination or an earlier ``alpha_set``)."""
    events = _events(path)
    acc = {(e["update"], e["epoch"]): e["val_acc"] for e in events if e["event"] == "epoch"}
    kinds: dict[tuple[int, int, int], set[str]] = defaultdict(set)
    restyled: set[tuple[int, int, int]] = set()
    style: dict[tuple[int, int, int], str] = {}  # (update, env, slot) -> the seed's style so far
    for e in events:
        if e["event"] != "lifecycle":
            continue
        key = (e["update"], e["env"], e["epoch"])
        kinds[key].add(e["kind"])
        seed = (e["update"], e["env"], e["slot"])
        if e["kind"] in ("germinated", "alpha_set") and "style" in e:
            if e["kind"] == "alpha_set" and style.get(seed, e["style"]) != e["style"]:
                restyled.add(key)
            style[seed] = e["style"]
    out = []
    for (u, t), now in sorted(acc.items()):
        before, after = acc.get((u, t - 1)), acc.get((u, t + 1))
        if before is None or after is None:
            continue
        for i, (a, b, c) in enumerate(zip(before, now, after)):
            if a - b >= drop and abs(c - a) <= back:
                out.append({"update": u, "env": i, "epoch": t, "depth": float(a - b),
                            "kinds": sorted(kinds.get((u, i, t - 1), ())),
                            "restyled": (u, i, t - 1) in restyled})  # fmt: skip
    return out


def _holds(grown: str, plan: str) -> bool:
    """Whether a final host (``grown``, the fixed placements' notation) holds every ``slot=blueprint``
    of ``plan`` (other seeds may be there too)."""
    have = set(grown.split("+")) if grown else set()
    return set(plan.split("+")) <= have


def exposure(path: str | Path, plan: str, early: int = 5) -> dict[str, int]:
    """Training episodes whose final host holds ``plan`` (``b0=conv_heavy+b2=self_attention``):
    ``early`` (updates ``1..early``) of ``early_episodes``, ``all`` of ``episodes``, ``last`` of
    ``last_episodes`` (the run's last update)."""
    if not plan or any(part.count("=") != 1 for part in plan.split("+")):
        raise ValueError(f"plan must read slot=blueprint[+slot=blueprint...], got {plan!r}")
    eps = [e for e in _events(path) if e["event"] == "episode"]
    if not eps:
        raise ValueError(f"{path} has no episode events")
    last = max(e["update"] for e in eps)
    held = [(e["update"], _holds(e.get("grown") or "", plan)) for e in eps]
    return {
        "early": sum(h for u, h in held if u <= early), "early_episodes": sum(u <= early for u, _ in held),
        "all": sum(h for _, h in held), "episodes": len(held),
        "last": sum(h for u, h in held if u == last), "last_episodes": sum(u == last for u, _ in held),
    }  # fmt: skip


def summary(
    paths: list[str],
    window: int = 5,
    last_update: int = 8,
    plans: Sequence[str] = (),
    early: int = 5,
    credit_from: int = 0,
    credit_min: float = 1.0,
) -> str:
    prunes = [p for path in paths for p in deadline_prunes(path, window)]
    lines = [f"{len(paths)} runs, {len(prunes)} deadline prunes"]
    for after in (True, False):
        kept = [p["drop"] for p in prunes if p["after_alpha_set"] is after]
        drops = np.array([d for d in kept if d is not None])
        what = f"after an alpha_set within {window} epochs" if after else "with no alpha_set before"
        if len(drops):
            lines.append(
                f"  {what}: {len(drops)}; next-epoch val acc change median {np.median(drops):+.1f}, "
                f"below -10: {(drops < -10).mean():.1%}, below -20: {(drops < -20).mean():.1%}"
            )
        else:
            lines.append(f"  {what}: none")
    pooled: dict[str, list[float]] = defaultdict(list)
    for path in paths:
        for bp, r in b0_returns(path, last_update).items():
            pooled[bp] += r
    lines.append(f"episode return by b0 blueprint, updates 1-{last_update} (mean, sd, episodes):")
    for bp, r in sorted(pooled.items(), key=lambda kv: -np.mean(kv[1])):
        lines.append(f"  {bp:>16}: {np.mean(r):6.1f} {np.std(r):5.1f} {len(r):5d}")
    per_run = [dips(path) for path in paths]
    found = [d for run in per_run for d in run]
    lines.append(
        f"one-epoch dips (>= 15 points, back within 5): {len(found)} "
        f"(per run {', '.join(str(len(r)) for r in per_run)}); "
        f"after an alpha_set {sum('alpha_set' in d['kinds'] for d in found)}, "
        f"after a re-style {sum(d['restyled'] for d in found)}, "
        f"after no lifecycle event {sum(not d['kinds'] for d in found)}"
    )
    for plan in plans:
        lines.append(
            f"training episodes whose final host holds {plan} (updates 1-{early} / all / last update):"
        )
        for path in paths:
            x = exposure(path, plan, early)
            lines.append(f"  {Path(path).parent.name or path}: {x['early']}/{x['early_episodes']}, "
                         f"{x['all']}/{x['episodes']}, {x['last']}/{x['last_episodes']}")  # fmt: skip
    if credit_from > 0:
        lines.append(
            f"choices on a HOLDING seed that pays (contribution >= {credit_min:g}), updates {credit_from}-: "
            "counts; FOSSILIZE minus WAIT in return-to-go at the same epoch (weight); the return's spread"
        )
        for path in paths:
            rows = holding_credit(path, credit_from, credit_min)
            counts = ", ".join(f"{k} {sum(r['choice'] == k for r in rows)}" for k in CREDIT_CHOICES)
            x = credit_contrast(rows, "FOSSILIZE")
            diff = "n/a" if x["difference"] is None else f"{x['difference']:+.2f}"
            spread = "n/a" if x["spread"] is None else f"{x['spread']:.2f}"
            lines.append(f"  {Path(path).parent.name or path}: {counts}; {diff} ({x['weight']}); sd {spread}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.diagnose", description=__doc__.split("\n\n")[0])
    p.add_argument("events", nargs="+", help="events.jsonl of training runs")
    p.add_argument("--window", type=int, default=5, help="epochs searched for alpha_set")
    p.add_argument("--last-update", type=int, default=8, help="b0 returns over updates 1..N")
    p.add_argument(
        "--plan",
        action="append",
        default=[],
        help="a placement (b0=conv_heavy+b2=self_attention): training episodes that ended holding it",
    )
    p.add_argument("--early", type=int, default=5, help="the plan's early window: updates 1..N")
    p.add_argument(
        "--credit-from", type=int, default=0, help="read choices on paying HOLDING seeds, updates N.. (0 off)"
    )
    p.add_argument("--credit-min", type=float, default=1.0, help="a HOLDING seed pays from this contribution")
    args = p.parse_args(argv)
    if args.credit_from < 0:
        p.error(f"--credit-from must be >= 0, got {args.credit_from}")
    credit = {"credit_from": args.credit_from, "credit_min": args.credit_min}
    print(summary(args.events, args.window, args.last_update, args.plan, args.early, **credit))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
