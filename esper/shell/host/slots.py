"""Seed slots: the injection points of a host, where a seed's delta is composed with the activation.

A :class:`SeedSlot` holds at most one seed (a blueprint module, :mod:`esper.shell.host.blueprints`), the
gate of a GATED_GATE seed, the blend weight ``alpha`` (a Python float the shell sets each epoch) and
the lifecycle ``stage``. With ``h`` the host activation, ``x`` the seed's input and ``d = seed(x)``:

=================================== ============================================
style                               composed output ``y(alpha)``
=================================== ============================================
LINEAR_ADD, SIGMOID_ADD             ``h + alpha · d``
LINEAR_MULTIPLY                     ``h · (1 + alpha · tanh(d))``
GATED_GATE                          ``h + alpha · g(x) · d``
=================================== ============================================

(SIGMOID_ADD differs from LINEAR_ADD only in the curve the lifecycle ramps alpha along.) ``g`` is a
small trained gate in (0, 1): CNN, one value per sample from channel-pooled features; transformer,
one value per position from that position's features (pooling over the sequence would let a token
read later tokens and break the LM's causality). Its parameters are returned with the seed's, so
they are optimized (the reference left them in no optimizer).

Forward by stage:

- empty slot (no seed): ``h``.
- GERMINATED, TRAINING (incubation): ``h``, the seed is not run, so the host trains exactly as if
  the slot were empty (``alpha`` is ignored). The seed learns in a separate *what-if* pass
  (:meth:`esper.shell.host.hosts.Host.incubating`, used by
  :meth:`esper.shell.host.model.EnvModel.train_epoch`):
  under ``force_alpha(1)`` the slot composes ``y(1)`` with ``x = h.detach()``, the loss of that
  forward is back-propagated into the incubating seeds only, and batch-norm statistics are frozen
  during it. The seed thus trains on the host's residual and sees its own effect on the loss. (A
  straight-through forward, ``h + (y − y.detach())``, evaluates the loss at the host's output
  whatever the seed does: its gradient never responds to the seed's own delta, so the delta grows
  without bound along the first gradient and wrecks the host once blended in.)
- BLENDING, HOLDING, PRUNED: ``y(alpha)`` with ``x = h.detach()``: the host's downstream layers see
  the blend, but the layers before the slot are not shaped by a seed that may still be pruned
  (the reference kept this isolation for its CNN host; we keep it for both families).
- FOSSILIZED: ``y(alpha)`` with ``x = h``: the seed is permanent, so gradients flow into the host
  through it. Seeds keep training after fossilization (their optimizer stays, as in the reference).
- ``lifecycle.attach_at blending`` (:func:`attach_seeds`): BLENDING and HOLDING read ``x = h`` too, so
  the host trains through a seed from the first epoch it is blended in. The isolation costs a task
  whose seed needs the host to change under it (``recall``: the host settles within a few epochs, and
  a seed it first trains through at fossilization finds it settled; docs/experiment-log.md).
- ``alpha == 0`` in any non-training stage returns ``h`` without running the seed, so the output is
  exactly the host's.

:meth:`SeedSlot.force_alpha` overrides alpha inside a ``with`` block, for counterfactual validation;
while it is active every stage composes ``y(forced)`` (a TRAINING seed under ``force_alpha(1)`` shows
what blending it in would do), and ``force_alpha(0)`` returns ``h`` exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from esper.core.spec import LIVE_STAGES, Stage, Style

#: Stages whose seed incubates: the normal forward skips it, a what-if pass trains it.
INCUBATING_STAGES = frozenset({Stage.GERMINATED, Stage.TRAINING})
#: Stages in which the seed reads ``h.detach()`` (everything but FOSSILIZED; incubating seeds too, in
#: the what-if pass): the reference's isolation, ``lifecycle.attach_at fossilized``.
DETACHED_INPUT_STAGES = frozenset(LIVE_STAGES) - {Stage.FOSSILIZED}
#: ``lifecycle.attach_at`` -> the stages in which a seed reads ``h.detach()``.
DETACHED_BY_ATTACH = {
    "fossilized": DETACHED_INPUT_STAGES,
    "blending": DETACHED_INPUT_STAGES - {Stage.BLENDING, Stage.HOLDING},
}


class Gate(nn.Module):
    """Per-sample gate ``g(x)`` in (0, 1), shaped to broadcast against ``x``.

    CNN (``[N, C, H, W]``; cnn1d ``[N, C, L]``): mean over the spatial dims -> Linear(C, C/4) -> ReLU
    -> Linear(C/4, 1) -> sigmoid, ``[N, 1, 1, 1]`` (``[N, 1, 1]``). Transformer (``[N, L, D]``): the
    same MLP per position, ``[N, L, 1]``. The last layer starts at zero, so a fresh gate is 0.5
    everywhere.
    """

    def __init__(self, width: int, family: str):
        super().__init__()
        if family not in ("cnn", "cnn1d", "transformer", "mlp"):
            raise ValueError(f"Gate: unknown family {family!r}")
        self.family = family
        hidden = max(1, width // 4)
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, 1)
        nn.init.zeros_(self.fc2.weight)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.family not in ("transformer", "mlp"):  # mlp [N, D]: one value per row, [N, 1]
            spatial = tuple(range(2, x.dim()))
            g = torch.sigmoid(self.fc2(F.relu(self.fc1(x.mean(dim=spatial)))))  # [N, 1]
            return g.reshape(*g.shape, *(1,) * len(spatial))
        return torch.sigmoid(self.fc2(F.relu(self.fc1(x))))  # [N, L, 1]


#: The blend kinds, in the order a mixed blend adds their terms: the term each adds to ``h`` is
#: ``alpha · d`` (``add``), ``alpha · h · tanh(d)`` (``mul``) or ``alpha · g · d`` (``gate``).
BLEND_KINDS = ("add", "mul", "gate")
#: Each style's blend kind (the table above).
BLEND = {
    Style.LINEAR_ADD: "add", Style.SIGMOID_ADD: "add", Style.LINEAR_MULTIPLY: "mul", Style.GATED_GATE: "gate"
}  # fmt: skip


def blend(
    h: torch.Tensor, d: torch.Tensor, alpha: Mapping[str, float | torch.Tensor | None],
    g: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """The composed output of the table above for both host paths: the seed slot's (one style, a float
    alpha) and the stacked hosts' (:mod:`esper.shell.host.stacked`, a group of envs, each with its style:
    per kind a tensor of each env's alpha, zero where the env's style is another kind). ``alpha`` maps a
    blend kind to its weight (None or left out: the kind is absent). One kind alone is composed as the
    table writes it; several add each kind's term to ``h`` in :data:`BLEND_KINDS` order. ``g``: the gate
    value, needed with ``gate``."""
    a = {k: alpha.get(k) for k in BLEND_KINDS}
    if a["gate"] is not None and g is None:
        raise ValueError("blend: GATED_GATE needs the gate value g")
    present = [k for k in BLEND_KINDS if a[k] is not None]
    if present == ["add"]:
        return h + a["add"] * d
    if present == ["mul"]:
        return h * (1.0 + a["mul"] * torch.tanh(d))
    if present == ["gate"]:
        return h + a["gate"] * g * d
    y = h
    if a["add"] is not None:
        y = y + a["add"] * d
    if a["mul"] is not None:
        y = y + a["mul"] * h * torch.tanh(d)
    if a["gate"] is not None:
        y = y + a["gate"] * g * d
    return y


def compose(style: Style, h: torch.Tensor, d: torch.Tensor, alpha: float, g: torch.Tensor | None = None):
    """The composed output of one seed of ``style`` (:func:`blend`; ``g`` only for GATED_GATE)."""
    try:
        kind = BLEND[Style(style)]
    except (KeyError, ValueError):
        raise ValueError(f"compose: unknown style {style!r}") from None
    if kind == "gate" and g is None:
        raise ValueError("compose: GATED_GATE needs the gate value g")
    return blend(h, d, {kind: alpha}, g)


def _check_alpha(alpha: float, where: str) -> float:
    alpha = float(alpha)
    if not (math.isfinite(alpha) and 0.0 <= alpha <= 1.0):
        raise ValueError(f"{where}: alpha must be a finite number in [0, 1], got {alpha}")
    return alpha


class SeedSlot(nn.Module):
    """One named injection point of ``width`` channels/features in a host of ``family``."""

    def __init__(self, name: str, width: int, family: str):
        super().__init__()
        self.name = name
        self.width = width
        self.family = family
        self.register_module("seed", None)
        self.register_module("gate", None)
        self.blueprint: str | None = None
        self.style = Style.LINEAR_ADD
        self.alpha = 0.0
        self.stage = Stage.DORMANT
        self._forced: float | None = None
        #: The stages in which the seed reads the host's activation detached (:func:`attach_seeds`).
        self.detached_stages: frozenset[Stage] = DETACHED_INPUT_STAGES

    # ------------------------------------------------------------------------------ seed management
    @property
    def occupied(self) -> bool:
        return self.seed is not None

    def install(self, seed: nn.Module, style: Style | int, blueprint: str) -> list[nn.Parameter]:
        """Put ``seed`` in the empty slot (stage GERMINATED, alpha 0); build the gate for GATED_GATE.
        Returns the trainable parameters (seed, then gate). Move the slot to the host's device after
        (``slot.to(device)``; the slot has no parameters of its own)."""
        if self.seed is not None:
            raise ValueError(f"slot {self.name!r} already holds a {self.blueprint!r} seed")
        style = Style(style)
        self.seed = seed
        self.gate = Gate(self.width, self.family) if style == Style.GATED_GATE else None
        self.style = style
        self.blueprint = blueprint
        self.alpha = 0.0
        self.stage = Stage.GERMINATED
        return self.seed_parameters()

    def remove(self) -> None:
        """Drop the seed and its gate (their parameters leave the module); the slot becomes DORMANT."""
        self.seed = None
        self.gate = None
        self.blueprint = None
        self.style = Style.LINEAR_ADD
        self.alpha = 0.0
        self.stage = Stage.DORMANT

    def seed_parameters(self) -> list[nn.Parameter]:
        params = [] if self.seed is None else list(self.seed.parameters())
        return params + ([] if self.gate is None else list(self.gate.parameters()))

    def set(self, *, alpha: float, stage: Stage | int) -> None:
        """Set the blend weight and stage. A live stage needs a seed; a non-live stage needs none
        (remove the seed first)."""
        stage = Stage(stage)
        live = stage in LIVE_STAGES
        if live and self.seed is None:
            raise ValueError(f"slot {self.name!r}: stage {stage.name} needs a seed, the slot is empty")
        if not live and self.seed is not None:
            raise ValueError(f"slot {self.name!r}: stage {stage.name} with a seed present; remove it first")
        self.alpha = _check_alpha(alpha, f"slot {self.name!r}")
        self.stage = stage

    @property
    def contributes(self) -> bool:
        """Whether the slot can change the forward value (seed present, blended, alpha > 0)."""
        return self.seed is not None and self.stage not in INCUBATING_STAGES and self.alpha > 0.0

    @property
    def reads_live(self) -> bool:
        """Whether the seed reads the host's live activation (the layers before the slot train through it)."""
        return self.stage not in self.detached_stages

    @property
    def incubating(self) -> bool:
        """Whether the slot holds a seed that trains only in the what-if pass."""
        return self.seed is not None and self.stage in INCUBATING_STAGES

    @contextmanager
    def force_alpha(self, value: float) -> Iterator[None]:
        """Compose with ``alpha = value`` in every stage inside the block (counterfactuals)."""
        value = _check_alpha(value, f"slot {self.name!r}.force_alpha")
        previous, self._forced = self._forced, value
        try:
            yield
        finally:
            self._forced = previous

    # ------------------------------------------------------------------------------------- forward
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.seed is None:
            return h
        forced = self._forced
        if forced is None and self.stage in INCUBATING_STAGES:
            return h  # incubating: the host trains as if the slot were empty
        alpha = self.alpha if forced is None else forced
        if alpha == 0.0:
            return h
        x = h if self.reads_live else h.detach()
        return self._compose(h, x, alpha)

    def _compose(self, h: torch.Tensor, x: torch.Tensor, alpha: float) -> torch.Tensor:
        d = self.seed(x)
        g = self.gate(x) if self.gate is not None else None
        return compose(self.style, h, d, alpha, g)

    def extra_repr(self) -> str:
        return (
            f"name={self.name!r}, width={self.width}, blueprint={self.blueprint!r}, "
            f"style={self.style.name}, stage={self.stage.name}, alpha={self.alpha:.3f}"
        )


def attach_seeds(slots: Iterable[SeedSlot], attach_at: str) -> None:
    """Every slot's seeds read the host's live activation from stage ``attach_at`` on
    (``lifecycle.attach_at``: :data:`DETACHED_BY_ATTACH`); what a host's slots hold now and later."""
    if attach_at not in DETACHED_BY_ATTACH:
        known = tuple(DETACHED_BY_ATTACH)
        raise ValueError(f"attach_seeds: attach_at must be one of {known}, got {attach_at!r}")
    for slot in slots:
        slot.detached_stages = DETACHED_BY_ATTACH[attach_at]


__all__ = [
    "BLEND",
    "BLEND_KINDS",
    "DETACHED_BY_ATTACH",
    "DETACHED_INPUT_STAGES",
    "INCUBATING_STAGES",
    "Gate",
    "SeedSlot",
    "attach_seeds",
    "blend",
    "compose",
]
