"""Evaluation on a family of hosts (issue 89): each member's hosts side by side, the records back in the
hosts' order (a family's batch must be one member, so a plain chunking of mixed hosts is refused)."""

from __future__ import annotations

import pytest

from esper.shell.baselines.simple import StaticController
from esper.shell.config.presets import preset
from esper.shell.env.tasks import make_task, where_member
from esper.shell.eval.runner import batches_of, run_hosts
from esper.shell.eval.store import grow_spec, run_specs


def _mixed_seeds(n_first: int = 2) -> list[int]:
    """Seeds of two members interleaved: first-member, other, first-member, ..."""
    first = repr(where_member(0))
    same = [s for s in range(200) if repr(where_member(s)) == first][:n_first]
    other = [s for s in range(200) if repr(where_member(s)) != first][:1]
    return [same[0], other[0], *same[1:]]


def test_batches_group_a_familys_hosts_by_member_and_chunk_the_rest_in_order():
    task = make_task("mnist1d_where", splits=(300, 60, 60))
    seeds = _mixed_seeds(3)  # a, b, a, a
    assert batches_of(task, seeds, 2) == [[0, 2], [3], [1]]
    plain = make_task("mnist1d", splits=(300, 60, 60))
    assert batches_of(plain, seeds, 3) == [[0, 1, 2], [3]]


def test_run_hosts_on_a_family_runs_each_member_apart_and_keeps_the_order():
    cfg = preset("smoke", {"env.task": "mnist1d_where", "lifecycle.max_epochs": 2, "env.workers": 1})
    task = cfg.env.build_task()
    seeds = _mixed_seeds()  # a, b, a: one batch of a's two, one of b
    records = run_hosts(cfg, task, lambda env, batch: StaticController(), seeds)
    assert [r["host_seed"] for r in records] == seeds
    alone = run_hosts(cfg, task, lambda env, batch: StaticController(), seeds[1:2])
    assert alone[0]["final_test_acc"] == records[1]["final_test_acc"]  # b ran alone in both


def test_fixed_plans_on_a_familys_mixed_hosts_each_run_their_own_plan():
    """run_specs on a family: the hosts regroup by member, and each host still runs the plan paired with
    it (the batch's indices map back to the pairs, not a slice from its first)."""
    cfg = preset("smoke", {"env.task": "mnist1d_where", "lifecycle.max_epochs": 3, "env.workers": 1})
    task = cfg.env.build_task()
    names, blueprints = task.make_host().slot_names, task.make_host().blueprint_names
    seeds = _mixed_seeds(3)  # a, b, a, a: batches [0, 2], [3], [1] at width 2
    plans = [{0: blueprints.index("norm")}, {1: blueprints.index("norm")}, {}, {2: blueprints.index("norm")}]
    specs = [grow_spec(p, names, blueprints) for p in plans]
    records, _ = run_specs(cfg, task, list(zip(specs, seeds, strict=True)), width=2)
    assert [r["host_seed"] for r in records] == seeds
    germinated = [[(g["slot"], g["blueprint"]) for g in r["germinations"]] for r in records]
    assert germinated == [[(0, "norm")], [(1, "norm")], [], [(2, "norm")]]


def test_issue102_an_evaluations_meta_gives_a_familys_sizes_per_member():
    """``grow_all_params``, ``param_budget`` and ``ppo_param_cap`` of a family's evaluation are each member's
    (a dict over the members evaluated), not the first member's numbers as if they were the task's (they
    read 828 and 138 on ``mnist1d_where``, a narrow host's); on a task of one host, one number as before."""
    from esper.shell.env.tasks import grow_all_params
    from esper.shell.eval.episodes import member_label, size_meta
    from esper.shell.eval.output import report_markdown

    cfg = preset("smoke", {"env.task": "mnist1d_where", "ppo.param_cap_share": 1 / 6,
                           "reward.param_budget_share": 1 / 6})  # fmt: skip
    task = make_task("mnist1d_where", splits=(300, 60, 60))
    seeds = _mixed_seeds()  # a, b, a
    meta = size_meta(cfg, task, seeds)
    a, b = (member_label(where_member(s)) for s in seeds[:2])
    assert a.startswith("channels ") and a != b
    full = {m: float(grow_all_params(task, task.host_for(s))) for m, s in ((a, seeds[0]), (b, seeds[1]))}
    assert meta["grow_all_params"] == full and len(set(full.values())) == 2
    assert meta["ppo_param_cap"] == pytest.approx({m: v / 6 for m, v in full.items()})
    assert meta["param_budget"] == pytest.approx({m: v / 6 for m, v in full.items()})
    assert meta["members"] == {a: 2, b: 1}
    plain = preset("smoke", {"ppo.param_cap_share": 0.5})
    one = size_meta(plain, plain.env.build_task(), [1, 2])
    assert set(one) == {"grow_all_params", "param_budget", "ppo_param_cap"}
    assert one["ppo_param_cap"] == pytest.approx(one["grow_all_params"] / 2)
    # the report says each member's cap; the suite's plan within the cap reads no one member's
    results = {"meta": {"run_dir": "r", "episodes": 3, "eval_seed": 1, "torch_threads": 1, "task": "t",
                        "ppo_acts": "-", "ppo_param_cap_share": 1 / 6, "param_weight": 1.0,
                        "param_over_weight": 2.0, **meta},
               "controllers": {}, "correlations": {"n_episodes": 0, "return_vs_test_acc": None,
                                                   "return_vs_test_acc_per_kparam": None,
                                                   "return_vs_test_objective": None}}  # fmt: skip
    md = report_markdown(results, [])
    assert f"{full[a] / 6:g} on {a}; {full[b] / 6:g} on {b}" in md
    assert f"(added − the host's budget, where > 0: {full[a] / 6:g} on {a}" in md
    from esper.shell.suite.runs import with_plan_in_cap

    scored = {"plan_search@1x": {"search": {"candidates": [{"plan": "b0=norm", "val_acc_mean": 1.0,
                                                             "episodes": 1}]}}}  # fmt: skip
    res = {"controllers": scored, "meta": meta}
    assert with_plan_in_cap(res, "mnist1d", None, 0, 1, "x", None, []) is res  # no one member's cap read
    assert res["controllers"] == scored


def test_issue102_a_familys_evaluation_writes_its_sizes_per_member_of_its_own_hosts():
    """The evaluation's meta (results.json) holds :func:`size_meta` of the hosts it evaluated."""
    from esper.shell.common.seeding import eval_host_seeds
    from esper.shell.eval.episodes import compare_on_config, member_label

    over = {"env.task": "mnist1d_where", "lifecycle.max_epochs": 1, "env.workers": 1, "env.train_batches": 1,
            "env.val_batches": 1, "ppo.param_cap_share": 1 / 6}  # fmt: skip
    cfg, task = preset("smoke", over), make_task("mnist1d_where", splits=(300, 60, 60))
    meta = compare_on_config(cfg, ["static"], episodes=3, seed=5, show_progress=False, task=task)["meta"]
    members = [member_label(where_member(s)) for s in eval_host_seeds(5, range(3))]
    assert meta["members"] == {m: members.count(m) for m in members} and len(set(members)) == 2
    assert set(meta["grow_all_params"]) == set(meta["ppo_param_cap"]) == set(members)
    assert all(meta["ppo_param_cap"][m] == pytest.approx(g / 6) for m, g in meta["grow_all_params"].items())
