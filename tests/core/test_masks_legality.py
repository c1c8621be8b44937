"""Masks vs lifecycle: in every reachable state, the legality masks forbid exactly the (op, slot) pairs
that :func:`lifecycle_step` refuses. A masked-out pair is an ``illegal`` no-op; every masked-in pair is
accepted (its gate may still fail, which is a legal outcome)."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from esper.core.lifecycle import LifecycleConfig, lifecycle_step
from esper.core.masks import action_masks, legal_masks, op_slot_legality
from esper.core.spec import SLOT_FIELDS, ActionSpec, Op
from tests.core.test_lifecycle import N_BP, make_action, random_rollout

#: Events that say what the op did to the chosen slot (the others are mechanical).
OP_EVENTS = (
    "germinated",
    "germinate_failed",
    "advanced",
    "advance_failed",
    "fossilized",
    "fossilize_failed",
    "prune_started",
    "alpha_set",
    "illegal",
)
#: Op events a legal op may raise on its slot: exactly one of them (none for WAIT).
ACCEPTED = {
    Op.WAIT: (),
    Op.GERMINATE: ("germinated",),
    Op.SET_ALPHA_TARGET: ("alpha_set",),
    Op.PRUNE: ("prune_started",),
    Op.FOSSILIZE: ("fossilized", "fossilize_failed"),
    Op.ADVANCE: ("advanced", "advance_failed"),
}
ALLOWED = torch.tensor([[k in ACCEPTED[o] for k in OP_EVENTS] for o in Op])  # [N_OPS, K]


def every_pair(slots, signals, cfg, heads):
    """Apply every (op, slot) pair to every env at once: batch ``[E * N_OPS * S]``."""
    E, S = slots.batch_size
    n_ops = len(Op)
    env = torch.arange(E).repeat_interleave(n_ops * S)
    op = torch.arange(n_ops).repeat_interleave(S).repeat(E)
    slot = torch.arange(S).repeat(E * n_ops)
    action = make_action(E * n_ops * S, op, slot, **heads)
    new, events = lifecycle_step(slots[env], action, signals[env], cfg, n_blueprints=N_BP)
    return env, op, slot, new, events


@given(
    data=st.data(),
    max_seeds=st.sampled_from([0, 1, 2]),
    min_prune_age=st.sampled_from([0, 1, 3]),
    bp=st.integers(0, N_BP - 1),
)
def test_masks_forbid_exactly_what_the_lifecycle_refuses(data, max_seeds, min_prune_age, bp):
    cfg = LifecycleConfig(
        max_seeds=max_seeds, min_prune_age=min_prune_age, holding_timeout=3, g2_min_epochs=1, g3_min_epochs=1
    )
    spec = ActionSpec(n_slots=3, n_blueprints=N_BP)
    heads = {"blueprint": bp, "alpha_target": 1, "alpha_speed": 1, "alpha_curve": 2, "tempo": 0, "style": 1}
    for pre, _, signals, _, _ in random_rollout(data, cfg=cfg, T=12):
        legal = op_slot_legality(pre, max_seeds=max_seeds, min_prune_age=min_prune_age)
        masks = legal_masks(pre, spec, max_seeds=max_seeds, min_prune_age=min_prune_age)
        assert torch.equal(masks["op"], legal.any(-1))
        for o in Op:
            row = action_masks(masks, torch.full((pre.batch_size[0],), int(o)))["slot"]
            assert torch.equal(row, legal[:, o])

        env, op, slot, new, events = every_pair(pre, signals, cfg, heads)
        ev = torch.stack([events[k] for k in OP_EVENTS], dim=1)  # [N, K, S]
        chosen = torch.nn.functional.one_hot(slot, ev.shape[-1]).bool()  # [N, S]
        assert not (ev & ~chosen.unsqueeze(1)).any(), "an op raised events on a slot it did not choose"
        got = (ev & chosen.unsqueeze(1)).any(-1)  # [N, K]
        ok = legal[env, op, slot]  # [N]
        n_ops_events = got.sum(-1)
        assert not (got[ok] & ~ALLOWED[op[ok]]).any(), "a masked-in pair was refused or did something else"
        assert torch.equal(n_ops_events[ok], (op[ok] != int(Op.WAIT)).long()), "masked-in op: one outcome"
        illegal_only = torch.tensor([k == "illegal" for k in OP_EVENTS])
        assert (got[~ok] == illegal_only).all(), "a masked-out pair was not an illegal no-op"
        # a masked-out pair changes nothing beyond WAIT's mechanical advance (same env, enabled slot)
        wait_slot = pre["enabled"].int().argmax(-1)
        wait_new, _ = lifecycle_step(pre, make_action(len(wait_slot), Op.WAIT, wait_slot), signals, cfg)
        for k in SLOT_FIELDS:  # floats: the same math in another batch size may differ in the last ulp
            a, b = new[k][~ok], wait_new[k][env[~ok]]
            same = torch.allclose(a, b, rtol=0, atol=1e-6) if a.is_floating_point() else torch.equal(a, b)
            assert same, f"a masked-out pair changed {k}"


@given(data=st.data(), min_prune_age=st.sampled_from([0, 1, 3]))
def test_gate_masks_offer_advance_and_fossilize_exactly_where_they_would_succeed(data, min_prune_age):
    """With the gates, a masked-in ADVANCE or FOSSILIZE always goes through (no failed-gate no-op is
    ever offered), and no op other than those two loses or gains legality."""
    from esper.core.lifecycle import gate_readiness

    cfg = LifecycleConfig(min_prune_age=min_prune_age, holding_timeout=3, g2_min_epochs=1, g3_min_epochs=1)
    heads = {"blueprint": 1, "alpha_target": 1, "alpha_speed": 1, "alpha_curve": 2, "tempo": 0, "style": 1}
    gated_ops = (int(Op.ADVANCE), int(Op.FOSSILIZE))
    for pre, _, signals, _, _ in random_rollout(data, cfg=cfg, T=12):
        plain = op_slot_legality(pre, min_prune_age=min_prune_age)
        gated = op_slot_legality(
            pre, min_prune_age=min_prune_age, gates=gate_readiness(pre, signals["val_acc"], cfg)
        )
        assert not (gated & ~plain).any()  # gates only ever remove choices
        others = [o for o in range(len(Op)) if o not in gated_ops]
        assert torch.equal(gated[:, others], plain[:, others])
        env, op, slot, _, events = every_pair(pre, signals, cfg, heads)
        offered = gated[env, op, slot]
        for o, success in ((Op.ADVANCE, "advanced"), (Op.FOSSILIZE, "fossilized")):
            picked = offered & (op == int(o))
            took = events[success][torch.arange(len(slot)), slot]
            assert took[picked].all(), f"an offered {o.name} failed its gate"
            failed = plain[env, op, slot] & (op == int(o)) & ~took
            assert not (failed & offered).any()


def test_gate_masks_follow_g2_g3_g5():
    from esper.core.lifecycle import gate_readiness, init_slots
    from esper.core.spec import Stage

    cfg = LifecycleConfig(g2_min_epochs=3, g3_min_epochs=3, g5_min_contribution=1.0)
    slots = init_slots(2, [True, True, True])
    # env 0: TRAINING long enough with gain and gradient (G2 passes), BLENDING with its ramp done
    # (G3 passes), HOLDING with a contribution (G5 passes); env 1: each one epoch short / too small
    for env, eis, contrib in ((0, 3, 2.0), (1, 2, 0.5)):
        for s, stage in enumerate((Stage.TRAINING, Stage.BLENDING, Stage.HOLDING)):
            slots["stage"][env, s] = int(stage)
            slots["epochs_in_stage"][env, s] = eis if stage != Stage.HOLDING else 1
            slots["age"][env, s] = 9
        slots["acc_at_stage_start"][env, 0] = 40.0
        slots["grad_ratio"][env, 0] = 0.5
        slots["alpha"][env, 1:] = 1.0
        slots["contribution"][env, 2] = contrib
    val_acc = torch.tensor([45.0, 45.0])
    gated = op_slot_legality(slots, gates=gate_readiness(slots, val_acc, cfg))
    plain = op_slot_legality(slots)
    assert plain[:, int(Op.ADVANCE)].tolist() == [[True, True, False]] * 2
    assert gated[:, int(Op.ADVANCE)].tolist() == [[True, True, False], [False, False, False]]
    assert gated[:, int(Op.FOSSILIZE)].tolist() == [[False, False, True], [False, False, False]]
    assert plain[:, int(Op.FOSSILIZE)].tolist() == [[False, False, True]] * 2
