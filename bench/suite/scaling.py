"""``python -m bench.suite.scaling``: the wall time of one task's ten training seeds on a local Dask cluster
of 1, 2, ... one-CPU workers (issue 105), each count in a fresh runs folder, on the configuration the
flags give (default: the cluster test's tiny one, ``tests/shell/suite/test_cluster.py``).

    python -m bench.suite.scaling --workers 1,2 --seeds 10

Writes ``bench/results/perf/<date>-<machine>-suite-cluster-scaling.{json,md,png}`` (``--out``): per worker
count the wall seconds of ``python -m esper.shell.suite --workers N`` and the speed-up over the first
count, with the machine, revision and the load average before and after each run (the VM is shared: a
load above its cores means other jobs took part of them). A count above the machine's cores is not run:
``--project 8`` adds a projection (see :func:`projection`), marked as one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from esper.shell.common.revision import git_revision, machine_info

#: The cluster test's configuration: one updates' worth of tiny hosts, every stage real.
TINY = ("--env.n_envs 2 --lifecycle.max_epochs 6 --updates 2 --env.train_batches 4 --env.val_batches 1 "
        "--eval_episodes 0 --report false")  # fmt: skip


def run_once(workers: int, seeds: int, task: str, train_args: str, root: Path) -> dict:
    """One suite run on ``workers`` workers in a fresh folder: its wall seconds and the load around it."""
    cmd = [sys.executable, "-m", "esper.shell.suite", "--tasks", task, "--seeds", str(seeds),
           "--episodes", "2", "--workers", str(workers), "--train-args", train_args,
           "--runs", str(root / f"runs-{workers}"), "--out", str(root / f"out-{workers}")]  # fmt: skip
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{shlex.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return {"workers": workers, "seconds": seconds, "load_before": load0, "load_after": os.getloadavg()}


def projection(rows: list[dict], workers: int, seeds: int) -> dict:
    """The wall time at ``workers``, projected from the measured runs: the 1-worker time over
    ``min(workers, seeds)`` (seeds are independent; a seed's own stages wait on each other, so more workers
    than seeds would not all be busy), divided by the 2-worker run's measured efficiency (its speed-up over
    1, divided by 2), which carries the cluster's overhead and the wait for each seed's slowest stage. It
    assumes that efficiency holds at ``workers`` cores with nothing else running."""
    one = next(r["seconds"] for r in rows if r["workers"] == 1)
    two = next((r["seconds"] for r in rows if r["workers"] == 2), None)
    efficiency = (one / two) / 2 if two else 1.0
    return {"workers": workers, "seconds": one / min(workers, seeds) / efficiency, "projected": True,
            "efficiency_from_2": efficiency}  # fmt: skip


def render(saved: dict, stem: Path) -> None:
    """The table (``stem.md``) and the figure (``stem.png``) of a saved measurement."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = saved["rows"]
    one = next(r["seconds"] for r in rows if r["workers"] == 1)
    m = saved["machine"]
    title = f"{saved['seeds']} seeds of `{saved['task']}` ({saved['date']})"
    lines = [f"# The suite on a local Dask cluster: {title}", "",
             f"Machine: {m.get('host', '?').upper()}, {m.get('cpu')}, {m.get('cpu_count')} cores; "
             f"revision `{saved['revision']}`; "
             f"`--train-args \"{saved['train_args']}\"`, `--episodes 2`.", "",
             "| workers | wall s | speed-up over 1 | load average before / after (1 min) |",
             "|---:|---:|---:|---|"]  # fmt: skip
    for r in rows:
        load = "projected" if r.get("projected") else f"{r['load_before'][0]:.1f} / {r['load_after'][0]:.1f}"
        lines.append(f"| {r['workers']} | {r['seconds']:.0f} | {one / r['seconds']:.2f} | {load} |")
    notes = [saved[k] for k in ("revision_note", "load_note") if k in saved]
    lines += ["", *(f"- {n[0].upper()}{n[1:]}." for n in notes)]
    if any(r.get("projected") for r in rows):
        lines.append("- The projected row is not measured (no machine of that many cores): "
                     + " ".join(projection.__doc__.split()))  # fmt: skip
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(4, 3))
    measured = [r for r in rows if not r.get("projected")]
    ax.plot([r["workers"] for r in measured], [r["seconds"] for r in measured], "o-", label="measured")
    for r in rows:
        if r.get("projected"):
            ax.plot([r["workers"]], [r["seconds"]], "s", mfc="none", label=f"projected ({r['workers']})")
    ax.set_xlabel("workers (one CPU each)")
    ax.set_ylabel("wall seconds")
    ax.set_title(f"{saved['seeds']} seeds of {saved['task']}, tiny", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.suite.scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts (1,2)")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--task", default="mnist1d")
    p.add_argument("--train-args", default=TINY)
    p.add_argument("--project", type=int, default=8, help="a worker count to project (0: none)")
    p.add_argument("--out", type=Path, default=Path("bench") / "results" / "perf")
    p.add_argument("--render", type=Path, default=None, metavar="JSON",
                   help="only write the table and figure of a saved measurement, beside it")  # fmt: skip
    args = p.parse_args(argv)
    if args.render is not None:
        render(json.loads(args.render.read_text()), args.render.with_suffix(""))
        return 0
    counts = [int(w) for w in args.workers.split(",")]
    info = machine_info(torch.device("cpu"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="suite-scaling-") as tmp:
        for w in counts:
            rows.append(run_once(w, args.seeds, args.task, args.train_args, Path(tmp)))
            print(f"{w} workers: {rows[-1]['seconds']:.1f} s", flush=True)
    if args.project and 1 in counts:
        rows.append(projection(rows, args.project, args.seeds))
    date = dt.date.today().isoformat()
    stem = f"{date}-{info.get('host', 'host')}-suite-cluster-scaling"
    saved = {"date": date, "revision": git_revision(), "machine": info, "task": args.task,
             "seeds": args.seeds, "train_args": args.train_args, "rows": rows}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(saved, indent=1))
    render(saved, args.out / stem)
    print(json.dumps(saved, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
