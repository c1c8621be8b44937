"""The two subprocesses every suite seed is made of: a training run (``python -m esper.shell.run``), kept
when finished and resumed when interrupted, and its evaluation (``python -m esper.shell.evaluate``), kept
when its results hold the same evaluation. Callers reach them as ``launch.train`` and
``launch.evaluate``, so that a test can stand in for both."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from esper.shell.telemetry.events import read_events


def train(k: int, run_root: Path, extra: list[str]) -> tuple[Path, float]:
    """Training seed ``k`` into ``run_root/seedk`` with ``extra`` flags (its log beside it, in
    ``run_root/seedk.log``): the run directory and the training's wall time (a finished run's own)."""
    run_dir = run_root / f"seed{k}"
    cmd = [
        sys.executable,
        "-m",
        "esper.shell.run",
        "--seed",
        str(k),
        "--run_dir",
        str(run_root),
        "--name",
        f"seed{k}",
        "--progress",
        "false",
        *extra,
    ]
    events = run_dir / "events.jsonl"
    done = [e for e in read_events(events, "run_end") if not e.get("interrupted")] if events.exists() else []
    if done and (run_dir / "checkpoint.pt").exists():  # finished: keep it (re-run the stage to re-evaluate)
        return run_dir, float(done[-1]["t"])
    if (run_dir / "checkpoint.pt").exists():  # an interrupted run: continue it
        cmd = [sys.executable, "-m", "esper.shell.run", "--resume", str(run_dir), "--progress", "false"]
    t0 = time.perf_counter()
    run_root.mkdir(parents=True, exist_ok=True)  # the log goes beside the run, before the run exists
    log = run_root / f"seed{k}.log"
    with log.open("w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode:
        raise RuntimeError(f"training seed {k} failed ({proc.returncode}); see {log}")
    return run_dir, time.perf_counter() - t0


def evaluate(run_dir: Path, k: int, episodes: int, names: Sequence[str] = (), out: str = "eval",
             data_seed: int | None = None, extra: Sequence[str] = ()) -> dict:  # fmt: skip
    """Evaluate training seed k's run on its hosts (evaluation seed 1000 + k): ``names`` (default:
    evaluate's default set) into ``RUN_DIR/out``, or the results already there if they hold them alike.
    ``data_seed``: on that draw of generated data (``--data-seed``); ``extra``: more of evaluate's flags."""
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
    cmd = [
        sys.executable,
        "-m",
        "esper.shell.evaluate",
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
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)  # it sets the run's threads
    if proc.returncode:
        raise RuntimeError(f"evaluating {run_dir} failed:\n{proc.stderr[-2000:]}")
    return json.loads(saved.read_text())


__all__ = ["evaluate", "train"]
