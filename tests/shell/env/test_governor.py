from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from esper.shell.env.governor import Governor, GovernorConfig

RG = math.log(10.0)  # random-guess loss of a 10-class task


def _gov(n_envs: int = 2, **kw) -> Governor:
    return Governor(GovernorConfig(**kw), n_envs=n_envs, random_guess_loss=RG)


def _warm(gov: Governor, env: int, n: int = 12, base: float = 1.0) -> None:
    for i in range(n):
        assert gov.check(env, base + 0.01 * (i % 3)) is None


def test_config_defaults_match_reference_and_validate():
    cfg = GovernorConfig()
    assert (cfg.history, cfg.min_history, cfg.consecutive, cfg.snapshot_every) == (20, 10, 3, 5)
    assert (cfg.lobotomy_fraction, cfg.lobotomy_tolerance) == (0.6, 0.065)
    assert (cfg.panic_loss, cfg.sigma, cfg.mean_factor, cfg.penalty) == (12.0, 6.0, 3.0, 10.0)
    with pytest.raises(ValueError, match="min_history"):
        GovernorConfig(history=5, min_history=10)
    with pytest.raises(ValueError, match="consecutive"):
        GovernorConfig(consecutive=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.history = 3
    assert not hasattr(cfg, "__dict__")  # slotted
    with pytest.raises(ValueError, match="random_guess_loss"):
        Governor(cfg, n_envs=1, random_guess_loss=0.0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_loss_panics_at_once(bad):
    gov = _gov()
    assert gov.check(0, bad) == "nonfinite"
    assert gov.check(1, 1.0) is None  # other env unaffected


def test_lobotomy_needs_a_learned_history_and_a_random_guess_loss():
    gov = _gov()
    assert gov.check(0, RG) is None  # no history: a fresh host at random-guess level is normal
    gov.reset(0)
    _warm(gov, 0, n=3, base=0.5)  # mean 0.5 < 0.6 * ln 10
    assert gov.check(0, RG * 1.05) == "lobotomy"
    assert gov.check(0, RG * 1.2) is None  # outside the 6.5 % tolerance: just a bad epoch
    gov.reset(1)
    _warm(gov, 1, n=3, base=1.8)  # mean 1.8 > 0.6 * ln 10 = 1.38: never learned
    assert gov.check(1, RG) is None


def test_spike_needs_consecutive_epochs_and_min_history():
    gov = _gov()
    for _ in range(5):  # below min_history: no statistics, so no spike, however large
        assert gov.check(0, 1.0) is None
    assert gov.check(0, 100.0) is None
    gov.reset(0)
    _warm(gov, 0)
    assert gov.check(0, 50.0) is None
    assert gov.check(0, 50.0) is None
    assert gov.check(0, 50.0) == "spike"
    # the spikes never entered the history, and the count restarted after the panic
    assert max(gov._envs[0].history) < 2.0
    assert gov.check(0, 50.0) is None


def test_spike_run_is_broken_by_a_normal_epoch_and_all_three_tests_apply():
    gov = _gov()
    _warm(gov, 0)
    assert gov.check(0, 50.0) is None
    assert gov.check(0, 50.0) is None
    assert gov.check(0, 1.0) is None  # normal: run broken
    assert gov.check(0, 50.0) is None
    assert gov.check(0, 50.0) is None
    assert gov.check(0, 50.0) == "spike"
    # below panic_loss: never a spike even if far above the statistics
    gov.reset(0)
    _warm(gov, 0, base=1.0)
    assert all(gov.check(0, 11.0) is None for _ in range(5))


def test_disabled_governor_never_panics_or_snapshots():
    gov = _gov(enabled=False)
    assert gov.check(0, float("nan")) is None
    assert not gov.should_snapshot(0)
    assert _gov().should_snapshot(0) and _gov().should_snapshot(10) and not _gov().should_snapshot(3)


def test_rollback_returns_snapshot_and_negative_penalty():
    gov = _gov(penalty=7.5)
    w = torch.randn(3, 4)
    gov.snapshot(1, {"w": w})
    state, delta = gov.rollback(1)
    assert delta == -7.5
    torch.testing.assert_close(state["w"], w)
    assert state["w"].device.type == "cpu" and state["w"] is not w
    assert gov.n_rollbacks(1) == 1
    with pytest.raises(RuntimeError, match="no snapshot"):
        gov.restore(0)
    gov.reset(1)
    with pytest.raises(RuntimeError, match="no snapshot"):
        gov.restore(1)  # a previous episode's snapshot is stale
    with pytest.raises(IndexError):
        gov.check(2, 1.0)


def test_C7_snapshot_memory_is_flat():
    """200 snapshots of a changing state: the same tensors, bytes and storages throughout."""
    gov = _gov(n_envs=2)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4))
    gov.snapshot(0, model.state_dict())
    buffers = gov.restore(0)
    n0, bytes0 = len(buffers), gov.snapshot_bytes(0)
    ptrs0 = {k: v.untyped_storage().data_ptr() for k, v in buffers.items()}
    for i in range(200):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * (i + 1))
        model.train()(torch.randn(5, 8))  # BatchNorm running stats change too
        gov.snapshot(0, model.state_dict())
        snap = gov.restore(0)
        assert len(snap) == n0 and gov.snapshot_bytes(0) == bytes0
        # If each snapshot allocated anew (the original's behaviour), these pointers would change.
        assert {k: v.untyped_storage().data_ptr() for k, v in snap.items()} == ptrs0
    for k, v in model.state_dict().items():
        torch.testing.assert_close(gov.restore(0)[k], v)  # the last snapshot, not a stale one
    # across episodes too: reset keeps the buffers for reuse
    gov.reset(0)
    gov.snapshot(0, model.state_dict())
    assert {k: v.untyped_storage().data_ptr() for k, v in gov.restore(0).items()} == ptrs0


def test_snapshot_reallocates_only_changed_entries_and_drops_absent_ones():
    gov = _gov(n_envs=1)
    gov.snapshot(0, {"a": torch.ones(3), "b": torch.ones(2, 2), "c": torch.zeros(1)})
    before = {k: v.data_ptr() for k, v in gov.restore(0).items()}
    gov.snapshot(0, {"a": torch.full((3,), 2.0), "b": torch.ones(4, 4), "d": torch.ones(2, dtype=torch.long)})
    snap = gov.restore(0)
    assert set(snap) == {"a", "b", "d"}
    assert snap["a"].data_ptr() == before["a"]  # same shape: copied in place
    assert snap["b"].shape == (4, 4)
    torch.testing.assert_close(snap["a"], torch.full((3,), 2.0))
    assert snap["d"].dtype == torch.long
    with pytest.raises(TypeError, match="'x'"):
        gov.snapshot(0, {"x": 3})
