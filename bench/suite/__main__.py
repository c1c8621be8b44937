"""``python -m bench.suite``: ``python -m esper.shell.suite``."""

from esper.shell.suite.cli import main

if __name__ == "__main__":  # not again in a process the local cluster spawns
    raise SystemExit(main())
