"""The grown network out of Esper (esper.shell.user.export): a plain copy whose slots are torch's own
modules, and a torch.export program, each with the grown network's outputs; both load and run in a fresh
interpreter where esper cannot be imported."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from esper.core.spec import Stage, Style
from esper.shell.host.blueprints import BLUEPRINTS, build_blueprint
from esper.shell.host.hosts import TransformerHost
from esper.shell.user import Grower, Slot, UserHost, export_program, plain_module

#: Gates that always pass: a plan's seeds are fossilized by the fourth epoch.
OPEN = {"lifecycle.g2_min_gain": -100.0, "lifecycle.g2_min_grad_ratio": 0.0, "lifecycle.g2_min_epochs": 1,
        "lifecycle.g3_min_epochs": 1, "lifecycle.g5_min_contribution": -100.0}  # fmt: skip
#: One activation per family (width 8), and two of other batch sizes and lengths.
SHAPES = {"mlp": [(2, 8), (1, 8), (6, 8)], "cnn1d": [(2, 8, 4), (1, 8, 1), (6, 8, 9)],
          "cnn": [(2, 8, 4, 3), (1, 8, 1, 1), (5, 8, 6, 7)],
          "transformer": [(2, 4, 8), (1, 1, 8), (6, 9, 8)]}  # fmt: skip


def _perturb(module: nn.Module, seed: int) -> None:
    """Weights away from the seeds' near-zero init, so every seed changes the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))


def _roundtrip(module: nn.Module) -> nn.Module:
    buf = io.BytesIO()
    torch.save(module, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("family", list(BLUEPRINTS))
def test_every_seed_and_style_becomes_a_graph_with_the_slots_outputs(family):
    """Every blueprint of the family, fossilized or blended (alpha 1 or 0.6), each style in turn (the gate
    of GATED_GATE included): the plain copy, pickled and loaded, gives the grown network's outputs bit for
    bit, on batch sizes and lengths other than the ones traced."""
    slots = []
    for i, name in enumerate(BLUEPRINTS[family]):
        slot = Slot(8, name=f"s{i}", family=family)
        slot.install(build_blueprint(family, name, 8), list(Style)[i % len(Style)], name)
        _perturb(slot, i)
        slot.set(alpha=1.0 if i % 2 else 0.6, stage=Stage.FOSSILIZED if i % 2 else Stage.BLENDING)
        slots.append(slot)
    model = nn.Sequential(*slots).eval()
    plain = _roundtrip(plain_module(model))
    assert all(isinstance(m, torch.fx.GraphModule) for m in plain)
    assert not any(type(m).__module__.startswith("esper") for m in plain.modules())
    for shape in SHAPES[family]:
        x = torch.randn(shape)
        with torch.no_grad():
            assert torch.equal(plain(x), model(x)), shape


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.out = nn.Linear(6, 16), nn.Linear(16, 16), nn.Linear(16, 3)
        self.grow1, self.grow2, self.grow3 = Slot(16), Slot(16), Slot(16)

    def forward(self, x):
        return self.out(self.grow3(self.grow2(torch.relu(self.fc2(self.grow1(torch.relu(self.fc1(x))))))))


def test_a_hosts_network_its_empty_and_incubating_slots_identities():
    """From a UserHost (its network calls the slots through references) or from that network: a
    fossilized seed becomes a graph (the seed's parameters under its names), an incubating one and an
    empty slot ``nn.Identity``; the outputs are the host's; the host is left as it was."""
    torch.manual_seed(0)
    host = UserHost(MLP(), example_input=torch.randn(2, 6))
    fossil, young, _ = host.slots
    fossil.install(build_blueprint("mlp", "widen", 16), Style.GATED_GATE, "widen")
    _perturb(fossil, 0)
    fossil.set(alpha=0.8, stage=Stage.FOSSILIZED)
    young.install(build_blueprint("mlp", "mlp", 16), Style.LINEAR_ADD, "mlp")
    young.set(alpha=0.0, stage=Stage.TRAINING)
    x = torch.randn(5, 6)
    host.eval()
    with torch.no_grad():
        expected = host(x)
    for source in (host, host.model):
        plain = plain_module(source, example_input=x)
        assert isinstance(plain.grow1, torch.fx.GraphModule) and isinstance(plain.grow2, nn.Identity)
        assert isinstance(plain.grow3, nn.Identity) and not plain.training
        assert {k for k in plain.state_dict() if k.startswith("grow1.")} == {
            f"grow1.{k}" for k in fossil.state_dict() if k != "_extra_state"
        }
        with torch.no_grad():
            assert torch.equal(plain(x), expected)
    assert young.stage == Stage.TRAINING and type(host.model.grow1).__name__ == "_SlotRef"


class MixPositions(nn.Module):
    """A seed of the user's that mixes the 4 positions of a ``[N, C, 4]`` signal: it fixes the length."""

    def __init__(self):
        super().__init__()
        self.mix = nn.Linear(4, 4)

    def forward(self, x):
        return self.mix(x)


def test_a_built_in_host_and_a_seed_that_fixes_a_length_are_refused():
    with pytest.raises(ValueError, match="built-in hosts"):
        plain_module(TransformerHost(d_model=8, n_layers=2, n_heads=2, ctx=8))
    slot = Slot(8, name="fixed", family="cnn1d")
    slot.install(MixPositions(), Style.LINEAR_ADD, "mix_positions")
    slot.set(alpha=1.0, stage=Stage.FOSSILIZED)
    with pytest.raises(
        ValueError, match=r"seed of slot 'fixed' \(mix_positions\).*use export_program"
    ) as err:
        plain_module(nn.Sequential(nn.Conv1d(1, 8, 1), slot), example_input=torch.randn(2, 1, 4))
    assert "\n" not in str(err.value)


class TinyLM(nn.Module):
    """A causal byte model with one slot on its residual stream (family transformer)."""

    def __init__(self, d: int = 16, ctx: int = 16):
        super().__init__()
        self.tok, self.pos = nn.Embedding(256, d), nn.Embedding(ctx, d)
        self.mix = nn.Linear(d, d)
        self.grow = Slot(d, family="transformer")
        self.head = nn.Linear(d, 256)

    def forward(self, idx):
        h = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.grow(h + self.mix(h)))


def test_export_program_frees_the_sequence_length_when_asked(tmp_path):
    """A fossilized causal attention seed: the program (saved, loaded) gives the network's logits at
    other batch sizes and lengths; by default only the batch dim is free."""
    torch.manual_seed(0)
    model = TinyLM()
    UserHost(model, family="transformer")  # the slot learns its family (the Grower's host does this)
    slot = model.grow.slot
    slot.install(build_blueprint("transformer", "attention", 16), Style.LINEAR_ADD, "attention")
    _perturb(slot, 1)
    slot.set(alpha=1.0, stage=Stage.FOSSILIZED)
    model.eval()
    x = torch.randint(256, (3, 8))
    dim = torch.export.Dim.AUTO
    export_program(model, x, tmp_path / "lm.pt2", dynamic_shapes=({0: dim, 1: dim},))
    program = torch.export.load(tmp_path / "lm.pt2").module()
    for shape in ((1, 5), (4, 12), (3, 8)):
        idx = torch.randint(256, shape)
        with torch.no_grad():
            torch.testing.assert_close(program(idx), model(idx))
    fixed_length = export_program(model, x).module()
    assert fixed_length(torch.randint(256, (2, 8))).shape == (2, 8, 256)
    with pytest.raises(Exception, match="size|shape"):  # torch's guard: the length was fixed
        fixed_length(torch.randint(256, (3, 5)))


#: What the fresh interpreter runs: no site (so no .pth file, esper's editable finder among them), torch's
#: site-packages on the path, esper asserted unfindable and then blocked; the two artefacts loaded and run.
NO_ESPER = textwrap.dedent(
    """
    import importlib.abc, importlib.util, json, sys
    sys.path.append(sys.argv[1])  # torch's site-packages, its .pth files unread
    assert importlib.util.find_spec("esper") is None, "esper is importable"

    class NoEsper(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "esper" or name.startswith("esper."):
                raise ImportError("esper is blocked in this interpreter")

    sys.meta_path.insert(0, NoEsper())
    import torch

    plain = torch.load("plain.pt", weights_only=False).eval()
    program = torch.export.load("grown.pt2").module()
    out = {"kinds": sorted({type(m).__module__ + "." + type(m).__qualname__ for m in plain.modules()}),
           "plain": [], "program": []}
    for x, expected in torch.load("io.pt", weights_only=True):
        with torch.no_grad():
            out["plain"].append(torch.allclose(plain(x), expected, rtol=1e-5, atol=1e-6))
            out["program"].append(torch.allclose(program(x), expected, rtol=1e-5, atol=1e-6))
    out["esper_modules"] = [m for m in sys.modules if m == "esper" or m.startswith("esper.")]
    print(json.dumps(out))
    """
)


def test_a_grown_network_loads_and_runs_where_esper_cannot_be_imported(tmp_path):
    """A network of torch's containers grown in a loop by a plan (gates open) until its seeds are
    fossilized; its plain copy (``torch.save``) and its program (``torch.export.save``) load in a fresh
    interpreter that cannot import esper (no site, so no editable install; esper asserted unfindable, then
    blocked) and give the grown network's outputs at three batch sizes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), Slot(16, name="grow1"), nn.Linear(16, 16), nn.ReLU(),
                          Slot(16, name="grow2"), nn.Linear(16, 3))  # fmt: skip
    g = torch.Generator().manual_seed(0)
    x, xv = torch.randn(96, 6, generator=g), torch.randn(32, 6, generator=g)
    rule = torch.randn(6, 3, generator=g)
    y, yv = (x @ rule).argmax(-1), (xv @ rule).argmax(-1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    grower = Grower(model, opt, val=(xv, yv), controller={"grow1": "mlp_small", "grow2": "widen"}, epochs=5,
                    overrides=OPEN)  # fmt: skip
    for _ in range(grower.epochs):
        model.train()
        for xb, yb in zip(x.split(32), y.split(32)):
            opt.zero_grad()
            out = model(xb)
            loss = F.cross_entropy(out, yb)
            loss.backward()
            grower.after_backward(xb, yb, loss=loss, output=out)
            opt.step()
        grower.on_epoch_end()
    assert grower.finished and [s.stage for s in grower.host.slots] == [Stage.FOSSILIZED] * 2
    model.eval()
    inputs = [torch.randn(n, 6) for n in (1, 5, 9)]
    with torch.no_grad():
        torch.save([(xi, model(xi)) for xi in inputs], tmp_path / "io.pt")
    torch.save(plain_module(model, example_input=inputs[1]), tmp_path / "plain.pt")
    export_program(model, inputs[1], tmp_path / "grown.pt2")
    (tmp_path / "load.py").write_text(NO_ESPER)
    site = str(Path(torch.__file__).resolve().parent.parent)
    env = {"PATH": os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-I", "-S", "load.py", site], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["plain"] == [True] * 3 and out["program"] == [True] * 3 and out["esper_modules"] == []
    assert all(k.startswith("torch.") for k in out["kinds"]), out["kinds"]
    assert any("GraphModule" in k for k in out["kinds"])
