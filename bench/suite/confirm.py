"""``python -m bench.suite.confirm``: ``python -m esper.shell.suite.confirm``."""

from esper.shell.suite.confirm import main

if __name__ == "__main__":
    raise SystemExit(main())
