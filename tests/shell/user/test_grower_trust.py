"""A Grower a practitioner can trust (issue 104): the catalogue it was built with holds, a blueprint that
does not fit a slot's width is refused naming both, misuse is refused in one line (a module for a
builder, two Growers on one model, a network whose seeds its state does not know, a forgotten
``after_backward``), the model's modes, the user's weight-decay split and the events survive, the
what-if pass touches only the seeds and reads the configured statistics, the seeds follow a learning
rate set by hand, and the host trains, number for number, as without the slots until a seed blends in.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from esper.core.spec import Style
from esper.shell.host.blueprints import BUILTIN_BLUEPRINTS, GLOBAL
from esper.shell.host.registry import register_blueprint, unregister_blueprint
from esper.shell.user import Grower, Slot, user_task
from tests.shell.host.test_registry import ChannelScale
from tests.shell.host.test_user import Net1d, _data, _host
from tests.shell.user.test_grower import OPEN, PLAN, _batches, _net, _train

ROOT = Path(__file__).resolve().parents[3]


def _grower(model=None, opt=None, **kwargs) -> Grower:
    model = model if model is not None else _net()
    opt = opt if opt is not None else torch.optim.SGD(model.parameters(), lr=0.05)
    return Grower(model, opt, val=kwargs.pop("val", _data(32, 1)), **{"controller": PLAN, "epochs": 6,
                                                                     **kwargs})  # fmt: skip


def _seed_groups(g: Grower) -> list[dict]:
    return g.optimizer.param_groups[1:] if len(g.optimizer.param_groups) > 1 else []


# ------------------------------------------------------------------------------------ 1. the catalogue
def test_issue104_a_blueprint_registered_after_a_grower_does_not_change_its_catalogue():
    """The plan names conv_light; a blueprint registered after the Grower lands before it in the
    family's registry; the Grower still germinates conv_light (and a host keeps its catalogue, a
    blueprint unregistered after it was built included)."""
    g = _grower(overrides=OPEN)
    host = _host()
    before = g.host.blueprint_names
    register_blueprint("cnn1d", "tiny_scale", ChannelScale, kind="normalization")
    try:
        assert g.host.blueprint_names == before == host.blueprint_names and "tiny_scale" not in before
        log = _train(g, _batches(64, 0), 1)
        assert [(e["slot"], e["blueprint"]) for e in log[0]["events"]] == [("tail.1", "conv_light")]
        assert g.host.slots[1].blueprint == "conv_light"
    finally:
        unregister_blueprint("cnn1d", "tiny_scale")
    index = register_blueprint("cnn1d", "tiny_scale", ChannelScale, kind="normalization")
    try:
        host = _host()
    finally:
        unregister_blueprint("cnn1d", "tiny_scale")
    assert host.blueprint_names[index] == "tiny_scale"
    host.germinate(0, index, Style.LINEAR_ADD)
    assert isinstance(host.slots[0].seed, ChannelScale) and host.slots[0].blueprint == "tiny_scale"


# ------------------------------------------------------------------------ 2. every width of the slots
class Heads8(nn.Module):
    """Self-attention over positions with 8 heads: fits width 8 (registration's), not width 12."""

    def __init__(self, c: int):
        super().__init__()
        self.attn = nn.MultiheadAttention(c, 8, batch_first=True)
        self.scale = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.transpose(1, 2)
        return self.scale * self.attn(h, h, h, need_weights=False)[0].transpose(1, 2)


def test_issue104_a_blueprint_that_fails_at_a_slots_width_is_refused_naming_both():
    register_blueprint("cnn1d", "heads8", Heads8, kind="self_attention", reach=GLOBAL)  # width 8: fits
    try:
        torch.manual_seed(0)
        model = Net1d(widths=(12, 12, 12))
        for controller in ("static", "heuristic"):
            with pytest.raises(ValueError, match=r"heads8.*slot 'tail\.2'.*width 12") as err:
                Grower(
                    model, torch.optim.SGD(model.parameters(), lr=0.1), val=_data(8, 1), controller=controller
                )
            assert "\n" not in str(err.value) and "divisible" in str(err.value)
        _grower(controller="static")  # width 8 slots: it fits
    finally:
        unregister_blueprint("cnn1d", "heads8")


# ------------------------------------------------------------------------------------------ 3. misuse
def test_issue104_a_module_instance_for_a_builder_is_refused():
    with pytest.raises(ValueError, match=r"builder is a Conv1d instance") as err:
        register_blueprint("cnn1d", "conv_inst", nn.Conv1d(8, 8, 1), kind="convolution")
    assert "\n" not in str(err.value)
    x, y = _data(16, 0)
    with pytest.raises(ValueError, match=r"model_factory is a Net1d instance") as err:
        user_task(Net1d(), train=(x, y), val=(x, y), test=(x, y))
    assert "\n" not in str(err.value)


def test_issue104_a_second_grower_on_one_model_is_refused_at_its_construction():
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    first = _grower(model, opt)
    with pytest.raises(ValueError, match=r"Net1d is grown by another Grower") as err:
        _grower(model, opt)
    assert "\n" not in str(err.value) and not first.finished


def test_issue104_a_network_holding_seeds_the_growers_state_does_not_know_is_refused():
    """The network's state and the Grower's come from one checkpoint (the network loaded first or
    after): every seed is in the optimizer. A network whose state holds a seed the Grower's state
    does not (a stale Grower state) is refused, loaded before ``g.load_state_dict`` or after it."""
    train = _batches(64, 0)
    first = _grower(overrides=OPEN)
    stale = first.state_dict()
    _train(first, train, 2)
    model_state, state = first.model.state_dict(), first.state_dict()
    g = _grower(overrides=OPEN)
    g.model.load_state_dict(model_state)
    g.load_state_dict(state)
    seed = g.host.slots[1].seed_parameters()
    trained = {id(p) for group in _seed_groups(g) for p in group["params"]}
    assert seed and all(id(p) in trained for p in seed)
    g = _grower(overrides=OPEN)
    g.model.load_state_dict(model_state)
    with pytest.raises(ValueError, match=r"^Grower.*slot 'tail\.1'") as err:
        g.load_state_dict(stale)
    assert "\n" not in str(err.value)
    g = _grower(overrides=OPEN)
    g.load_state_dict(stale)
    g.model.load_state_dict(model_state)
    with pytest.raises(ValueError, match=r"^Grower.*slot 'tail\.1'") as err:
        _train(g, train, 1)
    assert "\n" not in str(err.value)


def _loop_without_after_backward(g: Grower, batches, epochs: int) -> None:
    for _ in range(epochs):
        g.model.train()
        for x, y in batches:
            g.optimizer.zero_grad()
            F.cross_entropy(g.model(x), y).backward()
            g.optimizer.step()
        g.on_epoch_end()


def test_issue104_a_forgotten_after_backward_warns_once():
    train = _batches(64, 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _loop_without_after_backward(_grower(), train, 4)  # germinated at epoch 1, incubating after
    said = [str(w.message) for w in caught if "after_backward" in str(w.message)]
    assert len(said) == 1 and "tail.1" in said[0] and "\n" not in said[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train(_grower(), train, 3)
    assert not [w for w in caught if "after_backward" in str(w.message)]


# ------------------------------------------------------------------------------------ 4. small things
def test_issue104_on_epoch_end_restores_the_models_modes():
    g = _grower(controller="static")
    model = g.model
    model.train()
    model.blocks[0][1].eval()  # a frozen batch norm
    g.on_epoch_end()
    assert model.training and not model.blocks[0][1].training and model.blocks[1][1].training
    model.eval()
    g.on_epoch_end()
    assert not any(m.training for m in model.modules())


def test_issue104_seed_groups_follow_the_users_weight_decay_split():
    """The user's AdamW decays matrices (0.1) and not biases or norm weights (0.0), its constructor's
    default 0.01 in neither: a seed's matrices are decayed at 0.1, its biases and norm weights not."""
    model = _net()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=0.01)  # fmt: skip
    g = _grower(model, opt, overrides=OPEN)
    _train(g, _batches(64, 0), 1)
    seed = g.host.slots[1].seed_parameters()
    decay_of = {id(p): group["weight_decay"] for group in _seed_groups(g) for p in group["params"]}
    assert {p.dim() >= 2 for p in seed} == {True, False}
    assert all(decay_of[id(p)] == (0.1 if p.dim() >= 2 else 0.0) for p in seed)
    # one group, one weight decay: one seed group, as before
    g = _grower(overrides=OPEN)
    _train(g, _batches(64, 0), 1)
    assert len(_seed_groups(g)) == 1


def test_issue104_the_events_survive_a_resume():
    train = _batches(64, 0)
    first = _grower(overrides=OPEN)
    _train(first, train, 2)
    state = first.state_dict()
    second = _grower(overrides=OPEN)
    second.load_state_dict(state)
    second.model.load_state_dict(first.model.state_dict())
    assert first.events and second.events == first.events
    _train(first, train, 1)
    _train(second, train, 1)
    assert second.events == first.events


def test_issue104_the_page_lists_the_2d_blueprints_and_unregister_blueprint():
    page = (ROOT / "docs" / "grow-your-model.md").read_text()
    assert "unregister_blueprint(" in page
    heading = next(line for line in page.splitlines() if line.startswith("## ") and "2-D" in line)
    section = page.split(heading, 1)[1].split("\n## ", 1)[0]
    assert all(f"`{b}`" in section for b in BUILTIN_BLUEPRINTS["cnn"] if b != "noop")


# ------------------------------------------------------------------------------ 5. the what-if pass
def test_issue104_the_whatif_backward_reaches_the_seeds_only():
    g = _grower()  # the default gates: the seed incubates
    _train(g, _batches(64, 0), 1)
    model, (x, y) = g.model, _batches(64, 2)[0]
    model.train()
    g.optimizer.zero_grad()
    out = model(x)
    loss = F.cross_entropy(out, y)
    loss.backward()
    host = g.host.host_parameters()
    grads = [p.grad.clone() for p in host]
    g.after_backward(x, y, loss=loss, output=out)
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, host, strict=True))
    seed = g.host.slots[1].seed_parameters()
    assert g.host.slots[1].incubating and any(p.grad is not None and p.grad.abs().sum() > 0 for p in seed)


def test_issue104_the_grower_reads_whatif_statistics():
    """``lifecycle.whatif_statistics batch``: the what-if gain the Grower records is the one read with
    each batch's own batch-norm statistics, which here differs from the running statistics' reading."""
    val = _data(256, 1)
    for stats in ("batch", "running"):
        model = _net()
        opt = torch.optim.SGD(model.parameters(), lr=0.2)
        g = _grower(model, opt, val=val, overrides={"lifecycle.g2_evidence": "what_if",
                                                    "lifecycle.whatif_statistics": stats})  # fmt: skip
        _train(g, _batches(128, 0), 2)
        for x, y in _batches(128, 0):  # the third epoch's training
            g.optimizer.zero_grad()
            out = g.model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            g.after_backward(x, y, loss=loss, output=out)
            g.optimizer.step()
        assert g.host.slots[1].incubating
        read = {s: g._measurer.measure_validation([val], whatif=True, whatif_statistics=s)["whatif_gain"]
                for s in ("batch", "running")}  # fmt: skip
        assert not torch.equal(read["batch"], read["running"])
        g.on_epoch_end()
        assert torch.equal(g._measured["whatif_gain"], read[stats])


def test_issue104_seed_groups_follow_a_learning_rate_set_by_hand():
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = _grower(model, opt, seed_lr_scale=0.5)
    train = _batches(64, 0)
    for epoch in range(4):
        opt.param_groups[0]["lr"] = 0.05 / (epoch + 1)  # the user's own schedule, no scheduler
        _train(g, train, 1)
        if epoch:
            assert _seed_groups(g) and all(
                group["lr"] == pytest.approx(0.025 / (epoch + 1)) for group in _seed_groups(g)
            )


# -------------------------------------------------------------------------- 6. the host, untouched
class DropNet(nn.Module):
    """Two blocks with batch norm and dropout 0.1, a slot after each, dropout before the head."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv1d(c, 8, 1), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.1), nn.MaxPool1d(2))
            for c in (1, 8)
        )
        self.grow = nn.ModuleList(Slot(8) for _ in range(2))
        self.head = nn.Sequential(nn.Dropout(0.1), nn.Linear(8, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block, slot in zip(self.blocks, self.grow, strict=True):
            x = slot(block(x))
        return self.head(x.mean(-1))


def _host_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("grow.")}


def _dropout_run(grower: bool, epochs: int) -> tuple[list[dict], list[list[dict]]]:
    """The user's loop: dropout, SGD with momentum, gradient clipping at 0.1; with a Grower (a plan,
    the gates open after two epochs of incubation), clipping ``g.host_parameters()``."""
    torch.manual_seed(0)
    model = DropNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    val = DataLoader(TensorDataset(*_data(64, 1)), batch_size=32, shuffle=True)  # draws a seed per epoch
    g = None
    if grower:
        g = Grower(model, opt, val=val, controller={"grow.0": "conv_light"}, epochs=8,
                   overrides={**OPEN, "lifecycle.g2_min_epochs": 2})  # fmt: skip
    states, events = [], []
    for _ in range(epochs):
        model.train()
        for x, y in _batches(128, 0):
            opt.zero_grad()
            out = model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            if g is not None:
                g.after_backward(x, y, loss=loss, output=out)
            clipped = g.host_parameters() if g is not None else model.parameters()
            torch.nn.utils.clip_grad_norm_(clipped, 0.1)
            opt.step()
        events.append(g.on_epoch_end()["events"] if g is not None else [])
        states.append(_host_state(model))
    return states, events


def test_issue104_with_dropout_and_clipping_the_host_trains_as_a_static_run_until_a_seed_blends():
    static, _ = _dropout_run(False, 6)
    grown, events = _dropout_run(True, 6)
    stages = [[e["stage"] for e in epoch] for epoch in events]
    blend = next(i for i, s in enumerate(stages) if "BLENDING" in s)
    assert stages[0] == ["GERMINATED"] and blend >= 2  # two epochs and more of what-if passes
    for epoch in range(blend + 1):  # the seed incubated through the blending epoch's training
        assert static[epoch].keys() == grown[epoch].keys()
        assert all(torch.equal(static[epoch][k], grown[epoch][k]) for k in static[epoch]), epoch
    assert not all(torch.equal(static[-1][k], grown[-1][k]) for k in static[-1])  # blended: it differs
