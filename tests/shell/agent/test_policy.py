"""The factored recurrent actor-critic: legal sampling, op-conditioned slot masks, and act/evaluate
consistency (the first PPO epoch must see ratio 1)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from tensordict import TensorDict

from esper.core import distributions as D
from esper.core.lifecycle import LifecycleConfig
from esper.core.masks import action_masks, legal_masks
from esper.core.spec import DEFAULT_BLEND, HEADS, SLOT_FIELDS, ActionSpec, Op, Stage
from esper.shell.agent.agent import build_agent
from esper.shell.agent.config import PPOConfig
from esper.shell.agent.policy import FactoredRecurrentActorCritic
from esper.shell.baselines.simple import GrowAllController

SPEC = ActionSpec(n_slots=3, n_blueprints=5)


def _slots(E: int, seed: int) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    td = TensorDict({k: torch.zeros(E, 3, dtype=dt) for k, (dt, _) in SLOT_FIELDS.items()}, [E, 3])
    td["enabled"] = torch.ones(E, 3, dtype=torch.bool)
    td["stage"] = torch.randint(0, len(Stage), (E, 3), generator=g)
    td["age"] = torch.full((E, 3), 4)
    return td


def test_act_samples_legal_actions_with_op_conditioned_slot_mask():
    torch.manual_seed(0)
    net = FactoredRecurrentActorCritic(10, SPEC, hidden=32, head_hidden=16)
    E = 16
    legal = legal_masks(_slots(E, 1), SPEC)
    out, (h, _c) = net.act(torch.randn(E, 10), net.initial_state(E), legal)
    assert h.shape == (1, E, 32) and out["state_value"].shape == (E,)
    expected = action_masks(legal, out["op", "action"])
    for head in HEADS:
        a, mask = out[head, "action"], out[head, "action_mask"]
        assert torch.equal(mask, expected[head])
        assert mask.gather(-1, a.unsqueeze(-1)).all(), head
    assert (
        legal["slot_by_op"]
        .gather(1, out["op", "action"].view(E, 1, 1).expand(E, 1, 3))
        .squeeze(1)
        .gather(-1, out["slot", "action"].unsqueeze(-1))
        .all()
    )


def test_act_then_evaluate_gives_the_same_log_probs_and_values():
    torch.manual_seed(1)
    net = FactoredRecurrentActorCritic(7, SPEC, hidden=24, head_hidden=16)
    E, T = 4, 6
    state0 = net.initial_state(E)
    state = state0
    obs_seq, steps = [], []
    for t in range(T):
        obs = torch.randn(E, 7)
        out, state = net.act(obs, state, legal_masks(_slots(E, 10 + t), SPEC))
        obs_seq.append(obs)
        steps.append(out)
    rollout = torch.stack(steps, dim=1)  # [E, T]
    current = net.rescore(torch.stack(obs_seq, 1), state0, rollout["op", "action"], rollout["slot", "action"])
    for head in HEADS:
        lp = D.log_prob(current[head, "logits"], rollout[head, "action"], rollout[head, "action_mask"])
        torch.testing.assert_close(lp, rollout[head, "action_log_prob"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(current["state_value"], rollout["state_value"], rtol=1e-5, atol=1e-5)


def test_evaluate_gives_gradient_to_every_head_and_the_trunk():
    net = FactoredRecurrentActorCritic(5, SPEC, hidden=16, head_hidden=8)
    E, T = 2, 3
    op = torch.tensor([[int(Op.GERMINATE)] * T] * E)
    slot = torch.tensor([[0, 1, 2]] * E)
    out = net.rescore(torch.randn(E, T, 5), net.initial_state(E), op, slot)
    loss = sum(out[h, "logits"].square().sum() for h in HEADS) + out["state_value"].sum()
    loss.backward()
    for name, p in net.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_deterministic_act_takes_the_most_likely_legal_choice():
    torch.manual_seed(2)
    net = FactoredRecurrentActorCritic(5, SPEC, hidden=16, head_hidden=8)
    legal = legal_masks(_slots(6, 2), SPEC)
    obs, state = torch.randn(6, 5), net.initial_state(6)
    out, _ = net.act(obs, state, legal, deterministic=True)
    feats, _ = net.features(obs.unsqueeze(1), state)
    logits = net.head_logits(feats.squeeze(1), out["op", "action"], out["slot", "action"])
    for head in HEADS:
        masked = torch.where(out[head, "action_mask"], logits[head], -torch.inf)
        assert torch.equal(out[head, "action"], masked.argmax(-1)), head


def test_deterministic_heads_take_the_mode_and_the_rest_sample_as_before():
    """``deterministic=heads``: those heads take their most likely legal choice; op and slot, drawn first
    from the same generator, are the draws a fully sampled act makes."""
    torch.manual_seed(3)
    net = FactoredRecurrentActorCritic(5, SPEC, hidden=16, head_hidden=8)
    E = 64
    legal = legal_masks(_slots(E, 4), SPEC)
    obs, state = torch.randn(E, 5), net.initial_state(E)
    later = [h for h in HEADS if h not in ("op", "slot")]
    mixed, _ = net.act(obs, state, legal, generator=torch.Generator().manual_seed(7), deterministic=later)
    sampled, _ = net.act(obs, state, legal, generator=torch.Generator().manual_seed(7))
    greedy, _ = net.act(obs, state, legal, deterministic=True)
    for head in ("op", "slot"):
        assert torch.equal(mixed[head, "action"], sampled[head, "action"]), head
    assert not torch.equal(mixed["op", "action"], greedy["op", "action"])  # op really is sampled
    feats, _ = net.features(obs.unsqueeze(1), state)
    logits = net.head_logits(feats.squeeze(1), mixed["op", "action"], mixed["slot", "action"])
    for head in later:
        masked = torch.where(mixed[head, "action_mask"], logits[head], -torch.inf)
        assert torch.equal(mixed[head, "action"], masked.argmax(-1)), head
    with pytest.raises(ValueError, match="unknown head"):
        net.act(obs, state, legal, deterministic=["blueprint", "colour"])
    with pytest.raises(TypeError, match="collection of head names"):
        net.act(obs, state, legal, deterministic="blueprint")


def test_all_illegal_op_row_raises_before_sampling():
    net = FactoredRecurrentActorCritic(5, SPEC, hidden=16, head_hidden=8)
    legal = legal_masks(_slots(2, 3), SPEC)
    legal["op"] = torch.zeros_like(legal["op"])
    with pytest.raises(RuntimeError, match=r"no legal choice for head 'op' in env\(s\) \[0, 1\]"):
        net.act(torch.randn(2, 5), net.initial_state(2), legal)


def test_bad_observation_shape_is_reported():
    net = FactoredRecurrentActorCritic(5, SPEC, hidden=16, head_hidden=8)
    with pytest.raises(ValueError, match=r"observation must be \[E, T, 5\], got \[2, 1, 4\]"):
        net.act(torch.randn(2, 4), net.initial_state(2), legal_masks(_slots(2, 4), SPEC))


def test_bf16_autocast_act_is_finite():
    net = FactoredRecurrentActorCritic(5, SPEC, hidden=16, head_hidden=8)
    legal = legal_masks(_slots(4, 5), SPEC)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = net.act(torch.randn(4, 5) * 50, net.initial_state(4), legal)
    for head in HEADS:
        assert torch.isfinite(out[head, "action_log_prob"]).all()


@pytest.mark.parametrize("bias", [0.0, 2.0])
def test_wait_bias_sets_the_initial_preference_for_wait(bias):
    """The op head starts near uniform over the legal ops, WAIT ``bias`` logits above the rest: a
    cautious start (p(WAIT) = e^b / (e^b + k - 1) with k legal ops)."""
    torch.manual_seed(0)
    net = FactoredRecurrentActorCritic(6, SPEC, hidden=16, head_hidden=8, wait_bias=bias)
    feats, _ = net.features(torch.randn(64, 1, 6), net.initial_state(64))
    with torch.no_grad():
        probs = torch.softmax(net.heads["op"](feats.squeeze(1)), -1)
    k = len(Op)
    expected = torch.tensor(bias).exp() / (torch.tensor(bias).exp() + k - 1)
    torch.testing.assert_close(probs[:, int(Op.WAIT)].mean(), expected, atol=0.02, rtol=0)
    others = torch.cat([probs[:, : int(Op.WAIT)], probs[:, int(Op.WAIT) + 1 :]], -1)
    assert float(others.std()) < 0.02  # the other ops start equal


@pytest.mark.parametrize(("wait", "germinate"), [(0.0, 0.0), (2.0, 2.0), (1.0, 3.0)])
def test_germinate_bias_sets_the_initial_preference_for_germinate(wait, germinate):
    """WAIT starts ``wait`` logits and GERMINATE ``germinate`` logits above the ops that change a
    live seed, which start equal among themselves."""
    torch.manual_seed(0)
    net = FactoredRecurrentActorCritic(6, SPEC, hidden=16, head_hidden=8, wait_bias=wait,
                                       germinate_bias=germinate)  # fmt: skip
    feats, _ = net.features(torch.randn(64, 1, 6), net.initial_state(64))
    with torch.no_grad():
        probs = torch.softmax(net.heads["op"](feats.squeeze(1)), -1).mean(0)
    z = math.exp(wait) + math.exp(germinate) + len(Op) - 2
    torch.testing.assert_close(probs[int(Op.WAIT)], torch.tensor(math.exp(wait) / z), atol=0.02, rtol=0)
    p_germinate = torch.tensor(math.exp(germinate) / z)
    torch.testing.assert_close(probs[int(Op.GERMINATE)], p_germinate, atol=0.02, rtol=0)
    rest = [int(o) for o in Op if o not in (Op.WAIT, Op.GERMINATE)]
    torch.testing.assert_close(probs[rest], torch.full((len(rest),), 1 / z), atol=0.02, rtol=0)


@pytest.mark.parametrize("bias", [0.0, 2.0])
def test_blend_bias_starts_the_blend_heads_on_the_fixed_schedules_blend(bias):
    """Each blend head (style, tempo, alpha target) starts ``bias`` logits above its other choices on
    DEFAULT_BLEND, the blend the growth schedules use; the other heads stay uniform."""
    torch.manual_seed(0)
    net = FactoredRecurrentActorCritic(6, SPEC, hidden=16, head_hidden=8, blend_bias=bias)
    feats, _ = net.features(torch.randn(64, 1, 6), net.initial_state(64))
    later = torch.cat([feats.squeeze(1), torch.zeros(64, net.op_embedding.embedding_dim
                                                     + net.slot_embedding.embedding_dim)], -1)  # fmt: skip
    assert set(DEFAULT_BLEND) == {"style", "tempo", "alpha_target"}
    with torch.no_grad():
        for head in ("style", "tempo", "alpha_target", "alpha_speed", "alpha_curve"):
            probs = torch.softmax(net.heads[head](later), -1).mean(0)
            k = probs.numel()
            b = bias if head in DEFAULT_BLEND else 0.0
            expected = torch.full((k,), 1 / (math.exp(b) + k - 1))
            if head in DEFAULT_BLEND:
                expected[DEFAULT_BLEND[head]] = math.exp(b) / (math.exp(b) + k - 1)
            torch.testing.assert_close(probs, expected, atol=0.02, rtol=0)
    grow = GrowAllController(0, LifecycleConfig())
    assert (grow.style, grow.tempo) == (DEFAULT_BLEND["style"], DEFAULT_BLEND["tempo"])
    assert grow.alpha_target == DEFAULT_BLEND["alpha_target"]


def test_slot_bias_gives_each_slot_its_own_blueprint_preference():
    """With ``slot_bias`` the heads after the slot head add a learned bias per slot (zero at the start,
    so the initial policy is unchanged): a gradient step that favours conv in slot 0 moves slot 0's
    blueprint logits through its own table row and leaves slot 1's row untouched."""
    torch.manual_seed(0)
    plain = FactoredRecurrentActorCritic(6, SPEC, hidden=16, head_hidden=8)
    torch.manual_seed(0)
    net = FactoredRecurrentActorCritic(6, SPEC, hidden=16, head_hidden=8, slot_bias=True)
    assert plain.slot_bias is None and set(net.slot_bias) == set(HEADS) - {"op", "slot"}
    obs, state = torch.randn(4, 3, 6), net.initial_state(4)
    op = torch.full((4, 3), int(Op.GERMINATE))
    slot = torch.zeros(4, 3, dtype=torch.long)
    a, b = plain.rescore(obs, state, op, slot), net.rescore(obs, state, op, slot)
    for h in HEADS:
        torch.testing.assert_close(a[h, "logits"], b[h, "logits"])  # zero bias: the same policy
    loss = -torch.log_softmax(b["blueprint", "logits"], -1)[..., 1].mean()
    loss.backward()
    grad = net.slot_bias["blueprint"].weight.grad
    assert grad[0].abs().sum() > 0 and grad[1:].abs().sum() == 0


@pytest.mark.parametrize("bias", [0.0, 3.0])
def test_slot_order_bias_starts_the_slot_head_on_the_first_legal_slot(bias):
    """``slot_order_bias`` starts slot s ``s * bias`` logits below slot 0, whatever the op: with every
    slot legal an untrained policy germinates into ``b0`` first, with ``b0`` taken into ``b1``, the
    order in which ``grow_all`` fills slots (its first legal slot); 0 keeps the slot head uniform."""
    torch.manual_seed(0)
    net = FactoredRecurrentActorCritic(6, SPEC, hidden=16, head_hidden=8, slot_order_bias=bias)
    feats, _ = net.features(torch.randn(64, 1, 6), net.initial_state(64))
    feats = feats.squeeze(1)
    order = torch.exp(-bias * torch.arange(SPEC.n_slots, dtype=torch.float32))
    with torch.no_grad():
        for op in (Op.GERMINATE, Op.ADVANCE):
            logits = net.slot_logits(feats, torch.full((64,), int(op)))
            for legal in ([True, True, True], [False, True, True], [False, False, True]):
                mask = torch.tensor(legal).expand(64, -1)
                probs = D.log_softmax(logits, mask).exp().mean(0)
                expected = order * mask[0]
                torch.testing.assert_close(probs, expected / expected.sum(), atol=0.02, rtol=0)


def _policy(cfg: PPOConfig, cost: torch.Tensor | None = None):
    """The flat network a run builds for ``cfg`` with ``ppo.policy flat`` (``cost``: the env's germination
    cost, for the size prior; the set policy's priors: tests/shell/agent/test_setpolicy.py)."""
    flat = dataclasses.replace(cfg, policy="flat")
    return build_agent(flat, SPEC, device="cpu", germination_cost=cost).policy


def test_slot_order_bias_reaches_the_policy_from_the_ppo_config():
    cfg = PPOConfig(slot_order_bias=2.0, hidden=16, head_hidden=8)
    policy = _policy(cfg)
    torch.testing.assert_close(policy.heads["slot"][2].bias.detach(), torch.tensor([0.0, -2.0, -4.0]))
    policy = _policy(PPOConfig(hidden=16, head_hidden=8))
    assert policy.heads["slot"][2].bias.abs().sum() == 0


def test_size_bias_starts_the_blueprint_head_in_proportion_to_each_seeds_cost():
    # Costs per slot [S=3, n=5]: blueprint 0 costs nothing (a noop: counted as 1), slot 2 is wider.
    cost = torch.tensor([[0.0, 10.0, 40.0, 100.0, 400.0]] * 2 + [[0.0, 20.0, 80.0, 200.0, 800.0]])
    policy = _policy(PPOConfig(size_bias=1.0, hidden=16, head_hidden=8), cost)
    bias = policy.heads["blueprint"][2].bias.detach()
    log_mean = cost.clamp(min=1).log().mean(0)
    torch.testing.assert_close(bias, log_mean - log_mean.max())
    # At size_bias 1 an untrained policy grows each legal blueprint about in proportion to its cost.
    feats = torch.randn(64, 16)
    germinate, slot0 = torch.full((64,), int(Op.GERMINATE)), torch.zeros(64, dtype=torch.long)
    logits = policy.head_logits(feats, germinate, slot0)
    probs = logits["blueprint"].softmax(-1).mean(0)
    share = torch.tensor([10.0, 40.0, 100.0, 400.0])  # the geometric mean over slots: 2^(1/3) x each
    torch.testing.assert_close(probs[1:] / probs[1:].sum(), share / share.sum(), atol=0.02, rtol=0)
    # Half the bias, half the log-odds; 0 leaves the head as before, bit for bit.
    half = _policy(PPOConfig(size_bias=0.5, hidden=16, head_hidden=8), cost)
    torch.testing.assert_close(half.heads["blueprint"][2].bias.detach(), bias / 2)
    plain = _policy(PPOConfig(hidden=16, head_hidden=8), cost)
    assert plain.heads["blueprint"][2].bias.abs().sum() == 0


def test_size_bias_refuses_a_missing_or_misshapen_cost_and_a_negative_bias():
    cfg = PPOConfig(size_bias=1.0, hidden=16, head_hidden=8)
    with pytest.raises(ValueError, match="germination_cost"):
        _policy(cfg)
    with pytest.raises(ValueError, match=r"must be \[3, 5\]"):
        _policy(cfg, torch.ones(3, 4))
    with pytest.raises(ValueError):
        PPOConfig(size_bias=-1.0)
    with pytest.raises(ValueError, match="finite"):
        bad = torch.tensor([0.0, 1.0, float("nan"), 0.0, 0.0])
        FactoredRecurrentActorCritic(8, SPEC, hidden=16, head_hidden=8, blueprint_prior=bad)


# ------------------------------------------------------------------------------ the per-env sampler
def _narrow_masks(E: int, seed: int) -> TensorDict:
    """Hand-built legality ``[E]`` where rows 0-5 allow exactly one choice of every head (the op, then for
    each legal op exactly one slot, and one blueprint, style, ...) and the other rows a random non-empty
    set: choice 0 where one choice is legal, never 0 elsewhere (so a sampler that favours the rest can
    only land on 0 by reading the mask)."""
    g = torch.Generator().manual_seed(seed)
    S, single = SPEC.n_slots, torch.arange(E) < 6

    def rows(n: int) -> torch.Tensor:
        m = torch.rand(E, n, generator=g) < 0.5
        m[:, 0] = False
        m[torch.arange(E), 1 + torch.randint(0, n - 1, (E,), generator=g)] = True  # at least one legal
        m[single] = False
        m[single, 0] = True  # exactly one legal choice
        return m

    op = rows(len(Op))
    by_op = torch.zeros(E, len(Op), S, dtype=torch.bool)
    for o in range(len(Op)):
        by_op[:, o] = rows(S) & op[:, o : o + 1]
    out = {"op": op, "slot_by_op": by_op}
    out.update({h: rows(n) for h, n in SPEC.sizes.items() if h not in ("op", "slot")})
    return TensorDict(out, batch_size=[E])


def _per_env_sampling_faults(net: FactoredRecurrentActorCritic, rounds: int = 12) -> list[str]:
    """Act with one generator per env (the run's sampler) on :func:`_narrow_masks`, the network biased
    20 logits towards every choice but 0: the actions that were illegal, or not the single legal choice
    of their row (an illegal op leaves its slot head nothing legal, which ``act`` refuses)."""
    E, faults = 12, []
    for r in range(rounds):
        legal = _narrow_masks(E, r)
        gens = [torch.Generator().manual_seed(1000 * r + e) for e in range(E)]
        try:
            out, _ = net.act(torch.randn(E, 10), net.initial_state(E), legal, generator=gens)
        except RuntimeError as e:
            faults.append(f"round {r}: {e}")
            continue
        used = action_masks(legal, out["op", "action"], out["slot", "action"], out["blueprint", "action"])
        for head in HEADS:
            a = out[head, "action"]
            legal_choice = used[head].gather(-1, a.unsqueeze(-1)).squeeze(-1)
            single = used[head].sum(-1) == 1
            for e in range(E):
                if not legal_choice[e]:
                    faults.append(f"round {r} env {e}: {head} {int(a[e])} is illegal")
                elif single[e] and int(a[e]) != int(used[head][e].int().argmax()):
                    faults.append(f"round {r} env {e}: {head} missed its single legal choice")
            assert torch.equal(out[head, "action_mask"], used[head]), head
    return faults


def _biased_net() -> FactoredRecurrentActorCritic:
    torch.manual_seed(5)
    net = FactoredRecurrentActorCritic(10, SPEC, hidden=16, head_hidden=8)
    with torch.no_grad():
        for head in HEADS:
            bias = net.heads[head][2].bias
            bias.fill_(20.0)
            bias[0] = 0.0  # every head strongly prefers the choices single-choice rows forbid
    return net


def test_per_env_sampler_takes_only_legal_actions_and_the_single_legal_choice():
    """Issue 47: ``act`` with one generator per env (``PPOController(per_env=True)``, what a run uses)
    under masks where some rows allow exactly one op, slot or blueprint (and one choice of every other
    head): every sampled action is legal, and it is the single legal choice where there is one."""
    net = _biased_net()
    assert _per_env_sampling_faults(net) == []
    # the single-generator path holds to the same masks
    legal = _narrow_masks(12, 99)
    out, _ = net.act(torch.randn(12, 10), net.initial_state(12), legal, generator=torch.Generator())
    assert (out["op", "action"][:6] == 0).all() and (out["blueprint", "action"][:6] == 0).all()


def test_the_per_env_sampler_check_catches_a_sampler_that_ignores_single_choice_masks(monkeypatch):
    """The check above is not vacuous: a per-env sampler that drops the mask of rows with one legal
    choice (the regression issue 47 planted, which the whole suite missed) is caught."""
    from esper.shell.agent import policy as policy_module

    real = policy_module._sample

    def ignores_single_choice_rows(logits, mask, generator, deterministic):
        if isinstance(generator, list) and not deterministic:
            mask = torch.where(mask.sum(-1, keepdim=True) == 1, torch.ones_like(mask), mask)
        return real(logits, mask, generator, deterministic)

    monkeypatch.setattr(policy_module, "_sample", ignores_single_choice_rows)
    faults = _per_env_sampling_faults(_biased_net(), rounds=2)
    assert len(faults) == 2 and all("no legal choice for head 'slot'" in f for f in faults)
    # the same fault in a later head alone (the blueprint's, and alpha_curve's: 5 choices each) is caught
    # action by action, with the op and slot sampled right

    def in_the_blueprint_head(logits, mask, generator, deterministic):
        wrong = logits.shape[-1] == SPEC.n_blueprints
        return (ignores_single_choice_rows if wrong else real)(logits, mask, generator, deterministic)

    monkeypatch.setattr(policy_module, "_sample", in_the_blueprint_head)
    faults = _per_env_sampling_faults(_biased_net(), rounds=2)
    assert any("blueprint" in f and "illegal" in f for f in faults)
    assert not any("op " in f or "slot " in f for f in faults)


def test_the_fossilizing_readout_fossilizes_wherever_it_is_legal_and_nowhere_else():
    """The diagnostic readout ``ppo_greedy_fossilize``: an env where FOSSILIZE is legal fossilizes
    its first slot where it is legal; every other env keeps the policy's action."""
    from esper.shell.agent.controller import fossilize_where_legal

    torch.manual_seed(3)
    net = FactoredRecurrentActorCritic(10, SPEC, hidden=32, head_hidden=16)
    E = 32
    slots = _slots(E, 4)
    slots["alpha"] = torch.full((E, 3), 0.7)
    slots["contribution"] = torch.full((E, 3), 5.0)
    legal = legal_masks(slots, SPEC)
    can = legal["op"][:, Op.FOSSILIZE]
    assert can.any() and not can.all()
    out, _ = net.act(torch.randn(E, 10), net.initial_state(E), legal, deterministic=True)
    before = out.clone()
    out = fossilize_where_legal(out, legal)
    assert torch.equal(out["op", "action"][can], torch.full_like(out["op", "action"][can], int(Op.FOSSILIZE)))
    holding = legal["slot_by_op"][:, Op.FOSSILIZE]
    for e in torch.nonzero(can).flatten().tolist():
        assert out["slot", "action"][e] == torch.nonzero(holding[e]).min()
    for head in ("op", "slot"):
        assert torch.equal(out[head, "action"][~can], before[head, "action"][~can])


def test_a_learning_controller_refuses_the_fossilizing_override():
    from esper.shell.agent.controller import PPOController

    flat = dataclasses.replace(PPOConfig(), policy="flat")
    agent = build_agent(flat, SPEC, device="cpu", germination_cost=torch.ones(5))
    with pytest.raises(ValueError, match="evaluation only"):
        PPOController(agent, fossilize_when_legal=True)
    assert PPOController(agent, fossilize_when_legal=True, learns=False).fossilize_when_legal
