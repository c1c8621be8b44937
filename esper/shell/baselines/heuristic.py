"""The heuristic controller: the reference's hand-written rules, on the same action space as the policy.

Per env, each epoch (the original system's heuristic, adapted to ADVANCE-driven stage changes):

- **No live seed.** WAIT during a 5-epoch cooldown after a prune; WAIT until the host has stabilised
  (latched after 3 consecutive epochs whose validation loss fell by less than 3 % and never rose by
  half); WAIT before epoch 5; GERMINATE once validation accuracy has plateaued for 3 epochs (gain
  under 0.5 points each), into the first empty slot, with the next blueprint of a rotation (heavier
  convolutions first, then attention, norm, depthwise, ...; never ``noop``) that skips blueprints
  recently pruned (a prune adds 2 to a blueprint's penalty, which halves every epoch; skipped at 3).
  Blend style SIGMOID_ADD, standard tempo, alpha target 1.0. Two settings the reference does not
  have (:class:`HeuristicThresholds`; ``heuristic_tuned_wide`` searches them): ``blueprint``, germinate
  only that blueprint instead of the rotation, and ``budget_share``, germinate only a blueprint that
  keeps the seeds' parameters within that share of what ``grow_all`` adds (the next in the rotation that
  fits; WAIT when none does).
- **GERMINATED** (the step after GERMINATE; G1 makes it TRAINING at this step's end). WAIT.
- **TRAINING / BLENDING.** PRUNE a seed that has lost more than 2 points over 5 epochs in its stage;
  otherwise ADVANCE once the stage's minimum dwell passed (and, in BLENDING, the ramp finished) —
  the lifecycle's gate decides whether it goes through.
- **HOLDING.** PRUNE on "ransomware" (contribution > 0.1 while the host is worse than at
  germination); FOSSILIZE when the contribution reaches the G5 threshold; PRUNE when it is <= 0;
  otherwise WAIT (the holding timeout will prune it).

Every choice is checked against the legality masks (an illegal choice becomes WAIT, and WAIT goes to an
enabled slot) and explained in ``last_reasons`` (:meth:`HeuristicController.explain`), which the run
logs with each epoch.

**The predicted-decrease trigger** (``gain_trigger``; evaluation's ``heuristic_gain``, issue 91 item 5).
With the slot statistics on (``lifecycle.grad_init`` or ``lifecycle.grad_gain_features``) the signals carry
each slot's predicted first-order loss decrease per parameter (``grad_gain_rms``,
:mod:`esper.shell.host.gradinit`). Given ``gain_trigger``, the no-live-seed rule germinates, after the
same cooldown, stabilisation and first-epoch waits, into the empty enabled slot whose predicted decrease
per parameter is largest, as soon as it reaches ``gain_trigger`` (or, as before, once accuracy has
plateaued); the blueprint and blend are the reference's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from esper.core.lifecycle import LifecycleConfig
from esper.core.spec import ALPHA_TARGETS, HEADS, AlphaCurve, AlphaSpeed, Op, Stage, Style, Tempo
from esper.shell.baselines.simple import FixedController
from esper.shell.env.step import StepInput

#: Preferred germination order; names a host family does not have are skipped.
ROTATION = ("conv_light", "conv_heavy", "attention", "norm", "depthwise", "bottleneck", "conv_small",
            "mlp", "lora", "lora_large", "mlp_small")  # fmt: skip

#: ``heuristic_gain``'s trigger: a predicted first-order loss decrease per parameter (``grad_gain_rms``)
#: chosen on training hosts (docs/grow-your-model.md, bench/results/perf/2026-12-06-vm-grad-init.md).
GAIN_TRIGGER = 0.03

#: Stages whose seed the heuristic manages; while one exists it germinates nothing.
_SEEDED = (Stage.GERMINATED, Stage.TRAINING, Stage.BLENDING, Stage.HOLDING)


@dataclass(frozen=True, slots=True)
class HeuristicThresholds:
    """The rules' thresholds; the defaults are the reference's (``heuristic``). ``heuristic_tuned``
    chooses them per task on training hosts (:mod:`esper.shell.eval.search`)."""

    #: Epochs to wait after a prune before germinating again.
    cooldown: int = 5
    #: No germination before this epoch.
    min_epoch: int = 5
    #: Germinate after this many epochs in a row that gained under ``plateau_threshold`` points.
    plateau_epochs: int = 3
    plateau_threshold: float = 0.5
    #: PRUNE a TRAINING/BLENDING seed that lost more than ``prune_loss`` points after ``prune_after``
    #: epochs in its stage.
    prune_loss: float = 2.0
    prune_after: int = 5
    #: The host counts as stabilised (latched) after ``stable_epochs`` epochs in a row whose validation
    #: loss fell, by less than ``calm_fall`` of itself; no germination before.
    stable_epochs: int = 3
    calm_fall: float = 0.03
    #: ``""``: germinate the rotation's blueprints in turn (the reference); a blueprint's name: only it.
    blueprint: str = ""
    #: Germinate only a seed that keeps the seeds' parameters within this share of what ``grow_all``
    #: adds (0: no budget, the reference). Needs the seeds' costs (:class:`HeuristicController`).
    budget_share: float = 0.0

    def changed(self) -> dict[str, float]:
        """The thresholds that differ from the reference's, by name (``{}``: the reference's rules)."""
        ref = HeuristicThresholds()
        return {f: getattr(self, f) for f in self.__slots__ if getattr(self, f) != getattr(ref, f)}


class HeuristicController(FixedController):
    """The reference's rules (the module's docstring). Keyword arguments set thresholds
    (:class:`HeuristicThresholds`'s fields); ``per_env`` gives each env its own thresholds instead (a
    threshold search runs its candidates side by side)."""

    def __init__(
        self,
        blueprint_names: tuple[str, ...],
        lifecycle: LifecycleConfig,
        *,
        per_env: Sequence[HeuristicThresholds] | None = None,
        costs: Sequence[Sequence[float]] | None = None,
        grow_all_params: float = 0.0,
        cap: float = math.inf,
        gain_trigger: float | None = None,
        **thresholds: float | str,
    ) -> None:
        self.names = blueprint_names
        self.lc = lifecycle
        #: A bound on the seeds' parameters whatever a threshold's ``budget_share`` says: the learned
        #: controller's cap, so that a searched heuristic is held to what the controller is (inf: none).
        self.cap = float(cap)
        if not self.cap > 0 or (math.isfinite(self.cap) and (costs is None or gain_trigger is not None)):
            raise ValueError(
                f"HeuristicController: a cap is a positive number of parameters, read with the "
                f"seeds' costs by the plateau rule, not the gain trigger (got {cap})"
            )
        if gain_trigger is not None and not lifecycle.grad_stats:
            raise ValueError(
                "HeuristicController: gain_trigger reads the slot statistics: turn on lifecycle.grad_init "
                "(or lifecycle.grad_gain_features)"
            )
        #: Germinate where the predicted decrease per parameter is largest once it reaches this (None: the
        #: reference's plateau trigger and first empty slot alone).
        self.gain_trigger = gain_trigger
        self.thresholds = HeuristicThresholds(**thresholds)
        if per_env is not None and (thresholds or not per_env):
            raise ValueError("HeuristicController: a non-empty per_env list or keywords, not both")
        self.per_env = list(per_env) if per_env is not None else None
        order = [n for n in ROTATION if n in blueprint_names]
        order += [n for n in blueprint_names if n not in order and n != "noop"]
        self.rotation = [blueprint_names.index(n) for n in order] or [0]
        #: ``costs[s][b]``: the seed parameters blueprint b adds in slot s; the unit of ``budget_share``.
        self.costs, self.grow_all_params = costs, float(grow_all_params)
        for t in self.per_env or [self.thresholds]:
            if t.blueprint and (t.blueprint not in blueprint_names or t.blueprint == "noop"):
                raise ValueError(f"HeuristicController: no blueprint {t.blueprint!r}")
            if t.budget_share and (costs is None or not self.grow_all_params > 0):
                raise ValueError("HeuristicController: a budget_share needs the seeds' costs and grow_all's")
        self.last_reasons: list[str] = []
        self.begin(0)

    def begin(self, n_envs: int) -> None:
        if self.per_env is not None and n_envs and len(self.per_env) != n_envs:
            raise ValueError(f"HeuristicController: {len(self.per_env)} per-env thresholds for {n_envs} envs")
        self.n = n_envs
        self.env_state = [
            {"cooldown": 0, "stable": 0, "stabilised": False, "plateau": 0, "prev_loss": None,
             "prev_acc": None, "next_bp": 0, "penalty": {}}
            for _ in range(n_envs)
        ]  # fmt: skip

    def explain(self) -> list[str]:
        """Why it took its last actions, per env (the run logs them with each epoch)."""
        return list(self.last_reasons)

    def act(self, step: StepInput) -> TensorDict:
        slots, sig = step.slots, step.signals
        host = {  # sync point: the heuristic reads its inputs once per step
            k: slots[k].tolist()
            for k in ("stage", "epochs_in_stage", "contribution", "acc_at_stage_start", "acc_at_germination",
                      "ramp_pos", "ramp_len", "enabled", "blueprint", "seed_params")
        }  # fmt: skip
        if self.gain_trigger is not None:
            host["gain"] = sig["slots", "grad_gain_rms"].tolist()
        val_acc, val_loss, epoch = sig["val_acc"].tolist(), sig["val_loss"].tolist(), sig["epoch"].tolist()
        legal = step.legal["slot_by_op"].tolist()
        actions = {h: [0] * self.n for h in HEADS}
        self.last_reasons = []
        for i in range(self.n):
            op, slot, bp, reason = self._decide(i, host, val_acc[i], val_loss[i], epoch[i])
            if op != Op.WAIT and not legal[i][op][slot]:
                op, reason = Op.WAIT, f"{Op(op).name} not legal on slot {slot}: wait"
            if op == Op.WAIT and not legal[i][Op.WAIT][slot]:  # WAIT is legal on enabled slots only
                slot = next((k for k, ok in enumerate(legal[i][Op.WAIT]) if ok), slot)
            actions["op"][i], actions["slot"][i] = int(op), slot
            if op == Op.GERMINATE:
                actions["blueprint"][i] = bp
                actions["style"][i] = int(Style.SIGMOID_ADD)
                actions["tempo"][i] = int(Tempo.STANDARD)
                actions["alpha_target"][i] = ALPHA_TARGETS.index(1.0)
            if op == Op.PRUNE:
                actions["alpha_speed"][i] = int(AlphaSpeed.INSTANT)
                actions["alpha_curve"][i] = int(AlphaCurve.LINEAR)
                self.env_state[i]["cooldown"] = self._t(i).cooldown
                self._penalize(i, host["blueprint"][i][slot])
            self.last_reasons.append(reason)
        device = step.raw_obs.device
        return TensorDict(
            {h: TensorDict({"action": torch.tensor(v, device=device)}, [self.n]) for h, v in actions.items()},
            batch_size=[self.n],
        )

    # ------------------------------------------------------------------------------------------ rules
    def _t(self, i: int) -> HeuristicThresholds:
        """Env ``i``'s thresholds."""
        return self.per_env[i] if self.per_env is not None else self.thresholds

    def _decide(self, i: int, s: dict, acc: float, loss: float, epoch: int) -> tuple[int, int, int, str]:
        st, t = self.env_state[i], self._t(i)
        self._track(st, acc, loss, t)
        for name in list(st["penalty"]):
            st["penalty"][name] *= 0.5
            if st["penalty"][name] < 0.1:
                del st["penalty"][name]
        stages = s["stage"][i]
        live = [k for k, g in enumerate(stages) if g in _SEEDED]
        if live:
            k = live[0]
            stage, eis = Stage(stages[k]), s["epochs_in_stage"][i][k]
            if stage == Stage.GERMINATED:  # germinated last step; G1 makes it TRAINING at this step's end
                return Op.WAIT, k, 0, "seed germinated: wait for it to train"
            gain = acc - s["acc_at_stage_start"][i][k]
            if stage in (Stage.TRAINING, Stage.BLENDING):
                if eis >= t.prune_after and gain < -t.prune_loss:
                    return Op.PRUNE, k, 0, f"{stage.name} seed lost {-gain:.1f} pts in {eis} epochs: prune"
                dwell = self.lc.g2_min_epochs if stage == Stage.TRAINING else self.lc.g3_min_epochs
                ramped = s["ramp_pos"][i][k] >= s["ramp_len"][i][k]
                if eis >= dwell and (stage == Stage.TRAINING or ramped):
                    return Op.ADVANCE, k, 0, f"{stage.name} dwell {eis} >= {dwell}: advance (gate decides)"
                return Op.WAIT, k, 0, f"{stage.name} seed dwelling ({eis} epochs)"
            contrib = s["contribution"][i][k]
            total = acc - s["acc_at_germination"][i][k]
            if contrib > 0.1 and total < 0:
                return (
                    Op.PRUNE,
                    k,
                    0,
                    f"ransomware: contribution {contrib:.2f} but host {total:.2f} pts: prune",
                )
            if contrib >= self.lc.g5_min_contribution:
                return (
                    Op.FOSSILIZE,
                    k,
                    0,
                    f"contribution {contrib:.2f} >= {self.lc.g5_min_contribution}: fossilize",
                )
            if contrib <= 0:
                return Op.PRUNE, k, 0, f"contribution {contrib:.2f} <= 0: prune"
            return Op.WAIT, k, 0, f"holding, contribution {contrib:.2f}"
        if st["cooldown"] > 0:
            st["cooldown"] -= 1
            return Op.WAIT, 0, 0, f"cooldown after prune ({st['cooldown'] + 1} left)"
        if not st["stabilised"]:
            return Op.WAIT, 0, 0, "host not yet stabilised"
        if epoch < t.min_epoch:
            return Op.WAIT, 0, 0, f"epoch {epoch} < {t.min_epoch}"
        empty = [k for k, g in enumerate(stages) if g == Stage.DORMANT and s["enabled"][i][k]]
        if self.gain_trigger is not None and empty:
            return self._gain_rule(st, t, empty, s["gain"][i])
        if st["plateau"] < t.plateau_epochs:
            return Op.WAIT, 0, 0, f"improving (plateau {st['plateau']} < {t.plateau_epochs})"
        if not empty:
            return Op.WAIT, 0, 0, "no empty slot"
        fits = None
        bound = min(self.cap, t.budget_share * self.grow_all_params) if t.budget_share else self.cap
        if math.isfinite(bound):  # the seeds' parameters stay within the budget and the cap
            left = bound - sum(s["seed_params"][i])
            fits = lambda b: self.costs[empty[0]][b] <= left
        bp = self._next_blueprint(st, self._order(t), fits)
        if bp is None:
            return Op.WAIT, 0, 0, "no blueprint fits the budget"
        return Op.GERMINATE, empty[0], bp, f"plateau {st['plateau']}: germinate {self.names[bp]}"

    def _order(self, t: HeuristicThresholds) -> list[int]:
        """The blueprints germinated in turn: the rotation, or only ``t.blueprint``."""
        return [self.names.index(t.blueprint)] if t.blueprint else self.rotation

    def _gain_rule(self, st: dict, t: HeuristicThresholds, empty: list[int], gain: list[float]) -> tuple:
        """The predicted-decrease trigger (the module docstring): the empty slot with the largest
        predicted decrease per parameter, germinated once it reaches :attr:`gain_trigger` or on a plateau."""
        k = max(empty, key=lambda j: (gain[j], -j))
        if gain[k] < self.gain_trigger and st["plateau"] < t.plateau_epochs:
            return Op.WAIT, 0, 0, (f"predicted decrease {gain[k]:.4f} < {self.gain_trigger} and improving "
                                   f"(plateau {st['plateau']} < {t.plateau_epochs})")  # fmt: skip
        bp = self._next_blueprint(st, self._order(t))
        fired = gain[k] >= self.gain_trigger
        why = f"predicted decrease {gain[k]:.4f}" if fired else f"plateau {st['plateau']}"
        return Op.GERMINATE, k, bp, f"{why}: germinate {self.names[bp]} in slot {k}"

    def _penalize(self, i: int, blueprint: int) -> None:
        """A pruned blueprint is skipped by the rotation for a few epochs."""
        name = self.names[blueprint]
        self.env_state[i]["penalty"][name] = self.env_state[i]["penalty"].get(name, 0.0) + 2.0

    def _next_blueprint(self, st: dict, rotation: list[int], fits=None) -> int | None:
        """The next blueprint of ``rotation`` not recently pruned (and, with ``fits``, one that fits; None
        where none does)."""
        for _ in range(len(rotation)):
            bp = rotation[st["next_bp"] % len(rotation)]
            st["next_bp"] += 1
            if st["penalty"].get(self.names[bp], 0.0) < 3.0 and (fits is None or fits(bp)):
                return bp
        if fits is None:
            return rotation[0]
        return next((b for b in rotation if fits(b)), None)

    def _track(self, st: dict, acc: float, loss: float, t: HeuristicThresholds) -> None:
        prev_loss, prev_acc = st["prev_loss"], st["prev_acc"]
        if prev_loss is not None:
            delta = prev_loss - loss
            calm = delta >= 0 and delta / max(prev_loss, 1e-8) < t.calm_fall and loss < 1.5 * prev_loss
            st["stable"] = st["stable"] + 1 if calm else 0
        st["stabilised"] = st["stabilised"] or st["stable"] >= t.stable_epochs
        if prev_acc is not None:
            st["plateau"] = st["plateau"] + 1 if acc - prev_acc < t.plateau_threshold else 0
        st["prev_loss"], st["prev_acc"] = loss, acc


__all__ = ["GAIN_TRIGGER", "HeuristicController", "HeuristicThresholds"]
