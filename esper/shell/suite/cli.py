"""``python -m esper.shell.suite``: the command line and where the results files go."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

import esper.shell.suite
from esper.shell.common.revision import machine_info
from esper.shell.eval.suite import finetune
from esper.shell.eval.suite.report import beside_verdicts, goals, markdown, plots, suite_verdict
from esper.shell.eval.suite.status import status, status_lines
from esper.shell.eval.suite.tasks import EVAL_EPISODES, SUITE
from esper.shell.eval.suite.verdict import PROTOCOL, TRAINING_SEEDS, judge, trying_view
from esper.shell.suite.engine import Engine
from esper.shell.suite.runs import run_finetune, run_suite, run_transfer

#: The command, as the results files record it.
PROG = "python -m esper.shell.suite"


def _parser() -> argparse.ArgumentParser:
    doc = esper.shell.suite.__doc__.split("\n\n")[0]
    p = argparse.ArgumentParser(prog=PROG, description=doc)
    p.add_argument("--tasks", default=",".join(SUITE), help=f"comma-separated subset of {','.join(SUITE)}")
    p.add_argument("--seeds", type=int, default=5, help="training seeds per task (default 5)")
    p.add_argument("--first-seed", type=int, default=0, help="the first training seed (0)")
    p.add_argument("--episodes", type=int, default=EVAL_EPISODES,
                   help=f"fresh hosts per training seed and controller ({EVAL_EPISODES})")  # fmt: skip
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="the stages (each (task, seed)'s training, searches and evaluation) run on a "
                        "local Dask cluster of this many one-thread workers, bound to 127.0.0.1 "
                        f"(default: the CPU count, {os.cpu_count()}); 0: one after another in this "
                        "process, for debugging")  # fmt: skip
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run the stages on an existing Dask cluster instead: tcp://HOST:PORT, or the "
                        "scheduler file `dask scheduler --scheduler-file` wrote (its workers started "
                        "with --nthreads 1; --runs on storage they share, at the same path: "
                        "docs/suite.md)")  # fmt: skip
    p.add_argument("--runs", type=Path, default=Path("runs") / "suite",
                   help="where the run directories go (every stage's work is kept there and read back, "
                        "not run again; on a cluster, a path every worker reads and writes; default "
                        "runs/suite)")  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("bench") / "results" / "suite",
                   help="where the results files go (default bench/results/suite)")  # fmt: skip
    p.add_argument("--train-args", default="", metavar="FLAGS",
                   help="flags added to every training run after the task's preset (python -m "
                        "esper.shell.run's), e.g. a tiny configuration to try a cluster on: \"--updates 1 "
                        "--env.n_envs 2\"; a run directory trained with other flags is not trained again, "
                        "so give such a run its own --runs")  # fmt: skip
    p.add_argument("--merge", type=Path, action="append", default=[], metavar="FILE",
                   help="an earlier suite results file: its pooled tasks that this run does not pool join "
                        "the table as they are (repeatable)")  # fmt: skip
    p.add_argument("--transfer", metavar="TASK", default=None,
                   help="instead of the tasks: train the set policy on every other suite task and evaluate "
                        "it zero-shot on TASK (issue 46; results under \"transfer\")")  # fmt: skip
    p.add_argument("--finetune", metavar="TASK", default=None,
                   help="after --transfer TASK: fine-tune each seed's transferred controller on TASK, and "
                        "train the same network there from scratch; their learning curves")  # fmt: skip
    p.add_argument("--updates", type=int, default=22, help="--finetune's updates per run (22, the default's)")
    p.add_argument("--controller-from", type=Path, default=None, metavar="DIR",
                   help="train no controller: join the one kept in DIR/TASK/seedk.json.gz (python -m "
                        "esper.shell.suite.confirm keeps them) to the baselines evaluated here on the same "
                        "hosts and draw")  # fmt: skip
    p.add_argument("--beside", type=Path, default=None, metavar="DIR",
                   help="with --controller-from: another arm's kept runs, whose ppo and ppo_greedy join the "
                        "table as ppo_greedy[NAME] (they judge nothing)")  # fmt: skip
    p.add_argument("--trying", action="store_true",
                   help="also evaluate the baselines that try harder (issue 89: born_big, probe, "
                        "heuristic_tuned_wide, plan_search_timed@1x, and born_big of ppo_greedy's most grown "
                        "plan), into RUN_DIR/eval-suite-trying; without it the suite runs and renders as "
                        "before")  # fmt: skip
    p.add_argument("--protocol", type=int, choices=(1, PROTOCOL), default=PROTOCOL,
                   help=f"the rule the tables are judged by: {PROTOCOL} (default; issue 89's claims, paired "
                        f"by seed, Holm-corrected, equivalence by TOST, on {TRAINING_SEEDS} training seeds: "
                        "esper.shell.eval.suite.verdict) or 1 (issue 45's goals: to pool again a run judged "
                        "by them, as it was)")  # fmt: skip
    p.add_argument("--status", action="store_true",
                   help="print where each (task, seed) of --runs stands (training, searches, evaluations) "
                        "and exit; runs nothing")  # fmt: skip
    return p


def _done(key: str, _result: Any) -> None:
    """A line as each (task, seed) comes back (its evaluation, the last of its stages)."""
    if key.startswith(("seed ", "finetune ")):
        tqdm.write(f"{key}: done", file=sys.stderr)


def engine(args: argparse.Namespace) -> Engine:
    """Where the stages run: ``--scheduler``'s cluster, else a local one of ``--workers`` (0: here)."""
    return Engine(workers=args.workers, scheduler=args.scheduler, done=_done)


def _run(args: argparse.Namespace) -> dict[str, Any]:
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if args.transfer is not None and args.finetune is not None:
        raise ValueError("--transfer and --finetune are separate runs: transfer first, then fine-tune")
    flags = shlex.split(args.train_args)
    if flags and args.controller_from is not None:
        raise ValueError("--train-args: --controller-from trains nothing")
    where = engine(args)
    if args.finetune is not None:
        return run_finetune(args.finetune, args.seeds, args.first_seed, args.updates, args.runs, where, flags)
    sizes = (args.seeds, args.first_seed, args.episodes, args.runs, where)
    if args.transfer is not None:
        return run_transfer(args.transfer, *sizes, train_flags=flags)
    if args.beside is not None and args.controller_from is None:
        raise ValueError("--beside names an arm shown beside the one --controller-from joins: give both")
    suite = run_suite(tasks, *sizes, controller_from=args.controller_from, beside=args.beside,
                      trying=args.trying, train_flags=flags)  # fmt: skip
    return merged(suite, args.merge)


def merged(suite: dict[str, Any], files: list[Path]) -> dict[str, Any]:
    """``suite`` with each task pooled in ``files`` (earlier ``python -m esper.shell.suite`` results) that it
    does not pool itself, in :data:`SUITE`'s order, marked with the file it came from (``merged_from``)."""
    tasks = dict(suite["tasks"])
    for f in files:
        if not f.exists():
            raise ValueError(f"--merge {f}: no such file")
        for task, entry in json.loads(f.read_text()).get("tasks", {}).items():
            if task not in tasks:
                tasks[task] = {**entry, "merged_from": f.name}
    order = [t for t in SUITE if t in tasks] + [t for t in tasks if t not in SUITE]
    return {**suite, "tasks": {t: tasks[t] for t in order}}


def _write(args: argparse.Namespace, suite: dict[str, Any], info: dict[str, Any], command: str) -> Path:
    """The results files; returns the table's path."""
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{info['date']}-{info.get('host', 'host')}"
    if args.finetune is None and args.transfer is None and (view := trying_view(suite["tasks"])) is not None:
        suite["trying"] = view  # the controller beside the baselines that try (reported, judging nothing)
    if args.finetune is not None:
        stem += f"-finetune-{args.finetune}"
        curves = suite["transfer"][args.finetune]["finetune"]
        png = finetune.plot(args.out, stem, args.finetune, curves)
        when = f"{info['date']}, {info.get('host')}, revision {info.get('git')}"
        head = [f"# Fine-tuning after transfer ({when})", "", f"`{command}`", ""]
        text = "\n".join([*head, *finetune.markdown(args.finetune, curves, png)])
    elif args.transfer is None and args.protocol >= 2:  # the claims new runs are judged by (issue 89)
        suite["protocol"] = args.protocol
        suite["verdict"] = judge(suite)
        text = markdown(info, suite, command, plots(args.out, stem, suite))
    else:  # issue 45's goals (and issue 46's, for a transfer run), as the runs before protocol 2 were judged
        for t in (*suite["tasks"].values(), *suite.get("transfer", {}).values()):
            t["goals"] = goals(t["controllers"])
        if len(suite["tasks"]) > 1:
            suite["verdict"] = suite_verdict(suite["tasks"])
            if beside := beside_verdicts(suite["tasks"]):
                suite["verdict_beside"] = beside
        if args.transfer is not None:
            stem += f"-transfer-{args.transfer}"
        text = markdown(info, suite, command, plots(args.out, stem, suite))
    (args.out / f"{stem}.md").write_text(text)
    saved = {"machine": info, "command": command, **suite}
    (args.out / f"{stem}.json").write_text(json.dumps(saved, indent=1))
    return args.out / f"{stem}.md"


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.status:  # reads the run directories; runs nothing
        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
        unknown = [t for t in tasks if t not in SUITE]
        if unknown:
            p.error(f"unknown suite task(s) {unknown}; tasks: {', '.join(SUITE)}")
        print("\n".join(status_lines(status(tasks, args.seeds, args.first_seed, args.runs))))
        return 0
    command = f"{PROG} " + shlex.join(argv if argv is not None else sys.argv[1:])
    try:
        suite = _run(args)
    except ValueError as e:
        p.error(str(e))
    except RuntimeError as e:  # a stage that failed on every try, or no distributed: one line
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    info = machine_info(torch.device("cpu"))
    info["date"] = dt.date.today().isoformat()
    print(_write(args, suite, info, command.strip()).read_text())
    return 0
