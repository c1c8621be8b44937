"""Esper's benchmarks: ``python -m bench.run`` (see ``bench/run.py``)."""
