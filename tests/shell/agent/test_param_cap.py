"""``ppo.param_cap``: the learned controller's hard parameter budget, end to end on the default task's
host. The cost table bounds what a germination adds; a capped controller never holds more seed
parameters than the cap, where the same controller uncapped does; the baselines stay uncapped."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from esper.core.lifecycle import LifecycleConfig
from esper.core.masks import action_masks, within_param_cap
from esper.core.normalize import running_stats
from esper.core.observation import obs_dim
from esper.core.spec import Op, Style
from esper.shell.agent.agent import Agent, policy_input_dim
from esper.shell.agent.config import PPOConfig
from esper.shell.agent.controller import PPOController
from esper.shell.agent.policy import FactoredRecurrentActorCritic
from esper.shell.env.config import EnvConfig
from esper.shell.env.governor import GovernorConfig
from esper.shell.env.rollout import EpisodeRunner
from esper.shell.env.vecenv import VecEnv
from esper.shell.host.hosts import CNN1dHost

ENV = EnvConfig(task="mnist1d", n_envs=2, batch_size=64, train_batches=1, val_batches=1)
LIFECYCLE = LifecycleConfig(max_epochs=5, auto_advance=True)
CAP = 300.0


def test_germination_cost_bounds_every_germination_and_is_met_with_a_gate():
    host = CNN1dHost()
    cost = host.germination_cost()
    assert cost.shape == (host.n_slots, len(host.blueprint_names))
    for s in range(host.n_slots):
        for b in range(len(host.blueprint_names)):
            for style in Style:
                n = sum(p.numel() for p in host.germinate(s, b, style))
                assert n <= cost[s, b], (s, b, style)
                assert (n == cost[s, b]) == (style == Style.GATED_GATE), (s, b, style)
                host.remove_seed(s)


class _Watch:
    """The controller, recording the seed parameters the env holds at every step."""

    def __init__(self, inner: PPOController) -> None:
        self.inner, self.learns, self.held = inner, False, []

    def begin(self, n_envs: int) -> None:
        self.inner.begin(n_envs)

    def seed_envs(self, host_seeds: list[int]) -> None:
        self.inner.seed_envs(host_seeds)

    def explain(self) -> None:
        return None

    def act(self, step):
        self.held.append(step.slots["seed_params"].sum(-1))
        return self.inner.act(step)

    def bootstrap(self, step):
        self.held.append(step.slots["seed_params"].sum(-1))
        return self.inner.bootstrap(step)


def _held(cap: float, share: float = 0.0) -> torch.Tensor:
    env = VecEnv(ENV, LIFECYCLE, GovernorConfig(), seed=3)
    ppo = PPOConfig(hidden=16, head_hidden=16, germinate_bias=6.0, param_cap=cap, param_cap_share=share)
    raw = obs_dim(env.spec.n_slots, env.spec.n_blueprints)
    torch.manual_seed(0)
    policy = FactoredRecurrentActorCritic(
        policy_input_dim(raw), env.spec, hidden=16, head_hidden=16, germinate_bias=6.0
    )
    agent = Agent(
        policy, running_stats((raw,)), obs_clip=ppo.obs_clip, param_cap=ppo.param_cap,
        param_cap_share=ppo.param_cap_share, germination_cost=env.germination_cost,
    )  # fmt: skip
    ctl = _Watch(PPOController(agent, generator=torch.Generator().manual_seed(1), learns=False))
    EpisodeRunner(env, ctl).run(0)
    return torch.stack(ctl.held)


def test_a_capped_controller_never_holds_more_than_the_cap():
    uncapped, capped = _held(0.0), _held(CAP)
    assert uncapped.max() > CAP  # the same policy and hosts overspend without the cap
    assert capped.max() <= CAP
    assert capped.max() > 0  # it still grows


def test_a_cap_stated_as_a_share_of_grow_all_is_that_many_parameters_on_the_host():
    """``ppo.param_cap_share``: 0.25 of the 1,200 parameters grow_all adds to the default's host is the
    cap of 300, step for step (the same draws, the same held parameters)."""
    one = VecEnv(dataclasses.replace(ENV, n_envs=1), LIFECYCLE, GovernorConfig(), seed=0)
    assert one.grow_all_params == 1200
    assert torch.equal(_held(0.0, share=CAP / 1200), _held(CAP))


def _share_capped(share: float) -> tuple[VecEnv, Agent]:
    """One env of the default task and a small untrained agent capped at ``share`` of ``grow_all``."""
    env = VecEnv(dataclasses.replace(ENV, n_envs=1), LIFECYCLE, GovernorConfig(), seed=0)
    raw = obs_dim(env.spec.n_slots, env.spec.n_blueprints)
    policy = FactoredRecurrentActorCritic(policy_input_dim(raw), env.spec, hidden=8, head_hidden=8)
    agent = Agent(policy, running_stats((raw,)), obs_clip=10.0, param_cap_share=share,
                  germination_cost=env.germination_cost)  # fmt: skip
    return env, agent


def test_a_share_cap_needs_the_step_s_host():
    env, agent = _share_capped(0.5)
    step = env.reset(0).obs
    assert agent.legal(step) is not step.legal  # the env's step holds its host's layout
    with pytest.raises(ValueError, match="param_cap_share needs the host's grow_all parameters"):
        agent.legal(dataclasses.replace(step, host=None))


def test_a_cap_is_given_one_way():
    with pytest.raises(ValueError, match="both set"):
        PPOConfig(param_cap=720.0, param_cap_share=0.6)


def test_a_cap_needs_the_cost_table():
    env_spec = VecEnv(dataclasses.replace(ENV, n_envs=1), LIFECYCLE, GovernorConfig(), seed=0).spec
    raw = obs_dim(env_spec.n_slots, env_spec.n_blueprints)
    policy = FactoredRecurrentActorCritic(policy_input_dim(raw), env_spec, hidden=8, head_hidden=8)
    with pytest.raises(ValueError, match="germination_cost"):
        Agent(policy, running_stats((raw,)), obs_clip=10.0, param_cap=CAP)


def test_issue89_a_whole_budget_lets_the_controller_grow_grow_all_without_gates():
    """Issue 89: the budget judge counts what a plan adds (``grow_all``: 1,200 seed parameters on the
    default host, gates not counted, as built), but the cap had charged every germination its gate
    whatever the style, so at a budget of the whole of ``grow_all`` (1,200) a third ``conv_heavy`` after
    two was out of the controller's reach (400 + 400 + 421 > 1,200). Now the cap charges the gate only
    where one is built: the third ``conv_heavy`` is legal, GATED_GATE on it is not."""
    env, agent = _share_capped(1.0)
    step = env.reset(0).obs
    heavy = env.blueprint_names.index("conv_heavy")
    bare = env.germination_cost[:, heavy] - step.host.gate_cost
    assert bare.sum() == env.grow_all_params == 1200
    step.slots["seed_params"] = torch.tensor([[bare[0].item(), bare[1].item(), 0.0]])
    legal = agent.legal(step)
    assert legal["blueprint_by_slot"][0, 2, heavy]
    assert not legal["gated_by_slot"][0, 2, heavy]
    germinate = torch.tensor([int(Op.GERMINATE)])
    used = action_masks(legal, germinate, torch.tensor([2]), torch.tensor([heavy]))
    assert not used["style"][0, int(Style.GATED_GATE)] and used["style"][0, int(Style.LINEAR_ADD)]
    # the old cap (the gate always charged) could not grow it
    old = within_param_cap(step.legal, step.slots["seed_params"], env.germination_cost, 1200.0)
    assert not old["blueprint_by_slot"][0, 2, heavy]


def test_a_fixed_blend_controller_germinates_only_with_the_fixed_schedules_blend():
    """``ppo.fixed_blend``: every germination the learned controller makes blends as the fixed plans do
    (an untrained, germination-eager policy, so it germinates in every slot)."""
    from esper.core.spec import DEFAULT_BLEND
    from esper.shell.agent.agent import build_agent

    env = VecEnv(ENV, LIFECYCLE, GovernorConfig(), seed=3)
    ppo = PPOConfig(hidden=16, head_hidden=16, germinate_bias=6.0, fixed_blend=True)
    torch.manual_seed(0)
    agent = build_agent(ppo, env.spec, device="cpu", germination_cost=env.germination_cost,
                        raw_obs_dim=env.obs_dim)  # fmt: skip
    assert agent.fixed_blend
    seen = []

    class _Record(_Watch):
        def act(self, step):
            out = self.inner.act(step)
            germ = out["op", "action"] == int(Op.GERMINATE)
            seen.extend(
                tuple(int(out[h, "action"][i]) for h in DEFAULT_BLEND) for i in germ.nonzero().flatten()
            )
            return out

    ctl = _Record(PPOController(agent, generator=torch.Generator().manual_seed(1), learns=False))
    EpisodeRunner(env, ctl).run(0)
    assert seen and set(seen) == {tuple(DEFAULT_BLEND.values())}
