"""``python -m bench.growth``: see :mod:`bench.growth`."""

from bench.growth.cli import main

raise SystemExit(main())
