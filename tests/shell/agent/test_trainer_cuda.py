"""``ppo.replay`` on a real GPU: skipped without CUDA (CI has none; run on a GPU machine with
``bench/gpu_check.sh``).

On CUDA the trainer takes the fused Triton kernels for the masked categorical and GAE, so the replayed
part of a batch (re-scored by today's policy and critic, weighted by the truncated ratio) goes through
other code than on the CPU. These check that it gives the CPU's numbers, that a checkpoint written on
the GPU resumes on the CPU with its kept rollouts, and that the compiled (inductor) step with replay
gives the eager step's numbers there. TF32 is off for these comparisons (cuDNN's LSTM takes it by
default, which moves the re-scored values by ~1e-3 relative on its own).
"""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

from esper.shell.agent.config import PPOConfig
from esper.shell.agent.policy import FactoredRecurrentActorCritic
from esper.shell.agent.trainer import PPOTrainer
from tests.shell.agent.test_trainer import RAW, SPEC, _agent, make_rollout, resume, resume_state

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def no_tf32(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


KEYS = ("advantage", "value_target", "state_value", ("next", "reward"))


def _cfg(**kw) -> PPOConfig:
    base = dict(hidden=16, head_hidden=8, n_epochs=2, n_minibatches=2, target_kl=None, lr=1e-3, replay=2)
    return PPOConfig(**{**base, **kw})


def _trainer(cfg: PPOConfig, device: str, *, compile: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    policy = FactoredRecurrentActorCritic(RAW + 6, SPEC, hidden=cfg.hidden, head_hidden=cfg.head_hidden)
    policy.to(device)
    generator = torch.Generator().manual_seed(seed)
    trainer = PPOTrainer(_agent(policy, cfg), cfg, compile=compile, generator=generator)
    return policy, trainer


def _close(a: float, b: float, rel: float = 1e-3) -> bool:
    return abs(a - b) <= rel * (1 + abs(b))


def test_replayed_batch_on_the_gpu_is_the_cpus():
    """One update on the CPU, its state loaded on the GPU: the prepared batch with a kept rollout (the
    GPU through the Triton kernels) equals the CPU's, and so does the next update's report."""
    cfg = _cfg()
    p_cpu, cpu = _trainer(cfg, "cpu")
    old = make_rollout(p_cpu, cpu, seed=20)
    cpu.update(old.clone())
    _, gpu = _trainer(cfg, "cuda", seed=3)
    resume(gpu, resume_state(cpu))
    assert len(gpu.state.replay) == 1 and gpu.state.replay[0].device.type == "cuda"

    new = make_rollout(p_cpu, cpu, seed=21)
    b_cpu = cpu.prepare(new.clone(), replayed=cpu.state.replay)
    b_gpu = gpu.prepare(new.clone().to("cuda"), replayed=gpu.state.replay)
    assert b_cpu.batch_size == b_gpu.batch_size and b_cpu.batch_size[0] == 8
    for key in KEYS:
        torch.testing.assert_close(
            b_gpu[key].cpu(), b_cpu[key], rtol=1e-4, atol=1e-5, msg=lambda m, k=key: f"{k}: {m}"
        )

    m_cpu, m_gpu = cpu.update(new.clone()), gpu.update(new.clone().to("cuda"))
    assert m_cpu["replayed_envs"] == m_gpu["replayed_envs"] == 4
    for key in ("loss_objective", "loss_critic", "kl_approx", "explained_variance"):
        assert _close(m_gpu[key], m_cpu[key]), (key, m_gpu[key], m_cpu[key])


def test_a_gpu_checkpoint_with_kept_rollouts_resumes_on_the_cpu():
    cfg = _cfg()
    _, gpu = _trainer(cfg, "cuda")
    p_ref, ref = _trainer(cfg, "cpu")  # only to make rollouts
    for i in range(2):
        gpu.update(make_rollout(p_ref, ref, seed=40 + i).to("cuda"))
    buf = io.BytesIO()
    torch.save(resume_state(gpu), buf)
    buf.seek(0)
    sd = torch.load(buf, map_location="cpu", weights_only=True)
    _, cpu = _trainer(cfg, "cpu", seed=5)
    resume(cpu, sd)
    assert len(cpu.state.replay) == 2
    for a, b in zip(gpu.state.replay, cpu.state.replay):
        assert b.device.type == "cpu" and (a.cpu() == b).all()
    rollout = make_rollout(p_ref, ref, seed=42)
    assert cpu.update(rollout)["replayed_envs"] == 8


def test_compiled_step_with_replay_on_the_gpu_equals_eager():
    """Inductor with the Triton kernels inside the graph: three updates while the kept rollout fills
    (a graph per batch size), each update's report as eager's."""
    torch._dynamo.reset()
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 13):
        # inductor before 2.13 crashes fusing the foreach Adam with the per-tensor gradient norms on
        # CUDA (pytorch/pytorch#176591, fixed by #176849); esper asks for torch >= 2.13, but the GPU
        # machines lent to this project carry an older build
        stack = torch._inductor.config.patch(loop_ordering_after_fusion=False)
    else:
        stack = contextlib.nullcontext()
    with stack:
        _compiled_against_eager()


def _compiled_against_eager() -> None:
    cfg = _cfg(replay=1)
    p_eager, eager = _trainer(cfg, "cuda")
    _, comp = _trainer(cfg, "cuda", compile=True)
    p_ref, ref = _trainer(cfg, "cpu")
    for i in range(3):
        rollout = make_rollout(p_ref, ref, seed=60 + i).to("cuda")
        m_eager, m_comp = eager.update(rollout.clone()), comp.update(rollout.clone())
        assert m_comp["replayed_envs"] == m_eager["replayed_envs"] == min(i, 1) * 4
        for key in ("loss_objective", "loss_critic", "kl_approx", "grad_norm"):
            assert _close(m_comp[key], m_eager[key]), (i, key, m_comp[key], m_eager[key])
    for x, y in zip(p_eager.parameters(), comp.policy.parameters()):
        torch.testing.assert_close(x, y, rtol=1e-3, atol=5e-3)
