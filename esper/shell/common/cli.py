"""The command-line convention of every ``python -m esper.shell.*`` tool: an error is one line on
stderr, ``PROG: error: WHAT (see PROG --help)``, and a non-zero exit status, never a traceback and
never the whole usage text. Bugs are the exception: an unexpected exception still shows its traceback.

Exit statuses: 2 for a request refused before anything was changed (bad option or value, missing or
corrupt input, a device this machine lacks, a run directory in use), 3 for a run that started and had
to stop (non-finite training, disk full; its last checkpoint is intact), 130 / 143 for Ctrl-C / SIGTERM
(a checkpoint of the last finished update was written).
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

#: Exit status of a request refused before anything was changed.
REFUSED = 2
#: Exit status of a run that started and could not continue.
STOPPED = 3


class CliError(Exception):
    """A failure the user can act on: printed as one line, exits with ``status``."""

    def __init__(self, message: str, status: int = REFUSED) -> None:
        super().__init__(message)
        self.status = status


class OneLineParser(argparse.ArgumentParser):
    """``argparse`` whose errors are one line with a hint to ``--help`` instead of the usage text."""

    def error(self, message: str) -> NoReturn:
        self.exit(REFUSED, error_line(self.prog, message) + "\n")


def error_line(prog: str, message: str) -> str:
    """``PROG: error: MESSAGE (see PROG --help)``, on one line whatever ``message`` holds."""
    text = " ".join(str(message).split())
    return f"{prog}: error: {text} (see {prog} --help)"


def report(prog: str, err: BaseException, status: int = REFUSED) -> int:
    """Print ``err`` as the one-line error of ``prog``; returns the exit status to use."""
    print(error_line(prog, describe(err)), file=sys.stderr)
    return err.status if isinstance(err, CliError) else status


def describe(err: BaseException) -> str:
    """A one-line description of an expected failure (an ``OSError`` names its file and reason)."""
    if isinstance(err, OSError) and err.strerror:
        where = f" {err.filename}" if err.filename else ""
        return f"cannot access{where}: {err.strerror}"
    return str(err) or type(err).__name__


def repeat_line(seed: int, threads: int) -> str:
    """How to repeat a run's or an evaluation's numbers: its seed and its torch thread count. The
    threads belong to it because another count splits the host ops' float sums differently, and SGD
    on a small host amplifies those last bits (a static host on the default's held-out seeds: 44.7 % at
    one thread, 44.5 % at two)."""
    return (
        f"to repeat these numbers: --seed {seed} --threads {threads} (the torch threads used; another "
        "count, or another CPU's kernels, trains the hosts to different numbers)"
    )


__all__ = [
    "REFUSED",
    "STOPPED",
    "CliError",
    "OneLineParser",
    "describe",
    "error_line",
    "repeat_line",
    "report",
]
