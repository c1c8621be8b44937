"""The budget judge's arithmetic (issue 89) on synthetic tables: at each budget the bar is the best plan
within it, the controller is paired with it by training seed, "above" is Holm-corrected across budgets
and TOST reads equivalence; the frontier; the figure and the CLI."""

from __future__ import annotations

import json

import pytest

from esper.shell.eval import budget as B

HOSTS = [11, 12]


def _plans(**plans):
    """``plan=(test, params)`` -> evaluate's results of those fixed plans (``static``: nothing grown)."""
    eps = lambda: [{"host_seed": h} for h in HOSTS]
    ctl = {n: {"test_acc_mean": t, "params_added_mean": p, "per_episode": eps()}
           for n, (t, p) in plans.items()}  # fmt: skip
    return {
        "controllers": ctl,
        "meta": {"grow_all_params": 1000.0, "task": "t", "eval_seed": 1, "data_seed": 2},
    }


def _ctl(test, params=100.0, grown="b0=x"):
    eps = [{"host_seed": h, "params_added": params, "grown": grown} for h in HOSTS]
    return {"controllers": {"ppo_greedy": {"test_acc_mean": test, "params_added_mean": params,
                                           "per_episode": eps}}}  # fmt: skip


PLANS = _plans(static=(40.0, 0.0), **{"grow:b0=s": (60.0, 200.0), "grow:b0=m": (70.0, 450.0),
                                      "grow:b0=l": (69.0, 900.0), "grow:all": (80.0, 1000.0)})  # fmt: skip


def test_the_frontier_and_the_bar_within_each_budget():
    table = B.plan_table(PLANS)
    assert B.frontier(table) == ["static", "grow:b0=s", "grow:b0=m", "grow:all"]
    assert B.bar_at(table, 250.0) == "grow:b0=s"
    assert B.bar_at(table, 950.0) == "grow:b0=m"  # the larger plan within it is worse
    assert B.bar_at(table, 1000.0) == "grow:all"
    with pytest.raises(ValueError, match="no enumerated plan"):
        B.bar_at({"grow:x": {"test": 1.0, "params": 5.0, "hosts": HOSTS}}, 1.0)


def test_above_equivalent_and_dominated_are_told_apart():
    table = B.plan_table(PLANS)
    evals = {
        0.25: {s: _ctl(v, 200.0) for s, v in zip(range(5), (64.0, 65.0, 63.0, 64.5, 63.5))},  # above 60
        0.5: {s: _ctl(v, 400.0) for s, v in zip(range(5), (70.1, 69.9, 70.0, 70.2, 69.8))},  # ties 70
        1.0: {s: _ctl(v, 900.0) for s, v in zip(range(5), (75.0, 74.0, 76.0, 75.5, 74.5))},  # under 80
    }
    out = B.judge(table, evals, 1000.0)
    r = out["budgets"]
    assert r["0.25"]["bar"] == "grow:b0=s" and r["0.25"]["above"] and r["0.25"]["not_dominated"]
    assert r["0.25"]["minus_bar"]["mean"] == pytest.approx(4.0)
    assert not r["0.5"]["above"] and r["0.5"]["equivalent"] and r["0.5"]["not_dominated"]
    assert not r["1"]["not_dominated"]
    assert out["not_dominated_everywhere"] is False
    assert r["0.25"]["p_above_holm"] >= min(1.0, r["0.25"]["p_above"])  # Holm never lowers a p-value


def test_a_controller_over_its_budget_or_on_other_hosts_is_refused():
    table = B.plan_table(PLANS)
    with pytest.raises(ValueError, match="over the budget"):
        B.judge(table, {0.25: {0: _ctl(60.0, 300.0)}}, 1000.0)
    other = _ctl(60.0, 100.0)
    other["controllers"]["ppo_greedy"]["per_episode"][0]["host_seed"] = 99
    with pytest.raises(ValueError, match="other hosts"):
        B.judge(table, {0.25: {0: other}}, 1000.0)


def test_the_cli_writes_the_table_and_the_figure(tmp_path):
    (tmp_path / "plans.json").write_text(json.dumps(PLANS))
    args = []
    for share, test in ((0.25, 62.0), (1.0, 79.5)):
        for seed, dt in ((1, 0.0), (2, 0.4)):
            f = tmp_path / f"e{share}-{seed}.json"
            f.write_text(json.dumps(_ctl(test + dt, share * 800)))
            args.append(f"{share}:{seed}:{f}")
    rc = B.main(["--plans", str(tmp_path / "plans.json"), "--evals", *args, "--out", str(tmp_path / "o.json"),
                 "--md", str(tmp_path / "o.md"), "--png", str(tmp_path / "o.png")])  # fmt: skip
    assert rc == 0
    out = json.loads((tmp_path / "o.json").read_text())
    assert set(out["budgets"]) == {"0.25", "1"} and out["training_seeds"] == [1, 2]
    assert "| 0.25 (250) |" in (tmp_path / "o.md").read_text()
    assert (tmp_path / "o.png").stat().st_size > 0
