"""The learner options of issue 92 (each off by default): ``ppo.clip_per_group`` (findings M19 and 000
MED-1), ``ppo.value_coef_adapt`` (000 MED-2) and ``ppo.entropy_floor`` (004 P-4) in the trainer's
update: each changes what it should, and nothing when off. Compiled == eager is in
tests/compile/test_compile_trainer.py, two processes == one in tests/shell/runtime/test_distributed.py."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from esper.core.health import adapt_value_coef
from esper.shell.agent.config import PPOConfig
from esper.shell.agent.steps import GRAD_GROUPS, VALUE_COEF_RANGE
from esper.shell.config.presets import preset
from tests.shell.agent.test_trainer import _make, make_rollout, resume, resume_state

BASE = PPOConfig(hidden=16, head_hidden=8, n_epochs=2, n_minibatches=2, target_kl=None, lr=1e-2)


def _trained(cfg: PPOConfig, seed: int = 0, **kw):
    policy, trainer = _make(cfg, seed=seed)
    metrics = trainer.update(make_rollout(policy, trainer, seed=11), **kw)
    return policy, trainer, metrics


def _params(policy) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.parameters()]


def _record_clips(trainer) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Wrap the learner's clip: each call records the pre-clip group norms (the health's) and those of
    the gradients it leaves for the optimizer."""
    learner, seen = trainer.learner, []
    original = learner.clip

    def clip(health):
        original(health)
        after = torch.stack([
            torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1) for p in members if p.grad is not None]
                                               or [torch.zeros(1)]))
            for members in learner.members
        ])  # fmt: skip
        seen.append((health["group_norms"].clone(), after))

    learner.clip = clip
    return seen


def test_the_options_are_off_by_default_and_in_the_default_preset():
    cfg = PPOConfig()
    assert (cfg.clip_per_group, cfg.value_coef_adapt, cfg.entropy_floor) == (0.0, 0.0, ())
    assert cfg.entropy_floors() is None
    default = preset("default").ppo
    assert (default.clip_per_group, default.value_coef_adapt, default.entropy_floor) == (0.0, 0.0, ())


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"clip_per_group": -1.0}, "ppo.clip_per_group must be >= 0, got -1.0"),
        ({"value_coef_adapt": -0.5}, "ppo.value_coef_adapt must be >= 0, got -0.5"),
        ({"value_coef_adapt_rate": 0.0}, "ppo.value_coef_adapt_rate must be in (0, 1], got 0.0"),
        ({"value_coef_adapt_rate": 1.5}, "ppo.value_coef_adapt_rate must be in (0, 1], got 1.5"),
        ({"value_coef_adapt": 0.3, "value_coef": 0.0}, "ppo.value_coef_adapt needs ppo.value_coef > 0"),
        ({"entropy_floor": (1.5,)}, "ppo.entropy_floor must be in [0, 1], got 1.5"),
        ({"entropy_floor": (0.1, 0.2)}, "ppo.entropy_floor needs 1 value (every head) or 8"),
        ({"entropy_floor": (0.1,), "entropy_floor_coef": 0.0},
         "ppo.entropy_floor is set with ppo.entropy_floor_coef 0"),
        ({"entropy_floor_coef": -1.0}, "ppo.entropy_floor_coef must be >= 0, got -1.0"),
    ],
)  # fmt: skip
def test_bad_learner_options_are_refused_in_one_line(kw, message):
    with pytest.raises(ValueError, match=re.escape(message)) as exc:
        PPOConfig(**kw)
    assert "\n" not in str(exc.value)


def test_off_the_update_reports_no_option_and_on_each_reports_its_own():
    _, _, off = _trained(BASE)
    assert "value_coef" not in off and "loss_entropy_floor" not in off
    _, _, floor = _trained(dataclasses.replace(BASE, entropy_floor=(1.0,)))
    assert floor["loss_entropy_floor"] > 0 and "value_coef" not in floor
    _, _, adapt = _trained(dataclasses.replace(BASE, value_coef_adapt=0.2))
    assert adapt["value_coef"] > 0 and "loss_entropy_floor" not in adapt


# --------------------------------------------------------------------------------- per-group clipping
def test_M19_per_group_clip_scales_each_group_to_its_bound_then_the_global_clip():
    """001 M19 / 000 MED-1: each group the gradient health reports (trunk, eight heads, value) is clipped
    on its own, from the health's pre-clip norms; the global clip then scales what is left."""
    cfg = dataclasses.replace(BASE, clip_per_group=0.05, max_grad_norm=1e6)
    _, trainer = _make(cfg)
    seen = _record_clips(trainer)
    trainer.update(make_rollout(trainer.policy, trainer, seed=11))
    assert len(seen) == 4
    clipped = 0
    for before, after in seen:
        torch.testing.assert_close(after, torch.clamp(before, max=0.05), rtol=1e-4, atol=1e-7)
        clipped += int((before > 0.05).sum())
    assert clipped and clipped < 4 * len(GRAD_GROUPS)  # some groups were cut, others were not
    # with a global clip below the groups' sum, it scales every group alike after the per-group clip
    cfg = dataclasses.replace(BASE, clip_per_group=0.05, max_grad_norm=0.02)
    _, trainer = _make(cfg)
    seen = _record_clips(trainer)
    trainer.update(make_rollout(trainer.policy, trainer, seed=11))
    for before, after in seen:
        capped = torch.clamp(before, max=0.05)
        factor = min(1.0, 0.02 / (float(capped.square().sum().sqrt()) + 1e-6))
        torch.testing.assert_close(after, capped * factor, rtol=1e-4, atol=1e-7)


def test_M19_a_per_group_bound_above_every_group_changes_nothing():
    policy_off, _, m_off = _trained(BASE)
    policy_on, _, m_on = _trained(dataclasses.replace(BASE, clip_per_group=1e6))
    for a, b in zip(_params(policy_off), _params(policy_on), strict=True):
        assert torch.equal(a, b)
    assert m_on["grad_norm"] == m_off["grad_norm"]


# ------------------------------------------------------------------------- adaptive value coefficient
def test_value_coef_adapt_follows_its_rule_from_value_coef_and_weighs_the_critic_loss():
    """000 MED-2: the coefficient starts at ``ppo.value_coef`` (the first step is the fixed
    coefficient's step exactly), then after each step moves by
    :func:`esper.core.health.adapt_value_coef` of that step's value-head and policy-heads gradient
    norms; the update reports the mean coefficient it used."""
    cfg = dataclasses.replace(BASE, value_coef_adapt=0.2, value_coef_adapt_rate=0.5)
    _, trainer = _make(cfg)
    used = []
    seen = _record_clips(trainer)
    original = trainer.learner.clip
    trainer.learner.clip = lambda health: (used.append(trainer.learner.value_coef.clone()), original(health))
    m = trainer.update(make_rollout(trainer.policy, trainer, seed=11), detail=True)
    _, _, m_fixed = _trained(BASE, detail=True)
    steps, fixed = m["detail"]["steps"], m_fixed["detail"]["steps"]
    assert steps["loss_critic"][0] == pytest.approx(fixed["loss_critic"][0], rel=1e-6)
    assert steps["grad/group_norms"][0] == pytest.approx(fixed["grad/group_norms"][0], rel=1e-5)
    coef = torch.tensor(cfg.value_coef)
    v, heads = GRAD_GROUPS.index("value"), slice(1, len(GRAD_GROUPS) - 1)
    for k, (norms, _) in enumerate(seen):
        assert float(used[k]) == pytest.approx(float(coef)), k
        kw = dict(target=0.2, rate=0.5, low=0.5 / VALUE_COEF_RANGE, high=0.5 * VALUE_COEF_RANGE)
        coef = adapt_value_coef(coef, norms[v], norms[heads].square().sum().sqrt(), **kw)
    assert float(trainer.learner.value_coef) == pytest.approx(float(coef))
    assert float(coef) != cfg.value_coef
    assert m["value_coef"] == pytest.approx(sum(float(c) for c in used) / len(used))
    assert steps["value_coef"] == pytest.approx([float(c) for c in used])


def test_value_coef_adapt_goes_into_the_checkpoint_and_back_with_a_rollback():
    cfg = dataclasses.replace(BASE, value_coef_adapt=0.2)
    _, trainer, _ = _trained(cfg)
    moved = trainer.learner.value_coef.clone()
    assert float(moved) != cfg.value_coef
    _, fresh = _make(cfg, seed=3)
    resume(fresh, resume_state(trainer))
    assert torch.equal(fresh.learner.value_coef, moved)
    start = fresh._learner_state()
    fresh.learner.value_coef = moved * 2
    fresh._restore_learner(start)
    assert torch.equal(fresh.learner.value_coef, moved)
    _, off, _ = _trained(BASE)
    assert "value_coef" not in off.state_dict() and off.learner.value_coef is None


# ------------------------------------------------------------------------------------ entropy floor
def test_P4_an_entropy_floor_over_every_head_moves_the_policy_and_a_floor_at_zero_does_not():
    """004 P-4: the hinge reaches the update (not annealed: it acts with the entropy coefficient at 0);
    a floor no entropy is under adds nothing."""
    base = dataclasses.replace(BASE, entropy_coef=0.0)
    policy_off, _, _ = _trained(base)
    policy_zero, _, m_zero = _trained(dataclasses.replace(base, entropy_floor=(0.0,)))
    policy_on, _, m_on = _trained(dataclasses.replace(base, entropy_floor=(1.0,), entropy_floor_coef=0.5))
    for a, b in zip(_params(policy_off), _params(policy_zero), strict=True):
        assert torch.equal(a, b)
    assert m_zero["loss_entropy_floor"] == 0.0
    assert m_on["loss_entropy_floor"] > 0
    moved = [not torch.equal(a, b) for a, b in zip(_params(policy_off), _params(policy_on))]
    assert any(moved)
    # every head under a floor of 1 (the masked-mean entropies of heads that counted are below 1)
    assert m_on["entropy"] > m_zero["entropy"] - 1e-6
