"""The default reward cannot be farmed: scripted policies on the default task (MNIST-1D, the default
host), the same host seeds for each. Growing useful seeds and fossilizing them earns more return than
farming: growing seeds that do not raise accuracy and keeping them, or keeping a seed the host has
come to depend on (its removal hurts) without being better for it."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from esper.core.rewards import parameter_cost
from esper.shell.baselines.simple import GrowAllController, StaticController
from esper.shell.config.presets import preset
from esper.shell.env.rollout import EpisodeRunner
from esper.shell.env.vecenv import VecEnv

SEEDS = [101, 202]


def _episodes(controller_of, *, reward_mode: str | None = None, epochs: int = 14):
    overrides = {"env.n_envs": 2, "env.workers": 1, "ppo.n_minibatches": 1, "lifecycle.max_epochs": epochs,
                 "lifecycle.g5_min_contribution": -100.0}  # fmt: skip
    if reward_mode:
        overrides["reward.mode"] = reward_mode
    cfg = preset("default", overrides)
    env = VecEnv(cfg.env, cfg.lifecycle, cfg.governor, seed=0, reward=cfg.reward, gamma=cfg.ppo.gamma)
    runner = EpisodeRunner(env, controller_of(env, cfg))
    result = runner.run(0, host_seeds=SEEDS)
    return result.episodes, result


def _grow(name):
    return lambda env, cfg: GrowAllController(env.blueprint_names.index(name), cfg.lifecycle)


def test_farming_earns_less_return_than_growing_useful_seeds():
    useful, _ = _episodes(_grow("conv_heavy"))
    useless, _ = _episodes(_grow("norm"))  # kept, but they do not raise accuracy
    dependent, res = _episodes(_grow("self_attention"))  # costly seeds the host leans on
    static, _ = _episodes(lambda env, cfg: StaticController())
    ret = lambda eps: float(np.mean([e["return"] for e in eps]))
    acc = lambda eps: float(np.mean([e["final_test_acc"] for e in eps]))

    # the useful policy really is better on held-out data, and the return says so
    assert acc(useful) > acc(static) + 10
    assert ret(useful) > ret(useless) + 5 and ret(useful) > ret(dependent) + 5
    # farming is not even better than doing nothing
    assert ret(useless) < ret(static) + 2 and ret(dependent) < ret(static) + 2
    # the dependent seeds were kept and the host came to lean on them: removing one costs accuracy
    last_contribution = [ev for ev in res.epochs][-1]
    assert all(e["n_fossilized"] == 3 for e in dependent)
    assert last_contribution["stage"][0].count("FOSSILIZED") == 3


def test_shaped_reward_is_kept_as_an_option():
    episodes, _ = _episodes(_grow("conv_heavy"), reward_mode="shaped", epochs=5)
    assert all(e["reward_components"]["objective"] == 0.0 for e in episodes)
    assert any(e["reward_components"]["pbrs"] != 0.0 for e in episodes)


def test_the_default_preset_is_the_objective_reward():
    cfg = preset("default")
    assert cfg.reward.mode.name == "OBJECTIVE" and cfg.env.task == "mnist1d"
    # growth is charged: free up to the budget, then at param_over_weight points per host-size
    charged = torch.tensor([0.0, cfg.reward.param_budget, 1200.0])
    cost = parameter_cost(charged, torch.full_like(charged, 274.0), dataclasses.replace(cfg.reward))
    assert cfg.reward.param_budget > 0 and cost[0] == 0 and cost[1] == 0 and cost[2] > 10
