from __future__ import annotations

import math

import pytest
import torch

from esper.core.spec import Stage, Style
from esper.shell.host.blueprints import BLUEPRINTS
from esper.shell.host.hosts import CNNHost, Host, TransformerHost


def _ids(params) -> set[int]:
    return {id(p) for p in params}


@pytest.mark.parametrize(("in_channels", "size"), [(1, 8), (1, 16), (3, 32), (3, 12)])
def test_cnn_host_shapes(in_channels, size):
    host = CNNHost(in_channels=in_channels, image_size=size)
    assert isinstance(host, Host) and host.family == "cnn"
    assert host.slot_names == ("b0", "b1", "b2")
    assert [host.slot_width(n) for n in host.slot_names] == [16, 32, 64]
    logits = host(torch.randn(5, in_channels, size, size))
    assert logits.shape == (5, 10)
    assert sum(p.numel() for p in host.parameters()) < 30_000
    with pytest.raises(KeyError, match="b0"):
        host.slot_width("r0c0")


def test_cnn1d_host_is_pointwise_and_small():
    from esper.shell.host.hosts import CNN1dHost

    host = CNN1dHost()
    assert host.family == "cnn1d" and host.slot_names == ("b0", "b1", "b2")
    assert [host.slot_width(n) for n in host.slot_names] == [8, 8, 8]
    assert host.blueprint_names == BLUEPRINTS["cnn1d"]
    assert sum(p.numel() for p in host.parameters()) == 274
    x = torch.randn(5, 1, 40)
    assert host(x).shape == (5, 10)
    # kernel-1 convolutions: with no pooling, a position of the last block's output reads one input
    # position only, so the host cannot see the shape of a signal; its slots are where context grows
    flat = CNN1dHost(pools=(1, 1, 1)).eval()
    feats = lambda t: torch.nn.Sequential(*flat.blocks)(t)
    moved = x.clone()
    moved[..., 7] += 3.0
    diff = (feats(moved) - feats(x)).abs().sum(dim=(0, 1))
    assert diff[7] > 0 and torch.count_nonzero(diff) == 1
    for bad in ({"kernels": (1, 1)}, {"pools": (0, 1, 1)}, {"length": 3, "pools": (2, 2, 1)}):
        with pytest.raises(ValueError, match="CNN1dHost"):
            CNN1dHost(**bad)


def test_cnn_host_rejects_too_small_images():
    with pytest.raises(ValueError, match="image_size"):
        CNNHost(image_size=4)


def test_transformer_host_shapes_slots_and_tied_head():
    host = TransformerHost()
    assert host.family == "transformer" and host.slot_names == ("s0", "s1")
    assert host.slot_after == (1, 3)
    assert TransformerHost(n_layers=4, slot_every=1).slot_names == ("s0", "s1", "s2", "s3")
    x = torch.randint(0, 256, (2, 64))
    assert host(x).shape == (2, 64, 256)
    names = [n for n, _ in host.named_parameters()]
    assert not any(n.startswith("head") for n in names)  # tied: the head is tok.weight
    with torch.no_grad():
        loss, correct, n = host.loss_and_correct((x, torch.randint(0, 256, (2, 64))))
    assert n == 128 and correct.dtype == torch.int64 and loss.shape == ()
    assert abs(loss.item() - math.log(256)) < 0.5  # near uniform at init
    with pytest.raises(ValueError, match="ctx"):
        host(torch.randint(0, 256, (1, 65)))


def test_transformer_host_is_causal_with_seeds():
    torch.manual_seed(0)
    host = TransformerHost(d_model=32, n_layers=2, ctx=16, slot_every=1)
    for i, bp in enumerate(("attention", "mlp")):
        host.germinate(i, BLUEPRINTS["transformer"].index(bp), Style.GATED_GATE)
        with torch.no_grad():
            for p in host.seed_parameters(i):
                p.add_(torch.randn_like(p) * 0.1)
        host.set_slot(i, alpha=1.0, stage=Stage.FOSSILIZED)
    host.eval()
    x = torch.randint(0, 256, (2, 16))
    x2 = x.clone()
    x2[:, 9:] = (x2[:, 9:] + 1) % 256
    torch.testing.assert_close(host(x)[:, :9], host(x2)[:, :9])


def test_a_transformer_host_without_attention_reads_only_its_position_and_the_previous_token():
    """The `recall` task's host: blocks without attention and the previous token's embedding, so an
    output reads tokens i and i-1 and nothing else, until an ``attention`` seed mixes positions (a
    per-position seed, the largest ``mlp``, does not)."""
    torch.manual_seed(0)

    def host_with(bp: str | None) -> TransformerHost:
        host = TransformerHost(vocab=16, d_model=32, n_layers=2, n_heads=2, ctx=12, slot_every=1,
                               attention=False, prev_token=True)  # fmt: skip
        if bp is not None:
            host.germinate(0, BLUEPRINTS["transformer"].index(bp), Style.LINEAR_ADD)
            with torch.no_grad():
                for p in host.seed_parameters(0):
                    p.add_(torch.randn_like(p) * 0.1)
            host.set_slot(0, alpha=1.0, stage=Stage.FOSSILIZED)
        return host.eval()

    x = torch.randint(0, 16, (3, 12))
    earlier, previous = x.clone(), x.clone()
    earlier[:, 4] = (earlier[:, 4] + 1) % 16  # two or more positions before 6 onwards
    previous[:, 5] = (previous[:, 5] + 1) % 16  # the token before position 6
    for bp in (None, "mlp"):
        host = host_with(bp)
        assert all(b.attn is None for b in host.layers)
        with torch.no_grad():
            out, out_earlier, out_previous = host(x), host(earlier), host(previous)
        torch.testing.assert_close(out[:, 6:], out_earlier[:, 6:])  # positions do not mix
        torch.testing.assert_close(out[:, :4], out_earlier[:, :4])
        assert not torch.allclose(out[:, 6], out_previous[:, 6])  # the previous token is read
    with torch.no_grad():
        mixed = host_with("attention")
        assert not torch.allclose(mixed(x)[:, 6:], mixed(earlier)[:, 6:])
    without_prev = TransformerHost(16, 32, 2, 2, 12, slot_every=1, attention=False)
    n_params = lambda m: sum(p.numel() for p in m.parameters())
    assert n_params(host_with(None)) - n_params(without_prev) == 17 * 32  # the previous-token embedding


@pytest.mark.parametrize("host_fn", [lambda: CNNHost(1, 8), lambda: TransformerHost(d_model=32, ctx=8)])
def test_every_blueprint_germinates_into_every_slot(host_fn):
    host = host_fn()
    x = torch.randn(2, 1, 8, 8) if host.family == "cnn" else torch.randint(0, 256, (2, 8))
    for b in range(len(host.blueprint_names)):
        for style in Style:
            for i in range(host.n_slots):
                params = host.germinate(i, b, style)
                assert _ids(params) == _ids(host.seed_parameters(i))
                host.set_slot(i, alpha=1.0, stage=Stage.BLENDING)
            assert torch.isfinite(host(x)).all()
            for i in range(host.n_slots):
                host.remove_seed(i)


def test_parameter_partition_germinate_and_remove():
    host = CNNHost(1, 8)
    host_ids = _ids(host.host_parameters())
    assert host_ids == _ids(host.parameters())
    params = host.germinate(1, BLUEPRINTS["cnn"].index("depthwise"), Style.GATED_GATE)
    slot = host.slot(1)
    assert _ids(params) == _ids(slot.seed.parameters()) | _ids(slot.gate.parameters())
    assert _ids(host.host_parameters()) == host_ids  # seeds never count as host
    assert _ids(host.parameters()) == host_ids | _ids(params)
    host.remove_seed(1)
    assert _ids(host.parameters()) == host_ids
    assert host.slot(1).stage == Stage.DORMANT and host.seed_parameters(1) == []
    with pytest.raises(IndexError):
        host.germinate(3, 0, Style.LINEAR_ADD)
    with pytest.raises(IndexError):
        host.germinate(0, len(BLUEPRINTS["cnn"]), Style.LINEAR_ADD)


def test_fossilized_seed_stays_and_contributes_counterfactual_restores_host():
    torch.manual_seed(0)
    host = CNNHost(1, 8).eval()
    x = torch.randn(4, 1, 8, 8)
    base = host(x)
    params = host.germinate(0, BLUEPRINTS["cnn"].index("conv_light"), Style.LINEAR_ADD)
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn_like(p))
    host.set_slot(0, alpha=1.0, stage=Stage.FOSSILIZED)
    assert _ids(params) <= _ids(host.parameters())
    assert not torch.allclose(host(x), base)
    with host.counterfactual(0):
        assert torch.equal(host(x), base)
    assert not torch.allclose(host(x), base)
