"""The task suite: one controller configuration, several tasks, baselines that try, the compute spent.

    python -m esper.shell.suite                                  # every task, 5 training seeds each
    python -m esper.shell.suite --tasks longrange --seeds 2 --episodes 4
    python -m esper.shell.suite --first-seed 5 --seeds 5         # seeds 5-9; finished seeds are kept
    python -m esper.shell.suite --workers 8                      # a local cluster of 8 one-CPU workers
    python -m esper.shell.suite --scheduler tcp://HOST:8786      # an existing Dask cluster's workers
    python -m esper.shell.suite --transfer mnist1d --seeds 5     # trained on the others, judged on mnist1d
    python -m esper.shell.suite --finetune mnist1d --seeds 5     # then: fine-tuned there vs from scratch

(``python -m bench.suite`` is the same command.) Each (task, seed) is a few stages, each a task on a Dask
worker of one CPU (:mod:`esper.shell.suite.engine`): its training (``python -m esper.shell.run``), each
search of the baselines that search, and its evaluation (``python -m esper.shell.evaluate``), in
subprocesses (:mod:`esper.shell.suite.launch`, :mod:`esper.shell.suite.runs`); then each task's seeds are
pooled and judged as :mod:`esper.shell.eval.suite` says (the protocol and the selection rule).
``python -m esper.shell.suite.confirm`` runs the confirmation of a candidate change
(:mod:`esper.shell.suite.confirm`).

Writes ``bench/results/suite/<date>-<machine>.{json,md}`` and ``...-<task>-acc-vs-params.png``,
``...-acc-vs-compute.png`` (``--out`` elsewhere); the JSON has
``{"tasks": {TASK: {"controllers": {NAME: {"test_acc_mean", "test_acc_ci95": [lo, hi],
"params_added_mean", "compute_host_epochs", "training_seeds"}}}}}``. The runs go in ``runs/suite``
(``--runs``: on a cluster, storage every worker shares), where every stage's work is kept and read back.
"""
