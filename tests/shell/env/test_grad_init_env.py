"""Gradient-informed seeds in the environment (``lifecycle.grad_init``, ``lifecycle.grad_gain_features``,
issue 91 item 5): the slot statistics reach the signals and, behind their switch, the observation, on both
host paths; a germination starts its projection from them; off, nothing of it is there; a run of each
policy trains with them; ``heuristic_gain`` runs in an evaluation; the Grower refuses them."""

from __future__ import annotations

import pytest
import torch

from esper.core.observation import obs_dim
from esper.core.spec import Op
from esper.shell import run
from esper.shell.config.presets import preset
from esper.shell.env.vecenv import VecEnv
from esper.shell.eval.episodes import compare_on_config
from esper.shell.host.gradinit import GRAD_GAIN_KEYS, init_scale_norm, projection
from esper.shell.telemetry.events import read_events
from esper.shell.user.grower import Grower
from tests.core.test_lifecycle import make_action
from tests.shell.host.test_user import Net1d, _data


def _cfg(**over):
    return preset("smoke", {"env.n_envs": 2, "env.workers": 1, "lifecycle.max_epochs": 4, **over})


@pytest.mark.parametrize("host_step", ["per_env", "batched"])
def test_the_statistics_reach_the_signals_the_observation_and_the_seeds(host_step):
    on = _cfg(**{"env.host_step": host_step, "lifecycle.grad_init": True,
                 "lifecycle.grad_gain_features": True, "lifecycle.grad_init_scale": 0.5})  # fmt: skip
    env = VecEnv(on.env, on.lifecycle, on.governor, seed=0)
    ts = env.reset(0)
    S, B = env.spec.n_slots, env.spec.n_blueprints
    assert env.obs_dim == obs_dim(S, B, grad_gain=True) == obs_dim(S, B) + 2 * S
    assert ts.obs.raw_obs.shape == (2, env.obs_dim)
    gains = ts.obs.signals["slots", "grad_gain"]
    assert gains.shape == (2, S) and bool((gains > 0).all())
    assert set(GRAD_GAIN_KEYS) <= set(ts.obs.signals["slots"].keys())
    heavy = env.blueprint_names.index("conv_heavy")
    env.step(make_action(2, Op.GERMINATE, 0, blueprint=heavy))
    for i in range(2):  # its scale, give or take the epoch the seed has trained since
        P = projection(env.hosts.host(i).slot(0).seed)
        assert float(P.detach().norm()) == pytest.approx(init_scale_norm(P, 0.5), rel=0.2)
    off = _cfg(**{"env.host_step": host_step})
    plain = VecEnv(off.env, off.lifecycle, off.governor, seed=0)
    ts = plain.reset(0)
    assert not set(GRAD_GAIN_KEYS) & set(ts.obs.signals["slots"].keys())
    assert plain.obs_dim == obs_dim(S, B)
    plain.step(make_action(2, Op.GERMINATE, 0, blueprint=heavy))
    P = projection(plain.hosts.host(0).slot(0).seed)  # the blueprint's own near-zero start
    assert float(P.detach().norm()) < 0.3 * init_scale_norm(P, 0.5)


@pytest.mark.parametrize("policy", ["set", "flat"])
def test_a_run_trains_with_the_statistics_and_their_observation(tmp_path, policy):
    args = ["--preset", "smoke", "--run_dir", str(tmp_path), "--name", "g", "--ppo.policy", policy,
            "--lifecycle.grad_init", "true", "--lifecycle.grad_gain_features", "true"]  # fmt: skip
    assert run.main(args) == 0
    events = read_events(tmp_path / "g" / "events.jsonl")
    assert any(e["event"] == "epoch" for e in events)


def test_heuristic_gain_runs_on_fresh_hosts_and_is_refused_without_the_statistics():
    cfg = _cfg(**{"lifecycle.grad_init": True, "lifecycle.max_epochs": 7})
    res = compare_on_config(cfg, ["heuristic_gain", "grow_all"], episodes=2, seed=3, show_progress=False)
    assert set(res["controllers"]) == {"heuristic_gain", "grow_all"}
    with pytest.raises(ValueError, match="lifecycle.grad_init"):
        compare_on_config(_cfg(), ["heuristic_gain"], episodes=2, seed=3, show_progress=False)


def test_the_grower_refuses_the_statistics():
    model = Net1d()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="Grower: lifecycle.grad_init"):
        Grower(model, opt, val=_data(8, 1), overrides={"lifecycle.grad_init": True})
