"""Running statistics as a TensorDict in, TensorDict out (observation and reward normalization).

A stats TensorDict (batch size ``[]``) holds ``mean [*S]``, ``var [*S]`` (population variance) and
``count`` (float64 scalar: samples seen). :func:`update_running_stats` merges a batch into it exactly
(Chan et al.'s parallel Welford merge, in float64) or as an exponential moving average;
:func:`normalize` and :func:`scale` apply it. The merge is its own function
(:func:`merge_running_stats`, of two stats TensorDicts, with :func:`batch_stats` giving a batch's):
processes that each hold part of a batch merge their parts' statistics with it.

Thread and stream use (finding H13). Every function here is pure: it reads its arguments and returns
new tensors, with no module state, no caches and no in-place writes to its inputs. Any thread or CUDA
stream may therefore call them concurrently on the same stats TensorDict. The caller owns exactly one
stats TensorDict and *replaces* it with the returned one (``stats = update_running_stats(stats, x)``);
when the update runs on a side stream, the usual rule applies to the reference it hands over: record
an event after the update and make the consumer's stream wait on it before reading the new stats.

Order (finding C5): the shell updates the observation statistics from a collected batch *before* the
PPO update, and stores the normalized observation the policy acted on.
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict, TensorDictBase

from esper.core.checks import check_kind, require
from esper.core.distributions import compute_dtype

_F64 = torch.float64


def running_stats(
    shape: tuple[int, ...] | torch.Size | int,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> TensorDict:
    """Empty statistics for samples of shape ``shape``: ``mean`` zeros, ``var`` ones (``dtype``) and
    ``count`` a float64 0; batch size ``[]``."""
    if not dtype.is_floating_point:
        raise TypeError(f"running_stats: dtype must be floating, got {dtype}")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return TensorDict(
        {
            "mean": torch.zeros(shape, dtype=dtype, device=device),
            "var": torch.ones(shape, dtype=dtype, device=device),
            "count": torch.zeros((), dtype=_F64, device=device),
        },
        batch_size=[],
        device=device,
    )


def update_running_stats(
    stats: TensorDictBase,
    x: torch.Tensor,
    *,
    valid: torch.Tensor | None = None,
    momentum: float | None = None,
) -> TensorDict:
    """Statistics after seeing the batch ``x``; a NEW TensorDict (``stats`` is not touched).

    Args:
        stats: from :func:`running_stats` (``mean``/``var`` of shape ``[*S]``, ``count``).
        x: floating ``[*L, *S]``; the leading dims ``[*L]`` are reduced.
        valid: optional bool ``[*L]``; False samples are ignored.
        momentum: None for the exact merge; ``m`` in ``[0, 1]`` for an EMA,
            ``mean <- m mean + (1-m) batch_mean``, ``var <- m var + (1-m) batch_var + m (1-m)
            (batch_mean - mean)^2``. While ``count`` is 0 the EMA takes the batch statistics (so the
            initial zeros/ones do not linger). ``count`` accumulates in both modes.

    Exact mode: with a running count of 0 the result is the batch statistics; a batch with no valid
    sample leaves every field unchanged. All math in float64, results in the stats' dtype; no branch
    on tensor values.
    """
    where = "update_running_stats"
    mean = _fields(stats, where)[0]
    check_kind(x, "x", kind="float", where=where)
    n_s = mean.dim()
    if x.dim() < n_s or x.shape[x.dim() - n_s :] != mean.shape:
        raise ValueError(
            f"{where}: x must have shape [*L, {', '.join(map(str, mean.shape))}] (trailing dims = the "
            f"stats' shape {list(mean.shape)}), got {list(x.shape)}"
        )
    if momentum is not None and not 0.0 <= momentum <= 1.0:
        raise ValueError(f"{where}: momentum must be None or in [0, 1], got {momentum}")
    return merge_running_stats(stats, batch_stats(x, n_s, valid=valid, where=where), momentum=momentum)


def batch_stats(
    x: torch.Tensor, n_sample_dims: int, *, valid: torch.Tensor | None = None, where: str = "batch_stats"
) -> TensorDict:
    """The statistics of the batch ``x`` alone (float64 ``mean``/``var`` of shape ``x.shape[-n:]``,
    ``count``): what :func:`update_running_stats` merges in, and what processes that each hold a part
    of one batch exchange before merging the parts with :func:`merge_running_stats` (in float64, the
    merge of the parts equals the statistics of the whole to rounding). ``valid`` as in
    :func:`update_running_stats`; with no valid sample, ``count`` is 0 and ``mean``/``var`` are 0."""
    n_s = n_sample_dims
    lead = x.shape[: x.dim() - n_s]
    shape = x.shape[x.dim() - n_s :]
    xf = x.to(_F64).reshape(math.prod(lead), *shape)  # [N, *S]
    if valid is None:
        w = torch.ones(xf.shape[0], dtype=_F64, device=x.device)
    else:
        check_kind(valid, "valid", kind="bool", where=where)
        if valid.shape != lead:
            raise ValueError(
                f"{where}: valid must have x's leading shape {list(lead)}, got {list(valid.shape)}"
            )
        w = valid.reshape(-1).to(_F64)
    w = w.reshape(-1, *([1] * n_s))  # [N, 1, ...] against [N, *S]
    n_b = w.sum()
    b_mean = (xf * w).sum(0) / n_b.clamp(min=1.0)
    b_var = ((xf - b_mean).square() * w).sum(0) / n_b.clamp(min=1.0)
    return TensorDict({"mean": b_mean, "var": b_var, "count": n_b}, batch_size=[], device=x.device)


def merge_running_stats(
    stats: TensorDictBase, batch: TensorDictBase, *, momentum: float | None = None
) -> TensorDict:
    """``stats`` after merging in ``batch`` (another stats TensorDict, e.g. from :func:`batch_stats`);
    a NEW TensorDict in ``stats``' dtypes. ``momentum`` as in :func:`update_running_stats` (None:
    Chan et al.'s exact parallel merge). A ``batch`` with count 0 leaves every field unchanged."""
    where = "merge_running_stats"
    mean, var, count = _fields(stats, where)
    b_mean, b_var, n_b = (t.to(_F64) for t in _fields(batch, where))
    if b_mean.shape != mean.shape:
        raise ValueError(f"{where}: the stats have shape {list(mean.shape)}, the batch {list(b_mean.shape)}")
    if momentum is not None and not 0.0 <= momentum <= 1.0:
        raise ValueError(f"{where}: momentum must be None or in [0, 1], got {momentum}")
    has_b = n_b > 0
    old_mean, old_var, old_count = mean.to(_F64), var.to(_F64), count.to(_F64)
    delta = b_mean - old_mean
    total = old_count + n_b
    if momentum is None:
        frac = n_b / total.clamp(min=1.0)  # 0 when the batch is empty, 1 when nothing was seen yet
        new_mean = old_mean + delta * frac
        new_var = old_var * (1.0 - frac) + b_var * frac + delta.square() * frac * (1.0 - frac)
    else:
        m = momentum * (old_count > 0).to(_F64)
        new_mean = m * old_mean + (1.0 - m) * b_mean
        new_var = m * old_var + (1.0 - m) * b_var + m * (1.0 - m) * delta.square()
    return TensorDict(
        {
            "mean": torch.where(has_b, new_mean, old_mean).to(mean.dtype),
            "var": torch.where(has_b, new_var, old_var).to(var.dtype),
            "count": total.to(count.dtype),
        },
        batch_size=[],
        device=stats.device,
    )


def normalize(
    stats: TensorDictBase, x: torch.Tensor, *, clip: float | None = 10.0, eps: float = 1e-8
) -> torch.Tensor:
    """``clamp((x - mean) / sqrt(var + eps), -clip, clip)`` in ``x``'s dtype. ``x``: ``[*L, *S]``;
    ``clip=None`` skips the clamp."""
    mean, var, _ = _fields(stats, "normalize")
    _check_apply(x, mean, clip, eps, "normalize")
    dtype = compute_dtype(x.dtype)
    inv_std = torch.rsqrt(var.to(_F64) + eps).to(dtype)
    y = (x.to(dtype) - mean.to(dtype)) * inv_std
    return _clip(y, clip).to(x.dtype)


def scale(
    stats: TensorDictBase, x: torch.Tensor, *, clip: float | None = 10.0, eps: float = 1e-8
) -> torch.Tensor:
    """``clamp(x / sqrt(var + eps), -clip, clip)`` in ``x``'s dtype: scaling without centering (reward
    scaling, with stats of the discounted return). ``x``: ``[*L, *S]``; ``clip=None`` skips the clamp."""
    mean, var, _ = _fields(stats, "scale")
    _check_apply(x, mean, clip, eps, "scale")
    dtype = compute_dtype(x.dtype)
    y = x.to(dtype) * torch.rsqrt(var.to(_F64) + eps).to(dtype)
    return _clip(y, clip).to(x.dtype)


# --------------------------------------------------------------------------------------------- helpers
def _fields(stats: TensorDictBase, where: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    mean = require(stats, "mean", where=where)
    var = require(stats, "var", where=where)
    count = require(stats, "count", where=where)
    check_kind(mean, "mean", kind="float", where=where)
    check_kind(var, "var", kind="float", where=where)
    check_kind(count, "count", kind="float", where=where)
    if var.shape != mean.shape or count.shape != ():
        raise ValueError(
            f"{where}: stats need var of mean's shape {list(mean.shape)} and a 0-dim count, "
            f"got var {list(var.shape)}, count {list(count.shape)}"
        )
    return mean, var, count


def _check_apply(x: torch.Tensor, mean: torch.Tensor, clip: float | None, eps: float, where: str) -> None:
    check_kind(x, "x", kind="float", where=where)
    n_s = mean.dim()
    if x.dim() < n_s or x.shape[x.dim() - n_s :] != mean.shape:
        raise ValueError(f"{where}: x must end with the stats' shape {list(mean.shape)}, got {list(x.shape)}")
    if clip is not None and not clip > 0:
        raise ValueError(f"{where}: clip must be > 0 or None, got {clip}")
    if not eps >= 0:
        raise ValueError(f"{where}: eps must be >= 0, got {eps}")


def _clip(y: torch.Tensor, clip: float | None) -> torch.Tensor:
    return y if clip is None else y.clamp(-clip, clip)


__all__ = [
    "batch_stats",
    "merge_running_stats",
    "normalize",
    "running_stats",
    "scale",
    "update_running_stats",
]
