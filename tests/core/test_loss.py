"""ppo_loss: against a per-step Python reference, TorchRL's ClipPPOLoss on a single head, the
findings it fixes (H3, H6, M20, P1, C4 anchor), and clear errors on bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDict

from esper.core import distributions as D
from esper.core.loss import kl_early_stop, ppo_loss, total_loss
from esper.core.spec import HEADS, RELEVANCE, ActionSpec, Op


# ------------------------------------------------------------------------------------------- fixtures
def factored_batch(
    E: int = 3, T: int = 6, *, spec: ActionSpec | None = None, seed: int = 0, ops=None, grad: bool = True
) -> TensorDict:
    """A factored batch whose actions were sampled from random masked logits ("old") and whose
    current logits are a perturbation of those."""
    spec = spec or ActionSpec(3, 5)
    g = torch.Generator().manual_seed(seed)
    td = TensorDict({}, [E, T])
    current = TensorDict({}, [E, T])
    for head, n in spec.sizes.items():
        mask = torch.rand(E, T, n, generator=g) > 0.35
        mask[..., 0] |= ~mask.any(-1)
        if head == "op":
            mask[..., Op.WAIT] = True
        old_logits = torch.randn(E, T, n, generator=g)
        action = D.sample(old_logits, mask, generator=g)
        if head == "op" and ops is not None:
            action = torch.as_tensor(ops).expand(E, T).clone()
            mask.scatter_(-1, action.unsqueeze(-1), True)
        new_logits = (old_logits + 0.4 * torch.randn(E, T, n, generator=g)).requires_grad_(grad)
        td[head] = TensorDict(
            {"action": action, "action_log_prob": D.log_prob(old_logits, action, mask), "action_mask": mask},
            [E, T],
        )
        current[head] = TensorDict({"logits": new_logits}, [E, T])
    current["state_value"] = torch.randn(E, T, 1, generator=g).requires_grad_(grad)
    td["current"] = current
    td["advantage"] = torch.randn(E, T, 1, generator=g)
    td["state_value"] = torch.randn(E, T, 1, generator=g)
    td["value_target"] = torch.randn(E, T, 1, generator=g)
    return td


def _ref_distance(v: float, t: float, kind: str) -> float:
    d = v - t
    if kind == "half_l2":
        return 0.5 * d * d
    if kind == "l2":
        return d * d
    return 0.5 * d * d if abs(d) < 1.0 else abs(d) - 0.5  # smooth_l1, delta 1


def reference_factored(
    td: TensorDict,
    *,
    eps=0.2,
    value_clip=10.0,
    value_coef=0.5,
    ent_coef=0.01,
    critic_loss="half_l2",
    normalize_entropy=True,
) -> dict:
    """Per step, per head, in plain Python floats."""
    E, T = td.batch_size
    adv = td["advantage"].squeeze(-1).tolist()
    per_head = {h: {"surr": [], "ent": [], "kl": [], "clip": []} for h in HEADS}
    joint_kl = []
    valid = td.get(("collector", "mask"), torch.ones(E, T, dtype=torch.bool)).tolist()
    for e in range(E):
        for t in range(T):
            if not valid[e][t]:
                continue
            op = Op(int(td["op", "action"][e, t]))
            step_kl = 0.0
            for head in HEADS:
                mask = td[head, "action_mask"][e, t].tolist()
                if not (head == "op" or head in RELEVANCE[op]) or sum(mask) <= 1:
                    continue
                logits = td["current", head, "logits"][e, t].tolist()
                legal = [i for i, m in enumerate(mask) if m]
                lse = math.log(sum(math.exp(logits[i]) for i in legal))
                a = int(td[head, "action"][e, t])
                lp = logits[a] - lse
                r = math.exp(lp - float(td[head, "action_log_prob"][e, t]))
                A = adv[e][t]
                per_head[head]["surr"].append(-min(r * A, min(max(r, 1 - eps), 1 + eps) * A))
                ent = -sum(math.exp(logits[i] - lse) * (logits[i] - lse) for i in legal)
                per_head[head]["ent"].append(ent / math.log(len(legal)) if normalize_entropy else ent)
                k3 = (r - 1) - math.log(r)
                per_head[head]["kl"].append(k3)
                per_head[head]["clip"].append(float(abs(r - 1) > eps))
                step_kl += k3
            joint_kl.append(step_kl)
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0
    out = {h: {k: mean(v) for k, v in d.items()} for h, d in per_head.items()}
    v = td["current", "state_value"].squeeze(-1).tolist()
    v_old = td["state_value"].squeeze(-1).tolist()
    tgt = td["value_target"].squeeze(-1).tolist()
    vl = []
    for e in range(E):
        for t in range(T):
            if valid[e][t]:
                clipped = v_old[e][t] + min(max(v[e][t] - v_old[e][t], -value_clip), value_clip)
                dist = [_ref_distance(x, tgt[e][t], critic_loss) for x in (v[e][t], clipped)]
                vl.append(max(dist))
    return {
        "heads": out,
        "loss_objective": sum(out[h]["surr"] for h in HEADS),
        "entropy": sum(out[h]["ent"] for h in HEADS),
        "loss_entropy": -ent_coef * sum(out[h]["ent"] for h in HEADS),
        "kl_approx": mean(joint_kl),
        "loss_critic": value_coef * mean(vl),
    }


# -------------------------------------------------------------------------------------------- tests
@given(
    seed=st.integers(0, 10_000),
    E=st.integers(1, 4),
    T=st.integers(1, 7),
    n_slots=st.integers(1, 4),
    n_bp=st.integers(1, 6),
    value_clip=st.sampled_from([0.05, 0.5, 10.0]),
    with_valid=st.booleans(),
    critic_loss=st.sampled_from(["half_l2", "l2", "smooth_l1"]),
    normalize_entropy=st.booleans(),
)
def test_factored_loss_matches_reference(
    seed, E, T, n_slots, n_bp, value_clip, with_valid, critic_loss, normalize_entropy
):
    td = factored_batch(E, T, spec=ActionSpec(n_slots, n_bp), seed=seed)
    td["value_target"] = td["value_target"] * 2.0  # errors on both sides of smooth_l1's |d| = 1
    if with_valid:
        valid = torch.rand(E, T, generator=torch.Generator().manual_seed(seed)) > 0.3
        td["collector", "mask"] = valid
    kw = dict(value_clip=value_clip, critic_loss=critic_loss, normalize_entropy=normalize_entropy)
    out = ppo_loss(td, factored=True, **kw)
    ref = reference_factored(td, **kw)
    for key in ("loss_objective", "entropy", "loss_entropy", "kl_approx", "loss_critic"):
        assert out[key].item() == pytest.approx(ref[key], rel=1e-4, abs=1e-5), key
    for head in HEADS:
        assert out[head, "loss_objective"].item() == pytest.approx(ref["heads"][head]["surr"], abs=1e-5)
        assert out[head, "entropy"].item() == pytest.approx(ref["heads"][head]["ent"], abs=1e-5)
        assert out[head, "kl"].item() == pytest.approx(ref["heads"][head]["kl"], abs=1e-5)
        assert out[head, "clip_fraction"].item() == pytest.approx(ref["heads"][head]["clip"], abs=1e-6)


def _torchrl_setup(batch_shape, n=4, D_obs=5, seed=0):
    from tensordict.nn import TensorDictModule
    from torchrl.modules import ProbabilisticActor, ValueOperator

    torch.manual_seed(seed)
    net = torch.nn.Linear(D_obs, n)
    actor = ProbabilisticActor(
        TensorDictModule(net, ["observation"], ["logits"]),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )
    critic = ValueOperator(torch.nn.Linear(D_obs, 1), in_keys=["observation"])
    obs = torch.randn(*batch_shape, D_obs)
    with torch.no_grad():
        behaviour = torch.distributions.Categorical(logits=net(obs) + 0.5 * torch.randn(*batch_shape, n))
        action = behaviour.sample()
    td = TensorDict(
        {
            "observation": obs,
            "action": action,
            "action_log_prob": behaviour.log_prob(action),
            "advantage": torch.randn(*batch_shape, 1),
            "state_value": torch.randn(*batch_shape, 1),
            "value_target": torch.randn(*batch_shape, 1),
        },
        batch_shape,
    )
    return net, actor, critic, td


@pytest.mark.parametrize("batch_shape", [(4, 6), (32,), (2, 3, 5)])
@pytest.mark.parametrize("eps", [0.1, 0.2])
def test_single_head_objective_equals_torchrl_clip_ppo(batch_shape, eps):
    from torchrl.objectives import ClipPPOLoss

    net, actor, critic, td = _torchrl_setup(batch_shape)
    theirs = ClipPPOLoss(actor, critic, clip_epsilon=eps)(td.clone())
    ours_td = td.clone()
    ours_td["current"] = TensorDict({"logits": net(td["observation"])}, batch_shape)
    ours = ppo_loss(ours_td, clip_epsilon=eps)
    torch.testing.assert_close(ours["loss_objective"], theirs["loss_objective"].reshape(()))
    torch.testing.assert_close(ours["clip_fraction"], theirs["clip_fraction"].reshape(()))
    torch.testing.assert_close(ours["mean_ratio"], theirs["mean_ratio"].reshape(()))
    torch.testing.assert_close(ours["max_ratio"], theirs["max_ratio"].reshape(()))
    # the gradient of the objective is the same too
    g_ours = torch.autograd.grad(ours["loss_objective"], net.weight)[0]
    fresh = ClipPPOLoss(actor, critic, clip_epsilon=eps)(td.clone())
    g_theirs = torch.autograd.grad(fresh["loss_objective"].sum(), net.weight)[0]
    torch.testing.assert_close(g_ours, g_theirs)


# TorchRL's ClipPPOLoss with its critic and entropy settings, and the esper arguments that reproduce it.
PARITY = [
    ({}, {}),  # TorchRL's defaults: critic_coeff 1, smooth_l1, no value clip, entropy 0.01
    ({"loss_critic_type": "l2"}, {"critic_loss": "l2"}),
    ({"loss_critic_type": "l2", "critic_coeff": 0.5}, {"critic_loss": "l2", "value_coef": 0.5}),
    ({"critic_coeff": 0.25, "entropy_coeff": 0.05}, {"value_coef": 0.25, "entropy_coef": 0.05}),
    ({"loss_critic_type": "l2", "clip_value": 0.3}, {"critic_loss": "l2", "value_clip": 0.3}),
    ({"clip_value": 0.3, "clip_epsilon": 0.1}, {"value_clip": 0.3, "clip_epsilon": 0.1}),
]


def torchrl_parity_args(theirs: dict) -> dict:
    """ppo_loss arguments for ClipPPOLoss(**theirs): TorchRL's defaults made explicit."""
    return {
        "clip_epsilon": theirs.get("clip_epsilon", 0.2),
        "entropy_coef": theirs.get("entropy_coeff", 0.01),
        "value_coef": theirs.get("critic_coeff", 1.0),
        "critic_loss": theirs.get("loss_critic_type", "smooth_l1"),
        "value_clip": theirs.get("clip_value"),
        "normalize_entropy": False,
    }


@pytest.mark.parametrize(("theirs", "extra"), PARITY)
@pytest.mark.parametrize("batch_shape", [(4, 6), (32,)])
def test_single_head_losses_equal_torchrl_clip_ppo(theirs, extra, batch_shape):
    """loss_objective, loss_critic, loss_entropy, entropy (values and gradients) equal ClipPPOLoss's."""
    from torchrl.objectives import ClipPPOLoss

    net, actor, critic, td = _torchrl_setup(batch_shape)
    td["value_target"] = td["value_target"] * 2.0  # errors on both sides of smooth_l1's |d| = 1
    args = torchrl_parity_args(theirs)
    assert {k: args[k] for k in extra} == extra  # the table above says what the mapping is
    loss_mod = ClipPPOLoss(actor, critic, **theirs)
    ours_td = td.clone()
    ours_td["current"] = TensorDict(
        {"logits": net(td["observation"]), "state_value": critic(td.clone())["state_value"]}, batch_shape
    )
    ours = ppo_loss(ours_td, **args)
    params = [*net.parameters(), *critic.parameters()]
    names = ["loss_objective", "loss_critic", "loss_entropy"]
    fresh = [loss_mod(td.clone()) for _ in names]  # one graph per gradient
    for name, out in zip(names, fresh):
        torch.testing.assert_close(ours[name], out[name].reshape(()), msg=name)
        g_ours = torch.autograd.grad(ours[name], params, retain_graph=True, allow_unused=True)
        g_theirs = torch.autograd.grad(out[name], params, allow_unused=True)
        for a, b in zip(g_ours, g_theirs):
            assert (a is None) == (b is None), name
            if a is not None:
                torch.testing.assert_close(a, b, msg=name)
    torch.testing.assert_close(ours["entropy"], fresh[0]["entropy"].reshape(()))
    if "clip_value" in theirs:
        torch.testing.assert_close(ours["value_clip_fraction"], fresh[0]["value_clip_fraction"].reshape(()))


def test_explained_variance_equals_torchrl_on_a_flat_batch():
    """A scalar ``[]`` here; TorchRL's ``[1]`` on a flat batch holds the same number (up to its eps)."""
    from torchrl.objectives import ClipPPOLoss

    net, actor, critic, td = _torchrl_setup((64,))
    theirs = ClipPPOLoss(actor, critic)(td.clone())["explained_variance"]
    td["current"] = TensorDict(
        {"logits": net(td["observation"]), "state_value": critic(td.clone())["state_value"]}, [64]
    )
    ours = ppo_loss(td)["explained_variance"]
    assert ours.shape == () and theirs.shape == (1,)
    torch.testing.assert_close(ours, theirs.reshape(()).to(ours.dtype), rtol=1e-5, atol=1e-6)


def test_one_hot_actions_equal_index_actions_and_torchrl():
    """TorchRL's GymEnv stores discrete actions one-hot ([*B, n]); they read as their index."""
    from tensordict.nn import TensorDictModule
    from torchrl.modules import OneHotCategorical, ProbabilisticActor
    from torchrl.objectives import ClipPPOLoss

    net, _, critic, td = _torchrl_setup((2, 32), n=3)
    actor = ProbabilisticActor(
        TensorDictModule(net, ["observation"], ["logits"]),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    )
    index_td = td.clone()
    index_td["current"] = TensorDict({"logits": net(td["observation"])}, [2, 32])
    by_index = ppo_loss(index_td, **torchrl_parity_args({}))
    for dtype in (torch.int64, torch.bool, torch.uint8):
        one_hot = td.clone()
        one_hot["action"] = torch.nn.functional.one_hot(td["action"], 3).to(dtype)
        one_hot["current"] = index_td["current"]
        ours = ppo_loss(one_hot, **torchrl_parity_args({}))
        torch.testing.assert_close(ours["loss_objective"], by_index["loss_objective"])
    one_hot["action"] = torch.nn.functional.one_hot(td["action"], 3)
    theirs = ClipPPOLoss(actor, critic)(one_hot.exclude("current"))
    torch.testing.assert_close(by_index["loss_objective"], theirs["loss_objective"].reshape(()))
    torch.testing.assert_close(by_index["loss_entropy"], theirs["loss_entropy"].reshape(()))


def test_action_of_a_third_shape_names_both_layouts():
    net, _, _, td = _torchrl_setup((2, 32), n=3)
    td["current"] = TensorDict({"logits": net(td["observation"]).detach()}, [2, 32])
    td["action"] = torch.zeros(2, 32, 2, dtype=torch.int64)
    layouts = r"index of shape \[2, 32\].*one-hot with the logits' shape \[2, 32, 3\]"
    with pytest.raises(ValueError, match=layouts):
        ppo_loss(td)
    td["action"] = torch.zeros(2, 32, 3)
    with pytest.raises(TypeError, match="integer dtype or torch.bool"):
        ppo_loss(td)
    with pytest.raises(ValueError, match="critic_loss must be one of"):
        ppo_loss(td, critic_loss="huber")


def test_single_head_reads_legacy_sample_log_prob_and_no_critic():
    net, _, _, td = _torchrl_setup((3, 4))
    td["current"] = TensorDict({"logits": net(td["observation"])}, [3, 4])
    a = ppo_loss(td.clone())
    td.rename_key_("action_log_prob", "sample_log_prob")
    b = ppo_loss(td)
    torch.testing.assert_close(a["loss_objective"], b["loss_objective"])
    assert "loss_critic" not in a.keys()
    torch.testing.assert_close(total_loss(a), a["loss_objective"] + a["loss_entropy"])


def test_H3_sparse_head_entropy_is_a_masked_mean():
    """blueprint matters at one step in ten: its entropy is that step's entropy, not a tenth of it."""
    ops = [Op.GERMINATE] + [Op.WAIT] * 9
    td = factored_batch(1, 10, ops=torch.tensor([int(o) for o in ops]), seed=3)
    out = ppo_loss(td, factored=True)
    logits, mask = td["current", "blueprint", "logits"][0, 0], td["blueprint", "action_mask"][0, 0]
    step_entropy = D.normalized_entropy(logits, mask).item()
    expected = step_entropy if mask.sum() > 1 else 0.0
    assert out["blueprint", "entropy"].item() == pytest.approx(expected, abs=1e-6)
    assert out["blueprint", "weight"].item() == pytest.approx(0.1 if mask.sum() > 1 else 0.0)


def test_choice_share_is_what_each_head_chose_where_it_counted():
    """Issue 47: ``(head, choice_share)`` says what a head's low entropy committed to: the share of the
    steps where it counted (valid, relevant, more than one legal choice) on which the batch took each
    choice, counted here by a plain loop."""
    td = factored_batch(4, 9, seed=5)
    td["collector", "mask"] = torch.rand(4, 9, generator=torch.Generator().manual_seed(1)) > 0.2
    out = ppo_loss(td, factored=True)
    for head in HEADS:
        n = td[head, "action_mask"].shape[-1]
        counts, total = [0] * n, 0
        for e in range(4):
            for t in range(9):
                op = Op(int(td["op", "action"][e, t]))
                relevant = head == "op" or head in RELEVANCE[op]
                if td["collector", "mask"][e, t] and relevant and td[head, "action_mask"][e, t].sum() > 1:
                    counts[int(td[head, "action"][e, t])] += 1
                    total += 1
        expected = [c / max(total, 1) for c in counts]
        assert out[head, "choice_share"].tolist() == pytest.approx(expected, abs=1e-6), head
        if total:
            assert sum(expected) == pytest.approx(1.0)


def test_H6_kl_only_counts_heads_that_mattered():
    """Changing a head's logits where it did not matter changes neither its KL nor the joint KL."""
    td = factored_batch(2, 8, ops=torch.full((8,), int(Op.WAIT)), seed=4, grad=False)
    base = ppo_loss(td, factored=True)
    td["current", "blueprint", "logits"] = td["current", "blueprint", "logits"] + 5 * torch.randn(2, 8, 5)
    moved = ppo_loss(td, factored=True)
    assert moved["blueprint", "kl"].item() == 0.0
    torch.testing.assert_close(moved["kl_approx"], base["kl_approx"])


def test_M20_kl_approx_is_frequency_weighted_sum_of_head_kls():
    td = factored_batch(4, 9, seed=5, grad=False)
    out = ppo_loss(td, factored=True)
    weighted = sum(out[h, "weight"] * out[h, "kl"] for h in HEADS)
    torch.testing.assert_close(out["kl_approx"], weighted)
    naive_sum = sum(out[h, "kl"] for h in HEADS)
    assert out["kl_approx"] <= naive_sum + 1e-7, "never inflated by heads that did not matter"


def test_P1_gradient_reaches_exactly_the_relevant_heads():
    """For every op x head pair: the surrogate's gradient reaches head h at a step with op o iff the
    relevance table says h matters for o."""
    ops = torch.tensor([int(o) for o in Op])
    td = factored_batch(1, len(Op), ops=ops, seed=6)
    for head in HEADS:  # every head has all choices legal, so only relevance can zero a gradient
        td[head, "action_mask"] = torch.ones_like(td[head, "action_mask"])
    td["advantage"] = torch.ones(1, len(Op), 1)
    out = ppo_loss(td, factored=True, entropy_coef=0.0, clip_epsilon=100.0)
    logits = [td["current", h, "logits"] for h in HEADS]
    grads = torch.autograd.grad(out["loss_objective"], logits)
    for h, head in enumerate(HEADS):
        for o, op in enumerate(Op):
            reached = bool(grads[h][0, o].abs().sum() > 0)
            assert reached == (head == "op" or head in RELEVANCE[op]), (op, head)


def test_C4_value_clipping_anchors_on_state_value():
    """The clip is around ``state_value`` (the caller writes the values recomputed at update start
    there); the loss never reads another anchor."""
    td = factored_batch(2, 5, seed=7)
    td["state_value"] = td["current", "state_value"].detach() + 1.0  # anchor 1 above the new value
    out = ppo_loss(td, factored=True, value_clip=0.5)
    assert out["value_clip_fraction"].item() == 1.0
    td["state_value"] = td["current", "state_value"].detach()
    assert ppo_loss(td, factored=True, value_clip=0.5)["value_clip_fraction"].item() == 0.0


def test_early_stop_is_a_tensor_flag():
    td = factored_batch(2, 5, seed=8, grad=False)
    kl = ppo_loss(td, factored=True)["kl_approx"]
    assert ppo_loss(td, factored=True, target_kl=kl.item() / 1.6)["early_stop"].item() is True
    flag = ppo_loss(td, factored=True, target_kl=kl.item() / 1.4)["early_stop"]
    assert flag.dtype == torch.bool and flag.shape == () and flag.item() is False


def test_per_head_entropy_coefficients():
    td = factored_batch(2, 5, seed=9, grad=False)
    coefs = {h: 0.1 * (i + 1) for i, h in enumerate(HEADS)}
    out = ppo_loss(td, factored=True, entropy_coef=coefs)
    expected = -sum(coefs[h] * out[h, "entropy"] for h in HEADS)
    torch.testing.assert_close(out["loss_entropy"], expected)
    with pytest.raises(ValueError, match="unknown.*'blueprnt'"):
        ppo_loss(td, factored=True, entropy_coef={**coefs, "blueprnt": 1.0})
    with pytest.raises(ValueError, match="missing.*'style'"):
        ppo_loss(td, factored=True, entropy_coef={h: 1.0 for h in HEADS if h != "style"})


def test_explained_variance_and_no_nan_on_constant_target():
    td = factored_batch(2, 5, seed=10, grad=False)
    td["value_target"] = td["current", "state_value"].clone()
    assert ppo_loss(td, factored=True)["explained_variance"].item() == pytest.approx(1.0)
    td["value_target"] = torch.full_like(td["value_target"], 3.0)
    out = ppo_loss(td, factored=True)
    assert all(torch.isfinite(v).all() for v in out.values(True, True))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_logits_are_finite(dtype):
    td = factored_batch(2, 5, seed=11, grad=False)
    for head in HEADS:
        td["current", head, "logits"] = (td["current", head, "logits"] * 30).to(dtype)
    out = ppo_loss(td, factored=True)
    assert all(torch.isfinite(v).all() for v in out.values(True, True))


# ------------------------------------------------------------------------------------------ bad input
def test_bad_inputs_raise_clear_errors():
    td = factored_batch(2, 4, seed=12, grad=False)
    with pytest.raises(KeyError, match="'advantage'"):
        ppo_loss(td.exclude("advantage"), factored=True)
    bad = td.clone()
    bad["advantage"] = torch.randn(2, 4, 3)
    with pytest.raises(ValueError, match=r"'advantage' must have shape \[2, 4\] or \[2, 4, 1\]"):
        ppo_loss(bad, factored=True)
    bad = td.clone()
    bad["slot", "action_mask"] = bad["slot", "action_mask"].float()
    with pytest.raises(TypeError, match=r"\('slot', 'action_mask'\) must be torch.bool"):
        ppo_loss(bad, factored=True)
    bad = td.clone()
    bad["op", "action"] = bad["op", "action"].float()
    with pytest.raises(TypeError, match=r"\('op', 'action'\) must be an integer dtype"):
        ppo_loss(bad, factored=True)
    with pytest.raises(KeyError, match="mismatched head sets.*missing \\['tempo'\\]"):
        ppo_loss(td.exclude(("current", "tempo")), factored=True)
    extra = td.clone()
    extra["current", "colour"] = TensorDict({"logits": torch.zeros(2, 4, 2)}, [2, 4])
    with pytest.raises(KeyError, match="unexpected \\['colour'\\]"):
        ppo_loss(extra, factored=True)
    bad = td.clone()
    bad["current", "op", "logits"] = torch.zeros(2, 4, 7)
    with pytest.raises(ValueError, match="must have the logits' shape"):
        ppo_loss(bad, factored=True)
    with pytest.raises(ValueError, match="clip_epsilon"):
        ppo_loss(td, factored=True, clip_epsilon=0.0)


# --------------------------------------------------------------------- issue 10, item 9: library edges
def test_minus_inf_logit_without_a_mask_is_a_masked_choice():
    """A -inf logit (how TorchRL's masked distributions write an illegal choice) and no action_mask:
    the loss and its gradient are finite and equal to the same batch with an explicit mask
    (the old behaviour gave NaN through the entropy's 0 * -inf)."""
    net, _, _, td = _torchrl_setup((3, 4))
    logits = net(td["observation"]).detach()
    logits[..., 3] = -torch.inf
    td["action"] = td["action"] % 3  # taken actions are legal
    a_logits = logits.clone().requires_grad_(True)
    td_inf = td.clone()
    td_inf["current"] = TensorDict({"logits": a_logits}, [3, 4])
    out = ppo_loss(td_inf)
    total_loss(out).backward()
    assert all(torch.isfinite(v).all() for v in out.values())
    assert torch.isfinite(a_logits.grad).all()

    b_logits = logits.clone()
    b_logits[..., 3] = 0.0
    b_logits.requires_grad_(True)
    td_mask = td.clone()
    td_mask["current"] = TensorDict({"logits": b_logits}, [3, 4])
    td_mask["action_mask"] = torch.tensor([True, True, True, False]).expand(3, 4, 4).clone()
    ref = ppo_loss(td_mask)
    total_loss(ref).backward()
    for k in ("loss_objective", "loss_entropy", "entropy", "kl_approx"):
        torch.testing.assert_close(out[k], ref[k])
    torch.testing.assert_close(a_logits.grad[..., :3], b_logits.grad[..., :3])
    # the distributions agree: the -inf choice is never sampled and its entropy share is 0
    assert (D.sample(logits, generator=torch.Generator().manual_seed(0)) != 3).all()
    masked = D.normalized_entropy(b_logits, td_mask["action_mask"])
    torch.testing.assert_close(D.normalized_entropy(logits), masked)


@pytest.mark.parametrize(
    "kw",
    [
        {"clip_epsilon": math.nan},
        {"clip_epsilon": math.inf},
        {"value_coef": math.nan},
        {"value_coef": -1.0},
        {"value_coef": math.inf},
        {"entropy_coef": math.nan},
        {"entropy_coef": -0.1},
        {"value_clip": math.nan},
        {"value_clip": math.inf},
        {"target_kl": math.nan},
    ],
)
def test_every_coefficient_is_checked_alike(kw):
    """value_coef=nan and entropy_coef=nan used to be accepted while clip_epsilon=nan was refused."""
    td = factored_batch(2, 4, seed=3, grad=False)
    name = next(iter(kw))
    with pytest.raises(ValueError, match=rf"ppo_loss: {name} must be finite"):
        ppo_loss(td, factored=True, **kw)
    with pytest.raises(ValueError, match=r"entropy_coef\['op'\] must be finite"):
        ppo_loss(td, factored=True, entropy_coef={h: (math.nan if h == "op" else 0.01) for h in HEADS})


def test_the_kl_stop_rule_has_one_home():
    """``ppo_loss``'s ``early_stop`` is :func:`kl_early_stop` of its KL (the rule several processes apply
    to their summed KL): above 1.5 x target_kl, never without a target."""
    td = factored_batch(2, 5, seed=8, grad=False)
    for target in (None, 0.01, 1.0, 100.0):
        out = ppo_loss(td, factored=True, target_kl=target)
        assert torch.equal(out["early_stop"], kl_early_stop(out["kl_approx"], target))
    assert kl_early_stop(torch.tensor(0.16), 0.1).item() is True
    assert kl_early_stop(torch.tensor(0.14), 0.1).item() is False
    assert kl_early_stop(torch.tensor(1e9), None).item() is False


# ------------------------------------------------------------------------------------- entropy floor
def _logits(td: TensorDict) -> list[torch.Tensor]:
    return [td["current", h, "logits"] for h in HEADS]


def test_P4_entropy_floor_is_a_hinge_on_each_heads_masked_normalized_entropy():
    """004 P-4 (the original's half-built ``get_entropy_floor``): ``loss_entropy_floor = coef * sum_h
    relu(floor_h - H_h)`` over the masked mean normalized entropies ``ppo_loss`` reports per head, the
    action masks and head relevance threaded through; its gradient is exactly an entropy bonus of
    ``coef`` on the heads under their floor and nothing on the others."""
    td = factored_batch(4, 6, seed=31)
    plain = ppo_loss(td, factored=True)
    entropy = {h: float(plain[h, "entropy"]) for h in HEADS}
    floors = {h: (entropy[h] + 0.1 if i % 2 else entropy[h] - 0.1) for i, h in enumerate(HEADS)}
    floors = {h: min(max(f, 0.0), 1.0) for h, f in floors.items()}
    out = ppo_loss(td, factored=True, entropy_floor=floors, entropy_floor_coef=0.3)
    want = 0.3 * sum(max(0.0, floors[h] - entropy[h]) for h in HEADS)
    assert float(out["loss_entropy_floor"]) == pytest.approx(want, rel=1e-5)
    below = {h for h in HEADS if entropy[h] < floors[h]}
    assert below and below != set(HEADS)
    grad = torch.autograd.grad(out["loss_entropy_floor"], _logits(td))
    bonus = ppo_loss(td, factored=True, entropy_coef={h: 0.3 if h in below else 0.0 for h in HEADS})
    ref = torch.autograd.grad(bonus["loss_entropy"], _logits(td))
    for h, a, b in zip(HEADS, grad, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=h)
    # total_loss adds it; every other output is unchanged by the floor
    torch.testing.assert_close(total_loss(out), total_loss(plain) + out["loss_entropy_floor"])
    assert "loss_entropy_floor" not in plain.keys()
    for key in plain.keys(True, True):
        torch.testing.assert_close(out[key], plain[key], msg=str(key))


def test_P4_one_entropy_floor_for_every_head_and_a_floor_under_every_entropy_costs_nothing():
    td = factored_batch(3, 5, seed=32)
    plain = ppo_loss(td, factored=True)
    one = ppo_loss(td, factored=True, entropy_floor=0.8, entropy_floor_coef=0.5)
    each = ppo_loss(td, factored=True, entropy_floor=dict.fromkeys(HEADS, 0.8), entropy_floor_coef=0.5)
    torch.testing.assert_close(one["loss_entropy_floor"], each["loss_entropy_floor"])
    want = 0.5 * sum(max(0.0, 0.8 - float(plain[h, "entropy"])) for h in HEADS)
    assert float(one["loss_entropy_floor"]) == pytest.approx(want, rel=1e-5)
    zero = ppo_loss(td, factored=True, entropy_floor=0.0)
    assert float(zero["loss_entropy_floor"]) == 0.0
    assert all(g is None or not g.any() for g in torch.autograd.grad(
        zero["loss_entropy_floor"], _logits(td), allow_unused=True))  # fmt: skip


def test_P4_a_head_that_never_counted_pays_no_floor():
    """Every step WAIT: only ``op`` counts; the other heads' entropies are 0 by the masked mean, and the
    floor must not charge them for it."""
    td = factored_batch(2, 4, seed=33, ops=[int(Op.WAIT)] * 4)
    out = ppo_loss(td, factored=True, entropy_floor=0.5)
    op_entropy = float(out["op", "entropy"])
    assert float(out["loss_entropy_floor"]) == pytest.approx(max(0.0, 0.5 - op_entropy), abs=1e-6)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"entropy_floor": 1.5}, r"entropy_floor must be in \[0, 1\]"),
        ({"entropy_floor": -0.1}, "entropy_floor must be finite and >= 0"),
        ({"entropy_floor": math.nan}, "entropy_floor must be finite"),
        ({"entropy_floor": {"op": 0.5}}, "per-head entropy_floor must name exactly the heads"),
        ({"entropy_floor": 0.5, "entropy_floor_coef": -1.0}, "entropy_floor_coef must be finite and >= 0"),
        ({"entropy_floor": 0.5, "normalize_entropy": False}, "floor on normalized entropies"),
    ],
)
def test_P4_entropy_floor_arguments_are_checked_in_one_line(kw, match):
    td = factored_batch(2, 4, seed=3, grad=False)
    with pytest.raises(ValueError, match=match):
        ppo_loss(td, factored=True, **kw)
