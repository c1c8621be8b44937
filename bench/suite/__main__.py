"""``python -m bench.suite``: see :mod:`bench.suite`."""

from bench.suite.cli import main

raise SystemExit(main())
