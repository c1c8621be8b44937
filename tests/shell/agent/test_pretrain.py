"""The offline learner's IQL (issue 104): the Q heads over the trunk features and the stored factored
action (:class:`esper.shell.agent.pretrain.ActionValueHead`), and ``fit`` with ``iql`` and
``expectile_td`` on a small synthetic dataset (no run, no host: the dataset end to end is
tests/shell/eval/test_offline.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from esper.core.spec import HEADS, ActionSpec, Op
from esper.shell.agent.agent import build_agent
from esper.shell.agent.config import PPOConfig
from esper.shell.agent.pretrain import ActionValueHead, OfflineConfig, OfflineLearner

SPEC = ActionSpec(n_slots=2, n_blueprints=3)


def test_action_value_head_reads_only_the_heads_the_stored_op_made_relevant():
    torch.manual_seed(0)
    q = ActionValueHead(16, SPEC.sizes, head_hidden=8)
    feats = torch.randn(4, 5, 16)
    g = torch.Generator().manual_seed(1)
    actions = {h: torch.randint(0, n, (4, 5), generator=g) for h, n in SPEC.sizes.items()}
    actions["op"] = torch.full((4, 5), int(Op.GERMINATE))
    out = q(feats, actions)
    assert out.shape == (4, 5, 2) and not torch.equal(out[..., 0], out[..., 1])  # twin, apart
    other = lambda head: {**actions, head: (actions[head] + 1) % SPEC.sizes[head]}
    assert not torch.allclose(q(feats, other("blueprint")), out)  # relevant to GERMINATE
    torch.testing.assert_close(q(feats, other("alpha_speed")), out, rtol=0, atol=0)  # irrelevant to it
    wait = {**actions, "op": torch.zeros_like(actions["op"])}
    base = q(feats, wait)
    for head in HEADS[1:]:  # WAIT: no other head matters
        torch.testing.assert_close(q(feats, {**other(head), "op": wait["op"]}), base, rtol=0, atol=0)
    with pytest.raises(ValueError, match="sizes for the heads"):
        ActionValueHead(16, {"op": 6}, head_hidden=8)


def _dataset(N: int, T: int, obs_dim: int, seed: int) -> TensorDict:
    """N episodes of T steps: WAIT pays 0, GERMINATE 1 plus noise; the other heads' choices random."""
    g = torch.Generator().manual_seed(seed)
    steps = TensorDict({}, [N, T])
    for head, n in SPEC.sizes.items():
        mask = torch.ones(N, T, n, dtype=torch.bool)
        if head == "op":
            mask[..., 2:] = False  # WAIT and GERMINATE legal
        action = torch.randint(0, 2 if head == "op" else n, (N, T), generator=g)
        steps[head] = TensorDict({"action": action, "action_mask": mask}, [N, T])
    steps["observation"] = torch.randn(N, T, obs_dim, generator=g)
    germ = steps["op", "action"] == int(Op.GERMINATE)
    reward = torch.where(germ, 1.0 + torch.randn(N, T, generator=g), 0.0)
    terminated = torch.zeros(N, T, dtype=torch.bool)
    terminated[:, -1] = True
    steps["next"] = TensorDict({"reward": reward, "terminated": terminated}, [N, T])
    final = TensorDict({"observation": torch.randn(N, obs_dim, generator=g)}, [N])
    return TensorDict({"steps": steps, "final": final}, [N])


def _learner(seed: int = 0) -> OfflineLearner:
    torch.manual_seed(seed)
    ppo = PPOConfig(policy="flat", hidden=16, head_hidden=8)
    agent = build_agent(ppo, SPEC, device="cpu")
    return OfflineLearner(agent, ppo, OfflineConfig(minibatch=4, lr=3e-3, target_tau=0.1), seed=seed)


def test_iql_fit_trains_twin_q_v_and_the_policy_and_moves_the_targets():
    learner = _learner()
    data = _dataset(8, 5, learner.policy.obs_dim, seed=2)
    policy_before = copy.deepcopy(learner.policy.state_dict())
    reports = learner.fit(data, "iql", 15)
    assert learner.q is not None and learner.q_target is not None and learner.target is not None
    assert not any(p.requires_grad for p in learner.q_target.parameters())
    keys = ("td_loss", "expectile_loss", "q_mean", "q_explained_variance", "weight_mean", "advantage_mean")
    for key in keys:
        assert key in reports[-1], key
    assert reports[-1]["td_loss"] < reports[0]["td_loss"]  # Q learns the rewards
    # the Q heads are in the optimizer and the trunk moved; the targets moved towards the trained nets
    assert any(g["params"][0] is next(learner.q.parameters()) for g in learner.optimizer.param_groups)
    assert not torch.equal(learner.policy.state_dict()["encoder.0.weight"], policy_before["encoder.0.weight"])
    assert not torch.equal(learner.target.state_dict()["encoder.0.weight"], policy_before["encoder.0.weight"])
    for t, p in zip(learner.q_target.parameters(), learner.q.parameters()):
        assert torch.isfinite(t).all() and not torch.equal(t, p)
    # Q of GERMINATE (pays 1 on average) is above Q of WAIT (pays 0) on the data's states
    steps = data["steps"]
    feats, _ = learner.policy.features(steps["observation"], learner.policy.initial_state(8))
    acts = {h: steps[h, "action"] for h in HEADS}
    with torch.no_grad():
        q_germ = learner.q(feats, {**acts, "op": torch.full_like(acts["op"], int(Op.GERMINATE))})
        q_wait = learner.q(feats, {**acts, "op": torch.zeros_like(acts["op"])})
    gap = float((q_germ - q_wait).mean())
    assert gap > 0.3, gap


def test_expectile_td_keeps_the_q_free_variant_and_bc_makes_no_q():
    learner = _learner(1)
    data = _dataset(8, 4, learner.policy.obs_dim, seed=3)
    learner.fit(data, "bc", 1)
    assert learner.q is None and learner.target is None
    reports = learner.fit(data, "expectile_td", 2)
    assert learner.q is None and learner.target is not None
    assert "weight_mean" in reports[-1] and "td_loss" not in reports[-1]
    with pytest.raises(ValueError, match="expectile_td"):
        learner.fit(data, "cql", 1)
    assert OfflineConfig().algo == "iql" and OfflineConfig(algo="expectile_td").algo == "expectile_td"
