"""The FLOP counter (issue 103): PyTorch's FlopCounterMode gives a convolution's and a linear layer's
analytic counts, forward and backward; each pass is counted once per architecture and batch shape; a pass
counts what the host runs in it (its seeds by role, a pass resumed at a slot from there); counting leaves the
host, its optimizer state and the generators as they were; the meta device and a real copy count alike."""

from __future__ import annotations

import torch
from torch import nn

from esper.core.spec import Stage, Style
from esper.shell.host import flops
from esper.shell.host.blueprints import BLUEPRINTS
from esper.shell.host.flops import FlopCounter, count_flops, eval_cost, seed_roles, train_cost
from esper.shell.host.hosts import CNN1dHost

BP = {n: i for i, n in enumerate(BLUEPRINTS["cnn1d"])}
#: A training batch of the default 1-D host: 16 signals of length 40 and their labels.
SHAPE = ((16, 1, 40), torch.float32, (16,), torch.int64)


def _host(seed: int = 0) -> CNN1dHost:
    torch.manual_seed(seed)
    return CNN1dHost()


def test_a_convolution_counts_2_b_cout_lout_cin_k_forward_and_once_more_per_gradient_backward():
    B, C_in, C_out, L, k = 4, 3, 5, 20, 3
    conv = nn.Conv1d(C_in, C_out, k, padding=1)  # "same": L_out = L
    forward = 2 * B * C_out * L * C_in * k
    x = torch.randn(B, C_in, L)
    assert count_flops(lambda: conv(x)) == forward
    # backward: the weight's gradient costs a forward; the input's another, where the input needs one
    assert count_flops(lambda: conv(x).sum().backward()) == forward + forward
    x.requires_grad_(True)
    assert count_flops(lambda: conv(x).sum().backward()) == forward + 2 * forward
    # a stride and no padding: the output's length is what the formula reads
    strided = nn.Conv1d(C_in, C_out, k, stride=2, bias=False)
    assert (
        count_flops(lambda: strided(torch.randn(B, C_in, L))) == 2 * B * C_out * ((L - k) // 2 + 1) * C_in * k
    )


def test_a_linear_layer_counts_2_b_in_out_forward_and_once_more_per_gradient_backward():
    B, n_in, n_out = 6, 7, 9
    lin = nn.Linear(n_in, n_out)
    forward = 2 * B * n_in * n_out  # the bias adds nothing
    x = torch.randn(B, n_in)
    assert count_flops(lambda: lin(x)) == forward
    assert count_flops(lambda: lin(x).sum().backward()) == 2 * forward  # the weight's gradient
    x.requires_grad_(True)
    assert count_flops(lambda: lin(x).sum().backward()) == 3 * forward  # and the input's


def test_the_cache_counts_an_architecture_and_a_batch_shape_once(monkeypatch):
    calls = []
    real = flops.count_flops
    monkeypatch.setattr(flops, "count_flops", lambda run: calls.append(1) or real(run))
    counter = FlopCounter()
    host = _host()
    first = counter.train(host, SHAPE)
    n = len(calls)
    assert counter.runs == 1 and n >= 1
    assert counter.train(host, SHAPE) == first  # the same architecture and shape: read, not counted
    assert counter.train(_host(1), SHAPE) == first  # another host of the same architecture: the same
    assert (counter.runs, len(calls)) == (1, n)
    counter.train(host, ((8, 1, 40), torch.float32, (8,), torch.int64))  # another batch shape
    assert counter.runs == 2
    host.germinate(0, BP["conv_heavy"], Style.LINEAR_ADD)
    host.set_slot(0, alpha=0.3, stage=Stage.BLENDING)
    grown = counter.train(host, SHAPE)  # another architecture
    assert counter.runs == 3 and grown.host > first.host
    host.set_slot(0, alpha=0.8, stage=Stage.BLENDING)  # another alpha, the same graph
    assert counter.train(host, SHAPE) == grown and counter.runs == 3
    host.set_slot(0, alpha=0.8, stage=Stage.HOLDING)  # another stage of the same role: the same graph
    assert counter.train(host, SHAPE) == grown and counter.runs == 3
    # validation is counted apart (its own shape and passes), once
    counter.eval(host, SHAPE)
    counter.eval(host, SHAPE)
    assert counter.runs == 4


def test_a_pass_counts_the_seeds_it_runs_by_their_role():
    host = _host()
    bare = train_cost(host, SHAPE)
    assert bare.whatif == 0
    host.germinate(1, BP["conv_heavy"], Style.LINEAR_ADD)  # incubating: the host pass skips it
    incubating = train_cost(host, SHAPE)
    assert incubating.host == bare.host and incubating.whatif > 0
    assert seed_roles(host, "train") == ((1, "conv_heavy", False, "incubating"),)
    host.set_slot(1, alpha=0.0, stage=Stage.BLENDING)  # alpha 0 out of incubation: skipped everywhere
    assert train_cost(host, SHAPE) == bare and seed_roles(host, "train") == ()
    host.set_slot(1, alpha=0.5, stage=Stage.BLENDING)  # blended on the detached activation
    detached = train_cost(host, SHAPE)
    host.set_slot(1, alpha=0.5, stage=Stage.FOSSILIZED)  # on the live one: the input's gradient too
    live = train_cost(host, SHAPE)
    assert bare.host < detached.host < live.host and detached.whatif == live.whatif == 0
    # the what-if pass of a seed in the last slot runs that slot and the head, not the host before it
    late = _host()
    late.germinate(2, BP["conv_heavy"], Style.LINEAR_ADD)
    assert 0 < train_cost(late, SHAPE).whatif < incubating.whatif
    # validation: the host pass, each blended seed's counterfactual from its slot, each incubating seed's
    # pass at alpha 1 from its slot
    host.germinate(2, BP["conv_small"], Style.GATED_GATE)
    cost = eval_cost(host, SHAPE)
    assert cost.host > eval_cost(_host(), SHAPE).host and cost.counterfactual > 0 and cost.whatif > 0
    assert seed_roles(host, "eval") == (
        (1, "conv_heavy", False, "blended"),
        (2, "conv_small", True, "incubating"),
    )


def test_counting_leaves_the_host_and_the_generators_as_they_were():
    host = _host()
    host.germinate(0, BP["conv_light"], Style.LINEAR_ADD)
    host.set_slot(0, alpha=1.0, stage=Stage.FOSSILIZED)
    host.germinate(1, BP["depthwise"], Style.GATED_GATE)
    state = {k: v.clone() for k, v in host.state_dict().items()}
    rng = torch.get_rng_state()
    counter = FlopCounter()
    counter.train(host, SHAPE)
    counter.eval(host, SHAPE)
    assert torch.equal(torch.get_rng_state(), rng)
    assert host.training and all(p.grad is None for p in host.parameters())
    after = host.state_dict()
    assert all(torch.equal(after[k], v) for k, v in state.items())


def test_the_meta_device_and_a_real_copy_count_alike():
    host = _host()
    host.germinate(0, BP["self_attention"], Style.GATED_GATE)
    host.set_slot(0, alpha=0.5, stage=Stage.HOLDING)
    host.germinate(1, BP["conv_heavy"], Style.LINEAR_MULTIPLY)
    host.set_slot(1, alpha=1.0, stage=Stage.FOSSILIZED)
    host.germinate(2, BP["conv_small"], Style.LINEAR_ADD)
    cpu = torch.device("cpu")
    assert train_cost(host, SHAPE, flops.META) == train_cost(host, SHAPE, cpu)
    assert eval_cost(host, SHAPE, flops.META) == eval_cost(host, SHAPE, cpu)
