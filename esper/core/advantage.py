"""Generalized advantage estimation (GAE) and advantage normalization.

Semantics are TorchRL's ``generalized_advantage_estimate`` (Schulman et al. 2015), per env, time last:

    delta_t = r_t + gamma * (1 - terminated_t) * V(next)_t - V_t
    A_t     = delta_t + gamma * lmbda * (1 - done_t) * A_{t+1}        (A_T = 0)
    value_target_t = A_t + V_t

``done`` cuts the lambda-trace, ``terminated`` masks the bootstrap. A truncated step (done, not
terminated) therefore bootstraps from ``V(next)_t``, which the shell computes on the final observation
with the post-action masks and hidden state (finding H4). Envs never mix: every operation is
elementwise over the batch dims.

Finding R1 (no per-step allocation, no Python loop in the compiled hot path): ``delta`` and the
per-step trace coefficient are computed vectorized. Eager moves them once to time-major contiguous
buffers and runs the reverse recurrence in place in the ``delta`` buffer with ``addcmul_`` on row views,
so it allocates the same handful of buffers whatever ``T`` is. Under ``torch.compile`` the data stays
time-last (TorchRL's layout: no transposes) and the scan is blocked: time is cut into ``n_blocks`` blocks
of ``K ~ sqrt(T)`` steps, each block scanned on its own (the ``K`` steps of all blocks at once), the
blocks' results chained in a second ``n_blocks``-step scan, and the two combined pointwise. The graph
holds ``O(sqrt T)`` steps instead of ``T`` (in-place row updates would be functionalized into a copy of
the whole buffer per step; a ``T``-step chain becomes ``T`` buffers and ``T`` strided copies in
inductor's CPU code), and inductor fuses it into one kernel of a few loops.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from tensordict import TensorDictBase

from esper.core.checks import check_kind, check_unit_interval, key_str, per_step
from esper.core.distributions import compute_dtype
from esper.core.spec import KEYS, Keys

_WHERE = "gae"


def gae_tensors(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    *,
    gamma: float,
    lmbda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over plain tensors, time on the LAST dim.

    Args:
        reward, value, next_value: floating ``[*B, T]``; ``next_value[..., t]`` is V(s_{t+1}) (the
            final observation's value on a truncated step).
        done, terminated: bool ``[*B, T]``; ``done`` cuts the trace, ``terminated`` stops bootstrapping.
        gamma, lmbda: Python floats in ``[0, 1]``.

    Returns:
        ``(advantage, value_target)``, both ``[*B, T]`` in the promoted dtype of the three float inputs.
        The math runs in float64 for float64 inputs and in float32 otherwise (half/bfloat16 are cast back).
    """
    check_gae_tensors(reward, value, next_value, done, terminated, gamma=gamma, lmbda=lmbda)

    out_dtype = gae_out_dtype(reward, value, next_value)
    dtype = compute_dtype(out_dtype)
    r, v, nv = reward.to(dtype), value.to(dtype), next_value.to(dtype)
    delta = torch.addcmul(r - v, (~terminated).to(dtype), nv, value=gamma)  # [*B, T]
    coef = (~done).to(dtype) * (gamma * lmbda)
    if torch.compiler.is_compiling():
        advantage = _reverse_scan_blocked(delta, coef)
    else:  # time-major [T, *B] buffers; the recurrence runs in `delta`'s buffer in place
        time_major = _reverse_scan_in_place(*(x.movedim(-1, 0).contiguous() for x in (delta, coef)))
        advantage = time_major.movedim(0, -1).contiguous()  # back to the inputs' [*B, T] layout
    value_target = advantage + v
    return advantage.to(out_dtype), value_target.to(out_dtype)


def gae_out_dtype(reward: torch.Tensor, value: torch.Tensor, next_value: torch.Tensor) -> torch.dtype:
    """The dtype of GAE's outputs: the promoted dtype of the three float inputs (the fused kernel's
    fake and real implementations allocate with it too)."""
    return torch.promote_types(torch.promote_types(reward.dtype, value.dtype), next_value.dtype)


def _reverse_scan_in_place(delta: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """Eager: ``A_t = delta_t + coef_t * A_{t+1}`` over time-major rows, in ``delta``'s buffer."""
    for t in range(delta.shape[0] - 2, -1, -1):
        delta[t].addcmul_(coef[t], delta[t + 1])  # no allocation per step
    return delta


def _reverse_scan_blocked(delta: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """Traced: ``A_t = delta_t + coef_t * A_{t+1}`` (``A_T = 0``) over the last dim of ``[*B, T]``, as a
    blocked scan of ``O(sqrt T)`` steps (module docstring). With ``K`` steps per block, in block ``b``:

        local_j   = delta_j + coef_j * local_{j+1}       (local_K = 0: the block alone)
        through_j = coef_j * through_{j+1}               (through_K = 1: what reaches step j from b+1)
        A_j       = local_j + through_j * A_first(b + 1)

    and ``A_first(b) = local_0(b) + through_0(b) * A_first(b + 1)`` chains the blocks (``A_first`` of
    the block after the last is 0). A ragged ``T`` is padded at the end with inert steps (delta 0).
    """
    *batch, T = delta.shape
    K, n_blocks = _scan_blocks(T)
    pad = K * n_blocks - T
    if pad:  # inert steps after the last: they add 0 and pass nothing back
        delta = torch.nn.functional.pad(delta, (0, pad))
        coef = torch.nn.functional.pad(coef, (0, pad))
    d = delta.reshape(*batch, n_blocks, K)
    c = coef.reshape(*batch, n_blocks, K)
    local, through = d[..., K - 1], c[..., K - 1]
    locals_, throughs = [local], [through]
    for j in range(K - 2, -1, -1):
        local = torch.addcmul(d[..., j], c[..., j], local)
        through = c[..., j] * through
        locals_.append(local)
        throughs.append(through)
    local = torch.stack(locals_[::-1], -1)  # [*B, n_blocks, K]
    through = torch.stack(throughs[::-1], -1)
    first = torch.zeros_like(local[..., 0, 0])  # A_first of the block after the last
    carries = []  # carries[b] = A_first(b + 1)
    for b in range(n_blocks - 1, -1, -1):
        carries.append(first)
        first = torch.addcmul(local[..., b, 0], through[..., b, 0], first)
    carry = torch.stack(carries[::-1], -1).unsqueeze(-1)  # [*B, n_blocks, 1]
    advantage = torch.addcmul(local, through, carry).reshape(*batch, n_blocks * K)
    return advantage[..., :T] if pad else advantage


def _scan_blocks(T: int) -> tuple[int, int]:
    """``(K, n_blocks)`` for a blocked scan of ``T`` steps: the divisor of ``T`` nearest ``sqrt(T)`` when
    one lies within a factor 2 of it, else ``K = ceil(sqrt(T))`` (the last block padded)."""
    root = math.sqrt(T)
    divisors = [k for k in range(1, T + 1) if T % k == 0 and root / 2 <= k <= 2 * root]
    K = min(divisors, key=lambda k: abs(k - root)) if divisors else math.ceil(root)
    return K, math.ceil(T / K)


def gae(td: TensorDictBase, *, gamma: float, lmbda: float, keys: Keys = KEYS) -> TensorDictBase:
    """GAE over a rollout TensorDict of batch size ``[*B, T]`` (time = last batch dim).

    Reads ``keys.reward``, ``keys.state_value``, ``keys.next_state_value`` (floating) and
    ``keys.terminated``, ``keys.done`` (bool); when ``done`` is absent it is ``terminated | truncated``.
    Each may be ``[*B, T]`` or ``[*B, T, 1]`` (TorchRL's trailing 1). Writes ``keys.advantage`` and
    ``keys.value_target`` with the reward's shape into ``td`` and returns ``td``.

    Raises:
        KeyError: a key is missing (the message lists the keys present).
        ValueError: ``td`` has no batch dim, a shape is not ``[*B, T]``/``[*B, T, 1]``, or gamma/lmbda
            is outside ``[0, 1]``.
        TypeError: done/terminated/truncated not bool, or reward/values not floating.
    """
    check_gae_coefs(gamma, lmbda, _WHERE)
    inputs = gae_inputs(td, keys=keys)
    advantage, value_target = gae_tensors(*inputs, gamma=gamma, lmbda=lmbda)
    return write_gae_outputs(td, advantage, value_target, keys=keys)


def gae_inputs(
    td: TensorDictBase, *, keys: Keys = KEYS, where: str = _WHERE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(reward, value, next_value, done, terminated)`` read from ``td`` as ``[*B, T]`` tensors, with
    the checks and errors :func:`gae` documents (``done`` built as ``terminated | truncated`` when
    absent). The one reader of GAE's keys: the fused kernel reads through it too."""
    if td.batch_dims < 1:
        raise ValueError(f"{where}: the TensorDict needs batch size [*B, T] (time last), got []")
    reward = per_step(td, keys.reward, where=where, kind="float")
    value = per_step(td, keys.state_value, where=where, kind="float")
    next_value = per_step(td, keys.next_state_value, where=where, kind="float")
    terminated = per_step(td, keys.terminated, where=where, kind="bool")
    present = td.keys(include_nested=True)
    if keys.done in present:
        done = per_step(td, keys.done, where=where, kind="bool")
    elif keys.truncated in present:
        done = terminated | per_step(td, keys.truncated, where=where, kind="bool")
    else:
        raise KeyError(
            f"{where}: needs {key_str(keys.done)}, or {key_str(keys.truncated)} to build it as "
            f"terminated | truncated; neither is in the TensorDict (keys: "
            f"{', '.join(sorted(key_str(k) for k in td.keys(include_nested=True, leaves_only=True)))})"
        )
    return reward, value, next_value, done, terminated


def write_gae_outputs(
    td: TensorDictBase, advantage: torch.Tensor, value_target: torch.Tensor, *, keys: Keys = KEYS
) -> TensorDictBase:
    """Writes ``keys.advantage`` and ``keys.value_target`` with the reward's shape (``[*B, T]`` or
    ``[*B, T, 1]``) into ``td``; returns ``td``."""
    reward_shape = td.get(keys.reward).shape
    td.set(keys.advantage, advantage.reshape(reward_shape))
    td.set(keys.value_target, value_target.reshape(reward_shape))
    return td


def check_gae_tensors(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    *,
    gamma: float,
    lmbda: float,
    where: str = "gae_tensors",
) -> None:
    """:func:`gae_tensors`' input contract, on metadata only (no host sync; free under compile):
    gamma/lmbda Python floats in ``[0, 1]``, five ``[*B, T]`` tensors of one shape and device, float
    reward/values, bool flags."""
    check_gae_coefs(gamma, lmbda, where)
    named = {
        "reward": reward,
        "value": value,
        "next_value": next_value,
        "done": done,
        "terminated": terminated,
    }
    for name, x in named.items():
        if x.dim() < 1 or x.shape != reward.shape:
            raise ValueError(
                f"{where}: {name} must have shape [*B, T] equal to reward's {list(reward.shape)} "
                f"(at least one dim), got {list(x.shape)}"
            )
        if x.device != reward.device:
            raise ValueError(f"{where}: {name} is on {x.device}, reward on {reward.device}")
        check_kind(x, name, kind="bool" if name in ("done", "terminated") else "float", where=where)


def normalize_advantage(
    advantage: torch.Tensor,
    valid: torch.Tensor | None = None,
    *,
    eps: float = 1e-8,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``(A - mean) / (std + eps)`` over the valid steps; invalid steps come back as 0.

    Args:
        advantage: floating, any shape (usually ``[*B, T]`` or ``[*B, T, 1]``).
        valid: bool broadcastable to ``advantage`` (a ``[*B, T]`` mask also fits a ``[*B, T, 1]``
            advantage), or None for all steps.

    The mean and the (unbiased, like ``torch.std``) variance are masked sums with clamped denominators,
    so fewer than 2 valid steps give zeros, never NaN. A non-finite entry comes back as it was
    (non-finite) and is left out of the mean and variance, so it does not spread to the other steps.
    Math in float32 at least; returned in ``advantage``'s dtype.

    ``reduce``: applied to the sums behind the statistics (a ``[2]`` tensor ``[count, sum]``, then
    the sum of squared deviations) before they are used; data-parallel training passes a sum over
    processes, so every process normalizes its part of one batch with the whole batch's statistics.
    None: this batch's own.
    """
    where = "normalize_advantage"
    reduce = reduce if reduce is not None else (lambda t: t)
    check_kind(advantage, "advantage", kind="float", where=where)
    if not eps >= 0:
        raise ValueError(f"{where}: eps must be >= 0, got {eps}")
    dtype = compute_dtype(advantage.dtype)
    a = advantage.to(dtype)
    if valid is None:
        w = torch.ones_like(a)
    else:
        check_kind(valid, "valid", kind="bool", where=where)
        if valid.dim() == a.dim() - 1 and a.shape[-1] == 1 and valid.shape == a.shape[:-1]:
            valid = valid.unsqueeze(-1)
        if not _broadcasts_to(valid.shape, a.shape):
            raise ValueError(
                f"{where}: valid must broadcast to advantage's shape {list(a.shape)}, got {list(valid.shape)}"
            )
        w = valid.to(dtype).expand_as(a)
    # A non-finite advantage stays non-finite in the output (it is a bug upstream, not to be hidden)
    # but takes no part in the statistics, so one NaN does not turn every other step into NaN.
    finite = torch.isfinite(a)
    bad = ~finite & (w > 0)  # non-finite valid steps; invalid ones come back as 0 whatever they hold
    w = torch.where(finite, w, 0.0)
    a = torch.where(finite, a, 0.0)
    n, total = reduce(torch.stack([w.sum(), (a * w).sum()])).unbind()
    mean = total / n.clamp(min=1.0)
    centered = (a - mean) * w
    var = reduce(centered.square().sum()) / (n - 1.0).clamp(min=1.0)
    out = torch.where(bad, advantage.to(dtype), centered / (var.sqrt() + eps))
    return out.to(advantage.dtype)


def group_relative(advantage: torch.Tensor, group: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Each env's advantage less the mean of the other envs of its group at the same step (a
    leave-one-out baseline), for envs run in groups of ``group`` that share their host seeds.

    Args:
        advantage: floating ``[E, T]`` or ``[E, T, 1]``, envs on the first dim, each group ``group``
            consecutive envs (env ``e`` in group ``e // group``).
        group: a Python int >= 1 that divides ``E``; 1 returns ``advantage`` unchanged.
        valid: bool ``[E, T]`` (or shaped like ``advantage``), or None for every step: only valid
            steps enter a baseline, and an invalid step comes back as it was.

    Why it is unbiased: the envs of a group share the host (its init, its seeds' init, its data order),
    and each samples its own actions, so the other envs' advantages at step t do not depend on this
    env's action at t. Subtracting their mean is a baseline, whatever ``lmbda`` GAE used. What it takes
    out is what the group shares: how well this host does whatever the controller does (the host's
    luck), which a critic that sees one env's history can only partly tell apart from the action's
    effect. A step where no other env of the group is valid keeps its advantage (baseline 0). Math in
    float32 at least; returned in ``advantage``'s dtype.
    """
    where = "group_relative"
    check_kind(advantage, "advantage", kind="float", where=where)
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"{where}: group must be a Python int >= 1, got {group!r}")
    if advantage.dim() < 2 or advantage.dim() > 3 or (advantage.dim() == 3 and advantage.shape[-1] != 1):
        raise ValueError(f"{where}: advantage must be [E, T] or [E, T, 1], got {list(advantage.shape)}")
    E = advantage.shape[0]
    if E % group:
        raise ValueError(f"{where}: group {group} must divide the {E} envs (whole groups of envs)")
    if group == 1:
        return advantage
    dtype = compute_dtype(advantage.dtype)
    a = advantage.reshape(E, -1).to(dtype)
    if valid is None:
        w = torch.ones_like(a)
    else:
        check_kind(valid, "valid", kind="bool", where=where)
        if valid.numel() != a.numel() or valid.shape[0] != E:
            raise ValueError(f"{where}: valid must be shaped like advantage, got {list(valid.shape)}")
        w = valid.reshape(E, -1).to(dtype)
    g, gw = (a * w).reshape(E // group, group, -1), w.reshape(E // group, group, -1)
    others = (gw.sum(1, keepdim=True) - gw).reshape(E, -1)  # valid envs of the group besides this one
    rest = ((g.sum(1, keepdim=True) - g).reshape(E, -1)) / others.clamp(min=1.0)
    out = torch.where((w > 0) & (others > 0), a - rest, a)
    return out.reshape(advantage.shape).to(advantage.dtype)


def check_gae_coefs(gamma: float, lmbda: float, where: str = _WHERE) -> None:
    """gamma and lmbda are Python floats (not tensors: they are compile-time constants) in ``[0, 1]``."""
    for name, x in (("gamma", gamma), ("lmbda", lmbda)):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise TypeError(f"{where}: {name} must be a Python float, got {type(x).__name__}")
        check_unit_interval(name, x, where=where)


def _broadcasts_to(src: torch.Size, dst: torch.Size) -> bool:
    return len(src) <= len(dst) and all(s in (1, d) for s, d in zip(reversed(src), reversed(dst)))


__all__ = [
    "check_gae_coefs",
    "check_gae_tensors",
    "gae",
    "gae_inputs",
    "gae_out_dtype",
    "gae_tensors",
    "group_relative",
    "normalize_advantage",
    "write_gae_outputs",
]
