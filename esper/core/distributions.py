"""Masked categorical distributions, one head at a time.

All math runs in float32 at least (half and bfloat16 logits are upcast), illegal choices are filled
with the dtype's most negative finite value rather than ``-inf``, and every ``p * log p`` of an illegal
choice is zeroed with ``torch.where``. The results are therefore finite for any input that has at least
one legal choice per row, and stay finite (if meaningless) for an all-illegal row: catching that row is
the shell's job, before sampling.

Shapes: ``logits [..., n]``, ``mask [..., n] bool`` (or ``None``: all legal), ``action [...] int64``.
"""

from __future__ import annotations

import math

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the math runs in: float64 stays, everything else becomes float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def legal_mask(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The choices that can be taken, bool ``[..., n]``: ``mask`` (every choice if None) without those
    whose logit is ``-inf`` (a ``-inf`` logit is a masked choice, as in TorchRL's masked distributions).
    The one definition every function below uses, so ``-inf`` logits never turn into NaN."""
    finite = logits != -torch.inf
    return finite if mask is None else mask & finite


def masked_logits(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Logits in :func:`compute_dtype`, illegal choices (:func:`legal_mask`) set to the most negative
    finite value."""
    x = logits.to(compute_dtype(logits.dtype))
    return torch.where(legal_mask(logits, mask), x, torch.finfo(x.dtype).min)


def log_softmax(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Masked log-probabilities ``[..., n]``; illegal entries are very negative but finite."""
    return torch.log_softmax(masked_logits(logits, mask), dim=-1)


def log_prob(logits: torch.Tensor, action: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``log pi(action)`` under the masked distribution, shape ``[...]``."""
    return _gather(log_softmax(logits, mask), action)


def normalized_entropy_from_log_probs(lsm: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Entropy divided by ``log(#legal)``, in ``[0, 1]``; exactly 0 where at most one choice is legal."""
    p_log_p = lsm.exp() * lsm
    if mask is None:
        n = lsm.shape[-1]
        ent = -p_log_p.sum(-1)
        return ent / math.log(n) if n > 1 else torch.zeros_like(ent)
    ent = -torch.where(mask, p_log_p, 0.0).sum(-1)
    n = mask.sum(-1)
    denom = torch.log(n.clamp(min=2).to(ent.dtype))
    return torch.where(n > 1, ent / denom, 0.0)


def normalized_entropy(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Normalized entropy of the masked distribution, ``[...]`` in ``[0, 1]``."""
    mask = legal_mask(logits, mask)
    return normalized_entropy_from_log_probs(log_softmax(logits, mask), mask)


def legal_log_count(mask: torch.Tensor | None, n: int, like: torch.Tensor) -> torch.Tensor | float:
    """``log(#legal choices)`` per row (``like``'s shape and dtype; a Python float without a mask): the
    factor that turns a normalized entropy back into nats. Rows with at most one legal choice get
    ``log 2`` (their normalized entropy is 0, so the product stays 0)."""
    if mask is None:
        return math.log(n) if n > 1 else 0.0
    return torch.log(mask.sum(-1).clamp(min=2).to(like.dtype))


def k3_kl(log_ratio: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(old || new) from ``log_ratio = new_log_prob - old_log_prob`` of
    the taken action: ``(r - 1) - log r``. Non-negative, unbiased for the action's distribution.
    (TorchRL's ``kl_approx`` is k1, ``old - new``; k3 has lower variance and never goes negative.)"""
    return torch.expm1(log_ratio) - log_ratio


def masked_categorical(
    logits: torch.Tensor,
    action: torch.Tensor,
    mask: torch.Tensor | None,
    old_log_prob: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One head's per-step quantities from one log-softmax: ``(log_prob, normalized_entropy, k3)``.

    This is the reference of the fused kernel in :mod:`esper.kernels`.
    """
    mask = legal_mask(logits, mask)
    lsm = log_softmax(logits, mask)
    lp = _gather(lsm, action)
    ent = normalized_entropy_from_log_probs(lsm, mask)
    kl = k3_kl(lp - old_log_prob.to(lp.dtype))
    return lp, ent, kl


def sample(
    logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
    deterministic: bool = False,
    race: torch.Tensor | None = None,
) -> torch.Tensor:
    """Draw one choice per row without a host sync (exponential-race / Gumbel-max), never an illegal
    one while the row has a legal choice. ``deterministic`` takes the most likely legal choice.
    ``race``: the Exp(1) draws to use (``logits``' shape; e.g. each row drawn from its own generator,
    so a row's choice does not depend on which other rows share the batch); None draws them from
    ``generator``."""
    mask = legal_mask(logits, mask)
    scores = log_softmax(logits, mask)
    if not deterministic:
        if race is None:
            race = torch.empty_like(scores).exponential_(generator=generator)
        elif race.shape != scores.shape:
            raise ValueError(
                f"sample: race must have the logits' shape {list(scores.shape)}, got {list(race.shape)}"
            )
        scores = scores - race.log()
    scores = torch.where(mask, scores, -torch.inf)
    return scores.argmax(-1)


def _gather(lsm: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    return lsm.gather(-1, action.unsqueeze(-1)).squeeze(-1)


__all__ = [
    "compute_dtype",
    "k3_kl",
    "legal_log_count",
    "legal_mask",
    "log_prob",
    "log_softmax",
    "masked_categorical",
    "masked_logits",
    "normalized_entropy",
    "normalized_entropy_from_log_probs",
    "sample",
]
