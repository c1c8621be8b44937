"""``python -m esper.shell.evaluate RUN_DIR``: a trained controller and the baselines on fresh hosts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from esper.core.spec import HEADS, Style, Tempo
from esper.shell.eval.controllers import CONTROLLERS
from esper.shell.eval.episodes import compare_controllers
from esper.shell.evaluate import main

pytestmark = pytest.mark.e2e

RUN = ["--preset", "smoke", "--env.n_envs", "2", "--lifecycle.max_epochs", "4", "--updates", "1"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    out = subprocess.run(
        [sys.executable, "-m", "esper.shell.run", *RUN, "--run_dir", str(root), "--name", "r"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return root / "r"


def test_evaluate_cli_writes_results_report_and_plots(run_dir):
    out = subprocess.run(
        [sys.executable, "-m", "esper.shell.evaluate", str(run_dir), "--episodes", "3", "--seed", "5",
         "--threads", "1", "--no-progress"], capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "static: test acc" in out.stdout
    results = json.loads((run_dir / "eval" / "results.json").read_text())
    assert list(results["controllers"]) == list(CONTROLLERS)
    for name, s in results["controllers"].items():
        assert s["episodes"] == 3, name
        lo, hi = s["test_acc_ci95"]
        assert lo <= s["test_acc_mean"] <= hi and 0 <= s["test_acc_mean"] <= 100
        assert isinstance(s["params_added_mean"], float) and s["params_added_mean"] >= 0
        assert len(s["per_episode"]) == 3
    static = results["controllers"]["static"]
    assert static["params_added_mean"] == 0
    seeds = {name: [e["host_seed"] for e in s["per_episode"]] for name, s in results["controllers"].items()}
    assert all(v == seeds["static"] for v in seeds.values())  # every controller meets the same hosts
    corr = results["correlations"]
    assert corr["n_episodes"] == 3 * len(CONTROLLERS) and "return_vs_test_acc" in corr
    assert "ppo_greedy" in results["meta"]["ppo_acts"] and results["meta"]["trained_updates"] == 1
    assert results["meta"]["torch_threads"] == 1 and "--seed 5 --threads 1 " in out.stdout  # how to repeat it
    assert static["grown_counts"] == {"": 3} and static["first_germination_mean"] is None
    for s in results["controllers"].values():  # what was grown: a count per final plan, every episode once
        assert sum(s["grown_counts"].values()) == 3
        assert [e["grown"] for e in s["per_episode"]].count("") == s["grown_counts"].get("", 0)
    report = (run_dir / "eval" / "report.md").read_text()
    assert "| grow_all |" in report and "Spearman" in report
    assert "What each controller grew" in report and "| static | `none` (3) | - |" in report
    for plot in ("acc_vs_params.png", "acc_over_epochs.png"):
        assert (run_dir / "eval" / "plots" / plot).stat().st_size > 1000


def test_out_puts_the_evaluation_elsewhere_and_ppo_mixed_meets_the_same_hosts(run_dir, tmp_path, monkeypatch,
                                                                                capsys):  # fmt: skip
    """``--out DIR``: another evaluation of the same run (``ppo_mixed`` here) goes to DIR and leaves
    ``RUN_DIR/eval`` alone; ``ppo_mixed`` is evaluated on the hosts ``ppo`` meets."""
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # keep this worker's thread share
    snapshot = lambda: {p: p.read_bytes() for p in (run_dir / "eval").rglob("*") if p.is_file()}
    before = snapshot()
    out = tmp_path / "more"
    argv = [str(run_dir), "--episodes", "2", "--seed", "4", "--controllers", "ppo,ppo_mixed", "--out"]
    assert main([*argv, str(out), "--no-progress"]) == 0
    assert f"results: {out / 'results.json'}" in capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert list(results["controllers"]) == ["ppo", "ppo_mixed"] and (out / "report.md").exists()
    hosts = {n: [e["host_seed"] for e in c["per_episode"]] for n, c in results["controllers"].items()}
    assert hosts["ppo"] == hosts["ppo_mixed"]
    assert "ppo_mixed samples the op and slot heads" in results["meta"]["ppo_acts"]
    assert snapshot() == before


def test_evaluation_is_reproducible_and_other_seeds_give_other_hosts(run_dir):
    names = ["ppo", "ppo_greedy", "random"]
    a = compare_controllers(run_dir, episodes=2, seed=9, controllers=names, show_progress=False)
    b = compare_controllers(run_dir, episodes=2, seed=9, controllers=names, show_progress=False)
    c = compare_controllers(run_dir, episodes=2, seed=10, controllers=["ppo"], show_progress=False)

    def eps(r, name):
        per_episode = r["controllers"][name]["per_episode"]
        return [(e["host_seed"], e["final_test_acc"], e["return"]) for e in per_episode]

    for name in names:  # the sampled controller too: its generator derives from the evaluation seed
        assert eps(a, name) == eps(b, name), name
    assert {e[0] for e in eps(a, "ppo")}.isdisjoint({e[0] for e in eps(c, "ppo")})


def test_ppo_samples_its_policy_and_ppo_greedy_takes_the_mode(run_dir):
    """A policy that germinates at some epoch early on, but at no particular one, can keep WAIT as its
    most likely op at every epoch: greedy, it never grows. ``ppo`` is the policy as trained (sampled);
    ``ppo_greedy`` is reported next to it (a default-task training run, seed 0, ended training with 352
    parameters added per sampled episode while its greedy held-out hosts added none)."""
    from esper.shell.common.checkpoint import load_checkpoint
    from esper.shell.common.fields import from_dict
    from esper.shell.config.presets import RunConfig
    from esper.shell.env.vecenv import VecEnv
    from esper.shell.eval.controllers import make_controller

    cfg = from_dict(RunConfig, json.loads((run_dir / "config.json").read_text()))
    ckpt = load_checkpoint(run_dir / "checkpoint.pt")
    env = VecEnv(cfg.env, cfg.lifecycle, cfg.governor, seed=cfg.seed)
    try:
        sampled = make_controller("ppo", cfg, env, checkpoint=ckpt, seed=1)
        greedy = make_controller("ppo_greedy", cfg, env, checkpoint=ckpt, seed=1)
        mixed = make_controller("ppo_mixed", cfg, env, checkpoint=ckpt, seed=1)
    finally:
        env.close()
    assert sampled.deterministic is False and greedy.deterministic is True
    # ppo_mixed: sampled when and where, the mode of what and how
    assert set(mixed.deterministic) == set(HEADS) - {"op", "slot"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--episodes", "1"], "--episodes must be >= 2"),
        (["--controllers", "ppo,greedy"], "unknown controller"),
        (["--controllers", "grow_all:conv_huge"], "no blueprint 'conv_huge'"),
        (["--threads", "-1"], "--threads must be >= 0"),
    ],
)
def test_evaluate_refuses_bad_requests_in_one_line(run_dir, capsys, args, message):
    assert main([str(run_dir), "--no-progress", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_evaluate_needs_a_run_directory(tmp_path, capsys):
    assert main([str(tmp_path / "nope")]) == 2
    assert "config.json not found" in capsys.readouterr().err


def test_plan_controller_grows_only_the_planned_slots_with_their_blueprints():
    """``grow:b0=conv_heavy+b2=depthwise``: the fixed placement germinates exactly those two seeds (and
    nothing in b1), each with its own blueprint, in slot order; bad plans are refused in one line."""
    from esper.shell.config.presets import preset
    from esper.shell.env.rollout import EpisodeRunner
    from esper.shell.env.vecenv import VecEnv
    from esper.shell.eval.controllers import make_controller, parse_plan
    from esper.shell.eval.episodes import summarize
    from esper.shell.eval.output import _blend

    cfg = preset("smoke", {"env.n_envs": 2, "lifecycle.max_epochs": 4})
    env = VecEnv(cfg.env, cfg.lifecycle, cfg.governor, seed=cfg.seed, reward=cfg.reward, gamma=cfg.ppo.gamma)
    try:
        bp = env.blueprint_names
        assert parse_plan("grow:b0=conv_heavy+b2=depthwise", env) == {
            0: bp.index("conv_heavy"),
            2: bp.index("depthwise"),
        }
        for bad, msg in [
            ("grow:", "empty plan"),
            ("grow:b7=conv_heavy", "not SLOT=BLUEPRINT"),
            ("grow:b0=conv_huge", "no blueprint"),
            ("grow:b0=noop", "no blueprint"),
            ("grow:b0=norm+b0=norm", "planned twice"),
            ("grow:b0", "not SLOT=BLUEPRINT"),
        ]:
            with pytest.raises(ValueError, match=msg):
                parse_plan(bad, env)
        ctl = make_controller("grow:b0=conv_heavy+b2=depthwise", cfg, env, checkpoint=None, seed=0)
        runner = EpisodeRunner(env, ctl)
        result = runner.run(0, host_seeds=[11, 12])
    finally:
        env.close()
    germinated = sorted((e["env"], e["epoch"], e["slot"], e["blueprint"]) for e in result.lifecycle
                        if e["kind"] == "germinated")  # fmt: skip
    plan = ((1, 0, "conv_heavy"), (2, 2, "depthwise"))  # (epoch, slot, blueprint), in slot order
    assert germinated == [(i, *step) for i in (0, 1) for step in plan]
    # the episode summary says when it germinated, and what its final host holds in the plan's notation
    assert [ep["germinated_at"] for ep in result.episodes] == [[1, 2], [1, 2]]
    # and how each germination blends: the fixed schedule's style, tempo and alpha target
    for ep in result.episodes:
        assert [(g["epoch"], g["slot"], g["blueprint"]) for g in ep["germinations"]] == list(plan)
        assert {(g["style"], g["tempo"], g["alpha_target"]) for g in ep["germinations"]} == {
            ("LINEAR_ADD", "FAST", 1.0)
        }
    summary = summarize([{**ep, "controller": "grow", "episode": i, "val_acc_curve": [0.0],
                          "test_objective": 0.0} for i, ep in enumerate(result.episodes)])  # fmt: skip
    want = {"style": {"LINEAR_ADD": 4}, "tempo": {"FAST": 4}, "alpha_target": {"1.0": 4}}
    assert summary["blend_counts"] == want
    assert _blend(summary) == "LINEAR_ADD 100 %, FAST 100 %, alpha 1.0 100 %"
    live = [[True, False, True], [False, False, False]]
    blueprint = [[bp.index("conv_heavy"), 0, bp.index("depthwise")], [0, 0, 0]]
    assert runner._grown(live, blueprint) == ["b0=conv_heavy+b2=depthwise", ""]


def _play_fixed_schedule(name, *, refused, max_epochs, check=None):
    """The germinations of one smoke episode (hosts 11, 12) under the fixed schedule ``name``, after
    checking that each ``(bad name, message)`` in ``refused`` is refused with that message and calling
    ``check(make)`` with a factory ``make(name)`` for controllers on the same env."""
    from esper.shell.config.presets import preset
    from esper.shell.env.rollout import EpisodeRunner
    from esper.shell.env.vecenv import VecEnv
    from esper.shell.eval.controllers import make_controller

    cfg = preset("smoke", {"env.n_envs": 2, "lifecycle.max_epochs": max_epochs})
    env = VecEnv(cfg.env, cfg.lifecycle, cfg.governor, seed=cfg.seed, reward=cfg.reward, gamma=cfg.ppo.gamma)
    make = lambda n: make_controller(n, cfg, env, checkpoint=None, seed=0)
    try:
        if check is not None:
            check(make)
        for bad, msg in refused:
            with pytest.raises(ValueError, match=msg):
                make(bad)
        ctl = make(name)
        runner = EpisodeRunner(env, ctl)
        return runner.run(0, host_seeds=[11, 12]).episodes[0]["germinations"]
    finally:
        env.close()


def test_a_fixed_schedule_blends_with_the_style_its_name_ends_in():
    """``grow:b0=conv_heavy@LINEAR_MULTIPLY`` germinates as the plan says but blends LINEAR_MULTIPLY, so a
    learned controller's style can be held against the fixed schedule's; bad styles are refused."""

    def check(make):
        assert make("grow_all").style == int(Style.LINEAR_ADD)
        assert make("grow_all@gated_gate").style == int(Style.GATED_GATE)

    germinations = _play_fixed_schedule(
        "grow:b0=conv_heavy@LINEAR_MULTIPLY",
        refused=[
            ("grow:b0=conv_heavy@SIDEWAYS", "no blend setting 'SIDEWAYS'"),
            ("random@LINEAR_ADD", "only grow_all and grow: placements"),
        ],
        max_epochs=3,
        check=check,
    )
    assert [(g["slot"], g["blueprint"], g["style"]) for g in germinations] == [
        (0, "conv_heavy", "LINEAR_MULTIPLY")
    ]


def test_a_fixed_schedule_takes_the_tempo_and_alpha_target_its_name_ends_in():
    """``grow:b0=conv_heavy@STANDARD@0.7`` blends LINEAR_ADD at tempo STANDARD to alpha 0.7: a learned
    controller's blend can be replayed on the fixed placement, one setting at a time; unknown settings,
    alpha targets off the action grid and a setting given twice are refused."""

    def check(make):
        plain = make("grow_all")
        assert (plain.style, plain.tempo, plain.alpha_target) == (int(Style.LINEAR_ADD), int(Tempo.FAST), 2)
        mixed = make("grow_all@0.5@slow@GATED_GATE")
        assert (mixed.style, mixed.tempo, mixed.alpha_target) == (int(Style.GATED_GATE), int(Tempo.SLOW), 0)

    germinations = _play_fixed_schedule(
        "grow:b0=conv_heavy@STANDARD@0.7",
        refused=[
            ("grow:b0=conv_heavy@0.6", "no blend setting '0.6'"),
            ("grow:b0=conv_heavy@FAST@SLOW", "gives the tempo twice"),
            ("grow:b0=conv_heavy@", "no blend setting ''"),
        ],
        max_epochs=4,
        check=check,
    )
    assert [(g["slot"], g["style"], g["tempo"], g["alpha_target"]) for g in germinations] == [
        (0, "LINEAR_ADD", "STANDARD", 0.7)
    ]
