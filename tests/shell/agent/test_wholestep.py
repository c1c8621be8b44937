"""The traceable Adam/AdamW step: the optimizer's own update (eager, and compiled into one graph with
forward and backward), ``skip`` leaves everything untouched, the state is the optimizer's."""

from __future__ import annotations

import copy

import pytest
import torch

from esper.shell.agent.wholestep import adam_step, compile_step, init_adam_state


def _net_and_opts(kind: str = "adamw", **kw):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}[kind]
    groups = lambda n: [
        {"params": list(n[0].parameters()), "weight_decay": 0.0},
        {"params": list(n[2].parameters()), "weight_decay": 0.1, "lr": 3e-2},
    ]
    ref = copy.deepcopy(net)
    return net, cls(groups(net), lr=1e-2, eps=1e-5, **kw), ref, cls(groups(ref), lr=1e-2, eps=1e-5, **kw)


def _loss(net, x):
    return net(x).square().mean()


def _three_steps_match(net, opt, ref, ref_opt, x, **step_kw):
    """Three steps of ``adam_step(opt, **step_kw)`` on ``net`` and of ``ref_opt.step()`` on ``ref``
    leave the same parameters."""
    for _ in range(3):
        _loss(net, x).backward()
        adam_step(opt, **step_kw)
        opt.zero_grad(set_to_none=True)
        _loss(ref, x).backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
    for a, b in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b)


KINDS = [("adamw", {}), ("adam", {"weight_decay": 0.01}), ("adam", {"amsgrad": True})]


@pytest.mark.parametrize(("kind", "kw"), KINDS)
def test_adam_step_is_the_optimizers_step(kind, kw):
    net, opt, ref, ref_opt = _net_and_opts(kind, **kw)
    init_adam_state(opt)
    x = torch.randn(16, 3)
    _three_steps_match(net, opt, ref, ref_opt, x)
    # the state is the optimizer's: an eager optimizer loads it and goes on from there
    ref_opt.load_state_dict(opt.state_dict())
    assert float(ref_opt.state[ref[0].weight]["step"]) == 3.0


@pytest.mark.parametrize(("kind", "kw"), KINDS[:2])
def test_scale_is_the_step_at_a_scaled_learning_rate(kind, kw):
    """``scale=s`` moves the parameters as the optimizer does at ``s x lr`` (every group's, decoupled
    and L2 weight decay alike), with the same moments; ``skip`` still wins."""
    net, opt, ref, ref_opt = _net_and_opts(kind, **kw)
    init_adam_state(opt)
    for group in ref_opt.param_groups:
        group["lr"] *= 0.3
    x = torch.randn(16, 3)
    _three_steps_match(net, opt, ref, ref_opt, x, scale=torch.tensor(0.3))
    before = [p.clone() for p in net.parameters()]
    _loss(net, x).backward()
    adam_step(opt, skip=torch.tensor(True), scale=torch.tensor(0.3))
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), before))


def test_skip_leaves_parameters_and_state_untouched():
    net, opt, _, _ = _net_and_opts()
    init_adam_state(opt)
    x = torch.randn(16, 3)
    _loss(net, x).backward()
    adam_step(opt)
    before = copy.deepcopy((list(net.parameters()), opt.state_dict()))
    _loss(net, x).backward()
    adam_step(opt, skip=torch.tensor(True))
    for a, b in zip(net.parameters(), before[0]):
        assert torch.equal(a, b)
    for p_id, state in opt.state_dict()["state"].items():
        for k, v in state.items():
            assert torch.equal(v, before[1]["state"][p_id][k]), k
    adam_step(opt, skip=torch.tensor(False))
    assert not torch.equal(net[0].weight, before[0][0])


def test_init_keeps_a_resumed_state_and_refuses_other_optimizers():
    net, opt, _, _ = _net_and_opts()
    init_adam_state(opt)
    opt.state[net[0].weight]["step"].fill_(7.0)
    init_adam_state(opt)
    assert float(opt.state[net[0].weight]["step"]) == 7.0
    with pytest.raises(TypeError, match="Adam or AdamW, got SGD"):
        init_adam_state(torch.optim.SGD(net.parameters(), lr=0.1))


def test_compiled_whole_step_is_one_graph_and_equals_eager():
    """forward + backward + clip + AdamW in one fullgraph (aot_eager), no recompile over calls with
    a changing tensor coefficient, the same parameters as the eager step."""
    net, opt, ref, ref_opt = _net_and_opts()
    init_adam_state(opt)
    params = list(net.parameters())
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        from torch._dynamo.backends.debugging import aot_eager

        return aot_eager(gm, example_inputs)

    def step(x, coef):
        loss = _loss(net, x) * coef
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 0.5)
        adam_step(opt)
        for p in params:
            p.grad = None
        return loss.detach(), norm

    torch._dynamo.reset()
    compiled = compile_step(step, backend=counting)
    for i in range(4):
        x, coef = torch.randn(16, 3), torch.tensor(1.0 + i)
        loss, _ = compiled(x, coef)
        ref_loss = _loss(ref, x) * coef
        ref_loss.backward()
        torch.nn.utils.clip_grad_norm_(list(ref.parameters()), 0.5)
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        torch.testing.assert_close(loss, ref_loss.detach())
    assert len(graphs) == 1
    for a, b in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b)
