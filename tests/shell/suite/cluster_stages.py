"""Small stages for the engine's tests on a local cluster (``test_cluster.py``): a module of its own that
imports little, so that each worker that unpickles them starts fast."""

from __future__ import annotations

from pathlib import Path


def where(_k: int) -> tuple[str, str, int, set[str]]:
    """A stage that says where it ran: its worker's and scheduler's addresses, its torch threads, and the
    addresses its process, its nanny and the process that started the cluster listen on."""
    import distributed
    import psutil
    import torch

    w = distributed.get_worker()
    me = psutil.Process()
    family = [me, *me.parents()[:2]]  # the worker, its nanny, the cluster's process (its scheduler)
    ips = {c.laddr.ip for p in family for c in p.net_connections(kind="inet")
           if c.status == psutil.CONN_LISTEN}  # fmt: skip
    return w.address, w.scheduler.address, torch.get_num_threads(), ips


def flaky(marker: str, value: int, *after: int) -> int:
    """Raises the first time (leaving ``marker``), returns ``value + sum(after)`` the next."""
    if not Path(marker).exists():
        Path(marker).write_text("tried")
        raise OSError("a stage that fails once")
    return value + sum(after)
