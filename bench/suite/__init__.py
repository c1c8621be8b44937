"""The task suite: one controller configuration, several tasks, baselines that try, the compute spent.

    python -m bench.suite                                  # every task, 5 training seeds each
    python -m bench.suite --tasks longrange --seeds 2 --episodes 4
    python -m bench.suite --first-seed 5 --seeds 5         # seeds 5-9; finished seeds are kept
    python -m bench.suite --jobs 2                         # two (task, seed) runs at a time
    python -m bench.suite --transfer mnist1d --seeds 5     # trained on the others, judged on mnist1d
    python -m bench.suite --finetune mnist1d --seeds 5     # then: fine-tuned there vs from scratch

For each task of :data:`SUITE` (a preset of ``python -m esper.shell.run``: the default's controller,
reward and lifecycle, only the task's own sizes differ; docs/suite.md says why each task is there):

1. **train** the learned controller, training seeds ``first_seed`` .. ``first_seed + seeds - 1``, each a
   ``python -m esper.shell.run --preset PRESET --seed k`` run in ``--runs/TASK/seedk`` (bench.growth's
   training step: a finished run is kept, an interrupted one resumed);
2. **evaluate** it with ``python -m esper.shell.evaluate`` against :data:`BASELINES` and ``plan_search`` at
   :data:`PLAN_MULTIPLES` times its training compute, and the same search within its parameter cap at
   equal compute (:data:`CAP_SEARCH`, where it has a cap), on 10 fresh hosts (evaluation seed ``1000 + k``)
   and, for generated data, a fresh draw (data seed :data:`FINAL_DATA_SEED` ``+ k``), into
   ``RUN_DIR/eval-suite`` (kept: a re-run evaluates only what is missing);
3. **pool** the seeds: per controller the mean test accuracy with a 95 % interval over training seeds
   (Student-t of the per-seed means), the parameters added, and the host epochs spent on training or
   search (``compute_host_epochs``).

**The selection rule** (written before any suite run): whatever is chosen (the learned controller's
weights, ``heuristic_tuned``'s thresholds, ``plan_search``'s plan) is chosen on the training seed's
own hosts (``train_host_seeds``) and on the task's own data draw (the selection draw: its default
``data_seed``; for a fixed dataset its train and validation splits), by validation accuracy. The table
reads only the final draw (data seed ``FINAL_DATA_SEED + k``; for a fixed dataset its test split, which
nothing above reads) on evaluation hosts (evaluation seed ``1000 + k``), which no choice saw.

Writes ``bench/results/suite/<date>-<machine>.{json,md}`` and ``...-<task>-acc-vs-params.png``,
``...-acc-vs-compute.png`` (``--out`` elsewhere); the JSON has
``{"tasks": {TASK: {"controllers": {NAME: {"test_acc_mean", "test_acc_ci95": [lo, hi],
"params_added_mean", "compute_host_epochs", "training_seeds"}}}}}``.
"""

from __future__ import annotations

from bench.suite.report import markdown, plots
from bench.suite.run import (
    BASELINES,
    CAP_SEARCH,
    CONTROLLERS,
    EVAL_EPISODES,
    FINAL_DATA_SEED,
    LEARNED,
    PLAN_MULTIPLES,
    SUITE,
    final_data_seed,
    plan_name,
    pool_task,
    run_suite,
)

__all__ = [
    "BASELINES", "CAP_SEARCH", "CONTROLLERS", "EVAL_EPISODES", "FINAL_DATA_SEED", "LEARNED", "PLAN_MULTIPLES",
    "SUITE", "final_data_seed", "markdown", "plan_name", "plots", "pool_task", "run_suite",
]  # fmt: skip
