"""The seed lifecycle as a tensorized state machine: every slot of every env advances in one call.

Slot state is a TensorDict ``[*E, S]`` with the fields of :data:`esper.core.spec.SLOT_FIELDS`. Per RL
step the shell calls :func:`record_signals` (measurements: contribution, parameter count, gradient-
ratio EMA), then, once the policy acted, :func:`lifecycle_step` (the decision and the mechanical
end-of-epoch advance). Both are pure, vectorized with ``torch.where``, and compile with
``fullgraph=True``.

Transitions of :func:`lifecycle_step`, in order. The sampled ``(op, slot)`` pair is first checked
against :func:`esper.core.masks.op_slot_legality`; an illegal pair changes nothing and raises the
``illegal`` event on the chosen slot. Gates read the pre-step state and this epoch's signals.

- **GERMINATE** (DORMANT, enabled, room for a seed): G0 = the blueprint index is in
  ``[0, n_blueprints)``. Pass: GERMINATED; blueprint, style, tempo and ``ALPHA_TARGETS[alpha_target]``
  stored; ``acc_at_germination`` = this epoch's val_acc; age 0. Fail: ``germinate_failed``. Without
  ``incubate`` the pass is BLENDING instead, its blend-in ramp started as ADVANCE's would be.
- **ADVANCE** on TRAINING: G2 = ``epochs_in_stage >= g2_min_epochs``, a gain ``>= g2_min_gain`` and
  gradient-ratio EMA ``>= g2_min_grad_ratio``. The gain (``g2_evidence``) is the host's val_acc gain
  since the stage began (``host``, the reference's), the seed's own what-if gain, ``whatif_gain``
  (``what_if``: what blending it in at alpha 1 would add to val_acc now), or the larger (``either``).
  Pass: BLENDING, with a
  blend-in ramp from 0 to ``alpha_target`` over ``TEMPO_EPOCHS[tempo]`` epochs along
  ``STYLE_BLEND_CURVE[style]``. ADVANCE on BLENDING: G3 = ``epochs_in_stage >= g3_min_epochs`` and the
  ramp finished. Pass: HOLDING. A failed gate changes nothing (``advance_failed``). There is no
  automatic TRAINING->BLENDING or BLENDING->HOLDING: the policy advances, the gates decide — unless
  ``auto_advance`` is set: then ADVANCE is illegal and every slot the op did not act on advances
  wherever its gate passes (the reviewed reference's mechanical transitions).
- **SET_ALPHA_TARGET** (BLENDING or HOLDING, not ramping): a new ramp from the current alpha to
  ``ALPHA_TARGETS[alpha_target]`` over ``ALPHA_SPEED_STEPS[alpha_speed]`` epochs along ``alpha_curve``
  (``alpha_set``). The composition style stays the one chosen at germination (the reference re-styles
  here; see :data:`esper.core.spec.RELEVANCE` for why Esper does not).
- **PRUNE** (GERMINATED..HOLDING, ``age >= min_prune_age``, not ramping): PRUNED, alpha ramps to 0 over
  ``ALPHA_SPEED_STEPS[alpha_speed]`` epochs along ``alpha_curve`` (``prune_started``). INSTANT, or an
  alpha already 0, removes the seed at this step's end.
- **FOSSILIZE** (HOLDING, not ramping): G5 = alpha > 0 (a counterfactual was measured) and
  ``contribution >= g5_min_contribution``. Pass: FOSSILIZED (terminal: never pruned, never changed).
  Fail: ``fossilize_failed``.
- **WAIT**: nothing.

Then the mechanical end-of-epoch advance of every slot:

1. GERMINATED (not germinated this step) -> TRAINING (G1).
2. A HOLDING seed whose ``epochs_in_stage`` would reach ``holding_timeout`` is pruned
   (``timeout_pruned``): removed at this step's end, or with ``timeout_ramp`` PRUNED, alpha ramping
   out to 0 over its tempo's ``TEMPO_EPOCHS`` along its style's blend curve, as it ramped in (at once
   where alpha is already 0); the policy saw it in HOLDING ``holding_timeout`` times. No auto-fossilize —
   unless ``timeout_fossilizes`` is set: then a seed that pays (G5 but for the ramp: alpha > 0 and
   ``contribution >= g5_min_contribution``) is fossilized instead (``timeout_fossilized``), at the
   alpha it has: a ramp in flight (a SET_ALPHA_TARGET in HOLDING) stops there. Only the others are
   pruned. What "pays" reads there is ``keep_by``: the accuracy (``accuracy``, the default), the
   validation loss (``loss``: alpha > 0 and ``loss_contribution``, the loss at alpha 0 minus the loss
   as blended, at least ``g5_min_loss_drop`` of the loss without the seed), or either (``either``).
   Only the deadline reads ``keep_by``: FOSSILIZE's G5 and the prune gate read the accuracy.
3. Every active ramp moves one epoch (also a ramp started this step, so a ramp of length L reaches
   its end after L steps and INSTANT applies at once); alpha = :func:`alpha_at` of the ramp fields.
4. A PRUNED seed whose ramp ended (alpha 0) is removed (``removed``): EMBARGOED for
   ``embargo_epochs`` epochs (DORMANT at once if 0), every seed field cleared.
5. An EMBARGOED slot (embargoed before this step) counts its embargo down; at 0 it is DORMANT.
6. ``epochs_in_stage`` is 0 on a stage change (``acc_at_stage_start`` = val_acc), else += 1;
   ``age`` += 1 for live seeds (0 on the germination step); ``prev_stage``/``prev_epochs_in_stage`` hold
   the pre-step values (potential-based shaping reads both ends from the post-step state).

So ``epochs_in_stage`` and ``age`` count lifecycle steps since the stage began / the seed germinated:
the first observation in a new stage sees 0 (the seed has then trained one epoch in it). The fastest
path with the defaults (tempo FAST) is germinate at step g, TRAINING at g+1, ADVANCE at g+5, HOLDING
at g+9, FOSSILIZE at g+10 (reference: "~10 epochs").

Non-live slots (DORMANT, EMBARGOED) always have every seed field at 0. Head indices other than the
blueprint are clamped into their (fixed) range before table lookups; the policy never samples
outside it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from esper.core.masks import op_slot_legality, seed_lowers_loss, seed_pays
from esper.core.spec import (
    ALPHA_CURVE_STEEPNESS,
    ALPHA_SPEED_STEPS,
    ALPHA_TARGETS,
    LIVE_STAGES,
    SLOT_FIELDS,
    STYLE_BLEND_CURVE,
    TEMPO_EPOCHS,
    AlphaCurve,
    Op,
    Stage,
    Style,
)

#: Slot fields that describe the seed; all 0 on a slot without a seed (DORMANT, EMBARGOED).
SEED_FIELDS: tuple[str, ...] = (
    "age",
    "blueprint",
    "style",
    "tempo",
    "alpha",
    "alpha_target",
    "ramp_from",
    "ramp_to",
    "ramp_len",
    "ramp_pos",
    "curve",
    "contribution",
    "loss_contribution",
    "acc_at_germination",
    "acc_at_stage_start",
    "grad_ratio",
    "whatif_gain",
    "seed_params",
)

#: What G2's gain reads (``LifecycleConfig.g2_evidence``).
G2_EVIDENCE = ("host", "what_if", "either")
#: The batch-norm statistics the what-if reading normalizes with (``LifecycleConfig.whatif_statistics``).
WHATIF_STATISTICS = ("running", "batch")
#: The stage from which a seed reads the host's live activation (``LifecycleConfig.attach_at``).
ATTACH_AT = ("fossilized", "blending")
#: What a seed must pay in to be kept at the HOLDING deadline (``LifecycleConfig.keep_by``).
KEEP_BY = ("accuracy", "loss", "either")

#: Bool ``[*E, S]`` entries of the events TensorDict returned by :func:`lifecycle_step`.
EVENT_KINDS: tuple[str, ...] = (
    "germinated",
    "germinate_failed",
    "advanced",
    "advance_failed",
    "fossilized",
    "fossilize_failed",
    "prune_started",
    "removed",
    "timeout_pruned",
    "timeout_fossilized",
    "alpha_set",
    "illegal",
)

#: Physical range of an accuracy in percent; signals are clamped into it (finite outputs for any input).
ACC_RANGE = (0.0, 100.0)
#: A loss difference (``loss_contribution``) is clamped to +- this, as the rewards clamp a loss to [0, 1e4].
LOSS_DELTA_MAX = 1e4


def config_field(default: Any, text: str) -> Any:
    """A config dataclass field with a default and a one-line doc (the CLI's help reads it)."""
    return dataclasses.field(default=default, metadata={"doc": text})


@dataclass(frozen=True, slots=True)
class LifecycleConfig:
    """Gates, timers and limits of the seed lifecycle (defaults: the reference's)."""

    max_epochs: int = config_field(25, "host epochs per episode (one RL step each)")
    terminal_at_limit: bool = config_field(
        False,
        "the episode's last epoch is terminal (the final host is what the task delivers; nothing follows "
        "it, so GAE does not bootstrap there) instead of truncated by the time limit (bootstrapping from "
        "V of the post-action observation, H4)",
    )
    g2_min_epochs: int = config_field(3, "G2: epochs in TRAINING before ADVANCE can pass")
    g2_min_gain: float = config_field(0.5, "G2: val-acc gain (points) since TRAINING began")
    g2_min_grad_ratio: float = config_field(0.05, "G2: minimum seed/host gradient-ratio EMA")
    g2_evidence: str = config_field(
        "host",
        "what G2's gain reads: host = the host's val-acc gain since TRAINING began (the reference's; the "
        "seed is not in that forward, so on a host that cannot learn the task alone only noise passes it), "
        "what_if = the val-acc gain the seed would bring blended in at alpha 1 now (one more validation "
        "pass per incubating seed and epoch; how it normalizes: whatif_statistics), either = whichever of "
        "the two is larger",
    )
    whatif_statistics: str = config_field(
        "running",
        "the batch-norm statistics of G2's what-if reading: running = the host's running statistics, which "
        "never saw the incubating seed, so a seed before a batch norm is mis-normalized and under-read; "
        "batch = each validation batch's own statistics, for the host and the what-if pass alike (one more "
        "host pass per env with an incubating seed; running statistics untouched)",
    )
    attach_at: str = config_field(
        "fossilized",
        "the stage from which a seed reads the host's live activation, so the layers before its slot train "
        "through it: fossilized = the reference's isolation (every earlier stage reads it detached); "
        "blending = from BLENDING on (detached only while it incubates, and once pruned)",
    )
    incubate: bool = config_field(
        True,
        "a germinated seed incubates (GERMINATED, TRAINING: trained in the what-if pass on the host's "
        "residual "
        "until G2 passes) before it blends; false = no incubation: GERMINATE puts the seed straight into "
        "BLENDING, its blend-in ramp starting at once (alpha 0 at germination, its projection near zero, so "
        "the host's function is kept), with attach_at blending the host trains through it from then on",
    )
    instant_blend: bool = config_field(
        False,
        "the blend-in takes no epoch: alpha is at its target from the step a seed enters BLENDING (with "
        "incubate false, from its germination; the blueprints' near-zero projection keeps the host's "
        "function there, so the ramp protects nothing); off: the tempo's ramp",
    )
    g3_min_epochs: int = config_field(3, "G3: epochs in BLENDING (and the ramp finished) before ADVANCE")
    g5_min_contribution: float = config_field(1.0, "G5: counterfactual contribution (points) to fossilize")
    holding_timeout: int = config_field(5, "HOLDING epochs after which the seed is pruned automatically")
    timeout_fossilizes: bool = config_field(
        False,
        "at the HOLDING timeout, fossilize a seed that pays (alpha > 0, contribution >= g5_min_contribution; "
        "a ramp in flight stops where it is) and prune only the others",
    )
    keep_by: str = config_field(
        "accuracy",
        "what a seed must pay in to be kept at the HOLDING deadline (with timeout_fossilizes): accuracy = "
        "its contribution >= g5_min_contribution points; loss = it lowers the validation loss by at least "
        "g5_min_loss_drop of the loss without it (loss_contribution, the counterfactual's loss at alpha 0 "
        "minus the loss as blended); either = one or the other. FOSSILIZE's G5 and the prune gate read the "
        "accuracy whatever this is (issue 104; docs/controller.md)",
    )
    g5_min_loss_drop: float = config_field(
        0.05,
        "keep_by loss/either: the share of the validation loss without the seed that it must remove, "
        "(loss at alpha 0 - loss blended) / loss at alpha 0 (0.05: the seed lowers the loss by 5 %)",
    )
    timeout_ramp: bool = config_field(
        False,
        "a seed pruned at its HOLDING deadline ramps out to alpha 0 over its tempo's epochs along its "
        "style's blend curve, as a PRUNE does, so the host re-adapts while it leaves (issue 104); off: "
        "removed in one step (the reference's), until the default is measured with it on",
    )
    embargo_epochs: int = config_field(5, "epochs a slot stays EMBARGOED after its seed was removed")
    min_prune_age: int = config_field(1, "minimum seed age (steps since germination) for PRUNE")
    max_seeds: int = config_field(0, "maximum live seeds per env (0: unlimited)")
    auto_advance: bool = config_field(
        False, "the lifecycle itself blends a seed when G2 passes and holds it when G3 passes (no ADVANCE op)"
    )
    gate_masks: bool = config_field(
        True, "offer ADVANCE / FOSSILIZE only where their gate would pass (a failing one does nothing)"
    )
    mask_same_alpha: bool = config_field(
        False,
        "offer SET_ALPHA_TARGET only targets other than the alpha the seed holds (a ramp to the same alpha "
        "changes nothing, and FOSSILIZE and PRUNE wait while it runs); off until a rule judges it",
    )
    prune_gate: bool = config_field(
        False, "PRUNE only seeds that do not pay: a blended seed contributing >= g5_min_contribution is kept"
    )
    grad_ratio_momentum: float = config_field(0.9, "EMA momentum of the gradient ratio")
    grad_ratio_cap: float = config_field(10.0, "cap on the per-epoch gradient ratio before the EMA")
    seed_grad_features: bool = config_field(
        False,
        "the observation also shows each seed's gradient health (4 features per slot: its gradient norm, a "
        "health score, the shares of its parameter tensors whose gradient vanished or exploded); off until "
        "the growth bench on fresh seeds shows it costs nothing (docs/experiment-log.md)",
    )
    grad_init: bool = config_field(
        False,
        "gradient-informed seeds: the last grad_init_batches training batches of every epoch keep each "
        "slot's input and output gradient, and a germinated seed's projection (its last layer) starts along "
        "the top singular directions of their cross-covariance (GradMax style), at its usual small size, "
        "instead of its default direction (esper.shell.host.gradinit; docs/controller.md: what it did)",
    )
    grad_init_batches: int = config_field(
        4, "training batches (the epoch's last) whose slot statistics grad_init and grad_gain_features read"
    )
    grad_init_scale: float = config_field(
        0.1,
        "grad_init: the projection's norm over that of its layer's default init (the blueprints shrink that "
        "by 0.01: 0.01 changes the direction alone, 0.1 is ten times the usual near-zero start)",
    )
    grad_gain_features: bool = config_field(
        False,
        "the observation also shows each slot's predicted first-order loss decrease from growing there (2 "
        "features per slot, from the slot statistics of grad_init, measured with this on too): its size on a "
        "log scale and its share of the env's largest",
    )

    @property
    def grad_stats(self) -> bool:
        """Whether the hosts keep the slot statistics (``grad_init`` or ``grad_gain_features``)."""
        return self.grad_init or self.grad_gain_features

    @property
    def prune_floor(self) -> float | None:
        """The ``prune_below`` of :func:`esper.core.masks.op_slot_legality` (None: any seed prunable)."""
        return self.g5_min_contribution if self.prune_gate else None

    def __post_init__(self) -> None:
        where = "LifecycleConfig"
        ints = {
            "max_epochs": 1,
            "g2_min_epochs": 0,
            "g3_min_epochs": 0,
            "holding_timeout": 1,
            "embargo_epochs": 0,
            "min_prune_age": 0,
            "max_seeds": 0,
            "grad_init_batches": 1,
        }
        for name, low in ints.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{where}.{name} must be an integer >= {low}, got {v!r}")
        if not (math.isfinite(self.grad_init_scale) and self.grad_init_scale > 0):
            raise ValueError(f"{where}.grad_init_scale must be finite and > 0, got {self.grad_init_scale}")
        for name in ("g2_min_gain", "g2_min_grad_ratio", "g5_min_contribution", "grad_ratio_cap"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{where}.{name} must be finite, got {getattr(self, name)}")
        if self.g2_evidence not in G2_EVIDENCE:
            raise ValueError(f"{where}.g2_evidence must be one of {G2_EVIDENCE}, got {self.g2_evidence!r}")
        if self.attach_at not in ATTACH_AT:
            raise ValueError(f"{where}.attach_at must be one of {ATTACH_AT}, got {self.attach_at!r}")
        if self.keep_by not in KEEP_BY:
            raise ValueError(f"{where}.keep_by must be one of {KEEP_BY}, got {self.keep_by!r}")
        if not 0.0 <= self.g5_min_loss_drop < 1.0:
            raise ValueError(f"{where}.g5_min_loss_drop must be in [0, 1), got {self.g5_min_loss_drop}")
        if self.whatif_statistics not in WHATIF_STATISTICS:
            got = self.whatif_statistics
            raise ValueError(f"{where}.whatif_statistics must be one of {WHATIF_STATISTICS}, got {got!r}")
        if not 0.0 <= self.grad_ratio_momentum < 1.0:
            raise ValueError(f"{where}.grad_ratio_momentum must be in [0, 1), got {self.grad_ratio_momentum}")
        if not self.grad_ratio_cap > 0:
            raise ValueError(f"{where}.grad_ratio_cap must be > 0, got {self.grad_ratio_cap}")


# ------------------------------------------------------------------------------------------- helpers
def stage_in(stage: torch.Tensor, stages: Sequence[int]) -> torch.Tensor:
    """Bool mask: ``stage`` is one of ``stages``."""
    out = torch.zeros_like(stage, dtype=torch.bool)
    for s in stages:
        out = out | (stage == int(s))
    return out


def is_live(stage: torch.Tensor) -> torch.Tensor:
    """Bool mask of slots holding a seed module (:data:`LIVE_STAGES`)."""
    return stage_in(stage, LIVE_STAGES)


def clean_acc(x: torch.Tensor) -> torch.Tensor:
    """An accuracy in percent, NaN-free and clamped to [0, 100]."""
    return torch.nan_to_num(x.float(), nan=0.0).clamp(*ACC_RANGE)


def clean_contribution(x: torch.Tensor) -> torch.Tensor:
    """A contribution in percentage points, NaN-free and clamped to [-100, 100]."""
    return torch.nan_to_num(x.float(), nan=0.0).clamp(-ACC_RANGE[1], ACC_RANGE[1])


def _lookup(table: Sequence[float], index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``table[index]`` with ``index`` clamped into range."""
    t = torch.tensor(tuple(table), dtype=dtype, device=index.device)
    return t[index.clamp(0, len(table) - 1)]


def _check_batch(slots: TensorDictBase, signals: TensorDictBase, where: str) -> None:
    if slots.batch_dims < 1 or tuple(slots.batch_size[:-1]) != tuple(signals.batch_size):
        raise ValueError(
            f"{where}: slots must have batch size [*E, S] and signals [*E]; got {list(slots.batch_size)} "
            f"and {list(signals.batch_size)}"
        )


def _build(like: TensorDictBase, fields: dict[str, torch.Tensor]) -> TensorDict:
    """A TensorDict with ``like``'s batch size holding ``fields`` and every other key of ``like``."""
    out = {k: fields[k] if k in fields else like[k] for k in like.keys()}
    out.update({k: v for k, v in fields.items() if k not in out})
    return TensorDict(out, batch_size=like.batch_size)


# ------------------------------------------------------------------------------------------- state
def init_slots(
    n_envs: int, enabled: Sequence[bool] | torch.Tensor, *, device: torch.device | str | None = None
) -> TensorDict:
    """Empty slot state ``[n_envs, S]``: every field of :data:`SLOT_FIELDS` (its dtype), all DORMANT.
    ``enabled``: bool per slot (length S), or ``[n_envs, S]``."""
    en = torch.as_tensor(enabled, dtype=torch.bool, device=device)
    if n_envs < 1 or en.dim() not in (1, 2) or en.shape[-1] < 1:
        raise ValueError(
            f"init_slots: need n_envs >= 1 and `enabled` of length S >= 1, got {n_envs}, {list(en.shape)}"
        )
    if en.dim() == 2 and en.shape[0] != n_envs:
        raise ValueError(f"init_slots: enabled has {en.shape[0]} rows for {n_envs} envs")
    shape = (n_envs, en.shape[-1])
    td = {k: torch.zeros(shape, dtype=dt, device=en.device) for k, (dt, _) in SLOT_FIELDS.items()}
    td["enabled"] = en.expand(shape).clone()
    td["stage"] = torch.full(shape, int(Stage.DORMANT), dtype=torch.int64, device=en.device)
    td["prev_stage"] = td["stage"].clone()
    return TensorDict(td, batch_size=shape, device=device)


def clear_seeds(slots: TensorDict, env_mask: torch.Tensor) -> TensorDict:
    """Slot state after a governor rollback of the envs where ``env_mask [*E]`` is True: every live seed
    that is not FOSSILIZED is gone (the shell removed its module), its slot DORMANT with no embargo.
    No event is raised. Potential-based shaping does not charge this jump (the rollback has its own
    penalty)."""
    stage = slots["stage"]
    drop = env_mask.unsqueeze(-1) & is_live(stage) & (stage != int(Stage.FOSSILIZED))
    fields = {k: torch.where(drop, torch.zeros_like(slots[k]), slots[k]) for k in SEED_FIELDS}
    fields["stage"] = torch.where(drop, int(Stage.DORMANT), stage)
    fields["epochs_in_stage"] = torch.where(drop, 0, slots["epochs_in_stage"])
    return _build(slots, fields)


# ------------------------------------------------------------------------------------------- alpha
#: (curve value, steepness) of the logistic curves, as plain ints/floats (compile-time constants).
_SIGMOID_CURVES = tuple(
    (int(c), float(ALPHA_CURVE_STEEPNESS[int(c)]))
    for c in (AlphaCurve.SIGMOID_GENTLE, AlphaCurve.SIGMOID, AlphaCurve.SIGMOID_SHARP)
)


def alpha_at(
    curve: torch.Tensor, pos: torch.Tensor, length: torch.Tensor, start: torch.Tensor, end: torch.Tensor
) -> torch.Tensor:
    """Alpha at step ``pos`` of a ramp of ``length`` steps from ``start`` to ``end`` along ``curve``
    (an :class:`AlphaCurve`; all arguments broadcast). LINEAR; COSINE = half-cosine ease; SIGMOID_* =
    logistic of steepness :data:`ALPHA_CURVE_STEEPNESS` rescaled to [0, 1]. Position 0 gives exactly
    ``start``, position ``>= length`` exactly ``end``; ``length <= 0`` is instant (``end``)."""
    start, end = torch.as_tensor(start), torch.as_tensor(end)
    dtype = torch.promote_types(torch.promote_types(start.dtype, end.dtype), torch.float32)
    frac = pos.clamp(min=0).to(dtype) / length.clamp(min=1).to(dtype)
    t = torch.where(length > 0, frac.clamp(0.0, 1.0), torch.ones_like(frac))
    s = torch.where(curve == int(AlphaCurve.COSINE), 0.5 - 0.5 * torch.cos(math.pi * t), t)
    for c, k in _SIGMOID_CURVES:
        lo = torch.sigmoid(torch.full_like(t, -0.5 * k))  # same float ops as t = 0 / t = 1
        hi = torch.sigmoid(torch.full_like(t, 0.5 * k))
        s = torch.where(curve == c, (torch.sigmoid(k * (t - 0.5)) - lo) / (hi - lo), s)
    s = torch.where(t >= 1.0, torch.ones_like(s), torch.where(t <= 0.0, torch.zeros_like(s), s.clamp(0, 1)))
    return start.to(dtype) * (1.0 - s) + end.to(dtype) * s


# ------------------------------------------------------------------------------------------- gates
def gate_readiness(slots: TensorDict, val_acc: torch.Tensor, cfg: LifecycleConfig) -> TensorDict:
    """Which gate would pass now, per slot ``[*E, S]`` (bool): ``g2`` (TRAINING, ADVANCE would blend),
    ``g3`` (BLENDING, ADVANCE would hold), ``g5`` (HOLDING, FOSSILIZE would pass: also not ramping).
    ``val_acc [*E]`` is this epoch's validation accuracy (%)."""
    stage = slots["stage"]
    eis = slots["epochs_in_stage"]
    settled = slots["ramp_pos"] >= slots["ramp_len"]
    gain = clean_acc(val_acc).unsqueeze(-1) - slots["acc_at_stage_start"]  # the host's: "host"
    if cfg.g2_evidence == "what_if":
        gain = slots["whatif_gain"]
    elif cfg.g2_evidence == "either":
        gain = torch.maximum(gain, slots["whatif_gain"])
    g2 = (
        (stage == int(Stage.TRAINING))
        & (eis >= cfg.g2_min_epochs)
        & (gain >= cfg.g2_min_gain)
        & (slots["grad_ratio"] >= cfg.g2_min_grad_ratio)
    )
    g3 = (stage == int(Stage.BLENDING)) & (eis >= cfg.g3_min_epochs) & settled
    g5 = (stage == int(Stage.HOLDING)) & settled & seed_pays(slots, cfg.g5_min_contribution)
    return TensorDict({"g2": g2, "g3": g3, "g5": g5}, batch_size=slots.batch_size)


# ------------------------------------------------------------------------------------ measurements
def record_signals(slots: TensorDict, signals: TensorDict, cfg: LifecycleConfig) -> TensorDict:
    """Copy this epoch's measurements into the slot state (no decisions): ``contribution``,
    ``loss_contribution`` (0 where the signals hold none; clamped to ``[-1e4, 1e4]``) and
    ``seed_params`` of live seeds, the gradient-ratio EMA of seeds in GERMINATED, TRAINING or
    BLENDING (the first measurement, made while GERMINATED, starts the EMA; later stages keep it),
    and ``whatif_gain`` of incubating seeds (GERMINATED, TRAINING) where the signals hold one (0 else).
    The raw ratio is clamped to ``[0, grad_ratio_cap]`` before the EMA."""
    _check_batch(slots, signals, "record_signals")
    sig = signals["slots"]
    stage = slots["stage"]
    live = is_live(stage)
    raw = torch.nan_to_num(sig["grad_ratio"].float(), nan=0.0).clamp(0.0, cfg.grad_ratio_cap)
    m = cfg.grad_ratio_momentum
    ema = torch.where(stage == int(Stage.GERMINATED), raw, m * slots["grad_ratio"] + (1.0 - m) * raw)
    measured = stage_in(stage, (Stage.GERMINATED, Stage.TRAINING, Stage.BLENDING))
    grad_ratio = torch.where(measured, ema, slots["grad_ratio"])
    params = torch.nan_to_num(sig["seed_params"].float(), nan=0.0).clamp(min=0.0)
    incubating = stage_in(stage, (Stage.GERMINATED, Stage.TRAINING))
    whatif = sig.get("whatif_gain", None)
    whatif = torch.zeros_like(slots["whatif_gain"]) if whatif is None else clean_contribution(whatif)
    loss_drop = sig.get("loss_contribution", None)
    loss_drop = (
        torch.zeros_like(slots["loss_contribution"])
        if loss_drop is None
        else torch.nan_to_num(loss_drop.float(), nan=0.0).clamp(-LOSS_DELTA_MAX, LOSS_DELTA_MAX)
    )
    return _build(
        slots,
        {
            "whatif_gain": torch.where(incubating, whatif, 0.0),
            "contribution": torch.where(live, clean_contribution(sig["contribution"]), 0.0),
            "loss_contribution": torch.where(live, loss_drop, 0.0),
            "seed_params": torch.where(live, params, 0.0),
            "grad_ratio": torch.where(live, grad_ratio, 0.0),
        },
    )


# -------------------------------------------------------------------------------------------- step
def lifecycle_step(
    slots: TensorDict, action: TensorDict, signals: TensorDict, cfg: LifecycleConfig, *, n_blueprints: int = 0
) -> tuple[TensorDict, TensorDict]:
    """Apply the sampled action, then advance every slot one epoch (module docstring).

    Args:
        slots: state ``[*E, S]`` after :func:`record_signals`.
        action: ``[*E]`` with one int64 entry per head (``op``, ``slot``, ``blueprint``, ``style``,
            ``tempo``, ``alpha_target``, ``alpha_speed``, ``alpha_curve``).
        signals: ``[*E]``, reads ``val_acc`` (%).
        cfg: gates and timers.
        n_blueprints: the host family's blueprint count for G0 (0: only ``blueprint >= 0`` is checked).

    Returns ``(new_slots [*E, S], events [*E, S])``; ``events`` holds a bool per :data:`EVENT_KINDS`.

    The sub-steps, in order: :func:`_decide` (legality, gates: which transition each slot takes),
    :func:`_apply_op` (the op's stage change, the fields it stores, the ramps it starts),
    :func:`_holding_timeout`, :func:`_move_ramps` (ramps, removal, embargo) and :func:`_close_epoch`
    (counters, cleared seed fields, the previous stage).
    """
    _check_batch(slots, signals, "lifecycle_step")
    if n_blueprints < 0:
        raise ValueError(f"lifecycle_step: n_blueprints must be >= 0, got {n_blueprints}")
    f = {k: slots[k] for k in SLOT_FIELDS}
    stage0 = f["stage"]
    heads = {k: action[k].unsqueeze(-1).expand_as(stage0) for k in _STEP_HEADS}  # [*E] -> [*E, S]
    val_acc = clean_acc(signals["val_acc"]).unsqueeze(-1).expand_as(f["alpha"])
    d = _decide(slots, action, heads, signals, cfg, n_blueprints)
    stage, f = _apply_op(f, d, heads, val_acc, incubate=cfg.incubate, instant_blend=cfg.instant_blend)
    stage, f, kept, timeout = _holding_timeout(f, stage, slots, d["germ"], cfg, signals["val_loss"])
    stage, f, removed, embargo = _move_ramps(f, stage, stage0, cfg)
    f = _close_epoch(f, stage, slots, d["germ"], val_acc, embargo)
    events = {
        "germinated": d["germ"],
        "germinate_failed": d["germ_failed"],
        "advanced": d["to_blend"] | d["to_hold"],
        "advance_failed": d["advance_op"] & ~(d["to_blend"] | d["to_hold"]),
        "fossilized": d["fossil"],
        "fossilize_failed": d["fossil_failed"],
        "prune_started": d["prune"],
        "removed": removed,
        "timeout_pruned": timeout,
        "timeout_fossilized": kept,
        "alpha_set": d["aset"],
        "illegal": d["illegal"],
    }
    return _build(slots, f), TensorDict(events, batch_size=slots.batch_size)


#: The action heads :func:`lifecycle_step` reads per slot.
_STEP_HEADS = ("op", "blueprint", "style", "tempo", "alpha_target", "alpha_speed", "alpha_curve")


def _decide(
    slots: TensorDict,
    action: TensorDict,
    heads: dict[str, torch.Tensor],
    signals: TensorDict,
    cfg: LifecycleConfig,
    n_blueprints: int,
) -> dict[str, torch.Tensor]:
    """Which transition the action makes on each slot ``[*E, S]`` (bool masks): the sampled ``(op,
    slot)`` pair checked against :func:`op_slot_legality` (``illegal`` on the chosen slot where it is
    not legal), then each op's gate on the pre-step state (G0, G2, G3, G5). ``advance_op``: the op was
    ADVANCE, gate passed or not; with ``auto_advance`` ``to_blend``/``to_hold`` also hold the slots
    no op acted on whose gate passes."""
    S = slots.batch_size[-1]
    dev = slots["stage"].device
    op = action["op"]
    chosen = torch.arange(S, device=dev) == action["slot"].unsqueeze(-1)
    legal = op_slot_legality(
        slots, max_seeds=cfg.max_seeds, min_prune_age=cfg.min_prune_age, auto_advance=cfg.auto_advance,
        prune_below=cfg.prune_floor,
    )  # fmt: skip
    op_hot = torch.arange(legal.shape[-2], device=dev) == op.unsqueeze(-1)
    legal_here = (legal & op_hot.unsqueeze(-1)).any(-2)
    act = chosen & legal_here
    doing = lambda o: act & (heads["op"] == int(o))
    gates = gate_readiness(slots, signals["val_acc"], cfg)
    bp = heads["blueprint"]
    g0 = (bp >= 0) & (bp < n_blueprints) if n_blueprints > 0 else bp >= 0
    advance = doing(Op.ADVANCE)
    if cfg.auto_advance:  # every slot no op acted on (WAIT acts on none) advances where its gate passes
        advance = advance | ~(act & (heads["op"] != int(Op.WAIT)))
    return {
        "illegal": chosen & ~legal_here,
        "germ": doing(Op.GERMINATE) & g0,
        "germ_failed": doing(Op.GERMINATE) & ~g0,
        "advance_op": doing(Op.ADVANCE),
        "to_blend": advance & gates["g2"],
        "to_hold": advance & gates["g3"],
        "aset": doing(Op.SET_ALPHA_TARGET),
        "prune": doing(Op.PRUNE),
        "fossil": doing(Op.FOSSILIZE) & gates["g5"],
        "fossil_failed": doing(Op.FOSSILIZE) & ~gates["g5"],
    }


def _apply_op(
    f: dict[str, torch.Tensor],
    d: dict[str, torch.Tensor],
    heads: dict[str, torch.Tensor],
    val_acc: torch.Tensor,
    *,
    incubate: bool = True,
    instant_blend: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The op's own effect (``d`` from :func:`_decide`): the new stage ``[*E, S]``, and the fields
    ``f`` with what a germination stores (blueprint, style, tempo, target, ``acc_at_germination``,
    cleared measurements) and the ramps a germination, blend-in, SET_ALPHA_TARGET or PRUNE starts.
    Without ``incubate`` (``LifecycleConfig.incubate``) a germination is also a blend-in: the seed
    enters BLENDING with its ramp from 0; with ``instant_blend`` a blend-in's ramp has no epoch.
    ``f`` is not modified; a new dict is returned."""
    f = dict(f)
    germ, aset, prune = d["germ"], d["aset"], d["prune"]
    alpha0 = f["alpha"]
    # a germination without incubation starts the blend-in ramp; one with it starts no ramp
    to_blend = d["to_blend"] | germ if not incubate else d["to_blend"]
    rampless = germ & ~to_blend
    stage = f["stage"]
    stage = torch.where(germ, int(Stage.GERMINATED), stage)
    stage = torch.where(to_blend, int(Stage.BLENDING), stage)
    stage = torch.where(d["to_hold"], int(Stage.HOLDING), stage)
    stage = torch.where(prune, int(Stage.PRUNED), stage)
    stage = torch.where(d["fossil"], int(Stage.FOSSILIZED), stage)

    zero_i, zero_f = torch.zeros_like(f["epochs_in_stage"]), torch.zeros_like(alpha0)
    target_a = _lookup(ALPHA_TARGETS, heads["alpha_target"], alpha0.dtype)
    f["blueprint"] = torch.where(germ, heads["blueprint"], f["blueprint"])
    f["style"] = torch.where(germ, heads["style"].clamp(0, len(Style) - 1), f["style"])
    f["tempo"] = torch.where(germ, heads["tempo"].clamp(0, len(TEMPO_EPOCHS) - 1), f["tempo"])
    f["alpha_target"] = torch.where(germ | aset, target_a, f["alpha_target"])
    f["acc_at_germination"] = torch.where(germ, val_acc, f["acc_at_germination"])
    for k in ("contribution", "loss_contribution", "grad_ratio", "seed_params"):
        f[k] = torch.where(germ, zero_f, f[k])

    # new ramps: blend-in (ADVANCE to BLENDING), SET_ALPHA_TARGET, PRUNE (ramp down to 0)
    speed_len = _lookup(ALPHA_SPEED_STEPS, heads["alpha_speed"], torch.int64)
    blend_len = _lookup(TEMPO_EPOCHS, f["tempo"], torch.int64)
    if instant_blend:  # LifecycleConfig.instant_blend: the blend-in is a ramp of no epoch
        blend_len = torch.zeros_like(blend_len)
    blend_curve = _lookup(STYLE_BLEND_CURVE, f["style"], torch.int64)
    prune_len = torch.where(alpha0 > 0, speed_len, 0)
    new_ramp = germ | to_blend | aset | prune
    f["ramp_from"] = torch.where(new_ramp, torch.where(germ, zero_f, alpha0), f["ramp_from"])
    ramp_to = torch.where(new_ramp, f["alpha_target"], f["ramp_to"])
    f["ramp_to"] = torch.where(rampless | prune, zero_f, ramp_to)
    ramp_len = torch.where(to_blend, blend_len, torch.where(aset, speed_len, prune_len))
    f["ramp_len"] = torch.where(new_ramp, torch.where(rampless, zero_i, ramp_len), f["ramp_len"])
    f["ramp_pos"] = torch.where(new_ramp, zero_i, f["ramp_pos"])
    curve = torch.where(to_blend, blend_curve, heads["alpha_curve"].clamp(0, len(AlphaCurve) - 1))
    f["curve"] = torch.where(new_ramp, torch.where(rampless, zero_i, curve), f["curve"])
    return stage, f


def _holding_timeout(
    f: dict[str, torch.Tensor],
    stage: torch.Tensor,
    slots: TensorDict,
    germ: torch.Tensor,
    cfg: LifecycleConfig,
    val_loss: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """The first mechanical advances (module docstring, 1-2): GERMINATED seeds not germinated this step
    move to TRAINING, and a HOLDING seed at ``holding_timeout`` is pruned, or fossilized where
    ``timeout_fossilizes`` and it pays (in what ``keep_by`` names; ``val_loss [*E]``: this epoch's, as
    blended), its ramp ended where alpha is. Returns the stage, new fields, and the ``kept``
    (fossilized) and ``timeout`` (pruned) masks."""
    f = dict(f)
    stage0, eis0, alpha0 = slots["stage"], slots["epochs_in_stage"], slots["alpha"]
    promote = (stage == int(Stage.GERMINATED)) & ~germ
    stage = torch.where(promote, int(Stage.TRAINING), stage)
    expired = (stage == int(Stage.HOLDING)) & (stage0 == int(Stage.HOLDING))
    expired = expired & (eis0 + 1 >= cfg.holding_timeout)
    # G5 but for the ramp: a seed that pays is kept at its deadline even while an alpha ramp moves it
    # (the ramp stops where it is). With G5 itself, a SET_ALPHA_TARGET in HOLDING made a seed the host
    # depended on fail at its deadline and vanish in one step, the host back at chance.
    pays = _pays_at_deadline(slots, val_loss, cfg)
    kept = expired & pays if cfg.timeout_fossilizes else torch.zeros_like(expired)
    timeout = expired & ~kept
    stage = torch.where(kept, int(Stage.FOSSILIZED), stage)
    stage = torch.where(timeout, int(Stage.PRUNED), stage)
    # a kept seed's ramp ends where alpha is now; a pruned one leaves at once, or with ``timeout_ramp``
    # ramps out to 0 as it ramped in (its tempo's length, its style's curve), as a PRUNE does, so the
    # host re-adapts while it leaves (issue 104: removed in one step, a seed that had halved the loss
    # left the host worse than it found it)
    ended = kept | timeout
    zero_i = torch.zeros_like(eis0)
    out_len = zero_i
    if cfg.timeout_ramp:
        out_len = torch.where(alpha0 > 0, _lookup(TEMPO_EPOCHS, f["tempo"], torch.int64), zero_i)
    out_curve = _lookup(STYLE_BLEND_CURVE, f["style"], torch.int64)
    f["ramp_from"] = torch.where(ended, alpha0, f["ramp_from"])
    f["ramp_to"] = torch.where(kept, alpha0, torch.where(timeout, torch.zeros_like(alpha0), f["ramp_to"]))
    f["alpha_target"] = torch.where(kept, alpha0, f["alpha_target"])
    f["ramp_len"] = torch.where(kept, zero_i, torch.where(timeout, out_len, f["ramp_len"]))
    f["ramp_pos"] = torch.where(ended, zero_i, f["ramp_pos"])
    f["curve"] = torch.where(timeout, out_curve, f["curve"])
    return stage, f, kept, timeout


def _pays_at_deadline(slots: TensorDict, val_loss: torch.Tensor, cfg: LifecycleConfig) -> torch.Tensor:
    """``[*E, S]`` bool: the seed pays in what ``cfg.keep_by`` names (a branch on the config, not on a
    tensor): its accuracy (:func:`seed_pays`), its validation loss (:func:`seed_lowers_loss`; issue
    104: a seed that more than halved the loss without adding a point was removed), or either."""
    by_acc = seed_pays(slots, cfg.g5_min_contribution)
    if cfg.keep_by == "accuracy":
        return by_acc
    by_loss = seed_lowers_loss(slots, val_loss, cfg.g5_min_loss_drop)
    return by_loss if cfg.keep_by == "loss" else by_acc | by_loss


def _move_ramps(
    f: dict[str, torch.Tensor], stage: torch.Tensor, stage0: torch.Tensor, cfg: LifecycleConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """Mechanical advances 3-5 (module docstring): every active ramp moves one epoch and sets alpha, a
    PRUNED seed whose ramp ended is ``removed`` (EMBARGOED, or DORMANT without an embargo), and a slot
    embargoed before this step counts down. Returns the stage, new fields, the ``removed`` mask and
    the embargo counters ``[*E, S]`` (before clearing, :func:`_close_epoch`)."""
    f = dict(f)
    live = is_live(stage)
    ramping = live & (f["ramp_pos"] < f["ramp_len"])
    f["ramp_pos"] = torch.where(ramping, f["ramp_pos"] + 1, f["ramp_pos"])
    f["alpha"] = alpha_at(f["curve"], f["ramp_pos"], f["ramp_len"], f["ramp_from"], f["ramp_to"])

    removed = (stage == int(Stage.PRUNED)) & (f["ramp_pos"] >= f["ramp_len"])
    after_removal = int(Stage.EMBARGOED) if cfg.embargo_epochs > 0 else int(Stage.DORMANT)
    stage = torch.where(removed, after_removal, stage)
    embargo = torch.where(removed, cfg.embargo_epochs, f["embargo"])
    counting = (stage0 == int(Stage.EMBARGOED)) & (stage == int(Stage.EMBARGOED))
    embargo = torch.where(counting, embargo - 1, embargo)
    stage = torch.where(counting & (embargo <= 0), int(Stage.DORMANT), stage)
    return stage, f, removed, embargo


def _close_epoch(
    f: dict[str, torch.Tensor],
    stage: torch.Tensor,
    slots: TensorDict,
    germ: torch.Tensor,
    val_acc: torch.Tensor,
    embargo: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Mechanical advance 6 (module docstring): ``age`` and ``epochs_in_stage`` counted (0 on a stage
    change, ``acc_at_stage_start`` = val_acc then), the seed fields of slots without a live seed
    cleared, the embargo kept only where EMBARGOED, the pre-step stage kept in ``prev_stage`` /
    ``prev_epochs_in_stage``, and the final ``stage``. Returns the new fields."""
    f = dict(f)
    stage0, eis0 = slots["stage"], slots["epochs_in_stage"]
    zero_i = torch.zeros_like(eis0)
    live = is_live(stage)
    changed = stage != stage0
    f["age"] = torch.where(live & ~germ, f["age"] + 1, zero_i)
    f["acc_at_stage_start"] = torch.where(changed, val_acc, f["acc_at_stage_start"])
    for k in SEED_FIELDS:
        f[k] = torch.where(live, f[k], torch.zeros_like(f[k]))
    f["embargo"] = torch.where(stage == int(Stage.EMBARGOED), embargo, zero_i)
    f["prev_stage"], f["prev_epochs_in_stage"] = stage0, eis0
    f["epochs_in_stage"] = torch.where(changed, zero_i, eis0 + 1)
    f["stage"] = stage
    return f


__all__ = [
    "ATTACH_AT",
    "EVENT_KINDS",
    "KEEP_BY",
    "SEED_FIELDS",
    "LifecycleConfig",
    "alpha_at",
    "clean_acc",
    "clean_contribution",
    "clear_seeds",
    "config_field",
    "gate_readiness",
    "init_slots",
    "is_live",
    "lifecycle_step",
    "record_signals",
    "stage_in",
]
