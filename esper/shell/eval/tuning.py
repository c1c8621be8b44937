"""Settings chosen on training hosts by Optuna: ``heuristic_tuned_wide`` (the heuristic's timing, its
blueprint and a budget) and ``probe`` (its threshold, incubation and score).
:mod:`esper.shell.eval.search` runs them and caches their choices; its plan searches use this module's
studies too (:func:`make_study`).

**The search** (:func:`optuna_search`, issue 105) is an Optuna study over a space of settings
(:class:`Param`: integer or real ranges, log-scaled where a range spans decades, and categories),
sampled by TPE (the default: ``TPESampler`` with a constant liar, so that settings asked together spread
out) or at random (``probe@random``, ``heuristic_tuned_wide@random``: the NAS literature's bar), seeded
from the run seed and kept in memory: the same seed, the same settings. Its first trial is the starting
setting (the reference's rules, or the probe's defaults); then ``batch`` settings are asked at a time
(``study.ask``), run side by side on the same training hosts, and told their scores (``study.tell``),
:data:`TUNE_TRIALS` settings in all. A setting asked again is told its score without running it again.
The ranges reach what the widening grid before it could reach (its values and three widenings at each
edge). The best mean final validation accuracy wins (a tie: the setting tried first). Every setting run
is an episode on each host: ``compute_host_epochs`` = settings run × hosts × ``max_epochs``, as before.

Optuna is imported when a search runs (``pip install -e ".[cluster]"``; a one-line error without it).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from esper.shell.baselines.heuristic import HeuristicController, HeuristicThresholds
from esper.shell.baselines.probe import PROBE_LIFECYCLE, SCORES, ProbeController, ProbeSettings
from esper.shell.common.seeding import derive_seed
from esper.shell.config.presets import RunConfig
from esper.shell.env.tasks import Task
from esper.shell.eval.runner import run_hosts
from esper.shell.host.blueprints import BLUEPRINTS

#: The samplers a search may name last (``plan_search@1x@random``, ``probe@random``): Optuna's TPE, the
#: default, and random search.
TPE, RANDOM = "tpe", "random"
SAMPLERS = (TPE, RANDOM)
#: Settings each tuned search runs (every one on each of its hosts): about what the widening grid it
#: replaces spent on the default preset (``probe`` 22 settings, ``heuristic_tuned_wide`` 57).
TUNE_TRIALS = {"probe": 24, "heuristic_tuned_wide": 56}
#: Settings asked at a time and run side by side (with 4 hosts: 32 envs, the plan searches' width).
TUNE_BATCH = 8


def optuna_module():
    """Optuna, imported when a search needs it; a one-line error where it is not installed."""
    try:
        import optuna
    except ImportError:
        raise ModuleNotFoundError(
            'the searching baselines run on Optuna, which is not installed: pip install -e ".[cluster]"'
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def make_study(sampler: str, seed: int, pruner=None):
    """An in-memory Optuna study that maximizes, with ``sampler`` (:data:`TPE`: ``TPESampler`` with a
    constant liar; :data:`RANDOM`: ``RandomSampler``) seeded by ``seed``, and ``pruner``."""
    optuna = optuna_module()
    seed = int(seed) % 2**32  # numpy's seeds are 32-bit
    if sampler == RANDOM:
        chosen = optuna.samplers.RandomSampler(seed=seed)
    elif sampler == TPE:
        with warnings.catch_warnings():  # constant_liar is marked experimental
            warnings.simplefilter("ignore")
            chosen = optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    else:
        raise ValueError(f"no sampler {sampler!r}; samplers: {', '.join(SAMPLERS)}")
    return optuna.create_study(direction="maximize", sampler=chosen, pruner=pruner)


@dataclass(frozen=True)
class Param:
    """One setting's range: integers or reals in ``[low, high]`` (``log``: sampled on a log scale), or
    ``choices``; ``when``: ``(name, value)``, sampled only where that setting has that value (else
    ``default``)."""

    name: str
    low: float | None = None
    high: float | None = None
    integer: bool = False
    log: bool = False
    choices: tuple | None = None
    when: tuple[str, Any] | None = None
    default: Any = None

    def clamp(self, value: Any) -> Any:
        """``value`` within the range (a starting setting on a short episode), choices as they are."""
        if self.choices is not None:
            return value
        return min(max(value, self.low), self.high)

    def sample(self, trial) -> Any:
        if self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.integer:
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high), log=self.log)


Evaluate = Callable[[list[dict[str, Any]]], list[dict[str, float]]]


Setting = Callable[[dict[str, Any]], dict[str, Any]]


def optuna_search(params: Sequence[Param], start: dict[str, Any], evaluate: Evaluate, *, trials: int,
                  seed: int, sampler: str = TPE, batch: int = TUNE_BATCH,
                  to_setting: Setting | None = None) -> dict[str, Any]:  # fmt: skip
    """The module's search. ``evaluate(settings)`` scores settings side by side, one dict per setting with
    ``val_acc_mean`` (the score) and what else it reports. ``start`` (the sampled parameters of the first
    trial) is tried first; ``to_setting`` maps a trial's parameters to the setting evaluated (default:
    as they are, with each conditional parameter left out at its ``default``). Returns ``chosen``, every
    setting run in order (``points``), ``settings_tried`` (run), ``trials`` (asked) and the sampler."""
    by_name = {p.name: p for p in params}

    def setting_of(sampled: dict[str, Any]) -> dict[str, Any]:
        full = {p.name: sampled.get(p.name, p.default) for p in params}
        return to_setting(full) if to_setting is not None else full

    study = make_study(sampler, seed)
    study.enqueue_trial({k: by_name[k].clamp(v) for k, v in start.items()})
    scored: dict[tuple, dict[str, Any]] = {}
    order: list[tuple] = []
    asked, limit = 0, trials * 20  # a space smaller than ``trials`` ends the search
    while len(order) < trials and asked < limit:
        need = min(batch, trials - len(order))
        todo: list[tuple[Any, dict[str, Any]]] = []
        fresh: set[tuple] = set()
        while len(fresh) < need and asked < limit:
            t = study.ask()
            asked += 1
            sampled: dict[str, Any] = {}
            for p in params:
                if p.when is None or sampled.get(p.when[0]) == p.when[1]:
                    sampled[p.name] = p.sample(t)
            todo.append((t, setting_of(sampled)))
            if _key(todo[-1][1]) not in scored:
                fresh.add(_key(todo[-1][1]))
        new = list({_key(s): s for _, s in todo if _key(s) not in scored}.values())
        if new:
            for s, r in zip(new, evaluate(new), strict=True):
                scored[_key(s)] = {"setting": dict(s), **r}
                order.append(_key(s))
        for t, s in todo:  # a setting asked again is told its score, not run again
            study.tell(t, scored[_key(s)]["val_acc_mean"])
    best = max(range(len(order)), key=lambda i: (scored[order[i]]["val_acc_mean"], -i))
    return {
        "chosen": dict(scored[order[best]]["setting"]),
        "sampler": sampler,
        "settings_tried": len(order),
        "trials": asked,
        "points": [scored[k] for k in order],
    }


def _key(setting: dict[str, Any]) -> tuple:
    return tuple(sorted(setting.items()))


def _rows(records: list[dict], n_points: int, hosts: int) -> list[dict[str, float]]:
    """Each point's mean final validation accuracy and parameters added over its ``hosts`` episodes."""
    out = []
    for c in range(n_points):
        recs = records[c * hosts : (c + 1) * hosts]
        out.append({"val_acc_mean": float(np.mean([r["final_val_acc"] for r in recs])),
                    "params_added_mean": float(np.mean([r["params_added"] for r in recs]))})  # fmt: skip
    return out


# ------------------------------------------------------------------------------ heuristic_tuned_wide
def heuristic_params(blueprint_names: Sequence[str], max_epochs: int) -> list[Param]:
    """``heuristic_tuned_wide``'s space: when the rules germinate (the four timing thresholds of
    ``heuristic_tuned``: ``min_epoch`` 1 to ``max_epochs``, ``plateau_epochs`` and ``stable_epochs`` 0 to
    ``max_epochs``, ``plateau_threshold`` 1/16 to 16 points, log-scaled), what (the rotation, or one
    blueprint: every one but ``noop``) and how much (a budget: none, or a share of what ``grow_all`` adds
    from 1/32 to 1, log-scaled): the reach of the widening grid before it."""
    real = [b for b in blueprint_names if b != "noop"]
    return [
        Param("min_epoch", 1, max_epochs, integer=True),
        Param("plateau_epochs", 0, max_epochs, integer=True),
        Param("plateau_threshold", 1 / 16, 16.0, log=True),
        Param("stable_epochs", 0, max_epochs, integer=True),
        Param("blueprint", choices=("", *real)),
        Param("budgeted", choices=(False, True)),
        Param("budget_share", 1 / 32, 1.0, log=True, when=("budgeted", True), default=0.0),
    ]


def _heuristic_setting(sampled: dict[str, Any]) -> dict[str, Any]:
    out = dict(sampled)
    if not out.pop("budgeted"):
        out["budget_share"] = 0.0
    return out


def tune_heuristic_wide(cfg: RunConfig, task: Task, host_seeds: list[int], priced: Callable[[int], Any], *,
                        sampler: str = TPE, trials: int | None = None) -> dict[str, Any]:  # fmt: skip
    """:func:`optuna_search` of :func:`heuristic_params` from the reference's rules, every setting on
    ``host_seeds``; ``priced(host_seed)`` (:func:`esper.shell.eval.search.prices`) prices each batch's
    budget by its own host (``costs``, ``grow_all``: seed parameters)."""
    ref = HeuristicThresholds()
    params = heuristic_params(BLUEPRINTS[task.family], cfg.lifecycle.max_epochs)
    start = {p.name: getattr(ref, p.name) for p in params if p.name not in ("budgeted", "budget_share")}
    start["budgeted"] = False

    def evaluate(points: list[dict[str, Any]]) -> list[dict[str, float]]:
        settings = [HeuristicThresholds(**p) for p in points]
        pairs = [(c, h) for c in range(len(points)) for h in host_seeds]

        def make(env, batch: list[int]):
            per_env = [settings[pairs[k][0]] for k in batch]
            p = priced(pairs[batch[0]][1])  # a batch is one host (one member of a family)
            return HeuristicController(env.blueprint_names, cfg.lifecycle, per_env=per_env, costs=p.costs,
                                       grow_all_params=p.grow_all, cap=p.budget)  # fmt: skip

        return _rows(run_hosts(cfg, task, make, [h for _, h in pairs]), len(points), len(host_seeds))

    out = optuna_search(params, start, evaluate, trials=trials or TUNE_TRIALS["heuristic_tuned_wide"],
                        seed=derive_seed("heuristic_tuned_wide", cfg.seed), sampler=sampler,
                        to_setting=_heuristic_setting)  # fmt: skip
    chosen = HeuristicThresholds(**out["chosen"])
    return {**out, "chosen": {f: getattr(chosen, f) for f in chosen.__slots__}, "changed": chosen.changed()}


# ------------------------------------------------------------------------------------------- probe
def probe_params(max_epochs: int) -> list[Param]:
    """``probe``'s space: how a candidate is scored, how long it incubates (1 to ``max_epochs - 3``), the
    score it must reach (1/32 to 512, log-scaled): the reach of the widening grid before it."""
    return [
        Param("score", choices=tuple(SCORES)),
        Param("incubate", 1, max(1, max_epochs - 3), integer=True),
        Param("threshold", 1 / 32, 512.0, log=True),
    ]


def tune_probe(cfg: RunConfig, task: Task, host_seeds: list[int], priced: Callable[[int], Any],
               enabled: int, *, sampler: str = TPE, trials: int | None = None) -> dict[str, Any]:  # fmt: skip
    """:func:`optuna_search` of :func:`probe_params` from :class:`ProbeSettings`'s defaults, every setting
    on ``host_seeds``; ``priced(host_seed)`` (:func:`esper.shell.eval.search.prices`) gives each batch's
    host its costs, the learned controller's budget there and the score's unit (its ``grow_all`` over the
    ``enabled`` slots)."""
    params = probe_params(cfg.lifecycle.max_epochs)
    start = {p.name: getattr(ProbeSettings(), p.name) for p in params}

    def evaluate(points: list[dict[str, Any]]) -> list[dict[str, float]]:
        settings = [ProbeSettings(**p) for p in points]
        pairs = [(c, h) for c in range(len(points)) for h in host_seeds]

        def make(env, batch: list[int]):
            per_env = [settings[pairs[k][0]] for k in batch]
            p = priced(pairs[batch[0]][1])  # a batch is one host (one member of a family)
            return ProbeController(env.blueprint_names, cfg.lifecycle, p.costs, unit=p.grow_all / enabled,
                                   budget=p.budget, per_env=per_env)  # fmt: skip

        return _rows(run_hosts(cfg, task, make, [h for _, h in pairs]), len(points), len(host_seeds))

    out = optuna_search(params, start, evaluate, trials=trials or TUNE_TRIALS["probe"],
                        seed=derive_seed("probe", cfg.seed), sampler=sampler)  # fmt: skip
    return {**out, "lifecycle": dict(PROBE_LIFECYCLE)}


__all__ = ["RANDOM", "SAMPLERS", "TPE", "TUNE_BATCH", "TUNE_TRIALS", "Param", "heuristic_params",
           "make_study", "optuna_module", "optuna_search", "probe_params", "tune_heuristic_wide",
           "tune_probe"]  # fmt: skip
