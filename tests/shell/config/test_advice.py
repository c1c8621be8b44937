"""Warnings at config resolution (esper.shell.config.advice, issue 92): one line per legal but
suspicious setting, none for any preset, silenced by ``--warnings false``."""

from __future__ import annotations

import pytest

from esper.shell import run
from esper.shell.config.advice import print_warnings, suspicious_settings
from esper.shell.config.presets import PRESETS, preset

NEEDS_DATA = {"cifar10": "/data/cifar-10-batches-bin", "tinystories": "/data/TinyStories.txt"}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_no_preset_raises_a_warning(name):
    extra = {"env.data_path": NEEDS_DATA[name]} if name in NEEDS_DATA else None
    assert suspicious_settings(preset(name, extra)) == []


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"ppo.gamma": 0.8}, "ppo.gamma 0.8"),
        ({"ppo.clip_epsilon": 0.5}, "ppo.clip_epsilon 0.5"),
        ({"ppo.entropy_coef": 0.5}, "ppo.entropy_coef 0.5"),
        ({"ppo.entropy_coef_end": 0.2}, "ppo.entropy_coef_end 0.2"),
        ({"ppo.lr": 0.05}, "ppo.lr 0.05"),
        ({"ppo.gae_lambda": 0.5}, "ppo.gae_lambda 0.5"),
        ({"ppo.n_epochs": 20, "ppo.target_kl": None}, "ppo.n_epochs 20 with no ppo.target_kl"),
        ({"ppo.max_grad_norm": 100.0}, "ppo.max_grad_norm 100"),
    ],
)
def test_each_suspicious_setting_is_one_line_naming_it(override, field):
    found = suspicious_settings(preset("smoke", override))
    assert len(found) == 1 and found[0].startswith(field), found
    assert "\n" not in found[0]


def test_many_epochs_with_a_kl_stop_is_not_suspicious():
    assert suspicious_settings(preset("smoke", {"ppo.n_epochs": 20, "ppo.target_kl": 0.02})) == []


def test_the_heuristic_uses_no_ppo_settings_and_is_not_warned_about_them():
    assert suspicious_settings(preset("smoke", {"policy": "heuristic", "ppo.gamma": 0.5})) == []


def test_the_cli_prints_each_warning_once_on_stderr_and_warnings_false_silences_them(capsys):
    args = ["--preset", "smoke", "--ppo.gamma", "0.8", "--ppo.lr", "0.1", "--print-config"]
    assert run.main(args) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[2].split()[0] for line in err] == ["ppo.gamma", "ppo.lr"], err
    assert all(line.startswith("esper: warning: ") for line in err)
    assert run.main([*args, "--warnings", "false"]) == 0
    assert capsys.readouterr().err == ""


def test_print_warnings_returns_what_it_printed(capsys):
    cfg = preset("smoke", {"ppo.gamma": 0.5})
    lines = print_warnings(cfg)
    assert capsys.readouterr().err.splitlines() == lines and len(lines) == 1


def test_a_run_with_a_suspicious_setting_says_so_once_and_goes_on(tmp_path, capsys):
    args = ["--preset", "smoke", "--updates", "1", "--ppo.gamma", "0.85", "--run_dir", str(tmp_path)]
    args += ["--name", "w"]
    assert run.main(args) == 0
    err = capsys.readouterr().err
    assert err.count("esper: warning: ppo.gamma 0.85") == 1
    assert (tmp_path / "w" / "checkpoint.pt").is_file()
