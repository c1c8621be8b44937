"""Episodes per second of ``python -m esper.shell.run`` by device, host step and env count (issue 44):
the batched host step on a GPU against one CUDA stream per env (the original's design, ``env.host_step
per_env``) and against the CPU, at 8, 32 and 128 envs.

    python -m bench.throughput                                   # the cells below, default preset, 2 updates
    python -m bench.throughput --envs 8 32 128 --paths cuda:batched cuda:per_env cpu:batched:2
    python -m bench.throughput --envs 2 --paths cpu:batched cpu:per_env --no-write -- --preset smoke

A path is ``DEVICE:HOST_STEP[:WORKERS]`` (workers: env threads, the CPU's batches; default 1). Each
cell runs the same config (``--`` passes CLI options; the default preset unless changed) in a fresh
run directory and process, with one torch thread; its throughput is ``n_envs * updates / seconds``
over the updates after the first (warm-up: allocations, caches, cuDNN's choices), the seconds being
the run's own per-update wall time (rollout and PPO update) as it records them in its checkpoint.
``--rounds`` rounds run every cell once each, interleaved; a ratio is the median of per-round ratios.

Cells run in the order of ``--paths`` then ``--envs`` within a round, each under ``--cell-timeout``
seconds and all under ``--deadline``; a cell that fails or times out is written down as such, and the
larger env counts of that path are skipped in that round (they would take longer). The results file
is written after every cell, so a run stopped by a time limit keeps what it measured. Writes
``bench/results/gpu/<date>-<host>-throughput.{md,json}`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.scaling import QUIET, child_env, measured_throughput

ROOT = Path(__file__).resolve().parents[1]
HOST_STEPS = ("batched", "per_env")


def parse_path(text: str) -> dict:
    """``DEVICE:HOST_STEP[:WORKERS]`` as a dict, or a one-line ``ValueError``."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or parts[1] not in HOST_STEPS or not parts[0]:
        raise ValueError(f"path {text!r}: expected DEVICE:HOST_STEP[:WORKERS], HOST_STEP one of {HOST_STEPS}")
    workers = 1
    if len(parts) == 3:
        if not parts[2].isdigit() or int(parts[2]) < 1:
            raise ValueError(f"path {text!r}: WORKERS must be an integer >= 1")
        workers = int(parts[2])
    return {"key": text, "device": parts[0], "host_step": parts[1], "workers": workers}


def cell_args(path: dict, n_envs: int, updates: int, extra: list[str], root: Path, name: str) -> list[str]:
    """The CLI arguments of one cell (the user's ``extra`` first, the cell's own settings after)."""
    return [
        "-m",
        "esper.shell.run",
        *QUIET,
        *extra,
        "--updates",
        str(updates),
        "--threads",
        "1",
        "--env.n_envs",
        str(n_envs),
        "--env.device",
        path["device"],
        "--env.host_step",
        path["host_step"],
        "--env.workers",
        str(path["workers"]),
        "--run_dir",
        str(root),
        "--name",
        name,
    ]


def run_cell(
    path: dict, n_envs: int, updates: int, extra: list[str], root: Path, name: str, timeout: float
) -> dict:
    """One cell in its own process: its throughput, or ``{"error": ...}``."""
    cmd = [sys.executable, *cell_args(path, n_envs, updates, extra, root, name)]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=child_env(1), capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "wall_s": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        print(done.stderr[-3000:], file=sys.stderr)
        return {"error": f"exit {done.returncode}: {lines[-1] if lines else ''}"[:300], "wall_s": wall}
    return {**measured_throughput(root / name), "wall_s": wall}


def summarize(paths: list[dict], envs: list[int], measured: dict) -> list[dict]:
    """One row per (path, envs): the median episodes per second over its rounds, and the median of
    per-round ratios to every other path at the same envs (rounds where both ran)."""
    rows = []
    for p in paths:
        for n in envs:
            runs = measured[(p["key"], n)]
            ok = [r for r in runs if "error" not in r]
            row = {
                "path": p["key"],
                "device": p["device"],
                "host_step": p["host_step"],
                "workers": p["workers"],
                "n_envs": n,
                "rounds": len(runs),
                "ok": len(ok),
                "errors": sorted({r["error"] for r in runs if "error" in r}),
            }
            if ok:
                row["episodes_per_s"] = statistics.median(r["episodes_per_s"] for r in ok)
                row["seconds_per_update"] = statistics.median(r["seconds_per_update"] for r in ok)
                row["all_episodes_per_s"] = [r.get("episodes_per_s") for r in runs]
                for q in paths:
                    if q is p:
                        continue
                    pairs = [
                        (a["episodes_per_s"], b["episodes_per_s"])
                        for a, b in zip(runs, measured[(q["key"], n)])
                        if "error" not in a and "error" not in b
                    ]
                    if pairs:
                        row[f"vs {q['key']}"] = statistics.median(a / b for a, b in pairs)
            rows.append(row)
    return rows


def markdown(rows: list[dict], paths: list[dict], info: dict, args: argparse.Namespace) -> str:
    keys = [p["key"] for p in paths]
    head = [
        "| path | envs | rounds ok | s per update | episodes/s (median) | "
        + " | ".join(f"x vs {k}" for k in keys)
        + " |",
        "|---|---:|---:|---:|---:|" + "---:|" * len(keys),
    ]
    for r in rows:
        if not r["ok"]:
            why = "; ".join(r["errors"]) or "not run"
            head.append(f"| {r['path']} | {r['n_envs']} | 0/{r['rounds']} | {why} | |" + " |" * len(keys))
            continue
        ratios = " | ".join(
            "" if k == r["path"] else (f"{r[f'vs {k}']:.2f}x" if f"vs {k}" in r else "") for k in keys
        )
        head.append(
            f"| {r['path']} | {r['n_envs']} | {r['ok']}/{r['rounds']} | {r['seconds_per_update']:.2f} | "
            f"{r['episodes_per_s']:.3f} | {ratios} |"
        )
    gpu = f", {info['device_name']}" if info.get("device_name", "cpu") != "cpu" else ""
    text = (
        f"`{info['command']}` on {info['cpu']} ({info['cpu_count']} cores){gpu}, torch {info['torch']}, "
        f"git {info['git']}; {args.updates} updates a run (the first is warm-up), {args.rounds} interleaved "
        f"round(s); one torch thread a process; a ratio is the median of per-round ratios of the row's "
        f"episodes per second to the column's."
    )
    return "\n".join(
        [f"# Episodes per second by device and host step, {info['date_utc']}", "", text, "", *head, ""]
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", type=int, nargs="+", default=[8, 32, 128], help="env counts")
    p.add_argument(
        "--paths",
        nargs="+",
        default=["cuda:batched", "cuda:per_env", "cpu:batched:2"],
        help="DEVICE:HOST_STEP[:WORKERS] each",
    )
    p.add_argument("--updates", type=int, default=2, help="PPO updates per run (the first is warm-up)")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds (every cell once per round)")
    p.add_argument("--cell-timeout", type=float, default=600.0, help="seconds a cell may run")
    p.add_argument(
        "--deadline",
        type=float,
        default=0.0,
        help="seconds after which no cell starts and a running one is stopped (0: none)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gpu")
    p.add_argument("--tag", default="", help="appended to the results file's name")
    p.add_argument("--no-write", action="store_true", help="print only")
    args = p.parse_args(own)
    try:
        paths = [parse_path(t) for t in args.paths]
    except ValueError as e:
        p.error(str(e))
    if args.updates < 1 or args.rounds < 1 or any(n < 1 for n in args.envs):
        p.error("--updates, --rounds and --envs must be >= 1")
    from bench.harness import machine_info

    cuda = any(q["device"].startswith("cuda") for q in paths) and torch.cuda.is_available()
    info = machine_info(torch.device("cuda" if cuda else "cpu"))
    info["command"] = "python -m bench.throughput " + " ".join(argv)
    stem = f"{dt.date.today().isoformat()}-{info['host']}-throughput" + (f"-{args.tag}" if args.tag else "")
    envs = sorted(args.envs)
    measured: dict = {(q["key"], n): [] for q in paths for n in envs}

    def write() -> str:
        rows = summarize(paths, envs, measured)
        md = markdown(rows, paths, info, args)
        if not args.no_write:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{stem}.md").write_text(md)
            raw = {f"{k}@{n}": v for (k, n), v in measured.items()}
            body = {
                "machine": info,
                "config": extra,
                "updates": args.updates,
                "rounds": args.rounds,
                "rows": rows,
                "runs": raw,
            }
            (args.out / f"{stem}.json").write_text(json.dumps(body, indent=1) + "\n")
        return md

    root = Path(tempfile.mkdtemp(prefix="esper-throughput-"))
    start = time.perf_counter()
    try:
        for i in range(args.rounds):
            for q in paths:
                skip = False
                for n in envs:
                    spent = time.perf_counter() - start
                    left = args.deadline - spent if args.deadline else args.cell_timeout
                    if skip or left < 1:
                        why = "skipped (a smaller count failed)" if skip else "not run (deadline)"
                        measured[(q["key"], n)].append({"error": why})
                        continue
                    one = run_cell(
                        q,
                        n,
                        args.updates,
                        extra,
                        root,
                        f"r{i}-{q['key'].replace(':', '-')}-{n}",
                        min(args.cell_timeout, left),
                    )
                    measured[(q["key"], n)].append(one)
                    skip = "error" in one
                    shown = one.get("error") or f"{one['episodes_per_s']:.3f} episodes/s"
                    wall = one.get("wall_s", 0)
                    print(f"round {i} {q['key']} {n} envs: {shown} ({wall:.0f} s)", flush=True)
                    write()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(write())
    if not args.no_write:
        print(f"wrote {args.out / stem}.md (+ .json)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
