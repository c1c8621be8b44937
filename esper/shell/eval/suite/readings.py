"""What a confirmation keeps of a run's training events beside its evaluation, read while the run
directory is here (it does not outlive its machine): the late fossilization counts, the credit reading
on paying HOLDING seeds, and each training episode's outcome."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from esper.shell.telemetry.events import read_events

#: The training update from which the credit reading is taken (``bench.diagnose --credit-from``).
CREDIT_FROM = 12
#: The training updates :func:`fossil_counts` counts (the late half of the default's 22).
LATE_UPDATES = (12, 22)
#: The classes of a choice made before a step on a paying HOLDING seed (:func:`holding_credit`).
CREDIT_CHOICES = ("FOSSILIZE", "SET_ALPHA_TARGET", "PRUNE", "WAIT", "elsewhere")
#: What is kept of each training episode (its ``episode`` event).
EPISODE_KEYS = ("update", "env", "grown", "final_val_acc", "final_test_acc", "params_added", "return",
                "n_fossilized", "n_pruned", "op_counts")  # fmt: skip


def fossil_counts(events: Path, updates: tuple[int, int] = LATE_UPDATES) -> dict[str, int] | None:
    """Seeds fossilized by the controller (``fossilized``) and kept by the holding deadline
    (``timeout_fossilized``) in training updates ``updates`` (inclusive); None without the file."""
    if not events.is_file():
        return None
    counts = {"fossilized": 0, "timeout_fossilized": 0}
    first, last = updates
    for e in read_events(events, "lifecycle"):
        if e.get("kind") in counts and first <= e.get("update", 0) <= last:
            counts[e["kind"]] += 1
    return counts


def holding_credit(
    path: str | Path, from_update: int = 1, min_contribution: float = 1.0
) -> list[dict[str, Any]]:
    """One row per (step, slot) of the training episodes of updates ``from_update..`` where the slot's
    seed was HOLDING before the step (the previous epoch's post-step stage) and its contribution measured
    at that step was at least ``min_contribution``: ``{"update", "epoch", "env", "slot", "choice",
    "return_to_go"}``. ``choice`` is the op taken on that slot (one of :data:`CREDIT_CHOICES`),
    ``WAIT``, or ``elsewhere`` (an op on another slot); ``return_to_go`` is the sum of the env's rewards
    from that step to the episode's end. Reads the ``epoch`` events' per-env ``op``, ``slot``,
    ``reward``, ``stage``, ``contribution`` and ``slot_names``."""
    episodes: dict[int, list[dict[str, Any]]] = defaultdict(list)
    with open(path) as f:
        for e in (json.loads(line) for line in f if line.strip()):
            if e["event"] == "epoch" and e["update"] >= from_update:
                episodes[e["update"]].append(e)
    rows = []
    for update, evs in sorted(episodes.items()):
        evs.sort(key=lambda e: e["epoch"])
        for env in range(len(evs[0]["reward"])):
            rtg = np.cumsum([ev["reward"][env] for ev in evs][::-1])[::-1]
            for t in range(1, len(evs)):
                ev, before = evs[t], evs[t - 1]["stage"][env]
                for s, stage in enumerate(before):
                    c = ev["contribution"][env][s]
                    if stage != "HOLDING" or c is None or c < min_contribution:
                        continue
                    op, on = ev["op"][env], ev["slot"][env] == ev["slot_names"][s]
                    choice = "WAIT" if op == "WAIT" else (op if on else "elsewhere")
                    rows.append({"update": update, "epoch": ev["epoch"], "env": env,
                                 "slot": ev["slot_names"][s], "choice": choice,
                                 "return_to_go": float(rtg[t])})  # fmt: skip
    return rows


def credit_contrast(rows: list[dict[str, Any]], choice: str, against: str = "WAIT") -> dict[str, Any]:
    """``choice`` against ``against`` among :func:`holding_credit` rows of one run: per epoch where both
    were chosen, the difference of their mean returns-to-go, averaged with weight ``min(n_choice,
    n_against)``, as ``{"difference", "weight", "epochs"}`` (``difference`` None where no epoch holds
    both), and ``spread``, the median over epochs with at least 6 rows of the returns' standard
    deviation (None where none has)."""
    by_epoch: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by_epoch[r["epoch"]][r["choice"]].append(r["return_to_go"])
    num = weight = epochs = 0
    for d in by_epoch.values():
        if d.get(choice) and d.get(against):
            n = min(len(d[choice]), len(d[against]))
            num, weight, epochs = num + n * (np.mean(d[choice]) - np.mean(d[against])), weight + n, epochs + 1
    pooled = [[x for v in d.values() for x in v] for d in by_epoch.values()]
    sds = [np.std(v) for v in pooled if len(v) >= 6]
    return {"difference": float(num / weight) if weight else None, "weight": weight, "epochs": epochs,
            "spread": float(np.median(sds)) if sds else None}  # fmt: skip


def credit(events: Path, first: int = CREDIT_FROM) -> dict[str, Any] | None:
    """The credit reading of a run's training events from update ``first`` (``bench.diagnose --credit-from``):
    the choices made on a paying HOLDING seed, counted (``counts``), and FOSSILIZE against WAIT in
    return-to-go (``contrast``); None without the file."""
    if not events.is_file():
        return None
    rows = holding_credit(events, first)
    return {"from_update": first, "counts": {c: sum(r["choice"] == c for r in rows) for c in CREDIT_CHOICES},
            "contrast": credit_contrast(rows, "FOSSILIZE")}  # fmt: skip


def train_episodes(events: Path) -> list[dict[str, Any]] | None:
    """Each training episode's outcome (:data:`EPISODE_KEYS` of its ``episode`` event): what the
    controller grew on its training hosts, update by update, for readings made after the run directory
    is gone; None without the file."""
    if not events.is_file():
        return None
    return [{key: e.get(key) for key in EPISODE_KEYS} for e in read_events(events, "episode")]


__all__ = [
    "CREDIT_CHOICES", "CREDIT_FROM", "EPISODE_KEYS", "LATE_UPDATES", "credit", "credit_contrast",
    "fossil_counts", "holding_credit", "train_episodes",
]  # fmt: skip
