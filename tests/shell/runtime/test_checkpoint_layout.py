"""A run's checkpoint holds ``agent`` (what the controller needs to act) and ``learner`` (what resuming
training needs besides); one written before (version 2: both in one ``trainer`` entry) still loads
everywhere (``--resume``, evaluation, ``grow``, ``--init_from``) and acts the same."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from esper.shell.common.checkpoint import CHECKPOINT_VERSION, load_checkpoint
from esper.shell.config.presets import preset
from esper.shell.evaluate import main as evaluate_main
from esper.shell.runtime.training import TrainingRun
from esper.shell.user.grow import load_run
from tests.shell.runtime.test_checkpoint import _assert_equal, write_version_2
from tests.shell.runtime.test_run_safety import TINY, cli


@pytest.fixture(autouse=True)
def _keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture
def runs(tmp_path, capsys):
    """A finished two-update run ``new`` and its copy ``old`` whose checkpoint is rewritten as version 2
    wrote it: one ``trainer`` entry holding the agent's and the learner's."""
    status, err = cli(capsys, *TINY, "--updates", "2", "--run_dir", tmp_path, "--name", "new")
    assert status == 0, err[-3000:]
    new, old = tmp_path / "new", tmp_path / "old"
    shutil.copytree(new, old)
    payload = load_checkpoint(new / "checkpoint.pt")
    assert {"agent", "learner"} <= payload.keys() and "trainer" not in payload
    assert (new / "checkpoint.pt").read_bytes().startswith(f"ESPER-CHECKPOINT {CHECKPOINT_VERSION} ".encode())
    trainer = {**payload.pop("agent"), **payload.pop("learner")}
    write_version_2(old / "checkpoint.pt", {"trainer": trainer, **payload})
    return new, old


def test_an_old_checkpoint_loads_as_agent_and_learner(runs):
    new, old = runs
    assert (old / "checkpoint.pt").read_bytes().startswith(b"ESPER-CHECKPOINT 2 ")
    _assert_equal(load_checkpoint(new / "checkpoint.pt"), load_checkpoint(old / "checkpoint.pt"))


def test_an_old_checkpoint_resumes_as_the_new_one_does(runs, capsys):
    new, old = runs
    for run in (new, old):
        status, err = cli(capsys, "--resume", run, "--updates", "3")
        assert status == 0, err[-3000:]
    a, b = (load_checkpoint(r / "checkpoint.pt") for r in (new, old))
    assert a["progress"]["update"] == b["progress"]["update"] == 3 and b["learner"]["updates"] == 3
    assert (old / "checkpoint.pt").read_bytes().startswith(f"ESPER-CHECKPOINT {CHECKPOINT_VERSION} ".encode())
    _assert_equal(a["agent"], b["agent"])
    _assert_equal(a["learner"], b["learner"])


def test_an_old_checkpoint_evaluates_and_grows_as_the_new_one_does(runs, capsys):
    new, old = runs
    results = []
    for run in (new, old):
        argv = [str(run), "--episodes", "2", "--controllers", "ppo,ppo_greedy", "--no-progress",
                "--threads", "1", "--out", str(run / "eval")]  # fmt: skip
        assert evaluate_main(argv) == 0, capsys.readouterr().err[-3000:]
        res = json.loads((run / "eval" / "results.json").read_text())
        results.append({name: c["per_episode"] for name, c in res["controllers"].items()})
    assert results[0] == results[1]
    (cfg_a, a), (cfg_b, b) = load_run(new), load_run(old)
    assert cfg_a == cfg_b
    _assert_equal(a, b)


def test_init_from_an_old_checkpoint_starts_from_the_same_controller(runs, tmp_path):
    new, old = runs
    overrides = {"lifecycle.max_epochs": 2, "env.train_batches": 1, "env.val_batches": 1}
    cfgs = [preset("smoke", {**overrides, "init_from": str(run)}) for run in (new, old)]
    agents = [TrainingRun(cfg, tmp_path / f"from-{i}").agent for i, cfg in enumerate(cfgs)]
    saved = load_checkpoint(new / "checkpoint.pt")["agent"]
    for agent in agents:
        _assert_equal(saved, agent.state_dict())
