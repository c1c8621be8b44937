"""The trainer's compiled minibatch step (``PPOTrainer(compile=True)``): the LSTM re-scoring, the
factored loss, backward, gradient health, clip and AdamW are one fullgraph, reused by every minibatch
and update (zero recompiles, counted; with ``ppo.replay``, one graph per batch size), with the eager
trainer's results. Traced on ``aot_eager``
(inductor compiles of this graph take minutes on 2 cores; ``bench/`` times the inductor build)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import torch

from esper.shell.agent.config import PPOConfig
from esper.shell.agent.policy import FactoredRecurrentActorCritic
from esper.shell.agent.trainer import PPOTrainer
from tests.shell.agent.test_trainer import RAW, SPEC, _agent, make_rollout

#: Set in the child process :func:`isolated` starts.
ISOLATED = "ESPER_TEST_ISOLATED"


def isolated(test):
    """Run ``test`` in a fresh Python process. Once a process has compiled a trainer update, torch 2.13's
    Dynamo fails to compile a later function that builds and returns a TensorDict ("self missing" in
    ``codegen_update_mutated``; ``torch._dynamo.reset()`` does not clear it), so on a shared xdist
    worker these tests broke the compile tests that ran after them."""

    @functools.wraps(test)
    def run() -> None:
        if os.environ.get(ISOLATED):
            return test()
        cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
               f"{__file__}::{test.__name__}"]  # fmt: skip
        done = subprocess.run(cmd, env={**os.environ, ISOLATED: "1"}, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]

    return run


class CountingBackend:
    """``aot_eager`` that records every graph it is handed (one per compile or recompile)."""

    def __init__(self) -> None:
        self.graphs: list = []

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.debugging import aot_eager

        self.graphs.append(gm)
        return aot_eager(gm, example_inputs)


def _pair(cfg: PPOConfig, backend):
    out = []
    for compile in (False, True):
        torch.manual_seed(0)
        policy = FactoredRecurrentActorCritic(RAW + 6, SPEC, hidden=cfg.hidden, head_hidden=cfg.head_hidden)
        trainer = PPOTrainer(
            _agent(policy, cfg),
            cfg,
            compile=compile,
            compile_backend=backend,
            generator=torch.Generator().manual_seed(0),
        )
        out.append((policy, trainer))
    return out


def _assert_same_policy(a, b) -> None:
    for x, y in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


@isolated
def test_compiled_update_is_one_graph_without_recompiles_and_equals_eager():
    """Two updates x 2 epochs x 2 minibatches with an annealed entropy coefficient and learning rate:
    the step compiles once (plus GAE's own graph), and the policy and metrics match the eager
    trainer's (whose optimizer takes the annealed rate; the compiled step scales its step instead)."""
    torch._dynamo.reset()
    backend = CountingBackend()
    cfg = PPOConfig(
        hidden=16, head_hidden=8, n_epochs=2, n_minibatches=2, target_kl=None,
        entropy_coef=0.05, entropy_coef_end=0.0, entropy_anneal_updates=2,
        lr=1e-2, lr_end=1e-3, lr_anneal_updates=1,
    )  # fmt: skip
    (p_eager, eager), (p_comp, comp) = _pair(cfg, backend)
    rollout = make_rollout(p_eager, eager)
    graphs_after = []
    for _ in range(2):
        m_eager, m_comp = eager.update(rollout.clone()), comp.update(rollout.clone())
        graphs_after.append(len(backend.graphs))
        assert m_comp["minibatch_steps"] == m_eager["minibatch_steps"] == 4
        for key in ("loss_objective", "loss_critic", "loss_entropy", "kl_approx", "grad_norm"):
            assert abs(m_comp[key] - m_eager[key]) <= 1e-4 * (1 + abs(m_eager[key])), key
        # the rollout's LSTM health and advantage statistics are in both (issue 47), the same
        lstm = [k for k in m_eager if k.startswith("lstm_")]
        assert "lstm_h_saturated_frac" in lstm and "adv_std" in m_comp
        for key in [*lstm, "adv_mean", "adv_std", "adv_max_abs", "adv_pos_frac"]:
            assert abs(m_comp[key] - m_eager[key]) <= 1e-5 * (1 + abs(m_eager[key])), key
        _assert_same_policy(p_eager, p_comp)
    assert graphs_after == [2, 2], "one graph for the step and one for GAE; nothing recompiled"
    assert m_eager["entropy_coef"] != cfg.entropy_coef  # the coefficient did change between updates
    assert m_eager["lr"] == m_comp["lr"] == 1e-3  # and so did the learning rate
    eager.optimizer.load_state_dict(comp.optimizer.state_dict())  # the state is the usual AdamW's


@isolated
def test_compiled_update_with_replay_compiles_once_per_batch_size_and_equals_eager():
    """``ppo.replay 1``: the first update holds the new rollout alone, the later ones a kept rollout as
    well, so the step compiles twice and never again; every update matches the eager trainer's. With
    ``ppo.host_group 2`` (here) the group baseline is part of GAE's one graph (the test above runs
    without groups)."""
    torch._dynamo.reset()
    backend = CountingBackend()
    cfg = PPOConfig(hidden=16, head_hidden=8, n_epochs=2, n_minibatches=2, target_kl=None, lr=1e-2, replay=1,
                    host_group=2)  # fmt: skip
    (p_eager, eager), (p_comp, comp) = _pair(cfg, backend)
    graphs = []
    for i in range(3):
        rollout = make_rollout(p_eager, eager, seed=60 + i)
        m_eager, m_comp = eager.update(rollout.clone()), comp.update(rollout.clone())
        graphs.append(len(backend.graphs))
        assert m_comp["replayed_envs"] == m_eager["replayed_envs"] == min(i, 1) * 4
        for key in ("loss_objective", "loss_critic", "kl_approx", "grad_norm"):
            assert abs(m_comp[key] - m_eager[key]) <= 1e-4 * (1 + abs(m_eager[key])), (i, key)
        _assert_same_policy(p_eager, p_comp)
    assert graphs == [2, 3, 3], "GAE's graph and one step graph per batch size; nothing more"


@isolated
def test_compiled_kl_early_stop_skips_the_same_step_as_eager():
    torch._dynamo.reset()
    cfg = PPOConfig(hidden=16, head_hidden=8, n_epochs=3, n_minibatches=2, target_kl=1e-4, lr=0.05)
    (p_eager, eager), (p_comp, comp) = _pair(cfg, "aot_eager")
    rollout = make_rollout(p_eager, eager)
    m_eager, m_comp = eager.update(rollout.clone()), comp.update(rollout.clone())
    assert m_eager["early_stopped"] and m_comp["early_stopped"]
    assert m_comp["minibatch_steps"] == m_eager["minibatch_steps"] < 6
    _assert_same_policy(p_eager, p_comp)
    state_e, state_c = eager.optimizer.state_dict()["state"], comp.optimizer.state_dict()["state"]
    assert [float(s["step"]) for s in state_c.values()] == [float(s["step"]) for s in state_e.values()]


@isolated
def test_compiled_update_of_the_set_policy_is_one_graph_per_host_shape_and_equals_eager():
    """``ppo.policy set`` (a TensorDict input, pointer heads): the step traces as one fullgraph, a host
    with another number of slots compiles it once more and nothing recompiles after; every update
    matches the eager trainer's."""
    from tests.shell.agent.test_setpolicy import LAYOUTS, _rollout
    from tests.shell.agent.test_setpolicy import _agent as _set_agent

    torch._dynamo.reset()
    backend = CountingBackend()
    cfg = PPOConfig(
        policy="set", hidden=16, head_hidden=8, n_epochs=2, n_minibatches=2, target_kl=None, lr=1e-2
    )
    agents = [_set_agent(cfg, seed=0) for _ in range(2)]
    eager, comp = (
        PPOTrainer(a, cfg, compile=c, compile_backend=backend, generator=torch.Generator().manual_seed(0))
        for a, c in zip(agents, (False, True))
    )
    graphs = []
    for i, name in enumerate(("cnn1d-3", "cnn1d-5", "cnn1d-3")):
        rollout = _rollout(agents[0], LAYOUTS[name], E=4, T=5, seed=70 + i)
        m_eager, m_comp = eager.update(rollout.clone()), comp.update(rollout.clone())
        graphs.append(len(backend.graphs))
        for key in ("loss_objective", "loss_critic", "kl_approx", "grad_norm"):
            assert abs(m_comp[key] - m_eager[key]) <= 1e-4 * (1 + abs(m_eager[key])), (i, key)
        for x, y in zip(agents[0].policy.parameters(), agents[1].policy.parameters()):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)
    assert graphs == [2, 3, 3], "GAE's graph and one step graph per host shape; nothing more"


@isolated
def test_compiled_update_with_the_learner_options_is_one_graph_and_equals_eager():
    """``ppo.clip_per_group``, ``ppo.value_coef_adapt`` and ``ppo.entropy_floor`` together: the step still
    compiles once (the adaptive value coefficient goes in and out as a tensor, so its new value every
    step recompiles nothing) and every update matches the eager trainer's, the coefficient included."""
    torch._dynamo.reset()
    backend = CountingBackend()
    cfg = PPOConfig(
        hidden=16, head_hidden=8, n_epochs=2, n_minibatches=2, target_kl=None, lr=1e-2,
        clip_per_group=0.05, value_coef_adapt=0.2, value_coef_adapt_rate=0.5, entropy_floor=(1.0, 0.5) * 4,
    )  # fmt: skip
    (p_eager, eager), (p_comp, comp) = _pair(cfg, backend)
    graphs = []
    for i in range(2):
        rollout = make_rollout(p_eager, eager, seed=80 + i)
        m_eager, m_comp = eager.update(rollout.clone()), comp.update(rollout.clone())
        graphs.append(len(backend.graphs))
        for key in ("loss_objective", "loss_critic", "loss_entropy_floor", "value_coef", "grad_norm"):
            assert abs(m_comp[key] - m_eager[key]) <= 1e-4 * (1 + abs(m_eager[key])), (i, key)
        assert m_eager["loss_entropy_floor"] > 0
        torch.testing.assert_close(comp.learner.value_coef, eager.learner.value_coef, rtol=1e-5, atol=0)
        _assert_same_policy(p_eager, p_comp)
    assert float(eager.learner.value_coef) != cfg.value_coef
    assert graphs == [2, 2], "one graph for the step and one for GAE; nothing recompiled"
