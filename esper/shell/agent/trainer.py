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
   the learner options, each off by default, act here: ``ppo.clip_per_group`` clips each gradient
   group before the global clip, ``ppo.value_coef_adapt`` weighs the critic loss by a coefficient that
   follows the value head's gradient norm, ``ppo.entropy_floor`` adds a hinge below a head's entropy
   floor (docs/controller.md, "Learner options");
7. rolls the policy and optimizer back to their state at step 6's start if a loss or gradient was
   not finite (that step is never taken) or the parameters ended non-finite: a non-finite update is
   never applied, so it can never reach a checkpoint.

With ``ppo.replay K`` the last K rollouts join the batch after step 4 (of the new one's host shape: with
several training tasks K are kept per shape, :func:`~esper.shell.agent.collective.keep_replay`), each
re-scored by the current policy and critic and re-based for decoupled PPO (:func:`esper.core.decouple`);
step 5 normalizes over all of it, then scales each replayed step's advantage by its truncated behaviour
weight. Step 2's statistics see only the new rollout. With several processes each keeps its own envs'
rollouts, and the update is the one process's (:func:`esper.shell.agent.steps.local_rows`).

With several processes (``dist``, each holding the rollout of its slice of the envs) the update is
the same update of the whole batch: 2. merges the statistics of every process's part exactly
(:func:`esper.core.normalize.merge_running_stats`), 5. normalizes with the whole batch's mean and
spread, and 6. draws the same global env minibatches everywhere; each process re-scores the envs of a
minibatch it holds, divides its loss terms by the whole minibatch's counts
(:func:`esper.core.loss.loss_counts`) and one all-reduce sums the gradients, the KL and the
finiteness flag, so every process takes the same decisions and the same optimizer steps.

Metrics stay on the device until the end, then one :func:`read_scalars` call brings them back; the
only other host reads are one per minibatch step (the KL flag and the finiteness flag together). Besides
the minibatch steps' means the report holds the health of the rollout's LSTM states
(:func:`esper.core.health.lstm_health` of the stored ``("recurrent_state", "h" | "c")`` after each
episode's first step, the same whichever minibatch step runs, eager or compiled; ``lstm_*`` in the
``ppo_update`` event) and the statistics of the advantages GAE gave, before step 5 normalizes them
(``adv_mean``, ``adv_std``, ``adv_max_abs``, ``adv_pos_frac``; finding M12). ``update(detail=True)``
adds each minibatch step's metrics and each env's rollout statistics (``detail``; the run logs them as
``ppo_detail`` for a while after an anomaly).

The minibatch step of 6. is chosen once, when the trainer is built (:mod:`esper.shell.agent.steps`):
eager, compiled, or shared by several processes. With ``compile=True`` it is one graph (the LSTM
re-scoring, the loss, backward, the gradient-health statistics, the clip and the AdamW step, compiled
with ``fullgraph=True``; with ``ppo.replay K``, one graph per batch size while the kept rollouts fill
up, K + 1 in all, then none). Both paths skip the same step. GAE is compiled on its own; the rest of
``prepare`` stays eager.

The trainer updates its :class:`~esper.shell.agent.agent.Agent`: the policy's weights and the
observation statistics the agent normalizes its input with.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from tensordict import TensorDict, TensorDictBase

from esper import kernels
from esper.core.advantage import gae, gae_tensors, group_relative, normalize_advantage
from esper.core.distributions import masked_categorical
from esper.core.health import GradHealthConfig, lstm_health
from esper.core.loss import decouple, loss_counts, ppo_loss
from esper.core.minibatch import env_minibatches
from esper.core.normalize import (
    running_stats,
    scale,
)
from esper.core.spec import HEADS, KEYS, ActionSpec
from esper.shell.agent.agent import Agent, build_agent
from esper.shell.agent.collective import (
    advantage_stats,
    check_finite_everywhere,
    keep_replay,
    reduce_health,
    reduce_report,
    shape_key,
    update_stats,
    whole_rollout,
)
from esper.shell.agent.config import PPOConfig
from esper.shell.agent.steps import GRAD_GROUPS, Learner, ValueCoefRule, make_step
from esper.shell.common.distributed import SINGLE, Dist
from esper.shell.telemetry.readout import read_scalars

#: Parameter groups whose gradient norms are reported separately.


@dataclass(slots=True)
class TrainerState:
    """Everything of the learner that a checkpoint must carry besides the agent and the optimizer."""

    reward_stats: TensorDict
    updates: int = 0
    #: The last ``ppo.replay`` rollouts of each shape as they came in (newest first), for decoupled re-use.
    replay: list = field(default_factory=list)


class PPOTrainer:
    def __init__(
        self,
        agent: Agent,
        cfg: PPOConfig,
        *,
        compile: bool = False,
        compile_backend: str | Callable = "inductor",
        generator: torch.Generator | None = None,
        dist: Dist = SINGLE,
    ) -> None:
        limit = torch.compiler.config.recompile_limit
        if compile and cfg.replay + 1 > limit:
            raise ValueError(
                f"ppo.replay={cfg.replay} with --compile needs {cfg.replay + 1} graphs (one per batch size "
                f"while the kept rollouts fill up), over torch.compile's recompile_limit of {limit}; use "
                f"--ppo.replay {limit - 1} or less, or run without --compile"
            )
        policy = agent.policy
        self.agent, self.policy, self.cfg, self.dist = agent, policy, cfg, dist
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
        self.state = TrainerState(reward_stats=running_stats((), device=device))
        #: The advantage statistics of the last :meth:`prepare` (device tensors, read with the report).
        self.advantage = TensorDict({}, batch_size=[])
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)
        #: Consecutive updates rolled back for a non-finite loss, gradient or parameter.
        self.bad_streak = 0
        self.params = list(policy.parameters())
        self.loss_fn, self.gae_fn, self._categorical = loss_functions(
            cfg, device, compile=compile, backend=compile_backend
        )
        rule = None
        if cfg.value_coef_adapt > 0:
            rule = ValueCoefRule(cfg.value_coef, cfg.value_coef_adapt, cfg.value_coef_adapt_rate)
        floor = bool(cfg.entropy_floor)
        counts = partial(loss_counts, factored=True, entropy=floor, categorical=self._categorical)
        #: What the minibatch step works on (the network, optimizer, loss, clip and learner options).
        self.learner = Learner(
            policy, self.optimizer, self.loss_fn, self._rescore,
            GradHealthConfig.for_clipped_ppo(cfg.max_grad_norm, factor=cfg.grad_explode_factor),
            cfg.max_grad_norm, cfg.target_kl, clip_per_group=cfg.clip_per_group, value_rule=rule,
            counts_fn=counts,
        )  # fmt: skip
        #: The minibatch step, chosen once: eager, compiled or shared by several processes.
        self.step = make_step(
            self.learner, compile=compile, dist=dist, base_lr=cfg.lr, backend=compile_backend
        )

    # ----------------------------------------------------------------------------------------- update
    def prepare(self, batch: TensorDictBase, *, replayed: list[TensorDictBase] = ()) -> TensorDictBase:
        """Steps 1-5 of the module docstring; returns the batch ready for the epochs. ``replayed``:
        earlier rollouts (``ppo.replay``), re-scored by :func:`rescore_replayed` and appended along
        the env dim after step 4; step 5 normalizes over all of it. The advantages' statistics before
        step 5 go to :attr:`advantage`."""
        cfg = self.cfg
        check_finite_everywhere(batch, self.dist)
        st = self.state
        # C5: statistics include this batch before the update (the stored observations are not
        # re-normalized: they are what the policy saw, S2).
        self.agent.update_statistics(
            batch, lambda stats, x, valid: update_stats(stats, x, self.dist, cfg.obs_momentum, valid)
        )
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
        st.reward_stats = update_stats(st.reward_stats, returns, self.dist)
        batch["next", "reward"] = scale(st.reward_stats, raw, clip=cfg.reward_clip)
        with torch.no_grad():
            self.gae_fn(batch)
            # C4: the value-clip anchor is V under the same hidden reconstruction the update uses.
            batch["state_value"] = self._rescore(batch)["state_value"]
            weight = None
            if replayed:
                fns = (self._rescore, self.gae_fn, self._categorical)
                old = [rescore_replayed(td, st.reward_stats, cfg, *fns) for td in replayed]
                weight = torch.cat([torch.ones_like(batch["advantage"])] + [w for _, w in old], 0)
                batch = torch.cat([batch] + [td for td, _ in old], 0)
            self.advantage = advantage_stats(batch["advantage"], batch.get(KEYS.valid, None), self.dist)
            if cfg.normalize_advantage:
                reduce = self.dist.all_reduce_sum if self.dist.active else None
                batch["advantage"] = normalize_advantage(batch["advantage"], reduce=reduce)
            if weight is not None:  # after normalizing: the weight scales each step's share, not the spread
                batch["advantage"] = batch["advantage"] * weight
        return batch

    def update(self, batch: TensorDictBase, *, detail: bool = False) -> dict[str, float | list[float]]:
        """One PPO update on a rollout ``[n_envs, T]``. Returns host-side metrics (one sync per
        minibatch step, for the KL flag and the finiteness flag together, and one for the report).
        ``detail``: the metrics also hold ``detail``, ``{"steps": {metric: [one per minibatch step]},
        "envs": {statistic: [one per env of the new rollout]}}``.

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
        replayed = [td for td in self.state.replay if shape_key(td) == shape_key(batch)]  # one host shape
        n_envs = batch_envs + sum(td.batch_size[0] for td in replayed) * self.dist.world
        if n_envs % cfg.n_minibatches:
            raise ValueError(f"ppo.n_minibatches={cfg.n_minibatches} must divide n_envs={n_envs}")
        incoming = batch.clone() if cfg.replay else None  # as it came in: prepare writes into batch
        lstm = self._lstm_health(batch)
        batch = self.prepare(batch, replayed=replayed)
        if cfg.replay:
            self.state.replay = keep_replay([incoming, *self.state.replay], cfg.replay)
        coef = cfg.entropy_coef_at(self.state.updates)
        lr = cfg.lr_at(self.state.updates)
        self.step.begin_update(lr, block=block)
        self.optimizer.zero_grad(set_to_none=True)
        start = self._learner_state()
        steps: list[TensorDict] = []
        stopped = nonfinite = False
        epochs_run = 0
        for _ in range(cfg.n_epochs):
            for idx in env_minibatches(n_envs, cfg.n_minibatches, generator=self.generator):
                stopped, ok, metrics = self.step(batch, idx.to(batch.device), coef)
                if stopped or not ok:
                    nonfinite = not stopped
                    break
                steps.append(metrics)
            if stopped or nonfinite:
                break
            epochs_run += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.state.updates += 1
        report = TensorDict({}, batch_size=[])
        if steps:
            report = reduce_report(torch.stack(steps).mean(0), self.dist)
        report["lstm"] = lstm
        report["advantage"] = self.advantage
        if detail:
            if steps:
                report["steps"] = reduce_report(torch.stack(steps), self.dist)
            report["envs"] = self._env_detail(batch[:block])
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

    def _lstm_health(self, batch: TensorDictBase) -> TensorDict:
        """:func:`esper.core.health.lstm_health` of the rollout's stored recurrent states after each
        episode's first step (the first is the zero initial state, not a state the network made), over
        every process's envs."""
        h = batch["recurrent_state", "h"][:, 1:]
        c = batch["recurrent_state", "c"][:, 1:]
        return reduce_health(lstm_health(h, c), self.dist)

    def _env_detail(self, new: TensorDictBase) -> TensorDict:
        """Per env of the new rollout (every process's, in global order): the episode's raw return, the
        mean value-clip anchor, and the mean and largest magnitude of its normalized advantages."""
        E = new.batch_size[0]
        adv = new["advantage"].reshape(E, -1).float()
        stats = torch.stack(
            [
                new["next", "raw_reward"].reshape(E, -1).float().sum(1),
                new["state_value"].reshape(E, -1).float().mean(1),
                adv.mean(1),
                adv.abs().amax(1),
            ],
            dim=1,
        )
        whole = torch.cat(self.dist.gather_tensors(stats), 0)
        names = ("return", "value_mean", "adv_mean", "adv_max_abs")
        return TensorDict({k: whole[:, j] for j, k in enumerate(names)}, batch_size=[])

    def _learner_state(self) -> tuple[dict, dict, torch.Tensor | None]:
        """Copies of the policy's and the optimizer's state and of the adaptive value coefficient (to
        roll an update back)."""
        policy = {k: v.detach().clone() for k, v in self.policy.state_dict().items()}
        coef = self.learner.value_coef
        return policy, copy.deepcopy(self.optimizer.state_dict()), None if coef is None else coef.clone()

    def _restore_learner(self, state: tuple[dict, dict, torch.Tensor | None]) -> None:
        self.policy.load_state_dict(state[0])
        self.optimizer.load_state_dict(state[1])
        self.learner.value_coef = state[2]

    def _rescore(self, td: TensorDictBase) -> TensorDict:
        """Per-head logits and V of the stored sequences of ``td``, re-scored from their initial
        recurrent state (the stored ops and slots condition the later heads)."""
        h0 = td["recurrent_state", "h"][:, 0].unsqueeze(0).contiguous()
        c0 = td["recurrent_state", "c"][:, 0].unsqueeze(0).contiguous()
        out = self.policy.rescore(td["observation"], (h0, c0), td["op", "action"], td["slot", "action"])
        return out

    # ------------------------------------------------------------------------------------- checkpoint
    def state_dict(self, *, replay: bool = True) -> dict:
        """The learner's state, what resuming training needs besides the agent's
        (:meth:`esper.shell.agent.agent.Agent.state_dict`): a checkpoint's ``learner`` entry. ``replay``
        (``ppo.replay``'s kept rollouts) is stored whole, every process's envs in global order, so a
        checkpoint resumes on any number of processes; with several processes gathering it is a
        collective, which every process must call together (``replay=False`` leaves it out)."""
        out = {
            "optimizer": self.optimizer.state_dict(),
            "reward_stats": self.state.reward_stats.to_dict(),
            "updates": self.state.updates,
            "generator": self.generator.get_state(),
            "replay": [whole_rollout(td, self.dist).to_dict() for td in self.state.replay] if replay else [],
        }
        if self.learner.value_coef is not None:  # ppo.value_coef_adapt: where the coefficient got to
            out["value_coef"] = self.learner.value_coef.detach().cpu().clone()
        return out

    def load_state_dict(self, sd: dict) -> None:
        """Restore the learner's state (:meth:`state_dict`; the agent's is
        :meth:`esper.shell.agent.agent.Agent.load`)."""
        self.optimizer.load_state_dict(sd["optimizer"])
        # The saved moments carry over; the hyperparameters are this config's (a resume with another
        # --ppo.lr must use it: load_state_dict would bring back the saved one).
        for group, decay in zip(self.optimizer.param_groups, (0.0, self.cfg.critic_weight_decay)):
            group.update(lr=self.cfg.lr, eps=self.cfg.adam_eps, weight_decay=decay)
        device = next(self.policy.parameters()).device
        self.state.reward_stats = TensorDict(sd["reward_stats"], batch_size=[]).to(device)
        self.state.updates = int(sd["updates"])
        self.generator.set_state(sd["generator"])
        if self.learner.value_coef is not None and "value_coef" in sd:  # else it starts at ppo.value_coef
            self.learner.value_coef = sd["value_coef"].to(device=device, dtype=self.learner.value_coef.dtype)
        # a checkpoint from before ppo.replay has none; of a longer one, the newest this config re-uses
        # (of each shape); each is stored whole, and this process keeps its own slice of the envs
        kept = []
        for d in sd.get("replay", []):
            whole = TensorDict(d, batch_size=d["is_init"].shape)
            first, count = self.dist.shard(whole.batch_size[0])
            kept.append(whole[first : first + count].to(device))
        self.state.replay = keep_replay(kept, self.cfg.replay)


def loss_functions(
    cfg: PPOConfig, device: torch.device, *, compile: bool = False, backend: str | Callable = "inductor"
) -> tuple[Callable, Callable, Callable]:
    """The trainer's loss (``ppo_loss`` with the config's coefficients, factored over the heads), GAE
    (compiled with ``compile``) and masked categorical: the fused Triton kernels where they run (CUDA
    with Triton), the core functions elsewhere."""
    weights = cfg.head_entropy_weights or (1.0,) * len(HEADS)
    head_weights = dict(zip(HEADS, weights))
    use_kernels = device.type == "cuda" and kernels.HAS_TRITON
    categorical = kernels.masked_categorical if use_kernels else masked_categorical
    gae_impl = kernels.gae if use_kernels else gae

    def loss_fn(td: TensorDictBase, counts: TensorDict | None = None) -> TensorDict:
        # entropy_coef is a per-head weight here; the annealed scalar multiplies loss_entropy
        # outside, so a changing coefficient never recompiles the loss.
        # with ppo.value_coef_adapt the critic loss comes unweighted; the step weighs it (steps.descend)
        return ppo_loss(
            td,
            factored=True,
            clip_epsilon=cfg.clip_epsilon,
            value_clip=cfg.value_clip,
            value_coef=1.0 if cfg.value_coef_adapt > 0 else cfg.value_coef,
            entropy_coef=head_weights,
            target_kl=cfg.target_kl,
            categorical=categorical,
            counts=counts,
            entropy_floor=cfg.entropy_floors(),
            entropy_floor_coef=cfg.entropy_floor_coef,
        )

    def gae_fn(td: TensorDictBase) -> TensorDictBase:
        out = gae_impl(td, gamma=cfg.gamma, lmbda=cfg.gae_lambda)
        if cfg.host_group > 1:  # the envs of a group share a host: the others' advantages are a baseline
            out["advantage"] = group_relative(out["advantage"], cfg.host_group, out.get(KEYS.valid, None))
        return out

    if compile:
        gae_fn = torch.compile(gae_fn, fullgraph=True, dynamic=False, backend=backend)
    return loss_fn, gae_fn, categorical


def rescore_replayed(
    old: TensorDictBase,
    reward_stats: TensorDict,
    cfg: PPOConfig,
    rescore: Callable[[TensorDictBase], TensorDict],
    gae_fn: Callable[[TensorDictBase], TensorDictBase],
    categorical: Callable,
) -> tuple[TensorDictBase, torch.Tensor]:
    """An earlier rollout made ready for this update (``ppo.replay``): its rewards scaled with the
    current statistics, V from the current critic (``rescore``: the value-clip anchor and GAE's values;
    the truncated last step's bootstrap stays the rollout's, whose post-action state is not stored),
    GAE, and :func:`esper.core.decouple`: each head's stored log-prob replaced by the current
    (proximal) policy's and the truncated behaviour weight, returned beside the batch. Call under
    ``no_grad``; the stored observations are those the behaviour policy saw (S2)."""
    td = old.clone()
    td["next", "reward"] = scale(reward_stats, td["next", "raw_reward"], clip=cfg.reward_clip)
    prox = rescore(td)
    values = prox["state_value"]
    boot = td["next", "state_value"][:, -1:]
    td["state_value"] = values
    td["next", "state_value"] = torch.cat([values[:, 1:], boot.to(values.dtype)], dim=1)
    gae_fn(td)
    td["current"] = prox
    rebased = decouple(td, factored=True, categorical=categorical)
    del td["current"]
    weight = rebased.pop("behaviour_weight")
    td.update(rebased)
    return td, weight.reshape(td["advantage"].shape)


def _flatten_update_metrics(m: dict) -> dict:
    """Shape the readout into the ``ppo_update`` event: per-head dicts, per-group grad norms, ``lstm_*``
    and ``adv_*`` statistics, and the ``detail`` dict (``steps`` and ``envs``) when it was asked for."""
    out: dict = {}
    per_head: dict[str, dict[str, float]] = {}
    detail: dict[str, dict] = {}
    for key, value in m.items():
        parts = key.split("/")
        if parts[0] in ("steps", "envs"):
            detail.setdefault(parts[0], {})["/".join(parts[1:])] = value
        elif parts[0] == "lstm":
            out[f"lstm_{parts[1]}"] = value
        elif parts[0] == "advantage":
            out[f"adv_{parts[1]}"] = value
        elif parts[0] in HEADS:
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
    if detail:
        out["detail"] = detail
    return out


def build_learner(
    ppo: PPOConfig, spec: ActionSpec, *, device: torch.device | str, seed: int, compile: bool = False,
    dist: Dist = SINGLE, germination_cost: torch.Tensor | None = None, raw_obs_dim: int | None = None,
    budget_input: bool = False,
) -> tuple[Agent, PPOTrainer]:  # fmt: skip
    """A fresh agent for an action space (:func:`~esper.shell.agent.agent.build_agent`) and its PPO
    trainer, whose minibatch order is drawn from ``seed``'s generator; load a checkpoint's ``agent`` entry
    into the agent (:meth:`~esper.shell.agent.agent.Agent.load`) and its ``learner`` entry into the
    trainer (:meth:`PPOTrainer.load_state_dict`) to restore both."""
    agent = build_agent(ppo, spec, device=device, germination_cost=germination_cost, raw_obs_dim=raw_obs_dim,
                        budget_input=budget_input)  # fmt: skip
    trainer = PPOTrainer(
        agent, ppo, compile=compile, generator=torch.Generator().manual_seed(seed + 1), dist=dist
    )
    return agent, trainer


__all__ = ["PPOTrainer", "TrainerState", "build_learner"]
