"""The default reward cannot be farmed: scripted policies on the default task (MNIST-1D, the default
host), the same host seeds for each. Growing useful seeds and fossilizing them earns more return than
farming: growing seeds that do not raise accuracy and keeping them, or keeping a seed the host has
come to depend on (its removal hurts) without being better for it."""

from __future__ import annotations

import numpy as np
import torch

from esper.core.reward_config import with_param_budget
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
    # the default's whole 25-epoch episode: on its batches of 256 (issue 90), 14 epochs leave grow_all's
    # hosts too little trained to earn back the charge above the budget (59 % test, return 28.9 against
    # the static host's 29.7); at 25 they reach 81 % and a return of 52.3 against 31.9
    useful, _ = _episodes(_grow("conv_heavy"), epochs=25)
    useless, _ = _episodes(_grow("norm"), epochs=25)  # kept, but they do not raise accuracy
    dependent, res = _episodes(_grow("self_attention"), epochs=25)  # costly seeds the host leans on
    static, _ = _episodes(lambda env, cfg: StaticController(), epochs=25)
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
    # growth is charged: free up to the budget (60 % of grow_all's 1,200 here), then at
    # param_over_weight points per host-size
    reward = with_param_budget(cfg.reward, 1200)
    charged = torch.tensor([0.0, reward.param_budget, 1200.0])
    cost = parameter_cost(charged, torch.full_like(charged, 274.0), reward)
    assert reward.param_budget == 720.0 and cost[0] == 0 and cost[1] == 0 and cost[2] > 10


class _LateGrowth:
    """WAIT for ``wait`` steps, then as ``grow`` (a fixed growth schedule): a seed germinated after the
    host has learnt most of what it will, so that the host comes to lean on it without gaining much."""

    learns = False

    def __init__(self, wait: int, grow: GrowAllController) -> None:
        self.wait, self.grow, self.static, self.t = wait, grow, StaticController(), 0

    def begin(self, n_envs: int) -> None:
        self.t = 0
        self.grow.begin(n_envs)
        self.static.begin(n_envs)

    def seed_envs(self, host_seeds: list[int]) -> None:
        return None

    def explain(self) -> None:
        return None

    def bootstrap(self, step) -> None:
        return None

    def act(self, step):
        self.t += 1
        return (self.static if self.t <= self.wait else self.grow).act(step)


def test_H9_a_farming_episode_raises_the_flags_in_its_epoch_events_summary_anomalies_and_report(tmp_path):
    """Issue 47: the ``hacking`` and ``ransomware`` flags every reward computes (finding H9) reach the
    ``epoch`` events (one per env), the episode summary (``reward_flags``: steps flagged), the anomaly
    detector (kinds of their own) and the report. The farming episode: a costly ``self_attention`` seed
    germinated late into ``b0`` and kept, which the host comes to lean on (its removal costs more than
    the host gained since it arrived). The flags' own thresholds are set so that this seed meets them: a
    seed claiming at least all of the host's gain (``hacking_ratio`` 1), a host that gained less than 15
    points while depending on it (``ransomware_max_improvement`` 15); what each flag means is tested in
    tests/core/test_rewards.py, that it is reported here."""
    from esper.shell.telemetry.anomaly import AnomalyConfig, AnomalyDetector
    from esper.shell.telemetry.events import EventLog
    from esper.shell.telemetry.report import write_report

    overrides = {"env.n_envs": 1, "env.workers": 1, "ppo.n_minibatches": 1, "lifecycle.max_epochs": 11,
                 "reward.hacking_ratio": 1.0, "reward.ransomware_max_improvement": 15.0}  # fmt: skip
    cfg = preset("default", overrides)
    env = VecEnv(cfg.env, cfg.lifecycle, cfg.governor, seed=0, reward=cfg.reward, gamma=cfg.ppo.gamma)
    grow = GrowAllController({0: env.blueprint_names.index("self_attention")}, cfg.lifecycle)
    result = EpisodeRunner(env, _LateGrowth(2, grow)).run(0, host_seeds=SEEDS[:1])
    env.close()
    flagged = {flag: [ev[flag][0] for ev in result.epochs] for flag in ("hacking", "ransomware")}
    assert any(flagged["hacking"]) and any(flagged["ransomware"]), flagged
    assert not any(flagged["hacking"][:3]), "no seed, no flag"
    summary = result.episodes[0]["reward_flags"]
    assert summary == {flag: sum(v) for flag, v in flagged.items()}
    # the seed the flags point at: blended, costly to remove
    last = result.epochs[-1]
    assert last["contribution"][0][0] > 1.0 and last["contribution"][0][1] is None

    steps = cfg.lifecycle.max_epochs
    found = AnomalyDetector(AnomalyConfig(reward_hacking=0.0, ransomware=0.0)).check_rewards(summary, steps)
    assert {a.kind for a in found} == {"reward_hacking", "ransomware"}  # any flagged step, here
    with EventLog(tmp_path / "events.jsonl") as log:
        log.write("run_start", config={})
        for ev in result.epochs:
            log.write("epoch", update=1, **ev)
        log.write("episode", update=1, **result.episodes[0])
        for a in found:
            log.write("anomaly", update=1, **a.as_dict())
    write_report(tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert f"hacking {summary['hacking']} of {steps}" in md and "reward_hacking" in md
    assert (tmp_path / "plots" / "reward_flags.png").is_file()
