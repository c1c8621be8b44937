"""The learning controller: an :class:`~esper.shell.agent.agent.Agent` acting for every env at once.

It samples each head under its legality mask (or takes its most likely choice, ``deterministic``), keeps
the recurrent state across the episode's steps, and for a learner returns everything the PPO update
needs: the input the policy saw (``observation``, finding S2), the raw observation (for the
normalizer), and the pre-step recurrent state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection

import torch
from tensordict import TensorDict

from esper.core.masks import slot_mask
from esper.core.spec import Op
from esper.shell.agent.agent import Agent
from esper.shell.common.seeding import derive_seed
from esper.shell.env.step import StepInput


class PPOController:
    def __init__(
        self,
        agent: Agent,
        *,
        generator: torch.Generator | None = None,
        deterministic: bool | Collection[str] = False,
        learns: bool = True,
        per_env: bool = False,
        fossilize_when_legal: bool = False,
    ) -> None:
        #: False for a frozen controller under evaluation: the runner then keeps no rollout.
        self.learns = learns
        #: A diagnostic readout (evaluation only): wherever FOSSILIZE is legal, fossilize
        #: (:func:`fossilize_where_legal`) whatever the policy chose.
        if fossilize_when_legal and learns:
            raise ValueError("fossilize_when_legal overrides the policy's actions: evaluation only")
        self.fossilize_when_legal = fossilize_when_legal
        self.agent, self.policy = agent, agent.policy
        self.generator, self.deterministic = generator, deterministic
        #: Sample each env's actions from its own generator, seeded by :meth:`seed_envs` from the env's
        #: host seed (a function of the run seed, the episode and the GLOBAL env index): an env's
        #: episode is then the same whichever process runs it and whichever envs share its batch.
        self.per_env = per_env
        self.env_generators: list[torch.Generator] = []
        self.device = agent.device
        self.state = self.policy.initial_state(1, self.device)

    def begin(self, n_envs: int) -> None:
        self.state = self.policy.initial_state(n_envs, self.device)

    def seed_envs(self, host_seeds: list[int]) -> None:
        """Called by the runner after each reset: one action generator per env (with ``per_env``). Envs
        that share a host (``ppo.host_group``) must not share their actions too, or a group's episodes
        would be one episode run G times and its group baseline would cancel every advantage: the k-th
        env of a host seed (k >= 1, in env order) draws from its own stream. The first keeps the stream
        of before, so a run without groups samples what it always did."""
        if self.per_env:
            seen: Counter = Counter()
            seeds = []
            for s in host_seeds:
                seeds.append(derive_seed("act", s) if not seen[s] else derive_seed("act", s, seen[s]))
                seen[s] += 1
            self.env_generators = [torch.Generator(device=self.device).manual_seed(x) for x in seeds]

    def act(self, step: StepInput) -> TensorDict:
        legal = self.agent.legal(step)
        x = self.agent.policy_input(step, legal)
        h, c = self.state
        out, self.state = self.policy.act(
            x,
            self.state,
            legal,
            generator=self.env_generators if self.per_env else self.generator,
            deterministic=self.deterministic,
        )
        if self.fossilize_when_legal:
            out = fossilize_where_legal(out, legal)
        out["observation"] = x
        out["raw_observation"] = step.raw_obs
        out["recurrent_state"] = TensorDict({"h": h[0], "c": c[0]}, batch_size=x.shape[:1])
        return out

    def explain(self) -> None:
        return None

    def bootstrap(self, step: StepInput) -> torch.Tensor:
        return self.policy.bootstrap_value(self.agent.policy_input(step), self.state)


def fossilize_where_legal(out: TensorDict, legal: TensorDict) -> TensorDict:
    """``out``'s actions, except that every env where FOSSILIZE is legal fossilizes its first slot
    where it is legal (the later heads are not relevant to FOSSILIZE). The log-probabilities are left
    as the policy's: nothing learns from these steps."""
    can = legal["op"][:, Op.FOSSILIZE]
    fossilize = torch.full_like(out["op", "action"], int(Op.FOSSILIZE))
    first = slot_mask(legal, fossilize).to(torch.int8).argmax(-1).to(out["slot", "action"].dtype)
    out["op", "action"] = torch.where(can, fossilize, out["op", "action"])
    out["slot", "action"] = torch.where(can, first, out["slot", "action"])
    return out


__all__ = ["PPOController", "fossilize_where_legal"]
