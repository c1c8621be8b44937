"""The PPO anomaly detector: unhealthy updates, flagged as ``anomaly`` events.

:class:`AnomalyDetector` checks the metrics of one ``ppo_update`` against :class:`AnomalyConfig` (the
run config's ``anomaly`` section; every threshold configurable, finding M21): ratio explosion /
collapse, entropy collapse of a head that mattered (H1), KL spikes against a running EMA or the KL
target (H2), value collapse (explained variance), NaN/Inf anywhere, and an update the trainer rolled
back (``rolled_back``: a non-finite loss, gradient or parameter). The run writes each
:class:`Anomaly` to its event log (:mod:`esper.shell.telemetry.events`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from esper.shell.config.fields import check_fields, doc


@dataclass(frozen=True, slots=True)
class AnomalyConfig:
    ratio_explosion: float = doc(5.0, "flag max_ratio above this", gt=1)
    ratio_collapse: float = doc(0.1, "flag min_ratio below this", ge=0, lt=1)
    entropy_collapse: float = doc(
        0.1, "flag a head's normalized entropy below this (heads with weight > 0)", ge=0, le=1
    )
    kl_spike_factor: float = doc(3.0, "flag kl_approx above this x its running EMA (after the warm-up)", gt=1)
    kl_spike_ema: float = doc(0.9, "decay of the KL running EMA", ge=0, lt=1)
    kl_spike_warmup: int = doc(3, "updates seen before the EMA test applies", ge=0)
    kl_spike_target_factor: float = doc(
        4.0, "flag kl_approx above this x target_kl (when a target is set)", gt=1
    )
    kl_spike_floor: float = doc(1e-4, "a KL below this is never a spike (EMA near 0)", ge=0)
    value_collapse: float = doc(-0.5, "flag explained_variance below this", le=1)

    def __post_init__(self) -> None:
        check_fields(self, "anomaly")


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One flagged metric; ``as_dict()`` gives the fields of an ``anomaly`` event (plus ``update``)."""

    kind: str
    value: float | None
    threshold: float | None
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value, "threshold": self.threshold, "detail": self.detail}


class AnomalyDetector:
    """Flags unhealthy PPO updates. ``check`` takes the flat metrics of one ``ppo_update`` event
    (per-head dicts ``head_entropy`` and ``head_weight``); metrics absent from the dict are not
    checked. Stateful only through the KL running EMA (``state_dict`` / ``load_state_dict``)."""

    def __init__(self, cfg: AnomalyConfig | None = None, target_kl: float | None = None) -> None:
        self.cfg = cfg if cfg is not None else AnomalyConfig()
        if target_kl is not None and not target_kl > 0:
            raise ValueError(f"target_kl must be > 0 or None, got {target_kl}")
        self.target_kl = target_kl
        self.kl_ema: float | None = None
        self.n_seen = 0

    def check(self, metrics: Mapping[str, Any]) -> list[Anomaly]:
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
            out.append(Anomaly("ratio_explosion", metrics["max_ratio"], cfg.ratio_explosion, "max_ratio"))
        if _finite(metrics, "min_ratio") and metrics["min_ratio"] < cfg.ratio_collapse:
            out.append(Anomaly("ratio_collapse", metrics["min_ratio"], cfg.ratio_collapse, "min_ratio"))
        if "head_entropy" in metrics:
            if "head_weight" not in metrics:
                raise KeyError("AnomalyDetector: head_entropy needs head_weight (which heads mattered)")
            weights = metrics["head_weight"]
            for head, ent in metrics["head_entropy"].items():
                w = weights[head]
                if _isfinite(ent) and _isfinite(w) and w > 0 and ent < cfg.entropy_collapse:
                    out.append(
                        Anomaly(
                            "entropy_collapse", ent, cfg.entropy_collapse, f"head {head} (weight {w:.3g})"
                        )
                    )
        if _finite(metrics, "kl_approx"):
            spike = self._kl(float(metrics["kl_approx"]))
            if spike is not None:
                out.append(spike)
        if _finite(metrics, "explained_variance") and metrics["explained_variance"] < cfg.value_collapse:
            out.append(
                Anomaly(
                    "value_collapse", metrics["explained_variance"], cfg.value_collapse, "explained_variance"
                )
            )
        return out

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

    def state_dict(self) -> dict[str, Any]:
        return {"kl_ema": self.kl_ema, "n_seen": self.n_seen}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        self.kl_ema = None if sd["kl_ema"] is None else float(sd["kl_ema"])
        self.n_seen = int(sd["n_seen"])


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
