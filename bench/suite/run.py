"""The suite's runs: each (task, training seed) trained and evaluated in subprocesses (bench.growth's
steps), then each task's seeds pooled into one entry per controller."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.growth import training
from bench.growth.pooling import summarize_runs
from bench.suite.archive import (
    baselines_only,
    carry,
    load_seed,
    partial_path,
    restore,
    run_end,
    save_seed,
    seed_path,
    train_machine,
    train_revision,
)
from esper.shell.config.presets import RunConfig, preset
from esper.shell.env.config import GENERATED_TASKS
from esper.shell.env.tasks import Task, seed_params
from esper.shell.eval.search import HEURISTIC_TUNED, PLAN_SEARCH_CAP, learned_compute
from esper.shell.eval.stats import spearman
from esper.shell.host.hosts import Host
from esper.shell.telemetry.events import read_events

#: Suite task -> the preset that trains it (``python -m esper.shell.run --preset``).
SUITE: dict[str, str] = {
    "mnist1d": "default",
    "mnist1d_deep": "mnist1d_deep",
    "longrange": "longrange",
    "digits_shallow": "digits_shallow",
    "recall": "recall",
}
#: The learned controller's readouts: sampled as trained, and each head's most likely action.
LEARNED = ("ppo", "ppo_greedy")
#: Baselines that spend nothing before the evaluation, and the tuned heuristic (which searches).
BASELINES = ("static", "random", "heuristic", "heuristic_tuned", "grow_all")
#: ``plan_search``'s budgets, as multiples of the learned controller's training compute.
PLAN_MULTIPLES = (0.25, 0.5, 1.0, 2.0)
#: Evaluation episodes (fresh hosts) per training seed.
EVAL_EPISODES = 10
#: The final draw of a generated task for training seed k: data seed ``FINAL_DATA_SEED + k`` (the
#: selection draw is the task's own, mnist1d 42, longrange 7).
FINAL_DATA_SEED = 100_000
#: Where each (task, seed)'s evaluation goes inside its run directory.
EVAL_DIR = "eval-suite"
#: The learned controller's most grown plan, grown as a fixed plan on the same hosts: the row that
#: splits a gap to ``plan_search`` into the plan chosen and how it was grown (timing, blending).
OWN_PLAN = "ppo_greedy_plan"
#: The greedy controller, fossilizing wherever FOSSILIZE is legal: how much of the growing part is
#: the seeds kept late (``esper.shell.eval.controllers.FOSSILIZING_READOUTS``).
FOSSILIZING = "ppo_greedy_fossilize"
#: ``plan_search@1x``'s best plan within the learned controller's parameter cap (by the search's scores on
#: the training hosts), grown as a fixed plan on the same hosts: what the cap costs at equal compute,
#: since the search has none. Evaluated into ``RUN_DIR/OUT-in-cap``.
IN_CAP = "plan_search_in_cap"


def plan_name(multiple: float) -> str:
    """``plan_search@0.25x``: plan search at ``multiple`` times the learned controller's compute."""
    return f"plan_search@{multiple:g}x"


#: The plan search at equal compute over only the plans within the learned controller's parameter cap
#: (``esper.shell.eval.search``): the search that looks for the best plan under the controller's budget,
#: beside ``plan_search@1x``, which has none. Evaluated where the task's preset has a cap.
CAP_SEARCH = f"{PLAN_SEARCH_CAP}@1x"
CONTROLLERS = (*LEARNED, *BASELINES[:-1], *(plan_name(m) for m in PLAN_MULTIPLES), CAP_SEARCH, BASELINES[-1])


def controllers_for(cfg: RunConfig) -> tuple[str, ...]:
    """The controllers a seed trained with ``cfg`` is evaluated with: :data:`CONTROLLERS`, less
    :data:`CAP_SEARCH` where the learned controller has no parameter cap to search within."""
    return CONTROLLERS if cfg.ppo.has_param_cap else tuple(n for n in CONTROLLERS if n != CAP_SEARCH)


#: The controller settings every evaluation records in its meta (``esper.shell.eval.episodes``), by meta key:
#: the setting's name. Read back to state which of them the suite's controller took from elsewhere than
#: its task's preset (:func:`controller_settings`).
RECORDED_SETTINGS = {
    "param_weight": "reward.param_weight",
    "param_budget_share": "reward.param_budget_share",
    "param_over_weight": "reward.param_over_weight",
    "reward_mode": "reward.mode",
    "ppo_param_cap_share": "ppo.param_cap_share",
}


def controller_settings(task: str, metas: Sequence[dict]) -> dict[str, Any]:
    """The recorded controller settings (:data:`RECORDED_SETTINGS`) that the seeds of ``task`` were
    trained and evaluated with where they depart from the task's preset, by setting name: the value all
    seeds share, or every seed's value, in order, where they disagree. Empty: the preset's controller."""
    base = preset(SUITE[task])
    out: dict[str, Any] = {}
    for key, name in RECORDED_SETTINGS.items():
        values = [m[key] for m in metas if key in m]
        if not values:
            continue
        section, field = name.split(".")
        default = getattr(getattr(base, section), field)
        default = getattr(default, "name", default)  # an enum is recorded by its name
        if len(set(values)) > 1:
            out[name] = values
        elif values[0] != default:
            out[name] = values[0]
    return out


def kept_has_cap(task: str, run_config: dict[str, Any] | None) -> bool:
    """Whether the controller of a kept run of ``task`` (its settings as ``config.json`` holds them) had a
    parameter cap: its ``ppo.param_cap`` or ``ppo.param_cap_share``, each the task's preset's where the
    settings do not give it."""
    base = preset(SUITE[task]).ppo
    ppo = (run_config or {}).get("ppo", {})
    return ppo.get("param_cap", base.param_cap) > 0 or ppo.get("param_cap_share", base.param_cap_share) > 0


def final_data_seed(task: str, k: int) -> int | None:
    """The final draw's data seed of training seed ``k`` (None for a fixed dataset: its test split)."""
    return FINAL_DATA_SEED + k if preset(SUITE[task]).env.task in GENERATED_TASKS else None


def _one(task: str, k: int, episodes: int, runs: Path, jobs: int, archive: Path | None = None,
         controller_from: Path | None = None,
         beside: Path | None = None) -> tuple[str, int, dict, float]:  # fmt: skip
    """Train and evaluate training seed ``k`` of ``task`` (one the ``archive`` does not keep:
    :func:`run_suite` reads those); with an ``archive``, the seed evaluated here is kept there. With
    ``controller_from`` no controller is trained: the one kept there (:mod:`bench.suite.confirm`) is joined
    to the baselines evaluated here (:func:`with_kept_controller`)."""
    root = runs / task
    if archive is not None:
        restore(archive, task, k, root / f"seed{k}")  # a state in progress kept from another machine
    root.mkdir(parents=True, exist_ok=True)
    if controller_from is not None:
        results, train_s = with_kept_controller(task, k, episodes, root / f"seed{k}", jobs, controller_from,
                                                beside)  # fmt: skip
        if archive is not None:
            save_seed(archive, task, k, results, train_s)
        return task, k, results, train_s
    threads = ["--env.workers", "1", "--threads", "1"] if jobs > 1 else []
    run_dir, train_s = training._train(k, root, ["--preset", SUITE[task], *threads])
    extra = ["--threads", "1"] if jobs > 1 else []
    results = training._evaluate(run_dir, k, episodes, controllers_for(preset(SUITE[task])), out=EVAL_DIR,
                                 data_seed=final_data_seed(task, k), extra=extra)  # fmt: skip
    with_diagnostics(results, run_dir, k, episodes, EVAL_DIR, final_data_seed(task, k), extra)
    with_plan_in_cap(results, task, run_dir, k, episodes, EVAL_DIR, final_data_seed(task, k), extra)
    if archive is not None:
        save_seed(archive, task, k, results, train_s)
    return task, k, results, train_s


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
                         f"{episodes} hosts of evaluation seed {1000 + k} (python -m bench.suite.confirm "
                         "keeps them)")  # fmt: skip
    if not (run_dir / "config.json").is_file():
        if not kept.get("run_config"):
            raise ValueError(f"--controller-from {controller_from}: {task} seed {k} keeps no run settings")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(kept["run_config"], indent=1))
    # the kept run's cap, not the preset's: a controller trained without one has no cap to search within
    capped = kept_has_cap(task, kept.get("run_config"))
    names = [n for n in CONTROLLERS if n not in LEARNED and (capped or n != CAP_SEARCH)]
    extra = ["--threads", "1"] if jobs > 1 else []
    base = training._evaluate(run_dir, k, episodes, names, out=EVAL_DIR, data_seed=data_seed, extra=extra)
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


def beside_name(name: str, arm_dir: Path) -> str:
    """A learned row of the arm kept in ``arm_dir``, beside the judged arm's: ``ppo_greedy[default]``."""
    return f"{name}[{arm_dir.name}]"


def beside_readout(row: str) -> str | None:
    """The learned readout a :func:`beside_name` row stands for (``ppo_greedy[default]`` → ``ppo_greedy``);
    None for any other row."""
    base, bracket, rest = row.partition("[")
    return base if bracket and rest.endswith("]") and base in LEARNED else None


def joined_correlations(episodes: list[dict]) -> dict[str, Any]:
    """Spearman's rho of return against test accuracy and test objective over the episodes of two
    evaluations joined (the one against accuracy per parameter needs the host's size, which the
    episodes do not keep: None)."""
    ret = [e["return"] for e in episodes]
    return {"n_episodes": len(episodes),
            "return_vs_test_acc": spearman(ret, [e["final_test_acc"] for e in episodes]),
            "return_vs_test_acc_per_kparam": None,
            "return_vs_test_objective": spearman(ret, [e["test_objective"] for e in episodes])}  # fmt: skip


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
    got = training._evaluate(run_dir, k, episodes, list(names.values()), out=f"{out}-diagnosis",
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
    added without that search's scores or a cap, or when no plan it scored fits the cap."""
    equal = results["controllers"].get(plan_name(1.0), {})
    candidates = equal.get("search", {}).get("candidates")
    cap = results["meta"].get("ppo_param_cap")
    if not candidates or not cap:
        return results
    made = preset(SUITE[task]).env.build_task()
    best = _best([c for c in scored_plans(made, made.make_host(), candidates) if c["params"] <= cap])
    if best is None:
        return results
    name = f"grow:{best['plan']}"
    got = training._evaluate(run_dir, k, episodes, [name], out=f"{out}-in-cap", data_seed=data_seed,
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


def scored_plans(task: Task, host: Host, candidates: list[dict]) -> list[dict]:
    """A plan search's ``candidates`` with what each plan adds to ``host`` (``params``), its score
    (``val_acc``, the mean over the ``episodes`` it ran on the training hosts)."""
    return [{"plan": c["plan"], "params": seed_params(task, host, c["plan"]), "val_acc": c["val_acc_mean"],
             "episodes": c["episodes"]} for c in candidates]  # fmt: skip


def most_grown(controller: dict) -> str:
    """The plan a controller's evaluation grew most often (``""``: nothing grown)."""
    return next(iter(controller.get("grown_counts", {})), "")


def run_suite(tasks: Sequence[str], seeds: int, first_seed: int, episodes: int, jobs: int, runs: Path,
              log: Callable[[str], None] = print, archive: Path | None = None,
              controller_from: Path | None = None, beside: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """Every (task, seed) trained and evaluated (``jobs`` at a time), each task's seeds pooled; with an
    ``archive`` (:mod:`bench.suite.archive`), seeds kept there are read, and seeds evaluated here kept;
    with ``controller_from``, the controllers kept there are joined to the baselines, not trained (and
    ``beside``'s learned rows beside them)."""
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
        out = _one(*pair, episodes, runs, jobs, archive, controller_from, beside)
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


#: The evaluations of a seed, by folder: the table's, the diagnosis rows, the plan within the cap.
EVALUATIONS = (EVAL_DIR, f"{EVAL_DIR}-diagnosis", f"{EVAL_DIR}-in-cap")


def carry_suite(tasks: Sequence[str], seeds: int, first_seed: int, runs: Path, archive: Path) -> list[Path]:
    """Keep the state in progress of every trained (task, seed) of ``runs`` that ``archive`` does not keep
    whole (:func:`bench.suite.archive.carry`); the folders written. Run it before a machine goes."""
    pairs = [(task, k) for task in tasks for k in range(first_seed, first_seed + seeds)]
    kept = [carry(archive, task, k, runs / task / f"seed{k}", EVALUATIONS) for task, k in pairs]
    return [dest for dest in kept if dest is not None]


def restore_suite(tasks: Sequence[str], seeds: int, first_seed: int, runs: Path, archive: Path) -> list[Path]:
    """Put every state in progress that ``archive`` keeps back into ``runs`` (where the run directory has
    no checkpoint of its own; :func:`bench.suite.archive.restore`); the run directories written. A suite
    run does this itself; this is for runs at a revision that does not."""
    pairs = [(task, k) for task in tasks for k in range(first_seed, first_seed + seeds)]
    return [runs / t / f"seed{k}" for t, k in pairs if restore(archive, t, k, runs / t / f"seed{k}")]


def pool_task(task: str, per_seed: dict[int, dict]) -> dict[str, Any]:
    """One task's entry from its training seeds' evaluations (``per_seed[k]``: seed k's ``results.json``):
    per controller the mean over seeds with a 95 % interval over seeds, the parameters added, the host
    epochs spent (their mean over seeds), what the searches chose, and what it grew (``grown``: each
    plan's count of evaluation episodes over all seeds, most grown first); per seed, the revisions that
    trained and evaluated it (``revisions``); and the controller's settings that depart from the task's preset
    (``controller_settings``, :func:`controller_settings`)."""
    seeds = sorted(per_seed)
    names = [n for n in per_seed[seeds[0]]["controllers"]
             if all(n in per_seed[k]["controllers"] for k in seeds)]  # fmt: skip
    runs = [{n: per_seed[k]["controllers"][n]["per_episode"] for n in names} for k in seeds]
    pooled, corr = summarize_runs(runs, [per_seed[k].get("correlations") for k in seeds])
    controllers = {}
    for n in names:
        entries = [per_seed[k]["controllers"][n] for k in seeds]
        c = pooled[n]
        controllers[n] = {
            "test_acc_mean": c["test_acc_mean"],
            "test_acc_ci95": c["test_acc_ci95"],
            "params_added_mean": c["params_added_mean"],
            "params_added_ci95": c["params_added_ci95"],
            "compute_host_epochs": round(float(np.mean([e.get("compute_host_epochs", 0) for e in entries]))),
            "training_seeds": seeds,
            "per_seed_test_acc": c["per_seed_test_acc"],
            "episodes": c["episodes"],
        }
        fates = seed_fates(runs, n)
        if fates is not None:
            controllers[n]["seed_fates"] = fates
        grown = sum((Counter(e.get("grown_counts", {})) for e in entries), Counter())
        if grown:
            controllers[n]["grown"] = dict(sorted(grown.items(), key=lambda kv: (-kv[1], kv[0])))
        if any("search" in e for e in entries):
            controllers[n]["chosen"] = {str(k): e["search"]["chosen"] for k, e in zip(seeds, entries)
                                        if "search" in e}  # fmt: skip
    meta = [per_seed[k]["meta"] for k in seeds]
    return {
        "preset": SUITE.get(task),
        "controllers": controllers,
        "return_vs_test_acc": corr["return_vs_test_acc"],
        "data": {
            "final_data_seeds": [m.get("data_seed") for m in meta],
            "selection_data_seed": meta[0].get("selection_data_seed"),
            "eval_seeds": [m.get("eval_seed") for m in meta],
            "episodes_per_seed": meta[0].get("episodes"),
        },
        "learned_compute_host_epochs": meta[0].get("learned_compute_host_epochs"),
        "revisions": {str(k): revisions(m) for k, m in zip(seeds, meta)},
        "controller_settings": controller_settings(task, meta),
        "search_view": search_view(task, per_seed),
    }


def seed_fates(runs: list[dict[str, list[dict]]], name: str) -> dict[str, float] | None:
    """What became of the seeds ``name`` germinated (``germinated``), per evaluation episode of ``runs``:
    ``unfossilized``, in the final host (alpha above 0) but never fossilized (their input stayed
    detached to the end); ``lost``, neither pruned nor in the final host (still at alpha 0 at the end, or
    removed by a rollback); and ``kept_nothing_share``, the episodes that germinated and ended with no
    seed in the host. None where the episodes do not record their germinations."""
    eps = [e for r in runs for e in r[name]]
    fields = ("germinated_at", "n_fossilized", "n_pruned", "grown")
    if not eps or any(k not in e for e in eps for k in fields):
        return None
    live = [len(e["grown"].split("+")) if e["grown"] else 0 for e in eps]
    return {
        "germinated": float(np.mean([len(e["germinated_at"]) for e in eps])),
        "unfossilized": float(np.mean([n - e["n_fossilized"] for n, e in zip(live, eps)])),
        "lost": float(np.mean([len(e["germinated_at"]) - e["n_pruned"] - n for n, e in zip(live, eps)])),
        "kept_nothing_share": float(np.mean([bool(e["germinated_at"]) and not e["grown"] for e in eps])),
    }


def search_view(task: str, per_seed: dict[int, dict], readout: str = "ppo_greedy") -> dict[str, Any]:
    """The plans the largest ``plan_search`` scored on each seed's training hosts (validation accuracy,
    the mean over the episodes each plan ran), read for a diagnosis of where the learned controller
    trails: per seed the best plan, the best within the learned controller's parameter cap (None, as the
    cap, where it had none), and
    ``readout``'s most grown plan with its score where the search scored it. Scores of plans that ran
    few episodes are noisy, and the best of many is biased up: read them with their episodes."""
    out: dict[str, Any] = {}
    built: tuple[Task, Host] | None = None  # the task and one host, built once where some seed has scores
    for k, res in sorted(per_seed.items()):
        ctl = res["controllers"]
        names = [n for n in (plan_name(m) for m in reversed(PLAN_MULTIPLES)) if "search" in ctl.get(n, {})]
        if not names or readout not in ctl or "candidates" not in ctl[names[0]]["search"]:
            continue
        if built is None:
            made = preset(SUITE[task]).env.build_task()
            built = (made, made.make_host())
        cap = res["meta"].get("ppo_param_cap") or None  # 0: the controller had no cap
        scored = scored_plans(*built, ctl[names[0]]["search"]["candidates"])
        grown = most_grown(ctl[readout]) or None
        out[str(k)] = {
            "search": names[0], "plans_scored": len(scored), "cap": cap, "best": _best(scored),
            "best_within_cap": None if cap is None else _best([c for c in scored if c["params"] <= cap]),
            "controller_plan": grown,
            "controller_plan_scored": next((c for c in scored if c["plan"] == grown), None),
        }  # fmt: skip
    return out


def _best(scored: list[dict]) -> dict | None:
    """The plan with the highest score (the smaller on a tie)."""
    return max(scored, key=lambda c: (c["val_acc"], -c["params"]), default=None)


def revisions(meta: dict) -> dict[str, str | None]:
    """The git revisions (short) of one seed: ``train`` from the archive's ``train_git_rev`` or the run
    directory's ``provenance.json``, ``evaluate`` from the evaluation's meta (None where neither
    recorded one); and the machines, ``train_machine`` and ``evaluate_machine``, the same way (None
    before they were recorded, 2026-12-03)."""

    def short(rev: str | None) -> str | None:
        return rev[:7] if rev else None

    return {"train": short(train_revision(meta)), "evaluate": short(meta.get("git_rev")),
            "train_machine": train_machine(meta), "evaluate_machine": meta.get("machine")}  # fmt: skip


def status(tasks: Sequence[str], seeds: int, first_seed: int, runs: Path, archive: Path | None = None,
           episodes: int = EVAL_EPISODES) -> list[dict[str, Any]]:  # fmt: skip
    """Where each (task, seed) of a suite run stands, read from ``runs`` (nothing is run): its training
    (``updates`` done of ``of``, ``trained``; ``baselines_only`` where it trains none: ``--controller-from``),
    the searches cached in its run directory, which of its evaluations (the table's, the diagnosis, the
    plan within the cap) are written, and whether ``archive`` keeps it for an evaluation of ``episodes``
    hosts (``archived``: then it is done wherever its run directory is) or keeps its state in progress
    (``partial``)."""
    rows = []
    for task in tasks:
        of = preset(SUITE[task]).updates
        for k in range(first_seed, first_seed + seeds):
            run = runs / task / f"seed{k}"
            events = run / "events.jsonl"
            updates = len(list(read_events(events, "ppo_update"))) if events.exists() else 0
            ended = run_end(run) is not None
            searches = sorted(p.stem for p in (run / "search").glob("*.json")) if run.is_dir() else []
            evals = {name: (run / d / "results.json").exists()
                     for name, d in zip(("table", "diagnosis", "in_cap"), EVALUATIONS)}  # fmt: skip
            kept = archive is not None and load_seed(archive, task, k, episodes, final_data_seed(task, k))
            partial = archive is not None and partial_path(archive, task, k).is_dir()
            rows.append({"task": task, "seed": k, "updates": updates, "of": of, "trained": ended,
                         "baselines_only": baselines_only(run), "searches": searches, **evals,
                         "archived": bool(kept), "partial": partial})  # fmt: skip
    return rows


def status_lines(rows: list[dict[str, Any]]) -> list[str]:
    """:func:`status` as a table (searches by budget: ``tuned`` is ``heuristic_tuned``, ``cap 1x``
    ``plan_search_cap@1x``)."""
    out = ["| task | seed | training | searches cached | table | diagnosis | in cap | archived |",
           "|---|---:|---|---|---|---|---|---|"]  # fmt: skip
    mark = {True: "done", False: ""}
    for r in rows:
        if r.get("baselines_only"):
            train = "none (baselines only)"
        else:
            train = "done" if r["trained"] else (f"{r['updates']}/{r['of']} updates" if r["updates"] else "")
        short = (n.replace(HEURISTIC_TUNED, "tuned").replace(f"{PLAN_SEARCH_CAP}@", "cap ")
                 .replace("plan_search@", "") for n in r["searches"])  # fmt: skip
        searched = ", ".join(short)
        kept = "done" if r.get("archived") else ("in progress" if r.get("partial") else "")
        evals = " | ".join([*(mark[r[k]] for k in ("table", "diagnosis", "in_cap")), kept])
        out.append(f"| {r['task']} | {r['seed']} | {train} | {searched} | {evals} |")
    done = sum(r["table"] or r.get("archived", False) for r in rows)
    out.append(f"\n{done} of {len(rows)} (task, seed) evaluated.")
    return out


def planned_compute(task: str) -> int:
    """The learned controller's training compute on ``task`` from its preset (host epochs)."""
    return learned_compute(preset(SUITE[task]))


__all__ = [
    "BASELINES", "CAP_SEARCH", "CONTROLLERS", "EVALUATIONS", "EVAL_EPISODES", "FINAL_DATA_SEED",
    "FOSSILIZING", "IN_CAP", "LEARNED", "OWN_PLAN", "PLAN_MULTIPLES", "RECORDED_SETTINGS", "SUITE",
    "beside_name", "beside_readout", "carry_suite", "controller_settings", "controllers_for",
    "final_data_seed", "joined_correlations", "kept_elsewhere", "kept_has_cap", "most_grown", "plan_name",
    "planned_compute", "pool_task", "restore_suite", "revisions", "run_suite", "scored_plans", "search_view",
    "seed_fates", "status", "status_lines", "with_diagnostics", "with_kept_controller", "with_plan_in_cap",
]  # fmt: skip
