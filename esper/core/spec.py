"""The vocabulary every other module speaks: lifecycle stages, the factored action space, the
head-relevance table, and the TensorDict key names.

Nothing here computes on tensors except :func:`relevance_table`, which turns the one relevance table
into a tensor. Everything that needs to know "which heads matter for this op" goes through
:mod:`esper.core.masks`, which reads this table (finding P1: one owner).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from types import MappingProxyType

import torch

NestedKey = str | tuple[str, ...]


# --------------------------------------------------------------------------------------------- stages
class Stage(IntEnum):
    """Lifecycle stage of one seed slot. Values are stored in int64 tensors."""

    DORMANT = 0  # empty slot, a seed may be germinated here
    GERMINATED = 1  # seed built, not yet trained (G1 moves it to TRAINING at the next epoch end)
    TRAINING = 2  # trained on the host's residual, isolated: alpha is 0, host output unchanged
    BLENDING = 3  # alpha ramps towards its target along the chosen curve
    HOLDING = 4  # blended in, on probation: FOSSILIZE keeps it, a timeout prunes it
    FOSSILIZED = 5  # permanent part of the host (terminal)
    PRUNED = 6  # alpha ramps down to 0, then the seed is removed
    EMBARGOED = 7  # slot cooling down after a prune; becomes DORMANT again


N_STAGES = len(Stage)
#: Stages whose seed module exists (it takes part in the forward pass unless alpha is 0).
LIVE_STAGES = (
    Stage.GERMINATED,
    Stage.TRAINING,
    Stage.BLENDING,
    Stage.HOLDING,
    Stage.FOSSILIZED,
    Stage.PRUNED,
)


# ---------------------------------------------------------------------------------------------- heads
class Op(IntEnum):
    WAIT = 0
    GERMINATE = 1
    SET_ALPHA_TARGET = 2
    PRUNE = 3
    FOSSILIZE = 4
    ADVANCE = 5


class Style(IntEnum):
    """How a seed's output is composed with the host activation, and the curve of its blend-in."""

    LINEAR_ADD = 0  # h + alpha * delta, alpha ramps linearly
    LINEAR_MULTIPLY = 1  # h * (1 + alpha * tanh(delta)), alpha ramps linearly
    SIGMOID_ADD = 2  # h + alpha * delta, alpha ramps along a sigmoid
    GATED_GATE = 3  # h + alpha * gate(h) * delta, gate is a small trained module


class Tempo(IntEnum):
    FAST = 0
    STANDARD = 1
    SLOW = 2


class AlphaSpeed(IntEnum):
    INSTANT = 0
    FAST = 1
    MEDIUM = 2
    SLOW = 3


class AlphaCurve(IntEnum):
    LINEAR = 0
    COSINE = 1
    SIGMOID_GENTLE = 2
    SIGMOID = 3
    SIGMOID_SHARP = 4


#: Blend-in length (epochs) for each Tempo.
TEMPO_EPOCHS: tuple[int, ...] = (3, 5, 8)
#: Alpha value for each choice of the alpha_target head.
ALPHA_TARGETS: tuple[float, ...] = (0.5, 0.7, 1.0)
#: The fixed blend ``{head: choice}`` of the growth schedules (:class:`esper.shell.baselines.simple.
#: GrowAllController`): add the seed's output linearly, over TEMPO FAST's 3 epochs, up to alpha 1.
#: ``ppo.blend_bias`` starts the policy's blend heads on it.
DEFAULT_BLEND: Mapping[str, int] = MappingProxyType(
    {"style": int(Style.LINEAR_ADD), "tempo": int(Tempo.FAST), "alpha_target": ALPHA_TARGETS.index(1.0)}
)
#: The name of each choice of the heads whose choices do not depend on the host (slot and blueprint
#: choices are the host's), in head order: what plots and the anomaly detector's notes print.
CHOICE_NAMES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "op": tuple(o.name for o in Op),
        "style": tuple(s.name for s in Style),
        "tempo": tuple(t.name for t in Tempo),
        "alpha_target": tuple(f"alpha {a:g}" for a in ALPHA_TARGETS),
        "alpha_speed": tuple(a.name for a in AlphaSpeed),
        "alpha_curve": tuple(c.name for c in AlphaCurve),
    }
)
#: Ramp length (epochs) for each AlphaSpeed; 0 means the new alpha applies at once.
ALPHA_SPEED_STEPS: tuple[int, ...] = (0, 3, 5, 8)
#: Steepness of each AlphaCurve (0 for the two non-sigmoid curves).
ALPHA_CURVE_STEEPNESS: tuple[float, ...] = (0.0, 0.0, 6.0, 12.0, 24.0)
#: Curve used for a seed's blend-in, by Style.
STYLE_BLEND_CURVE: tuple[int, ...] = (
    AlphaCurve.LINEAR,
    AlphaCurve.LINEAR,
    AlphaCurve.SIGMOID,
    AlphaCurve.LINEAR,
)

#: The eight heads, in sampling order. ``op`` is sampled first; the slot mask is conditioned on it.
HEADS: tuple[str, ...] = (
    "op",
    "slot",
    "blueprint",
    "style",
    "tempo",
    "alpha_target",
    "alpha_speed",
    "alpha_curve",
)
HEAD_INDEX = MappingProxyType({h: i for i, h in enumerate(HEADS)})

#: Head relevance (the "causal masks"): for each op, the heads besides ``op`` whose sample changes
#: what the action does. This is the only place this table is written down (finding P1).
#: Unlike the reference, SET_ALPHA_TARGET does not read ``style``: the style is fixed at germination.
#: A re-style swaps the composition rule of a seed the host already depends on in one step (measured:
#: a host at 72.8 % validation fell to 14.5 % test when its last action re-styled a blended seed), so
#: :func:`esper.core.lifecycle.lifecycle_step` ignores the head there and the loss does not credit it.
RELEVANCE = MappingProxyType(
    {
        Op.WAIT: frozenset(),
        Op.GERMINATE: frozenset({"slot", "blueprint", "style", "tempo", "alpha_target"}),
        Op.SET_ALPHA_TARGET: frozenset({"slot", "alpha_target", "alpha_speed", "alpha_curve"}),
        Op.PRUNE: frozenset({"slot", "alpha_speed", "alpha_curve"}),
        Op.FOSSILIZE: frozenset({"slot"}),
        Op.ADVANCE: frozenset({"slot"}),
    }
)


def relevance_table(device: torch.device | str | None = None) -> torch.Tensor:
    """``[N_OPS, len(HEADS)]`` bool: entry ``[o, h]`` says whether head ``h`` matters when op ``o`` is
    sampled. The op head always matters."""
    return torch.tensor(_RELEVANCE_ROWS, dtype=torch.bool, device=device)


# Plain nested tuples (a compile-time constant for dynamo), derived from RELEVANCE once.
_RELEVANCE_ROWS = tuple(tuple(h == "op" or h in RELEVANCE[op] for h in HEADS) for op in Op)


@dataclass(frozen=True, slots=True)
class ActionSpec:
    """Sizes of the factored action space for one host.

    The slot and blueprint heads depend on the host (its injection slots, its blueprint family);
    the other heads are fixed by this module's enums. ``masked_blueprints``: blueprint indices the
    blueprint head never offers (the shell lists the family's ``noop`` there, as the reference does:
    germinating nothing is WAIT by another name, and a policy that must stay uncertain about its op
    can hide in germinate-noop / prune loops that change nothing).
    """

    n_slots: int
    n_blueprints: int
    masked_blueprints: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.n_slots < 1:
            raise ValueError(f"ActionSpec.n_slots must be >= 1, got {self.n_slots}")
        if self.n_blueprints < 1:
            raise ValueError(f"ActionSpec.n_blueprints must be >= 1, got {self.n_blueprints}")
        bad = [i for i in self.masked_blueprints if not 0 <= i < self.n_blueprints]
        if bad:
            raise ValueError(f"ActionSpec.masked_blueprints {bad} outside 0..{self.n_blueprints - 1}")
        if len(set(self.masked_blueprints)) >= self.n_blueprints:
            raise ValueError(
                "ActionSpec.masked_blueprints masks every blueprint: GERMINATE could not be sampled"
            )

    @property
    def heads(self) -> tuple[str, ...]:
        return HEADS

    @property
    def sizes(self) -> dict[str, int]:
        return {
            "op": len(Op),
            "slot": self.n_slots,
            "blueprint": self.n_blueprints,
            "style": len(Style),
            "tempo": len(Tempo),
            "alpha_target": len(ALPHA_TARGETS),
            "alpha_speed": len(AlphaSpeed),
            "alpha_curve": len(AlphaCurve),
        }


# ----------------------------------------------------------------------------------------- slot state
#: The tensorized state of every slot of every env, a TensorDict with batch size ``[*E, S]``.
#: Written only by :mod:`esper.core.lifecycle`; read by masks, observation and rewards.
#: name -> (dtype, meaning)
SLOT_FIELDS = MappingProxyType(
    {
        "enabled": (torch.bool, "slot may hold a seed (config)"),
        "stage": (torch.int64, "Stage value"),
        "epochs_in_stage": (torch.int64, "epochs since the current stage began"),
        "age": (torch.int64, "epochs since germination (0 when empty)"),
        "prev_stage": (torch.int64, "stage before the last step (for potential-based shaping)"),
        "prev_epochs_in_stage": (torch.int64, "epochs_in_stage before the last step"),
        "blueprint": (torch.int64, "blueprint index in the host family's list"),
        "style": (torch.int64, "Style value"),
        "tempo": (torch.int64, "Tempo value (blend-in length)"),
        "alpha": (torch.float32, "current blend weight in [0, 1]"),
        "alpha_target": (torch.float32, "alpha the seed is blended towards"),
        "ramp_from": (torch.float32, "alpha at the start of the current ramp"),
        "ramp_to": (torch.float32, "alpha at the end of the current ramp"),
        "ramp_len": (torch.int64, "length of the current ramp in epochs (0: none)"),
        "ramp_pos": (torch.int64, "epochs done in the current ramp; ramping while ramp_pos < ramp_len"),
        "curve": (torch.int64, "AlphaCurve of the current ramp"),
        "contribution": (torch.float32, "counterfactual accuracy delta, percentage points"),
        "loss_contribution": (
            torch.float32,
            "counterfactual validation-loss delta: the loss with the seed at alpha 0 minus the loss as "
            "blended (positive: the seed lowers the loss)",
        ),
        "acc_at_germination": (torch.float32, "host val accuracy (%) when the seed germinated"),
        "acc_at_stage_start": (torch.float32, "host val accuracy (%) when the stage began"),
        "grad_ratio": (torch.float32, "EMA of the parameter-normalized seed/host gradient ratio"),
        "whatif_gain": (
            torch.float32,
            "val-acc gain (points) an incubating seed would bring blended in at alpha 1 (0 where unmeasured)",
        ),
        "seed_params": (torch.float32, "parameter count of the seed"),
        "embargo": (torch.int64, "epochs of embargo left (EMBARGOED slots)"),
    }
)


# ----------------------------------------------------------------------------------------------- keys
@dataclass(frozen=True, slots=True)
class Keys:
    """TensorDict key names, TorchRL's by default. Override any field to read other names:
    ``Keys(state_value="value")``. Per-head entries live under the head's name:
    ``(head, keys.action)``, ``(head, keys.log_prob)``, ``(head, keys.action_mask)``; the current
    policy's logits under ``(keys.current, head, keys.logits)``.
    """

    #: What the policy saw (already normalized, finding S2).
    observation: NestedKey = "observation"
    #: Sampled action index (int64), per head in multi-head mode.
    action: NestedKey = "action"
    #: Log-probability of ``action`` under the behaviour policy (at collection time).
    log_prob: NestedKey = "action_log_prob"
    #: Legacy TorchRL name of the same, read when ``log_prob`` is absent.
    legacy_log_prob: NestedKey = "sample_log_prob"
    #: Bool legality mask over choices, ``[..., n]``; absent means every choice was legal.
    action_mask: NestedKey = "action_mask"
    #: Unnormalized scores over choices.
    logits: NestedKey = "logits"
    #: V(s_t) as estimated when the data was collected (or recomputed at update start, see C4);
    #: the anchor of value clipping.
    state_value: NestedKey = "state_value"
    #: Sub-TensorDict holding the current policy's forward on the batch (with grad):
    #: ``(current, logits)`` / ``(current, head, logits)`` and ``(current, state_value)``.
    current: str = "current"
    reward: NestedKey = ("next", "reward")
    done: NestedKey = ("next", "done")
    terminated: NestedKey = ("next", "terminated")
    truncated: NestedKey = ("next", "truncated")
    #: V(s_{t+1}); on a truncated step, the value of the final observation (post-action masks, H4).
    next_state_value: NestedKey = ("next", "state_value")
    #: Q(s_t, a_t) of the stored action, ``[*B]`` or ``[*B, K]`` for K critics (offline IQL).
    state_action_value: NestedKey = "state_action_value"
    #: Sub-TensorDict holding target networks' forward (no grad): ``(target, state_action_value)``.
    target: str = "target"
    advantage: NestedKey = "advantage"
    value_target: NestedKey = "value_target"
    #: True on the first step of an episode (recurrent state reset).
    is_init: NestedKey = "is_init"
    #: Optional bool ``[*B, T]``: False marks padding steps that every mean skips.
    valid: NestedKey = ("collector", "mask")
    #: Recurrent state at the first step of each stored sequence.
    hidden: NestedKey = ("recurrent_state", "h")
    cell: NestedKey = ("recurrent_state", "c")

    def head(self, head: str, key: NestedKey) -> tuple[str, ...]:
        """``(head, *key)``: the per-head location of ``key``."""
        return (head, *_as_tuple(key))

    def current_key(self, key: NestedKey, head: str | None = None) -> tuple[str, ...]:
        """Where the current forward's ``key`` lives, for ``head`` (multi-head) or flat."""
        prefix = (self.current,) if head is None else (self.current, head)
        return (*prefix, *_as_tuple(key))

    def target_key(self, key: NestedKey) -> tuple[str, ...]:
        """Where the target networks' ``key`` lives."""
        return (self.target, *_as_tuple(key))


def _as_tuple(key: NestedKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


KEYS = Keys()

__all__ = [
    "ALPHA_CURVE_STEEPNESS",
    "ALPHA_SPEED_STEPS",
    "ALPHA_TARGETS",
    "CHOICE_NAMES",
    "DEFAULT_BLEND",
    "HEADS",
    "HEAD_INDEX",
    "KEYS",
    "LIVE_STAGES",
    "N_STAGES",
    "RELEVANCE",
    "SLOT_FIELDS",
    "STYLE_BLEND_CURVE",
    "TEMPO_EPOCHS",
    "ActionSpec",
    "AlphaCurve",
    "AlphaSpeed",
    "Keys",
    "NestedKey",
    "Op",
    "Stage",
    "Style",
    "Tempo",
    "relevance_table",
]
