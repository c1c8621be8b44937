"""Episodes on given hosts: :func:`run_hosts` runs a controller on a list of host seeds, ``n_envs`` at a
time, and returns one record per host. Evaluation (:mod:`esper.shell.eval.episodes`, evaluation hosts)
and the searches of :mod:`esper.shell.eval.search` (training hosts, several candidates side by side)
both run through it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from esper.core.rewards import RewardConfig, parameter_cost
from esper.shell.config.presets import RunConfig
from esper.shell.env.rollout import Controller, EpisodeResult, EpisodeRunner
from esper.shell.env.tasks import Task
from esper.shell.env.vecenv import VecEnv
from esper.shell.host.hosts import Host

#: ``make(env, batch) -> controller`` for the envs of one batch: ``batch`` the indices (into the host
#: seeds :func:`run_hosts` was given) of the hosts ``env`` runs, in env order (a search maps them to the
#: batch's candidates): consecutive, except on a family, whose hosts are grouped by member
#: (:func:`batches_of`). A controller with a ``prepare_env(env)`` method is handed the env before its
#: episodes (``born_big`` builds its seeds in, ``probe`` asks for what-if readings).
MakeController = Callable[[VecEnv, list[int]], Controller]


def run_hosts(cfg: RunConfig, task: Task, make: MakeController, host_seeds: Sequence[int], *,
              on_epoch=None, keep: Callable[[Host], Any] | None = None,
              on_result: Callable[[EpisodeResult], None] | None = None,
              width: int | None = None) -> list[dict]:  # fmt: skip
    """One episode on each host of ``host_seeds`` (host init, seed modules and data order), ``width``
    (default ``cfg.env.n_envs``) side by side (on a family, grouped by member: :func:`batches_of`), each
    batch's controller from ``make``. Returns one record
    per host, in order: the episode's summary, its ``test_objective`` and its validation accuracy over the
    epochs; with ``keep``, ``kept``: what ``keep`` makes of the final host (e.g. the grown network).
    ``on_result`` receives each batch's :class:`EpisodeResult` (episodes kept as a dataset:
    :mod:`esper.shell.eval.dataset`)."""
    width = width or cfg.env.n_envs
    out: dict[int, dict] = {}
    for chunk in batches_of(task, host_seeds, width):
        seeds = [host_seeds[k] for k in chunk]
        env_cfg = dataclasses.replace(cfg.env, n_envs=len(seeds))
        env = VecEnv(
            env_cfg, cfg.lifecycle, cfg.governor, seed=cfg.seed, task=task, reward=cfg.reward,
            gamma=cfg.ppo.gamma,
        )  # fmt: skip
        try:
            controller = make(env, chunk)
            if (prepare := getattr(controller, "prepare_env", None)) is not None:
                prepare(env)  # what the controller needs of the env: seeds born in, what-if readings
            runner = EpisodeRunner(env, controller, on_epoch=on_epoch)
            result = runner.run(chunk[0], host_seeds=seeds)
            kept = [keep(env.hosts.host(i)) for i in range(env.n)] if keep is not None else None
            if on_result is not None:
                on_result(result)
        finally:
            env.close()
        reward = env.reward_cfg  # its budget in this task's parameters (a family's: this batch's member's)
        curves = np.array([ev["val_acc"] for ev in result.epochs]).T  # [E, T]
        for i, ep in enumerate(result.episodes):
            rec = dict(ep)
            rec["test_objective"] = objective_on_test(ep["final_test_acc"], ep["params_added"],
                                                      ep["host_params"], reward)  # fmt: skip
            rec["val_acc_curve"] = [float(a) for a in curves[i]]
            if kept is not None:
                rec["kept"] = kept[i]
            out[chunk[i]] = rec
    return [out[k] for k in range(len(host_seeds))]


def batches_of(task: Task, host_seeds: Sequence[int], width: int) -> list[list[int]]:
    """The batches (indices into ``host_seeds``, in order) that :func:`run_hosts` runs: ``width`` hosts at
    a time; on a family (:attr:`Task.varies`, whose batch must be one member), each member's hosts
    ``width`` at a time, members in the order they first appear."""
    if not task.varies:
        return [list(range(k, min(k + width, len(host_seeds)))) for k in range(0, len(host_seeds), width)]
    groups: dict[str, list[int]] = {}
    for k, seed in enumerate(host_seeds):
        groups.setdefault(repr(task.describe_member(int(seed))), []).append(k)
    return [g[k : k + width] for g in groups.values() for k in range(0, len(g), width)]


def objective_on_test(acc: float, params_added: float, host_params: float, reward: RewardConfig) -> float:
    """The held-out analogue of the OBJECTIVE reward's Phi: test accuracy minus the parameter cost."""
    host = torch.tensor(max(float(host_params), 1.0))
    cost = parameter_cost(torch.tensor(float(params_added)), host, reward)
    return acc - float(cost)


__all__ = ["MakeController", "batches_of", "objective_on_test", "run_hosts"]
