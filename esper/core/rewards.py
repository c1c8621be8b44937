"""Per-step rewards, every component returned separately (the original system's reward, adapted to the
8-head space).

**OBJECTIVE** mode (the default) pays for what a user of a grown network wants: held-out accuracy per
parameter. With the objective of a host state

    Phi(s) = val_acc(s) - param_weight * sum_seeds(share * parameters) / (host parameters)   (points)

(:func:`objective`; with ``param_budget`` set, the parameters above the budget pay ``param_over_weight``
per host-size on top, so a user who states how large the grown network may be gets the most accurate
network within it: :func:`parameter_cost`), step t pays ``r_t = Phi(s_{t+1}) - Phi(s_t)``
(:func:`objective_delta`): the change the action and the epoch of training after it made. The sum over
an episode telescopes to ``Phi(final host) - Phi(after the first epoch)``, so the return *is* the final
objective, up to a start value no action can change. It cannot be farmed: a seed that does not raise
accuracy pays its parameters and nothing else, and a seed the host has come to depend on is worth
exactly what the host's accuracy is worth. A seed is charged while it is part of the host's function, in
proportion to its blend weight (``share = alpha``): an incubating seed (alpha 0) changes nothing a user
would keep, and a seed being blended in is charged as its effect arrives, so the step that starts a
blend is paid by what the blend does rather than by its whole price at once. The final host is charged
in full for every seed it keeps (``share = 1`` wherever alpha > 0), so the sum still telescopes to the
held-out objective of the final host. That split has a cost the learner sees: the part of a half-blended
seed's price that waits for the last step is discounted and, at GAE's lambda, reaches the germination
that caused it only weakly, so a low alpha target looks cheaper than it is. ``param_share="live"``
charges a seed in full from its first epoch with alpha > 0, exactly as the final host is charged, so
``Phi`` is one function of the host state throughout and every alpha target pays the same price at the
same time. ``s_{t+1}`` is measured one epoch after the action, so :func:`episode_rewards` adds this
term once the episode's measurements are in; in OBJECTIVE mode :func:`compute_reward` itself returns
zeros. The reference's modes below stay available.

**Where the learner's reward is.** Two steps, both here. :func:`compute_reward` gives a step's own
terms when the step is taken; :func:`episode_rewards`, run once the episode is over, turns them into
the reward PPO trains on (its ``total``): it adds the OBJECTIVE term above and the governor's
rollback charge (a panic at a measurement charges the transition that led into it), neither of which
is known when the step is taken. The shell stores that ``total`` as ``("next", "raw_reward")``.

:func:`compute_reward` reads the **pre-action** slot state, the action, the lifecycle events, the
post-step slot state, this epoch's signals and the history after this epoch, and returns a
TensorDict ``[*E]`` of float32 components, their sum ``step_total`` (not yet the learner's reward),
and two bool telemetry flags (``hacking``, ``ransomware``; finding H9). Slot-specific terms use the
sampled slot (``gather``). Inputs are clamped to their physical ranges (accuracy [0, 100] %,
contribution [-100, 100] points, loss [0, 1e4]) and every division is guarded, so every component is
finite and bounded for any valid config (findings C2, M3).

Notation for the sampled slot before the action: ``c`` = contribution (points), ``measured`` = it
had alpha > 0 this epoch (so ``c`` is a counterfactual; alpha-0 seeds report 0), ``ti`` = total
improvement = val_acc - acc_at_germination (points), ``eis`` = epochs_in_stage.

**SHAPED** mode, CONTRIBUTION family (default):

=====================  ===============================================================================
attribution            no seed, FOSSILIZED seed, or FOSSILIZE with ti < 0: 0. Measured: ``c < 0``: c
                       x discount; ``c >= 0``: 0 if ti <= 0, sqrt(ti c) if c >= ti, else c. discount =
                       sigmoid(k ti) if ti < 0 else 1. Not measured: ``proxy_weight`` x acc gain if > 0.
                       PRUNE negates it (removing a harmful seed is good).
ratio_penalty          ``hacking`` (measured, c > ``ratio_min_contribution``, ti >= 0, c >= ``hacking_
                       ratio`` ti) and op != PRUNE, on a non-fossilized seed: ti > safe threshold:
                       -min(max, slope (c/ti - ratio)/ratio); else -low_weight min(1, c/low_scale).
                       The division uses max(ti, threshold, 1e-6) (finding C2).
ransomware_penalty     ``ransomware`` (measured, c > ``ransomware_min_contribution``, ti <
                       ``ransomware_max_improvement``) and op != PRUNE, non-fossilized: -penalty.
blending_warning       sampled slot BLENDING, ti < 0, op != PRUNE: -(base + min(per_epoch eis, cap)).
holding_indecision     op WAIT while some HOLDING seed has eis >= grace and positive attribution:
                       -min(cap, base + slope (eis - grace)) for the worst such slot. Linear and
                       bounded (finding H11; the reference's -3^k reached -9 in two epochs). The slot
                       head is irrelevant under WAIT, so this looks at every slot.
pbrs                   weight (gamma Phi(s') - Phi(s)) with Phi(s) = sum over slots of
                       ``stage_potentials[stage]`` + min(epoch_weight eis, epoch_cap) for GERMINATED..
                       HOLDING. s, s' are read from the post-step state (prev_stage,
                       prev_epochs_in_stage) and (stage, epochs_in_stage), so Phi depends only on the
                       state and the sum over an episode telescopes exactly (finding H8). ``gamma`` is
                       an argument: the PPO gamma, passed by the shell (finding C1).
rent                   -min(weight ln(1 + seed params / host params), cap); all live seeds.
op_shaping             GERMINATE: -invalid if it failed; -germinate_cost. ADVANCE: -invalid if
                       illegal, -advance_fail_penalty if a gate failed. SET_ALPHA_TARGET: -invalid if
                       illegal; -alpha_set_cost. FOSSILIZE: illegal -fossilize_invalid_penalty; ti < 0:
                       -(regress_base + min(regress_slope |ti|, regress_cap)); fossilized: (bonus_base
                       + bonus_slope c) min(1, eis / bonus_epochs); G5 failed: -fossilize_fail_penalty;
                       -fossilize_cost. PRUNE: illegal -prune_invalid_penalty (-prune_fossilized_
                       penalty on a FOSSILIZED seed); else -young max(0, 1 - age); measured c < -0.5:
                       +bad_bonus, c < 0: +mild_bonus, c >= 0: -(good_base + min(good_slope c,
                       good_cap)) (bounded, finding M3); -prune_cost. WAIT: 0.
terminal               last epoch: acc_weight val_acc + fossil_bonus x #FOSSILIZED seeds (post-step)
                       with ti >= fossil_min_improvement.
=====================  ===============================================================================

LOSS family (SHAPED only): ``loss_progress`` = loss_delta_weight x (x if x > 0 else regression_factor
x) with x = clip(loss_delta / loss_std, +-5) and loss_delta = prev - cur (**positive = better**: the
reference's sign bug is fixed, a lower loss gives a higher reward); rent -min(loss_rent_weight ln(1 +
ratio), loss_rent_cap) after ``loss_rent_grace`` epochs; pbrs with ``loss_pbrs_weight``; terminal
clip((baseline - val_loss) / (baseline - target), 0, 1), baseline and target calibrated to the task
(:func:`esper.core.reward_config.with_loss_calibration`). Other components 0.

**SPARSE**: terminal only, at the last epoch: ``sparse_scale`` x clip(best_val_acc / 100 -
sparse_param_weight x seed params / sparse_param_budget, +-1). The scale is applied after the clip,
so it always has effect (finding H10). **MINIMAL**: SPARSE, plus op_shaping = -minimal_prune_penalty
for starting to prune a seed younger than ``minimal_young_age``.

The flags are computed in every mode; their penalties act only in SHAPED/CONTRIBUTION.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from esper.core.lifecycle import clean_acc, clean_contribution, is_live, stage_in
from esper.core.observation import clean_loss
from esper.core.reward_config import COMPONENTS, FLAGS, PARAM_SHARES, RewardConfig, RewardFamily, RewardMode
from esper.core.spec import N_STAGES, Op, Stage

#: Stages whose potential grows with epochs_in_stage.
_PROGRESS_STAGES = (Stage.GERMINATED, Stage.TRAINING, Stage.BLENDING, Stage.HOLDING)
_EPS = 1e-6
#: Parameter counts are clamped to this (finite sums and ratios for any input).
_PARAMS_MAX = 1e12


# --------------------------------------------------------------------------------------- objective
def objective(signals: TensorDictBase, cfg: RewardConfig, *, final: bool = False) -> torch.Tensor:
    """``Phi`` of the module docstring for every env, ``[*E]`` float32 (accuracy points): reads
    ``val_acc [*E]`` (%), ``host_params [*E]``, and per slot ``("slots", "seed_params" | "alpha")
    [*E, S]`` (the seed's parameter count, 0 where there is none, and the alpha it was measured at).
    Each seed is charged ``alpha`` times its parameters, or all of them wherever alpha > 0 with
    ``final=True`` (the final host) or ``cfg.param_share == "live"``. Finite for any input: accuracy
    clamped to [0, 100], alpha to [0, 1], NaN parameter counts and alphas read as 0, the host count as
    at least 1."""
    params = torch.nan_to_num(signals["slots", "seed_params"].float(), nan=0.0).clamp(0.0, _PARAMS_MAX)
    alpha = torch.nan_to_num(signals["slots", "alpha"].float(), nan=0.0).clamp(0.0, 1.0)
    share = (alpha > 0).float() if final or cfg.param_share == "live" else alpha
    host = torch.nan_to_num(signals["host_params"].float(), nan=1.0).clamp(1.0, _PARAMS_MAX)
    return clean_acc(signals["val_acc"]) - parameter_cost((share * params).sum(-1), host, cfg)


def parameter_cost(charged: torch.Tensor, host: torch.Tensor, cfg: RewardConfig) -> torch.Tensor:
    """The accuracy points OBJECTIVE charges for ``charged`` seed parameters on a host of ``host``
    parameters (``[*E]`` each, float; host >= 1): ``param_weight`` per host-size, plus
    ``param_over_weight`` per host-size of what exceeds ``param_budget`` when a budget is set. One home
    for the price: the reward's ``Phi`` and the held-out objective of :mod:`esper.shell.eval.episodes` both
    call it."""
    cost = cfg.param_weight * charged / host
    if cfg.param_budget > 0:
        cost = cost + cfg.param_over_weight * (charged - cfg.param_budget).clamp(min=0.0) / host
    return cost


def objective_delta(
    before: TensorDictBase, after: TensorDictBase, cfg: RewardConfig, *, final: bool = False
) -> torch.Tensor:
    """``Phi(after) - Phi(before)`` ``[*E]``: the OBJECTIVE reward of the step that led from the
    measurement ``before`` to the measurement ``after`` (the next epoch's, or with ``final=True`` the
    final host's, charged in full)."""
    return objective(after, cfg, final=final) - objective(before, cfg)


# ------------------------------------------------------------------------------------------ pieces
def potential(stage: torch.Tensor, epochs_in_stage: torch.Tensor, cfg: RewardConfig) -> torch.Tensor:
    """Phi of the slot state ``[*E, S] -> [*E]``: sum over slots of the stage potential plus, for
    GERMINATED..HOLDING, ``min(pbrs_epoch_weight * epochs_in_stage, pbrs_epoch_cap)``."""
    table = torch.tensor(cfg.stage_potentials, dtype=torch.float32, device=stage.device)
    base = table[stage.clamp(0, N_STAGES - 1)]
    epochs = (cfg.pbrs_epoch_weight * epochs_in_stage.clamp(min=0).to(torch.float32)).clamp(
        max=cfg.pbrs_epoch_cap
    )
    return (base + torch.where(stage_in(stage, _PROGRESS_STAGES), epochs, 0.0)).sum(-1)


def pbrs(new_slots: TensorDict, *, gamma: float, weight: float, cfg: RewardConfig) -> torch.Tensor:
    """``weight * (gamma * Phi(s') - Phi(s))`` from the post-step slot state ``[*E, S] -> [*E]``: s is
    ``(prev_stage, prev_epochs_in_stage)``, s' is ``(stage, epochs_in_stage)``."""
    after = potential(new_slots["stage"], new_slots["epochs_in_stage"], cfg)
    before = potential(new_slots["prev_stage"], new_slots["prev_epochs_in_stage"], cfg)
    return weight * (gamma * after - before)


def _rent(slots: TensorDict, host_params: torch.Tensor, weight: float, cap: float) -> torch.Tensor:
    live = is_live(slots["stage"])
    seeds = torch.where(live, torch.nan_to_num(slots["seed_params"].float(), nan=0.0).clamp(min=0.0), 0.0)
    host = torch.nan_to_num(host_params.float(), nan=0.0).clamp(min=1.0)
    ratio = (seeds.clamp(max=_PARAMS_MAX).sum(-1) / host).clamp(max=_PARAMS_MAX)
    return -(weight * torch.log1p(ratio)).clamp(max=cap)


def _attribution(c, ti, acc_delta, measured, cfg: RewardConfig):
    """Per-slot attribution before op-specific handling (``[*E, S]``)."""
    discount = torch.where(ti < 0, torch.sigmoid(cfg.discount_steepness * ti), 1.0)
    geo = torch.sqrt((ti * c).clamp(min=0.0))
    positive = torch.where(ti <= 0, 0.0, torch.where(c >= ti, geo, c))
    counterfactual = torch.where(c < 0, c * discount, positive)
    proxy = cfg.proxy_weight * acc_delta.clamp(min=0.0).unsqueeze(-1).expand_as(c)
    return torch.where(measured, counterfactual, proxy)


def _ratio_penalty(c, ti, cfg: RewardConfig):
    safe = max(cfg.improvement_safe_threshold, _EPS)
    ratio = c / ti.clamp(min=safe)  # guarded (finding C2)
    high = (cfg.ratio_penalty_slope * (ratio - cfg.hacking_ratio) / cfg.hacking_ratio).clamp(
        0.0, cfg.ratio_penalty_max
    )
    low = cfg.ratio_low_weight * (c / cfg.ratio_low_scale).clamp(0.0, 1.0)
    return -torch.where(ti > cfg.improvement_safe_threshold, high, low)


def _check(slots, action, new_slots, events, signals, history, gamma, max_epochs) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"compute_reward: gamma must be in [0, 1], got {gamma}")
    if max_epochs < 1:
        raise ValueError(f"compute_reward: max_epochs must be >= 1, got {max_epochs}")
    env = tuple(signals.batch_size)
    for name, td in (("slots", slots), ("new_slots", new_slots), ("events", events)):
        if td.batch_dims < 1 or tuple(td.batch_size[:-1]) != env:
            raise ValueError(
                f"compute_reward: {name} must be [*E, S] with E = {list(env)}, got {td.batch_size}"
            )
    for name, td in (("action", action), ("history", history)):
        if tuple(td.batch_size) != env:
            raise ValueError(f"compute_reward: {name} must be [*E] = {list(env)}, got {list(td.batch_size)}")


# ------------------------------------------------------------------------------------------ reward
def compute_reward(
    slots: TensorDictBase,
    action: TensorDictBase,
    new_slots: TensorDictBase,
    events: TensorDictBase,
    signals: TensorDictBase,
    history: TensorDictBase,
    *,
    gamma: float,
    cfg: RewardConfig,
    max_epochs: int,
) -> TensorDict:
    """Reward of one RL step for every env (module docstring).

    Args:
        slots: pre-action slot state ``[*E, S]`` (after :func:`esper.core.lifecycle.record_signals`).
        action: ``[*E]``, int64 per head.
        new_slots, events: what :func:`esper.core.lifecycle.lifecycle_step` returned.
        signals: this epoch's ``[*E]`` signals (``epoch``, ``val_acc``, ``val_loss``, ``host_params``).
        history: ``[*E]`` after :func:`esper.core.observation.update_history` with these signals.
        gamma: the PPO discount (PBRS must use it, finding C1).
        cfg: mode, family, coefficients.
        max_epochs: episode length; the step with ``epoch >= max_epochs`` is the last.

    Returns ``[*E]``: float32 :data:`COMPONENTS`, ``step_total`` (their sum: the step's own terms,
    which :func:`episode_rewards` turns into the learner's reward) and bool :data:`FLAGS`. The
    per-slot quantities are :func:`_slot_quantities`; the terms of each mode :func:`_contribution_terms`
    (SHAPED, CONTRIBUTION family), :func:`_loss_terms` (SHAPED, LOSS family) and :func:`_sparse_terms`
    (SPARSE, MINIMAL).
    """
    _check(slots, action, new_slots, events, signals, history, gamma, max_epochs)
    zero = torch.zeros(signals.batch_size, dtype=torch.float32, device=action["op"].device)
    is_last = signals["epoch"] >= max_epochs
    q = _slot_quantities(slots, signals, history, cfg)
    anyw = _selectors(slots, action)[2]
    out: dict[str, torch.Tensor] = {k: torch.zeros_like(zero) for k in COMPONENTS}
    out["hacking"], out["ransomware"] = anyw(q["hacking"]), anyw(q["ransom"])
    if cfg.mode is RewardMode.OBJECTIVE:
        pass  # every term is the shell's objective_delta, added when the next measurement arrives
    elif cfg.mode is RewardMode.SHAPED and cfg.family is RewardFamily.CONTRIBUTION:
        out.update(
            _contribution_terms(q, slots, action, new_slots, events, signals, is_last, gamma=gamma, cfg=cfg)
        )
    elif cfg.mode is RewardMode.SHAPED:  # LOSS family
        out.update(_loss_terms(slots, new_slots, signals, history, is_last, gamma=gamma, cfg=cfg))
    else:  # SPARSE, MINIMAL
        out.update(_sparse_terms(slots, action, new_slots, events, history, is_last, cfg=cfg))

    out = {k: (v.to(torch.float32) if k in COMPONENTS else v) for k, v in out.items()}
    total = zero
    for k in COMPONENTS:
        total = total + out[k]
    out["step_total"] = total  # not yet the learner's reward: episode_rewards finishes it
    return TensorDict(out, batch_size=signals.batch_size)


def _selectors(slots: TensorDictBase, action: TensorDictBase):
    """``(pick, sel, anyw)``, each ``[*E, S] -> [*E]``: ``pick`` reads the sampled slot; ``sel`` (float)
    and ``anyw`` (bool) read it too, except under WAIT. Under WAIT the slot head does not matter (it is
    sampled but ignored), so a per-slot term must not depend on its sample: ``sel`` gives the mean over
    enabled slots (the expectation of a uniformly drawn slot, without its variance) and ``anyw``
    whether any enabled slot has the flag."""
    S = slots.batch_size[-1]
    idx = action["slot"].clamp(0, S - 1).unsqueeze(-1)
    pick = lambda x: x.gather(-1, idx).squeeze(-1)  # [*E, S] -> [*E], the sampled slot
    enabled = slots["enabled"].to(torch.float32)
    n_enabled = enabled.sum(-1).clamp(min=1.0)
    wait = action["op"] == int(Op.WAIT)
    sel = lambda x: torch.where(
        wait, (x.to(torch.float32) * enabled).sum(-1) / n_enabled, pick(x).to(torch.float32)
    )
    anyw = lambda x: torch.where(wait, (x & slots["enabled"]).any(-1), pick(x))
    return pick, sel, anyw


def _slot_quantities(
    slots: TensorDictBase, signals: TensorDictBase, history: TensorDictBase, cfg: RewardConfig
) -> dict[str, torch.Tensor]:
    """The pre-action quantities of every slot ``[*E, S]`` (module docstring's notation): ``stage``,
    ``live``, ``fossil``, ``c``, ``measured``, ``ti``, ``eis``, the attribution ``attr`` (0 for no or a
    fossilized seed) and the ``hacking`` and ``ransom`` flags; and ``val_acc`` ``[*E]``, cleaned."""
    val_acc = clean_acc(signals["val_acc"])
    stage = slots["stage"]
    live = is_live(stage)
    fossil = stage == int(Stage.FOSSILIZED)
    c = torch.where(live, clean_contribution(slots["contribution"]), 0.0)
    measured = live & (slots["alpha"] > 0)
    ti = torch.where(live, val_acc.unsqueeze(-1) - clean_acc(slots["acc_at_germination"]), 0.0)
    acc_delta = torch.nan_to_num(history["val_acc_delta"].float(), nan=0.0).clamp(-100.0, 100.0)
    attr = torch.where(live & ~fossil, _attribution(c, ti, acc_delta, measured, cfg), 0.0)
    return {
        "val_acc": val_acc,
        "stage": stage,
        "live": live,
        "fossil": fossil,
        "c": c,
        "measured": measured,
        "ti": ti,
        "eis": slots["epochs_in_stage"].clamp(min=0),
        "attr": attr,
        "hacking": measured & (c > cfg.ratio_min_contribution) & (ti >= 0) & (c >= cfg.hacking_ratio * ti),
        "ransom": measured & (c > cfg.ransomware_min_contribution) & (ti < cfg.ransomware_max_improvement),
    }


def _contribution_terms(
    q: dict[str, torch.Tensor],
    slots: TensorDictBase,
    action: TensorDictBase,
    new_slots: TensorDictBase,
    events: TensorDictBase,
    signals: TensorDictBase,
    is_last: torch.Tensor,
    *,
    gamma: float,
    cfg: RewardConfig,
) -> dict[str, torch.Tensor]:
    """SHAPED mode, CONTRIBUTION family: every component of the module docstring's table ``[*E]``
    (``q`` from :func:`_slot_quantities`; the penalties for keeping a seed from :func:`_keeping_terms`)."""
    pick, sel, _ = _selectors(slots, action)
    op = action["op"]
    is_op = lambda o: op == int(o)
    c, ti, eis = q["c"], q["ti"], q["eis"]
    out = _keeping_terms(q, op, pick, sel, cfg)
    a = sel(q["attr"])
    a = torch.where(is_op(Op.FOSSILIZE) & (pick(ti) < 0), 0.0, a)
    out["attribution"] = torch.where(is_op(Op.PRUNE), -a, a)
    out["pbrs"] = pbrs(new_slots, gamma=gamma, weight=cfg.pbrs_weight, cfg=cfg)
    out["rent"] = _rent(slots, signals["host_params"], cfg.rent_weight, cfg.rent_cap)
    ev = lambda k: pick(events[k])
    eis_s = pick(eis).to(torch.float32)
    out["op_shaping"] = _op_shaping(
        op, ev, pick, pick(c), pick(ti), eis_s, q["measured"], q["stage"], slots, cfg
    )
    val_acc = q["val_acc"]
    n_good = (new_slots["stage"] == int(Stage.FOSSILIZED)) & (
        val_acc.unsqueeze(-1) - clean_acc(new_slots["acc_at_germination"])
        >= cfg.terminal_fossil_min_improvement
    )
    term = cfg.terminal_acc_weight * val_acc + cfg.terminal_fossil_bonus * n_good.sum(-1).to(torch.float32)
    out["terminal"] = torch.where(is_last, term, 0.0)
    return out


def _keeping_terms(
    q: dict[str, torch.Tensor], op: torch.Tensor, pick, sel, cfg: RewardConfig
) -> dict[str, torch.Tensor]:
    """SHAPED, CONTRIBUTION: the penalties for keeping a seed as it is, ``[*E]`` each (``pick`` and
    ``sel`` from :func:`_selectors`): ``ratio_penalty``, ``ransomware_penalty`` (never for a fossil,
    nor under PRUNE of the sampled seed), ``blending_warning`` (not under PRUNE) and
    ``holding_indecision`` (WAIT only)."""
    wait = op == int(Op.WAIT)
    stage, c, ti, eis = q["stage"], q["c"], q["ti"], q["eis"]
    keep = ~(op == int(Op.PRUNE)) & ~pick(q["fossil"])  # the seed is kept this step
    kept = ~q["fossil"]  # per slot: penalties for keeping a seed never apply to a fossil
    ratio = torch.where(q["hacking"] & kept, _ratio_penalty(c, ti, cfg), 0.0)
    ransom_pen = torch.where(q["ransom"] & kept, -cfg.ransomware_penalty, 0.0)
    warn = cfg.blending_warning_base + (cfg.blending_warning_per_epoch * eis.to(torch.float32)).clamp(
        max=cfg.blending_warning_cap
    )
    blending = (stage == int(Stage.BLENDING)) & (ti < 0)
    grace = cfg.holding_grace_epochs
    over = (eis - grace).clamp(min=0).to(torch.float32)
    indecision = (cfg.holding_penalty_base + cfg.holding_penalty_slope * over).clamp(
        max=cfg.holding_penalty_cap
    )
    waiting = (stage == int(Stage.HOLDING)) & (eis >= grace) & (q["attr"] > 0)
    worst = torch.where(waiting, indecision, 0.0).amax(-1)
    return {
        "ratio_penalty": torch.where(keep | wait, sel(ratio), 0.0),
        "ransomware_penalty": torch.where(keep | wait, sel(ransom_pen), 0.0),
        "blending_warning": torch.where(op == int(Op.PRUNE), 0.0, sel(torch.where(blending, -warn, 0.0))),
        "holding_indecision": torch.where(wait, -worst, 0.0),
    }


def _loss_terms(
    slots: TensorDictBase,
    new_slots: TensorDictBase,
    signals: TensorDictBase,
    history: TensorDictBase,
    is_last: torch.Tensor,
    *,
    gamma: float,
    cfg: RewardConfig,
) -> dict[str, torch.Tensor]:
    """SHAPED mode, LOSS family: ``loss_progress``, ``rent`` (after the grace epochs), ``pbrs`` and
    ``terminal`` ``[*E]`` (module docstring)."""
    delta = torch.nan_to_num(history["val_loss_delta"].float(), nan=0.0)
    x = (delta / cfg.loss_std).clamp(-5.0, 5.0)
    rent = _rent(slots, signals["host_params"], cfg.loss_rent_weight, cfg.loss_rent_cap)
    if cfg.loss_baseline is None or cfg.loss_target is None:  # a config value: no graph break
        raise ValueError("compute_reward: LOSS needs loss_baseline, loss_target: with_loss_calibration")
    span = cfg.loss_baseline - cfg.loss_target
    term = ((cfg.loss_baseline - clean_loss(signals["val_loss"])) / span).clamp(0.0, 1.0)
    return {
        "loss_progress": cfg.loss_delta_weight * torch.where(x > 0, x, cfg.loss_regression_factor * x),
        "rent": torch.where(signals["epoch"] > cfg.loss_rent_grace, rent, 0.0),
        "pbrs": pbrs(new_slots, gamma=gamma, weight=cfg.loss_pbrs_weight, cfg=cfg),
        "terminal": torch.where(is_last, term, 0.0),
    }


def _sparse_terms(
    slots: TensorDictBase,
    action: TensorDictBase,
    new_slots: TensorDictBase,
    events: TensorDictBase,
    history: TensorDictBase,
    is_last: torch.Tensor,
    *,
    cfg: RewardConfig,
) -> dict[str, torch.Tensor]:
    """SPARSE and MINIMAL modes: ``terminal`` ``[*E]``, scaled after the clip (finding H10), and in
    MINIMAL ``op_shaping``, the penalty for starting to prune a young seed (module docstring)."""
    best = clean_acc(history["best_val_acc"])
    live_new = is_live(new_slots["stage"])
    params = torch.nan_to_num(new_slots["seed_params"].float(), nan=0.0).clamp(0.0, _PARAMS_MAX)
    params = torch.where(live_new, params, 0.0).sum(-1)
    raw = best / 100.0 - cfg.sparse_param_weight * params / cfg.sparse_param_budget
    out = {"terminal": torch.where(is_last, cfg.sparse_scale * raw.clamp(-1.0, 1.0), 0.0)}  # H10
    if cfg.mode is RewardMode.MINIMAL:
        pick = _selectors(slots, action)[0]
        young = pick(events["prune_started"]) & (pick(slots["age"]) < cfg.minimal_young_age)
        out["op_shaping"] = torch.where(young, -cfg.minimal_prune_penalty, 0.0)
    return out


def _op_shaping(op, ev, pick, c, ti, eis, measured, stage, slots, cfg: RewardConfig) -> torch.Tensor:
    """Per-op shaping of the sampled (op, slot) (module docstring); ``[*E]``."""
    illegal = ev("illegal")
    invalid = torch.full_like(c, -cfg.invalid_op_penalty)
    germ = torch.where(ev("germinated"), 0.0, invalid) - cfg.germinate_cost
    advance = torch.where(illegal, invalid, torch.where(ev("advance_failed"), -cfg.advance_fail_penalty, 0.0))
    aset = torch.where(illegal, invalid, torch.full_like(c, -cfg.alpha_set_cost))

    regress = cfg.fossilize_regress_base + (cfg.fossilize_regress_slope * ti.abs()).clamp(
        max=cfg.fossilize_regress_cap
    )
    bonus = (cfg.fossilize_bonus_base + cfg.fossilize_bonus_slope * c) * (
        eis / cfg.fossilize_bonus_epochs
    ).clamp(max=1.0)
    fossil = torch.where(ev("fossilized"), bonus, -cfg.fossilize_fail_penalty)
    fossil = torch.where(ti < 0, -regress, fossil)
    fossil = torch.where(illegal, -cfg.fossilize_invalid_penalty, fossil) - cfg.fossilize_cost

    age = pick(slots["age"]).to(torch.float32)
    good = cfg.prune_good_base + (cfg.prune_good_slope * c).clamp(0.0, cfg.prune_good_cap)  # bounded (M3)
    by_c = torch.where(
        c < cfg.prune_bad_threshold, cfg.prune_bad_bonus, torch.where(c < 0, cfg.prune_mild_bonus, -good)
    )
    legal_prune = -cfg.prune_young_penalty * (1.0 - age).clamp(min=0.0) + torch.where(
        pick(measured), by_c, 0.0
    )
    bad_target = torch.where(
        pick(stage) == int(Stage.FOSSILIZED), -cfg.prune_fossilized_penalty, -cfg.prune_invalid_penalty
    )
    prune = torch.where(illegal, bad_target, legal_prune) - cfg.prune_cost

    wait = torch.where(illegal, invalid, 0.0)
    out = wait
    for o, v in ((Op.GERMINATE, germ), (Op.ADVANCE, advance), (Op.SET_ALPHA_TARGET, aset)):
        out = torch.where(op == int(o), v, out)
    out = torch.where(op == int(Op.FOSSILIZE), fossil, out)
    return torch.where(op == int(Op.PRUNE), prune, out)


# ------------------------------------------------------------------------------ the learner's reward
def episode_rewards(
    terms: TensorDictBase,
    measurements: TensorDictBase,
    final: TensorDictBase,
    panicked: torch.Tensor,
    *,
    cfg: RewardConfig,
    rollback_penalty: float,
) -> TensorDict:
    """**The learner's reward** of every step of an episode, ``[*E, T]`` (time last): the one place
    that turns the per-step terms into the reward PPO trains on. The shell stores ``total`` as the
    rollout's ``("next", "raw_reward")`` (the trainer only rescales it, into ``("next", "reward")``),
    logs it as each ``epoch`` event's ``reward`` and sums it into each episode's ``return``.

    Args:
        terms: the steps' :func:`compute_reward` outputs stacked over time ``[*E, T]``.
        measurements: the measurement each step acted on ``[*E, T]`` (``val_acc``, ``host_params``,
            ``("slots", "seed_params" | "alpha")``, as :func:`objective` reads them).
        final: the final hosts' measurement ``[*E]``, taken after the last step.
        panicked: bool ``[*E, T]``, the governor rolled the env back at that measurement.
        cfg: the reward's configuration (its mode).
        rollback_penalty: what a rollback costs (``governor.penalty``, >= 0).

    Returns ``[*E, T]``: the float32 :data:`COMPONENTS` (in OBJECTIVE mode ``objective`` now holds
    ``Phi(m_{t+1}) - Phi(m_t)``, the last step's against ``final``, charged in full), the bool
    :data:`FLAGS`, ``rollback`` (the rollback charge, <= 0: a panic at measurement t charges the
    transition that led into it, t - 1, and a panic at the first measurement the first step) and
    ``total`` = ``step_total`` + ``rollback`` + the objective term, added in the order each became
    known (so equal, up to rounding, to the sum of the components and ``rollback``). None of these is
    known when the step is taken: the objective term needs the next measurement, the rollback charge
    the next panic check; hence this function runs once the episode is over. Fullgraph-clean.
    """
    _check_episode(terms, measurements, final, panicked)
    charge = rollback_penalty * panicked.float()  # [*E, T], at the panicking measurement
    none = torch.zeros_like(charge[..., :1])
    at_start = torch.cat([charge[..., :1], torch.zeros_like(charge[..., 1:])], dim=-1)  # first step
    into_next = torch.cat([charge[..., 1:], none], dim=-1)  # the transition that led into the panic
    total = terms["step_total"] - at_start - into_next
    out = {k: terms[k] for k in (*COMPONENTS, *FLAGS)}
    if cfg.mode is RewardMode.OBJECTIVE:
        delta = torch.cat(
            [
                objective_delta(measurements[..., :-1], measurements[..., 1:], cfg),
                objective_delta(measurements[..., -1], final, cfg, final=True).unsqueeze(-1),
            ],
            dim=-1,
        )
        total = total + delta
        out["objective"] = out["objective"] + delta
    out["rollback"] = -(at_start + into_next)
    out["total"] = total
    return TensorDict(out, batch_size=terms.batch_size)


def _check_episode(terms, measurements, final, panicked) -> None:
    """:func:`episode_rewards`' shapes: ``terms``, ``measurements`` and ``panicked`` ``[*E, T]`` with
    T >= 1, ``final`` ``[*E]``."""
    steps = tuple(terms.batch_size)
    if len(steps) < 1 or steps[-1] < 1:
        raise ValueError(f"episode_rewards: terms must be [*E, T] with T >= 1, got {list(steps)}")
    if tuple(measurements.batch_size) != steps or tuple(panicked.shape) != steps:
        raise ValueError(
            f"episode_rewards: measurements {list(measurements.batch_size)} and panicked "
            f"{list(panicked.shape)} must be the terms' {list(steps)}"
        )
    if tuple(final.batch_size) != steps[:-1]:
        raise ValueError(
            f"episode_rewards: final must be [*E] = {list(steps[:-1])}, got {list(final.batch_size)}"
        )


__all__ = [
    "COMPONENTS",
    "FLAGS",
    "PARAM_SHARES",
    "RewardConfig",
    "RewardFamily",
    "RewardMode",
    "compute_reward",
    "episode_rewards",
    "objective",
    "objective_delta",
    "pbrs",
    "potential",
]
