"""Learning from kept episodes: behaviour cloning and an implicit-Q-learning-style (IQL) learner over
a TensorDict of stored steps, no host sync, compiling with ``torch.compile(fullgraph=True)``.

Both read the factored action as :func:`esper.core.ppo_loss` does, and count a head at a step only where
:func:`ppo_loss` counts it: the stored op made the head relevant (:func:`esper.core.masks.head_relevance`,
finding P1), the head had more than one legal choice under its stored mask, and the step is valid
(``("collector", "mask")``). Each head's term is the mean over the steps where it counted (finding H3),
and the heads' terms are summed: the log-likelihood of the joint factored action, head by head.

Input (batch ``[*B]``, usually ``[episodes, T]``; per-step scalars may carry TorchRL's trailing 1):

=====================================================  ===============================================
``(head, "action")``, ``(head, "action_mask")``        int ``[*B]`` (or one-hot), optional bool
                                                       ``[*B, n]``: the stored action and the mask it
                                                       was taken under, per head of ``HEADS``
``("current", head, "logits")``                        float ``[*B, n]``: the policy being trained (grad)
``("current", "state_value")``                         float ``[*B]``: its critic (grad); :func:`bc_loss`
                                                       reads it only with ``value_target``
``value_target``                                       float ``[*B]`` (:func:`bc_loss`, optional): what
                                                       the critic regresses to, e.g. the episode's
                                                       Monte Carlo return from the step
``("next", "reward")``, ``("next", "terminated")``     :func:`iql_losses`: the step's (scaled) reward,
                                                       bool: nothing follows (no bootstrap)
``("next", "state_value")``                            :func:`iql_losses`: V(s_{t+1}) of a target critic
                                                       (no grad; on an episode's last step, V of the
                                                       post-action state)
``("collector", "mask")``                              optional bool ``[*B]``: False on padding steps
=====================================================  ===============================================

:func:`bc_loss` is the negative log-likelihood of the stored actions (a demonstrator's, e.g. a fixed
plan's or the heuristic's). :func:`iql_losses` is the IQL family (Kostrikov et al., "Offline
reinforcement learning with implicit Q-learning", 2021) on a recurrent actor-critic that has a state
value and no Q head: the one-step TD target ``q = r + gamma * V_target(s') * (1 - terminated)`` stands
for ``Q(s, a)`` of the stored action (exact where the host's training is deterministic given the
action; an estimate otherwise), the critic regresses to it by expectile regression
(``|tau - 1(q < V)| * (q - V)^2``: ``tau > 0.5`` leans V towards the better actions seen in a state, so
V approaches the best in-data value rather than the demonstrator's average), and the policy maximizes
the advantage-weighted log-likelihood ``min(exp(temperature * (q - V)), max_weight) * log pi(a | s)``
(advantage-weighted regression: it clones the stored actions that did better than V expected, and never
asks the policy for an action the data does not hold). ``temperature`` multiplies the advantage, as
TorchRL's ``IQLLoss`` reads it (the paper's inverse temperature beta); 0 gives :func:`bc_loss`'s policy
term. The target critic (``("next", "state_value")``) is the caller's: a slowly moving copy of the
critic, as IQL's target networks are.

Both return a TensorDict with ``loss_objective`` (the policy term), ``loss_entropy`` (minus
``entropy_coef`` times the masked mean of each head's normalized entropy, summed) and, where there is a
critic, ``loss_critic``: :func:`esper.core.loss.total_loss` sums them, as for :func:`ppo_loss`
(TorchRL's ``IQLLoss`` names them ``loss_actor`` and ``loss_value``). Diagnostics: ``log_likelihood``
(the summed per-head means), ``accuracy`` (the share of valid steps where every head that counted would
have chosen the stored action greedily), ``entropy``, and per head ``(head, "log_likelihood" |
"accuracy" | "entropy" | "weight")``; :func:`iql_losses` adds ``advantage_mean``, ``weight_mean``,
``weight_max``, ``weight_clip_fraction``, ``value_mean`` and ``explained_variance`` (of q by V).
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict, TensorDictBase

from esper.core.checks import check_kind, key_str, per_step, require
from esper.core.distributions import compute_dtype, legal_mask, masked_categorical
from esper.core.loss import (
    _action_index,
    _check_head_sets,
    _explained_variance,
    _head_weight,
    _msum,
    _relevance,
    _wmean,
)
from esper.core.spec import HEADS, KEYS, Keys


def bc_loss(
    td: TensorDictBase,
    *,
    entropy_coef: float = 0.0,
    value_coef: float = 0.5,
    keys: Keys = KEYS,
) -> TensorDict:
    """Behaviour cloning of the stored factored actions (the module docstring). With ``value_target``
    and ``("current", "state_value")`` in ``td`` the critic also regresses to the target:
    ``loss_critic = value_coef * mean(0.5 * (V - value_target)^2)`` over valid steps, and
    ``explained_variance`` is reported."""
    where = "bc_loss"
    _check_coef(where, "entropy_coef", entropy_coef)
    _check_coef(where, "value_coef", value_coef)
    out, valid, n_valid, dtype = _policy_terms(td, keys, where, None, entropy_coef)
    present = td.keys(include_nested=True)
    if keys.current_key(keys.state_value) in present and keys.value_target in present:
        value = per_step(td, keys.current_key(keys.state_value), where=where, kind="float").to(dtype)
        target = per_step(td, keys.value_target, where=where, kind="float").to(dtype)
        out["loss_critic"] = value_coef * _msum(0.5 * (value - target).square(), valid) / n_valid
        out["explained_variance"] = _explained_variance(value.detach(), target, valid, n_valid)
    return TensorDict(out, batch_size=[])


def iql_losses(
    td: TensorDictBase,
    *,
    gamma: float = 0.99,
    expectile: float = 0.7,
    temperature: float = 3.0,
    max_weight: float = 100.0,
    value_coef: float = 1.0,
    entropy_coef: float = 0.0,
    keys: Keys = KEYS,
) -> TensorDict:
    """The IQL-family losses of the module docstring: expectile regression of V on the one-step TD
    target, and the advantage-weighted log-likelihood of the stored actions.

    Args:
        gamma: the discount of the TD target.
        expectile: ``tau`` in ``(0, 1)``; 0.5 is plain mean regression (V of the data's policy).
        temperature: >= 0, multiplies the advantage in the policy's weight ``exp(temperature * A)``.
        max_weight: > 0, the weight's cap (IQL's 100).
        value_coef: the critic term's weight.
        entropy_coef: the entropy bonus (0: none, as in IQL).
    """
    where = "iql_losses"
    for name, x in (("gamma", gamma), ("temperature", temperature), ("value_coef", value_coef),
                    ("entropy_coef", entropy_coef)):  # fmt: skip
        _check_coef(where, name, x)
    _check_coef(where, "max_weight", max_weight, positive=True)
    if not 0.0 < expectile < 1.0 or not 0.0 <= gamma <= 1.0:
        raise ValueError(
            f"{where}: expectile must be in (0, 1) and gamma in [0, 1], got {expectile}, {gamma}"
        )
    value_key = keys.current_key(keys.state_value)
    value = per_step(td, value_key, where=where, kind="float")
    dtype = compute_dtype(value.dtype)
    value = value.to(dtype)
    reward = per_step(td, keys.reward, where=where, kind="float").to(dtype)
    terminated = per_step(td, keys.terminated, where=where, kind="bool")
    next_value = per_step(td, keys.next_state_value, where=where, kind="float").to(dtype).detach()
    q = reward + gamma * torch.where(terminated, 0.0, next_value)
    diff = q - value
    tau = torch.where(diff < 0, 1.0 - expectile, expectile)
    advantage = diff.detach()
    weight = torch.exp(temperature * advantage).clamp(max=max_weight)
    out, valid, n_valid, _ = _policy_terms(td, keys, where, weight, entropy_coef)
    out["loss_critic"] = value_coef * _msum(tau * diff.square(), valid) / n_valid
    out["advantage_mean"] = _msum(advantage, valid) / n_valid
    out["weight_mean"] = _msum(weight, valid) / n_valid
    seen = weight if valid is None else torch.where(valid > 0, weight, 0.0)
    out["weight_max"] = seen.amax() if seen.numel() else weight.new_zeros(())
    out["weight_clip_fraction"] = _msum((weight >= max_weight).to(dtype), valid) / n_valid
    out["value_mean"] = _msum(value.detach(), valid) / n_valid
    out["explained_variance"] = _explained_variance(value.detach(), q, valid, n_valid)
    return TensorDict(out, batch_size=[])


# --------------------------------------------------------------------------------------------- helpers
def _policy_terms(
    td: TensorDictBase, keys: Keys, where: str, step_weight: torch.Tensor | None, entropy_coef: float
) -> tuple[dict, torch.Tensor | None, torch.Tensor, torch.dtype]:
    """The per-head (weighted) log-likelihood, entropy and greedy accuracy over the steps where each
    head counted; ``step_weight [*B]`` (None: 1) multiplies each step's log-likelihood. Returns the
    output entries, the valid-step weight, its count and the dtype."""
    if td.batch_dims < 1:
        raise ValueError(f"{where}: the TensorDict needs at least one batch dim, got batch size []")
    _check_head_sets(td, keys, where)
    shape = td.batch_size
    dtype = compute_dtype(require(td, keys.current_key(keys.logits, "op"), where=where).dtype)
    valid = None
    if keys.valid in td.keys(include_nested=True):
        valid = per_step(td, keys.valid, where=where, kind="bool").to(dtype)
    n_steps = torch.full((), float(math.prod(shape)), dtype=dtype, device=td.device)
    n_valid = (n_steps if valid is None else valid.sum()).clamp(min=1.0)
    relevance = _relevance(td, keys, where)
    out: dict = {}
    objective = entropy = loglik = None
    matched = torch.ones(shape, dtype=torch.bool, device=relevance.device)
    for head in HEADS:
        logits, action, mask = _head(td, head, keys, shape, where)
        lp, ent, _ = masked_categorical(
            logits, action, mask, torch.zeros(shape, dtype=dtype, device=logits.device)
        )
        w = _head_weight(valid, mask, logits.shape[-1], relevance, head, lp)
        w_sum = n_steps if w is None else w.sum()
        greedy = torch.where(mask, logits.detach(), -torch.inf).argmax(-1) == action
        counted = torch.ones_like(greedy) if w is None else w > 0
        matched = matched & (greedy | ~counted)
        head_ll = _wmean(lp, w, w_sum)
        # the step weight multiplies the head's weight, never lp itself: an irrelevant head's stored
        # action may be illegal (lp the dtype's minimum), and weight * lp would overflow before the 0
        weighted = (
            head_ll
            if step_weight is None
            else _wmean(lp, step_weight if w is None else step_weight * w, w_sum)
        )
        head_ent = _wmean(ent, w, w_sum)
        objective = -weighted if objective is None else objective - weighted
        entropy = head_ent if entropy is None else entropy + head_ent
        loglik = head_ll.detach() if loglik is None else loglik + head_ll.detach()
        out[head] = {
            "log_likelihood": head_ll.detach(),
            "accuracy": _wmean(greedy.to(dtype), w, w_sum),
            "entropy": head_ent.detach(),
            "weight": w_sum / n_valid,
        }
    out.update(
        loss_objective=objective,
        loss_entropy=-entropy_coef * entropy,
        entropy=entropy.detach(),
        log_likelihood=loglik,
        accuracy=_msum(matched.to(dtype), valid) / n_valid,
    )
    return out, valid, n_valid, dtype


def _head(
    td: TensorDictBase, head: str, keys: Keys, shape: torch.Size, where: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One head's current logits, stored action index and legal mask (:func:`legal_mask` of the
    stored ``action_mask`` and the logits)."""
    logits_key = keys.current_key(keys.logits, head)
    logits = require(td, logits_key, where=where)
    check_kind(logits, logits_key, kind="float", where=where)
    if logits.shape[:-1] != shape:
        raise ValueError(
            f"{where}: {key_str(logits_key)} must have shape {[*shape, 'n']}, got {list(logits.shape)}"
        )
    action = _action_index(td, keys.head(head, keys.action), logits.shape, where)
    mask_key = keys.head(head, keys.action_mask)
    mask = None
    if mask_key in td.keys(include_nested=True):
        mask = td[mask_key]
        check_kind(mask, mask_key, kind="bool", where=where)
        if mask.shape != logits.shape:
            raise ValueError(
                f"{where}: {key_str(mask_key)} must have the logits' shape {list(logits.shape)}, got "
                f"{list(mask.shape)}"
            )
    return logits, action, legal_mask(logits, mask)


def _check_coef(where: str, name: str, x: float, *, positive: bool = False) -> None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{where}: {name} must be a Python float, got {type(x).__name__}")
    if not math.isfinite(x) or (x <= 0 if positive else x < 0):
        raise ValueError(f"{where}: {name} must be finite and {'> 0' if positive else '>= 0'}, got {x}")


__all__ = ["bc_loss", "iql_losses"]
