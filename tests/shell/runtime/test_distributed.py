"""Many processes, one controller (``torchrun``): on the CPU with gloo and two processes, a run's
envs, episodes and PPO update are those of one process; a checkpoint of two processes resumes on one
and on four; a process that dies (rank 0 or another) makes the other stop with one line and an intact
checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from esper.shell.common.checkpoint import load_checkpoint
from esper.shell.common.distributed import SINGLE, Dist
from esper.shell.run import main

ROOT = Path(__file__).resolve().parents[3]
#: The smoke preset made smaller still: 4 envs x 3 epochs, one training and one validation batch.
#: Seed 42's minibatches (2 of 2 envs, 2 epochs): the first epoch's each lie in one process's slice
#: (the other process joins with a masked-out stand-in), the second epoch's straddle both.
TINY = ["--preset", "smoke", "--env.n_envs", "4", "--lifecycle.max_epochs", "3", "--env.train_batches", "1",
        "--env.val_batches", "1", "--threads", "1"]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def torchrun(n: int, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
           "-m", "esper.shell.run", *args, "--dist_timeout", "60"]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def policy(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir / "checkpoint.pt")["agent"]["policy"]


def assert_same_policy(a: Path, b: Path) -> None:
    pa, pb = policy(a), policy(b)
    assert pa.keys() == pb.keys()
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], atol=1e-5, rtol=0, msg=k)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """One update of the same run on one process and on two."""
    root = tmp_path_factory.mktemp("dist")
    assert main([*TINY, "--updates", "1", "--run_dir", str(root), "--name", "one"]) == 0
    torchrun(2, *TINY, "--updates", "1", "--run_dir", str(root), "--name", "two")
    return root


def test_two_processes_run_the_same_envs_and_update_as_one(runs):
    one, two = runs / "one", runs / "two"
    assert_same_policy(one, two)
    e1, e2 = events(one, "episode"), events(two, "episode")
    assert [e["env"] for e in e2] == [0, 1, 2, 3]  # every process's episodes, by global env index
    for key in ("return", "host_seed", "final_test_acc", "op_counts"):
        assert [e[key] for e in e1] == [e[key] for e in e2], key
    assert [e["op"] for e in events(one, "epoch")] == [e["op"] for e in events(two, "epoch")]
    u1, u2 = events(one, "ppo_update")[0], events(two, "ppo_update")[0]
    assert u1["minibatch_steps"] == u2["minibatch_steps"] == 4  # both kinds of minibatch ran
    for key in ("kl_approx", "loss_objective", "loss_critic", "explained_variance", "grad_norm"):
        assert u2[key] == pytest.approx(u1[key], rel=1e-4, abs=1e-6), key
    c1, c2 = (load_checkpoint(r / "checkpoint.pt") for r in (one, two))
    o1, o2 = c1["agent"]["obs_stats"], c2["agent"]["obs_stats"]
    r1, r2 = c1["learner"]["reward_stats"], c2["learner"]["reward_stats"]
    # merged over the processes: the whole batch's (the set policy's observation statistics are two
    # groups, global and slot, each with its mean, var and count)
    for stats in (o1["global"], o1["slot"], r1):
        assert set(stats) >= {"mean", "var", "count"}
    torch.testing.assert_close(o1, o2, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(r1, r2, rtol=1e-9, atol=1e-9)
    prov = json.loads((two / "provenance.json").read_text())
    assert prov["world_size"] == 2 and "gloo" in prov["backend"]
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())  # rank 0 wrote


def test_a_checkpoint_resumes_on_another_number_of_processes(runs, tmp_path):
    """Update 2 of the run, resumed from two processes' checkpoint on one and on four: the same
    policy and episodes."""
    for dst in ("two_on_1", "two_on_4"):
        shutil.copytree(runs / "two", tmp_path / dst)
    assert main(["--resume", str(tmp_path / "two_on_1"), "--updates", "2"]) == 0
    torchrun(4, "--resume", str(tmp_path / "two_on_4"), "--updates", "2")
    returns = []
    for name in ("two_on_1", "two_on_4"):
        assert load_checkpoint(tmp_path / name / "checkpoint.pt")["progress"]["update"] == 2
        returns.append([e["return"] for e in events(tmp_path / name, "episode") if e["update"] == 2])
        assert_same_policy(tmp_path / "two_on_1", tmp_path / name)
    assert returns[0] == returns[1] and len(returns[0]) == 4


def test_replay_on_two_processes_updates_as_on_one_and_resumes_on_one(tmp_path):
    """``--ppo.replay 1``: each process keeps its own envs' last rollout, and update 2 (the new rollout
    and the replayed one) is the one process's update; the checkpoint holds the kept rollout whole, so
    the two processes' run resumes on one process as the one process's run goes on."""
    args = [*TINY, "--ppo.replay", "1", "--updates", "2", "--run_dir", str(tmp_path)]
    assert main([*args, "--name", "one"]) == 0
    torchrun(2, *args, "--name", "two")
    one, two = tmp_path / "one", tmp_path / "two"
    assert [e["replayed_envs"] for e in events(two, "ppo_update")] == [0, 4]
    u1, u2 = events(one, "ppo_update")[1], events(two, "ppo_update")[1]
    for key in ("kl_approx", "loss_objective", "loss_critic", "grad_norm"):
        assert u2[key] == pytest.approx(u1[key], rel=1e-4), key
    assert_same_policy(one, two)
    kept = [load_checkpoint(r / "checkpoint.pt")["learner"]["replay"] for r in (one, two)]
    assert len(kept[0]) == len(kept[1]) == 1
    a, b = (TensorDict(k[0], batch_size=k[0]["is_init"].shape) for k in kept)
    assert a.batch_size[0] == b.batch_size[0] == 4  # every env, not rank 0's two
    for key in a.keys(True, True):
        torch.testing.assert_close(a[key], b[key], msg=str(key))
    for r in (one, two):
        assert main(["--resume", str(r), "--updates", "3"]) == 0
    assert_same_policy(one, two)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("dead", [1, 0])
def test_a_dead_process_stops_the_others_with_one_line_and_an_intact_checkpoint(tmp_path, dead):
    port = _free_port()
    args = [sys.executable, "-m", "esper.shell.run", *TINY, "--updates", "50", "--run_dir", str(tmp_path),
            "--name", "r", "--dist_timeout", "20"]  # fmt: skip
    procs = []
    for rank in range(2):
        env = {**_env(), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        procs.append(subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))  # fmt: skip
    ckpt = tmp_path / "r" / "checkpoint.pt"
    try:
        deadline = time.monotonic() + 180
        while not ckpt.exists():
            assert time.monotonic() < deadline and procs[0].poll() is None, "no first checkpoint"
            time.sleep(0.2)
        procs[dead].send_signal(signal.SIGKILL)
        survivor = procs[1 - dead]
        t0 = time.monotonic()
        _, err = survivor.communicate(timeout=90)
        waited = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert survivor.returncode == 3, err[-2000:]
    assert waited < 60  # noticed at the next gather or within --dist_timeout, never a hang
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("python -m esper.shell.run: error:")]
    assert errors == lines[-1:], err  # one line, the last (rank 0 also printed its start line)
    assert "stopped during update" in errors[0] and "another process stopped answering" in errors[0]
    assert f"--resume {tmp_path / 'r'}" in errors[0]
    saved = load_checkpoint(ckpt)  # intact (hash checked) and at an update boundary
    assert saved["progress"]["update"] >= 1


def test_env_slices_cover_the_global_envs_once():
    slices = [Dist(rank=r, world=4).shard(8) for r in range(4)]
    assert slices == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert SINGLE.shard(5) == (0, 5) and SINGLE.is_main and not SINGLE.active
    with pytest.raises(ValueError, match=r"env.n_envs 6 must be a multiple of the number of processes \(4\)"):
        Dist(rank=1, world=4).shard(6)


def test_the_learner_options_on_two_processes_update_as_on_one(tmp_path):
    """``ppo.clip_per_group`` (each process clips the summed gradients), ``ppo.value_coef_adapt`` (the
    rule reads the summed gradients' norms, so every process moves the coefficient alike) and
    ``ppo.entropy_floor`` (the hinge judged on the whole minibatch's entropies): the two processes'
    update is the one process's, the coefficient in the checkpoint included."""
    options = ["--ppo.clip_per_group", "0.05", "--ppo.value_coef_adapt", "0.2",
               "--ppo.entropy_floor", "1,0.5,1,0.5,1,0.5,1,0.5"]  # fmt: skip
    args = [*TINY, *options, "--updates", "1", "--run_dir", str(tmp_path)]
    assert main([*args, "--name", "one"]) == 0
    torchrun(2, *args, "--name", "two")
    one, two = tmp_path / "one", tmp_path / "two"
    u1, u2 = events(one, "ppo_update")[0], events(two, "ppo_update")[0]
    assert u1["minibatch_steps"] == u2["minibatch_steps"] == 4
    assert u1["loss_entropy_floor"] > 0 and u1["value_coef"] != 0.5
    for key in ("loss_objective", "loss_critic", "loss_entropy_floor", "value_coef", "grad_norm"):
        assert u2[key] == pytest.approx(u1[key], rel=1e-4, abs=1e-6), key
    assert_same_policy(one, two)
    c1, c2 = (load_checkpoint(r / "checkpoint.pt")["learner"]["value_coef"] for r in (one, two))
    torch.testing.assert_close(c1, c2, rtol=1e-5, atol=0)
