"""Evaluation episodes: controllers run on the same fresh hosts, and what their final hosts show.

:func:`run_episodes` runs one controller on evaluation episodes (host seeds of their own,
:func:`esper.shell.common.seeding.eval_host_seeds`); :func:`summarize` and :func:`correlations` make the
``results.json`` entries; :func:`compare_on_config` runs and summarizes several controllers on the
task a config describes (the end-of-run held-out check, the growth bench); :func:`compare_controllers`
does it for a run directory's trained controller and writes ``RUN_DIR/eval/``
(``python -m esper.shell.evaluate``). Controllers that grow the same fixed plan (plan searches that chose
it, a ``grow:`` placement of it, ``grow_all`` and its plan written out, ``born_big`` of one plan: one
:func:`~esper.shell.eval.controllers.episode_spec`) are one controller: its episodes run once, and each
later one's summary names the first in ``same_episodes_as``. With a search cache (a run directory's
``search/``), fixed plans' episodes are also kept there (:mod:`esper.shell.eval.store`), so that another
evaluation of the run on the same hosts and draw (the suite's diagnosis, in-cap and ``--trying`` rows, a
re-run with more controllers) reads them: number for number the episodes it would run.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from esper.core.reward_config import with_param_budget
from esper.shell.agent.config import param_cap_on
from esper.shell.common.checkpoint import load_checkpoint
from esper.shell.common.fields import from_dict
from esper.shell.common.revision import git_revision, machine
from esper.shell.common.seeding import eval_host_seeds
from esper.shell.config.presets import RunConfig
from esper.shell.env.config import GENERATED_TASKS, TASKS
from esper.shell.env.step import BLEND_SETTINGS
from esper.shell.env.tasks import Task, grow_all_params
from esper.shell.eval.controllers import (
    CONTROLLERS,
    EXTRA_CONTROLLERS,
    HEURISTIC_GAIN,
    PLAN_PREFIX,
    PPO_CONTROLLERS,
    PPO_READOUTS,
    STYLE_SEP,
    born_source,
    episode_spec,
    is_born_big,
    make_controller,
)
from esper.shell.eval.dataset import EpisodeDataset, dataset_name
from esper.shell.eval.fits import check_controller_fits
from esper.shell.eval.output import write_eval
from esper.shell.eval.runner import run_hosts
from esper.shell.eval.search import is_searched, learned_compute, plan_budget, plan_kind, search
from esper.shell.eval.stats import mean_ci95, spearman
from esper.shell.eval.store import STORE_FILE, EpisodeStore, run_specs
from esper.shell.host.flops import FLOP_KINDS
from esper.shell.telemetry.console import progress

#: Episode fields kept in ``per_episode`` (and averaged where numeric).
EPISODE_FIELDS = ("return", "final_test_acc", "final_val_acc", "params_added", "objective", "test_objective",
                  "n_fossilized", "n_pruned", "host_seed", "grown", "germinated_at",
                  "germinations")  # fmt: skip
#: The FLOPs an episode spent, by kind (:mod:`esper.shell.host.flops`): kept in ``per_episode`` and averaged
#: (``KIND_flops_mean``) where the episodes record them (an episode kept before they were counted does not).
FLOP_FIELDS = tuple(f"{kind}_flops" for kind in FLOP_KINDS)


def run_episodes(cfg: RunConfig, task: Task, name: str, episodes: Sequence[int], *, eval_seed: int,
                 checkpoint: dict | None, on_epoch=None, searched: dict | None = None, keep=None,
                 dataset: EpisodeDataset | None = None,
                 store: EpisodeStore | None = None) -> list[dict]:  # fmt: skip
    """Run controller ``name`` on evaluation episodes ``episodes`` (indices; host seeds from
    ``eval_seed``), ``cfg.env.n_envs`` at a time. Returns one record per episode, in order.
    ``searched``: the search's result, for ``heuristic_tuned`` and ``plan_search``; ``keep``: as
    :func:`~esper.shell.eval.runner.run_hosts` takes it; ``dataset``: the episodes also go to this
    dataset (:mod:`esper.shell.eval.dataset`). A fixed plan
    (:func:`~esper.shell.eval.controllers.episode_spec`) runs from its spec, and with a ``store``
    (:mod:`esper.shell.eval.store`; not with ``keep`` or a ``dataset``, which need every episode run) its
    batches kept there are read, not run."""
    episodes = list(episodes)
    hosts = eval_host_seeds(eval_seed, episodes)
    spec = episode_spec(name, cfg, task, searched) if keep is None else None
    if spec is not None:
        wrap = (lambda ctl, env: dataset.wrap(name, ctl, env)) if dataset is not None else None
        records, _ = run_specs(cfg, task, [(spec, h) for h in hosts], on_epoch=on_epoch, wrap=wrap,
                               store=store if dataset is None else None,
                               on_result=None if dataset is None else dataset.take)  # fmt: skip
        return [{"controller": name, "episode": e, **rec} for e, rec in zip(episodes, records, strict=True)]

    def make(env, batch: list[int]):
        ctl = make_controller(name, cfg, env, checkpoint=checkpoint, seed=eval_seed + batch[0],
                              searched=searched, host_seed=hosts[batch[0]])  # fmt: skip
        return ctl if dataset is None else dataset.wrap(name, ctl, env)

    records = run_hosts(cfg, task, make, hosts, on_epoch=on_epoch, keep=keep,
                        on_result=None if dataset is None else dataset.take)  # fmt: skip
    return [{"controller": name, "episode": e, **rec} for e, rec in zip(episodes, records, strict=True)]


def summarize(records: list[dict]) -> dict[str, Any]:
    """One controller's summary (the ``results.json`` entry)."""
    acc = [r["final_test_acc"] for r in records]
    params = [r["params_added"] for r in records]
    m, (lo, hi) = mean_ci95(acc)
    pm, (plo, phi) = mean_ci95(params)
    out: dict[str, Any] = {
        "test_acc_mean": m,
        "test_acc_ci95": [lo, hi],
        "params_added_mean": pm,
        "params_added_ci95": [plo, phi],
        "episodes": len(records),
        "test_acc_std": float(np.std(acc, ddof=1)) if len(acc) > 1 else 0.0,
    }
    for k in ("return", "final_val_acc", "objective", "test_objective", "n_fossilized", "n_pruned"):
        out[f"{k}_mean"] = float(np.mean([r[k] for r in records]))
    ops: dict[str, float] = {}
    for r in records:
        for op, n in r.get("op_counts", {}).items():
            ops[op] = ops.get(op, 0.0) + n / len(records)
    out["op_counts_mean"] = ops
    # what was grown, where and when: the final hosts' seeds in the placements' notation, most common
    # first, and the epoch of each episode's first germination (episodes that germinated at all)
    grown = Counter(r["grown"] for r in records)
    out["grown_counts"] = dict(sorted(grown.items(), key=lambda kv: (-kv[1], kv[0])))
    first = [r["germinated_at"][0] for r in records if r["germinated_at"]]
    out["first_germination_mean"] = float(np.mean(first)) if first else None
    # how it blended: the style, tempo and alpha target of every germination, most common first
    germs = [g for r in records for g in r.get("germinations", [])]
    out["blend_counts"] = {
        k: dict(Counter(str(g[k]) for g in germs if k in g).most_common()) for k in BLEND_SETTINGS
    }
    out["val_acc_curve_mean"] = np.mean([r["val_acc_curve"] for r in records], axis=0).tolist()
    # the FLOPs an episode spent (None where some episode does not record them)
    for k in FLOP_FIELDS:
        spent = [r.get(k) for r in records]
        out[f"{k}_mean"] = None if any(v is None for v in spent) else float(np.mean(spent))
    out["per_episode"] = [{k: r[k] for k in (*EPISODE_FIELDS, "episode")}
                          | {k: r[k] for k in FLOP_FIELDS if k in r} for r in records]  # fmt: skip
    return out


def correlations(records: list[dict]) -> dict[str, Any]:
    """Spearman's rho between each episode's return and its held-out outcome, over ``records``."""
    ret = [r["return"] for r in records]
    per_param = [r["final_test_acc"] / (r["host_params"] + r["params_added"]) * 1000.0 for r in records]
    return {
        "n_episodes": len(records),
        "return_vs_test_acc": spearman(ret, [r["final_test_acc"] for r in records]),
        "return_vs_test_acc_per_kparam": spearman(ret, per_param),
        "return_vs_test_objective": spearman(ret, [r["test_objective"] for r in records]),
    }


def compare_controllers(
    run_dir: str | Path,
    *,
    episodes: int = 20,
    seed: int = 0,
    controllers: Sequence[str] = CONTROLLERS,
    show_progress: bool = True,
    threads: int | None = None,
    out: str | Path | None = None,
    data_seed: int | None = None,
    task: str | None = None,
    save_episodes: str | Path | None = None,
    budget_share: float | None = None,
) -> dict[str, Any]:
    """Evaluate the run in ``run_dir`` (as :mod:`esper.shell.evaluate` describes) and write ``out``
    (``RUN_DIR/eval/`` by default); returns the results dict. ``threads``: torch intra-op threads to
    set (0: as the run would, the cores over its env workers; None: leave torch's setting alone). The
    CLI passes 0: two env threads on two cores with two intra-op threads each ran the evaluation ~4x
    slower per episode than training. ``data_seed``: evaluate on that draw of generated data (the run
    trained, and the searches select, on its own draw); refused for a fixed dataset. The searches'
    choices are kept in ``RUN_DIR/search/``. ``task``: evaluate on another task (the run's config on that
    task, :meth:`RunConfig.for_task`, its own data draw for the searches: zero-shot transfer; the
    controller is checked to act on its host, :func:`esper.shell.eval.fits.check_controller_fits`; written to
    ``RUN_DIR/eval-TASK/``, the searches' choices to ``RUN_DIR/search-TASK/``). ``save_episodes``: every
    controller's evaluation episodes are also written there as a dataset, ``save_episodes/<controller>/``
    (:mod:`esper.shell.eval.dataset`). ``budget_share``: evaluate under that parameter budget, a share of
    what ``grow_all`` adds (:func:`at_budget`: the learned controller's cap, the reward's budget and every
    budgeted baseline's; a run whose controller reads a budget, ``env.budget_shares``, is told it); a run
    that reads one is evaluated at its largest training share unless given another."""
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path} not found (is {run_dir} a run directory?)")
    if episodes < 2:
        raise ValueError(f"--episodes must be >= 2 (a confidence interval needs two), got {episodes}")
    check_names(controllers)
    run_cfg = cfg = from_dict(RunConfig, json.loads(cfg_path.read_text()))
    if task is not None:  # another task: the run's settings on it, the task's own draw for the searches
        if task not in TASKS:
            raise ValueError(f"--task: unknown task {task!r}; tasks: {', '.join(TASKS)}")
        try:
            cfg = cfg.for_task(task)
        except ValueError as e:
            raise ValueError(f"--task {task}: the run's settings do not fit it: {e}") from None
    if budget_share is not None or cfg.env.budget_shares:
        cfg = at_budget(cfg, budget_share if budget_share is not None else max(cfg.env.budget_shares))
    eval_cfg = cfg
    if data_seed is not None:
        if cfg.env.task not in GENERATED_TASKS:
            raise ValueError(
                f"--data-seed: task {cfg.env.task!r} is a fixed dataset; its test split is the only held-out "
                f"draw (data seeds draw generated data: {', '.join(GENERATED_TASKS)})"
            )
        eval_cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, data_seed=data_seed))
    if threads is not None:
        torch.set_num_threads(threads or cfg.torch_threads())
    checkpoint = None
    if any(c in PPO_CONTROLLERS for c in controllers):
        ckpt = run_dir / "checkpoint.pt"
        if not ckpt.is_file():
            raise FileNotFoundError(f"{ckpt} not found: evaluate a run that finished an update")
        checkpoint = load_checkpoint(ckpt, map_location=cfg.env.device)
        if "agent" not in checkpoint:
            raise ValueError(f"{ckpt} has no 'agent' entry: not a checkpoint of python -m esper.shell.run")
        if task is not None:
            where = f"--task {task}: run {run_dir}"
            check_controller_fits(run_cfg, checkpoint, cfg.env.build_task(), run=where)
    suffix = f"-{task}" if task is not None else ""
    dataset = None
    if save_episodes is not None:
        taken = [p for c in controllers if (p := Path(save_episodes) / dataset_name(c)).exists()]
        if taken:  # refused before any episode runs
            raise ValueError(f"--save-episodes: {taken[0]} exists; choose another directory")
        dataset = EpisodeDataset(eval_cfg, eval_seed=seed)
    results = compare_on_config(eval_cfg, controllers, episodes=episodes, seed=seed, checkpoint=checkpoint,
                                show_progress=show_progress, selection_cfg=cfg,
                                search_cache=run_dir / f"search{suffix}", dataset=dataset)  # fmt: skip
    if dataset is not None:
        results["meta"]["saved_episodes"] = [str(p) for p in dataset.save(Path(save_episodes))]
    results["meta"]["run_dir"] = str(run_dir)
    if budget_share is not None or run_cfg.env.budget_shares:
        results["meta"]["budget_share"] = cfg.ppo.param_cap_share
    results["meta"]["trained_on"] = list(run_cfg.training_tasks)
    results["meta"]["git_rev"] = git_revision()
    results["meta"]["machine"] = machine()
    write_eval(Path(out) if out is not None else run_dir / f"eval{suffix}", results)
    return results


def at_budget(cfg: RunConfig, share: float) -> RunConfig:
    """``cfg`` under a parameter budget of ``share`` x what ``grow_all`` adds: the learned controller's
    hard cap (``ppo.param_cap_share``) and the reward's budget (``reward.param_budget_share``), which the
    budgeted baselines read too; where the controller reads a budget (``env.budget_shares``), every episode
    is told this one."""
    if not (isinstance(share, (int, float)) and math.isfinite(share) and share > 0):
        raise ValueError(f"--budget-share must be a share > 0 of what grow_all adds, got {share!r}")
    env = dataclasses.replace(cfg.env, budget_shares=(float(share),)) if cfg.env.budget_shares else cfg.env
    ppo = dataclasses.replace(cfg.ppo, param_cap=0.0, param_cap_share=float(share))
    reward = dataclasses.replace(cfg.reward, param_budget=0.0, param_budget_share=float(share))
    return dataclasses.replace(cfg, env=env, ppo=ppo, reward=reward)


def check_names(controllers: Sequence[str]) -> None:
    """Refuse (one line) controller names evaluation does not know, and an empty list."""
    extra = ("grow_all:", "grow_all" + STYLE_SEP, PLAN_PREFIX)
    known = (*CONTROLLERS, *PPO_CONTROLLERS, HEURISTIC_GAIN)
    named = lambda c: c in known or c.startswith(extra) or is_searched(c) or is_born_big(c)
    unknown = [c for c in controllers if not named(c)]
    if unknown or not controllers:
        raise ValueError(
            f"unknown controller(s) {unknown}; choose from {', '.join(CONTROLLERS)} (or {EXTRA_CONTROLLERS})"
        )
    check_born_sources(controllers)


def check_born_sources(controllers: Sequence[str]) -> None:
    """Refuse a ``born_big:CONTROLLER`` whose source is not evaluated before it."""
    for k, c in enumerate(controllers):
        if (source := born_source(c)) is not None and source not in controllers[:k]:
            raise ValueError(f"{c}: grows {source}'s most frequent plan: name {source} before it in the "
                             "same --controllers")  # fmt: skip


def most_frequent_plan(records: list[dict]) -> str:
    """The final plan (``grown``) most episodes of ``records`` ended with, the first by name on a tie
    (``""``: nothing grown)."""
    counts = Counter(r["grown"] for r in records)
    return min(counts, key=lambda plan: (-counts[plan], plan))


def compute_host_epochs(name: str, cfg: RunConfig, checkpoint: dict | None, searched: dict | None) -> int:
    """The host epochs controller ``name`` spent before it was evaluated: the learned controller's
    training (its updates × ``n_envs`` × ``max_epochs``), a search's episodes × ``max_epochs``, 0 for a
    fixed rule (``born_big`` of ``grow_all``'s plan or of a plan given); ``born_big:CONTROLLER``'s is its
    source's, whose plan it grows (in ``searched``)."""
    if name in PPO_CONTROLLERS:
        updates = int(checkpoint["progress"]["update"]) if checkpoint else cfg.updates
        return updates * cfg.env.n_envs * cfg.lifecycle.max_epochs
    return int(searched["compute_host_epochs"]) if searched else 0


def member_label(member: dict) -> str:
    """A family's member in words (``channels 2-8-8, kernels 1-1-1, pools 1-1-4``): a key of the meta's
    per-member sizes."""
    said = lambda v: "-".join(map(str, v)) if isinstance(v, list | tuple) else str(v)
    return ", ".join(f"{k} {said(v)}" for k, v in member.items())


def size_meta(cfg: RunConfig, task: Task, host_seeds: Sequence[int]) -> dict[str, Any]:
    """What ``grow_all`` adds (``grow_all_params``), the reward's budget (``param_budget``) and the learned
    controller's hard cap (``ppo_param_cap``, 0: none), in parameters: one number each on a task of one
    host; on a family (:attr:`Task.varies`), whose members differ in size and each host's budget and cap
    are shares of its own, a dict for each, member (:func:`member_label`) -> its value, over the members of
    ``host_seeds`` (the evaluation's hosts), with ``members``, each member's count of those hosts: no one
    member's numbers stand for the task's (issue 102)."""

    def sizes(host) -> dict[str, float]:
        grow_all = grow_all_params(task, host, tuple(cfg.env.slots))
        budget = with_param_budget(cfg.reward, grow_all).param_budget
        cap = param_cap_on(cfg.ppo.param_cap, cfg.ppo.param_cap_share, grow_all)
        return {"grow_all_params": grow_all, "param_budget": budget, "ppo_param_cap": cap}

    with torch.random.fork_rng(devices=[]):  # a fresh host draws its init: leave the caller's stream
        if not task.varies:
            return sizes(task.make_host())
        per: dict[str, dict[str, float]] = {}
        count: Counter = Counter()
        for h in host_seeds:
            label = member_label(task.describe_member(int(h)))
            count[label] += 1
            if label not in per:
                per[label] = sizes(task.host_for(int(h)))
    keys = ("grow_all_params", "param_budget", "ppo_param_cap")
    return {**{k: {m: v[k] for m, v in per.items()} for k in keys}, "members": dict(count)}


def compare_on_config(cfg: RunConfig, controllers: Sequence[str], *, episodes: int, seed: int,
                      checkpoint: dict | None = None, show_progress: bool = True,
                      task: Task | None = None, selection_cfg: RunConfig | None = None,
                      search_cache: Path | None = None,
                      dataset: EpisodeDataset | None = None) -> dict[str, Any]:  # fmt: skip
    """Run ``controllers`` on ``episodes`` evaluation episodes of the task ``cfg`` describes and
    summarize (the ``results.json`` layout, without writing it). ``heuristic_tuned`` and ``plan_search``
    first search on the training hosts and data draw of ``selection_cfg`` (default ``cfg``; its choice
    cached in ``search_cache`` when given). ``born_big:CONTROLLER`` grows, from the start, the plan its
    source (named earlier) ended with most often here (its ``search``: ``chosen``, ``from``).
    ``dataset``: every controller's episodes also go to this dataset (a controller that grows the same
    fixed plan as an earlier one is not run again, nor kept)."""
    check_born_sources(controllers)
    task = task if task is not None else cfg.env.build_task()
    selection_cfg = selection_cfg if selection_cfg is not None else cfg
    t0 = time.perf_counter()
    selection_task = task if selection_cfg == cfg else selection_cfg.env.build_task()
    searched = {name: search(name, selection_cfg, selection_task, cache=search_cache)
                for name in controllers if is_searched(name)}  # fmt: skip
    records: dict[str, list[dict]] = {}
    T = cfg.lifecycle.max_epochs
    store = EpisodeStore(search_cache / STORE_FILE, cfg, task) if search_cache is not None else None
    first_of: dict[str, str] = {}  # each fixed plan's first controller, by its spec
    same_as: dict[str, str] = {}
    with progress(len(controllers) * episodes * T, desc="evaluate", enabled=show_progress) as bar:
        for name in controllers:
            bar.set_postfix(controller=name)
            if (source := born_source(name)) is not None:  # the source ran earlier (check_names)
                plan = most_frequent_plan(records[source])
                spent = compute_host_epochs(source, cfg, checkpoint, searched.get(source))
                searched[name] = {"chosen": plan, "from": source, "compute_host_epochs": spent}
            plan = episode_spec(name, cfg, task, searched.get(name))
            if plan is not None and plan in first_of:  # the same controller: its episodes, not run again
                same_as[name] = first_of[plan]
                records[name] = copy.deepcopy(records[same_as[name]])
                bar.update(episodes * T)
                continue
            if plan is not None:
                first_of[plan] = name
            on_epoch = lambda ev: bar.update(ev["envs"])
            records[name] = run_episodes(cfg, task, name, range(episodes), eval_seed=seed,
                                         checkpoint=checkpoint, on_epoch=on_epoch,
                                         searched=searched.get(name), dataset=dataset,
                                         store=store)  # fmt: skip
    sizes = size_meta(cfg, task, eval_host_seeds(seed, range(episodes)))
    summaries = {}
    for name, recs in records.items():
        summaries[name] = summarize(recs)
        spent = compute_host_epochs(name, cfg, checkpoint, searched.get(name))
        summaries[name]["compute_host_epochs"] = spent
        if name in searched:
            summaries[name]["search"] = searched[name]
        if name in same_as:
            summaries[name]["same_episodes_as"] = same_as[name]
    return {
        "controllers": summaries,
        "correlations": correlations([r for recs in records.values() for r in recs]),
        "meta": {
            "run_dir": None,
            "task": cfg.env.task,
            "episodes": episodes,
            "eval_seed": seed,
            "host_seeds": eval_host_seeds(seed, range(episodes)),
            # the draw evaluated on (None: a fixed dataset, read on its test split), and the draw the
            # learned controller trained and the searches selected on
            "data_seed": task.data_seed,
            "selection_data_seed": selection_task.data_seed,
            "learned_compute_host_epochs": learned_compute(cfg),
            "plan_search_budgets": {n: plan_budget(n, cfg) for n in controllers if plan_kind(n) is not None},
            "ppo_acts": "; ".join(f"{name} {how}" for name, (_, how) in PPO_READOUTS.items()),
            "grow_all_blueprint": task.grow_all,
            "param_weight": cfg.reward.param_weight,
            # grow_all_params (the unit of the budgets stated as a share), param_budget and ppo_param_cap
            # (the learned controller's hard cap, 0: none), in parameters; on a family, per member
            **sizes,
            "param_budget_share": cfg.reward.param_budget_share,
            "param_over_weight": cfg.reward.param_over_weight,
            "ppo_param_cap_share": cfg.ppo.param_cap_share,
            "reward_mode": cfg.reward.mode.name,
            "trained_updates": int(checkpoint["progress"]["update"]) if checkpoint else None,
            "torch_threads": torch.get_num_threads(),  # the numbers repeat at the same seed and threads
            "seconds": time.perf_counter() - t0,
            # the evaluation's fixed-plan episodes run and read from the run's store (none: no store)
            **({"episode_store": {"ran": store.ran, "read": store.read}} if store is not None else {}),
        },
    }
