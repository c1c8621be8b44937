"""The pieces the held-out evaluation rests on: MNIST-1D data, three disjoint splits (the test split is
read only by the final evaluation), host seeds that never repeat between training and evaluation,
the learning-rate schedule, the OBJECTIVE reward as the runner pays it, concurrent CPU envs that
change nothing but speed, and the baseline controllers."""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from esper.core.lifecycle import LifecycleConfig
from esper.core.rewards import RewardConfig, RewardMode, objective
from esper.core.spec import HEADS, Op, Stage
from esper.shell.baselines.simple import GrowAllController, RandomController, StaticController
from esper.shell.common.seeding import derive_seed, eval_host_seeds, train_host_seeds
from esper.shell.data.datasets import _mnist1d_draw, load_mnist1d
from esper.shell.env.config import EnvConfig, lr_scale
from esper.shell.env.governor import GovernorConfig
from esper.shell.env.rollout import EpisodeRunner
from esper.shell.env.vecenv import VecEnv
from esper.shell.host.slots import DETACHED_BY_ATTACH


def _env(n_envs=2, *, max_epochs=6, workers=1, task="mnist1d", **env) -> VecEnv:
    cfg = EnvConfig(task=task, n_envs=n_envs, batch_size=128, train_batches=4, workers=workers, **env)
    return VecEnv(cfg, LifecycleConfig(max_epochs=max_epochs, g2_min_epochs=1, g3_min_epochs=1),
                  GovernorConfig(), seed=3)  # fmt: skip


# ------------------------------------------------------------------------------------------- data
def test_mnist1d_splits_are_deterministic_disjoint_and_leave_global_rngs_alone(monkeypatch):
    monkeypatch.setenv("ESPER_CACHE_DIR", "off")  # generated, not read from the disk cache
    random.seed(5)
    np.random.seed(5)  # noqa: NPY002 (checking the legacy global generator is left alone)
    before = (random.random(), np.random.rand())  # noqa: NPY002
    random.seed(5)
    np.random.seed(5)  # noqa: NPY002
    _mnist1d_draw.cache_clear()  # generate here, not from an earlier test's draw
    (tx, ty), (vx, _), (sx, sy) = load_mnist1d()
    assert (random.random(), np.random.rand()) == before  # noqa: NPY002
    assert tx.shape == (4000, 1, 40) and vx.shape == (1000, 1, 40) and sx.shape == (1000, 1, 40)
    assert tx.dtype == torch.float32 and ty.dtype == torch.int64 and set(ty.tolist()) == set(range(10))
    (tx2, _), _, (sx2, sy2) = load_mnist1d()
    assert torch.equal(tx, tx2) and torch.equal(sx, sx2) and torch.equal(sy, sy2)
    rows = [{tuple(r.tolist()) for r in x[:, 0]} for x in (tx, vx, sx)]
    assert not (rows[0] & rows[1]) and not (rows[0] & rows[2]) and not (rows[1] & rows[2])
    with pytest.raises(ValueError, match="splits"):
        load_mnist1d(splits=(100, 5, 100))


def test_an_mnist1d_draw_is_made_once_per_process_and_each_call_gets_its_own_copy():
    _mnist1d_draw.cache_clear()
    (tx, _), _, _ = load_mnist1d(splits=(100, 20, 20), seed=3)
    tx.fill_(7.0)  # a caller that writes into its data does not reach the next caller's
    (tx2, ty2), _, _ = load_mnist1d(splits=(100, 20, 20), seed=3)
    assert _mnist1d_draw.cache_info().hits == 1 and not torch.equal(tx, tx2)
    _mnist1d_draw.cache_clear()
    (fresh, fy), _, _ = load_mnist1d(splits=(100, 20, 20), seed=3)
    assert torch.equal(fresh, tx2) and torch.equal(fy, ty2)


# ------------------------------------------------------------------------------------------ seeds
def test_training_and_evaluation_hosts_never_share_a_seed():
    train = {s for run in range(5) for ep in range(200) for s in train_host_seeds(run, ep, range(16))}
    evals = {s for ev in range(5) for s in eval_host_seeds(ev, range(500))}
    assert len(train) == 5 * 200 * 16 and len(evals) == 5 * 500  # no collision inside either set
    assert not train & evals
    assert derive_seed("eval", 1, 2) == derive_seed("eval", 1, 2) and 0 <= derive_seed("x") < 2**63


def test_host_groups_share_a_training_host_within_a_group_and_never_across():
    """``ppo.host_group``: consecutive envs share the training host's seed (its init, its seeds' init, its
    data order), so the first measurement of a group's envs is the same; without groups every env has its
    own seed, exactly the seeds of before (group 1)."""
    assert train_host_seeds(3, 5, range(4)) == [derive_seed("train", 3, 5, i) for i in range(4)]
    paired = train_host_seeds(3, 5, range(4, 8), group=2)
    assert paired[0] == paired[1] != paired[2] == paired[3]
    assert paired[0] == derive_seed("train", 3, 5, 2)  # the group's index, from the global env index
    with pytest.raises(ValueError, match="group must be an int >= 1"):
        train_host_seeds(3, 5, range(4), group=0)
    cfg = EnvConfig(task="mnist1d", n_envs=4, batch_size=128, train_batches=2)
    lc = LifecycleConfig(max_epochs=3)
    env = VecEnv(cfg, lc, GovernorConfig(), seed=3, host_group=2)
    ts = env.reset(0)
    assert env.host_seeds == train_host_seeds(3, 0, range(4), group=2)
    acc = ts.measurement["val_acc"]
    assert acc[0] == acc[1] and acc[2] == acc[3] and not torch.equal(acc[:2], acc[2:])
    for first, n in ((2, 4), (0, 3)):  # a group would span two processes
        with pytest.raises(ValueError, match="must divide each process's envs"):
            VecEnv(dataclasses.replace(cfg, n_envs=n), lc, GovernorConfig(), seed=3, first_env=first,
                   host_group=4)  # fmt: skip


def test_env_hosts_follow_the_given_seeds():
    env = _env(2)
    env.reset(0, host_seeds=[11, 12])
    a = [p.detach().clone() for p in env.hosts.host(0).parameters()]
    env.reset(7, host_seeds=[11, 99])
    assert all(torch.equal(x, y) for x, y in zip(a, env.hosts.host(0).parameters()))
    assert env.host_seeds == [11, 99]
    with pytest.raises(ValueError, match="host seeds"):
        env.reset(0, host_seeds=[1])


# ---------------------------------------------------------------------------------- test isolation
def test_the_test_split_is_read_only_by_the_final_evaluation(monkeypatch):
    env = _env(2, max_epochs=4)
    runner = EpisodeRunner(env, GrowAllController(5, env.lifecycle))
    reads = []
    real_reset = env.reset

    class Spy:
        def __init__(self, i, batches):
            self.i, self.batches = i, batches

        def __iter__(self):
            reads.append((self.i, env.epoch))
            return iter(self.batches)

    def spy_reset(*args, **kwargs):
        first = real_reset(*args, **kwargs)
        env.hosts.loaders = [ld._replace(test=Spy(i, ld.test)) for i, ld in enumerate(env.hosts.loaders)]
        return first

    monkeypatch.setattr(env, "reset", spy_reset)
    result = runner.run(0)
    assert sorted(reads) == [(0, 4), (1, 4)]  # once per env, after the last epoch
    assert all(0 <= ep["final_test_acc"] <= 100 for ep in result.episodes)
    assert all("test" not in k for ev in result.epochs for k in ev)  # the controller's view has no test


# --------------------------------------------------------------------------------------- schedule
def test_cosine_schedule_runs_from_one_to_near_zero():
    assert lr_scale("constant", 7, 25) == 1.0
    scales = [lr_scale("cosine", e, 25) for e in range(1, 26)]
    assert scales[0] == 1.0 and scales[-1] < 0.01 and all(a > b for a, b in itertools.pairwise(scales))
    env = _env(1, max_epochs=4, lr_schedule="cosine", host_step="per_env")  # per-seed optimizers
    env.reset(0)  # epoch 1
    for epoch in range(2, 5):  # germinate at the first step, then wait
        op = Op.GERMINATE if epoch == 2 else Op.WAIT
        action = TensorDict({h: torch.zeros(1, dtype=torch.int64) for h in HEADS}, batch_size=[1])
        action["op"], action["blueprint"] = torch.tensor([int(op)]), torch.tensor([3])
        env.step(action)
        lrs = [g["lr"] for opt in env.hosts.models[0].optimizers() for g in opt.param_groups]
        assert lrs == pytest.approx([env.cfg.host_lr * lr_scale("cosine", epoch, 4)] + [
            env.cfg.seed_lr * lr_scale("cosine", epoch, 4)] * (len(lrs) - 1))  # fmt: skip
    with pytest.raises(ValueError, match="lr_schedule"):
        EnvConfig(lr_schedule="linear")


# ------------------------------------------------------------------------------------------ runner
def test_objective_return_is_the_final_objective_minus_the_first_measurement(monkeypatch):
    env = _env(2, max_epochs=6)
    cfg = RewardConfig(param_weight=2.0)
    firsts = []
    real_reset = env.reset

    def spy(*args, **kwargs):
        first = real_reset(*args, **kwargs)
        firsts.append(objective(first.measurement, cfg))
        return first

    monkeypatch.setattr(env, "reset", spy)
    env.reward_cfg = cfg
    runner = EpisodeRunner(env, GrowAllController(5, env.lifecycle))
    result = runner.run(0)
    for i, ep in enumerate(result.episodes):
        expected = ep["objective"] - float(firsts[0][i])
        assert ep["return"] == pytest.approx(expected, abs=1e-3)
        assert ep["reward_components"]["objective"] == pytest.approx(ep["return"], abs=1e-3)
        assert ep["objective"] == pytest.approx(
            ep["final_val_acc"] - 2.0 * ep["params_added"] / ep["host_params"], abs=1e-3
        )
    assert any(ep["params_added"] > 0 for ep in result.episodes)  # grow_all grew something


def test_shaped_mode_still_runs_and_pays_no_objective_term():
    env = _env(2, max_epochs=4)
    env.reward_cfg = RewardConfig(mode=RewardMode.SHAPED)
    runner = EpisodeRunner(env, GrowAllController(5, env.lifecycle))
    for ep in runner.run(0).episodes:
        assert ep["reward_components"]["objective"] == 0.0 and "final_test_acc" in ep


# ----------------------------------------------------------------------------------------- workers
def test_concurrent_cpu_envs_give_the_same_episodes_as_sequential_ones():
    def episode(workers):
        torch.manual_seed(0)
        env = _env(3, max_epochs=5, workers=workers, host_step="per_env")  # worker threads: env by env
        runner = EpisodeRunner(env, RandomController(seed=4))
        try:
            return runner.run(0), env
        finally:
            env.close()

    (seq, seq_env), (par, par_env) = episode(1), episode(2)
    assert seq_env.hosts._pool is None and par_env.hosts._pool is None  # closed
    for a, b in zip(seq.episodes, par.episodes):
        for k in ("return", "final_val_acc", "final_test_acc", "params_added", "op_counts"):
            assert a[k] == b[k], k
    with pytest.raises(ValueError, match="workers"):
        EnvConfig(workers=0)


def test_workers_stay_sequential_for_hosts_with_dropout():
    env = VecEnv(EnvConfig(task="stdlib_text", n_envs=2, workers=2), LifecycleConfig(max_epochs=2),
                 GovernorConfig(), seed=0, task=_dropout_text_task())  # fmt: skip
    assert env.hosts._pool is None


def _dropout_text_task():
    from esper.shell.env.tasks import make_task

    return make_task("stdlib_text", max_bytes=20_000, ctx=16, batch_size=2, d_model=16, n_layers=2,
                     n_heads=2, dropout=0.1)  # fmt: skip


# --------------------------------------------------------------------------------------- baselines
def _legal_ops(result):
    return [op for ev in result.epochs for op in ev["op"]]


def test_static_waits_and_grow_all_fills_every_slot_then_fossilizes():
    env = _env(2, max_epochs=14)
    static = EpisodeRunner(env, StaticController())
    res = static.run(0)
    assert set(_legal_ops(res)) == {"WAIT"} and all(ep["params_added"] == 0 for ep in res.episodes)
    lc = dataclasses.replace(env.lifecycle, g2_min_gain=-100.0, g5_min_contribution=-100.0)
    env.lifecycle = lc
    grow = EpisodeRunner(env, GrowAllController(5, lc))
    res = grow.run(1)
    ops = [ev["op"][0] for ev in res.epochs]
    assert ops[:3] == ["GERMINATE"] * 3 and "FOSSILIZE" in ops and "PRUNE" not in ops
    assert [ev["blueprint"][0] for ev in res.epochs[:3]] == [env.blueprint_names[5]] * 3
    final = res.epochs[-1]["stage"][0]
    assert final.count("FOSSILIZED") == 3, final


def test_random_controller_only_takes_legal_actions_and_is_reproducible():
    env = _env(3, max_epochs=8)

    def run(seed):
        runner = EpisodeRunner(env, RandomController(seed=seed))
        return runner.run(0)

    a, b, c = run(1), run(1), run(2)
    assert _legal_ops(a) == _legal_ops(b) and _legal_ops(a) != _legal_ops(c)
    assert not any(e["kind"] == "illegal" for e in a.lifecycle)
    assert len(set(_legal_ops(a))) >= 3  # it explores several ops
    assert Op.WAIT.name in _legal_ops(a) and Stage.DORMANT.name  # WAIT is always legal


def test_env_masks_the_noop_blueprint_and_no_controller_germinates_it():
    env = _env(3, max_epochs=8)
    noop = env.blueprint_names.index("noop")
    assert env.spec.masked_blueprints == (noop,)
    for seed in (1, 2, 3):
        runner = EpisodeRunner(env, RandomController(seed=seed))
        res = runner.run(seed)
        germinated = [e["blueprint"] for e in res.lifecycle if e["kind"] == "germinated"]
        assert germinated and "noop" not in germinated, germinated


def test_the_env_masks_a_ramp_to_the_alpha_held_only_when_configured():
    """``lifecycle.mask_same_alpha`` reaches the env's legality (the core test shows what it removes)."""
    for on in (False, True):
        cfg = EnvConfig(task="mnist1d", n_envs=1, batch_size=128, train_batches=1)
        env = VecEnv(cfg, LifecycleConfig(max_epochs=2, mask_same_alpha=on), GovernorConfig(), seed=3)
        assert ("alpha_target_by_slot" in env.reset(0).obs.legal.keys()) == on


# --------------------------------------------------------------------------------------- attachment
def test_attach_at_blending_reaches_every_fresh_host_and_changes_what_grow_all_trains():
    """``lifecycle.attach_at``: every host a reset builds holds slots that read the live activation from
    the configured stage, on both host paths, and the same hosts and seeds train to other weights once the
    host trains through a blending seed (the layers before it get its gradient); the reference's isolation
    (the default) trains as before."""

    def episode(attach_at, host_step="batched"):
        torch.manual_seed(0)
        cfg = EnvConfig(
            task="mnist1d", n_envs=2, batch_size=64, train_batches=8, workers=1, host_step=host_step
        )
        attach = {} if attach_at is None else {"attach_at": attach_at}
        life = LifecycleConfig(max_epochs=7, g2_min_epochs=1, g3_min_epochs=1, g2_min_gain=0.0,
                               g2_min_grad_ratio=0.0, **attach)  # fmt: skip
        env = VecEnv(cfg, life, GovernorConfig(), seed=3)
        EpisodeRunner(env, GrowAllController(5, env.lifecycle)).run(0)
        stages = {env.hosts.host(i).slot(s).detached_stages for i in range(env.n) for s in range(3)}
        blended = any(
            env.hosts.host(i).slot(s).stage == Stage.BLENDING for i in range(env.n) for s in range(3)
        )
        weights = [p.detach().clone() for i in range(env.n) for p in env.hosts.host(i).host_parameters()]
        return weights, stages, blended

    default, _, _ = episode(None)
    isolated, detached, blended = episode("fossilized")
    attached, live, _ = episode("blending")
    per_env, live_per_env, _ = episode("blending", "per_env")
    assert blended  # a seed blended in this episode, so the two settings could differ
    assert detached == {DETACHED_BY_ATTACH["fossilized"]}
    assert live == live_per_env == {DETACHED_BY_ATTACH["blending"]}
    assert all(torch.equal(a, b) for a, b in zip(default, isolated, strict=True))  # the default: as before
    assert any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(isolated, attached, strict=True))
    for a, b in zip(attached, per_env, strict=True):  # the two host paths agree on it
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_issue103_without_incubation_seeds_blend_from_germination_on_both_host_paths():
    """``lifecycle.incubate false`` (issue 103): a germinated seed is in BLENDING on the host from its
    germination step (alpha above 0 for the next epoch), no what-if pass is spent on it (its FLOPs 0),
    the host trains through it with ``attach_at blending``, and the batched and per-env paths agree."""

    def episode(host_step):
        torch.manual_seed(0)
        cfg = EnvConfig(task="mnist1d", n_envs=2, batch_size=64, train_batches=4, workers=1,
                        host_step=host_step)  # fmt: skip
        life = LifecycleConfig(max_epochs=3, incubate=False, attach_at="blending")
        env = VecEnv(cfg, life, GovernorConfig(), seed=3)
        seen = []
        result = EpisodeRunner(env, GrowAllController(5, env.lifecycle),
                               on_epoch=lambda ev: seen.append(
                                   [env.hosts.host(0).slot(s).stage for s in range(3)])).run(0)  # fmt: skip
        weights = [p.detach().clone() for i in range(env.n) for p in env.hosts.host(i).host_parameters()]
        return result, seen, weights, env

    result, seen, weights, env = episode("batched")
    # grow_all germinates one slot a step: slot 0 at the first step, BLENDING at once, never GERMINATED
    assert all(Stage.GERMINATED not in stages and Stage.TRAINING not in stages for stages in seen)
    assert seen[0][0] == Stage.BLENDING and env.hosts.host(0).slot(0).alpha > 0.0
    assert env.hosts.host(0).slot(0).reads_live
    assert all(ep["whatif_flops"] == 0 for ep in result.episodes)
    _, _, per_env, _ = episode("per_env")
    for a, b in zip(weights, per_env, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
