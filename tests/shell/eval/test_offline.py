"""Episodes kept and learned from (issue 92): ``evaluate --save-episodes`` writes a dataset, the offline
learner rebuilds what the policy saw from it and trains by BC, IQL or the Q-free expectile variant, and
``run --pretrain`` / ``run --offline`` use it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from esper.core.masks import head_relevance
from esper.core.offline import bc_loss
from esper.core.spec import HEAD_INDEX, HEADS, ActionSpec
from esper.shell.agent.pretrain import OfflineConfig, OfflineLearner
from esper.shell.agent.trainer import build_learner
from esper.shell.common.checkpoint import load_checkpoint
from esper.shell.common.fields import from_dict
from esper.shell.config.presets import RunConfig
from esper.shell.eval.dataset import layout_of, load_dataset
from esper.shell.eval.episodes import compare_controllers
from esper.shell.evaluate import main

pytestmark = pytest.mark.e2e

RUN = ["--preset", "smoke", "--env.n_envs", "2", "--lifecycle.max_epochs", "4", "--updates", "1"]
SAVED = ("ppo_greedy", "heuristic", "grow_all")


def _run(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A smoke run, and its controller's and two baselines' evaluation episodes kept (4 each)."""
    root = tmp_path_factory.mktemp("offline")
    out = _run("esper.shell.run", *RUN, "--run_dir", str(root), "--name", "r")
    assert out.returncode == 0, out.stderr[-3000:]
    results = compare_controllers(root / "r", episodes=4, seed=3, controllers=list(SAVED),
                                  show_progress=False, threads=1, save_episodes=root / "ds")  # fmt: skip
    return root, results


def test_the_dataset_holds_what_the_trainer_reads(saved):
    root, results = saved
    data, meta = load_dataset(str(root / "ds" / "heuristic"))
    assert data.batch_size == (4,) and data["steps"].batch_size == (4, 4)
    steps = data["steps"]
    assert meta["controllers"] == ["heuristic"] and meta["episodes"] == 4 and meta["max_epochs"] == 4
    assert steps["raw_observation"].shape == (4, 4, meta["obs_dim"])
    # the rewards are the episodes' (their sum is each episode's return), done on the last step
    per = json.loads((root / "ds" / "heuristic" / "meta.json").read_text())["per_episode"]
    evaluated = results["controllers"]["heuristic"]["per_episode"]
    assert [p["host_seed"] for p in per] == [e["host_seed"] for e in evaluated]
    torch.testing.assert_close(steps["next", "raw_reward"].sum(1), torch.tensor([p["return"] for p in per]))
    assert steps["next", "done"][:, -1].all() and not steps["next", "done"][:, :-1].any()
    assert steps["is_init"][:, 0].all() and not steps["is_init"][:, 1:].any()
    # every head's stored action is legal under its stored mask wherever the head mattered
    relevant = head_relevance(steps["op", "action"])
    for head in HEADS:
        mask, action = steps[head, "action_mask"], steps[head, "action"]
        legal = mask.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        assert legal[relevant[..., HEAD_INDEX[head]]].all(), head
    layout = layout_of(data, meta)
    assert layout.slot_names == tuple(meta["slot_names"]) and layout.descriptors.dim() == 3
    assert data["final", "raw_observation"].shape == (4, meta["obs_dim"])


def test_keeping_the_episodes_changes_none_of_them(saved, tmp_path):
    root, results = saved
    plain = compare_controllers(root / "r", episodes=4, seed=3, controllers=["heuristic", "ppo_greedy"],
                                show_progress=False, threads=1, out=tmp_path)  # fmt: skip
    for name in ("heuristic", "ppo_greedy"):
        assert plain["controllers"][name]["per_episode"] == results["controllers"][name]["per_episode"]


def test_rescoring_a_greedy_controllers_episodes_from_the_zero_state_reproduces_its_choices(saved):
    """The input rebuilt from the raw observation, the op bits and the layout, re-scored from the zero
    state (every stored sequence is a whole episode), is what the controller acted on: its greedy
    choice is the stored action at every step and head that counted."""
    root, _ = saved
    cfg = from_dict(RunConfig, json.loads((root / "r" / "config.json").read_text()))
    data, meta = load_dataset(str(root / "ds" / "ppo_greedy"))
    agent, _ = build_learner(cfg.ppo, ActionSpec(len(meta["slot_names"]), len(meta["blueprint_names"])),
                             device="cpu", seed=0, raw_obs_dim=meta["obs_dim"])  # fmt: skip
    agent.load(load_checkpoint(root / "r" / "checkpoint.pt")["agent"])
    learner = OfflineLearner(agent, cfg.ppo, OfflineConfig(), seed=0)
    steps = data["steps"]
    steps["observation"] = learner.policy_inputs(steps["raw_observation"], steps["op", "action_mask"],
                                                 layout_of(data, meta))  # fmt: skip
    with torch.no_grad():
        steps["current"] = learner._rescore(agent.policy, steps)
    assert float(bc_loss(steps)["accuracy"]) == 1.0


def test_bc_learns_the_demonstrator_and_iql_trains_finite(saved):
    root, _ = saved
    cfg = from_dict(RunConfig, json.loads((root / "r" / "config.json").read_text()))
    data, meta = load_dataset(str(root / "ds"))  # every controller's episodes
    assert meta["controllers"] == sorted(SAVED) and data.batch_size == (12,)
    spec = ActionSpec(len(meta["slot_names"]), len(meta["blueprint_names"]))
    for algo in ("bc", "iql", "expectile_td"):
        torch.manual_seed(0)
        agent, _ = build_learner(cfg.ppo, spec, device="cpu", seed=0, raw_obs_dim=meta["obs_dim"])
        learner = OfflineLearner(agent, cfg.ppo, OfflineConfig(minibatch=4, lr=3e-3), seed=0)
        batch = learner.prepare(data, layout_of(data, meta))
        assert float(agent.obs_stats["global", "count"]) == 12 * 4  # the statistics took the episodes in
        reports = learner.fit(batch, algo, 12)
        assert len(reports) == 12 and all(r["algo"] == algo for r in reports)
        assert reports[-1]["log_likelihood"] > reports[0]["log_likelihood"] + 0.5, algo
        if algo != "bc":
            assert learner.target is not None and "weight_mean" in reports[-1]
        if algo == "iql":  # the twin Q heads over the set policy's trunk, sized by the dataset's heads
            assert learner.q is not None and reports[-1]["td_loss"] < reports[0]["td_loss"]


def test_load_dataset_refuses_what_it_cannot_read(saved, tmp_path):
    root, _ = saved
    with pytest.raises(ValueError, match="not found"):
        load_dataset(str(tmp_path / "none"))
    with pytest.raises(ValueError, match="no dataset in it"):
        load_dataset(str(tmp_path))
    other = tmp_path / "other"
    shutil.copytree(root / "ds" / "grow_all", other)
    meta = json.loads((other / "meta.json").read_text())
    meta["slot_names"] = ["x", "y", "z"]
    (other / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="slot_names differ"):
        load_dataset(f"{root / 'ds' / 'heuristic'},{other}")
    with pytest.raises(ValueError, match="algo"):
        OfflineConfig(algo="cql")


def test_save_episodes_refuses_an_existing_dataset_in_one_line(saved, capsys):
    root, _ = saved
    args = [str(root / "r"), "--episodes", "2", "--controllers", "heuristic", "--no-progress"]
    assert main([*args, "--save-episodes", str(root / "ds")]) != 0
    err = capsys.readouterr().err
    assert "--save-episodes: " in err and "exists; choose another directory" in err
    assert len(err.splitlines()) == 1


def test_run_offline_then_evaluate_and_run_pretrain(saved):
    root, _ = saved
    ds = root / "ds"
    out = _run("esper.shell.run", *RUN, "--run_dir", str(root), "--name", "off", "--offline", str(ds),
               "--offline_rl.epochs", "2", "--offline_rl.algo", "bc")  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "offline: 2 epochs of bc on 12 episodes" in out.stderr
    events = [json.loads(line) for line in (root / "off" / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds.count("offline_epoch") == 2 and "ppo_update" not in kinds and "episode" not in kinds
    ckpt = load_checkpoint(root / "off" / "checkpoint.pt")
    assert ckpt["progress"]["update"] == 0
    ev = _run("esper.shell.evaluate", str(root / "off"), "--episodes", "2", "--controllers",
              "ppo_greedy,random", "--threads", "1", "--no-progress")  # fmt: skip
    assert ev.returncode == 0, ev.stderr[-3000:]
    resume = _run("esper.shell.run", "--resume", str(root / "off"))
    assert resume.returncode != 0 and "offline run has nothing to resume" in resume.stderr
    pre = _run("esper.shell.run", *RUN, "--run_dir", str(root), "--name", "pre", "--pretrain",
               str(ds / "heuristic"), "--offline_rl.pretrain_epochs", "2")  # fmt: skip
    assert pre.returncode == 0, pre.stderr[-3000:]
    kinds = [json.loads(line)["event"] for line in (root / "pre" / "events.jsonl").read_text().splitlines()]
    assert kinds.count("offline_epoch") == 2 and kinds.index("offline_epoch") < kinds.index("ppo_update")
    both = _run("esper.shell.run", *RUN, "--run_dir", str(root), "--name", "both", "--pretrain", str(ds),
                "--offline", str(ds))  # fmt: skip
    assert both.returncode == 2 and "give one" in both.stderr
