"""Where the suite's stages run: in this process one after another, or as tasks of a Dask cluster.

A suite run is a graph of **stages** (:class:`Stage`): per (task, training seed) its training, each search
of a baseline that searches, and its evaluation, each stage after those it reads. :meth:`Engine.run` runs
them and returns each stage's result by its key.

- ``Engine(workers=0)``: in this process, in order (for debugging, and the path the tests compare the
  cluster's against).
- ``Engine(workers=N)``: a local Dask cluster (``distributed.LocalCluster``) of ``N`` worker processes of
  one thread each, every server bound to 127.0.0.1 (the scheduler's HTTP server on a free port there),
  started for the run and closed after it.
- ``Engine(scheduler="tcp://HOST:PORT")`` (or the path of a scheduler file, as ``dask scheduler
  --scheduler-file`` writes it): an existing cluster's workers (``dask worker ADDRESS --nthreads 1``).

On a cluster each stage is one task on one worker, with torch's threads set to one
(:func:`call_stage`), its subprocesses set to one thread by the stage's flags. A stage whose worker dies
is run again elsewhere (the scheduler reschedules what a dead worker held; an exception is retried
:data:`RETRIES` times): every stage goes on from what its run directory holds (a training from its
checkpoint, a search from its cache, an evaluation kept once written: :mod:`esper.shell.suite.launch`), so
a stage run again, or a finished stage computed again because the worker that held its result died,
finds its work done and repeats nothing. Results stream back as they finish
(``distributed.as_completed``) under one progress bar, and each key is taken once. Every path a stage is
handed is absolute, so the run directories must be on storage every worker and this process read and
write at the same path (docs/suite.md, "Running the protocol on a cluster").

``distributed`` is an optional dependency (``pip install -e ".[cluster]"``), imported only when a cluster
is asked for.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from esper.shell.telemetry.console import progress

#: How many times a stage that raised is run again before the suite stops (a worker's death is the
#: scheduler's to reschedule: ``distributed.scheduler.allowed-failures``).
RETRIES = 2
#: What a missing ``distributed`` says.
MISSING = 'the suite on a cluster needs distributed: pip install -e ".[cluster]" (or --workers 0)'


@dataclass(frozen=True)
class Stage:
    """One unit of work: ``fn(*args, *results of after)``. ``fn`` is a module-level function (a worker
    imports it by name); ``after`` names the stages it reads (or waits for), each before it in the list."""

    key: str
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    after: tuple[str, ...] = ()


def call_stage(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with torch's intra-op threads at one (the stage's CPU), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(before)


def distributed_module():
    """``distributed``, or a one-line error naming the extra that installs it."""
    try:
        import distributed
    except ImportError:
        raise RuntimeError(MISSING) from None
    return distributed


def check_order(stages: Sequence[Stage]) -> None:
    """Refuse (ValueError) a key given twice or a stage after one not before it."""
    seen: set[str] = set()
    for s in stages:
        if s.key in seen:
            raise ValueError(f"stage {s.key!r} given twice")
        if missing := [a for a in s.after if a not in seen]:
            raise ValueError(f"stage {s.key!r} reads {missing}, not before it")
        seen.add(s.key)


@dataclass
class Engine:
    """Runs stages: ``workers=0`` in this process; else on Dask (``scheduler``'s cluster, or a local one of
    ``workers`` processes). ``done(key, result)`` is called as each stage's result comes back."""

    workers: int = 0
    scheduler: str | None = None
    show_progress: bool = True
    done: Callable[[str, Any], None] | None = None
    retries: int = RETRIES
    local: dict[str, Any] = field(default_factory=dict)  # LocalCluster's extra arguments (tests)

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise ValueError(f"--workers must be >= 0, got {self.workers}")

    @property
    def where(self) -> str:
        """In words: where the stages run."""
        if self.scheduler is not None:
            return f"the cluster at {self.scheduler}"
        return "this process" if self.workers == 0 else f"a local cluster of {self.workers} workers"

    def run(self, stages: Sequence[Stage], desc: str = "suite") -> dict[str, Any]:
        """Every stage's result, by key."""
        check_order(stages)
        if self.scheduler is None and self.workers == 0:
            return self._in_process(stages, desc)
        return self._on_cluster(stages, desc)

    def _finished(self, bar, results: dict[str, Any], key: str, value: Any) -> None:
        if key in results:  # a result is taken once, however often its stage ran
            raise RuntimeError(f"stage {key!r} came back twice")
        results[key] = value
        bar.update(1)
        bar.set_postfix_str(key, refresh=False)
        if self.done is not None:
            self.done(key, value)

    def _in_process(self, stages: Sequence[Stage], desc: str) -> dict[str, Any]:
        results: dict[str, Any] = {}
        with progress(len(stages), desc=desc, enabled=self.show_progress) as bar:
            for s in stages:
                value = call_stage(s.fn, *s.args, *(results[a] for a in s.after))
                self._finished(bar, results, s.key, value)
        return results

    def _on_cluster(self, stages: Sequence[Stage], desc: str) -> dict[str, Any]:
        dist = distributed_module()
        results: dict[str, Any] = {}
        run = uuid.uuid4().hex[:8]  # this run's keys: another client's stages are not this one's
        with self._client(dist) as client:
            futures: dict[str, Any] = {}
            for s in stages:
                deps = [futures[a] for a in s.after]
                futures[s.key] = client.submit(call_stage, s.fn, *s.args, *deps, key=f"{s.key} [{run}]",
                                               retries=self.retries, pure=False)  # fmt: skip
            key_of = {f.key: k for k, f in futures.items()}
            with progress(len(stages), desc=desc, enabled=self.show_progress) as bar:
                try:
                    for fut in dist.as_completed(list(futures.values())):
                        key = key_of[fut.key]
                        if fut.status != "finished":
                            raise RuntimeError(f"stage {key!r} failed: {fut.exception()!r}")
                        self._finished(bar, results, key, fut.result())
                finally:
                    client.cancel(list(futures.values()))
        return results

    @contextlib.contextmanager
    def _client(self, dist) -> Iterator[Any]:
        if self.scheduler is not None:
            file = Path(self.scheduler)
            if not self.scheduler.startswith(("tcp://", "tls://", "inproc://")) and file.is_file():
                with dist.Client(scheduler_file=str(file)) as client:
                    yield client
            else:
                with dist.Client(self.scheduler) as client:
                    yield client
            return
        # the scheduler's HTTP server (health, metrics; the dashboard where bokeh is installed) serves even
        # without a dashboard: a free port on the loopback, as every other server here
        kwargs = {"n_workers": self.workers, "threads_per_worker": 1, "processes": True,
                  "host": "127.0.0.1", "dashboard_address": "127.0.0.1:0", "silence_logs": logging.ERROR,
                  **self.local}  # fmt: skip
        with dist.LocalCluster(**kwargs) as cluster, dist.Client(cluster) as client:
            yield client


__all__ = ["MISSING", "RETRIES", "Engine", "Stage", "call_stage", "check_order", "distributed_module"]
