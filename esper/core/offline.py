"""Learning from kept episodes: behaviour cloning, implicit Q-learning (IQL) and a Q-free variant of it
over a TensorDict of stored steps, no host sync, compiling with ``torch.compile(fullgraph=True)``.

All read the factored action as :func:`esper.core.ppo_loss` does, and count a head at a step only where
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
``("current", "state_value")``                         float ``[*B]``: its critic V(s) (grad);
                                                       :func:`bc_loss` reads it only with
                                                       ``value_target``
``value_target``                                       float ``[*B]`` (:func:`bc_loss`, optional): what
                                                       the critic regresses to, e.g. the episode's
                                                       Monte Carlo return from the step
``("current", "state_action_value")``                  :func:`iql_losses`: float ``[*B, K]`` (or
                                                       ``[*B]``): the K critics' Q(s, a) of the stored
                                                       action (grad; K = 2, twin, as the paper)
``("target", "state_action_value")``                   :func:`iql_losses`: float ``[*B, K']`` (or
                                                       ``[*B]``): the target critics' Q(s, a), slowly
                                                       moving copies of them (no grad); their minimum
                                                       is the Q the value and the policy read
``("next", "reward")``, ``("next", "terminated")``     :func:`iql_losses`, :func:`expectile_td_losses`:
                                                       the step's (scaled) reward, bool: nothing
                                                       follows (no bootstrap)
``("next", "state_value")``                            V(s_{t+1}) (no grad; on an episode's last step,
                                                       V of the post-action state): the current V for
                                                       :func:`iql_losses`, a target copy's for
                                                       :func:`expectile_td_losses`
``("collector", "mask")``                              optional bool ``[*B]``: False on padding steps
=====================================================  ===============================================

:func:`bc_loss` is the negative log-likelihood of the stored actions (a demonstrator's, e.g. a fixed
plan's or the heuristic's).

:func:`iql_losses` is IQL as Kostrikov et al. define it ("Offline reinforcement learning with implicit
Q-learning", 2021), three regressions that never query an action the data does not hold:

- V by expectile regression on the target critics' Q: ``u = Q_target(s, a) - V(s)``, the term
  ``|tau - 1(u < 0)| * u^2`` with ``Q_target = min_k Q_target_k`` (the paper's twin Q, clipped double
  Q). ``tau > 0.5`` leans V towards the better actions seen in a state: an upper expectile of Q over the
  data's actions, approaching the best in-data action's value as ``tau -> 1``. Q, not the sampled
  return, is what V's expectile is taken over: the transitions' noise (a lucky reward, a lucky next
  state) is averaged out by Q's mean regression first, so the optimism is over actions only.
- each Q by mean squared error on the one-step target ``r + gamma * (1 - terminated) * V(s')``, V(s')
  the current V's (no gradient): ``sum_k (Q_k(s, a) - y)^2`` per step, as the paper sums its twins'.
- the policy by advantage-weighted regression: the weight ``min(exp(temperature * (Q_target(s, a) -
  V(s))), max_weight)`` (no gradient; the paper's beta and cap 100) times ``log pi(a | s)`` of the
  stored action, summed over heads as :func:`bc_loss` does (temperature 0: :func:`bc_loss`'s policy term).

The networks, the target copies and their Polyak steps are the caller's (:mod:`esper.shell.agent.pretrain`).

:func:`expectile_td_losses` is the Q-free variant the project called IQL before (issue 104): on a
recurrent actor-critic with a state value and no Q head, the one-step TD sample ``q = r + gamma *
V_target(s') * (1 - terminated)`` stands in for ``Q(s, a)`` (``("next", "state_value")`` from a slowly
moving copy of the critic); V's expectile is taken over that sample and the policy's advantage is
``q - V``. Where transitions are noisy, V's optimism then also leans towards lucky transitions, which
the paper's separate Q averages out; where the host is deterministic given the action it is IQL with
``Q = q``.

``temperature`` multiplies the advantage, as TorchRL's ``IQLLoss`` reads it (the paper's inverse
temperature beta). All return a TensorDict with ``loss_objective`` (the policy term), ``loss_entropy``
(minus ``entropy_coef`` times the masked mean of each head's normalized entropy, summed) and, where there
is a critic, ``loss_critic`` (for :func:`iql_losses` V's and Q's terms together):
:func:`esper.core.loss.total_loss` sums them, as for :func:`ppo_loss` (TorchRL's ``IQLLoss`` names them
``loss_actor``, ``loss_value`` and ``loss_qvalue``). Diagnostics: ``log_likelihood`` (the summed
per-head means), ``accuracy`` (the share of valid steps where every head that counted would have chosen
the stored action greedily), ``entropy``, and per head ``(head, "log_likelihood" | "accuracy" |
"entropy" | "weight")``; the IQL family adds ``advantage_mean``, ``weight_mean``, ``weight_max``,
``weight_clip_fraction``, ``value_mean`` and ``explained_variance`` (of what V regresses to, by V), and
:func:`iql_losses` ``expectile_loss`` and ``td_loss`` (V's and Q's terms, detached, before their
coefficients), ``q_mean`` (the target critics' minimum) and ``q_explained_variance`` (of the TD target by
the critics' mean).
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


def expectile_td_losses(
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
    """The Q-free variant of the module docstring (what ``iql_losses`` was before issue 104):
    expectile regression of V on the one-step TD sample ``r + gamma * V_target(s')``, and the
    log-likelihood of the stored actions weighted by ``exp(temperature * (sample - V))``.

    Args:
        gamma: the discount of the TD target.
        expectile: ``tau`` in ``(0, 1)``; 0.5 is plain mean regression (V of the data's policy).
        temperature: >= 0, multiplies the advantage in the policy's weight ``exp(temperature * A)``.
        max_weight: > 0, the weight's cap (IQL's 100).
        value_coef: the critic term's weight.
        entropy_coef: the entropy bonus (0: none, as in IQL).
    """
    where = "expectile_td_losses"
    _check_iql_coefs(where, gamma, expectile, temperature, max_weight, value_coef, entropy_coef)
    value_key = keys.current_key(keys.state_value)
    value = per_step(td, value_key, where=where, kind="float")
    dtype = compute_dtype(value.dtype)
    value = value.to(dtype)
    q = _td_target(td, keys, where, gamma, dtype)
    diff, tau, advantage, weight = _expectile_weights(q, value, expectile, temperature, max_weight)
    out, valid, n_valid, _ = _policy_terms(td, keys, where, weight, entropy_coef)
    out["loss_critic"] = value_coef * _msum(tau * diff.square(), valid) / n_valid
    _weight_diagnostics(out, advantage, weight, value, q, max_weight, valid, n_valid)
    return TensorDict(out, batch_size=[])


def iql_losses(
    td: TensorDictBase,
    *,
    gamma: float = 0.99,
    expectile: float = 0.7,
    temperature: float = 3.0,
    max_weight: float = 100.0,
    value_coef: float = 1.0,
    q_coef: float = 1.0,
    entropy_coef: float = 0.0,
    keys: Keys = KEYS,
) -> TensorDict:
    """IQL (Kostrikov et al. 2021) as the module docstring states it: V by expectile regression on the
    target critics' ``min_k Q_target_k(s, a)``, each critic ``Q_k`` by squared error on
    ``r + gamma * (1 - terminated) * V(s')``, and the policy by the stored actions' log-likelihood
    weighted by ``min(exp(temperature * (Q_target - V)), max_weight)``.

    ``loss_critic = value_coef * mean(|tau - 1(u < 0)| * u^2) + q_coef * mean(sum_k (Q_k - y)^2)`` with
    ``u = Q_target - V`` and ``y`` the TD target, means over valid steps; V's term trains V only (Q_target
    is detached), Q's term the critics only (``V(s')`` is detached), the policy term the logits only.

    Args:
        gamma: the discount of Q's TD target.
        expectile: ``tau`` in ``(0, 1)``; 0.5 is plain mean regression (V of the data's policy).
        temperature: >= 0, the paper's beta: the policy's weight is ``exp(temperature * A)``.
        max_weight: > 0, the weight's cap (the paper's 100).
        value_coef: V's expectile term's weight.
        q_coef: Q's TD term's weight.
        entropy_coef: the entropy bonus (0: none, as in IQL).
    """
    where = "iql_losses"
    _check_iql_coefs(where, gamma, expectile, temperature, max_weight, value_coef, entropy_coef)
    _check_coef(where, "q_coef", q_coef)
    value = per_step(td, keys.current_key(keys.state_value), where=where, kind="float")
    dtype = compute_dtype(value.dtype)
    value = value.to(dtype)
    q = _critics(td, keys.current_key(keys.state_action_value), where).to(dtype)
    q_target = _critics(td, keys.target_key(keys.state_action_value), where).to(dtype).detach().amin(-1)
    y = _td_target(td, keys, where, gamma, dtype)
    diff, tau, advantage, weight = _expectile_weights(q_target, value, expectile, temperature, max_weight)
    out, valid, n_valid, _ = _policy_terms(td, keys, where, weight, entropy_coef)
    expectile_loss = _msum(tau * diff.square(), valid) / n_valid
    td_loss = _msum((q - y.unsqueeze(-1)).square().sum(-1), valid) / n_valid
    out["loss_critic"] = value_coef * expectile_loss + q_coef * td_loss
    out["expectile_loss"] = expectile_loss.detach()
    out["td_loss"] = td_loss.detach()
    out["q_mean"] = _msum(q_target, valid) / n_valid
    out["q_explained_variance"] = _explained_variance(q.detach().mean(-1), y, valid, n_valid)
    _weight_diagnostics(out, advantage, weight, value, q_target, max_weight, valid, n_valid)
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


def _td_target(td: TensorDictBase, keys: Keys, where: str, gamma: float, dtype: torch.dtype) -> torch.Tensor:
    """The one-step target ``r + gamma * (1 - terminated) * V(s')``, ``V(s')`` detached."""
    reward = per_step(td, keys.reward, where=where, kind="float").to(dtype)
    terminated = per_step(td, keys.terminated, where=where, kind="bool")
    next_value = per_step(td, keys.next_state_value, where=where, kind="float").to(dtype).detach()
    return reward + gamma * torch.where(terminated, 0.0, next_value)


def _expectile_weights(
    target: torch.Tensor, value: torch.Tensor, expectile: float, temperature: float, max_weight: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What V's expectile regression and the policy's weights read off ``u = target - V``: ``u``, the
    expectile's ``|tau - 1(u < 0)|``, the advantage ``u`` detached and ``min(exp(temperature * A), max)``."""
    diff = target - value
    tau = torch.where(diff < 0, 1.0 - expectile, expectile)
    advantage = diff.detach()
    return diff, tau, advantage, torch.exp(temperature * advantage).clamp(max=max_weight)


def _critics(td: TensorDictBase, key: tuple[str, ...], where: str) -> torch.Tensor:
    """``[*B, K]``: K critics' values per step (a ``[*B]`` entry is one critic)."""
    x = require(td, key, where=where)
    check_kind(x, key, kind="float", where=where)
    shape = td.batch_size
    if x.shape == shape:
        x = x.unsqueeze(-1)
    if x.shape[:-1] != shape or x.shape[-1] < 1:
        raise ValueError(
            f"{where}: {key_str(key)} must have shape {list(shape)} or {[*shape, 'K']} (K critics), got "
            f"{list(x.shape)}"
        )
    return x


def _weight_diagnostics(
    out: dict,
    advantage: torch.Tensor,
    weight: torch.Tensor,
    value: torch.Tensor,
    target: torch.Tensor,
    max_weight: float,
    valid: torch.Tensor | None,
    n_valid: torch.Tensor,
) -> None:
    """The IQL family's advantage, weight and value diagnostics (the module docstring)."""
    out["advantage_mean"] = _msum(advantage, valid) / n_valid
    out["weight_mean"] = _msum(weight, valid) / n_valid
    seen = weight if valid is None else torch.where(valid > 0, weight, 0.0)
    out["weight_max"] = seen.amax() if seen.numel() else weight.new_zeros(())
    out["weight_clip_fraction"] = _msum((weight >= max_weight).to(weight.dtype), valid) / n_valid
    out["value_mean"] = _msum(value.detach(), valid) / n_valid
    out["explained_variance"] = _explained_variance(value.detach(), target, valid, n_valid)


def _check_iql_coefs(
    where: str, gamma: float, expectile: float, temperature: float, max_weight: float, value_coef: float,
    entropy_coef: float,
) -> None:  # fmt: skip
    for name, x in (("gamma", gamma), ("temperature", temperature), ("value_coef", value_coef),
                    ("entropy_coef", entropy_coef)):  # fmt: skip
        _check_coef(where, name, x)
    _check_coef(where, "max_weight", max_weight, positive=True)
    if not 0.0 < expectile < 1.0 or not 0.0 <= gamma <= 1.0:
        raise ValueError(
            f"{where}: expectile must be in (0, 1) and gamma in [0, 1], got {expectile}, {gamma}"
        )


def _check_coef(where: str, name: str, x: float, *, positive: bool = False) -> None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{where}: {name} must be a Python float, got {type(x).__name__}")
    if not math.isfinite(x) or (x <= 0 if positive else x < 0):
        raise ValueError(f"{where}: {name} must be finite and {'> 0' if positive else '>= 0'}, got {x}")


__all__ = ["bc_loss", "expectile_td_losses", "iql_losses"]
