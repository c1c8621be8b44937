"""The policy's observation: this epoch's signals, a short history, and every slot's state, each feature
pre-scaled to about [-1, 1] or [0, 1].

The reference fed raw parameter counts and the global step, which sat at the running normalizer's
clip for many batches; here no feature grows with the host's size or the run's length. The shell
still normalizes with running statistics (finding C5); pre-scaling only keeps the first batches sane.

History (:func:`init_history`, :func:`update_history`, batch ``[*E]``) carries what needs memory:
the last epoch's val loss/acc (for deltas: ``val_loss_delta = prev - cur`` and ``val_acc_delta = cur -
prev``, so positive is better for both; 0 on the first epoch, never inf), the best val acc/loss so
far, the plateau count (consecutive epochs whose acc gain was below ``plateau_threshold``; the first
epoch does not count) and the last ``window`` val losses/accs (oldest first, front-padded with 0).

Layout (:func:`observation_layout` names every column; :func:`obs_dim` is its length):

- base: ``epoch_frac``; ``train_loss``, ``val_loss`` (:func:`scale_loss`); ``val_loss_delta``
  (``tanh(5 * delta / max(prev, 0.01))``, relative); ``train_acc``, ``val_acc`` (/100);
  ``val_acc_delta`` (points / 10, clipped to +-1); ``plateau`` (/10, cap 1); ``best_val_acc``;
  ``best_val_loss``; ``val_loss_hist_0..W-1``; ``val_acc_hist_0..W-1``; ``param_ratio``
  (``log((host + seeds) / host) / log(100)``, clipped to [0, 1]); ``seed_utilization`` (live seeds /
  ``max_seeds``, or / S when unlimited); ``fossilized_frac`` (fossilized seeds / S).
- per slot, slot-major: ``enabled``; ``stage_<NAME>`` one-hot; ``alpha``; ``alpha_target``;
  ``ramping``; ``ramp_left`` (epochs left / 8, cap 1); ``epochs_in_stage`` (/10, cap 1); ``age``
  (/max_epochs, cap 1); ``contribution`` (tanh(points / 5)); ``gain`` (val acc since the stage began,
  points / 10, +-1); ``progress`` (val acc since germination, points / 10, +-1); ``grad_ratio``
  (``log1p(ema) / log1p(cap)``); with ``lifecycle.seed_grad_features`` the seed's gradient health
  from this epoch's signals, ``seed_grad_norm`` (``log1p(norm) / log1p(100)``, cap 1),
  ``seed_grad_health`` (``1 - 0.5 vanishing - 0.8 exploding``, the original's score),
  ``seed_grad_vanishing`` and ``seed_grad_exploding`` (shares of the seed's parameter tensors, all 0
  without a seed); with ``lifecycle.grad_gain_features`` the slot's predicted first-order loss decrease
  from growing there (:mod:`esper.shell.host.gradinit`), ``grad_gain`` (``log1p(gain / 0.1) /
  log1p(10)``, cap 1) and ``grad_gain_share`` (its decrease per parameter over the largest of the env's
  enabled slots; 0 on a disabled slot); ``param_frac`` (seed params / all params); ``blueprint_<i>``,
  ``style_<i>``, ``tempo_<i>`` one-hots (all 0 without a seed); gate readiness ``g2_ready``,
  ``g3_ready``, ``g5_ready`` (:func:`esper.core.lifecycle.gate_readiness`), ``prunable`` (PRUNE legal);
  ``embargo_left`` (/embargo_epochs).
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict

from esper.core.health import seed_grad_health
from esper.core.lifecycle import LifecycleConfig, clean_acc, clean_contribution, gate_readiness, is_live
from esper.core.masks import legal_masks, op_slot_legality
from esper.core.spec import ALPHA_SPEED_STEPS, TEMPO_EPOCHS, ActionSpec, Op, Stage, Style

#: Largest loss the observation distinguishes (inputs are clamped to [0, LOSS_MAX]).
LOSS_MAX = 1e4
#: :func:`scale_loss` divisor: log1p(loss) / LOSS_LOG_SCALE, so a loss of ~11 (ln of a 50k vocabulary)
#: maps to ~1.
LOSS_LOG_SCALE = 2.5
#: Longest ramp (epochs); ``ramp_left`` is epochs left over this.
_LONGEST_RAMP = max(*TEMPO_EPOCHS, *ALPHA_SPEED_STEPS)
#: ``epochs_in_stage`` is scaled by this (gates and timeouts are a few epochs; 10 and beyond read as 1).
_STAGE_EPOCHS_SCALE = 10.0
#: A seed gradient norm this large (the shell's exploding threshold) reads 1 in ``seed_grad_norm``.
_SEED_GRAD_NORM_SCALE = 100.0
#: The per-slot gradient-health features of ``lifecycle.seed_grad_features`` (after ``grad_ratio``).
SEED_GRAD_FEATURES = ("seed_grad_norm", "seed_grad_health", "seed_grad_vanishing", "seed_grad_exploding")
#: The per-slot predicted-decrease features of ``lifecycle.grad_gain_features`` (after those).
GRAD_GAIN_FEATURES = ("grad_gain", "grad_gain_share")
#: ``grad_gain`` reads ``log1p(gain / _GRAD_GAIN_UNIT) / log1p(_GRAD_GAIN_CAP / _GRAD_GAIN_UNIT)``: a
#: predicted decrease of 1 (loss per unit step) reads 1; the default task's slots measure about 0.02-0.6.
_GRAD_GAIN_UNIT = 0.1
_GRAD_GAIN_CAP = 1.0


def clean_loss(x: torch.Tensor) -> torch.Tensor:
    """A loss, NaN-free (NaN counts as the largest loss) and clamped to [0, LOSS_MAX]."""
    return torch.nan_to_num(x.float(), nan=LOSS_MAX).clamp(0.0, LOSS_MAX)


def scale_loss(x: torch.Tensor) -> torch.Tensor:
    """``log1p(loss) / 2.5``: 0 for a perfect fit, ~0.5 for 10-way chance (2.3), ~1 at 11; at most 3.7."""
    return torch.log1p(clean_loss(x)) / LOSS_LOG_SCALE


# ------------------------------------------------------------------------------------------ history
def init_history(n_envs: int, *, window: int = 5, device: torch.device | str | None = None) -> TensorDict:
    """Empty signal history ``[n_envs]`` (module docstring); ``window`` past epochs are kept."""
    if n_envs < 1 or window < 1:
        raise ValueError(f"init_history: n_envs and window must be >= 1, got {n_envs}, {window}")
    z = lambda *shape: torch.zeros(n_envs, *shape, dtype=torch.float32, device=device)
    return TensorDict(
        {
            "count": torch.zeros(n_envs, dtype=torch.int64, device=device),
            "last_val_loss": z(),
            "last_val_acc": z(),
            "val_loss_delta": z(),
            "val_acc_delta": z(),
            "best_val_acc": z(),
            "best_val_loss": z(),
            "plateau": torch.zeros(n_envs, dtype=torch.int64, device=device),
            "val_loss_window": z(window),
            "val_acc_window": z(window),
        },
        batch_size=[n_envs],
        device=device,
    )


def update_history(history: TensorDict, signals: TensorDict, *, plateau_threshold: float = 0.5) -> TensorDict:
    """History after this epoch's ``signals`` (``val_loss``, ``val_acc``); batch ``[*E]``."""
    if tuple(history.batch_size) != tuple(signals.batch_size):
        raise ValueError(
            f"update_history: history {list(history.batch_size)} and signals {list(signals.batch_size)} "
            "must have the same batch size"
        )
    if not math.isfinite(plateau_threshold):
        raise ValueError(f"update_history: plateau_threshold must be finite, got {plateau_threshold}")
    loss, acc = clean_loss(signals["val_loss"]), clean_acc(signals["val_acc"])
    seen = history["count"] > 0
    loss_delta = torch.where(seen, history["last_val_loss"] - loss, 0.0)
    acc_delta = torch.where(seen, acc - history["last_val_acc"], 0.0)
    stalled = seen & (acc_delta < plateau_threshold)
    shift = lambda w, x: torch.cat([w[..., 1:], x.unsqueeze(-1)], dim=-1)
    return TensorDict(
        {
            "count": history["count"] + 1,
            "last_val_loss": loss,
            "last_val_acc": acc,
            "val_loss_delta": loss_delta,
            "val_acc_delta": acc_delta,
            "best_val_acc": torch.where(seen, torch.maximum(history["best_val_acc"], acc), acc),
            "best_val_loss": torch.where(seen, torch.minimum(history["best_val_loss"], loss), loss),
            "plateau": torch.where(stalled, history["plateau"] + 1, 0),
            "val_loss_window": shift(history["val_loss_window"], loss),
            "val_acc_window": shift(history["val_acc_window"], acc),
        },
        batch_size=history.batch_size,
    )


# -------------------------------------------------------------------------------------------- layout
_BASE = (
    "epoch_frac",
    "train_loss",
    "val_loss",
    "val_loss_delta",
    "train_acc",
    "val_acc",
    "val_acc_delta",
    "plateau",
    "best_val_acc",
    "best_val_loss",
)
_BASE_TAIL = ("param_ratio", "seed_utilization", "fossilized_frac")
_SLOT_HEAD = (
    "enabled",
    *(f"stage_{s.name}" for s in Stage),
    "alpha",
    "alpha_target",
    "ramping",
    "ramp_left",
    "epochs_in_stage",
    "age",
    "contribution",
    "gain",
    "progress",
    "grad_ratio",
)
_SLOT_TAIL = ("g2_ready", "g3_ready", "g5_ready", "prunable", "embargo_left")


def observation_layout(
    n_slots: int, n_blueprints: int, *, window: int = 5, seed_grads: bool = False, grad_gain: bool = False
) -> tuple[str, ...]:
    """The name of every observation column, in order (``slot<k>.<feature>`` for slot features);
    ``seed_grads``: with the gradient-health features (``lifecycle.seed_grad_features``); ``grad_gain``:
    with the predicted-decrease features (``lifecycle.grad_gain_features``)."""
    if n_slots < 1 or n_blueprints < 1 or window < 1:
        raise ValueError(f"observation_layout: sizes must be >= 1, got {n_slots}, {n_blueprints}, {window}")
    hist = (*(f"val_loss_hist_{i}" for i in range(window)), *(f"val_acc_hist_{i}" for i in range(window)))
    per_slot = (
        *_SLOT_HEAD,
        *(SEED_GRAD_FEATURES if seed_grads else ()),
        *(GRAD_GAIN_FEATURES if grad_gain else ()),
        "param_frac",
        *(f"blueprint_{i}" for i in range(n_blueprints)),
        *(f"style_{s.name}" for s in Style),
        *(f"tempo_{i}" for i in range(len(TEMPO_EPOCHS))),
        *_SLOT_TAIL,
    )
    slots = tuple(f"slot{k}.{name}" for k in range(n_slots) for name in per_slot)
    return (*_BASE, *hist, *_BASE_TAIL, *slots)


def obs_dim(
    n_slots: int, n_blueprints: int, *, window: int = 5, seed_grads: bool = False, grad_gain: bool = False
) -> int:
    """Length of the observation vector."""
    return len(observation_layout(n_slots, n_blueprints, window=window, seed_grads=seed_grads,
                                  grad_gain=grad_gain))  # fmt: skip


def layout_options(lifecycle_cfg: LifecycleConfig) -> dict[str, bool]:
    """The optional slot features a config turns on, as :func:`obs_dim`'s (and :func:`observation_layout`'s,
    :func:`slot_state_names`') keywords."""
    return {"seed_grads": lifecycle_cfg.seed_grad_features, "grad_gain": lifecycle_cfg.grad_gain_features}


def global_dim(*, window: int = 5) -> int:
    """Length of the observation's global part (base, history, tail: the columns before the slots)."""
    return len(_BASE) + 2 * window + len(_BASE_TAIL)


def slot_state_names(*, seed_grads: bool = False, grad_gain: bool = False) -> tuple[str, ...]:
    """The per-slot features without the blueprint one-hot, in :func:`split_observation`'s order: what
    describes a slot whatever the host's blueprint catalogue."""
    return (
        *_SLOT_HEAD, *(SEED_GRAD_FEATURES if seed_grads else ()), *(GRAD_GAIN_FEATURES if grad_gain else ()),
        "param_frac",
        *(f"style_{s.name}" for s in Style), *(f"tempo_{i}" for i in range(len(TEMPO_EPOCHS))), *_SLOT_TAIL,
    )  # fmt: skip


def split_observation(
    obs: torch.Tensor, n_slots: int, n_blueprints: int, *, window: int = 5
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``obs [*L, obs_dim]`` -> its global part ``[*L, global_dim]``, every slot's features without the
    blueprint one-hot ``[*L, S, len(slot_state_names())]`` and the one-hot ``[*L, S, n_blueprints]``
    (with or without ``lifecycle.seed_grad_features`` and ``lifecycle.grad_gain_features``: read from the
    length). Shapes that do not depend on the host: what the host-agnostic policy normalizes and reads
    (views and one copy, no sync)."""
    g = global_dim(window=window)
    rest = obs.shape[-1] - g
    if n_slots < 1 or n_blueprints < 1 or rest <= 0 or rest % n_slots:
        raise ValueError(
            f"split_observation: {obs.shape[-1]} columns are not an observation of {n_slots} slots "
            f"and {n_blueprints} blueprints"
        )
    per = rest // n_slots
    grads = per - n_blueprints - len(slot_state_names())
    extras = {a * len(SEED_GRAD_FEATURES) + b * len(GRAD_GAIN_FEATURES) for a in (0, 1) for b in (0, 1)}
    if grads not in extras:
        raise ValueError(
            f"split_observation: {per} features per slot fit no layout of {n_blueprints} blueprints"
        )
    slots = obs[..., g:].unflatten(-1, (n_slots, per))
    first = len(_SLOT_HEAD) + grads + 1  # the blueprint one-hot follows param_frac
    state = torch.cat([slots[..., :first], slots[..., first + n_blueprints :]], dim=-1)
    return obs[..., :g], state, slots[..., first : first + n_blueprints]


# ---------------------------------------------------------------------------------------- observe
def observe(
    signals: TensorDict,
    history: TensorDict,
    slots: TensorDict,
    *,
    max_epochs: int,
    n_blueprints: int,
    lifecycle_cfg: LifecycleConfig,
) -> torch.Tensor:
    """``[*E, obs_dim]`` float32 observation (module docstring), from this epoch's ``signals [*E]``, the
    history after :func:`update_history` and the slot state ``[*E, S]`` after
    :func:`esper.core.lifecycle.record_signals`. With ``lifecycle_cfg.seed_grad_features`` the signals'
    ``slots`` also hold ``seed_grad_norm``, ``seed_grad_vanishing`` and ``seed_grad_exploding``
    ``[*E, S]`` (the hosts' measurement), with ``lifecycle_cfg.grad_gain_features`` ``grad_gain`` and
    ``grad_gain_rms`` ``[*E, S]``. The global part is :func:`_global_features`, each slot's
    :func:`_slot_features`."""
    _check_observe(signals, history, slots, max_epochs, n_blueprints)
    cfg = lifecycle_cfg
    S = slots.batch_size[-1]
    host = torch.nan_to_num(signals["host_params"].to(torch.float32), nan=0.0).clamp(min=1.0)
    live = is_live(slots["stage"])
    seed_params = torch.nan_to_num(slots["seed_params"].to(torch.float32), nan=0.0).clamp(min=0.0)
    seed_params = torch.where(live, seed_params, 0.0)
    all_params = host + seed_params.sum(-1)
    param_frac = seed_params / all_params.unsqueeze(-1)
    per_slot = _slot_features(
        signals, slots, param_frac, max_epochs=max_epochs, n_blueprints=n_blueprints, cfg=cfg
    )
    glob = _global_features(signals, history, slots, all_params / host, max_epochs=max_epochs, cfg=cfg)
    out = torch.cat([glob, per_slot.flatten(-2)], dim=-1)
    expected = obs_dim(
        S,
        n_blueprints,
        window=history["val_loss_window"].shape[-1],
        seed_grads=cfg.seed_grad_features,
        grad_gain=cfg.grad_gain_features,
    )
    if out.shape[-1] != expected:  # static shapes: checked at trace time
        raise AssertionError(f"observe built {out.shape[-1]} features, layout says {expected}")
    return out


def _check_observe(
    signals: TensorDict, history: TensorDict, slots: TensorDict, max_epochs: int, n_blueprints: int
) -> None:
    """:func:`observe`'s input checks: slots ``[*E, S]``, signals and history ``[*E]``, sizes >= 1."""
    if slots.batch_dims < 1 or tuple(slots.batch_size[:-1]) != tuple(signals.batch_size):
        raise ValueError(
            f"observe: slots must be [*E, S] and signals [*E], got {list(slots.batch_size)}, "
            f"{list(signals.batch_size)}"
        )
    if tuple(history.batch_size) != tuple(signals.batch_size):
        raise ValueError(
            f"observe: history {list(history.batch_size)} and signals {list(signals.batch_size)} differ"
        )
    if max_epochs < 1 or n_blueprints < 1:
        raise ValueError(f"observe: max_epochs, n_blueprints must be >= 1, got {max_epochs}, {n_blueprints}")


def _slot_features(
    signals: TensorDict,
    slots: TensorDict,
    param_frac: torch.Tensor,
    *,
    max_epochs: int,
    n_blueprints: int,
    cfg: LifecycleConfig,
) -> torch.Tensor:
    """Every slot's features ``[*E, S, F]`` in :func:`observation_layout`'s order: ``enabled``, the
    stage one-hot, the scalars of :func:`_slot_scalars` (``param_frac`` ``[*E, S]`` last among them),
    the blueprint, style and tempo one-hots (0 without a seed), gate readiness, ``prunable`` and
    ``embargo_left``."""
    f32 = lambda x: x.to(torch.float32)
    stage = slots["stage"]
    live = is_live(stage)
    gates = gate_readiness(slots, signals["val_acc"], cfg)
    prunable = op_slot_legality(
        slots, max_seeds=cfg.max_seeds, min_prune_age=cfg.min_prune_age, prune_below=cfg.prune_floor
    )[..., int(Op.PRUNE), :]
    one_hot = lambda x, n: torch.where(
        live.unsqueeze(-1), torch.nn.functional.one_hot(x.clamp(0, n - 1), n).to(torch.float32), 0.0
    )
    return torch.cat(
        [
            f32(slots["enabled"]).unsqueeze(-1),
            torch.nn.functional.one_hot(stage.clamp(0, len(Stage) - 1), len(Stage)).to(torch.float32),
            _slot_scalars(signals, slots, param_frac, max_epochs=max_epochs, cfg=cfg),
            one_hot(slots["blueprint"], n_blueprints),
            one_hot(slots["style"], len(Style)),
            one_hot(slots["tempo"], len(TEMPO_EPOCHS)),
            torch.stack(
                [
                    f32(gates["g2"]),
                    f32(gates["g3"]),
                    f32(gates["g5"]),
                    f32(prunable),
                    (f32(slots["embargo"]) / max(cfg.embargo_epochs, 1)).clamp(0.0, 1.0),
                ],
                dim=-1,
            ),
        ],
        dim=-1,
    )


def _slot_scalars(
    signals: TensorDict, slots: TensorDict, param_frac: torch.Tensor, *, max_epochs: int, cfg: LifecycleConfig
) -> torch.Tensor:
    """The scalar features of every slot ``[*E, S, F]``: ``alpha`` .. ``grad_ratio`` of the module
    docstring, the seed gradient-health features when on, and ``param_frac``."""
    f32 = lambda x: x.to(torch.float32)
    live = is_live(slots["stage"])
    val_acc = clean_acc(signals["val_acc"])
    ramping = live & (slots["ramp_pos"] < slots["ramp_len"])
    grad = torch.nan_to_num(f32(slots["grad_ratio"]), nan=0.0).clamp(0.0, cfg.grad_ratio_cap)
    rel_acc = lambda ref: torch.where(live, ((val_acc.unsqueeze(-1) - ref) / 10.0).clamp(-1.0, 1.0), 0.0)
    return torch.stack(
        [
            f32(slots["alpha"]).clamp(0.0, 1.0),
            f32(slots["alpha_target"]).clamp(0.0, 1.0),
            f32(ramping),
            torch.where(ramping, f32(slots["ramp_len"] - slots["ramp_pos"]) / _LONGEST_RAMP, 0.0).clamp(0, 1),
            (f32(slots["epochs_in_stage"]) / _STAGE_EPOCHS_SCALE).clamp(0.0, 1.0),
            (f32(slots["age"]) / max_epochs).clamp(0.0, 1.0),
            torch.tanh(clean_contribution(slots["contribution"]) / 5.0),
            rel_acc(slots["acc_at_stage_start"]),
            rel_acc(slots["acc_at_germination"]),
            torch.log1p(grad) / math.log1p(cfg.grad_ratio_cap),
            *_seed_grad_features(signals, live, cfg.seed_grad_features),
            *_grad_gain_features(signals, slots["enabled"], cfg.grad_gain_features),
            param_frac,
        ],
        dim=-1,
    )


def _global_features(
    signals: TensorDict,
    history: TensorDict,
    slots: TensorDict,
    ratio: torch.Tensor,
    *,
    max_epochs: int,
    cfg: LifecycleConfig,
) -> torch.Tensor:
    """The global part ``[*E, global_dim]``: base features, the loss and accuracy windows, and the tail
    (``param_ratio`` from ``ratio`` = all parameters / host parameters ``[*E]``, seed utilization,
    fossilized share)."""
    f32 = lambda x: x.to(torch.float32)
    S = slots.batch_size[-1]
    stage = slots["stage"]
    # history holds this epoch's loss and delta = prev - cur, so prev = cur + delta
    prev_loss = clean_loss(history["last_val_loss"] + history["val_loss_delta"])
    loss_delta = torch.nan_to_num(f32(history["val_loss_delta"]), nan=0.0).clamp(-LOSS_MAX, LOSS_MAX)
    base = torch.stack(
        [
            (f32(signals["epoch"]) / max_epochs).clamp(0.0, 1.0),
            scale_loss(signals["train_loss"]),
            scale_loss(signals["val_loss"]),
            torch.tanh(5.0 * loss_delta / prev_loss.clamp(min=0.01)),
            clean_acc(signals["train_acc"]) / 100.0,
            clean_acc(signals["val_acc"]) / 100.0,
            (torch.nan_to_num(f32(history["val_acc_delta"]), nan=0.0) / 10.0).clamp(-1.0, 1.0),
            (f32(history["plateau"]) / 10.0).clamp(0.0, 1.0),
            clean_acc(history["best_val_acc"]) / 100.0,
            scale_loss(history["best_val_loss"]),
        ],
        dim=-1,
    )
    hist = torch.cat(
        [scale_loss(history["val_loss_window"]), clean_acc(history["val_acc_window"]) / 100.0], dim=-1
    )
    capacity = cfg.max_seeds if cfg.max_seeds > 0 else S
    tail = torch.stack(
        [
            (torch.log(ratio) / math.log(100.0)).clamp(0.0, 1.0),
            (f32(is_live(stage).sum(-1)) / capacity).clamp(0.0, 1.0),
            f32((stage == int(Stage.FOSSILIZED)).sum(-1)) / S,
        ],
        dim=-1,
    )
    return torch.cat([base, hist, tail], dim=-1)


def _seed_grad_features(signals: TensorDict, live: torch.Tensor, on: bool) -> list[torch.Tensor]:
    """The :data:`SEED_GRAD_FEATURES` of every slot ``[*E, S]`` each (none when ``on`` is False): the
    seed's gradient norm on a log scale, the original's health score ``1 - 0.5 vanishing - 0.8
    exploding`` and the two shares (:func:`esper.core.health.seed_grad_health`); 0 for a slot without a
    seed, NaN read as the worst case."""
    if not on:
        return []
    sig = signals["slots"]
    h = seed_grad_health(sig["seed_grad_norm"], sig["seed_grad_vanishing"], sig["seed_grad_exploding"], live)
    big = _SEED_GRAD_NORM_SCALE
    norm = torch.nan_to_num(h["norm"], nan=big, posinf=big)
    scaled = (torch.log1p(norm.clamp(min=0.0)) / math.log1p(_SEED_GRAD_NORM_SCALE)).clamp(0.0, 1.0)
    return [torch.where(live, scaled, 0.0), h["health"], h["vanishing"], h["exploding"]]


def _grad_gain_features(signals: TensorDict, enabled: torch.Tensor, on: bool) -> list[torch.Tensor]:
    """The :data:`GRAD_GAIN_FEATURES` of every slot ``[*E, S]`` each (none when ``on`` is False): the
    predicted decrease ``grad_gain`` on a log scale, and ``grad_gain_rms`` (per parameter) over the largest
    of the env's enabled slots; 0 on a disabled slot, NaN read as 0."""
    if not on:
        return []
    sig = signals["slots"]
    clean = lambda x: torch.where(enabled, torch.nan_to_num(x.to(torch.float32), nan=0.0, posinf=0.0), 0.0)
    gain, rms = clean(sig["grad_gain"]).clamp(min=0.0), clean(sig["grad_gain_rms"]).clamp(min=0.0)
    unit = _GRAD_GAIN_UNIT
    scaled = (torch.log1p(gain / unit) / math.log1p(_GRAD_GAIN_CAP / unit)).clamp(0.0, 1.0)
    top = rms.amax(dim=-1, keepdim=True)
    share = torch.where(top > 0, rms / top.clamp(min=1e-12), 0.0)
    return [scaled, share]


def controller_inputs(
    signals: TensorDict,
    history: TensorDict,
    slots: TensorDict,
    spec: ActionSpec,
    lifecycle_cfg: LifecycleConfig,
) -> tuple[torch.Tensor, TensorDict]:
    """What a controller acts on after a measurement: the observation ``[*E, obs_dim]`` (:func:`observe`)
    and the legality masks (:func:`esper.core.masks.legal_masks`, gated by the gates' readiness where
    ``lifecycle_cfg.gate_masks``). One rule for every place that steps the lifecycle: the vectorized env
    and the Grower in a user's loop. ``slots`` after :func:`esper.core.lifecycle.record_signals`,
    ``history`` after :func:`update_history`."""
    lc = lifecycle_cfg
    raw = observe(signals, history, slots, max_epochs=lc.max_epochs, n_blueprints=spec.n_blueprints,
                  lifecycle_cfg=lc)  # fmt: skip
    gates = gate_readiness(slots, signals["val_acc"], lc) if lc.gate_masks else None
    legal = legal_masks(
        slots, spec, max_seeds=lc.max_seeds, min_prune_age=lc.min_prune_age, gates=gates,
        auto_advance=lc.auto_advance, prune_below=lc.prune_floor, mask_same_alpha=lc.mask_same_alpha,
    )  # fmt: skip
    return raw, legal


__all__ = [
    "GRAD_GAIN_FEATURES",
    "LOSS_MAX",
    "SEED_GRAD_FEATURES",
    "clean_loss",
    "controller_inputs",
    "global_dim",
    "init_history",
    "layout_options",
    "obs_dim",
    "observation_layout",
    "observe",
    "scale_loss",
    "slot_state_names",
    "split_observation",
    "update_history",
]
