"""The suite's runs: each (task, training seed) trained and evaluated in subprocesses
(:mod:`esper.shell.suite.launch`), kept in the archive, joined to a controller kept elsewhere, then each
task's seeds pooled into one entry per controller (:mod:`esper.shell.eval.suite`); and the runs of
zero-shot transfer and of fine-tuning after it (issue 46)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from esper.shell.config.presets import preset
from esper.shell.eval.stats import mean_ci95
from esper.shell.eval.suite import finetune as ft
from esper.shell.eval.suite.archive import (
    carry,
    load_seed,
    restore,
    save_seed,
    seed_path,
    train_machine,
    train_revision,
)
from esper.shell.eval.suite.pooling import best_plan, joined_correlations, most_grown, pool_task, scored_plans
from esper.shell.eval.suite.tasks import (
    BORN_OWN,
    CAP_SEARCH,
    CONTROLLERS,
    EVAL_DIR,
    EVALUATIONS,
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


def _one(task: str, k: int, episodes: int, runs: Path, jobs: int, archive: Path | None = None,
         controller_from: Path | None = None, beside: Path | None = None,
         trying: bool = False) -> tuple[str, int, dict, float]:  # fmt: skip
    """Train and evaluate training seed ``k`` of ``task`` (one the ``archive`` does not keep:
    :func:`run_suite` reads those); with an ``archive``, the seed evaluated here is kept there. With
    ``controller_from`` no controller is trained: the one kept there (:mod:`esper.shell.suite.confirm`) is
    joined to the baselines evaluated here (:func:`with_kept_controller`). With ``trying``, the baselines
    that try harder join too (:func:`with_trying`)."""
    root = runs / task
    if archive is not None:
        restore(archive, task, k, root / f"seed{k}")  # a state in progress kept from another machine
    root.mkdir(parents=True, exist_ok=True)
    if controller_from is not None:
        results, train_s = with_kept_controller(task, k, episodes, root / f"seed{k}", jobs, controller_from,
                                                beside)  # fmt: skip
        if trying:
            extra = ["--threads", "1"] if jobs > 1 else []
            with_trying(results, root / f"seed{k}", k, episodes, EVAL_DIR, final_data_seed(task, k), extra)
        if archive is not None:
            save_seed(archive, task, k, results, train_s)
        return task, k, results, train_s
    threads = ["--env.workers", "1", "--threads", "1"] if jobs > 1 else []
    run_dir, train_s = launch.train(k, root, ["--preset", SUITE[task], *threads])
    extra = ["--threads", "1"] if jobs > 1 else []
    results = launch.evaluate(run_dir, k, episodes, controllers_for(preset(SUITE[task])), out=EVAL_DIR,
                              data_seed=final_data_seed(task, k), extra=extra)  # fmt: skip
    with_diagnostics(results, run_dir, k, episodes, EVAL_DIR, final_data_seed(task, k), extra)
    with_plan_in_cap(results, task, run_dir, k, episodes, EVAL_DIR, final_data_seed(task, k), extra)
    if trying:
        with_trying(results, run_dir, k, episodes, EVAL_DIR, final_data_seed(task, k), extra)
    if archive is not None:
        save_seed(archive, task, k, results, train_s)
    return task, k, results, train_s


def with_trying(results: dict, run_dir: Path, k: int, episodes: int, out: str, data_seed: int | None,
                extra: Sequence[str]) -> dict:  # fmt: skip
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
                          extra=extra)["controllers"]  # fmt: skip
    for row, name in names.items():
        results["controllers"][row] = got[name]
    if plan:  # the controller's plan: its compute
        spent = greedy.get("compute_host_epochs", 0)
        row = {**got[names[BORN_OWN]], "plan": plan, "compute_host_epochs": spent}
        results["controllers"][BORN_OWN] = row
    return results


def kept_elsewhere(kept: dict, task: str, k: int, episodes: int, controller_from: Path | None) -> str | None:
    """Why a seed kept in the archive is not the one this run asks for (None: it is). Without
    ``controller_from`` the run trains the task's preset, so a seed whose controller was joined from a kept
    run (``meta.controller_from``, whatever its flags) is not it; with one, the kept seed's learned rows
    must be that folder's own for the seed (the same ``ppo_greedy`` episodes), not another arm's or a
    controller trained here."""
    joined = kept.get("meta", {}).get("controller_from")
    if controller_from is None:
        return None if joined is None else f"its controller was joined from {joined}, not trained here"
    ctl = load_seed(controller_from, task, k, episodes, final_data_seed(task, k))
    if ctl is None:
        return f"--controller-from {controller_from} keeps no {task} seed {k} to check it against"
    mine = kept["controllers"].get("ppo_greedy", {}).get("per_episode")
    if mine is None or mine != ctl["controllers"].get("ppo_greedy", {}).get("per_episode"):
        source = f"joined from {joined}" if joined else "trained here"
        return f"its controller is not the one kept in {controller_from} ({source})"
    return None


def with_kept_controller(task: str, k: int, episodes: int, run_dir: Path, jobs: int, controller_from: Path,
                         beside: Path | None = None) -> tuple[dict, float]:  # fmt: skip
    """Seed ``k`` of ``task`` from a controller run kept in ``controller_from`` (its ``ppo``,
    ``ppo_greedy`` and diagnosis rows, evaluated on the suite's hosts and draw for the seed) and the
    baselines, evaluated here on the same hosts and draw from the kept run's settings (written to
    ``run_dir/config.json`` where the directory has none), with :data:`IN_CAP`: one seed's results as
    :func:`_one` makes them, and the kept training time. Refused (ValueError) where nothing is kept for
    the seed, or the two evaluations' hosts differ. ``beside``: another arm's kept runs, whose learned rows
    join too, named :func:`beside_name` (they judge nothing)."""
    data_seed = final_data_seed(task, k)
    kept = load_seed(controller_from, task, k, episodes, data_seed)
    if kept is None:
        raise ValueError(f"--controller-from {controller_from}: no {task} seed {k} kept there for "
                         f"{episodes} hosts of evaluation seed {1000 + k} (python -m "
                         "esper.shell.suite.confirm keeps them)")  # fmt: skip
    if not (run_dir / "config.json").is_file():
        if not kept.get("run_config"):
            raise ValueError(f"--controller-from {controller_from}: {task} seed {k} keeps no run settings")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(kept["run_config"], indent=1))
    # the kept run's cap, not the preset's: a controller trained without one has no cap to search within
    capped = kept_has_cap(task, kept.get("run_config"))
    names = [n for n in CONTROLLERS if n not in LEARNED and (capped or n != CAP_SEARCH)]
    extra = ["--threads", "1"] if jobs > 1 else []
    base = launch.evaluate(run_dir, k, episodes, names, out=EVAL_DIR, data_seed=data_seed, extra=extra)
    with_plan_in_cap(base, task, run_dir, k, episodes, EVAL_DIR, data_seed, extra)
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
                     extra: Sequence[str]) -> dict:  # fmt: skip
    """Add two diagnostic rows to seed ``k``'s ``results``, evaluated on the same hosts and draw (into
    ``RUN_DIR/OUT-diagnosis``; kept when there), right after ``ppo_greedy``'s: :data:`OWN_PLAN`, its most
    grown plan as the fixed plan ``grow:PLAN`` (none when it grew nothing), and :data:`FOSSILIZING`.
    Their compute is the learned controller's, whose plan and policy they read."""
    greedy = results["controllers"].get("ppo_greedy", {})
    plan = most_grown(greedy)
    names = {OWN_PLAN: f"grow:{plan}"} if plan else {}
    names[FOSSILIZING] = FOSSILIZING
    got = launch.evaluate(run_dir, k, episodes, list(names.values()), out=f"{out}-diagnosis",
                          data_seed=data_seed, extra=extra)["controllers"]  # fmt: skip
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
                     data_seed: int | None, extra: Sequence[str]) -> dict:  # fmt: skip
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
                          extra=extra)["controllers"][name]  # fmt: skip
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


def run_suite(tasks: Sequence[str], seeds: int, first_seed: int, episodes: int, jobs: int, runs: Path,
              log: Callable[[str], None] = print, archive: Path | None = None,
              controller_from: Path | None = None, beside: Path | None = None,
              trying: bool = False) -> dict[str, Any]:  # fmt: skip
    """Every (task, seed) trained and evaluated (``jobs`` at a time), each task's seeds pooled; with an
    ``archive`` (:mod:`esper.shell.eval.suite.archive`), seeds kept there are read, and seeds evaluated here
    kept; with ``controller_from``, the controllers kept there are joined to the baselines, not trained
    (and ``beside``'s learned rows beside them); with ``trying``, the baselines that try harder join each
    seed evaluated here (:func:`with_trying`; a seed read from the archive keeps the rows it was kept with,
    and a row missing from one seed is left out of its task's table)."""
    unknown = [t for t in tasks if t not in SUITE]
    if unknown or not tasks:
        raise ValueError(f"unknown suite task(s) {unknown}; tasks: {', '.join(SUITE)}")
    if seeds < 1 or first_seed < 0 or episodes < 2 or jobs < 1:
        raise ValueError("--seeds and --jobs must be >= 1, --first-seed >= 0, --episodes >= 2")
    t0 = time.perf_counter()
    pairs = [(t, k) for t in tasks for k in range(first_seed, first_seed + seeds)]
    kept: dict[tuple[str, int], dict | None] = {}  # what the archive keeps: read, not run
    if archive is not None:  # first: a seed kept for another controller is neither read nor overwritten
        kept = {(t, k): load_seed(archive, t, k, episodes, final_data_seed(t, k)) for t, k in pairs}
        wrong = [f"{seed_path(archive, t, k)}: {why}" for (t, k), r in kept.items() if r is not None
                 and (why := kept_elsewhere(r, t, k, episodes, controller_from)) is not None]  # fmt: skip
        if wrong:
            raise ValueError("kept seeds of another controller; nothing was read, run or overwritten (pass "
                             "the --controller-from they were made with, or another --archive):\n"
                             + "\n".join(wrong))  # fmt: skip

    def one(pair: tuple[str, int]) -> tuple[str, int, dict, float]:
        if (r := kept.get(pair)) is not None:
            return *pair, r, r["meta"].get("train_seconds", 0.0)
        out = _one(*pair, episodes, runs, jobs, archive, controller_from, beside, trying)
        log(f"{pair[0]} seed {pair[1]}: done")
        return out

    with ThreadPoolExecutor(max_workers=jobs) as workers:
        done = list(workers.map(one, pairs))
    out: dict[str, Any] = {}
    for task in tasks:
        per_seed = {k: r for t, k, r, _ in done if t == task}
        out[task] = pool_task(task, per_seed)
        out[task]["train_seconds"] = [s for t, _, _, s in done if t == task]
    return {"tasks": out, "seconds": time.perf_counter() - t0}


def carry_suite(tasks: Sequence[str], seeds: int, first_seed: int, runs: Path, archive: Path) -> list[Path]:
    """Keep the state in progress of every trained (task, seed) of ``runs`` that ``archive`` does not keep
    whole (:func:`esper.shell.eval.suite.archive.carry`); the folders written. Run it before a machine
    goes."""
    pairs = [(task, k) for task in tasks for k in range(first_seed, first_seed + seeds)]
    folders = (*EVALUATIONS, TRYING_DIR)
    kept = [carry(archive, task, k, runs / task / f"seed{k}", folders) for task, k in pairs]
    return [dest for dest in kept if dest is not None]


def restore_suite(tasks: Sequence[str], seeds: int, first_seed: int, runs: Path, archive: Path) -> list[Path]:
    """Put every state in progress that ``archive`` keeps back into ``runs`` (where the run directory has
    no checkpoint of its own; :func:`esper.shell.eval.suite.archive.restore`); the run directories written.
    A suite run does this itself; this is for runs at a revision that does not."""
    pairs = [(task, k) for task in tasks for k in range(first_seed, first_seed + seeds)]
    return [runs / t / f"seed{k}" for t, k in pairs if restore(archive, t, k, runs / t / f"seed{k}")]


def run_transfer(heldout: str, seeds: int, first_seed: int, episodes: int, jobs: int, runs: Path,
                 log: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    """Every training seed trained on the other tasks and evaluated on ``heldout`` (``jobs`` at a time),
    pooled: ``{"transfer": {heldout: entry}}``, the entry as
    :func:`~esper.shell.eval.suite.pooling.pool_task` writes a task's, with ``trained_on``, the training
    times and the :func:`~esper.shell.eval.suite.transfer.amortization`."""
    if seeds < 1 or first_seed < 0 or episodes < 2 or jobs < 1:
        raise ValueError("--seeds and --jobs must be >= 1, --first-seed >= 0, --episodes >= 2")
    args = train_args(heldout)
    root = runs / f"transfer-{heldout}"
    root.mkdir(parents=True, exist_ok=True)
    threads = ["--env.workers", "1", "--threads", "1"] if jobs > 1 else []
    t0 = time.perf_counter()

    evaluate_flags = ["--task", heldout, *(["--threads", "1"] if jobs > 1 else [])]
    out = TRANSFER_EVAL_DIR

    def one(k: int) -> tuple[int, dict, float]:
        run_dir, train_s = launch.train(k, root, [*args, *threads])
        # the preset it trains with (train_args) holds the controller's cap
        results = launch.evaluate(run_dir, k, episodes, controllers_for(preset("mnist1d")), out=out,
                                  data_seed=final_data_seed(heldout, k), extra=evaluate_flags)  # fmt: skip
        with_diagnostics(results, run_dir, k, episodes, out, final_data_seed(heldout, k), evaluate_flags)
        log(f"transfer to {heldout}, seed {k}: done")
        return k, results, train_s

    with ThreadPoolExecutor(max_workers=jobs) as workers:
        done = list(workers.map(one, range(first_seed, first_seed + seeds)))
    entry = pool_task(heldout, {k: r for k, r, _ in done})
    entry["preset"] = "mnist1d"
    entry["flags"] = list(TRANSFER_FLAGS)
    entry["trained_on"] = training_tasks(heldout)
    entry["train_seconds"] = [s for _, _, s in done]
    entry["amortization"] = amortization(entry["controllers"])
    return {"tasks": {}, "transfer": {heldout: entry}, "seconds": time.perf_counter() - t0}


def run_finetune(heldout: str, seeds: int, first_seed: int, updates: int, jobs: int, runs: Path,
                 log: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    """Both arms of :mod:`esper.shell.eval.suite.finetune` for every seed (``jobs`` runs at a time),
    pooled: ``{"tasks": {}, "transfer": {heldout: {"finetune": {"tuned": ..., "scratch": ...}}}}``."""
    training_tasks(heldout)  # a suite task
    if seeds < 1 or first_seed < 0 or updates < 1 or jobs < 1:
        raise ValueError("--seeds, --updates and --jobs must be >= 1, --first-seed >= 0")
    seed_range = range(first_seed, first_seed + seeds)
    sources = {k: runs / f"transfer-{heldout}" / f"seed{k}" for k in seed_range}
    missing = [str(p) for p in sources.values() if not (p / "checkpoint.pt").is_file()]
    if missing:
        raise ValueError(f"--finetune needs the transfer runs first (python -m esper.shell.suite --transfer "
                         f"{heldout}); missing: {', '.join(missing)}")  # fmt: skip
    base = ["--preset", SUITE[heldout], *TRANSFER_FLAGS, "--updates", str(updates)]
    threads = ["--env.workers", "1", "--threads", "1"] if jobs > 1 else []
    root = runs / f"finetune-{heldout}"

    def one(job: tuple[str, int]) -> tuple[str, int, list[float], float | None]:
        arm, k = job
        extra = ["--init_from", str(sources[k])] if arm == "tuned" else []
        run_dir, _ = launch.train(k, root / arm, [*base, *extra, *threads])
        log(f"fine-tuning on {heldout}, {arm}, seed {k}: done")
        return arm, k, ft.curve(run_dir), ft.closing_check(run_dir)

    jobs_list = [(arm, k) for k in seed_range for arm in ft.ARMS]
    with ThreadPoolExecutor(max_workers=jobs) as workers:
        done = list(workers.map(one, jobs_list))
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
    "carry_suite", "kept_elsewhere", "restore_suite", "run_finetune", "run_suite", "run_transfer",
    "with_diagnostics", "with_kept_controller", "with_plan_in_cap",
]  # fmt: skip
