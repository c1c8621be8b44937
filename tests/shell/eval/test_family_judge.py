"""The family judge's arithmetic (issue 89) on synthetic tables: a controller paired host by host with
the best constant, the kind rule and the oracle, pooled over training seeds."""

from __future__ import annotations

import json

import pytest

from esper.shell.eval import family
from esper.shell.eval.family import judge

A, B = {"pools": [1, 4, 1]}, {"pools": [1, 1, 4]}
KIND_OF = lambda m: "-".join(map(str, m["pools"]))
RULE = {"1-4-1": "b0=x", "1-1-4": "b1=y"}


def _row(seed, member, **plans):
    """``plan=(test, val)``; ``static`` is the empty plan."""
    cells = {("" if p == "static" else p): {"test": t, "val": v} for p, (t, v) in plans.items()}
    return {"host_seed": seed, "member": member, "plans": cells}


PRECHECK = {
    "plans": ["", "b0=x", "b1=y"],
    "per_host": [
        _row(1, A, static=(40, 40), **{"b0=x": (80, 80), "b1=y": (60, 60)}),
        _row(2, B, static=(40, 40), **{"b0=x": (50, 50), "b1=y": (70, 69)}),
    ],
}


def _eval(*hosts):
    """``(host_seed, test, params, grown)`` per host: evaluate's results for ppo_greedy."""
    eps = [{"host_seed": h, "final_test_acc": t, "params_added": p, "grown": g} for h, t, p, g in hosts]
    return {"controllers": {"ppo_greedy": {"per_episode": eps}}}


def test_differences_are_paired_per_host_and_pooled_over_seeds():
    evals = {
        7: _eval((1, 78.0, 100, "b0=x"), (2, 72.0, 120, "b1=y")),  # reads the host: near the kind rule
        8: _eval((1, 80.0, 100, "b0=x"), (2, 52.0, 100, "b0=x")),  # one plan for both: the constant
    }
    out = judge(PRECHECK, evals, constant="b0=x", kind_of=KIND_OF, kind_rule=RULE)
    s7, s8 = out["per_seed"][7], out["per_seed"][8]
    assert s7["minus_constant"] == pytest.approx(((78 - 80) + (72 - 50)) / 2)  # +10
    assert s7["minus_kind_rule"] == pytest.approx(((78 - 80) + (72 - 70)) / 2)  # 0
    assert s7["minus_oracle"] == pytest.approx(0.0)  # the oracle by validation is the kind rule here
    assert s7["minus_static"] == pytest.approx((38 + 32) / 2)
    assert s7["slots_as_kind_rule"] == 1.0 and s8["slots_as_kind_rule"] == 0.5
    assert s8["minus_constant"] == pytest.approx(1.0)
    pooled = out["pooled"]["minus_constant"]
    assert pooled["mean"] == pytest.approx(5.5) and pooled["ci95"][0] < 0  # two seeds that disagree
    assert not out["beats_best_constant"] and out["training_seeds"] == [7, 8]
    assert not out["kind_rule_tost"]["equivalent"]  # 0 and -9 on the two seeds: no equivalence shown
    a, b = out["per_kind"]["1-4-1"], out["per_kind"]["1-1-4"]
    assert a["hosts"] == b["hosts"] == 1 and a["controller_test_mean"] == pytest.approx(79.0)
    assert b["constant_test_mean"] == 50 and b["kind_rule_test_mean"] == 70
    assert b["grown_top"] == [("b1=y", 1), ("b0=x", 1)] and a["grown_top"] == [("b0=x", 2)]


def test_a_controller_that_reads_every_host_beats_the_constant():
    evals = {
        k: _eval((1, 79.0 + d, 100, "b0=x"), (2, 70.0 + d, 100, "b1=y"))
        for k, d in ((1, 0.0), (2, 0.5), (3, 1.0))
    }
    out = judge(PRECHECK, evals, constant="b0=x", kind_of=KIND_OF, kind_rule=RULE)
    assert out["beats_best_constant"] and out["pooled"]["minus_constant"]["ci95"][0] > 0
    assert out["kind_rule_tost"]["equivalent"]  # within ±1 of the kind rule on every seed, a narrow spread


def test_hosts_that_are_not_the_prechecks_are_refused():
    with pytest.raises(ValueError, match="not the pre-check's"):
        judge(PRECHECK, {1: _eval((1, 70.0, 0, ""), (3, 70.0, 0, ""))}, constant="b0=x", kind_of=KIND_OF,
              kind_rule=RULE)  # fmt: skip


def test_the_cli_writes_the_table(tmp_path, monkeypatch):
    pre = {**PRECHECK, "meta": {"task": "toy", "eval_seed": 1, "data_seed": 2}}
    monkeypatch.setitem(
        family.FAMILY_BARS, "toy", {"constant": "b0=x", "kind_of": KIND_OF, "kind_rule": RULE}
    )
    (tmp_path / "p.json").write_text(json.dumps(pre))
    files = []
    for k in (1, 2):
        f = tmp_path / f"e{k}.json"
        f.write_text(json.dumps(_eval((1, 79.0 + k, 100, "b0=x"), (2, 70.0, 100, "b1=y"))))
        files.append(str(f))
    argv = ["--precheck", str(tmp_path / "p.json"), "--evals", *files, "--seeds", "1", "2",
            "--out", str(tmp_path / "o.json"), "--md", str(tmp_path / "o.md")]  # fmt: skip
    assert family.main(argv) == 0
    md = (tmp_path / "o.md").read_text()
    assert "| minus the best constant (judged) | +10.25 [" in md and "beats** the best constant" in md
    assert "| 1-1-4 | 1 | 70.00 | 50.00 | 70.00 | 70.00 | `b1=y` (2) |" in md
    with pytest.raises(SystemExit):  # a seed for each results file
        family.main(["--precheck", str(tmp_path / "p.json"), "--evals", files[0], "--seeds", "1", "2",
                     "--out", str(tmp_path / "x.json")])  # fmt: skip


def _with(ctl, base, hosts=(1, 2), name="plan_search_cap", chosen="b0=x"):
    """evaluate's results with ``ppo_greedy`` and one baseline beside it, each a mean test accuracy."""
    eps = lambda: [{"host_seed": h} for h in hosts]
    return {"controllers": {
        "ppo_greedy": {"test_acc_mean": ctl, "params_added_mean": 10.0, "per_episode": eps()},
        name: {"test_acc_mean": base, "params_added_mean": 8.0, "compute_host_epochs": 400,
               "per_episode": eps(), "search": {"chosen": chosen}},
    }}  # fmt: skip


def test_against_pairs_each_baseline_by_seed_and_reads_the_gap_it_closes():
    evals = {1: _with(72.0, 70.0), 2: _with(74.0, 70.0), 3: _with(73.0, 71.0, chosen="b1=y")}
    out = family.against(evals, ["plan_search_cap"], oracle=76.0)["plan_search_cap"]
    assert out["minus"]["per_seed"] == [2.0, 4.0, 2.0]
    assert out["minus"]["mean"] == pytest.approx(8 / 3)
    lo, hi = out["minus"]["ci95"]
    assert lo < 8 / 3 < hi
    # controller 73.0, baseline 70.33, oracle 76: (73 - 70.33) / (76 - 70.33)
    assert out["gap_closed"] == pytest.approx((8 / 3) / (76.0 - 70 - 1 / 3))
    assert out["chosen"] == {1: "b0=x", 2: "b0=x", 3: "b1=y"}
    assert out["compute_host_epochs_mean"] == 400


def test_against_refuses_a_missing_baseline_or_other_hosts():
    with pytest.raises(ValueError, match="no 'probe'"):
        family.against({1: _with(72.0, 70.0)}, ["probe"])
    bad = _with(72.0, 70.0)
    bad["controllers"]["plan_search_cap"]["per_episode"] = [{"host_seed": 9}, {"host_seed": 2}]
    with pytest.raises(ValueError, match="other hosts"):
        family.against({1: bad}, ["plan_search_cap"])


# --------------------------------------------------------------------- issue 102: what publishes a verdict
#: Host 1's plans read differently on validation and on test: by validation ``b1=y`` (test 60), by test
#: ``b0=x`` (test 80). Host 2 agrees (``b1=y``). The honest oracle picks on validation and scores on test.
SPLIT = {
    "plans": ["", "b0=x", "b1=y"],
    "per_host": [
        _row(1, A, static=(40, 40), **{"b0=x": (80, 70), "b1=y": (60, 75)}),
        _row(2, B, static=(40, 40), **{"b0=x": (50, 50), "b1=y": (70, 69)}),
    ],
}


def test_issue102_the_judges_oracle_is_chosen_on_validation_not_on_test():
    """The oracle a controller is paired with is each host's plan chosen by *validation* accuracy, scored
    on test: on host 1 that is ``b1=y`` (60), not the test-chosen ``b0=x`` (80, biased upward)."""
    evals = {
        k: _eval((1, 78.0 + d, 100, "b1=y"), (2, 72.0 + d, 100, "b1=y")) for k, d in ((1, 0.0), (2, 1.0))
    }
    out = judge(SPLIT, evals, constant="b0=x", kind_of=KIND_OF, kind_rule=RULE)
    assert out["per_seed"][1]["minus_oracle"] == pytest.approx(((78 - 60) + (72 - 70)) / 2)  # +10, not 0
    assert out["pooled"]["minus_oracle"]["mean"] == pytest.approx(10.5)
    assert out["per_kind"]["1-4-1"]["oracle_test_mean"] == 60


def test_issue102_the_clis_oracle_beside_the_baselines_is_chosen_on_validation(tmp_path, monkeypatch):
    """``--against``'s oracle (the gap a baseline leaves to it) is the validation-chosen plan's test
    accuracy too: (60 + 70) / 2 = 65 on these hosts, not the test-chosen (80 + 70) / 2 = 75."""
    pre = {**SPLIT, "meta": {"task": "toy", "eval_seed": 1, "data_seed": 2}}
    monkeypatch.setitem(
        family.FAMILY_BARS, "toy", {"constant": "b0=x", "kind_of": KIND_OF, "kind_rule": RULE}
    )
    (tmp_path / "p.json").write_text(json.dumps(pre))
    files = []
    for k, (ctl, base) in enumerate(((64.0, 60.0), (65.0, 60.0)), start=1):
        res = _with(ctl, base)
        res["controllers"]["ppo_greedy"]["per_episode"] = _eval(
            (1, ctl - 1, 10, "b1=y"), (2, ctl + 1, 10, "b1=y")
        )["controllers"]["ppo_greedy"]["per_episode"]
        f = tmp_path / f"e{k}.json"
        f.write_text(json.dumps(res))
        files.append(str(f))
    argv = ["--precheck", str(tmp_path / "p.json"), "--evals", *files, "--seeds", "1", "2",
            "--against", "plan_search_cap", "--out", str(tmp_path / "o.json")]  # fmt: skip
    assert family.main(argv) == 0
    out = json.loads((tmp_path / "o.json").read_text())
    assert out["oracle_test_mean"] == pytest.approx(65.0)
    # the controller 64.5, the baseline 60: 4.5 of the 5 points to the oracle
    assert out["against"]["plan_search_cap"]["gap_closed"] == pytest.approx(4.5 / 5.0)


def test_issue102_as_good_as_the_kind_rule_is_tested_within_one_point():
    """TOST's margin is ±1 point: a controller 1.5 points under the kind rule on every seed, tight, is not
    "as good as" it (its 90 % interval lies inside ±2, so a ±2 margin would have called it equivalent)."""
    evals = {k: _eval((1, 78.5 + d, 100, "b0=x"), (2, 68.5 + d, 100, "b1=y"))
             for k, d in ((1, 0.0), (2, 0.1), (3, -0.1))}  # fmt: skip
    out = judge(PRECHECK, evals, constant="b0=x", kind_of=KIND_OF, kind_rule=RULE)
    tost = out["kind_rule_tost"]
    assert tost["mean"] == pytest.approx(-1.5) and tost["margin"] == 1.0
    lo, hi = tost["interval"]
    assert -2 < lo < hi < -1  # inside ±2, outside ±1
    assert not tost["equivalent"]


def _cli_files(tmp_path, monkeypatch, seeds, precheck=PRECHECK):
    """The pre-check and one evaluation per seed (``ppo_greedy`` and ``plan_search_cap`` beside it) on
    disk, the toy family's bars set: the CLI's arguments up to ``--out``."""
    monkeypatch.setitem(
        family.FAMILY_BARS, "toy", {"constant": "b0=x", "kind_of": KIND_OF, "kind_rule": RULE}
    )
    pre = {**precheck, "meta": {"task": "toy", "eval_seed": 1, "data_seed": 2}}
    (tmp_path / "p.json").write_text(json.dumps(pre))
    files = []
    for k in seeds:
        res = _with(80.0 + k, 70.0)
        res["controllers"]["ppo_greedy"]["per_episode"] = _eval(
            (1, 85.0 + k, 100, "b0=x"), (2, 75.0 + k, 100, "b1=y")
        )["controllers"]["ppo_greedy"]["per_episode"]
        f = tmp_path / f"e{k}.json"
        f.write_text(json.dumps(res))
        files.append(str(f))
    seeds = [str(k) for k in seeds]
    return ["--precheck", str(tmp_path / "p.json"), "--evals", *files, "--seeds", *seeds]


def test_issue102_one_training_seed_is_reported_and_not_judged(tmp_path, monkeypatch, capsys):
    """One seed gives no interval over seeds: the judge says plainly that it did not judge, with no
    verdict, no zero-width "95 % interval" and no equivalence test, and counts "1 training seed"."""
    evals = {7: _eval((1, 85.0, 100, "b0=x"), (2, 75.0, 100, "b1=y"))}
    out = judge(PRECHECK, evals, constant="b0=x", kind_of=KIND_OF, kind_rule=RULE)
    assert out["judged"] is False and out["min_training_seeds"] == family.MIN_SEEDS == 2
    assert out["beats_best_constant"] is None and out["kind_rule_tost"] is None
    assert out["pooled"]["minus_constant"] == {"mean": pytest.approx(15.0), "ci95": None}
    argv = _cli_files(tmp_path, monkeypatch, [7])
    assert family.main([*argv, "--against", "plan_search_cap", "--out", str(tmp_path / "o.json")]) == 0
    md = capsys.readouterr().out
    saved = json.loads((tmp_path / "o.json").read_text())
    assert saved["against"]["plan_search_cap"]["minus"]["ci95"] is None and saved["judged"] is False
    assert "1 training seed (7), 2 fresh hosts each. **Not judged**: a judgement needs at least 2" in md
    assert "seeds (7" not in md and "95 %" not in md and "[+" not in md  # no interval, zero-width or not
    assert "beat" not in md and "| yes" not in md and "| no" not in md  # no verdict, no TOST's answer
    assert "| minus the best constant | +22.00 |" in md
    assert "| `plan_search_cap` | 70.00 | 8 | 400 | +17.00 |" in md


def test_issue102_two_training_seeds_are_judged_and_counted_in_the_plural(tmp_path, monkeypatch, capsys):
    argv = _cli_files(tmp_path, monkeypatch, [7, 8])
    assert family.main([*argv, "--out", str(tmp_path / "o.json")]) == 0
    md = capsys.readouterr().out
    assert "2 training seeds (7-8), 2 fresh hosts each; means over seeds with 95 % intervals" in md
    assert "**beats** the best constant" in md and "| minus the best constant (judged) | +22.50 [" in md


def test_issue102_a_readout_missing_from_an_evaluation_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    """``--readout ppo_sampled`` where the files hold ``ppo_greedy`` and ``plan_search_cap``: an error
    that names the readout asked for and the readouts there, not a raw KeyError."""
    argv = _cli_files(tmp_path, monkeypatch, [7, 8])
    rc = family.main([*argv, "--readout", "ppo_sampled", "--out", str(tmp_path / "o.json")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert "no readout 'ppo_sampled'" in err and "its readouts: ppo_greedy, plan_search_cap" in err
    with pytest.raises(ValueError, match="no readout 'ppo_sampled'; its readouts: ppo_greedy"):
        family.against({1: _with(72.0, 70.0)}, ["plan_search_cap"], readout="ppo_sampled")
