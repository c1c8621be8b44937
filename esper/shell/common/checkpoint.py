"""Checkpoints: versioned, written atomically, verified on load, loaded without unpickling code
(finding P7).

A checkpoint file is one header line, ``ESPER-CHECKPOINT 3 sha256=HEX``, followed by the ``torch.save``
serialization of the payload; ``HEX`` is the SHA-256 of those bytes. Loading checks the header and the
hash before it unpickles anything, so a flipped byte anywhere in the file is refused with one line
instead of training on damaged weights. Files of version 1 (a plain ``torch.save`` of ``{"version": 1,
**payload}``, no hash) still load, unverified, with a warning.

A run's payload (:mod:`esper.shell.runtime.training`) holds ``agent`` (the policy's weights and the
observation statistics: what a controller needs to act) and ``learner`` (the optimizer, the reward
statistics, the update count, the minibatch generator and the kept rollouts: what resuming training
needs). Versions 1 and 2 held both in one ``trainer`` entry; :func:`load_checkpoint` splits it
(:func:`upgrade_payload`), so every reader sees the current layout.

The payload may contain only what ``torch.load(weights_only=True)`` accepts: tensors, ``str``/``bytes``,
``int``/``float``/``bool``/``complex``/``None``, ``torch.Size``/``dtype``/``device``, and ``dict``/
``OrderedDict``/``list``/``tuple``/``set`` of those: state dicts of modules and optimizers, TensorDicts as
``to_dict()``, configs as plain dicts, RNG states from :func:`rng_state`. :func:`save_checkpoint`
checks this before writing (naming the offending entry) so a run never writes a checkpoint it cannot
resume from, and it refuses a floating tensor holding NaN or Inf (a run resumed from it could only
fail); :func:`load_checkpoint` refuses anything else without executing it.

Writing serializes in memory, writes a temporary file in the target's directory, fsyncs it, then
``os.replace``s it over the target: a crash (``kill -9`` included) or an error mid-write (a full disk
raises ``OSError`` ``ENOSPC``) leaves the previous checkpoint intact. A temporary file a killed process
left behind is removed by :func:`remove_stale_temporaries`.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import random
import re
import tempfile
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: Bump when the layout of the file or of a run's payload changes; loading an unknown version fails with
#: a clear error. 3: ``agent`` and ``learner`` entries (2: one ``trainer`` entry; 1: no header, no hash).
CHECKPOINT_VERSION = 3
#: Versions with the header and hash of this module (2 upgraded on load, :func:`upgrade_payload`).
_HASHED_VERSIONS = (2, CHECKPOINT_VERSION)
#: The entries of version 2's ``trainer`` that are the agent's; the rest are the learner's.
_AGENT_ENTRIES = ("policy", "obs_stats")
#: The layout before the integrity hash: a plain ``torch.save`` of ``{"version": 1, **payload}``.
_UNHASHED_VERSION = 1
_MAGIC = b"ESPER-CHECKPOINT "
_HEADER = re.compile(rb"ESPER-CHECKPOINT (\d{1,6}) sha256=([0-9a-f]{64})\n")

_LEAF_TYPES = (str, bytes, int, float, bool, complex, type(None), torch.Size, torch.dtype, torch.device)
_CONTAINERS = (dict, OrderedDict, list, tuple, set)


def save_checkpoint(path: str | os.PathLike, payload: Mapping[str, Any]) -> Path:
    """Write ``payload`` to ``path`` atomically, behind a header with its version and SHA-256;
    returns the path.

    Raises:
        TypeError: ``payload`` holds something ``weights_only`` loading would refuse (path named).
        FloatingPointError: a floating tensor of ``payload`` holds NaN or Inf (path named).
        ValueError: ``payload`` has its own ``"version"`` key.
        OSError: the file could not be written (e.g. ``ENOSPC``); the previous file is intact.
    """
    path = Path(path)
    if "version" in payload:
        raise ValueError("save_checkpoint: 'version' is reserved (written by save_checkpoint)")
    _check_loadable(payload, "payload")
    _check_finite(payload)
    body = io.BytesIO()
    torch.save(dict(payload), body)
    data = body.getbuffer()
    header = _MAGIC + f"{CHECKPOINT_VERSION} sha256={hashlib.sha256(data).hexdigest()}\n".encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            _write_all(f, header)
            _write_all(f, data)
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


def _write_all(f: Any, data: bytes | memoryview) -> None:
    """Write ``data`` to the open file ``f`` (its own function so tests can fill the disk)."""
    f.write(data)


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporary files an interrupted :func:`save_checkpoint` of ``path`` left behind (a
    process killed between creating and renaming one); returns them. Call it only while no other
    process writes ``path`` (under the run directory's lock)."""
    path = Path(path)
    stale = sorted(path.parent.glob(f".{path.name}.*.tmp"))
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def load_checkpoint(path: str | os.PathLike, *, map_location: Any = "cpu") -> dict[str, Any]:
    """The payload saved at ``path``, verified against its SHA-256, then loaded with
    ``torch.load(weights_only=True)``.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is not a checkpoint, is damaged (hash mismatch, truncated), holds objects
            ``weights_only`` refuses (e.g. a pickled custom class: nothing is executed), or has a
            missing or unknown version.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    raw = path.read_bytes()
    if not raw.startswith(_MAGIC):
        return _load_unhashed(path, raw, map_location)
    header = _HEADER.match(raw, 0, 128)
    if header is None:
        raise ValueError(f"checkpoint {path} is damaged: its header line is unreadable")
    version, digest = int(header.group(1)), header.group(2).decode()
    if version not in _HASHED_VERSIONS:
        _refuse_version(path, version)
    body = memoryview(raw)[header.end() :]
    if hashlib.sha256(body).hexdigest() != digest:
        raise ValueError(
            f"checkpoint {path} is damaged (truncated or altered): its content does not match the sha256 "
            "in its header; refused"
        )
    return upgrade_payload(_load(io.BytesIO(body), path, map_location), version)


def upgrade_payload(payload: dict[str, Any], version: int) -> dict[str, Any]:
    """``payload``, of a checkpoint of ``version``, in the current layout (in place; returned): a
    ``trainer`` entry of versions 1 and 2 becomes ``agent`` (its ``policy`` and ``obs_stats``) and
    ``learner`` (the rest). A payload of the current version, or without ``trainer``, is unchanged."""
    if version < 3 and isinstance(payload.get("trainer"), dict):
        old = payload.pop("trainer")
        payload["agent"] = {k: v for k, v in old.items() if k in _AGENT_ENTRIES}
        payload["learner"] = {k: v for k, v in old.items() if k not in _AGENT_ENTRIES}
    return payload


def _load_unhashed(path: Path, raw: bytes, map_location: Any) -> dict[str, Any]:
    """A version-1 file: a plain ``torch.save`` of ``{"version": 1, **payload}``."""
    if not raw.startswith(b"PK"):
        raise ValueError(
            f"checkpoint {path} is not a torch checkpoint (no esper header, not a zip archive; truncated "
            "or foreign?)"
        )
    obj = _load(io.BytesIO(raw), path, map_location)
    if "version" not in obj:
        raise ValueError(f"checkpoint {path} has no 'version' field; it was not written by save_checkpoint")
    version = obj.pop("version")
    if version != _UNHASHED_VERSION:
        _refuse_version(path, version)
    warnings.warn(f"checkpoint {path} has version 1 (no integrity hash); loaded unverified", stacklevel=3)
    return upgrade_payload(obj, _UNHASHED_VERSION)


def _refuse_version(path: Path, version: Any) -> None:
    which = "newer" if isinstance(version, int) and version > CHECKPOINT_VERSION else "older or unknown"
    raise ValueError(
        f"checkpoint {path} has version {version!r} ({which}); this esper reads versions "
        f"{_UNHASHED_VERSION} to {CHECKPOINT_VERSION}"
    )


def _load(source: Any, path: Path, map_location: Any) -> dict[str, Any]:
    """``torch.load(weights_only=True)`` of a checkpoint's body, which must be a dict; one-line errors."""
    try:
        obj = torch.load(source, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"WeightsUnpickler error: (.*?)(?:\. Please|\n|$)", str(e))
        reason = found.group(1) if found else type(e).__name__
        raise ValueError(
            f"checkpoint {path} holds objects that torch.load(weights_only=True) refuses ({reason}); only "
            "tensors and plain containers are allowed, and arbitrary pickles are never executed"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        raise ValueError(f"checkpoint {path} is corrupt or truncated: {' '.join(str(e).split())}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"checkpoint {path} holds a {type(obj).__name__}, expected a dict")
    return obj


def _tensors(obj: Any, where: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        yield where, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{where}[{k!r}]")
    elif isinstance(obj, (list, tuple, set)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{where}[{i}]")


def _check_finite(payload: Mapping[str, Any]) -> None:
    """Raise ``FloatingPointError`` naming the first floating tensor with a NaN or Inf (a host read per
    tensor: checkpoints are rare)."""
    tensors = _tensors(dict(payload), "payload")
    floats = [(w, t) for w, t in tensors if t.is_floating_point() or t.is_complex()]
    if not floats:
        return
    flags = torch.cat([torch.isfinite(t.detach()).all().reshape(1).cpu() for _, t in floats])
    if not bool(flags.all()):
        where = floats[int((~flags).nonzero()[0])][0]
        raise FloatingPointError(
            f"save_checkpoint: {where} holds NaN or Inf; refusing to write a checkpoint that cannot be "
            "resumed"
        )


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


__all__ = [
    "CHECKPOINT_VERSION",
    "load_checkpoint",
    "remove_stale_temporaries",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "upgrade_payload",
]
