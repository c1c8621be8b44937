"""The PPO loss over a TensorDict: per-head clipped surrogate, clipped value loss, masked normalized
entropy, per-head k3 KL and an early-stop flag — no host sync, compiles with ``fullgraph=True``.

Input (batch size ``[*B]``, usually ``[n_envs, T]``; per-step scalars may carry TorchRL's trailing 1):

==========================================  ===================================================
``advantage``                                 float ``[*B]`` (normalize it before, if wanted)
``value_target``                              float ``[*B]``
``state_value``                               float ``[*B]``: the anchor of value clipping. For a
                                              recurrent multi-epoch update this must be the value
                                              recomputed at the start of the update with the same
                                              hidden reconstruction (finding C4), not the rollout's
``(current, state_value)``                    float ``[*B]``: the current critic's estimate (grad);
                                              optional — without it there is no critic loss
single head: ``action``, ``action_log_prob``  int ``[*B]`` (an index; or one-hot ``[*B, n]``, int or
(or ``sample_log_prob``), ``action_mask``     bool, TorchRL's ``OneHot`` spec), float ``[*B]`` (old
                                              policy); optional bool ``[*B, n]``;
``(current, logits)``                         float ``[*B, n]``: the current policy (grad)
factored: the same per head under           ``(head, action)``, ``(head, action_log_prob)``,
``(head, ...)`` and ``(current, head, ...)``  ``(head, action_mask)``, ``(current, head, logits)``
``("collector", "mask")``                     optional bool ``[*B]``: False on padding steps
==========================================  ===================================================

Masked means. In factored mode (Esper's eight heads) head ``h`` counts at step ``t`` only where it
*mattered* — the op sampled at ``t`` makes ``h`` relevant (:func:`esper.core.masks.head_relevance`,
finding P1) — and had more than one legal choice, and the step is valid. Each head's surrogate,
entropy, KL and clip fraction is the mean over the steps where it counted (finding H3): a sparse head
such as ``blueprint`` is not diluted by the steps where it was ignored.

KL semantics (findings H6, M20). ``(head, "kl")`` is the mean k3 estimate over the steps where the
head counted: the KL of that head *given* it mattered. ``kl_approx`` estimates the KL of the joint
factored policy per step: by the chain rule the joint KL at a step is the sum of the KLs of the heads
that mattered there, so ``kl_approx = mean_t sum_h w[t,h] * k3[t,h]`` over valid steps. It equals
``sum_h freq_h * kl_h`` (``freq_h`` = share of valid steps where ``h`` counted) and is never inflated
by heads that did not matter. TorchRL's ``kl_approx`` is k1 (``old - new``); ours is k3.

Output: a TensorDict with TorchRL's names — ``loss_objective``, ``loss_critic``, ``loss_entropy``
(differentiable), ``entropy`` (sum over heads of normalized entropies), ``kl_approx``,
``clip_fraction``, ``value_clip_fraction``, ``explained_variance``, ``ESS``, ``max_ratio``,
``mean_ratio`` — plus ``min_ratio`` of the joint ratio, ``early_stop`` (bool: ``kl_approx > 1.5 *
target_kl``), and per head (factored mode) ``(head, loss_objective | entropy | kl | clip_fraction |
weight)`` and ``(head, choice_share)`` (``[n]``: the share of the steps where the head counted on which
the batch's action took each choice, so a low entropy says what it committed to). ``total_loss(out)``
sums the three ``loss_*`` terms. With ``entropy_floor`` set there is a fourth, ``loss_entropy_floor``:
``coef * sum_h relu(floor_h - H_h)`` over the heads' masked normalized entropies ``H_h`` (a head below its
floor gets ``coef`` more entropy bonus per unit; finding 004 P-4), which ``total_loss`` adds too.
``explained_variance`` is one scalar (shape ``[]``) over all valid steps, 0 when the target is constant;
TorchRL's is ``torch.var(..., dim=0)``, shape ``[1]`` on a flat ``[B, 1]`` batch (equal to ours there up
to its ``eps``), one value per time step on an ``[N, T, 1]`` batch.

TorchRL parity (single head, no ``action_mask`` or one with >= 2 legal choices on every step).
``ClipPPOLoss(actor, critic, clip_epsilon=e, entropy_coeff=c, critic_coeff=k, loss_critic_type=L,
clip_value=v)`` with ``normalize_advantage=False`` gives the same ``loss_objective``, ``loss_critic``,
``loss_entropy`` and ``entropy`` (values and gradients) as ``ppo_loss(td, clip_epsilon=e, entropy_coef=c,
value_coef=k, critic_loss=L, value_clip=v, normalize_entropy=False)``; TorchRL's defaults are ``k=1``,
``L="smooth_l1"``, ``v=None``, ``c=0.01``. Esper's own defaults differ (``critic_loss="half_l2"``,
``value_coef=0.5``, ``value_clip=10``, normalized entropy): the shell's trainer relies on them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from tensordict import TensorDict, TensorDictBase

from esper.core.checks import check_kind, key_str, per_step, require
from esper.core.distributions import compute_dtype, legal_log_count, legal_mask, masked_categorical
from esper.core.masks import head_relevance
from esper.core.spec import HEAD_INDEX, HEADS, KEYS, Keys, NestedKey

_WHERE = "ppo_loss"


def ppo_loss(
    td: TensorDictBase,
    *,
    factored: bool = False,
    clip_epsilon: float = 0.2,
    value_clip: float | None = 10.0,
    value_coef: float = 0.5,
    critic_loss: str = "half_l2",
    entropy_coef: float | Mapping[str, float] = 0.01,
    normalize_entropy: bool = True,
    target_kl: float | None = None,
    keys: Keys = KEYS,
    categorical: Callable = masked_categorical,
    counts: TensorDictBase | None = None,
    entropy_floor: float | Mapping[str, float] | None = None,
    entropy_floor_coef: float = 1.0,
) -> TensorDict:
    """PPO loss terms and diagnostics for one (mini)batch. See the module docstring for the contract.

    Args:
        factored: read Esper's eight heads (``esper.core.spec.HEADS``) and mask each by relevance;
            False reads one head under TorchRL's flat keys.
        clip_epsilon: ratio clip of the surrogate, ``[1 - eps, 1 + eps]``.
        value_clip: bound on ``|V_new - V_anchor|`` in the clipped value loss; None: no clipping
            (TorchRL's ``clip_value``, off by default there).
        value_coef: ``loss_critic = value_coef * mean(max(d(V_new, target), d(V_clipped, target)))``
            (TorchRL's ``critic_coeff``).
        critic_loss: the distance ``d``: ``"half_l2"`` ``0.5 * (V - target)^2`` (Esper's default, as in
            CleanRL), ``"l2"`` ``(V - target)^2`` and ``"smooth_l1"`` (Huber, delta 1), TorchRL's
            ``loss_critic_type`` values of the same names.
        entropy_coef: coefficient of the entropy bonus, one float or one per head (exactly the heads).
        normalize_entropy: True: each head's entropy divided by ``log(#legal choices)`` (in ``[0, 1]``,
            so one coefficient fits heads of any size); False: entropy in nats, as TorchRL reports it.
        target_kl: sets ``early_stop`` when ``kl_approx > 1.5 * target_kl``; None: never.
        categorical: the per-head ``(log_prob, entropy, kl)`` function; the default is the core's
            :func:`~esper.core.distributions.masked_categorical`, and
            :func:`esper.kernels.masked_categorical` (the fused kernel) is a drop-in for it.
        counts: the denominators of the masked means (:func:`loss_counts`), None: this batch's own.
            Data-parallel training passes the counts summed over every process's part of one
            minibatch: each process's terms are then its share of the whole minibatch's mean, and the
            sum over processes of the loss terms (and of their gradients), of ``kl_approx``,
            ``clip_fraction``, ``value_clip_fraction``, ``mean_ratio`` and the per-head terms is
            exactly the whole minibatch's. ``explained_variance``, ``ESS`` and the ratio extremes
            stay this batch's own.
        entropy_floor: a floor on each head's masked normalized entropy, one float or one per head;
            None: off. Adds ``loss_entropy_floor`` (:func:`_floor_term`); ``entropy_floor_coef`` weighs it.
    """
    heads = HEADS if factored else (None,)
    coefs, distance, floors = _check_args(
        td, factored=factored, clip_epsilon=clip_epsilon, value_clip=value_clip, value_coef=value_coef,
        critic_loss=critic_loss, entropy_coef=entropy_coef, target_kl=target_kl, keys=keys, heads=heads,
        floor=(entropy_floor, entropy_floor_coef, normalize_entropy, counts),
    )  # fmt: skip
    adv = per_step(td, keys.advantage, where=_WHERE, kind="float")
    dtype = compute_dtype(adv.dtype)
    adv = adv.to(dtype)
    valid = _valid(td, keys, dtype)  # None: every step is valid (no multiplies by ones)
    n_steps = torch.full((), float(adv.numel()), dtype=dtype, device=adv.device)
    own_valid = (n_steps if valid is None else valid.sum()).clamp(min=1.0)
    n_valid = own_valid if counts is None else counts["steps"].to(dtype).clamp(min=1.0)
    relevance = _relevance(td, keys, _WHERE) if factored else None

    out: dict[str, torch.Tensor | dict[str, torch.Tensor]] = {}
    # Sums over heads; each starts as its first head's term (no adds onto zeros for a single head).
    sums: dict[str, torch.Tensor] = {}
    for head in heads:
        w_count = None if counts is None else counts[_count_key(head)].to(dtype)
        terms, per_head = _head_terms(
            td, head, keys, adv, valid, relevance, n_steps, n_valid, w_count, categorical=categorical,
            normalize_entropy=normalize_entropy, clip_epsilon=clip_epsilon, entropy_coef=coefs[head],
            floor=None if floors is None else (floors[head], entropy_floor_coef, counts),
        )  # fmt: skip
        sums = {k: _acc(sums.get(k), v) for k, v in terms.items()}
        if head is not None:
            out[head] = per_head
    out.update(_joint_terms(sums, valid, n_valid, own_valid, target_kl))
    critic = dict(value_clip=value_clip, value_coef=value_coef, distance=distance, own_valid=own_valid)
    out.update(_critic_terms(td, keys, valid, n_valid, dtype, **critic))
    return TensorDict(out, batch_size=[])


def _check_args(
    td: TensorDictBase,
    *,
    factored: bool,
    clip_epsilon: float,
    value_clip: float | None,
    value_coef: float,
    critic_loss: str,
    entropy_coef: float | Mapping[str, float],
    target_kl: float | None,
    keys: Keys,
    heads: tuple,
    floor: tuple,
) -> tuple[dict, Callable[[torch.Tensor, torch.Tensor], torch.Tensor], dict | None]:
    """:func:`ppo_loss`'s arguments checked (every coefficient a finite Python number in range, NaN and
    inf refused; a batch dim; in factored mode exactly the heads' keys). Returns the entropy coefficient
    per head, the critic distance function and the entropy floor per head (None: no floor). ``floor``:
    ``(entropy_floor, entropy_floor_coef, normalize_entropy, counts)``."""
    coefs = _entropy_coefs(entropy_coef, heads)
    floors = _entropy_floors(*floor, heads=heads)
    distance = _critic_distance(critic_loss)
    _check_coef("clip_epsilon", clip_epsilon, positive=True)
    _check_coef("value_coef", value_coef, positive=False)
    if isinstance(entropy_coef, Mapping):
        for head, c in coefs.items():
            _check_coef(f"entropy_coef[{head!r}]", c, positive=False)
    else:
        _check_coef("entropy_coef", entropy_coef, positive=False)
    if value_clip is not None:
        _check_coef("value_clip", value_clip, positive=True, none_ok=True)
    if target_kl is not None:
        _check_coef("target_kl", target_kl, positive=True, none_ok=True)
    if td.batch_dims < 1:
        raise ValueError(f"{_WHERE}: the TensorDict needs at least one batch dim, got batch size []")
    if factored:
        _check_head_sets(td, keys)
    return coefs, distance, floors


def _head_terms(
    td: TensorDictBase,
    head: str | None,
    keys: Keys,
    adv: torch.Tensor,
    valid: torch.Tensor | None,
    relevance: torch.Tensor | None,
    n_steps: torch.Tensor,
    n_valid: torch.Tensor,
    w_count: torch.Tensor | None,
    *,
    categorical: Callable,
    normalize_entropy: bool,
    clip_epsilon: float,
    entropy_coef: float,
    floor: tuple | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One head's part of the loss: its terms to sum over heads (``objective``, ``loss_entropy``,
    ``entropy``, the per-step ``kl`` and weighted ``log_ratio``, ``clipped`` and ``weight`` sums, and
    ``floor`` with an entropy floor) and its own diagnostics (``(head, ...)`` of the module docstring).
    ``w_count``: the head's summed weight over every process (:func:`loss_counts`), None: this batch's
    own. ``floor``: ``(the head's floor, its coefficient, counts)`` or None."""
    dtype = adv.dtype
    logits, action, old_lp, mask = _head_inputs(td, head, keys, adv.shape)
    lp, ent, kl = categorical(logits, action, mask, old_lp)
    if not normalize_entropy:  # back to nats: the normalized entropy times log(#legal)
        ent = ent * legal_log_count(mask, logits.shape[-1], ent)
    old_lp = old_lp.to(lp.dtype)
    w = _head_weight(valid, mask, logits.shape[-1], relevance, head, adv)
    own_w = n_steps if w is None else w.sum()
    w_sum = own_w if w_count is None else w_count

    log_ratio = lp - old_lp
    ratio = log_ratio.exp()
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_epsilon, 1.0 + clip_epsilon) * adv)
    head_objective = -_wmean(surrogate, w, w_sum)
    head_entropy = _wmean(ent, w, w_sum)
    clipped = ((ratio - 1.0).abs() > clip_epsilon).to(dtype).detach()
    terms = {
        "objective": head_objective,
        "loss_entropy": head_entropy * -entropy_coef,
        "entropy": head_entropy.detach(),
        "kl": (kl if w is None else w * kl).detach(),
        "log_ratio": (log_ratio if w is None else w * log_ratio).detach(),
        "clipped": _msum(clipped, w),
        "weight": w_sum,
    }
    if floor is not None:
        whole = None if floor[2] is None else floor[2][f"{_count_key(head)}_entropy"].to(dtype)
        terms["floor"] = _floor_term(head_entropy, own_w, w_sum, whole, floor=floor[0], coef=floor[1])
    per_head = {
        "loss_objective": head_objective.detach(),
        "entropy": head_entropy.detach(),
        "kl": _wmean(kl.detach(), w, w_sum),
        "clip_fraction": _wmean(clipped, w, w_sum),
        "weight": w_sum / n_valid,
        "choice_share": _choice_share(action, logits.shape[-1], w, w_sum),
    }
    return terms, per_head


def _joint_terms(
    sums: dict[str, torch.Tensor],
    valid: torch.Tensor | None,
    n_valid: torch.Tensor,
    own_valid: torch.Tensor,
    target_kl: float | None,
) -> dict[str, torch.Tensor]:
    """The policy terms of the joint factored policy from the heads' sums (:func:`_head_terms`): the
    losses, ``kl_approx`` (the per-step KL summed over heads, averaged over valid steps), the clip
    fraction, the joint ratio's mean, extremes and ESS, and ``early_stop``."""
    kl_approx = _msum(sums["kl"], valid) / n_valid
    joint_ratio = sums["log_ratio"].exp()
    floor = {"loss_entropy_floor": sums["floor"]} if "floor" in sums else {}
    return dict(
        **floor,
        loss_objective=sums["objective"],
        loss_entropy=sums["loss_entropy"],
        entropy=sums["entropy"],
        kl_approx=kl_approx,
        clip_fraction=sums["clipped"] / sums["weight"].clamp(min=1.0),
        mean_ratio=_msum(joint_ratio, valid) / n_valid,
        max_ratio=_masked_extreme(joint_ratio, valid, largest=True),
        min_ratio=_masked_extreme(joint_ratio, valid, largest=False),
        ESS=_ess(joint_ratio, valid, own_valid),
        early_stop=kl_early_stop(kl_approx, target_kl),
    )


def loss_counts(
    td: TensorDictBase,
    *,
    factored: bool = False,
    keys: Keys = KEYS,
    entropy: bool = False,
    categorical: Callable = masked_categorical,
) -> TensorDict:
    """The denominators of :func:`ppo_loss`'s masked means for ``td`` (the same inputs, ``current``
    logits included): ``steps`` (valid steps) and, per head (``action`` for a single head), the steps
    where the head counted; float scalars, not clamped. Sum them over the parts of a minibatch that
    several processes hold and pass the sums as ``ppo_loss(counts=...)``. ``entropy``: also each head's
    sum of normalized entropies over the steps where it counted (``{head}_entropy``, no grad), what an
    entropy floor (``ppo_loss(entropy_floor=...)``) needs to judge the whole minibatch's entropy."""
    heads = HEADS if factored else (None,)
    if factored:
        _check_head_sets(td, keys)
    adv = per_step(td, keys.advantage, where=_WHERE, kind="float")
    dtype = compute_dtype(adv.dtype)
    adv = adv.to(dtype)
    valid = _valid(td, keys, dtype)
    n_steps = torch.full((), float(adv.numel()), dtype=dtype, device=adv.device)
    relevance = _relevance(td, keys, _WHERE) if factored else None
    out = {"steps": n_steps if valid is None else valid.sum()}
    for head in heads:
        logits, _, _, mask = _head_inputs(td, head, keys, adv.shape)
        w = _head_weight(valid, mask, logits.shape[-1], relevance, head, adv)
        out[_count_key(head)] = n_steps if w is None else w.sum()
        if entropy:
            logits, action, old_lp, mask = _head_inputs(td, head, keys, adv.shape)
            ent = categorical(logits.detach(), action, mask, old_lp)[1].to(dtype)
            out[f"{_count_key(head)}_entropy"] = _msum(ent, w)
    return TensorDict(out, batch_size=[])


def _count_key(head: str | None) -> str:
    return "action" if head is None else head


def decouple(
    td: TensorDictBase,
    *,
    factored: bool = False,
    rho_max: float = 1.0,
    keys: Keys = KEYS,
    categorical: Callable = masked_categorical,
) -> TensorDict:
    """Re-base stale steps for decoupled PPO (Hilton et al. 2021, "Batch size-invariance for policy
    optimization"): the surrogate clips the ratio around the *proximal* policy (the policy at the
    update's start) and each step is weighted by that policy's probability ratio to the *behaviour*
    policy (the one that acted), truncated at ``rho_max``. Since the weight is non-negative,
    ``w * min(r A, clip(r) A) = min(r (w A), clip(r) (w A))``: :func:`ppo_loss` on the re-based log-probs
    and on ``behaviour_weight * advantage`` is the decoupled objective, and its KL (so the early stop)
    is measured from the proximal policy, not from a behaviour policy several updates old.

    Reads what :func:`ppo_loss` reads: the stored ``action``, ``action_log_prob`` (behaviour) and
    ``action_mask`` per head, and the proximal policy's logits under ``(current, head, logits)`` (give
    them without grad). Returns a TensorDict of ``td``'s batch size with the proximal log-probability
    of the stored action under ``(head, action_log_prob)`` (``action_log_prob`` for one head) and
    ``behaviour_weight`` float ``[*B]`` = ``min(rho_max, exp(sum_h (lp_prox - lp_behaviour)))`` over the
    heads that counted at the step (factored: :func:`esper.core.masks.head_relevance`, finding P1), the
    joint ratio of the factored policy. On data the proximal policy collected, the weight is 1.
    """
    _check_coef("rho_max", rho_max, positive=True, where="decouple")
    if td.batch_dims < 1:
        raise ValueError("decouple: the TensorDict needs at least one batch dim, got batch size []")
    heads = HEADS if factored else (None,)
    if factored:
        _check_head_sets(td, keys, "decouple")
    shape = td.batch_size
    relevance = _relevance(td, keys, "decouple") if factored else None
    result = TensorDict({}, batch_size=shape)
    log_w = None
    for head in heads:
        logits, action, old_lp, mask = _head_inputs(td, head, keys, shape, "decouple")
        lp, _, _ = categorical(logits.detach(), action, mask, old_lp)
        old_lp = old_lp.to(lp.dtype)
        w = _head_weight(None, mask, logits.shape[-1], relevance, head, lp)
        delta = lp - old_lp
        log_w = _acc(log_w, delta if w is None else w * delta)
        result.set(keys.log_prob if head is None else keys.head(head, keys.log_prob), lp)
    result.set("behaviour_weight", log_w.clamp(max=math.log(rho_max)).exp())
    return result


def total_loss(losses: TensorDictBase) -> torch.Tensor:
    """``loss_objective + loss_critic + loss_entropy`` (the critic term only where present), plus
    ``loss_entropy_floor`` where an entropy floor is set."""
    total = losses["loss_objective"] + losses["loss_entropy"]
    if "loss_critic" in losses.keys():
        total = total + losses["loss_critic"]
    if "loss_entropy_floor" in losses.keys():
        total = total + losses["loss_entropy_floor"]
    return total


# --------------------------------------------------------------------------------------------- helpers
def _acc(total: torch.Tensor | None, term: torch.Tensor) -> torch.Tensor:
    return term if total is None else total + term


# A weight of None means "all ones": the common unmasked single-head case skips the multiplies. The
# branches below are on the *presence* of masks and on static shapes, never on tensor values.
def _msum(x: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    return x.sum() if w is None else (x * w).sum()


def _wmean(x: torch.Tensor, w: torch.Tensor | None, w_sum: torch.Tensor) -> torch.Tensor:
    return _msum(x, w) / w_sum.clamp(min=1.0)


def _masked_extreme(x: torch.Tensor, valid: torch.Tensor | None, *, largest: bool) -> torch.Tensor:
    """Max (or min) of ``x`` over valid steps; 1.0 (a ratio's neutral value) when none is valid."""
    if x.numel() == 0:
        return x.new_ones(())
    if valid is None:
        return x.amax() if largest else x.amin()
    fill = -torch.inf if largest else torch.inf
    picked = torch.where(valid > 0, x, fill)
    return torch.where(valid.sum() > 0, picked.amax() if largest else picked.amin(), 1.0)


def _head_weight(
    valid: torch.Tensor | None,
    mask: torch.Tensor | None,
    n: int,
    relevance: torch.Tensor | None,
    head: str | None,
    like: torch.Tensor,
) -> torch.Tensor | None:
    """Where a head counts (``like``'s shape and dtype): valid steps with more than one legal choice
    where the head mattered. None when that is every step."""
    w = valid
    if mask is not None:
        several = (mask.sum(-1) > 1).to(like.dtype)
        w = several if w is None else w * several
    elif n <= 1:  # a single choice everywhere: the head never counts
        w = torch.zeros_like(like)
    if relevance is not None:
        rel = relevance[..., HEAD_INDEX[head]].to(like.dtype)
        w = rel if w is None else w * rel
    return w


def _choice_share(action: torch.Tensor, n: int, w: torch.Tensor | None, w_sum: torch.Tensor) -> torch.Tensor:
    """``[n]``: the share of the steps where a head counted (weights ``w``, their sum ``w_sum``) on which
    it chose each of its ``n`` choices (what a low entropy committed to)."""
    picked = torch.nn.functional.one_hot(action, n).to(w_sum.dtype)
    if w is not None:
        picked = picked * w.unsqueeze(-1)
    return picked.reshape(-1, n).sum(0) / w_sum.clamp(min=1.0)


def _valid(td: TensorDictBase, keys: Keys, dtype: torch.dtype) -> torch.Tensor | None:
    if keys.valid in td.keys(include_nested=True):
        return per_step(td, keys.valid, where=_WHERE, kind="bool").to(dtype)
    return None


def _ess(ratio: torch.Tensor, valid: torch.Tensor | None, n_valid: torch.Tensor) -> torch.Tensor:
    """Normalized effective sample size of the importance weights, in (0, 1]."""
    s1 = _msum(ratio, valid)
    s2 = _msum(ratio.square(), valid)
    return s1.square() / (s2 * n_valid).clamp(min=torch.finfo(ratio.dtype).tiny)


def _critic_terms(
    td: TensorDictBase,
    keys: Keys,
    valid: torch.Tensor | None,
    n_valid: torch.Tensor,
    dtype: torch.dtype,
    *,
    value_clip: float | None,
    value_coef: float,
    distance: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    own_valid: torch.Tensor,
) -> dict[str, torch.Tensor]:
    new_key = keys.current_key(keys.state_value)
    if new_key not in td.keys(include_nested=True):
        return {}
    value = per_step(td, new_key, where=_WHERE, kind="float").to(dtype)
    target = per_step(td, keys.value_target, where=_WHERE, kind="float").to(dtype)
    unclipped = distance(value, target)
    if value_clip is None:
        per_step_loss = unclipped
        clipped_frac = value.new_zeros(())
    else:
        anchor = per_step(td, keys.state_value, where=_WHERE, kind="float").to(dtype)
        moved = value - anchor
        clipped_value = anchor + moved.clamp(-value_clip, value_clip)
        per_step_loss = torch.maximum(unclipped, distance(clipped_value, target))
        clipped_frac = _msum((moved.abs() > value_clip).to(dtype), valid).detach() / n_valid
    loss_critic = value_coef * _msum(per_step_loss, valid) / n_valid
    return {
        "loss_critic": loss_critic,
        "value_clip_fraction": clipped_frac,
        "explained_variance": _explained_variance(value.detach(), target, valid, own_valid),
    }


_CRITIC_DISTANCES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "half_l2": lambda v, t: 0.5 * (v - t).square(),
    "l2": lambda v, t: (v - t).square(),
    "smooth_l1": lambda v, t: torch.nn.functional.smooth_l1_loss(v, t, reduction="none"),
}


def _critic_distance(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if name not in _CRITIC_DISTANCES:
        raise ValueError(f"{_WHERE}: critic_loss must be one of {list(_CRITIC_DISTANCES)}, got {name!r}")
    return _CRITIC_DISTANCES[name]


def _explained_variance(
    pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor | None, n_valid: torch.Tensor
) -> torch.Tensor:
    """``1 - Var(target - pred) / Var(target)`` over valid steps; 0 when the target has no variance."""

    def var(x: torch.Tensor) -> torch.Tensor:
        mean = _msum(x, valid) / n_valid
        return _msum((x - mean).square(), valid) / n_valid

    var_t = var(target)
    ok = var_t > 1e-12
    return torch.where(ok, 1.0 - var(target - pred) / torch.where(ok, var_t, 1.0), 0.0)


def _head_inputs(
    td: TensorDictBase, head: str | None, keys: Keys, shape: torch.Size, where: str = _WHERE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    at = (lambda k: keys.head(head, k)) if head is not None else (lambda k: k)
    logits_key = keys.current_key(keys.logits, head)
    logits = require(td, logits_key, where=where)
    check_kind(logits, logits_key, kind="float", where=where)
    if logits.shape[:-1] != shape:
        raise ValueError(
            f"{where}: {key_str(logits_key)} must have shape {[*shape, 'n']}, got {list(logits.shape)}"
        )
    action = _action_index(td, at(keys.action), logits.shape, where)
    present = td.keys(include_nested=True)
    lp_key = at(keys.log_prob)
    if lp_key not in present and at(keys.legacy_log_prob) in present:
        lp_key = at(keys.legacy_log_prob)
    old_lp = per_step(td, lp_key, where=where, kind="float", batch_shape=shape)
    mask = None
    if at(keys.action_mask) in td.keys(include_nested=True):
        mask = td[at(keys.action_mask)]
        check_kind(mask, at(keys.action_mask), kind="bool", where=where)
        if mask.shape != logits.shape:
            raise ValueError(
                f"{where}: {key_str(at(keys.action_mask))} must have the logits' shape "
                f"{list(logits.shape)}, got {list(mask.shape)}"
            )
    # A -inf logit is an illegal choice (TorchRL's masked distributions write them): part of the mask,
    # so the entropy's 0 * -inf and log_softmax's -inf never reach the loss or its gradient.
    return logits, action, old_lp, legal_mask(logits, mask)


def _action_index(
    td: TensorDictBase, key: NestedKey, logits_shape: torch.Size, where: str = _WHERE
) -> torch.Tensor:
    """The action as an int64 index ``[*B]``: stored as an index (``[*B]`` or ``[*B, 1]``) or one-hot
    with the logits' shape ``[*B, n]`` (TorchRL's ``OneHot`` spec, e.g. ``GymEnv``'s discrete actions;
    read as its argmax, so exactly one entry per row must be set)."""
    action = require(td, key, where=where)
    shape, n = logits_shape[:-1], logits_shape[-1]
    if n > 1 and action.shape == logits_shape:
        check_kind(action, key, kind="one_hot", where=where)
        return action.to(torch.uint8 if action.dtype == torch.bool else action.dtype).argmax(-1)
    if action.shape not in (shape, (*shape, 1)):
        raise ValueError(
            f"{where}: {key_str(key)} must be an index of shape {list(shape)} or {[*shape, 1]}, or "
            f"one-hot with the logits' shape {list(logits_shape)}; got {list(action.shape)}. For other "
            f"layouts store the index under another key and pass keys=Keys(action=...)"
        )
    return per_step(td, key, where=where, kind="int", batch_shape=shape).long()


def _relevance(td: TensorDictBase, keys: Keys, where: str) -> torch.Tensor:
    """Where each head mattered, from the stored op (:func:`esper.core.masks.head_relevance`)."""
    return head_relevance(per_step(td, keys.head("op", keys.action), where=where, kind="int").long())


def _check_head_sets(td: TensorDictBase, keys: Keys, where: str = _WHERE) -> None:
    current = require(td, keys.current, where=where)
    if not isinstance(current, TensorDictBase):
        raise TypeError(f"{where}: {keys.current!r} must be a TensorDict of per-head outputs")
    got_current = {k for k in current.keys() if isinstance(current.get(k), TensorDictBase)}
    got_actions = {h for h in td.keys() if isinstance(td.get(h), TensorDictBase) and h in HEADS}
    missing = [h for h in HEADS if h not in got_current or h not in got_actions]
    extra = sorted(got_current - set(HEADS))
    if missing or extra:
        raise KeyError(
            f"{where}: mismatched head sets: the factored loss needs exactly the heads {list(HEADS)} "
            f"under (head, ...) and ({keys.current!r}, head, ...); missing {missing}, unexpected {extra}"
        )


def _check_coef(name: str, x: float, *, positive: bool, none_ok: bool = False, where: str = _WHERE) -> None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{where}: {name} must be a Python float, got {type(x).__name__}")
    ok = math.isfinite(x) and (x > 0 if positive else x >= 0)
    if not ok:
        rng = "> 0" if positive else ">= 0"
        raise ValueError(f"{where}: {name} must be finite and {rng}{' or None' if none_ok else ''}, got {x}")


def _entropy_coefs(
    entropy_coef: float | Mapping[str, float], heads: tuple, name: str = "entropy_coef"
) -> dict:
    if isinstance(entropy_coef, Mapping):
        if heads == (None,):
            raise ValueError(f"{_WHERE}: per-head {name} needs factored=True; pass a float")
        if set(entropy_coef) != set(heads):
            raise ValueError(
                f"{_WHERE}: per-head {name} must name exactly the heads {list(heads)}; "
                f"missing {sorted(set(heads) - set(entropy_coef))}, "
                f"unknown {sorted(set(entropy_coef) - set(heads))}"
            )
        return {h: float(entropy_coef[h]) for h in heads}
    return dict.fromkeys(heads, float(entropy_coef))


def _entropy_floors(
    floor: float | Mapping[str, float] | None,
    coef: float,
    normalize_entropy: bool,
    counts: TensorDictBase | None,
    *,
    heads: tuple,
) -> dict | None:
    """The entropy floor per head, checked (each in ``[0, 1]``, the coefficient ``>= 0``, normalized
    entropies, entropy sums in ``counts``); None: no floor."""
    if floor is None:
        return None
    _check_coef("entropy_floor_coef", coef, positive=False)
    if not normalize_entropy:
        raise ValueError(f"{_WHERE}: entropy_floor is a floor on normalized entropies; set normalize_entropy")
    floors = _entropy_coefs(floor, heads, name="entropy_floor")
    for head, f in floors.items():
        per_head = isinstance(floor, Mapping)
        _check_coef(f"entropy_floor[{head!r}]" if per_head else "entropy_floor", f, positive=False)
        if f > 1:
            raise ValueError(f"{_WHERE}: entropy_floor must be in [0, 1] (normalized entropy), got {f}")
    if counts is not None and f"{_count_key(heads[0])}_entropy" not in counts.keys():
        raise KeyError(
            f"{_WHERE}: entropy_floor with counts needs their entropy sums: loss_counts(entropy=True)"
        )
    return floors


def _floor_term(
    ent: torch.Tensor,
    own: torch.Tensor,
    w_sum: torch.Tensor,
    whole: torch.Tensor | None,
    *,
    floor: float,
    coef: float,
) -> torch.Tensor:
    """One head's entropy-floor hinge, ``coef * relu(floor - H)`` of its masked mean normalized entropy
    ``H`` (``ent``, with grad; 0 where the head never counted): below the floor the head's entropy gets an
    extra bonus of ``coef`` per unit, above it nothing. Under data parallelism (``whole``: the sum of the
    head's entropies over every process, ``own`` and ``w_sum`` this process's and every process's
    weights) the hinge is judged on the whole minibatch's ``H`` and written ``coef * active * (floor *
    own / w_sum - ent)``, ``ent`` this process's share: the processes' terms and gradients then sum to
    the whole minibatch's."""
    n = w_sum.clamp(min=1.0)
    h = ent.detach() if whole is None else whole / n
    active = ((h < floor) & (w_sum > 0)).to(ent.dtype)
    return coef * active * (floor * own / n - ent)


def kl_early_stop(kl_approx: torch.Tensor, target_kl: float | None) -> torch.Tensor:
    """The KL early-stop rule: ``kl_approx > 1.5 * target_kl`` (bool, ``kl_approx``'s shape); never with
    ``target_kl`` None. :func:`ppo_loss` reports it as ``early_stop``; several processes apply it to the
    KL summed over them (:class:`esper.shell.agent.steps.SharedStep`)."""
    if target_kl is None:
        return torch.zeros_like(kl_approx, dtype=torch.bool)
    return kl_approx > 1.5 * target_kl


__all__ = ["decouple", "kl_early_stop", "loss_counts", "ppo_loss", "total_loss"]
