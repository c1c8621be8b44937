"""The reward's configuration: its mode, family and coefficients (:class:`RewardConfig`), and the names
of the components and flags :func:`esper.core.rewards.compute_reward` returns. The reward itself, and
what each coefficient does, is documented in :mod:`esper.core.rewards`."""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass

from esper.core.lifecycle import config_field
from esper.core.spec import N_STAGES


class RewardMode(enum.Enum):
    OBJECTIVE = "objective"
    SHAPED = "shaped"
    SPARSE = "sparse"
    MINIMAL = "minimal"


class RewardFamily(enum.Enum):
    CONTRIBUTION = "contribution"
    LOSS = "loss"


#: Float components of :func:`~esper.core.rewards.compute_reward`, summed into ``step_total``.
COMPONENTS: tuple[str, ...] = (
    "objective",
    "attribution",
    "ratio_penalty",
    "ransomware_penalty",
    "blending_warning",
    "holding_indecision",
    "pbrs",
    "rent",
    "op_shaping",
    "loss_progress",
    "terminal",
)
#: Bool telemetry flags of :func:`~esper.core.rewards.compute_reward` (finding H9).
FLAGS: tuple[str, ...] = ("hacking", "ransomware")

#: Stage potentials (reference: DORMANT 0, GERMINATED 1, TRAINING 2, BLENDING 3.5, PROBATIONARY 5.5,
#: FOSSILIZED 6); PRUNED and EMBARGOED hold no potential.
_POTENTIALS = (0.0, 1.0, 2.0, 3.5, 5.5, 6.0, 0.0, 0.0)
_f = config_field


#: OBJECTIVE's ``param_share`` choices (:func:`~esper.core.rewards.objective`).
PARAM_SHARES = ("alpha", "live")


@dataclass(frozen=True, slots=True)
class RewardConfig:
    """Reward mode, family and coefficients (the shaped modes' defaults are the reference's). There is
    deliberately no gamma: :func:`~esper.core.rewards.compute_reward` takes the PPO gamma as an argument
    (finding C1). Penalty fields are magnitudes (>= 0); the sign is applied there."""

    mode: RewardMode = dataclasses.field(
        default=RewardMode.OBJECTIVE,
        metadata={"doc": "OBJECTIVE (the change of val acc - parameter cost) | SHAPED | SPARSE | MINIMAL"},
    )
    param_weight: float = _f(2.0, "OBJECTIVE: accuracy points charged per host-size of live seed parameters")
    param_budget: float = _f(
        0.0,
        "OBJECTIVE: seed parameters the host may add before param_over_weight is charged as well "
        "(0: no budget)",
    )
    param_budget_share: float = _f(
        0.0,
        "OBJECTIVE: the budget as a share of the seed parameters the task's grow_all adds (0.6: 60 % of "
        "growing everything; the same words on every host). Resolved per task by the shell "
        "(with_param_budget); set, it replaces param_budget, which must then be 0",
    )
    param_over_weight: float = _f(
        10.0, "OBJECTIVE: points per host-size of seed parameters above param_budget, on top of param_weight"
    )
    param_share: str = _f(
        "alpha",
        "OBJECTIVE: how much of a blending seed's parameters each measurement charges: alpha (in "
        "proportion to its alpha; the final host in full) | live (in full once alpha > 0, as the final host)",
    )
    family: RewardFamily = dataclasses.field(
        default=RewardFamily.CONTRIBUTION,
        metadata={"doc": "SHAPED's terms: CONTRIBUTION | LOSS (LOSS needs SHAPED)"},
    )
    # attribution
    discount_steepness: float = _f(10.0, "attribution discount sigmoid(k * ti) when ti < 0")
    proxy_weight: float = _f(0.3, "unmeasured seed (alpha 0): weight of a positive val-acc gain")
    # ratio penalty / hacking (H9, C2)
    hacking_ratio: float = _f(5.0, "contribution / total improvement at or above which a seed is flagged")
    ratio_min_contribution: float = _f(1.0, "hacking check only above this contribution (points)")
    improvement_safe_threshold: float = _f(0.1, "ti above this: penalty from the ratio; else low-ti form")
    ratio_penalty_max: float = _f(0.3, "cap of the ratio penalty")
    ratio_penalty_slope: float = _f(0.1, "ratio penalty per (ratio - hacking_ratio) / hacking_ratio")
    ratio_low_weight: float = _f(0.3, "low-improvement penalty weight")
    ratio_low_scale: float = _f(10.0, "low-improvement penalty saturates at this contribution")
    # ransomware (H9)
    ransomware_min_contribution: float = _f(1.0, "ransomware: contribution above this (points)")
    ransomware_max_improvement: float = _f(-0.2, "ransomware: total improvement below this (points)")
    ransomware_penalty: float = _f(0.3, "penalty for keeping a ransomware seed (not pruning it)")
    # blending warning
    blending_warning_base: float = _f(0.1, "BLENDING seed with ti < 0: base penalty")
    blending_warning_per_epoch: float = _f(0.05, "... plus this per epoch in stage")
    blending_warning_cap: float = _f(0.3, "... capped at this")
    # holding indecision (H11)
    holding_grace_epochs: int = _f(2, "WAIT on a good HOLDING seed is free for this many epochs")
    holding_penalty_base: float = _f(1.0, "indecision penalty at the first epoch past the grace")
    holding_penalty_slope: float = _f(1.0, "indecision penalty growth per further epoch (linear)")
    holding_penalty_cap: float = _f(3.0, "indecision penalty cap")
    # PBRS (H8)
    pbrs_weight: float = _f(0.3, "weight of the potential-based shaping")
    stage_potentials: tuple[float, ...] = _f(_POTENTIALS, "potential per Stage, in Stage order")
    pbrs_epoch_weight: float = _f(0.3, "potential per epoch in stage (GERMINATED..HOLDING)")
    pbrs_epoch_cap: float = _f(2.0, "cap of the epoch part of the potential")
    # rent
    rent_weight: float = _f(0.5, "rent = weight * ln(1 + seed params / host params)")
    rent_cap: float = _f(8.0, "rent cap")
    # op shaping
    invalid_op_penalty: float = _f(0.3, "illegal GERMINATE / ADVANCE / SET_ALPHA_TARGET / WAIT, failed G0")
    germinate_cost: float = _f(0.02, "cost of every GERMINATE")
    advance_fail_penalty: float = _f(0.1, "ADVANCE whose gate failed")
    alpha_set_cost: float = _f(0.01, "cost of every legal SET_ALPHA_TARGET")
    fossilize_invalid_penalty: float = _f(1.0, "FOSSILIZE on a slot that is not HOLDING")
    fossilize_regress_base: float = _f(0.5, "FOSSILIZE with ti < 0: base penalty")
    fossilize_regress_slope: float = _f(0.2, "... plus this per point of |ti|")
    fossilize_regress_cap: float = _f(1.0, "... that part capped at this")
    fossilize_bonus_base: float = _f(0.5, "successful FOSSILIZE: base bonus")
    fossilize_bonus_slope: float = _f(0.1, "... plus this per point of contribution")
    fossilize_bonus_epochs: int = _f(5, "... scaled by min(1, epochs in HOLDING / this)")
    fossilize_fail_penalty: float = _f(0.2, "FOSSILIZE whose G5 failed")
    fossilize_cost: float = _f(0.01, "cost of every FOSSILIZE")
    prune_invalid_penalty: float = _f(0.2, "illegal PRUNE (no prunable seed)")
    prune_fossilized_penalty: float = _f(1.0, "PRUNE on a FOSSILIZED seed")
    prune_young_penalty: float = _f(0.3, "PRUNE at age a < 1: this * (1 - a)")
    prune_bad_threshold: float = _f(-0.5, "contribution below which pruning earns prune_bad_bonus")
    prune_bad_bonus: float = _f(0.3, "pruning a clearly harmful seed")
    prune_mild_bonus: float = _f(0.1, "pruning a mildly harmful seed (contribution in [bad, 0))")
    prune_good_base: float = _f(0.3, "pruning a helpful seed: base penalty")
    prune_good_slope: float = _f(0.05, "... plus this per point of contribution")
    prune_good_cap: float = _f(0.5, "... that part capped at this (finding M3)")
    prune_cost: float = _f(0.005, "cost of every PRUNE")
    # terminal
    terminal_acc_weight: float = _f(0.05, "last epoch: weight of val_acc (%)")
    terminal_fossil_bonus: float = _f(3.0, "last epoch: per fossilized seed that improved the host")
    terminal_fossil_min_improvement: float = _f(1.0, "... by at least this many points since germination")
    # sparse / minimal (H10)
    sparse_scale: float = _f(1.0, "SPARSE/MINIMAL: scale applied after the clip")
    sparse_param_weight: float = _f(0.1, "SPARSE: weight of the parameter cost")
    sparse_param_budget: float = _f(500_000.0, "SPARSE: seed parameters that cost sparse_param_weight")
    minimal_prune_penalty: float = _f(0.1, "MINIMAL: pruning a seed younger than minimal_young_age")
    minimal_young_age: int = _f(5, "MINIMAL: age under which a prune is penalized")
    # loss family
    loss_std: float = _f(0.05, "LOSS: loss-delta normalization")
    loss_delta_weight: float = _f(5.0, "LOSS: weight of the normalized loss improvement")
    loss_regression_factor: float = _f(0.5, "LOSS: a regression weighs this much of an improvement")
    loss_rent_weight: float = _f(0.05, "LOSS: rent weight")
    loss_rent_cap: float = _f(5.0, "LOSS: rent cap")
    loss_rent_grace: int = _f(3, "LOSS: epochs without rent")
    loss_pbrs_weight: float = _f(0.1, "LOSS: weight of the potential-based shaping")
    loss_baseline: float | None = _f(
        None,
        "LOSS: val loss worth 0 at the end (none: the task's chance loss, ln(classes): 2.30 on a 10-class "
        "task, 5.55 on a byte-level LM; resolved per task by the shell, with_loss_calibration)",
    )
    loss_target: float | None = _f(
        None,
        "LOSS: val loss worth 1 at the end (none: LOSS_TARGET_SHARE, 0.13, of the baseline: the reference's "
        "CIFAR-10 calibration, 0.3 of ln 10, on every task; resolved by with_loss_calibration)",
    )

    def __post_init__(self) -> None:
        where = "RewardConfig"
        if not isinstance(self.mode, RewardMode) or not isinstance(self.family, RewardFamily):
            raise ValueError(f"{where}: mode and family must be RewardMode / RewardFamily members")
        if self.param_share not in PARAM_SHARES:
            raise ValueError(f"{where}.param_share must be one of {PARAM_SHARES}, got {self.param_share!r}")
        if self.family is RewardFamily.LOSS and self.mode is not RewardMode.SHAPED:
            raise ValueError(f"{where}: family LOSS requires mode SHAPED, got {self.mode.name}")
        signed = {"ransomware_max_improvement", "prune_bad_threshold", "ransomware_min_contribution"}
        signed |= {"loss_baseline", "loss_target", "terminal_fossil_min_improvement"}
        for fld in dataclasses.fields(self):
            v = getattr(self, fld.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if not math.isfinite(v):
                raise ValueError(f"{where}.{fld.name} must be finite, got {v}")
            if fld.name not in signed and v < 0:
                raise ValueError(f"{where}.{fld.name} must be >= 0, got {v}")
        if len(self.stage_potentials) != N_STAGES or not all(math.isfinite(p) for p in self.stage_potentials):
            raise ValueError(
                f"{where}.stage_potentials: {N_STAGES} finite values, got {self.stage_potentials}"
            )
        for name in ("hacking_ratio", "loss_std", "sparse_param_budget", "ratio_low_scale"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{where}.{name} must be > 0, got {getattr(self, name)}")
        if self.param_budget > 0 and self.param_budget_share > 0:
            raise ValueError(
                f"{where}: param_budget ({self.param_budget:g}) and param_budget_share "
                f"({self.param_budget_share:g}) both set; give the budget one way (set the other to 0)"
            )
        if self.fossilize_bonus_epochs < 1:
            raise ValueError(
                f"{where}.fossilize_bonus_epochs must be >= 1, got {self.fossilize_bonus_epochs}"
            )
        both = self.loss_baseline is not None and self.loss_target is not None
        if both and not self.loss_baseline > self.loss_target:  # type: ignore[operator]
            raise ValueError(f"{where}: loss_baseline ({self.loss_baseline}) must be > loss_target")


def with_param_budget(cfg: RewardConfig, grow_all_params: float) -> RewardConfig:
    """``cfg`` with its budget in parameters: ``param_budget_share x grow_all_params`` where a share is
    set (the share then 0), else ``cfg`` itself. ``grow_all_params``: the seed parameters the task's
    ``grow_all`` adds to its host (:func:`esper.shell.env.tasks.grow_all_params`)."""
    if cfg.param_budget_share <= 0:
        return cfg
    if not grow_all_params > 0:
        raise ValueError(f"param_budget_share needs grow_all's parameters (> 0), got {grow_all_params}")
    budget = cfg.param_budget_share * float(grow_all_params)
    return dataclasses.replace(cfg, param_budget=budget, param_budget_share=0.0)


#: The LOSS terminal's target as a share of its baseline where the user gives none: the reference's
#: CIFAR-10 calibration (target 0.3 below a baseline of ln 10 = 2.30) carried to every task in
#: proportion to its chance loss (0.72 on a byte-level LM's ln 256 = 5.55).
LOSS_TARGET_SHARE = 0.3 / math.log(10)


def with_loss_calibration(cfg: RewardConfig, chance_loss: float) -> RewardConfig:
    """``cfg`` with the LOSS family's terminal calibrated to a task whose chance loss (the loss of a
    uniform prediction, ``ln(classes)``) is ``chance_loss``: ``loss_baseline``, where not given, that
    loss, and ``loss_target``, where not given, :data:`LOSS_TARGET_SHARE` of the baseline. Values the
    user gave stay. Review 001 M4: a fixed CIFAR-10 baseline (ln 10) left a byte-level LM, which starts
    near ln 256 = 5.55, a terminal term of 0 until its loss fell below 2.3.

    Raises:
        ValueError: ``chance_loss`` not > 0, or a given target not below the resolved baseline."""
    if cfg.loss_baseline is not None and cfg.loss_target is not None:
        return cfg
    if not chance_loss > 0 or not math.isfinite(chance_loss):
        raise ValueError(f"with_loss_calibration: the chance loss must be finite and > 0, got {chance_loss}")
    baseline = cfg.loss_baseline if cfg.loss_baseline is not None else float(chance_loss)
    target = cfg.loss_target if cfg.loss_target is not None else LOSS_TARGET_SHARE * baseline
    if not baseline > target:
        raise ValueError(
            f"reward.loss_target ({target:g}) must be below the loss baseline ({baseline:g}"
            + (", the task's chance loss ln(classes))" if cfg.loss_baseline is None else ")")
        )
    return dataclasses.replace(cfg, loss_baseline=baseline, loss_target=target)


__all__ = [
    "COMPONENTS", "FLAGS", "LOSS_TARGET_SHARE", "PARAM_SHARES", "RewardConfig", "RewardFamily", "RewardMode",
    "with_loss_calibration", "with_param_budget",
]  # fmt: skip
