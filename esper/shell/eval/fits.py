"""Whether a run's trained controller can act on a host (:func:`check_controller_fits`): a controller of
the flat policy (``ppo.policy flat``) has head and input sizes fixed by the host it trained on; one of
the set policy (``ppo.policy set``) acts on any host, and only its checkpoint's loading is checked. Used
by the evaluation on another task (``evaluate --task``) and by :func:`esper.shell.user.grow`."""

from __future__ import annotations

from typing import Any

import torch

from esper.core.observation import layout_options, obs_dim
from esper.core.spec import ActionSpec
from esper.shell.agent.agent import build_agent, load_error_line
from esper.shell.config.presets import RunConfig
from esper.shell.env.tasks import Task
from esper.shell.host.blueprints import BUILTIN_BLUEPRINTS
from esper.shell.host.hosts import Host
from esper.shell.host.registry import registered_blueprints


def _fresh_host(task: Task) -> Host:
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was
        return task.make_host()


def _describe(host: Host, layout: dict[str, bool], *, builtin: bool = False) -> dict[str, Any]:
    """What a controller's sizes depend on, for ``host`` with the observation's optional features
    ``layout`` (:func:`~esper.core.observation.layout_options`; ``builtin``: with its family's built-in
    catalogue, the one a run trained on, whatever was registered since)."""
    n_blueprints = len(BUILTIN_BLUEPRINTS[host.family] if builtin else host.blueprint_names)
    return {
        "family": host.family,
        "slots": host.n_slots,
        "blueprints": n_blueprints,
        "observation": obs_dim(host.n_slots, n_blueprints, **layout),
        "slot_names": host.slot_names,
    }


def _check_same_shape(run_cfg: RunConfig, task: Task, layout: dict[str, bool], run: str) -> None:
    """A flat controller's check: the run's host and ``task``'s agree in family, slots, blueprints and
    observation length (one-line ValueError naming what differs)."""
    try:
        run_host = _fresh_host(run_cfg.env.build_task())
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{run}: cannot rebuild its {run_cfg.env.task} host to check its controller: {e}"
        ) from None
    host = _fresh_host(task)
    theirs, ours = _describe(run_host, layout, builtin=True), _describe(host, layout)
    diffs = []
    if theirs["family"] != ours["family"]:
        diffs.append(f"family: the run's host is {theirs['family']}, this one {ours['family']} (another "
                     "blueprint catalogue)")  # fmt: skip
    if theirs["slots"] != ours["slots"]:
        diffs.append(f"slots: the run's host has {theirs['slots']} ({', '.join(theirs['slot_names'])}), this "
                     f"one {ours['slots']} ({', '.join(ours['slot_names'])})")  # fmt: skip
    for key, what in (("blueprints", "blueprints"), ("observation", "observation length")):
        if theirs[key] != ours[key]:
            mine = registered_blueprints(host.family) if key == "blueprints" else ()
            extra = f" (registered: {', '.join(mine)})" if mine else ""
            diffs.append(f"{what}: the run's {theirs[key]}, this host's {ours[key]}{extra}")
    if diffs:
        raise ValueError(
            f"{run}: its controller cannot act on this host: {'; '.join(diffs)}. A flat controller "
            f"(ppo.policy flat) acts only on hosts like the one it trained on: give the model "
            f"{theirs['slots']} slots of family {theirs['family']}, grow it without a run (the heuristic), "
            "or use a run of --ppo.policy set, which acts on any host"
        )


def check_controller_fits(run_cfg: RunConfig, checkpoint: dict[str, Any], task: Task, *,
                          run: str = "the run") -> None:  # fmt: skip
    """Refuse, in one ValueError line, a run whose controller cannot act on ``task``'s host: it names
    what differs (the family and its blueprint catalogue, the number of slots, the blueprint count, the
    observation's length) between the run's host (rebuilt from ``run_cfg``) and this one, or why the
    checkpoint does not load into a controller for this host. A run of the set policy (``ppo.policy
    set``) acts on any host: only the loading is checked."""
    layout = layout_options(run_cfg.lifecycle)
    if run_cfg.ppo.policy == "flat":
        _check_same_shape(run_cfg, task, layout, run)
    host = _fresh_host(task)
    names = host.blueprint_names
    # the env's action space, as VecEnv builds it (noop masked)
    spec = ActionSpec(host.n_slots, len(names), tuple(i for i, b in enumerate(names) if b == "noop"))
    with torch.random.fork_rng(devices=[]):
        agent = build_agent(run_cfg.ppo, spec, device="cpu", germination_cost=host.germination_cost(),
                            raw_obs_dim=_describe(host, layout)["observation"],
                            budget_input=bool(run_cfg.env.budget_shares))  # fmt: skip
    try:
        agent.load(checkpoint["agent"])
    except (RuntimeError, KeyError, ValueError) as e:
        raise ValueError(f"{run}: its controller does not load for this host: {load_error_line(e)}") from None


__all__ = ["check_controller_fits"]
