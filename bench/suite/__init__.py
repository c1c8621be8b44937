"""``python -m bench.suite``: an alias of ``python -m esper.shell.suite`` (:mod:`esper.shell.suite`)."""
