"""The episode runner with the learning controller, on tiny real episodes (digits, 2 envs, 3 epochs):
the truncation bootstrap (H4), the stored observations (S2), the one gamma (C1, shell side) and the
governor's rollback penalty reaching the learner (C7)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import esper.shell.agent.trainer as trainer_mod
import esper.shell.env.vecenv as vecenv_mod
from esper.core.lifecycle import LifecycleConfig
from esper.core.masks import legal_masks
from esper.core.normalize import running_stats, update_running_stats
from esper.core.observation import obs_dim, observe
from esper.core.spec import Op, Stage
from esper.shell.agent.agent import Agent, policy_input_dim
from esper.shell.agent.config import PPOConfig
from esper.shell.agent.controller import PPOController
from esper.shell.agent.policy import FactoredRecurrentActorCritic
from esper.shell.agent.trainer import PPOTrainer
from esper.shell.common.fields import fields_flat, with_overrides
from esper.shell.config.presets import RunConfig
from esper.shell.env.config import EnvConfig
from esper.shell.env.governor import GovernorConfig
from esper.shell.env.rollout import EpisodeRunner
from esper.shell.env.step import StepInput
from esper.shell.env.vecenv import VecEnv

T = 3
ENV = EnvConfig(
    task="digits", n_envs=2, image_size=8, channels=(4, 8, 8), batch_size=32, train_batches=1, val_batches=1
)
PPO = PPOConfig(hidden=16, head_hidden=16, n_epochs=1, n_minibatches=1, target_kl=None)


def _build(lifecycle: LifecycleConfig | None = None, governor: GovernorConfig | None = None, seed: int = 0):
    lifecycle = lifecycle or LifecycleConfig(max_epochs=T)
    env = VecEnv(ENV, lifecycle, governor or GovernorConfig(), seed=seed)
    raw = obs_dim(env.spec.n_slots, env.spec.n_blueprints)
    torch.manual_seed(seed)
    policy = FactoredRecurrentActorCritic(
        policy_input_dim(raw), env.spec, hidden=PPO.hidden, head_hidden=PPO.head_hidden
    )
    agent = Agent(policy, running_stats((raw,)), obs_clip=PPO.obs_clip)
    trainer = PPOTrainer(agent, PPO, generator=torch.Generator().manual_seed(seed))
    # non-trivial statistics, so "normalized" and "raw" observations differ
    g = torch.Generator().manual_seed(seed + 1)
    agent.obs_stats = update_running_stats(agent.obs_stats, torch.randn(64, raw, generator=g) * 3.0 + 2.0)
    ctl = PPOController(agent, generator=torch.Generator().manual_seed(seed))
    return env, policy, trainer, ctl


def _runner(env: VecEnv, ctl, gamma: float = PPO.gamma) -> EpisodeRunner:
    env.gamma = gamma  # the discount of the env's reward (PBRS): the learner's
    return EpisodeRunner(env, ctl)


class _Forced:
    """The PPO controller with some actions overridden after sampling; records what it was given."""

    learns = True

    def __init__(self, inner: PPOController, force) -> None:
        self.inner, self.force = inner, force
        self.inputs: list[StepInput] = []
        self.boot: StepInput | None = None

    def begin(self, n_envs: int) -> None:
        self.inner.begin(n_envs)
        self.t = 0

    def seed_envs(self, host_seeds: list[int]) -> None:
        self.inner.seed_envs(host_seeds)

    def explain(self) -> None:
        return None

    def act(self, step: StepInput) -> TensorDict:
        out = self.inner.act(step)
        self.inputs.append(step)
        for head, value in self.force(self.t, step.raw_obs.shape[0]).items():
            out[head, "action"] = value
        self.t += 1
        return out

    def bootstrap(self, step: StepInput) -> torch.Tensor:
        self.boot = step
        return self.inner.bootstrap(step)


def _full(n: int, value: int) -> torch.Tensor:
    return torch.full((n,), int(value), dtype=torch.int64)


# ------------------------------------------------------------------------------------------------ H4
def test_H4_truncation_bootstrap_uses_post_action_obs_masks_and_state():
    """WAIT, WAIT, then GERMINATE slot 0 with ``max_seeds = 1``: the last action makes GERMINATE
    illegal and PRUNE legal, so pre- and post-action masks differ in every env. The stored
    ``("next", "state_value")`` of the last step must be V(post-step observation, post-action masks,
    post-step recurrent state), recomputed here from the core functions."""
    lc = LifecycleConfig(max_epochs=T, max_seeds=1, min_prune_age=0)
    env, policy, trainer, ctl = _build(lc)

    def force(t: int, E: int) -> dict:
        if t < T - 1:
            return {"op": _full(E, Op.WAIT)}
        return {"op": _full(E, Op.GERMINATE), "slot": _full(E, 0), "blueprint": _full(E, 1)}

    forced = _Forced(ctl, force)
    td = _runner(env, forced).run(0).rollout
    post = env.slots  # the slot state after the last lifecycle step
    assert (td["op", "action"][:, -1] == int(Op.GERMINATE)).all()
    assert (post["stage"][:, 0] == int(Stage.GERMINATED)).all()

    last = forced.inputs[-1]  # what the policy acted on at the last step (pre-action)
    raw_post = observe(
        last.signals, last.history, post, max_epochs=T, n_blueprints=env.spec.n_blueprints, lifecycle_cfg=lc
    )
    legal_post = legal_masks(post, env.spec, max_seeds=lc.max_seeds, min_prune_age=lc.min_prune_age)
    assert (legal_post["op"] != last.legal["op"]).any(-1).all(), "the test needs masks that changed"
    assert not legal_post["op"][:, Op.GERMINATE].any() and legal_post["op"][:, Op.PRUNE].all()

    norm = trainer.agent.normalize(raw_post)
    post_state = ctl.state  # the recurrent state after the last act
    expected = policy.bootstrap_value(torch.cat([norm, legal_post["op"].float()], -1), post_state)
    boot = td["next", "state_value"][:, -1]
    torch.testing.assert_close(boot, expected)

    # the old behaviours give other values, so this test tells them apart
    pre_state = (
        td["recurrent_state", "h"][:, -1].unsqueeze(0),
        td["recurrent_state", "c"][:, -1].unsqueeze(0),
    )
    wrong = {
        "pre-action masks": policy.bootstrap_value(
            torch.cat([norm, last.legal["op"].float()], -1), post_state
        ),
        "pre-action observation": policy.bootstrap_value(td["observation"][:, -1], post_state),
        "pre-step recurrent state": policy.bootstrap_value(
            torch.cat([norm, legal_post["op"].float()], -1), pre_state
        ),
    }
    for what, value in wrong.items():
        assert (value - boot).abs().min() > 1e-5, f"the bootstrap is indistinguishable from one with {what}"

    # what the bootstrap call was given: the post-step slots and their masks
    assert all(torch.equal(forced.boot.slots[k], post[k]) for k in post.keys())
    assert torch.equal(forced.boot.legal["op"], legal_post["op"])
    # every other step bootstraps from the next step's stored value
    torch.testing.assert_close(td["next", "state_value"][:, :-1], td["state_value"][:, 1:])
    assert td["next", "truncated"][:, -1].all() and not td["next", "terminated"].any()


@pytest.mark.parametrize("terminal", [False, True])
def test_the_time_limit_truncates_or_ends_the_task(terminal):
    """By default the last step is truncated (GAE bootstraps from the stored post-action value, H4);
    with ``terminal_at_limit`` it is terminal: the final host is what the task delivers, so the last
    step's advantage is its reward minus V and the post-action value, still stored, is not used.
    Bootstrapping where the task ends credits an episode with a future it never has: the critic's
    guess of further gains, which is largest for the hosts left furthest from finished."""
    lc = LifecycleConfig(max_epochs=T, terminal_at_limit=terminal)
    env, _, trainer, ctl = _build(lc)
    td = _runner(env, ctl).run(0).rollout
    nxt = td["next"]
    assert nxt["done"][:, -1].all() and not nxt["done"][:, :-1].any()
    assert torch.equal(nxt["terminated"][:, -1], torch.full((2,), terminal))
    assert torch.equal(nxt["truncated"][:, -1], torch.full((2,), not terminal))
    assert not (nxt["terminated"] | nxt["truncated"])[:, :-1].any()
    # make the stored bootstrap matter, then read the last step's advantage off the trainer's GAE
    nxt["state_value"][:, -1] = 50.0
    td["next", "reward"] = nxt["raw_reward"]
    trainer.gae_fn(td)
    reward, value = td["next", "reward"][:, -1], td["state_value"][:, -1]
    expected = reward - value + (0.0 if terminal else PPO.gamma * 50.0)
    torch.testing.assert_close(td["advantage"][:, -1].reshape(-1), expected.reshape(-1))


# ------------------------------------------------------------------------------------------------ S2
def test_S2_stored_observation_is_exactly_the_normalized_policy_input(monkeypatch):
    env, policy, trainer, ctl = _build()
    seen: list[torch.Tensor] = []
    real_act = policy.act

    def spy(obs, state, legal, **kwargs):
        seen.append(obs.clone())
        return real_act(obs, state, legal, **kwargs)

    monkeypatch.setattr(policy, "act", spy)
    td = _runner(env, ctl).run(0).rollout
    assert len(seen) == T
    assert torch.equal(td["observation"], torch.stack(seen, 1)), "stored != what the policy saw"

    raw = td["raw_observation"]
    n_raw = raw.shape[-1]
    torch.testing.assert_close(td["observation"][..., :n_raw], trainer.agent.normalize(raw), rtol=0, atol=0)
    assert not torch.allclose(td["observation"][..., :n_raw], raw), "normalized, not raw"
    assert torch.equal(td["observation"][..., n_raw:], td["op", "action_mask"].float())

    # the update changes the statistics but never the stored observations
    stored = td["observation"].clone()
    count = float(trainer.agent.obs_stats["count"])
    trainer.update(td)
    assert float(trainer.agent.obs_stats["count"]) > count
    assert torch.equal(td["observation"], stored)


# ------------------------------------------------------------------------------------------------ C1
def test_C1_one_gamma_for_pbrs_and_ppo_through_the_run(monkeypatch, tmp_path):
    """There is exactly one gamma in the whole config (``ppo.gamma``); a run with ``ppo.gamma = 0.7``
    gives 0.7 to the core reward (PBRS) at every step and to GAE."""
    from esper.shell.runtime.training import TrainingRun

    gammas = [name for name, _, _ in fields_flat(RunConfig) if "gamma" in name.lower()]
    assert gammas == ["ppo.gamma"]
    with pytest.raises(ValueError, match="reward.gamma"):
        with_overrides(RunConfig(), {"reward.gamma": "0.9"})

    reward_gammas: list[float] = []
    gae_gammas: list[float] = []
    real_reward, real_gae = vecenv_mod.compute_reward, trainer_mod.gae

    def reward_spy(*args, gamma, **kwargs):
        reward_gammas.append(gamma)
        return real_reward(*args, gamma=gamma, **kwargs)

    def gae_spy(td, *, gamma, **kwargs):
        gae_gammas.append(gamma)
        return real_gae(td, gamma=gamma, **kwargs)

    monkeypatch.setattr(vecenv_mod, "compute_reward", reward_spy)
    monkeypatch.setattr(trainer_mod, "gae", gae_spy)
    cfg = RunConfig(
        updates=1, report=False, progress=False, checkpoint_every=1, eval_episodes=0, run_dir=str(tmp_path),
        env=ENV,
        lifecycle=LifecycleConfig(max_epochs=T), ppo=PPOConfig(gamma=0.7, hidden=16, head_hidden=16,
                                                               n_epochs=1, n_minibatches=1),
    )  # fmt: skip
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    assert TrainingRun(cfg, run_dir).train() == 0
    assert reward_gammas == [0.7] * T
    assert gae_gammas == [0.7]


# ------------------------------------------------------------------------------------------------ C7
def test_C7_rollback_penalty_reaches_the_learner(monkeypatch):
    """Env 1 panics at epoch 1 (charged to that step), env 0 at epoch 3 (charged to the transition
    that led into it). The penalty is in the stored ``("next", "raw_reward")``, both envs keep all
    their transitions, and the reward the PPO update uses carries it."""
    penalty = 7.5
    env, _, trainer, ctl = _build(governor=GovernorConfig(penalty=penalty))
    real_check = env.governor.check
    panics = {(1, 1), (0, 3)}  # (env, epoch)
    monkeypatch.setattr(
        env.governor,
        "check",
        lambda i, loss: "nonfinite" if (i, env.epoch) in panics else real_check(i, loss),
    )
    totals: list[torch.Tensor] = []
    real_reward = vecenv_mod.compute_reward

    def reward_spy(*args, **kwargs):
        out = real_reward(*args, **kwargs)
        totals.append(out["step_total"].clone())
        return out

    monkeypatch.setattr(vecenv_mod, "compute_reward", reward_spy)
    result = _runner(env, ctl).run(0)
    panicked = [(g["epoch"], g["env"], g["reason"]) for g in result.governor]
    assert panicked == [(1, 1, "nonfinite"), (3, 0, "nonfinite")]
    assert [env.governor.n_rollbacks(i) for i in range(2)] == [1, 1]

    td = result.rollout
    assert td.batch_size == torch.Size([2, T]), "the rolled-back envs' transitions are kept"
    expected = torch.stack(totals, 1)
    expected[1, 0] -= penalty  # panic on the first epoch: this step
    expected[0, 1] -= penalty  # panic at epoch 3: the transition of epoch 2 led into it
    torch.testing.assert_close(td["next", "raw_reward"], expected)
    for i in range(2):
        assert result.episodes[i]["return"] == pytest.approx(float(expected[i].sum()), abs=1e-5)

    prepared = trainer.prepare(td)
    reward = prepared["next", "reward"]
    assert torch.equal(torch.sign(reward), torch.sign(td["next", "raw_reward"]))
    assert reward[0, 1] == reward[0].min() and reward[1, 0] == reward[1].min() and reward[0, 1] < 0


def test_envs_that_share_a_host_do_not_share_their_actions():
    """``ppo.host_group``: the envs of a group share the host, never the action draws. If they did (the
    per-env generators were seeded from the host seed alone) a group's episodes would be one episode run
    twice, and the group baseline would cancel every advantage. A run without groups keeps its draws."""
    torch.manual_seed(0)
    trainer = _build()[2]
    per_env = PPOController(trainer.agent, per_env=True)
    per_env.seed_envs([5, 5, 9])
    draws = [torch.rand(4, generator=g) for g in per_env.env_generators]
    assert not torch.equal(draws[0], draws[1])
    alone = PPOController(trainer.agent, per_env=True)
    alone.seed_envs([5, 9])
    # the first env of a host keeps its stream
    assert torch.equal(torch.rand(4, generator=alone.env_generators[0]), draws[0])
    assert torch.equal(torch.rand(4, generator=alone.env_generators[1]), draws[2])
    # one episode of a pair that shares its host: the same first measurement, and a learner that samples
    # per env tells the two apart (a uniform policy over the legal ops: they part within a few steps)
    grouped = VecEnv(ENV, LifecycleConfig(max_epochs=6), GovernorConfig(), seed=0, host_group=2)
    ctl = PPOController(trainer.agent, per_env=True)
    rollout = EpisodeRunner(grouped, ctl).run(0).rollout
    assert grouped.host_seeds[0] == grouped.host_seeds[1]
    ops = rollout["op", "action"]
    assert not torch.equal(ops[0], ops[1])
