"""Where each (task, seed) of a suite run stands, read from its run directories: nothing is run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from esper.shell.config.presets import preset
from esper.shell.eval.search import HEURISTIC_TUNED, PLAN_SEARCH_CAP
from esper.shell.eval.suite.archive import baselines_only, run_end
from esper.shell.eval.suite.tasks import EVALUATIONS, SUITE
from esper.shell.telemetry.events import read_events


def status(tasks: Sequence[str], seeds: int, first_seed: int, runs: Path) -> list[dict[str, Any]]:
    """Where each (task, seed) of a suite run stands, read from ``runs`` (nothing is run): its training
    (``updates`` done of ``of``, ``trained``; ``baselines_only`` where it trains none: ``--controller-from``),
    the searches cached in its run directory, and which of its evaluations (the table's, the diagnosis, the
    plan within the cap) are written."""
    rows = []
    for task in tasks:
        of = preset(SUITE[task]).updates
        for k in range(first_seed, first_seed + seeds):
            run = runs / task / f"seed{k}"
            events = run / "events.jsonl"
            updates = len(list(read_events(events, "ppo_update"))) if events.exists() else 0
            ended = run_end(run) is not None
            searches = sorted(p.stem for p in (run / "search").glob("*.json")) if run.is_dir() else []
            evals = {name: (run / d / "results.json").exists()
                     for name, d in zip(("table", "diagnosis", "in_cap"), EVALUATIONS)}  # fmt: skip
            rows.append({"task": task, "seed": k, "updates": updates, "of": of, "trained": ended,
                         "baselines_only": baselines_only(run), "searches": searches, **evals})  # fmt: skip
    return rows


def status_lines(rows: list[dict[str, Any]]) -> list[str]:
    """:func:`status` as a table (searches by budget: ``tuned`` is ``heuristic_tuned``, ``cap 1x``
    ``plan_search_cap@1x``)."""
    out = ["| task | seed | training | searches cached | table | diagnosis | in cap |",
           "|---|---:|---|---|---|---|---|"]  # fmt: skip
    mark = {True: "done", False: ""}
    for r in rows:
        if r.get("baselines_only"):
            train = "none (baselines only)"
        else:
            train = "done" if r["trained"] else (f"{r['updates']}/{r['of']} updates" if r["updates"] else "")
        short = (n.replace(HEURISTIC_TUNED, "tuned").replace(f"{PLAN_SEARCH_CAP}@", "cap ")
                 .replace("plan_search@", "") for n in r["searches"])  # fmt: skip
        searched = ", ".join(short)
        evals = " | ".join(mark[r[k]] for k in ("table", "diagnosis", "in_cap"))
        out.append(f"| {r['task']} | {r['seed']} | {train} | {searched} | {evals} |")
    done = sum(r["table"] for r in rows)
    out.append(f"\n{done} of {len(rows)} (task, seed) evaluated.")
    return out


__all__ = ["status", "status_lines"]
