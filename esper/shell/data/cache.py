"""A disk cache for generated data: a draw that takes seconds to make is made once per machine.

MNIST-1D's generator is pure Python per sample (3-7 s for the default's 6,000 samples on the 2-core
VM), and every process that reads a draw paid it: each run, each evaluation, each end-to-end test.
:func:`cached_tensors` keeps the tensors a generator returns in one file per key, under
:func:`cache_dir`, and serves them back bit for bit.

- **Where:** ``$ESPER_CACHE_DIR``, else ``$XDG_CACHE_HOME/esper``, else ``~/.cache/esper``.
  ``ESPER_CACHE_DIR=off`` (or ``0``, ``none``, empty) turns the cache off: every draw is generated.
- **Keys** name everything the tensors depend on (the caller's job: the generator's arguments and
  the versions of the packages that compute them), so a changed input is a new file, never a stale one.
- **Integrity:** a file holds its tensors' SHA-256; one that fails to load or to match is made again and
  rewritten. Files are written to a temporary name and renamed, so processes that fill the same key at
  once each see a whole file or none.
- **Never fatal:** a cache folder that cannot be written leaves the data generated, as without a cache.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

import torch

#: The environment variable naming the cache folder (or turning the cache off).
ENV = "ESPER_CACHE_DIR"
_OFF = {"", "0", "off", "none", "false"}
_FORMAT = 1


def cache_dir() -> Path | None:
    """The cache folder, or None when ``$ESPER_CACHE_DIR`` turns the cache off."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in _OFF else Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except RuntimeError:  # no home folder to be found: no cache
            return None
    return Path(base) / "esper"


def digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the tensors' names, dtypes, shapes and bytes (in name order)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def cached_tensors(key: str, make: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``make()``'s tensors, from the cache when a whole, matching file holds ``key``; else made, kept
    for the next process, and returned. ``key`` is a file name stem: letters, digits, ``.``, ``-``, ``_``."""
    if not key or not all(c.isalnum() or c in "._-" for c in key):
        raise ValueError(f"cache key {key!r}: letters, digits, '.', '-' and '_' only")
    root = cache_dir()
    if root is None:
        return make()
    path = root / f"{key}.pt"
    kept = _load(path)
    if kept is not None:
        return kept
    tensors = make()
    _store(path, tensors)
    return tensors


def _load(path: Path) -> dict[str, torch.Tensor] | None:
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # missing, truncated or not ours: made again
        return None
    if not isinstance(blob, dict) or blob.get("format") != _FORMAT:
        return None
    tensors = blob.get("tensors")
    if not isinstance(tensors, dict) or blob.get("sha256") != digest(tensors):
        return None
    return tensors


def _store(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # one writer each
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"format": _FORMAT, "sha256": digest(tensors), "tensors": tensors}, tmp)
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
