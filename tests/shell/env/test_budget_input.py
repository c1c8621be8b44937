"""A budget the controller reads (issue 89, ``env.budget_shares``): each episode draws its parameter budget
from the shares, the env states it (the reward's budget, the host description's ``budget_params`` and
its ``params_vs_budget`` descriptor column), the learned controller's cap is that budget, and
``evaluate --budget-share`` fixes one. Without it every shape and number is as before."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from esper.core.spec import Op
from esper.shell.agent.agent import build_agent
from esper.shell.agent.controller import PPOController
from esper.shell.config.presets import preset
from esper.shell.env.vecenv import VecEnv
from esper.shell.eval.episodes import at_budget
from esper.shell.host.descriptors import DESCRIPTOR_FEATURES, PARAMS_SCALE, descriptor_dim

SHARES = (0.1, 1.0)


def _cfg(**over):
    return preset("smoke", {"env.n_envs": 2, "lifecycle.max_epochs": 3, "env.workers": 1,
                            "env.budget_shares": SHARES, **over})  # fmt: skip


def _env(cfg, seed=0):
    task = cfg.env.build_task()
    return VecEnv(cfg.env, cfg.lifecycle, cfg.governor, seed=seed, task=task, reward=cfg.reward)


def test_each_episode_draws_its_budget_and_the_env_states_it():
    cfg = _cfg()
    env = _env(cfg)
    try:
        drawn = []
        for episode in range(12):
            env.reset(episode)
            share = env.budget_share
            drawn.append(share)
            budget = share * env.grow_all_params
            assert env.layout.budget_params == pytest.approx(budget)
            assert env.reward_cfg.param_budget == pytest.approx(budget)
            cost = env.layout.germination_cost.clamp(min=1.0)
            want = ((cost.log() - math.log(budget)) / math.log(PARAMS_SCALE)).clamp(-1, 1)
            assert env.layout.descriptors.shape[-1] == len(DESCRIPTOR_FEATURES) + 1
            torch.testing.assert_close(env.layout.descriptors[..., -1].cpu(), want)
        assert set(drawn) == set(SHARES)  # both drawn over 12 episodes
    finally:
        env.close()
    again = _env(cfg)
    try:
        assert [again.budget_share_of(e) for e in range(12)] == drawn  # the same draw in every process
    finally:
        again.close()


def test_without_budget_shares_nothing_changes():
    cfg = preset("smoke", {"env.n_envs": 2, "lifecycle.max_epochs": 3, "env.workers": 1})
    env = _env(cfg)
    try:
        env.reset(0)
        assert env.budget_share is None and env.layout.budget_params == 0.0
        assert env.layout.descriptors.shape[-1] == len(DESCRIPTOR_FEATURES) == descriptor_dim(False)
    finally:
        env.close()


def test_the_learned_controllers_cap_is_the_episodes_budget():
    cfg = _cfg(**{"ppo.param_cap_share": 0.0})
    env = _env(cfg)
    try:
        agent = build_agent(cfg.ppo, env.spec, device="cpu", germination_cost=env.germination_cost,
                            raw_obs_dim=env.obs_dim, budget_input=True)  # fmt: skip
        allowed = {}
        for episode in range(12):
            step = env.reset(episode).obs
            legal = agent.legal(step)
            layout = env.layout
            bare = layout.germination_cost - layout.gate_cost.unsqueeze(-1)  # the seed alone
            within = bare <= layout.budget_params  # [S, n]
            gated = layout.germination_cost <= layout.budget_params  # with its gate
            germinable = legal["slot_by_op"][:, int(Op.GERMINATE), :]  # [E, S]
            by_slot = legal["blueprint_by_slot"].bool()  # [E, S, n]
            # where GERMINATE is legal, no blueprint over the episode's budget is, nor a gate over it
            assert not (germinable.unsqueeze(-1) & by_slot & ~within.unsqueeze(0)).any()
            assert torch.equal(legal["gated_by_slot"], gated.expand_as(legal["gated_by_slot"]))
            allowed[env.budget_share] = int((germinable.unsqueeze(-1) & by_slot).sum())
            agent.policy_input(step)  # the policy reads the layout with its budget column
        assert allowed[min(SHARES)] < allowed[max(SHARES)]
    finally:
        env.close()


def test_issue102_the_policy_sees_the_episodes_budget_in_its_descriptors():
    """What the learned controller hands its policy (and keeps for the update: ``observation``) carries
    the episode's budget: every blueprint descriptor's ``params_vs_budget`` column is its cost against
    that budget, not zeros (issue 102: a zeroed column left the budget-reading policy blind to it), and
    two budgets give two inputs that differ in that column alone."""
    cfg = _cfg(**{"ppo.param_cap_share": 0.0})
    env = _env(cfg)
    try:
        agent = build_agent(cfg.ppo, env.spec, device="cpu", germination_cost=env.germination_cost,
                            raw_obs_dim=env.obs_dim, budget_input=True)  # fmt: skip
        controller = PPOController(agent, generator=torch.Generator().manual_seed(0))
        cost = env.germination_cost.cpu().float().clamp(min=1.0)  # the env's own, not the layout's
        seen = {}
        shares = [env.budget_share_of(e) for e in range(12)]
        for share in SHARES:  # one episode of each budget
            step = env.reset(shares.index(share)).obs
            assert env.budget_share == share
            controller.begin(env.n)
            blueprints = controller.act(step)["observation", "blueprints"].cpu()  # [E, S, B, D]
            assert blueprints.shape[-1] == len(DESCRIPTOR_FEATURES) + 1
            budget = share * env.grow_all_params
            want = ((cost.log() - math.log(budget)) / math.log(PARAMS_SCALE)).clamp(-1, 1)
            assert want.abs().sum() > 0
            torch.testing.assert_close(blueprints[..., -1], want.expand(env.n, *want.shape))
            seen[share] = blueprints
        assert set(seen) == set(SHARES)
        low, high = seen[min(SHARES)], seen[max(SHARES)]
        assert (low[..., -1] >= high[..., -1]).all() and (low[..., -1] > high[..., -1]).any()  # weighs more
        torch.testing.assert_close(low[..., :-1], high[..., :-1])  # the rest of the descriptor alike
    finally:
        env.close()


def test_only_the_set_policy_reads_a_budget_and_an_absolute_cap_is_refused():
    with pytest.raises(ValueError, match="only the set policy"):
        _cfg(**{"ppo.policy": "flat"})
    with pytest.raises(ValueError, match="ppo.param_cap"):
        _cfg(**{"ppo.param_cap": 100.0, "ppo.param_cap_share": 0.0})


def test_at_budget_sets_the_cap_the_reward_and_the_episodes_budget():
    cfg = at_budget(_cfg(), 0.5)
    assert cfg.env.budget_shares == (0.5,)
    assert cfg.ppo.param_cap_share == 0.5 and cfg.reward.param_budget_share == 0.5
    plain = at_budget(preset("smoke"), 0.5)
    assert plain.env.budget_shares == () and plain.ppo.param_cap_share == 0.5
    with pytest.raises(ValueError, match="budget-share"):
        at_budget(plain, 0.0)


@pytest.mark.e2e
def test_a_run_that_reads_a_budget_trains_and_is_evaluated_under_one(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    run = [sys.executable, "-m", "esper.shell.run", "--preset", "smoke", "--env.n_envs", "2",
           "--lifecycle.max_epochs", "4", "--updates", "2", "--env.budget_shares", "0.1,1.0",
           "--run_dir", str(tmp_path), "--name", "b"]  # fmt: skip
    out = subprocess.run(run, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    ev = [sys.executable, "-m", "esper.shell.evaluate", str(tmp_path / "b"), "--episodes", "2",
          "--controllers", "ppo_greedy,grow_all", "--budget-share", "0.1", "--no-progress",
          "--out", str(tmp_path / "e")]  # fmt: skip
    out = subprocess.run(ev, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((tmp_path / "e" / "results.json").read_text())
    assert res["meta"]["budget_share"] == 0.1
    grow_all = res["controllers"]["grow_all"]["params_added_mean"]
    for ep in res["controllers"]["ppo_greedy"]["per_episode"]:
        assert ep["params_added"] <= 0.1 * grow_all + 1e-6  # within the told budget
