"""Zero-shot transfer (issue 46): the host-agnostic controller trained on every suite task but one, then
evaluated on the one it never saw, against the same baselines as the suite, and how much search on
that task its accuracy is worth (the amortization).

Training seed k runs ``python -m esper.shell.run --preset default --ppo.policy set --tasks OTHERS
--env.task OTHERS[0] --seed k`` into ``--runs/transfer-HELDOUT/seedk`` (one update per training task in
turn; the default's controller, reward and lifecycle, the set policy being the one that acts on any
host), then ``python -m esper.shell.evaluate RUN --task HELDOUT`` on the held-out task's fresh hosts
(evaluation seed 1000 + k) and final draw (data seed 100000 + k; a fixed dataset's test split), with
the searches (``heuristic_tuned``, ``plan_search``) run on the held-out task's training hosts and own
draw, into ``RUN_DIR/eval-transfer`` (the runs: :func:`esper.shell.suite.runs.run_transfer`).
"""

from __future__ import annotations

from typing import Any

from esper.shell.eval.suite.tasks import PLAN_MULTIPLES, SUITE, plan_name

#: What the transfer run sets beyond the default: the policy whose shapes do not depend on the host.
TRANSFER_FLAGS = ("--ppo.policy", "set")
#: The readout the amortization is read for (the one the suite's rule judges).
READOUT = "ppo_greedy"
#: Where each seed's held-out evaluation goes inside its run directory.
EVAL_DIR = "eval-transfer"


#: Suite tasks a transfer run neither trains on nor holds out. A run of several tasks trains each on one
#: env section's settings (the default preset's), and these need their own (``recall``: its batch and
#: learning rates), so they would be trained or judged at sizes they were never measured at.
OWN_SIZES = ("recall",)


def training_tasks(heldout: str) -> list[str]:
    """The suite's tasks but ``heldout`` and :data:`OWN_SIZES`, in the suite's order (the first is the
    run's ``env.task``)."""
    tasks = [t for t in SUITE if t not in OWN_SIZES]
    if heldout not in tasks:
        why = " (it needs its own env sizes)" if heldout in OWN_SIZES else ""
        raise ValueError(f"--transfer: {heldout!r} cannot be held out{why}; tasks: {', '.join(tasks)}")
    return [t for t in tasks if t != heldout]


def train_args(heldout: str) -> list[str]:
    """The training run's flags: the suite's configuration (preset ``mnist1d``) on every other suite
    task, the set policy."""
    others = training_tasks(heldout)
    return ["--preset", "mnist1d", *TRANSFER_FLAGS, "--tasks", ",".join(others), "--env.task", others[0]]


def amortization(controllers: dict[str, dict], readout: str = READOUT) -> dict[str, Any]:
    """How many host epochs of ``plan_search`` on the held-out task buy the accuracy the transferred
    controller reaches with none spent there: the first point of ``plan_search``'s curve (its budgets,
    :data:`PLAN_MULTIPLES`) at or above ``readout``'s mean test accuracy, interpolated linearly from the
    point before it. ``bound``: ``"about"`` (interpolated), ``"at most"`` (the smallest budget already
    reaches it) or ``"more than"`` (no budget reaches it; ``host_epochs`` is the largest tried)."""
    target = controllers[readout]["test_acc_mean"]
    curve = sorted((c["compute_host_epochs"], c["test_acc_mean"])
                   for m in PLAN_MULTIPLES if (c := controllers.get(plan_name(m))))  # fmt: skip
    out: dict[str, Any] = {"readout": readout, "test_acc_mean": target, "host_epochs": None, "bound": None}
    if not curve:
        return out
    before = None
    for x, acc in curve:
        if acc >= target:
            if before is None or acc == before[1]:
                return {**out, "host_epochs": x, "bound": "at most"}
            x0, a0 = before
            return {**out, "host_epochs": round(x0 + (target - a0) / (acc - a0) * (x - x0)), "bound": "about"}
        before = (x, acc)
    return {**out, "host_epochs": curve[-1][0], "bound": "more than"}


__all__ = ["EVAL_DIR", "OWN_SIZES", "READOUT", "TRANSFER_FLAGS", "amortization", "train_args",
           "training_tasks"]  # fmt: skip
