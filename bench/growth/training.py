"""The learn stage: training runs of the default (or a variant, ``--train-args``), seed by seed, each
evaluated with ``python -m esper.shell.evaluate`` on fresh hosts of its own (both subprocesses the
suite's: :mod:`esper.shell.suite.launch`)."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.growth.pooling import _verdicts, summarize_runs
from esper.shell.suite.launch import evaluate as _evaluate
from esper.shell.suite.launch import train as _train
from esper.shell.telemetry.events import read_events


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
