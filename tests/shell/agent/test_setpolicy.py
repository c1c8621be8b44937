"""The host-agnostic policy (``ppo.policy set``): one network, the same weights, acts legally on hosts
with 3 and 5 slots and on other blueprint catalogues (zero-shot); act and rescore agree; the capacity
and slot-order priors come from the descriptors; a PPO update moves it (with replay kept per host
shape); checkpoints round-trip; normalization does not depend on the host's shape."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from esper.core import distributions as D
from esper.core.loss import ppo_loss
from esper.core.masks import action_masks, legal_masks, within_param_cap
from esper.core.observation import global_dim, obs_dim, observation_layout, slot_state_names
from esper.core.spec import HEADS, SLOT_FIELDS, ActionSpec, Op, Stage
from esper.shell.agent.agent import build_agent
from esper.shell.agent.collective import keep_replay
from esper.shell.agent.config import PPOConfig
from esper.shell.agent.setpolicy import SetRecurrentActorCritic
from esper.shell.agent.trainer import PPOTrainer
from esper.shell.common.checkpoint import load_checkpoint, save_checkpoint
from esper.shell.env.step import StepInput
from esper.shell.host.descriptors import describe_host
from esper.shell.host.hosts import CNN1dHost, CNNHost, TransformerHost
from tests.shell.agent.test_trainer import finish_rollout

CFG = PPOConfig(policy="set", hidden=16, head_hidden=16, n_epochs=1, n_minibatches=2, target_kl=None)


def _layouts() -> dict:
    with torch.random.fork_rng(devices=[]):
        hosts = {
            "cnn1d-3": CNN1dHost(),  # the default's host: 3 slots, the cnn1d catalogue
            "cnn1d-5": CNN1dHost(channels=(8,) * 5, kernels=(1,) * 5, pools=(2, 2, 1, 1, 1)),  # 5 slots
            "cnn-3": CNNHost(in_channels=1, image_size=16, channels=(4, 8, 16)),  # another catalogue, widths
            "transformer-2": TransformerHost(d_model=16, n_layers=4, n_heads=2, ctx=8),  # 7 blueprints
        }
    return {name: describe_host(h) for name, h in hosts.items()}


LAYOUTS = _layouts()


def _spec(layout) -> ActionSpec:
    return ActionSpec(layout.n_slots, layout.n_blueprints, (layout.blueprint_names.index("noop"),))


def _step(layout, E: int, g: torch.Generator) -> StepInput:
    """A step on ``layout``'s host: random slot states (all enabled but the last slot of env 0), a raw
    observation of the host's layout whose ``enabled`` columns and blueprint one-hots agree with them."""
    S, B = layout.n_slots, layout.n_blueprints
    slots = TensorDict({k: torch.zeros(E, S, dtype=dt) for k, (dt, _) in SLOT_FIELDS.items()}, [E, S])
    slots["enabled"] = torch.ones(E, S, dtype=torch.bool)
    slots["enabled"][0, -1] = False
    slots["stage"] = torch.randint(0, len(Stage), (E, S), generator=g)
    slots["age"] = torch.full((E, S), 4)
    slots["blueprint"] = torch.randint(1, B, (E, S), generator=g)
    names = observation_layout(S, B)
    raw = torch.randn(E, len(names), generator=g)
    for s in range(S):
        raw[:, names.index(f"slot{s}.enabled")] = slots["enabled"][:, s].float()
        for b in range(B):
            raw[:, names.index(f"slot{s}.blueprint_{b}")] = (slots["blueprint"][:, s] == b).float()
    legal = legal_masks(slots, _spec(layout))
    return StepInput(raw, legal, slots, TensorDict({}, [E]), TensorDict({}, [E]), layout)


def _agent(cfg: PPOConfig = CFG, seed: int = 0, layout=None):
    torch.manual_seed(seed)
    layout = layout or LAYOUTS["cnn1d-3"]
    return build_agent(cfg, _spec(layout), device="cpu")


def _assert_legal(out: TensorDict, legal: TensorDict) -> None:
    expected = action_masks(legal, out["op", "action"], out["slot", "action"], out["blueprint", "action"])
    for head in HEADS:
        mask, a = out[head, "action_mask"], out[head, "action"]
        assert torch.equal(mask, expected[head]), head
        assert mask.gather(-1, a.unsqueeze(-1)).all(), head


def test_one_network_acts_legally_on_hosts_of_3_and_5_slots_and_other_catalogues():
    """The same weights (built for the default's 3-slot cnn1d host) act on a 5-slot host, a 2-D CNN host
    with other widths and a transformer's 7 blueprints: every action legal under the masks it stores,
    the masks those of the sampled op and slot, a value per env; greedy takes each head's mode."""
    agent = _agent()
    policy = agent.policy
    assert isinstance(policy, SetRecurrentActorCritic)
    weights = {k: v.clone() for k, v in policy.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    E = 6
    for name, layout in LAYOUTS.items():
        step = _step(layout, E, g)
        x = agent.policy_input(step)
        assert x["slots"].shape == (E, layout.n_slots, policy.slot_dim), name
        assert x["blueprints"].shape == (E, layout.n_slots, layout.n_blueprints, policy.descriptor_dim)
        assert not x["enabled"][0, -1] and x["enabled"][1:].all()
        out, (h, _) = policy.act(x, policy.initial_state(E), step.legal, generator=g)
        _assert_legal(out, step.legal)
        assert out["slot", "action_mask"].shape == (E, layout.n_slots)
        assert out["blueprint", "action_mask"].shape == (E, layout.n_blueprints)
        assert out["state_value"].shape == (E,) and h.shape == (1, E, 16)
        greedy, _ = policy.act(x, policy.initial_state(E), step.legal, deterministic=True)
        logits = policy.rescore(x.unsqueeze(1), policy.initial_state(E), greedy["op", "action"].unsqueeze(1),
                                greedy["slot", "action"].unsqueeze(1))  # fmt: skip
        for head in HEADS:
            masked = torch.where(greedy[head, "action_mask"], logits[head, "logits"][:, 0], -torch.inf)
            assert torch.equal(greedy[head, "action"], masked.argmax(-1)), (name, head)
    for k, v in policy.state_dict().items():
        assert torch.equal(v, weights[k]), "acting changed no weight"


def test_the_held_blueprint_is_described_not_indexed():
    """A slot's input holds the descriptor of the blueprint it holds (zeros without a seed), read from
    the observation's one-hot and the host's descriptors, never the one-hot itself."""
    layout = LAYOUTS["cnn-3"]
    agent = _agent(layout=layout)
    step = _step(layout, 3, torch.Generator().manual_seed(2))
    x = agent.policy_input(step)
    n = len(slot_state_names()) + 2
    for e in range(3):
        for s in range(layout.n_slots):
            b = int(step.slots["blueprint"][e, s])
            torch.testing.assert_close(x["slots"][e, s, n:], layout.descriptors[s, b])
    names = observation_layout(layout.n_slots, layout.n_blueprints)
    raw = step.raw_obs.clone()
    raw[:, [i for i, c in enumerate(names) if ".blueprint_" in c]] = 0.0  # no seed anywhere
    empty = agent.policy_input(StepInput(raw, step.legal, step.slots, step.signals, step.history, layout))
    assert torch.equal(empty["slots"][..., n:], torch.zeros_like(empty["slots"][..., n:]))


def test_per_env_generators_make_an_env_s_actions_independent_of_its_batch():
    layout = LAYOUTS["cnn1d-5"]
    agent = _agent()
    step = _step(layout, 3, torch.Generator().manual_seed(3))
    x = agent.policy_input(step)
    gens = lambda: [torch.Generator().manual_seed(100 + i) for i in range(3)]
    whole, _ = agent.policy.act(x, agent.policy.initial_state(3), step.legal, generator=gens())
    alone, _ = agent.policy.act(x[1:2], agent.policy.initial_state(1), step.legal[1:2], generator=gens()[1:2])
    for head in HEADS:
        assert torch.equal(whole[head, "action"][1:2], alone[head, "action"]), head
        torch.testing.assert_close(whole[head, "action_log_prob"][1:2], alone[head, "action_log_prob"])


def _rollout(agent, layout, E: int = 4, T: int = 5, seed: int = 0) -> TensorDict:
    """What EpisodeRunner + PPOController store for the set policy, on random steps of ``layout``."""
    g = torch.Generator().manual_seed(seed)
    policy = agent.policy
    state = policy.initial_state(E)
    steps = []
    for _ in range(T):
        step = _step(layout, E, g)
        x = agent.policy_input(step)
        h, c = state
        out, state = policy.act(x, state, step.legal, generator=g)
        out["observation"] = x
        out["raw_observation"] = step.raw_obs
        out["recurrent_state"] = TensorDict({"h": h[0], "c": c[0]}, [E])
        steps.append(out)
    return finish_rollout(steps, g)


@pytest.mark.parametrize("name", ["cnn1d-3", "cnn1d-5", "transformer-2"])
def test_log_probs_from_act_equal_rescore_on_each_host(name):
    agent = _agent(seed=1)
    layout = LAYOUTS[name]
    td = _rollout(agent, layout, E=3, T=4, seed=4)
    state0 = agent.policy.initial_state(3)
    current = agent.policy.rescore(td["observation"], state0, td["op", "action"], td["slot", "action"])
    for head in HEADS:
        lp = D.log_prob(current[head, "logits"], td[head, "action"], td[head, "action_mask"])
        torch.testing.assert_close(lp, td[head, "action_log_prob"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(current["state_value"], td["state_value"], rtol=1e-5, atol=1e-5)


def test_rescore_gives_gradient_to_every_parameter():
    agent = _agent()
    layout = LAYOUTS["cnn-3"]
    td = _rollout(agent, layout, E=2, T=3)
    op = torch.full((2, 3), int(Op.GERMINATE))
    out = agent.policy.rescore(td["observation"], agent.policy.initial_state(2), op, td["slot", "action"])
    loss = sum(out[h, "logits"].square().sum() for h in HEADS) + out["state_value"].sum()
    loss = loss + out["blueprint", "logits"].sum()  # the size prior's weight has a gradient of its own
    loss.backward()
    for name, p in agent.policy.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def _probs(agent, layout, op: Op, slot: int, E: int = 4):
    step = _step(layout, E, torch.Generator().manual_seed(5))
    x = agent.policy_input(step)
    ops = torch.full((E, 1), int(op))
    out = agent.policy.rescore(x.unsqueeze(1), agent.policy.initial_state(E), ops, torch.full((E, 1), slot))
    return out, step


def assert_size_prior(agent, layout) -> None:
    """At every slot of ``layout``, the untrained ``agent`` grows each legal blueprint about in proportion
    to what germinating it there costs (``noop`` excluded)."""
    noop = layout.blueprint_names.index("noop")
    legal = torch.ones(layout.n_blueprints, dtype=torch.bool)
    legal[noop] = False
    for slot in range(layout.n_slots):
        cost = layout.germination_cost[slot].clone()
        cost[noop] = 0.0
        out, _ = _probs(agent, layout, Op.GERMINATE, slot)
        p = torch.softmax(out["blueprint", "logits"][:, 0].masked_fill(~legal, -torch.inf), -1)
        torch.testing.assert_close(p, (cost / cost.sum()).expand_as(p), atol=0.02, rtol=0.0)


@pytest.mark.parametrize("name", ["cnn-3", "transformer-2"])
def test_size_bias_starts_the_blueprint_pointer_in_proportion_to_each_seeds_cost_at_the_chosen_slot(name):
    """``ppo.size_bias 1``: an untrained set policy grows each legal blueprint about in proportion to its
    germination cost in the slot it chose (the descriptors' costs of whatever host it acts on); 0: about
    uniform."""
    layout = LAYOUTS[name]
    agent = _agent(PPOConfig(policy="set", hidden=16, head_hidden=16, size_bias=1.0), layout=layout)
    assert float(agent.policy.heads["blueprint"].prior.detach()) == 1.0
    assert_size_prior(agent, layout)
    noop = layout.blueprint_names.index("noop")
    legal = torch.ones(layout.n_blueprints, dtype=torch.bool)
    legal[noop] = False
    uniform = _agent(layout=layout)
    out, _ = _probs(uniform, layout, Op.GERMINATE, 0)
    p = torch.softmax(out["blueprint", "logits"][:, 0].masked_fill(~legal, -torch.inf), -1)
    torch.testing.assert_close(
        p[:, legal], torch.full_like(p[:, legal], 1 / int(legal.sum())), atol=0.02, rtol=0
    )


def test_slot_order_bias_starts_the_slot_pointer_on_the_first_slot_of_any_host():
    for name in ("cnn1d-3", "cnn1d-5"):
        layout = LAYOUTS[name]
        agent = _agent(PPOConfig(policy="set", hidden=16, head_hidden=16, slot_order_bias=3.0))
        out, _ = _probs(agent, layout, Op.GERMINATE, 0)
        logits = out["slot", "logits"][:, 0]
        gaps = logits[:, :-1] - logits[:, 1:]
        torch.testing.assert_close(gaps, torch.full_like(gaps, 3.0), atol=0.05, rtol=0)


def test_wait_and_blend_biases_are_the_flat_policy_s():
    agent = _agent(PPOConfig(policy="set", hidden=16, head_hidden=16, wait_bias=3.0, germinate_bias=3.0))
    out, _ = _probs(agent, LAYOUTS["cnn1d-3"], Op.WAIT, 0)
    p = torch.softmax(out["op", "logits"][:, 0], -1)
    assert (p[:, int(Op.WAIT)] > 0.4).all() and (p[:, int(Op.GERMINATE)] > 0.4).all()


@pytest.mark.parametrize("policy", ["set", "flat"])
def test_fossilize_bias_starts_fossilize_above_wait_where_it_is_legal(policy):
    """``ppo.fossilize_bias`` reaches either network from the config: FOSSILIZE starts that many logits
    above the ops that change a live seed. Above ``wait_bias``, an untrained policy's most likely op is
    FOSSILIZE wherever the mask allows it, and WAIT where neither it nor GERMINATE is legal (no free
    slot, no seed that may be kept yet); 0 leaves the network as it was, bit for bit (the defaults'
    events do not move)."""
    base = dict(policy=policy, hidden=16, head_hidden=16, wait_bias=3.0, germinate_bias=3.0)
    agent = _agent(PPOConfig(**base, fossilize_bias=4.0))
    out, _ = _probs(agent, LAYOUTS["cnn1d-3"], Op.WAIT, 0)
    logits = out["op", "logits"][:, 0]
    gap = logits[:, int(Op.FOSSILIZE)] - logits[:, int(Op.PRUNE)]
    torch.testing.assert_close(gap, torch.full_like(gap, 4.0), atol=0.05, rtol=0)
    legal = torch.ones_like(logits, dtype=torch.bool)
    assert (logits.masked_fill(~legal, -torch.inf).argmax(-1) == int(Op.FOSSILIZE)).all()
    legal[:, [int(Op.FOSSILIZE), int(Op.GERMINATE)]] = False
    assert (logits.masked_fill(~legal, -torch.inf).argmax(-1) == int(Op.WAIT)).all()
    plain, zero = _agent(PPOConfig(**base)), _agent(PPOConfig(**base, fossilize_bias=0.0))
    for (k, a), b in zip(plain.policy.state_dict().items(), zero.policy.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def _trainer(agent, cfg: PPOConfig = CFG) -> PPOTrainer:
    return PPOTrainer(agent, cfg, generator=torch.Generator().manual_seed(0))


def test_a_ppo_update_runs_and_moves_the_set_policy_on_any_host():
    agent = _agent()
    trainer = _trainer(agent, PPOConfig(policy="set", hidden=16, head_hidden=16, n_epochs=1, n_minibatches=2,
                                        lr=1e-2, target_kl=None))  # fmt: skip
    before = {k: v.clone() for k, v in agent.policy.state_dict().items()}
    for name in ("cnn1d-3", "cnn1d-5"):
        m = trainer.update(_rollout(agent, LAYOUTS[name], E=4, T=5))
        assert m["minibatch_steps"] > 0 and not m["rolled_back"], name
        for key in ("loss_objective", "loss_critic", "kl_approx", "grad_norm"):
            assert torch.isfinite(torch.tensor(m[key])), key
    moved = [k for k, v in agent.policy.state_dict().items() if not torch.equal(v, before[k])]
    assert {"heads.slot.score.0.weight", "heads.blueprint.score.0.weight", "slot_encoder.0.weight",
            "blueprint_encoder.0.weight", "lstm.weight_hh_l0"} <= set(moved)  # fmt: skip


def test_statistics_are_global_and_pooled_over_enabled_slots_whatever_the_host():
    """The global part has its own statistics, every slot's features one set pooled over the enabled
    slots of every env and step: the same shapes after rollouts of hosts with 3 and 5 slots."""
    agent = _agent()
    trainer = _trainer(agent)
    g, s = agent.obs_stats["global", "mean"].shape, agent.obs_stats["slot", "mean"].shape
    assert g == (global_dim(),) and s == (len(slot_state_names()),)
    td = _rollout(agent, LAYOUTS["cnn1d-5"], E=4, T=5)
    trainer.update(td)
    assert float(agent.obs_stats["global", "count"]) == 4 * 5
    assert float(agent.obs_stats["slot", "count"]) == 5 * (4 * 5 - 1)  # env 0's last slot is disabled
    trainer.update(_rollout(agent, LAYOUTS["cnn1d-3"], E=4, T=5))
    assert agent.obs_stats["global", "mean"].shape == g and agent.obs_stats["slot", "mean"].shape == s
    assert float(agent.obs_stats["global", "count"]) == 2 * 4 * 5


def test_replay_keeps_rollouts_per_host_shape_and_never_mixes_them():
    cfg = PPOConfig(
        policy="set", hidden=16, head_hidden=16, n_epochs=1, n_minibatches=2, target_kl=None, replay=1
    )
    agent = _agent(cfg)
    trainer = _trainer(agent, cfg)
    three, five = LAYOUTS["cnn1d-3"], LAYOUTS["cnn1d-5"]
    assert trainer.update(_rollout(agent, three, seed=1))["replayed_envs"] == 0
    assert trainer.update(_rollout(agent, five, seed=2))["replayed_envs"] == 0  # another shape: none
    assert len(trainer.state.replay) == 2  # one per shape
    assert trainer.update(_rollout(agent, three, seed=3))["replayed_envs"] == 4  # the 3-slot one only
    kept = trainer.state.replay
    assert [td["observation", "slots"].shape[2] for td in kept] == [3, 5]
    a, b = _rollout(agent, three, E=2, T=2, seed=5), _rollout(agent, three, E=2, T=2, seed=6)
    assert keep_replay([a, b], 1) == [a] and keep_replay([a, b], 0) == []


def test_checkpoint_round_trip_and_a_flat_checkpoint_is_refused_in_one_line():
    agent = _agent()
    trainer = _trainer(agent)
    layout = LAYOUTS["cnn1d-5"]
    trainer.update(_rollout(agent, layout, T=3))
    sd = agent.state_dict()
    fresh = _agent(seed=7)
    fresh.load(sd)
    _trainer(fresh).load_state_dict(trainer.state_dict())
    td = _rollout(agent, layout, E=2, T=3, seed=9)
    args = (td["observation"], agent.policy.initial_state(2), td["op", "action"], td["slot", "action"])
    a, b = agent.policy.rescore(*args), fresh.policy.rescore(*args)
    for head in HEADS:
        torch.testing.assert_close(a[head, "logits"], b[head, "logits"])
    torch.testing.assert_close(fresh.obs_stats["slot", "mean"], agent.obs_stats["slot", "mean"])
    step = _step(layout, 2, torch.Generator().manual_seed(3))
    torch.testing.assert_close(fresh.policy_input(step)["slots"], agent.policy_input(step)["slots"])
    # the agent alone (evaluation, growing a user's model) loads it too
    alone = _agent(seed=8).load(sd)
    torch.testing.assert_close(alone.obs_stats["global", "var"], agent.obs_stats["global", "var"])
    flat_cfg = PPOConfig(policy="flat", hidden=16, head_hidden=16)
    flat = build_agent(flat_cfg, _spec(LAYOUTS["cnn1d-3"]), device="cpu")
    flat_sd = {"policy": flat.policy.state_dict(), "obs_stats": flat.obs_stats.to_dict()}
    with pytest.raises((RuntimeError, ValueError)):
        _agent().load(flat_sd)
    with pytest.raises(ValueError, match="observation statistics") as err:
        _agent().load({"policy": agent.policy.state_dict(), "obs_stats": flat.obs_stats.to_dict()})
    assert "\n" not in str(err.value)


def test_bad_inputs_and_options_are_refused_in_one_line():
    agent = _agent()
    with pytest.raises(ValueError, match="reads a TensorDict"):
        agent.policy.act(torch.zeros(2, 5), agent.policy.initial_state(2), TensorDict({}, [2]))
    step = _step(LAYOUTS["cnn1d-3"], 2, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="the step has none"):
        agent.policy_input(StepInput(step.raw_obs, step.legal, step.slots, step.signals, step.history))
    with pytest.raises(ValueError, match="ppo.slot_bias is the flat policy's"):
        PPOConfig(policy="set", slot_bias=True)
    with pytest.raises(ValueError, match="ppo.policy must be one of flat, set"):
        PPOConfig(policy="graph")


def test_param_cap_narrows_by_the_step_s_own_host():
    """``ppo.param_cap``: the cap reads each step's host's germination costs, so one agent caps a host
    of another width by that host's costs."""
    cfg = PPOConfig(policy="set", hidden=16, head_hidden=16, param_cap=100.0)
    agent = _agent(cfg)
    for name in ("cnn1d-3", "cnn-3"):
        layout = LAYOUTS[name]
        step = _step(layout, 2, torch.Generator().manual_seed(1))
        step.slots["seed_params"] = torch.zeros(2, layout.n_slots)
        legal = agent.legal(step)
        zero = step.slots["seed_params"]
        expected = within_param_cap(step.legal, zero, layout.germination_cost, 100.0, layout.gate_cost)
        assert torch.equal(legal["blueprint_by_slot"], expected["blueprint_by_slot"]), name
        assert torch.equal(legal["gated_by_slot"], expected["gated_by_slot"]), name
        other = LAYOUTS["cnn-3" if name == "cnn1d-3" else "cnn1d-3"].germination_cost
        assert not torch.equal(legal["blueprint_by_slot"], within_param_cap(step.legal, zero, other, 100.0)[
            "blueprint_by_slot"])  # fmt: skip
        out, _ = agent.policy.act(agent.policy_input(step, legal), agent.policy.initial_state(2), legal)
        _assert_legal(out, legal)


def test_the_observation_length_decides_the_slot_features():
    """With ``lifecycle.seed_grad_features`` the slot features hold the four gradient features: the
    agent reads that from the env's observation length."""
    spec = _spec(LAYOUTS["cnn1d-3"])
    raw = obs_dim(spec.n_slots, spec.n_blueprints, seed_grads=True)
    agent = build_agent(CFG, spec, device="cpu", raw_obs_dim=raw)
    assert agent.obs_stats["slot", "mean"].shape == (len(slot_state_names(seed_grads=True)),)


def test_the_set_policy_keeps_the_flat_policy_s_contract():
    """On the same host the set policy's act and rescore hold what the flat policy's hold (keys, shapes,
    dtypes), so the runner, the loss and the telemetry read either; each stored log-prob is the masked
    log-softmax of the re-scored logits (an illegal choice has probability 0); the factored PPO loss
    gives every head's normalized entropy in [0, 1] from the same logits and masks."""
    layout = LAYOUTS["cnn1d-3"]
    spec = _spec(layout)
    torch.manual_seed(0)
    flat = build_agent(PPOConfig(hidden=16, head_hidden=16), spec, device="cpu")
    agents = {"flat": flat, "set": _agent(layout=layout)}
    step = _step(layout, 4, torch.Generator().manual_seed(11))
    outs, scored = {}, {}
    for name, agent in agents.items():
        x = agent.policy_input(step)
        out, _ = agent.policy.act(x, agent.policy.initial_state(4), step.legal, generator=torch.Generator())
        outs[name] = out
        seq = x.unsqueeze(1)
        ops, slots = out["op", "action"].unsqueeze(1), out["slot", "action"].unsqueeze(1)
        scored[name] = agent.policy.rescore(seq, agent.policy.initial_state(4), ops, slots)
    layout_of = lambda td: {str(k): (tuple(v.shape), v.dtype) for k, v in td.items(True, True)}
    assert layout_of(outs["set"]) == layout_of(outs["flat"])
    assert {str(k): s for k, (s, _) in layout_of(scored["set"]).items()} == {
        str(k): s for k, (s, _) in layout_of(scored["flat"]).items()
    }
    out, current = outs["set"], scored["set"]
    for head in HEADS:
        logits, mask = current[head, "logits"][:, 0], out[head, "action_mask"]
        lsm = torch.log_softmax(logits.masked_fill(~mask, -torch.inf), -1)
        expected = lsm.gather(-1, out[head, "action"].unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(out[head, "action_log_prob"], expected, rtol=1e-5, atol=1e-5)
        p = D.log_softmax(logits, mask).exp()
        assert (p[~mask] == 0).all() and torch.allclose(p.sum(-1), torch.ones(4))
        ent = D.normalized_entropy(logits, mask)
        assert ((ent >= -1e-6) & (ent <= 1 + 1e-6)).all(), head
    td = _rollout(agents["set"], layout, E=2, T=3, seed=12)
    td["advantage"] = torch.randn(2, 3)
    td["value_target"] = torch.randn(2, 3)
    td["current"] = agents["set"].policy.rescore(
        td["observation"], agents["set"].policy.initial_state(2), td["op", "action"], td["slot", "action"]
    )
    losses = ppo_loss(td, factored=True)
    for head in HEADS:
        assert 0 <= float(losses[head, "entropy"]) <= 1 + 1e-6, head
    assert torch.isfinite(losses["loss_objective"]) and abs(float(losses["kl_approx"])) < 1e-5


def test_a_set_policy_checkpoint_round_trips_through_the_checkpoint_file(tmp_path):
    """Written with :func:`save_checkpoint` and read back with ``weights_only`` loading: the same logits
    on a host with another number of slots, the same statistics (global and pooled slot entries)."""
    agent = _agent()
    trainer = _trainer(agent)
    trainer.update(_rollout(agent, LAYOUTS["cnn1d-3"], T=3))
    payload = {"agent": agent.state_dict(), "learner": trainer.state_dict()}
    save_checkpoint(tmp_path / "checkpoint.pt", payload)
    loaded = load_checkpoint(tmp_path / "checkpoint.pt")
    fresh = _agent(seed=5)
    fresh.load(loaded["agent"])
    _trainer(fresh).load_state_dict(loaded["learner"])
    layout = LAYOUTS["cnn1d-5"]
    td = _rollout(agent, layout, E=2, T=3, seed=13)
    args = (td["observation"], agent.policy.initial_state(2), td["op", "action"], td["slot", "action"])
    a, b = agent.policy.rescore(*args), fresh.policy.rescore(*args)
    for head in HEADS:
        torch.testing.assert_close(a[head, "logits"], b[head, "logits"], rtol=0, atol=0)
    for key in ("global", "slot"):
        for stat in ("count", "mean", "var"):
            torch.testing.assert_close(fresh.obs_stats[key, stat], agent.obs_stats[key, stat], rtol=0, atol=0)
