"""bc_loss, iql_losses and expectile_td_losses under torch.compile: fullgraph traces (no graph break),
compiled == eager, values and gradients."""

from __future__ import annotations

import torch

from esper.core.loss import total_loss
from esper.core.offline import bc_loss, expectile_td_losses, iql_losses
from esper.core.spec import HEADS
from tests.core.test_offline import offline_batch


def test_bc_loss_compiles_fullgraph(compile_check):
    td = offline_batch(3, 5, seed=13, grad=False)
    td["collector", "mask"] = torch.rand(3, 5) > 0.2
    compile_check(lambda td: bc_loss(td, entropy_coef=0.01), td)


def test_iql_losses_compile_fullgraph(compile_check):
    td = offline_batch(3, 5, seed=14, grad=False)
    td["collector", "mask"] = torch.rand(3, 5) > 0.2
    fn = lambda td: iql_losses(td, expectile=0.7, temperature=3.0, q_coef=0.5, entropy_coef=0.01)
    compile_check(fn, td)
    compile_check(fn, td, backend="eager")


def test_iql_losses_compile_fullgraph_with_one_critic(compile_check):
    td = offline_batch(2, 4, seed=16, grad=False)
    td["current", "state_action_value"] = td["current", "state_action_value"][..., 0]
    td["target", "state_action_value"] = td["target", "state_action_value"][..., :1]
    compile_check(lambda td: iql_losses(td), td, backend="eager")


def test_expectile_td_losses_compile_fullgraph(compile_check):
    td = offline_batch(3, 5, seed=14, grad=False)
    td["collector", "mask"] = torch.rand(3, 5) > 0.2
    compile_check(lambda td: expectile_td_losses(td, expectile=0.7, temperature=3.0, entropy_coef=0.01), td)


def test_compiled_offline_gradients_equal_eager():
    fns = (
        lambda td: total_loss(bc_loss(td)),
        lambda td: total_loss(iql_losses(td)),
        lambda td: total_loss(expectile_td_losses(td)),
    )
    for fn in fns:
        torch._dynamo.reset()
        td = offline_batch(3, 5, seed=15)
        leaves = [td["current", h, "logits"] for h in HEADS]
        leaves += [td["current", "state_value"], td["current", "state_action_value"]]
        eager = torch.autograd.grad(fn(td), leaves, allow_unused=True)
        compiled = torch.autograd.grad(
            torch.compile(fn, fullgraph=True, backend="aot_eager")(td), leaves, allow_unused=True
        )
        for a, b in zip(eager, compiled):
            if a is None:
                assert b is None
            else:
                torch.testing.assert_close(a, b)
