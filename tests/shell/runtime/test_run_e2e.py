"""``python -m esper.shell.run`` end to end in a subprocess (several PPO updates), resume, the heuristic
baseline, and the CLI's refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from esper.shell.common.checkpoint import load_checkpoint
from esper.shell.telemetry.events import read_events

pytestmark = pytest.mark.e2e

SMOKE = ["--preset", "smoke", "--env.n_envs", "2", "--lifecycle.max_epochs", "5"]


def _run(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "esper.shell.run", *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


def test_tiny_run_end_to_end_then_resume(tmp_path):
    # every update's explained variance is below 1: an anomaly each update, so the detail escalates
    flagged = ["--anomaly.value_schedule", "false", "--anomaly.value_collapse", "1.0"]
    out = _run(
        [*SMOKE, *flagged, "--updates", "3", "--run_dir", str(tmp_path), "--name", "r", "--report", "true"],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "r"
    for name in (
        "config.json",
        "provenance.json",
        "events.jsonl",
        "checkpoint.pt",
        "summary.txt",
        "report.md",
    ):
        assert (run / name).is_file(), name
    assert any((run / "plots").glob("*.png"))
    events = read_events(run / "events.jsonl")
    kinds = [e["event"] for e in events]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    updates = [e for e in events if e["event"] == "ppo_update"]
    assert [u["update"] for u in updates] == [1, 2, 3]
    for u in updates:
        assert u["minibatch_steps"] >= 1
        assert set(u["head_entropy"]) == {"op", "slot", "blueprint", "style", "tempo", "alpha_target",
                                          "alpha_speed", "alpha_curve"}  # fmt: skip
        # issue 47: the LSTM's health and the advantages, every update
        assert {"lstm_h_norm_mean", "lstm_h_saturated_frac", "lstm_nonfinite"} <= set(u)
        assert {"adv_mean", "adv_std", "adv_max_abs", "adv_pos_frac"} <= set(u)
        # what each head chose where it counted: one share per choice, summing to 1 where it counted
        shares = u["head_choice_share"]
        assert len(shares["op"]) == 6 and abs(sum(shares["op"]) - 1) < 1e-5
        assert len(shares["blueprint"]) == len(events[0]["blueprints"])
    epochs = [e for e in events if e["event"] == "epoch"]
    assert len(epochs) == 3 * 5 and all(len(e["val_acc"]) == 2 for e in epochs)
    assert events[0]["slots"] == epochs[0]["slot_names"] and "conv_heavy" in events[0]["blueprints"]
    for e in epochs:  # issue 47: per slot, the measured contribution and gradient ratio; the reward flags
        assert len(e["contribution"]) == len(e["grad_ratio"]) == 2
        assert all(len(row) == len(e["slot_names"]) for row in e["contribution"])
        assert all(isinstance(f, bool) for f in e["hacking"] + e["ransomware"])
    assert any(v is not None for e in epochs for row in e["contribution"] for v in row), "a seed was measured"
    episodes = [e for e in events if e["event"] == "episode"]
    assert len(episodes) == 3 * 2 and all("reward_components" in e for e in episodes)
    assert all(set(e["reward_flags"]) == {"hacking", "ransomware"} for e in episodes)
    anomalies = [e for e in events if e["event"] == "anomaly" and e["kind"] == "value_collapse"]
    assert [a["update"] for a in anomalies] == [1, 2, 3]
    detail = [e for e in events if e["event"] == "ppo_detail"]  # escalated after update 1's anomaly
    assert [d["update"] for d in detail] == [2, 3]
    assert all(len(d["steps"]["kl_approx"]) == u["minibatch_steps"] and len(d["envs"]["return"]) == 2
               for d, u in zip(detail, updates[1:]))  # fmt: skip
    assert "update" in out.stdout and "test_acc" in out.stdout, "the summary table is printed"
    threads = json.loads((run / "provenance.json").read_text())["torch_threads"]
    seed = json.loads((run / "config.json").read_text())["seed"]
    repeat = f"--seed {seed} --threads {threads} "
    assert repeat in out.stdout and repeat in (run / "summary.txt").read_text(), "how to repeat it"

    ckpt = load_checkpoint(run / "checkpoint.pt")
    assert ckpt["progress"]["update"] == 3
    saved_policy = {k: v.clone() for k, v in ckpt["agent"]["policy"].items()}
    saved_count = float(ckpt["agent"]["obs_stats"]["global"]["count"])  # the set policy's: global and slot

    resumed = _run(["--resume", str(run), "--updates", "5"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    events = read_events(run / "events.jsonl")
    starts = [e for e in events if e["event"] == "run_start"]
    assert len(starts) == 2 and starts[1]["resumed_from"] == 3
    assert [u["update"] for u in events if u["event"] == "ppo_update"] == [1, 2, 3, 4, 5]
    ckpt2 = load_checkpoint(run / "checkpoint.pt")
    assert ckpt2["progress"]["update"] == 5
    count = float(ckpt2["agent"]["obs_stats"]["global"]["count"])
    assert count > saved_count, "statistics continued, not restarted"
    assert ckpt2["learner"]["updates"] == 5
    moved = any(not torch.equal(saved_policy[k], v) for k, v in ckpt2["agent"]["policy"].items())
    assert moved


def test_heuristic_baseline_completes_an_episode_and_logs_its_choices(tmp_path):
    out = _run(
        ["--preset", "smoke", "--policy", "heuristic", "--updates", "1", "--lifecycle.max_epochs", "12",
         "--run_dir", str(tmp_path), "--name", "h"], tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    events = read_events(tmp_path / "h" / "events.jsonl")
    assert not [e for e in events if e["event"] == "ppo_update"]
    assert len([e for e in events if e["event"] == "epoch"]) == 12
    reasons = [e for e in events if e["event"] == "epoch" and e.get("reasons")]
    assert len(reasons) == 12 and all(len(e["reasons"]) == 2 for e in reasons)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ppo.lrr", "1"], "unrecognized arguments: --ppo.lrr"),
        (["--ppo.lr", "fast"], "ppo.lr: 'fast' is not a number"),
        (["--env.n_envs", "3"], "must divide env.n_envs=3"),
        (["--policy", "sarsa"], "policy must be one of"),
        (["--preset", "nope"], "invalid choice: 'nope'"),
        (["--env.task", "cifar10"], "pass --env.data_path"),
        (["--env.task", "digits", "--env.data_path", "/x"], "ships with the code"),
        (["--ppo", "1"], "unrecognized arguments: --ppo"),
        (["--ppo.n_epoch", "1"], "unrecognized arguments: --ppo.n_epoch"),
        (["--resume", "/nonexistent/run"], "not found"),
    ],
)
def test_cli_refuses_bad_options_clearly(tmp_path, capsys, args, message):
    from esper.shell.run import main

    with pytest.raises(SystemExit) as exc:
        main([*args, "--run_dir", str(tmp_path)])
    assert exc.value.code != 0
    err = capsys.readouterr().err + str(exc.value.code)
    assert message in err, err[-2000:]


def test_help_lists_every_config_field(capsys):
    from esper.shell.common.fields import fields_flat
    from esper.shell.config.presets import RunConfig
    from esper.shell.run import main

    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for name, _, _ in fields_flat(RunConfig):
        assert f"--{name}" in text, name


def test_print_config_shows_the_resolved_config(tmp_path):
    out = _run(["--preset", "smoke", "--ppo.gamma", "0.9", "--print-config"], tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    cfg = json.loads(out.stdout)
    assert cfg["ppo"]["gamma"] == 0.9 and cfg["env"]["task"] == "mnist1d"
