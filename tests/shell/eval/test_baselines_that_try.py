"""Baselines that try (issue 89): ``born_big`` (the static network at a plan's final size, its seeds
fossilized at alpha 1 from epoch 0), ``probe`` (a greedy what-if probe), ``heuristic_tuned_wide`` (the
heuristic's timing, blueprint and budget, chosen by Optuna since issue 105), fixed schedules that say when
and how (``grow:b0=conv_heavy:3@GATED_GATE``) and ``plan_search_timed``; each a controller name of
``evaluate`` with its compute counted, and the suite runs them only behind ``--trying``."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import pytest

from esper.core.spec import Op, Stage, Style
from esper.shell.baselines.heuristic import HeuristicController, HeuristicThresholds
from esper.shell.baselines.probe import PROBE_LIFECYCLE, ProbeController, ProbeSettings
from esper.shell.config.presets import preset
from esper.shell.env.tasks import grow_all_params, seed_params
from esper.shell.env.vecenv import VecEnv
from esper.shell.eval import search as S
from esper.shell.eval import store as ST
from esper.shell.eval import tuning as U
from esper.shell.eval.controllers import episode_spec, make_controller, parse_plan, parse_schedule
from esper.shell.eval.episodes import check_names, compare_on_config
from esper.shell.eval.runner import run_hosts
from esper.shell.host.slots import DETACHED_INPUT_STAGES

#: A few seconds an episode (as test_search's, with room for a seed to be germinated, scored and grown).
TINY = {"lifecycle.max_epochs": 4, "env.train_batches": 1, "env.val_batches": 1, "updates": 2,
        "env.n_envs": 4, "ppo.n_minibatches": 1}  # fmt: skip
LONGER = {**TINY, "lifecycle.max_epochs": 9}


@pytest.fixture(scope="module")
def cfg():
    return preset("smoke", TINY)


@pytest.fixture(scope="module")
def task(cfg):
    return cfg.env.build_task()


def _env(cfg, task, n: int = 2) -> VecEnv:
    env_cfg = dataclasses.replace(cfg.env, n_envs=n)
    return VecEnv(env_cfg, cfg.lifecycle, cfg.governor, seed=cfg.seed, task=task, reward=cfg.reward)


# ------------------------------------------------------------------------------------------ born_big
def test_born_big_seeds_are_fossilized_at_alpha_1_from_epoch_0_and_train_with_the_host(cfg, task):
    env = _env(cfg, task)
    try:
        ctl = make_controller("born_big:b0=conv_heavy+b2=depthwise", cfg, env, checkpoint=None, seed=0)
        ctl.prepare_env(env)
        ts = env.reset(0, host_seeds=[5, 6])
        for i in range(2):
            host = env.hosts.host(i)
            for s, stage in ((0, Stage.FOSSILIZED), (1, Stage.DORMANT), (2, Stage.FOSSILIZED)):
                assert host.slot(s).stage == stage
            assert host.slot(0).alpha == 1.0 and host.slot(0).blueprint == "conv_heavy"
            assert Stage.FOSSILIZED not in DETACHED_INPUT_STAGES  # it reads the live activation: trains too
        slots = ts.obs.slots
        assert slots["stage"][:, 0].tolist() == [int(Stage.FOSSILIZED)] * 2
        assert slots["alpha"][:, [0, 2]].tolist() == [[1.0, 1.0]] * 2
        assert (slots["contribution"][:, 0] != 0).any()  # measured in the first epoch: it is in the forward
        assert slots["seed_params"][0].tolist() == [400.0, 0.0, 120.0]
        assert not ts.obs.legal["slot_by_op"][:, int(Op.GERMINATE), 0].any()  # none where one is born
    finally:
        env.close()


def test_born_big_is_grow_alls_final_network_from_the_start_and_costs_no_search(cfg, task):
    names = ["grow_all", "born_big", "born_big:grow_all", "born_big:b0=conv_heavy"]
    res = compare_on_config(cfg, names, episodes=2, seed=3, show_progress=False, task=task)["controllers"]
    full = grow_all_params(task, task.make_host())
    big = res["born_big"]
    assert big["params_added_mean"] == full == 1200  # counted as grow_all's are: every seed at alpha > 0
    assert big["grown_counts"] == {"b0=conv_heavy+b1=conv_heavy+b2=conv_heavy": 2}
    assert big["n_fossilized_mean"] == 3 and all(e["germinated_at"] == [] for e in big["per_episode"])
    assert big["compute_host_epochs"] == 0 and "search" not in big
    assert res["born_big:b0=conv_heavy"]["params_added_mean"] == 400
    # born_big:CONTROLLER: that controller's most frequent plan here, its compute its source's
    own = res["born_big:grow_all"]
    plan = min(res["grow_all"]["grown_counts"], key=lambda p: (-res["grow_all"]["grown_counts"][p], p))
    assert own["search"] == {"chosen": plan, "from": "grow_all", "compute_host_epochs": 0}
    assert own["params_added_mean"] == (seed_params(task, task.make_host(), plan) if plan else 0)


def test_born_big_names_are_checked_in_one_line(cfg, task):
    check_names(["born_big", "born_big:b0=norm", "ppo_greedy", "born_big:ppo_greedy", "probe",
                 "heuristic_tuned_wide", "plan_search_timed@0.5x", "grow:b0=norm:3@GATED_GATE"])  # fmt: skip
    with pytest.raises(ValueError, match="name ppo_greedy before it"):
        check_names(["born_big:ppo_greedy", "ppo_greedy"])
    env = _env(cfg, task, n=1)
    try:
        with pytest.raises(ValueError, match="born_big takes no @BLEND"):
            make_controller("born_big@GATED_GATE", cfg, env, checkpoint=None, seed=0)
        with pytest.raises(ValueError, match="evaluate ppo before it"):
            make_controller("born_big:ppo", cfg, env, checkpoint=None, seed=0)
    finally:
        env.close()


# ------------------------------------------------------------------------------------ timed schedules
def test_a_fixed_schedule_says_when_and_how(cfg, task):
    env = _env(cfg, task, n=1)
    try:
        plan, at = parse_schedule("grow:b0=conv_heavy:3+b2=norm", env, max_epochs=4)
        assert plan == {0: env.blueprint_names.index("conv_heavy"), 2: env.blueprint_names.index("norm")}
        assert at == {0: 3}
        for bad, why in (("grow:b0=norm:0", "an integer from 1 to 4"), ("grow:b0=norm:5", "from 1 to 4"),
                         ("grow:b0=norm:x", "from 1"), ("grow:b9=norm:2", "SLOT=BLUEPRINT")):  # fmt: skip
            with pytest.raises(ValueError, match=why) as err:
                make_controller(bad, cfg, env, checkpoint=None, seed=0)
            assert "\n" not in str(err.value)
        with pytest.raises(ValueError, match="what, not when"):
            parse_plan("grow:b0=norm:2", env)
    finally:
        env.close()
    assert episode_spec("grow:b0=norm:2", cfg, task) != episode_spec("grow:b0=norm", cfg, task)  # not one
    name = "grow:b1=norm:3+b0=conv_heavy:2@GATED_GATE"
    res = compare_on_config(cfg, [name, "grow:b0=norm"], episodes=2, seed=3, show_progress=False, task=task)
    eps = res["controllers"][name]["per_episode"]
    for e in eps:  # each slot at its epoch (the gates allow it at once here), in the style asked for
        assert [(g["epoch"], g["slot"], g["style"]) for g in e["germinations"]] == [
            (2, 0, "GATED_GATE"), (3, 1, "GATED_GATE")]  # fmt: skip
    assert res["controllers"]["grow:b0=norm"]["per_episode"][0]["germinated_at"] == [1]
    assert res["controllers"][name]["compute_host_epochs"] == 0


def test_the_timed_space_starts_with_plan_searchs_and_writes_grow_names(task):
    names = ("b0", "b1", "b2")
    plain = S.plan_space(task, names, [True] * 3, seed=0)
    timed = S.timed_space(task, names, [True] * 3, seed=0, max_epochs=25)
    assert S.timed_epochs(25) == [1, 7, 13] and S.timed_epochs(4) == [1, 2, 3]
    assert timed[:7] == plain[:7] and len(set(timed)) == len(timed)
    assert len(timed) == ((1 + 7 * 3) ** 3 - 1) * len(Style)  # each slot: empty, or a blueprint at an epoch
    assert set(plain) < set(timed)  # every plain plan is there, as fast as the gates allow, LINEAR_ADD
    blueprints = list(task.make_host().blueprint_names)
    plan, at, style = S.schedule_of("b0=conv_heavy:7+b2=norm@GATED_GATE", names, blueprints)
    assert plan == {0: blueprints.index("conv_heavy"), 2: blueprints.index("norm")}
    assert at == {0: 7} and style == int(Style.GATED_GATE)
    assert S.schedule_of("b1=norm", names, blueprints)[1:] == ({}, int(Style.LINEAR_ADD))


def test_plan_search_timed_keeps_its_budget_and_reads_plan_searchs_episodes(cfg, task, tmp_path, monkeypatch):
    """Its candidates past the first are timed and styled schedules, each run as one (its own epochs and
    style per env); its first ones are plan_search's, whose kept episodes it reads."""
    calls = []

    def fake(cfg_, task_, make, host_seeds, **kw):
        host = task.make_host()
        env = SimpleNamespace(n=len(host_seeds), blueprint_names=list(host.blueprint_names),
                              slot_names=host.slot_names)  # fmt: skip
        ctl = make(env, list(range(len(host_seeds))))
        calls.append((ctl.plans, ctl.at, ctl.style))
        return [{"final_val_acc": float(len(str(p))), "params_added": 1.0} for p in ctl.plans]

    monkeypatch.setattr(ST, "run_hosts", fake)
    T = cfg.lifecycle.max_epochs
    plain = S.search(f"plan_search@{7 * T}", cfg, task, cache=tmp_path)
    timed = S.search(f"plan_search_timed@{7 * T}", cfg, task, cache=tmp_path)
    assert timed["compute_host_epochs"] == timed["episodes"] * T == 7 * T
    assert timed["episodes_reused"] == 7  # its first trials are plan_search's: each blueprint everywhere
    assert [c["plan"] for c in timed["candidates"]][:1] and timed["space"] > plain["space"]
    assert timed["chosen"] in {c["plan"] for c in timed["candidates"]}
    assert S.is_searched("plan_search_timed@2x") and S.plan_kind("plan_search_timed") == "plan_search_timed"
    at3 = episode_spec("plan_search_timed", cfg, task, {"chosen": "b0=norm:3"})
    assert at3 == episode_spec("grow:b0=norm:3", cfg, task) != episode_spec("grow:b0=norm", cfg, task)
    assert episode_spec("plan_search_timed", cfg, task, {"chosen": "b0=norm"}) == episode_spec(
        "grow:b0=norm", cfg, task)  # fmt: skip
    monkeypatch.setattr(ST, "run_hosts", run_hosts)  # real episodes: a timed schedule, one per env
    recs, _ = S.run_plans(cfg, task, [("b0=norm:3@GATED_GATE", 1), ("b1=norm", 2)], ("b0", "b1", "b2"))
    firsts = [(r["germinations"][0]["epoch"], r["germinations"][0]["style"]) for r in recs]
    assert firsts == [(3, "GATED_GATE"), (1, "LINEAR_ADD")]


# ------------------------------------------------------------------------------- the tuned searches
def _bowl(evals):
    """A known objective over an integer, a real and a category: best at x 8, y 2.0, c "a"."""

    def evaluate(points):
        evals.append(list(points))
        score = lambda p: -((p["x"] - 8) ** 2) - 4 * (math.log2(p["y"]) - 1) ** 2 - 3 * (p["c"] != "a")
        return [{"val_acc_mean": score(p)} for p in points]

    return evaluate


SPACE = [U.Param("x", 1, 20, integer=True), U.Param("y", 1 / 16, 16.0, log=True),
         U.Param("c", choices=("a", "b"))]  # fmt: skip
START = {"x": 3, "y": 1.0, "c": "b"}


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_the_tuned_search_runs_its_trials_in_batches_from_its_start_and_repeats_with_its_seed(sampler):
    """The start is the first setting run; settings run ``batch`` at a time, ``trials`` in all, each once
    (compute: settings run); the same seed gives the same search; TPE comes close to the known best."""
    evals = []
    out = U.optuna_search(SPACE, START, _bowl(evals), trials=40, seed=7, sampler=sampler, batch=8)
    assert evals[0][0] == START and all(len(b) <= 8 for b in evals)
    run = [tuple(sorted(p.items())) for b in evals for p in b]
    assert out["settings_tried"] == len(run) == len(set(run)) == len(out["points"]) == 40
    best = max(out["points"], key=lambda p: p["val_acc_mean"])
    assert out["chosen"] == best["setting"] and out["sampler"] == sampler
    again = U.optuna_search(SPACE, START, _bowl([]), trials=40, seed=7, sampler=sampler, batch=8)
    assert again == out
    if sampler == "tpe":
        assert best["val_acc_mean"] > -2.0  # near x 8, y 2, c "a" (random's bar is not asserted)


def test_the_tuned_search_ends_where_its_space_runs_out_and_clamps_its_start():
    evals = []
    out = U.optuna_search([U.Param("x", 1, 3, integer=True)], {"x": 9}, _one(evals), trials=10, seed=0)
    assert evals[0][0] == {"x": 3} and out["settings_tried"] == 3 and out["chosen"] == {"x": 2}


def _one(evals):
    def evaluate(points):
        evals.append(list(points))
        return [{"val_acc_mean": -abs(p["x"] - 2)} for p in points]

    return evaluate


def test_the_tuned_spaces_reach_what_the_widening_grid_reached():
    wide = {p.name: p for p in U.heuristic_params(("noop", "norm", "conv_heavy"), 25)}
    assert (wide["min_epoch"].low, wide["min_epoch"].high) == (1, 25) and wide["blueprint"].choices == (
        "", "norm", "conv_heavy")  # fmt: skip
    assert wide["plateau_threshold"].low <= 0.0625 and wide["plateau_threshold"].high >= 16
    assert wide["budget_share"].low <= 1 / 32 and wide["budget_share"].when == ("budgeted", True)
    probe = {p.name: p for p in U.probe_params(25)}
    assert probe["threshold"].low <= 0.125 and probe["threshold"].high >= 512 and probe["incubate"].high == 22


def test_the_old_heuristic_tuned_records_that_its_choice_is_on_its_grids_edge(cfg, task):
    res = S.tune_heuristic(cfg, task, {"min_epoch": (5, 1)}, hosts=1)
    assert res["interior"] is False and res["on_edge"] == ["min_epoch"]


# ------------------------------------------------------------------------------------------ heuristic
def test_the_heuristic_may_grow_one_blueprint_and_keep_to_a_budget(task):
    cfg = preset("smoke", {**TINY, "lifecycle.max_epochs": 6})
    costs = S.seed_costs(task)
    quick = dict(min_epoch=1, stable_epochs=0, plateau_epochs=0)
    settings = [HeuristicThresholds(**quick, blueprint="conv_heavy"),
                HeuristicThresholds(**quick, blueprint="conv_heavy", budget_share=0.25),  # 300 < 400
                HeuristicThresholds(**quick, budget_share=0.1),  # 120: the rotation's first that fits
                HeuristicThresholds(**quick)]  # fmt: skip
    make = lambda env, batch: HeuristicController(env.blueprint_names, cfg.lifecycle, per_env=settings,
                                                  costs=costs, grow_all_params=1200)  # fmt: skip
    recs = run_hosts(cfg, task, make, [1, 2, 3, 4])
    firsts = [[g["blueprint"] for g in r["germinations"]] for r in recs]
    assert firsts[0] == ["conv_heavy"] and firsts[1] == [] and firsts[2] == ["attention"]
    assert firsts[3] == ["conv_light"]  # the reference's rotation
    with pytest.raises(ValueError, match="needs the seeds' costs"):
        HeuristicController(("noop", "norm"), cfg.lifecycle, budget_share=0.5)
    with pytest.raises(ValueError, match="no blueprint 'nope'"):
        HeuristicController(("noop", "norm"), cfg.lifecycle, blueprint="nope")
    assert HeuristicThresholds(blueprint="norm").changed() == {"blueprint": "norm"}


def test_the_widened_heuristic_is_held_to_the_learned_controllers_cap(task):
    """On a capped task (a budget family, ``--budget-share``) the widened heuristic's own budget axis reached
    "none", so it could add more than the controller may: now the controller's cap bounds it whatever
    its setting says (its budget share, where smaller, still holds), in its search and its evaluation."""
    cfg = preset("smoke", {**TINY, "lifecycle.max_epochs": 6})
    costs = S.seed_costs(task)
    quick = dict(min_epoch=1, stable_epochs=0, plateau_epochs=0)
    settings = [HeuristicThresholds(**quick, blueprint="conv_heavy"),  # 400 > the cap of 300: none
                HeuristicThresholds(**quick, blueprint="conv_heavy", budget_share=1.0),  # 1,200: none
                HeuristicThresholds(**quick, budget_share=0.1),  # 120 < 300: its own, smaller, holds
                HeuristicThresholds(**quick)]  # fmt: skip
    make = lambda env, batch: HeuristicController(env.blueprint_names, cfg.lifecycle, per_env=settings,
                                                  costs=costs, grow_all_params=1200, cap=300)  # fmt: skip
    recs = run_hosts(cfg, task, make, [1, 2, 3, 4])
    firsts = [[g["blueprint"] for g in r["germinations"]] for r in recs]
    assert firsts[0] == [] and firsts[1] == [] and firsts[2] == ["attention"]
    assert all(r["params_added"] <= 300 for r in recs) and firsts[3][:1] == ["conv_light"]
    with pytest.raises(ValueError, match="a cap is a positive number"):
        HeuristicController(("noop", "norm"), cfg.lifecycle, cap=100)  # no costs to read it with
    with pytest.raises(ValueError, match="not the gain trigger"):
        HeuristicController(("noop", "norm"), cfg.lifecycle, cap=100, costs=[[0, 1]], gain_trigger=0.1)
    capped = preset("smoke", {**TINY, "ppo.param_cap_share": 0.25})
    env = _env(capped, task)
    wide = make_controller("heuristic_tuned_wide", capped, env, checkpoint=None, seed=0,
                           searched={"chosen": {}})  # fmt: skip
    assert wide.cap == S.prices(capped, task).budget < S.prices(capped, task).grow_all
    assert make_controller("heuristic_tuned_wide", cfg, _env(cfg, task), checkpoint=None, seed=0,
                           searched={"chosen": {}}).cap == S.prices(cfg, task).budget  # fmt: skip


# ---------------------------------------------------------------------------------------------- probe
def test_the_probe_incubates_scores_by_what_if_gain_and_grows_greedily_within_its_budget(task):
    cfg = preset("smoke", LONGER)
    assert cfg.lifecycle.g2_evidence == "host"  # the probe asks for what-if readings all the same
    costs = S.seed_costs(task)
    made = []
    settings = [ProbeSettings(threshold=-100.0, incubate=2), ProbeSettings(threshold=1e9, incubate=2),
                ProbeSettings(threshold=-100.0, incubate=2, score="absolute"), ProbeSettings()]  # fmt: skip

    def make(env, batch):
        made.append(ProbeController(env.blueprint_names, cfg.lifecycle, costs, unit=400.0, budget=520.0,
                                    per_env=settings))  # fmt: skip
        return made[-1]

    recs = run_hosts(cfg, task, make, [1, 2, 3, 4])
    rounds = [st["scores"] for st in made[0].state]
    for r, st in zip(recs, made[0].state, strict=True):  # the first round: the largest in each slot
        assert [g["blueprint"] for g in r["germinations"]][:3] == ["conv_heavy"] * 3
        assert st["spent"] <= 520 and r["params_added"] <= 520
    assert any(row["gain"] != 0 for r in rounds for row in r[0])  # what-if readings; G2 reads the host's
    for r in rounds:  # scored in order, best first; equal costs (unit 400): per parameter is the gain
        assert [row["score"] for row in r[0]] == sorted((row["score"] for row in r[0]), reverse=True)
        assert all(row["score"] == pytest.approx(row["gain"]) for row in r[0])
    verdicts = [row["verdict"] for row in rounds[0][0]]
    assert verdicts == ["kept", "over budget", "over budget"]  # the best; a second does not fit 520
    assert [row["verdict"] for row in rounds[1][0]] == ["below"] * 3 and made[0].state[1]["spent"] == 0
    assert recs[1]["params_added"] == 0 and recs[1]["n_pruned"] == 3  # every candidate pruned
    with pytest.raises(ValueError, match="score must be one of"):
        ProbeSettings(score="gradient")


def test_probe_and_heuristic_tuned_wide_search_on_training_hosts_at_counted_compute(cfg, task, tmp_path,
                                                                                    monkeypatch):  # fmt: skip
    monkeypatch.setattr(S, "TUNE_HOSTS", 1)
    monkeypatch.setattr(U, "TUNE_TRIALS", {"probe": 3, "heuristic_tuned_wide": 3})
    T = cfg.lifecycle.max_epochs
    names = ["static", "probe", "heuristic_tuned_wide@random"]
    res = compare_on_config(cfg, names, episodes=2, seed=3, show_progress=False, task=task,
                            search_cache=tmp_path)  # fmt: skip
    ctl = res["controllers"]
    for name in ("probe", "heuristic_tuned_wide@random"):
        s = ctl[name]["search"]
        assert ctl[name]["compute_host_epochs"] == s["settings_tried"] * 1 * T == s["compute_host_epochs"] > 0
        assert s["episodes"] == s["settings_tried"] == 3 and len(s["points"]) == s["settings_tried"]
        assert s["selection"]["split"] == "validation"
        assert json.loads((tmp_path / f"{name}.json").read_text())["result"]["chosen"] == s["chosen"]
    assert ctl["probe"]["search"]["sampler"] == "tpe"
    wide = ctl["heuristic_tuned_wide@random"]["search"]
    assert wide["sampler"] == "random" and set(wide["chosen"]) == set(HeuristicThresholds.__slots__)
    assert ctl["probe"]["search"]["budget_params"] is None  # the smoke preset's controller has no budget
    assert "plan_search_budgets" in res["meta"] and res["meta"]["plan_search_budgets"] == {}


def test_the_probe_keeps_to_the_learned_controllers_budget(task):
    capped = preset("smoke", {**TINY, "ppo.param_cap_share": 0.6})
    assert S.learner_budget(capped, task) == pytest.approx(720.0)
    soft = preset("smoke", {**TINY, "reward.param_budget_share": 0.5})
    assert S.learner_budget(soft, task) == pytest.approx(600.0)
    assert S.learner_budget(preset("smoke", TINY), task) == math.inf


def test_the_probe_holds_its_candidates_at_alpha_0_under_a_lifecycle_that_advances_by_itself(task):
    """Under ``auto_advance`` (the default preset's) the lifecycle would blend every candidate G2 passes:
    the probe's env runs without it, and reads what-if gains on batch statistics; nothing else changes."""
    cfg = preset("smoke", {**TINY, "lifecycle.auto_advance": True})
    env = _env(cfg, task, n=1)
    try:
        ctl = ProbeController(env.blueprint_names, cfg.lifecycle, S.seed_costs(task), unit=400.0)
        ctl.prepare_env(env)
        assert env.measure_whatif and not env.lifecycle.auto_advance and not ctl.lc.auto_advance
        assert env.lifecycle.whatif_statistics == "batch" == ctl.lc.whatif_statistics
        back = {k: getattr(cfg.lifecycle, k) for k in PROBE_LIFECYCLE}
        assert dataclasses.replace(env.lifecycle, **back) == cfg.lifecycle  # nothing else changed
    finally:
        env.close()


@pytest.mark.parametrize("name", [S.PROBE, S.HEURISTIC_TUNED_WIDE])
def test_issue102_a_tuned_search_counts_each_setting_on_each_of_its_hosts(cfg, task, monkeypatch, name):
    """The compute of ``probe`` (and of the widened heuristic) is every setting it tried, on each of its
    training hosts, for a whole episode: settings x hosts x ``max_epochs`` host epochs. The search is
    stubbed (5 settings); 3 hosts, so the host factor is not 1 as in the test above."""
    monkeypatch.setattr(S, "TUNE_HOSTS", 3)
    seen = []

    def tried(cfg, task, host_seeds, priced, *rest, **kw):
        seen.append(list(host_seeds))
        return {"chosen": {}, "settings_tried": 5, "points": [], "axes": {}}

    monkeypatch.setattr(S, "tune_probe", tried)
    monkeypatch.setattr(S, "tune_heuristic_wide", tried)
    out = S._tune(name, cfg, task)
    assert seen == [S.selection_host_seeds(cfg, 3)] and len(seen[0]) == 3
    assert out["episodes"] == 5 * 3
    assert out["compute_host_epochs"] == 5 * 3 * cfg.lifecycle.max_epochs
