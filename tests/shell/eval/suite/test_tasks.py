"""The suite's tasks (issue 45) and the readings of transfer and fine-tuning after it (issue 46): every
task's preset holds the default's size prior, a kept run's cap is read from its settings, the amortization
reads ``plan_search``'s curve, and the fine-tuned start is caught up with where the curves say."""

from __future__ import annotations

import pytest

from esper.shell.eval.suite.tasks import SUITE, plan_name
from esper.shell.eval.suite.transfer import amortization


def test_amortization_reads_plan_search_s_curve():
    def ctl(target, curve):
        out = {"ppo_greedy": {"test_acc_mean": target}}
        for m, (x, a) in zip((0.25, 0.5, 1.0, 2.0), curve):
            out[plan_name(m)] = {"compute_host_epochs": x, "test_acc_mean": a}
        return out

    curve = [(1000, 60.0), (2000, 70.0), (4000, 80.0), (8000, 85.0)]
    assert amortization(ctl(75.0, curve)) == {"readout": "ppo_greedy", "test_acc_mean": 75.0,
                                                   "host_epochs": 3000, "bound": "about"}  # fmt: skip
    assert amortization(ctl(55.0, curve))["bound"] == "at most"
    assert amortization(ctl(55.0, curve))["host_epochs"] == 1000
    assert (amortization(ctl(90.0, curve))["bound"], amortization(ctl(90.0, curve))["host_epochs"]) == (
        "more than",
        8000,
    )
    assert amortization({"ppo_greedy": {"test_acc_mean": 50.0}})["host_epochs"] is None


def test_catch_up_is_the_first_update_scratch_reaches_the_tuned_start():
    from esper.shell.eval.suite.finetune import catch_up

    tuned = {"updates": [1, 2, 3], "test_acc_mean": [70.0, 71.0, 72.0]}
    assert catch_up(tuned, {"updates": [1, 2, 3], "test_acc_mean": [60.0, 70.0, 75.0]}) == 2
    assert catch_up(tuned, {"updates": [1, 2, 3], "test_acc_mean": [60.0, 65.0, 69.9]}) is None


def test_a_kept_runs_cap_is_read_from_its_settings_then_its_preset():
    from esper.shell.eval.suite.tasks import kept_has_cap

    assert not kept_has_cap("longrange", {"ppo": {"param_cap": 0.0, "param_cap_share": 0.0}})
    assert kept_has_cap("longrange", {"ppo": {"param_cap": 0.0, "param_cap_share": 0.6}})
    assert kept_has_cap("longrange", {"ppo": {"param_cap": 500.0, "param_cap_share": 0.0}})
    assert kept_has_cap("longrange", {"seed": 3}) and kept_has_cap("longrange", None)  # the preset's cap


@pytest.mark.parametrize("task", sorted(SUITE))
def test_the_default_s_size_prior_reads_each_seed_s_cost_on_every_suite_task(task):
    """Issue 45: a prior stays only if it is stated in terms any host has and is tested on every task. The
    suite's one controller (the default's settings, untrained) grows each legal blueprint about in
    proportion to what germinating it costs in the chosen slot, on each suite task's own host, at every
    slot: its blueprint catalogue, slot count and widths, read from the host, not from MNIST-1D."""
    import torch

    from esper.shell.agent.agent import build_agent
    from esper.shell.config.presets import preset
    from esper.shell.env.tasks import grow_all_params
    from esper.shell.host.descriptors import describe_host
    from tests.shell.agent.test_setpolicy import _spec, assert_size_prior

    cfg = preset(SUITE[task])
    assert cfg.ppo.policy == "set" and cfg.ppo.size_bias == 1.0  # the prior under test is the default's
    with torch.random.fork_rng(devices=[]):
        task_ = cfg.env.build_task()
        host = task_.make_host()
        layout = describe_host(host, grow_all_params=grow_all_params(task_, host))
        agent = build_agent(cfg.ppo, _spec(layout), device="cpu")
    assert_size_prior(agent, layout)
