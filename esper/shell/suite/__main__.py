"""``python -m esper.shell.suite``: see :mod:`esper.shell.suite`."""

from esper.shell.suite.cli import main

raise SystemExit(main())
