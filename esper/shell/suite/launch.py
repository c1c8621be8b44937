"""The work every suite seed is made of: a training run (``python -m esper.shell.run``, a subprocess),
kept when finished and resumed from its checkpoint when interrupted; each search of a baseline
(:mod:`esper.shell.suite.searching`), kept in the run's search cache; and its evaluation (``python -m
esper.shell.evaluate``), kept when its results hold the same evaluation. So a stage started again (a retry
after its worker died) goes on from what the one before it left. A subprocess runs through
:mod:`esper.shell.suite.child`, which dies with the process that started it. The searches, and the
evaluations where ``in_process``, run their command's ``main`` in this process instead (the suite's stages
do: a worker imports the library once, not once a stage; their numbers are the subprocess's, each
episode seeded by its own host seed). Callers reach them as ``launch.train``, ``launch.search`` and
``launch.evaluate``, so that a test can stand in for them."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from esper.shell.telemetry.events import read_events


def command(module: str, args: Sequence[str]) -> list[str]:
    """``python -m MODULE ARGS`` run through :mod:`esper.shell.suite.child` (killed with this process)."""
    return [sys.executable, "-m", "esper.shell.suite.child", str(os.getpid()), module, *args]


def run_seconds(events: Path) -> float:
    """A run's training time from its own log: each process's last event (every ``run_start`` begins one;
    the events a resume rewound are no longer there), summed, so a run resumed after its process died
    counts each stretch once."""
    total, last = 0.0, 0.0
    for e in read_events(events):
        if e["event"] == "run_start":
            total, last = total + last, 0.0
        last = float(e.get("t", last))
    return total + last


def train(k: int, run_root: Path, extra: list[str]) -> tuple[Path, float]:
    """Training seed ``k`` into ``run_root/seedk`` with ``extra`` flags (its log beside it, in
    ``run_root/seedk.log``): the run directory and the training's wall time (a finished run's own)."""
    run_dir = run_root / f"seed{k}"
    cmd = command("esper.shell.run", [
        "--seed",
        str(k),
        "--run_dir",
        str(run_root),
        "--name",
        f"seed{k}",
        "--progress",
        "false",
        *extra,
    ])  # fmt: skip
    events = run_dir / "events.jsonl"
    done = [e for e in read_events(events, "run_end") if not e.get("interrupted")] if events.exists() else []
    if done and (run_dir / "checkpoint.pt").exists():  # finished: keep it (re-run the stage to re-evaluate)
        return run_dir, run_seconds(events)
    if (run_dir / "checkpoint.pt").exists():  # an interrupted run (its process killed): continue it
        cmd = command("esper.shell.run", ["--resume", str(run_dir), "--progress", "false"])
    t0 = time.perf_counter()
    run_root.mkdir(parents=True, exist_ok=True)  # the log goes beside the run, before the run exists
    log = run_root / f"seed{k}.log"
    with log.open("a") as out:  # a retried stage's log follows the one before it
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode:
        raise RuntimeError(f"training seed {k} failed ({proc.returncode}); see {log}")
    return run_dir, run_seconds(events) if events.exists() else time.perf_counter() - t0


def _in_process(main: Callable[[list[str]], int], args: list[str], doing: str) -> None:
    """``main(args)`` of a command, in this process, its output kept for an error's message."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            rc = main(args)
        except SystemExit as e:  # argparse's refusals
            rc = e.code if isinstance(e.code, int) else 1
    if rc:
        raise RuntimeError(f"{doing} failed:\n{out.getvalue()[-2000:]}")


def search(run_dir: Path, name: str, task: str | None = None, extra: Sequence[str] = ()) -> str:
    """Search ``name`` (a baseline that searches before it is judged) for the run in ``run_dir`` into its
    search cache, as its evaluation would (``task``: evaluate's ``--task``), unless it is cached there, in
    this process; ``extra``: more flags (``--threads 1``). The evaluation then reads it from the cache.
    Returns ``name``."""
    from esper.shell.suite import searching

    args = [str(run_dir), name, *(["--task", task] if task is not None else []), *extra]
    _in_process(searching.main, args, f"searching {name} for {run_dir}")
    return name


def evaluate(run_dir: Path, k: int, episodes: int, names: Sequence[str] = (), out: str = "eval",
             data_seed: int | None = None, extra: Sequence[str] = (),
             in_process: bool = False) -> dict:  # fmt: skip
    """Evaluate training seed k's run on its hosts (evaluation seed 1000 + k): ``names`` (default:
    evaluate's default set) into ``RUN_DIR/out``, or the results already there if they hold them alike.
    ``data_seed``: on that draw of generated data (``--data-seed``); ``extra``: more of evaluate's flags;
    ``in_process``: evaluate's ``main`` here, not in a subprocess."""
    from esper.shell.eval.controllers import CONTROLLERS

    names = tuple(names) or CONTROLLERS
    saved = run_dir / out / "results.json"
    if saved.exists():  # already evaluated alike (same episodes, seed, data and controllers): keep it
        old = json.loads(saved.read_text())
        meta = old.get("meta", {})
        same_data = data_seed is None or meta.get("data_seed") == data_seed
        if (
            (meta.get("episodes"), meta.get("eval_seed")) == (episodes, 1000 + k)
            and same_data
            and set(names) <= set(old.get("controllers", {}))
        ):
            return old
    cmd = command("esper.shell.evaluate", [
        str(run_dir),
        "--episodes",
        str(episodes),
        "--seed",
        str(1000 + k),
        "--controllers",
        ",".join(names),
        "--out",
        str(run_dir / out),
        "--no-progress",
        *(["--data-seed", str(data_seed)] if data_seed is not None else []),
        *extra,
    ])  # fmt: skip
    if in_process:
        from esper.shell import evaluate as evaluate_cli

        _in_process(evaluate_cli.main, cmd[cmd.index("esper.shell.evaluate") + 1 :], f"evaluating {run_dir}")
        return json.loads(saved.read_text())
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)  # it sets the run's threads
    if proc.returncode:
        raise RuntimeError(f"evaluating {run_dir} failed:\n{proc.stderr[-2000:]}")
    return json.loads(saved.read_text())


__all__ = ["command", "evaluate", "run_seconds", "search", "train"]
