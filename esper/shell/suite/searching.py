"""``python -m esper.shell.suite.searching RUN_DIR NAME [--task TASK] [--threads N]``: one search of a
suite stage, into the run's search cache.

A baseline that searches before it is judged (``heuristic_tuned``, ``plan_search@1x``, ...) chooses on the
run's training hosts and data draw and caches its choice in ``RUN_DIR/search/NAME.json``
(``RUN_DIR/search-TASK`` with ``--task``: :func:`esper.shell.eval.search.search`). This runs that search
alone, on the settings ``python -m esper.shell.evaluate RUN_DIR [--task TASK]`` would hand it (the run's
``config.json``, on ``TASK`` where given, under the run's largest budget where it trains on several), so
that the suite can run each search as a stage of its own, beside the others, and the evaluation that
follows reads every choice from the cache. A cached choice is read only for the same settings and draw,
so were the two ever to differ the evaluation would search again, not read another's choice.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from esper.shell.common.fields import from_dict
from esper.shell.config.presets import RunConfig
from esper.shell.eval.episodes import at_budget
from esper.shell.eval.search import is_searched, search


def main(argv: list[str] | None = None) -> int:
    doc = __doc__.split("\n\n")[0]
    p = argparse.ArgumentParser(prog="python -m esper.shell.suite.searching", description=doc)
    p.add_argument("run_dir", type=Path, help="a run directory (its config.json)")
    p.add_argument("name", help="the searching controller (heuristic_tuned, plan_search@1x, ...)")
    p.add_argument("--task", default=None, help="as evaluate's --task: search on this task")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: as the run would)")
    args = p.parse_args(argv)
    if not is_searched(args.name):
        p.error(f"{args.name} is not a controller that searches")
    cfg = from_dict(RunConfig, json.loads((args.run_dir / "config.json").read_text()))
    if args.task is not None:
        cfg = cfg.for_task(args.task)
    if cfg.env.budget_shares:  # as evaluate: the run's largest training share
        cfg = at_budget(cfg, max(cfg.env.budget_shares))
    torch.set_num_threads(args.threads or cfg.torch_threads())
    suffix = f"-{args.task}" if args.task is not None else ""
    result = search(args.name, cfg, cfg.env.build_task(), cache=args.run_dir / f"search{suffix}")
    print(f"{args.name}: chose {result.get('chosen')} ({result.get('compute_host_epochs')} host epochs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
