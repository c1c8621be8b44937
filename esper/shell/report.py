"""Plots and a markdown summary of a finished (or interrupted) run: ``python -m esper.shell.report RUN_DIR``.

Reads ``RUN_DIR/events.jsonl`` (schema in :mod:`esper.shell.telemetry.events`) and writes into
``RUN_DIR/plots/``:

* ``returns.png``: mean episode return per update, with the min-max band over envs;
* ``accuracy.png``: final and best validation accuracy per update (mean over envs);
* ``entropy.png``: normalized entropy of each head per update (PPO runs only);
* ``losses.png``: policy and value loss, KL, clip fraction per update (PPO runs only);
* ``seed_timeline.png``: the last update's episodes, one row per env and slot, coloured by stage over
  epochs, with markers for germinate / fossilize / prune;
* ``blueprints.png``: per slot, the blueprints the episodes of each update germinated there (the
  ``germinations`` of episode events): what the controller learned to grow where, and when it committed;

and ``RUN_DIR/report.md`` (config highlights, update count, accuracies, return trend, lifecycle
counts, governor rollbacks, anomalies, links to the plots). Plots without data are skipped. The
plots are :mod:`esper.shell.telemetry.plots`'s, the summary and
:func:`~esper.shell.telemetry.report.write_report` :mod:`esper.shell.telemetry.report`'s; this module
is the command line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from esper.shell.common.cli import OneLineParser, describe
from esper.shell.telemetry.report import write_report


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m esper.shell.report", description="Plots and a markdown summary of an esper run."
    )
    parser.add_argument("run_dir", type=Path, help="run directory holding events.jsonl")
    args = parser.parse_args(argv)
    try:
        out = write_report(args.run_dir)
    except (OSError, ValueError) as e:  # a missing directory or log, a malformed log line, ...
        parser.error(describe(e))
    print(f"wrote {out} and {out.parent / 'plots'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
