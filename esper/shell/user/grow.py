"""Growing the user's network on fresh hosts (:func:`grow`): the static network, a baseline (the
heuristic by default) or a run's trained controller zero-shot, each on the same hosts (initial weights,
data order, seed modules), as an evaluation runs them (:func:`esper.shell.eval.episodes.run_episodes`).

A run's learned controller of the flat policy (``ppo.policy flat``) has head and input sizes
fixed by the host it was trained on: the number of slots, and the blueprint catalogue of its family
(docs/grow-your-model.md, the limits). It acts on a user host with as many slots and the same family,
e.g. a ``cnn1d`` network with three slots and a run on the default MNIST-1D task;
:func:`check_controller_fits` refuses any other in one line that says what differs. A run of the
host-agnostic policy (``ppo.policy set``, the default) acts on any host: only its checkpoint's loading is
checked.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from esper.shell.common.checkpoint import load_checkpoint
from esper.shell.common.fields import from_dict, with_overrides
from esper.shell.config.presets import RunConfig, preset
from esper.shell.env.tasks import Task
from esper.shell.eval.controllers import PPO_CONTROLLERS
from esper.shell.eval.episodes import check_names, run_episodes
from esper.shell.eval.fits import check_controller_fits
from esper.shell.user.grown import grown_model

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
    if "agent" not in checkpoint:
        raise ValueError(f"{ckpt} has no 'agent' entry: not a checkpoint of python -m esper.shell.run")
    return from_dict(RunConfig, json.loads(cfg_path.read_text())), checkpoint


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
    keep_models: bool = False,
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
    ``{"env.host_lr": 0.05}``). The hosts train env by env on ``device``. ``keep_models``: each record
    also holds ``model``, the final host's grown network (:func:`esper.shell.user.grown.grown_model`: the
    user's class, its seeds composed at the alpha they ended at, the others dropped; saved with
    ``torch.save(model.state_dict())``, it loads into a fresh network of that class)."""
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
        cfg,
        task,
        name,
        range(episodes),
        eval_seed=seed,
        checkpoint=checkpoint,
        on_epoch=on_epoch,
        keep=grown_model if keep_models else None,
    )
    out = {name: run(name) for name in controllers}
    for records in out.values() if keep_models else ():
        for r in records:
            r["model"] = r.pop("kept")
    return out


__all__ = ["BASE_PRESET", "DEFAULT_CONTROLLERS", "check_controller_fits", "grow", "load_run"]
