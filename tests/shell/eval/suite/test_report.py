"""The suite's tables (issue 45): the goals read off each task, the verdict over the tasks, the arm kept
beside the judged one, the transfer goal (issue 46), the configuration sentence, the plots and their
colours; and the table the README quotes renders from its committed JSON byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esper.shell.eval.suite.report import color
from esper.shell.eval.suite.tasks import (
    BORN_OWN,
    CAP_SEARCH,
    FOSSILIZING,
    IN_CAP,
    OWN_PLAN,
    PLAN_MULTIPLES,
    SUITE,
    TRYING,
    beside_readout,
    plan_name,
)

REPO = Path(__file__).resolve().parents[4]


def test_transfer_goal_reads_the_gain_share_and_the_disjoint_intervals():
    """Issue 46's goal: the judged readout holds at least 0.80 of grow_all's gain over static and is
    above static, random and both heuristics with disjoint intervals; either half alone is not met."""
    from esper.shell.eval.suite.report import _goal_lines, goals, transfer_verdict

    def row(mean, half=1.0):
        return {"test_acc_mean": mean, "test_acc_ci95": [mean - half, mean + half],
                "params_added_mean": 100.0}  # fmt: skip

    base = {"static": row(45.0), "random": row(60.0), "heuristic": row(46.0), "heuristic_tuned": row(67.0),
            "grow_all": row(85.0), plan_name(1.0): row(84.5)}  # fmt: skip
    met = goals({**base, "ppo_greedy": row(79.0, 6.0)})
    assert met["ppo_greedy"]["gain_share"] == pytest.approx(34.0 / 40.0)
    assert "**met** (0.85 of the gain, above all four)" in transfer_verdict(met, "ppo_greedy")
    assert "0.85 of `grow_all`'s gain over `static`" in _goal_lines(met)[0]
    low = goals({**base, "ppo_greedy": row(76.0, 1.0)})  # disjoint, but 0.78 of the gain
    assert "**not met** (0.78 of the gain, above all four)" in transfer_verdict(low, "ppo_greedy")
    wide = goals({**base, "ppo_greedy": row(79.0, 12.0)})  # the share, but overlapping heuristic_tuned
    assert "**not met** (0.85 of the gain, not above all four)" in transfer_verdict(wide, "ppo_greedy")
    no_grow_all = goals({k: v for k, v in base.items() if k != "grow_all"} | {"ppo_greedy": row(79.0)})
    assert no_grow_all["ppo_greedy"]["gain_share"] is None
    assert "not judged" in transfer_verdict(no_grow_all, "ppo_greedy")


def test_the_gap_to_plan_search_splits_into_the_cap_the_plan_and_the_growing():
    """Where ``ppo_greedy`` trails ``plan_search@1x``, the three readings split the gap: the search's lack
    of a cap (against its best plan within the cap), that plan against the controller's own (both grown
    as fixed plans), and how the controller grew its own plan; the three add up to the gap."""
    from esper.shell.eval.suite.report import _goal_lines, goals

    def row(mean):
        return {"test_acc_mean": mean, "test_acc_ci95": [mean - 1, mean + 1], "params_added_mean": 0.0}

    ctl = {"ppo_greedy": row(82.1), plan_name(1.0): row(84.5), OWN_PLAN: row(84.1), IN_CAP: row(83.0),
           FOSSILIZING: row(83.7), "static": row(45.0), "grow_all": row(85.0)}  # fmt: skip
    g = goals(ctl)["ppo_greedy"]
    split = g["gap_split"]
    assert split["cap"] == pytest.approx(1.5) and split["plan_within_cap"] == pytest.approx(-1.1)
    assert split["growing"] == pytest.approx(2.0) and split["fossilizing_recovers"] == pytest.approx(1.6)
    assert split["cap"] + split["plan_within_cap"] + split["growing"] == pytest.approx(
        -g["minus_plan_search_equal_compute"]
    )
    line = _goal_lines({"ppo_greedy": g})[0]
    assert "+1.5 are the search's lack of a cap" in line and f"`{IN_CAP}`" in line
    without = goals({k: v for k, v in ctl.items() if k != IN_CAP})["ppo_greedy"]["gap_split"]
    assert "cap" not in without and without["plan"] == pytest.approx(0.4)


def test_the_search_within_the_cap_is_reported_beside_the_goal_not_for_it():
    """``plan_search_cap@1x`` (the same search at equal compute, over only the plans within the controller's
    cap) is evaluated wherever the controller has a cap, and its distance is reported next to the issue's
    goal, which stays against ``plan_search@1x``."""
    import dataclasses

    from esper.shell.config.presets import preset
    from esper.shell.eval.suite.report import _goal_lines, goals
    from esper.shell.eval.suite.tasks import controllers_for

    capped = preset("default")
    assert capped.ppo.param_cap_share > 0 and CAP_SEARCH in controllers_for(capped)
    uncapped = dataclasses.replace(capped, ppo=dataclasses.replace(capped.ppo, param_cap_share=0.0))
    assert CAP_SEARCH not in controllers_for(uncapped)  # nothing to search within: it would be refused
    assert set(controllers_for(capped)) - set(controllers_for(uncapped)) == {CAP_SEARCH}

    def row(mean):
        return {"test_acc_mean": mean, "test_acc_ci95": [mean - 1, mean + 1], "params_added_mean": 0.0}

    ctl = {"ppo_greedy": row(82.1), plan_name(1.0): row(84.5), CAP_SEARCH: row(82.9)}
    g = goals(ctl)["ppo_greedy"]
    assert g["within_1_of_plan_search"] is False  # the goal as the issue writes it
    assert g["minus_plan_search_cap_equal_compute"] == pytest.approx(-0.8)
    assert g["within_1_of_plan_search_cap"] is True
    line = _goal_lines({"ppo_greedy": g})[0]
    assert "(**trails**: diagnose)" in line
    assert f"-0.8 against the same search within the controller's cap, `{CAP_SEARCH}` (within 1 point" in line
    without = goals({k: v for k, v in ctl.items() if k != CAP_SEARCH})["ppo_greedy"]
    assert "minus_plan_search_cap_equal_compute" not in without


def test_the_suite_verdict_reads_each_tasks_goals_first_on_every_task_second_on_half():
    """The goals over the suite: the first met only where every task meets it, the second where at least
    half of the tasks do (3 of 5), against ``plan_search@1x``, and the same read against the search within
    the cap beside it; the tasks that meet each are named, in words too."""
    from esper.shell.eval.suite.report import suite_verdict, verdict_lines

    def row(mean, half=1.0):
        return {"test_acc_mean": mean, "test_acc_ci95": [mean - half, mean + half], "params_added_mean": 0.0}

    def task(ppo, search, cap, heuristic=70.0):
        base = {b: row(heuristic) for b in ("static", "random", "heuristic", "heuristic_tuned")}
        rows = {"ppo_greedy": row(ppo), plan_name(1.0): row(search), CAP_SEARCH: row(cap)}
        return {"controllers": {**base, **rows}}

    tasks = {"a": task(80, 80.5, 81), "b": task(80, 83, 80.5), "c": task(80, 81, 79),
             "d": task(80, 85, 84), "e": task(80, 79, 83, heuristic=79.5)}  # fmt: skip
    v = suite_verdict(tasks)
    assert v["tasks"] == list("abcde") and v["second_goal"]["needs"] == 3
    assert v["first_goal"] == {"tasks_met": list("abcd"), "met": False}  # e: the intervals overlap
    assert v["second_goal"] == {"needs": 3, "tasks_met": ["a", "c", "e"], "met": True}
    assert v["second_goal_within_cap"] == {"needs": 3, "tasks_met": ["a", "b", "c"], "met": True}
    four = suite_verdict({t: tasks[t] for t in "abcd"})
    assert four["first_goal"]["met"]
    assert four["second_goal"] == {"needs": 2, "tasks_met": ["a", "c"], "met": True}
    line = verdict_lines(v)[0]
    assert "**not met**: 4 of 5, every task needed (`a`, `b`, `c`, `d`)" in line
    assert "**met**: 3 of 5, 3 needed (`a`, `c`, `e`)" in line and CAP_SEARCH in line
    uncapped = {t: {"controllers": {k: r for k, r in x["controllers"].items() if k != CAP_SEARCH}}
                for t, x in tasks.items()}  # fmt: skip
    assert suite_verdict(uncapped)["second_goal_within_cap"] is None
    assert suite_verdict({"a": {"controllers": {"static": row(1.0)}}}) is None and verdict_lines(None) == []


def test_an_arm_kept_beside_the_judged_one_gets_its_own_verdict_in_the_table_and_the_json():
    """The second run's rule: where the arm kept beside the judged one (``ppo_greedy[default]``) would meet
    a goal differently, the table says so. Its goals are read as the judged arm's, stated as beside it, and
    the judged verdict does not move."""
    from esper.shell.eval.suite.report import (
        beside_verdicts,
        goals,
        learned_rows,
        markdown,
        suite_verdict,
        verdict_lines,
    )

    def row(mean, half=1.0):
        return {"test_acc_mean": mean, "test_acc_ci95": [mean - half, mean + half], "params_added_mean": 0.0}

    def task(judged, beside):
        base = {b: row(70.0) for b in ("static", "random", "heuristic", "heuristic_tuned")}
        rows = {"ppo_greedy": row(judged), "ppo_greedy[default]": row(beside), "ppo[default]": row(beside),
                plan_name(1.0): row(84.0), CAP_SEARCH: row(82.0)}  # fmt: skip
        return {"controllers": {**base, **rows}}

    tasks = {"a": task(81.6, 80.5), "b": task(83.0, 71.5)}
    assert learned_rows(tasks["a"]["controllers"]) == ["ppo_greedy", "ppo_greedy[default]", "ppo[default]"]
    assert set(goals(tasks["a"]["controllers"])) == {"ppo_greedy", "ppo_greedy[default]", "ppo[default]"}
    judged = suite_verdict(tasks)
    assert judged["first_goal"]["met"] and judged["second_goal_within_cap"]["tasks_met"] == ["a", "b"]
    beside = beside_verdicts(tasks)
    assert list(beside) == ["ppo_greedy[default]"]  # the greedy readout only
    assert beside["ppo_greedy[default]"]["first_goal"] == {"tasks_met": ["a"], "met": False}
    capped = beside["ppo_greedy[default]"]["second_goal_within_cap"]
    assert capped == {"needs": 1, "tasks_met": [], "met": False}
    assert "the arm kept beside the judged one" in verdict_lines(beside["ppo_greedy[default]"])[0]
    assert "beside" not in verdict_lines(judged)[0].split(".**")[0]
    only_a = {"a": tasks["a"], "b": {"controllers": {k: r for k, r in tasks["b"]["controllers"].items()
                                                      if beside_readout(k) is None}}}  # fmt: skip
    assert beside_verdicts(only_a) == {}  # an arm missing from a task has no suite verdict
    # the second run's kept table: the default arm, beside fb4, meets the first goal on the same 3 of 4 and
    # the capped reading of the second on none, where fb4 meets it on 3 (the log's reading, by hand)
    second = json.loads((REPO / "bench/results/suite/2026-12-02-vm.json").read_text())
    text = markdown(second["machine"], {"tasks": second["tasks"]}, "python -m esper.shell.suite", {})
    assert text.count("**The issue's goals over the 4 tasks") == 2
    line = next(x for x in text.splitlines() if "for `ppo_greedy[default]`, the arm kept beside" in x)
    assert "**not met**: 3 of 4, every task needed (`mnist1d`, `mnist1d_deep`, `digits_shallow`)" in line
    assert line.endswith(
        f"`{CAP_SEARCH}`, the search within the controller's cap (reported beside the "
        "issue's goal): **not met**: 0 of 4, 2 needed (none)."
    )


def test_a_suite_of_several_tasks_gets_one_overview_plot(tmp_path):
    """Several tasks: one more plot, every task's baselines, judged controller and searches side by side
    (a controller a task lacks is left out); one task: none."""
    from esper.shell.eval.suite.report import OVERVIEW, plots

    def row(mean):
        return {"test_acc_mean": mean, "test_acc_ci95": [mean - 1, mean + 1], "params_added_mean": 10.0,
                "compute_host_epochs": 100}  # fmt: skip

    full = {n: row(50.0 + i) for i, n in enumerate(OVERVIEW)}
    lacking = {n: c for n, c in full.items() if n != CAP_SEARCH}
    files = plots(tmp_path, "s", {"tasks": {"a": {"controllers": full}, "b": {"controllers": lacking}}})
    (overview,) = files[""]
    assert overview.name == "s-overview.png" and overview.read_bytes()[:4] == b"\x89PNG"
    assert "" not in plots(tmp_path / "one", "s", {"tasks": {"a": {"controllers": full}}})


def test_every_suite_controller_has_its_own_colour():
    """Each controller a suite plot draws has a fixed colour, and no two share one (matplotlib's default
    red, which a controller without a colour got, is `ppo`'s)."""
    names = ["ppo", "ppo_greedy", "static", "random", "heuristic", "heuristic_tuned", "grow_all",
             *map(plan_name, PLAN_MULTIPLES), OWN_PLAN, FOSSILIZING, IN_CAP, CAP_SEARCH,
             *TRYING, BORN_OWN]  # fmt: skip
    colours = [color(n) for n in names]
    assert None not in colours
    assert len(set(colours)) == len(names)


def test_the_table_names_the_flags_its_controllers_trained_with_and_flags_tasks_that_differ():
    """The 2026-12-06 table said "every task trains the default's controller" of a run whose controllers
    were trained with the cap and the budget off: the sentence now comes from the settings each seed
    recorded, so it names the flags, and tasks trained differently are called out as not one
    configuration."""
    from esper.shell.config.presets import preset
    from esper.shell.eval.suite.pooling import controller_settings
    from esper.shell.eval.suite.report import configuration_sentence

    cfg = preset(SUITE["mnist1d"])
    as_preset = {"param_weight": cfg.reward.param_weight, "param_budget_share": cfg.reward.param_budget_share,
                 "param_over_weight": cfg.reward.param_over_weight, "reward_mode": cfg.reward.mode.name,
                 "ppo_param_cap_share": cfg.ppo.param_cap_share}  # fmt: skip
    assert cfg.ppo.param_cap_share > 0 and cfg.reward.param_budget_share > 0  # the default has both
    uncapped = {**as_preset, "ppo_param_cap_share": 0.0, "param_budget_share": 0.0}
    assert controller_settings("mnist1d", [as_preset] * 3) == {}
    off = {"reward.param_budget_share": 0.0, "ppo.param_cap_share": 0.0}
    assert controller_settings("mnist1d", [uncapped] * 2) == off
    assert controller_settings("mnist1d", [as_preset, uncapped]) == {
        "reward.param_budget_share": [cfg.reward.param_budget_share, 0.0],
        "ppo.param_cap_share": [cfg.ppo.param_cap_share, 0.0],
    }
    assert controller_settings("mnist1d", [{}]) == {}  # nothing recorded, nothing claimed

    same = configuration_sentence({"a": {"controller_settings": off}, "b": {"controller_settings": off}})
    assert same.startswith("One controller configuration")
    assert "with `--reward.param_budget_share 0 --ppo.param_cap_share 0` on every task" in same
    default = configuration_sentence({"a": {"controller_settings": {}}, "b": {}})
    assert default.startswith("One controller configuration") and "--" not in default
    differ = configuration_sentence({"a": {"controller_settings": off}, "b": {"controller_settings": {}}})
    assert differ.startswith("**Not one controller configuration**") and "`b` none" in differ
    mixed = {"ppo.param_cap_share": [0.6, 0.0]}  # the seeds of each task disagree
    assert configuration_sentence({"a": {"controller_settings": mixed}}).startswith("**Not one controller")


def test_the_table_the_current_result_quotes_renders_from_its_committed_json_byte_for_byte():
    """The suite's latest table (the one the current result links: docs/results.md since issue 102 moved it
    out of the README) is what :func:`markdown` makes of its committed JSON, to the byte: the table moved
    with the protocol into the library unchanged."""
    import re

    from esper.shell.eval.suite.report import markdown

    page = (REPO / "docs" / "results.md").read_text()
    link = re.search(r"suite's latest run.*?\]\((?:\.\./)?(bench/results/suite/[\w.-]+)\.md\)", page, re.S)
    assert link, "the current result links the suite's latest table"
    md, saved = REPO / f"{link.group(1)}.md", json.loads((REPO / f"{link.group(1)}.json").read_text())
    stem, folder = md.stem, md.parent
    plot_files: dict[str, list[Path]] = {
        t: [folder / f"{stem}-{t}-acc-vs-params.png", folder / f"{stem}-{t}-acc-vs-compute.png"]
        for t in saved["tasks"]
    }
    plot_files[""] = [folder / f"{stem}-overview.png"]
    suite = {k: v for k, v in saved.items() if k not in ("machine", "command")}
    assert markdown(saved["machine"], suite, saved["command"], plot_files) == md.read_text()
