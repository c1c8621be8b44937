"""The task suite's protocol (issue 45): one controller configuration, several tasks, baselines that try,
the compute spent. ``python -m esper.shell.suite`` runs it (:mod:`esper.shell.suite`); this package holds
what it is judged by.

For each task of :data:`~esper.shell.eval.suite.tasks.SUITE` (a preset of ``python -m esper.shell.run``:
the default's controller, reward and lifecycle, only the task's own sizes differ; docs/suite.md says why
each task is there):

1. **train** the learned controller, training seeds ``first_seed`` .. ``first_seed + seeds - 1``, each a
   ``python -m esper.shell.run --preset PRESET --seed k`` run in ``RUNS/TASK/seedk`` (a finished run is
   kept, an interrupted one resumed);
2. **evaluate** it with ``python -m esper.shell.evaluate`` against ``BASELINES`` and ``plan_search`` at
   ``PLAN_MULTIPLES`` times its training compute, and the same search within its parameter cap at equal
   compute (``CAP_SEARCH``, where it has a cap), on 10 fresh hosts (evaluation seed ``1000 + k``) and,
   for generated data, a fresh draw (data seed ``FINAL_DATA_SEED + k``), into ``RUN_DIR/eval-suite``
   (kept: a re-run evaluates only what is missing) (:mod:`~esper.shell.eval.suite.tasks`);
3. **pool** the seeds (:mod:`~esper.shell.eval.suite.pooling`): per controller the mean test accuracy
   with a 95 % interval over training seeds (Student-t of the per-seed means), the parameters added, and
   the host epochs spent on training or search (``compute_host_epochs``); and judge it: a new run by
   protocol 2's claims, paired by seed, Holm-corrected, equivalence by TOST
   (:mod:`~esper.shell.eval.suite.verdict`, issue 89), the runs before it by issue 45's goals, read off each
   task's table and over the suite (:mod:`~esper.shell.eval.suite.report`).

**The selection rule** (written before any suite run): whatever is chosen (the learned controller's
weights, ``heuristic_tuned``'s thresholds, ``plan_search``'s plan) is chosen on the training seed's
own hosts (``train_host_seeds``) and on the task's own data draw (the selection draw: its default
``data_seed``; for a fixed dataset its train and validation splits), by validation accuracy. The table
reads only the final draw (data seed ``FINAL_DATA_SEED + k``; for a fixed dataset its test split, which
nothing above reads) on evaluation hosts (evaluation seed ``1000 + k``), which no choice saw.

Each evaluated (task, seed) is kept as a small file (:mod:`~esper.shell.eval.suite.archive`); zero-shot
transfer and fine-tuning after it (issue 46) are read by :mod:`~esper.shell.eval.suite.transfer` and
:mod:`~esper.shell.eval.suite.finetune`.
"""
