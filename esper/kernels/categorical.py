"""Fused masked categorical: log-prob of the taken action, normalized entropy and k3 KL of one head in
one Triton kernel (rows in parallel), with a fused Triton backward.

Same results as :func:`esper.core.distributions.masked_categorical` (math in float32 at least, illegal
logits replaced by the dtype's most negative finite value, normalized entropy 0 where at most one
choice is legal, never NaN), registered as ``esper::masked_categorical`` with a fake impl and an
autograd formula, so ``torch.compile(fullgraph=True)`` traces through forward and backward.

Backward: a second op, ``esper::masked_categorical_backward``, which recomputes the row's softmax from
the logits rather than saving ``[rows, n]`` probabilities, and writes d/dlogits of
``g_lp * log_prob + g_ent * entropy + g_kl * k3`` (and d/d old_log_prob of the k3 term) in one pass. It
is a Triton kernel on GPU (one launch instead of the ~15 elementwise kernels of the torch formula in
eager; under inductor a custom op is opaque either way, so fusing by hand is what keeps it one pass) and
the same formula in torch ops on CPU, tested against the core's autograd.

Dispatch: CUDA tensors with Triton run the kernels; everything else runs the core (the public wrapper
calls the core directly on CPU, so compiled CPU code keeps inductor's fusion and the core's autograd).
"""

from __future__ import annotations

import importlib.util

import torch

from esper.core import distributions as core

HAS_TRITON = importlib.util.find_spec("triton") is not None
#: Test hook: run the Triton kernels on CPU tensors too (under ``TRITON_INTERPRET=1``).
TRITON_ON_CPU = False

_WHERE = "esper.kernels.masked_categorical"
#: Widest head the kernels take (one row per program, in registers); wider heads run the core.
MAX_KERNEL_CHOICES = 8192


def _check(logits, action, mask, old_log_prob) -> None:
    """Shapes and dtypes, on metadata only. The kernel needs exact shapes (the core broadcasts)."""
    if logits.dim() < 1 or not logits.is_floating_point():
        raise ValueError(
            f"{_WHERE}: logits must be floating [..., n], got {logits.dtype} {list(logits.shape)}"
        )
    batch = logits.shape[:-1]
    if action.shape != batch or action.is_floating_point() or action.dtype == torch.bool:
        raise ValueError(
            f"{_WHERE}: action must be integer {list(batch)}, got {action.dtype} {list(action.shape)}"
        )
    if old_log_prob.shape != batch or not old_log_prob.is_floating_point():
        raise ValueError(
            f"{_WHERE}: old_log_prob must be floating {list(batch)}, got "
            f"{old_log_prob.dtype} {list(old_log_prob.shape)}"
        )
    if mask is not None and (mask.shape != logits.shape or mask.dtype != torch.bool):
        raise ValueError(
            f"{_WHERE}: mask must be bool {list(logits.shape)}, got {mask.dtype} {list(mask.shape)}"
        )


def _on_kernel_device(logits: torch.Tensor) -> bool:
    """Kernel path: a Triton device (or the CPU test hook) and a head narrow enough for one program."""
    device_ok = logits.device.type == "cuda" or (TRITON_ON_CPU and logits.device.type == "cpu")
    return HAS_TRITON and device_ok and logits.dim() >= 1 and logits.shape[-1] <= MAX_KERNEL_CHOICES


# ------------------------------------------------------------------------------------------- forward
@torch.library.custom_op("esper::masked_categorical", mutates_args=())
def masked_categorical_op(
    logits: torch.Tensor, action: torch.Tensor, mask: torch.Tensor | None, old_log_prob: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log_prob, normalized_entropy, k3)``, each ``logits.shape[:-1]`` in the compute dtype."""
    if not _on_kernel_device(logits):
        return tuple(x.contiguous() for x in core.masked_categorical(logits, action, mask, old_log_prob))
    from esper.kernels import _triton

    _check(logits, action, mask, old_log_prob)
    lp, ent, kl = (
        torch.empty(logits.shape[:-1], dtype=core.compute_dtype(logits.dtype), device=logits.device)
        for _ in range(3)
    )
    _triton.masked_categorical(logits, action, mask, old_log_prob, lp, ent, kl)
    return lp, ent, kl


@masked_categorical_op.register_fake
def _fake(logits, action, mask, old_log_prob):
    _check(logits, action, mask, old_log_prob)
    dtype = core.compute_dtype(logits.dtype)
    return tuple(logits.new_empty(logits.shape[:-1], dtype=dtype) for _ in range(3))


# ------------------------------------------------------------------------------------------ backward
@torch.library.custom_op("esper::masked_categorical_backward", mutates_args=())
def masked_categorical_backward_op(
    logits: torch.Tensor,
    action: torch.Tensor,
    mask: torch.Tensor | None,
    old_log_prob: torch.Tensor,
    grad_log_prob: torch.Tensor,
    grad_entropy: torch.Tensor,
    grad_kl: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad_logits, grad_old_log_prob)`` in the dtypes of ``logits`` and ``old_log_prob``."""
    if not _on_kernel_device(logits):
        return _backward_reference(logits, action, mask, old_log_prob, grad_log_prob, grad_entropy, grad_kl)
    from esper.kernels import _triton

    grad_logits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    grad_old = torch.empty(old_log_prob.shape, dtype=old_log_prob.dtype, device=logits.device)
    _triton.masked_categorical_backward(
        logits, action, mask, old_log_prob, grad_log_prob, grad_entropy, grad_kl, grad_logits, grad_old
    )
    return grad_logits, grad_old


@masked_categorical_backward_op.register_fake
def _fake_backward(logits, action, mask, old_log_prob, grad_log_prob, grad_entropy, grad_kl):
    _check(logits, action, mask, old_log_prob)  # contiguous, like both real impls
    return logits.new_empty(logits.shape), old_log_prob.new_empty(old_log_prob.shape)


def _backward_reference(logits, action, mask, old_log_prob, grad_log_prob, grad_entropy, grad_kl):
    """The backward formula in torch ops (CPU, and the spec of the Triton backward):

    d log_prob / dz_j = [j = a] - p_j;  d H / dz_j = -p_j (log p_j + H), entropy = H / log(n_legal)
    (0 when n_legal <= 1);  d k3 / d log_prob = expm1(log_ratio) = -d k3 / d old_log_prob;
    illegal logits are replaced by a constant, so their gradient is 0.
    """
    lsm = core.log_softmax(logits, mask)
    log_ratio = lsm.gather(-1, action.long().unsqueeze(-1)).squeeze(-1) - old_log_prob.to(lsm.dtype)
    legal = mask if mask is not None else torch.ones_like(lsm, dtype=torch.bool)
    lsm = torch.where(legal, lsm, 0.0)  # illegal: p = 0; keep 0 * lsm finite
    p = torch.where(legal, lsm.exp(), 0.0)
    g_k3 = grad_kl.to(lsm.dtype) * torch.expm1(log_ratio)
    g_lp = grad_log_prob.to(lsm.dtype) + g_k3
    h = -(p * lsm).sum(-1)
    n_legal = legal.sum(-1)
    g_h = torch.where(n_legal > 1, grad_entropy.to(lsm.dtype) / n_legal.clamp(min=2).to(lsm.dtype).log(), 0.0)
    onehot = torch.zeros_like(lsm).scatter_(-1, action.long().unsqueeze(-1), 1.0)
    grad = g_lp.unsqueeze(-1) * (onehot - p) - (g_h.unsqueeze(-1) * p) * (lsm + h.unsqueeze(-1))
    grad = torch.where(legal, grad, 0.0)
    return grad.to(logits.dtype).contiguous(), (-g_k3).to(old_log_prob.dtype).contiguous()


def _setup_context(ctx, inputs, output) -> None:
    logits, action, mask, old_log_prob = inputs
    ctx.save_for_backward(logits, action, mask, old_log_prob)


def _backward(ctx, grad_log_prob, grad_entropy, grad_kl):
    logits, action, mask, old_log_prob = ctx.saved_tensors
    grad_logits, grad_old = masked_categorical_backward_op(
        logits, action, mask, old_log_prob, grad_log_prob, grad_entropy, grad_kl
    )
    return (
        grad_logits if ctx.needs_input_grad[0] else None,
        None,
        None,
        grad_old if ctx.needs_input_grad[3] else None,
    )


masked_categorical_op.register_autograd(_backward, setup_context=_setup_context)


# ------------------------------------------------------------------------------------------- wrapper
def masked_categorical(
    logits: torch.Tensor, action: torch.Tensor, mask: torch.Tensor | None, old_log_prob: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop-in for :func:`esper.core.distributions.masked_categorical`: ``(log_prob,
    normalized_entropy, k3)`` of one head, differentiable w.r.t. ``logits`` (and ``old_log_prob``).

    The fused kernels on CUDA; the core elsewhere. The kernel path needs ``action`` and
    ``old_log_prob`` of shape ``logits.shape[:-1]`` and ``action`` in ``[0, n)`` (not checked on the
    device: that would sync; an out-of-range action gives log_prob 0).
    """
    if not _on_kernel_device(logits):
        return core.masked_categorical(logits, action, mask, old_log_prob)
    _check(logits, action, mask, old_log_prob)
    return masked_categorical_op(logits, action, mask, old_log_prob)


__all__ = ["HAS_TRITON", "masked_categorical", "masked_categorical_backward_op", "masked_categorical_op"]
