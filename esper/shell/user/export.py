"""The grown network out of Esper: artefacts that load and run with torch alone.

The grown network (:func:`esper.shell.user.grown.grown_model`, or the user's model after a
:class:`~esper.shell.user.grower.Grower`) holds esper's :class:`~esper.shell.user.host.Slot` modules, and
its seeds are esper's blueprint modules (``SqueezeExcite``, ``LoRA``, ``PreNorm``, ...). Its state dict
loads where esper is importable (and the user's own blueprints registered again), and a pickled copy
(``torch.save(model)``) names esper's classes, so it too needs esper to load. Two calls take it out:

- :func:`plain_module` returns a copy of the network in which each slot is replaced by torch's own
  modules: an empty slot (empty, pruned, incubating, or at alpha 0: a slot that leaves its input
  unchanged) by ``nn.Identity``; a slot whose seed changes the forward (fossilized, or blended at
  alpha > 0) by a ``torch.fx.GraphModule`` that computes what the slot computes, the seed's (and its
  gate's) function composed with the activation by the slot's style at its alpha (``h + alpha · d``,
  ``h · (1 + alpha · tanh(d))`` or ``h + alpha · g · d``, :mod:`esper.shell.host.slots`). The rest of the
  tree (the user's own classes and layers) is the user's, untouched. The graph is the seed's
  ``torch.export`` trace (aten ops, the seed's parameters under the same names: ``grow1.seed.fc1.weight``),
  with every dim but the channel one free, so it runs on activations of any batch size and length. So
  ``torch.save(plain)`` pickles torch classes and the user's, never esper's: it loads where torch and the
  user's own modules import. (If the module that defines the user's class imports esper, as one that
  builds ``Slot``\\ s at its top does, loading imports it too: use :func:`export_program`, or define the
  network with torch's containers, ``nn.Sequential(..., Slot(16), ...)``.) It trains further as a plain
  network: the seeds' parameters are ``nn.Parameter``\\ s of the copy, and their graphs are differentiable;
  a seed's train-mode behaviour (dropout) is its eval-mode one, fixed when traced (the built-in seeds
  have none).
- :func:`export_program` returns (and saves) a ``torch.export`` program of the whole network in eval mode:
  ``torch.export.load(path).module()(x)`` needs torch alone, neither esper nor the user's classes. Its
  batch dim is free by default; ``dynamic_shapes`` frees others (a sequence's length).

Both check, on an example input, that the artefact gives the grown network's outputs.
``tests/shell/user/test_export.py`` loads both in a fresh interpreter that cannot import esper.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from esper.core.spec import Style
from esper.shell.host.hosts import Host
from esper.shell.host.slots import SeedSlot, compose
from esper.shell.user.grown import grown_model
from esper.shell.user.host import LAYOUTS, _SlotRef, channel_dim

#: The name of the class of the module that replaces a slot whose seed changes the forward.
SEED_GRAPH_CLASS = "GrownSeed"
#: The sizes of the free dims (batch, positions) of the activation a seed is traced on when no
#: example input gives the real one (distinct, so that the trace does not tie two dims together).
_TRACE_SIZES = (3, 5, 7)


class _Composed(nn.Module):
    """What a slot whose seed changes the forward computes, without the slot's stages: ``compose`` of the
    activation with the seed's delta (read live, as a fossilized seed reads it) at the slot's alpha. Only
    traced, never returned."""

    def __init__(self, slot: SeedSlot):
        super().__init__()
        self.seed = slot.seed
        self.gate = slot.gate
        self.style = Style(slot.style)
        self.alpha = float(slot.alpha)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        d = self.seed(h)
        g = self.gate(h) if self.gate is not None else None
        return compose(self.style, h, d, self.alpha, g)


def _resolve(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with its slots in place: a host's network (:func:`grown_model`), or the
    network itself, each reference to a host's slot (a network a host wraps) replaced by that slot."""
    if isinstance(model, Host):
        if not hasattr(model, "slot_paths"):
            raise ValueError(
                f"plain_module: a {type(model).__name__} is one of esper's built-in hosts; pass the user's "
                "network (or the UserHost that wraps it)"
            )
        return grown_model(model)
    twin = copy.deepcopy(model)
    for path, module in list(twin.named_modules()):
        if path and isinstance(module, _SlotRef):
            parent, _, leaf = path.rpartition(".")
            twin.get_submodule(parent)._modules[leaf] = module.slot
    return twin


def _example_activation(slot: SeedSlot, where: str) -> torch.Tensor:
    """An activation of ``slot``'s family and width, on its seed's device and in its dtype."""
    if slot.family not in LAYOUTS:
        raise ValueError(f"plain_module: {where} holds a seed but states no family; pass example_input")
    ref = next((p for p in slot.parameters() if p.is_floating_point()), None)
    rank = len(LAYOUTS[slot.family].split(","))
    cdim = channel_dim(slot.family) % rank
    free = iter(_TRACE_SIZES)
    shape = [slot.width if i == cdim else next(free) for i in range(rank)]
    return torch.randn(shape, dtype=ref.dtype if ref is not None else torch.float32,
                       device=ref.device if ref is not None else "cpu")  # fmt: skip


def _seed_graph(slot: SeedSlot, h: torch.Tensor, where: str) -> nn.Module:
    """``slot``'s composed forward as a picklable ``torch.fx.GraphModule`` of aten ops (every dim of the
    activation but its channel one free)."""
    from torch.export import Dim

    module = _Composed(slot).eval()
    cdim = channel_dim(slot.family) % h.dim()
    dims = tuple(Dim.STATIC if i == cdim else Dim.DYNAMIC for i in range(h.dim()))
    try:
        program = torch.export.export(module, (h.detach(),), dynamic_shapes=(dims,))
    except Exception as e:  # one line that says what to do, with torch's reason
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"plain_module: the seed of {where} ({slot.blueprint}) does not export for activations of any "
            f"batch size and length ({first}); use export_program(model, example_inputs), whose shapes "
            "can be fixed"
        ) from e
    traced = program.module()
    # export's module checks its inputs with hooks and a guard submodule that do not pickle; the graph
    # alone, in a plain GraphModule of torch's class, computes the same
    graph = torch.fx.Graph()
    out = graph.graph_copy(traced.graph, {})
    for node in list(graph.nodes):
        if node.op == "call_module" and not node.users:
            graph.erase_node(node)  # the guards' call
    graph.output(out[0] if isinstance(out, (tuple, list)) else out)
    graph.lint()
    return torch.fx.GraphModule(traced, graph, class_name=SEED_GRAPH_CLASS)


def _capture(model: nn.Module, slots: dict[str, SeedSlot], example_input: Any) -> dict[str, torch.Tensor]:
    """Each slot's input in an eval-mode forward of ``example_input``."""
    seen: dict[str, torch.Tensor] = {}

    def record(path: str, args: tuple) -> None:
        seen.setdefault(path, args[0].detach())

    hooks = [
        slot.register_forward_pre_hook(lambda _m, a, p=path: record(p, a)) for path, slot in slots.items()
    ]
    try:
        with torch.no_grad():
            model(*_as_args(example_input))
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def _as_args(example: Any) -> tuple:
    return tuple(example) if isinstance(example, (tuple, list)) else (example,)


def _check_same(ours: Any, theirs: Any, what: str) -> None:
    try:
        torch.testing.assert_close(ours, theirs)
    except AssertionError as e:
        raise ValueError(f"{what} does not give the grown network's outputs on the example input: {e}") from e


def plain_module(model: nn.Module, example_input: Any = None) -> nn.Module:
    """A copy of the grown ``model`` (the user's network, or a :class:`~esper.shell.user.host.UserHost`)
    whose slots are torch's own modules: ``nn.Identity`` where the slot leaves its input unchanged, a
    ``torch.fx.GraphModule`` of the composed seed where it does not (module docstring). Its eval-mode
    outputs are the grown network's; ``torch.save(plain)`` names no esper class. ``example_input``: an
    input of the network (a tensor or a tuple of them): the seeds are traced on the activations it gives
    their slots (default: activations drawn in each slot's layout), and the copy's outputs on it are
    checked against the network's. The copy is in ``model``'s mode, on its device; ``model`` is left as
    it was."""
    twin = _resolve(model)
    slots = {path: m for path, m in twin.named_modules() if isinstance(m, SeedSlot)}
    if "" in slots:
        raise ValueError("plain_module: the model is a slot; pass the network that holds it")
    was_training = twin.training
    twin.eval()
    acts = _capture(twin, slots, example_input) if example_input is not None else {}
    expected = None
    if example_input is not None:
        with torch.no_grad():
            expected = twin(*_as_args(example_input))
    for path, slot in slots.items():
        where = f"slot {slot.name or path!r}"
        if slot.contributes:
            h = acts.get(path)
            replacement = _seed_graph(slot, h if h is not None else _example_activation(slot, where), where)
        else:
            replacement = nn.Identity()
        parent, _, leaf = path.rpartition(".")
        twin.get_submodule(parent)._modules[leaf] = replacement
    if expected is not None:
        with torch.no_grad():
            _check_same(twin(*_as_args(example_input)), expected, "plain_module: the plain copy")
    return twin.train(was_training)


def export_program(
    model: nn.Module,
    example_inputs: Any,
    path: str | Path | None = None,
    *,
    dynamic_shapes: Any = "batch",
    check: bool = True,
) -> torch.export.ExportedProgram:
    """The grown ``model`` (the user's network, or a :class:`~esper.shell.user.host.UserHost`) as a
    ``torch.export`` program of its eval-mode forward on ``example_inputs`` (a tensor or a tuple of the
    forward's arguments), saved to ``path`` (``torch.export.save``) when given. Load it with
    ``torch.export.load(path).module()``: torch alone, no esper, no class of the user's.

    ``dynamic_shapes``: ``"batch"`` (default) frees dim 0 of each tensor argument (``Dim.AUTO``: kept
    fixed only if the forward needs it); ``None`` fixes every shape; anything else is passed to
    ``torch.export.export`` as is (e.g. ``({0: Dim.AUTO, 1: Dim.AUTO},)`` frees a sequence's length too).
    ``check``: compare the program's outputs on ``example_inputs`` with the network's (a ValueError
    otherwise). ``model`` is left in its mode."""
    from torch.export import Dim

    net = grown_model(model) if isinstance(model, Host) and hasattr(model, "slot_paths") else model
    args = _as_args(example_inputs)
    if isinstance(dynamic_shapes, str):
        if dynamic_shapes != "batch":
            raise ValueError(
                f"export_program: dynamic_shapes must be 'batch', None or a spec, got {dynamic_shapes!r}"
            )
        dynamic_shapes = tuple(
            {0: Dim.AUTO} if isinstance(a, torch.Tensor) and a.dim() else None for a in args
        )
    was_training = net.training
    net.eval()
    try:
        program = torch.export.export(net, args, dynamic_shapes=dynamic_shapes)
        if check:
            with torch.no_grad():
                _check_same(program.module()(*args), net(*args), "export_program: the program")
    finally:
        net.train(was_training)
    if path is not None:
        torch.export.save(program, Path(path))
    return program


__all__ = ["SEED_GRAPH_CLASS", "export_program", "plain_module"]
