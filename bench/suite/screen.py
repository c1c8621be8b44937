"""Read a screen: an arm (the default plus flags, trained on suite tasks and seeds) paired seed by seed
with the suite's archived ``ppo_greedy``, and decided by the rule written before it.

    python -m bench.suite.screen RUNS/hg4 --tasks mnist1d_deep,longrange --first-seed 200 --seeds 5
    python -m bench.suite.screen RUNS/fb4 --out bench/results/suite/DATE-vm-screen-fb4.md
    python -m bench.suite.screen RUNS/fresh/fb4 --base RUNS/fresh/default --eval eval-fresh --confirm \
        --tasks mnist1d,mnist1d_deep,longrange,digits_shallow --first-seed 300

``ARM_DIR/TASK/seedk`` is a training run of the arm, evaluated into ``ARM_DIR/TASK/seedk/EVAL/``
(``python -m esper.shell.evaluate RUN --episodes 10 --seed 1000+k --data-seed 100000+k --controllers
ppo,ppo_greedy``: the suite's hosts and draw, which this checks before it pairs). The suite's seed comes
from ``--archive`` (:mod:`bench.suite.archive`). Per seed: the arm's ``ppo_greedy`` and ``ppo``, the
suite's ``ppo_greedy``, their difference, and from the training events of updates
:data:`LATE_UPDATES` how many seeds the controller fossilized against how many the holding deadline
kept (``timeout_fossilized``), beside the suite's own run where ``--suite-runs`` has it. The rule the
screens of docs/experiment-log.md wrote before their runs: an arm **goes on** to a rule of its own if
its paired mean over every (task, seed) pair is at least :data:`GOES_ON` points and no task's paired
mean is below :data:`FLOOR`; nothing is decided until every pair is in.

With ``--base BASE_DIR`` the arm is paired with another arm's runs instead (``BASE_DIR/TASK/seedk``,
trained at the same revision and evaluated on the same hosts and draw, each checked), on seeds the suite
never used. ``--confirm`` decides by the stricter rule a confirmation on fresh seeds wrote before its
runs: the arm is **adopted** if the pooled paired mean is at least :data:`GOES_ON`, its 95 % interval lies
above zero, and no task's paired mean is below :data:`FLOOR`. A seed kept by :mod:`bench.suite.confirm`
(``ARM_DIR/TASK/seedk.json.gz``, with its counts) is read where its run directory is gone, so
``python -m bench.suite.screen ARCHIVE/fb4 --base ARCHIVE/default ...`` reads the confirmation from the
repository alone.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.suite.archive import load_seed, same_evaluation, seed_path
from bench.suite.run import EVAL_EPISODES, SUITE, final_data_seed
from bench.suite.transfer import READOUT  # the readout the suite's rule judges: the one paired
from esper.shell.eval.stats import mean_ci95
from esper.shell.telemetry.events import read_events

#: The paired mean over all pairs an arm needs to go on, and the lowest a task's paired mean may be.
GOES_ON, FLOOR = 0.5, -0.5
#: The training updates whose lifecycle events are counted (the late half of the default's 22).
LATE_UPDATES = (12, 22)
#: Where a screen run's evaluation is, inside its run directory.
EVAL = "eval-screen"
#: The suite's kept seeds (:mod:`bench.suite.archive`).
ARCHIVE = Path(__file__).resolve().parents[1] / "results" / "suite" / "seeds"


def fossil_counts(events: Path, updates: tuple[int, int] = LATE_UPDATES) -> dict[str, int] | None:
    """Seeds fossilized by the controller (``fossilized``) and kept by the holding deadline
    (``timeout_fossilized``) in training updates ``updates`` (inclusive); None without the file."""
    if not events.is_file():
        return None
    counts = {"fossilized": 0, "timeout_fossilized": 0}
    first, last = updates
    for e in read_events(events, "lifecycle"):
        if e.get("kind") in counts and first <= e.get("update", 0) <= last:
            counts[e["kind"]] += 1
    return counts


def _arm_results(run: Path, task: str, k: int, episodes: int, eval_dir: str = EVAL) -> dict[str, Any] | None:
    """Seed ``k``'s evaluation of a run (in ``run/eval_dir``, or kept beside it as ``run.json.gz`` by
    :mod:`bench.suite.confirm`, which also holds its fossilization counts), checked to be on the suite's
    hosts and draw for that seed; None if absent."""
    f, kept = run / eval_dir / "results.json", seed_path(run.parent.parent, task, k)
    if f.is_file():
        results = json.loads(f.read_text())
    elif kept.is_file():
        f = kept
        with gzip.open(kept, "rb") as fh:
            results = json.loads(fh.read())
    else:
        return None
    meta, data_seed = results.get("meta", {}), final_data_seed(task, k)
    if not same_evaluation(meta, k, episodes, data_seed):
        got = {key: meta.get(key) for key in ("episodes", "eval_seed", "data_seed")}
        raise ValueError(f"{f}: evaluated on {got}, not on the suite's {episodes} hosts of evaluation seed "
                         f"{1000 + k} and data seed {data_seed}: the pair would not be paired")  # fmt: skip
    return results


def _fossils(results: dict[str, Any], run: Path | None) -> dict[str, int] | None:
    """A seed's late fossilization counts: those kept with its ``results``, else read from ``run``'s
    training events (None where neither has them)."""
    if results.get("fossils") is not None:
        return results["fossils"]
    return None if run is None else fossil_counts(run / "events.jsonl")


def read_screen(arm_dir: Path, archive: Path, tasks: Sequence[str], seeds: Sequence[int],
                suite_runs: Path | None = None, episodes: int = EVAL_EPISODES, *,
                base_dir: Path | None = None, eval_dir: str = EVAL) -> dict[str, Any]:  # fmt: skip
    """Every (task, seed) pair of the arm in ``arm_dir`` with its base, per task and pooled:
    ``{"tasks": {TASK: {"seeds": {k: row}, "paired": (mean, (lo, hi)) | None, ...}}, "pooled": ...,
    "pairs": n, "of": len(tasks) * len(seeds)}``. The base is the suite's archived seed (its training
    events from ``suite_runs``), or with ``base_dir`` that directory's run of the same task and seed
    (evaluated into the same ``eval_dir``)."""
    unknown = [t for t in tasks if t not in SUITE]
    if unknown or not tasks or not seeds:
        raise ValueError(
            f"unknown or no suite task(s) {unknown}; tasks: {', '.join(SUITE)}; seeds: {list(seeds)}"
        )
    out: dict[str, Any] = {"tasks": {}}
    every: list[float] = []
    base_runs = suite_runs if base_dir is None else base_dir  # where the base's training events are
    for task in tasks:
        rows: dict[int, dict[str, Any]] = {}
        for k in seeds:
            run = arm_dir / task / f"seed{k}"
            arm = _arm_results(run, task, k, episodes, eval_dir)
            if base_dir is None:
                base = load_seed(archive, task, k, episodes, final_data_seed(task, k))
            else:
                base = _arm_results(base_dir / task / f"seed{k}", task, k, episodes, eval_dir)
            if arm is None or base is None:
                rows[k] = {"missing": "arm" if arm is None else "base"}
                continue
            a, s = arm["controllers"], base["controllers"]
            rows[k] = {
                "arm": a[READOUT]["test_acc_mean"],
                "arm_ppo": a["ppo"]["test_acc_mean"] if "ppo" in a else None,
                "base": s[READOUT]["test_acc_mean"],
                "paired": a[READOUT]["test_acc_mean"] - s[READOUT]["test_acc_mean"],
                "fossils": _fossils(arm, run),
                "base_fossils": _fossils(base, None if base_runs is None else base_runs / task / f"seed{k}"),
                "credit": arm.get("credit"),
                "base_credit": base.get("credit"),
            }  # fmt: skip
        done = [r for r in rows.values() if "paired" in r]
        every += [r["paired"] for r in done]
        out["tasks"][task] = {
            "seeds": rows,
            "arm": mean_ci95([r["arm"] for r in done]) if done else None,
            "base": mean_ci95([r["base"] for r in done]) if done else None,
            "paired": mean_ci95([r["paired"] for r in done]) if done else None,
            "pairs": len(done),
        }
    out["pooled"] = mean_ci95(every) if every else None
    out["pairs"], out["of"] = len(every), len(tasks) * len(seeds)
    return out


def decide(screen: dict[str, Any], goes_on: float = GOES_ON, floor: float = FLOOR,
           confirm: bool = False) -> dict[str, Any]:  # fmt: skip
    """The rule: undecided until every pair is in; then the arm goes on if the pooled paired mean is at
    least ``goes_on`` and no task's paired mean is below ``floor``. ``confirm`` (a run on fresh seeds)
    also asks that the pooled mean's 95 % interval lie above zero; ``goes_on`` then reads "adopted"."""
    if screen["pairs"] < screen["of"]:
        return {"decided": False, "goes_on": None, "checks": {}, "confirm": confirm}
    mean, (lo, _) = screen["pooled"]
    checks = {"pooled": mean >= goes_on}
    if confirm:
        checks["pooled interval above zero"] = lo > 0
    checks.update({task: t["paired"][0] >= floor for task, t in screen["tasks"].items()})
    return {"decided": True, "goes_on": all(checks.values()), "checks": checks, "confirm": confirm}


def _interval(v: tuple[float, tuple[float, float]] | None, signed: bool = False) -> str:
    if v is None:
        return "n/a"
    m, (lo, hi) = v
    return f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]" if signed else f"{m:.1f} [{lo:.1f}, {hi:.1f}]"


def markdown(screen: dict[str, Any], decision: dict[str, Any], arm: str, base: str = "suite") -> str:
    """The screen as a table: per seed, per task, pooled, and the decision (``base`` names what the arm
    is paired with)."""
    first, last = LATE_UPDATES
    lines = [f"| task | seed | `{arm}` `{READOUT}` | `{arm}` `ppo` | {base} `{READOUT}` | paired | "
             f"fossilized / kept by the deadline, updates {first}-{last} (`{arm}`; {base}) |",
             "|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip

    def fossils(c: dict[str, int] | None) -> str:
        return "n/a" if c is None else f"{c['fossilized']} / {c['timeout_fossilized']}"

    for task, t in screen["tasks"].items():
        for k, r in t["seeds"].items():
            if "missing" in r:
                lines.append(f"| `{task}` | {k} | not in yet ({r['missing']}) | | | | |")
                continue
            ppo = "n/a" if r["arm_ppo"] is None else f"{r['arm_ppo']:.1f}"
            counts = f"{fossils(r['fossils'])}; {fossils(r['base_fossils'])}"
            lines.append(f"| `{task}` | {k} | {r['arm']:.1f} | {ppo} | {r['base']:.1f} | "
                         f"{r['paired']:+.2f} | {counts} |")  # fmt: skip
    lines.append("")
    for task, t in screen["tasks"].items():
        lines.append(f"- `{task}` ({t['pairs']} pairs): `{arm}` {_interval(t['arm'])}, {base} "
                     f"{_interval(t['base'])}; paired {_interval(t['paired'], signed=True)}")  # fmt: skip
    lines.append(f"- pooled over {screen['pairs']} of {screen['of']} pairs: paired "
                 f"{_interval(screen['pooled'], signed=True)}")  # fmt: skip
    if decision["decided"]:
        if decision["confirm"]:
            verdict = "adopted" if decision["goes_on"] else "not adopted"
            asked = (f"pooled at least {GOES_ON:+.1f} with its 95 % interval above zero, each task at least "
                     f"{FLOOR:+.1f}")  # fmt: skip
        else:
            verdict = "goes on to a rule of its own" if decision["goes_on"] else "does not go on"
            asked = f"pooled at least {GOES_ON:+.1f}, each task at least {FLOOR:+.1f}"
        checks = ", ".join(f"{name} {'holds' if ok else 'fails'}" for name, ok in decision["checks"].items())
        lines.append(f"- **decision: {verdict}** ({asked}: {checks})")
    else:
        lines.append(f"- not decided: {screen['pairs']} of {screen['of']} pairs in")
    lines += _credit_lines(screen, arm, base)
    return "\n".join(lines) + "\n"


def _credit_lines(screen: dict[str, Any], arm: str, base: str) -> list[str]:
    """The credit reading kept with each seed (:mod:`bench.suite.confirm`), as a table per task: on a
    HOLDING seed that pays, FOSSILIZE / WAIT chosen, and FOSSILIZE minus WAIT in return-to-go at the same
    epoch; nothing where no seed keeps one."""
    kept = [c for t in screen["tasks"].values() for r in t["seeds"].values()
            for c in (r.get("credit"), r.get("base_credit")) if c]  # fmt: skip
    if not kept:
        return []

    def one(c: dict[str, Any] | None) -> str:
        if not c:
            return "n/a"
        d = c["contrast"]["difference"]
        return f"{c['counts']['FOSSILIZE']} / {c['counts']['WAIT']} ({'n/a' if d is None else f'{d:+.2f}'})"

    out = ["", f"The credit reading (`bench.diagnose --credit-from {kept[0]['from_update']}`): on a HOLDING "
           "seed that pays, FOSSILIZE / WAIT chosen (FOSSILIZE minus WAIT in return-to-go at the same "
           "epoch), seed by seed:", "", f"| task | `{arm}` | {base} |", "|---|---|---|"]  # fmt: skip
    for task, t in screen["tasks"].items():
        done = [r for r in t["seeds"].values() if "paired" in r]
        if done:
            out.append(f"| `{task}` | {'; '.join(one(r.get('credit')) for r in done)} | "
                       f"{'; '.join(one(r.get('base_credit')) for r in done)} |")  # fmt: skip
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.suite.screen", description=__doc__.split("\n\n")[0])
    p.add_argument("arm_dir", type=Path, help="the arm's runs: ARM_DIR/TASK/seedk")
    p.add_argument("--tasks", default="mnist1d_deep,longrange")
    p.add_argument("--first-seed", type=int, default=200)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--archive", type=Path, default=ARCHIVE,
                   help="the suite's kept seeds (default bench/results/suite/seeds)")  # fmt: skip
    p.add_argument("--suite-runs", type=Path, default=None,
                   help="the suite's run directories (for its fossilization counts)")  # fmt: skip
    p.add_argument("--episodes", type=int, default=EVAL_EPISODES)
    p.add_argument("--base", type=Path, default=None,
                   help="pair with these runs (BASE/TASK/seedk), not the suite's")  # fmt: skip
    p.add_argument("--eval", default=EVAL, help=f"the evaluation's folder inside each run (default {EVAL})")
    p.add_argument("--confirm", action="store_true",
                   help="the confirmation's rule: the pooled interval also above zero")  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = p.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if args.base is not None and args.suite_runs is not None:
        p.error("--suite-runs names the suite's runs, which --base replaces: give one of them")
    try:
        seeds = range(args.first_seed, args.first_seed + args.seeds)
        screen = read_screen(args.arm_dir, args.archive, tasks, seeds, args.suite_runs, args.episodes,
                             base_dir=args.base, eval_dir=args.eval)  # fmt: skip
    except ValueError as e:
        p.error(str(e))
    base = "suite" if args.base is None else f"`{args.base.name}`"
    text = markdown(screen, decide(screen, confirm=args.confirm), args.arm_dir.name, base)
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
