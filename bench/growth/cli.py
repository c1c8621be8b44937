"""``python -m bench.growth``: the command line, which stage runs, and where the results files go."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shlex
import sys
from pathlib import Path

import torch

import bench.growth
from bench.growth.pooling import compare, pool
from bench.growth.report import _plots, compare_markdown, markdown, plans_markdown
from bench.growth.schedules import PLANS, placement, plans, sweep
from bench.growth.training import learn
from bench.harness import machine_info

BENCH = Path(__file__).resolve().parents[1]


def command_line(argv: list[str]) -> str:
    """The command a results file says it came from, quoted so that it can be pasted into a shell."""
    return "python -m bench.growth " + shlex.join(argv)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.growth", description=bench.growth.__doc__.split("\n\n")[0]
    )
    p.add_argument("--stage", choices=("all", "sweep", "placement", "learn", "plans"), default="all")
    p.add_argument("--seeds", type=int, default=5, help="training seeds (default 5)")
    p.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="the learn stage trains seeds first_seed .. first_seed + seeds - 1 (0); pool batches of seeds "
        "with --pool",
    )
    p.add_argument("--episodes", type=int, default=10, help="evaluation episodes per training seed (10)")
    p.add_argument("--sweep-episodes", type=int, default=10, help="fresh hosts per sweep controller (10)")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="training runs at a time (default 1: a run keeps both cores busy with its two env "
        "threads; two runs of one thread each took ~2x longer in total on the 2-core VM)",
    )
    p.add_argument(
        "--train-args",
        default="",
        help='flags for every training run of the learn stage, e.g. "--ppo.lr 1e-3" (default: none, '
        "the embedded default)",
    )
    p.add_argument(
        "--more-controllers",
        default="",
        help="the learn stage evaluates these too, on the same hosts (e.g. ppo_mixed); re-run a finished "
        "stage with them to add them without re-evaluating the rest",
    )
    p.add_argument("--runs", type=Path, default=BENCH / "runs" / "growth", help="where the training runs go")
    p.add_argument("--out", type=Path, default=BENCH / "results" / "growth")
    p.add_argument(
        "--pool",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="pool the learn stages of these results files (runs of one variant, e.g. on two machines) "
        "into one table; trains and evaluates nothing",
    )
    p.add_argument(
        "--compare",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="the base arm of a paired comparison (learn-stage results files of one variant, e.g. seeds "
        "0-4 and 5-9); with --against; trains and evaluates nothing",
    )
    p.add_argument("--against", type=Path, nargs="+", metavar="JSON", help="the variant arm of --compare")
    p.add_argument(
        "--plans",
        default=",".join(PLANS),
        help="the plans stage's fixed schedules, comma-separated (default: " + ",".join(PLANS) + ")",
    )
    p.add_argument(
        "--learned",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="with --stage plans: learn-stage results files of the same seeds, whose controllers are paired "
        "with each plan",
    )
    p.add_argument(
        "--tag",
        default="",
        help="appended to the results files' names (e.g. replay-blend: ...-growth-learn-replay-blend.md)",
    )
    args = p.parse_args(argv)
    if args.tag and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.tag):
        p.error(f"--tag {args.tag!r}: letters, digits, '.', '_' and '-' only (it goes into file names)")
    tag = f"-{args.tag}" if args.tag else ""
    if bool(args.compare) != bool(args.against):
        p.error("--compare and --against go together: the base arm's files and the variant arm's")
    command = command_line(argv if argv is not None else sys.argv[1:])
    info = machine_info(torch.device("cpu"))
    info["date"] = dt.date.today().isoformat()
    if args.compare:
        cmp = compare(args.compare, args.against)
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"{info['date']}-compare-growth-learn{tag}"
        (args.out / f"{stem}.md").write_text(compare_markdown(info, cmp, command.strip()))
        (args.out / f"{stem}.json").write_text(json.dumps({"machine": info, "compare": cmp}, indent=1))
        print((args.out / f"{stem}.md").read_text())
        return 0
    if args.pool:
        learned = pool(args.pool)
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"{info['date']}-pooled-growth-learn{tag}"
        plots = _plots(args.out, stem, learned)
        (args.out / f"{stem}.md").write_text(markdown(info, None, learned, plots, command.strip()))
        (args.out / f"{stem}.json").write_text(json.dumps({"machine": info, "learn": learned}, indent=1))
        print((args.out / f"{stem}.md").read_text())
        return 0
    if args.learned and args.stage != "plans":
        p.error("--learned goes with --stage plans")
    if args.stage == "plans":
        planned = plans([n.strip() for n in args.plans.split(",") if n.strip()], args.seeds, args.episodes,
                        args.first_seed, args.learned)  # fmt: skip
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"{info['date']}-{info.get('host', 'host')}-growth-plans{tag}"
        (args.out / f"{stem}.md").write_text(plans_markdown(info, planned, command.strip()))
        (args.out / f"{stem}.json").write_text(json.dumps({"machine": info, "plans": planned}, indent=1))
        print((args.out / f"{stem}.md").read_text())
        return 0
    swept = sweep(args.sweep_episodes, seed=500) if args.stage in ("all", "sweep") else None
    placed = placement(args.sweep_episodes, seed=500) if args.stage in ("all", "placement") else None
    more = [n.strip() for n in args.more_controllers.split(",") if n.strip()]
    learned = (
        learn(args.seeds, args.episodes, args.jobs, args.runs, args.train_args, args.first_seed, more)
        if args.stage in ("all", "learn")
        else None
    )
    args.out.mkdir(parents=True, exist_ok=True)
    stem = (
        f"{info['date']}-{info.get('host', 'host')}-growth"
        + ("" if args.stage == "all" else f"-{args.stage}")
        + tag
    )
    plots = _plots(args.out, stem, learned)
    (args.out / f"{stem}.md").write_text(markdown(info, swept, learned, plots, command.strip(), placed))
    (args.out / f"{stem}.json").write_text(
        json.dumps({"machine": info, "sweep": swept, "placement": placed, "learn": learned}, indent=1)
    )
    print((args.out / f"{stem}.md").read_text())
    return 0
