"""The tensorized seed lifecycle: transitions, gates, ramps, timers, and invariants under random legal
play (hypothesis). Helpers here (signals, actions, random legal rollouts) are shared by the masks,
observation, reward and compile tests."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDict

from esper.core.lifecycle import (
    EVENT_KINDS,
    SEED_FIELDS,
    LifecycleConfig,
    alpha_at,
    clear_seeds,
    gate_readiness,
    init_slots,
    is_live,
    lifecycle_step,
    record_signals,
)
from esper.core.masks import head_relevance, op_slot_legality
from esper.core.spec import (
    ALPHA_SPEED_STEPS,
    ALPHA_TARGETS,
    HEAD_INDEX,
    HEADS,
    SLOT_FIELDS,
    TEMPO_EPOCHS,
    AlphaCurve,
    AlphaSpeed,
    Op,
    Stage,
    Style,
    Tempo,
)

N_BP = 4


# ------------------------------------------------------------------------------------------ helpers
def make_signals(
    E: int,
    S: int,
    *,
    epoch=1,
    val_acc=40.0,
    val_loss=1.5,
    train_acc=None,
    train_loss=None,
    host_params=1000.0,
    contribution=0.0,
    grad_ratio=0.0,
    seed_params=0.0,
) -> TensorDict:
    """A signals TD ``[E]`` (slots ``[E, S]``); scalars broadcast, tensors/lists taken as given."""
    f = lambda v, shape: torch.as_tensor(v, dtype=torch.float32).expand(shape).clone()
    return TensorDict(
        {
            "epoch": torch.as_tensor(epoch, dtype=torch.int64).expand(E).clone(),
            "val_acc": f(val_acc, (E,)),
            "val_loss": f(val_loss, (E,)),
            "train_acc": f(val_acc if train_acc is None else train_acc, (E,)),
            "train_loss": f(val_loss if train_loss is None else train_loss, (E,)),
            "host_params": f(host_params, (E,)),
            "slots": TensorDict(
                {
                    "contribution": f(contribution, (E, S)),
                    "grad_ratio": f(grad_ratio, (E, S)),
                    "seed_params": f(seed_params, (E, S)),
                },
                batch_size=[E, S],
            ),
        },
        batch_size=[E],
    )


def make_action(E: int, op, slot=0, **heads) -> TensorDict:
    """An action TD ``[E]``; unspecified heads are 0."""
    t = lambda v: torch.as_tensor(int(v) if isinstance(v, int) else v, dtype=torch.int64).expand(E).clone()
    out = {h: t(heads.get(h, 0)) for h in HEADS}
    out["op"], out["slot"] = t(op), t(slot)
    return TensorDict(out, batch_size=[E])


def step(slots, action, signals, cfg, n_blueprints=N_BP):
    slots = record_signals(slots, signals, cfg)
    new, ev = lifecycle_step(slots, action, signals, cfg, n_blueprints=n_blueprints)
    return slots, new, ev


def fired(ev, env=0, slot=0) -> set[str]:
    return {k for k in EVENT_KINDS if bool(ev[k][env, slot])}


def check_invariants(slots: TensorDict, prev: TensorDict | None, cfg: LifecycleConfig) -> None:
    stage = slots["stage"]
    assert ((stage >= 0) & (stage < len(Stage))).all()
    assert ((slots["alpha"] >= 0) & (slots["alpha"] <= 1)).all()
    empty = ~is_live(stage)
    for k in SEED_FIELDS:
        assert (slots[k][empty] == 0).all(), f"{k} set on an empty slot"
    assert (slots["embargo"][stage != int(Stage.EMBARGOED)] == 0).all()
    assert (slots["embargo"][stage == int(Stage.EMBARGOED)] > 0).all()
    assert (stage[~slots["enabled"]] == int(Stage.DORMANT)).all(), "a disabled slot left DORMANT"
    assert (slots["ramp_pos"] <= slots["ramp_len"]).all() and (slots["ramp_pos"] >= 0).all()
    if cfg.max_seeds > 0:
        assert (is_live(stage).sum(-1) <= cfg.max_seeds).all()
    # alpha is always the ramp's value
    expect = alpha_at(
        slots["curve"], slots["ramp_pos"], slots["ramp_len"], slots["ramp_from"], slots["ramp_to"]
    )
    torch.testing.assert_close(slots["alpha"], torch.where(is_live(stage), expect, 0.0))
    # TRAINING and GERMINATED seeds are not blended in
    assert (slots["alpha"][(stage == int(Stage.TRAINING)) | (stage == int(Stage.GERMINATED))] == 0).all()
    if prev is not None:
        was_fossil = prev["stage"] == int(Stage.FOSSILIZED)
        assert (stage[was_fossil] == int(Stage.FOSSILIZED)).all(), "FOSSILIZED is terminal"
        assert (slots["alpha"][was_fossil] == prev["alpha"][was_fossil]).all()
        assert torch.equal(slots["prev_stage"], prev["stage"])
        assert torch.equal(slots["prev_epochs_in_stage"], prev["epochs_in_stage"])


#: Signal values a random rollout draws from: enough gain, gradient ratio and contribution to pass
#: every gate some of the time, and values that fail them.
_CONTRIB = st.sampled_from([-3.0, -0.2, 0.0, 0.7, 1.5, 6.0])
_GRAD = st.sampled_from([0.0, 0.02, 0.4, 30.0])
_GAIN = st.sampled_from([-2.0, 0.0, 0.3, 1.0, 2.5])
#: How often a random rollout picks each legal op (biased towards progress, so deep stages are reached).
_OP_WEIGHT = {
    Op.WAIT: 2,
    Op.GERMINATE: 2,
    Op.SET_ALPHA_TARGET: 1,
    Op.PRUNE: 1,
    Op.FOSSILIZE: 4,
    Op.ADVANCE: 4,
}


def random_rollout(data, *, E=2, S=3, T=25, cfg=None, enabled=None):
    """Play ``T`` steps of random *legal* actions (drawn from the masks). Yields per step
    ``(pre_slots, action, signals, new_slots, events)``; pre_slots is after record_signals."""
    cfg = cfg or LifecycleConfig(max_epochs=T)
    if enabled is None:
        enabled = data.draw(st.lists(st.booleans(), min_size=S, max_size=S).filter(any), label="enabled")
    slots = init_slots(E, enabled)
    acc = torch.full((E,), 30.0)
    for t in range(1, T + 1):
        acc = (acc + torch.tensor([data.draw(_GAIN) for _ in range(E)])).clamp(0, 100)
        signals = make_signals(
            E,
            S,
            epoch=t,
            val_acc=acc,
            val_loss=torch.tensor([data.draw(st.floats(0.01, 5.0)) for _ in range(E)]),
            contribution=torch.tensor([[data.draw(_CONTRIB) for _ in range(S)] for _ in range(E)]),
            grad_ratio=torch.tensor([[data.draw(_GRAD) for _ in range(S)] for _ in range(E)]),
            seed_params=torch.tensor([[data.draw(st.sampled_from([0.0, 50.0, 5e3])) for _ in range(S)]] * E),
        )
        slots = record_signals(slots, signals, cfg)
        legal = op_slot_legality(slots, max_seeds=cfg.max_seeds, min_prune_age=cfg.min_prune_age)
        ops, slot_choice = [], []
        for e in range(E):
            legal_ops = [o for o in Op if legal[e, o].any() for _ in range(_OP_WEIGHT[o])]
            o = data.draw(st.sampled_from(legal_ops), label="op")
            ok_slots = [s for s in range(S) if legal[e, o, s]]
            ops.append(int(o))
            slot_choice.append(data.draw(st.sampled_from(ok_slots), label="slot"))
        heads = {
            "blueprint": data.draw(st.integers(0, N_BP - 1)),
            "style": data.draw(st.sampled_from(list(Style))),
            "tempo": data.draw(st.sampled_from(list(Tempo))),
            "alpha_target": data.draw(st.integers(0, len(ALPHA_TARGETS) - 1)),
            "alpha_speed": data.draw(st.sampled_from(list(AlphaSpeed))),
            "alpha_curve": data.draw(st.sampled_from(list(AlphaCurve))),
        }
        action = make_action(
            E, torch.tensor(ops), torch.tensor(slot_choice), **{k: int(v) for k, v in heads.items()}
        )
        new, events = lifecycle_step(slots, action, signals, cfg, n_blueprints=N_BP)
        yield slots, action, signals, new, events
        slots = new


# ------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "bad",
    [
        {"max_epochs": 0},
        {"holding_timeout": 0},
        {"embargo_epochs": -1},
        {"max_seeds": -1},
        {"grad_ratio_momentum": 1.0},
        {"grad_ratio_cap": 0.0},
        {"g2_min_gain": float("nan")},
        {"g2_evidence": "seed"},
        {"g2_min_epochs": 1.5},
    ],
)
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        LifecycleConfig(**bad)


def test_config_defaults_are_the_references():
    cfg = LifecycleConfig()
    assert (cfg.max_epochs, cfg.g2_min_epochs, cfg.g2_min_gain, cfg.g2_min_grad_ratio) == (25, 3, 0.5, 0.05)
    assert (cfg.g3_min_epochs, cfg.g5_min_contribution, cfg.holding_timeout, cfg.embargo_epochs) == (
        3,
        1.0,
        5,
        5,
    )
    assert (cfg.min_prune_age, cfg.max_seeds, cfg.grad_ratio_momentum, cfg.grad_ratio_cap) == (1, 0, 0.9, 10)
    assert all(f.metadata.get("doc") for f in dataclasses.fields(cfg))


# -------------------------------------------------------------------------------------------- state
def test_init_slots_has_the_schema():
    slots = init_slots(3, [True, False, True])
    assert slots.batch_size == (3, 3)
    assert set(slots.keys()) == set(SLOT_FIELDS)
    for k, (dtype, _) in SLOT_FIELDS.items():
        assert slots[k].dtype == dtype, k
    assert (slots["stage"] == int(Stage.DORMANT)).all()
    assert slots["enabled"].tolist() == [[True, False, True]] * 3
    per_env = init_slots(2, torch.tensor([[True, False], [False, True]]))
    assert per_env["enabled"].tolist() == [[True, False], [False, True]]
    with pytest.raises(ValueError, match="rows"):
        init_slots(3, torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="n_envs"):
        init_slots(0, [True])


# -------------------------------------------------------------------------------------------- alpha
@pytest.mark.parametrize("curve", list(AlphaCurve))
@pytest.mark.parametrize("length", sorted(set(TEMPO_EPOCHS) | set(ALPHA_SPEED_STEPS)))
def test_alpha_at_every_length_and_curve_is_monotone_with_exact_ends(curve, length):
    """Every tempo x speed x curve: exact start at 0, exact end at the last position, monotone."""
    pairs = [(0.0, t) for t in ALPHA_TARGETS] + [(t, 0.0) for t in ALPHA_TARGETS] + [(0.5, 0.7), (1.0, 0.5)]
    start = torch.tensor([p[0] for p in pairs])
    end = torch.tensor([p[1] for p in pairs])
    pos = torch.arange(length + 3).unsqueeze(-1)  # beyond the end too
    vals = alpha_at(torch.tensor(int(curve)), pos, torch.tensor(length), start, end)  # [L+3, P]
    if length > 0:
        assert torch.equal(vals[0], start)
    assert torch.equal(vals[length:], end.expand(3, -1))
    diffs = (vals[1:] - vals[:-1]) * torch.sign(end - start)
    assert (diffs >= 0).all(), f"not monotone: {vals}"
    assert ((vals >= torch.minimum(start, end)) & (vals <= torch.maximum(start, end))).all()


def test_alpha_at_curve_shapes():
    pos, n = torch.arange(9), torch.tensor(8)
    lin = alpha_at(torch.tensor(int(AlphaCurve.LINEAR)), pos, n, torch.tensor(0.0), torch.tensor(1.0))
    torch.testing.assert_close(lin, pos / 8.0)
    cos = alpha_at(torch.tensor(int(AlphaCurve.COSINE)), pos, n, torch.tensor(0.0), torch.tensor(1.0))
    torch.testing.assert_close(cos[4], torch.tensor(0.5))
    assert cos[1] < lin[1] and cos[7] > lin[7]  # ease in, ease out
    early = [
        float(alpha_at(torch.tensor(int(c)), torch.tensor(1), n, torch.tensor(0.0), torch.tensor(1.0)))
        for c in (AlphaCurve.SIGMOID_GENTLE, AlphaCurve.SIGMOID, AlphaCurve.SIGMOID_SHARP)
    ]
    assert early[0] > early[1] > early[2] > 0  # steeper = flatter start


# -------------------------------------------------------------------------------------- transitions
def _play(plan, *, cfg=None, T=16, gain=1.0, contribution=2.0, grad=0.5, **heads):
    """One env, three slots; ``plan`` maps step -> (op, slot, extra heads). Returns per step
    (pre_slots, new_slots, events)."""
    cfg = cfg or LifecycleConfig()
    slots = init_slots(1, [True, True, False])
    out = []
    for t in range(1, T + 1):
        op, slot, extra = plan.get(t, (Op.WAIT, 0, {}))
        signals = make_signals(
            1, 3, epoch=t, val_acc=30.0 + gain * t, contribution=contribution, grad_ratio=grad
        )
        pre, new, ev = step(slots, make_action(1, op, slot, **{**heads, **extra}), signals, cfg)
        out.append((pre, new, ev))
        slots = new
    return out


def test_fastest_germinate_to_fossilize_path_with_reference_numbers():
    """Germinate at step 1 (tempo FAST, target 1.0): TRAINING at 2, G2 passes at 6 (3 epochs in TRAINING,
    +4 pts, grad ratio 0.5), the 3-epoch blend ends at 8, G3 passes at 10, G5 at 11: ten epochs, as in
    the reference. One step earlier each gate fails."""
    plan = {
        1: (Op.GERMINATE, 0, {"tempo": Tempo.FAST, "alpha_target": 2, "blueprint": 3}),
        5: (Op.ADVANCE, 0, {}),  # too early: 2 epochs in TRAINING
        6: (Op.ADVANCE, 0, {}),
        9: (Op.ADVANCE, 0, {}),  # too early: 2 epochs in BLENDING
        10: (Op.ADVANCE, 0, {}),
        11: (Op.FOSSILIZE, 0, {}),
    }
    run = _play(plan, T=12)
    stage = [Stage(int(new["stage"][0, 0])).name for _, new, _ in run]
    assert stage == ["GERMINATED", "TRAINING", "TRAINING", "TRAINING", "TRAINING", "BLENDING", "BLENDING",
                     "BLENDING", "BLENDING", "HOLDING", "FOSSILIZED", "FOSSILIZED"]  # fmt: skip
    events = [fired(ev) for _, _, ev in run]
    assert events[0] == {"germinated"} and events[4] == {"advance_failed"} and events[5] == {"advanced"}
    assert events[8] == {"advance_failed"} and events[9] == {"advanced"} and events[10] == {"fossilized"}
    alphas = [round(float(new["alpha"][0, 0]), 4) for _, new, _ in run]
    assert alphas[:5] == [0.0] * 5 and alphas[5:8] == [0.3333, 0.6667, 1.0] and alphas[8:] == [1.0] * 4
    _, g, _ = run[0]
    assert int(g["blueprint"][0, 0]) == 3 and int(g["tempo"][0, 0]) == int(Tempo.FAST)
    assert float(g["alpha_target"][0, 0]) == 1.0 and float(g["acc_at_germination"][0, 0]) == 31.0
    eis = [int(new["epochs_in_stage"][0, 0]) for _, new, _ in run]
    assert eis == [0, 0, 1, 2, 3, 0, 1, 2, 3, 0, 0, 1]
    assert [int(new["age"][0, 0]) for _, new, _ in run] == list(range(12))
    # the untouched slot and the disabled slot never moved
    assert all((new["stage"][0, 1:] == int(Stage.DORMANT)).all() for _, new, _ in run)


@pytest.mark.parametrize(
    ("kw", "fails"), [({"gain": 0.1}, True), ({"grad": 0.01}, True), ({"grad": 0.06}, False), ({}, False)]
)
def test_g2_blocks_on_gain_and_grad_ratio(kw, fails):
    run = _play({1: (Op.GERMINATE, 0, {}), 6: (Op.ADVANCE, 0, {})}, T=6, **kw)
    assert fired(run[5][2]) == ({"advance_failed"} if fails else {"advanced"})


@pytest.mark.parametrize(
    ("evidence", "whatif", "host_gain", "passes"),
    [
        ("host", 5.0, 0.0, False),  # the reference: a host that does not learn alone strands the seed
        ("host", 0.0, 1.0, True),
        ("what_if", 5.0, 0.0, True),  # the seed's own evidence: blending it in would add 5 points
        ("what_if", 0.25, 1.0, False),  # the host improves, the seed would not: it is not blended
        ("either", 5.0, 0.0, True),
        ("either", 0.25, 1.0, True),
        ("either", 0.25, 0.0, False),
    ],
)
def test_g2_reads_the_evidence_it_is_told_to(evidence, whatif, host_gain, passes):
    """``g2_evidence``: ``host`` reads the host's val-acc gain since TRAINING began (the reference's),
    ``what_if`` the seed's own what-if gain, recorded while it incubates, ``either`` the larger; the dwell
    and the gradient ratio hold whatever the evidence."""
    cfg = LifecycleConfig(g2_evidence=evidence)
    slots = init_slots(1, [True, True])
    for t in range(1, 7):
        op = Op.GERMINATE if t == 1 else Op.ADVANCE if t == 6 else Op.WAIT
        sig = make_signals(1, 2, epoch=t, val_acc=50.0 + host_gain * t, grad_ratio=0.5)
        sig["slots", "whatif_gain"] = torch.tensor([[whatif, 7.0]])
        pre, slots, ev = step(slots, make_action(1, op, 0), sig, cfg)
        if t > 1:  # recorded for the incubating seed only (slot 1 holds none)
            assert pre["whatif_gain"].tolist() == [[whatif, 0.0]]
    assert fired(ev) == ({"advanced"} if passes else {"advance_failed"})
    assert int(slots["stage"][0, 0]) == (Stage.BLENDING if passes else Stage.TRAINING)
    # once blended the seed no longer incubates: its what-if gain is no longer recorded
    assert record_signals(slots, sig, cfg)["whatif_gain"].tolist() == [[whatif if not passes else 0.0, 0.0]]


def test_record_signals_without_a_whatif_measurement_records_zero():
    cfg = LifecycleConfig(g2_evidence="what_if")
    slots = init_slots(1, [True])
    _, slots, _ = step(slots, make_action(1, Op.GERMINATE, 0), make_signals(1, 1), cfg)
    assert record_signals(slots, make_signals(1, 1), cfg)["whatif_gain"].tolist() == [[0.0]]


def test_g5_needs_contribution_and_the_policy_fossilizes_never_automatically():
    plan = {1: (Op.GERMINATE, 0, {"tempo": Tempo.FAST}), 6: (Op.ADVANCE, 0, {}), 10: (Op.ADVANCE, 0, {})}
    plan[11] = (Op.FOSSILIZE, 0, {})
    run = _play(plan, T=11, contribution=0.9)
    assert fired(run[10][2]) == {"fossilize_failed"}
    assert int(run[10][1]["stage"][0, 0]) == Stage.HOLDING


@pytest.mark.parametrize("tempo", [Tempo.STANDARD, Tempo.SLOW])
def test_g3_waits_for_the_blend_ramp_to_finish(tempo):
    """G3 = g3_min_epochs in BLENDING *and* the blend-in ramp finished. At tempo FAST the ramp (3
    epochs) ends when the epoch count is reached, so only a slower tempo tells a gate that forgot the
    ramp apart (issue 10: that mutation survived the suite)."""
    L = TEMPO_EPOCHS[tempo]
    done = 6 + L  # BLENDING at step 6 (its ramp moves that step too): settled in the state step 6 + L reads
    plan = {1: (Op.GERMINATE, 0, {"tempo": tempo, "alpha_target": 2}), 6: (Op.ADVANCE, 0, {})}
    plan.update({t: (Op.ADVANCE, 0, {}) for t in range(10, done + 1)})  # 3 epochs in BLENDING from step 10
    run = _play(plan, T=done)
    cfg = LifecycleConfig()
    for t in range(10, done):
        pre, new, ev = run[t - 1]
        assert int(pre["epochs_in_stage"][0, 0]) >= cfg.g3_min_epochs, t
        assert int(pre["ramp_pos"][0, 0]) < int(pre["ramp_len"][0, 0]) == L, t  # still ramping
        assert "advanced" not in fired(ev) and int(new["stage"][0, 0]) == Stage.BLENDING, t
        signals = make_signals(1, 3, val_acc=40.0)
        assert not bool(gate_readiness(pre, signals["val_acc"], cfg)["g3"][0, 0]), t
    pre, new, ev = run[done - 1]
    assert float(pre["alpha"][0, 0]) == 1.0 and fired(ev) == {"advanced"}
    assert int(new["stage"][0, 0]) == Stage.HOLDING


def test_g5_refuses_a_seed_at_alpha_zero_whatever_its_contribution():
    """G5 needs alpha > 0 (the counterfactual was measured on a blended seed): a HOLDING seed at alpha 0
    is not fossilized by FOSSILIZE, offered by the gate mask, or kept at the HOLDING timeout."""
    plan = {1: (Op.GERMINATE, 0, {"tempo": Tempo.FAST, "alpha_target": 2}), 6: (Op.ADVANCE, 0, {}),
            10: (Op.ADVANCE, 0, {})}  # fmt: skip
    holding = _play(plan, T=10, contribution=5.0)[-1][1]
    assert int(holding["stage"][0, 0]) == Stage.HOLDING and float(holding["alpha"][0, 0]) == 1.0
    at_zero = holding.clone()
    for k in ("alpha", "ramp_from", "ramp_to", "alpha_target"):
        at_zero[k][0, 0] = 0.0
    signals = make_signals(1, 3, epoch=11, val_acc=41.0, contribution=5.0, grad_ratio=0.5)
    cfg = LifecycleConfig()
    _, new, ev = step(holding, make_action(1, Op.FOSSILIZE, 0), signals, cfg)
    assert fired(ev) == {"fossilized"}  # the control: blended, the same contribution passes
    pre, new, ev = step(at_zero, make_action(1, Op.FOSSILIZE, 0), signals, cfg)
    assert float(pre["contribution"][0, 0]) == 5.0
    assert "fossilized" not in fired(ev) and int(new["stage"][0, 0]) == Stage.HOLDING
    gates = gate_readiness(pre, signals["val_acc"], cfg)
    assert not bool(gates["g5"][0, 0])
    assert not bool(op_slot_legality(pre, gates=gates)[0, int(Op.FOSSILIZE), 0]), "the gate mask hides it"
    timeout = LifecycleConfig(timeout_fossilizes=True)
    at_zero["epochs_in_stage"][0, 0] = timeout.holding_timeout - 1
    _, new, ev = step(at_zero, make_action(1, Op.WAIT, 0), signals, timeout)
    assert "timeout_fossilized" not in fired(ev) and "timeout_pruned" in fired(ev)


def test_holding_timeout_prunes_then_embargo_then_dormant():
    cfg = LifecycleConfig()
    plan = {1: (Op.GERMINATE, 0, {"tempo": Tempo.FAST}), 6: (Op.ADVANCE, 0, {}), 10: (Op.ADVANCE, 0, {})}
    run = _play(plan, T=22, cfg=cfg, contribution=0.0)
    stages = [Stage(int(new["stage"][0, 0])) for _, new, _ in run]
    # HOLDING observed at steps 11..15 (5 = holding_timeout decisions), pruned at the end of step 15
    assert stages[9:14] == [Stage.HOLDING] * 5
    assert fired(run[14][2]) == {"timeout_pruned", "removed"}
    assert stages[14:19] == [Stage.EMBARGOED] * cfg.embargo_epochs
    assert [int(new["embargo"][0, 0]) for _, new, _ in run[14:19]] == [5, 4, 3, 2, 1]
    assert stages[19] == Stage.DORMANT
    assert float(run[14][1]["alpha"][0, 0]) == 0.0


def test_issue104_deadline_removal_ramps_out_as_prune_does():
    """Issue 104 item 3 (``timeout_ramp``): a seed pruned at its HOLDING deadline leaves as a PRUNE ramps
    it out, over its tempo's epochs along its style's blend curve, not in one step (without the option
    alpha goes to 0 at once: a blended seed the host had adapted to vanishes between two epochs)."""
    plan = {1: (Op.GERMINATE, 0, {"tempo": Tempo.STANDARD, "alpha_target": 2}), 8: (Op.ADVANCE, 0, {})}
    plan[14] = (Op.ADVANCE, 0, {})
    run = _play(plan, T=26, cfg=LifecycleConfig(timeout_ramp=True), contribution=0.0)
    alphas = [round(float(n["alpha"][0, 0]), 4) for _, n, _ in run]
    stages = [Stage(int(n["stage"][0, 0])) for _, n, _ in run]
    t = next(i for i, (_, _, ev) in enumerate(run) if "timeout_pruned" in fired(ev))
    held = alphas[t - 1]
    assert held == 1.0 and stages[t] == Stage.PRUNED
    out = alphas[t : t + TEMPO_EPOCHS[Tempo.STANDARD]]
    assert all(0.0 < a < held for a in out[:-1]) and out == sorted(out, reverse=True)  # down, step by step
    assert out[-1] == 0.0 and fired(run[t + TEMPO_EPOCHS[Tempo.STANDARD] - 1][2]) == {"removed"}


def test_issue103_without_incubation_a_germination_blends_at_once():
    """Issue 103 (``incubate=False``): GERMINATE puts the seed in BLENDING with the blend-in ramp an
    ADVANCE would start (same length, curve and target), no what-if incubation, age 0; with incubation
    (the default) the same action leaves it GERMINATED at alpha 0, as before."""
    plan = {1: (Op.GERMINATE, 0, {"tempo": Tempo.FAST})}
    direct = _play(plan, T=4, cfg=LifecycleConfig(incubate=False), contribution=0.0)
    incubating = _play(plan, T=4, contribution=0.0)
    assert fired(direct[0][2]) == {"germinated"} == fired(incubating[0][2])
    assert [Stage(int(n["stage"][0, 0])) for _, n, _ in direct] == [Stage.BLENDING] * 4
    assert Stage(int(incubating[0][1]["stage"][0, 0])) == Stage.GERMINATED
    assert float(incubating[0][1]["alpha"][0, 0]) == 0.0
    alphas = [round(float(n["alpha"][0, 0]), 4) for _, n, _ in direct]
    assert alphas == [0.1667, 0.3333, 0.5, 0.5]  # the FAST tempo's 3 epochs to the target 0.5
    assert int(direct[0][1]["age"][0, 0]) == 0 and int(direct[0][1]["epochs_in_stage"][0, 0]) == 0
    # and the blend-in is the one ADVANCE gives an incubated seed: its ramp fields match
    adv = _play({1: (Op.GERMINATE, 0, {"tempo": Tempo.FAST}), 6: (Op.ADVANCE, 0, {})}, T=6, contribution=0.0)
    for k in ("ramp_from", "ramp_to", "ramp_len", "curve"):
        assert float(direct[0][1][k][0, 0]) == float(adv[5][1][k][0, 0]), k


def test_prune_ramps_alpha_down_then_removes():
    plan = {
        1: (Op.GERMINATE, 0, {"tempo": Tempo.FAST, "alpha_target": 2}),
        6: (Op.ADVANCE, 0, {}),
        10: (Op.ADVANCE, 0, {}),
    }
    plan[11] = (Op.PRUNE, 0, {"alpha_speed": AlphaSpeed.FAST, "alpha_curve": AlphaCurve.LINEAR})
    run = _play(plan, T=14, contribution=0.0)
    assert fired(run[10][2]) == {"prune_started"}
    assert [round(float(n["alpha"][0, 0]), 4) for _, n, _ in run[10:13]] == [0.6667, 0.3333, 0.0]
    assert [Stage(int(n["stage"][0, 0])) for _, n, _ in run[10:13]] == [
        Stage.PRUNED,
        Stage.PRUNED,
        Stage.EMBARGOED,
    ]
    assert fired(run[12][2]) == {"removed"}


@pytest.mark.parametrize(("contribution", "pruned"), [(2.0, False), (0.5, True)])
def test_prune_gate_keeps_a_seed_that_pays(contribution, pruned):
    """``prune_gate``: PRUNE of a blended seed contributing >= g5_min_contribution is illegal (a no-op
    with an ``illegal`` event), as the legality masks say; a seed below it is pruned as before."""
    cfg = LifecycleConfig(prune_gate=True)
    assert cfg.prune_floor == cfg.g5_min_contribution and LifecycleConfig().prune_floor is None
    plan = {1: (Op.GERMINATE, 0, {"tempo": Tempo.FAST}), 6: (Op.ADVANCE, 0, {}), 10: (Op.ADVANCE, 0, {})}
    plan[11] = (Op.PRUNE, 0, {"alpha_speed": AlphaSpeed.FAST})
    run = _play(plan, T=11, contribution=contribution, cfg=cfg)
    pre, new, ev = run[10]
    assert bool(op_slot_legality(pre, prune_below=cfg.prune_floor)[0, Op.PRUNE, 0]) is pruned
    assert fired(ev) == ({"prune_started"} if pruned else {"illegal"})
    assert Stage(int(new["stage"][0, 0])) == (Stage.PRUNED if pruned else Stage.HOLDING)


@pytest.mark.parametrize("when", ["instant", "alpha_zero"])
def test_prune_instant_or_at_alpha_zero_removes_this_step(when):
    speed = AlphaSpeed.INSTANT if when == "instant" else AlphaSpeed.SLOW
    plan = {1: (Op.GERMINATE, 0, {"tempo": Tempo.FAST}), 6: (Op.ADVANCE, 0, {}), 10: (Op.ADVANCE, 0, {})}
    at = 11 if when == "instant" else 3  # TRAINING seed: alpha is 0
    plan[at] = (Op.PRUNE, 0, {"alpha_speed": speed})
    run = _play(plan, T=at)
    assert fired(run[at - 1][2]) == {"prune_started", "removed"}
    assert int(run[at - 1][1]["stage"][0, 0]) == Stage.EMBARGOED


def test_embargo_zero_frees_the_slot_at_once():
    cfg = LifecycleConfig(embargo_epochs=0)
    run = _play({1: (Op.GERMINATE, 0, {}), 3: (Op.PRUNE, 0, {})}, T=4, cfg=cfg)
    assert int(run[2][1]["stage"][0, 0]) == Stage.DORMANT and fired(run[2][2]) == {"prune_started", "removed"}
    assert int(run[2][1]["embargo"][0, 0]) == 0


def test_set_alpha_target_ramps_along_the_curve_and_keeps_the_germination_style():
    """The style head is ignored by SET_ALPHA_TARGET (and is not relevant to it): a re-style swaps the
    composition rule of a blended seed in one step. The reference re-styles here; on the held-out
    evaluation a host at 72.8 % validation ended at 14.5 % test after a last-step re-style."""
    plan = {1: (Op.GERMINATE, 0, {"tempo": Tempo.FAST, "alpha_target": 2, "style": Style.LINEAR_ADD})}
    plan[6] = (Op.ADVANCE, 0, {})
    setting = {"alpha_target": 0, "alpha_speed": AlphaSpeed.MEDIUM, "alpha_curve": AlphaCurve.COSINE}
    plan[9] = (Op.SET_ALPHA_TARGET, 0, {**setting, "style": Style.GATED_GATE})
    run = _play(plan, T=14)
    assert fired(run[8][2]) == {"alpha_set"}
    new = run[8][1]
    assert int(new["style"][0, 0]) == Style.LINEAR_ADD and float(new["alpha_target"][0, 0]) == 0.5
    assert all(int(n["style"][0, 0]) == Style.LINEAR_ADD for _, n, _ in run[1:])
    assert not head_relevance(torch.tensor([int(Op.SET_ALPHA_TARGET)]))[0, HEAD_INDEX["style"]]
    got = torch.tensor([float(n["alpha"][0, 0]) for _, n, _ in run[8:13]])
    want = alpha_at(torch.tensor(int(AlphaCurve.COSINE)), torch.arange(1, 6), torch.tensor(5), 1.0, 0.5)
    torch.testing.assert_close(got, want)
    # while ramping, neither SET_ALPHA_TARGET nor ADVANCE-to-HOLDING can go through
    legal = op_slot_legality(run[10][1])
    assert not legal[0, Op.SET_ALPHA_TARGET, 0] and not legal[0, Op.PRUNE, 0]


def test_illegal_pair_is_a_noop_with_an_event():
    cfg = LifecycleConfig()
    run_wait = _play({1: (Op.GERMINATE, 0, {})}, T=3)
    run_bad = _play({1: (Op.GERMINATE, 0, {}), 3: (Op.FOSSILIZE, 0, {})}, T=3)
    assert fired(run_bad[2][2]) == {"illegal"}
    for k in SLOT_FIELDS:
        assert torch.equal(run_bad[2][1][k], run_wait[2][1][k]), k
    slots = init_slots(1, [True, False])
    _, _, ev = step(slots, make_action(1, Op.GERMINATE, 1), make_signals(1, 2), cfg)
    assert fired(ev, slot=1) == {"illegal"}  # disabled slot


def test_g0_blueprint_out_of_range_fails_germination():
    cfg = LifecycleConfig()
    slots = init_slots(1, [True])
    for bp in (N_BP, -1):
        _, new, ev = step(slots, make_action(1, Op.GERMINATE, 0, blueprint=bp), make_signals(1, 1), cfg)
        assert fired(ev) == {"germinate_failed"} and int(new["stage"][0, 0]) == Stage.DORMANT


def test_max_seeds_blocks_germination():
    cfg = LifecycleConfig(max_seeds=1)
    slots = init_slots(1, [True, True])
    _, slots, _ = step(slots, make_action(1, Op.GERMINATE, 0), make_signals(1, 2), cfg)
    _, new, ev = step(slots, make_action(1, Op.GERMINATE, 1), make_signals(1, 2), cfg)
    assert fired(ev, slot=1) == {"illegal"} and int(new["stage"][0, 1]) == Stage.DORMANT


def test_record_signals_measures_only_live_seeds_and_starts_the_ema():
    cfg = LifecycleConfig()
    slots = init_slots(1, [True, True])
    _, slots, _ = step(slots, make_action(1, Op.GERMINATE, 0), make_signals(1, 2), cfg)
    sig = make_signals(1, 2, contribution=[[0.5, 9.0]], grad_ratio=[[0.4, 7.0]], seed_params=[[100.0, 5.0]])
    rec = record_signals(slots, sig, cfg)  # GERMINATED: first measurement starts the EMA
    assert rec["contribution"].tolist() == [[0.5, 0.0]] and rec["seed_params"].tolist() == [[100.0, 0.0]]
    torch.testing.assert_close(rec["grad_ratio"], torch.tensor([[0.4, 0.0]]))
    rec2 = record_signals(lifecycle_step(rec, make_action(1, Op.WAIT), sig, cfg)[0], sig, cfg)  # TRAINING
    torch.testing.assert_close(rec2["grad_ratio"][0, 0], torch.tensor(0.9 * 0.4 + 0.1 * 0.4))
    capped = record_signals(rec2, make_signals(1, 2, grad_ratio=1e30), cfg)
    torch.testing.assert_close(capped["grad_ratio"][0, 0], torch.tensor(0.9 * 0.4 + 0.1 * 10.0))


def test_clear_seeds_keeps_fossils_and_other_envs():
    run = _play({1: (Op.GERMINATE, 0, {"tempo": Tempo.FAST}), 6: (Op.ADVANCE, 0, {}), 10: (Op.ADVANCE, 0, {}),
                 11: (Op.FOSSILIZE, 0, {}), 12: (Op.GERMINATE, 1, {})}, T=12)  # fmt: skip
    slots = torch.cat([run[-1][1], run[-1][1]], dim=0)
    out = clear_seeds(slots, torch.tensor([True, False]))
    assert out["stage"][:, 0].tolist() == [Stage.FOSSILIZED] * 2
    assert out["stage"][:, 1].tolist() == [Stage.DORMANT, Stage.GERMINATED]
    check_invariants(out, None, LifecycleConfig())


# ----------------------------------------------------------------------------------------- property
@given(data=st.data(), max_seeds=st.sampled_from([0, 1, 2]), embargo=st.sampled_from([0, 2, 5]))
def test_random_legal_play_never_reaches_an_illegal_state(data, max_seeds, embargo):
    cfg = LifecycleConfig(
        max_seeds=max_seeds, embargo_epochs=embargo, holding_timeout=3, g2_min_epochs=1, g3_min_epochs=1
    )
    for pre, _, _, new, events in random_rollout(data, cfg=cfg, T=20):
        assert not events["illegal"].any(), "a masked-in action was refused"
        check_invariants(pre, None, cfg)
        check_invariants(new, pre, cfg)


def test_auto_advance_blends_and_holds_where_the_gates_pass_and_the_op_left_the_slot_alone():
    from esper.core.masks import op_slot_legality

    cfg = LifecycleConfig(auto_advance=True, g2_min_epochs=1, g3_min_epochs=1, min_prune_age=0)
    slots = init_slots(3, [True, True])
    for env in range(3):
        slots["stage"][env] = torch.tensor([int(Stage.TRAINING), int(Stage.TRAINING)])
        slots["epochs_in_stage"][env] = 3
        slots["age"][env] = 4
        slots["grad_ratio"][env] = 0.5
        slots["acc_at_stage_start"][env] = 40.0
        slots["tempo"][env] = int(Tempo.FAST)
        slots["alpha_target"][env] = 1.0
    signals = make_signals(3, 2, val_acc=45.0)
    # env 0 waits, env 1 prunes slot 0, env 2 tries ADVANCE (illegal with auto_advance)
    ops = torch.tensor([int(Op.WAIT), int(Op.PRUNE), int(Op.ADVANCE)])
    action = make_action(3, ops, torch.tensor([0, 0, 1]))
    new, events = lifecycle_step(slots, action, signals, cfg, n_blueprints=N_BP)
    assert new["stage"].tolist() == [
        [int(Stage.BLENDING)] * 2,
        [int(Stage.EMBARGOED), int(Stage.BLENDING)],  # pruned at alpha 0: removed at once
        [int(Stage.BLENDING)] * 2,
    ]
    assert events["advanced"].tolist() == [[True, True], [False, True], [True, True]]
    assert events["illegal"].tolist() == [[False, False], [False, False], [False, True]]
    assert not op_slot_legality(slots, auto_advance=True)[:, int(Op.ADVANCE)].any()
    assert (new["ramp_len"][new["stage"] == int(Stage.BLENDING)] == 3).all()  # the FAST blend-in ramp
    # and nothing moves where a gate fails
    slots["epochs_in_stage"][:] = 0
    held, events = lifecycle_step(slots, make_action(3, Op.WAIT, 0), signals, cfg, n_blueprints=N_BP)
    assert (held["stage"] == int(Stage.TRAINING)).all() and not events["advanced"].any()


@pytest.mark.parametrize(("contribution", "kept"), [(2.0, True), (0.0, False)])
def test_timeout_fossilizes_a_seed_that_earned_g5_and_prunes_the_rest(contribution, kept):
    cfg = LifecycleConfig(timeout_fossilizes=True)
    plan = {1: (Op.GERMINATE, 0, {"tempo": Tempo.FAST}), 6: (Op.ADVANCE, 0, {}), 10: (Op.ADVANCE, 0, {})}
    run = _play(plan, T=16, cfg=cfg, contribution=contribution)
    stages = [Stage(int(new["stage"][0, 0])) for _, new, _ in run]
    assert stages[9:14] == [Stage.HOLDING] * 5  # the policy had holding_timeout chances to decide
    if kept:
        assert fired(run[14][2]) == {"timeout_fossilized"} and stages[14:] == [Stage.FOSSILIZED] * 2
        assert float(run[15][1]["alpha"][0, 0]) == float(run[13][1]["alpha"][0, 0]) > 0  # kept as blended
    else:
        assert fired(run[14][2]) == {"timeout_pruned", "removed"} and stages[14] == Stage.EMBARGOED


@pytest.mark.parametrize(("contribution", "kept"), [(30.0, True), (0.0, False)])
def test_timeout_keeps_a_seed_that_pays_while_an_alpha_ramp_moves_it(contribution, kept):
    """A SET_ALPHA_TARGET in HOLDING starts a ramp that is still moving at the HOLDING deadline. G5
    needs a settled alpha, so the old rule pruned such a seed at once, however much the host depended
    on it (a conv_heavy seed carrying ~65 points: the host back at chance in one step). A seed that
    pays is now fossilized at the alpha the ramp had reached; one that does not pay is still pruned."""
    cfg = LifecycleConfig(timeout_fossilizes=True)
    slowest, half = AlphaSpeed(len(ALPHA_SPEED_STEPS) - 1), ALPHA_TARGETS.index(0.5)
    slow_down = {"alpha_target": half, "alpha_speed": slowest, "alpha_curve": AlphaCurve.LINEAR}
    plan = {1: (Op.GERMINATE, 0, {"tempo": Tempo.FAST, "alpha_target": ALPHA_TARGETS.index(1.0)}),
            6: (Op.ADVANCE, 0, {}), 10: (Op.ADVANCE, 0, {}),
            12: (Op.SET_ALPHA_TARGET, 0, slow_down)}  # fmt: skip
    run = _play(plan, T=17, cfg=cfg, contribution=contribution)
    stages = [Stage(int(new["stage"][0, 0])) for _, new, _ in run]
    assert stages[9:14] == [Stage.HOLDING] * 5
    pre = run[14][0]  # the deadline step: the ramp towards 0.5 is still moving
    assert int(pre["ramp_pos"][0, 0]) < int(pre["ramp_len"][0, 0]) and 0.5 < float(pre["alpha"][0, 0]) < 1.0
    if kept:
        assert fired(run[14][2]) == {"timeout_fossilized"} and stages[14:] == [Stage.FOSSILIZED] * 3
        frozen = float(pre["alpha"][0, 0])
        assert [float(new["alpha"][0, 0]) for _, new, _ in run[14:]] == [frozen] * 3  # the ramp stopped
        assert int(run[16][1]["ramp_len"][0, 0]) == 0 and float(run[16][1]["alpha_target"][0, 0]) == frozen
    else:
        assert fired(run[14][2]) == {"timeout_pruned", "removed"} and stages[14] == Stage.EMBARGOED


def test_issue103_an_instant_blend_puts_alpha_at_its_target_from_the_blending_step():
    """``instant_blend``: the blend-in has no epoch, alpha is at its target from the step the seed enters
    BLENDING: with ``incubate=False`` from its germination, with incubation from its ADVANCE; G3 still waits
    its epochs. Off (the default), the tempo's ramp (the test above)."""
    plan = {1: (Op.GERMINATE, 0, {"tempo": Tempo.SLOW})}
    cfg = LifecycleConfig(incubate=False, instant_blend=True)
    run = _play(plan, T=5, cfg=cfg, contribution=0.0)
    assert [round(float(n["alpha"][0, 0]), 4) for _, n, _ in run] == [0.5] * 5
    assert [Stage(int(n["stage"][0, 0])) for _, n, _ in run[:3]] == [Stage.BLENDING] * 3
    incubated = LifecycleConfig(instant_blend=True)
    advanced = _play({**plan, 6: (Op.ADVANCE, 0, {})}, T=7, cfg=incubated, contribution=0.0)
    assert Stage(int(advanced[5][1]["stage"][0, 0])) == Stage.BLENDING
    assert float(advanced[5][1]["alpha"][0, 0]) == 0.5 and float(advanced[4][1]["alpha"][0, 0]) == 0.0
