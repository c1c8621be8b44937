"""Scale-out throughput: episodes per second of ``python -m esper.shell.run`` on 1 process and on N
processes under ``torchrun`` (gloo on the CPU), the same global envs and the same cores in total.

    python -m bench.scaling                          # 1 vs 2 processes, default preset, 3 updates, 3 rounds
    python -m bench.scaling --updates 2 --ranks 1 2 4 --cores 4
    python -m bench.scaling --updates 1 --no-write -- --preset smoke --env.n_envs 4   # a quick check

Each layout runs the same config (``--`` passes CLI options; the default preset's 8 envs unless
changed) in a fresh run directory; the ``--cores`` are shared out: one process runs twice, once with
``cores`` env threads (esper's in-process parallelism) and once with one env thread and ``cores`` torch
intra-op threads; N processes get ``cores / N`` env threads each (one intra-op thread each).
Throughput is ``n_envs * updates / seconds``, the seconds being the run's own per-update wall time
(rollout and PPO update; start-up, the first update (warm-up, where there are several) and the
final report excluded), as rank 0 records it in the checkpoint. ``--repeats`` rounds run every layout
once each, interleaved; a speed-up is the median of the per-round ratios. The issue's target: at
least 1.5x with 2 processes, here checked against the *better* of the two one-process layouts.
Writes ``bench/results/perf/<date>-<host>-scaling.{md,json}``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TARGET = 1.5
QUIET = ["--eval_episodes", "0", "--report", "false", "--progress", "false"]


def run_once(ranks: int, workers: int, threads: int, updates: int, extra: list[str], root: Path,
             name: str) -> dict:  # fmt: skip
    """One run on ``ranks`` processes, each with ``workers`` env threads and ``threads`` intra-op threads;
    its measured throughput."""
    args = ["-m", "esper.shell.run", *QUIET, *extra, "--updates", str(updates), "--threads", str(threads),
            "--env.workers", str(workers), "--run_dir", str(root), "--name", name]  # fmt: skip
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] if ranks > 1 else []
    cmd = [sys.executable, *launch, *args]
    done = subprocess.run(cmd, cwd=ROOT, env=child_env(threads), capture_output=True, text=True)
    if done.returncode != 0:
        errors = [ln for ln in done.stderr.splitlines() if "error:" in ln] or done.stderr.splitlines()
        print(done.stderr[-4000:], file=sys.stderr)
        raise RuntimeError(f"{ranks} process(es) failed: {' | '.join(errors[-3:])}")
    return {"ranks": ranks, "env_workers_per_rank": workers, "threads_per_rank": threads,
            **measured_throughput(root / name)}  # fmt: skip


def child_env(threads: int) -> dict[str, str]:
    """The environment of a measured run's process: ``threads`` OpenMP threads, this checkout first on
    the path (a site carried onto a lent machine kept after it)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": path}


def measured_throughput(run_dir: Path) -> dict:
    """A finished run's measured throughput, from its checkpoint's per-update rows (the first dropped
    as warm-up where there are several: allocations, caches)."""
    from esper.shell.common.checkpoint import load_checkpoint

    ckpt = load_checkpoint(run_dir / "checkpoint.pt")
    rows = ckpt["progress"]["rows"]
    timed = rows[1:] if len(rows) > 1 else rows
    n_envs = ckpt["config"]["env"]["n_envs"]
    seconds = sum(r["seconds"] for r in timed)
    return {"n_envs": n_envs, "updates_timed": len(timed), "seconds": seconds,
            "seconds_per_update": seconds / len(timed),
            "episodes_per_s": n_envs * len(timed) / seconds}  # fmt: skip


def layouts(ranks: list[int], cores: int) -> list[dict]:
    """What runs: for one process, both ways of giving it the cores (esper's env threads, or torch's
    intra-op threads); for N processes, ``cores / N`` env threads each, one intra-op thread."""
    out = []
    for r in ranks:
        per = max(1, cores // r)
        if r == 1 and cores > 1:
            out.append({"key": "1-env", "ranks": 1, "workers": cores, "threads": 1,
                        "label": f"1 process, {cores} env threads"})  # fmt: skip
            out.append({"key": "1-intra", "ranks": 1, "workers": 1, "threads": cores,
                        "label": f"1 process, 1 env thread, {cores} intra-op threads"})  # fmt: skip
        else:
            procs, threads = f"process{'es' if r > 1 else ''}", f"env thread{'s' if per > 1 else ''}"
            out.append({"key": f"{r}", "ranks": r, "workers": per, "threads": 1,
                        "label": f"{r} {procs}, {per} {threads} each"})  # fmt: skip
    return out


def markdown(results: dict, info: dict) -> str:
    rows = ["| layout | envs | updates timed | episodes/s (median) | each round "
            "| speed-up vs best 1-process (median of rounds) |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for r in results["per_layout"]:
        rounds = ", ".join(f"{x:.3f}" for x in r["all_episodes_per_s"])
        rows.append(f"| {r['label']} | {r['n_envs']} | {r['updates_timed']} | {r['episodes_per_s']:.3f} | "
                    f"{rounds} | {r['speedup_vs_best_single']:.2f}x |")  # fmt: skip
    verdict = results.get("verdict", "")
    head = (f"`{info['command']}` on {info['cpu']} ({info['cpu_count']} cores), torch {info['torch']}, "
            f"git {info['git']}; {results['cores']} cores shared out over the processes; "
            f"{results['repeats']} interleaved rounds (every layout once per round).")  # fmt: skip
    return "\n".join([f"# Scale-out throughput, {info['date_utc']}", "", head, "", *rows, "", verdict, ""])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--updates", type=int, default=3, help="PPO updates per run (the first is warm-up)")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="world sizes (1 must be among them)")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="cores shared out (default: all)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (every layout once per round)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "perf")
    p.add_argument("--no-write", action="store_true", help="print only")
    args = p.parse_args(own)
    if 1 not in args.ranks:
        p.error("--ranks must include 1 (the base)")
    from bench.harness import machine_info

    plan = layouts(args.ranks, args.cores)
    root = Path(tempfile.mkdtemp(prefix="esper-scaling-"))
    measured: dict[str, list[dict]] = {lay["key"]: [] for lay in plan}
    try:
        for i in range(args.repeats):
            for lay in plan:
                one = run_once(lay["ranks"], lay["workers"], lay["threads"], args.updates, extra, root,
                               f"{lay['key']}-{i}")  # fmt: skip
                measured[lay["key"]].append(one)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    single = [lay["key"] for lay in plan if lay["ranks"] == 1]
    best_single = [max(measured[k][i]["episodes_per_s"] for k in single) for i in range(args.repeats)]
    per_layout = []
    for lay in plan:
        runs = measured[lay["key"]]
        row = {**runs[0], "label": lay["label"], "key": lay["key"]}
        row["episodes_per_s"] = statistics.median(x["episodes_per_s"] for x in runs)
        row["all_episodes_per_s"] = [x["episodes_per_s"] for x in runs]
        row["seconds"] = [x["seconds"] for x in runs]
        ratios = [x["episodes_per_s"] / b for x, b in zip(runs, best_single)]
        row["speedup_vs_best_single"] = statistics.median(ratios)
        row["speedup_per_round"] = ratios
        for k in single:
            row[f"speedup_vs_{k}"] = statistics.median(
                x["episodes_per_s"] / y["episodes_per_s"] for x, y in zip(runs, measured[k])
            )
        per_layout.append(row)
    results = {"cores": args.cores, "config": extra, "updates": args.updates, "repeats": args.repeats,
               "per_layout": per_layout}  # fmt: skip
    two = next((x for x in per_layout if x["ranks"] == 2), None)
    if two is not None:
        speedup = two["speedup_vs_best_single"]
        results["speedup_2"] = speedup
        met = "met" if speedup >= TARGET else "NOT met"
        others = "; ".join(f"{two['speedup_vs_' + k]:.2f}x vs '{lay['label']}'" for k in single
                           for lay in plan if lay["key"] == k)  # fmt: skip
        results["verdict"] = (f"**2 processes: {speedup:.2f}x the best one-process layout's episodes per "
                              f"second (median of per-round ratios; target >= {TARGET}x: {met}).** "
                              f"Per layout: {others}.")  # fmt: skip
    info = machine_info(torch.device("cpu"))
    info["command"] = "python -m bench.scaling " + " ".join(argv)
    md = markdown(results, info)
    print(md)
    if not args.no_write:
        stem = f"{dt.date.today().isoformat()}-{info['host']}-scaling"
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{stem}.md").write_text(md)
        (args.out / f"{stem}.json").write_text(json.dumps({"machine": info, **results}, indent=1) + "\n")
        print(f"wrote {args.out / stem}.md (+ .json)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
