"""The baselines that try, on a family of hosts (issue 89): the probe and the widened heuristic price each
host by its own sizes, and the capped plan search keeps only constant plans that fit every member.

Before, each read one member's (``task.make_host()``'s) costs and budget on every host: on
``mnist1d_where`` a two-channel first block's, so a pooled-early host's ``b0`` seeds were priced as tiny."""

from __future__ import annotations

import math

import pytest

from esper.shell.baselines.heuristic import HeuristicController
from esper.shell.baselines.probe import ProbeController
from esper.shell.config.presets import preset
from esper.shell.env.tasks import make_task, seed_params, where_member
from esper.shell.env.vecenv import VecEnv
from esper.shell.eval import search as S
from esper.shell.eval.controllers import make_controller

SPLITS = (300, 60, 60)


def _cfg(**over):
    return preset("smoke", {"env.task": "mnist1d_where", "env.workers": 1, "ppo.param_cap_share": 1 / 6,
                            "reward.param_budget_share": 1 / 6, **over})  # fmt: skip


def _other_member_seed(task) -> int:
    """A host seed whose member is not ``task.make_host()``'s (its first block is wide)."""
    first = task.make_host().slots[0].width
    return next(s for s in range(200) if where_member(s)["channels"][0] != first)


def test_prices_read_each_members_own_host():
    task = make_task("mnist1d_where", splits=SPLITS)
    cfg = _cfg()
    seed = _other_member_seed(task)
    here, there = S.prices(cfg, task), S.prices(cfg, task, seed)
    assert here.costs[0] != there.costs[0]  # a narrow b0 against a wide one
    assert there.costs == S.seed_costs(task, seed)
    assert there.budget == pytest.approx(there.grow_all / 6)
    assert there.budget == pytest.approx(S.learner_cap(cfg, task, seed))
    assert S.prices(_cfg(**{"env.task": "mnist1d"}), make_task("mnist1d", splits=SPLITS)).budget > 0


@pytest.mark.parametrize("name", [S.PROBE, S.HEURISTIC_TUNED_WIDE])
def test_the_probe_and_the_widened_heuristic_are_priced_by_the_batchs_member(name):
    task = make_task("mnist1d_where", splits=SPLITS)
    cfg = _cfg()
    seed = _other_member_seed(task)
    env = VecEnv(cfg.env, cfg.lifecycle, cfg.governor, seed=0, task=task, reward=cfg.reward)
    try:
        searched = {"chosen": {}, "budget_params": 1.0, "unit_params": 1.0}
        ctl = make_controller(name, cfg, env, checkpoint=None, seed=0, searched=searched, host_seed=seed)
    finally:
        env.close()
    want = S.prices(cfg, task, seed)
    if name == S.PROBE:
        assert isinstance(ctl, ProbeController)
        assert ctl.costs == want.costs and ctl.budget == pytest.approx(want.budget)
        assert ctl.unit == pytest.approx(want.grow_all / 3)
    else:
        assert isinstance(ctl, HeuristicController)
        assert ctl.costs == want.costs


def test_the_capped_plan_search_keeps_only_plans_that_fit_every_member():
    task = make_task("mnist1d_where", splits=SPLITS)
    cfg = _cfg()
    host = task.make_host()
    space = S.plan_space(task, host.slot_names, [True] * 3, 0)
    kept = S.plans_under_cap(space, cfg, task)
    members = S.member_seeds(task, S.selection_host_seeds(cfg, S.FAMILY_FIT_HOSTS))
    assert len(members) >= 2
    for seed in members:
        member = S.host_of(task, seed)
        assert all(seed_params(task, member, p) <= S.learner_cap(cfg, task, seed) for p in kept)
    # the first member's cap alone (the old reading) admits plans another member cannot hold
    alone = S.plans_within(space, task, host, S.learner_cap(cfg, task))
    assert set(kept) < set(alone) and kept
    assert not math.isinf(S.learner_budget(cfg, task, members[-1]))
