"""The batched host step (:class:`esper.shell.host.batched.BatchedHosts`) against the per-env reference
(:class:`esper.shell.host.bank.PerEnvHosts`): the same hosts, seeds, data and optimizer steps give the
same numbers to float tolerance, for every blueprint in every slot, in every stage, at alphas 0, between 0
and 1, and 1, in every blend style, on both CNN families; and through germination, pruning and a governor
rollback. The batched path is also what ``env.host_step`` picks by default where it applies."""

from __future__ import annotations

import itertools

import pytest
import torch

from esper.core.spec import Stage, Style
from esper.shell.env.config import EnvConfig
from esper.shell.host.bank import PerEnvHosts
from esper.shell.host.batched import BatchedHosts, ShardedHosts, make_bank
from esper.shell.host.slots import attach_seeds
from esper.shell.host.stacked import StackedHosts, supports

#: The stages a seed can be in while it is in a slot, and the alphas each is measured at.
STAGES = (Stage.GERMINATED, Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED, Stage.PRUNED)
ALPHAS = (0.0, 0.4, 1.0)

FAMILIES = {
    "cnn1d": dict(task="mnist1d", batch_size=16, train_batches=2, val_batches=1),
    "cnn": dict(task="digits", batch_size=16, train_batches=2, val_batches=1, image_size=8,
                channels=(4, 8, 8)),
}  # fmt: skip


def _banks(family: str, n_envs: int, device: torch.device | None = None):
    device = device or torch.device("cpu")
    cfg = EnvConfig(n_envs=n_envs, workers=1, device=str(device), **FAMILIES[family])
    task = cfg.build_task()
    ref, bat = PerEnvHosts(cfg, task, device), BatchedHosts(cfg, task, device)
    seeds = [100 + e for e in range(n_envs)]
    ref.reset(seeds)
    bat.reset(seeds)
    return ref, bat, task.make_host().blueprint_names


def _both(ref, bat, method: str, *args, **kwargs):
    a, b = getattr(ref, method)(*args, **kwargs), getattr(bat, method)(*args, **kwargs)
    assert a == b
    return a


def _assert_same_state(ref: PerEnvHosts, bat: BatchedHosts, atol: float = 1e-4) -> None:
    for e, (model, host) in enumerate(zip(ref.models, bat.hosts)):
        a, b = model.host.state_dict(), host.state_dict()
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(b[k].float(), a[k].float(), atol=atol, rtol=1e-4, msg=f"env {e} {k}")
            assert b[k].device == a[k].device, f"env {e} {k}"


def _assert_same_measure(a: dict, b: dict) -> None:
    """Every measurement to float tolerance; the gradient ratio (a ratio of two gradient norms, of a seed
    whose last layer starts near zero) to 1 %: it amplifies the last bits of its small gradients."""
    assert a.keys() == b.keys()
    for k in a:
        tol = {"atol": 1e-3, "rtol": 1e-2} if k == "grad_ratio" else {"atol": 1e-4, "rtol": 1e-4}
        torch.testing.assert_close(b[k], a[k], **tol, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_batched_step_equals_the_per_env_step_for_every_blueprint_slot_stage_alpha_and_style(family):
    check_every_blueprint_slot_stage_alpha_and_style(family, torch.device("cpu"))


def test_batched_step_equals_the_per_env_step_with_seeds_attached_while_they_blend():
    """``lifecycle.attach_at blending``: BLENDING and HOLDING seeds read the live activation, on both paths
    alike (the stacked step reads each slot's own stages, not a module constant)."""
    check_every_blueprint_slot_stage_alpha_and_style("cnn1d", torch.device("cpu"), attach_at="blending")


def check_every_blueprint_slot_stage_alpha_and_style(family: str, device: torch.device,
                                                     attach_at: str = "fossilized") -> None:  # fmt: skip
    """One env per (blueprint, slot): each env holds that blueprint there, in a stage, at an alpha and in a
    style that together cover every stage x alpha and every style; each env also holds another seed in
    the next slot, so slots interact and groups mix. Three epochs on both paths: the measurements
    (losses, accuracies, gradient ratios, counterfactual contributions, what-if gains read with running
    and with batch statistics), every parameter and buffer and the final evaluation agree (also on a
    GPU: ``test_env_cuda.py``)."""
    torch.set_num_threads(1)
    probe_names = _banks(family, 1)[2]
    combos = list(itertools.product(range(len(probe_names)), range(3)))
    ref, bat, names = _banks(family, len(combos), device)
    for bank in (ref, bat):
        for e in range(len(combos)):
            attach_seeds(bank.host(e).slots, attach_at)
    stage_alpha = list(itertools.product(STAGES, ALPHAS))
    seen = set()
    for e, (b, s) in enumerate(combos):
        stage, alpha = stage_alpha[e % len(stage_alpha)]
        style = list(Style)[e % len(Style)]
        seen.add((names[b], s, stage, alpha, style))
        _both(ref, bat, "germinate", e, s, b, style, 1)
        for bank in (ref, bat):
            bank.set_slot(e, s, alpha=alpha, stage=int(stage))
        other = (s + 1) % 3
        _both(ref, bat, "germinate", e, other, (b + 3) % len(names), list(Style)[(e + 1) % len(Style)], 1)
        for bank in (ref, bat):
            bank.set_slot(e, other, alpha=0.7, stage=int(STAGES[(e + 2) % len(STAGES)]))
    # the assignment covers every blueprint in every slot, every stage at every alpha, every style
    assert {(n, s) for n, s, *_ in seen} == set(itertools.product(names, range(3)))
    assert {(st, a) for _, _, st, a, _ in seen} == set(stage_alpha)
    assert {st for *_, st in seen} == set(Style)
    for epoch in range(3):
        scale = 1.0 - 0.2 * epoch  # a learning-rate schedule reaches both optimizers alike
        whatif = epoch >= 1  # the incubating seeds' what-if gains too (G2 under g2_evidence what_if),
        statistics = "batch" if epoch == 2 else "running"  # read with either batch-norm statistics
        a = ref.measure(scale, whatif=whatif, whatif_statistics=statistics)
        b = bat.measure(scale, whatif=whatif, whatif_statistics=statistics)
        _assert_same_measure(a, b)
        incubating = torch.tensor([[bool(ref.host(e).slot(s).incubating) for s in range(3)]
                                   for e in range(len(combos))])  # fmt: skip
        assert a["whatif_gain"][~incubating].eq(0).all()
        assert a["whatif_gain"][incubating].ne(0).any() == whatif  # measured only when asked
    _assert_same_state(ref, bat)
    _assert_same_measure(ref.final(), bat.final())


def test_germination_pruning_and_rollback_keep_the_paths_together():
    """Seeds built, pruned and rolled back between epochs (the optimizer's momentum of a pruned or
    rolled-back seed is dropped, a new seed starts with none) leave both paths with the same hosts."""
    torch.set_num_threads(1)
    ref, bat, names = _banks("cnn1d", 3)
    conv, attn = names.index("conv_heavy"), names.index("self_attention")
    _assert_same_measure(ref.measure(1.0), bat.measure(1.0))
    snapshot = [bank.snapshot_state(0) for bank in (ref, bat)]
    for e in range(3):
        _both(ref, bat, "germinate", e, 0, conv, Style.LINEAR_ADD, 1)
        for bank in (ref, bat):
            bank.set_slot(e, 0, alpha=1.0, stage=int(Stage.FOSSILIZED))
    _both(ref, bat, "germinate", 1, 2, attn, Style.GATED_GATE, 1)
    for bank in (ref, bat):
        bank.set_slot(1, 2, alpha=0.5, stage=int(Stage.BLENDING))
    _assert_same_measure(ref.measure(1.0), bat.measure(1.0))
    for bank in (ref, bat):
        bank.prune(1, 2)
    _assert_same_measure(ref.measure(0.5), bat.measure(0.5))
    assert _both(ref, bat, "rollback", 0, snapshot[0]) == []  # env 0's seed is fossilized: it stays
    _both(ref, bat, "germinate", 2, 1, attn, Style.LINEAR_MULTIPLY, 2)
    for bank in (ref, bat):
        bank.set_slot(2, 1, alpha=0.0, stage=int(Stage.GERMINATED))
    _assert_same_measure(ref.measure(0.5), bat.measure(0.5))
    _assert_same_measure(ref.revalidate([0, 2]), bat.revalidate([0, 2]))
    _assert_same_state(ref, bat)


def test_a_seed_at_alpha_zero_is_left_as_it_was():
    """A blended seed at alpha 0 takes no part in the step: no gradient, no update (its momentum does not
    move it), on the batched path as on the reference."""
    ref, bat, names = _banks("cnn1d", 2)
    for bank in (ref, bat):
        bank.germinate(0, 1, names.index("conv_light"), Style.LINEAR_ADD, 1)
        bank.set_slot(0, 1, alpha=0.0, stage=int(Stage.BLENDING))
    before = [p.detach().clone() for p in bat.hosts[0].seed_parameters(1)]
    bat.measure(1.0)
    ref.measure(1.0)
    assert all(torch.equal(a, b) for a, b in zip(before, bat.hosts[0].seed_parameters(1)))
    assert all(torch.equal(a, b) for a, b in zip(before, ref.models[0].host.seed_parameters(1)))


def test_the_batch_norm_statistics_are_the_hosts_own():
    """The stacked running statistics are the hosts' buffers (views), so a snapshot, a rollback's
    load_state_dict and the per-env evaluation all see what the batched step wrote."""
    _, bat, _ = _banks("cnn1d", 2)
    norm = bat.hosts[1].blocks[0][1]
    bat.measure(1.0)
    mean, _ = bat.stack.running[0]
    assert torch.equal(norm.running_mean, mean[1]) and norm.running_mean.abs().sum() > 0
    bat.hosts[1].load_state_dict({**bat.hosts[1].state_dict(), "blocks.0.1.running_mean": torch.ones(8)})
    assert torch.equal(mean[1], torch.ones(8))


@pytest.mark.parametrize("n_envs", [2, 5])
def test_the_host_parameters_are_rows_of_one_leaf_each_whatever_the_env_count(n_envs):
    """The optimizer's host group holds one stacked leaf per host parameter (not one tensor per env and
    parameter); each host's own parameter is its row, so a step, a snapshot and a rollback's load all
    see the same numbers; each env's host gradient is its row of the leaf's gradient."""
    _, bat, _ = _banks("cnn1d", n_envs)
    leaves = bat.optimizer.param_groups[0]["params"]
    own = bat.hosts[1].host_parameters()
    assert len(leaves) == len(own) and all(leaf.shape == (n_envs, *p.shape) for leaf, p in zip(leaves, own))
    bat.measure(1.0)
    for leaf, p in zip(leaves, own):
        assert torch.equal(p, leaf[1]) and p.grad is None
    assert all(torch.equal(g, leaf.grad[1]) for g, leaf in zip(bat.stack.host_grads(1), leaves))
    head = bat.hosts[1].state_dict()["head.bias"]
    bat.hosts[1].load_state_dict({**bat.hosts[1].state_dict(), "head.bias": torch.full_like(head, 7.0)})
    j = next(j for j, p in enumerate(own) if p is bat.hosts[1].head.bias)
    assert torch.equal(leaves[j][1], torch.full_like(head, 7.0))


def test_sharded_batches_answer_as_one_batch_through_germination_pruning_and_rollback():
    """``env.workers`` batches on as many threads: each env's measurements, parameters and buffers are what
    one batch gives it, with seeds of several blueprints (an attention seed alone in its group among them)
    in both shards, through germination, pruning, a rollback, a revalidation and the final evaluation."""
    torch.set_num_threads(1)
    cfg = EnvConfig(n_envs=5, workers=1, **FAMILIES["cnn1d"])
    task = cfg.build_task()
    cpu = torch.device("cpu")
    one, sharded = BatchedHosts(cfg, task, cpu), ShardedHosts(cfg, task, cpu, 2)
    assert [bank.n for _, bank in sharded.shards] == [2, 3]  # uneven: envs 0-1 and 2-4
    names = task.make_host().blueprint_names
    seeds = [100 + e for e in range(5)]
    one.reset(seeds)
    sharded.reset(seeds)
    assert sharded.host_seeds == one.host_seeds == seeds
    snapshot = [bank.snapshot_state(3) for bank in (one, sharded)]
    _assert_same_measure(one.measure(1.0), sharded.measure(1.0))
    for e, (bp, slot, stage, alpha) in enumerate([
        ("self_attention", 2, Stage.BLENDING, 0.5), ("conv_heavy", 0, Stage.FOSSILIZED, 1.0),
        ("conv_heavy", 0, Stage.TRAINING, 0.0), ("norm", 1, Stage.BLENDING, 0.7),
        ("self_attention", 1, Stage.HOLDING, 1.0),
    ]):  # fmt: skip
        _both(one, sharded, "germinate", e, slot, names.index(bp), Style.LINEAR_ADD, 1)
        for bank in (one, sharded):
            bank.set_slot(e, slot, alpha=alpha, stage=int(stage))
    assert _both(one, sharded, "alphas", 3) == [0.0, 0.7, 0.0]
    assert _both(one, sharded, "host_params", 4) == one.host_params(0)
    _assert_same_measure(one.measure(1.0), sharded.measure(1.0))
    assert set(sharded.timings) == {"host_training", "validation"}
    for bank in (one, sharded):
        bank.prune(0, 2)
    assert _both(one, sharded, "rollback", 3, snapshot[0]) == [1]
    _assert_same_measure(one.measure(0.5), sharded.measure(0.5))
    _assert_same_measure(one.revalidate([1, 3]), sharded.revalidate([1, 3]))
    _assert_same_measure(one.final(), sharded.final())
    for e in range(5):
        a, b = one.host(e).state_dict(), sharded.host(e).state_dict()
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(b[k], a[k], atol=1e-5, rtol=1e-5, msg=f"env {e} {k}")
    sharded.close()
    with pytest.raises(ValueError, match="6 shards for 5 envs"):
        ShardedHosts(cfg, task, cpu, 6)


def test_make_bank_shards_the_batch_by_env_workers_on_the_cpu():
    def kind(**kw):
        cfg = EnvConfig(**{**FAMILIES["cnn1d"], "n_envs": 3, **kw})
        bank = make_bank(cfg, cfg.build_task(), torch.device("cpu"))
        bank.close()
        return type(bank).__name__, len(getattr(bank, "shards", ()))

    assert kind(workers=1) == ("BatchedHosts", 0)
    assert kind(workers=2) == ("ShardedHosts", 2)
    assert kind(workers=8) == ("ShardedHosts", 3)  # no more shards than envs
    assert kind(workers=2, host_step="per_env") == ("PerEnvHosts", 0)


def test_host_step_picks_the_batched_path_where_it_applies_and_refuses_it_elsewhere():
    assert EnvConfig(task="mnist1d").batched and EnvConfig(task="digits").batched
    assert not EnvConfig(task="mnist1d", host_step="per_env").batched
    assert not EnvConfig(task="stdlib_text").batched  # a transformer host: env by env
    with pytest.raises(ValueError, match="transformer host"):
        EnvConfig(task="stdlib_text", host_step="batched")
    with pytest.raises(ValueError, match="host_step"):
        EnvConfig(host_step="fast")
    with pytest.raises(ValueError, match="StackedHosts"):
        StackedHosts([])
    cfg = EnvConfig(task="stdlib_text")
    assert not supports(cfg.build_task().make_host())
