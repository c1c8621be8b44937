"""The recurrent PPO update.

One call of :meth:`PPOTrainer.update` takes the rollout of one batch of episodes (``[n_envs, T]``,
every episode ends at T: truncated, or terminal with ``lifecycle.terminal_at_limit``) and, in this order:

1. refuses non-finite data with the offending key named (one host sync);
2. updates the observation and reward statistics from this batch (finding C5: before the update;
   the stored observations stay exactly those the policy acted on, finding S2) and scales rewards;
3. runs GAE on the rollout values (a truncated last step bootstraps from V(post-action obs), H4; a
   terminal one does not);
4. recomputes V with the same hidden reconstruction the update uses and makes it the value-clip
   anchor (findings C4/H5: ``n_epochs > 1`` is correct, never stale rollout values);
5. normalizes advantages over the batch;
6. for ``n_epochs``: shuffles *envs* into minibatches of whole sequences (finding C3), re-scores each
   from its stored initial hidden state, computes :func:`esper.core.ppo_loss`, stops on the KL flag
   (checked before the step), clips gradients, steps AdamW (weight decay on the critic only);
7. rolls the policy and optimizer back to their state at step 6's start if a loss or gradient was
   not finite (that step is never taken) or the parameters ended non-finite: a non-finite update is
   never applied, so it can never reach a checkpoint.

With ``ppo.replay K`` the last K rollouts join the batch after step 4, each re-scored by the current
policy and critic and re-based for decoupled PPO (:func:`esper.core.decouple`); step 5 normalizes over
all of it, then scales each replayed step's advantage by its truncated behaviour weight. Step 2's
statistics see only the new rollout. With several processes each keeps its own envs' rollouts, and
the update is the one process's (:func:`local_rows`).

With several processes (``dist``, each holding the rollout of its slice of the envs) the update is
the same update of the whole batch: 2. merges the statistics of every process's part exactly
(:func:`esper.core.normalize.merge_running_stats`), 5. normalizes with the whole batch's mean and
spread, and 6. draws the same global env minibatches everywhere; each process re-scores the envs of a
minibatch it holds, divides its loss terms by the whole minibatch's counts
(:func:`esper.core.loss.loss_counts`) and one all-reduce sums the gradients, the KL and the
finiteness flag, so every process takes the same decisions and the same optimizer steps.

Metrics stay on the device until the end, then one :func:`read_scalars` call brings them back; the
only other host reads are one per minibatch step (the KL flag and the finiteness flag together).

With ``compile=True`` each minibatch step of 6. is one graph (:mod:`esper.shell.agent.wholestep`): the LSTM
re-scoring, the loss, backward, the gradient-health statistics, the clip and the AdamW step, compiled
with ``fullgraph=True`` and reused by every minibatch and update (no recompiles: the entropy coefficient
goes in as a tensor; with ``ppo.replay K``, one graph per batch size while the kept rollouts fill up,
K + 1 in all, then none). The KL and finiteness flags are data there: the step is applied only where the
KL flag is False and the loss and gradients are finite; the loop then reads both flags (the same one
sync as eager), so both paths skip the same step. GAE is compiled on its own; the rest of ``prepare``
stays eager. Eager (the default) is unchanged.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tensordict import TensorDict, TensorDictBase

from esper import kernels
from esper.core.advantage import gae, gae_tensors, normalize_advantage
from esper.core.distributions import masked_categorical
from esper.core.health import GradHealthConfig, grad_health
from esper.core.loss import decouple, loss_counts, ppo_loss
from esper.core.minibatch import env_minibatches
from esper.core.normalize import (
    batch_stats,
    merge_running_stats,
    normalize,
    running_stats,
    scale,
    update_running_stats,
)
from esper.core.spec import HEADS, KEYS
from esper.shell.agent.policy import FactoredRecurrentActorCritic
from esper.shell.agent.wholestep import adam_step, compile_step, init_adam_state
from esper.shell.config.fields import check_fields, doc
from esper.shell.runtime.distributed import SINGLE, Dist
from esper.shell.telemetry.readout import read_scalars

#: Parameter groups whose gradient norms are reported separately.
GRAD_GROUPS = ("trunk", *HEADS, "value")


@dataclass(frozen=True, slots=True)
class PPOConfig:
    gamma: float = doc(
        0.995, "discount; also the potential-based shaping gamma (one value, finding C1)", ge=0, le=1
    )
    gae_lambda: float = doc(0.97, "GAE lambda", ge=0, le=1)
    clip_epsilon: float = doc(0.2, "surrogate ratio clip", gt=0)
    value_clip: float | None = doc(10.0, "bound on |V_new - V_anchor| in the value loss (none: off)", gt=0)
    value_coef: float = doc(0.5, "weight of the value loss (applied to 0.5 * squared error)", ge=0)
    entropy_coef: float = doc(0.05, "entropy bonus coefficient at the first update", ge=0)
    entropy_coef_end: float | None = doc(
        None, "entropy coefficient after annealing (none: no annealing)", ge=0
    )
    entropy_anneal_updates: int = doc(
        0, "updates over which the entropy coefficient moves linearly to its end", ge=0
    )
    head_entropy_weights: tuple[float, ...] = doc(
        (), "per-head entropy weights in HEADS order (empty: all 1)", ge=0
    )
    lr: float = doc(3e-4, "AdamW learning rate (at the first update, when annealed)", gt=0)
    lr_end: float | None = doc(None, "AdamW learning rate after annealing (none: constant)", ge=0)
    lr_anneal_updates: int = doc(0, "updates over which the learning rate moves linearly to lr_end", ge=0)
    adam_eps: float = doc(1e-5, "AdamW epsilon", gt=0)
    critic_weight_decay: float = doc(0.0, "weight decay on the value head only", ge=0)
    max_grad_norm: float = doc(0.5, "global gradient-norm clip", gt=0)
    n_epochs: int = doc(4, "passes over each batch", ge=1)
    n_minibatches: int = doc(
        2, "minibatches per pass; each holds whole env sequences (must divide n_envs)", ge=1
    )
    target_kl: float | None = doc(
        0.015, "stop the update when kl_approx > 1.5 * target_kl (none: never)", gt=0
    )
    normalize_advantage: bool = doc(True, "normalize advantages over the batch")
    obs_clip: float = doc(10.0, "clip of normalized observations", gt=0)
    reward_clip: float = doc(10.0, "clip of scaled rewards", gt=0)
    obs_momentum: float | None = doc(
        None, "EMA momentum of observation statistics (none: exact Welford)", ge=0, le=1
    )
    hidden: int = doc(128, "LSTM / trunk width", ge=1)
    head_hidden: int = doc(64, "hidden width of each head", ge=1)
    wait_bias: float = doc(0.0, "initial logit of WAIT above the other ops (0: uniform over the legal ops)")
    germinate_bias: float = doc(
        0.0,
        "initial logit of GERMINATE above the ops other than WAIT (equal to wait_bias: an untrained "
        "policy germinates as often as it waits where it can, and rarely prunes or re-targets)",
    )
    blend_bias: float = doc(
        0.0,
        "initial logit of the fixed schedules' blend (style LINEAR_ADD, tempo FAST, alpha target 1.0) "
        "above each blend head's other choices (0: uniform)",
    )
    slot_bias: bool = doc(
        False,
        "a learned logit bias per slot for the heads after the slot head (blueprint, blend): what to "
        "grow where gets a term per slot, not only the heads' shared output bias",
    )
    slot_order_bias: float = doc(
        0.0,
        "initial logit of each slot above the next one (slot s starts s x this below slot 0): an "
        "untrained policy acts on the first legal slot, growing b0 first, as the fixed schedules do "
        "(0: uniform over the legal slots)",
    )
    size_bias: float = doc(
        0.0,
        "a capacity prior: the blueprint head starts this x ln(parameters) logits on each blueprint (its "
        "germination cost, the log averaged over the slots), so an untrained policy grows a seed about in "
        "proportion to its size at 1 (0: uniform over the legal blueprints)",
        ge=0,
    )
    param_cap: float = doc(
        0.0,
        "a hard budget on the learned controller's seeds: it may germinate only where the env's seed "
        "parameters stay at most this many, counting each germination at its most (a gate included; "
        "esper.core.masks.within_param_cap). 0: no cap. Only the learned controller is capped; "
        "the baselines are not",
        ge=0,
    )
    replay: int = doc(
        0,
        "earlier batches each update re-uses (0: on-policy PPO). A replayed batch is re-scored at the "
        "update's start: rewards re-scaled with the current statistics, values and GAE from the current "
        "critic (its last step's bootstrap stays the rollout's), the surrogate clipped around the policy at "
        "the update's start and its advantage weighted by min(1, that policy's ratio to the one that "
        "acted): decoupled PPO (esper.core.decouple). Observation and reward statistics see each batch once",
        ge=0,
    )
    grad_explode_factor: float = doc(
        10.0, "a parameter's pre-clip grad norm above this x max_grad_norm is 'exploding'", gt=0
    )
    max_bad_updates: int = doc(
        3,
        "stop the run after this many consecutive updates rolled back for a non-finite loss or gradient",
        ge=1,
    )

    def __post_init__(self) -> None:
        check_fields(self, "ppo")
        if self.head_entropy_weights and len(self.head_entropy_weights) != len(HEADS):
            raise ValueError(
                f"ppo.head_entropy_weights needs {len(HEADS)} values ({', '.join(HEADS)}), "
                f"got {len(self.head_entropy_weights)}"
            )

    def entropy_coef_at(self, update: int) -> float:
        return _anneal(self.entropy_coef, self.entropy_coef_end, self.entropy_anneal_updates, update)

    def lr_at(self, update: int) -> float:
        """The learning rate of update ``update`` (0-based): ``lr`` moving linearly to ``lr_end`` over
        ``lr_anneal_updates`` (the late updates of a short run take small steps, so a policy that has
        found what pays does not drift away from it on the noise of 8 episodes)."""
        return _anneal(self.lr, self.lr_end, self.lr_anneal_updates, update)


def _anneal(start: float, end: float | None, updates: int, update: int) -> float:
    if end is None or updates == 0:
        return start
    frac = min(1.0, update / updates)
    return (1.0 - frac) * start + frac * end  # exactly ``end`` once annealed


@dataclass(slots=True)
class TrainerState:
    """Everything of the learner that a checkpoint must carry besides the network and optimizer."""

    obs_stats: TensorDict
    reward_stats: TensorDict
    updates: int = 0
    history: list = field(default_factory=list)
    #: The last ``ppo.replay`` rollouts as they came in (newest first), for decoupled re-use.
    replay: list = field(default_factory=list)


class PPOTrainer:
    def __init__(
        self,
        policy: FactoredRecurrentActorCritic,
        cfg: PPOConfig,
        *,
        raw_obs_dim: int,
        compile: bool = False,
        compile_backend: str | Callable = "inductor",
        generator: torch.Generator | None = None,
        dist: Dist = SINGLE,
    ) -> None:
        if dist.active and compile:
            raise ValueError("compile is not supported with several processes yet; run without --compile")
        limit = torch._dynamo.config.recompile_limit
        if compile and cfg.replay + 1 > limit:
            raise ValueError(
                f"ppo.replay={cfg.replay} with --compile needs {cfg.replay + 1} graphs (one per batch size "
                f"while the kept rollouts fill up), over torch._dynamo's recompile_limit of {limit}; use "
                f"--ppo.replay {limit - 1} or less, or run without --compile"
            )
        self.policy, self.cfg, self.dist = policy, cfg, dist
        device = next(policy.parameters()).device
        critic = list(policy.value_head.parameters())
        critic_ids = {id(p) for p in critic}
        rest = [p for p in policy.parameters() if id(p) not in critic_ids]
        self.optimizer = torch.optim.AdamW(
            [
                {"params": rest, "weight_decay": 0.0},
                {"params": critic, "weight_decay": cfg.critic_weight_decay},
            ],
            lr=cfg.lr,
            eps=cfg.adam_eps,
        )
        self.state = TrainerState(
            obs_stats=running_stats((raw_obs_dim,), device=device),
            reward_stats=running_stats((), device=device),
        )
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)
        #: Consecutive updates rolled back for a non-finite loss, gradient or parameter.
        self.bad_streak = 0
        self.health_cfg = GradHealthConfig.for_clipped_ppo(cfg.max_grad_norm, factor=cfg.grad_explode_factor)
        self.params = [p for p in policy.parameters()]
        self.groups = _group_index(policy)
        weights = cfg.head_entropy_weights or (1.0,) * len(HEADS)
        head_weights = dict(zip(HEADS, weights))

        # The fused Triton kernels where they run (CUDA with Triton), the core functions elsewhere.
        use_kernels = device.type == "cuda" and kernels.HAS_TRITON
        categorical = kernels.masked_categorical if use_kernels else masked_categorical
        gae_impl = kernels.gae if use_kernels else gae

        def loss_fn(td: TensorDictBase, counts: TensorDict | None = None) -> TensorDict:
            # entropy_coef is a per-head weight here; the annealed scalar multiplies loss_entropy
            # outside, so a changing coefficient never recompiles the loss.
            return ppo_loss(
                td,
                factored=True,
                clip_epsilon=cfg.clip_epsilon,
                value_clip=cfg.value_clip,
                value_coef=cfg.value_coef,
                entropy_coef=head_weights,
                target_kl=cfg.target_kl,
                categorical=categorical,
                counts=counts,
            )

        def gae_fn(td: TensorDictBase) -> TensorDictBase:
            return gae_impl(td, gamma=cfg.gamma, lmbda=cfg.gae_lambda)

        self.loss_fn = loss_fn
        self._categorical = categorical
        compiled = lambda fn: torch.compile(fn, fullgraph=True, dynamic=False, backend=compile_backend)
        self.gae_fn = compiled(gae_fn) if compile else gae_fn
        #: the whole minibatch step as one graph (None: eager)
        self.train_step = None
        if compile:
            self.train_step = compile_step(self._train_step, backend=compile_backend)

    # ------------------------------------------------------------------------------------ observation
    def normalize_obs(self, raw: torch.Tensor) -> torch.Tensor:
        """What the policy sees: raw observations normalized with the current (frozen) statistics."""
        return normalize(self.state.obs_stats, raw, clip=self.cfg.obs_clip)

    # ----------------------------------------------------------------------------------------- update
    def prepare(self, batch: TensorDictBase, *, replayed: list[TensorDictBase] = ()) -> TensorDictBase:
        """Steps 1-5 of the module docstring; returns the batch ready for the epochs. ``replayed``:
        earlier rollouts (``ppo.replay``), re-scored by :meth:`_rescore_replayed` and appended along
        the env dim after step 4; step 5 normalizes over all of it."""
        cfg = self.cfg
        self._check_finite(batch)
        st = self.state
        # C5: statistics include this batch before the update (the stored observations are not
        # re-normalized: they are what the policy saw, S2).
        st.obs_stats = self._update_stats(st.obs_stats, batch["raw_observation"], momentum=cfg.obs_momentum)
        # Rewards are divided by the spread of discounted returns (what the critic must predict), not
        # of single rewards: a sparse terminal bonus would otherwise dominate the scale.
        raw = batch["next", "raw_reward"]
        returns, _ = gae_tensors(
            raw,
            torch.zeros_like(raw),
            torch.zeros_like(raw),
            batch["next", "done"].reshape(raw.shape),
            batch["next", "terminated"].reshape(raw.shape),
            gamma=cfg.gamma,
            lmbda=1.0,
        )
        st.reward_stats = self._update_stats(st.reward_stats, returns)
        batch["next", "reward"] = scale(st.reward_stats, raw, clip=cfg.reward_clip)
        with torch.no_grad():
            self.gae_fn(batch)
            # C4: the value-clip anchor is V under the same hidden reconstruction the update uses.
            batch["state_value"] = self._evaluate(batch)["state_value"]
            weight = None
            if replayed:
                old = [self._rescore_replayed(td) for td in replayed]
                weight = torch.cat([torch.ones_like(batch["advantage"])] + [w for _, w in old], 0)
                batch = torch.cat([batch] + [td for td, _ in old], 0)
            if cfg.normalize_advantage:
                reduce = self.dist.all_reduce_sum if self.dist.active else None
                batch["advantage"] = normalize_advantage(batch["advantage"], reduce=reduce)
            if weight is not None:  # after normalizing: the weight scales each step's share, not the spread
                batch["advantage"] = batch["advantage"] * weight
        return batch

    def _rescore_replayed(self, old: TensorDictBase) -> tuple[TensorDictBase, torch.Tensor]:
        """An earlier rollout made ready for this update (``ppo.replay``): its rewards scaled with the
        current statistics, V from the current critic (the value-clip anchor and GAE's values; the
        truncated last step's bootstrap stays the rollout's, whose post-action state is not stored),
        GAE, and :func:`esper.core.decouple`: each head's stored log-prob replaced by the current
        (proximal) policy's and the truncated behaviour weight, returned beside the batch. Runs under
        ``no_grad``; the stored observations are those the behaviour policy saw (S2)."""
        cfg, st = self.cfg, self.state
        td = old.clone()
        td["next", "reward"] = scale(st.reward_stats, td["next", "raw_reward"], clip=cfg.reward_clip)
        prox = self._evaluate(td)
        values = prox["state_value"]
        boot = td["next", "state_value"][:, -1:]
        td["state_value"] = values
        td["next", "state_value"] = torch.cat([values[:, 1:], boot.to(values.dtype)], dim=1)
        self.gae_fn(td)
        td["current"] = prox
        rebased = decouple(td, factored=True, categorical=self._categorical)
        del td["current"]
        weight = rebased.pop("behaviour_weight")
        td.update(rebased)
        return td, weight.reshape(td["advantage"].shape)

    def _check_finite(self, batch: TensorDictBase) -> None:
        """:func:`check_finite`, and with several processes every one raises if one's rollout is bad."""
        try:
            check_finite(batch)
        except FloatingPointError:
            if self.dist.active:
                self.dist.all_reduce_sum(torch.ones(1, device=batch.device))
            raise
        if self.dist.active and self.dist.all_reduce_sum(torch.zeros(1, device=batch.device)).item():
            raise FloatingPointError("non-finite values in another process's rollout; refusing to update")

    def _update_stats(self, stats: TensorDict, x: torch.Tensor, momentum: float | None = None) -> TensorDict:
        """``stats`` updated with the batch ``x``; with several processes, with the whole batch (every
        process's part, merged exactly in rank order), so every process holds the same statistics."""
        if not self.dist.active:
            return update_running_stats(stats, x, momentum=momentum)
        part = batch_stats(x, stats["mean"].dim())
        flat = torch.cat([part["count"].reshape(1), part["mean"].reshape(-1), part["var"].reshape(-1)])
        whole = None
        for row in self.dist.gather_tensors(flat):
            n, rest = row[0], row[1:]
            mean, var = rest.chunk(2)
            p = TensorDict({"mean": mean.view_as(part["mean"]), "var": var.view_as(part["var"]), "count": n})
            whole = p if whole is None else merge_running_stats(whole, p)
        return merge_running_stats(stats, whole, momentum=momentum)

    def update(self, batch: TensorDictBase) -> dict[str, float | list[float]]:
        """One PPO update on a rollout ``[n_envs, T]``. Returns host-side metrics (one sync per
        minibatch step, for the KL flag and the finiteness flag together, and one for the report).

        A step whose loss or gradient is not finite is not taken: it ends the update, and the policy
        and optimizer go back to their state at the update's start (``rolled_back``), as they do when
        the parameters are not finite at the end. The optimizer steps of an update are not
        independent (the later ones start where the earlier ones left the weights), so a step that
        blew up condemns the steps before it too. :attr:`bad_streak` counts consecutive rolled-back
        updates; the run stops when it reaches ``ppo.max_bad_updates``.

        Raises:
            FloatingPointError: the rollout holds non-finite values (nothing is changed).
        """
        t0 = time.perf_counter()
        cfg = self.cfg
        # the whole batch's envs (each process holds a slice of the new rollout and of each replayed one)
        block = batch.batch_size[0]  # this process's envs of each rollout in the batch
        batch_envs = block * self.dist.world
        n_envs = batch_envs + sum(td.batch_size[0] for td in self.state.replay) * self.dist.world
        if n_envs % cfg.n_minibatches:
            raise ValueError(f"ppo.n_minibatches={cfg.n_minibatches} must divide n_envs={n_envs}")
        incoming = batch.clone() if cfg.replay else None  # as it came in: prepare writes into batch
        batch = self.prepare(batch, replayed=self.state.replay)
        if cfg.replay:
            self.state.replay = [incoming, *self.state.replay][: cfg.replay]
        coef = self.cfg.entropy_coef_at(self.state.updates)
        coef_t = torch.tensor(coef, device=batch.device)  # a tensor: a new value never recompiles
        lr = self.cfg.lr_at(self.state.updates)
        if self.train_step is None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        # compiled: the optimizer keeps cfg.lr (a float in the graph) and the step is scaled by a tensor
        lr_scale = torch.tensor(lr / self.cfg.lr, device=batch.device)
        self.optimizer.zero_grad(set_to_none=True)
        if self.train_step is not None:
            init_adam_state(self.optimizer)  # a no-op unless a loaded state_dict had none yet
        start = self._learner_state()
        steps: list[TensorDict] = []
        stopped = nonfinite = False
        epochs_run = 0
        for _ in range(cfg.n_epochs):
            for idx in env_minibatches(n_envs, cfg.n_minibatches, generator=self.generator):
                idx = idx.to(batch.device)
                if self.dist.active:
                    stopped, ok, step_metrics = self._shared_step(batch, idx, block, coef)
                    if stopped or not ok:
                        nonfinite = not stopped
                        break
                    steps.append(step_metrics)
                    continue
                if self.train_step is not None:
                    step_metrics, flags = self.train_step(batch, idx, coef_t, lr_scale)
                    # sync point: the KL and finiteness flags (where either fails, no step was applied)
                    stopped, ok = flags.tolist()
                    if stopped or not ok:
                        nonfinite = not stopped
                        break
                    steps.append(step_metrics)
                    continue
                mb = batch[idx]
                mb["current"] = self._evaluate(mb)
                losses = self.loss_fn(mb)
                total = _total_loss(losses, coef)
                self.optimizer.zero_grad(set_to_none=True)
                total.backward()
                grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
                health = grad_health(
                    grads, groups=self.groups, n_groups=len(GRAD_GROUPS), cfg=self.health_cfg
                )
                finite = torch.isfinite(total) & health["finite"]
                # sync point: the KL flag (checked before the step) and the finiteness flag, one read
                stopped, ok = torch.stack([losses["early_stop"], finite]).tolist()
                if stopped or not ok:
                    nonfinite = not stopped
                    break
                torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
                self.optimizer.step()
                steps.append(_step_metrics(losses, health, coef))
            if stopped or nonfinite:
                break
            epochs_run += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.state.updates += 1
        report = self._reduce_report(torch.stack(steps).mean(0)) if steps else TensorDict({}, batch_size=[])
        report["params_finite"] = torch.stack([torch.isfinite(p).all() for p in self.params]).all()
        metrics = read_scalars(report)  # sync point: one read
        rolled_back = nonfinite or not metrics.pop("params_finite")
        if rolled_back:
            self._restore_learner(start)
        self.bad_streak = self.bad_streak + 1 if rolled_back else 0
        out = _flatten_update_metrics(metrics)
        out.update(
            entropy_coef=coef,
            lr=lr,
            epochs_run=epochs_run,
            minibatch_steps=len(steps),
            replayed_envs=n_envs - batch_envs,
            early_stopped=bool(stopped),
            nonfinite_steps=int(nonfinite),
            rolled_back=rolled_back,
            seconds=time.perf_counter() - t0,
        )
        return out

    def _shared_step(
        self, batch: TensorDictBase, idx: torch.Tensor, block: int, coef: float
    ) -> tuple[bool, bool, TensorDict]:
        """One minibatch step with several processes: ``idx`` are global env indices (the same on every
        process; ``block`` envs of each rollout in ``batch`` are this process's, :func:`local_rows`);
        this one re-scores those in its slice, with the loss denominators summed over every
        process (:func:`esper.core.loss.loss_counts`), so the sum of the processes' gradients is the
        whole minibatch's gradient. One all-reduce carries the gradients, the KL and the finiteness
        flag; every process then takes the same decision and the same step. Returns ``(early_stop,
        finite, metrics)`` (metrics of this process's part; :meth:`_reduce_report` combines them)."""
        mine = local_rows(idx, block, self.dist)  # sync point: the slice's envs
        if mine.numel():
            mb = batch[mine]
        else:  # none of this minibatch is here: a masked-out stand-in adds nothing but joins the sums
            mb = batch[:1].clone()
            mb.set(KEYS.valid, torch.zeros(mb.batch_size, dtype=torch.bool, device=batch.device))
        mb["current"] = self._evaluate(mb)
        counts = loss_counts(mb, factored=True)
        names = sorted(counts.keys())
        # one all-reduce: the loss denominators and the sums behind the whole minibatch's explained variance
        local = torch.cat([torch.stack([counts[k].double() for k in names]), _ev_sums(mb)])
        summed = self.dist.all_reduce_sum(local)
        denominators = summed[: len(names)].float().unbind()
        losses = self.loss_fn(mb, TensorDict(dict(zip(names, denominators)), batch_size=[]))
        ev = _ev_from_sums(summed[len(names) :])
        losses["explained_variance"] = ev.to(losses["explained_variance"].dtype)
        total = _total_loss(losses, coef)
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        has = [p.grad is not None for p in self.params]
        flat = torch.cat(
            [(p.grad if h else torch.zeros_like(p)).reshape(-1) for p, h in zip(self.params, has)]
            + [losses["kl_approx"].detach().float().reshape(1), (~torch.isfinite(total)).float().reshape(1)]
        )
        flat = self.dist.all_reduce_sum(flat)
        grads, offset = [], 0
        for p, h in zip(self.params, has):
            g = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
            grads.append(g)
            if h:
                p.grad = g.clone()
        kl, bad = flat[-2], flat[-1]
        target = self.cfg.target_kl
        stop = kl > 1.5 * target if target is not None else torch.zeros((), dtype=torch.bool)
        health = grad_health(grads, groups=self.groups, n_groups=len(GRAD_GROUPS), cfg=self.health_cfg)
        finite = (bad == 0) & health["finite"]
        stopped, ok = torch.stack([stop.to(finite.device), finite]).tolist()  # sync point: the shared flags
        if not stopped and ok:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
            self.optimizer.step()
        return bool(stopped), bool(ok), _step_metrics(losses, health, coef)

    def _reduce_report(self, report: TensorDict) -> TensorDict:
        """The mean step metrics of the whole batch from every process's: sums of the shares (loss
        terms, KL, entropy, clip fractions, ``mean_ratio``), max / min of the ratio extremes, the mean
        over processes of ``ESS`` (an average of the parts', not the whole's); gradient statistics,
        head weights and the explained variance are already the whole minibatch's everywhere."""
        if not self.dist.active:
            return report
        for key in report.keys(True, True):
            path = key if isinstance(key, tuple) else (key,)
            if path[0] == "grad" or path[-1] in ("weight", "explained_variance"):
                continue
            op = {"max_ratio": "max", "min_ratio": "min"}.get(path[-1], "sum")
            value = self.dist.all_reduce(report[key].clone(), op)
            if path[-1] == "ESS":
                value = value / self.dist.world
            report[key] = value
        return report

    def _learner_state(self) -> tuple[dict, dict]:
        """Copies of the policy's and the optimizer's state (to roll an update back)."""
        policy = {k: v.detach().clone() for k, v in self.policy.state_dict().items()}
        return policy, copy.deepcopy(self.optimizer.state_dict())

    def _restore_learner(self, state: tuple[dict, dict]) -> None:
        self.policy.load_state_dict(state[0])
        self.optimizer.load_state_dict(state[1])

    def _train_step(
        self, batch: TensorDictBase, idx: torch.Tensor, coef: torch.Tensor, lr_scale: torch.Tensor
    ) -> tuple[TensorDict, torch.Tensor]:
        """One minibatch step, the body of the compiled graph: gather the envs ``idx`` of ``batch``,
        re-score, loss, backward, gradient health, clip, AdamW at ``lr_scale`` x the optimizer's
        learning rate (not applied where the KL flag is set or the loss or a gradient is not finite).
        Returns the step's metrics and the flags
        ``[early_stop, finite]``. Every ``.grad`` is None on entry and on exit."""
        td = batch[idx]
        td["current"] = self._evaluate(td)
        losses = self.loss_fn(td)
        total = _total_loss(losses, coef)
        total.backward()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        health = grad_health(grads, groups=self.groups, n_groups=len(GRAD_GROUPS), cfg=self.health_cfg)
        finite = torch.isfinite(total) & health["finite"]
        torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        stop = losses["early_stop"]
        adam_step(self.optimizer, skip=stop | ~finite, scale=lr_scale)
        for p in self.params:
            p.grad = None
        return _step_metrics(losses, health, coef), torch.stack([stop, finite])

    def _evaluate(self, td: TensorDictBase) -> TensorDict:
        h0 = td["recurrent_state", "h"][:, 0].unsqueeze(0).contiguous()
        c0 = td["recurrent_state", "c"][:, 0].unsqueeze(0).contiguous()
        out = self.policy.evaluate(td["observation"], (h0, c0), td["op", "action"], td["slot", "action"])
        return out

    # ------------------------------------------------------------------------------------- checkpoint
    def state_dict(self, *, replay: bool = True) -> dict:
        """The learner's state. ``replay`` (``ppo.replay``'s kept rollouts) is stored whole, every
        process's envs in global order, so a checkpoint resumes on any number of processes; with several
        processes gathering it is a collective, which every process must call together (``replay=False``
        leaves it out, for a copy that needs only the policy, e.g. rank 0's held-out check)."""
        return {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "obs_stats": self.state.obs_stats.to_dict(),
            "reward_stats": self.state.reward_stats.to_dict(),
            "updates": self.state.updates,
            "generator": self.generator.get_state(),
            "replay": [self._whole(td).to_dict() for td in self.state.replay] if replay else [],
        }

    def _whole(self, part: TensorDictBase) -> TensorDictBase:
        """A kept rollout with every process's envs, in rank order (this process's part alone)."""
        if not self.dist.active:
            return part
        parts = self.dist.gather_objects(part.cpu().to_dict())
        return torch.cat([TensorDict(d, batch_size=part.batch_size) for d in parts], 0)

    def load_state_dict(self, sd: dict) -> None:
        self.policy.load_state_dict(sd["policy"])
        self.optimizer.load_state_dict(sd["optimizer"])
        # The saved moments carry over; the hyperparameters are this config's (a resume with another
        # --ppo.lr must use it: load_state_dict would bring back the saved one).
        for group, decay in zip(self.optimizer.param_groups, (0.0, self.cfg.critic_weight_decay)):
            group.update(lr=self.cfg.lr, eps=self.cfg.adam_eps, weight_decay=decay)
        device = next(self.policy.parameters()).device
        self.state.obs_stats = TensorDict(sd["obs_stats"], batch_size=[]).to(device)
        self.state.reward_stats = TensorDict(sd["reward_stats"], batch_size=[]).to(device)
        self.state.updates = int(sd["updates"])
        self.generator.set_state(sd["generator"])
        # a checkpoint from before ppo.replay has none; of a longer one, the newest this config re-uses;
        # each is stored whole, and this process keeps its own slice of the envs
        kept = []
        for d in sd.get("replay", [])[: self.cfg.replay]:
            whole = TensorDict(d, batch_size=d["is_init"].shape)
            first, count = self.dist.shard(whole.batch_size[0])
            kept.append(whole[first : first + count].to(device))
        self.state.replay = kept


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


def check_finite(td: TensorDictBase) -> None:
    """Raise naming every non-finite floating key (one host sync for the whole batch)."""
    keys = [k for k in td.keys(True, True) if td[k].is_floating_point()]
    if not keys:
        return
    flags = torch.stack([torch.isfinite(td[k]).all() for k in keys])
    if not bool(flags.all()):  # sync point
        bad = [k for k, ok in zip(keys, flags.tolist()) if not ok]
        raise FloatingPointError(f"non-finite values in the rollout under {bad}; refusing to update")


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


def _group_index(policy: FactoredRecurrentActorCritic) -> list[int]:
    """Group of each parameter, in ``policy.parameters()`` order (see GRAD_GROUPS)."""
    index = {id(p): GRAD_GROUPS.index("value") for p in policy.value_head.parameters()}
    for h in HEADS:
        index.update({id(p): GRAD_GROUPS.index(h) for p in policy.heads[h].parameters()})
    for h, table in (policy.slot_bias or {}).items():
        index.update({id(p): GRAD_GROUPS.index(h) for p in table.parameters()})
    return [index.get(id(p), GRAD_GROUPS.index("trunk")) for p in policy.parameters()]


def _total_loss(losses: TensorDict, coef: float | torch.Tensor) -> torch.Tensor:
    """What the update minimizes: the per-head-weighted entropy term scaled by the annealed coefficient."""
    return losses["loss_objective"] + losses["loss_critic"] + coef * losses["loss_entropy"]


def _step_metrics(losses: TensorDict, health: TensorDict, coef: float | torch.Tensor) -> TensorDict:
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
    out = losses.select(*keep).detach().float()
    out["loss_entropy"] = out["loss_entropy"] * coef
    out["grad"] = health.select("global_norm", "group_norms", "nan_count", "inf_count").float()
    out["grad", "vanishing_frac"] = health["vanishing_frac"].float()
    out["grad", "exploding_frac"] = health["exploding_frac"].float()
    return out


def _flatten_update_metrics(m: dict) -> dict:
    """Shape the readout into the ``ppo_update`` event: per-head dicts and per-group grad norms."""
    out: dict = {}
    per_head: dict[str, dict[str, float]] = {}
    for key, value in m.items():
        parts = key.split("/")
        if parts[0] in HEADS:
            per_head.setdefault(parts[1], {})[parts[0]] = value
        elif parts[0] == "grad":
            if parts[1] == "group_norms":
                out["head_grad_norm"] = dict(zip(GRAD_GROUPS, value))
            elif parts[1] == "global_norm":
                out["grad_norm"] = value
            else:
                out[f"grad_{parts[1]}"] = value
        else:
            out[key] = value
    for stat, by_head in per_head.items():
        out[f"head_{stat}"] = by_head
    return out


__all__ = ["GRAD_GROUPS", "PPOConfig", "PPOTrainer", "TrainerState", "check_finite"]
