"""bench/perf/hosts.py: its seed populations put the same seeds on both paths (so the timing compares
like with like), and its FLOP count is a real count that grows with the seeds."""

from __future__ import annotations

import pytest
import torch

from bench.perf.hosts import INCUBATING, POPULATIONS, compile_step, populate, sgemm_rate, step_flops
from esper.shell.env.config import EnvConfig
from esper.shell.host.bank import PerEnvHosts
from esper.shell.host.batched import BatchedHosts


def _banks(envs: int = 8):
    cfg = EnvConfig(task="mnist1d", n_envs=envs, batch_size=16, train_batches=1, val_batches=1, workers=1)
    task = cfg.build_task()
    banks = [PerEnvHosts(cfg, task, torch.device("cpu")), BatchedHosts(cfg, task, torch.device("cpu"))]
    for bank in banks:
        bank.reset(list(range(envs)))
    return banks, task.make_host().blueprint_names


@pytest.mark.parametrize("population", POPULATIONS)
def test_populations_put_the_same_seeds_on_both_paths(population):
    (ref, bat), names = _banks()
    for bank in (ref, bat):
        populate(bank, names, population)
    for e in range(ref.n):
        for s in range(3):
            a, b = ref.models[e].host.slot(s), bat.hosts[e].slot(s)
            assert (a.blueprint, a.stage, a.alpha, a.style) == (b.blueprint, b.stage, b.alpha, b.style)
    a, b = ref.measure(1.0), bat.measure(1.0)
    torch.testing.assert_close(b["val_acc"], a["val_acc"], atol=1e-4, rtol=1e-4)
    if population == "diverse":  # every blueprint somewhere, and an incubating seed
        held = {bat.hosts[e].slot(s).blueprint for e in range(bat.n) for s in range(3)}
        assert held == set(names) - {"noop"}
        assert any(h.incubating_slots() for h in bat.hosts)


def test_the_whatif_population_asks_only_the_validation_for_more():
    """``hosts_whatif`` times an epoch without and with the what-if reading (on running or on batch
    statistics): the reading must change nothing but the validation's ``whatif_gain`` (it trains the
    same), and agree with the per-env path."""
    (ref, bat), names = _banks(4)
    (_, without), _ = _banks(4)
    (_, batch), _ = _banks(4)
    for bank in (ref, bat, without, batch):
        populate(bank, names, INCUBATING)
    assert all(h.slot(0).incubating and h.slot(1).seed is None for h in bat.hosts)
    a, b, c = ref.measure(1.0, whatif=True), bat.measure(1.0, whatif=True), without.measure(1.0)
    d = batch.measure(1.0, whatif=True, whatif_statistics="batch")
    for key in ("train_loss", "val_acc", "contribution"):
        torch.testing.assert_close(b[key], c[key], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(d[key], c[key], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(d["whatif_gain"], b["whatif_gain"])  # the batch reading reads otherwise
    torch.testing.assert_close(b["whatif_gain"], a["whatif_gain"], atol=1e-3, rtol=1e-4)
    assert not c["whatif_gain"].any() and b["whatif_gain"][:, 1:].eq(0).all()
    assert b["whatif_gain"][:, 0].ne(0).any()  # asked of every env's b0, and a fresh seed moves the score


def test_step_flops_counts_the_seeds_and_the_rate_is_positive():
    (_, bare), names = _banks(2)
    (_, grown), _ = _banks(2)
    populate(grown, names, "converged")
    assert 0 < step_flops(bare) < step_flops(grown)
    assert sgemm_rate(n=64, seconds=0.05) > 0


def test_the_compiled_step_trains_the_hosts_as_the_eager_one():
    """``hosts_compiled`` times a compiled bank against an eager one: they must do the same work (a cheap
    backend here; the suite compiles with inductor)."""
    (_, eager), names = _banks(2)
    (_, compiled), _ = _banks(2)
    for bank in (eager, compiled):
        populate(bank, names, "converged")
    compile_step(compiled, backend="aot_eager")
    for _ in range(2):
        a, b = eager.measure(1.0), compiled.measure(1.0)
        for key in ("train_loss", "val_acc"):
            torch.testing.assert_close(b[key], a[key], atol=1e-5, rtol=1e-5)
    for p, q in zip(eager.optimizer.param_groups[0]["params"], compiled.optimizer.param_groups[0]["params"]):
        torch.testing.assert_close(q, p, atol=1e-5, rtol=1e-5)


def test_the_cuda_graph_probe_wraps_the_epoch_loop_without_changing_its_eager_steps():
    """``hosts_cuda_graph``'s StepGraph takes over the bank's loss, zero_grad and step; before it
    captures (here: never, the warm-up outlasts the epoch) the epoch must train exactly as unwrapped.
    Its capture and replay need a GPU (bench/gpu_check.sh runs them)."""
    from bench.perf.cuda_graphs import StepGraph

    (_, plain), names = _banks(2)
    (_, wrapped), _ = _banks(2)
    for bank in (plain, wrapped):
        populate(bank, names, "converged")
    graph = StepGraph(wrapped, warmup=100)
    for _ in range(2):
        graph.begin_epoch()
        a, b = plain.measure(1.0), wrapped.measure(1.0)
        assert graph.calls == 1 and graph.captures == 0  # one training batch an epoch here
        for key in ("train_loss", "val_acc"):
            assert torch.equal(a[key], b[key])
    for p, q in zip(plain.stack.leaves.values(), wrapped.stack.leaves.values(), strict=True):
        assert torch.equal(p, q)
