"""The run's anomaly detector: unhealthy updates and episodes, flagged as ``anomaly`` events.

:class:`AnomalyDetector` checks the metrics of one ``ppo_update`` against :class:`AnomalyConfig` (the
run config's ``anomaly`` section; every threshold configurable, finding M21): ratio explosion /
collapse, entropy collapse of a head that mattered (H1), KL spikes against a running EMA or the KL
target (H2), value collapse (explained variance), a drift of the gradient norm from its running EMA,
the LSTM's health (saturated units, dead or exploded state rows), NaN/Inf anywhere, and an update the
trainer rolled back (``rolled_back``: a non-finite loss, gradient or parameter). Each finding is an
:class:`Anomaly` of severity ``alarm``, or ``note`` for what is worth a line in the report but is no
fault (a head committed to its prior's choice): the run logs alarms as ``anomaly`` events and notes as
``note`` events, and only alarms escalate.
:meth:`AnomalyDetector.check_rewards` checks an update's episodes: the share of env-steps whose reward
raised the ``hacking`` or ``ransomware`` flag (finding H9), each its own kind (``reward_hacking``,
``ransomware``). The run writes each :class:`Anomaly` to its event log
(:mod:`esper.shell.telemetry.events`).

Thresholds that know where the run is, so that the default run raises no alarm a reader would learn
to ignore:

- **entropy collapse** is judged against ``entropy_collapse`` times the head's relevance weight (the
  share of steps where it mattered, over ``entropy_full_weight``: a head that matters at one step in
  ten, such as ``tempo`` or ``style``, which only a germination reads, is held to a tenth of the
  threshold) and times the entropy coefficient's annealing (its value now over its first), and not at
  all once the coefficient has annealed below ``entropy_anneal_floor`` of its first value: a policy the
  run tells to commit is not flagged for committing. A collapse is an event, not a level: a head is
  flagged when its entropy falls below its threshold, and again only after it has recovered above
  ``entropy_rearm`` times the threshold (a committed head stays flagged once, not at every update);
  and a head that collapsed onto the choice its start bias favours (``priors``: ``ppo.blend_bias``
  starts the blend heads on the fixed schedules' blend) is a ``note``, not an alarm (``entropy_prior_note``):
  the head committed to what the run told it to prefer, and the report says so. Over the twenty
  training runs of seeds 120-129 (set and flat policies) every one of the eleven entropy alarms was such
  a commitment, and the runs that raised one scored no lower than those that did not;
- **ratio explosion** is an alarm when ``max_ratio`` (one step's joint ratio, the most extreme of
  thousands) is above ``ratio_explosion`` *and* the importance weights' effective sample size (``ESS``)
  fell below ``ratio_explosion_ess``: a single rare action made five times likelier, with the batch's
  ESS, KL and clip fraction as usual, is what the clipped surrogate is for (the four such flags of those
  runs came at ESS 0.86-0.89, KL and clip fraction at their run's median);
- **gradient drift** is judged against a running EMA that starts, after the warm-up, at the median of the
  warm-up's norms rather than at the first update's norm (``grad_drift_median``): the first update,
  with an untrained critic, has the run's largest gradient, and an EMA seeded there reads the normal
  fall of the next few updates as a drift (four alarms of those runs);
- **explained variance** is judged against a level that rises with training progress (the original's
  schedule: -0.5 during the first 10 % of the updates, -0.2 until 25 %, 0 until 75 %, 0.1 after), or
  one fixed ``value_collapse`` with ``value_schedule`` off.

**Escalation.** After an update or episode with an anomaly the detector asks for detail for the next
``escalate_updates`` updates (:meth:`AnomalyDetector.detail_due`): the run then logs a ``ppo_detail``
event with every minibatch step's metrics and every env's rollout statistics, as the original turned
its telemetry up to debug for a while after an anomaly.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from esper.shell.common.fields import check_fields, doc


@dataclass(frozen=True, slots=True)
class AnomalyConfig:
    ratio_explosion: float = doc(
        5.0, "flag max_ratio above this (when ESS is below ratio_explosion_ess)", gt=1
    )
    ratio_explosion_ess: float = doc(
        0.5,
        "a max_ratio above ratio_explosion is an alarm only when the update's ESS is below this too (1: "
        "max_ratio alone; an update without ESS is judged on max_ratio alone)",
        gt=0,
        le=1,
    )
    ratio_collapse: float = doc(0.1, "flag min_ratio below this", ge=0, lt=1)
    entropy_collapse: float = doc(
        0.1,
        "flag a head's normalized entropy below this (heads with weight > 0; scaled as the next fields say)",
        ge=0,
        le=1,
    )
    entropy_by_weight: bool = doc(
        True,
        "scale a head's entropy-collapse threshold by its relevance weight / entropy_full_weight "
        "(at most 1): a head that rarely matters may commit",
    )
    entropy_full_weight: float = doc(
        1.0,
        "relevance weight (share of steps the head mattered) from which a head gets the full "
        "entropy-collapse threshold",
        gt=0,
        le=1,
    )
    entropy_by_anneal: bool = doc(
        True,
        "scale the entropy-collapse threshold by the entropy coefficient now / at the first update, and "
        "judge no head once it has annealed below entropy_anneal_floor of that (a policy annealed "
        "towards committing is not flagged for it)",
    )
    entropy_anneal_floor: float = doc(
        0.6,
        "share of its first value below which the annealed entropy coefficient ends the entropy-collapse "
        "check (0: never)",
        ge=0,
        lt=1,
    )
    entropy_rearm: float = doc(
        2.0,
        "a head's collapse is flagged when it falls below its threshold, then not again until its entropy "
        "has risen above this x the threshold (0: flagged at every update it stays below)",
        ge=0,
    )
    entropy_prior_note: bool = doc(
        True,
        "a head that collapsed onto the choice its start bias favours (ppo.blend_bias's fixed blend) is a "
        "note, not an alarm (needs the update's head_choice_share)",
    )
    kl_spike_factor: float = doc(3.0, "flag kl_approx above this x its running EMA (after the warm-up)", gt=1)
    kl_spike_ema: float = doc(0.9, "decay of the KL running EMA", ge=0, lt=1)
    kl_spike_warmup: int = doc(3, "updates seen before the EMA test applies", ge=0)
    kl_spike_target_factor: float = doc(
        4.0, "flag kl_approx above this x target_kl (when a target is set)", gt=1
    )
    kl_spike_floor: float = doc(1e-4, "a KL below this is never a spike (EMA near 0)", ge=0)
    value_collapse: float = doc(-0.5, "flag explained_variance below this (value_schedule off)", le=1)
    value_schedule: bool = doc(
        True,
        "judge explained_variance by training progress: below value_levels[i] until value_progress[i] "
        "of the updates is a collapse, below the last level after",
    )
    value_progress: tuple[float, ...] = doc(
        (0.1, 0.25, 0.75), "progress (share of the run's updates) at which each value level ends", gt=0, le=1
    )
    value_levels: tuple[float, ...] = doc(
        (-0.5, -0.2, 0.0, 0.1),
        "explained-variance threshold in each stretch of value_progress (one more)",
        le=1,
    )
    grad_drift: float = doc(
        3.0, "flag grad_norm above this x its running EMA or below 1/this x (after the warm-up)", gt=1
    )
    grad_drift_ema: float = doc(0.9, "decay of the gradient-norm running EMA", ge=0, lt=1)
    grad_drift_warmup: int = doc(3, "updates seen before the gradient-norm drift test applies", ge=0)
    grad_drift_median: bool = doc(
        True,
        "start the gradient-norm EMA after the warm-up at the median of its norms (False: at the first "
        "update's norm, the largest of a run whose critic starts untrained)",
    )
    lstm_saturation: float = doc(
        0.5,
        "flag when more than this share of the LSTM's hidden units sit saturated (|h| >= 0.95)",
        ge=0,
        le=1,
    )
    lstm_bad_rows: float = doc(
        0.0,
        "flag when more than this share of the LSTM's state rows has a norm below 1e-6 or above 100 "
        "(or any element is not finite)",
        ge=0,
        le=1,
    )
    reward_hacking: float = doc(
        0.05,
        "flag an update whose episodes raised the reward-hacking flag at more than this share of env-steps",
        ge=0,
        le=1,
    )
    ransomware: float = doc(
        0.05,
        "flag an update whose episodes raised the ransomware flag at more than this share of env-steps",
        ge=0,
        le=1,
    )
    escalate_updates: int = doc(
        3,
        "after an anomaly, log a ppo_detail event (each minibatch step, each env) for this many updates "
        "(0: never)",
        ge=0,
    )

    def __post_init__(self) -> None:
        check_fields(self, "anomaly")
        if len(self.value_levels) != len(self.value_progress) + 1:
            raise ValueError(
                f"anomaly.value_levels needs one level more than anomaly.value_progress has edges, got "
                f"{len(self.value_levels)} levels for {len(self.value_progress)} edges"
            )
        if any(b <= a for a, b in zip(self.value_progress, self.value_progress[1:])):
            raise ValueError(f"anomaly.value_progress must increase, got {self.value_progress}")


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One flagged metric; ``as_dict()`` gives the fields of its ``anomaly`` or ``note`` event (plus
    ``update``)."""

    kind: str
    value: float | None
    threshold: float | None
    detail: str
    #: ``alarm`` (an ``anomaly`` event, escalates the detail) or ``note`` (a ``note`` event: no fault).
    severity: str = "alarm"

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value, "threshold": self.threshold, "detail": self.detail}


class AnomalyDetector:
    """Flags unhealthy PPO updates and episodes. ``check`` takes the flat metrics of one ``ppo_update``
    (per-head dicts ``head_entropy`` and ``head_weight``); metrics absent from the dict are not
    checked. ``updates`` (the run's length) lets the explained-variance threshold follow progress,
    ``entropy_coef`` (its first value) lets the entropy threshold follow the annealing; without them
    those thresholds stay fixed. ``priors`` (head → the index and name of the choice its start bias favours,
    :func:`esper.shell.agent.policy.prior_choices`) lets a collapse onto that choice be a note. Stateful
    through the KL and gradient-norm running EMAs, the heads whose collapse was flagged and the
    escalation (``state_dict`` / ``load_state_dict``)."""

    def __init__(
        self,
        cfg: AnomalyConfig | None = None,
        target_kl: float | None = None,
        *,
        updates: int | None = None,
        entropy_coef: float | None = None,
        priors: Mapping[str, tuple[int, str]] | None = None,
    ) -> None:
        self.cfg = cfg if cfg is not None else AnomalyConfig()
        self.priors = dict(priors or {})
        if target_kl is not None and not target_kl > 0:
            raise ValueError(f"target_kl must be > 0 or None, got {target_kl}")
        self.target_kl, self.updates, self.entropy_coef = target_kl, updates, entropy_coef
        self.kl_ema: float | None = None
        self.n_seen = 0
        self.grad_ema: float | None = None
        self.grad_seen = 0
        #: The warm-up's gradient norms (their median starts the EMA; ``grad_drift_median``).
        self.grad_warm: list[float] = []
        #: The last update that logs detail (after an anomaly; 0: none).
        self.detail_until = 0
        #: Heads whose entropy collapse was flagged and has not recovered since (``entropy_rearm``).
        self.collapsed: set[str] = set()

    # ------------------------------------------------------------------------------------------ checks
    def check(self, metrics: Mapping[str, Any], *, update: int | None = None) -> list[Anomaly]:
        """The anomalies of one ``ppo_update``'s metrics; ``update`` (1-based, of the ``updates`` the
        detector was told of) places it in the run."""
        cfg = self.cfg
        out = [Anomaly("nonfinite", None, None, f"{name} is {v}") for name, v in _nonfinite(metrics)]
        if metrics.get("rolled_back"):
            out.append(
                Anomaly(
                    "rolled_back", metrics.get("nonfinite_steps"), None,
                    "a PPO step had a non-finite loss or gradient, or the parameters ended non-finite: "
                    "the update was rolled back",
                )
            )  # fmt: skip
        if _finite(metrics, "max_ratio") and metrics["max_ratio"] > cfg.ratio_explosion:
            ess = metrics["ESS"] if _finite(metrics, "ESS") else None
            if ess is None or cfg.ratio_explosion_ess >= 1 or ess < cfg.ratio_explosion_ess:
                why = "max_ratio" if ess is None else f"max_ratio, with ESS {ess:.3g}"
                out.append(Anomaly("ratio_explosion", metrics["max_ratio"], cfg.ratio_explosion, why))
        if _finite(metrics, "min_ratio") and metrics["min_ratio"] < cfg.ratio_collapse:
            out.append(Anomaly("ratio_collapse", metrics["min_ratio"], cfg.ratio_collapse, "min_ratio"))
        out += self._entropy(metrics)
        if _finite(metrics, "kl_approx"):
            spike = self._kl(float(metrics["kl_approx"]))
            if spike is not None:
                out.append(spike)
        if _finite(metrics, "explained_variance"):
            limit, why = self.value_threshold(update)
            if metrics["explained_variance"] < limit:
                out.append(Anomaly("value_collapse", metrics["explained_variance"], limit, why))
        if _finite(metrics, "grad_norm"):
            drift = self._grad_drift(float(metrics["grad_norm"]))
            if drift is not None:
                out.append(drift)
        out += self._lstm(metrics)
        self._escalate(out, update)
        return out

    def check_rewards(
        self, counts: Mapping[str, int], steps: int, *, update: int | None = None
    ) -> list[Anomaly]:
        """The anomalies of an update's episodes: ``counts`` of env-steps whose reward raised the
        ``hacking`` and ``ransomware`` flags out of ``steps`` env-steps, each its own kind when its
        share is above its threshold."""
        out = []
        for flag, kind, limit in (("hacking", "reward_hacking", self.cfg.reward_hacking),
                                  ("ransomware", "ransomware", self.cfg.ransomware)):  # fmt: skip
            n = int(counts.get(flag, 0))
            share = n / max(steps, 1)
            if n and share > limit:
                out.append(Anomaly(kind, share, limit, f"{n} of {steps} env-steps flagged {flag}"))
        self._escalate(out, update)
        return out

    def detail_due(self, update: int) -> bool:
        """Whether update ``update`` (1-based) falls within an escalation (log its detail)."""
        return update <= self.detail_until

    # -------------------------------------------------------------------------------------- thresholds
    def value_threshold(self, update: int | None) -> tuple[float, str]:
        """The explained-variance level below which ``update`` flags a value collapse, and why."""
        cfg = self.cfg
        if not cfg.value_schedule or update is None or not self.updates:
            return cfg.value_collapse, "explained_variance"
        progress = (update - 1) / self.updates  # the share of the run done before this update
        level = next((v for edge, v in zip(cfg.value_progress, cfg.value_levels) if progress < edge),
                     cfg.value_levels[-1])  # fmt: skip
        return level, f"explained_variance at {progress:.0%} of the run"

    def entropy_threshold(self, weight: float, coef: float | None) -> float:
        """The normalized entropy below which a head of relevance ``weight`` collapsed, with the
        entropy coefficient at ``coef`` (None: not annealed); 0 (nothing is a collapse) once the
        coefficient has annealed below ``entropy_anneal_floor`` of its first value."""
        cfg = self.cfg
        limit = cfg.entropy_collapse
        if cfg.entropy_by_weight:
            limit *= min(1.0, weight / cfg.entropy_full_weight)
        start = self.entropy_coef
        if cfg.entropy_by_anneal and coef is not None and start is not None and start > 0:
            share = min(1.0, max(coef, 0.0) / start)
            limit = limit * share if share >= cfg.entropy_anneal_floor else 0.0
        return limit

    # -------------------------------------------------------------------------------------- detectors
    def _entropy(self, metrics: Mapping[str, Any]) -> list[Anomaly]:
        if "head_entropy" not in metrics:
            return []
        if "head_weight" not in metrics:
            raise KeyError("AnomalyDetector: head_entropy needs head_weight (which heads mattered)")
        weights, out = metrics["head_weight"], []
        shares = metrics.get("head_choice_share") or {}
        coef = metrics.get("entropy_coef") if _finite(metrics, "entropy_coef") else None
        for head, ent in metrics["head_entropy"].items():
            w = weights[head]
            if not (_isfinite(ent) and _isfinite(w) and w > 0):
                continue
            limit = self.entropy_threshold(w, coef)
            rearm = self.cfg.entropy_rearm
            if head in self.collapsed and (rearm <= 0 or ent > rearm * limit):
                self.collapsed.discard(head)  # recovered (or latching is off): the next collapse counts
            if ent < limit and head not in self.collapsed:
                out.append(self._collapse(head, ent, limit, w, shares.get(head)))
                if rearm > 0:
                    self.collapsed.add(head)
        return out

    def _collapse(self, head: str, ent: float, limit: float, weight: float, share: Any) -> Anomaly:
        """A head's collapse: an alarm, or a note when it committed to its prior's choice (the choice the
        batch took most often where the head counted is the one its start bias favours)."""
        what = f"head {head} (weight {weight:.3g})"
        prior = self.priors.get(head)
        if self.cfg.entropy_prior_note and prior is not None and isinstance(share, (list, tuple)) and share:
            top = max(range(len(share)), key=lambda i: share[i])
            if top == prior[0]:
                return Anomaly(
                    "prior_commitment", ent, limit,
                    f"{what} committed to {prior[1]}, the choice its start bias favours ({share[top]:.1%} of "
                    "its steps)",
                    severity="note",
                )  # fmt: skip
        return Anomaly("entropy_collapse", ent, limit, what)

    def _kl(self, kl: float) -> Anomaly | None:
        cfg = self.cfg
        found = None
        if kl > cfg.kl_spike_floor:
            if self.kl_ema is not None and self.n_seen >= cfg.kl_spike_warmup:
                limit = cfg.kl_spike_factor * self.kl_ema
                if kl > limit:
                    found = Anomaly("kl_spike", kl, limit, f"kl_approx > {cfg.kl_spike_factor} x EMA")
            if found is None and self.target_kl is not None:
                limit = cfg.kl_spike_target_factor * self.target_kl
                if kl > limit:
                    found = Anomaly(
                        "kl_spike", kl, limit, f"kl_approx > {cfg.kl_spike_target_factor} x target"
                    )
        beta = cfg.kl_spike_ema
        self.kl_ema = kl if self.kl_ema is None else beta * self.kl_ema + (1.0 - beta) * kl
        self.n_seen += 1
        return found

    def _grad_drift(self, norm: float) -> Anomaly | None:
        """The gradient norm against its running EMA: a jump or a collapse by ``grad_drift`` times."""
        cfg = self.cfg
        found = None
        ema = self.grad_ema
        if ema is not None and ema > 0 and self.grad_seen >= cfg.grad_drift_warmup:
            if norm > cfg.grad_drift * ema:
                found = Anomaly(
                    "grad_drift", norm, cfg.grad_drift * ema, f"grad_norm > {cfg.grad_drift} x EMA"
                )
            elif norm < ema / cfg.grad_drift:
                found = Anomaly(
                    "grad_drift", norm, ema / cfg.grad_drift, f"grad_norm < EMA / {cfg.grad_drift}"
                )
        beta = cfg.grad_drift_ema
        self.grad_seen += 1
        if cfg.grad_drift_median and self.grad_seen <= cfg.grad_drift_warmup:
            self.grad_warm.append(norm)  # the warm-up: the EMA starts at its median when it ends
            done = self.grad_seen == cfg.grad_drift_warmup
            self.grad_ema = statistics.median(self.grad_warm) if done else None
        else:
            self.grad_ema = norm if ema is None else beta * ema + (1.0 - beta) * norm
        return found

    def _lstm(self, metrics: Mapping[str, Any]) -> list[Anomaly]:
        cfg, out = self.cfg, []
        if (
            _finite(metrics, "lstm_h_saturated_frac")
            and metrics["lstm_h_saturated_frac"] > cfg.lstm_saturation
        ):
            out.append(Anomaly("lstm_saturation", metrics["lstm_h_saturated_frac"], cfg.lstm_saturation,
                               "share of the LSTM's hidden units at |h| >= 0.95"))  # fmt: skip
        bad = [(k, metrics[k]) for k in ("lstm_too_small_frac", "lstm_too_large_frac") if _finite(metrics, k)]
        worst = max(bad, key=lambda kv: kv[1], default=None)
        if worst is not None and worst[1] > cfg.lstm_bad_rows:
            what = "below 1e-6" if worst[0] == "lstm_too_small_frac" else "above 100"
            out.append(Anomaly("lstm_norm", worst[1], cfg.lstm_bad_rows,
                               f"share of the LSTM's state rows with a norm {what}"))  # fmt: skip
        if _finite(metrics, "lstm_nonfinite") and metrics["lstm_nonfinite"] > 0:
            out.append(Anomaly("lstm_norm", metrics["lstm_nonfinite"], 0, "non-finite LSTM state elements"))
        return out

    def _escalate(self, found: list[Anomaly], update: int | None) -> None:
        if any(a.severity == "alarm" for a in found) and update is not None and self.cfg.escalate_updates > 0:
            self.detail_until = max(self.detail_until, update + self.cfg.escalate_updates)

    # -------------------------------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {"kl_ema": self.kl_ema, "n_seen": self.n_seen, "grad_ema": self.grad_ema,
                "grad_seen": self.grad_seen, "grad_warm": list(self.grad_warm),
                "detail_until": self.detail_until,
                "collapsed": sorted(self.collapsed)}  # fmt: skip

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (a checkpoint from before the gradient-norm EMA and the
        escalation starts them afresh)."""
        self.kl_ema = None if sd["kl_ema"] is None else float(sd["kl_ema"])
        self.n_seen = int(sd["n_seen"])
        self.grad_ema = None if sd.get("grad_ema") is None else float(sd["grad_ema"])
        self.grad_seen = int(sd.get("grad_seen", 0))
        self.grad_warm = [float(g) for g in sd.get("grad_warm", ())]
        self.detail_until = int(sd.get("detail_until", 0))
        self.collapsed = set(sd.get("collapsed", ()))


def _isfinite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _finite(metrics: Mapping[str, Any], key: str) -> bool:
    return key in metrics and _isfinite(metrics[key])


def _nonfinite(value: Any, name: str = "") -> Iterable[tuple[str, float]]:
    if isinstance(value, float) and not math.isfinite(value):
        yield name, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _nonfinite(v, f"{name}.{k}" if name else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _nonfinite(v, f"{name}[{i}]")


__all__ = ["Anomaly", "AnomalyConfig", "AnomalyDetector"]
