"""Finished (task, seed) evaluations kept as small files (to commit, where the archive is a folder of the
repository), so that a suite run spanning several machines or sessions resumes from what the archive
holds, not from a run directory that is gone.

A suite run's (task, seed) costs 40 minutes to two hours on the 2-core VM and the whole suite about 12
hours, longer than one session; the run directories (checkpoints, search caches) live outside the
repository and do not outlive the machine. So once a seed is evaluated, its evaluation (the table's,
the diagnosis rows and the plan within the cap, merged as
:func:`esper.shell.eval.suite.pooling.pool_task` reads them) is written to
``ARCHIVE/TASK/seedK.json.gz`` with what pooling would otherwise read from the run directory (the
training revision, the training time). :func:`load_seed` returns it when it was made alike (the same
hosts, episodes and draw), and the suite then neither trains nor evaluates that seed.

A seed still in progress when its machine goes is kept too, from the point where it is trained
(:func:`carry`): ``ARCHIVE/TASK/seedK.partial/`` holds what the rest of its evaluation reads from the run
directory, with the checkpoint slimmed to what evaluation loads (the policy's weights and observation
statistics; the optimizer's state and the replay buffer, which only a resumed training needs, are left
out), plus the searches and evaluations already cached. A run directory of baselines only (``python -m
esper.shell.suite --controller-from``: the kept run's settings and no checkpoint) is kept from its first
cached search or evaluation, without a checkpoint. :func:`restore` puts it back into a run directory, and
the suite goes on from there. A partial state is removed once its seed is kept whole.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

from esper.shell.common.checkpoint import load_checkpoint, save_checkpoint
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
    shutil.rmtree(partial_path(archive, task, k), ignore_errors=True)  # kept whole: the partial is done
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


def partial_path(archive: Path, task: str, k: int) -> Path:
    """The folder of training seed ``k``'s state in progress (:func:`carry`)."""
    return archive / task / f"seed{k}.partial"


#: What of a run directory the rest of a seed's evaluation reads, besides its checkpoint and caches.
RUN_FILES = ("config.json", "provenance.json")
#: Checkpoint entries evaluation does not load (only a resumed training needs them).
TRAINING_ONLY = ("learner",)


def run_end(run_dir: Path) -> dict[str, Any] | None:
    """The last ``run_end`` event of the run in ``run_dir`` that was not interrupted (None: none yet)."""
    events = run_dir / "events.jsonl"
    ends = [e for e in read_events(events, "run_end") if not e.get("interrupted")] if events.exists() else []
    return ends[-1] if ends else None


def trained(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` finished its training (a ``run_end`` not interrupted, a checkpoint)."""
    return (run_dir / "checkpoint.pt").exists() and run_end(run_dir) is not None


def carry(archive: Path, task: str, k: int, run_dir: Path, evaluations: tuple[str, ...]) -> Path | None:
    """Keep seed ``k``'s state in progress in ``archive`` (the folder; None where the seed is kept whole
    already, or its run directory has nothing to carry: a run not trained, baselines not started): the
    run's :data:`RUN_FILES`, every cached search and the searches' episodes (``search*/``), the
    ``results.json`` of each of ``evaluations`` (folder names) that is written; for a trained run also its
    ``run_end`` event and the checkpoint without :data:`TRAINING_ONLY` (:func:`baselines_only` runs have
    neither)."""
    if seed_path(archive, task, k).exists():
        return None
    caches = sorted([*run_dir.glob("search*/*.json"), *run_dir.glob("search*/*.jsonl")])
    written = [name for name in evaluations if (run_dir / name / "results.json").exists()]
    is_trained = trained(run_dir)
    if not is_trained and not (baselines_only(run_dir) and (caches or written)):
        return None
    dest = partial_path(archive, task, k)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in RUN_FILES:
        if (run_dir / name).exists():
            shutil.copy2(run_dir / name, tmp / name)
    if is_trained:
        (tmp / "events.jsonl").write_text(json.dumps(run_end(run_dir)) + "\n")
        ck = load_checkpoint(run_dir / "checkpoint.pt")
        ck.pop("version", None)
        for key in TRAINING_ONLY:
            ck.pop(key, None)
        save_checkpoint(tmp / "checkpoint.pt", ck)
    for cache in caches:
        (tmp / cache.parent.name).mkdir(exist_ok=True)
        shutil.copy2(cache, tmp / cache.parent.name / cache.name)
    for name in written:
        (tmp / name).mkdir()
        shutil.copy2(run_dir / name / "results.json", tmp / name / "results.json")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def baselines_only(run_dir: Path) -> bool:
    """Whether ``run_dir`` is a run directory of baselines only (``python -m esper.shell.suite
    --controller-from`` writes the kept run's settings there and trains nothing): settings, no checkpoint
    and no events (a training logs its ``run_start`` as it begins, before it saves anything)."""
    return (run_dir / "config.json").is_file() and not any(
        (run_dir / name).exists() for name in ("checkpoint.pt", "events.jsonl")
    )


def restore(archive: Path, task: str, k: int, run_dir: Path) -> bool:
    """Put seed ``k``'s kept state in progress into ``run_dir`` where that has no checkpoint of its own
    (an empty or missing directory, or a training that never saved), or, for baselines only (a state kept
    without a checkpoint), no settings of its own; whether it did."""
    src = partial_path(archive, task, k)
    if not src.is_dir() or (run_dir / "checkpoint.pt").exists():
        return False
    if not (src / "checkpoint.pt").exists() and (run_dir / "config.json").exists():
        return False  # baselines only, and this run directory is the live one
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, run_dir, dirs_exist_ok=True)
    return True


__all__ = ["RUN_FILES", "TRAINING_ONLY", "baselines_only", "carry", "load_seed", "partial_path", "restore",
           "run_end", "same_evaluation", "save_seed", "seed_path", "train_machine", "train_revision",
           "trained"]  # fmt: skip
