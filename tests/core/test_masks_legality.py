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
