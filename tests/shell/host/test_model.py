from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from esper.core.spec import Stage, Style
from esper.shell.host.blueprints import BLUEPRINTS
from esper.shell.host.hosts import CNN1dHost, CNNHost, TransformerHost
from esper.shell.host.model import (
    GRAD_RATIO_CAP,
    SEED_EXPLODE_NORM,
    SEED_GRAD_KEYS,
    SEED_VANISH_NORM,
    EnvModel,
    seed_grad_stats,
)

BP = {n: i for i, n in enumerate(BLUEPRINTS["cnn"])}


def _batches(n_batches: int = 3, size: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(16, 1, size, size, generator=g), torch.randint(0, 10, (16,), generator=g))
        for _ in range(n_batches)
    ]


def _model(**kw) -> EnvModel:
    torch.manual_seed(0)
    return EnvModel(CNNHost(1, 8), **kw)


def _ids(params) -> set[int]:
    return {id(p) for p in params}


def _optimizer_ids(model: EnvModel) -> set[int]:
    ids = set()
    for opt in model.optimizers():
        ids |= _ids(p for group in opt.param_groups for p in group["params"])
        ids |= _ids(opt.state.keys())
    return ids


def _perturb(params) -> None:
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn_like(p) * 0.5)


def test_train_epoch_returns_finite_tensors_and_learns():
    m = _model()
    data = _batches()
    first = m.train_epoch(data)
    assert set(first) == {"loss", "acc", "n_items", *SEED_GRAD_KEYS}
    for k in SEED_GRAD_KEYS:  # no seed yet
        assert first[k].shape == (3,) and torch.equal(first[k], torch.zeros(3)), k
    assert int(first["n_items"]) == 48 and 0 <= float(first["acc"]) <= 100
    for _ in range(10):
        last = m.train_epoch(data)
    assert float(last["loss"]) < float(first["loss"])
    with pytest.raises(ValueError, match="no batches"):
        m.train_epoch([])


def test_prune_removes_seed_from_model_and_optimizers():
    m = _model()
    m.germinate(1, BP["conv_light"], Style.GATED_GATE)
    params = m.host.seed_parameters(1)
    m.host.set_slot(1, alpha=0.5, stage=Stage.BLENDING)
    m.train_epoch(_batches())  # momentum buffers now exist
    assert _ids(params) <= _optimizer_ids(m)
    assert 1 in m.seed_opts and len(m.seed_opts[1].state) == len(params)
    m.prune(1)
    assert not (_ids(params) & _ids(m.host.parameters()))
    assert not (_ids(params) & _optimizer_ids(m))
    assert 1 not in m.seed_opts
    m.train_epoch(_batches())  # still trains without it


def test_fossilized_seed_stays_keeps_training_and_contributing():
    m = _model()
    m.germinate(0, BP["conv_small"], Style.LINEAR_ADD)
    params = m.host.seed_parameters(0)
    _perturb(params)
    m.host.set_slot(0, alpha=1.0, stage=Stage.FOSSILIZED)
    before = [p.detach().clone() for p in params]
    m.train_epoch(_batches())
    assert _ids(params) <= _ids(m.host.parameters()) and _ids(params) <= _optimizer_ids(m)
    assert any(not torch.equal(a, p) for a, p in zip(before, params))  # seeds train after fossilization
    x = _batches(1)[0][0]
    m.host.eval()
    with torch.no_grad(), m.host.counterfactual(0):
        cf = m.host(x)
    with torch.no_grad():
        assert not torch.allclose(m.host(x), cf)


def test_gated_gate_parameters_get_gradient_and_an_optimizer():
    m = _model()
    m.germinate(2, BP["noop"], Style.GATED_GATE)  # noop seed: the gate is the only trainable part
    gate_params = list(m.host.slot(2).gate.parameters())
    assert gate_params and _ids(gate_params) <= _ids(
        p for g in m.seed_opts[2].param_groups for p in g["params"]
    )
    m.germinate(0, BP["conv_light"], Style.GATED_GATE)
    _perturb(m.host.seed_parameters(0))
    m.host.set_slot(0, alpha=0.0, stage=Stage.TRAINING)
    gate0 = list(m.host.slot(0).gate.parameters())
    before = [p.detach().clone() for p in gate0]
    m.train_epoch(_batches())
    assert all(p.grad is not None for p in gate0) and sum(float(p.grad.abs().sum()) for p in gate0) > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, gate0))


def test_grad_ratio_formula_and_cap():
    m = _model()
    m.germinate(0, BP["depthwise"], Style.LINEAR_ADD)
    m.host.set_slot(0, alpha=0.0, stage=Stage.TRAINING)
    out = m.train_epoch(_batches())
    host_p, seed_p = m.host.host_parameters(), m.host.seed_parameters(0)
    norm = lambda ps: math.sqrt(sum(float(p.grad.pow(2).sum()) for p in ps if p.grad is not None))
    n = lambda ps: sum(p.numel() for p in ps)
    expected = min(GRAD_RATIO_CAP, norm(seed_p) / norm(host_p) * math.sqrt(n(host_p) / n(seed_p)))
    assert float(out["grad_ratio"][0]) == pytest.approx(expected, rel=1e-4)
    assert float(out["grad_ratio"][0]) > 0 and out["grad_ratio"][1:].eq(0).all()
    with torch.no_grad():
        for p in seed_p:
            p.grad.mul_(1e6)
    assert float(m.grad_ratios()[0]) == GRAD_RATIO_CAP
    for p in host_p:
        p.grad = None
    assert float(m.grad_ratios()[0]) == 0.0  # host_norm < 1e-8


def test_seed_gradient_norm_and_its_vanishing_and_exploding_shares():
    """Issue 47: the hosts measure each seed's gradient norm beside its ratio (one function for both
    banks), and the share of its parameter tensors whose gradient vanished or exploded; an empty slot
    reads 0 everywhere."""
    m = _model()
    m.germinate(0, BP["depthwise"], Style.LINEAR_ADD)
    m.host.set_slot(0, alpha=0.0, stage=Stage.TRAINING)
    out = m.train_epoch(_batches())
    assert set(SEED_GRAD_KEYS) <= set(out)
    seed_p = m.host.seed_parameters(0)
    norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in seed_p))
    assert float(out["seed_grad_norm"][0]) == pytest.approx(norm, rel=1e-5) and norm > 0
    assert out["seed_grad_vanishing"][0] == 0 and out["seed_grad_exploding"][0] == 0
    for k in SEED_GRAD_KEYS:
        assert out[k][1:].eq(0).all(), k  # no seed there
    with torch.no_grad():
        seed_p[0].grad.zero_()  # one tensor's gradient vanished, another's exploded
        seed_p[1].grad.fill_(SEED_EXPLODE_NORM)
    stats = seed_grad_stats(m.host, m.host.host_parameters())
    assert float(stats["seed_grad_vanishing"][0]) == pytest.approx(1 / len(seed_p))
    assert float(stats["seed_grad_exploding"][0]) == pytest.approx(1 / len(seed_p))
    for p in seed_p:
        p.grad = None  # a seed the step did not reach: every tensor's gradient counts as 0
    stats = seed_grad_stats(m.host, m.host.host_parameters())
    assert stats["seed_grad_norm"][0] == 0 and stats["seed_grad_vanishing"][0] == 1.0
    assert SEED_VANISH_NORM < SEED_EXPLODE_NORM


def _three_seeds(stages: tuple[Stage, Stage, Stage], alphas: tuple[float, float, float]):
    """A model with a (perturbed) seed in each slot, in ``stages`` at ``alphas``, and two batches."""
    m = _model()
    m.germinate(0, BP["conv_light"], Style.LINEAR_ADD)
    m.germinate(1, BP["conv_heavy"], Style.GATED_GATE)
    m.germinate(2, BP["bottleneck"], Style.LINEAR_MULTIPLY)
    for i, (stage, alpha) in enumerate(zip(stages, alphas)):
        _perturb(m.host.seed_parameters(i))
        m.host.set_slot(i, alpha=alpha, stage=stage)
    return m, _batches(2)


def test_M18_counterfactual_for_every_live_seed_alpha_zero_included():
    # slot 1 at alpha 0 in BLENDING: the reference skipped this one
    m, data = _three_seeds((Stage.TRAINING, Stage.BLENDING, Stage.HOLDING), (0.0, 0.0, 0.7))
    # Label the data with the host's own predictions without seed 2: its counterfactual scores 100 %,
    # so any prediction the seed changes makes its contribution nonzero.
    m.host.eval()
    with torch.no_grad(), m.host.counterfactual(2):
        data = [(x, m.host(x).argmax(-1)) for x, _ in data]
    loss, acc, contrib = m.counterfactual_validation(data)
    assert torch.isfinite(loss) and contrib.shape == (3,) and torch.isfinite(contrib).all()
    # Every live slot measured against an explicit forced-alpha-0 pass over the same batches.
    for i in range(3):
        with m.host.counterfactual(i):
            _, cf_acc = m.validate(data)
        assert float(contrib[i]) == pytest.approx(float(acc - cf_acc), abs=1e-4)
    assert float(contrib[0]) == 0.0 and float(contrib[1]) == 0.0  # forced pass == real pass
    assert float(contrib[2]) < 0.0  # a random bottleneck at alpha 0.7 changes predictions
    torch.testing.assert_close(m.counterfactuals(data, [0, 1, 2]), contrib)
    mask = torch.tensor([False, True, True])
    assert torch.equal(m.counterfactuals(data, mask), torch.tensor([0.0, 0.0, float(contrib[2])]))


def test_whatif_gain_is_what_blending_an_incubating_seed_in_would_add():
    """``measure_validation(whatif=True)``: each incubating seed (GERMINATED, TRAINING) is scored blended
    in at alpha 1 against the real pass (what G2 reads under ``g2_evidence what_if``); other seeds get 0,
    and without ``whatif`` every slot gets 0. The other measurements are the counterfactual loop's."""
    m, data = _three_seeds((Stage.TRAINING, Stage.GERMINATED, Stage.BLENDING), (0.0, 0.0, 0.7))
    m.host.eval()
    with torch.no_grad():  # labels: the host's own predictions, so a seed that changes any scores below 100
        data = [(x, m.host(x).argmax(-1)) for x, _ in data]
    out = m.measure_validation(data, whatif=True)
    for i in (0, 1):
        with m.host.slot(i).force_alpha(1.0):
            _, blended = m.validate(data)
        assert float(out["whatif_gain"][i]) == pytest.approx(float(blended - out["val_acc"]), abs=1e-4)
    assert float(out["whatif_gain"][0]) < 0.0 and float(out["whatif_gain"][2]) == 0.0
    _, acc, contrib = m.counterfactual_validation(data)
    assert torch.equal(out["contribution"], contrib) and float(out["val_acc"]) == float(acc)
    assert m.measure_validation(data)["whatif_gain"].eq(0).all()


class _Rescale(torch.nn.Module):
    """A seed whose delta is ``8·x``: blended in at alpha 1 under LINEAR_ADD its slot outputs ``9·h``,
    which the batch norm after it undoes once it normalizes with the statistics of what it is given."""

    def __init__(self):
        super().__init__()
        self.k = torch.nn.Parameter(torch.tensor(8.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.k * x


def test_whatif_batch_statistics_reads_a_seed_the_next_batch_norm_undoes_as_changing_nothing():
    """``whatif_statistics="batch"``: the incubating seed's what-if and the host it is read against both
    normalize with each batch's own statistics. A seed that only rescales its slot's activation changes
    nothing once the batch norm after it has seen it, and reads 0 that way; read with the host's running
    statistics (which never saw the seed, the reading before this option) it reads as a large loss. The
    batch reading records nothing: running statistics, step counts and modes are as they were."""
    m = _model()
    data = _batches(3)
    for _ in range(2):  # running statistics that are the host's own, not their initial 0 and 1
        m.train_epoch(data)
    m.host.slot(0).install(_Rescale(), Style.LINEAR_ADD, "conv_heavy")
    m.host.set_slot(0, alpha=0.0, stage=Stage.TRAINING)
    m.host.eval()
    with torch.no_grad():  # labels: the host's own predictions, so the host alone scores 100
        data = [(x, m.host(x).argmax(-1)) for x, _ in data]
    norms = m.host.batch_norms()
    before = [(n.running_mean.clone(), n.running_var.clone(), int(n.num_batches_tracked)) for n in norms]
    m.host.train()
    batch = m.measure_validation(data, whatif=True, whatif_statistics="batch")
    running = m.measure_validation(data, whatif=True, whatif_statistics="running")
    assert float(batch["whatif_gain"][0]) == pytest.approx(0.0, abs=1e-6)
    assert float(running["val_acc"]) == 100.0 and float(running["whatif_gain"][0]) <= -30.0
    assert m.host.training and all(n.training and n.track_running_stats for n in norms)
    for n, (mean, var, steps) in zip(norms, before):
        assert torch.equal(n.running_mean, mean) and torch.equal(n.running_var, var)
        assert int(n.num_batches_tracked) == steps
    for k in ("val_loss", "val_acc", "contribution"):  # only the what-if reading differs
        assert torch.equal(batch[k], running[k])
    with pytest.raises(ValueError, match="whatif_statistics"):
        m.measure_validation(data, whatif=True, whatif_statistics="population")


def test_evaluate_modes_and_errors():
    m = _model()
    data = _batches(2)
    m.host.train()
    bn = m.host.blocks[0][1]
    stats = bn.running_mean.clone()
    loss, acc = m.validate(data)
    assert m.host.training  # mode restored
    assert torch.equal(bn.running_mean, stats)  # eval mode: BN statistics untouched
    assert loss.shape == () and 0 <= float(acc) <= 100
    with pytest.raises(ValueError, match="holds no seed"):
        m.counterfactuals(data, [1])
    with pytest.raises(ValueError, match="no batches"):
        m.validate([])
    assert torch.equal(m.counterfactuals(data), torch.zeros(3))  # no live seed: all zero


def test_digits_epoch_learns():
    from esper.shell.env.tasks import make_task

    task = make_task("digits", image_size=8)
    torch.manual_seed(0)
    m = EnvModel(task.make_host())
    train, val, _ = task.make_loaders(0)
    for _ in range(3):
        m.train_epoch(train)
    _, acc = m.validate(val)
    assert float(acc) > 80.0


def test_incubation_trains_the_seed_on_its_own_effect():
    """An incubating seed learns from a what-if pass (its delta blended in at alpha 1), so its training
    loss responds to what it does: on a fixed task it falls below the host's own, and the host's
    training is exactly what it would be without the seed. (A straight-through forward evaluated the
    loss at the host's output whatever the seed did: the seed followed one gradient direction without
    feedback, its delta grew without bound and blending it in wrecked the host.)"""
    from esper.shell.host.hosts import CNN1dHost

    # AR(1) signals with correlation +0.8 or -0.8: same marginals, so a pointwise host is at chance;
    # the class is in how neighbours move together, which a seed with a kernel of 3 can read
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 2, (256,), generator=g)
    rho = torch.where(y == 1, 0.8, -0.8)
    noise = torch.randn(256, 16, generator=g)
    steps = [noise[:, 0]]
    for t in range(1, 16):
        steps.append(rho * steps[-1] + (1 - rho**2).sqrt() * noise[:, t])
    x = torch.stack(steps, -1).unsqueeze(1)
    batches = [(x[i : i + 32], y[i : i + 32]) for i in range(0, 256, 32)]

    def host_only(model):
        torch.manual_seed(1)
        return EnvModel(model, host_lr=0.05, seed_lr=0.05)

    torch.manual_seed(0)
    plain = host_only(CNN1dHost(1, 16, (4, 4, 4), 2, pools=(1, 1, 1)))
    torch.manual_seed(0)
    grown = host_only(CNN1dHost(1, 16, (4, 4, 4), 2, pools=(1, 1, 1)))
    grown.germinate(0, BLUEPRINTS["cnn1d"].index("conv_heavy"), Style.LINEAR_ADD)
    grown.host.set_slot(0, alpha=0.0, stage=Stage.TRAINING)
    for _ in range(15):
        plain_stats = plain.train_epoch(batches)
        grown_stats = grown.train_epoch(batches)
        assert torch.equal(plain_stats["loss"], grown_stats["loss"])  # the host trains as if alone
    host_loss, _ = grown.validate(batches)
    grown.host.set_slot(0, alpha=1.0, stage=Stage.BLENDING)
    blended_loss, _ = grown.validate(batches)
    assert float(blended_loss) < float(host_loss) - 0.05  # blending the incubated seed in helps
    with torch.no_grad():
        delta = grown.host.slot(0).seed(torch.randn(32, 4, 16, generator=g))
    assert float(delta.abs().max()) < 100.0  # bounded: trained with feedback


# ------------------------------------------------------------------ validation passes resumed at a slot
def _whole_forward(host, inp: torch.Tensor) -> torch.Tensor:
    """The hosts' forward as written before they were staged: every block and slot in one loop."""
    if isinstance(host, TransformerHost):
        x = host._stem(inp)
        slots = iter(host.slots)
        for i, layer in enumerate(host.layers):
            x = layer(x)
            if i in host.slot_after:
                x = next(slots)(x)
        return F.linear(host.ln_f(x), host.tok.weight)
    x = inp
    for block, slot in zip(host.blocks, host.slots):
        x = slot(block(x))
    return host.head(x.mean(dim=tuple(range(2, x.dim()))))


def _staged_models():
    """Each built-in host with a seed in every slot (perturbed, at several stages and alphas), and its
    batches: a 2-D CNN, a 1-D CNN, a transformer with a layer after its last slot, and `recall`'s host
    (no attention, previous-token embedding, a slot after each of its two blocks)."""
    torch.manual_seed(3)
    g = torch.Generator().manual_seed(4)
    tokens = [(torch.randint(0, 16, (4, 8), generator=g),) * 2 for _ in range(2)]
    signals = [
        (torch.randn(8, 1, 16, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(2)
    ]
    lm = {"vocab": 16, "d_model": 16, "n_heads": 2, "ctx": 8}
    cases = [
        (CNNHost(1, 8), _batches(2)),
        (CNN1dHost(length=16, channels=(4, 4, 4)), signals),
        (TransformerHost(n_layers=4, slot_every=3, **lm), tokens),
        (TransformerHost(n_layers=2, slot_every=1, attention=False, prev_token=True, **lm), tokens),
    ]
    plan = [("attention", Stage.BLENDING, 0.6), ("norm", Stage.TRAINING, 0.0), ("lora", Stage.HOLDING, 1.0)]
    out = []
    for host, data in cases:
        m = EnvModel(host)
        names = host.blueprint_names
        for i in range(host.n_slots):
            blueprint, stage, alpha = plan[i % len(plan)]
            m.germinate(i, names.index(blueprint if blueprint in names else "norm"), Style.LINEAR_ADD)
            _perturb(host.seed_parameters(i))
            host.set_slot(i, alpha=alpha, stage=stage)
        out.append((m, data))
    return out


def test_a_pass_resumed_at_a_slot_is_the_whole_pass_number_for_number():
    """Every built-in host's forward is the loop it was, and a pass that changes only slot i (its
    counterfactual at alpha 0, its what-if at alpha 1) resumed at slot i from the input the real pass
    kept gives the whole pass's loss and correct count exactly."""
    for m, data in _staged_models():
        host = m.host
        host.eval()
        with torch.inference_mode():
            for batch in data:
                assert torch.equal(host(batch[0]), _whole_forward(host, batch[0]))
                loss, correct, n, inputs = host.loss_and_correct_inputs(batch)
                assert (loss, correct, n) == host.loss_and_correct(batch) and len(inputs) == host.n_slots
                for i in range(host.n_slots):
                    for change in (host.counterfactual(i), host.slot(i).force_alpha(1.0)):
                        with change:
                            whole = host.loss_and_correct(batch)
                            resumed = host.loss_and_correct_from(i, inputs[i], batch)
                        assert torch.equal(whole[0], resumed[0]) and torch.equal(whole[1], resumed[1])


def test_validation_resumes_its_counterfactual_and_whatif_passes_and_reads_the_same(monkeypatch):
    """``measure_validation`` on a staged host resumes each counterfactual and what-if pass at its slot:
    the readings are the ones of whole passes (a host that is not staged), exactly, under both what-if
    statistics, and the stages before each slot run once per batch instead of once per pass."""
    calls = []

    def counting(host):
        real = host._stage

        def stage(i, x):
            calls.append(i)
            return real(i, x)

        return stage

    for m, data in _staged_models():
        host = m.host
        monkeypatch.setattr(host, "_stage", counting(host))
        for statistics in ("running", "batch"):
            calls.clear()
            resumed = m.measure_validation(data, whatif=True, whatif_statistics=statistics)
            n_resumed = len(calls)
            monkeypatch.setattr(host, "staged", False)
            calls.clear()
            whole = m.measure_validation(data, whatif=True, whatif_statistics=statistics)
            monkeypatch.setattr(host, "staged", True)
            for k in ("val_loss", "val_acc", "contribution", "whatif_gain"):
                assert torch.equal(resumed[k], whole[k]), (type(host).__name__, statistics, k)
            assert n_resumed < len(calls), (type(host).__name__, statistics)
