"""Training on several tasks (``tasks``: one per update, in turn) and from another run's controller
(``init_from``), with ``ppo.policy set`` where the hosts differ in shape (issue 46)."""

from __future__ import annotations

import pytest
import torch

from esper.shell.common.checkpoint import load_checkpoint
from esper.shell.config.presets import preset
from esper.shell.runtime.training import TrainingRun
from esper.shell.telemetry.events import read_events
from tests.shell.runtime.test_run_safety import TINY, cli, error_line

pytestmark = pytest.mark.e2e

SET = [*TINY, "--ppo.policy", "set", "--ppo.germinate_bias", "3"]


@pytest.fixture(autouse=True)
def _keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_several_tasks_take_turns_and_one_set_policy_learns_on_hosts_of_3_and_5_slots(tmp_path, capsys):
    """``--tasks mnist1d,mnist1d_deep``: updates 1 and 3 run the 3-slot host, update 2 the 5-slot one,
    each update trains the one network; replay keeps one rollout per host shape and replays only the
    new rollout's shape; the checkpoint keeps both; the episodes and the summary say their task."""
    status, err = cli(capsys, *SET, "--tasks", "mnist1d,mnist1d_deep", "--ppo.replay", "1", "--updates", "3",
                      "--run_dir", tmp_path, "--name", "r")  # fmt: skip
    assert status == 0, err[-3000:]
    assert "esper: ppo on mnist1d, mnist1d_deep in turn" in err
    events = read_events(tmp_path / "r" / "events.jsonl")
    episodes = [e for e in events if e["event"] == "episode"]
    assert [(e["update"], e["task"]) for e in episodes] == [
        (1, "mnist1d"), (1, "mnist1d"), (2, "mnist1d_deep"), (2, "mnist1d_deep"), (3, "mnist1d"),
        (3, "mnist1d"),
    ]  # fmt: skip
    slots = {e["task"]: {g["slot"] for g in e["germinations"]} for e in episodes}
    assert max(slots["mnist1d"], default=0) < 3 and max(slots["mnist1d_deep"], default=0) < 5
    assert any(e["germinations"] for e in episodes if e["task"] == "mnist1d_deep"), "it acted on the 5 slots"
    updates = [e for e in events if e["event"] == "ppo_update"]
    assert [u["replayed_envs"] for u in updates] == [0, 0, 2]  # update 3 replays update 1's 3-slot rollout
    assert all(u["minibatch_steps"] > 0 for u in updates)
    ckpt = load_checkpoint(tmp_path / "r" / "checkpoint.pt")
    kept = ckpt["learner"]["replay"]
    assert sorted(d["observation"]["slots"].shape[2] for d in kept) == [3, 5]
    summary = (tmp_path / "r" / "summary.txt").read_text()
    assert "task" in summary.splitlines()[0] and "mnist1d_deep" in summary


def test_the_flat_policy_refuses_tasks_whose_hosts_differ_in_one_line(tmp_path, capsys):
    flat = ["--ppo.policy", "flat", "--tasks", "mnist1d,mnist1d_deep"]
    status, err = cli(capsys, *TINY, *flat, "--run_dir", tmp_path, "--name", "r")
    assert status == 2
    line = error_line(err)
    assert "tasks: the flat policy acts on one host shape, these differ (mnist1d 3 slots" in line
    assert "mnist1d_deep 5 slots" in line and "--ppo.policy set" in line
    assert not (tmp_path / "r").exists()


def test_compile_refuses_more_graphs_than_torch_compile_keeps_in_one_line(tmp_path, capsys):
    """A compiled step builds one graph per host shape and batch size: two shapes with ``ppo.replay K``
    need 2 (K + 1), refused past torch.compile's recompile limit before anything is built."""
    limit = torch.compiler.config.recompile_limit
    replay = limit // 2  # within the one-task limit (K + 1 <= limit), past it with two shapes
    args = ["--tasks", "mnist1d,mnist1d_deep", "--compile", "true", "--ppo.replay", replay]
    status, err = cli(capsys, *SET, *args, "--run_dir", tmp_path, "--name", "r")
    assert status == 2 and f"need {2 * (replay + 1)} graphs" in error_line(err)
    assert not (tmp_path / "r").exists()


def test_init_from_starts_the_controller_from_another_run_s_checkpoint(tmp_path, capsys):
    """``init_from A``: the run's network and observation statistics are A's (a fresh optimizer, no
    update counted), here fine-tuned on a host of another shape; refusals are one line each."""
    status, err = cli(capsys, *SET, "--updates", "1", "--run_dir", tmp_path, "--name", "a")
    assert status == 0, err[-3000:]
    a = load_checkpoint(tmp_path / "a" / "checkpoint.pt")["agent"]
    cfg = preset("smoke", {"ppo.policy": "set", "env.task": "mnist1d_deep", "init_from": str(tmp_path / "a")})
    run = TrainingRun(cfg, tmp_path / "b")
    for k, v in run.agent.policy.state_dict().items():
        assert torch.equal(v, a["policy"][k]), k
    for k, v in run.agent.obs_stats.items(True, True):
        assert torch.equal(v, a["obs_stats"][k[0]][k[1]]), k
    assert run.trainer.state.updates == 0 and not run.trainer.optimizer.state
    fresh = TrainingRun(preset("smoke", {"ppo.policy": "set", "env.task": "mnist1d_deep"}), tmp_path / "c")
    assert not torch.equal(fresh.agent.policy.value_head[0].weight, run.agent.policy.value_head[0].weight)
    status, err = cli(capsys, *SET, "--env.task", "mnist1d_deep", "--init_from", tmp_path / "a",
                      "--updates", "1", "--run_dir", tmp_path, "--name", "b")  # fmt: skip
    assert status == 0, err[-3000:]
    refusals = [
        (
            ["--init_from", tmp_path / "none"],
            "init_from: " + str(tmp_path / "none" / "checkpoint.pt") + " not found",
        ),
        (
            ["--init_from", tmp_path / "a", "--ppo.policy", "flat"],
            "its controller is ppo.policy set, this run's flat",
        ),
        (
            ["--init_from", tmp_path / "a", "--ppo.hidden", "8"],
            "does not load into this run's: size mismatch",
        ),
    ]
    for i, (args, message) in enumerate(refusals):
        status, err = cli(capsys, *SET, *args, "--run_dir", tmp_path, "--name", f"x{i}")
        assert status == 2 and message in error_line(err), err[-2000:]
        assert not (tmp_path / f"x{i}").exists()
