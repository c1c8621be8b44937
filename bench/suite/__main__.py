"""``python -m bench.suite``: ``python -m esper.shell.suite``."""

from esper.shell.suite.cli import main

raise SystemExit(main())
