"""Finished (task, seed) evaluations kept as small committed files, so that a suite run spanning several
machines or sessions resumes from what the repository holds, not from a run directory that is gone.

A suite run's (task, seed) costs 40 minutes to two hours on the 2-core VM and the whole suite about 12
hours, longer than one session; the run directories (checkpoints, search caches) live outside the
repository and do not outlive the machine. So once a seed is evaluated, its evaluation (the table's,
the diagnosis rows and the plan within the cap, merged as :func:`bench.suite.run.pool_task` reads them)
is written to ``ARCHIVE/TASK/seedK.json.gz`` with what pooling would otherwise read from the run
directory (the training revision, the training time). :func:`load_seed` returns it when it was made
alike (the same hosts, episodes and draw), and the suite then neither trains nor evaluates that seed.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

#: Where ``python -m bench.suite`` keeps finished seeds by default (committed with the results).
ARCHIVE = Path(__file__).resolve().parents[1] / "results" / "suite" / "seeds"


def seed_path(archive: Path, task: str, k: int) -> Path:
    """The file of training seed ``k`` of ``task`` in ``archive``."""
    return archive / task / f"seed{k}.json.gz"


def save_seed(archive: Path, task: str, k: int, results: dict[str, Any], train_seconds: float) -> Path:
    """Keep seed ``k``'s merged evaluation ``results`` (``meta.run_dir`` as evaluate wrote it). The
    training revision is read from the run directory's ``provenance.json`` now, while it exists, into
    ``meta.train_git_rev``; ``meta.train_seconds`` is the training's wall time."""
    meta = dict(results["meta"])
    prov = Path(meta["run_dir"]) / "provenance.json" if meta.get("run_dir") else None
    if prov is not None and prov.exists():
        meta["train_git_rev"] = json.loads(prov.read_text()).get("git_rev")
    meta["train_seconds"] = float(train_seconds)
    path = seed_path(archive, task, k)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    # mtime 0: the same results give the same bytes, so a re-save leaves git with nothing to commit
    with gzip.GzipFile(tmp, "wb", mtime=0) as f:
        f.write(json.dumps({**results, "meta": meta}).encode())  # order kept: it means something
    tmp.replace(path)  # whole or not at all
    return path


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
    meta = results.get("meta", {})
    same_data = data_seed is None or meta.get("data_seed") == data_seed
    same_hosts = (meta.get("episodes"), meta.get("eval_seed")) == (episodes, 1000 + k)
    return results if same_data and same_hosts else None


__all__ = ["ARCHIVE", "load_seed", "save_seed", "seed_path"]
