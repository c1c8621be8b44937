"""``python -m esper.shell.suite.child PARENT_PID MODULE [ARGS...]``: run ``python -m MODULE ARGS...`` in
this process, made to die with the process that started it.

Every suite stage runs its training, search or evaluation as a subprocess (:mod:`esper.shell.suite.launch`).
On a cluster the process that started it is a Dask worker; when that worker is killed (SIGKILL, a node
lost), an ordinary child would go on running, writing into the run directory while the stage is retried
elsewhere. So the child first asks the kernel to send it SIGKILL when its parent dies (Linux's
``prctl(PR_SET_PDEATHSIG)``; elsewhere nothing is asked) and checks that the parent it was started by is
still its parent (it may have died before the request), then runs the module as ``__main__``
(:func:`runpy.run_module`), in this interpreter: its output, exit status and files are the module's own.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys

#: ``prctl``'s option that sets the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def die_with_parent() -> bool:
    """Ask for SIGKILL when this process's parent dies; whether it was asked (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) == 0
    except (OSError, AttributeError):
        return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python -m esper.shell.suite.child PARENT_PID MODULE [ARGS...]", file=sys.stderr)
        return 2
    parent, module, args = int(argv[0]), argv[1], argv[2:]
    if die_with_parent() and os.getppid() != parent:  # the parent died before the request: go too
        return 1
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)  # a module ends in sys.exit: its status
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
