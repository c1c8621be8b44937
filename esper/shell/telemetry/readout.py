"""Reading metrics TensorDicts on the host: one device-to-host transfer per report (finding M14).

Core functions return metrics as tensors (loss terms, gradient and LSTM health, ...). The shell reads
a whole report with :func:`read_scalars`, which packs every leaf into one float64 vector on the
metrics' device and moves it to the host once, instead of one ``.item()`` (one sync) per number.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase


def read_scalars(td: TensorDictBase) -> dict[str, float | list[float]]:
    """Every tensor leaf of ``td`` as Python floats, keyed by its "/"-joined key path.

    0-dim leaves become a float, other leaves a flat list of floats in row-major order. Any device and
    dtype (bool and integer leaves read as 0.0/1.0 and exact small integers). Leaves on several devices
    are gathered on the first leaf's device before the single transfer.

    Raises:
        TypeError: a leaf is not a tensor (non-tensor data has no place in a metrics TensorDict).
    """
    keys, leaves = [], []
    for key, value in td.items(include_nested=True, leaves_only=True):
        name = key if isinstance(key, str) else "/".join(key)
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"read_scalars: leaf {name!r} is a {type(value).__name__}, not a tensor")
        keys.append(name)
        leaves.append(value)
    if not leaves:
        return {}
    device = leaves[0].device
    dtype = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
    flat = torch.cat([x.detach().reshape(-1).to(device=device, dtype=dtype) for x in leaves])
    values = flat.tolist()  # sync point: the one device-to-host transfer of the report
    out: dict[str, float | list[float]] = {}
    start = 0
    for name, x in zip(keys, leaves):
        n = x.numel()
        out[name] = values[start] if x.dim() == 0 else values[start : start + n]
        start += n
    return out


__all__ = ["read_scalars"]
