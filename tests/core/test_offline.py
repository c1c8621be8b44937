"""bc_loss, iql_losses (IQL as Kostrikov et al. 2021 define it) and expectile_td_losses (the Q-free
variant): against a per-step Python reference (the same head-relevance and legality counting as
ppo_loss) and a case computed by hand, their gradients, what they learn on toy problems (where the two
IQL variants differ: noisy transitions), and clear errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDict

from esper.core.loss import ppo_loss, total_loss
from esper.core.offline import bc_loss, expectile_td_losses, iql_losses
from esper.core.spec import HEADS, RELEVANCE, ActionSpec, Op
from tests.core.test_loss import factored_batch


def offline_batch(
    E: int, T: int, *, spec: ActionSpec | None = None, seed: int = 0, grad: bool = True, ops=None
):
    """A factored batch (tests.core.test_loss.factored_batch) with a reward, a terminal last step, V(s')
    and twin critics' Q(s, a) (grad) and their target copies'."""
    td = factored_batch(E, T, spec=spec, seed=seed, grad=grad, ops=ops)
    g = torch.Generator().manual_seed(seed + 1)
    terminated = torch.zeros(E, T, 1, dtype=torch.bool)
    terminated[:, -1] = torch.rand(E, 1, generator=g) > 0.5
    td["next"] = TensorDict(
        {"reward": torch.randn(E, T, 1, generator=g), "terminated": terminated,
         "state_value": torch.randn(E, T, 1, generator=g)}, [E, T],
    )  # fmt: skip
    td["current", "state_action_value"] = torch.randn(E, T, 2, generator=g).requires_grad_(grad)
    td["target"] = TensorDict({"state_action_value": torch.randn(E, T, 2, generator=g)}, [E, T])
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
def test_expectile_td_losses_match_reference(seed, E, T, expectile, temperature, max_weight, gamma):
    td = offline_batch(E, T, seed=seed)
    out = expectile_td_losses(
        td, gamma=gamma, expectile=expectile, temperature=temperature, max_weight=max_weight
    )
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


@given(
    seed=st.integers(0, 10_000),
    E=st.integers(1, 4),
    T=st.integers(1, 6),
    expectile=st.sampled_from([0.5, 0.7, 0.9]),
    temperature=st.sampled_from([0.0, 1.0, 3.0]),
    max_weight=st.sampled_from([2.0, 100.0]),
    gamma=st.sampled_from([0.9, 1.0]),
    with_valid=st.booleans(),
)
def test_iql_losses_match_reference(seed, E, T, expectile, temperature, max_weight, gamma, with_valid):
    td = offline_batch(E, T, seed=seed)
    if with_valid:
        td["collector", "mask"] = torch.rand(E, T, generator=torch.Generator().manual_seed(seed)) > 0.3
    out = iql_losses(td, gamma=gamma, expectile=expectile, temperature=temperature, max_weight=max_weight,
                     value_coef=0.7, q_coef=0.4)  # fmt: skip
    valid = td.get(("collector", "mask"), torch.ones(E, T, dtype=torch.bool)).tolist()
    v = td["current", "state_value"].squeeze(-1).tolist()
    q = td["current", "state_action_value"].tolist()
    q_target = td["target", "state_action_value"].tolist()
    r = td["next", "reward"].squeeze(-1).tolist()
    v2 = td["next", "state_value"].squeeze(-1).tolist()
    term = td["next", "terminated"].squeeze(-1).tolist()
    weights, value_terms, q_terms, advantages = [], [], [], []
    for e in range(E):
        row = []
        for t in range(T):
            u = min(q_target[e][t]) - v[e][t]
            y = r[e][t] + (0.0 if term[e][t] else gamma * v2[e][t])
            row.append(min(math.exp(temperature * u), max_weight))
            if valid[e][t]:
                value_terms.append(abs(expectile - (u < 0)) * u * u)
                q_terms.append(sum((qk - y) ** 2 for qk in q[e][t]))
                advantages.append(u)
        weights.append(row)
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0
    ref = reference(td, weights=weights)
    assert float(out["loss_objective"]) == pytest.approx(ref["loss_objective"], rel=1e-4, abs=1e-4)
    critic = 0.7 * mean(value_terms) + 0.4 * mean(q_terms)
    assert float(out["loss_critic"]) == pytest.approx(critic, rel=1e-5, abs=1e-5)
    assert float(out["expectile_loss"]) == pytest.approx(mean(value_terms), rel=1e-5, abs=1e-6)
    assert float(out["td_loss"]) == pytest.approx(mean(q_terms), rel=1e-5, abs=1e-5)
    assert float(out["advantage_mean"]) == pytest.approx(mean(advantages), abs=1e-5)
    assert float(out["log_likelihood"]) == pytest.approx(ref["log_likelihood"], abs=1e-4)


def _hand_batch(ops, op_logits, value, q, q_target, reward, terminated, next_value) -> TensorDict:
    """One episode of ``len(ops)`` steps where only the op head counts (WAIT and GERMINATE legal; every
    other head has a single legal choice): the policy term is the op head's weighted mean."""
    T = len(ops)
    spec = ActionSpec(1, 2)
    td = TensorDict({}, [1, T])
    cur = TensorDict({}, [1, T])
    for head, n in spec.sizes.items():
        mask = torch.zeros(1, T, n, dtype=torch.bool)
        mask[..., : 2 if head == "op" else 1] = True
        action = torch.tensor([ops]) if head == "op" else torch.zeros(1, T, dtype=torch.int64)
        td[head] = TensorDict({"action": action, "action_mask": mask}, [1, T])
        logits = torch.zeros(1, T, n)
        if head == "op":
            logits[0, :, :2] = torch.tensor(op_logits)
        cur[head] = TensorDict({"logits": logits.requires_grad_()}, [1, T])
    cur["state_value"] = torch.tensor([value]).requires_grad_()
    cur["state_action_value"] = torch.tensor([q]).requires_grad_()
    td["current"] = cur
    td["target"] = TensorDict({"state_action_value": torch.tensor([q_target])}, [1, T])
    td["next"] = TensorDict(
        {"reward": torch.tensor([reward]), "terminated": torch.tensor([terminated]),
         "state_value": torch.tensor([next_value])}, [1, T],
    )  # fmt: skip
    return td


def test_iql_losses_on_a_case_computed_by_hand():
    """Three steps, twin critics, every number worked out below in plain arithmetic: the TD target
    ``y = r + gamma (1 - terminated) V(s')``, Q_target the twin targets' minimum, V's expectile term on
    ``u = Q_target - V``, Q's squared errors summed over the twins, the AWR weights clipped at the cap,
    and the gradients each term sends to V and Q."""
    gamma, tau, beta, cap, value_coef, q_coef = 0.5, 0.8, 2.0, 5.0, 1.0, 0.5
    WAIT, GERM = int(Op.WAIT), int(Op.GERMINATE)
    td = _hand_batch(
        ops=[GERM, WAIT, GERM], op_logits=[0.0, math.log(3.0)],  # pi(WAIT) = 1/4, pi(GERMINATE) = 3/4
        value=[1.0, 2.0, 0.5], q=[[1.5, 1.0], [2.0, 3.0], [0.0, 1.0]],
        q_target=[[2.0, 1.5], [1.0, 3.0], [4.0, 2.0]], reward=[1.0, 0.0, 2.0],
        terminated=[False, False, True], next_value=[2.0, 4.0, 9.0],
    )  # fmt: skip
    out = iql_losses(td, gamma=gamma, expectile=tau, temperature=beta, max_weight=cap,
                     value_coef=value_coef, q_coef=q_coef)  # fmt: skip
    # Q_target = min of the twins: 1.5, 1.0, 2.0; u = Q_target - V: 0.5, -1.0, 1.5
    # TD targets: 1 + 0.5 * 2 = 2.0; 0 + 0.5 * 4 = 2.0; 2.0 (terminal: V(s') = 9 ignored)
    expectile_terms = [0.8 * 0.5**2, 0.2 * 1.0**2, 0.8 * 1.5**2]  # 0.2, 0.2, 1.8
    td_terms = [(1.5 - 2) ** 2 + (1.0 - 2) ** 2, (2 - 2) ** 2 + (3 - 2) ** 2, (0 - 2) ** 2 + (1 - 2) ** 2]
    weights = [math.exp(2.0 * 0.5), math.exp(2.0 * -1.0), 5.0]  # e, e^-2, e^3 = 20.1 clipped at 5
    log_probs = [math.log(0.75), math.log(0.25), math.log(0.75)]
    assert float(out["expectile_loss"]) == pytest.approx(2.2 / 3, rel=1e-6)
    assert sum(expectile_terms) == pytest.approx(2.2)
    assert float(out["td_loss"]) == pytest.approx(sum(td_terms) / 3, rel=1e-6)
    assert sum(td_terms) == pytest.approx(7.25)
    assert float(out["loss_critic"]) == pytest.approx(2.2 / 3 + 0.5 * 7.25 / 3, rel=1e-6)
    policy = -sum(w * lp for w, lp in zip(weights, log_probs)) / 3
    assert float(out["loss_objective"]) == pytest.approx(policy, rel=1e-6)
    assert float(out["weight_max"]) == pytest.approx(5.0)
    assert float(out["weight_clip_fraction"]) == pytest.approx(1 / 3)
    assert float(out["weight_mean"]) == pytest.approx(sum(weights) / 3, rel=1e-6)
    assert float(out["advantage_mean"]) == pytest.approx((0.5 - 1.0 + 1.5) / 3, rel=1e-6)
    assert float(out["q_mean"]) == pytest.approx((1.5 + 1.0 + 2.0) / 3, rel=1e-6)
    # gradients of loss_critic: dV = -2 |tau - 1(u < 0)| u / 3 (value_coef 1); dQ_k = 0.5 * 2 (Q_k - y) / 3
    v, q = td["current", "state_value"], td["current", "state_action_value"]
    g_v, g_q = torch.autograd.grad(out["loss_critic"], [v, q])
    expect_v = [-2 * 0.8 * 0.5 / 3, -2 * 0.2 * -1.0 / 3, -2 * 0.8 * 1.5 / 3]
    expect_q = [[(1.5 - 2) / 3, (1.0 - 2) / 3], [0.0, 1 / 3], [-2 / 3, -1 / 3]]
    torch.testing.assert_close(g_v, torch.tensor([expect_v]))
    torch.testing.assert_close(g_q, torch.tensor([expect_q]))
    # the policy's gradient on the op logits: -w (onehot(a) - pi) / 3 at each step
    (g_logits,) = torch.autograd.grad(out["loss_objective"], [td["current", "op", "logits"]])
    pi = [0.25, 0.75]
    for t, (a, w) in enumerate(zip([1, 0, 1], weights)):
        expect = [-w * ((i == a) - pi[i]) / 3 for i in range(2)]
        torch.testing.assert_close(g_logits[0, t, :2], torch.tensor(expect))


def _toy(spec: ActionSpec, ops: torch.Tensor, reward: torch.Tensor) -> TensorDict:
    """One state, N one-step (terminal) episodes taking ``ops`` (WAIT or GERMINATE; the other heads have
    a single legal choice) and paid ``reward``."""
    N = ops.shape[0]
    td = TensorDict({}, [N, 1])
    for head, n in spec.sizes.items():
        mask = torch.zeros(N, 1, n, dtype=torch.bool)
        mask[..., : 2 if head == "op" else 1] = True
        action = ops.view(N, 1) if head == "op" else torch.zeros(N, 1, dtype=torch.int64)
        td[head] = TensorDict({"action": action, "action_mask": mask}, [N, 1])
    td["current"] = TensorDict({h: TensorDict({"logits": torch.zeros(N, 1, n)}, [N, 1])
                                for h, n in spec.sizes.items()}, [N, 1])  # fmt: skip
    td["next"] = TensorDict(
        {"reward": reward.view(N, 1), "terminated": torch.ones(N, 1, dtype=torch.bool),
         "state_value": torch.zeros(N, 1)}, [N, 1],
    )  # fmt: skip
    return td


def test_iql_differs_from_the_td_sample_variant_where_transitions_are_noisy():
    """WAIT always pays 0.6; GERMINATE pays 0 or 1 (mean 0.5). IQL's twin Q averages the noise out
    (Q(WAIT) 0.6, Q(GERMINATE) 0.5), so V is the 0.9-expectile of {0.6, 0.5} over the data's actions
    (0.59, no higher than the best action's mean) and the policy favours WAIT, the better action. The
    TD-sample variant takes V's expectile over the sampled returns {0.6, 0, 1}: V ends near 0.85, above
    every action's mean (optimism about lucky transitions), and its weights favour the lucky GERMINATE
    samples, so its policy prefers the worse action."""
    torch.manual_seed(0)
    spec = ActionSpec(1, 2)
    N = 8
    ops = (torch.arange(N) % 2).long()  # WAIT (0), GERMINATE (1) in equal parts
    reward = torch.where(ops == 0, 0.6, (torch.arange(N) // 2 % 2).float())  # GERMINATE: 0, 1, 0, 1, ...
    td = _toy(spec, ops, reward)
    tau, beta, polyak = 0.9, 3.0, 0.1
    results = {}
    for fn in (iql_losses, expectile_td_losses):
        v = torch.zeros((), requires_grad=True)
        q = torch.tensor([[0.0, 0.3], [0.2, -0.1]], requires_grad=True)  # [op, critic]: twins apart
        q_target = q.detach().clone()
        logits = torch.zeros(spec.sizes["op"], requires_grad=True)
        opt = torch.optim.Adam([v, q, logits], lr=0.1)
        for _ in range(200):
            td["current", "op", "logits"] = logits.expand(N, 1, spec.sizes["op"])
            td["current", "state_value"] = v.expand(N, 1)
            td["current", "state_action_value"] = q[ops].view(N, 1, 2)
            td["target", "state_action_value"] = q_target[ops].view(N, 1, 2)
            loss = total_loss(fn(td, expectile=tau, temperature=beta))
            opt.zero_grad()
            loss.backward()
            opt.step()
            q_target.lerp_(q.detach(), polyak)
        results[fn.__name__] = (v.item(), torch.softmax(logits[:2].detach(), 0)[0].item(), q.detach())
    v_iql, p_wait_iql, q_iql = results["iql_losses"]
    v_td, p_wait_td, _ = results["expectile_td_losses"]
    torch.testing.assert_close(q_iql, torch.tensor([[0.6, 0.6], [0.5, 0.5]]), atol=0.02, rtol=0)
    assert v_iql == pytest.approx(0.59, abs=0.02)  # 0.9 (0.6 - V) = 0.1 (V - 0.5)
    assert v_td == pytest.approx(0.85, abs=0.03)  # 0.9 * 0.25 (1 - V) = 0.1 (0.25 V + 0.5 (V - 0.6))
    assert p_wait_iql > 0.55  # exp(3 * 0.1) : 1 -> 0.57
    assert p_wait_td < 0.42  # 1 : (exp(3 * 0.4) + exp(-3 * 0.6)) / 2 -> 0.37


def test_iql_at_temperature_zero_is_bc_and_gradients_reach_policy_and_critic_only_through_their_terms():
    td = offline_batch(3, 5, seed=11)
    bc = bc_loss(td)
    v, q = td["current", "state_value"], td["current", "state_action_value"]
    leaves = [td["current", h, "logits"] for h in HEADS]
    for fn in (iql_losses, expectile_td_losses):
        out = fn(td, temperature=0.0)
        torch.testing.assert_close(out["loss_objective"], bc["loss_objective"])
        grads = torch.autograd.grad(out["loss_objective"], [v, q], allow_unused=True)
        assert all(g is None for g in grads)  # the weight is detached: the advantage trains no critic
        assert all(g is None for g in torch.autograd.grad(out["loss_critic"], leaves, allow_unused=True))


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
        loss = total_loss(expectile_td_losses(td, expectile=0.9, temperature=3.0))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(v) == pytest.approx(0.9, abs=0.03)  # the 0.9-expectile of {0, 1} in equal parts
    p = torch.softmax(op_logits[:2].detach(), 0)
    assert p[1] > 0.7  # weights exp(3 * 0.1) against exp(3 * -0.9): GERMINATE


def test_bad_coefficients_and_missing_keys_fail_in_one_line():
    td = offline_batch(2, 3, seed=2)
    for fn in (iql_losses, expectile_td_losses):
        with pytest.raises(ValueError, match="expectile"):
            fn(td, expectile=1.0)
        with pytest.raises(ValueError, match="temperature"):
            fn(td, temperature=-1.0)
        with pytest.raises(ValueError, match="max_weight"):
            fn(td, max_weight=0.0)
    with pytest.raises(ValueError, match="q_coef"):
        iql_losses(td, q_coef=-1.0)
    with pytest.raises(TypeError, match="entropy_coef"):
        bc_loss(td, entropy_coef=torch.tensor(0.1))
    with pytest.raises(ValueError, match="iql_losses: \\('current', 'state_action_value'\\) must have shape"):
        iql_losses(td.clone().set(("current", "state_action_value"), torch.zeros(2, 3, 2, 1)))
    with pytest.raises(KeyError, match="iql_losses: missing key \\('target', 'state_action_value'\\)"):
        iql_losses(td.exclude("target"))
    del td["next", "state_value"]
    with pytest.raises(KeyError, match="expectile_td_losses: missing key \\('next', 'state_value'\\)"):
        expectile_td_losses(td)
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
    for out in (iql_losses(td, temperature=3.0), expectile_td_losses(td, temperature=3.0), bc_loss(td)):
        total = total_loss(out)
        assert torch.isfinite(total)
        grads = torch.autograd.grad(total, [td["current", h, "logits"] for h in HEADS], allow_unused=True)
        assert all(g is None or torch.isfinite(g).all() for g in grads)
