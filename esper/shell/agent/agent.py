"""The agent: Tamiyo's network plus the observation statistics it reads its input with.

What the flat policy (``ppo.policy flat``) sees is ``cat(normalize(raw_obs), op_legality)``: the raw
observation normalized with the agent's statistics (frozen during a rollout; the trainer updates them
before each PPO update, finding C5), plus one bit per op saying whether it is legal now for this agent
(with ``ppo.param_cap``, after the cap's narrowing, :meth:`Agent.legal`). The host-agnostic policy
(``ppo.policy set``, :mod:`esper.shell.agent.setpolicy`) sees a TensorDict whose shapes follow the host
(:meth:`Agent.policy_input`): the observation's global part normalized with its own statistics and the
op bits; each slot's features without the blueprint one-hot, normalized with statistics pooled over
the enabled slots of every env and step (one set of statistics whatever the number of slots), beside
the slot's position, width and held blueprint's descriptor from the host's layout
(:mod:`esper.shell.host.descriptors`, carried by the step); and every blueprint's descriptor. Either
input is what a learning controller stores as ``observation`` (finding S2), so the PPO update re-scores
exactly the inputs the actions were sampled from; the value therefore also depends on the legality
masks, and the truncation bootstrap uses the post-action ones (finding H4).

The agent owns the normalization: :meth:`Agent.update_statistics` takes in a rollout's raw observations
(the flat policy's statistics are one running-statistics TensorDict of the whole vector, as checkpoints
have always held it; the set policy's hold ``global`` and ``slot`` entries).

An agent acts without a learner: evaluation restores one from a checkpoint with :meth:`Agent.load`,
with no optimizer built (:mod:`esper.shell.agent.trainer` trains it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDict, TensorDictBase

from esper.core.masks import fixed_blend, within_param_cap
from esper.core.normalize import normalize, running_stats
from esper.core.observation import global_dim, obs_dim, slot_state_names, split_observation
from esper.core.spec import ActionSpec, Op
from esper.shell.agent.config import PPOConfig, param_cap_on
from esper.shell.agent.policy import FactoredRecurrentActorCritic
from esper.shell.agent.setpolicy import SetRecurrentActorCritic
from esper.shell.env.step import StepInput
from esper.shell.host.descriptors import SLOT_FEATURES, descriptor_dim

Policy = FactoredRecurrentActorCritic | SetRecurrentActorCritic
#: ``update(stats, x, valid)``: running statistics after the batch ``x [*L, *shape]`` (``valid [*L]``
#: bool or None), e.g. :func:`esper.shell.agent.collective.update_stats` over every process.
UpdateStats = Callable[[TensorDict, torch.Tensor, torch.Tensor | None], TensorDict]


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
    """``policy`` and ``obs_stats`` (running statistics of the raw observation: one TensorDict for the flat
    policy, ``global`` and ``slot`` entries for the set policy), with the config values that shape what it
    sees: ``obs_clip``, and ``param_cap`` (0: none; or ``param_cap_share`` of what ``grow_all`` adds to
    each step's host, :func:`~esper.shell.agent.config.param_cap_on`) checked against each step's host's
    germination cost (``StepInput.host``; else ``germination_cost [S, n_blueprints]``, the env's the agent
    was built for)."""

    def __init__(
        self,
        policy: Policy,
        obs_stats: TensorDict,
        *,
        obs_clip: float,
        param_cap: float = 0.0,
        param_cap_share: float = 0.0,
        germination_cost: torch.Tensor | None = None,
        fixed_blend: bool = False,
    ) -> None:
        self.policy, self.obs_stats, self.obs_clip = policy, obs_stats, obs_clip
        #: ``ppo.fixed_blend``: the blend heads offer only the fixed schedules' blend.
        self.fixed_blend = fixed_blend
        self.param_cap, self.param_cap_share = param_cap, param_cap_share
        self.germination_cost = germination_cost
        self.device = next(policy.parameters()).device
        #: The input is a TensorDict whose shapes follow the host (``ppo.policy set``).
        self.is_set = isinstance(policy, SetRecurrentActorCritic)
        if param_cap > 0 and germination_cost is None and not self.is_set:
            raise ValueError("ppo.param_cap needs the env's germination_cost (VecEnv.germination_cost)")

    def legal(self, step: StepInput) -> TensorDict:
        """The env's legality, narrowed to what keeps the seeds within the cap when one is set, and to the
        fixed schedules' blend with ``ppo.fixed_blend``."""
        legal = self._capped(step)
        return fixed_blend(legal) if self.fixed_blend else legal

    def _capped(self, step: StepInput) -> TensorDict:
        budget = step.host.budget_params if step.host is not None else 0.0
        if self.param_cap <= 0 and self.param_cap_share <= 0 and budget <= 0:
            return step.legal
        cost = step.host.germination_cost if step.host is not None else self.germination_cost
        if cost is None:
            raise ValueError("ppo.param_cap needs the host's germination cost (StepInput.host)")
        grow_all = step.host.grow_all_params if step.host is not None else 0.0
        # the episode's budget where the controller reads one (env.budget_shares), else the config's cap
        cap = budget if budget > 0 else param_cap_on(self.param_cap, self.param_cap_share, grow_all)
        gate = step.host.gate_cost if step.host is not None else None  # None: the gate always counted
        gate = None if gate is None else gate.to(step.legal.device)
        return within_param_cap(step.legal, step.slots["seed_params"], cost.to(step.legal.device), cap, gate)

    def normalize(self, raw_obs: torch.Tensor) -> torch.Tensor:
        """Raw observations normalized with the current (frozen) statistics (the flat policy's input)."""
        return normalize(self.obs_stats, raw_obs, clip=self.obs_clip)

    def policy_input(self, step: StepInput, legal: TensorDict | None = None) -> torch.Tensor | TensorDict:
        """What the policy reads (the module docstring): ``[E, obs + n_ops]`` for the flat policy, a
        TensorDict ``[E]`` for the set policy."""
        legal = self.legal(step) if legal is None else legal
        ops = legal["op"].float()
        if not self.is_set:
            return torch.cat([self.normalize(step.raw_obs), ops], dim=-1)
        host = step.host
        if host is None:
            raise ValueError("the set policy reads the host's layout: the step has none (StepInput.host)")
        raw = step.raw_obs
        glob, state, held = split_observation(raw, host.n_slots, host.n_blueprints)
        E, S = raw.shape[0], host.n_slots
        clip = self.obs_clip
        descriptors = host.descriptors.to(raw.device)
        slots = torch.cat(
            [
                normalize(self.obs_stats["slot"], state, clip=clip),
                host.slot_features.to(raw.device).expand(E, S, len(SLOT_FEATURES)),
                torch.einsum("esb,sbd->esd", held.float(), descriptors),  # the held blueprint's (0: none)
            ],
            dim=-1,
        )
        return TensorDict(
            {
                "globals": torch.cat([normalize(self.obs_stats["global"], glob, clip=clip), ops], dim=-1),
                "slots": slots,
                "enabled": state[..., 0] > 0.5,  # the raw ``enabled`` column
                "blueprints": descriptors.expand(E, *descriptors.shape),
                "log_cost": host.log_cost.to(raw.device).expand(E, *host.log_cost.shape),
            },
            batch_size=[E],
        )

    def update_statistics(self, batch: TensorDictBase, update: UpdateStats) -> None:
        """Take in a rollout's ``raw_observation`` (``[E, T, obs]``) with ``update``: the whole vector
        (flat), or the global part and every enabled slot's features pooled over slots (set; the host's
        shape is read from the stored input)."""
        raw = batch["raw_observation"]
        if not self.is_set:
            self.obs_stats = update(self.obs_stats, raw, None)
            return
        S, B = batch["observation", "log_cost"].shape[-2:]
        glob, state, _ = split_observation(raw, S, B)
        self.obs_stats = TensorDict(
            {
                "global": update(self.obs_stats["global"], glob, None),
                "slot": update(self.obs_stats["slot"], state, state[..., 0] > 0.5),
            },
            batch_size=[],
        )

    def state_dict(self) -> dict:
        """What a controller needs to act: the policy's weights and the observation statistics (a
        checkpoint's ``agent`` entry; the ``learner`` entry is
        :meth:`esper.shell.agent.trainer.PPOTrainer.state_dict`)."""
        return {"policy": self.policy.state_dict(), "obs_stats": self.obs_stats.to_dict()}

    def load(self, state: dict) -> Agent:
        """Restore the policy's weights and the observation statistics from a checkpoint's ``agent``
        entry (:meth:`state_dict`); returns self."""
        self.policy.load_state_dict(state["policy"])
        self.obs_stats = load_stats(state["obs_stats"], self.obs_stats, self.device)
        return self


def load_error_line(e: BaseException) -> str:
    """One line of why :meth:`Agent.load` failed: the line that names a mismatched, missing or unexpected
    weight where there is one (torch's message spans many), else the message's first line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
    named = [line for line in lines if line.startswith(("size mismatch", "Missing", "Unexpected"))]
    return (named or lines)[0]


def load_stats(saved: dict, current: TensorDict, device: torch.device) -> TensorDict:
    """Saved observation statistics, checked against the layout of ``current`` (a flat policy's are one
    set, a set policy's ``global`` and ``slot``): a one-line ValueError where they differ."""
    stats = TensorDict(saved, batch_size=[]).to(device)
    mine = sorted((str(k), tuple(v.shape)) for k, v in current.items(True, True))
    theirs = sorted((str(k), tuple(v.shape)) for k, v in stats.items(True, True))
    if mine != theirs:
        raise ValueError(
            f"the checkpoint's observation statistics {theirs} do not fit this policy's {mine} (another "
            "ppo.policy, or another observation layout)"
        )
    return stats


def set_stats(
    *, seed_grads: bool = False, grad_gain: bool = False, device: torch.device | str | None = None
) -> TensorDict:
    """Empty statistics of the set policy: the observation's global part, and one slot's features (with
    the optional ones :func:`~esper.core.observation.layout_options` names)."""
    n_slot = len(slot_state_names(seed_grads=seed_grads, grad_gain=grad_gain))
    return TensorDict(
        {
            "global": running_stats((global_dim(),), device=device),
            "slot": running_stats((n_slot,), device=device),
        },
        batch_size=[],
    )


def build_agent(
    ppo: PPOConfig, spec: ActionSpec, *, device: torch.device | str,
    germination_cost: torch.Tensor | None = None, raw_obs_dim: int | None = None, budget_input: bool = False,
) -> Agent:  # fmt: skip
    """A fresh agent for an action space: the network (``ppo.policy``) initialized from the global torch
    generator (seed it first), empty observation statistics. ``germination_cost`` (the env's ``[S,
    n_blueprints]``) is needed with ``ppo.size_bias`` or ``ppo.param_cap`` for the flat policy; the set
    policy reads each step's host instead. ``raw_obs_dim`` is the env's observation length
    (``VecEnv.obs_dim``; None: the default layout's, without the optional features). ``budget_input``: the
    env's episodes carry a budget the set policy reads (``env.budget_shares``: one more descriptor
    feature, :data:`~esper.shell.host.descriptors.BUDGET_FEATURES`); refused for the flat policy."""
    if budget_input and ppo.policy != "set":
        raise ValueError("env.budget_shares: only the set policy reads a budget (ppo.policy set)")
    raw_dim = obs_dim(spec.n_slots, spec.n_blueprints) if raw_obs_dim is None else raw_obs_dim
    biases = dict(wait_bias=ppo.wait_bias, germinate_bias=ppo.germinate_bias, blend_bias=ppo.blend_bias,
                  fossilize_bias=ppo.fossilize_bias, slot_order_bias=ppo.slot_order_bias)  # fmt: skip
    device = torch.device(device)
    if ppo.policy == "set":
        # the slot features' count says which optional features the layout holds
        _, state, _ = split_observation(torch.zeros(raw_dim), spec.n_slots, spec.n_blueprints)
        n_state = state.shape[-1]
        layout = next(
            {"seed_grads": a, "grad_gain": b} for a in (False, True) for b in (False, True)
            if len(slot_state_names(seed_grads=a, grad_gain=b)) == n_state
        )  # fmt: skip
        n_desc = descriptor_dim(budget_input)
        policy = SetRecurrentActorCritic(
            global_dim() + len(Op), n_state + len(SLOT_FEATURES) + n_desc,
            n_desc, hidden=ppo.hidden, head_hidden=ppo.head_hidden,
            size_bias=ppo.size_bias, **biases,
        ).to(device)  # fmt: skip
        stats = set_stats(**layout, device=device)
    else:
        policy = FactoredRecurrentActorCritic(
            policy_input_dim(raw_dim), spec, hidden=ppo.hidden, head_hidden=ppo.head_hidden,
            slot_bias=ppo.slot_bias, blueprint_prior=size_prior(ppo.size_bias, germination_cost, spec),
            **biases,
        ).to(device)  # fmt: skip
        stats = running_stats((raw_dim,), device=device)
    return Agent(
        policy,
        stats,
        obs_clip=ppo.obs_clip,
        param_cap=ppo.param_cap,
        param_cap_share=ppo.param_cap_share,
        germination_cost=germination_cost,
        fixed_blend=ppo.fixed_blend,
    )


__all__ = [
    "Agent", "Policy", "UpdateStats", "build_agent", "load_error_line", "load_stats", "policy_input_dim",
    "set_stats", "size_prior",
]  # fmt: skip
