"""Learning from kept episodes (a dataset of :mod:`esper.shell.eval.dataset`): behaviour cloning before
PPO (``python -m esper.shell.run --pretrain DATASET``) or a policy trained from the episodes alone
(``--offline DATASET``, by BC, IQL or the Q-free expectile variant), :class:`OfflineLearner`.

:meth:`OfflineLearner.prepare` makes the dataset ready once, as the PPO trainer's ``prepare`` does a
rollout: the agent's observation statistics take in the episodes' raw observations (finding C5), the
policy's input is built from them with those statistics (:meth:`Agent.policy_input
<esper.shell.agent.agent.Agent.policy_input>` on the raw observation, the stored op legality bits and
the dataset's host layout), and rewards are scaled by the spread of the discounted returns (the
trainer's scaling, statistics the PPO trainer then continues from). Each epoch shuffles the episodes
into minibatches of whole episodes (finding C3) and re-scores each from the zero recurrent state (every
stored sequence is a whole episode: the state it began in) with the policy's own ``rescore``, the call
the PPO trainer makes, so the later heads are conditioned on the stored op and slot; then one loss of
:mod:`esper.core.offline`, a clipped gradient step (AdamW), and for IQL and ``expectile_td`` a Polyak
step (``offline_rl.target_tau``) of the target networks.

- ``bc``: :func:`esper.core.offline.bc_loss`; the critic also regresses to each step's discounted
  return (scaled; ``offline_rl.value_coef``), so PPO starts with a critic of the data's scale.
- ``iql``: :func:`esper.core.offline.iql_losses`, IQL as Kostrikov et al. (2021) define it, with a Q
  critic the policy does not have: :class:`ActionValueHead`, twin Q heads over the policy's trunk
  features and an embedding of the stored factored action (its class docstring). V is the policy's own
  critic; ``V(s')`` is the current network's (no gradient) over the episode with its post-action
  observation appended (the next step's value, on the last step the post-action state's, used where the
  episode was truncated); ``Q_target`` is a Polyak copy of the trunk and the Q heads together (the
  paper's target critic; V has none, as in the paper). The Q heads train the trunk as V does and live
  only as long as the learner: the checkpoint holds the policy, which is what PPO and ``evaluate`` read.
  ``offline_rl.value_coef`` weights V's and Q's terms alike (the paper trains each by its own optimizer
  at weight 1).
- ``expectile_td``: :func:`esper.core.offline.expectile_td_losses`, what ``iql`` was before issue 104:
  no Q, V's expectile over the TD sample ``r + gamma V_target(s')``, ``V_target(s')`` from a slowly moving
  copy of the network over the episode with its post-action observation appended.

Metrics are means over each epoch's minibatch steps, read with one host sync per epoch.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from esper.core.advantage import gae_tensors
from esper.core.loss import total_loss
from esper.core.masks import head_relevance
from esper.core.normalize import running_stats, scale
from esper.core.offline import bc_loss, expectile_td_losses, iql_losses
from esper.core.spec import HEAD_INDEX, HEADS
from esper.shell.agent.agent import Agent
from esper.shell.agent.collective import update_stats
from esper.shell.agent.config import PPOConfig
from esper.shell.agent.policy import _mlp
from esper.shell.common.distributed import SINGLE
from esper.shell.common.fields import check_fields, doc
from esper.shell.env.step import StepInput
from esper.shell.host.descriptors import HostLayout
from esper.shell.telemetry.readout import read_scalars

#: The offline learners (``offline_rl.algo``).
ALGOS = ("bc", "iql", "expectile_td")
#: The learners with target networks and advantage weights.
TARGETED = ("iql", "expectile_td")
#: The epoch metrics reported (besides per-head ones).
METRICS = ("loss_objective", "loss_critic", "loss_entropy", "log_likelihood", "accuracy", "entropy")
#: The IQL family's (``expectile_td`` reports these, ``iql`` these and :data:`Q_METRICS`).
IQL_METRICS = ("advantage_mean", "weight_mean", "weight_max", "weight_clip_fraction", "value_mean",
               "explained_variance")  # fmt: skip
Q_METRICS = ("expectile_loss", "td_loss", "q_mean", "q_explained_variance")
#: The Q critics of ``iql`` (twin, as the paper) and the width of each head's action embedding.
N_CRITICS, ACTION_EMBED = 2, 8


class ActionValueHead(nn.Module):
    """Q(s, a) of a stored factored action, for ``iql``: ``n_critics`` critics, each ``Linear -> ReLU ->
    Linear`` (the value head's shape) over the trunk features of s concatenated with an embedding of a.

    The action's embedding is, per head, a learned ``embed``-wide vector of the head's stored choice
    (one table per head and critic), zeroed where the head was irrelevant to the stored op
    (:func:`esper.core.masks.head_relevance`, the relevance the losses count heads by), and the heads'
    vectors concatenated: two actions that do the same thing (a WAIT whatever its other heads hold) have
    the same Q, and a rule's arbitrary choice for a head its op ignores does not enter. The heads'
    sizes are the dataset's (its stored masks' widths), so the set policy's pointer heads get a table of
    the dataset's host shape: the Q heads serve one dataset and are not kept."""

    def __init__(self, hidden: int, sizes: dict[str, int], *, head_hidden: int, embed: int = ACTION_EMBED,
                 n_critics: int = N_CRITICS) -> None:  # fmt: skip
        super().__init__()
        if set(sizes) != set(HEADS) or n_critics < 1:
            raise ValueError(f"ActionValueHead: sizes for the heads {list(HEADS)} and n_critics >= 1")
        self.embeddings = nn.ModuleList(
            nn.ModuleDict({h: nn.Embedding(sizes[h], embed) for h in HEADS}) for _ in range(n_critics)
        )
        width = hidden + embed * len(HEADS)
        self.critics = nn.ModuleList(_mlp(width, head_hidden, 1, 1.0) for _ in range(n_critics))

    def forward(self, feats: torch.Tensor, actions: dict[str, torch.Tensor]) -> torch.Tensor:
        """``feats [*B, hidden]``, ``actions`` per head int ``[*B]`` -> ``[*B, n_critics]``."""
        relevant = head_relevance(actions["op"].long()).to(feats.dtype)
        out = []
        for table, critic in zip(self.embeddings, self.critics):
            parts = [table[h](actions[h].long()) * relevant[..., HEAD_INDEX[h], None] for h in HEADS]
            out.append(critic(torch.cat([feats, *parts], dim=-1)).squeeze(-1))
        return torch.stack(out, dim=-1)


@dataclass(frozen=True, slots=True)
class OfflineConfig:
    algo: str = doc("iql", "what --offline trains with: bc (behaviour cloning) | iql (Kostrikov et al. "
                    "2021: twin Q by TD, V by expectile of the target Q, advantage-weighted policy) | "
                    "expectile_td (no Q: V's expectile over the TD sample r + gamma V'); --pretrain "
                    "always clones")  # fmt: skip
    epochs: int = doc(40, "passes over the dataset of --offline", ge=1)
    pretrain_epochs: int = doc(20, "passes over the dataset of --pretrain before the first PPO update", ge=1)
    minibatch: int = doc(8, "episodes per minibatch step (whole episodes)", ge=1)
    lr: float = doc(1e-3, "AdamW learning rate of the offline steps", gt=0)
    value_coef: float = doc(0.5, "weight of the critic's terms (BC: regression to the return; IQL: V's "
                            "expectile and Q's TD error each; expectile_td: the expectile)",
                            ge=0)  # fmt: skip
    entropy_coef: float = doc(0.0, "entropy bonus of the offline steps (normalized entropy per head)", ge=0)
    expectile: float = doc(0.7, "IQL: the expectile of V's regression (0.5: the data's mean)", gt=0, lt=1)
    temperature: float = doc(3.0, "IQL: the policy's weight is exp(temperature x advantage)", ge=0)
    max_weight: float = doc(100.0, "IQL: the cap of the policy's weight", gt=0)
    target_tau: float = doc(0.02, "IQL: the target network (iql: trunk and Q heads; expectile_td: the "
                            "whole network) moves this share towards the trained one each step", gt=0,
                            le=1)  # fmt: skip

    def __post_init__(self) -> None:
        check_fields(self, "offline_rl")
        if self.algo not in ALGOS:
            raise ValueError(f"offline_rl.algo must be one of {', '.join(ALGOS)}, got {self.algo!r}")


class OfflineLearner:
    """Trains ``agent`` (its policy and observation statistics) on a dataset; the module docstring."""

    def __init__(self, agent: Agent, ppo: PPOConfig, cfg: OfflineConfig, *, seed: int) -> None:
        self.agent, self.policy, self.ppo, self.cfg = agent, agent.policy, ppo, cfg
        self.device = agent.device
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=cfg.lr, eps=ppo.adam_eps)
        self.generator = torch.Generator().manual_seed(seed)
        #: The statistics of the discounted returns the rewards are scaled by (the PPO trainer's kind).
        self.reward_stats = running_stats((), device=self.device)
        #: The target copy of the network (``iql`` reads its trunk, ``expectile_td`` its V), made by fit.
        self.target: torch.nn.Module | None = None
        #: ``iql``'s Q heads and their target copy (:class:`ActionValueHead`), made by fit.
        self.q: ActionValueHead | None = None
        self.q_target: ActionValueHead | None = None

    # ----------------------------------------------------------------------------------------- data
    def prepare(self, data: TensorDictBase, layout: HostLayout) -> TensorDict:
        """The dataset ``[N]`` (``steps [N, T]``, ``final [N]``) ready for the epochs (module docstring):
        ``steps`` gains ``observation``, ``("next", "reward")`` and ``value_target``, ``final`` its
        ``observation``."""
        data = data.to(self.device)
        steps, final = data["steps"].clone(), data["final"].clone()
        layout = layout.to(self.device)
        steps["observation"] = self.policy_inputs(
            steps["raw_observation"], steps["op", "action_mask"], layout
        )
        momentum = self.ppo.obs_momentum
        self.agent.update_statistics(steps, lambda st, x, valid: update_stats(st, x, SINGLE, momentum, valid))
        steps["observation"] = self.policy_inputs(
            steps["raw_observation"], steps["op", "action_mask"], layout
        )
        final["observation"] = self.policy_inputs(final["raw_observation"], final["op_mask"], layout)
        raw = steps["next", "raw_reward"].float()
        done, terminated = (
            steps["next", "done"].reshape(raw.shape),
            steps["next", "terminated"].reshape(raw.shape),
        )
        zeros = torch.zeros_like(raw)
        returns, _ = gae_tensors(raw, zeros, zeros, done, terminated, gamma=self.ppo.gamma, lmbda=1.0)
        self.reward_stats = update_stats(self.reward_stats, returns, SINGLE)
        reward = scale(self.reward_stats, raw, clip=self.ppo.reward_clip)
        steps["next", "reward"] = reward
        steps["value_target"], _ = gae_tensors(reward, zeros, zeros, done, terminated, gamma=self.ppo.gamma,
                                               lmbda=1.0)  # fmt: skip
        return TensorDict({"steps": steps, "final": final}, batch_size=data.batch_size)

    def policy_inputs(self, raw: torch.Tensor, op_mask: torch.Tensor, layout: HostLayout) -> TensorDictBase:
        """What the policy reads for raw observations ``[*L, obs]`` with op legality ``[*L, n_ops]`` on
        ``layout``'s host, with the agent's current statistics: ``[*L, ...]``."""
        lead = raw.shape[:-1]
        flat_raw, flat_ops = raw.reshape(-1, raw.shape[-1]), op_mask.reshape(-1, op_mask.shape[-1])
        legal = TensorDict({"op": flat_ops}, batch_size=flat_ops.shape[:1])
        step = StepInput(raw_obs=flat_raw, legal=legal, slots=None, signals=None, history=None, host=layout)
        x = self.agent.policy_input(step, legal)
        return x.reshape(*lead) if isinstance(x, TensorDictBase) else x.reshape(*lead, x.shape[-1])

    # -------------------------------------------------------------------------------------- training
    def fit(self, data: TensorDict, algo: str, epochs: int,
            on_epoch: Callable[[int, dict], None] | None = None) -> list[dict]:  # fmt: skip
        """``epochs`` passes of ``algo`` over the prepared ``data``; returns each epoch's metrics (also
        handed to ``on_epoch(epoch, metrics)``, epochs from 1).

        Raises:
            FloatingPointError: a loss or a parameter went non-finite.
        """
        if algo not in ALGOS:
            raise ValueError(f"offline algo must be one of {', '.join(ALGOS)}, got {algo!r}")
        if algo in TARGETED and self.target is None:
            self.target = copy.deepcopy(self.policy).requires_grad_(False)
        if algo == "iql" and self.q is None:
            steps = data["steps"]
            sizes = {h: steps[h, "action_mask"].shape[-1] for h in HEADS}
            q = ActionValueHead(self.policy.hidden, sizes, head_hidden=self.ppo.head_hidden)
            self.q = q.to(self.device)
            self.q_target = copy.deepcopy(self.q).requires_grad_(False)
            self.optimizer.add_param_group({"params": list(self.q.parameters())})
        self.policy.train()
        reports = []
        n = data.batch_size[0]
        for epoch in range(1, epochs + 1):
            t0 = time.perf_counter()
            steps = []
            for idx in torch.randperm(n, generator=self.generator).split(self.cfg.minibatch):
                steps.append(self._step(data[idx.to(self.device)], algo))
            report = torch.stack(steps).mean(0)
            report["finite"] = torch.stack([torch.isfinite(p).all() for p in self.policy.parameters()]).all()
            metrics = read_scalars(report)  # sync point: one read per epoch
            if not metrics.pop("finite") or any(v != v for v in metrics.values() if isinstance(v, float)):
                raise FloatingPointError(
                    f"offline {algo}: a loss or a parameter is not finite at epoch {epoch}"
                )
            metrics = {"epoch": epoch, "algo": algo, **metrics, "seconds": time.perf_counter() - t0}
            reports.append(metrics)
            if on_epoch is not None:
                on_epoch(epoch, metrics)
        return reports

    def _step(self, mb: TensorDictBase, algo: str) -> TensorDict:
        cfg = self.cfg
        steps = mb["steps"]
        steps["current"] = self._rescore(self.policy, steps)
        if algo == "iql":
            self._action_values(mb)
            losses = iql_losses(
                steps, gamma=self.ppo.gamma, expectile=cfg.expectile, temperature=cfg.temperature,
                max_weight=cfg.max_weight, value_coef=cfg.value_coef, q_coef=cfg.value_coef,
                entropy_coef=cfg.entropy_coef,
            )  # fmt: skip
        elif algo == "expectile_td":
            with torch.no_grad():
                steps["next", "state_value"] = self._next_values(self.target, mb)
            losses = expectile_td_losses(
                steps, gamma=self.ppo.gamma, expectile=cfg.expectile, temperature=cfg.temperature,
                max_weight=cfg.max_weight, value_coef=cfg.value_coef, entropy_coef=cfg.entropy_coef,
            )  # fmt: skip
        else:
            losses = bc_loss(steps, entropy_coef=cfg.entropy_coef, value_coef=cfg.value_coef)
        total = total_loss(losses)
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.ppo.max_grad_norm)
        if algo == "iql":
            torch.nn.utils.clip_grad_norm_(self.q.parameters(), self.ppo.max_grad_norm)
        self.optimizer.step()
        if algo in TARGETED:
            with torch.no_grad():
                pairs = [(self.target, self.policy)] + ([(self.q_target, self.q)] if algo == "iql" else [])
                for target, online in pairs:
                    for t, p in zip(target.parameters(), online.parameters()):
                        t.lerp_(p, cfg.target_tau)
        keep = METRICS + (IQL_METRICS if algo in TARGETED else ()) + (Q_METRICS if algo == "iql" else ())
        return losses.select(*[k for k in keep if k in losses.keys()]).detach().float()

    def _action_values(self, mb: TensorDictBase) -> None:
        """``iql``'s inputs beyond the re-scoring, into ``mb["steps"]``: the Q heads' ``Q_k(s, a)`` of
        the stored actions over the trunk's features (grad), the target trunk and Q heads' (no grad),
        and the current V of the next state (no grad; the post-action observation's on the last step)."""
        steps = mb["steps"]
        actions = {h: steps[h, "action"].reshape(steps.batch_size) for h in HEADS}
        obs = torch.cat([steps["observation"], mb["final", "observation"].unsqueeze(1)], dim=1)
        feats, _ = self.policy.features(obs, self.policy.initial_state(mb.batch_size[0], mb.device))
        steps["current", "state_action_value"] = self.q(feats[:, :-1], actions)
        with torch.no_grad():
            steps["next", "state_value"] = self.policy.value(feats[:, 1:].detach())
            target_feats, _ = self.target.features(
                steps["observation"], self.target.initial_state(mb.batch_size[0], mb.device)
            )
            steps["target", "state_action_value"] = self.q_target(target_feats, actions)

    @staticmethod
    def _rescore(policy: torch.nn.Module, steps: TensorDictBase) -> TensorDict:
        """Per-head logits and V of whole stored episodes, from the zero state every episode starts in."""
        state = policy.initial_state(steps.batch_size[0], steps.device)
        return policy.rescore(steps["observation"], state, steps["op", "action"], steps["slot", "action"])

    @staticmethod
    def _next_values(net: torch.nn.Module, mb: TensorDictBase) -> torch.Tensor:
        """``[m, T]``: ``net``'s V(s_{t+1}), the post-action observation's on the last step."""
        obs = torch.cat([mb["steps", "observation"], mb["final", "observation"].unsqueeze(1)], dim=1)
        feats, _ = net.features(obs, net.initial_state(mb.batch_size[0], mb.device))
        return net.value(feats)[:, 1:]


__all__ = [
    "ALGOS",
    "IQL_METRICS",
    "METRICS",
    "Q_METRICS",
    "ActionValueHead",
    "OfflineConfig",
    "OfflineLearner",
]
