"""Input checks shared by the core functions.

They look only at metadata (key presence, shape, dtype), so under ``torch.compile`` they run at
trace time and add nothing to the graph; a bad input fails with the same message compiled or not.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from esper.core.spec import NestedKey


def key_str(key: NestedKey) -> str:
    return repr(key) if isinstance(key, str) else repr(tuple(key))


def require(td: TensorDictBase, key: NestedKey, *, where: str) -> torch.Tensor:
    """``td[key]``, or a KeyError naming the key and the keys that are there."""
    if key not in td.keys(include_nested=True):
        present = sorted(key_str(k) for k in td.keys(include_nested=True, leaves_only=True))
        raise KeyError(f"{where}: missing key {key_str(key)}; the TensorDict has {', '.join(present)}")
    return td[key]


def per_step(
    td: TensorDictBase, key: NestedKey, *, where: str, kind: str, batch_shape: torch.Size | None = None
) -> torch.Tensor:
    """A per-step scalar of shape ``batch_shape`` or ``[*batch_shape, 1]`` (TorchRL's trailing 1),
    returned as ``batch_shape``. ``kind``: "float", "bool", "int" or "one_hot" (checked)."""
    x = require(td, key, where=where)
    shape = td.batch_size if batch_shape is None else batch_shape
    if x.shape == (*shape, 1):
        x = x.squeeze(-1)
    if x.shape != shape:
        raise ValueError(
            f"{where}: {key_str(key)} must have shape {list(shape)} or {[*shape, 1]} "
            f"(the TensorDict's batch size), got {list(x.shape)}"
        )
    check_kind(x, key, kind=kind, where=where)
    return x


_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def check_kind(x: torch.Tensor, key: NestedKey, *, kind: str, where: str) -> None:
    ok = {
        "float": x.is_floating_point(),
        "bool": x.dtype == torch.bool,
        "int": x.dtype in _INT_DTYPES,
        "one_hot": x.dtype in _INT_DTYPES or x.dtype == torch.bool,
    }[kind]
    if not ok:
        wanted = {
            "float": "a floating dtype",
            "bool": "torch.bool",
            "int": "an integer dtype",
            "one_hot": "an integer dtype or torch.bool (one-hot)",
        }[kind]
        raise TypeError(f"{where}: {key_str(key)} must be {wanted}, got {x.dtype}")


def check_unit_interval(name: str, value: float, *, where: str) -> None:
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{where}: {name} must be in [0, 1], got {value}")
