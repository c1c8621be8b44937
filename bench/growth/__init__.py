"""Does growth pay, and does the learned controller grow better than the alternatives? Held-out numbers.

    python -m bench.growth                          # sweep + 5 training seeds + evaluation (see README)
    python -m bench.growth --stage sweep            # static vs grow_all with every blueprint only
    python -m bench.growth --stage learn --seeds 5 --episodes 10
    python -m bench.growth --stage learn --runs bench/runs/variant --train-args "--ppo.lr 1e-3"
    python -m bench.growth --stage learn --first-seed 5 --runs bench/runs/more   # seeds 5-9
    python -m bench.growth --pool A.json B.json     # one table from the learn stages of several files
    python -m bench.growth --compare BASE.json --against VARIANT.json   # paired, per training seed
    python -m bench.growth --stage plans --seeds 5 --learned LEARN.json   # fixed plans on those hosts

Three stages, each on the embedded default (``python -m esper.shell.run``'s preset):

1. **sweep** — ``static`` and ``grow_all:<blueprint>`` for every blueprint of the host family on
   ``--sweep-episodes`` fresh hosts (evaluation seeds; the same hosts for every controller). Shows the
   default task's headroom (the bar: the best fixed schedule beats the static host by >= 15 points of
   test accuracy) and which blueprint ``grow_all`` should grow (it must be the one
   :data:`esper.shell.env.tasks.GROW_ALL_BLUEPRINT` names).
2. **placement** — fixed placements (``grow:b0=conv_heavy+b2=depthwise``: only those slots, each with
   its blueprint) on the same hosts as the sweep: where growth pays, and the best accuracy a schedule
   reaches for a given number of added parameters (what a controller that beats ``grow_all`` on
   accuracy per parameter has to find).
3. **learn** — ``--seeds`` training runs of the default (``--seed k``), ``--jobs`` at a time, each then
   evaluated with ``python -m esper.shell.evaluate`` on ``--episodes`` fresh hosts of its own (evaluation
   seed ``1000 + k``) against ``static``, ``random``, ``heuristic`` and ``grow_all``. The 95 % intervals
   are over training seeds (Student-t of the per-seed means), so they include the spread between
   trained controllers, not only between episodes. ``--train-args`` trains a variant of the default
   (the run's own flags; give it its own ``--runs`` folder: finished runs there are kept, and a folder
   whose runs were trained with other flags is refused). ``--more-controllers ppo_mixed`` evaluates
   further readouts on the same hosts into each run's ``eval-more``; given to a finished stage, it
   evaluates only them.

``--stage plans`` trains nothing: it runs fixed schedules (``--plans``) on the learn stage's evaluation
hosts, seed by seed, and with ``--learned`` pairs the learned controllers of those seeds with each one.

Writes ``bench/results/growth/<date>-<host>-growth.{md,json}`` and ``...-growth-*.png`` (test accuracy
vs parameters added; test accuracy over the training updates of every seed); ``--out`` elsewhere.
``bench/results/README.md`` indexes the committed ones.
"""

from __future__ import annotations

from bench.growth.cli import command_line, main
from bench.growth.pooling import BASELINES, compare, pool, summarize_runs, verdict
from bench.growth.report import _frontier, compare_markdown, markdown, plans_markdown
from bench.growth.schedules import (
    PLACEMENTS,
    PLANS,
    _against_learned,
    placement,
    plan_rows,
    plans,
    split_by_placement,
    sweep,
)
from bench.growth.training import learn

__all__ = [
    "BASELINES", "PLACEMENTS", "PLANS", "_against_learned", "_frontier", "command_line", "compare",
    "compare_markdown", "learn", "main", "markdown", "placement", "plan_rows", "plans", "plans_markdown",
    "pool", "split_by_placement", "summarize_runs", "sweep", "verdict",
]  # fmt: skip
