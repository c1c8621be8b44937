"""The run's event log: written line by line, read back, rewound to a checkpoint, grouped by kind.

**Event log.** :class:`EventLog` writes one JSON object per line, ``{"event": kind, "t": seconds
since the log opened, **fields}``, flushed line by line (a crash loses at most the line being
written; :func:`read_events` skips a truncated last line and says so, and appending after one first
moves it aside). Values are made JSON-safe by :func:`jsonable`: tensors and numpy values become
numbers or lists, NaN/±Inf become ``null``, enums their name, dataclasses dicts.

**Schema** (what the trainer emits and :mod:`esper.shell.telemetry.report` reads; lists marked [env] have one
entry per env, [env][slot] one per env and slot, in ``slot_names`` order):

``run_start``
    ``config`` (nested dict), ``versions`` (dict: python, torch, tensordict, ...), ``git_rev``
    (str or null), ``device`` (str); the report also accepts the last three inside one
    ``provenance`` dict. ``esper.shell.run`` also writes ``slots`` and ``blueprints`` (the names of the
    host's slots and of its blueprint catalogue, in the slot and blueprint heads' order, of
    ``env.task``'s host).
``epoch``
    ``update``, ``epoch``; [env]: ``val_acc``, ``val_loss``, ``train_loss``, ``reward``, ``op``,
    ``slot``, ``blueprint`` (names of the action taken), ``hacking`` and ``ransomware`` (bool: the
    step's reward raised the flag); [env][slot]: ``stage`` (Stage names), ``alpha`` (after the
    action), ``contribution`` (points of validation accuracy the seed was worth when measured) and
    ``grad_ratio`` (its measured seed/host gradient ratio), and its gradient health from the epoch's last
    training batch (:func:`esper.core.health.seed_grad_health`): ``seed_grad_norm`` (L2 norm of the seed's
    gradients), ``seed_grad_vanishing`` and ``seed_grad_exploding`` (the share of its parameter tensors
    whose gradient norm is under 1e-7, over 100) and ``seed_grad_health`` (``1 - 0.5 vanishing - 0.8
    exploding``, 0 for a non-finite norm), null where the slot held no seed;
    ``slot_names`` (list of str); ``timings`` (dict of seconds by phase).
``episode``
    ``update``, ``env``, ``host_seed`` (the seed the env's host was built from), ``return``,
    ``final_val_acc``, ``best_val_acc``, ``final_test_acc`` and ``final_test_loss`` (the final host on
    the test split, read only here, never by the controller), ``host_params`` (the final host's
    parameters, fossilized seeds included), ``params_added`` (minus the static host's), ``objective``
    (the OBJECTIVE reward's value of the final host on validation data), ``n_fossilized``,
    ``n_pruned``, ``reward_components`` (dict name → episode sum), ``op_counts`` (dict op → count),
    ``grown`` (the seeds blended into the final host, ``b0=conv_heavy+b2=depthwise``; ``""``: none),
    ``germinated_at`` (the epoch of each germination, in order), ``germinations`` (each one's
    ``epoch``, ``slot``, ``blueprint``, ``style``, ``tempo``, ``alpha_target``), ``reward_flags``
    (dict flag → steps whose reward raised it: ``hacking``, ``ransomware``).
``lifecycle``
    ``update``, ``epoch``, ``env``, ``slot`` (index or name), ``kind`` (what happened, e.g.
    germinated, advanced, fossilized, prune_started, removed, timeout_pruned, timeout_fossilized),
    ``blueprint``,
    ``stage`` (the stage after the event); ``germinated`` and ``alpha_set`` also ``style`` and
    ``alpha_target`` (the blend the action chose), ``germinated`` also ``tempo``.
``ppo_update``
    ``update``, ``loss_objective``, ``loss_critic``, ``loss_entropy``, ``entropy``, ``kl_approx``,
    ``clip_fraction``, ``value_clip_fraction``, ``explained_variance``, ``max_ratio``, ``min_ratio``,
    ``entropy_coef``, ``lr``, ``epochs_run``, ``minibatch_steps``, ``replayed_envs`` (envs of earlier
    batches re-used, ``ppo.replay``), ``early_stopped``,
    ``nonfinite_steps`` and ``rolled_back`` (a non-finite step ended the update and undid it),
    ``grad_norm``, ``seconds``; per-head
    dicts ``head_entropy`` (normalized, in [0, 1]), ``head_kl``, ``head_clip_fraction``,
    ``head_weight`` (fraction of steps where the head mattered), ``head_choice_share`` (per head a list:
    the share of those steps on which the batch took each choice), ``head_grad_norm`` (by parameter
    group: trunk, each head, value); the rollout's LSTM states (after each episode's first step):
    ``lstm_h_norm_mean``, ``lstm_h_norm_max``, ``lstm_c_norm_mean``, ``lstm_c_norm_max``,
    ``lstm_nonfinite``, ``lstm_too_small_frac``, ``lstm_too_large_frac``, ``lstm_h_saturated_frac``,
    ``lstm_c_saturated_frac`` (:func:`esper.core.health.lstm_health`); the advantages before they are
    normalized: ``adv_mean``, ``adv_std``, ``adv_max_abs``, ``adv_pos_frac``. With a learner option on
    (docs/controller.md, "Learner options"): ``value_coef`` (``ppo.value_coef_adapt``: the mean
    adaptive value coefficient of the update's steps) and ``loss_entropy_floor``
    (``ppo.entropy_floor``: the entropy floor's hinge term).
``ppo_detail``
    for a few updates after an anomaly (``anomaly.escalate_updates``): ``update``, ``steps`` (dict
    metric → one value per minibatch step, nested names joined with ``/``), ``envs`` (dict → one value
    per env of the new rollout: ``return``, ``value_mean``, ``adv_mean``, ``adv_max_abs``).
``anomaly``
    ``update``, ``kind`` (see :class:`~esper.shell.telemetry.anomaly.AnomalyDetector`: an update's
    ``nonfinite``, ``rolled_back``, ``ratio_explosion``, ``ratio_collapse``, ``entropy_collapse``,
    ``kl_spike``, ``value_collapse``, ``grad_drift``, ``lstm_saturation``, ``lstm_norm``; an update's
    episodes' ``reward_hacking``, ``ransomware``), ``value``, ``threshold``, ``detail``, ``severity``
    (``alarm``).
``note``
    what the detector reports but is no fault, with the fields of an ``anomaly`` (``severity`` ``note``):
    ``prior_commitment``, a head whose entropy collapsed onto the choice its start bias favours.
``governor``
    ``update``, ``epoch``, ``env``, ``reason`` (nonfinite, lobotomy, spike).
``checkpoint``
    ``update``, ``path``.
``compile``
    after an update during which ``torch.compile`` compiled graphs (``--compile``: the first update's,
    then each recompile: a new batch size while ``ppo.replay`` fills, another task's host shape):
    ``update``, ``graphs`` (compiled by the run so far), ``new`` (by this update). Every compile is
    ``fullgraph=True``, so a graph break or a function past ``recompile_limit`` raises instead of
    falling back to eager.
``profile``
    with ``--profile N``, once the N-th update is done (or the run, if sooner): ``update``, ``updates``
    (profiled), ``trace`` and ``table`` (paths in the run directory), ``sort_by`` and ``top`` (the operators
    that took most time by themselves: ``name``, ``calls``, ``self_ms``, ``total_ms``;
    :mod:`esper.shell.telemetry.profiling`).
``log_rewound``
    ``update`` (the checkpoint a resumed run starts from), ``discarded`` (event lines of later updates
    and torn lines moved to ``events.discarded.jsonl``), ``path``.
``heldout_check``
    after the last update when ``eval_episodes`` > 0: ``episodes``, ``controller``, ``test_acc`` and
    ``static_test_acc`` (mean final test accuracy on the same fresh hosts), ``params_added``,
    ``gain`` and ``gain_ci95`` (paired difference, points), all of the controller sampled as trained;
    for ``ppo`` also ``greedy_test_acc``, ``greedy_params_added``, ``greedy_gain`` and
    ``greedy_gain_ci95``, the same of its most likely actions (``ppo_greedy``).
``run_end``
    ``interrupted``, ``updates``; ``summary`` (dict) after a finished run, ``status`` (exit status)
    and ``reason`` after an interrupted or stopped one.

Other kinds (``timings``, ``heuristic``, ...) may be written; readers ignore kinds they do not know.

**Reading.** :func:`scan_events` and :func:`read_events` read a log back; :class:`RunEvents` groups
its events by kind, each update counted once (what the run report reads).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import time
import warnings
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch


# ------------------------------------------------------------------------------------------ event log
def jsonable(value: Any) -> Any:
    """``value`` as JSON-safe Python data: NaN/±Inf → None, tensors/numpy → numbers or lists, enums →
    names, dataclasses → dicts, mapping keys → str. Anything else unknown is written as ``str(value)``
    (telemetry must never stop a run)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return jsonable(value.item() if value.dim() == 0 else value.tolist())
    if isinstance(value, (np.ndarray, np.generic)):
        return jsonable(value.tolist())
    if isinstance(value, Mapping):
        return {_key(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def _key(k: Any) -> str:
    return k.name if isinstance(k, enum.Enum) else str(k)


class EventLog:
    """Append-only JSONL event log; use as a context manager or call :meth:`close`.

    Args:
        path: the file; parent directories are created.
        append: keep existing events (a resumed run) instead of truncating the file. A torn last line
            (the process died mid-write: no final newline) is first moved to :func:`discarded_path`,
            so the first new event starts on a fresh line; :attr:`repaired` holds what was moved.
    """

    def __init__(self, path: str | os.PathLike, *, append: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.repaired: str | None = _cut_torn_tail(self.path) if append else None
        self._file: IO[str] | None = open(self.path, "a" if append else "w", encoding="utf-8")
        self._t0 = time.monotonic()

    def write(self, event: str, /, **fields: Any) -> dict[str, Any]:
        """Write one event (``event`` is its kind, e.g. ``"epoch"``; positional, so a field may be
        called ``kind``) and flush it; returns the JSON-safe record written."""
        if self._file is None:
            raise ValueError(f"EventLog {self.path} is closed")
        if not (isinstance(event, str) and event):
            raise ValueError(f"event kind must be a non-empty string, got {event!r}")
        for reserved in ("event", "t"):
            if reserved in fields:
                raise ValueError(f"event field {reserved!r} is reserved (the kind and the time)")
        record = {"event": event, "t": round(time.monotonic() - self._t0, 6), **jsonable(fields)}
        self._file.write(json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n")
        self._file.flush()
        return record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    @property
    def closed(self) -> bool:
        return self._file is None

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def discarded_path(path: str | os.PathLike) -> Path:
    """Where lines taken out of the log ``path`` go: ``events.jsonl`` -> ``events.discarded.jsonl``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.discarded{path.suffix}")


def _cut_torn_tail(path: Path) -> str | None:
    """Move an unterminated last line of ``path`` to :func:`discarded_path`; returns it (or None)."""
    if not path.is_file() or path.stat().st_size == 0:
        return None
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return None
        keep, pos = 0, size
        while pos > 0:  # the start of the last line, reading backwards in 64 KiB chunks
            start = max(0, pos - (1 << 16))
            f.seek(start)
            newline = f.read(pos - start).rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            pos = start
        f.seek(keep)
        tail = f.read()
        _append_lines(discarded_path(path), [tail])
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return tail.decode("utf-8", errors="replace")


def _append_lines(path: Path, lines: Sequence[bytes]) -> None:
    with open(path, "ab") as f:
        for line in lines:
            f.write(line if line.endswith(b"\n") else line + b"\n")
        f.flush()
        os.fsync(f.fileno())


def rewind_events(path: str | os.PathLike, update: int) -> int:
    """Make the log ``path`` end at the checkpoint of ``update`` before a resumed run appends to it.

    Moves to :func:`discarded_path` every event of a later update (logged by a run that died before
    that update's checkpoint: the resumed run logs the update again) and every unreadable line (a torn
    tail), keeping the order of the rest; the log is rewritten atomically. Returns the number of lines
    moved (0: the file is left untouched)."""
    path = Path(path)
    if not path.is_file():
        return 0
    keep, moved = [], []
    for line in path.read_bytes().splitlines(keepends=True):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
            ok = isinstance(event, dict) and "event" in event
            ok = ok and not (isinstance(event.get("update"), int) and event["update"] > update)
        except (json.JSONDecodeError, UnicodeDecodeError):
            ok = False
        (keep if ok else moved).append(line)
    if not moved:
        return 0
    _append_lines(discarded_path(path), moved)
    tmp = path.with_name(f".{path.name}.rewind.tmp")
    with open(tmp, "wb") as f:
        f.writelines(line if line.endswith(b"\n") else line + b"\n" for line in keep)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(moved)


def scan_events(path: str | os.PathLike, kind: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """The events of a JSONL log (only those of ``kind`` if given) and its torn last line, if any (a
    crash while writing: it is skipped). A malformed line elsewhere raises ``ValueError`` with its
    number."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    events, torn = [], None
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) - 1 and not text.endswith("\n"):
                torn = line
                break
            raise ValueError(f"{path}:{i + 1}: malformed event line: {e}") from None
        if not isinstance(event, dict) or "event" not in event:
            raise ValueError(f"{path}:{i + 1}: not an event object")
        if kind is None or event["event"] == kind:
            events.append(event)
    return events, torn


def read_events(path: str | os.PathLike, kind: str | None = None) -> list[dict[str, Any]]:
    """The events of :func:`scan_events`; a torn last line is skipped with a warning that says so."""
    events, torn = scan_events(path, kind)
    if torn is not None:
        warnings.warn(f"{path}: skipped a torn last line ({len(torn)} characters)", stacklevel=2)
    return events


# ------------------------------------------------------------------------------------------- reading
class RunEvents:
    """The events of one log, grouped by kind."""

    def __init__(self, events: list[dict[str, Any]], torn: str | None = None) -> None:
        by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for e in events:
            by_kind[e["event"]].append(e)
        self.start = by_kind["run_start"][-1] if by_kind["run_start"] else None
        self.end = by_kind["run_end"][-1] if by_kind["run_end"] else None
        # An update logged twice (a log written before resumes rewound it) counts once: its last copy.
        self.episodes = _last_of(by_kind["episode"], ("update", "env"))
        self.ppo = sorted(_last_of(by_kind["ppo_update"], ("update",)), key=lambda e: e["update"])
        logged = len(by_kind["episode"]) + len(by_kind["ppo_update"])
        self.duplicates = logged - len(self.episodes) - len(self.ppo)
        self.rewound = sum(int(e.get("discarded", 0)) for e in by_kind["log_rewound"])
        self.torn = torn
        self.epochs = by_kind["epoch"]
        self.lifecycle = by_kind["lifecycle"]
        self.anomalies = by_kind["anomaly"]
        self.notes = by_kind["note"]
        self.governor = by_kind["governor"]
        self.checkpoints = by_kind["checkpoint"]
        self.heldout = by_kind["heldout_check"][-1] if by_kind["heldout_check"] else None
        self.profile = by_kind["profile"][-1] if by_kind["profile"] else None

    def per_update(self, field: str) -> dict[int, list[float]]:
        """``{update: [field of each episode]}`` (finite values only), updates in order."""
        out: dict[int, list[float]] = defaultdict(list)
        for e in self.episodes:
            v = e.get(field)
            if finite_number(v):
                out[e["update"]].append(float(v))
        return dict(sorted(out.items()))

    def updates(self) -> list[int]:
        seen = {e["update"] for e in self.episodes} | {e["update"] for e in self.ppo}
        return sorted(seen)


def _last_of(events: list[dict[str, Any]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """``events`` with one event per value of ``keys`` (the last one), in the order of those."""
    last = {tuple(e.get(k) for k in keys): e for e in events}
    return list(last.values())


def finite_number(v: Any) -> bool:
    """``v`` is a finite int or float (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


__all__ = [
    "EventLog",
    "RunEvents",
    "discarded_path",
    "finite_number",
    "jsonable",
    "read_events",
    "rewind_events",
    "scan_events",
]
