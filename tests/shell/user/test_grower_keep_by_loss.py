"""Issue 104, item 3, in the owner's loop: the Grower measures each blended seed's ``loss_contribution`` and
its HOLDING deadline reads ``lifecycle.keep_by`` as an environment's does; a Grower state saved before the
field existed still resumes."""

from __future__ import annotations

import torch

from esper.shell.user import Grower
from tests.shell.host.test_user import _data
from tests.shell.user.test_grower import OPEN, PLAN, _batches, _net, _train

#: Gates open but G5's (no seed pays in accuracy), a deadline one epoch into HOLDING that keeps by loss.
BY_LOSS = {**OPEN, "lifecycle.g5_min_contribution": 1000.0, "lifecycle.holding_timeout": 1,
           "lifecycle.timeout_fossilizes": True, "lifecycle.keep_by": "loss",
           "lifecycle.g5_min_loss_drop": 0.0}  # fmt: skip


def _grower(epochs: int) -> Grower:
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return Grower(model, opt, val=_data(32, 1), controller=PLAN, epochs=epochs, overrides=BY_LOSS)


def test_issue104_the_grower_keeps_by_loss_at_the_deadline():
    """The seed's loss contribution reaches the Grower's slot state (measured, non-zero once blended), and
    at the deadline it is kept exactly where that reading is above 0 (``g5_min_loss_drop`` 0), pruned
    elsewhere: the deadline read the loss, not the accuracy (no seed pays G5's 1000 points)."""
    g = _grower(8)
    seen = []
    for _ in range(8):
        before = g.slots.clone()
        log = _train(g, _batches(64, 0), 1)[0]
        kinds = {e["kind"] for e in log["events"] if e["slot"] == "tail.1"}
        if kinds & {"timeout_fossilized", "timeout_pruned"}:
            drop = float(g._measured["loss_contribution"][1])
            assert drop != 0.0 and int(before["stage"][0, 1]) != 0
            seen.append((drop > 0, "timeout_fossilized" in kinds))
    assert seen and all(want == got for want, got in seen), seen


def test_issue104_a_grower_state_saved_before_the_loss_contribution_resumes():
    """A Grower state without ``loss_contribution`` in its slot state (saved before the field existed)
    loads, the field at 0, and the growth goes on."""
    first = _grower(6)
    _train(first, _batches(64, 0), 3)
    state = first.state_dict()
    assert "loss_contribution" in state["slots"]
    del state["slots"]["loss_contribution"]
    second = _grower(6)
    second.load_state_dict(state)
    second.model.load_state_dict(first.model.state_dict())
    second.optimizer.load_state_dict(first.optimizer.state_dict())
    assert second.slots["loss_contribution"].eq(0).all()
    log = _train(second, _batches(64, 0), 3)
    assert log[-1]["finished"]
