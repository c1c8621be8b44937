"""Baselines that search before they are judged: ``heuristic_tuned`` and ``plan_search``.

- ``heuristic_tuned``: the heuristic's rules (:class:`~esper.shell.baselines.heuristic.HeuristicController`)
  with thresholds chosen by a grid (:data:`TUNE_GRID`, the reference's thresholds first), every
  candidate on the same :data:`TUNE_HOSTS` training hosts.
- ``plan_search``: the best fixed plan (``b0=conv_heavy+b2=self_attention``: those slots, each with its
  blueprint, grown as fast as the gates allow) found by an Optuna study (:func:`search_plans`: TPE, or
  random search with ``@random`` after the budget, and Optuna's successive-halving pruner over host
  epochs) within a budget of host epochs: ``plan_search`` spends what the learned controller's training
  did (``updates × n_envs × max_epochs`` of the run's config), ``plan_search@H`` ``H`` host epochs,
  ``plan_search@Kx`` ``K`` times the learned controller's. Its first trials: each blueprint in every slot
  (the task's ``grow_all`` blueprint first); then the sampler's plans (each enabled slot empty or one
  blueprint), no repeats.
- ``plan_search_cap`` (``@H``, ``@Kx`` alike): the same search over only the plans that fit the learned
  controller's parameter cap (``ppo.param_cap``, or ``ppo.param_cap_share`` of what ``grow_all`` adds;
  :func:`learner_cap`), so that the search and the controller look for the best plan under one budget.
  ``plan_search`` has no cap: where the controller has one, the two answer different questions.
- ``plan_search_timed`` (``@H``, ``@Kx`` alike): the same search over fixed schedules that say when and
  how as well as what (:func:`timed_space`): each planned slot germinated from one of
  :func:`timed_epochs` (``b0=conv_heavy:7``: not before epoch 7), blended in one of the styles
  (``@GATED_GATE``). Its first trials are ``plan_search``'s (each blueprint everywhere, as fast as the
  gates allow, LINEAR_ADD), then the sampler's schedules.
- ``heuristic_tuned_wide`` and ``probe`` (``@random`` alike): settings chosen by an Optuna study
  (:mod:`esper.shell.eval.tuning`: TPE, or random search): the heuristic's timing, blueprint and budget;
  the greedy probe's threshold, incubation and score
  (:class:`~esper.shell.baselines.probe.ProbeController`), within the learned controller's budget
  (:func:`learner_budget`). Each setting tried runs on the same :data:`TUNE_HOSTS` training hosts.

**The selection rule.** Both score a candidate by the mean final **validation** accuracy of its hosts,
on **training hosts** (the learned controller's own: :func:`esper.shell.common.seeding.train_host_seeds`
of the run seed, its first updates' envs in order) and on the run's **training data draw** (its
``env.data_seed``). The test split, the evaluation's hosts (evaluation seeds) and the evaluation's data
draw (``python -m esper.shell.evaluate --data-seed``) are never read. Ties go to the earlier candidate.
What they chose, every candidate's score, the hosts and the data draw, and the host epochs spent
(``compute_host_epochs``: episodes run × ``max_epochs``) are returned, and cached in a run directory's
``search/NAME.json`` so that another evaluation of the run reuses the choice.

**Episodes shared between searches.** With a cache directory, the plan searches of a run keep the
episodes they run in the run's episode store (``search/episode-store.jsonl``,
:class:`~esper.shell.eval.store.EpisodeStore`, shared with the evaluation's fixed plans), and a later
search reads what is kept instead of running it again. On the batched host step an episode's numbers
depend, at the level of rounding, on the batch it ran in, so what is read is a whole batch asked for
again (the first round's candidates on the first host, common to the budgets); on the per-env step each
(plan, host) pair. Either way a search gives with the store exactly what it gives without one. A search
still counts every episode it scores, read or run, in ``episodes`` and ``compute_host_epochs``: its
budget is its own; the saving is the benchmark's.

**Width.** On the CPU a search runs its candidates :data:`SEARCH_WIDTH` envs side by side (or
``n_envs`` where that is more): one batched step over more envs costs less per episode (on the 2-core
VM, mnist1d, 10-epoch episodes: 0.73 CPU-seconds an episode at 8 envs, 0.66 at 16, 0.59 at 32).
"""

from __future__ import annotations

import itertools
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from esper.core.reward_config import with_param_budget
from esper.core.spec import DEFAULT_BLEND, Style
from esper.shell.agent.config import param_cap_on
from esper.shell.baselines.heuristic import HeuristicController, HeuristicThresholds
from esper.shell.common.seeding import derive_seed, train_host_seeds
from esper.shell.config.presets import RunConfig
from esper.shell.env.tasks import Task, grow_all_params, seed_params, written_plan
from esper.shell.eval.runner import run_hosts
from esper.shell.eval.store import STORE_FILE, EpisodeStore, config_digest, grow_spec, run_specs
from esper.shell.eval.tuning import (
    RANDOM,
    SAMPLERS,
    TPE,
    make_study,
    optuna_module,
    tune_heuristic_wide,
    tune_probe,
)
from esper.shell.host.blueprints import BLUEPRINTS
from esper.shell.host.hosts import Host

HEURISTIC_TUNED = "heuristic_tuned"
#: The heuristic with its timing, blueprint and budget chosen by an Optuna study (TPE; @random).
HEURISTIC_TUNED_WIDE = "heuristic_tuned_wide"
#: The greedy what-if probe, its settings chosen by an Optuna study (TPE; @random).
PROBE = "probe"
PLAN_SEARCH = "plan_search"
#: ``plan_search`` within the learned controller's parameter cap.
PLAN_SEARCH_CAP = "plan_search_cap"
#: ``plan_search`` over fixed schedules with their timing and blend style.
PLAN_SEARCH_TIMED = "plan_search_timed"
#: The searches that tune a rule's settings (no budget in their name).
TUNED = (HEURISTIC_TUNED, HEURISTIC_TUNED_WIDE, PROBE)
#: ``plan_search@H`` (host epochs) or ``plan_search@Kx`` (K times the learned controller's compute).
BUDGET_SEP = "@"
#: The thresholds ``heuristic_tuned`` tries: every combination, the reference's values first. They
#: decide when the rules germinate (the reference's never fire on the default: they wait for a calm,
#: plateaued host, and by then the episode ends before a seed can be fossilized).
TUNE_GRID: dict[str, tuple[float, ...]] = {
    "min_epoch": (5, 1),
    "plateau_epochs": (3, 1),
    "plateau_threshold": (0.5, 2.0),
    "stable_epochs": (3, 0),
}
#: Training hosts each ``heuristic_tuned`` candidate runs on (the same hosts for every candidate).
TUNE_HOSTS = 4
#: Bumped when a search's rule changes, so cached choices of another rule are not reused: 2 since
#: ``heuristic_tuned_wide`` and ``probe`` search with Optuna's samplers (issue 105).
SEARCH_VERSION = 2
#: The plan searches' own version: 2 since their episodes are read from the exact store and run
#: :data:`SEARCH_WIDTH` wide (a choice cached before may have read episodes run in other batches); 3 since
#: they search with Optuna's samplers and pruner (issue 105).
PLAN_SEARCH_VERSION = 3
#: Envs side by side in a plan search's batches on the CPU (``n_envs`` where that is more).
SEARCH_WIDTH = 32


def is_searched(name: str) -> bool:
    """Whether controller ``name`` searches on training hosts before it is evaluated."""
    return parse_search(name) is not None


def parse_search(name: str) -> tuple[str, str | None, str] | None:
    """A searched controller's name -> ``(search, budget or None, sampler)``; None for any other name.
    The plan searches take a budget and a sampler, each optional, in that order
    (``plan_search[@H|@Kx][@random]``); ``heuristic_tuned_wide`` and ``probe`` a sampler
    (``probe@random``); ``heuristic_tuned`` (its grid) nothing. The sampler is :data:`TPE` unless named."""
    base, *rest = name.split(BUDGET_SEP)
    sampler = TPE
    if rest and rest[-1] in SAMPLERS:
        sampler = rest.pop()
    if base in (PLAN_SEARCH, PLAN_SEARCH_CAP, PLAN_SEARCH_TIMED):
        return (base, rest[0], sampler) if len(rest) == 1 and rest[0] else (base, None, sampler) if not rest \
            else None  # fmt: skip
    if base in (HEURISTIC_TUNED_WIDE, PROBE) and not rest:
        return base, None, sampler
    return (base, None, TPE) if name == HEURISTIC_TUNED else None


def search_kind(name: str) -> str | None:
    """The search ``name`` runs, without its budget and sampler (``probe@random`` -> ``probe``); None for
    any other controller."""
    parsed = parse_search(name)
    return parsed[0] if parsed is not None else None


def _plan_kind(name: str) -> str | None:
    """``plan_search``, ``plan_search_cap`` or ``plan_search_timed`` for a plan search's name (with or
    without a budget and a sampler), else None."""
    kind = search_kind(name)
    return kind if kind in (PLAN_SEARCH, PLAN_SEARCH_CAP, PLAN_SEARCH_TIMED) else None


def plan_kind(name: str) -> str | None:
    """The plan search ``name`` is (:data:`PLAN_SEARCH`, :data:`PLAN_SEARCH_CAP`,
    :data:`PLAN_SEARCH_TIMED`), with or without a budget; None for any other controller."""
    return _plan_kind(name)


def host_of(task: Task, host_seed: int | None = None) -> Host:
    """The host whose sizes price a budget: on a family (:attr:`Task.varies`) the member of
    ``host_seed``, else (or with no seed) ``task.make_host()`` (the caller's random stream untouched)."""
    with torch.random.fork_rng(devices=[]):  # a host draws its init: leave the caller's stream
        return task.host_for(host_seed) if host_seed is not None and task.varies else task.make_host()


def learner_cap(cfg: RunConfig, task: Task, host_seed: int | None = None) -> float:
    """The learned controller's parameter cap on ``task``'s host (on a family, the member of
    ``host_seed``: the cap is a share of each host's ``grow_all``), in seed parameters
    (:func:`~esper.shell.agent.config.param_cap_on` of the run's ``ppo.param_cap`` and
    ``ppo.param_cap_share``); refused in one line where the controller has none."""
    if not cfg.ppo.has_param_cap:
        raise ValueError(
            f"{PLAN_SEARCH_CAP}: the learned controller has no parameter cap to search within "
            f"(ppo.param_cap and ppo.param_cap_share are 0); use {PLAN_SEARCH}"
        )
    return learner_budget(cfg, task, host_seed)  # with a cap, the budget is the cap


def learner_budget(cfg: RunConfig, task: Task, host_seed: int | None = None) -> float:
    """The seed parameters the learned controller may add on ``task``'s host (on a family, the member of
    ``host_seed``): its hard cap (:func:`learner_cap`) where it has one, else its reward's budget
    (``reward.param_budget``, or ``reward.param_budget_share`` of what ``grow_all`` adds) where that is
    set, else ``math.inf``."""
    return _budget_of(cfg, grow_all_params(task, host_of(task, host_seed), tuple(cfg.env.slots)))


def _budget_of(cfg: RunConfig, grow_all: float) -> float:
    """:func:`learner_budget` on a host whose ``grow_all`` adds ``grow_all`` seed parameters."""
    if cfg.ppo.has_param_cap:
        return float(param_cap_on(cfg.ppo.param_cap, cfg.ppo.param_cap_share, grow_all))
    budget = with_param_budget(cfg.reward, grow_all).param_budget
    return float(budget) if budget > 0 else math.inf


def seed_costs(task: Task, host_seed: int | None = None) -> list[list[float]]:
    """``[S][n_blueprints]``: the seed parameters each blueprint adds in each slot of ``task``'s host (on a
    family, the member of ``host_seed``), gates not counted (:func:`~esper.shell.env.tasks.seed_params`;
    the caller's random stream untouched)."""
    return _costs_on(task, host_of(task, host_seed))


def _costs_on(task: Task, host: Host) -> list[list[float]]:
    names = host.blueprint_names
    return [[float(seed_params(task, host, {s: b})) for b in names] for s in range(host.n_slots)]


@dataclass(frozen=True)
class Prices:
    """What a budgeted baseline needs of one host: each germination's seed parameters (``costs[s][b]``),
    what ``grow_all`` adds (``grow_all``) and the learned controller's budget there (``budget``)."""

    costs: list[list[float]]
    grow_all: float
    budget: float


def prices(cfg: RunConfig, task: Task, host_seed: int | None = None) -> Prices:
    """:class:`Prices` of ``task``'s host, on a family of the member of ``host_seed``: so that the probe
    and the widened heuristic, like the learned controller's cap, read each host's own sizes, not one
    member's (issue 89). The host is built once."""
    host = host_of(task, host_seed)
    grow_all = float(grow_all_params(task, host, tuple(cfg.env.slots)))
    return Prices(_costs_on(task, host), grow_all, _budget_of(cfg, grow_all))


def member_seeds(task: Task, host_seeds: Sequence[int]) -> list[int]:
    """One host seed per member of a family among ``host_seeds`` (the first of each, in order); on a task
    of one host, the first seed alone."""
    if not task.varies:
        return [int(host_seeds[0])]
    first: dict[str, int] = {}
    for s in host_seeds:
        first.setdefault(repr(task.describe_member(int(s))), int(s))
    return list(first.values())


#: Training hosts whose members a constant plan must fit on a family (``plan_search_cap``): the first
#: this many of the run's (:func:`selection_host_seeds`).
FAMILY_FIT_HOSTS = 64


def learned_compute(cfg: RunConfig) -> int:
    """The host epochs the learned controller's training spends: ``updates × n_envs × max_epochs``."""
    return cfg.updates * cfg.env.n_envs * cfg.lifecycle.max_epochs


def plan_budget(name: str, cfg: RunConfig) -> int:
    """A plan search's budget in host epochs: the learned controller's compute, ``@H`` host epochs or
    ``@Kx`` K times the learned controller's (one-line errors; ``plan_search`` and ``plan_search_cap``
    alike)."""
    parsed = parse_search(name)
    spec = parsed[1] if parsed is not None else name.partition(BUDGET_SEP)[2] or None
    if spec is None:
        return learned_compute(cfg)
    try:
        value = float(spec[:-1]) * learned_compute(cfg) if spec.endswith("x") else int(spec)
    except ValueError:
        value = -1
    if not value >= 0 or not math.isfinite(value):
        raise ValueError(
            f"{name}: the budget after {BUDGET_SEP} is host epochs (an integer >= 0) or a multiple of the "
            f"learned controller's compute (e.g. {PLAN_SEARCH}@0.5x), then a sampler if any "
            f"({BUDGET_SEP}{RANDOM})"
        )
    return round(value)


def selection_host_seeds(cfg: RunConfig, n: int) -> list[int]:
    """The first ``n`` training hosts of the run: update 0's envs in order, then update 1's, ..."""
    width = cfg.env.n_envs
    seeds: list[int] = []
    for update in itertools.count():
        if len(seeds) >= n:
            return seeds[:n]
        seeds += train_host_seeds(cfg.seed, update, range(width))
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------------------- searches
def search(name: str, cfg: RunConfig, task: Task | None = None, *, cache: Path | None = None,
           show_progress: bool = False) -> dict[str, Any]:  # fmt: skip
    """Run (or read from ``cache/NAME.json``) the search of controller ``name`` on ``cfg``'s training hosts
    and data draw (``task``: ``cfg``'s task, built if not given). Returns the choice (``chosen``), every
    candidate's score, the selection hosts and data draw, and ``compute_host_epochs``. A cached result is
    read only for the same key and the same data draw (its ``selection``'s ``data_seed``: the key holds the
    config, and a task handed in may be another draw than the config's)."""
    key = _key(name, cfg)
    path = cache / f"{name}.json" if cache is not None else None
    if path is not None and path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            task = task if task is not None else cfg.env.build_task()
            if saved["result"].get("selection", {}).get("data_seed") == task.data_seed:
                return saved["result"]
    task = task if task is not None else cfg.env.build_task()
    t0 = time.perf_counter()
    parsed = parse_search(name)
    kind, sampler = (parsed[0], parsed[2]) if parsed is not None else (None, TPE)
    if kind == HEURISTIC_TUNED:
        result = tune_heuristic(cfg, task)
    elif kind in (HEURISTIC_TUNED_WIDE, PROBE):
        result = _tune(kind, cfg, task, sampler)
    elif _plan_kind(name) is not None:
        store = plan_store(cache, cfg, task) if cache is not None else None
        cap = learner_cap(cfg, task) if kind == PLAN_SEARCH_CAP else None
        result = search_plans(cfg, task, plan_budget(name, cfg), cap=cap, store=store,
                              timed=kind == PLAN_SEARCH_TIMED, sampler=sampler)  # fmt: skip
    else:
        raise ValueError(
            f"{name}: not a searched controller ({', '.join(TUNED)}, {PLAN_SEARCH}[@BUDGET][@random], "
            f"{PLAN_SEARCH_CAP}[@BUDGET][@random], {PLAN_SEARCH_TIMED}[@BUDGET][@random]; "
            f"{HEURISTIC_TUNED_WIDE} and {PROBE} with @random)"
        )
    result["seconds"] = time.perf_counter() - t0
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": key, "result": result}, indent=1))
    return result


def _key(name: str, cfg: RunConfig) -> dict[str, Any]:
    """What a cached search depends on: the controller (and its budget), the rule's version, the run seed
    and every config field but the ones that cannot change the hosts it runs."""
    tuned = search_kind(name) in TUNED
    budget = plan_budget(name, cfg) if not tuned else None
    version = SEARCH_VERSION if tuned else PLAN_SEARCH_VERSION
    return {"name": name, "version": version, "budget": budget, "config": _config_digest(cfg)}


def _tune(name: str, cfg: RunConfig, task: Task, sampler: str = TPE) -> dict[str, Any]:
    """``heuristic_tuned_wide`` or ``probe``: :mod:`esper.shell.eval.tuning`'s search on the first
    :data:`TUNE_HOSTS` training hosts, with its compute and selection. Each batch of hosts is priced by its
    own host (:func:`prices`: on a family, each member's costs and budget)."""
    host_seeds = selection_host_seeds(cfg, TUNE_HOSTS)

    def priced(seed: int) -> Prices:
        return prices(cfg, task, seed)

    if name == HEURISTIC_TUNED_WIDE:
        result = tune_heuristic_wide(cfg, task, host_seeds, priced, sampler=sampler)
    else:
        result = tune_probe(cfg, task, host_seeds, priced, enabled_slots(cfg, task), sampler=sampler)
    if name == PROBE:  # as before issue 89's families: the first host's numbers (every host's, off a family)
        first = priced(host_seeds[0])
        unit = first.grow_all / enabled_slots(cfg, task)
        result = {**result, "budget_params": first.budget if math.isfinite(first.budget) else None,
                  "unit_params": unit}  # fmt: skip
    episodes = result["settings_tried"] * len(host_seeds)
    per_member = {"priced_per_member": True} if task.varies else {}
    return {**result, "episodes": episodes, "compute_host_epochs": episodes * cfg.lifecycle.max_epochs,
            **per_member, **_selection(cfg, task, host_seeds)}  # fmt: skip


def enabled_slots(cfg: RunConfig, task: Task) -> int:
    """How many of the host's slots the run may grow (``env.slots``; empty: all)."""
    return len(cfg.env.slots) or host_of(task).n_slots


#: Every config field but the ones that cannot change the hosts a search runs, hashed.
_config_digest = config_digest


def _score(records: list[dict]) -> float:
    return float(np.mean([r["final_val_acc"] for r in records]))


def tune_heuristic(cfg: RunConfig, task: Task, grid: dict[str, Sequence[float]] | None = None,
                   hosts: int | None = None) -> dict[str, Any]:  # fmt: skip
    """Every combination of ``grid`` (default :data:`TUNE_GRID`) on the same ``hosts`` (default
    :data:`TUNE_HOSTS`) training hosts, side by side; the best mean final validation accuracy wins."""
    grid = dict(TUNE_GRID if grid is None else grid)
    hosts = TUNE_HOSTS if hosts is None else hosts
    names = list(grid)
    combos = itertools.product(*grid.values())
    candidates = [HeuristicThresholds(**dict(zip(names, values, strict=True))) for values in combos]
    host_seeds = selection_host_seeds(cfg, hosts)
    pairs = [(c, h) for c in range(len(candidates)) for h in host_seeds]

    def make(env, batch: list[int]):
        per_env = [candidates[pairs[k][0]] for k in batch]
        return HeuristicController(env.blueprint_names, cfg.lifecycle, per_env=per_env)

    records = run_hosts(cfg, task, make, [h for _, h in pairs])
    rows = []
    for c, th in enumerate(candidates):
        recs = records[c * hosts : (c + 1) * hosts]
        rows.append({"thresholds": th.changed(), "val_acc_mean": _score(recs),
                     "params_added_mean": float(np.mean([r["params_added"] for r in recs]))})  # fmt: skip
    best = max(range(len(rows)), key=lambda i: (rows[i]["val_acc_mean"], -i))
    chosen = candidates[best]
    # where the choice sits in the grid: inside each axis's values, or on an edge (every axis of two values
    # is all edges; heuristic_tuned_wide widens its grid where the choice lands there)
    edges = [n for n in names if len(grid[n]) < 3 or getattr(chosen, n) in (min(grid[n]), max(grid[n]))]
    return {
        "chosen": {f: getattr(chosen, f) for f in chosen.__slots__},
        "changed": chosen.changed(),
        "interior": not edges,
        "on_edge": edges,
        "candidates": rows,
        "episodes": len(pairs),
        "compute_host_epochs": len(pairs) * cfg.lifecycle.max_epochs,
        **_selection(cfg, task, host_seeds),
    }


def _selection(cfg: RunConfig, task: Task, host_seeds: list[int]) -> dict[str, Any]:
    return {"selection": {"hosts": "training hosts (train_host_seeds of the run seed)", "run_seed": cfg.seed,
                          "host_seeds": host_seeds, "data_seed": task.data_seed,
                          "split": "validation"}}  # fmt: skip


def plan_space(task: Task, slot_names: Sequence[str], enabled: Sequence[bool], seed: int) -> list[str]:
    """``plan_search``'s candidates in the order it tries them: each blueprint in every enabled slot (the
    task's ``grow_all`` blueprint first, then the others from the largest), then every other plan (each
    enabled slot empty or one blueprint, at least one grown) in an order drawn from ``seed``."""
    blueprints = [b for b in BLUEPRINTS[task.family] if b != "noop"]
    first = task.grow_all
    order = ([first] if first in blueprints else []) + [b for b in reversed(blueprints) if b != first]
    slots = [s for s, on in zip(slot_names, enabled) if on]
    uniform = ["+".join(f"{s}={b}" for s in slots) for b in order]
    rest = []
    for choice in itertools.product([None, *blueprints], repeat=len(slots)):
        plan = "+".join(f"{s}={b}" for s, b in zip(slots, choice) if b is not None)
        if plan and plan not in uniform:
            rest.append(plan)
    random.Random(seed).shuffle(rest)
    return uniform + rest


#: ``plan_search_timed``'s germination epochs, as shares of ``max_epochs`` after the first epoch
#: (:func:`timed_epochs`).
TIMED_SHARES = (0.0, 0.25, 0.5)
#: A timed candidate's first epoch of germination after its blueprint (``b0=conv_heavy:7``), and its
#: style after the plan (``...@GATED_GATE``): the grammar of ``grow:`` controllers.
EPOCH_SEP, STYLE_SEP = ":", "@"


def timed_epochs(max_epochs: int) -> list[int]:
    """The epochs a timed candidate may germinate a slot from: ``1 + int(share × max_epochs)`` for each
    of :data:`TIMED_SHARES` (1, 7 and 13 of 25), each once."""
    return sorted({1 + int(share * max_epochs) for share in TIMED_SHARES})


def timed_space(task: Task, slot_names: Sequence[str], enabled: Sequence[bool], seed: int,
                max_epochs: int) -> list[str]:  # fmt: skip
    """``plan_search_timed``'s candidates in the order it tries them: :func:`plan_space`'s first ones (each
    blueprint in every enabled slot, as fast as the gates allow, the default blend), then every other
    schedule (a plan of :func:`plan_space`, each of its slots from one of :func:`timed_epochs`, one blend
    style) in an order drawn from ``seed``. Written as ``grow:`` controllers are, the first epoch left out
    where it is 1 and the style where it is the default's:
    ``b0=conv_heavy:7+b2=self_attention@GATED_GATE``."""
    plans = plan_space(task, slot_names, enabled, seed)
    epochs = timed_epochs(max_epochs)
    default = Style(DEFAULT_BLEND["style"])
    n_uniform = sum(1 for b in BLUEPRINTS[task.family] if b != "noop")
    first = plans[:n_uniform]
    rest = []
    for plan in plans:
        parts = plan.split("+")
        for when in itertools.product(epochs, repeat=len(parts)):
            body = "+".join(p if e == 1 else f"{p}{EPOCH_SEP}{e}" for p, e in zip(parts, when))
            for style in Style:
                name = body if style == default else f"{body}{STYLE_SEP}{style.name}"
                if name not in first:
                    rest.append(name)
    random.Random(derive_seed("plan_search_timed", seed)).shuffle(rest)
    return first + rest


def schedule_of(candidate: str, slot_names: Sequence[str],
                blueprint_names: Sequence[str]) -> tuple[dict[int, int], dict[int, int], int]:  # fmt: skip
    """A written (timed) candidate -> ``(plan {slot: blueprint}, first epochs {slot: epoch}, style)``
    (indices)."""
    body, _, style = candidate.partition(STYLE_SEP)
    plan, at = {}, {}
    for slot, part in written_plan(body, slot_names).items():
        blueprint, _, epoch = part.partition(EPOCH_SEP)
        plan[slot] = list(blueprint_names).index(blueprint)
        if epoch:
            at[slot] = int(epoch)
    return plan, at, int(Style[style]) if style else int(DEFAULT_BLEND["style"])


#: The pruner's reduction factor (Optuna's ``SuccessiveHalvingPruner``): a third of a rung goes on.
ETA = 3
#: Samples in a row that name no new candidate (a repeat, an empty plan, a plan over the cap) before a
#: random untried candidate is asked for instead.
MAX_MISSES = 20


def max_episodes(budget_episodes: int) -> int:
    """The most episodes (training hosts) one candidate may run: ``ETA**k``, the largest ``k`` for which
    one synchronous bracket from ``ETA**(k+1)`` candidates down to one fits the budget (``(k+1) *
    ETA**(k+1)`` episodes; 9 at 176 episodes, 3 at 44, 27 at 352); 1 under 18 episodes (no pruning)."""
    k = 0
    while (k + 2) * ETA ** (k + 2) <= budget_episodes:
        k += 1
    return ETA**k


def rungs_of(most: int) -> list[int]:
    """The episodes at which a candidate is judged, up to ``most``: 1, ETA, ETA**2, ..."""
    out = [1]
    while out[-1] < most:
        out.append(min(most, out[-1] * ETA))
    return out


@dataclass(eq=False)
class _Trial:
    """One candidate's trial: its Optuna trial, its scores (the i-th on selection host i) and the
    episodes it has been granted."""

    trial: Any
    candidate: str
    scores: list[float]
    target: int
    queued: int = 0
    state: str = "running"  # running, pruned, complete


def _space_params(study_trial, slots: Sequence[str], blueprints: Sequence[str], epochs: Sequence[int] | None,
                  styles: Sequence[str] | None) -> str | None:  # fmt: skip
    """Sample a candidate's parameters on ``study_trial`` (each enabled slot empty or one blueprint; timed:
    each grown slot's first epoch, and one blend style) -> the candidate written as :func:`plan_space` and
    :func:`timed_space` write it, or None for an empty plan."""
    parts = []
    for s in slots:
        b = study_trial.suggest_categorical(s, [NONE, *blueprints])
        if b == NONE:
            continue
        part = f"{s}={b}"
        if epochs is not None:
            e = study_trial.suggest_categorical(f"{s}{EPOCH_SEP}epoch", list(epochs))
            part += "" if e == 1 else f"{EPOCH_SEP}{e}"
        parts.append(part)
    if not parts:
        return None
    body = "+".join(parts)
    if styles is None:
        return body
    style = study_trial.suggest_categorical("style", list(styles))
    return body if style == Style(DEFAULT_BLEND["style"]).name else f"{body}{STYLE_SEP}{style}"


def _params_of(candidate: str, slots: Sequence[str], timed: bool) -> dict[str, Any]:
    """The parameters that :func:`_space_params` samples for ``candidate`` (to enqueue it)."""
    body, _, style = candidate.partition(STYLE_SEP)
    planned = dict(p.split("=", 1) for p in body.split("+"))
    params: dict[str, Any] = {}
    for s in slots:
        blueprint, _, epoch = planned.get(s, NONE).partition(EPOCH_SEP)
        params[s] = blueprint
        if timed and blueprint != NONE:
            params[f"{s}{EPOCH_SEP}epoch"] = int(epoch) if epoch else 1
    if timed:
        params["style"] = style or Style(DEFAULT_BLEND["style"]).name
    return params


#: An empty slot among a plan search's parameters.
NONE = "none"


def search_plans(cfg: RunConfig, task: Task, budget: int, cap: float | None = None,
                 store: EpisodeStore | None = None, timed: bool = False,
                 sampler: str = TPE) -> dict[str, Any]:  # fmt: skip
    """The best fixed plan within ``budget`` host epochs: an Optuna study (``sampler``: :data:`TPE` or
    :data:`RANDOM`, seeded from the run seed, in memory) over :func:`plan_space` (each enabled slot empty
    or one blueprint), its first trials each blueprint in every slot (the task's ``grow_all`` blueprint
    first), with Optuna's ``SuccessiveHalvingPruner`` over host epochs: a trial's i-th episode runs on
    training host i (the same hosts for every trial), it reports its mean final validation accuracy at
    1, :data:`ETA`, ``ETA**2``... episodes (``step``: its host epochs) and goes on only where the pruner
    keeps it, up to :func:`max_episodes`. Trials run :func:`search_width` episodes side by side: a batch
    takes the episodes promoted trials are owed first, then new trials (``study.ask``), never past the
    budget. Every episode run is counted, pruned or not. The choice: among the trials that reached the
    deepest rung, the best mean over that rung's hosts (ties: the earlier trial).

    With ``cap`` (seed parameters), only the plans that add at most ``cap`` are candidates (on a family,
    the plans that fit every member among the first :data:`FAMILY_FIT_HOSTS` training hosts, each under
    its own cap); with ``timed``, the candidates are :func:`timed_space`'s schedules (no ``cap``). A
    sample that names no new candidate (a repeat, an empty plan, one over the cap) runs nothing and is
    told failed; after :data:`MAX_MISSES` in a row an untried candidate drawn from the run seed is asked
    for. With ``store`` (:class:`~esper.shell.eval.store.EpisodeStore`), a batch kept there is read, not
    run (``episodes_reused``); the choice, scores and compute are the ones without a store."""
    optuna = optuna_module()
    T = cfg.lifecycle.max_epochs
    probe = task.make_host()
    slot_names = tuple(probe.slot_names)
    enabled = [not cfg.env.slots or i in cfg.env.slots for i in range(len(slot_names))]
    slots = [s for s, on in zip(slot_names, enabled) if on]
    blueprints = [b for b in BLUEPRINTS[task.family] if b != "noop"]
    seed = derive_seed("plan_search", cfg.seed)
    if timed:
        if cap is not None:
            raise ValueError(f"{PLAN_SEARCH_TIMED}: no cap")
        space = timed_space(task, slot_names, enabled, seed, T)
    else:
        space = plan_space(task, slot_names, enabled, seed)
    if cap is not None:
        # on a family, each member under its own cap (the caller's ``cap`` is one member's)
        space = plans_under_cap(space, cfg, task) if task.varies else plans_within(space, task, probe, cap)
        if not space:
            raise ValueError(f"{PLAN_SEARCH_CAP}: no plan adds at most {cap:g} seed parameters on this host")
    feasible = set(space)
    epochs = timed_epochs(T) if timed else None
    styles = [s.name for s in Style] if timed else None
    n_episodes = budget // T
    most = max_episodes(n_episodes)
    rungs = rungs_of(most)
    hosts = selection_host_seeds(cfg, most)
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=T, reduction_factor=ETA)
    study = make_study(sampler, derive_seed("plan_search_sampler", cfg.seed), pruner)
    uniform = {"+".join(f"{s}={b}" for s in slots) for b in blueprints}
    for c in (c for c in space if c in uniform):  # each blueprint everywhere first (those within a cap)
        study.enqueue_trial(_params_of(c, slots, timed))
    fill = random.Random(derive_seed("plan_search_fill", cfg.seed))
    trials: list[_Trial] = []
    tried: set[str] = set()
    failed = 0

    def ask() -> _Trial | None:
        nonlocal failed
        misses = 0
        while len(tried) < len(feasible):
            t = study.ask()
            c = _space_params(t, slots, blueprints, epochs, styles)
            if c is None or c not in feasible or c in tried:
                study.tell(t, state=optuna.trial.TrialState.FAIL)
                failed += 1
                misses += 1
                if misses >= MAX_MISSES:
                    left = [p for p in space if p not in tried]
                    study.enqueue_trial(_params_of(fill.choice(left), slots, timed))
                    misses = 0
                continue
            tried.add(c)
            out = _Trial(t, c, [], rungs[0])
            trials.append(out)
            return out
        return None

    used, reused, batches = 0, 0, 0
    width = search_width(cfg)
    while used < n_episodes:
        room = min(width, n_episodes - used)
        work: list[_Trial] = []  # the episodes promoted trials are owed, the most promising first
        owed = sorted((t for t in trials if t.state == "running" and len(t.scores) < t.target),
                      key=lambda t: (-float(np.mean(t.scores)), t.trial.number))  # fmt: skip
        for t in owed:
            while len(work) < room and len(t.scores) + t.queued < t.target:
                work.append(t)
                t.queued += 1
        # new trials only where the budget left keeps what the promoted trials may still need to finish
        promoted = [t for t in trials if t.state == "running" and t.target > rungs[0]]
        while len(work) < room and n_episodes - used - len(work) > sum(
                most - len(t.scores) - t.queued for t in promoted):  # fmt: skip
            t = ask()
            if t is None:
                break
            work.append(t)
            t.queued += 1
        if not work:
            break
        pairs = []
        for t in work:  # each trial's next hosts in order
            pairs.append((t.candidate, hosts[len(t.scores) + sum(1 for p in pairs if p[0] == t.candidate)]))
        records, read = run_plans(cfg, task, pairs, slot_names, store=store)
        reused += read
        used += len(pairs)
        batches += 1
        for t, r in zip(work, records):
            t.scores.append(float(r["final_val_acc"]))
            t.queued = 0
        for t in sorted(set(work), key=lambda t: t.trial.number):
            if len(t.scores) < t.target:
                continue
            value = float(np.mean(t.scores))
            if t.target >= most:
                study.tell(t.trial, value)
                t.state = "complete"
                continue
            t.trial.report(value, step=len(t.scores) * T)
            if t.trial.should_prune():
                study.tell(t.trial, state=optuna.trial.TrialState.PRUNED)
                t.state = "pruned"
            else:
                t.target = rungs[rungs.index(t.target) + 1]
    scored = [t for t in trials if t.scores]
    if scored:
        depth = max(max(r for r in rungs if r <= len(t.scores)) for t in scored)
        finalists = [t for t in scored if len(t.scores) >= depth]
        best = max(finalists, key=lambda t: (float(np.mean(t.scores[:depth])), -t.trial.number))
        chosen = best.candidate
    else:  # no episode fits the budget: the first candidate, unscored (as before)
        depth, finalists, chosen = 0, [], space[0]
    ranked = sorted(scored, key=lambda t: (-float(np.mean(t.scores)), t.trial.number))
    pruned = {"name": "SuccessiveHalvingPruner", "reduction_factor": ETA, "min_resource_host_epochs": T,
              "rungs_episodes": rungs}  # fmt: skip
    rows = [{"plan": t.candidate, "val_acc_mean": float(np.mean(t.scores)), "episodes": len(t.scores),
             "state": t.state} for t in ranked]  # fmt: skip
    return {
        "chosen": chosen,
        **({"cap_params": cap} if cap is not None else {}),
        "budget_host_epochs": budget,
        "episodes": used,
        **({"episodes_reused": reused} if store is not None else {}),
        "compute_host_epochs": used * T,
        "space": len(space),
        "sampler": sampler,
        "pruner": pruned,
        "trials": len(scored),
        "trials_pruned": sum(t.state == "pruned" for t in trials),
        "trials_complete": sum(t.state == "complete" for t in trials),
        "samples_failed": failed,
        "batches": batches,
        "finalists": {"episodes": depth, "plans": [t.candidate for t in finalists]},
        "candidates": rows,
        **_selection(cfg, task, hosts[: max((len(t.scores) for t in scored), default=0)]),
    }


def plans_under_cap(plans: Sequence[str], cfg: RunConfig, task: Task) -> list[str]:
    """The ``plans`` that fit the learned controller's cap on every host of ``task``: on a family, on each
    member among the first :data:`FAMILY_FIT_HOSTS` training hosts, under that member's own cap (a constant
    plan, as the pre-check's are); else on the task's host. In their order."""
    for seed in member_seeds(task, selection_host_seeds(cfg, FAMILY_FIT_HOSTS)):  # off a family: one host
        plans = plans_within(plans, task, host_of(task, seed), learner_cap(cfg, task, seed))
    return list(plans)


def plans_within(plans: Sequence[str], task: Task, host: Host, cap: float) -> list[str]:
    """The ``plans`` (written, on ``host``'s slots) that add at most ``cap`` seed parameters to ``host``
    (:func:`~esper.shell.env.tasks.seed_params`), in their order."""
    names = tuple(host.slot_names)
    each: dict[tuple[int, str], int] = {}  # a plan's parameters are its seeds' sum: count each seed once

    def params(plan: str) -> int:
        total = 0
        for s, b in written_plan(plan, names).items():
            if (s, b) not in each:
                each[(s, b)] = seed_params(task, host, {s: b})  # forks the RNG itself
            total += each[(s, b)]
        return total

    return [p for p in plans if params(p) <= cap]


#: What a plan search reads of an episode, and keeps of it in the run's store.
SEARCH_FIELDS = ("final_val_acc", "params_added")


def plan_store(cache: Path, cfg: RunConfig, task: Task) -> EpisodeStore:
    """The plan searches' part of the episode store in the search cache ``cache``: :data:`SEARCH_FIELDS`
    of each episode, on ``cfg``'s settings and ``task``'s draw."""
    return EpisodeStore(cache / STORE_FILE, cfg, task, fields=SEARCH_FIELDS)


def search_width(cfg: RunConfig) -> int:
    """Envs side by side in a plan search's batches: :data:`SEARCH_WIDTH` with the hosts on the CPU (or
    ``n_envs`` where that is more), ``n_envs`` on an accelerator."""
    device = cfg.env.devices[0] if cfg.env.devices else cfg.env.device
    return max(cfg.env.n_envs, SEARCH_WIDTH) if str(device).startswith("cpu") else cfg.env.n_envs


def candidate_spec(candidate: str, slot_names: Sequence[str], blueprint_names: Sequence[str]) -> str:
    """A (timed) candidate's episode spec (:func:`~esper.shell.eval.store.grow_spec`): its plan, first
    epochs and style, the default tempo and alpha target."""
    plan, at, style = schedule_of(candidate, slot_names, blueprint_names)
    return grow_spec(plan, slot_names, blueprint_names, at=at, style=style)


def run_plans(cfg: RunConfig, task: Task, pairs: Sequence[tuple[str, int]], slot_names: Sequence[str], *,
              store: EpisodeStore | None = None) -> tuple[list[dict], int]:  # fmt: skip
    """One episode of each ``(plan, host seed)`` pair (plans written on ``slot_names``, timed ones too:
    :func:`schedule_of`), :func:`search_width` side by side in their order
    (:func:`~esper.shell.eval.store.run_specs`): the records, and how many were read from ``store``."""
    with torch.random.fork_rng(devices=[]):  # a host draws its init: leave the caller's stream
        blueprints = tuple(task.make_host().blueprint_names)
    specs: dict[str, str] = {}
    for plan, _ in pairs:
        if plan not in specs:
            specs[plan] = candidate_spec(plan, slot_names, blueprints)
    return run_specs(cfg, task, [(specs[p], h) for p, h in pairs], store=store, width=search_width(cfg))


__all__ = [
    "FAMILY_FIT_HOSTS", "HEURISTIC_TUNED", "HEURISTIC_TUNED_WIDE", "PLAN_SEARCH", "PLAN_SEARCH_CAP",
    "PLAN_SEARCH_TIMED", "PLAN_SEARCH_VERSION", "PROBE", "SEARCH_FIELDS", "SEARCH_WIDTH", "TIMED_SHARES",
    "TUNED", "TUNE_GRID", "TUNE_HOSTS", "Prices", "candidate_spec", "enabled_slots",
    "host_of", "is_searched", "learned_compute", "learner_budget", "learner_cap", "member_seeds",
    "plan_budget", "plan_kind", "plan_space", "plan_store", "plans_under_cap", "plans_within", "prices",
    "run_plans", "schedule_of", "search", "search_plans", "search_width", "seed_costs",
    "selection_host_seeds", "timed_epochs", "timed_space", "tune_heuristic",
]  # fmt: skip
