"""The vectorized env on a real GPU: skipped without CUDA (CI has none; run on a GPU machine).

``test_env.py`` checks the per-env stream protocol on a CPU with fake streams. These tests run the real
thing: an episode with one CUDA stream per env (``env.host_step per_env``) must give the same numbers as
the same episode with every env on the default stream (cuDNN and cuBLAS made deterministic), so a missing
wait would show as a difference; CUDA AMP (one GradScaler per env, finding H12) must train to finite
losses; and the batched host step (every env's host as one batch, the default where it applies) must
equal the per-env reference on the GPU as it does on the CPU (``test_batched.py``), TF32 off.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from esper.core.lifecycle import LifecycleConfig
from esper.shell.env.config import EnvConfig
from esper.shell.env.governor import GovernorConfig
from esper.shell.env.rollout import EpisodeRunner
from esper.shell.env.vecenv import VecEnv
from tests.shell.env.test_env import _Scripted

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _cuda_env(n_envs: int = 3, *, amp: bool = False, host_step: str = "per_env") -> VecEnv:
    cfg = EnvConfig(
        task="digits", n_envs=n_envs, image_size=8, channels=(4, 8, 8), batch_size=32, train_batches=3,
        val_batches=1, amp=amp, device="cuda", host_step=host_step,
    )  # fmt: skip
    return VecEnv(cfg, LifecycleConfig(max_epochs=4), GovernorConfig(), seed=0)


def _episode(env: VecEnv):
    runner = EpisodeRunner(env, _Scripted(env.spec))
    result = runner.run(0)
    torch.cuda.synchronize()
    return result


@pytest.fixture
def deterministic(monkeypatch):
    """cuDNN and cuBLAS deterministic for the test (cuBLAS needs a fixed workspace to be deterministic
    across streams; the variable is read when a handle is created, so a fresh process is safest)."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)


def test_S1_real_streams_give_the_default_stream_episode(deterministic):
    with_streams = _cuda_env()
    assert all(s is not None for s in with_streams.hosts.streams.streams), "one CUDA stream per env expected"
    a = _episode(with_streams)

    serial = _cuda_env()
    serial.hosts.streams.streams = [None] * serial.n  # every env's work on the default stream
    b = _episode(serial)

    for field in ("val_acc", "val_loss", "train_loss", "reward"):
        x = torch.tensor([e[field] for e in a.epochs], dtype=torch.float64)
        y = torch.tensor([e[field] for e in b.epochs], dtype=torch.float64)
        assert torch.isfinite(x).all(), field
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5, msg=lambda m, f=field: f"{f}: {m}")
    assert [e["op"] for e in a.epochs] == [e["op"] for e in b.epochs]
    torch.testing.assert_close(a.final.to_dict(), b.final.to_dict(), rtol=1e-5, atol=1e-5)
    assert [ep["return"] for ep in a.episodes] == pytest.approx([ep["return"] for ep in b.episodes], abs=1e-4)


def test_H12_cuda_amp_trains_each_env_with_its_own_scaler():
    env = _cuda_env(2, amp=True)
    result = _episode(env)
    assert all(s is not None and s.is_enabled() for s in env.hosts.scalers)
    assert len(set(map(id, env.hosts.scalers))) == env.n
    losses = [x for e in result.epochs for x in e["train_loss"]]
    assert losses and all(torch.isfinite(torch.tensor(v)) for v in losses)


@pytest.mark.parametrize("host_step", ["per_env", "batched"])
def test_cuda_env_keeps_its_hosts_on_the_gpu(host_step):
    env = _cuda_env(2, host_step=host_step)
    env.reset(0)
    hosts = [m.host for m in env.hosts.models] if host_step == "per_env" else env.hosts.hosts
    assert type(env.hosts).__name__ == {"per_env": "PerEnvHosts", "batched": "BatchedHosts"}[host_step]
    for host in hosts:
        assert {p.device.type for p in host.parameters()} == {"cuda"}


@pytest.fixture
def no_tf32(monkeypatch):
    """TF32 off: the card's default rounds convolutions and matmuls to 10 mantissa bits, and a grouped
    convolution over the envs rounds otherwise than one convolution per env."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


@pytest.mark.parametrize("family", ["cnn1d", "cnn"])
def test_batched_step_on_the_gpu_equals_the_per_env_step(family, no_tf32):
    from tests.shell.env.test_batched import check_every_blueprint_slot_stage_alpha_and_style

    check_every_blueprint_slot_stage_alpha_and_style(family, torch.device("cuda"))


def test_batched_episode_on_the_gpu_takes_the_per_env_episodes_actions(no_tf32):
    """A whole scripted episode on both paths: the same lifecycle events, and the same measurements to
    the tolerance of a few epochs' float drift."""
    a, b = (_episode(_cuda_env(host_step=h)) for h in ("per_env", "batched"))
    assert [e["op"] for e in a.epochs] == [e["op"] for e in b.epochs]
    for field in ("val_loss", "train_loss"):
        x = torch.tensor([e[field] for e in a.epochs], dtype=torch.float64)
        y = torch.tensor([e[field] for e in b.epochs], dtype=torch.float64)
        torch.testing.assert_close(y, x, rtol=1e-3, atol=1e-3, msg=lambda m, f=field: f"{f}: {m}")


def test_random_baseline_draws_the_same_actions_on_the_gpu_as_on_the_cpu():
    # It used to draw from the global CUDA generator there (its own generator is a CPU one), so a
    # seeded random baseline was not reproducible on a GPU.
    from esper.core.masks import legal_masks
    from esper.shell.baselines.simple import RandomController

    env = _cuda_env(3)
    env.reset(0)
    legal = legal_masks(env.slots, env.spec)
    actions = {}
    for device in ("cpu", "cuda"):
        controller = RandomController(seed=7)
        controller.begin(env.n)
        step = SimpleNamespace(legal=legal.to(device))
        actions[device] = [controller.act(step).to("cpu") for _ in range(20)]
    for cpu, gpu in zip(actions["cpu"], actions["cuda"]):
        for head in cpu.keys():
            assert torch.equal(cpu[head, "action"], gpu[head, "action"]), head
