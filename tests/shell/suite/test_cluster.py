"""The suite on a real Dask cluster on one machine (issue 105).

A scheduler and two workers are started as the docs say (``dask scheduler`` and ``dask worker ADDRESS
--nthreads 1``, here ``python -m distributed.cli.dask_scheduler`` / ``dask_worker``, the same commands),
every one bound to 127.0.0.1 with no dashboard; the suite runs on them (``--scheduler FILE``) on a tiny
configuration of one task and seed (:data:`TINY`: every stage real, training, six searches and the
evaluation), and one worker is killed with SIGKILL while it trains, after the training's first
checkpoint. The table must equal the one the sequential path (``--workers 0``, this process) gives on the
same configuration: nothing lost, nothing counted twice, the killed training resumed from its checkpoint
on the other worker. The engine on a local cluster (``--workers N``: ``distributed.LocalCluster``) is
checked on small stages of this module, and its retry of a stage that raised.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

WHY = 'the cluster tests need distributed: pip install -e ".[cluster]"'
distributed = pytest.importorskip("distributed", reason=WHY)
psutil = pytest.importorskip("psutil", reason="distributed's dependency psutil finds a worker's training")

from esper.shell.suite.cli import main  # noqa: E402
from esper.shell.suite.engine import Engine, Stage  # noqa: E402
from esper.shell.telemetry.events import read_events  # noqa: E402

#: One task, one seed, two updates (a checkpoint after each): the tiniest configuration whose rows differ
#: (at fewer epochs or batches nothing grows and every row reads the same accuracy).
TINY = ["--tasks", "mnist1d", "--seeds", "1", "--episodes", "2", "--train-args",
        "--env.n_envs 2 --lifecycle.max_epochs 6 --updates 2 --env.train_batches 4 --env.val_batches 1 "
        "--eval_episodes 0 --report false"]  # fmt: skip
#: The servers' environment (one OpenMP thread, as the workers' stages).
QUIET = {**os.environ, "OMP_NUM_THREADS": "1"}
#: Where every server of these tests listens (port 0: any free one).
LOOPBACK = "127.0.0.1:0"


def listening(pids: list[int]) -> set[str]:
    """The addresses the processes ``pids`` listen on."""
    return {c.laddr.ip for pid in pids for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}  # fmt: skip


def _table(out: Path) -> dict:
    """A results folder's task entries, without what a wall clock, a folder's name or the checkout's
    revision decides (the revisions that trained and evaluated each seed: HEAD may move between the two
    runs while other work is committed)."""

    def strip(x):
        if isinstance(x, dict):
            keep = lambda k: "seconds" not in k and k not in ("run_dir", "machine", "revisions")
            return {k: strip(v) for k, v in x.items() if keep(k)}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    (saved,) = out.glob("*.json")
    return strip(json.loads(saved.read_text())["tasks"])


@pytest.fixture(scope="module")
def sequential(tmp_path_factory) -> dict:
    """The sequential path's table on :data:`TINY`."""
    root = tmp_path_factory.mktemp("sequential")
    assert main([*TINY, "--workers", "0", "--runs", str(root / "runs"), "--out", str(root / "out")]) == 0
    return _table(root / "out")


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *cmd], stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env=QUIET, cwd=log.parent)  # fmt: skip


def _kill_the_training_worker(workers: list[subprocess.Popen], run_dir: Path, got: dict) -> None:
    """Once the training wrote its first checkpoint, SIGKILL the worker whose child trains (recorded in
    ``got``: the worker's pid, the training's, the update it had checkpointed)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if (run_dir / "checkpoint.pt").exists():
            for w in workers:
                for child in psutil.Process(w.pid).children(recursive=True):
                    try:
                        cmd = child.cmdline()
                    except psutil.Error:
                        continue
                    if "esper.shell.run" in cmd:
                        os.kill(w.pid, signal.SIGKILL)
                        got.update(worker=w.pid, training=child.pid, ended=(run_dir / "summary.txt").exists())
                        return
        time.sleep(0.01)


@pytest.mark.e2e
def test_the_suite_on_a_loopback_cluster_with_a_worker_killed_gives_the_sequential_table(tmp_path, sequential):  # noqa: E501
    """``dask scheduler`` and two ``dask worker --nthreads 1`` on 127.0.0.1; one worker SIGKILLed while it
    trains: the suite finishes on the other with the sequential path's table."""
    file, runs, out = tmp_path / "scheduler.json", tmp_path / "runs", tmp_path / "out"
    # --no-dashboard still serves HTTP (health, metrics) on every interface: --dashboard-address keeps it in
    scheduler = _start(["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
                        "--no-dashboard", "--dashboard-address", LOOPBACK, "--scheduler-file", str(file)],
                       tmp_path / "scheduler.log")  # fmt: skip
    workers: list[subprocess.Popen] = []
    try:
        deadline = time.monotonic() + 60
        while not file.exists() or not file.read_text().strip():
            log = (tmp_path / "scheduler.log").read_text()
            assert time.monotonic() < deadline and scheduler.poll() is None, log
            time.sleep(0.1)
        address = json.loads(file.read_text())["address"]
        assert address.startswith("tcp://127.0.0.1:")
        for i in range(2):
            cmd = ["distributed.cli.dask_worker", address, "--nthreads", "1", "--host", "127.0.0.1",
                   "--no-dashboard", "--dashboard-address", LOOPBACK, "--no-nanny",
                   "--local-directory", str(tmp_path / f"w{i}")]  # fmt: skip
            workers.append(_start(cmd, tmp_path / f"worker{i}.log"))
        with distributed.Client(address) as client:
            client.wait_for_workers(2, timeout=60)
            bound = [w for w in client.scheduler_info()["workers"]]
        assert len(bound) == 2 and all(w.startswith("tcp://127.0.0.1:") for w in bound)
        assert listening([scheduler.pid, *(w.pid for w in workers)]) == {"127.0.0.1"}  # every server
        killed: dict = {}
        run_dir = runs / "mnist1d" / "seed0"
        killer = threading.Thread(target=_kill_the_training_worker, args=(workers, run_dir, killed))
        killer.start()
        assert main([*TINY, "--scheduler", str(file), "--runs", str(runs), "--out", str(out)]) == 0
        killer.join()
        # the kill landed mid-training: after its first checkpoint, before it ended
        assert killed and not killed["ended"], killed
        assert workers[[w.pid for w in workers].index(killed["worker"])].wait(timeout=10) == -signal.SIGKILL
        training = killed["training"]  # died with its worker
        assert not psutil.pid_exists(training) or psutil.Process(training).status() == psutil.STATUS_ZOMBIE
        # resumed from that checkpoint on the other worker: two processes, each update once
        events = read_events(run_dir / "events.jsonl")
        assert [e["event"] for e in events].count("run_start") == 2
        assert [e["update"] for e in events if e["event"] == "ppo_update"] == [1, 2]
        assert _table(out) == sequential  # nothing lost, nothing counted twice: the same table
        rows = sequential["mnist1d"]["controllers"]
        assert len({round(r["test_acc_mean"], 4) for r in rows.values()}) > 1  # a table that can differ
        assert all(len(r["per_seed_test_acc"]) == 1 for r in rows.values() if "per_seed_test_acc" in r)
    finally:
        for p in (*workers, scheduler):
            p.kill()
            p.wait()


def test_a_local_cluster_binds_loopback_runs_each_stage_on_one_thread_and_retries_a_failure(tmp_path):
    """``--workers 2``: a LocalCluster on 127.0.0.1 (scheduler and workers), each stage on one torch thread,
    a stage that raised run again, its result handed to the stage after it."""
    from tests.shell.suite.cluster_stages import flaky, where

    stages = [Stage(f"where {k}", where, (k,)) for k in range(4)]
    stages += [Stage("one", flaky, (str(tmp_path / "tried-one"), 1)),
               Stage("flaky", flaky, (str(tmp_path / "tried"), 10), ("one",))]  # fmt: skip
    got = Engine(workers=2, show_progress=False).run(stages)
    where = [got[f"where {k}"] for k in range(4)]
    assert all(w.startswith("tcp://127.0.0.1:") and s.startswith("tcp://127.0.0.1:") for w, s, _, _ in where)
    assert {t for _, _, t, _ in where} == {1}
    # the worker, its nanny and the scheduler (in this process) listen on the loopback alone
    assert set().union(*(ips for *_, ips in where)) == {"127.0.0.1"}
    assert got["one"] == 1 and got["flaky"] == 11  # each failed once and was run again
