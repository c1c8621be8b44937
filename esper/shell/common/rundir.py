"""One process per run directory, and stop signals that wait for a safe point.

:class:`RunDirLock` holds an exclusive ``fcntl.flock`` on ``RUN_DIR/.lock`` for as long as a run uses
the directory. The operating system drops the lock when the process ends, however it ends (``kill
-9`` included), so a crashed run never leaves the directory locked; a second run of the same
directory (the same ``--name``, or a ``--resume`` while it runs) is refused at once with the holder's
pid. Without ``fcntl`` (Windows) the lock is a no-op.

:class:`StopSignals` turns SIGTERM (what schedulers send) into the same ``KeyboardInterrupt`` as
Ctrl-C, and can hold both back while a checkpoint is being written (:meth:`StopSignals.deferred`):
the interrupt is raised when the write is done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".lock"


class RunDirBusy(RuntimeError):
    """Another process holds the run directory."""


class RunDirLock:
    """Exclusive lock of ``run_dir`` (which must exist); use as a context manager.

    Raises:
        RunDirBusy: another process (or another lock in this one) holds it.
    """

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunDirLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise RunDirBusy(
                    f"run directory {self.path.parent} is in use by another esper process (pid {holder}); "
                    "wait for it to finish, or use another --name"
                ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> RunDirLock:
        return self.acquire() if self._fd is None else self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would raise ``KeyboardInterrupt``."""


class StopSignals:
    """While active (a context manager, main thread only; elsewhere it does nothing): SIGINT raises
    ``KeyboardInterrupt`` and SIGTERM :class:`Terminated`, except inside :meth:`deferred`, where the
    first one is remembered and raised when the block ends. The previous handlers come back on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self._previous: dict[int, object] = {}
        self._deferring = 0
        self._pending: int | None = None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._deferring:
            self._pending = self._pending or signum
            return
        _raise(signum)

    @contextlib.contextmanager
    def deferred(self, *, drop: bool = False) -> Iterator[None]:
        """Hold SIGINT/SIGTERM back until the block ends (a checkpoint write is never cut short), then
        raise the first one that arrived, or with ``drop`` forget it (the run is stopping anyway)."""
        self._deferring += 1
        try:
            yield
        finally:  # a signal that arrived while the block failed is dropped: the error stops the run
            self._deferring -= 1
            signum = None if self._deferring else self._pending
            if signum is not None:
                self._pending = None
        if signum is not None and not drop:
            _raise(signum)


def _raise(signum: int) -> None:
    if signum == signal.SIGTERM:
        raise Terminated(f"signal {signum} (SIGTERM)")
    raise KeyboardInterrupt


__all__ = ["LOCK_FILE", "RunDirBusy", "RunDirLock", "StopSignals", "Terminated"]
