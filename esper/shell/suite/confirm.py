"""The confirmation runs of a candidate change, kept in the repository as each seed is evaluated.

    python -m esper.shell.suite.confirm default fb4 --runs RUNS/fresh \\
        --archive bench/results/suite/confirm-fb4 --rev f608ea9 \\
        --tasks mnist1d,mnist1d_deep,longrange,digits_shallow --first-seed 300 --seeds 5

trains each (task, seed) of each arm as its rule says (``python -m esper.shell.run --preset PRESET --seed k
--progress false --threads 1 [FLAG]``; seed by seed, the tasks in the given order, the arms side by side,
one process each), evaluates it on the suite's fresh hosts and draw for that seed (``--controllers
ppo,ppo_greedy``, then the diagnosis rows), and keeps the evaluation in ``ARCHIVE/ARM/TASK/seedk.json.gz``
(:mod:`esper.shell.eval.suite.archive`) with what the reading takes from the run's training events (the
late fossilization counts, the credit reading: :mod:`esper.shell.eval.suite.readings`) and the run's
settings: the run directory does not outlive its machine, and forty runs do not fit in one session. A
seed kept there is skipped; a run directory with a checkpoint is resumed. (``python -m
bench.suite.confirm`` is the same command.)

``--rev`` pins the code the rule was written at: before each training and each evaluation the working
tree's ``esper/`` must be the same as at that revision (``git diff --quiet REV -- esper``), or the arm
stops, so a change to the library made while the runs go cannot enter some of them.
``python -m esper.shell.suite --controller-from ARCHIVE/ARM`` joins the kept seeds to the suite's baselines.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from esper.shell.config.presets import preset
from esper.shell.eval.suite.archive import load_seed, save_seed, seed_path, trained
from esper.shell.eval.suite.readings import credit, fossil_counts, train_episodes
from esper.shell.eval.suite.tasks import FOSSILIZING, SUITE, final_data_seed
from esper.shell.suite import launch
from esper.shell.suite.runs import with_diagnostics
from esper.shell.telemetry.events import read_events

#: The arms, by name: the flags added to the default's training command.
ARMS: dict[str, tuple[str, ...]] = {
    "default": (),
    "fb4": ("--ppo.fossilize_bias", "4"),
    # the learned controller with no parameter cap and the reward with no budget (docs/suite.md, open for
    # the lead: the second way), for the screen on the third run's seeds (docs/experiment-log.md)
    "nocap": ("--ppo.param_cap_share", "0", "--reward.param_budget_share", "0"),
}
#: The readouts each seed is evaluated with.
CONTROLLERS = ("ppo", "ppo_greedy")
#: Where each seed's evaluation goes inside its run directory.
EVAL_DIR = "eval-fresh"
#: Evaluation episodes (fresh hosts) per seed, as the suite's.
EPISODES = 10
REPO = Path(__file__).resolve().parents[3]


def library_matches(rev: str, repo: Path = REPO) -> bool:
    """Whether ``repo``'s working tree has the same ``esper/`` as revision ``rev``."""
    proc = subprocess.run(["git", "diff", "--quiet", rev, "--", "esper"], cwd=repo, check=False,
                          capture_output=True)  # fmt: skip
    if proc.returncode > 1:
        raise RuntimeError(f"git diff against {rev} failed: {proc.stderr.decode().strip()}")
    return proc.returncode == 0


def train_args(task: str, arm: str) -> list[str]:
    """The arm's training flags for ``task`` (``launch.train`` adds the seed, run directory and progress)."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; arms: {', '.join(ARMS)}")
    return ["--preset", SUITE[task], "--threads", "1", *ARMS[arm]]


def _keep(kept_at: Path, task: str, k: int, run_dir: Path, results: dict[str, Any], train_s: float) -> Path:
    """Seed ``k``'s evaluation kept with what its reading and the suite's table take from the run directory:
    the diagnosis rows (evaluated now, while the trained policy is here), the late fossilization counts, the
    credit reading, each training episode's outcome (``train_episodes``) and the run's settings
    (``run_config``, from which the baselines can be evaluated on the same hosts once the directory is
    gone)."""
    results = with_diagnostics(results, run_dir, k, EPISODES, EVAL_DIR, final_data_seed(task, k),
                               ["--threads", "1"])  # fmt: skip
    events = run_dir / "events.jsonl"
    cfg = run_dir / "config.json"
    config = json.loads(cfg.read_text()) if cfg.is_file() else None
    results = {**results, "fossils": fossil_counts(events), "credit": credit(events), "run_config": config,
               "train_episodes": train_episodes(events)}  # fmt: skip
    return save_seed(kept_at, task, k, results, train_s)


def _check_library(rev: str | None, doing: str) -> None:
    """Refuse (RuntimeError) ``doing`` where ``esper/`` differs from ``rev`` (None: nothing pinned)."""
    if rev is not None and not library_matches(rev):
        raise RuntimeError(f"esper/ differs from {rev}, the revision the rule pins: not {doing}")


def confirm_seed(arm: str, task: str, k: int, runs: Path, archive: Path, rev: str | None,
                 log: Callable[[str], None] = print) -> Path:  # fmt: skip
    """Train, evaluate and keep seed ``k`` of ``task`` for ``arm`` (nothing runs where it is kept whole; a
    kept seed without its diagnosis rows or training episodes gets them where its run directory is still
    here); the kept file's path."""
    kept_at = archive / arm
    data_seed = final_data_seed(task, k)
    run_dir = runs / arm / task / f"seed{k}"
    if (kept := load_seed(kept_at, task, k, EPISODES, data_seed)) is not None:
        if (FOSSILIZING not in kept["controllers"] or "train_episodes" not in kept) and trained(run_dir):
            log(f"{arm} {task} seed {k}: adding what the kept seed lacks")
            results = {key: v for key, v in kept.items() if key in ("meta", "controllers", "correlations")}
            _keep(kept_at, task, k, run_dir, results, kept["meta"].get("train_seconds", 0.0))
        return seed_path(kept_at, task, k)
    _check_library(rev, f"training {task} seed {k}")
    log(f"{arm} {task} seed {k}: training")
    run_dir, train_s = launch.train(k, runs / arm / task, train_args(task, arm))
    _check_library(rev, f"evaluating {task} seed {k}")  # evaluation reads esper/ too
    log(f"{arm} {task} seed {k}: evaluating")
    results = launch.evaluate(run_dir, k, EPISODES, CONTROLLERS, out=EVAL_DIR, data_seed=data_seed,
                              extra=["--threads", "1"])  # fmt: skip
    path = _keep(kept_at, task, k, run_dir, results, train_s)
    log(f"{arm} {task} seed {k}: kept in {path}")
    return path


def run_arm(arm: str, tasks: Sequence[str], seeds: Sequence[int], runs: Path, archive: Path, rev: str | None,
            log: Callable[[str], None] = print) -> bool:  # fmt: skip
    """Every (task, seed) of ``arm``, seed by seed, kept as each is evaluated; whether all went (an error is
    logged and stops the arm)."""
    for k in seeds:
        for task in tasks:
            try:
                confirm_seed(arm, task, k, runs, archive, rev, log)
            except RuntimeError as e:
                log(f"{arm}: error: {e}")
                return False
    return True


def status_lines(arms: Sequence[str], tasks: Sequence[str], seeds: Sequence[int], runs: Path,
                 archive: Path) -> list[str]:  # fmt: skip
    """Where each (arm, task, seed) stands, read from ``archive`` and ``runs`` (nothing runs): ``kept``,
    ``trained`` (not yet kept), ``U/N updates`` of a training in progress, or blank."""
    out = [f"| task | seed | {' | '.join(f'`{a}`' for a in arms)} |", f"|---|---:|{'---|' * len(arms)}"]
    kept_n = 0
    for k in seeds:
        for task in tasks:
            cells = []
            for arm in arms:
                run = runs / arm / task / f"seed{k}"
                if load_seed(archive / arm, task, k, EPISODES, final_data_seed(task, k)) is not None:
                    cells.append("kept")
                    kept_n += 1
                elif trained(run):
                    cells.append("trained")
                elif (run / "events.jsonl").is_file():
                    done = len(list(read_events(run / "events.jsonl", "ppo_update")))
                    cells.append(f"{done}/{preset(SUITE[task]).updates} updates")
                else:
                    cells.append("")
            out.append(f"| `{task}` | {k} | {' | '.join(cells)} |")
    out.append(f"\n{kept_n} of {len(arms) * len(tasks) * len(seeds)} runs kept.")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    doc = __doc__.split("\n\n")[0]
    p = argparse.ArgumentParser(prog="python -m esper.shell.suite.confirm", description=doc)
    p.add_argument("arms", nargs="+", choices=sorted(ARMS), metavar="ARM",
                   help=f"the arms, side by side (one process each): {', '.join(ARMS)}")  # fmt: skip
    p.add_argument("--runs", type=Path, required=True, help="run directories go in RUNS/ARM/TASK/seedk")
    p.add_argument("--archive", type=Path, required=True,
                   help="kept seeds go in ARCHIVE/ARM/TASK/seedk.json.gz")  # fmt: skip
    p.add_argument("--rev", default=None, help="the revision whose esper/ the runs must train with")
    p.add_argument("--tasks", default=",".join(SUITE))
    p.add_argument("--first-seed", type=int, default=300)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--status", action="store_true", help="print where each run stands and exit; runs nothing")
    args = p.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if (
        not tasks
        or any(t not in SUITE for t in tasks)
        or args.seeds < 1
        or len(set(args.arms)) < len(args.arms)
    ):
        p.error(f"tasks must be among {', '.join(SUITE)}, --seeds >= 1, and each arm named once")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    if args.status:
        print("\n".join(status_lines(args.arms, tasks, seeds, args.runs, args.archive)))
        return 0

    def one(arm: str) -> bool:
        return run_arm(
            arm, tasks, seeds, args.runs, args.archive, args.rev, log=lambda m: print(m, flush=True)
        )

    with ThreadPoolExecutor(max_workers=len(args.arms)) as arms:  # each arm's work runs in subprocesses
        ok = list(arms.map(one, args.arms))
    return 0 if all(ok) else 1


if __name__ == "__main__":
    raise SystemExit(main())
