"""The suite's runs as stages (:mod:`esper.shell.suite.engine`): each (task, training seed) trained, each of
its baselines' searches run and the seed evaluated, in subprocesses (:mod:`esper.shell.suite.launch`), or
joined to a controller kept elsewhere; then each task's seeds pooled into one entry per controller
(:mod:`esper.shell.eval.suite`); and the runs of zero-shot transfer and of fine-tuning after it (issue 46).

Every stage function here is run by the engine, in this process or on a worker, with absolute paths; each
one's subprocesses run on one thread (:data:`THREADS`, :data:`TRAIN_THREADS`), so a seed's numbers are the
same wherever its stages ran."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from esper.shell.config.presets import preset
from esper.shell.eval.search import is_searched
from esper.shell.eval.stats import mean_ci95
from esper.shell.eval.suite import finetune as ft
from esper.shell.eval.suite.archive import baselines_only, load_seed, train_machine, train_revision
from esper.shell.eval.suite.pooling import best_plan, joined_correlations, most_grown, pool_task, scored_plans
from esper.shell.eval.suite.tasks import (
    BORN_OWN,
    CAP_SEARCH,
    CONTROLLERS,
    EVAL_DIR,
    FOSSILIZING,
    IN_CAP,
    LEARNED,
    OWN_PLAN,
    SUITE,
    TRYING,
    TRYING_DIR,
    beside_name,
    controllers_for,
    final_data_seed,
    kept_has_cap,
    plan_name,
)
from esper.shell.eval.suite.transfer import EVAL_DIR as TRANSFER_EVAL_DIR
from esper.shell.eval.suite.transfer import TRANSFER_FLAGS, amortization, train_args, training_tasks
from esper.shell.suite import launch
from esper.shell.suite.engine import Engine, Stage

#: Every evaluation and search subprocess of a stage: one torch thread (the stage's one CPU).
THREADS = ("--threads", "1")
#: Every training subprocess of a stage: one env worker, one torch thread.
TRAIN_THREADS = ("--env.workers", "1", "--threads", "1")


# ------------------------------------------------------------------------------------------ the stages
def train_stage(root: Path, k: int, flags: Sequence[str]) -> tuple[Path, float]:
    """Train seed ``k`` into ``root/seedk`` with ``flags`` on one thread (resumed from its checkpoint, or
    kept when finished): the run directory and its training time."""
    return launch.train(k, root, [*flags, *TRAIN_THREADS])


def search_stage(run_dir: Path, name: str, task: str | None, *_after: Any) -> str:
    """Run search ``name`` for the run in ``run_dir`` into its cache (kept there when cached), on one thread;
    ``task``: evaluate's ``--task``. ``_after``: the stage it waits for (the training, or the settings)."""
    return launch.search(run_dir, name, task, THREADS)


def searches(names: Sequence[str]) -> list[str]:
    """The names among ``names`` that search before they are judged, each a stage of its own."""
    return [n for n in names if is_searched(n)]


def seed_stage(task: str, k: int, episodes: int, trying: bool, trained: tuple[Path, float],
               *_searched: str) -> tuple[str, int, dict, float]:  # fmt: skip
    """Evaluate trained seed ``k`` of ``task`` (its searches read from the cache): every controller, the
    diagnosis rows, the plan within the cap, and with ``trying`` the baselines that try harder; one seed's
    results and its training time."""
    run_dir, train_s = trained
    data_seed = final_data_seed(task, k)
    results = launch.evaluate(run_dir, k, episodes, controllers_for(preset(SUITE[task])), out=EVAL_DIR,
                              data_seed=data_seed, extra=THREADS, in_process=True)  # fmt: skip
    with_diagnostics(results, run_dir, k, episodes, EVAL_DIR, data_seed, THREADS, in_process=True)
    with_plan_in_cap(results, task, run_dir, k, episodes, EVAL_DIR, data_seed, THREADS, in_process=True)
    if trying:
        with_trying(results, run_dir, k, episodes, EVAL_DIR, data_seed, THREADS, in_process=True)
    return task, k, results, train_s


def kept_setup_stage(task: str, k: int, episodes: int, run_dir: Path, controller_from: Path) -> Path:
    """The settings of seed ``k``'s controller kept in ``controller_from``, written to
    ``run_dir/config.json`` where the directory has none, for its baselines to be searched and evaluated
    on the same hosts and draw; the run directory."""
    kept = _kept(task, k, episodes, controller_from)
    if not (run_dir / "config.json").is_file():
        if not kept.get("run_config"):
            raise ValueError(f"--controller-from {controller_from}: {task} seed {k} keeps no run settings")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(kept["run_config"], indent=1))
    return run_dir


def kept_seed_stage(
    task: str,
    k: int,
    episodes: int,
    run_dir: Path,
    controller_from: Path,
    beside: Path | None,
    trying: bool,
    *_after: Any,
) -> tuple[str, int, dict, float]:
    """Seed ``k`` of ``task`` with the controller kept in ``controller_from`` joined to its baselines
    (:func:`with_kept_controller`), and with ``trying`` the baselines that try harder."""
    results, train_s = with_kept_controller(task, k, episodes, run_dir, controller_from, beside)
    if trying:
        with_trying(
            results, run_dir, k, episodes, EVAL_DIR, final_data_seed(task, k), THREADS, in_process=True
        )
    return task, k, results, train_s


def transfer_seed_stage(heldout: str, k: int, episodes: int, trained: tuple[Path, float],
                        *_searched: str) -> tuple[int, dict, float]:  # fmt: skip
    """Evaluate transfer seed ``k``'s controller zero-shot on ``heldout`` (and its diagnosis rows)."""
    run_dir, train_s = trained
    flags = ["--task", heldout, *THREADS]
    data_seed = final_data_seed(heldout, k)
    # the preset it trains with (train_args) holds the controller's cap
    results = launch.evaluate(run_dir, k, episodes, controllers_for(preset("mnist1d")), out=TRANSFER_EVAL_DIR,
                              data_seed=data_seed, extra=flags, in_process=True)  # fmt: skip
    with_diagnostics(results, run_dir, k, episodes, TRANSFER_EVAL_DIR, data_seed, flags, in_process=True)
    return k, results, train_s


def finetune_stage(root: Path, k: int, flags: Sequence[str],
                   arm: str) -> tuple[str, int, list[float], float | None]:  # fmt: skip
    """Train fine-tuning arm ``arm``'s seed ``k`` into ``root/seedk``: its learning curve and closing
    held-out check."""
    run_dir, _ = train_stage(root, k, flags)
    return arm, k, ft.curve(run_dir), ft.closing_check(run_dir)


def with_trying(results: dict, run_dir: Path, k: int, episodes: int, out: str, data_seed: int | None,
                extra: Sequence[str], in_process: bool = False) -> dict:  # fmt: skip
    """Add the baselines that try harder (:data:`TRYING`) to seed ``k``'s ``results``, evaluated on the same
    hosts and draw into ``RUN_DIR/OUT-trying`` (kept when there), after every other row, and
    :data:`BORN_OWN`: the learned controller's most grown plan (``ppo_greedy``'s) present from the start
    (``born_big:PLAN``; none where it grew nothing or is not in the results), its compute the learned
    controller's, whose plan it grows. Their searches are cached in ``RUN_DIR/search`` as the others'."""
    greedy = results["controllers"].get("ppo_greedy")
    plan = most_grown(greedy) if greedy else ""
    names = {n: n for n in TRYING}
    if plan:
        names[BORN_OWN] = f"born_big:{plan}"
    folder = out.replace(EVAL_DIR, TRYING_DIR)
    got = launch.evaluate(run_dir, k, episodes, list(names.values()), out=folder, data_seed=data_seed,
                          extra=extra, in_process=in_process)["controllers"]  # fmt: skip
    for row, name in names.items():
        results["controllers"][row] = got[name]
    if plan:  # the controller's plan: its compute
        spent = greedy.get("compute_host_epochs", 0)
        row = {**got[names[BORN_OWN]], "plan": plan, "compute_host_epochs": spent}
        results["controllers"][BORN_OWN] = row
    return results


def _kept(task: str, k: int, episodes: int, controller_from: Path) -> dict:
    """Seed ``k``'s controller kept in ``controller_from``, refused (ValueError) where none is."""
    kept = load_seed(controller_from, task, k, episodes, final_data_seed(task, k))
    if kept is None:
        raise ValueError(f"--controller-from {controller_from}: no {task} seed {k} kept there for "
                         f"{episodes} hosts of evaluation seed {1000 + k} (python -m "
                         "esper.shell.suite.confirm keeps them)")  # fmt: skip
    return kept


def kept_baselines(task: str, k: int, episodes: int, controller_from: Path) -> list[str]:
    """The baselines evaluated beside seed ``k``'s kept controller: every controller but the learned ones,
    less :data:`CAP_SEARCH` where the kept run had no cap (the kept run's cap, not the preset's: a
    controller trained without one has no cap to search within)."""
    capped = kept_has_cap(task, _kept(task, k, episodes, controller_from).get("run_config"))
    return [n for n in CONTROLLERS if n not in LEARNED and (capped or n != CAP_SEARCH)]


def with_kept_controller(task: str, k: int, episodes: int, run_dir: Path, controller_from: Path,
                         beside: Path | None = None) -> tuple[dict, float]:  # fmt: skip
    """Seed ``k`` of ``task`` from a controller run kept in ``controller_from`` (its ``ppo``,
    ``ppo_greedy`` and diagnosis rows, evaluated on the suite's hosts and draw for the seed) and the
    baselines (:func:`kept_baselines`), evaluated here on the same hosts and draw from the kept run's
    settings (:func:`kept_setup_stage` writes them to ``run_dir/config.json``), with :data:`IN_CAP`: one
    seed's results as :func:`seed_stage` makes them, and the kept training time. Refused (ValueError) where
    nothing is kept for the seed, or the two evaluations' hosts differ. ``beside``: another arm's kept runs,
    whose learned rows join too, named :func:`beside_name` (they judge nothing)."""
    data_seed = final_data_seed(task, k)
    kept = _kept(task, k, episodes, controller_from)
    kept_setup_stage(task, k, episodes, run_dir, controller_from)
    names = kept_baselines(task, k, episodes, controller_from)
    base = launch.evaluate(
        run_dir, k, episodes, names, out=EVAL_DIR, data_seed=data_seed, extra=THREADS, in_process=True
    )
    with_plan_in_cap(base, task, run_dir, k, episodes, EVAL_DIR, data_seed, THREADS, in_process=True)
    if kept["meta"].get("host_seeds") != base["meta"].get("host_seeds"):
        raise ValueError(f"{task} seed {k}: the kept controller met other hosts than the baselines here: "
                         "the rows would not be paired")  # fmt: skip
    other = {}
    if beside is not None:
        also = load_seed(beside, task, k, episodes, data_seed)
        if also is None or also["meta"].get("host_seeds") != base["meta"].get("host_seeds"):
            raise ValueError(f"--beside {beside}: no {task} seed {k} kept there on the same hosts")
        other = {beside_name(n, beside): also["controllers"][n] for n in LEARNED if n in also["controllers"]}
    controllers = {**kept["controllers"], **other, **base["controllers"]}
    episodes_all = [e for c in controllers.values() for e in c.get("per_episode", [])]
    meta = {
        **base["meta"],
        "train_git_rev": train_revision(kept["meta"]),
        "train_machine": train_machine(kept["meta"]),
        "controller_from": str(controller_from),
        "controller_git_rev": kept["meta"].get("git_rev"),
    }
    results = {"controllers": controllers, "correlations": joined_correlations(episodes_all), "meta": meta}
    return results, float(kept["meta"].get("train_seconds", 0.0))


def with_diagnostics(results: dict, run_dir: Path, k: int, episodes: int, out: str, data_seed: int | None,
                     extra: Sequence[str], in_process: bool = False) -> dict:  # fmt: skip
    """Add two diagnostic rows to seed ``k``'s ``results``, evaluated on the same hosts and draw (into
    ``RUN_DIR/OUT-diagnosis``; kept when there), right after ``ppo_greedy``'s: :data:`OWN_PLAN`, its most
    grown plan as the fixed plan ``grow:PLAN`` (none when it grew nothing), and :data:`FOSSILIZING`.
    Their compute is the learned controller's, whose plan and policy they read."""
    greedy = results["controllers"].get("ppo_greedy", {})
    plan = most_grown(greedy)
    names = {OWN_PLAN: f"grow:{plan}"} if plan else {}
    names[FOSSILIZING] = FOSSILIZING
    got = launch.evaluate(run_dir, k, episodes, list(names.values()), out=f"{out}-diagnosis",
                          data_seed=data_seed, extra=extra, in_process=in_process)["controllers"]  # fmt: skip
    rows = {row: {**got[name], "compute_host_epochs": greedy.get("compute_host_epochs", 0)}
            for row, name in names.items()}  # fmt: skip
    if plan:
        rows[OWN_PLAN]["plan"] = plan
    ctl = {}
    for n, c in results["controllers"].items():
        if n not in rows:
            ctl[n] = c
        if n == "ppo_greedy":
            ctl.update(rows)
    results["controllers"] = ctl
    return results


def with_plan_in_cap(results: dict, task: str, run_dir: Path, k: int, episodes: int, out: str,
                     data_seed: int | None, extra: Sequence[str],
                     in_process: bool = False) -> dict:  # fmt: skip
    """Add :data:`IN_CAP` to seed ``k``'s ``results`` right after ``plan_search@1x`` (evaluated on the same
    hosts and draw into ``RUN_DIR/OUT-in-cap``; kept when there), its compute the search's. Nothing is
    added without that search's scores or a cap, or when no plan it scored fits the cap, or on a family
    (its meta's cap a dict, each member its own, which no one host's plan sizes read: ``plan_search_cap``
    is the search that keeps to every member's)."""
    equal = results["controllers"].get(plan_name(1.0), {})
    candidates = equal.get("search", {}).get("candidates")
    cap = results["meta"].get("ppo_param_cap")
    if not candidates or not cap or isinstance(cap, dict):
        return results
    made = preset(SUITE[task]).env.build_task()
    best = best_plan([c for c in scored_plans(made, made.make_host(), candidates) if c["params"] <= cap])
    if best is None:
        return results
    name = f"grow:{best['plan']}"
    got = launch.evaluate(run_dir, k, episodes, [name], out=f"{out}-in-cap", data_seed=data_seed,
                          extra=extra, in_process=in_process)["controllers"][name]  # fmt: skip
    row = {**got, "compute_host_epochs": equal.get("compute_host_epochs", 0), "plan": best["plan"],
           "search_val_acc": best["val_acc"], "search_episodes": best["episodes"]}  # fmt: skip
    ctl = {}
    for n, c in results["controllers"].items():
        if n != IN_CAP:
            ctl[n] = c
        if n == plan_name(1.0):
            ctl[IN_CAP] = row
    results["controllers"] = ctl
    return results


# ------------------------------------------------------------------------------------------- the runs
def _check_sizes(seeds: int, first_seed: int, episodes: int = 2) -> None:
    if seeds < 1 or first_seed < 0 or episodes < 2:
        raise ValueError("--seeds must be >= 1, --first-seed >= 0, --episodes >= 2")


def suite_stages(tasks: Sequence[str], seeds: int, first_seed: int, episodes: int, runs: Path,
                 controller_from: Path | None = None, beside: Path | None = None, trying: bool = False,
                 train_flags: Sequence[str] = ()) -> list[Stage]:  # fmt: skip
    """The stages of a suite run, per (task, seed): its training (or, with ``controller_from``, the kept
    controller's settings), each search of its baselines, then its evaluation (``seed TASK K``), which
    returns ``(task, k, results, train_seconds)``. ``train_flags``: added to every training's after the
    task's preset."""
    stages: list[Stage] = []
    for task in tasks:
        for k in range(first_seed, first_seed + seeds):
            run_dir = runs / task / f"seed{k}"
            first = f"train {task} {k}"
            if controller_from is None:
                flags = ["--preset", SUITE[task], *train_flags]
                stages.append(Stage(first, train_stage, (runs / task, k, flags)))
                names = list(controllers_for(preset(SUITE[task])))
            else:
                first = f"settings {task} {k}"
                stages.append(Stage(first, kept_setup_stage, (task, k, episodes, run_dir, controller_from)))
                names = kept_baselines(task, k, episodes, controller_from)
            names += list(TRYING) if trying else []
            found = [f"search {task} {k} {n}" for n in searches(names)]
            stages += [Stage(key, search_stage, (run_dir, n, None), (first,))
                       for key, n in zip(found, searches(names), strict=True)]  # fmt: skip
            if controller_from is None:
                args = (task, k, episodes, trying)
                stages.append(Stage(f"seed {task} {k}", seed_stage, args, (first, *found)))
            else:
                args = (task, k, episodes, run_dir, controller_from, beside, trying)
                stages.append(Stage(f"seed {task} {k}", kept_seed_stage, args, (first, *found)))
    return stages


def run_suite(tasks: Sequence[str], seeds: int, first_seed: int, episodes: int, runs: Path, engine: Engine,
              controller_from: Path | None = None, beside: Path | None = None, trying: bool = False,
              train_flags: Sequence[str] = ()) -> dict[str, Any]:  # fmt: skip
    """Every (task, seed) trained, searched and evaluated as stages on ``engine``
    (:func:`suite_stages`), each task's seeds pooled; with ``controller_from``, the controllers kept there
    are joined to the baselines, not trained (and ``beside``'s learned rows beside them); with ``trying``,
    the baselines that try harder join each seed (:func:`with_trying`). A run directory of ``runs`` that
    holds a seed already trained, searched or evaluated is read, not run again."""
    unknown = [t for t in tasks if t not in SUITE]
    if unknown or not tasks:
        raise ValueError(f"unknown suite task(s) {unknown}; tasks: {', '.join(SUITE)}")
    _check_sizes(seeds, first_seed, episodes)
    pairs = [(t, k) for t in tasks for k in range(first_seed, first_seed + seeds)]
    if controller_from is None:  # a run directory of baselines only holds no training to go on from
        only = [str(runs / t / f"seed{k}") for t, k in pairs if baselines_only(runs / t / f"seed{k}")]
        if only:
            raise ValueError(
                "run directories of baselines only (--controller-from) where this run "
                f"trains; pass their --controller-from, or another --runs: {', '.join(only)}"
            )
    else:
        for t, k in pairs:  # every kept seed is there before anything runs
            _kept(t, k, episodes, controller_from)
    t0 = time.perf_counter()
    absolute = [p.resolve() if p is not None else None for p in (runs, controller_from, beside)]
    stages = suite_stages(tasks, seeds, first_seed, episodes, *absolute, trying, train_flags)
    got = engine.run(stages, desc="suite")
    done = [got[f"seed {t} {k}"] for t, k in pairs]
    out: dict[str, Any] = {}
    for task in tasks:
        per_seed = {k: r for t, k, r, _ in done if t == task}
        out[task] = pool_task(task, per_seed)
        out[task]["train_seconds"] = [s for t, _, _, s in done if t == task]
    return {"tasks": out, "seconds": time.perf_counter() - t0}


def run_transfer(heldout: str, seeds: int, first_seed: int, episodes: int, runs: Path, engine: Engine,
                 train_flags: Sequence[str] = ()) -> dict[str, Any]:  # fmt: skip
    """Every training seed trained on the other tasks and evaluated on ``heldout``, as stages on ``engine``
    (training, each search on ``heldout``, the evaluation), pooled: ``{"transfer": {heldout: entry}}``, the
    entry as :func:`~esper.shell.eval.suite.pooling.pool_task` writes a task's, with ``trained_on``, the
    training times and the :func:`~esper.shell.eval.suite.transfer.amortization`."""
    _check_sizes(seeds, first_seed, episodes)
    flags = [*train_args(heldout), *train_flags]
    root = runs.resolve() / f"transfer-{heldout}"
    t0 = time.perf_counter()
    stages: list[Stage] = []
    for k in range(first_seed, first_seed + seeds):
        first = f"train transfer {k}"
        stages.append(Stage(first, train_stage, (root, k, flags)))
        names = searches(controllers_for(preset("mnist1d")))
        found = [f"search transfer {k} {n}" for n in names]
        stages += [Stage(key, search_stage, (root / f"seed{k}", n, heldout), (first,))
                   for key, n in zip(found, names, strict=True)]  # fmt: skip
        evaluation = Stage(f"seed transfer {k}", transfer_seed_stage, (heldout, k, episodes), (first, *found))
        stages.append(evaluation)
    got = engine.run(stages, desc=f"transfer to {heldout}")
    done = [got[f"seed transfer {k}"] for k in range(first_seed, first_seed + seeds)]
    entry = pool_task(heldout, {k: r for k, r, _ in done})
    entry["preset"] = "mnist1d"
    entry["flags"] = list(TRANSFER_FLAGS)
    entry["trained_on"] = training_tasks(heldout)
    entry["train_seconds"] = [s for _, _, s in done]
    entry["amortization"] = amortization(entry["controllers"])
    return {"tasks": {}, "transfer": {heldout: entry}, "seconds": time.perf_counter() - t0}


def run_finetune(heldout: str, seeds: int, first_seed: int, updates: int, runs: Path, engine: Engine,
                 train_flags: Sequence[str] = ()) -> dict[str, Any]:  # fmt: skip
    """Both arms of :mod:`esper.shell.eval.suite.finetune` for every seed, a stage each on ``engine``,
    pooled: ``{"tasks": {}, "transfer": {heldout: {"finetune": {"tuned": ..., "scratch": ...}}}}``."""
    training_tasks(heldout)  # a suite task
    if updates < 1:
        raise ValueError("--updates must be >= 1")
    _check_sizes(seeds, first_seed)
    runs = runs.resolve()
    seed_range = range(first_seed, first_seed + seeds)
    sources = {k: runs / f"transfer-{heldout}" / f"seed{k}" for k in seed_range}
    missing = [str(p) for p in sources.values() if not (p / "checkpoint.pt").is_file()]
    if missing:
        raise ValueError(f"--finetune needs the transfer runs first (python -m esper.shell.suite --transfer "
                         f"{heldout}); missing: {', '.join(missing)}")  # fmt: skip
    base = ["--preset", SUITE[heldout], *TRANSFER_FLAGS, "--updates", str(updates), *train_flags]
    root = runs / f"finetune-{heldout}"
    start = {"tuned": lambda k: ["--init_from", str(sources[k])], "scratch": lambda k: []}
    stages = [Stage(f"finetune {arm} {k}", finetune_stage, (root / arm, k, [*base, *start[arm](k)], arm))
              for k in seed_range for arm in ft.ARMS]  # fmt: skip
    done = list(engine.run(stages, desc=f"fine-tuning on {heldout}").values())
    pooled = {arm: ft.pool_curves({k: c for a, k, c, _ in done if a == arm}) for arm in ft.ARMS}
    for arm in ft.ARMS:
        finals = {k: h for a, k, _, h in done if a == arm and h is not None}
        if finals:  # the closing held-out check of each run: fresh hosts, greedy
            m, ci = mean_ci95(list(finals.values()))
            pooled[arm]["heldout_greedy"] = {"test_acc_mean": m, "test_acc_ci95": list(ci),
                                             "training_seeds": sorted(finals)}  # fmt: skip
    pooled["catch_up_update"] = ft.catch_up(pooled["tuned"], pooled["scratch"])
    about = {"updates": updates, "preset": SUITE[heldout], "flags": list(TRANSFER_FLAGS),
             "trained_on": training_tasks(heldout)}  # fmt: skip
    entry = {"finetune": {**pooled, **about}}
    return {"tasks": {}, "transfer": {heldout: entry}}


__all__ = [
    "THREADS", "TRAIN_THREADS", "finetune_stage", "kept_baselines", "kept_seed_stage", "kept_setup_stage",
    "run_finetune", "run_suite", "run_transfer", "search_stage", "searches", "seed_stage", "suite_stages",
    "train_stage", "transfer_seed_stage", "with_diagnostics", "with_kept_controller", "with_plan_in_cap",
    "with_trying",
]  # fmt: skip
