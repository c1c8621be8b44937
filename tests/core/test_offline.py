"""bc_loss and iql_losses: against a per-step Python reference (the same head-relevance and legality
counting as ppo_loss), their gradients, what they learn on a toy problem, and clear errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDict

from esper.core.loss import ppo_loss, total_loss
from esper.core.offline import bc_loss, iql_losses
from esper.core.spec import HEADS, RELEVANCE, ActionSpec, Op
from tests.core.test_loss import factored_batch


def offline_batch(
    E: int, T: int, *, spec: ActionSpec | None = None, seed: int = 0, grad: bool = True, ops=None
):
    """A factored batch (tests.core.test_loss.factored_batch) with a reward, a terminal last step and a
    target critic's V(s')."""
    td = factored_batch(E, T, spec=spec, seed=seed, grad=grad, ops=ops)
    g = torch.Generator().manual_seed(seed + 1)
    terminated = torch.zeros(E, T, 1, dtype=torch.bool)
    terminated[:, -1] = torch.rand(E, 1, generator=g) > 0.5
    td["next"] = TensorDict(
        {"reward": torch.randn(E, T, 1, generator=g), "terminated": terminated,
         "state_value": torch.randn(E, T, 1, generator=g)}, [E, T],
    )  # fmt: skip
    return td


def reference(td: TensorDict, *, weights=None, entropy_coef=0.0) -> dict:
    """Per step and head in Python floats: the counted steps' mean (weighted) log-likelihood, entropy
    and greedy accuracy per head; the joint greedy accuracy over valid steps."""
    E, T = td.batch_size
    valid = td.get(("collector", "mask"), torch.ones(E, T, dtype=torch.bool)).tolist()
    heads = {h: {"ll": [], "wll": [], "ent": [], "acc": []} for h in HEADS}
    joint = []
    for e in range(E):
        for t in range(T):
            if not valid[e][t]:
                continue
            op = Op(int(td["op", "action"][e, t]))
            ok = True
            for head in HEADS:
                mask = td[head, "action_mask"][e, t].tolist()
                if not (head == "op" or head in RELEVANCE[op]) or sum(mask) <= 1:
                    continue
                logits = td["current", head, "logits"][e, t].tolist()
                legal = [i for i, m in enumerate(mask) if m]
                lse = math.log(sum(math.exp(logits[i]) for i in legal))
                a = int(td[head, "action"][e, t])
                lp = logits[a] - lse
                w = 1.0 if weights is None else weights[e][t]
                best = max(legal, key=lambda i: logits[i])
                heads[head]["ll"].append(lp)
                heads[head]["wll"].append(w * lp)
                ent = -sum(math.exp(logits[i] - lse) * (logits[i] - lse) for i in legal)
                heads[head]["ent"].append(ent / math.log(len(legal)))
                heads[head]["acc"].append(float(best == a))
                ok = ok and best == a
            joint.append(float(ok))
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0
    per = {h: {k: mean(v) for k, v in d.items()} for h, d in heads.items()}
    return {
        "heads": per,
        "loss_objective": -sum(per[h]["wll"] for h in HEADS),
        "log_likelihood": sum(per[h]["ll"] for h in HEADS),
        "entropy": sum(per[h]["ent"] for h in HEADS),
        "loss_entropy": -entropy_coef * sum(per[h]["ent"] for h in HEADS),
        "accuracy": mean(joint),
    }


@given(
    seed=st.integers(0, 10_000),
    E=st.integers(1, 4),
    T=st.integers(1, 7),
    n_slots=st.integers(1, 4),
    n_bp=st.integers(1, 6),
    with_valid=st.booleans(),
    entropy_coef=st.sampled_from([0.0, 0.05]),
)
def test_bc_loss_matches_reference(seed, E, T, n_slots, n_bp, with_valid, entropy_coef):
    td = factored_batch(E, T, spec=ActionSpec(n_slots, n_bp), seed=seed)
    if with_valid:
        td["collector", "mask"] = torch.rand(E, T, generator=torch.Generator().manual_seed(seed)) > 0.3
    out = bc_loss(td, entropy_coef=entropy_coef, value_coef=0.5)
    ref = reference(td, entropy_coef=entropy_coef)
    for key in ("loss_objective", "log_likelihood", "entropy", "loss_entropy", "accuracy"):
        assert float(out[key].detach()) == pytest.approx(ref[key], abs=1e-4), key
    for head in HEADS:
        assert float(out[head, "log_likelihood"]) == pytest.approx(ref["heads"][head]["ll"], abs=1e-4)
        assert float(out[head, "accuracy"]) == pytest.approx(ref["heads"][head]["acc"], abs=1e-6)
    # the critic regresses to value_target: 0.5 * value_coef * mean squared error over valid steps
    valid = td.get(("collector", "mask"), torch.ones(E, T, dtype=torch.bool))
    err = (td["current", "state_value"] - td["value_target"]).squeeze(-1).detach()[valid]
    expected = 0.25 * err.square().mean().item() if err.numel() else 0.0
    assert float(out["loss_critic"]) == pytest.approx(expected, abs=1e-5)


def test_bc_counts_the_heads_ppo_loss_counts():
    """The same relevance and legality (P1, H3): a head's weight equals ppo_loss's."""
    td = factored_batch(4, 9, seed=3)
    td["collector", "mask"] = torch.rand(4, 9, generator=torch.Generator().manual_seed(1)) > 0.2
    bc, ppo = bc_loss(td), ppo_loss(td, factored=True)
    for head in HEADS:
        torch.testing.assert_close(bc[head, "weight"], ppo[head, "weight"])


def test_bc_without_critic_inputs_has_no_critic_term():
    td = factored_batch(2, 4, seed=5)
    del td["value_target"]
    out = bc_loss(td)
    assert "loss_critic" not in out.keys()
    total_loss(out).backward()  # the policy terms alone


@given(
    seed=st.integers(0, 10_000),
    E=st.integers(1, 4),
    T=st.integers(1, 6),
    expectile=st.sampled_from([0.5, 0.7, 0.9]),
    temperature=st.sampled_from([0.0, 1.0, 3.0]),
    max_weight=st.sampled_from([2.0, 100.0]),
    gamma=st.sampled_from([0.9, 1.0]),
)
def test_iql_losses_match_reference(seed, E, T, expectile, temperature, max_weight, gamma):
    td = offline_batch(E, T, seed=seed)
    out = iql_losses(td, gamma=gamma, expectile=expectile, temperature=temperature, max_weight=max_weight)
    v = td["current", "state_value"].squeeze(-1).tolist()
    r = td["next", "reward"].squeeze(-1).tolist()
    v2 = td["next", "state_value"].squeeze(-1).tolist()
    term = td["next", "terminated"].squeeze(-1).tolist()
    weights, value_terms, advantages = [], [], []
    for e in range(E):
        row = []
        for t in range(T):
            q = r[e][t] + (0.0 if term[e][t] else gamma * v2[e][t])
            u = q - v[e][t]
            value_terms.append(abs(expectile - (u < 0)) * u * u)
            advantages.append(u)
            row.append(min(math.exp(temperature * u), max_weight))
        weights.append(row)
    ref = reference(td, weights=weights)
    assert float(out["loss_objective"]) == pytest.approx(ref["loss_objective"], rel=1e-4, abs=1e-4)
    assert float(out["loss_critic"]) == pytest.approx(sum(value_terms) / len(value_terms), rel=1e-5, abs=1e-6)
    assert float(out["advantage_mean"]) == pytest.approx(sum(advantages) / len(advantages), abs=1e-5)
    assert float(out["weight_max"]) == pytest.approx(max(max(w) for w in weights), rel=1e-5)
    assert float(out["log_likelihood"]) == pytest.approx(ref["log_likelihood"], abs=1e-4)


def test_iql_at_temperature_zero_is_bc_and_gradients_reach_policy_and_critic_only_through_their_terms():
    td = offline_batch(3, 5, seed=11)
    iql = iql_losses(td, temperature=0.0)
    bc = bc_loss(td)
    torch.testing.assert_close(iql["loss_objective"], bc["loss_objective"])
    v = td["current", "state_value"]
    (g_policy,) = torch.autograd.grad(iql["loss_objective"], [v], allow_unused=True)
    assert g_policy is None  # the weight is detached: the advantage does not train the critic
    leaves = [td["current", h, "logits"] for h in HEADS]
    assert all(g is None for g in torch.autograd.grad(iql["loss_critic"], leaves, allow_unused=True))


def test_expectile_value_leans_toward_the_better_actions():
    """One state, two stored outcomes (0 and 1): V by expectile regression goes to the tau-expectile,
    above the mean (0.5) for tau > 0.5, and the advantage-weighted policy prefers the better action."""
    torch.manual_seed(0)
    spec = ActionSpec(1, 2)
    N = 64
    better = torch.arange(N) % 2  # op GERMINATE (1) pays 1, WAIT (0) pays 0
    v = torch.zeros((), requires_grad=True)
    op_logits = torch.zeros(spec.sizes["op"], requires_grad=True)
    opt = torch.optim.Adam([v, op_logits], lr=0.05)
    td = TensorDict({}, [N, 1])
    cur = TensorDict({}, [N, 1])
    for head, n in spec.sizes.items():
        mask = torch.zeros(N, 1, n, dtype=torch.bool)
        mask[..., : 2 if head == "op" else 1] = True
        action = better.view(N, 1) if head == "op" else torch.zeros(N, 1, dtype=torch.int64)
        td[head] = TensorDict({"action": action, "action_mask": mask}, [N, 1])
        cur[head] = TensorDict({"logits": torch.zeros(N, 1, n)}, [N, 1])
    td["current"] = cur
    td["next"] = TensorDict(
        {"reward": better.view(N, 1).float(), "terminated": torch.ones(N, 1, dtype=torch.bool),
         "state_value": torch.zeros(N, 1)}, [N, 1],
    )  # fmt: skip
    for _ in range(150):
        td["current", "op", "logits"] = op_logits.expand(N, 1, spec.sizes["op"])
        td["current", "state_value"] = v.expand(N, 1)
        loss = total_loss(iql_losses(td, expectile=0.9, temperature=3.0))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(v) == pytest.approx(0.9, abs=0.03)  # the 0.9-expectile of {0, 1} in equal parts
    p = torch.softmax(op_logits[:2].detach(), 0)
    assert p[1] > 0.7  # weights exp(3 * 0.1) against exp(3 * -0.9): GERMINATE


def test_bad_coefficients_and_missing_keys_fail_in_one_line():
    td = offline_batch(2, 3, seed=2)
    with pytest.raises(ValueError, match="expectile"):
        iql_losses(td, expectile=1.0)
    with pytest.raises(ValueError, match="temperature"):
        iql_losses(td, temperature=-1.0)
    with pytest.raises(ValueError, match="max_weight"):
        iql_losses(td, max_weight=0.0)
    with pytest.raises(TypeError, match="entropy_coef"):
        bc_loss(td, entropy_coef=torch.tensor(0.1))
    del td["next", "state_value"]
    with pytest.raises(KeyError, match="iql_losses: missing key \\('next', 'state_value'\\)"):
        iql_losses(td)
    del td["current", "slot"]
    with pytest.raises(KeyError, match="bc_loss: mismatched head sets"):
        bc_loss(td)


def test_an_irrelevant_heads_illegal_stored_action_leaves_the_losses_finite():
    """A rule stores 0 for the heads its op ignores, which may be a masked choice (``noop``): the
    weighted log-likelihood must not turn its -huge log-prob times a weight times 0 into NaN."""
    td = offline_batch(3, 4, seed=7, ops=[int(Op.WAIT)] * 4)
    td["blueprint", "action_mask"][..., 0] = False
    td["blueprint", "action"].zero_()
    td["next", "reward"] = td["next", "reward"] * 10.0  # large advantages: large weights
    for out in (iql_losses(td, temperature=3.0), bc_loss(td)):
        total = total_loss(out)
        assert torch.isfinite(total)
        grads = torch.autograd.grad(total, [td["current", h, "logits"] for h in HEADS], allow_unused=True)
        assert all(g is None or torch.isfinite(g).all() for g in grads)
