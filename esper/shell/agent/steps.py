"""One PPO minibatch step, chosen once when the trainer is built (:func:`make_step`).

Every step takes the prepared batch, the global env indices of one minibatch and the annealed entropy
coefficient, and returns ``(early_stop, finite, metrics)``: whether the KL flag stopped the update before
this step, whether the loss and every gradient were finite (when either fails, no optimizer step was
taken), and the step's metrics (device tensors; None when the step was not taken). Three versions:

All three start with :func:`descend`: re-score, :func:`esper.core.ppo_loss`, backward, gradient
health, the KL flag (:func:`esper.core.loss.kl_early_stop`) and the finiteness flag.

- :class:`EagerStep`: :func:`descend`, one read of the two flags, clip, AdamW.
- :class:`CompiledStep`: the same as one graph (:mod:`esper.shell.agent.wholestep`); the flags are data
  inside it (the step is applied only where both pass), then read once, as eager reads them.
- :class:`SharedStep`: several processes (torchrun): each re-scores the minibatch's envs it holds, the
  loss denominators and gradients are summed over processes, and every process takes the same step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from tensordict import TensorDict, TensorDictBase

from esper.core.health import GradHealthConfig, adapt_value_coef, grad_health, group_clip_scale
from esper.core.loss import kl_early_stop, loss_counts
from esper.core.spec import HEADS, KEYS
from esper.shell.agent.policy import FactoredRecurrentActorCritic
from esper.shell.agent.wholestep import adam_step, compile_step, init_adam_state
from esper.shell.common.distributed import Dist

#: Parameter groups whose gradient norms are reported separately.
GRAD_GROUPS = ("trunk", *HEADS, "value")

StepResult = tuple[bool, bool, TensorDict | None]


#: The adaptive value coefficient stays within this factor of ``ppo.value_coef`` either way.
VALUE_COEF_RANGE = 10.0


@dataclass
class Descent:
    """What :func:`descend` leaves for the step to decide on: the loss terms, the gradient health, and
    the two flags (bool ``[]``): the KL early stop (checked before the step) and whether the loss and
    every gradient were finite; with an adaptive value coefficient, its value for the next step."""

    losses: TensorDict
    health: TensorDict
    stop: torch.Tensor
    finite: torch.Tensor
    value_coef: torch.Tensor | None = None


@dataclass(frozen=True)
class ValueCoefRule:
    """``ppo.value_coef_adapt`` (:func:`esper.core.health.adapt_value_coef`): starts at ``start``
    (``ppo.value_coef``), aims the value head's gradient norm at ``target`` times the policy heads'
    (the eight heads' groups together) and moves ``rate`` of the way each minibatch step, within
    :data:`VALUE_COEF_RANGE` of the start."""

    start: float
    target: float
    rate: float

    def next(self, coef: torch.Tensor, group_norms: torch.Tensor) -> torch.Tensor:
        heads = group_norms[GRAD_GROUPS.index(HEADS[0]) : GRAD_GROUPS.index(HEADS[-1]) + 1]
        low, high = self.start / VALUE_COEF_RANGE, self.start * VALUE_COEF_RANGE
        value = group_norms[GRAD_GROUPS.index("value")]
        return adapt_value_coef(
            coef, value, heads.square().sum().sqrt(), target=self.target, rate=self.rate, low=low, high=high
        )


@dataclass
class Learner:
    """What a minibatch step works on: the network, its optimizer, the loss and the re-scoring of stored
    sequences (both closures of the trainer's config), the gradient-health settings and the clip, and
    the learner options: ``clip_per_group`` (``ppo.clip_per_group``, 0: off), ``value_rule``
    (``ppo.value_coef_adapt``, None: off; :attr:`value_coef` holds the coefficient, a device tensor) and
    ``counts_fn``, the loss denominators of a minibatch several processes hold."""

    policy: FactoredRecurrentActorCritic
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[..., TensorDict]
    rescore: Callable[[TensorDictBase], TensorDict]
    health_cfg: GradHealthConfig
    max_grad_norm: float
    target_kl: float | None
    clip_per_group: float = 0.0
    value_rule: ValueCoefRule | None = None
    counts_fn: Callable[[TensorDictBase], TensorDict] = field(default=partial(loss_counts, factored=True))

    def __post_init__(self) -> None:
        self.params = list(self.policy.parameters())
        self.groups = group_index(self.policy)
        #: The parameters of each group of GRAD_GROUPS (per-group clipping).
        pairs = list(zip(self.params, self.groups))
        self.members = [[p for p, g in pairs if g == k] for k in range(len(GRAD_GROUPS))]
        rule, device = self.value_rule, self.params[0].device
        self.value_coef = None if rule is None else torch.tensor(rule.start, device=device)

    def health(self, grads: list[torch.Tensor]) -> TensorDict:
        return grad_health(grads, groups=self.groups, n_groups=len(GRAD_GROUPS), cfg=self.health_cfg)

    def clip(self, health: TensorDict) -> None:
        """The gradients clipped before the step: with ``clip_per_group`` each group's scaled to that norm
        at most (:func:`esper.core.health.group_clip_scale` of the health's pre-clip ``group_norms``, one
        ``_foreach_mul_`` per group), then the global norm to ``max_grad_norm``. Several processes call
        it on the summed gradients, so every process clips the same."""
        if self.clip_per_group > 0:
            scale = group_clip_scale(health["group_norms"], self.clip_per_group)
            for k, members in enumerate(self.members):
                grads = [p.grad for p in members if p.grad is not None]
                if grads:
                    torch._foreach_mul_(grads, scale[k].to(grads[0].dtype))
        torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)


class EagerStep:
    """The minibatch step in eager mode (the default)."""

    def __init__(self, learner: Learner) -> None:
        self.learner = learner

    def begin_update(self, lr: float, *, block: int) -> None:
        """Called before each update's first step: the update's learning rate, and how many envs of each
        rollout in the batch this process holds (all of them with one process)."""
        for group in self.learner.optimizer.param_groups:
            group["lr"] = lr

    def __call__(self, batch: TensorDictBase, idx: torch.Tensor, coef: float) -> StepResult:
        lr = self.learner
        out = descend(lr, batch[idx], coef, value_coef=lr.value_coef)
        # sync point: the KL flag (checked before the step) and the finiteness flag, one read
        stopped, ok = torch.stack([out.stop, out.finite]).tolist()
        if stopped or not ok:
            return bool(stopped), bool(ok), None
        lr.clip(out.health)
        lr.optimizer.step()
        lr.value_coef = out.value_coef
        return False, True, step_metrics(out.losses, out.health, coef)


class CompiledStep:
    """The minibatch step as one graph, reused by every minibatch and update (no recompiles: the entropy
    coefficient and the learning-rate scale go in as tensors; the optimizer keeps ``ppo.lr``)."""

    def __init__(self, learner: Learner, *, base_lr: float, backend: str | Callable = "inductor") -> None:
        self.learner, self.base_lr = learner, base_lr
        self.graph = compile_step(self._body, backend=backend)
        self.lr_scale: torch.Tensor | None = None

    def begin_update(self, lr: float, *, block: int) -> None:
        init_adam_state(self.learner.optimizer)  # a no-op unless a loaded state_dict had none yet
        device = self.learner.params[0].device
        self.lr_scale = torch.tensor(lr / self.base_lr, device=device)

    def __call__(self, batch: TensorDictBase, idx: torch.Tensor, coef: float) -> StepResult:
        coef_t = torch.tensor(coef, device=batch.device)  # a tensor: a new value never recompiles
        metrics, flags, value_coef = self.graph(batch, idx, coef_t, self.lr_scale, self.learner.value_coef)
        self.learner.value_coef = value_coef  # None without ppo.value_coef_adapt
        # sync point: the KL and finiteness flags (where either fails, no step was applied)
        stopped, ok = flags.tolist()
        return bool(stopped), bool(ok), (metrics if not stopped and ok else None)

    def _body(
        self,
        batch: TensorDictBase,
        idx: torch.Tensor,
        coef: torch.Tensor,
        lr_scale: torch.Tensor,
        value_coef: torch.Tensor | None,
    ) -> tuple[TensorDict, torch.Tensor, torch.Tensor | None]:
        """The compiled graph: gather the envs ``idx`` of ``batch``, re-score, loss, backward, gradient
        health, clip, AdamW at ``lr_scale`` x the optimizer's learning rate (not applied where the KL
        flag is set or the loss or a gradient is not finite). Returns the step's metrics, the flags
        ``[early_stop, finite]`` and the adaptive value coefficient after the step (None when off; kept
        where the step was not applied). Every ``.grad`` is None on entry and on exit."""
        lr = self.learner
        out = descend(lr, batch[idx], coef, value_coef=value_coef)
        skip = out.stop | ~out.finite
        lr.clip(out.health)
        adam_step(lr.optimizer, skip=skip, scale=lr_scale)
        for p in lr.params:
            p.grad = None
        if value_coef is not None:
            value_coef = torch.where(skip, value_coef, out.value_coef)
        return step_metrics(out.losses, out.health, coef), torch.stack([out.stop, out.finite]), value_coef


class SharedStep:
    """The minibatch step with several processes: ``idx`` are global env indices (the same on every
    process; ``block`` envs of each rollout in the batch are this process's, :func:`local_rows`). This
    process re-scores those in its slice, with the loss denominators summed over every process
    (:func:`esper.core.loss.loss_counts`), so the sum of the processes' gradients is the whole
    minibatch's gradient. One all-reduce carries the gradients, the KL and the finiteness flag; every
    process then takes the same decision and the same step. The metrics are this process's part
    (:func:`reduce_report` combines them)."""

    def __init__(self, learner: Learner, dist: Dist) -> None:
        self.learner, self.dist = learner, dist
        self.block = 0

    def begin_update(self, lr: float, *, block: int) -> None:
        for group in self.learner.optimizer.param_groups:
            group["lr"] = lr
        self.block = block

    def __call__(self, batch: TensorDictBase, idx: torch.Tensor, coef: float) -> StepResult:
        lr, dist = self.learner, self.dist
        mine = local_rows(idx, self.block, dist)  # sync point: the slice's envs
        if mine.numel():
            mb = batch[mine]
        else:  # none of this minibatch is here: a masked-out stand-in adds nothing but joins the sums
            mb = batch[:1].clone()
            mb.set(KEYS.valid, torch.zeros(mb.batch_size, dtype=torch.bool, device=batch.device))
        out = descend(lr, mb, coef, dist, value_coef=lr.value_coef)
        stopped, ok = torch.stack([out.stop, out.finite]).tolist()  # sync point: the shared flags
        if stopped or not ok:
            return bool(stopped), bool(ok), None
        lr.clip(out.health)  # on the summed gradients: the same on every process
        lr.optimizer.step()
        lr.value_coef = out.value_coef  # from the summed gradients' norms: the same everywhere
        return False, True, step_metrics(out.losses, out.health, coef)


MinibatchStep = EagerStep | CompiledStep | SharedStep


def make_step(
    learner: Learner, *, compile: bool, dist: Dist, base_lr: float, backend: str | Callable = "inductor"
) -> MinibatchStep:
    """The trainer's one minibatch step: distributed, compiled or eager."""
    if dist.active:
        if compile:
            raise ValueError("compile is not supported with several processes yet; run without --compile")
        return SharedStep(learner, dist)
    if compile:
        return CompiledStep(learner, base_lr=base_lr, backend=backend)
    return EagerStep(learner)


def descend(
    learner: Learner,
    mb: TensorDictBase,
    coef: float | torch.Tensor,
    dist: Dist | None = None,
    *,
    value_coef: torch.Tensor | None = None,
) -> Descent:
    """What every minibatch step does before it decides: re-score the minibatch ``mb`` (its
    ``current`` entry), the loss, backward (every ``.grad`` set to None first), the gradient health and
    the two flags. Traceable into the compiled step's graph. ``value_coef`` (``ppo.value_coef_adapt``):
    the critic loss (computed with coefficient 1) is weighted by it, and the rule's next value from this
    step's gradient norms is returned in the descent (the coefficient used goes to the metrics).

    With ``dist`` (several processes, :class:`SharedStep`): one all-reduce before the loss sums its
    denominators and the sums behind the explained variance over the processes, and one after backward
    sums the gradients (written back to the ``.grad`` that exist), the KL and the non-finite count; the
    health and both flags are then the whole minibatch's, the same on every process."""
    mb["current"] = learner.rescore(mb)
    losses = learner.loss_fn(mb) if dist is None else _shared_loss(learner, mb, dist)
    if value_coef is not None:
        losses["loss_critic"] = losses["loss_critic"] * value_coef
        losses["value_coef"] = value_coef.detach()
    total = annealed_loss(losses, coef)
    for p in learner.params:  # the optimizer's zero_grad(set_to_none=True): it holds these parameters
        p.grad = None
    total.backward()
    if dist is None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in learner.params]
        stop, finite_loss = losses["early_stop"], torch.isfinite(total)
    else:
        grads, kl, finite_loss = _sum_gradients(learner.params, losses["kl_approx"], total, dist)
        stop = kl_early_stop(kl, learner.target_kl)
    health = learner.health(grads)
    after = None if value_coef is None else learner.value_rule.next(value_coef, health["group_norms"])
    return Descent(losses, health, stop, finite_loss & health["finite"], after)


def _shared_loss(learner: Learner, mb: TensorDictBase, dist: Dist) -> TensorDict:
    """This process's part of the loss of a minibatch several processes hold: the denominators and the
    explained variance are the whole minibatch's (one all-reduce)."""
    counts = learner.counts_fn(mb)
    names = sorted(counts.keys())
    # one all-reduce: the loss denominators and the sums behind the whole minibatch's explained variance
    local = torch.cat([torch.stack([counts[k].double() for k in names]), _ev_sums(mb)])
    summed = dist.all_reduce_sum(local)
    denominators = summed[: len(names)].float().unbind()
    losses = learner.loss_fn(mb, TensorDict(dict(zip(names, denominators)), batch_size=[]))
    ev = _ev_from_sums(summed[len(names) :])
    losses["explained_variance"] = ev.to(losses["explained_variance"].dtype)
    return losses


def _sum_gradients(
    params: list[torch.Tensor], kl: torch.Tensor, total: torch.Tensor, dist: Dist
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """One all-reduce of every gradient (zeros where a ``.grad`` is None), the KL and the non-finite
    flag of ``total``; each ``.grad`` that exists becomes the sum. Returns the summed gradients of
    every parameter, the summed KL and whether every process's loss was finite."""
    has = [p.grad is not None for p in params]
    flat = torch.cat(
        [(p.grad if h else torch.zeros_like(p)).reshape(-1) for p, h in zip(params, has)]
        + [kl.detach().float().reshape(1), (~torch.isfinite(total)).float().reshape(1)]
    )
    flat = dist.all_reduce_sum(flat)
    grads, offset = [], 0
    for p, h in zip(params, has):
        g = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
        grads.append(g)
        if h:
            p.grad = g.clone()
    return grads, flat[-2], flat[-1] == 0


def group_index(policy: FactoredRecurrentActorCritic) -> list[int]:
    """Group of each parameter, in ``policy.parameters()`` order (see GRAD_GROUPS)."""
    index = {id(p): GRAD_GROUPS.index("value") for p in policy.value_head.parameters()}
    for h in HEADS:
        index.update({id(p): GRAD_GROUPS.index(h) for p in policy.heads[h].parameters()})
    for h, table in (policy.slot_bias or {}).items():
        index.update({id(p): GRAD_GROUPS.index(h) for p in table.parameters()})
    return [index.get(id(p), GRAD_GROUPS.index("trunk")) for p in policy.parameters()]


def local_rows(idx: torch.Tensor, block: int, dist: Dist) -> torch.Tensor:
    """The rows of this process's prepared batch that hold the global envs ``idx`` (in ``idx``'s
    order). The whole batch is laid out as one process would hold it: the new rollout's envs, then
    each replayed rollout's, each block ``block * dist.world`` envs in rank order; this process holds
    ``block`` envs of every block, stacked the same way. Without replay this is ``idx - rank * block``
    for the envs of this process's slice."""
    width = block * dist.world
    blk, within = idx // width, idx % width
    here = within // block == dist.rank
    return blk[here] * block + within[here] % block


def _ev_sums(td: TensorDictBase) -> torch.Tensor:
    """``[n, sum t, sum t^2, sum r, sum r^2]`` (float64) over the valid steps of ``td``, ``t`` the value
    target and ``r`` the critic's residual: summed over processes, :func:`_ev_from_sums` gives the
    explained variance of their whole minibatch."""
    pred = td["current", "state_value"].detach().double()
    target = td["value_target"].double().reshape(pred.shape)
    w = td.get(KEYS.valid, torch.ones_like(pred, dtype=torch.bool)).reshape(pred.shape).double()
    res = target - pred
    return torch.stack([w.sum(), (w * target).sum(), (w * target.square()).sum(), (w * res).sum(),
                        (w * res.square()).sum()])  # fmt: skip


def _ev_from_sums(sums: torch.Tensor) -> torch.Tensor:
    """``1 - Var(r) / Var(t)`` from :func:`_ev_sums`'s sums; 0 when the target has no variance (as
    :func:`esper.core.loss.ppo_loss` reports it)."""
    n, st, st2, sr, sr2 = sums.unbind()
    n = n.clamp(min=1.0)
    var_t, var_r = (st2 - st.square() / n) / n, (sr2 - sr.square() / n) / n
    ok = var_t > 1e-12
    return torch.where(ok, 1.0 - var_r / torch.where(ok, var_t, 1.0), 0.0)


def annealed_loss(losses: TensorDict, coef: float | torch.Tensor) -> torch.Tensor:
    """What the update minimizes: :func:`esper.core.total_loss` with the (per-head-weighted) entropy term
    scaled by the annealed coefficient ``coef``; an entropy floor's hinge (``ppo.entropy_floor``) is not
    annealed."""
    total = losses["loss_objective"] + losses["loss_critic"] + coef * losses["loss_entropy"]
    if "loss_entropy_floor" in losses.keys():
        total = total + losses["loss_entropy_floor"]
    return total


def step_metrics(losses: TensorDict, health: TensorDict, coef: float | torch.Tensor) -> TensorDict:
    keep = [
        "loss_objective",
        "loss_critic",
        "loss_entropy",
        "entropy",
        "kl_approx",
        "clip_fraction",
        "value_clip_fraction",
        "explained_variance",
        "max_ratio",
        "min_ratio",
        "ESS",
        *HEADS,
    ]
    keep += [k for k in ("loss_entropy_floor", "value_coef") if k in losses.keys()]  # learner options
    out = losses.select(*keep).detach().float()
    out["loss_entropy"] = out["loss_entropy"] * coef
    out["grad"] = health.select("global_norm", "group_norms", "nan_count", "inf_count").float()
    out["grad", "vanishing_frac"] = health["vanishing_frac"].float()
    out["grad", "exploding_frac"] = health["exploding_frac"].float()
    return out


__all__ = [
    "GRAD_GROUPS",
    "VALUE_COEF_RANGE",
    "CompiledStep",
    "Descent",
    "EagerStep",
    "Learner",
    "MinibatchStep",
    "SharedStep",
    "ValueCoefRule",
    "annealed_loss",
    "descend",
    "group_index",
    "local_rows",
    "make_step",
    "step_metrics",
]
