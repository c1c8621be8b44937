"""Run Esper's benchmarks, print a table, write the results file.

    python -m bench.run                      # every suite (gae, loss, compile, update, episode): ~10 minutes
    python -m bench.run --suite gae,loss     # some suites
    python -m bench.run --quick              # smaller cases and fewer samples: a few minutes
    python -m bench.run --list               # the registered suites

Options: ``--device cuda`` (default: cuda when available, else cpu; the ``update`` and ``episode`` suites
always run the embedded default, on CPU), ``--threads N`` (torch intra-op threads; default: torch's),
``--episodes N`` (measured episodes of the ``episode`` suite), ``--out DIR`` (default ``bench/results/perf``,
``bench/results/gpu`` with a CUDA device), ``--tag NAME``, ``--no-write``.

Writes ``<out>/<YYYY-MM-DD>-<host>-<device>[-quick][-t<threads>][-<tag>].md`` (tables, targets,
machine) and a ``.json`` beside it with the raw numbers. Every time is the median (and p10/p90) of
interleaved samples taken after warm-up; every ratio compares timings from the same run. Add a suite
in ``bench/perf/`` (see :mod:`bench.harness`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from bench import perf  # noqa: F401  (registers the suites)
from bench.harness import SUITES, Context, console, machine_info, markdown, write

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="", help="comma-separated suite names (default: all)")
    parser.add_argument("--quick", action="store_true", help="small cases, few samples (< 1 minute)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave as is)")
    parser.add_argument(
        "--out", type=Path, default=None, help="results folder (default: bench/results/perf, or gpu on CUDA)"
    )
    parser.add_argument(
        "--episodes", type=int, default=0, help="measured episodes of the episode suite (0: 5, --quick: 2)"
    )
    parser.add_argument("--tag", default="", help="appended to the results file name (e.g. a re-run)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--list", action="store_true", help="list the suites and exit")
    args = parser.parse_args(argv)

    ordered = sorted(SUITES.values(), key=lambda s: s.order)
    if args.list:
        for s in ordered:
            print(f"{s.name:<10} {s.help}")
        return 0
    names = [n.strip() for n in args.suite.split(",") if n.strip()] or [s.name for s in ordered]
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {unknown}; registered: {[s.name for s in ordered]}")
    if args.threads:
        torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    out = args.out or RESULTS / ("gpu" if device.type == "cuda" else "perf")
    if args.episodes < 0:
        parser.error("--episodes must be >= 0")
    ctx = Context(device=device, quick=args.quick, episodes=args.episodes)
    if args.quick:
        ctx.samples, ctx.min_sample_s, ctx.budget_s, ctx.warmup = 9, 0.002, 0.4, 2
    info = machine_info(device)
    info["load_average_start"] = _load()
    start = time.perf_counter()
    results = {}
    for name in names:
        t0 = time.perf_counter()
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        results[name] = SUITES[name].fn(ctx)
        print(f"[bench] {name} done in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    wall = time.perf_counter() - start
    info["load_average_end"] = _load()
    command = "python -m bench.run " + " ".join(argv if argv is not None else sys.argv[1:])
    print(console(results))
    if not args.no_write:
        tag = "-".join(
            t
            for t in ("quick" if args.quick else "", f"t{args.threads}" if args.threads else "", args.tag)
            if t
        )
        path = write(out, info, results, markdown(info, results, command.strip(), wall), tag)
        print(f"\nwrote {path} (+ .json)")
    return 0


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
