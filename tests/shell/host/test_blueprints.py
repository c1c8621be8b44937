from __future__ import annotations

import pytest
import torch

from esper.shell.host.blueprints import BLUEPRINTS, blueprint_index, build_blueprint, param_count

CASES = [(family, n) for family in ("cnn", "cnn1d", "transformer", "mlp") for n in BLUEPRINTS[family]]
#: Slot widths of the default hosts (CNNHost channels, CNN1dHost channels, TransformerHost d_model), and
#: of MLP hidden layers.
DEFAULT_WIDTHS = {"cnn": (16, 32, 64), "cnn1d": (8,), "transformer": (64,), "mlp": (16, 32, 64)}


def _input(family: str, width: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    shape = {"cnn": (3, width, 5, 7), "cnn1d": (3, width, 11), "mlp": (3, width)}.get(family, (3, 9, width))
    return torch.randn(shape, generator=g)


def _randomize(module: torch.nn.Module, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)


@pytest.mark.parametrize(("family", "name"), CASES)
@pytest.mark.parametrize("width", [1, 6, 16, 64])
def test_every_blueprint_builds_keeps_shape_and_is_finite(family, name, width):
    seed = build_blueprint(family, name, width)
    x = _input(family, width)
    for randomized in (False, True):
        if randomized:
            _randomize(seed)
        d = seed(x)
        assert d.shape == x.shape
        assert torch.isfinite(d).all()


@pytest.mark.parametrize("family", ["cnn", "cnn1d", "transformer", "mlp"])
def test_param_counts_increase_in_registry_order(family):
    for width in DEFAULT_WIDTHS[family]:
        counts = [param_count(build_blueprint(family, n, width)) for n in BLUEPRINTS[family]]
        assert counts[0] == 0  # noop
        assert counts == sorted(counts) and len(set(counts)) == len(counts), (width, counts)


@pytest.mark.parametrize(("family", "name"), [c for c in CASES if c[1] != "noop"])
def test_no_blueprint_is_a_silent_noop(family, name):
    # Finding (§10): the reference mapped conv_heavy to a no-op. Every named seed has parameters and,
    # once its weights move, a nonzero delta.
    seed = build_blueprint(family, name, 16)
    assert param_count(seed) > 0
    _randomize(seed)
    assert seed(_input(family, 16)).abs().max() > 1e-3


@pytest.mark.parametrize(("family", "name"), CASES)
def test_fresh_seed_delta_is_small(family, name):
    x = _input(family, 32)
    d = build_blueprint(family, name, 32)(x)
    assert d.abs().mean() <= 0.05 * x.abs().mean()
    if name in ("noop", "norm", "lora", "lora_large", "widen"):
        assert torch.equal(d, torch.zeros_like(d))  # scale / up-projection / outgoing weights start at 0


@pytest.mark.parametrize("name", BLUEPRINTS["transformer"])
def test_transformer_seeds_are_causal(name):
    seed = build_blueprint("transformer", name, 16)
    _randomize(seed)
    x = _input("transformer", 16)
    x2 = x.clone()
    x2[:, 5:] += torch.randn_like(x2[:, 5:])
    torch.testing.assert_close(seed(x)[:, :5], seed(x2)[:, :5], rtol=1e-5, atol=1e-6)


def test_cnn1d_self_attention_reads_the_whole_signal():
    """The 1-D family gives a pointwise host what it lacks, context along the signal: through
    self-attention the first position's delta depends on the last position."""
    x = _input("cnn1d", 8)
    far = x.clone()
    far[..., -1] += 5.0  # change the last position only
    seed = build_blueprint("cnn1d", "self_attention", 8)
    _randomize(seed)
    assert not torch.allclose(seed(x)[..., 0], seed(far)[..., 0])


def test_unknown_names_raise_listing_the_valid_ones():
    with pytest.raises(ValueError, match="conv_light"):
        build_blueprint("cnn", "conv_huge", 16)
    with pytest.raises(ValueError, match="lora_large"):
        blueprint_index("transformer", "flex_attention")
    with pytest.raises(ValueError, match="transformer"):
        build_blueprint("rnn", "noop", 16)
    assert blueprint_index("cnn", "conv_heavy") == BLUEPRINTS["cnn"].index("conv_heavy")
