"""The user's own network as a host: :class:`Slot` marks where it may grow, :class:`UserHost` wraps it.

A slot is a module the user places in their network and calls in its forward, like any layer::

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.block1 = nn.Sequential(nn.Conv1d(1, 8, 1), nn.BatchNorm1d(8), nn.ReLU())
            self.grow1 = Slot(8)                      # width: the channels of the activation it receives
            self.head = nn.Linear(8, 4)

        def forward(self, x):                         # x: [N, 1, L]
            return self.head(self.grow1(self.block1(x)).mean(-1))

An empty slot returns its input unchanged, so the network trains and predicts as it would without it.
:class:`UserHost` makes it a :class:`~esper.shell.host.hosts.Host` the environment can grow: seeds are
germinated into its slots, trained in isolation, blended in, fossilized or pruned, as in the built-in
hosts (:mod:`esper.shell.host.slots` says how a seed composes with the activation).

**One owner per parameter.** The host keeps its slots in ``host.slots`` (what the environment and the
checkpoints read: state-dict keys ``slots.<i>.``). When it wraps the network, each slot moves there and
the network keeps, in the slot's place, a reference without parameters or buffers that calls it. So
every parameter is registered once: :meth:`~esper.shell.host.hosts.Host.host_parameters` holds the
network's own, never a seed's or a gate's, and no parameter is counted twice. A network is wrapped once;
build a fresh one for each host (:func:`esper.shell.user.task.user_task` takes a factory).

**The family** picks the blueprint catalogue (:data:`~esper.shell.host.blueprints.BLUEPRINTS`): ``cnn``
for activations ``[N, C, H, W]``, ``cnn1d`` for ``[N, C, L]``, ``mlp`` for flat ``[N, D]`` (inferred
from the rank of the activations a dummy forward of ``example_input`` sends to the slots), ``transformer``
for ``[N, L, D]`` residual streams (stated, never inferred: its seeds are causal). One host has one family.

**Checks, each a one-line ValueError that says what to do:** a network without slots; a slot whose width
is not the activation's channel count (at wrap time with ``example_input``, else at the slot's first
forward); a slot the dummy forward never reaches; slots of different families.

The slots are ordered by the dummy forward (the first slot the input reaches is slot 0, as in the
built-in hosts, whose slot ``i`` follows block ``i``), else in the order the network registers them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from esper.shell.data.batches import Batch
from esper.shell.host.blueprints import BLUEPRINTS, build_blueprint
from esper.shell.host.hosts import Host
from esper.shell.host.slots import SeedSlot
from esper.shell.user.grown import describe_seed

#: The family a slot's activation implies by its rank (``transformer`` is stated, never inferred).
FAMILY_BY_RANK = {2: "mlp", 3: "cnn1d", 4: "cnn"}
#: The layout of a slot's activation per family (its channel dim is the one named by the width).
LAYOUTS = {"cnn": "[N, C, H, W]", "cnn1d": "[N, C, L]", "transformer": "[N, L, D]", "mlp": "[N, D]"}


def channel_dim(family: str) -> int:
    """The dim of a ``family`` activation that a slot's width counts: the channels, or the features of
    a transformer's residual stream or of a flat vector (``mlp``)."""
    return -1 if family in ("transformer", "mlp") else 1


def _shape(h: torch.Tensor) -> str:
    return "[" + ", ".join(["N", *map(str, h.shape[1:])]) + "]"


def check_activation(slot: SeedSlot, h: torch.Tensor, family: str | None = None) -> str:
    """The family of the activation ``h`` that ``slot`` receives (``family``, else the slot's, else the
    one its rank implies), after checking that the slot fits it; a one-line ValueError otherwise."""
    family = family or slot.family or FAMILY_BY_RANK.get(h.dim())
    where = f"slot {slot.name!r}" if slot.name else f"a Slot({slot.width})"
    if family is None:
        raise ValueError(
            f"{where} receives an activation {_shape(h)}: slots take [N, D] (mlp), [N, C, L] (cnn1d) or "
            "[N, C, H, W] (cnn) activations, or [N, L, D] with family='transformer'; move the slot or state "
            "the family"
        )
    if h.dim() != len(LAYOUTS[family].split(",")):
        raise ValueError(
            f"{where} of family {family} takes {LAYOUTS[family]} activations, got {_shape(h)}; move the slot "
            "or state another family"
        )
    channels = h.shape[channel_dim(family)]
    if channels != slot.width:
        hint = ""
        if family == "cnn1d" and h.shape[-1] == slot.width:
            hint = " (a sequence of features [N, L, D]? pass family='transformer')"
        raise ValueError(
            f"{where} has width {slot.width} but receives {channels} channels ({family} activation "
            f"{_shape(h)}){hint}: make it Slot({channels}), or move it after a layer with {slot.width} "
            "channels"
        )
    return family


class Slot(SeedSlot):
    """Where the user's network may grow: ``width`` channels (``[N, C, ...]`` activations) or features
    (a flat ``[N, D]``, a transformer's ``[N, L, D]``). Empty, it returns its input; in a host, a seed
    composes with it by stage, style and alpha. ``name``: how the controller's events and plans
    (``grow:NAME=BLUEPRINT``) call it (default: its path in the network, e.g. ``grow1`` or
    ``blocks.0.3``); ``family``: its blueprint family (default: the host's, inferred from the
    activation). Every forward checks that the activation has ``width`` channels."""

    def __init__(self, width: int, *, name: str | None = None, family: str | None = None):
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"Slot: width must be an int >= 1 (the activation's channels), got {width!r}")
        if family is not None and family not in BLUEPRINTS:
            raise ValueError(f"Slot: unknown family {family!r}; families: {', '.join(BLUEPRINTS)}")
        super().__init__(name or "", width, family)  # type: ignore[arg-type]  # the host sets the family
        #: Whether the user named it (else the host names it by its path in the network).
        self.named = name is not None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        check_activation(self, h)
        return super().forward(h)

    # A slot's state-dict entry ``<path>._extra_state`` describes its seed (blueprint, family, style,
    # stage, alpha; ``{}`` when empty), so a grown network saved with ``torch.save(model.state_dict())``
    # loads back into a fresh network of the user's class: each slot builds its seed from the description
    # before the seed's weights load (:mod:`esper.shell.user.grown`). Load on the CPU, then move it.
    def get_extra_state(self) -> dict:
        return describe_seed(self)

    def set_extra_state(self, state: dict) -> None:
        if not state:
            if self.seed is not None:
                self.remove()
            return
        if self.seed is not None and self.blueprint == state["blueprint"]:
            self.set(alpha=state["alpha"], stage=state["stage"])
            return
        if self.seed is not None:
            self.remove()
        self.family = state["family"]
        self.install(build_blueprint(self.family, state["blueprint"], self.width), state["style"],
                     state["blueprint"])  # fmt: skip
        self.set(alpha=state["alpha"], stage=state["stage"])


class _SlotRef(nn.Module):
    """What the network holds in a slot's place once a host owns the slot: a call to it, without
    registering it (no parameters, buffers or state-dict keys of its own)."""

    def __init__(self, slot: SeedSlot):
        super().__init__()
        object.__setattr__(self, "slot", slot)  # a plain attribute: nn.Module would register it

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.slot(h)

    def extra_repr(self) -> str:
        return f"-> host.slots[{self.slot.name!r}]"


def cross_entropy(output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The default loss: mean cross-entropy of logits ``[..., K]`` against class indices ``[...]``."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), y.reshape(-1))


def top1(output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The default metric: per item, whether the largest logit is the label (bool ``[...]``)."""
    return output.argmax(dim=-1) == y


#: ``loss(output, y) -> mean loss (0-d, with grad)``.
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: ``metric(output, y) -> bool tensor``: True for each item counted correct; accuracy is their share.
Metric = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class UserHost(Host):
    """The user's ``model`` as a host: its :class:`Slot` modules (or plain
    :class:`~esper.shell.host.slots.SeedSlot`\\ s) are its slots, ``loss(model(x), y)`` what it trains
    on, and ``metric(model(x), y)`` what it counts correct (the accuracy the controller sees and the
    test reports). Defaults: cross-entropy and top-1 on logits ``[N, K]`` (or ``[N, L, K]``).

    ``example_input``: one small batch of inputs. The host runs it once (eval mode, no grad) to order
    the slots as the forward reaches them, infer their family (``family``: state it instead, or as
    well) and check their widths; :attr:`output_shape` is what one example gives. Without it ``family``
    is needed, and each slot checks its width at its first forward. The module docstring has the rest."""

    def __init__(
        self,
        model: nn.Module,
        *,
        example_input: torch.Tensor | None = None,
        family: str | None = None,
        loss: Loss | None = None,
        metric: Metric | None = None,
    ):
        nn.Module.__init__(self)  # not Host.__init__: the slots are the model's, not built here
        if not isinstance(model, nn.Module):
            raise TypeError(f"UserHost: model must be an nn.Module, got {type(model).__name__}")
        if family is not None and family not in BLUEPRINTS:
            raise ValueError(f"UserHost: unknown family {family!r}; families: {', '.join(BLUEPRINTS)}")
        found = [(path, m) for path, m in model.named_modules() if isinstance(m, SeedSlot) and path]
        kind = type(model).__name__
        if any(isinstance(m, _SlotRef) for m in model.modules()):
            raise ValueError(f"UserHost: this {kind} is wrapped by a host already; build one per host")
        if not found:
            raise ValueError(
                f"UserHost: {kind} has no seed slots; place esper.shell.user.Slot(width) modules where it "
                "may grow and call them in its forward"
            )
        slots = [m for _, m in found]
        for path, slot in found:
            if not (slot.name and (not isinstance(slot, Slot) or slot.named)):
                slot.name = path
        names = [s.name for s in slots]
        if len(set(names)) != len(names):
            raise ValueError(f"UserHost: slot names must differ, got {names}; use Slot(width, name=...)")
        stated = {s.family for s in slots if s.family is not None} | ({family} if family else set())
        if len(stated) > 1:
            raise ValueError(f"UserHost: the slots state different families {sorted(stated)}; a host has one")
        family = next(iter(stated), None)
        for slot in slots:  # a stated family holds from the first forward (the probe's included)
            slot.family = family
        for path, slot in found:  # the host owns the slots; the model calls them through a reference
            parent, _, leaf = path.rpartition(".")
            model.get_submodule(parent)._modules[leaf] = _SlotRef(slot)
        self.model = model
        #: Each slot's path in the model (where :func:`esper.shell.user.grown.grown_model` puts it back).
        self.slot_paths: dict[str, str] = {slot.name: path for path, slot in found}
        #: What the model gives for one example of ``example_input`` (None without it).
        self.output_shape: tuple[int, ...] | None = None
        if example_input is not None:
            family, slots, self.output_shape = self._probe(model, slots, example_input, family)
        elif family is None:
            raise ValueError(
                "UserHost: pass example_input (one small batch) or family='cnn1d' | 'cnn' | 'mlp' | "
                "'transformer': the slots' family picks their blueprints"
            )
        for slot in slots:
            slot.family = family  # inferred by the probe, or as stated
        #: "cnn", "cnn1d", "mlp" or "transformer": picks the blueprint registry.
        self.family = family
        self.keep_catalogue()  # the family's catalogue now is this host's for its life
        self.slots = nn.ModuleList(slots)
        self.loss: Loss = loss or cross_entropy
        self.metric: Metric = metric or top1

    @staticmethod
    def _probe(model: nn.Module, slots: list[SeedSlot], x: torch.Tensor, family: str | None):
        """Run ``x`` through ``model`` once: ``(family, slots in the order the forward reaches them, the
        output shape of one example)``, every slot checked against its activation."""
        reached: dict[int, str] = {}

        def record(slot: SeedSlot, _module: nn.Module, args: tuple) -> None:
            if id(slot) not in reached:
                reached[id(slot)] = check_activation(slot, args[0], family)

        hooks = [s.register_forward_pre_hook(lambda m, a, s=s: record(s, m, a)) for s in slots]
        was_training = model.training
        model.eval()  # no batch-norm statistics move, no dropout draws from the generator
        try:
            with torch.no_grad():
                out = model(x)
        finally:
            model.train(was_training)
            for hook in hooks:
                hook.remove()
        missed = [s.name for s in slots if id(s) not in reached]
        if missed:
            raise ValueError(
                f"UserHost: slot(s) {missed} never ran in the forward of the example input; call each slot "
                "in forward, or remove it"
            )
        families = {reached[id(s)] for s in slots}
        if len(families) > 1:
            kinds = ", ".join(f"{s.name}: {reached[id(s)]}" for s in slots)
            raise ValueError(f"UserHost: the slots receive activations of different families ({kinds}); "
                             "one host has one family")  # fmt: skip
        order = list(reached)
        slots = sorted(slots, key=lambda s: order.index(id(s)))
        return families.pop(), slots, tuple(out.shape[1:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def loss_and_correct(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, int]:
        x, y = batch
        out = self.model(x)
        hit = self.metric(out.detach(), y)
        return self.loss(out, y), hit.sum(dtype=torch.int64), hit.numel()


__all__ = ["FAMILY_BY_RANK", "LAYOUTS", "Loss", "Metric", "Slot", "UserHost", "channel_dim",
           "check_activation", "cross_entropy", "top1"]  # fmt: skip
