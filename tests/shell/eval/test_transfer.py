"""``python -m esper.shell.evaluate RUN_DIR --task T``: a run's controller evaluated zero-shot on another
task. A controller of ``ppo.policy set`` trained on the 3-slot MNIST-1D host acts on ``mnist1d_deep``'s 5
slots; a flat one is refused in one line where the host differs in shape (issue 46)."""

from __future__ import annotations

import json

import pytest
import torch

import esper.shell.run as run_mod
from esper.shell.evaluate import main
from tests.shell.runtime.test_run_safety import TINY

pytestmark = pytest.mark.e2e

PROG = "python -m esper.shell.evaluate"


@pytest.fixture(autouse=True)
def _keep_threads(monkeypatch):
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # keep this worker's thread share
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two one-update runs on mnist1d: ``set`` (the host-agnostic policy) and ``flat``."""
    root = tmp_path_factory.mktemp("runs")
    n = torch.get_num_threads()
    arms = (("set", ["--ppo.policy", "set", "--ppo.germinate_bias", "3"]), ("flat", ["--ppo.policy", "flat"]))
    for name, extra in arms:
        argv = [*TINY, *extra, "--updates", "1", "--run_dir", str(root), "--name", name]
        assert run_mod.main(argv) == 0, name
    torch.set_num_threads(n)
    return root


def test_a_set_policy_run_is_evaluated_zero_shot_on_a_host_with_five_slots(runs, capsys):
    run_dir = runs / "set"
    argv = [str(run_dir), "--task", "mnist1d_deep", "--episodes", "2", "--no-progress", "--threads", "1",
            "--controllers", "ppo,ppo_greedy,static"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    out = capsys.readouterr().out
    assert f"results: {run_dir / 'eval-mnist1d_deep' / 'results.json'}" in out
    results = json.loads((run_dir / "eval-mnist1d_deep" / "results.json").read_text())
    assert results["meta"]["task"] == "mnist1d_deep" and results["meta"]["trained_on"] == ["mnist1d"]
    # the evaluation's own revision, beside the run's (the suite's table names both per seed)
    provenance = json.loads((run_dir / "provenance.json").read_text())
    assert results["meta"]["git_rev"] == provenance["git_rev"]
    # and the machines that trained and evaluated it, one line each (cores counted)
    assert results["meta"]["machine"] == provenance["machine"] and " cores" in provenance["machine"]
    assert not (run_dir / "eval").exists()  # the run's own evaluation is left alone
    germinations = [g for e in results["controllers"]["ppo"]["per_episode"] for g in e["germinations"]]
    assert germinations, "the controller acted on the new host"
    assert all(0 <= g["slot"] < 5 for g in germinations)
    for s in results["controllers"].values():
        assert s["episodes"] == 2 and 0 <= s["test_acc_mean"] <= 100


def test_a_flat_run_on_a_host_of_another_shape_is_refused_in_one_line(runs, capsys):
    run_dir = runs / "flat"
    assert main([str(run_dir), "--task", "mnist1d_deep", "--episodes", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{PROG}: error: --task mnist1d_deep: run "), err
    assert "slots: the run's host has 3 (b0, b1, b2), this one 5" in lines[0]
    assert "--ppo.policy set" in lines[0]
    assert not (run_dir / "eval-mnist1d_deep").exists()
    assert main([str(run_dir), "--task", "mnist2d", "--episodes", "2", "--no-progress"]) == 2
    assert "--task: unknown task 'mnist2d'" in capsys.readouterr().err
