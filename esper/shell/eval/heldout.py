"""The end-of-run held-out check: the trained controller and the static host on fresh hosts.

After its last update a run with ``eval_episodes`` > 0 runs its controller (and, for ``ppo``, its most
likely actions, ``ppo_greedy``) and the static host on ``eval_episodes`` evaluation episodes, hosts
neither ever saw, the same for all, and reports whether growth paid: :func:`heldout_check` returns
the line the run prints and the fields of its ``heldout_check`` event. ``python -m esper.shell.evaluate``
is the full comparison.
"""

from __future__ import annotations

from pathlib import Path

from esper.shell.config.presets import RunConfig
from esper.shell.env.tasks import Task
from esper.shell.eval.episodes import at_budget, compare_on_config
from esper.shell.eval.stats import mean_ci95

#: Evaluation seeds of the end-of-run held-out check start here (plus the run seed).
HELDOUT_SEED = 7_000_000


def heldout_check(cfg: RunConfig, run_dir: Path, agent_state: dict, task: Task) -> dict:
    """The trained controller (``agent_state``: the agent's state after the run's last update) and
    the static host on ``cfg.eval_episodes`` fresh hosts of ``task`` (evaluation seeds of their own,
    the same for both): did growth pay on data neither ever saw? Returns the line to print
    (``"text"``) and the fields of the ``heldout_check`` event; ``run_dir`` is named in the line."""
    checkpoint = {"agent": agent_state, "progress": {"update": cfg.updates}}
    if cfg.env.budget_shares:  # a controller that reads a budget: checked at its largest training share
        cfg = at_budget(cfg, max(cfg.env.budget_shares))
    # the learned controller is read twice: sampled as trained, and by its most likely actions
    greedy = ["ppo_greedy"] if cfg.policy == "ppo" else []
    res = compare_on_config(
        cfg, [cfg.policy, *greedy, "static"], episodes=cfg.eval_episodes, seed=HELDOUT_SEED + cfg.seed,
        checkpoint=checkpoint, show_progress=cfg.progress, task=task,
    )  # fmt: skip
    grown, static = res["controllers"][cfg.policy], res["controllers"]["static"]

    def gain_over_static(ctrl: dict) -> tuple[float, tuple[float, float]]:
        """Mean and 95 % CI of the paired test-accuracy difference to the static host, in points."""
        return mean_ci95([a["final_test_acc"] - s["final_test_acc"]
                          for a, s in zip(ctrl["per_episode"], static["per_episode"])])  # fmt: skip

    gain, (lo, hi) = gain_over_static(grown)
    also, extra = "", {}
    if greedy:
        g = res["controllers"]["ppo_greedy"]
        g_gain, (g_lo, g_hi) = gain_over_static(g)
        # the growth bench judges the default's controller by its most likely actions (README)
        also = (
            f" (sampled, as trained; by its most likely actions, ppo_greedy, the readout the growth "
            f"bench judges: {g['test_acc_mean']:.1f} % with {g['params_added_mean']:.0f}, "
            f"{g_gain:+.1f} points over the static host, 95 % CI {g_lo:+.1f} to {g_hi:+.1f})"
        )
        extra = {"greedy_test_acc": g["test_acc_mean"], "greedy_params_added": g["params_added_mean"],
                 "greedy_gain": g_gain, "greedy_gain_ci95": [g_lo, g_hi]}  # fmt: skip
    text = (
        f"held-out check on {cfg.eval_episodes} fresh hosts (the same for all): the {cfg.policy} "
        f"controller's final hosts reach {grown['test_acc_mean']:.1f} % test accuracy with "
        f"{grown['params_added_mean']:.0f} parameters added{also}; the static host "
        f"{static['test_acc_mean']:.1f} %; "
        f"growth paid {gain:+.1f} points (95 % CI {lo:+.1f} to {hi:+.1f}). "
        f"Full comparison: python -m esper.shell.evaluate {run_dir}"
    )
    return {"text": text, "episodes": cfg.eval_episodes, "controller": cfg.policy,
            "test_acc": grown["test_acc_mean"], "static_test_acc": static["test_acc_mean"],
            "params_added": grown["params_added_mean"], "gain": gain, "gain_ci95": [lo, hi],
            **extra}  # fmt: skip
