"""bench.suite.lifecycle_swap: trained controllers on the same hosts under two lifecycles."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.suite import lifecycle_swap

pytestmark = pytest.mark.e2e

RUN = ["--preset", "smoke", "--env.n_envs", "2", "--lifecycle.max_epochs", "4", "--updates", "1"]


@pytest.fixture(scope="module")
def arm_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("arm")
    out = subprocess.run(  # the smoke preset's task is mnist1d
        [sys.executable, "-m", "esper.shell.run", *RUN, "--run_dir", str(root / "mnist1d"), "--name", "s7"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    (root / "mnist1d" / "s7").rename(root / "mnist1d" / "seed7")
    return root


def test_the_swap_pairs_the_same_hosts_under_both_lifecycles(arm_dir, tmp_path, capsys):
    out = tmp_path / "swap.json"
    assert lifecycle_swap.main([
        str(arm_dir), "--tasks", "mnist1d", "--first-seed", "7", "--seeds", "1", "--episodes", "2",
        "--set", "lifecycle.g2_evidence=what_if", "--set", "lifecycle.g2_min_gain=0.25",
        "--controllers", "ppo_greedy,static", "--out", str(out), "--eval-seed", "40", "--data-seed", "90",
        "--plus-seed",
    ]) == 0  # fmt: skip
    rec = json.loads(out.read_text())
    assert rec["sets"] == {"g2_evidence": "what_if", "g2_min_gain": 0.25}
    run = rec["runs"]["mnist1d/seed7"]
    assert (run["eval_seed"], run["data_seed"]) == (47, 97)  # fresh hosts and draw per training seed
    static = run["controllers"]["static"]
    # the static host has no seed: the lifecycle cannot change it, so the hosts are the same ones
    base = static["base"]["test_acc"]
    assert base == static["swapped"]["test_acc"] and len(base) == 2
    assert set(run["controllers"]["ppo_greedy"]) == {"base", "swapped"}
    printed = capsys.readouterr().out
    assert "| pooled over 1 runs | `static` | | | **+0.00**" in printed


def test_a_base_set_changes_both_arms_and_a_stopped_swap_goes_on(arm_dir, tmp_path, monkeypatch, capsys):
    """``--base-set`` moves the base arm off the run's own lifecycle (both arms carry it), and a second
    call with the same settings and ``--out`` keeps the runs the record holds instead of measuring them
    again; other settings on the same record are refused."""
    out = tmp_path / "swap.json"
    args = [str(arm_dir), "--tasks", "mnist1d", "--first-seed", "7", "--seeds", "1", "--episodes", "1",
            "--base-set", "lifecycle.g2_evidence=either", "--set", "lifecycle.whatif_statistics=batch",
            "--controllers", "static", "--out", str(out)]  # fmt: skip
    seen = []
    real = lifecycle_swap.swap

    def spy(run, sets, *a, **kw):
        seen.append((sets, kw["base_sets"]))
        return real(run, sets, *a, **kw)

    monkeypatch.setattr(lifecycle_swap, "swap", spy)
    assert lifecycle_swap.main(args) == 0
    assert seen == [({"whatif_statistics": "batch"}, {"g2_evidence": "either"})]
    rec = json.loads(out.read_text())
    assert rec["base_sets"] == {"g2_evidence": "either"} and rec["sets"] == {"whatif_statistics": "batch"}
    assert lifecycle_swap.main(args) == 0  # the record holds the run: nothing measured again
    assert len(seen) == 1 and json.loads(out.read_text())["runs"] == rec["runs"]
    assert "mnist1d/seed7: kept from" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="other settings"):
        lifecycle_swap.main([*args[:-2], "--episodes", "2", "--out", str(out)])


def test_the_swap_changes_the_lifecycle_only():
    assert lifecycle_swap.parse_sets(["lifecycle.auto_advance=false", "lifecycle.holding_timeout=3"]) == {
        "auto_advance": False, "holding_timeout": 3}  # fmt: skip
    for bad, message in (("ppo.lr=0.1", "lifecycle field"), ("lifecycle.nope=1", "lifecycle field"),
                         ("lifecycle.auto_advance=yes", "true or false")):  # fmt: skip
        with pytest.raises(SystemExit, match=message):
            lifecycle_swap.parse_sets([bad])
    with pytest.raises(SystemExit, match="at least one"):
        lifecycle_swap.parse_sets([])


def test_episodes_at_chance_are_counted_against_the_tasks_chance():
    assert lifecycle_swap.at_chance([50.0, 64.9, 65.0, 93.0], 50.0) == 2
    assert lifecycle_swap.at_chance([20.0, 26.0], 10.0) == 1
