"""Gradient and LSTM health statistics, returned as tensors in a TensorDict, and the seeds' gradient
health score (:func:`seed_grad_health`), and two learner rules over the gradient-group norms
(:func:`group_clip_scale`, :func:`adapt_value_coef`).

Everything is vectorized over the list of gradients: the gradients are viewed flat and joined into
one vector (``torch.cat``), each tensor's squared norm is a segment sum over it (``index_add``), and
the NaN and Inf counts are two reductions of it. Public torch functions only (none of the private
foreach ops), no per-tensor arithmetic, no ``.item()``, no branch on values, so both functions compile
with ``fullgraph=True`` into a graph whose arithmetic does not grow with the number of gradients
(finding C6). The shell reads a report with one host transfer
(:func:`esper.shell.telemetry.readout.read_scalars`, finding M14).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from esper.core.checks import check_kind


@dataclass(frozen=True, slots=True)
class GradHealthConfig:
    """Thresholds on per-parameter-tensor gradient norms (finding H14).

    The default ``explode_norm`` is ``for_clipped_ppo(0.5)``'s: PPO's usual ``max_grad_norm`` is 0.5, and
    a fixed threshold such as 100 says nothing under a clip of 0.5.
    """

    #: A parameter tensor whose gradient norm is below this counts as vanishing.
    vanish_norm: float = 1e-7
    #: A parameter tensor whose gradient norm is above this counts as exploding.
    explode_norm: float = 5.0

    def __post_init__(self) -> None:
        if not self.vanish_norm > 0 or not self.explode_norm > 0:
            raise ValueError(
                f"GradHealthConfig: vanish_norm and explode_norm must be > 0, got "
                f"{self.vanish_norm}, {self.explode_norm}"
            )
        if not self.vanish_norm < self.explode_norm:
            raise ValueError(
                f"GradHealthConfig: vanish_norm ({self.vanish_norm}) must be < "
                f"explode_norm ({self.explode_norm})"
            )

    @classmethod
    def for_clipped_ppo(
        cls, max_grad_norm: float, factor: float = 10.0, *, vanish_norm: float = 1e-7
    ) -> GradHealthConfig:
        """Thresholds for an update that clips the global grad norm to ``max_grad_norm``: a tensor whose
        pre-clip norm is ``factor`` times the clip is exploding (the clip is doing the work)."""
        if not max_grad_norm > 0 or not factor > 0:
            raise ValueError(
                f"GradHealthConfig.for_clipped_ppo: max_grad_norm and factor must be > 0, got "
                f"{max_grad_norm}, {factor}"
            )
        return cls(vanish_norm=vanish_norm, explode_norm=factor * max_grad_norm)


def grad_health(
    grads: Sequence[torch.Tensor],
    *,
    groups: Sequence[int] | None = None,
    n_groups: int = 1,
    cfg: GradHealthConfig,
) -> TensorDict:
    """Health of a list of ``P`` gradient tensors (any shapes, floating, one device).

    Args:
        grads: the gradients, e.g. ``[p.grad for p in params]`` (no None entries).
        groups: the group index (``0 <= g < n_groups``) of each gradient, e.g. one group per policy
            head; None puts every gradient in group 0.
        n_groups: number of groups.
        cfg: thresholds.

    Returns a TensorDict (batch size ``[]``) of tensors:
        ``global_norm`` (L2 norm of all gradients together), ``group_norms [n_groups]`` (sqrt of the
        group's summed squared norms; 0 for an empty group), ``param_norms [P]``, ``nan_count`` and
        ``inf_count`` (int64 element counts), ``vanishing_frac`` and ``exploding_frac`` (share of the P
        tensors whose norm is below ``cfg.vanish_norm`` / above ``cfg.explode_norm``; 0 when P = 0),
        ``finite`` (bool: no NaN/Inf element). Norms are float64 if any gradient is float64, else
        float32 (group and global sums of squares run in float64, so they do not overflow where the
        per-tensor norms do not); a NaN element makes its norms NaN (that is the signal), zero or no
        gradients give 0.
    """
    grads = list(grads)
    groups = _check_grads(grads, groups, n_groups)
    device = grads[0].device if grads else torch.device("cpu")
    dtype = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
    sq, nan_count, inf_count = _squared_norms(grads, device)
    param_norms = sq.sqrt().to(dtype)
    index = torch.tensor(groups, dtype=torch.int64, device=device)
    group_sq = torch.zeros(n_groups, dtype=torch.float64, device=device).index_add(0, index, sq)
    n_params = max(len(grads), 1)
    return TensorDict(
        {
            "global_norm": sq.sum().sqrt().to(dtype),
            "group_norms": group_sq.sqrt().to(dtype),
            "param_norms": param_norms,
            "nan_count": nan_count,
            "inf_count": inf_count,
            "vanishing_frac": (param_norms < cfg.vanish_norm).sum().to(dtype) / n_params,
            "exploding_frac": (param_norms > cfg.explode_norm).sum().to(dtype) / n_params,
            "finite": (nan_count + inf_count) == 0,
        },
        batch_size=[],
    )


def _check_grads(grads: list[torch.Tensor], groups: Sequence[int] | None, n_groups: int) -> list[int]:
    """:func:`grad_health`'s input checks (floating tensors on one device, group indices in range);
    returns the group index of every gradient (all 0 when ``groups`` is None)."""
    where = "grad_health"
    for i, g in enumerate(grads):
        if not isinstance(g, torch.Tensor):
            raise TypeError(f"{where}: grads[{i}] must be a tensor, got {type(g).__name__}")
        check_kind(g, f"grads[{i}]", kind="float", where=where)
    devices = {g.device for g in grads}
    if len(devices) > 1:
        raise ValueError(f"{where}: all gradients must be on one device, got {sorted(map(str, devices))}")
    if n_groups < 1:
        raise ValueError(f"{where}: n_groups must be >= 1, got {n_groups}")
    if groups is None:
        groups = [0] * len(grads)
    groups = [int(k) for k in groups]
    if len(groups) != len(grads):
        raise ValueError(f"{where}: groups has {len(groups)} entries for {len(grads)} grads")
    bad = [k for k in groups if not 0 <= k < n_groups]
    if bad:
        raise ValueError(f"{where}: group indices must be in [0, {n_groups}), got {bad[:5]}")
    return groups


def _squared_norms(
    grads: list[torch.Tensor], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every gradient's squared L2 norm ``[P]`` (float64) and the NaN and Inf element counts (int64).
    One flat copy of every gradient (views joined, promoted to the widest dtype), each tensor's squared
    norm a segment sum over it in float64: large finite norms do not overflow, a NaN or Inf element
    makes its tensor's norm NaN or Inf, as a norm function would."""
    if not grads:
        zero = torch.zeros((), dtype=torch.int64, device=device)
        return torch.zeros(0, dtype=torch.float64, device=device), zero, zero
    sizes = [g.numel() for g in grads]
    flat = torch.cat([g.reshape(-1) for g in grads])
    segment = torch.repeat_interleave(
        torch.arange(len(grads), device=device),
        torch.tensor(sizes, device=device),
        output_size=sum(sizes),
    )
    sq = torch.zeros(len(grads), dtype=torch.float64, device=device).index_add(
        0, segment, flat.to(torch.float64).square()
    )
    return sq, torch.isnan(flat).sum(), torch.isinf(flat).sum()


def lstm_health(
    h: torch.Tensor, c: torch.Tensor, *, low: float = 1e-6, high: float = 100.0, saturation: float = 0.95
) -> TensorDict:
    """Health of an LSTM's hidden and cell state.

    Args:
        h, c: floating ``[..., H]`` (e.g. ``[num_layers, B, H]``); norms are taken over the last dim.
        low, high: a state vector (a row of ``h`` or of ``c``) whose L2 norm is below ``low`` counts as
            too small (dead), above ``high`` as too large.
        saturation: a unit is saturated where its output ``|h|`` (or, for the cell, ``|tanh(c)|``) is at
            least this: ``h = o * tanh(c)`` is then pinned near +-1 and the gradient through its gates
            nearly vanishes.

    Returns a TensorDict (batch size ``[]``) of 0-dim tensors: ``h_norm_mean``, ``h_norm_max``,
    ``c_norm_mean``, ``c_norm_max`` (float32, float64 for float64 input), ``nonfinite`` (int64 count of
    NaN/Inf elements in ``h`` and ``c``), ``too_small_frac`` and ``too_large_frac`` (share of all rows of
    ``h`` and ``c`` together), ``h_saturated_frac`` and ``c_saturated_frac`` (share of the elements of
    ``h``, of ``c``, that are saturated; NaN counts as not saturated). Empty states give zeros.
    """
    where = "lstm_health"
    for name, x in (("h", h), ("c", c)):
        check_kind(x, name, kind="float", where=where)
        if x.dim() < 1:
            raise ValueError(f"{where}: {name} must have shape [..., H], got []")
    if not 0 <= low < high:
        raise ValueError(f"{where}: need 0 <= low < high, got low={low}, high={high}")
    if not 0 < saturation < 1:
        raise ValueError(f"{where}: need 0 < saturation < 1, got {saturation}")
    dtype = torch.float64 if torch.float64 in (h.dtype, c.dtype) else torch.float32
    h_norm = torch.linalg.vector_norm(h.to(dtype), dim=-1).reshape(-1)
    c_norm = torch.linalg.vector_norm(c.to(dtype), dim=-1).reshape(-1)
    norms = torch.cat([h_norm, c_norm])
    n_rows = max(norms.numel(), 1)
    nonfinite = (~torch.isfinite(h)).sum() + (~torch.isfinite(c)).sum()
    return TensorDict(
        {
            "h_norm_mean": _mean(h_norm),
            "h_norm_max": _max(h_norm),
            "c_norm_mean": _mean(c_norm),
            "c_norm_max": _max(c_norm),
            "nonfinite": nonfinite.to(torch.int64),
            "too_small_frac": (norms < low).sum().to(dtype) / n_rows,
            "too_large_frac": (norms > high).sum().to(dtype) / n_rows,
            "h_saturated_frac": (h.abs() >= saturation).sum().to(dtype) / max(h.numel(), 1),
            "c_saturated_frac": (torch.tanh(c).abs() >= saturation).sum().to(dtype) / max(c.numel(), 1),
        },
        batch_size=[],
    )


#: The seed health score's weights (the original system's): ``1 - 0.5 vanishing - 0.8 exploding``.
SEED_HEALTH_VANISHING = 0.5
SEED_HEALTH_EXPLODING = 0.8


def seed_grad_health(
    norm: torch.Tensor, vanishing: torch.Tensor, exploding: torch.Tensor, live: torch.Tensor
) -> TensorDict:
    """The gradient health of every slot's seed, ``[*E, S]``, from what host training measured of it
    (:func:`esper.shell.host.model.seed_grad_stats`): ``norm``, the L2 norm of the seed's gradients,
    and ``vanishing`` / ``exploding``, the share of its parameter tensors whose gradient norm is below /
    above the seed thresholds. ``live``: bool, the slot held a seed when measured.

    Returns a TensorDict ``[*E, S]`` of float32: ``norm``, ``vanishing``, ``exploding`` (as given, the
    shares clamped to [0, 1]) and ``health``, the original system's score ``1 - 0.5 vanishing - 0.8
    exploding`` clamped to [0, 1]; a NaN share reads as the worst case (1), and a non-finite norm makes
    the health 0 (a NaN gradient is no healthy seed, whatever the shares say); 0 everywhere a slot has
    no seed. Elementwise: no sync, no branch on values.
    """
    check_kind(live, "live", kind="bool", where="seed_grad_health")
    f32 = lambda x: x.to(torch.float32)
    share = lambda x: torch.nan_to_num(f32(x), nan=1.0).clamp(0.0, 1.0)
    v, e = share(vanishing), share(exploding)
    score = (1.0 - SEED_HEALTH_VANISHING * v - SEED_HEALTH_EXPLODING * e).clamp(0.0, 1.0)
    score = torch.where(torch.isfinite(norm), score, 0.0)
    out = {"norm": f32(norm), "vanishing": v, "exploding": e, "health": score}
    return TensorDict({k: torch.where(live, x, 0.0) for k, x in out.items()}, batch_size=live.shape)


def group_clip_scale(group_norms: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Per-group gradient clipping (``ppo.clip_per_group``, findings M19 / 000 MED-1): the factor each
    group's gradients are multiplied by so that no group's norm exceeds ``max_norm``,
    ``min(1, max_norm / (norm + 1e-6))`` per group (``torch.nn.utils.clip_grad_norm_``'s rule, applied to
    each group of :func:`grad_health`'s ``group_norms`` alone). ``[n_groups]``, ``group_norms``' dtype;
    a group under the bound keeps its gradient (factor 1); NaN stays NaN (the step is refused anyway)."""
    if not (math.isfinite(max_norm) and max_norm > 0):
        raise ValueError(f"group_clip_scale: max_norm must be finite and > 0, got {max_norm}")
    return (max_norm / (group_norms + 1e-6)).clamp(max=1.0)


def adapt_value_coef(
    coef: torch.Tensor,
    value_norm: torch.Tensor,
    policy_norm: torch.Tensor,
    *,
    target: float,
    rate: float,
    low: float,
    high: float,
) -> torch.Tensor:
    """The adaptive value coefficient's next value (``ppo.value_coef_adapt``, finding 000 MED-2).

    ``value_norm`` is the gradient norm of the value head's parameters and ``policy_norm`` that of the
    policy heads' together, both measured on one minibatch whose critic loss was weighted by ``coef``;
    the value head's gradient is proportional to ``coef`` (only the critic loss reaches it) and the
    heads' does not depend on it, so ``coef * target / ratio`` (``ratio = value_norm / policy_norm``)
    would have given the ratio ``target``. The rule moves ``coef`` a share ``rate`` of the way there in
    log space, ``coef * (target / ratio) ** rate``, clamped to ``[low, high]``; where the ratio is not
    finite and positive (a minibatch without a gradient on either side) ``coef`` stays. Tensors of any
    one shape; no sync, no branch on values."""
    for name, x in (("target", target), ("rate", rate), ("low", low), ("high", high)):
        if not (math.isfinite(x) and x > 0):
            raise ValueError(f"adapt_value_coef: {name} must be finite and > 0, got {x}")
    if not (rate <= 1 and low <= high):
        raise ValueError(f"adapt_value_coef: need rate <= 1 and low <= high, got {rate}, {low}, {high}")
    ratio = value_norm.to(coef.dtype) / policy_norm.to(coef.dtype)
    ok = torch.isfinite(ratio) & (ratio > 0)
    step = (target / torch.where(ok, ratio, 1.0)).pow(rate)
    return torch.where(ok, (coef * step).clamp(low, high), coef)


def _mean(x: torch.Tensor) -> torch.Tensor:
    return x.sum() / max(x.numel(), 1)


def _max(x: torch.Tensor) -> torch.Tensor:
    """Max of a 1-d tensor, 0 when empty; NaN propagates."""
    return x.new_zeros(()) if x.numel() == 0 else x.amax()


__all__ = [
    "GradHealthConfig",
    "adapt_value_coef",
    "grad_health",
    "group_clip_scale",
    "lstm_health",
    "seed_grad_health",
]
