"""``python -m esper.shell.evaluate RUN_DIR``: judge a trained controller on hosts it never saw.

    python -m esper.shell.evaluate runs/default-20261123-101500                   # 20 episodes each
    python -m esper.shell.evaluate RUN_DIR --episodes 50 --seed 7 --controllers ppo,static,grow_all
    python -m esper.shell.evaluate RUN_DIR --data-seed 5 --controllers ppo,heuristic_tuned,plan_search@0.5x
    python -m esper.shell.evaluate RUN_DIR --task mnist1d_deep --data-seed 5     # zero-shot, another task

The run's controller is loaded from ``RUN_DIR/checkpoint.pt`` and frozen (no update, observation
statistics as saved) and run twice: ``ppo`` samples its policy as in training (seeded), ``ppo_greedy``
takes each head's most likely choice (``--controllers ppo_mixed`` adds a third readout: sampled op and
slot, the most likely blueprint and blend). They and the baselines of
:mod:`esper.shell.baselines.simple` — ``static`` (always WAIT), ``random`` (uniform over legal actions),
``heuristic`` (the reference's rules), ``grow_all`` (germinate the task's best blueprint everywhere,
blend and fossilize as fast as the gates allow) — each run the **same** episodes: host seeds derived
from ``--seed`` under a purpose of their own (:func:`esper.shell.common.seeding.eval_host_seeds`), so no
evaluation host is a training host, and every controller meets the same hosts and data orders.

``heuristic_tuned`` (the heuristic's thresholds chosen by a grid), ``heuristic_tuned_wide`` (its timing,
blueprint and budget chosen by a grid that widens where its choice lands on an edge), ``probe`` (a greedy
probe: candidates incubate at alpha 0, the best by what-if gain per parameter grows while it clears a
threshold and fits the learned controller's budget; its settings searched) and ``plan_search`` (the best
fixed plan found within a budget of host epochs: ``plan_search`` the learned controller's training
compute, ``plan_search@H`` H host epochs, ``plan_search@Kx`` K times it; ``plan_search_timed`` the same
over schedules with their timing and blend style) first search on the run's **training** hosts and data
draw, by validation accuracy (:mod:`esper.shell.eval.search`; their choices are kept in
``RUN_DIR/search/``). ``born_big`` is the static network at ``grow_all``'s final size (its seeds
fossilized at alpha 1 from epoch 0, trained with the host); ``born_big:b0=conv_heavy+b2=self_attention``
any plan's, ``born_big:ppo_greedy`` the plan ``ppo_greedy`` ended with most often in this evaluation.

``--data-seed S`` evaluates on a fresh draw of generated data (the tasks ``mnist1d``, ``mnist1d_deep``,
``longrange``, ``retrieval``); a fixed dataset (``digits``, ...) refuses it: its test split is the only
held-out draw.

``--task T`` evaluates on another task: the run's settings with T's task (:meth:`RunConfig.for_task`), T's
own data draw for the searches and ``--data-seed`` for a fresh one, the results in ``RUN_DIR/eval-T/``:
zero-shot transfer for a controller of ``--ppo.policy set``, which acts on any host (a flat-policy run is
refused in one line where T's host differs in shape, :func:`esper.shell.user.check_controller_fits`).

The verdict is the held-out **test** accuracy of each episode's final host (a split neither the host's
training nor the controller ever reads) and the parameters the controller added. Written to
``RUN_DIR/eval/`` (``--out DIR`` elsewhere):

- ``results.json``: ``{"controllers": {name: {"test_acc_mean", "test_acc_ci95": [lo, hi],
  "params_added_mean", "compute_host_epochs", "train_flops_mean", "validation_flops_mean",
  "whatif_flops_mean", "episodes", ...}}, "correlations": {...}, "meta": {...}}`` (``meta`` names the
  evaluation's host seeds and data seed and the run's own data seed; ``compute_host_epochs``: the host
  epochs a controller spent on training or search; ``*_flops_mean``: the FLOPs one evaluation episode
  spent, its mean, by kind: training, validation, what-if, :mod:`esper.shell.host.flops`): accuracy in %,
  95 % Student-t intervals over episodes, ``params_added`` = final host's parameters minus the static
  host's; every episode's numbers under ``per_episode``; Spearman correlations between the episode
  return and the final test accuracy (and accuracy per parameter, and the held-out objective) over
  all evaluation episodes;
- ``report.md`` and ``plots/``: test accuracy against parameters added (one point per episode), and
  validation accuracy over the epochs per controller.

``--save-episodes DIR`` also keeps every controller's episodes as a dataset, ``DIR/<controller>/``
(:mod:`esper.shell.eval.dataset`), for ``python -m esper.shell.run --pretrain DIR`` (behaviour cloning
before PPO) or ``--offline DIR`` (training from the episodes alone).

The controllers are :mod:`esper.shell.eval.controllers`'s, the episodes and their summary
:mod:`esper.shell.eval.episodes`'s, the files :mod:`esper.shell.eval.output`'s; this module is the
command line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from esper.shell.common.cli import OneLineParser, repeat_line, report
from esper.shell.common.memory import tune_allocator
from esper.shell.env.config import GENERATED_TASKS
from esper.shell.eval.controllers import CONTROLLERS
from esper.shell.eval.episodes import compare_controllers
from esper.shell.eval.output import FLOP_COLUMNS, format_flops

PROG = "python -m esper.shell.evaluate"


def main(argv: Sequence[str] | None = None) -> int:
    tune_allocator()
    p = OneLineParser(
        prog=PROG,
        allow_abbrev=False,
        description="Evaluate a trained controller against baselines on fresh hosts.",
    )
    p.add_argument("run_dir", help="a run directory written by python -m esper.shell.run")
    p.add_argument("--episodes", type=int, default=20, help="episodes per controller (default 20)")
    p.add_argument("--seed", type=int, default=0, help="evaluation seed: host seeds derive from it (0)")
    p.add_argument("--controllers", default=",".join(CONTROLLERS),
                   help=f"comma-separated subset of {','.join(CONTROLLERS)}, or ppo_mixed (samples when and "
                        "where, takes the most likely blueprint and blend); grow_all:BLUEPRINT grows "
                        "another blueprint than the task's best; grow:b0=conv_heavy+b2=depthwise grows only "
                        "those slots, each with its blueprint, and grow:b0=conv_heavy:3+b2=depthwise:8 each "
                        "from that epoch on; either may end in @STYLE, @TEMPO, @ALPHA to "
                        "blend otherwise than LINEAR_ADD, FAST, 1.0 (grow_all@LINEAR_MULTIPLY, "
                        "grow:b0=conv_heavy@STANDARD@0.7); born_big is the static network at grow_all's "
                        "final size (its seeds fossilized at alpha 1 from epoch 0), born_big:PLAN at that "
                        "plan's, born_big:CONTROLLER at the plan CONTROLLER (named before it) ended with "
                        "most often; searched on training hosts first, their compute counted: "
                        "heuristic_tuned, heuristic_tuned_wide[@random] (timing, blueprint and budget), "
                        "probe[@random] (a greedy what-if probe), plan_search[@H|@Kx][@random], "
                        "plan_search_cap[@H|@Kx][@random], plan_search_timed[@H|@Kx][@random] (schedules "
                        "with their timing and blend style); these search with Optuna's TPE, or at random "
                        "with @random (the plan searches with its successive-halving pruner)")  # fmt: skip
    p.add_argument("--threads", type=int, default=0,
                   help="torch intra-op threads (0, the default: as the run would, the cores over its env "
                        "workers); the numbers repeat at the same --seed and thread count")  # fmt: skip
    p.add_argument("--data-seed", type=int, default=None,
                   help=f"evaluate on this draw of generated data ({', '.join(GENERATED_TASKS)}; default: "
                        "the run's own draw); refused for a fixed dataset, whose test split is the only "
                        "held-out draw")  # fmt: skip
    p.add_argument("--task", default=None,
                   help="evaluate on another task than the run's (zero-shot transfer; its searches select on "
                        "the task's own draw): refused for a flat-policy run whose host shape differs "
                        "(default: the run's task)")  # fmt: skip
    p.add_argument("--out", type=Path, default=None,
                   help="where results.json, report.md and plots/ go (default RUN_DIR/eval, "
                        "RUN_DIR/eval-TASK with --task)")  # fmt: skip
    p.add_argument("--save-episodes", type=Path, default=None, metavar="DIR",
                   help="also write every controller's evaluation episodes as a dataset, DIR/<controller>/ "
                        "(observations, masks, actions, rewards, done flags: what python -m esper.shell.run "
                        "--pretrain DIR or --offline DIR learns from)")  # fmt: skip
    p.add_argument("--budget-share", type=float, default=None, metavar="SHARE",
                   help="evaluate under a parameter budget of SHARE x what grow_all adds: the learned "
                        "controller's cap, the reward's budget and every budgeted baseline's; a controller "
                        "trained with env.budget_shares reads it (default: the run's own; for such a run, "
                        "its largest training share)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.threads < 0:
        return report(PROG, ValueError(f"--threads must be >= 0, got {args.threads}"))
    if args.data_seed is not None and args.data_seed < 0:
        return report(PROG, ValueError(f"--data-seed must be >= 0, got {args.data_seed}"))
    names = [c.strip() for c in args.controllers.split(",") if c.strip()]
    try:
        results = compare_controllers(args.run_dir, episodes=args.episodes, seed=args.seed,
                                      controllers=names, show_progress=not args.no_progress,
                                      threads=args.threads, out=args.out,
                                      data_seed=args.data_seed, task=args.task,
                                      save_episodes=args.save_episodes,
                                      budget_share=args.budget_share)  # fmt: skip
    except (OSError, ValueError) as e:
        return report(PROG, e)
    for name, s in results["controllers"].items():
        lo, hi = s["test_acc_ci95"]
        flops = ", ".join(f"{h.removesuffix(' FLOPs')} {format_flops(s.get(k))}" for h, k in FLOP_COLUMNS)
        print(f"{name:>10}: test acc {s['test_acc_mean']:5.1f} % [{lo:5.1f}, {hi:5.1f}]  "
              f"params added {s['params_added_mean']:7.0f}  return {s['return_mean']:6.2f}  "
              f"host epochs spent {s['compute_host_epochs']}  FLOPs an episode: {flops}")  # fmt: skip
        if "search" in s and "from" in s["search"]:  # born_big:CONTROLLER
            src, plan = s["search"]["from"], s["search"]["chosen"] or "none"
            print(f"{'':>10}  grew {src}'s most frequent plan: {plan}")
        elif "search" in s:
            print(f"{'':>10}  chose {s['search']['chosen']} on training hosts")
    meta = results["meta"]
    draw = "a fixed dataset's test split" if meta["data_seed"] is None else f"data seed {meta['data_seed']}"
    print(f"data: {draw} (the run's own draw: {meta['selection_data_seed']})")
    print(repeat_line(args.seed, results["meta"]["torch_threads"]))
    default = Path(args.run_dir) / ("eval" if args.task is None else f"eval-{args.task}")
    print(f"results: {(args.out or default) / 'results.json'}")
    for path in results["meta"].get("saved_episodes", []):
        print(f"episodes: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
