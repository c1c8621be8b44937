"""``python -m bench.suite.cap_screen``: an arm without the controller's cap, paired seed by seed with the
suite's kept seeds (the capped controller, ``plan_search@1x``, ``heuristic_tuned``) and decided by the rule
written before its runs."""

import json

import pytest

from bench.suite.archive import save_seed
from bench.suite.cap_screen import decide, grows, largest_blueprint, main, markdown, read, share_growing
from bench.suite.run import final_data_seed

TASKS = ("mnist1d", "mnist1d_deep", "digits_shallow", "longrange", "recall")
LARGEST = {"mnist1d": "conv_heavy", "mnist1d_deep": "conv_heavy", "digits_shallow": "conv_heavy",
           "longrange": "conv_heavy", "recall": "mlp"}  # fmt: skip
SEEDS = (400, 401)


def _five(*accs: float) -> dict[str, float]:
    """One number per task, in TASKS order."""
    return dict(zip(TASKS, accs, strict=True))


def _meta(task: str, k: int) -> dict:
    return {"episodes": 10, "eval_seed": 1000 + k, "data_seed": final_data_seed(task, k), "run_dir": "x"}


def _row(acc: float, params: float = 700.0, grown: dict | None = None) -> dict:
    return {"test_acc_mean": acc, "params_added_mean": params, **({"grown_counts": grown} if grown else {})}


def _kept(tmp_path, arm: dict, capped: dict, search: dict, tuned: float = 70.0):
    """Kept seeds of the arm and of the suite: per task the arm's, the capped controller's and the
    search's accuracy (the same on both seeds, the arm's +-0.5 around its value)."""
    arm_dir, suite = tmp_path / "nocap", tmp_path / "seeds"
    for task in arm:
        for i, k in enumerate(SEEDS):
            grown = {"s0=mlp+s1=attention": 3, "s0=attention+s1=mlp_small": 7} if task == "recall" else None
            greedy = _row(arm[task] + (i - 0.5), 1200, grown)
            a = {"meta": _meta(task, k), "controllers": {"ppo_greedy": greedy}}
            save_seed(arm_dir, task, k, a, 1.0)
            s = {"meta": _meta(task, k), "controllers": {"ppo_greedy": _row(capped[task]),
                 "heuristic_tuned": _row(tuned), "plan_search@1x": _row(search[task], 1100),
                 "grow_all": _row(search[task], 1200)}}  # fmt: skip
            save_seed(suite, task, k, s, 1.0)
    return arm_dir, suite


def test_recommended_when_near_the_search_on_three_tasks_and_no_task_lost(tmp_path):
    arm = _five(84.5, 84.4, 83.0, 96.0, 51.5)
    capped = _five(83.3, 82.3, 80.6, 94.4, 51.9)
    search = _five(84.8, 85.0, 83.5, 96.4, 52.1)
    screen = read(*_kept(tmp_path, arm, capped, search), TASKS, SEEDS, largest=LARGEST)
    assert screen["pairs"] == screen["of"] == 10
    d = decide(screen)
    assert d["decided"] and d["recommended"]
    assert set(d["near_search"]) == set(TASKS)
    recall = screen["tasks"]["recall"]
    assert recall["vs_capped"][0] == pytest.approx(-0.4)
    assert recall["largest_share"] == pytest.approx(0.3)  # mlp_small is not mlp
    assert "**decision: recommended" in markdown(screen, d, "nocap")


def test_not_recommended_when_one_task_falls_under_the_capped_controller(tmp_path):
    """Near the search everywhere, but `recall` 1.5 under the capped controller: the second condition
    fails."""
    arm = _five(84.5, 84.4, 83.0, 96.0, 50.4)
    capped = _five(83.3, 82.3, 80.6, 94.4, 51.9)
    search = {t: a + 0.5 for t, a in arm.items()}
    d = decide(read(*_kept(tmp_path, arm, capped, search), TASKS, SEEDS, largest=LARGEST))
    assert d["decided"] and not d["recommended"]
    assert d["checks"]["`recall` against the capped controller"] is False


def test_not_recommended_when_near_the_search_on_two_tasks_only(tmp_path):
    arm = _five(84.5, 82.0, 81.0, 96.0, 52.0)
    capped = {t: a - 0.5 for t, a in arm.items()}
    search = _five(84.8, 85.0, 83.5, 96.4, 55.0)
    d = decide(read(*_kept(tmp_path, arm, capped, search), TASKS, SEEDS, largest=LARGEST))
    assert d["decided"] and not d["recommended"]
    assert set(d["near_search"]) == {"mnist1d", "longrange"}


def test_undecided_until_every_pair_is_in_and_other_evaluations_refused(tmp_path):
    arm = {"mnist1d": 84.5, "recall": 51.0}
    arm_dir, suite = _kept(tmp_path, arm, arm, arm)
    screen = read(arm_dir, suite, ("mnist1d", "recall", "longrange"), SEEDS, largest=LARGEST)
    assert screen["pairs"] == 4 and screen["of"] == 6
    d = decide(screen)
    assert not d["decided"] and d["recommended"] is None
    text = markdown(screen, d, "nocap")
    assert "not in yet (arm)" in text and "not decided: 4 of 6" in text
    other = {"meta": {**_meta("longrange", 400), "eval_seed": 7}, "controllers": {"ppo_greedy": _row(90.0)}}
    save_seed(arm_dir, "longrange", 400, other, 1.0)
    with pytest.raises(ValueError, match="not the suite's evaluation"):
        read(arm_dir, suite, ("longrange",), SEEDS, largest=LARGEST)


def test_plans_and_largest_blueprints():
    assert grows("s0=mlp+s1=attention", "mlp")
    assert not grows("s0=mlp_small", "mlp") and not grows("none", "mlp")
    assert share_growing({"grown_counts": {"b0=conv_heavy": 1, "b1=norm": 3}}, "conv_heavy") == 0.25
    assert share_growing({}, "conv_heavy") is None
    assert largest_blueprint("recall") == "mlp"  # the one the cap kept out on recall
    assert largest_blueprint("longrange") == "conv_heavy"


def test_cli_writes_table_and_record(tmp_path, capsys):
    arm = {"mnist1d": 84.5}
    arm_dir, suite = _kept(tmp_path, arm, arm, arm)
    out = tmp_path / "out" / "screen"
    assert main([str(arm_dir), "--tasks", "mnist1d", "--archive", str(suite), "--out", str(out)]) == 0
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["decision"]["decided"] and record["screen"]["pairs"] == 2
    assert out.with_suffix(".md").read_text() == capsys.readouterr().out
