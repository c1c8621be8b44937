"""From each training seed's evaluation to one entry per controller: the mean over training seeds with a
95 % interval over them (Student-t of the per-seed means), the parameters added, the compute spent, what
the searches chose, what was grown, and what a diagnosis reads beside them (the fates of the seeds
germinated, the plans the largest search scored, the revisions and the controller's settings)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from esper.shell.config.presets import preset
from esper.shell.env.tasks import Task, seed_params
from esper.shell.eval.output import FLOP_COLUMNS
from esper.shell.eval.stats import grouped_mean_ci95, spearman
from esper.shell.eval.suite.archive import train_machine, train_revision
from esper.shell.eval.suite.tasks import LEARNED, ORACLE, PLAN_MULTIPLES, SUITE, beside_readout, plan_name
from esper.shell.host.hosts import Host


def summarize_runs(runs: list[dict[str, list[dict]]], per_run_correlations: list[Any]) -> tuple[dict, dict]:
    """Per controller, the mean test accuracy and parameters added over training runs (``runs[i][name]``:
    run i's evaluation episodes of controller ``name``) with Student-t 95 % intervals of the per-run
    means, and the Spearman correlations of return with test accuracy and objective over every episode."""
    controllers = {}
    for name in runs[0]:
        acc = [[e["final_test_acc"] for e in r[name]] for r in runs]
        params = [[e["params_added"] for e in r[name]] for r in runs]
        m, (lo, hi) = grouped_mean_ci95(acc)
        pm, (plo, phi) = grouped_mean_ci95(params)
        controllers[name] = {
            "test_acc_mean": m,
            "test_acc_ci95": [lo, hi],
            "params_added_mean": pm,
            "params_added_ci95": [plo, phi],
            "per_seed_test_acc": [float(np.mean(a)) for a in acc],
            "episodes": sum(len(a) for a in acc),
            "training_seeds": len(acc),
            "per_episode": [e for r in runs for e in r[name]],
        }
    pooled = [e for c in controllers.values() for e in c["per_episode"]]
    corr = {
        "return_vs_test_acc": spearman([e["return"] for e in pooled], [e["final_test_acc"] for e in pooled]),
        "return_vs_test_objective": spearman(
            [e["return"] for e in pooled], [e["test_objective"] for e in pooled]
        ),
        "per_run": list(per_run_correlations),
    }
    return controllers, corr


def shares(acc: float, params: float, static: float, grow_all: float, grow_all_params: float) -> tuple:
    """``(gain share, parameter share)`` of ``grow_all``'s: a controller's accuracy gain over ``static``
    as a share of ``grow_all``'s, and its parameters added as a share of ``grow_all``'s. Each None where
    ``grow_all`` gains nothing (or adds nothing)."""
    gain_all = grow_all - static
    return (
        (acc - static) / gain_all if gain_all > 0 else None,
        params / grow_all_params if grow_all_params > 0 else None,
    )


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


def joined_correlations(episodes: list[dict]) -> dict[str, Any]:
    """Spearman's rho of return against test accuracy and test objective over the episodes of two
    evaluations joined (the one against accuracy per parameter needs the host's size, which the
    episodes do not keep: None)."""
    ret = [e["return"] for e in episodes]
    return {"n_episodes": len(episodes),
            "return_vs_test_acc": spearman(ret, [e["final_test_acc"] for e in episodes]),
            "return_vs_test_acc_per_kparam": None,
            "return_vs_test_objective": spearman(ret, [e["test_objective"] for e in episodes])}  # fmt: skip


def scored_plans(task: Task, host: Host, candidates: list[dict]) -> list[dict]:
    """A plan search's ``candidates`` with what each plan adds to ``host`` (``params``), its score
    (``val_acc``, the mean over the ``episodes`` it ran on the training hosts)."""
    return [{"plan": c["plan"], "params": seed_params(task, host, c["plan"]), "val_acc": c["val_acc_mean"],
             "episodes": c["episodes"]} for c in candidates]  # fmt: skip


def best_plan(scored: list[dict]) -> dict | None:
    """The plan with the highest score (the smaller on a tie)."""
    return max(scored, key=lambda c: (c["val_acc"], -c["params"]), default=None)


def most_grown(controller: dict) -> str:
    """The plan a controller's evaluation grew most often (``""``: nothing grown)."""
    return next(iter(controller.get("grown_counts", {})), "")


#: The keys of a family's pre-check (issue 89), as its entry records them: the hosts it ran on, the per-host
#: oracle's points above the best constant plan, and the share of hosts whose best plan is not that one.
PRECHECK_KEYS = ("hosts", "oracle_minus_best_constant", "share_best_differs")


def family_fields(precheck: dict[str, Any]) -> dict[str, Any]:
    """What a family's task entry carries beside its rows: ``"family": true`` and its ``"precheck"`` (the
    :data:`PRECHECK_KEYS`, and any other record it keeps, such as the draws and hosts it used)."""
    missing = [k for k in PRECHECK_KEYS if k not in precheck]
    if missing:
        raise ValueError(f"a family's pre-check records {', '.join(PRECHECK_KEYS)}; "
                         f"missing {', '.join(missing)}")  # fmt: skip
    return {"family": True, "precheck": dict(precheck)}


def plans_per_seed(runs: list[dict[str, list[dict]]], name: str) -> list[list[str]] | None:
    """The plan each evaluation episode of ``name`` ended with (``""``: none), per training seed in order,
    episode by episode (one fresh host each); None where the episodes do not record it."""
    plans = [[e.get("grown") for e in r[name]] for r in runs]
    return None if any(p is None for seed in plans for p in seed) else plans


def pool_task(task: str, per_seed: dict[int, dict], precheck: dict[str, Any] | None = None) -> dict[str, Any]:
    """One task's entry from its training seeds' evaluations (``per_seed[k]``: seed k's ``results.json``):
    per controller the mean over seeds with a 95 % interval over seeds, each seed's mean
    (``per_seed_test_acc``, in ``training_seeds`` order, the same for every row), the parameters added, the
    host epochs spent (their mean over seeds), the FLOPs an evaluation episode spent (:func:`pooled_flops`),
    what the searches chose, and what it grew (``grown``: each
    plan's count of evaluation episodes over all seeds, most grown first; for the learned readouts and the
    per-host oracle, each episode's plan too, ``plans_per_seed``); per seed, the revisions that
    trained and evaluated it (``revisions``); and the controller's settings that depart from the task's preset
    (``controller_settings``, :func:`controller_settings`). A family's task (issue 89) passes its
    ``precheck`` and carries :func:`family_fields`."""
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
            **pooled_flops(entries),
            "training_seeds": seeds,
            "per_seed_test_acc": c["per_seed_test_acc"],
            "episodes": c["episodes"],
        }
        if n in (*LEARNED, ORACLE) or beside_readout(n):
            if (plans := plans_per_seed(runs, n)) is not None:
                controllers[n]["plans_per_seed"] = plans
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
        **({} if precheck is None else family_fields(precheck)),
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


def pooled_flops(entries: Sequence[dict]) -> dict[str, float | None]:
    """The FLOPs an evaluation episode of a controller spent, by kind (``train_flops_mean``,
    ``validation_flops_mean``, ``whatif_flops_mean``): the mean over the seeds' evaluations (each its
    episodes' mean); None where some seed's evaluation predates them."""
    out: dict[str, float | None] = {}
    for _, key in FLOP_COLUMNS:
        spent = [e.get(key) for e in entries]
        out[key] = None if any(v is None for v in spent) else float(np.mean(spent))
    return out


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
        if isinstance(cap, dict):  # a family: each member its own cap, the scores one member's (issue 102)
            cap = None
        scored = scored_plans(*built, ctl[names[0]]["search"]["candidates"])
        grown = most_grown(ctl[readout]) or None
        out[str(k)] = {
            "search": names[0], "plans_scored": len(scored), "cap": cap, "best": best_plan(scored),
            "best_within_cap": None if cap is None else best_plan([c for c in scored if c["params"] <= cap]),
            "controller_plan": grown,
            "controller_plan_scored": next((c for c in scored if c["plan"] == grown), None),
        }  # fmt: skip
    return out


def revisions(meta: dict) -> dict[str, str | None]:
    """The git revisions (short) of one seed: ``train`` from the archive's ``train_git_rev`` or the run
    directory's ``provenance.json``, ``evaluate`` from the evaluation's meta (None where neither
    recorded one); and the machines, ``train_machine`` and ``evaluate_machine``, the same way (None
    before they were recorded, 2026-12-03)."""

    def short(rev: str | None) -> str | None:
        return rev[:7] if rev else None

    return {"train": short(train_revision(meta)), "evaluate": short(meta.get("git_rev")),
            "train_machine": train_machine(meta), "evaluate_machine": meta.get("machine")}  # fmt: skip


__all__ = [
    "PRECHECK_KEYS", "RECORDED_SETTINGS", "best_plan", "controller_settings", "family_fields",
    "joined_correlations", "most_grown", "plans_per_seed", "pool_task", "pooled_flops",
    "revisions", "scored_plans", "search_view", "seed_fates", "shares", "summarize_runs",
]  # fmt: skip
