"""Gradient-informed seeds (``lifecycle.grad_init``, issue 91 item 5): statistics at each slot, the
predicted first-order loss decrease of growing there, and a seed's projection initialised from them.

**Statistics.** While the option is on, the host pass of the last ``lifecycle.grad_init_batches``
training batches of every epoch keeps, at each slot, the slot's input ``h`` and the gradient ``g`` of
the batch's mean loss with respect to the slot's output (:class:`SlotStats`; a forward hook per slot on
the per-env path, :class:`SlotRecorder`; the stacked forward's own activations on the batched path).
Nothing else changes: the same forward, the same backward, the same optimizer steps (a test holds the
trained numbers to the option-off ones).

**The slot's predicted decrease** (:meth:`SlotStats.gain`). A linear residual seed at the slot,
``y = h + W h`` (a 1x1 convolution or a ``[C, C]`` matrix on the channels), changes the loss at first
order by ``<G, W>`` with ``G = dL/dW at W = 0 = E_batches[sum over samples and positions of g ⊗ h]``
(``[C, C]``), so ``||G||_F`` is the first-order loss decrease per unit (Frobenius) step of such a seed, and
``||G||_F / sqrt(C²)`` (the root-mean-square entry of ``G``) the same per parameter. Both are measured for
every slot each epoch (empty or not: for a slot that holds a seed ``h`` is still the slot's input and
``g`` the gradient at its output): ``grad_gain`` and ``grad_gain_rms`` in the signals.

**The seed's init** (:func:`init_projection`; GradMax, Evci et al. 2022, applied to the seed's own
features). A blueprint qualifies when its delta is zero whenever one weight tensor, its *projection* ``P``,
is zero (:func:`projection`): the last layer of every built-in blueprint but ``noop``. With ``P = 0``
the seed's delta is 0, and composed at alpha 1 as the what-if pass composes it, the first-order
gradient is ``G_P = d/dP E_batches[<g, y(P)>] at P = 0`` — for a linear or convolutional projection on
features ``φ(h)`` (the seed's layers before ``P``, at their init) the cross-covariance ``E[g ⊗ φ(h)]``
(positions unfolded for a ``k > 1`` kernel; for squeeze-excite ``E[(g·h summed over positions) ⊗ z]``; the
style's composition enters through ``y``: ``g ⊙ h`` for LINEAR_MULTIPLY, ``g ⊙ gate`` for GATED_GATE).
``P`` is then set to ``-s · P_r / ||P_r||``, ``P_r`` the best rank-``r`` approximation of ``G_P`` (its
top :data:`GRAD_INIT_RANK` singular directions, ``P`` flattened to ``[out, rest]``), of Frobenius norm
``s = lifecycle.grad_init_scale · sqrt(out / 3)``: ``sqrt(out / 3)`` is the expected norm of PyTorch's
default init of a layer with ``out`` outputs (any fan-in), which the blueprints shrink by
:data:`~esper.shell.host.blueprints.FINAL_INIT_SCALE` (0.01; LoRA's and widen's output and the norm
seed's scale start at exactly 0). The default scale, 0.1, is ten times that near-zero size, a tenth of a
layer's usual one: small, so the seed's delta at alpha 1 stays a small part of the activation (at alpha
0, where it incubates, the host's function is exactly unchanged in any case); a scale of 0.01 changes the
projection's direction alone. The norm seed's scalar becomes ``-s · sign(G_P)`` with ``s`` the scale. The
seed's own predicted decrease per unit step is ``||G_P||_F``. Blueprints registered by users keep their
own init (no projection is known for them), as does ``noop``; so does any seed of a slot without
statistics (the first epoch after a governor rollback) or whose ``G_P`` is zero.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from esper.shell.host.blueprints import (
    CausalSelfAttention,
    LoRA,
    NormSeed,
    PositionAttention,
    PreNorm,
    SqueezeExcite,
    Widen,
)
from esper.shell.host.slots import SeedSlot

#: The projection is initialised from this many top singular directions of its cross-covariance.
GRAD_INIT_RANK = 4
#: What the statistics add to a measurement, ``[S]`` per env (``[E, S]`` from a bank).
GRAD_GAIN_KEYS = ("grad_gain", "grad_gain_rms")
#: Families whose activations carry their channels in dim 1 (``[N, C, *spatial]``); the others last.
CHANNELS_FIRST = ("cnn", "cnn1d")


def channel_rows(x: torch.Tensor, family: str) -> torch.Tensor:
    """``x`` as ``[M, C]``: one row per sample and position, the channels (features) last (float32)."""
    if family in CHANNELS_FIRST:
        x = x.movedim(1, -1)
    return x.reshape(-1, x.shape[-1]).float()


class SlotStats:
    """The last ``batches`` host-pass pairs ``(h, g)`` at each of ``n_slots`` slots of one host, in that
    host's own layout (``[N, C, *spatial]`` for the CNN families, ``[N, ..., D]`` otherwise): ``h`` the
    slot's input, ``g`` the gradient of the batch's mean loss with respect to the slot's output."""

    def __init__(self, n_slots: int, family: str, batches: int) -> None:
        if batches < 1:
            raise ValueError(f"SlotStats: batches must be >= 1, got {batches}")
        self.family = family
        self.pairs: list[deque[tuple[torch.Tensor, torch.Tensor]]] = [
            deque(maxlen=batches) for _ in range(n_slots)
        ]

    def push(self, slot: int, h: torch.Tensor, g: torch.Tensor) -> None:
        self.pairs[slot].append((h, g))

    def slot_pairs(self, slot: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(self.pairs[slot])

    def cross_covariance(self, slot: int) -> torch.Tensor | None:
        """``G = mean over the kept batches of sum over rows of g ⊗ h`` ``[C, C]`` float32 at ``slot``: the
        gradient of the loss with respect to a linear residual seed ``W`` at ``W = 0`` (the module
        docstring); None with no pair kept."""
        pairs = self.pairs[slot]
        if not pairs:
            return None
        rows = lambda x: channel_rows(x, self.family)
        return sum(rows(g).T @ rows(h) for h, g in pairs) / len(pairs)

    def gain(self, device: torch.device | None = None) -> dict[str, torch.Tensor]:
        """Per slot ``[S]`` float32: ``grad_gain`` ``||G||_F`` and ``grad_gain_rms`` ``||G||_F / C``
        (:meth:`cross_covariance`); 0 for a slot with no pair kept."""
        gains, rms = [], []
        for slot in range(len(self.pairs)):
            G = self.cross_covariance(slot)
            norm = torch.zeros(()) if G is None else torch.linalg.matrix_norm(G)
            gains.append(norm.to(device))
            rms.append((norm / (1.0 if G is None else math.sqrt(G.numel()))).to(device))
        return {"grad_gain": torch.stack(gains), "grad_gain_rms": torch.stack(rms)}


class SlotRecorder:
    """Forward hooks on a host's slots that fill a :class:`SlotStats` while :meth:`recording` is active (the
    host pass of a training step; never the what-if pass): each slot's input, and through a hook on its
    output the gradient that reaches it in the backward. ``recording(scale)``: ``scale()`` is the factor
    the loss was scaled by before its backward (an AMP GradScaler's), divided out of ``g``. :meth:`close`
    removes the hooks."""

    def __init__(self, slots: Sequence[SeedSlot], stats: SlotStats) -> None:
        self.stats = stats
        self._on = False
        self._scale: Callable[[], float] | None = None
        self._handles = [slot.register_forward_hook(self._hook(i)) for i, slot in enumerate(slots)]

    def _hook(self, i: int):
        def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
            if not (self._on and torch.is_grad_enabled() and out.requires_grad):
                return
            h = args[0].detach().clone()
            scale = self._scale

            def grad_hook(g: torch.Tensor) -> None:
                g = g.detach().clone()
                self.stats.push(i, h, g / scale() if scale is not None else g)

            out.register_hook(grad_hook)

        return hook

    @contextmanager
    def recording(self, scale: Callable[[], float] | None = None) -> Iterator[None]:
        self._on, self._scale = True, scale
        try:
            yield
        finally:
            self._on, self._scale = False, None

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


# ------------------------------------------------------------------------------------------ the init
def projection(seed: nn.Module | None) -> nn.Parameter | None:
    """The weight whose zero makes the seed's delta zero (its last layer), for the built-in blueprints;
    None for ``noop``, for a module of another kind (a registered blueprint) and for no seed."""
    if isinstance(seed, PreNorm):
        seed = seed.body
    if isinstance(seed, nn.Sequential) and len(seed):
        last = seed[-1]
        ok = isinstance(last, (nn.Conv1d, nn.Conv2d, nn.Linear)) and _no_bias_or_zero(last)
        return last.weight if ok else None
    layer = {
        SqueezeExcite: lambda m: m.fc2,
        PositionAttention: lambda m: m.proj,
        CausalSelfAttention: lambda m: m.proj,
        LoRA: lambda m: m.up,
        Widen: lambda m: m.out,
    }.get(type(seed))
    if layer is not None:
        return layer(seed).weight if _no_bias_or_zero(layer(seed)) else None
    if isinstance(seed, NormSeed):
        return seed.scale
    return None


def _no_bias_or_zero(layer: nn.Module) -> bool:
    bias = getattr(layer, "bias", None)
    return bias is None or not bool(bias.detach().any())


Pairs = Sequence[tuple[torch.Tensor, torch.Tensor]]


def projection_gradient(slot: SeedSlot, pairs: Pairs) -> torch.Tensor | None:
    """``G_P``: the gradient of ``mean over pairs of <g, y(P)>`` with respect to the seed's projection
    ``P`` at ``P = 0``, ``y`` the slot's composition at alpha 1 of its seed on ``h`` (the module
    docstring); None where the seed has no projection or there are no pairs. ``P`` is left as it was."""
    P = projection(slot.seed)
    if P is None or not pairs:
        return None
    saved = P.detach().clone()
    total = torch.zeros_like(P, dtype=torch.float32)
    try:
        with torch.no_grad():
            P.zero_()
        with torch.enable_grad(), slot.force_alpha(1.0):
            for h, g in pairs:
                h = h.to(device=P.device, dtype=P.dtype)
                y = slot(h)
                inner = (y.float() * g.to(y.device).float()).sum()
                (grad,) = torch.autograd.grad(inner, [P], allow_unused=True)
                if grad is not None:
                    total += grad.float()
    finally:
        with torch.no_grad():
            P.copy_(saved)
    return total / len(pairs)


def init_scale_norm(P: torch.Tensor, scale: float) -> float:
    """The Frobenius norm :func:`init_projection` gives ``P``: ``scale · sqrt(out / 3)``, ``scale`` for a
    scalar (the module docstring)."""
    return scale * (math.sqrt(P.shape[0] / 3.0) if P.dim() >= 2 else 1.0)


def init_projection(slot: SeedSlot, pairs: Pairs, scale: float = 0.1) -> float | None:
    """Set the slot's seed projection to ``-s · P_r / ||P_r||`` (the module docstring; ``s`` from
    ``scale``, :func:`init_scale_norm`) from the statistics ``pairs`` of the slot; returns ``||G_P||_F``
    (the seed's predicted first-order decrease per unit step), or None where nothing was changed (no
    projection, no pairs, or a zero gradient). Draws no random numbers."""
    G = projection_gradient(slot, pairs)
    P = projection(slot.seed)
    if G is None or P is None:
        return None
    norm = float(torch.linalg.vector_norm(G))
    if not math.isfinite(norm) or norm == 0.0:
        return None
    target = init_scale_norm(P, scale)
    if G.dim() < 2:
        new = -target * torch.sign(G)
    else:
        W = G.reshape(G.shape[0], -1)
        U, S, Vh = torch.linalg.svd(W, full_matrices=False)
        r = min(GRAD_INIT_RANK, S.numel())
        low = (U[:, :r] * S[:r]) @ Vh[:r]
        new = (-target * low / torch.linalg.matrix_norm(low)).reshape(G.shape)
    with torch.no_grad():
        P.copy_(new.to(P.dtype))
    return norm


__all__ = [
    "CHANNELS_FIRST",
    "GRAD_GAIN_KEYS",
    "GRAD_INIT_RANK",
    "SlotRecorder",
    "SlotStats",
    "channel_rows",
    "init_projection",
    "init_scale_norm",
    "projection",
    "projection_gradient",
]
