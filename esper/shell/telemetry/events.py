"""Telemetry: a JSONL event log, the PPO anomaly detector, a progress bar and a summary table.

**Event log.** :class:`EventLog` writes one JSON object per line, ``{"event": kind, "t": seconds
since the log opened, **fields}``, flushed line by line (a crash loses at most the line being
written; :func:`read_events` skips a truncated last line and says so, and appending after one first
moves it aside). Values are made JSON-safe by :func:`jsonable`: tensors and numpy values become
numbers or lists, NaN/±Inf become ``null``, enums their name, dataclasses dicts.

**Schema** (what the trainer emits and :mod:`esper.shell.report` reads; lists marked [env] have one
entry per env, [env][slot] one per env and slot, in ``slot_names`` order):

``run_start``
    ``config`` (nested dict), ``versions`` (dict: python, torch, tensordict, ...), ``git_rev``
    (str or null), ``device`` (str); the report also accepts the last three inside one
    ``provenance`` dict.
``epoch``
    ``update``, ``epoch``; [env]: ``val_acc``, ``val_loss``, ``train_loss``, ``reward``, ``op``,
    ``slot``, ``blueprint`` (names of the action taken); [env][slot]: ``stage`` (Stage names),
    ``alpha``; ``slot_names`` (list of str); ``timings`` (dict of seconds by phase).
``episode``
    ``update``, ``env``, ``host_seed`` (the seed the env's host was built from), ``return``,
    ``final_val_acc``, ``best_val_acc``, ``final_test_acc`` and ``final_test_loss`` (the final host on
    the test split, read only here, never by the controller), ``host_params`` (the final host's
    parameters, fossilized seeds included), ``params_added`` (minus the static host's), ``objective``
    (the OBJECTIVE reward's value of the final host on validation data), ``n_fossilized``,
    ``n_pruned``, ``reward_components`` (dict name → episode sum), ``op_counts`` (dict op → count),
    ``grown`` (the seeds blended into the final host, ``b0=conv_heavy+b2=depthwise``; ``""``: none),
    ``germinated_at`` (the epoch of each germination, in order), ``germinations`` (each one's
    ``epoch``, ``slot``, ``blueprint``, ``style``, ``tempo``, ``alpha_target``).
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
    ``head_weight`` (fraction of steps where the head mattered), ``head_grad_norm`` (by parameter
    group: trunk, each head, value).
``anomaly``
    ``update``, ``kind`` (see :class:`AnomalyDetector`; other detectors such as reward-hacking
    checks use their own kind), ``value``, ``threshold``, ``detail``.
``governor``
    ``update``, ``epoch``, ``env``, ``reason`` (nonfinite, lobotomy, spike).
``checkpoint``
    ``update``, ``path``.
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

**Anomalies.** :class:`AnomalyDetector` checks the metrics of one ``ppo_update`` against
:class:`AnomalyConfig` (every threshold configurable, finding M21): ratio explosion / collapse,
entropy collapse of a head that mattered (H1), KL spikes against a running EMA or the KL target (H2),
value collapse (explained variance), NaN/Inf anywhere, and an update the trainer rolled back
(``rolled_back``: a non-finite loss, gradient or parameter).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from tqdm import tqdm

from esper.shell.config.fields import check_fields, doc

#: The event kinds of the schema above, in the order a run emits them.
EVENT_KINDS = (
    "run_start",
    "epoch",
    "episode",
    "lifecycle",
    "ppo_update",
    "anomaly",
    "governor",
    "checkpoint",
    "run_end",
)


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


# ---------------------------------------------------------------------------------------- anomalies
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


# ----------------------------------------------------------------------------------- console output
def progress(total: int | None, desc: str, enabled: bool = True):
    """A tqdm progress bar on stderr (a no-op bar when not ``enabled``); use as a context manager and
    call ``.update(n)`` / ``.set_postfix(...)``."""
    return tqdm(total=total, desc=desc, disable=not enabled, file=sys.stderr, dynamic_ncols=True)


def summary_table(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *, float_fmt: str = ".4g"
) -> str:
    """Plain-text table of ``rows`` restricted to ``columns``: numbers right-aligned (floats with
    ``float_fmt``), text left-aligned, a missing value shown as ``-``."""

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return format(v, float_fmt) if math.isfinite(v) else str(v)
        if isinstance(v, enum.Enum):
            return v.name
        return str(v)

    body = [[cell(row[c]) if c in row else "-" for c in columns] for row in rows]
    numeric = [
        all(
            isinstance(row.get(c), (int, float)) and not isinstance(row.get(c), bool)
            for row in rows
            if c in row
        )
        and any(c in row for row in rows)
        for c in columns
    ]
    widths = [max([len(c)] + [len(r[i]) for r in body]) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        parts = [x.rjust(w) if num else x.ljust(w) for x, w, num in zip(cells, widths, numeric)]
        return "  ".join(parts).rstrip()

    out = [line(list(columns)), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in body)
    return "\n".join(out)


__all__ = [
    "EVENT_KINDS",
    "Anomaly",
    "AnomalyConfig",
    "AnomalyDetector",
    "EventLog",
    "discarded_path",
    "jsonable",
    "progress",
    "read_events",
    "rewind_events",
    "scan_events",
    "summary_table",
]
