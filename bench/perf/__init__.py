"""Benchmark suites. Importing this package registers them; add a module and import it here to add a
suite (see ``bench.harness.suite``; its ``order`` places it in the default run)."""

from bench.perf import compile, cuda_graphs, episode, gae, hosts, loss, update  # noqa: F401
