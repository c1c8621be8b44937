"""One PPO update of the embedded default at two revisions, interleaved on one machine.

    python -m bench.revisions --base 828fa25 --rounds 3            # this checkout against 828fa25
    python -m bench.revisions --base 828fa25 --envs 32 --rounds 2

Each round runs ``python -m esper.shell.run --updates 1 --eval_episodes 0`` (the issue's measure: one
update of the default preset, no held-out check) once at each revision, in alternating order (A B, B A,
...), each in a fresh process with its own run directory, and reads the process's wall time and the
run's ``timings`` event (host training, validation, ...). The result is the median over rounds of the
per-round ratio base / this, so a machine whose speed drifts between rounds hits both alike. The base
revision is checked out into a temporary git worktree (removed after).

It also compares the two runs' events (the first round's of each): at the run's fixed seed, a change
that only makes the code faster gives the same events to the bit, apart from times
(:func:`fingerprint`). ``--preset`` runs another preset (a suite task's) instead of the default. The
suite's rule lets a part run at a later revision whose fixed-seed run gives the same events
(docs/experiment-log.md).

Writes ``bench/results/perf/<date>-<host>-revisions[-<tag>].{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import machine_info

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "perf"


#: Events that record times, paths or the machine's state, not what the run computed.
UNTIMED_SKIP = ("run_start", "timings", "checkpoint", "run_end", "anomaly")


#: Fields of the other events that are times.
TIME_FIELDS = ("t", "timings", "seconds")


def fingerprint(events: list[dict]) -> list[dict]:
    """What a run computed, from its events: every event but :data:`UNTIMED_SKIP`, without its
    :data:`TIME_FIELDS`."""
    return [{k: v for k, v in e.items() if k not in TIME_FIELDS} for e in events
            if e["event"] not in UNTIMED_SKIP]  # fmt: skip


def first_difference(a: list[dict], b: list[dict]) -> str | None:
    """Where two fingerprints first differ (None: the same events)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
            return f"event {i} ({x.get('event')}, update {x.get('update')}): {', '.join(keys)} differ"
    return None if len(a) == len(b) else f"{len(a)} events against {len(b)}"


def one_update(checkout: Path, run_dir: Path, name: str, envs: int, preset: str | None = None) -> dict:
    """Wall seconds of one update of the default (or ``preset``) at ``checkout``, its timings event, and
    its events' :func:`fingerprint` (``events``)."""
    cmd = [sys.executable, "-m", "esper.shell.run", "--updates", "1", "--eval_episodes", "0", "--report",
           "false", "--progress", "false", "--run_dir", str(run_dir), "--name", name]  # fmt: skip
    if preset:
        cmd += ["--preset", preset]
    if envs != 8:
        cmd += ["--env.n_envs", str(envs)]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{checkout}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    events = [json.loads(line) for line in (run_dir / name / "events.jsonl").read_text().splitlines()]
    timings = next(e for e in events if e["event"] == "timings")
    times = {k: v for k, v in timings.items() if isinstance(v, float) and k != "t"}
    return {"wall_s": wall, **times, "events": fingerprint(events)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.revisions", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="828fa25", help="the revision to compare against (828fa25)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--envs", type=int, default=8, help="env.n_envs (8: the default's)")
    p.add_argument("--preset", default=None, help="a preset of esper.shell.run instead of the default")
    p.add_argument("--tag", default="")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    rev = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()  # fmt: skip
    rows: dict[str, list[dict]] = {"base": [], "this": []}
    with tempfile.TemporaryDirectory(prefix="esper-revisions-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(base), rev], cwd=ROOT, check=True)
        try:
            for r in range(args.rounds):
                order = ("base", "this") if r % 2 == 0 else ("this", "base")
                for which in order:
                    checkout = base if which == "base" else ROOT
                    run = one_update(checkout, Path(tmp) / "runs", f"{which}-{r}", args.envs, args.preset)
                    rows[which].append(run)
                    print(f"round {r + 1} {which}: {rows[which][-1]['wall_s']:.1f} s", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT)
    ratios = [b["wall_s"] / t["wall_s"] for b, t in zip(rows["base"], rows["this"])]
    host = [b["host_training"] / t["host_training"] for b, t in zip(rows["base"], rows["this"])]
    diff = first_difference(rows["base"][0].pop("events"), rows["this"][0].pop("events"))
    for run in (*rows["base"], *rows["this"]):
        run.pop("events", None)
    result = {
        "machine": machine_info(__import__("torch").device("cpu")),
        "base": rev,
        "preset": args.preset or "default",
        "same_events": diff is None,
        "first_difference": diff,
        "envs": args.envs,
        "rounds": rows,
        "ratio_wall_median": statistics.median(ratios),
        "ratio_host_training_median": statistics.median(host),
    }
    text = _markdown(result, args)
    print(text)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        stem = f"{result['machine']['date_utc'][:10]}-{result['machine']['host']}-revisions"
        stem += f"-{args.preset}" if args.preset else ""
        stem += f"-{args.envs}envs" + (f"-{args.tag}" if args.tag else "")
        (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))
        (RESULTS / f"{stem}.md").write_text(text)
    return 0


def _markdown(result: dict, args) -> str:
    m = result["machine"]
    lines = [
        f"# One update of the default: this checkout ({m['git']}) against {result['base']}",
        "",
        f"{m['date_utc']} UTC, {m['host']} ({m['cpu']}, {m['cpu_count']} cores), torch {m['torch']}; "
        f"{result['envs']} envs, {args.rounds} interleaved rounds, each run a fresh process "
        "(`python -m esper.shell.run --updates 1 --eval_episodes 0`).",
        "",
        "| round | base wall s | this wall s | ratio | base host training s | this host training s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for i, (b, t) in enumerate(zip(result["rounds"]["base"], result["rounds"]["this"]), 1):
        lines.append(f"| {i} | {b['wall_s']:.1f} | {t['wall_s']:.1f} | {b['wall_s'] / t['wall_s']:.2f}x | "
                     f"{b['host_training']:.1f} | {t['host_training']:.1f} |")  # fmt: skip
    lines += [
        "",
        f"Median of per-round ratios: **{result['ratio_wall_median']:.2f}x** on the process's wall time, "
        f"{result['ratio_host_training_median']:.2f}x on host training.",
        "",
        f"Events at the fixed seed (preset `{result['preset']}`, times left out): "
        + (
            "**the same** at both revisions."
            if result["same_events"]
            else f"**differ**: {result['first_difference']}."
        ),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
