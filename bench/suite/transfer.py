"""Zero-shot transfer (issue 46): the host-agnostic controller trained on every suite task but one, then
evaluated on the one it never saw, against the same baselines as the suite, and how much search on
that task its accuracy is worth (the amortization).

Training seed k runs ``python -m esper.shell.run --preset default --ppo.policy set --tasks OTHERS
--env.task OTHERS[0] --seed k`` into ``--runs/transfer-HELDOUT/seedk`` (one update per training task in
turn; the default's controller, reward and lifecycle, the set policy being the one that acts on any
host), then ``python -m esper.shell.evaluate RUN --task HELDOUT`` on the held-out task's fresh hosts
(evaluation seed 1000 + k) and final draw (data seed 100000 + k; a fixed dataset's test split), with
the searches (``heuristic_tuned``, ``plan_search``) run on the held-out task's training hosts and own
draw, into ``RUN_DIR/eval-transfer``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.growth import training
from bench.suite.run import (
    PLAN_MULTIPLES,
    SUITE,
    controllers_for,
    final_data_seed,
    plan_name,
    pool_task,
    with_diagnostics,
)
from esper.shell.config.presets import preset

#: What the transfer run sets beyond the default: the policy whose shapes do not depend on the host.
TRANSFER_FLAGS = ("--ppo.policy", "set")
#: The readout the amortization is read for (the one the suite's rule judges).
READOUT = "ppo_greedy"
#: Where each seed's held-out evaluation goes inside its run directory.
EVAL_DIR = "eval-transfer"


#: Suite tasks a transfer run neither trains on nor holds out. A run of several tasks trains each on one
#: env section's settings (the default preset's), and these need their own (``recall``: its batch and
#: learning rates), so they would be trained or judged at sizes they were never measured at.
OWN_SIZES = ("recall",)


def training_tasks(heldout: str) -> list[str]:
    """The suite's tasks but ``heldout`` and :data:`OWN_SIZES`, in the suite's order (the first is the
    run's ``env.task``)."""
    tasks = [t for t in SUITE if t not in OWN_SIZES]
    if heldout not in tasks:
        why = " (it needs its own env sizes)" if heldout in OWN_SIZES else ""
        raise ValueError(f"--transfer: {heldout!r} cannot be held out{why}; tasks: {', '.join(tasks)}")
    return [t for t in tasks if t != heldout]


def train_args(heldout: str) -> list[str]:
    """The training run's flags: the default preset on every other suite task, the set policy."""
    others = training_tasks(heldout)
    return ["--preset", "default", *TRANSFER_FLAGS, "--tasks", ",".join(others), "--env.task", others[0]]


def amortization(controllers: dict[str, dict], readout: str = READOUT) -> dict[str, Any]:
    """How many host epochs of ``plan_search`` on the held-out task buy the accuracy the transferred
    controller reaches with none spent there: the first point of ``plan_search``'s curve (its budgets,
    :data:`PLAN_MULTIPLES`) at or above ``readout``'s mean test accuracy, interpolated linearly from the
    point before it. ``bound``: ``"about"`` (interpolated), ``"at most"`` (the smallest budget already
    reaches it) or ``"more than"`` (no budget reaches it; ``host_epochs`` is the largest tried)."""
    target = controllers[readout]["test_acc_mean"]
    curve = sorted((c["compute_host_epochs"], c["test_acc_mean"])
                   for m in PLAN_MULTIPLES if (c := controllers.get(plan_name(m))))  # fmt: skip
    out: dict[str, Any] = {"readout": readout, "test_acc_mean": target, "host_epochs": None, "bound": None}
    if not curve:
        return out
    before = None
    for x, acc in curve:
        if acc >= target:
            if before is None or acc == before[1]:
                return {**out, "host_epochs": x, "bound": "at most"}
            x0, a0 = before
            return {**out, "host_epochs": round(x0 + (target - a0) / (acc - a0) * (x - x0)), "bound": "about"}
        before = (x, acc)
    return {**out, "host_epochs": curve[-1][0], "bound": "more than"}


def run_transfer(heldout: str, seeds: int, first_seed: int, episodes: int, jobs: int, runs: Path,
                 log: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    """Every training seed trained on the other tasks and evaluated on ``heldout`` (``jobs`` at a time),
    pooled: ``{"transfer": {heldout: entry}}``, the entry as :func:`bench.suite.run.pool_task` writes a
    task's, with ``trained_on``, the training times and the :func:`amortization`."""
    if seeds < 1 or first_seed < 0 or episodes < 2 or jobs < 1:
        raise ValueError("--seeds and --jobs must be >= 1, --first-seed >= 0, --episodes >= 2")
    args = train_args(heldout)
    root = runs / f"transfer-{heldout}"
    root.mkdir(parents=True, exist_ok=True)
    threads = ["--env.workers", "1", "--threads", "1"] if jobs > 1 else []
    t0 = time.perf_counter()

    evaluate_flags = ["--task", heldout, *(["--threads", "1"] if jobs > 1 else [])]

    def one(k: int) -> tuple[int, dict, float]:
        run_dir, train_s = training._train(k, root, [*args, *threads])
        # the preset it trains with (train_args) holds the controller's cap
        results = training._evaluate(run_dir, k, episodes, controllers_for(preset("default")), out=EVAL_DIR,
                                     data_seed=final_data_seed(heldout, k), extra=evaluate_flags)  # fmt: skip
        with_diagnostics(results, run_dir, k, episodes, EVAL_DIR, final_data_seed(heldout, k), evaluate_flags)
        log(f"transfer to {heldout}, seed {k}: done")
        return k, results, train_s

    with ThreadPoolExecutor(max_workers=jobs) as workers:
        done = list(workers.map(one, range(first_seed, first_seed + seeds)))
    entry = pool_task(heldout, {k: r for k, r, _ in done})
    entry["preset"] = "default"
    entry["flags"] = list(TRANSFER_FLAGS)
    entry["trained_on"] = training_tasks(heldout)
    entry["train_seconds"] = [s for _, _, s in done]
    entry["amortization"] = amortization(entry["controllers"])
    return {"tasks": {}, "transfer": {heldout: entry}, "seconds": time.perf_counter() - t0}


__all__ = ["EVAL_DIR", "READOUT", "TRANSFER_FLAGS", "amortization", "run_transfer", "train_args",
           "training_tasks"]  # fmt: skip
