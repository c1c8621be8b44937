"""Pooling a task's seeds (issue 45): the evaluations of each training seed, as ``esper.shell.evaluate``
writes them, pooled into one entry per controller; what the largest plan search scored beside the
controller's plan; the committed kept seeds' tables are the ones pooled before the protocol moved here."""

from __future__ import annotations

from esper.shell.eval.suite.tasks import CONTROLLERS, FINAL_DATA_SEED


def _results(k: int, data_seed: int | None, names, run_dir=None) -> dict:
    """An evaluation's ``results.json`` as ``esper.shell.evaluate`` writes it (two episodes each)."""
    ctl = {}
    for i, name in enumerate(names):
        # episode 0 germinates two seeds, both in the final host, one fossilized; episode 1 germinates one
        # and ends with no seed in the host
        eps = [{"final_test_acc": 40.0 + i + k + e, "params_added": 10.0 * i, "return": float(i),
                "test_objective": 40.0 + i, "germinated_at": [[1, 3], [2]][e], "n_fossilized": 1 - e,
                "n_pruned": 0, "grown": ["b0=conv_heavy+b1=norm", ""][e]} for e in range(2)]  # fmt: skip
        grown = {"b0=conv_heavy": 1, "": 1} if k % 2 else {"b0=conv_heavy": 2}
        ctl[name] = {"per_episode": eps, "compute_host_epochs": 100 * i, "grown_counts": grown}
        if name.startswith(("plan_search", "heuristic_tuned")):
            ctl[name]["search"] = {"chosen": "b0=conv_heavy" if name.startswith("plan") else {"min_epoch": 1}}
        if name.startswith("plan_search"):  # what the search scored on the training hosts
            ctl[name]["search"]["candidates"] = [
                {"plan": "b0=conv_heavy+b1=conv_heavy+b2=conv_heavy", "val_acc_mean": 80.0, "episodes": 4},
                {"plan": "b0=conv_heavy", "val_acc_mean": 78.0, "episodes": 4},
                {"plan": "b0=norm", "val_acc_mean": 70.0, "episodes": 2},
            ]
    meta = {"data_seed": data_seed, "selection_data_seed": 42, "eval_seed": 1000 + k, "episodes": 2,
            "learned_compute_host_epochs": 4400, "ppo_param_cap": 720.0, "git_rev": "e" * 40,
            "run_dir": None if run_dir is None else str(run_dir)}  # fmt: skip
    return {"controllers": ctl, "correlations": {}, "meta": meta}


def test_a_controller_without_a_cap_has_no_best_plan_within_one_in_the_search_view():
    """A run with no parameter cap records a cap of 0: the diagnosis reads it as no cap, not as a cap of
    0 within which no plan fits (it said "best within the controller's cap of 0: none")."""
    from esper.shell.eval.suite.pooling import search_view
    from esper.shell.eval.suite.report import _search_view_lines

    capped, free = (_results(k, FINAL_DATA_SEED + k, CONTROLLERS) for k in (3, 4))
    free["meta"]["ppo_param_cap"] = 0.0
    view = search_view("longrange", {3: capped, 4: free})
    assert view["3"]["cap"] == 720 and view["3"]["best_within_cap"]["plan"] == "b0=conv_heavy"
    assert view["4"]["cap"] is None and view["4"]["best_within_cap"] is None
    assert view["4"]["best"]["plan"] == "b0=conv_heavy+b1=conv_heavy+b2=conv_heavy"
    three, four = (ln for ln in _search_view_lines(view) if ln.startswith("- seed"))
    assert "within the controller's cap of 720" in three
    assert "cap" not in four and "the controller's: `b0=conv_heavy` 78.0 %" in four


def test_each_row_keeps_its_seeds_means_in_seed_order_and_a_family_its_precheck():
    """Issue 89's schema: every row's ``per_seed_test_acc`` in the same training seed order (whatever
    order the seeds came in), each episode's plan for the learned readouts and the per-host oracle
    (``plans_per_seed``), and a family's ``"family": true`` with its pre-check; a task that is no family
    carries neither."""
    import pytest

    from esper.shell.eval.suite.pooling import family_fields, pool_task
    from esper.shell.eval.suite.tasks import ORACLE

    names = ("ppo", "ppo_greedy", "static", ORACLE)
    per_seed = {k: _results(k, FINAL_DATA_SEED + k, names) for k in (4, 3)}
    precheck = {"hosts": 40, "oracle_minus_best_constant": 5.2, "share_best_differs": 0.4, "eval_seeds": [9]}
    entry = pool_task("longrange", per_seed, precheck=precheck)
    for i, name in enumerate(names):
        c = entry["controllers"][name]
        assert c["training_seeds"] == [3, 4]
        assert c["per_seed_test_acc"] == pytest.approx([40.0 + i + 3.5, 40.0 + i + 4.5])
        plans = [["b0=conv_heavy+b1=norm", ""]] * 2
        assert c.get("plans_per_seed") == (None if name == "static" else plans)
    assert entry["family"] is True and entry["precheck"] == precheck
    plain = pool_task("longrange", per_seed)
    assert "family" not in plain and "precheck" not in plain
    with pytest.raises(ValueError, match="missing oracle_minus_best_constant, share_best_differs"):
        family_fields({"hosts": 30})


def test_issue102_a_familys_per_member_cap_is_no_one_cap_in_the_search_view():
    """On a family an evaluation's meta gives a cap per member (a dict): the diagnosis scores plans on one
    host, so it reads no cap there (it raised a TypeError comparing a plan's size with the dict)."""
    from esper.shell.eval.suite.pooling import search_view

    res = _results(3, FINAL_DATA_SEED + 3, CONTROLLERS)
    res["meta"]["ppo_param_cap"] = {"channels 2-8-8": 138.0, "channels 8-8-8": 200.0}
    view = search_view("longrange", {3: res})
    assert view["3"]["cap"] is None and view["3"]["best_within_cap"] is None
    assert view["3"]["best"]["plan"] == "b0=conv_heavy+b1=conv_heavy+b2=conv_heavy"


def test_issue102_a_rows_interval_is_over_its_seeds_means_and_its_compute_their_mean():
    """Pooled over training seeds: the 95 % interval is Student-t of the seeds' means (3 seeds, 2 degrees
    of freedom), not of the episodes pooled as if independent; the host epochs a row spent, their mean over
    the seeds (not the largest, nor the sum)."""
    import pytest

    from esper.shell.eval.stats import mean_ci95
    from esper.shell.eval.suite.pooling import pool_task

    per_seed = {k: _results(k, FINAL_DATA_SEED + k, ("ppo_greedy", "probe")) for k in (3, 4, 6)}
    for k, spent in zip((3, 4, 6), (100, 200, 600), strict=True):
        per_seed[k]["controllers"]["probe"]["compute_host_epochs"] = spent
    c = pool_task("longrange", per_seed)["controllers"]
    means = [40.0 + 3.5, 40.0 + 4.5, 40.0 + 6.5]  # episodes 40 + k and 41 + k (ppo_greedy, the first row)
    assert c["ppo_greedy"]["per_seed_test_acc"] == pytest.approx(means)
    m, (lo, hi) = mean_ci95(means)
    assert c["ppo_greedy"]["test_acc_mean"] == pytest.approx(m)
    assert c["ppo_greedy"]["test_acc_ci95"] == pytest.approx([lo, hi])
    assert hi - lo == pytest.approx(2 * 4.303 * 1.5275252 / 3**0.5, rel=1e-4)  # t(0.975, 2) s / sqrt(3)
    assert c["probe"]["compute_host_epochs"] == 300
