"""The LOSS reward calibrated per task (review 001 M4, issue 92): on a byte-level LM, whose loss starts
near ln 256 = 5.55, the terminal term is non-zero from the first episodes, where CIFAR-10's fixed
baseline (ln 10 = 2.3) read 0 until the loss fell below 2.3."""

from __future__ import annotations

import math

from esper.core.reward_config import LOSS_TARGET_SHARE
from esper.shell import run
from esper.shell.config.presets import preset
from esper.shell.env.vecenv import VecEnv
from esper.shell.telemetry.events import read_events

LOSS = ["--reward.mode", "shaped", "--reward.family", "loss"]
#: The stdlib_text preset, its episodes cut short (three epochs of two training batches) for a test.
SHORT = ["--lifecycle.max_epochs", "3", "--env.train_batches", "2", "--env.val_batches", "2"]


def _terminals(tmp_path, name: str, *extra: str) -> list[float]:
    args = ["--preset", "stdlib_text", *LOSS, *SHORT, "--updates", "1", "--eval_episodes", "0", "--report",
            "false", "--progress", "false", "--run_dir", str(tmp_path), "--name", name, *extra]  # fmt: skip
    assert run.main(args) == 0
    episodes = [e for e in read_events(tmp_path / name / "events.jsonl") if e["event"] == "episode"]
    assert len(episodes) == 2
    return [e["reward_components"]["terminal"] for e in episodes]


def test_M4_stdlib_text_with_the_loss_reward_has_a_nonzero_terminal_in_its_first_episodes(tmp_path):
    terminals = _terminals(tmp_path, "calibrated")
    assert all(0.0 < t < 1.0 for t in terminals), terminals
    # the same episodes under the old fixed calibration (CIFAR-10's): the loss is still above 2.3
    assert _terminals(tmp_path, "fixed", "--reward.loss_baseline", "2.3", "--reward.loss_target", "0.3") == [
        0.0, 0.0,
    ]  # fmt: skip


def test_the_env_resolves_the_calibration_from_its_task_unless_given():
    cfg = preset("stdlib_text", {"reward.mode": "shaped", "reward.family": "loss", "env.n_envs": 1})
    env = VecEnv(cfg.env, cfg.lifecycle, cfg.governor, seed=0, reward=cfg.reward)
    assert abs(env.reward_cfg.loss_baseline - math.log(256)) < 1e-5
    assert abs(env.reward_cfg.loss_target - LOSS_TARGET_SHARE * math.log(256)) < 1e-5
    given = preset("smoke", {"reward.mode": "shaped", "reward.family": "loss", "reward.loss_baseline": 2.0})
    env = VecEnv(given.env, given.lifecycle, given.governor, seed=0, reward=given.reward)
    assert env.reward_cfg.loss_baseline == 2.0
    assert abs(env.reward_cfg.loss_target - LOSS_TARGET_SHARE * 2.0) < 1e-9
