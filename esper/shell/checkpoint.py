"""Checkpoints: versioned, written atomically, loaded without unpickling code (finding P7).

A checkpoint is one ``torch.save`` file holding ``{"version": CHECKPOINT_VERSION, **payload}``. The
payload may contain only what ``torch.load(weights_only=True)`` accepts: tensors, ``str``/``bytes``,
``int``/``float``/``bool``/``complex``/``None``, ``torch.Size``/``dtype``/``device``, and ``dict``/
``OrderedDict``/``list``/``tuple``/``set`` of those: state dicts of modules and optimizers, TensorDicts as
``to_dict()``, configs as plain dicts, RNG states from :func:`rng_state`. :func:`save_checkpoint`
checks this before writing (naming the offending entry) so a run never writes a checkpoint it cannot
resume from; :func:`load_checkpoint` refuses anything else without executing it.

Writing goes to a temporary file in the target's directory, is fsynced, then ``os.replace``d over the
target: a crash or an error mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import tempfile
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: Bump when the layout of the payload changes; loading another version fails with a clear error.
CHECKPOINT_VERSION = 1

_LEAF_TYPES = (str, bytes, int, float, bool, complex, type(None), torch.Size, torch.dtype, torch.device)
_CONTAINERS = (dict, OrderedDict, list, tuple, set)


def save_checkpoint(path: str | os.PathLike, payload: Mapping[str, Any]) -> Path:
    """Write ``{"version": CHECKPOINT_VERSION, **payload}`` to ``path`` atomically; returns the path.

    Raises:
        TypeError: ``payload`` holds something ``weights_only`` loading would refuse (path named).
        ValueError: ``payload`` has its own ``"version"`` key.
    """
    path = Path(path)
    if "version" in payload:
        raise ValueError("save_checkpoint: 'version' is reserved (written by save_checkpoint)")
    _check_loadable(payload, "payload")
    obj = {"version": CHECKPOINT_VERSION, **payload}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def load_checkpoint(path: str | os.PathLike, *, map_location: Any = "cpu") -> dict[str, Any]:
    """The payload saved at ``path`` (without its ``"version"`` key), loaded with
    ``torch.load(weights_only=True)``.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is not a checkpoint, holds objects ``weights_only`` refuses (e.g. a
            pickled custom class: nothing is executed), or has a missing or different version.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"checkpoint {path} is not a torch checkpoint (not a zip archive; truncated or foreign?)"
        )
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"WeightsUnpickler error: (.*?)(?:\. Please|\n|$)", str(e))
        reason = found.group(1) if found else type(e).__name__
        raise ValueError(
            f"checkpoint {path} holds objects that torch.load(weights_only=True) refuses ({reason}); only "
            "tensors and plain containers are allowed, and arbitrary pickles are never executed"
        ) from None
    except (RuntimeError, EOFError) as e:
        raise ValueError(f"checkpoint {path} is corrupt or truncated: {e}") from e
    if not isinstance(obj, dict):
        raise ValueError(f"checkpoint {path} holds a {type(obj).__name__}, expected a dict")
    if "version" not in obj:
        raise ValueError(f"checkpoint {path} has no 'version' field; it was not written by save_checkpoint")
    version = obj.pop("version")
    if version != CHECKPOINT_VERSION:
        which = "newer" if isinstance(version, int) and version > CHECKPOINT_VERSION else "older or unknown"
        raise ValueError(
            f"checkpoint {path} has version {version!r} ({which}); this esper reads version "
            f"{CHECKPOINT_VERSION} only"
        )
    return obj


def _check_loadable(obj: Any, where: str) -> None:
    """Raise ``TypeError`` naming the first entry ``weights_only`` loading would refuse."""
    if isinstance(obj, torch.Tensor):
        if type(obj) not in (torch.Tensor, torch.nn.Parameter):
            raise TypeError(f"save_checkpoint: {where} is a tensor subclass {type(obj).__name__}")
        return
    if type(obj) in _LEAF_TYPES:
        return
    if type(obj) in _CONTAINERS:
        items = obj.items() if isinstance(obj, dict) else enumerate(obj)
        for k, v in items:
            if isinstance(obj, dict):
                _check_loadable(k, f"{where} key {k!r}")
            _check_loadable(v, f"{where}[{k!r}]")
        return
    hint = (
        " (convert numpy data with .tolist() or torch.as_tensor)" if type(obj).__module__ == "numpy" else ""
    )
    raise TypeError(
        f"save_checkpoint: {where} is a {type(obj).__module__}.{type(obj).__qualname__}, which "
        f"torch.load(weights_only=True) refuses{hint}; store tensors, primitives and plain containers"
    )


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable (POSIX); best effort elsewhere."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------------ RNG
def rng_state() -> dict[str, Any]:
    """Python ``random``, numpy's global RNG and torch's CPU (+ every CUDA device's) RNG state, in a
    form ``weights_only`` loading accepts (numpy's as plain ints)."""
    version, internal, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # noqa: NPY002 (the global RNG is the point)
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "numpy": {
            "name": str(name),
            "keys": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore the states captured by :func:`rng_state`."""
    py = state["python"]
    gauss = py["gauss_next"]
    random.setstate((int(py["version"]), tuple(int(x) for x in py["internal"]), gauss))
    npst = state["numpy"]
    np.random.set_state(  # noqa: NPY002
        (
            npst["name"],
            np.asarray(npst["keys"], dtype=np.uint32),
            int(npst["pos"]),
            int(npst["has_gauss"]),
            float(npst["cached_gaussian"]),
        )
    )
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state:
        if torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
        else:
            warnings.warn(
                "set_rng_state: the checkpoint's CUDA RNG states do not match this machine's devices; "
                "CUDA RNG not restored",
                stacklevel=2,
            )


__all__ = ["CHECKPOINT_VERSION", "load_checkpoint", "rng_state", "save_checkpoint", "set_rng_state"]
