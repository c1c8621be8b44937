"""Growing the user's network on fresh hosts (:func:`grow`): the static network, a baseline (the
heuristic by default) or a run's trained controller zero-shot, each on the same hosts (initial weights,
data order, seed modules), as an evaluation runs them (:func:`esper.shell.eval.episodes.run_episodes`).

A run's learned controller of the flat policy (``ppo.policy flat``, the default) has head and input sizes
fixed by the host it was trained on: the number of slots, and the blueprint catalogue of its family
(docs/grow-your-model.md, the limits). It acts on a user host with as many slots and the same family,
e.g. a ``cnn1d`` network with three slots and a run on the default MNIST-1D task;
:func:`check_controller_fits` refuses any other in one line that says what differs. A run of the
host-agnostic policy (``ppo.policy set``) acts on any host: only its checkpoint's loading is checked.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from esper.core.observation import obs_dim
from esper.core.spec import ActionSpec
from esper.shell.agent.agent import build_agent, load_error_line
from esper.shell.config.fields import from_dict, with_overrides
from esper.shell.config.presets import RunConfig, preset
from esper.shell.data.tasks import Task
from esper.shell.eval.controllers import PPO_CONTROLLERS
from esper.shell.eval.episodes import check_names, run_episodes
from esper.shell.host.hosts import Host
from esper.shell.runtime.checkpoint import load_checkpoint

#: The controllers :func:`grow` runs by default: the network as the user wrote it, and the heuristic.
DEFAULT_CONTROLLERS = ("static", "heuristic")
#: The preset whose controller settings (lifecycle, reward) a growth without a run uses.
BASE_PRESET = "default"


def load_run(run_dir: str | Path) -> tuple[RunConfig, dict[str, Any]]:
    """A run directory's config and checkpoint (loaded onto the CPU); one-line errors where either is
    missing."""
    run_dir = Path(run_dir)
    cfg_path, ckpt = run_dir / "config.json", run_dir / "checkpoint.pt"
    if not cfg_path.is_file():
        raise FileNotFoundError(
            f"{cfg_path} not found (is {run_dir} a directory of python -m esper.shell.run?)"
        )
    if not ckpt.is_file():
        raise FileNotFoundError(f"{ckpt} not found: grow with a run that finished an update")
    checkpoint = load_checkpoint(ckpt, map_location="cpu")
    if "trainer" not in checkpoint:
        raise ValueError(f"{ckpt} has no 'trainer' entry: not a checkpoint of python -m esper.shell.run")
    return from_dict(RunConfig, json.loads(cfg_path.read_text())), checkpoint


def _fresh_host(task: Task) -> Host:
    with torch.random.fork_rng(devices=[]):  # the caller's generator is left as it was
        return task.make_host()


def _describe(host: Host, seed_grads: bool) -> dict[str, Any]:
    """What a controller's sizes depend on, for ``host``."""
    n_blueprints = len(host.blueprint_names)
    return {
        "family": host.family,
        "slots": host.n_slots,
        "blueprints": n_blueprints,
        "observation": obs_dim(host.n_slots, n_blueprints, seed_grads=seed_grads),
        "slot_names": host.slot_names,
    }


def _check_same_shape(run_cfg: RunConfig, task: Task, seed_grads: bool, run: str) -> None:
    """A flat controller's check: the run's host and ``task``'s agree in family, slots, blueprints and
    observation length (one-line ValueError naming what differs)."""
    try:
        run_host = _fresh_host(run_cfg.env.build_task())
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{run}: cannot rebuild its {run_cfg.env.task} host to check its controller: {e}"
        ) from None
    theirs, ours = _describe(run_host, seed_grads), _describe(_fresh_host(task), seed_grads)
    diffs = []
    if theirs["family"] != ours["family"]:
        diffs.append(f"family: the run's host is {theirs['family']}, this one {ours['family']} (another "
                     "blueprint catalogue)")  # fmt: skip
    if theirs["slots"] != ours["slots"]:
        diffs.append(f"slots: the run's host has {theirs['slots']} ({', '.join(theirs['slot_names'])}), this "
                     f"one {ours['slots']} ({', '.join(ours['slot_names'])})")  # fmt: skip
    for key, what in (("blueprints", "blueprints"), ("observation", "observation length")):
        if theirs[key] != ours[key]:
            diffs.append(f"{what}: the run's {theirs[key]}, this host's {ours[key]}")
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
    seed_grads = run_cfg.lifecycle.seed_grad_features
    if run_cfg.ppo.policy == "flat":
        _check_same_shape(run_cfg, task, seed_grads, run)
    host = _fresh_host(task)
    names = host.blueprint_names
    # the env's action space, as VecEnv builds it (noop masked)
    spec = ActionSpec(host.n_slots, len(names), tuple(i for i, b in enumerate(names) if b == "noop"))
    with torch.random.fork_rng(devices=[]):
        agent = build_agent(run_cfg.ppo, spec, device="cpu", germination_cost=host.germination_cost(),
                            raw_obs_dim=_describe(host, seed_grads)["observation"])  # fmt: skip
    try:
        agent.load(checkpoint["trainer"])
    except (RuntimeError, KeyError, ValueError) as e:
        raise ValueError(f"{run}: its controller does not load for this host: {load_error_line(e)}") from None


def grow(
    task: Task,
    controllers: Sequence[str] = DEFAULT_CONTROLLERS,
    *,
    run_dir: str | Path | None = None,
    episodes: int = 4,
    epochs: int | None = None,
    seed: int = 0,
    n_envs: int | None = None,
    device: str = "cpu",
    overrides: dict[str, Any] | None = None,
    on_epoch: Callable[[dict], None] | None = None,
) -> dict[str, list[dict]]:
    """Run each of ``controllers`` on the same ``episodes`` fresh hosts of ``task``; returns, per
    controller, one record per host (:func:`esper.shell.eval.episodes.run_episodes`: ``final_test_acc``,
    ``host_params``, ``params_added``, ``grown`` — the seeds blended into the final host, ``SLOT=BLUEPRINT``
    joined by ``+`` — and the rest of an episode's summary).

    ``controllers``: evaluation's names (``static``, ``random``, ``heuristic``, ``grow_all``,
    ``grow:SLOT=BLUEPRINT...``) and, with ``run_dir``, the run's trained controller (``ppo``: sampled,
    seeded; ``ppo_greedy``: its most likely actions), checked first by :func:`check_controller_fits`.
    Without a run the controller settings are the ``default`` preset's; with one, the run's. ``epochs``:
    host epochs per episode (default: the settings' ``lifecycle.max_epochs``); ``n_envs``: hosts trained
    side by side (default: up to 4); ``overrides``: ``section.field`` values on top (e.g.
    ``{"env.host_lr": 0.05}``). The hosts train env by env on ``device``."""
    controllers = list(controllers)
    check_names(controllers)
    if episodes < 1:
        raise ValueError(f"grow: episodes must be >= 1, got {episodes}")
    learned = [c for c in controllers if c in PPO_CONTROLLERS]
    if run_dir is not None:
        cfg, checkpoint = load_run(run_dir)
    elif learned:
        raise ValueError(
            f"grow: {', '.join(learned)} is a run's trained controller: pass run_dir (a directory of "
            "python -m esper.shell.run), or grow with the heuristic"
        )
    else:
        cfg, checkpoint = preset(BASE_PRESET), None
    changes: dict[str, Any] = {
        "env.host_step": "per_env", "env.device": device, "env.devices": (), "env.amp": False,
        "env.n_envs": n_envs or min(episodes, 4), "ppo.n_minibatches": 1,
    }  # fmt: skip
    if epochs is not None:
        changes["lifecycle.max_epochs"] = epochs
    cfg = with_overrides(cfg, {**changes, **(overrides or {})})
    if learned:
        check_controller_fits(cfg, checkpoint, task, run=f"run {run_dir}")
    run = lambda name: run_episodes(
        cfg, task, name, range(episodes), eval_seed=seed, checkpoint=checkpoint, on_epoch=on_epoch
    )
    return {name: run(name) for name in controllers}


__all__ = ["BASE_PRESET", "DEFAULT_CONTROLLERS", "check_controller_fits", "grow", "load_run"]
