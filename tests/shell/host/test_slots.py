from __future__ import annotations

import pytest
import torch

from esper.core.lifecycle import ATTACH_AT
from esper.core.spec import Stage, Style
from esper.shell.host.blueprints import build_blueprint
from esper.shell.host.hosts import CNNHost, TransformerHost
from esper.shell.host.slots import (
    BLEND,
    BLEND_KINDS,
    DETACHED_BY_ATTACH,
    Gate,
    SeedSlot,
    attach_seeds,
    blend,
    compose,
)

BLENDED = (Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED, Stage.PRUNED)


def _randomize(module: torch.nn.Module, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def _slot(family: str, style: Style, blueprint: str = "conv_light", width: int = 8) -> SeedSlot:
    slot = SeedSlot("x", width, family)
    slot.install(build_blueprint(family, blueprint, width), style, blueprint)
    _randomize(slot)  # seed and gate, so every term of the composition matters
    return slot


def _h(family: str, width: int = 8) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn((4, width, 6, 6) if family == "cnn" else (4, 7, width), generator=g)


def test_empty_slot_is_identity():
    slot = SeedSlot("b0", 8, "cnn")
    h = _h("cnn")
    assert slot(h) is h
    assert list(slot.parameters()) == []


@pytest.mark.parametrize("family", ["cnn", "transformer"])
@pytest.mark.parametrize("style", list(Style))
@pytest.mark.parametrize("stage", BLENDED)
def test_every_style_composes_as_documented(family, style, stage):
    blueprint = "conv_light" if family == "cnn" else "mlp"
    slot = _slot(family, style, blueprint)
    slot.set(alpha=0.3, stage=stage)
    h = _h(family)
    d = slot.seed(h)
    if style in (Style.LINEAR_ADD, Style.SIGMOID_ADD):
        expected = h + 0.3 * d
    elif style == Style.LINEAR_MULTIPLY:
        expected = h * (1 + 0.3 * torch.tanh(d))
    else:
        g = slot.gate(h)
        assert g.shape == ((4, 1, 1, 1) if family == "cnn" else (4, 7, 1))
        assert ((g > 0) & (g < 1)).all()
        expected = h + 0.3 * g * d
    out = slot(h)
    torch.testing.assert_close(out, expected)
    assert not torch.equal(out, h)
    with slot.force_alpha(0.0):
        assert torch.equal(slot(h), h)
    with slot.force_alpha(1.0):
        torch.testing.assert_close(slot(h), slot._compose(h, h, 1.0))
    torch.testing.assert_close(slot(h), expected)  # the override is gone after the block


@pytest.mark.parametrize("style", list(Style))
def test_alpha_zero_and_force_alpha_zero_return_the_host_exactly(style):
    slot = _slot("cnn", style)
    h = _h("cnn")
    slot.set(alpha=0.0, stage=Stage.BLENDING)
    assert torch.equal(slot(h), h)
    slot.set(alpha=0.8, stage=Stage.FOSSILIZED)
    with slot.force_alpha(0.5):
        with slot.force_alpha(0.0):
            assert torch.equal(slot(h), h)
        assert slot._forced == 0.5  # nested overrides restore the outer one
    assert slot._forced is None


@pytest.mark.parametrize("family", ["cnn", "transformer"])
@pytest.mark.parametrize("style", list(Style))
def test_incubating_seed_is_skipped_by_the_host_pass_and_trained_by_the_what_if_pass(family, style):
    slot = _slot(family, style, "conv_light" if family == "cnn" else "mlp")
    slot.set(alpha=0.7, stage=Stage.TRAINING)  # alpha is ignored while incubating
    h = _h(family).requires_grad_()
    out = slot(h)
    assert out is h  # the host pass: the seed does not run
    out.pow(2).sum().backward()
    assert all(p.grad is None for p in slot.seed_parameters())
    h.grad = None
    with slot.force_alpha(1.0):  # the what-if pass: composed at alpha 1 on the detached activation
        what_if = slot(h)
    torch.testing.assert_close(what_if, slot._compose(h, h, 1.0))
    what_if.pow(2).sum().backward()
    grads = [p.grad for p in slot.seed_parameters()]
    assert all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)


def test_blending_input_is_detached_fossilized_is_not():
    slot = _slot("cnn", Style.LINEAR_ADD)
    h = _h("cnn").requires_grad_()
    slot.set(alpha=0.5, stage=Stage.BLENDING)
    slot(h).sum().backward()
    assert torch.equal(h.grad, torch.ones_like(h))  # d(h + a·seed(h.detach()))/dh = 1
    h.grad = None
    slot.set(alpha=0.5, stage=Stage.FOSSILIZED)
    slot(h).sum().backward()
    assert not torch.equal(h.grad, torch.ones_like(h))  # the fossil's input is attached


def test_attached_at_blending_the_host_trains_through_a_blending_or_holding_seed():
    """``lifecycle.attach_at blending``: the seed reads the live activation from BLENDING on (so the
    layers before the slot get its gradient); an incubating seed is still skipped by the host pass and a
    pruned one still reads it detached. The reference's isolation (``fossilized``) reads it detached in
    BLENDING, so this fails on it."""
    slot = _slot("cnn", Style.LINEAR_ADD)
    attach_seeds([slot], "blending")
    for stage in (Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED):
        h = _h("cnn").requires_grad_()
        slot.set(alpha=0.5, stage=stage)
        assert slot.reads_live
        slot(h).sum().backward()
        assert not torch.equal(h.grad, torch.ones_like(h)), stage  # attached: the seed's path adds gradient
    h = _h("cnn").requires_grad_()
    slot.set(alpha=0.5, stage=Stage.PRUNED)
    slot(h).sum().backward()
    assert torch.equal(h.grad, torch.ones_like(h)) and not slot.reads_live  # ramping out: detached
    slot.set(alpha=0.5, stage=Stage.TRAINING)
    assert slot(h) is h  # incubating: not in the host pass
    attach_seeds([slot], "fossilized")
    slot.set(alpha=0.5, stage=Stage.BLENDING)
    assert not slot.reads_live
    with pytest.raises(ValueError, match="attach_at must be one of"):
        attach_seeds([slot], "germinated")
    assert set(DETACHED_BY_ATTACH) == set(ATTACH_AT)  # every setting the config accepts has its stages


@pytest.mark.parametrize(
    ("host", "x"),
    [
        (lambda: CNNHost(3, 16), lambda: torch.randn(6, 3, 16, 16)),
        (
            lambda: TransformerHost(d_model=32, n_layers=2, ctx=16, slot_every=1),
            lambda: torch.randint(0, 256, (3, 16)),
        ),
    ],
)
def test_training_seed_leaves_host_forward_and_grads_unchanged(host, x):
    torch.manual_seed(0)
    model, inp = host(), x()
    reference = {n: p.detach().clone() for n, p in model.state_dict().items()}
    y = torch.randint(0, 10, (len(inp),)) if inp.dim() == 4 else torch.randint(0, 256, inp.shape)

    def run():
        model.load_state_dict(reference, strict=False)  # BN running stats back to the same start
        model.zero_grad(set_to_none=True)
        loss, _, _ = model.loss_and_correct((inp, y))
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.host_parameters()]

    base_loss, base_grads = run()
    for i in range(model.n_slots):
        params = model.germinate(i, len(model.blueprint_names) - 1, Style.GATED_GATE)
        _randomize(model.slot(i).seed)
        model.set_slot(i, alpha=0.0, stage=Stage.TRAINING)
    loss, grads = run()
    assert torch.equal(loss, base_loss)  # forward bit-for-bit unchanged
    for g0, g1 in zip(base_grads, grads):
        assert torch.equal(g0, g1)  # host gradients untouched by the seeds
    assert model.incubating_slots() == list(range(model.n_slots))
    stats = {n: b.clone() for n, b in model.named_buffers()}
    with model.incubating(model.incubating_slots()):
        seed_loss, _, _ = model.loss_and_correct((inp, y))
    assert not torch.equal(seed_loss, loss)  # the what-if pass sees the seeds
    seed_loss.backward(inputs=[p for i in range(model.n_slots) for p in model.seed_parameters(i)])
    for i in range(model.n_slots):
        params = model.seed_parameters(i)
        assert params and all(p.grad is not None for p in params)
        assert sum(float(p.grad.abs().sum()) for p in params) > 0
    for g0, g1 in zip(base_grads, [p.grad for p in model.host_parameters()]):
        assert torch.equal(g0, g1)  # ... and it adds nothing to the host's gradients
    for n, b in model.named_buffers():
        if b.is_floating_point():
            assert torch.equal(b, stats[n]), n  # nor to its batch-norm statistics
    assert all(m.momentum == 0.1 for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))


def test_gate_is_per_sample_and_per_position():
    g = Gate(8, "transformer")
    x = torch.randn(2, 5, 8)
    assert g(x).shape == (2, 5, 1)
    assert torch.equal(g(x), torch.full((2, 5, 1), 0.5))  # last layer starts at zero
    x2 = x.clone()
    x2[:, 3:] += 1.0
    _randomize(g)
    torch.testing.assert_close(g(x)[:, :3], g(x2)[:, :3])  # causal: a position reads itself only


def test_gated_seed_parameters_include_the_gate():
    slot = SeedSlot("b0", 8, "cnn")
    params = slot.install(build_blueprint("cnn", "noop", 8), Style.GATED_GATE, "noop")
    assert params and {id(p) for p in params} == {id(p) for p in slot.gate.parameters()}
    assert slot.stage == Stage.GERMINATED and slot.alpha == 0.0


def test_set_validates_stage_and_alpha():
    slot = SeedSlot("b0", 8, "cnn")
    with pytest.raises(ValueError, match="needs a seed"):
        slot.set(alpha=0.0, stage=Stage.TRAINING)
    slot.set(alpha=0.0, stage=Stage.EMBARGOED)
    slot.install(build_blueprint("cnn", "norm", 8), Style.LINEAR_ADD, "norm")
    with pytest.raises(ValueError, match="already holds"):
        slot.install(build_blueprint("cnn", "norm", 8), Style.LINEAR_ADD, "norm")
    with pytest.raises(ValueError, match="remove it first"):
        slot.set(alpha=0.0, stage=Stage.DORMANT)
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="alpha"):
            slot.set(alpha=bad, stage=Stage.BLENDING)
        with pytest.raises(ValueError, match="alpha"):
            slot.force_alpha(bad).__enter__()
    slot.remove()
    assert slot.seed is None and slot.stage == Stage.DORMANT and list(slot.parameters()) == []


def test_one_blend_serves_one_seed_and_a_mixed_group_of_envs():
    """The stacked hosts' form of the blend (per kind a tensor of each env's alpha, zero for the envs of
    another kind) composes every env as :func:`compose` does for that env's style alone."""
    g = torch.Generator().manual_seed(3)
    styles, alphas = list(Style), [0.3, 0.7, 1.0, 0.5]
    h, d = torch.randn(len(styles), 5, 6, generator=g), torch.randn(len(styles), 5, 6, generator=g)
    gate = torch.rand(len(styles), 1, 6, generator=g)
    weights = {
        k: torch.tensor([a if BLEND[s] == k else 0.0 for s, a in zip(styles, alphas)]).reshape(-1, 1, 1)
        for k in BLEND_KINDS
    }
    mixed = blend(h, d, weights, gate)
    for e, (style, alpha) in enumerate(zip(styles, alphas)):
        alone = compose(style, h[e], d[e], alpha, gate[e])
        torch.testing.assert_close(mixed[e], alone)
        assert torch.equal(blend(h[e], d[e], {BLEND[style]: alpha}, gate[e]), alone)
    with pytest.raises(ValueError, match="gate value"):
        compose(Style.GATED_GATE, h, d, 0.5)
