"""The family pre-check's arithmetic (issue 89) on synthetic tables, and one tiny run end to end."""

from __future__ import annotations

import json

import pytest

from esper.shell.eval import precheck
from esper.shell.eval.precheck import summarize, untimed


def _host(seed, **plans):
    """A host row: ``plan=(test, val)``; ``static`` is the empty plan."""
    return {"host_seed": seed, "plans": {("" if p == "static" else p): {"test": t, "val": v}
                                         for p, (t, v) in plans.items()}}  # fmt: skip


PLANS = ["", "a", "b"]


def test_the_oracle_chosen_on_validation_against_the_best_constant():
    hosts = [
        _host(1, static=(40, 40), a=(80, 79), b=(60, 61)),  # a best, chosen
        _host(2, static=(40, 40), a=(50, 52), b=(70, 51)),  # b best on test, a chosen on val (wrongly)
        _host(3, static=(40, 40), a=(55, 50), b=(75, 70)),  # b best, chosen
        _host(4, static=(40, 45), a=(70, 44), b=(65, 43)),  # a best, static chosen on val
    ]
    out = summarize(hosts, PLANS)
    # constant: a's mean test (80+50+55+70)/4 = 63.75 against b's (60+70+75+65)/4 = 67.5: b
    assert out["best_constant"] == {"plan": "b", "test_mean": pytest.approx(67.5)}
    # the validation-chosen plans: a, a, b, static -> test 80, 50, 75, 40: mean 61.25
    pc = out["precheck"]
    assert pc["hosts"] == 4
    assert pc["oracle_minus_best_constant"] == pytest.approx(61.25 - 67.5)
    assert pc["share_best_differs"] == pytest.approx(3 / 4)  # a, a, static differ from b
    assert not pc["passes"]  # the gap is negative
    assert out["oracle"]["val_chosen_test_mean"] == pytest.approx(61.25)
    # the test-chosen oracle: 80, 70, 75, 70 = 73.75 (biased upward)
    assert out["oracle"]["test_chosen_test_mean"] == pytest.approx(73.75)
    assert out["oracle"]["share_best_differs_test_chosen"] == pytest.approx(2 / 4)
    assert out["best_constant_by_val"]["plan"] == "a"  # val means: a 56.25, b 56.25 -> a first
    assert [r["best_val_plan"] for r in out["per_host"]] == ["a", "a", "b", ""]
    assert [r["oracle_gain"] for r in out["per_host"]] == pytest.approx([20, -20, 0, -25])
    lo, hi = pc["oracle_minus_best_constant_ci95"]
    assert lo < pc["oracle_minus_best_constant"] < hi


def test_a_family_passes_when_the_best_plan_moves_enough():
    # half the hosts want a, half b, by 10 points each way; validation agrees with test
    hosts = [_host(k, static=(40, 40), a=(80, 80), b=(70, 70)) for k in range(5)]
    hosts += [_host(k, static=(40, 40), a=(70, 70), b=(80, 80)) for k in range(5, 10)]
    pc = summarize(hosts, PLANS)["precheck"]
    assert pc["oracle_minus_best_constant"] == pytest.approx(5.0)  # 80 against the constant's 75
    assert pc["share_best_differs"] == pytest.approx(0.5) and pc["passes"]
    # the thresholds are the rule's: 4 points and 30 %
    assert not summarize(hosts, PLANS, min_gap=5.5)["precheck"]["passes"]
    assert not summarize(hosts, PLANS, min_share=0.6)["precheck"]["passes"]


def test_ties_go_to_the_first_plan_and_a_plan_over_a_budget_is_no_constant():
    hosts = [_host(1, static=(50, 50), a=(50, 50)), _host(2, static=(50, 50), a=(50, 50), b=(90, 90))]
    out = summarize(hosts, PLANS)
    assert out["best_constant"]["plan"] == ""  # b does not fit host 1: not a constant; "" before a
    assert [r["best_val_plan"] for r in out["per_host"]] == ["", "b"]  # b where it fits
    assert out["precheck"]["oracle_minus_best_constant"] == pytest.approx(20.0)
    assert set(out["per_plan"]) == {"", "a"}
    with pytest.raises(ValueError, match="no plan fits every host"):
        summarize([_host(1, a=(1, 1)), _host(2, b=(1, 1))], PLANS)


def test_untimed_counts_what_a_timed_plan_grows():
    assert untimed("b0=conv_heavy:7+b1=norm@GATED_GATE") == "b0=conv_heavy+b1=norm"
    assert untimed("") == ""


def test_a_tiny_precheck_runs_one_host_a_batch_and_resumes(tmp_path, monkeypatch):
    plans = ["", "b1=conv_light", "b0=conv_light:2"]
    over = {"lifecycle.max_epochs": 3, "env.train_batches": 1, "env.val_batches": 1, "env.batch_size": 32}
    kw = dict(
        hosts=2,
        eval_seed=3,
        data_seed=None,
        plans=plans,
        budget_share=1 / 3,
        overrides=over,
        log=lambda m: None,
    )
    part = tmp_path / "part.jsonl"
    assert precheck.run_precheck("mnist1d_where", partial=part, shard=(1, 2), **kw) is None
    assert len(part.read_text().splitlines()) == 1  # host 1 only
    out = precheck.run_precheck("mnist1d_where", partial=part, **kw)
    assert out["precheck"]["hosts"] == 2 and out["meta"]["episodes"] == 6
    rows = out["per_host"]
    assert [r["host"] for r in rows] == [0, 1] and all(set(r["plans"]) == set(plans) for r in rows)
    assert all(r["budget"] == pytest.approx(r["grow_all_params"] / 3) for r in rows)
    assert rows[0]["member"]["channels"] == tuple(rows[0]["slot_widths"])
    # a run that finds every host kept runs nothing
    monkeypatch.setattr(precheck, "run_plans", lambda *a, **k: pytest.fail("ran an episode"))
    again = precheck.run_precheck("mnist1d_where", partial=part, **kw)
    assert json.dumps(again["per_host"]) == json.dumps(json.loads(json.dumps(rows)))
    assert "static" in precheck.to_markdown(out)
    with pytest.raises(ValueError, match="not a family"):
        precheck.run_precheck("mnist1d", **kw)


def test_issue102_a_family_exactly_at_the_rules_thresholds_passes():
    """The rule asks *at least* 4 points and *at least* 30 %: three hosts of ten gain 10, 10 and 20 points
    by choosing ``a`` over the constant ``b`` (4.0 exactly, on 30 % exactly), and the family passes."""
    hosts = [_host(k, static=(40, 40), a=(t, t), b=(70, 70)) for k, t in enumerate((80, 80, 90))]
    hosts += [_host(k, static=(40, 40), a=(50, 50), b=(70, 70)) for k in range(3, 10)]
    out = summarize(hosts, PLANS)
    pc = out["precheck"]
    assert out["best_constant"]["plan"] == "b"
    assert pc["oracle_minus_best_constant"] == 4.0 and pc["share_best_differs"] == 0.3
    assert pc["passes"]


def test_issue102_a_plan_adding_exactly_the_hosts_budget_fits_it():
    """A plan that adds *more* than the host's budget is not run there; one that adds exactly the budget
    is: at a budget of all of ``grow_all``'s, ``grow_all``'s own plan fits, and so does a third of it at
    a third."""
    from esper.shell.env.tasks import make_task

    task = make_task("mnist1d_where", splits=(300, 60, 60))
    bp = task.grow_all
    every, one = f"b0={bp}+b1={bp}+b2={bp}", f"b0={bp}"
    seed = next(s for s in range(50) if len(set(task.describe_member(s)["channels"])) == 1)  # equal slots
    whole = precheck.host_plans(task, seed, ["", every, one], 1.0)
    assert whole["plan_params"][every] == whole["budget"] == whole["grow_all_params"]
    assert whole["fits"] == ["", every, one]
    third = precheck.host_plans(task, seed, ["", every, one], 1 / 3)
    assert third["plan_params"][one] == third["budget"] and third["fits"] == ["", one]
