"""The budget judge's arithmetic (issue 89) on synthetic tables: at each budget the bar is the best plan
within it, the controller is paired with it by training seed, "above" is Holm-corrected across budgets
and TOST reads equivalence; the frontier; the figure and the CLI; on a family, each host's own budget."""

from __future__ import annotations

import json

import pytest

from esper.shell.eval import budget as B

HOSTS = [11, 12]


def _plans(**plans):
    """``plan=(test, params)`` -> evaluate's results of those fixed plans (``static``: nothing grown)."""
    eps = lambda t, p: [{"host_seed": h, "final_test_acc": t, "params_added": p} for h in HOSTS]
    ctl = {n: {"test_acc_mean": t, "params_added_mean": p, "per_episode": eps(t, p)}
           for n, (t, p) in plans.items()}  # fmt: skip
    return {
        "controllers": ctl,
        "meta": {"grow_all_params": 1000.0, "task": "mnist1d", "eval_seed": 1, "data_seed": 2},
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
    assert B.plan_table(PLANS)["grow:b0=m"]["host_params"] == [450.0, 450.0]


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


def test_one_training_seed_is_reported_without_a_test():
    # A single seed's screen: no interval, no Holm, no TOST, and the table still renders (it raised a
    # TypeError on the missing TOST before).
    out = B.judge(B.plan_table(PLANS), {0.25: {7: _ctl(61.0, 200.0)}}, 1000.0)
    r = out["budgets"]["0.25"]
    assert r["minus_bar"]["mean"] == pytest.approx(1.0) and r["tost"] is None and "above" not in r
    assert out["not_dominated_everywhere"] is None  # not judged (issue 102: it read False, "no")
    row = next(ln for ln in B.to_markdown(out, "one seed").splitlines() if ln.startswith("| 0.25"))
    assert row.endswith("| — | — | — |")


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
    # --replot draws judged outputs into one figure, --columns a row, meta.panel titling a panel
    out["meta"]["panel"] = "the cap fixed"
    (tmp_path / "p.json").write_text(json.dumps(out))
    files = [str(tmp_path / "o.json"), str(tmp_path / "p.json"), str(tmp_path / "o.json")]
    assert B.main(["--replot", *files, "--columns", "2", "--png", str(tmp_path / "grid.png")]) == 0
    from PIL import Image  # matplotlib's own dependency

    wide, high = Image.open(tmp_path / "grid.png").size
    one = Image.open(tmp_path / "o.png").size
    assert high > 1.5 * one[1] and wide > 1.5 * one[0]  # two rows of two columns
    with pytest.raises(ValueError, match="columns must be >= 0"):
        B.figure_panels([], tmp_path / "x.png", columns=-1)


def _family_plans():
    """Two hosts of two members: ``small`` (``grow_all`` adds 600) and ``large`` (1,200). ``grow:b0=m``
    adds 450 on both and is the best on both; ``grow:b0=s`` adds 200; ``grow:b0=big`` only fits ``large``
    at half its budget and is the best there."""
    rows = {
        "static": ((40.0, 40.0), (0.0, 0.0)),
        "grow:b0=s": ((60.0, 62.0), (200.0, 200.0)),
        "grow:b0=m": ((70.0, 72.0), (450.0, 450.0)),
        "grow:b0=big": ((50.0, 80.0), (500.0, 600.0)),
    }
    ctl = {n: {"test_acc_mean": sum(t) / 2, "params_added_mean": sum(p) / 2,
               "per_episode": [{"host_seed": h, "final_test_acc": ti, "params_added": pi}
                               for h, ti, pi in zip(HOSTS, t, p, strict=True)]}
           for n, (t, p) in rows.items()}  # fmt: skip
    return {
        "controllers": ctl,
        "meta": {"grow_all_params": 600.0, "task": "t", "eval_seed": 1, "data_seed": 2},
    }


def _ctl_hosts(tests, params, grown=("b0=s", "b0=big")):
    eps = [{"host_seed": h, "final_test_acc": t, "params_added": p, "grown": g}
           for h, t, p, g in zip(HOSTS, tests, params, grown, strict=True)]  # fmt: skip
    ctl = {"test_acc_mean": sum(tests) / 2, "params_added_mean": sum(params) / 2, "per_episode": eps}
    return {"controllers": {"ppo_greedy": ctl}}


def test_on_a_family_a_plan_fits_a_budget_where_it_fits_every_hosts_own():
    """A family's members differ in size, so each host's budget is the share of its own ``grow_all``: at
    half, 300 on the small host and 600 on the large. ``grow:b0=m`` (450 on both) fits the large host's
    budget and the mean budget (450) but not the small host's, so it is no constant plan within it: the
    bar is ``grow:b0=s``. One number for every host (the old judge) would have made ``grow:b0=m`` the
    bar; and the controller's cap was each host's own, so a seed over its host's budget is refused even
    under the mean."""
    table = B.plan_table(_family_plans())
    sizes, members = [600.0, 1200.0], ["small", "large"]
    assert B.bar_at(table, 450.0) == "grow:b0=m"  # one budget for every host: the old reading
    assert B.bar_at(table, [300.0, 600.0]) == "grow:b0=s"
    evals = {0.5: {s: _ctl_hosts((61.0 + s / 10, 80.0 + s / 10), (200.0, 600.0)) for s in range(4)}}
    out = B.judge(table, evals, sizes, members=members)
    r = out["budgets"]["0.5"]
    assert r["bar"] == "grow:b0=s" and r["budget_params_range"] == [300.0, 600.0]
    assert r["budget_params"] == pytest.approx(450.0)
    assert r["minus_bar"]["mean"] == pytest.approx((61.0 + 80.0) / 2 + 0.15 - 61.0)
    # Per member, each host's best within its own budget: `b0=s` on the small, `b0=big` on the large.
    assert r["member_bars"] == {"small": "grow:b0=s", "large": "grow:b0=big"}
    assert r["member_bar_test"] == pytest.approx((60.0 + 80.0) / 2)
    assert r["minus_member_bar"]["mean"] == pytest.approx(0.5 + 0.15)
    assert r["grown_by_member"] == {"small": [("b0=s", 4)], "large": [("b0=big", 4)]}
    assert out["grow_all_params_per_host"] == sizes and out["members"] == {"small": 1, "large": 1}
    md = B.to_markdown(out, "t")
    assert "| 0.5 (300-600) |" in md and "large: `grow:b0=big`" in md
    with pytest.raises(ValueError, match="over the budget 300"):
        B.judge(table, {0.5: {0: _ctl_hosts((61.0, 80.0), (400.0, 400.0))}}, sizes)
    with pytest.raises(ValueError, match="1 grow_all sizes for 2 hosts"):
        B.judge(table, evals, [600.0])


def test_the_family_hosts_sizes_are_read_off_the_task():
    """The CLI reads each host's ``grow_all`` and member off the task where its hosts differ by seed, and
    nothing off a task whose hosts are all one."""
    from esper.shell.env.tasks import grow_all_params, make_task

    task = make_task("mnist1d_where")
    hosts = [h for h in range(40) if task.describe_member(h)["channels"][0] in (2, 12)][:3]
    sizes, members = B.host_sizes("mnist1d_where", hosts)
    assert sizes == [float(grow_all_params(task, task.make_host_for(h))) for h in hosts]
    assert len(set(sizes)) > 1 and all(m.startswith("channels (") for m in members)
    assert B.host_sizes("mnist1d", [1, 2]) == (None, None)


def test_issue102_above_is_read_off_holms_adjusted_p_value_not_the_raw_one():
    """Three budgets, one Holm family: at 0.25 the controller is 0.8 points above its bar with a raw
    one-sided p of 0.039, under 0.05 alone but 0.118 once Holm multiplies the smallest of three p-values by
    three. "Above" is the adjusted test's, so it does not hold there (and TOST does not either)."""
    table = B.plan_table(PLANS)
    evals = {
        0.25: {s: _ctl(60.0 + d, 200.0) for s, d in enumerate((1.2, 0.2, 1.6, -0.2, 1.2))},
        0.5: {s: _ctl(v, 400.0) for s, v in enumerate((71.0, 69.0, 70.5, 69.5, 70.0))},  # ties 70
        1.0: {s: _ctl(v, 900.0) for s, v in enumerate((75.0, 74.0, 76.0, 75.5, 74.5))},  # under 80
    }
    r = B.judge(table, evals, 1000.0)["budgets"]["0.25"]
    assert r["p_above"] < B.ALPHA < r["p_above_holm"]
    assert r["p_above_holm"] == pytest.approx(3 * r["p_above"])
    assert r["above"] is False and r["not_dominated"] is False


def test_issue102_one_training_seed_is_not_judged_and_says_so(tmp_path, capsys):
    """One seed at every budget: no interval (not a zero-width one), no test, and the verdict over the
    budgets says it did not judge rather than "no"; "1 training seed", singular."""
    (tmp_path / "plans.json").write_text(json.dumps(PLANS))
    (tmp_path / "e.json").write_text(json.dumps(_ctl(61.0, 200.0)))
    rc = B.main(["--plans", str(tmp_path / "plans.json"), "--evals", f"0.25:7:{tmp_path / 'e.json'}",
                 "--out", str(tmp_path / "o.json"), "--png", str(tmp_path / "o.png")])  # fmt: skip
    md = capsys.readouterr().out
    assert rc == 0 and (tmp_path / "o.png").stat().st_size > 0
    out = json.loads((tmp_path / "o.json").read_text())
    r = out["budgets"]["0.25"]
    assert r["minus_bar"] == {"mean": pytest.approx(1.0), "ci95": None} and r["test_acc_ci95"] is None
    assert out["not_dominated_everywhere"] is None and out["min_training_seeds"] == B.MIN_SEEDS == 2
    assert "1 training seed (7), 2 fresh hosts" in md and "training seeds (7" not in md
    assert "Not dominated at every budget: **not judged** (a budget is judged on at least 2" in md
    assert "**yes**" not in md and "**no**" not in md and "[+1.00, +1.00]" not in md
    assert "| +1.00 (no interval) |" in md


def test_issue102_a_budget_short_of_seeds_leaves_the_verdict_over_the_budgets_unjudged():
    """At 0.25 five seeds are above the bar; at 0.5 one seed, untested. "Not dominated at every budget"
    cannot be yes (it read True, from the one budget judged); where a judged budget is dominated, it is
    no whatever the others."""
    table = B.plan_table(PLANS)
    above = {s: _ctl(v, 200.0) for s, v in zip(range(5), (64.0, 65.0, 63.0, 64.5, 63.5))}
    out = B.judge(table, {0.25: above, 0.5: {0: _ctl(70.0, 400.0)}}, 1000.0)
    assert out["budgets"]["0.25"]["not_dominated"] and "not_dominated" not in out["budgets"]["0.5"]
    assert out["not_dominated_everywhere"] is None
    under = {s: _ctl(v, 900.0) for s, v in zip(range(5), (75.0, 74.0, 76.0, 75.5, 74.5))}
    out = B.judge(table, {0.25: above, 0.5: {0: _ctl(70.0, 400.0)}, 1.0: under}, 1000.0)
    assert out["not_dominated_everywhere"] is False
    assert B.judge(table, {0.25: above}, 1000.0)["not_dominated_everywhere"] is True


def test_issue102_a_readout_missing_from_an_evaluation_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "plans.json").write_text(json.dumps(PLANS))
    (tmp_path / "e.json").write_text(json.dumps(_ctl(61.0, 200.0)))
    rc = B.main(["--plans", str(tmp_path / "plans.json"), "--evals", f"0.25:7:{tmp_path / 'e.json'}",
                 "--readout", "ppo", "--out", str(tmp_path / "o.json")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert "seed 7 at 0.25 has no readout 'ppo'; its readouts: ppo_greedy" in err
