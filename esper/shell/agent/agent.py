"""The agent: Tamiyo's network plus the observation statistics it reads its input with.

What the policy sees is ``cat(normalize(raw_obs), op_legality)``: the raw observation normalized with
the agent's statistics (frozen during a rollout; the trainer updates them before each PPO update,
finding C5), plus one bit per op saying whether it is legal now for this agent (with ``ppo.param_cap``,
after the cap's narrowing, :meth:`Agent.legal`). That input is what a learning controller stores as
``observation`` (finding S2), so the PPO update re-scores exactly the inputs the actions were sampled
from; the value therefore also depends on the legality masks, and the truncation bootstrap uses the
post-action ones (finding H4).

An agent acts without a learner: evaluation restores one from a checkpoint with :meth:`Agent.load`,
with no optimizer built (:mod:`esper.shell.agent.trainer` trains it).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from esper.core.masks import within_param_cap
from esper.core.normalize import normalize, running_stats
from esper.core.observation import obs_dim
from esper.core.spec import ActionSpec, Op
from esper.shell.agent.config import PPOConfig
from esper.shell.agent.policy import FactoredRecurrentActorCritic
from esper.shell.env.vecenv import StepInput


def policy_input_dim(raw_obs_dim: int) -> int:
    return raw_obs_dim + len(Op)


def size_prior(
    size_bias: float, germination_cost: torch.Tensor | None, spec: ActionSpec
) -> torch.Tensor | None:
    """The blueprint head's starting logits for ``ppo.size_bias``: ``size_bias * ln(cost)``, the log of
    each blueprint's germination cost (parameters, at least 1) averaged over the slots, shifted so the
    largest is 0. None where ``size_bias`` is 0 (uniform)."""
    if size_bias <= 0:
        return None
    if germination_cost is None:
        raise ValueError("ppo.size_bias needs the env's germination_cost (VecEnv.germination_cost)")
    if germination_cost.shape != (spec.n_slots, spec.n_blueprints):
        shape = list(germination_cost.shape)
        raise ValueError(f"germination_cost must be [{spec.n_slots}, {spec.n_blueprints}], got {shape}")
    logits = size_bias * germination_cost.detach().float().cpu().clamp(min=1.0).log().mean(0)
    return logits - logits.max()


class Agent:
    """``policy`` and ``obs_stats`` (a running-statistics TensorDict of the raw observation), with the
    config values that shape what it sees: ``obs_clip``, and ``param_cap`` (0: none) checked against the
    env's ``germination_cost [S, n_blueprints]``."""

    def __init__(
        self,
        policy: FactoredRecurrentActorCritic,
        obs_stats: TensorDict,
        *,
        obs_clip: float,
        param_cap: float = 0.0,
        germination_cost: torch.Tensor | None = None,
    ) -> None:
        if param_cap > 0 and germination_cost is None:
            raise ValueError("ppo.param_cap needs the env's germination_cost (VecEnv.germination_cost)")
        self.policy, self.obs_stats, self.obs_clip = policy, obs_stats, obs_clip
        self.param_cap, self.germination_cost = param_cap, germination_cost
        self.device = next(policy.parameters()).device

    def legal(self, step: StepInput) -> TensorDict:
        """The env's legality, narrowed to what keeps the seeds within ``param_cap`` when set."""
        if self.param_cap <= 0:
            return step.legal
        cost = self.germination_cost.to(step.legal.device)
        return within_param_cap(step.legal, step.slots["seed_params"], cost, self.param_cap)

    def normalize(self, raw_obs: torch.Tensor) -> torch.Tensor:
        """Raw observations normalized with the current (frozen) statistics."""
        return normalize(self.obs_stats, raw_obs, clip=self.obs_clip)

    def policy_input(self, step: StepInput, legal: TensorDict | None = None) -> torch.Tensor:
        """``[E, obs + n_ops]``: what the policy reads (the module docstring)."""
        legal = self.legal(step) if legal is None else legal
        return torch.cat([self.normalize(step.raw_obs), legal["op"].float()], dim=-1)

    def load(self, trainer_state: dict) -> Agent:
        """Restore the policy's weights and the observation statistics from a checkpoint's ``trainer``
        entry (:meth:`esper.shell.agent.trainer.PPOTrainer.state_dict`); returns self."""
        self.policy.load_state_dict(trainer_state["policy"])
        self.obs_stats = TensorDict(trainer_state["obs_stats"], batch_size=[]).to(self.device)
        return self


def build_agent(
    ppo: PPOConfig, spec: ActionSpec, *, device: torch.device | str,
    germination_cost: torch.Tensor | None = None, raw_obs_dim: int | None = None,
) -> Agent:  # fmt: skip
    """A fresh agent for an action space: the network initialized from the global torch generator (seed
    it first), empty observation statistics. ``germination_cost`` (the env's ``[S, n_blueprints]``) is
    needed with ``ppo.size_bias`` or ``ppo.param_cap``; ``raw_obs_dim`` is the env's observation length
    (``VecEnv.obs_dim``; None: the default layout's, without ``lifecycle.seed_grad_features``)."""
    raw_dim = obs_dim(spec.n_slots, spec.n_blueprints) if raw_obs_dim is None else raw_obs_dim
    policy = FactoredRecurrentActorCritic(
        policy_input_dim(raw_dim), spec, hidden=ppo.hidden, head_hidden=ppo.head_hidden,
        wait_bias=ppo.wait_bias,
        germinate_bias=ppo.germinate_bias,
        blend_bias=ppo.blend_bias,
        slot_bias=ppo.slot_bias,
        slot_order_bias=ppo.slot_order_bias,
        blueprint_prior=size_prior(ppo.size_bias, germination_cost, spec),
    ).to(device)  # fmt: skip
    return Agent(
        policy, running_stats((raw_dim,), device=torch.device(device)), obs_clip=ppo.obs_clip,
        param_cap=ppo.param_cap, germination_cost=germination_cost,
    )  # fmt: skip


__all__ = ["Agent", "build_agent", "policy_input_dim", "size_prior"]
