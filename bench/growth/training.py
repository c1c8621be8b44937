"""The learn stage: training runs of the default (or a variant, ``--train-args``), seed by seed, each
evaluated with ``python -m esper.shell.evaluate`` on fresh hosts of its own."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.growth.pooling import _verdicts, summarize_runs
from esper.shell.telemetry.events import read_events


# --------------------------------------------------------------------------------------------- learn
def _train(k: int, run_root: Path, extra: list[str]) -> tuple[Path, float]:
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


def _evaluate(run_dir: Path, k: int, episodes: int, names: Sequence[str] = (), out: str = "eval",
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
        if (meta.get("episodes"), meta.get("eval_seed")) == (episodes, 1000 + k) and same_data and set(
            names
        ) <= set(old.get("controllers", {})):
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


def learn(
    seeds: int,
    episodes: int,
    jobs: int,
    run_root: Path,
    train_args: str = "",
    first_seed: int = 0,
    more_controllers: Sequence[str] = (),
) -> dict[str, Any]:
    """``seeds`` training runs (seeds ``first_seed`` on), each evaluated on fresh hosts of its own.
    ``more_controllers`` (``ppo_mixed``) are evaluated on the same hosts besides evaluate's default set,
    into ``RUN_DIR/eval-more`` (so a finished stage can be given them later without re-evaluating the
    rest)."""
    if first_seed < 0:
        raise ValueError(f"learn: first_seed must be >= 0, got {first_seed}")
    run_root.mkdir(parents=True, exist_ok=True)
    marker = run_root / "train_args.json"  # finished runs are kept: never mix two variants in one folder
    if marker.exists() and (was := json.loads(marker.read_text())) != train_args:
        raise ValueError(
            f"the runs in {run_root} were trained with --train-args {was!r}, not {train_args!r}: "
            "give this variant its own --runs folder"
        )
    marker.write_text(json.dumps(train_args))
    extra = (["--env.workers", "1", "--threads", "1"] if jobs > 1 else []) + shlex.split(train_args)
    t0 = time.perf_counter()

    def one(k: int) -> tuple[int, Path, float, dict, float]:
        run_dir, train_s = _train(k, run_root, extra)
        results = _evaluate(run_dir, k, episodes)
        seconds = results["meta"]["seconds"]
        if more_controllers:
            more = _evaluate(run_dir, k, episodes, more_controllers, out="eval-more")
            results = {**results, "controllers": {**results["controllers"], **more["controllers"]}}
            seconds += more["meta"]["seconds"]
        return k, run_dir, train_s, results, seconds

    with ThreadPoolExecutor(max_workers=jobs) as workers:
        done = sorted(workers.map(one, range(first_seed, first_seed + seeds)))
    per_run = [r for _, _, _, r, _ in done]
    controllers, corr = summarize_runs(
        [{name: c["per_episode"] for name, c in r["controllers"].items()} for r in per_run],
        [r["correlations"] for r in per_run],
    )
    curves = {str(k): _learning_curve(run_dir) for k, run_dir, _, _, _ in done}
    return {
        "seeds": seeds,
        "episodes_per_seed": episodes,
        "jobs": jobs,
        "controllers": controllers,
        "correlations": corr,
        **_verdicts(controllers),
        "learning_curves": curves,
        "train_seconds": [t for _, _, t, _, _ in done],
        "eval_seconds": [t for *_, t in done],
        "seconds": time.perf_counter() - t0,
        "run_root": str(run_root),
        "train_args": train_args,
        "first_seed": first_seed,
    }


def _learning_curve(run_dir: Path) -> dict[str, list[float]]:
    by_update: dict[int, list[dict]] = {}
    for ev in read_events(run_dir / "events.jsonl", "episode"):
        by_update.setdefault(ev["update"], []).append(ev)
    ups = sorted(by_update)
    mean = lambda k: [float(np.mean([e[k] for e in by_update[u]])) for u in ups]
    return {
        "update": ups,
        "test_acc": mean("final_test_acc"),
        "return": mean("return"),
        "params_added": mean("params_added"),
    }
