"""Read the screen of an arm that changes the learned controller's parameter cap (the ``nocap`` arm of
:mod:`bench.suite.confirm`), by the rule docs/experiment-log.md wrote before its runs.

    python -m bench.suite.cap_screen bench/results/suite/screen-nocap/nocap --first-seed 400 --seeds 2 \\
        --out bench/results/suite/DATE-vm-screen-nocap

Each kept seed of the arm (``ARM_DIR/TASK/seedk.json.gz``, evaluated on the suite's hosts and draw for the
seed, which this checks) is paired with the suite's kept seed of the same task and training seed
(:mod:`bench.suite.archive`; the third run's are ``bench/results/suite/seeds``), which holds the capped
controller and every baseline on the same hosts. Per (task, seed), for the readout the suite judges
(``ppo_greedy``): the arm against the capped controller (:data:`CAPPED`), against ``plan_search@1x``
(:data:`SEARCH`) and against ``heuristic_tuned`` (:data:`TUNED`); the parameters each added; and the share
of the arm's evaluation episodes that grew the task's largest blueprint somewhere.

The rule: nothing is decided until every (task, seed) pair is in; then the arm is **recommended** for a
run of its own if it is within :data:`WITHIN` points of ``plan_search@1x`` or above it (the mean of the
paired differences) on at least :data:`NEEDED` tasks, and on no task more than :data:`WITHIN` points
under the capped controller.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.suite.archive import load_seed, seed_path
from bench.suite.run import EVAL_EPISODES, SUITE, final_data_seed
from bench.suite.screen import ARCHIVE, _interval
from bench.suite.transfer import READOUT
from esper.shell.eval.stats import mean_ci95

#: The suite's rows each arm seed is paired with, by the name this reading gives them.
CAPPED, SEARCH, TUNED = "ppo_greedy", "plan_search@1x", "heuristic_tuned"
BASES = {"capped": CAPPED, "search": SEARCH, "tuned": TUNED}
#: How far under the search (on :data:`NEEDED` tasks) and under the capped controller (on every task) the
#: arm may be, in points.
WITHIN, NEEDED = -1.0, 3


def largest_blueprint(task: str) -> str:
    """The blueprint that adds the most parameters in one slot of ``task``'s host (its preset's)."""
    from esper.shell.config.presets import preset
    from esper.shell.env.tasks import seed_params

    made = preset(SUITE[task]).env.build_task()
    host = made.make_host()
    return max(host.blueprint_names, key=lambda bp: seed_params(made, host, {0: bp}))


def grows(plan: str, blueprint: str) -> bool:
    """Whether the written plan ``plan`` (``b0=conv_heavy+b2=norm``, ``none``) grows ``blueprint``."""
    return any(part.partition("=")[2] == blueprint for part in plan.split("+"))


def share_growing(row: dict[str, Any], blueprint: str) -> float | None:
    """The share of a controller's evaluation episodes whose plan grew ``blueprint`` (its ``grown_counts``;
    None without them)."""
    counts = row.get("grown_counts")
    if not counts:
        return None
    return sum(n for plan, n in counts.items() if grows(plan, blueprint)) / sum(counts.values())


def _kept(archive: Path, task: str, k: int, episodes: int) -> dict[str, Any] | None:
    """Seed ``k`` of ``task`` kept in ``archive``; None where none is kept; a ValueError where one is kept
    from another evaluation than the suite's for that seed (the pair would not be paired)."""
    got = load_seed(archive, task, k, episodes, final_data_seed(task, k))
    if got is None and seed_path(archive, task, k).exists():
        data = final_data_seed(task, k)
        raise ValueError(f"{seed_path(archive, task, k)}: not the suite's evaluation of seed {k} "
                         f"({episodes} hosts of evaluation seed {1000 + k}, data seed {data})")  # fmt: skip
    return got


def read(arm_dir: Path, archive: Path, tasks: Sequence[str], seeds: Sequence[int],
         episodes: int = EVAL_EPISODES, largest: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Every (task, seed) pair: ``{"tasks": {TASK: {"largest", "seeds": {k: row}, "arm", "<base>",
    "vs_<base>": (mean, (lo, hi))}}, "pairs", "of"}`` for each base of :data:`BASES`. ``largest`` names
    each task's largest blueprint (default: read off its preset's host)."""
    unknown = [t for t in tasks if t not in SUITE]
    if unknown or not tasks or not seeds:
        raise ValueError(
            f"unknown or no suite task(s) {unknown}; tasks: {', '.join(SUITE)}; seeds: {list(seeds)}"
        )
    out: dict[str, Any] = {"tasks": {}, "readout": READOUT}
    pairs = 0
    for task in tasks:
        big = (largest or {}).get(task) or largest_blueprint(task)
        rows: dict[int, dict[str, Any]] = {}
        for k in seeds:
            arm, base = (_kept(where, task, k, episodes) for where in (arm_dir, archive))
            if arm is None or base is None:
                rows[k] = {"missing": "arm" if arm is None else "suite"}
                continue
            a, s = arm["controllers"][READOUT], base["controllers"]
            absent = [name for name in BASES.values() if name not in s]
            if absent:
                raise ValueError(f"{task} seed {k}: the suite's kept seed has no {', '.join(absent)}")
            row = {"arm": a["test_acc_mean"], "arm_params": a.get("params_added_mean"),
                   "largest_share": share_growing(a, big),
                   "grow_all_params": s.get("grow_all", {}).get("params_added_mean")}  # fmt: skip
            for short, name in BASES.items():
                row[short] = s[name]["test_acc_mean"]
                row[f"{short}_params"] = s[name].get("params_added_mean")
                row[f"vs_{short}"] = row["arm"] - row[short]
            rows[k] = row
        done = [r for r in rows.values() if "missing" not in r]
        pairs += len(done)
        t: dict[str, Any] = {"largest": big, "seeds": rows, "pairs": len(done)}
        for key in ("arm", *BASES, *(f"vs_{b}" for b in BASES)):
            t[key] = mean_ci95([r[key] for r in done]) if done else None
        shares = [r["largest_share"] for r in done if r["largest_share"] is not None]
        t["largest_share"] = sum(shares) / len(shares) if shares else None
        out["tasks"][task] = t
    out["pairs"], out["of"] = pairs, len(tasks) * len(seeds)
    return out


def decide(screen: dict[str, Any], within: float = WITHIN, needed: int = NEEDED) -> dict[str, Any]:
    """The rule (module doc): undecided until every pair is in; then ``recommended`` when the arm is at
    least ``within`` against the search on ``needed`` tasks and at least ``within`` against the capped
    controller on every task."""
    if screen["pairs"] < screen["of"]:
        return {"decided": False, "recommended": None, "near_search": [], "checks": {}}
    tasks = screen["tasks"]
    near = [task for task, t in tasks.items() if t["vs_search"][0] >= within]
    checks = {f"within {abs(within):g} of `{SEARCH}` on at least {needed} tasks": len(near) >= needed}
    checks.update({f"`{task}` against the capped controller": t["vs_capped"][0] >= within
                   for task, t in tasks.items()})  # fmt: skip
    return {"decided": True, "recommended": all(checks.values()), "near_search": near, "checks": checks}


def markdown(screen: dict[str, Any], decision: dict[str, Any], arm: str) -> str:
    """The screen as tables: per seed, per task (means over the seeds, paired differences with their 95 %
    intervals) and the decision."""
    lines = [f"| task | seed | `{arm}` `{READOUT}` | capped `{CAPPED}` | `{SEARCH}` | `{TUNED}` | "
             f"against capped | against `{SEARCH}` | against `{TUNED}` | params added (`{arm}`; capped; "
             "`grow_all`) | episodes growing the largest blueprint |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]  # fmt: skip

    def num(v: float | None, fmt: str = ".0f") -> str:
        return "n/a" if v is None else format(v, fmt)

    for task, t in screen["tasks"].items():
        for k, r in t["seeds"].items():
            if "missing" in r:
                lines.append(f"| `{task}` | {k} | not in yet ({r['missing']}) | | | | | | | | |")
                continue
            share = "n/a" if r["largest_share"] is None else f"{r['largest_share']:.0%}"
            lines.append(
                f"| `{task}` | {k} | {r['arm']:.1f} | {r['capped']:.1f} | {r['search']:.1f} | "
                f"{r['tuned']:.1f} | "
                f"{r['vs_capped']:+.2f} | {r['vs_search']:+.2f} | {r['vs_tuned']:+.2f} | "
                f"{num(r['arm_params'])}; {num(r['capped_params'])}; {num(r['grow_all_params'])} | {share} |"
            )
    lines += ["", "Means over the seeds, test accuracy % (paired differences with 95 % intervals over the "
              "seeds):", ""]  # fmt: skip
    for task, t in screen["tasks"].items():
        share = "n/a" if t["largest_share"] is None else f"{t['largest_share']:.0%}"
        lines.append(
            f"- `{task}` ({t['pairs']} pairs; `{t['largest']}` grown in {share} of `{arm}`'s episodes): "
            f"`{arm}` {_interval(t['arm'])}; against capped {_interval(t['vs_capped'], signed=True)}, "
            f"against `{SEARCH}` {_interval(t['vs_search'], signed=True)}, against `{TUNED}` "
            f"{_interval(t['vs_tuned'], signed=True)}"
        )
    if decision["decided"]:
        verdict = "recommended for a run of its own" if decision["recommended"] else "not recommended"
        checks = "; ".join(f"{name}: {'holds' if ok else 'fails'}" for name, ok in decision["checks"].items())
        near = ", ".join(f"`{t}`" for t in decision["near_search"]) or "none"
        lines.append(f"- **decision: {verdict}** ({checks}). Within a point of `{SEARCH}` or above: {near}.")
    else:
        lines.append(f"- not decided: {screen['pairs']} of {screen['of']} pairs in")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.suite.cap_screen", description=__doc__.split("\n\n")[0])
    p.add_argument("arm_dir", type=Path, help="the arm's kept seeds: ARM_DIR/TASK/seedk.json.gz")
    p.add_argument("--tasks", default=",".join(SUITE))
    p.add_argument("--first-seed", type=int, default=400)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--archive", type=Path, default=ARCHIVE,
                   help=f"the suite's kept seeds (default {ARCHIVE})")  # fmt: skip
    p.add_argument("--episodes", type=int, default=EVAL_EPISODES)
    p.add_argument("--out", type=Path, default=None, help="also write OUT.md and OUT.json")
    args = p.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    try:
        screen = read(args.arm_dir, args.archive, tasks, seeds, args.episodes)
    except ValueError as e:
        p.error(str(e))
    decision = decide(screen)
    text = markdown(screen, decision, args.arm_dir.name)
    print(text, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(text)
        record = {"screen": screen, "decision": decision}
        args.out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
