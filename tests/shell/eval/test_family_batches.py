"""Evaluation on a family of hosts (issue 89): each member's hosts side by side, the records back in the
hosts' order (a family's batch must be one member, so a plain chunking of mixed hosts is refused)."""

from __future__ import annotations

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
