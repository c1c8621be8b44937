"""The learning controller: Tamiyo's network acting for every env at once.

What the policy sees is ``cat(normalize(raw_obs), op_legality)``: the observation normalized with the
trainer's statistics, frozen during the rollout, plus one bit per op saying whether it is legal now
for this controller (with ``ppo.param_cap``, after the cap's narrowing: :meth:`PPOController.legal`).
That input is what is stored as ``observation`` (finding S2), so the PPO update re-scores exactly the
inputs the actions were sampled from; the value therefore also depends on the legality masks, and the
truncation bootstrap uses the post-action ones (finding H4).
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from tensordict import TensorDict

from esper.core.masks import within_param_cap
from esper.core.observation import obs_dim
from esper.core.spec import ActionSpec, Op
from esper.shell.agent.policy import FactoredRecurrentActorCritic
from esper.shell.agent.trainer import PPOConfig, PPOTrainer
from esper.shell.env.rollout import StepInput
from esper.shell.env.vecenv import derive_seed
from esper.shell.runtime.distributed import SINGLE, Dist


def policy_input_dim(raw_obs_dim: int) -> int:
    return raw_obs_dim + len(Op)


def build_learner(
    ppo: PPOConfig, spec: ActionSpec, *, device: torch.device | str, seed: int, compile: bool = False,
    dist: Dist = SINGLE, germination_cost: torch.Tensor | None = None,
) -> tuple[FactoredRecurrentActorCritic, PPOTrainer]:
    """Tamiyo's network for an action space and its PPO trainer (statistics, optimizer), freshly
    initialized from ``seed``'s generators; load a checkpoint's ``trainer`` entry to restore one.
    ``germination_cost`` (the env's ``[S, n_blueprints]``) is needed with ``ppo.size_bias``."""
    raw_dim = obs_dim(spec.n_slots, spec.n_blueprints)
    policy = FactoredRecurrentActorCritic(
        policy_input_dim(raw_dim), spec, hidden=ppo.hidden, head_hidden=ppo.head_hidden,
        wait_bias=ppo.wait_bias,
        germinate_bias=ppo.germinate_bias,
        blend_bias=ppo.blend_bias,
        slot_bias=ppo.slot_bias,
        slot_order_bias=ppo.slot_order_bias,
        blueprint_prior=size_prior(ppo.size_bias, germination_cost, spec),
    ).to(device)  # fmt: skip
    trainer = PPOTrainer(
        policy, ppo, raw_obs_dim=raw_dim, compile=compile, generator=torch.Generator().manual_seed(seed + 1),
        dist=dist,
    )
    return policy, trainer


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


class PPOController:

    def __init__(
        self,
        policy: FactoredRecurrentActorCritic,
        trainer: PPOTrainer,
        *,
        generator: torch.Generator | None = None,
        deterministic: bool | Collection[str] = False,
        learns: bool = True,
        per_env: bool = False,
        germination_cost: torch.Tensor | None = None,
    ) -> None:
        #: False for a frozen controller under evaluation: the runner then keeps no rollout.
        self.learns = learns
        self.policy, self.trainer = policy, trainer
        self.generator, self.deterministic = generator, deterministic
        #: Sample each env's actions from its own generator, seeded by :meth:`seed_envs` from the env's
        #: host seed (a function of the run seed, the episode and the GLOBAL env index): an env's
        #: episode is then the same whichever process runs it and whichever envs share its batch.
        self.per_env = per_env
        self.env_generators: list[torch.Generator] = []
        self.device = next(policy.parameters()).device
        self.state = policy.initial_state(1, self.device)
        #: ``ppo.param_cap`` (0: none) and the env's ``germination_cost [S, n]`` it is checked with.
        self.param_cap = trainer.cfg.param_cap
        if self.param_cap > 0 and germination_cost is None:
            raise ValueError("ppo.param_cap needs the env's germination_cost (VecEnv.germination_cost)")
        self.germination_cost = germination_cost

    def legal(self, step: StepInput) -> TensorDict:
        """The env's legality, narrowed to what keeps the seeds within ``ppo.param_cap`` when set."""
        if self.param_cap <= 0:
            return step.legal
        cost = self.germination_cost.to(step.legal.device)
        return within_param_cap(step.legal, step.slots["seed_params"], cost, self.param_cap)

    def begin(self, n_envs: int) -> None:
        self.state = self.policy.initial_state(n_envs, self.device)

    def seed_envs(self, host_seeds: list[int]) -> None:
        """Called by the runner after each reset: one action generator per env (with ``per_env``)."""
        if self.per_env:
            self.env_generators = [
                torch.Generator(device=self.device).manual_seed(derive_seed("act", s)) for s in host_seeds
            ]

    def policy_input(self, step: StepInput, legal: TensorDict | None = None) -> torch.Tensor:
        legal = self.legal(step) if legal is None else legal
        return torch.cat([self.trainer.normalize_obs(step.raw_obs), legal["op"].float()], dim=-1)

    def act(self, step: StepInput) -> TensorDict:
        legal = self.legal(step)
        x = self.policy_input(step, legal)
        h, c = self.state
        out, self.state = self.policy.act(
            x, self.state, legal, generator=self.env_generators if self.per_env else self.generator,
            deterministic=self.deterministic,
        )
        out["observation"] = x
        out["raw_observation"] = step.raw_obs
        out["recurrent_state"] = TensorDict({"h": h[0], "c": c[0]}, batch_size=x.shape[:1])
        return out

    def bootstrap(self, step: StepInput) -> torch.Tensor:
        return self.policy.bootstrap_value(self.policy_input(step), self.state)


__all__ = ["PPOController", "build_learner", "policy_input_dim"]
