"""ppo_loss under torch.compile: fullgraph traces (no graph break) and compiled == eager, values and
gradients; one inductor-compiled numerical check."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from esper.core.loss import ppo_loss, total_loss
from esper.core.spec import HEADS
from tests.core.test_loss import _torchrl_setup, factored_batch


def test_factored_loss_compiles_fullgraph(compile_check):
    td = factored_batch(3, 5, seed=13, grad=False)
    td["collector", "mask"] = torch.rand(3, 5) > 0.2
    compile_check(lambda td: ppo_loss(td, factored=True, target_kl=0.01), td, rtol=1e-5, atol=1e-6)


def test_single_head_loss_compiles_fullgraph(compile_check):
    net, _, _, td = _torchrl_setup((4, 6))
    td["current"] = TensorDict({"logits": net(td["observation"]).detach()}, [4, 6])
    compile_check(lambda td: ppo_loss(td), td)


def test_compiled_loss_gradients_equal_eager():
    torch._dynamo.reset()
    td = factored_batch(3, 5, seed=14)
    leaves = [td["current", h, "logits"] for h in HEADS] + [td["current", "state_value"]]
    eager = torch.autograd.grad(total_loss(ppo_loss(td, factored=True)), leaves)
    fn = lambda td: total_loss(ppo_loss(td, factored=True))
    fn = torch.compile(fn, fullgraph=True, backend="aot_eager")
    compiled = torch.autograd.grad(fn(td), leaves)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b)


@pytest.mark.inductor
def test_factored_loss_inductor_matches_eager():
    torch._dynamo.reset()
    td = factored_batch(4, 25, seed=15)
    leaves = [td["current", h, "logits"] for h in HEADS] + [td["current", "state_value"]]
    fn = lambda td: total_loss(ppo_loss(td, factored=True, target_kl=0.02))
    eager = torch.autograd.grad(fn(td), leaves)
    compiled_fn = torch.compile(fn, fullgraph=True)
    compiled = torch.autograd.grad(compiled_fn(td), leaves)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_torchrl_parity_arguments_and_one_hot_actions_compile_fullgraph(compile_check):
    net, _, critic, td = _torchrl_setup((4, 6))
    td["action"] = torch.nn.functional.one_hot(td["action"], 4).bool()
    current = {"logits": net(td["observation"]).detach(), "state_value": critic(td.clone())["state_value"]}
    td["current"] = TensorDict(current, [4, 6]).detach()
    for critic_loss in ("smooth_l1", "l2"):
        fn = lambda td, c=critic_loss: ppo_loss(
            td, critic_loss=c, value_coef=1.0, value_clip=None, normalize_entropy=False
        )
        compile_check(fn, td)


def test_data_parallel_loss_with_summed_counts_compiles_fullgraph(compile_check):
    """``loss_counts`` and ``ppo_loss(counts=)``: what each process computes on its part of a batch."""
    from esper.core.loss import loss_counts

    td = factored_batch(4, 5, seed=21, grad=False)
    compile_check(lambda td: loss_counts(td, factored=True), td)
    counts = loss_counts(td, factored=True) + loss_counts(td[:2], factored=True)
    compile_check(lambda td, c: ppo_loss(td, factored=True, counts=c), td[2:], counts)


def test_minus_inf_logits_compile_fullgraph(compile_check):
    net, _, _, td = _torchrl_setup((3, 4))
    logits = net(td["observation"]).detach()
    logits[..., -1] = -torch.inf
    td["action"] = td["action"] % (logits.shape[-1] - 1)
    td["current"] = TensorDict({"logits": logits}, [3, 4])
    compile_check(lambda td: ppo_loss(td), td)


def test_decouple_compiles_fullgraph(compile_check):
    from esper.core.loss import decouple

    td = factored_batch(3, 5, seed=15, grad=False)
    compile_check(lambda td: decouple(td, factored=True), td)


def test_entropy_floor_compiles_fullgraph_alone_and_with_summed_counts(compile_check):
    """``ppo_loss(entropy_floor=...)`` (004 P-4), one process and a part of several (the hinge judged on
    the summed entropies), values and gradients."""
    from esper.core.loss import loss_counts

    td = factored_batch(4, 5, seed=22, grad=False)
    fn = lambda td: ppo_loss(td, factored=True, entropy_floor=0.6, entropy_floor_coef=0.2)
    compile_check(fn, td)
    compile_check(lambda td: loss_counts(td, factored=True, entropy=True), td)
    counts = loss_counts(td, factored=True, entropy=True)
    compile_check(lambda td, c: ppo_loss(td, factored=True, counts=c, entropy_floor=0.6), td[2:], counts)
    torch._dynamo.reset()
    td = factored_batch(3, 5, seed=23)
    leaves = [td["current", h, "logits"] for h in HEADS]
    loss = lambda td: total_loss(ppo_loss(td, factored=True, entropy_floor=0.7))
    eager = torch.autograd.grad(loss(td), leaves)
    compiled = torch.autograd.grad(torch.compile(loss, fullgraph=True, backend="aot_eager")(td), leaves)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b)
