"""From learn stages to tables: the per-controller summary over training runs (the suite's,
:func:`esper.shell.eval.suite.pooling.summarize_runs`), the issue's targets
(:func:`verdict`), pooling the learn stages of several results files (:func:`pool`) and the paired
comparison of two variants by training seed (:func:`compare`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from esper.shell.eval.stats import mean_ci95
from esper.shell.eval.suite.pooling import shares, summarize_runs

BASELINES = ("static", "random", "heuristic", "grow_all")
_MACHINE_KEYS = ("cpu", "cpu_count", "torch", "git")


def _runs(stage: dict[str, Any]) -> list[dict[str, list[dict]]]:
    """A learn stage's evaluation episodes split back into its training runs (run i's episodes of
    controller ``name``: ``_runs(stage)[i][name]``); the stage keeps them concatenated in run order."""
    n = stage["episodes_per_seed"]
    return [
        {name: c["per_episode"][i * n : (i + 1) * n] for name, c in stage["controllers"].items()}
        for i in range(stage["seeds"])
    ]


def pool(files: list[Path]) -> dict[str, Any]:
    """One learn stage from the learn stages of several results files (``bench.growth`` JSON): each
    file's training runs count as runs of their own. For runs of the same training seeds on other
    machines (another CPU or torch build makes another trajectory from the same seed). Refuses files
    whose runs were trained with other ``--train-args`` or evaluated on another number of episodes."""
    stages, machines = [], []
    for f in files:
        saved = json.loads(Path(f).read_text())
        if not saved.get("learn"):
            raise ValueError(f"pool: {f} has no learn stage")
        stages.append(saved["learn"])
        machines.append(saved.get("machine", {}))
    for f, s in zip(files[1:], stages[1:], strict=True):
        for key in ("train_args", "episodes_per_seed"):
            if s[key] != stages[0][key]:
                raise ValueError(
                    f"pool: {f} has {key}={s[key]!r}, {files[0]} {stages[0][key]!r}: only runs of one "
                    "variant, evaluated alike, can be pooled"
                )
    n = stages[0]["episodes_per_seed"]
    runs, per_run_corr, curves = [], [], {}
    for i, s in enumerate(stages):
        runs += _runs(s)
        per_run_corr += s["correlations"]["per_run"]
        curves.update({f"{i}:{k}": c for k, c in s["learning_curves"].items()})
    seen = [json.dumps(r, sort_keys=True) for r in runs]
    if len(set(seen)) < len(seen):
        raise ValueError("pool: one run's evaluation appears twice (a file given twice?): it counts once")
    controllers, corr = summarize_runs(runs, per_run_corr)
    return {
        "seeds": len(runs),
        "episodes_per_seed": n,
        "jobs": "mixed",
        "controllers": controllers,
        "correlations": corr,
        **_verdicts(controllers),
        "learning_curves": curves,
        "train_seconds": [t for s in stages for t in s["train_seconds"]],
        "eval_seconds": [t for s in stages for t in s["eval_seconds"]],
        "seconds": sum(s["seconds"] for s in stages),
        "run_root": [s["run_root"] for s in stages],
        "train_args": stages[0]["train_args"],
        "pooled_from": [
            {
                "file": Path(f).name,
                "runs": s["seeds"],
                "first_seed": s.get("first_seed", 0),
                **{k: m.get(k) for k in _MACHINE_KEYS},
            }
            for f, s, m in zip(files, stages, machines, strict=True)
        ],
    }


def _arm(files: list[Path], role: str) -> tuple[dict[int, dict[str, list[dict]]], dict[str, Any]]:
    """One arm of a paired comparison: per training seed, per controller, the seed's evaluation episodes.
    Refuses pooled files (name the files they were pooled from), files evaluated on other numbers of
    episodes, and a training seed that appears twice."""
    by_seed: dict[int, dict[str, list[dict]]] = {}
    n_eps, args = None, None
    for f in files:
        stage = json.loads(Path(f).read_text()).get("learn")
        if not stage:
            raise ValueError(f"compare: {f} has no learn stage")
        if stage.get("pooled_from"):
            raise ValueError(f"compare: {f} is pooled (its runs have no training seeds); give the files it "
                             "was pooled from")  # fmt: skip
        n = stage["episodes_per_seed"]
        if n_eps is not None and n != n_eps:
            raise ValueError(f"compare: {f} has {n} episodes per seed, the {role} arm's other files {n_eps}")
        if args is not None and stage["train_args"] != args:
            raise ValueError(f"compare: {f} was trained with {stage['train_args']!r}, the {role} arm's other "
                             f"files with {args!r}: one arm is one variant")  # fmt: skip
        n_eps, args = n, stage["train_args"]
        first = stage.get("first_seed", 0)  # files written before --first-seed trained seeds 0 on
        for k, run in enumerate(_runs(stage), start=first):
            if k in by_seed:
                raise ValueError(f"compare: training seed {k} appears twice in the {role} arm ({f})")
            by_seed[k] = run
    return by_seed, {"files": [Path(f).name for f in files], "train_args": args, "episodes_per_seed": n_eps}


def _paired(base: list[float], variant: list[float]) -> dict[str, Any]:
    d = np.asarray(variant, dtype=np.float64) - np.asarray(base, dtype=np.float64)
    m, (lo, hi) = mean_ci95(d)
    sd = float(d.std(ddof=1)) if d.size > 1 else float("nan")
    t = m / (sd / np.sqrt(d.size)) if d.size > 1 and sd > 0 else float("nan")
    return {"per_seed": d.tolist(), "mean": m, "ci95": [lo, hi], "sd": sd, "t": float(t),
            "variant_better": int((d > 0).sum()), "variant_worse": int((d < 0).sum())}  # fmt: skip


def compare(base_files: list[Path], variant_files: list[Path]) -> dict[str, Any]:
    """A paired comparison of two arms (``base`` and ``variant``: the learn stages of ``bench.growth``
    results files, one variant per arm, several files per arm for several batches of training seeds):
    the arms are paired on training seed (both must hold the same seeds), and per learned controller the
    variant-minus-base difference of each seed's mean test accuracy and parameters added, with its mean,
    Student-t 95 % interval over seeds, sd and t. ``same_hosts`` says whether every baseline controller
    (``static``, ``grow_all``, ...) scored identically, episode for episode, in both arms, that is whether
    the arms were also evaluated on the same hosts (the same machine and code); where not, the pairing
    is on training seed only."""
    base, base_info = _arm(base_files, "base")
    variant, variant_info = _arm(variant_files, "variant")
    if sorted(base) != sorted(variant):
        raise ValueError(f"compare: the arms hold other training seeds (base {sorted(base)}, variant "
                         f"{sorted(variant)}): a paired comparison needs the same seeds in both")  # fmt: skip
    if base_info["episodes_per_seed"] != variant_info["episodes_per_seed"]:
        raise ValueError("compare: the arms were evaluated on other numbers of episodes per seed")
    seeds = sorted(base)
    names = [c for c in base[seeds[0]] if c in variant[seeds[0]]]
    key = lambda e: (e["final_test_acc"], e["params_added"])
    same_hosts = all(
        [key(e) for e in base[k][c]] == [key(e) for e in variant[k][c]]
        for k in seeds for c in names if c in BASELINES
    )  # fmt: skip
    per_seed = lambda arm, c, field: [float(np.mean([e[field] for e in arm[k][c]])) for k in seeds]
    controllers = {}
    for c in names:
        if c in BASELINES:
            continue
        acc_b, acc_v = per_seed(base, c, "final_test_acc"), per_seed(variant, c, "final_test_acc")
        par_b, par_v = per_seed(base, c, "params_added"), per_seed(variant, c, "params_added")
        controllers[c] = {
            "base_test_acc": acc_b, "variant_test_acc": acc_v,
            "base_params_added": par_b, "variant_params_added": par_v,
            "test_acc_diff": _paired(acc_b, acc_v), "params_added_diff": _paired(par_b, par_v),
        }  # fmt: skip
    if not controllers:
        raise ValueError("compare: the arms share no learned controller (only baselines)")
    return {"training_seeds": seeds, "base": base_info, "variant": variant_info, "same_hosts": same_hosts,
            "controllers": controllers}  # fmt: skip


def _verdicts(c: dict[str, dict]) -> dict[str, Any]:
    """A learn stage's verdicts: the sampled readout's, and the greedy and mixed ones' where evaluated."""
    return {
        "verdict": verdict(c),
        "verdict_greedy": verdict(c, "ppo_greedy") if "ppo_greedy" in c else None,
        "verdict_mixed": verdict(c, "ppo_mixed") if "ppo_mixed" in c else None,
    }


def verdict(c: dict[str, dict], name: str = "ppo") -> dict[str, Any]:
    """The issue's targets, checked on the aggregated numbers of controller ``name``."""
    ppo = c[name]
    out: dict[str, Any] = {}
    for base in ("static", "random", "heuristic"):
        if base in c:
            out[f"beats_{base}"] = ppo["test_acc_ci95"][0] > c[base]["test_acc_ci95"][1]
    if "grow_all" in c and "static" in c:
        g = c["grow_all"]
        share_gain, share_params = (
            float("nan") if v is None else v
            for v in shares(ppo["test_acc_mean"], ppo["params_added_mean"], c["static"]["test_acc_mean"],
                            g["test_acc_mean"], g["params_added_mean"])
        )  # fmt: skip
        out.update(
            gain_share_of_grow_all=share_gain,
            params_share_of_grow_all=share_params,
            efficient_vs_grow_all=share_gain >= 0.9 and share_params <= 0.6,
            beats_grow_all=ppo["test_acc_ci95"][0] > c["grow_all"]["test_acc_ci95"][1],
        )
    return out
