"""Host layouts (:mod:`esper.shell.host.descriptors`): every family's blueprints described by features
any family can state, per slot, computed from the host (never an index into one family's list)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from esper.shell.host.blueprints import BLUEPRINT_KINDS, BLUEPRINT_TRAITS, BLUEPRINTS, GLOBAL
from esper.shell.host.descriptors import DESCRIPTOR_FEATURES, SLOT_FEATURES, blueprint_traits, describe_host
from esper.shell.host.hosts import CNN1dHost, CNNHost, TransformerHost
from esper.shell.user import Slot, UserHost

col = DESCRIPTOR_FEATURES.index


def test_every_blueprint_of_every_family_has_traits():
    assert set(BLUEPRINT_TRAITS) == set(BLUEPRINTS)
    for family, names in BLUEPRINTS.items():
        assert set(BLUEPRINT_TRAITS[family]) == set(names), family
        for name in names:
            kind, reach = blueprint_traits(family, name)
            assert kind in BLUEPRINT_KINDS and (reach == GLOBAL or reach >= 1)
        assert blueprint_traits(family, "noop") == ("identity", 1)
    with pytest.raises(ValueError, match="no traits for cnn blueprint 'lora'"):
        blueprint_traits("cnn", "lora")


@pytest.mark.parametrize(
    "make",
    [
        lambda: CNN1dHost(),
        lambda: CNN1dHost(channels=(8,) * 5, kernels=(1,) * 5, pools=(2, 2, 1, 1, 1)),
        lambda: CNNHost(in_channels=1, image_size=16, channels=(4, 8, 16)),
        lambda: TransformerHost(d_model=16, n_layers=4, n_heads=2, ctx=8),
    ],
)
def test_layout_of_a_host(make):
    host = make()
    layout = describe_host(host)
    S, B = host.n_slots, len(host.blueprint_names)
    assert layout.slot_features.shape == (S, len(SLOT_FEATURES))
    assert layout.descriptors.shape == (S, B, len(DESCRIPTOR_FEATURES))
    assert torch.isfinite(layout.descriptors).all() and layout.descriptors.abs().max() <= 3
    depth = layout.slot_features[:, SLOT_FEATURES.index("depth")]
    torch.testing.assert_close(depth, torch.arange(1, S + 1) / S)  # a fraction of the host's depth
    kinds = layout.descriptors[..., : len(BLUEPRINT_KINDS)]
    assert torch.equal(kinds.sum(-1), torch.ones(S, B))  # one kind each
    noop = host.blueprint_names.index("noop")
    assert (layout.descriptors[:, noop, col("kind_identity")] == 1).all()  # the is-identity bit
    cost = host.germination_cost()
    torch.testing.assert_close(layout.germination_cost, cost)
    torch.testing.assert_close(layout.log_cost, cost.clamp(min=1).log())
    host_params = sum(p.numel() for p in host.host_parameters())
    ratio = layout.descriptors[..., col("params_vs_host")] * math.log(100)
    torch.testing.assert_close(ratio, (cost / host_params).log(), rtol=1e-5, atol=1e-5)
    widths = torch.tensor([s.width for s in host.slots], dtype=torch.float32)
    per_width = layout.descriptors[..., col("params_vs_width")] * math.log(100)
    torch.testing.assert_close(per_width, (cost / widths.square().unsqueeze(-1)).log(), rtol=1e-5, atol=1e-5)
    # larger blueprints read larger, in every slot (the registries are sorted by size)
    assert (ratio[:, 1:] >= ratio[:, :-1] - 1e-6).all()


def test_widths_and_reach_are_described_relative_to_the_host():
    layout = describe_host(CNNHost(in_channels=1, image_size=16, channels=(4, 8, 16)))
    torch.testing.assert_close(layout.slot_features[:, 1], torch.tensor([-0.5, 0.0, 0.5]))
    names = layout.blueprint_names
    reach, wide = layout.descriptors[0, :, col("reach")], layout.descriptors[0, :, col("reach_global")]
    assert wide[names.index("attention")] == 1 and reach[names.index("attention")] == 1
    torch.testing.assert_close(reach[names.index("conv_light")], torch.tensor(0.5))  # ln 3 / ln 9
    at = lambda name: reach[names.index(name)]
    assert at("conv_heavy") > at("conv_light") > at("norm") == 0
    cnn1d = describe_host(CNN1dHost())
    sa = cnn1d.descriptors[0, cnn1d.blueprint_names.index("self_attention")]
    assert sa[col("kind_self_attention")] == 1 and sa[col("reach_global")] == 1


def test_a_user_host_is_described_like_a_built_in_one():
    net = nn.Sequential(nn.Conv1d(1, 8, 1), Slot(8), nn.ReLU(), nn.Conv1d(8, 4, 1), Slot(4), nn.Flatten(),
                        nn.LazyLinear(3))  # fmt: skip
    host = UserHost(net, example_input=torch.randn(2, 1, 16))
    layout = describe_host(host)
    assert layout.family == "cnn1d" and layout.slot_widths == (8, 4) and layout.n_blueprints == 8
    assert layout.descriptors.shape == (2, 8, len(DESCRIPTOR_FEATURES))
