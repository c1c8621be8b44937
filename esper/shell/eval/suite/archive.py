"""Finished (task, seed) evaluations kept as small files (to commit, where the archive is a folder of the
repository): what ``python -m esper.shell.suite.confirm`` keeps of each controller run it trains, and
``python -m esper.shell.suite --controller-from`` joins to the baselines.

A confirmation's run directories live outside the repository and do not outlive the machine, so once a
seed is evaluated its evaluation (the table's and the diagnosis rows, merged as
:func:`esper.shell.eval.suite.pooling.pool_task` reads them) is written to ``ARCHIVE/TASK/seedK.json.gz``
with what pooling would otherwise read from the run directory (the training revision, the training time)
and the run's settings. :func:`load_seed` returns it when it was made alike (the same hosts, episodes and
draw). (The suite itself keeps no such archive: its stages go on from their run directories, on storage
every worker of its cluster shares: :mod:`esper.shell.suite.engine`.)
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from esper.shell.telemetry.events import read_events


def seed_path(archive: Path, task: str, k: int) -> Path:
    """The file of training seed ``k`` of ``task`` in ``archive``."""
    return archive / task / f"seed{k}.json.gz"


def save_seed(archive: Path, task: str, k: int, results: dict[str, Any], train_seconds: float) -> Path:
    """Keep seed ``k``'s merged evaluation ``results`` (``meta.run_dir`` as evaluate wrote it). The
    training revision is read from the run directory's ``provenance.json`` now, while it exists, into
    ``meta.train_git_rev``, with the machine it trained on into ``meta.train_machine``; ``meta.train_seconds``
    is the training's wall time."""
    meta = dict(results["meta"])
    if (rev := train_revision(meta)) is not None:
        meta["train_git_rev"] = rev
    if (where := train_machine(meta)) is not None:
        meta["train_machine"] = where
    meta["train_seconds"] = float(train_seconds)
    path = seed_path(archive, task, k)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    # mtime 0: the same results give the same bytes, so a re-save leaves git with nothing to commit
    with gzip.GzipFile(tmp, "wb", mtime=0) as f:
        f.write(json.dumps({**results, "meta": meta}).encode())  # order kept: it means something
    tmp.replace(path)  # whole or not at all
    return path


def _provenance(meta: dict[str, Any]) -> dict[str, Any]:
    """The run directory's ``provenance.json`` named by an evaluation's ``meta`` (empty where it is gone)."""
    prov = Path(meta["run_dir"]) / "provenance.json" if meta.get("run_dir") else None
    return json.loads(prov.read_text()) if prov is not None and prov.exists() else {}


def train_machine(meta: dict[str, Any]) -> str | None:
    """The machine that trained a seed (:func:`esper.shell.common.revision.machine`), from its evaluation's
    ``meta``: the kept ``train_machine``, else the run directory's ``provenance.json`` (None where neither
    has it: runs before 2026-12-03 did not record it)."""
    return meta.get("train_machine") or _provenance(meta).get("machine")


def train_revision(meta: dict[str, Any]) -> str | None:
    """The git revision that trained a seed, from its evaluation's ``meta``: the kept ``train_git_rev``
    (an archived seed's), else the run directory's ``provenance.json`` (None where neither has it)."""
    return meta.get("train_git_rev") or _provenance(meta).get("git_rev")


def load_seed(archive: Path, task: str, k: int, episodes: int,
              data_seed: int | None) -> dict[str, Any] | None:  # fmt: skip
    """Seed ``k``'s kept results if ``archive`` holds them for the same evaluation (``episodes`` fresh
    hosts of evaluation seed ``1000 + k``, on data seed ``data_seed``; None: a fixed dataset's test split),
    else None."""
    path = seed_path(archive, task, k)
    if not path.exists():
        return None
    with gzip.open(path, "rb") as f:
        results = json.loads(f.read())
    return results if same_evaluation(results.get("meta", {}), k, episodes, data_seed) else None


def same_evaluation(meta: dict[str, Any], k: int, episodes: int, data_seed: int | None) -> bool:
    """Whether an evaluation's ``meta`` is the suite's evaluation of training seed ``k``: ``episodes``
    fresh hosts of evaluation seed ``1000 + k``, on data seed ``data_seed`` (None: a fixed dataset's test
    split, which has no seed to check)."""
    same_data = data_seed is None or meta.get("data_seed") == data_seed
    return same_data and (meta.get("episodes"), meta.get("eval_seed")) == (episodes, 1000 + k)


def run_end(run_dir: Path) -> dict[str, Any] | None:
    """The last ``run_end`` event of the run in ``run_dir`` that was not interrupted (None: none yet)."""
    events = run_dir / "events.jsonl"
    ends = [e for e in read_events(events, "run_end") if not e.get("interrupted")] if events.exists() else []
    return ends[-1] if ends else None


def trained(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` finished its training (a ``run_end`` not interrupted, a checkpoint)."""
    return (run_dir / "checkpoint.pt").exists() and run_end(run_dir) is not None


def baselines_only(run_dir: Path) -> bool:
    """Whether ``run_dir`` is a run directory of baselines only (``python -m esper.shell.suite
    --controller-from`` writes the kept run's settings there and trains nothing): settings, no checkpoint
    and no events (a training logs its ``run_start`` as it begins, before it saves anything)."""
    return (run_dir / "config.json").is_file() and not any(
        (run_dir / name).exists() for name in ("checkpoint.pt", "events.jsonl")
    )


__all__ = ["baselines_only", "load_seed", "run_end", "same_evaluation", "save_seed", "seed_path",
           "train_machine", "train_revision", "trained"]  # fmt: skip
