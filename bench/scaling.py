"""Scale-out throughput: episodes per second of ``python -m esper.shell.run`` on 1 process and on N
processes under ``torchrun`` (gloo on the CPU), the same global envs and the same cores in total.

    python -m bench.scaling                          # 1 vs 2 processes, the default preset, 3 updates
    python -m bench.scaling --updates 2 --ranks 1 2 4 --cores 4
    python -m bench.scaling --updates 1 --no-write -- --preset smoke --env.n_envs 4   # a quick check

Each world size runs the same config (``--`` passes CLI options; the default preset's 8 envs unless
changed) in a fresh run directory; the ``--cores`` are shared out: one process gets
``--env.workers cores`` env threads, N processes each ``cores / N`` (one intra-op thread each).
Throughput is ``n_envs * updates / seconds``, the seconds being the run's own per-update wall time
(rollout and PPO update; start-up, the first update (warm-up, where there are several) and the
final report excluded), as rank 0 records it in the checkpoint. ``--repeats`` alternates the world
sizes that many times and keeps each one's median. The issue's target: at least 1.5x with 2
processes. Writes ``bench/results/<date>-<host>-scaling.{md,json}``.
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


def run_once(ranks: int, cores: int, updates: int, extra: list[str], root: Path, name: str) -> dict:
    """One run on ``ranks`` processes; its measured throughput."""
    per = max(1, cores // ranks)
    args = ["-m", "esper.shell.run", *QUIET, *extra, "--updates", str(updates), "--threads", "1",
            "--env.workers", str(per), "--run_dir", str(root), "--name", name]  # fmt: skip
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] if ranks > 1 else []
    cmd = [sys.executable, *launch, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        errors = [ln for ln in done.stderr.splitlines() if "error:" in ln] or done.stderr.splitlines()
        print(done.stderr[-4000:], file=sys.stderr)
        raise RuntimeError(f"{ranks} process(es) failed: {' | '.join(errors[-3:])}")
    from esper.shell.checkpoint import load_checkpoint

    ckpt = load_checkpoint(root / name / "checkpoint.pt")
    rows = ckpt["progress"]["rows"]
    timed = rows[1:] if len(rows) > 1 else rows  # the first update warms up (allocations, caches)
    n_envs = ckpt["config"]["env"]["n_envs"]
    seconds = sum(r["seconds"] for r in timed)
    return {"ranks": ranks, "env_workers_per_rank": per, "n_envs": n_envs, "updates_timed": len(timed),
            "seconds": seconds, "episodes_per_s": n_envs * len(timed) / seconds}  # fmt: skip


def markdown(results: dict, info: dict) -> str:
    base = results["per_ranks"][0]
    rows = ["| processes | env threads each | envs | updates timed | episodes/s | speed-up |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for r in results["per_ranks"]:
        up = r["episodes_per_s"] / base["episodes_per_s"]
        rows.append(f"| {r['ranks']} | {r['env_workers_per_rank']} | {r['n_envs']} | {r['updates_timed']} | "
                    f"{r['episodes_per_s']:.3f} | {up:.2f}x |")  # fmt: skip
    verdict = results.get("verdict", "")
    head = (f"`{info['command']}` on {info['cpu']} ({info['cpu_count']} cores), torch {info['torch']}, "
            f"git {info['git']}; {results['cores']} cores shared out over the processes.")  # fmt: skip
    return "\n".join([f"# Scale-out throughput, {info['date_utc']}", "", head, "", *rows, "", verdict, ""])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--updates", type=int, default=3, help="PPO updates per run (the first is warm-up)")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="world sizes (the first: the base)")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="cores shared out (default: all)")
    p.add_argument("--repeats", type=int, default=1, help="runs per world size, alternated (median kept)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--no-write", action="store_true", help="print only")
    args = p.parse_args(own)
    from bench.harness import machine_info

    root = Path(tempfile.mkdtemp(prefix="esper-scaling-"))
    measured: dict[int, list[dict]] = {r: [] for r in args.ranks}
    try:
        for i in range(args.repeats):
            for r in args.ranks:
                measured[r].append(run_once(r, args.cores, args.updates, extra, root, f"r{r}-{i}"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    per_ranks = []
    for r in args.ranks:
        runs = measured[r]
        best = dict(runs[0])
        best["episodes_per_s"] = statistics.median(x["episodes_per_s"] for x in runs)
        best["all_episodes_per_s"] = [x["episodes_per_s"] for x in runs]
        per_ranks.append(best)
    results = {"cores": args.cores, "config": extra, "updates": args.updates, "per_ranks": per_ranks}
    two = next((x for x in per_ranks if x["ranks"] == 2), None)
    if two is not None and per_ranks[0]["ranks"] == 1:
        speedup = two["episodes_per_s"] / per_ranks[0]["episodes_per_s"]
        results["speedup_2"] = speedup
        met = "met" if speedup >= TARGET else "NOT met"
        results["verdict"] = (f"**2 processes: {speedup:.2f}x one process's episodes per second "
                              f"(target >= {TARGET}x: {met}).**")  # fmt: skip
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
