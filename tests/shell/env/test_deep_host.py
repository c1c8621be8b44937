"""Beyond three slots (issue 47): a 5-slot 1-D CNN host built directly (five pointwise blocks on
MNIST-1D), and every part that depends on the slot count on it: the action spec and the masks, the
policy acting and learning, the heuristic, ``random`` and ``grow_all``, the evaluation's episodes and
summary, and the run report's plots."""

from __future__ import annotations

import pytest
import torch

from esper.core.spec import Op
from esper.shell.agent.controller import PPOController
from esper.shell.agent.trainer import build_learner
from esper.shell.baselines.heuristic import HeuristicController
from esper.shell.baselines.simple import GrowAllController, RandomController
from esper.shell.config.presets import preset
from esper.shell.env.rollout import EpisodeRunner
from esper.shell.env.tasks import mnist1d_task
from esper.shell.env.vecenv import VecEnv
from esper.shell.eval.episodes import run_episodes, summarize
from esper.shell.telemetry.events import EventLog, RunEvents, read_events
from esper.shell.telemetry.plots import contributions, germination_counts
from esper.shell.telemetry.report import write_report

S = 5
DEEP = {"channels": (8,) * S, "kernels": (1,) * S, "pools": (2, 2, 1, 1, 1)}


def _cfg(**over):
    return preset("smoke", {"env.n_envs": 2, "env.workers": 1, "lifecycle.max_epochs": 9, **over})


@pytest.fixture(scope="module")
def task():
    return mnist1d_task(**DEEP, batch_size=128, max_batches=2)


def _env(cfg, task) -> VecEnv:
    return VecEnv(
        cfg.env, cfg.lifecycle, cfg.governor, seed=0, task=task, reward=cfg.reward, gamma=cfg.ppo.gamma
    )


def _ppo(cfg, env: VecEnv):
    torch.manual_seed(0)
    agent, trainer = build_learner(
        cfg.ppo, env.spec, device="cpu", seed=0, germination_cost=env.germination_cost,
        raw_obs_dim=env.obs_dim,
    )  # fmt: skip
    return PPOController(agent, per_env=True), trainer


def _run(env: VecEnv, ctl):
    try:
        return EpisodeRunner(env, ctl).run(0, host_seeds=[11, 12])
    finally:
        env.close()


def _check_episode(result, env: VecEnv) -> None:
    """Every action was legal (the lifecycle logged no ``illegal`` event) and every per-slot field of
    the epoch events has one entry per slot."""
    assert not [e for e in result.lifecycle if e["kind"] == "illegal"]
    for ev in result.epochs:
        assert ev["slot_names"] == [f"b{i}" for i in range(S)]
        for key in ("stage", "alpha", "contribution", "grad_ratio"):
            assert all(len(row) == S for row in ev[key]), key
        assert len(ev["hacking"]) == len(ev["ransomware"]) == env.n


def test_the_five_slot_host_has_five_slots_in_the_spec_the_masks_and_the_policy(task):
    cfg = _cfg()
    env = _env(cfg, task)
    ts = env.reset(0, host_seeds=[11, 12])
    assert env.spec.n_slots == S and env.slot_names == tuple(f"b{i}" for i in range(S))
    assert ts.obs.legal["slot_by_op"].shape == (2, len(Op), S)
    assert ts.obs.raw_obs.shape == (2, env.obs_dim)
    ctl, _ = _ppo(cfg, env)
    ctl.begin(2)
    ctl.seed_envs(env.host_seeds)
    out = ctl.act(ts.obs)
    assert out["slot", "action_mask"].shape == (2, S)
    env.close()


@pytest.mark.parametrize("seed_grads", [False, True])
def test_ppo_acts_and_learns_on_five_slots(task, seed_grads):
    """The PPO controller runs a whole episode on the 5-slot host and updates on its rollout, with and
    without the seed gradient-health observation (``lifecycle.seed_grad_features``: 4 more features
    per slot, 20 here)."""
    cfg = _cfg(**{"lifecycle.seed_grad_features": seed_grads})
    env = _env(cfg, task)
    assert env.obs_dim == _env(_cfg(), task).obs_dim + (4 * S if seed_grads else 0)
    ctl, trainer = _ppo(cfg, env)
    result = _run(env, ctl)
    _check_episode(result, env)
    rollout = result.rollout
    assert rollout.batch_size == (2, cfg.lifecycle.max_epochs)
    assert rollout["slot", "action"].max() < S and rollout["slot", "action_mask"].shape[-1] == S
    metrics = trainer.update(rollout)
    assert metrics["minibatch_steps"] >= 1 and not metrics["rolled_back"]
    assert metrics["lstm_nonfinite"] == 0


@pytest.mark.parametrize("name", ["heuristic", "random", "grow_all"])
def test_the_baselines_run_a_five_slot_episode_with_legal_actions(task, name):
    cfg = _cfg()
    env = _env(cfg, task)
    ctl = {
        "heuristic": lambda: HeuristicController(env.blueprint_names, cfg.lifecycle),
        "random": lambda: RandomController(seed=3),
        "grow_all": lambda: GrowAllController(env.blueprint_names.index("conv_light"), cfg.lifecycle),
    }[name]()
    result = _run(env, ctl)
    _check_episode(result, env)
    if name == "grow_all":  # one germination a step, slot after slot: all five slots grow
        for ep in result.episodes:
            assert [g["slot"] for g in ep["germinations"]] == list(range(S))


def test_evaluation_and_report_work_on_five_slots(task, tmp_path):
    """The evaluation's episodes and summary for the trained (here: fresh) policy and the baselines,
    then a run log of a 5-slot episode and its report: the seed timeline shows 5 rows per env, the
    contribution and blueprint plots one line and one panel per slot."""
    cfg = _cfg(**{"lifecycle.max_epochs": 6})
    env = _env(cfg, task)
    _, trainer = _ppo(cfg, env)
    env.close()
    checkpoint = {"agent": trainer.agent.state_dict()}
    for name in ("ppo", "heuristic", "random", "grow_all"):
        records = run_episodes(cfg, task, name, [0, 1], eval_seed=5, checkpoint=checkpoint)
        summary = summarize(records)
        assert summary["episodes"] == 2 and len(summary["val_acc_curve_mean"]) == 6, name
        for r in records:
            assert all(0 <= g["slot"] < S for g in r["germinations"]), name

    env = _env(cfg, task)
    result = _run(env, GrowAllController(env.blueprint_names.index("conv_light"), cfg.lifecycle))
    with EventLog(tmp_path / "events.jsonl") as log:
        log.write("run_start", config={"env": {"n_envs": 2}})
        for ev in result.epochs:
            log.write("epoch", update=1, **ev)
        for ev in result.lifecycle:
            log.write("lifecycle", update=1, **ev)
        for ep in result.episodes:
            log.write("episode", update=1, **ep)
        log.write("run_end", summary={})
    write_report(tmp_path)
    plots = tmp_path / "plots"
    for name in ("seed_timeline", "contribution", "blueprints"):
        assert (plots / f"{name}.png").is_file(), name
    md = (tmp_path / "report.md").read_text()
    assert "![contribution](plots/contribution.png)" in md and "reward flags" in md
    run = RunEvents(read_events(tmp_path / "events.jsonl"))
    names, per_slot = contributions(run)
    assert names == [f"b{i}" for i in range(S)] and set(per_slot) == set(range(S))
    assert {slot for slot, _ in germination_counts(run)} == set(range(S))
