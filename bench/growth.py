"""Does growth pay, and does the learned controller grow better than the alternatives? Held-out numbers.

    python -m bench.growth                          # sweep + 5 training seeds + evaluation (see README)
    python -m bench.growth --stage sweep            # static vs grow_all with every blueprint only
    python -m bench.growth --stage learn --seeds 5 --episodes 10
    python -m bench.growth --stage learn --runs bench/runs/variant --train-args "--ppo.lr 1e-3"
    python -m bench.growth --stage learn --first-seed 5 --runs bench/runs/more   # seeds 5-9
    python -m bench.growth --pool A.json B.json     # one table from the learn stages of several files
    python -m bench.growth --compare BASE.json --against VARIANT.json   # paired, per training seed
    python -m bench.growth --stage plans --seeds 5 --learned LEARN.json   # fixed plans on those hosts

Three stages, each on the embedded default (``python -m esper.shell.run``'s preset):

1. **sweep** — ``static`` and ``grow_all:<blueprint>`` for every blueprint of the host family on
   ``--sweep-episodes`` fresh hosts (evaluation seeds; the same hosts for every controller). Shows the
   default task's headroom (the bar: the best fixed schedule beats the static host by >= 15 points of
   test accuracy) and which blueprint ``grow_all`` should grow (it must be the one
   :data:`esper.shell.baselines.simple.GROW_ALL_BLUEPRINT` names).
2. **placement** — fixed placements (``grow:b0=conv_heavy+b2=depthwise``: only those slots, each with
   its blueprint) on the same hosts as the sweep: where growth pays, and the best accuracy a schedule
   reaches for a given number of added parameters (what a controller that beats ``grow_all`` on
   accuracy per parameter has to find).
3. **learn** — ``--seeds`` training runs of the default (``--seed k``), ``--jobs`` at a time, each then
   evaluated with ``python -m esper.shell.evaluate`` on ``--episodes`` fresh hosts of its own (evaluation
   seed ``1000 + k``) against ``static``, ``random``, ``heuristic`` and ``grow_all``. The 95 % intervals
   are over training seeds (Student-t of the per-seed means), so they include the spread between
   trained controllers, not only between episodes. ``--train-args`` trains a variant of the default
   (the run's own flags; give it its own ``--runs`` folder: finished runs there are kept, and a folder
   whose runs were trained with other flags is refused). ``--more-controllers ppo_mixed`` evaluates
   further readouts on the same hosts into each run's ``eval-more``; given to a finished stage, it
   evaluates only them.

``--stage plans`` trains nothing: it runs fixed schedules (``--plans``) on the learn stage's evaluation
hosts, seed by seed, and with ``--learned`` pairs the learned controllers of those seeds with each one.

Writes ``bench/results/<date>-<host>-growth.{md,json}`` and ``...-growth-*.png`` (test accuracy vs
parameters added; test accuracy over the training updates of every seed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.harness import machine_info
from esper.shell.baselines.simple import GROW_ALL_BLUEPRINT
from esper.shell.config.presets import preset
from esper.shell.eval.stats import grouped_mean_ci95, mean_ci95, spearman
from esper.shell.host.blueprints import BLUEPRINTS
from esper.shell.telemetry.events import read_events

ROOT = Path(__file__).resolve().parent
BASELINES = ("static", "random", "heuristic", "grow_all")


# --------------------------------------------------------------------------------------------- sweep
def sweep(episodes: int, seed: int) -> dict[str, Any]:
    family = preset("default").env.build_task().family
    out = _fixed_schedules(
        ["static"] + [f"grow_all:{b}" for b in BLUEPRINTS[family] if b != "noop"], episodes, seed
    )
    best = max((r for r in out["rows"] if r["controller"] != "static"), key=lambda r: r["test_acc_mean"])
    return {**out, "best": best["controller"], "grow_all_blueprint": GROW_ALL_BLUEPRINT[family]}


# ----------------------------------------------------------------------------------------- placement
#: The fixed placements the placement stage measures (cnn1d family): every slot alone with the best
#: blueprint, the cheaper blueprints in the first slot, and two- and three-seed mixes.
PLACEMENTS = (
    "grow:b0=conv_heavy", "grow:b1=conv_heavy", "grow:b2=conv_heavy",
    "grow:b0=conv_light", "grow:b0=depthwise",
    "grow:b0=conv_heavy+b1=depthwise", "grow:b0=conv_heavy+b2=depthwise",
    "grow:b0=conv_heavy+b2=conv_light", "grow:b0=conv_heavy+b1=conv_heavy",
    "grow:b0=conv_heavy+b2=conv_heavy",
    "grow:b0=conv_heavy+b1=depthwise+b2=depthwise", "grow_all",
)  # fmt: skip


def placement(episodes: int, seed: int) -> dict[str, Any]:
    return _fixed_schedules(["static", *PLACEMENTS], episodes, seed)


def _fixed_schedules(names: list[str], episodes: int, seed: int) -> dict[str, Any]:
    """``names`` (``static`` first) on the same ``episodes`` fresh hosts; gains paired with static's."""
    from esper.shell.evaluate import evaluate_config

    cfg = preset("default")
    torch.set_num_threads(cfg.torch_threads())  # as a run would: two env threads, one intra-op thread each
    t0 = time.perf_counter()
    res = evaluate_config(cfg, names, episodes=episodes, seed=seed, show_progress=True)
    static = res["controllers"]["static"]
    rows = []
    for name, s in res["controllers"].items():
        gains = [
            e["final_test_acc"] - b["final_test_acc"] for e, b in zip(s["per_episode"], static["per_episode"])
        ]
        gm, (glo, ghi) = mean_ci95(gains)  # paired: the same host seeds
        rows.append(
            {
                "controller": name,
                "test_acc_mean": s["test_acc_mean"],
                "test_acc_ci95": s["test_acc_ci95"],
                "gain_mean": gm,
                "gain_ci95": [glo, ghi],
                "params_added_mean": s["params_added_mean"],
                "fossilized_mean": s["n_fossilized_mean"],
            }
        )
    return {"episodes": episodes, "eval_seed": seed, "rows": rows, "seconds": time.perf_counter() - t0}


# --------------------------------------------------------------------------------------------- plans
#: The fixed plans the plans stage holds the learned controllers against by default: the cheapest
#: placement that met the efficiency target in the placement stage, blended as the fixed schedules blend
#: (LINEAR_ADD, FAST, alpha 1.0), then with the tempo and alpha target the learned controllers chose
#: most often, one at a time and together.
PLANS = (
    "grow:b0=conv_heavy", "grow:b0=conv_heavy@STANDARD", "grow:b0=conv_heavy@0.7",
    "grow:b0=conv_heavy@0.5", "grow:b0=conv_heavy@STANDARD@0.7",
)  # fmt: skip


def plans(
    names: list[str], seeds: int, episodes: int, first_seed: int = 0, learned_files: list[Path] | None = None,
    preset_name: str = "default", overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Fixed schedules ``names`` on the learn stage's evaluation hosts, without training anything: for
    training seed k (``first_seed`` on), the preset's config with ``seed`` k on the ``episodes`` hosts
    of evaluation seed ``1000 + k``, with ``static`` and ``grow_all`` beside them. Per schedule, the mean
    over seeds of each seed's mean test accuracy (Student-t 95 % interval over seeds), the parameters
    added, and the shares of ``grow_all``'s gain and parameters.

    ``learned_files``: learn-stage results files of those seeds (not pooled ones). Each learned
    controller is then paired with each schedule by training seed (learned minus schedule, the unit the
    seed's mean over its hosts). The files' episodes must be on the same host seeds; ``hosts`` says
    whether ``grow_all`` scored identically there, episode for episode (the same machine and code), and
    if not by how much its per-seed means differ (another CPU's float sums)."""
    from esper.shell.evaluate import evaluate_config

    if not names:
        raise ValueError("plans: no fixed schedule to measure")
    measured = ["static", "grow_all", *[n for n in names if n not in ("static", "grow_all")]]
    ks = list(range(first_seed, first_seed + seeds))
    t0 = time.perf_counter()
    episodes_by: dict[str, list[list[dict]]] = {n: [] for n in measured}
    for k in ks:
        cfg = preset(preset_name, {**(overrides or {}), "seed": k})
        torch.set_num_threads(cfg.torch_threads())  # as the learn stage's evaluation does
        res = evaluate_config(cfg, measured, episodes=episodes, seed=1000 + k, show_progress=True)
        for n in measured:
            episodes_by[n].append(res["controllers"][n]["per_episode"])
    seed_mean = lambda n, field: [float(np.mean([e[field] for e in eps])) for eps in episodes_by[n]]
    acc = {n: seed_mean(n, "final_test_acc") for n in measured}
    params = {n: seed_mean(n, "params_added") for n in measured}
    out: dict[str, Any] = {
        "training_seeds": ks, "episodes_per_seed": episodes, "preset": preset_name,
        "overrides": overrides or {}, "rows": plan_rows(acc, params),
        "per_episode": {n: [e for eps in episodes_by[n] for e in eps] for n in measured},
        "seconds": time.perf_counter() - t0,
    }  # fmt: skip
    if learned_files:
        out["learned"] = _against_learned(learned_files, ks, episodes_by, acc)
    return out


def plan_rows(acc: dict[str, list[float]], params: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Per controller (``static`` and ``grow_all`` among them), from its per-seed mean test accuracy and
    parameters added: the mean over seeds with a Student-t 95 % interval, and its shares of
    ``grow_all``'s gain over ``static`` (None where ``grow_all`` gains nothing) and of its parameters."""
    static = float(np.mean(acc["static"]))
    gain_all = float(np.mean(acc["grow_all"])) - static
    params_all = float(np.mean(params["grow_all"]))
    rows = []
    for n in acc:
        m, (lo, hi) = mean_ci95(acc[n])
        rows.append({
            "controller": n, "test_acc_mean": m, "test_acc_ci95": [lo, hi], "per_seed_test_acc": acc[n],
            "params_added_mean": float(np.mean(params[n])),
            "gain_share_of_grow_all": (m - static) / gain_all if gain_all > 0 else None,
            "params_share_of_grow_all": float(np.mean(params[n])) / params_all if params_all > 0 else None,
        })  # fmt: skip
    return rows


def _against_learned(files: list[Path], ks: list[int], episodes_by: dict[str, list[list[dict]]],
                     acc: dict[str, list[float]]) -> dict[str, Any]:  # fmt: skip
    by_seed, info = _arm(files, "learned")
    missing = [k for k in ks if k not in by_seed]
    if missing:
        raise ValueError(f"plans: the learned files hold no runs of training seed(s) {missing}")
    for i, k in enumerate(ks):
        hosts = lambda eps: [e["host_seed"] for e in eps]
        if hosts(by_seed[k]["grow_all"]) != hosts(episodes_by["grow_all"][i]):
            raise ValueError(f"plans: training seed {k}'s learned episodes ran on other hosts (another "
                             "--episodes, or evaluation seed?): nothing to pair")  # fmt: skip
    there = [[e["final_test_acc"] for e in by_seed[k]["grow_all"]] for k in ks]
    here = [[e["final_test_acc"] for e in eps] for eps in episodes_by["grow_all"]]
    seed_diff = [abs(float(np.mean(a)) - float(np.mean(b))) for a, b in zip(there, here)]
    ep_diff = [abs(a - b) for ta, he in zip(there, here) for a, b in zip(ta, he)]
    learned_names = [c for c in by_seed[ks[0]] if c not in BASELINES]
    plans_ = [n for n in acc if n not in ("static", "grow_all")]
    paired = {
        c: {n: _paired(acc[n], [float(np.mean([e["final_test_acc"] for e in by_seed[k][c]])) for k in ks])
            for n in plans_}
        for c in learned_names
    }  # fmt: skip
    from esper.shell.evaluate import PLAN_PREFIX, STYLE_SEP

    flat = lambda per_seed: [e for eps in per_seed for e in eps]
    bare = [n for n in plans_ if n.startswith(PLAN_PREFIX) and STYLE_SEP not in n]  # placements, no blend
    misses = {
        c: {n: split_by_placement(flat(by_seed[k][c] for k in ks), flat(episodes_by[n]),
                                  n.removeprefix(PLAN_PREFIX)) for n in bare}
        for c in learned_names
    }  # fmt: skip
    return {
        **info,
        "paired": paired,  # learned minus plan, per training seed ("variant_better": the learned one)
        "by_placement": misses,  # learned minus plan, episode by episode, split by holding the placement
        "hosts": {
            "identical": there == here,
            "grow_all_seed_mean_max_abs_diff": max(seed_diff),
            "grow_all_episode_median_abs_diff": float(np.median(ep_diff)),
        },
    }


def split_by_placement(learned: list[dict], plan: list[dict], placement: str) -> dict[str, Any]:
    """Where a learned controller's deficit against a fixed placement comes from. ``learned`` and
    ``plan`` are episodes on the same hosts, in the same order; ``placement`` is the plan's
    (``b0=conv_heavy+b2=depthwise``). Each learned episode's final host either holds every seed of the
    placement (``holds``) or not (``misses``); for each group: its episodes, the mean of learned minus
    plan over them, and that group's share of the mean over all episodes (``contribution``: the two
    contributions add up to ``mean``). ``misses["held"]`` counts what the missing hosts hold in the plan's
    slots instead (``b0=conv_small``, ``b0 empty``), most frequent first."""
    if [e["host_seed"] for e in learned] != [e["host_seed"] for e in plan]:
        raise ValueError("split_by_placement: the learned and planned episodes ran on other hosts")
    want = set(placement.split("+"))
    slots = sorted({w.split("=")[0] for w in want})
    groups: dict[str, list[float]] = {"holds": [], "misses": []}
    held: dict[str, int] = {}  # what the missing hosts hold in the plan's slots instead
    for e, p in zip(learned, plan):
        have = set(e["grown"].split("+")) if e["grown"] else set()
        hit = want <= have
        groups["holds" if hit else "misses"].append(e["final_test_acc"] - p["final_test_acc"])
        if not hit:
            there = {h.split("=")[0]: h for h in have}
            key = "+".join(there.get(s, f"{s} empty") for s in slots)
            held[key] = held.get(key, 0) + 1
    n = len(learned)
    out: dict[str, Any] = {"episodes": n, "mean": sum(groups["holds"] + groups["misses"]) / n}
    for g, d in groups.items():
        out[g] = {"episodes": len(d), "mean": float(np.mean(d)) if d else None, "contribution": sum(d) / n}
    out["misses"]["held"] = dict(sorted(held.items(), key=lambda kv: (-kv[1], kv[0])))
    return out


def plans_markdown(info: dict, planned: dict, command: str) -> str:
    ks = planned["training_seeds"]
    lines = [
        f"# Fixed plans on the learn stage's hosts, {info['date']}",
        "",
        f"`{command}` on {info.get('cpu', '?')} ({info.get('cpu_count', '?')} cores, torch "
        f"{info.get('torch', '?')}).",
        "",
        f"Training seeds {ks[0]}-{ks[-1]}: for seed k, the `{planned['preset']}` config with `--seed k` on "
        f"the {planned['episodes_per_seed']} hosts of evaluation seed 1000 + k (the hosts the learn stage "
        "scores seed k's controllers on). Nothing is trained. The 95 % intervals are over seeds (Student-t "
        "of the per-seed means). `@STANDARD`, `@0.7`: the tempo and alpha target the schedule blends with "
        "(otherwise FAST to 1.0).",
        "",
        "| controller | test acc % [95 % CI] | params added | share of grow_all's gain | of its params |",
        "|---|---|---:|---:|---:|",
    ]
    for r in planned["rows"]:
        share = lambda v: "" if v is None else f"{v:.2f}"
        lines.append(
            f"| {r['controller']} | {r['test_acc_mean']:.1f} [{r['test_acc_ci95'][0]:.1f}, "
            f"{r['test_acc_ci95'][1]:.1f}] | {r['params_added_mean']:.0f} | "
            f"{share(r['gain_share_of_grow_all'])} | {share(r['params_share_of_grow_all'])} |"
        )
    learned = planned.get("learned")
    if learned:
        h = learned["hosts"]
        lines += [
            "",
            f"## The learned controllers against the plans (paired by training seed; "
            f"{', '.join(f'`{f}`' for f in learned['files'])})",
            "",
            "`grow_all` scored identically here and in those files, episode for episode."
            if h["identical"]
            else "`grow_all` did not score identically here and in those files (another machine or code): "
            f"per-seed means differ by at most {h['grow_all_seed_mean_max_abs_diff']:.2f} points, episodes "
            f"by {h['grow_all_episode_median_abs_diff']:.2f} (median). The same hosts; the pairs carry that "
            "noise.",
            "",
            "| learned | plan | learned - plan, points [95 % CI] | learned better on |",
            "|---|---|---|---|",
        ]
        for c, by_plan in learned["paired"].items():
            for n, d in by_plan.items():
                lines.append(f"| {c} | {n} | {d['mean']:+.1f} [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}] | "
                             f"{d['variant_better']} of {len(ks)} |")  # fmt: skip
        split = [
            (c, n, d) for c, by_plan in learned.get("by_placement", {}).items() for n, d in by_plan.items()
        ]
        if split:
            lines += [
                "",
                "Episode by episode on the same hosts: learned minus plan where the learned final host "
                "holds the plan's placement and where it misses it; a group's share is its part of the mean "
                "over all episodes (the two add up to it).",
                "",
                "| learned | plan | all: mean | holds: episodes, mean, share | misses: episodes, mean, "
                "share |",
                "|---|---|---:|---|---|",
            ]
            fmt = lambda g: "none" if g["mean"] is None else (
                f"{g['episodes']}, {g['mean']:+.1f}, {g['contribution']:+.2f}")  # fmt: skip
            for c, n, d in split:
                lines.append(f"| {c} | {n} | {d['mean']:+.2f} | {fmt(d['holds'])} | {fmt(d['misses'])} |")
            lines += ["", "What the missing hosts hold in the plan's slots instead:", ""]
            for c, n, d in split:
                held = (
                    ", ".join(f"`{k}` {v}" for k, v in d["misses"].get("held", {}).items())
                    or "nothing missed"
                )
                lines.append(f"- {c} against {n}: {held}")
    lines += ["", f"{planned['seconds'] / 60:.1f} min."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------- learn
def _train(k: int, run_root: Path, extra: list[str]) -> tuple[Path, float]:
    run_dir = run_root / f"seed{k}"
    cmd = [
        sys.executable,
        "-m",
        "esper.shell.run",
        "--seed",
        str(k),
        "--run_dir",
        str(run_root),
        "--name",
        f"seed{k}",
        "--progress",
        "false",
        *extra,
    ]
    events = run_dir / "events.jsonl"
    done = [e for e in read_events(events, "run_end") if not e.get("interrupted")] if events.exists() else []
    if done and (run_dir / "checkpoint.pt").exists():  # finished: keep it (re-run the stage to re-evaluate)
        return run_dir, float(done[-1]["t"])
    if (run_dir / "checkpoint.pt").exists():  # an interrupted run: continue it
        cmd = [sys.executable, "-m", "esper.shell.run", "--resume", str(run_dir), "--progress", "false"]
    t0 = time.perf_counter()
    log = run_root / f"seed{k}.log"
    with log.open("w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode:
        raise RuntimeError(f"training seed {k} failed ({proc.returncode}); see {log}")
    return run_dir, time.perf_counter() - t0


def _evaluate(run_dir: Path, k: int, episodes: int, names: Sequence[str] = (), out: str = "eval") -> dict:
    """Evaluate training seed k's run on its hosts (evaluation seed 1000 + k): ``names`` (default:
    evaluate's default set) into ``RUN_DIR/out``, or the results already there if they hold them alike."""
    from esper.shell.evaluate import CONTROLLERS

    names = tuple(names) or CONTROLLERS
    saved = run_dir / out / "results.json"
    if saved.exists():  # already evaluated alike (same episodes, seed and controllers): keep it
        old = json.loads(saved.read_text())
        meta = old.get("meta", {})
        if (meta.get("episodes"), meta.get("eval_seed")) == (episodes, 1000 + k) and set(names) <= set(
            old.get("controllers", {})
        ):
            return old
    cmd = [
        sys.executable,
        "-m",
        "esper.shell.evaluate",
        str(run_dir),
        "--episodes",
        str(episodes),
        "--seed",
        str(1000 + k),
        "--controllers",
        ",".join(names),
        "--out",
        str(run_dir / out),
        "--no-progress",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)  # it sets the run's threads
    if proc.returncode:
        raise RuntimeError(f"evaluating {run_dir} failed:\n{proc.stderr[-2000:]}")
    return json.loads(saved.read_text())


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


def compare_markdown(info: dict, cmp: dict, command: str) -> str:
    arm = lambda a: f"`{a['train_args']}`" if a["train_args"] else "the default"
    files = lambda a: ", ".join(f"`{f}`" for f in a["files"])
    n, eps = len(cmp["training_seeds"]), cmp["base"]["episodes_per_seed"]
    lines = [
        f"# Paired comparison, {info['date']}",
        "",
        f"`{command}`",
        "",
        f"Base: {arm(cmp['base'])} ({files(cmp['base'])}). Variant: {arm(cmp['variant'])} "
        f"({files(cmp['variant'])}). Training seeds {', '.join(map(str, cmp['training_seeds']))}, "
        f"{eps} fresh hosts each; the unit is the training seed (its mean over its hosts).",
        "",
        "The baselines scored identically in both arms, episode for episode: the arms are paired on "
        "evaluation hosts as well as training seeds."
        if cmp["same_hosts"]
        else "The baselines did not score identically in both arms (another machine or code?): the arms "
        "are paired on training seed only, not on evaluation hosts.",
        "",
    ]
    for c, s in cmp["controllers"].items():
        d, p = s["test_acc_diff"], s["params_added_diff"]
        lines += [
            f"## {c}",
            "",
            "| training seed | base test acc % | variant | variant - base | base params | variant params |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for i, k in enumerate(cmp["training_seeds"]):
            lines.append(
                f"| {k} | {s['base_test_acc'][i]:.1f} | {s['variant_test_acc'][i]:.1f} | "
                f"{round(d['per_seed'][i], 1) + 0.0:+.1f} | {s['base_params_added'][i]:.0f} | "
                f"{s['variant_params_added'][i]:.0f} |"
            )
        lines += [
            "",
            f"Test accuracy, variant - base: {d['mean']:+.2f} points [95 % CI {d['ci95'][0]:+.2f}, "
            f"{d['ci95'][1]:+.2f}], sd {d['sd']:.2f}, t {d['t']:.2f} (df {n - 1}); the variant better on "
            f"{d['variant_better']} of {n} seeds, worse on {d['variant_worse']}. Parameters added, variant - "
            f"base: {p['mean']:+.0f} [{p['ci95'][0]:+.0f}, {p['ci95'][1]:+.0f}].",
            "",
        ]
    return "\n".join(lines) + "\n"


def learn(
    seeds: int,
    episodes: int,
    jobs: int,
    run_root: Path,
    train_args: str = "",
    first_seed: int = 0,
    more_controllers: Sequence[str] = (),
) -> dict[str, Any]:
    """``seeds`` training runs (seeds ``first_seed`` on), each evaluated on fresh hosts of its own.
    ``more_controllers`` (``ppo_mixed``) are evaluated on the same hosts besides evaluate's default set,
    into ``RUN_DIR/eval-more`` (so a finished stage can be given them later without re-evaluating the
    rest)."""
    if first_seed < 0:
        raise ValueError(f"learn: first_seed must be >= 0, got {first_seed}")
    run_root.mkdir(parents=True, exist_ok=True)
    marker = run_root / "train_args.json"  # finished runs are kept: never mix two variants in one folder
    if marker.exists() and (was := json.loads(marker.read_text())) != train_args:
        raise ValueError(
            f"the runs in {run_root} were trained with --train-args {was!r}, not {train_args!r}: "
            "give this variant its own --runs folder"
        )
    marker.write_text(json.dumps(train_args))
    extra = (["--env.workers", "1", "--threads", "1"] if jobs > 1 else []) + shlex.split(train_args)
    t0 = time.perf_counter()

    def one(k: int) -> tuple[int, Path, float, dict, float]:
        run_dir, train_s = _train(k, run_root, extra)
        results = _evaluate(run_dir, k, episodes)
        seconds = results["meta"]["seconds"]
        if more_controllers:
            more = _evaluate(run_dir, k, episodes, more_controllers, out="eval-more")
            results = {**results, "controllers": {**results["controllers"], **more["controllers"]}}
            seconds += more["meta"]["seconds"]
        return k, run_dir, train_s, results, seconds

    with ThreadPoolExecutor(max_workers=jobs) as workers:
        done = sorted(workers.map(one, range(first_seed, first_seed + seeds)))
    per_run = [r for _, _, _, r, _ in done]
    controllers, corr = summarize_runs(
        [{name: c["per_episode"] for name, c in r["controllers"].items()} for r in per_run],
        [r["correlations"] for r in per_run],
    )
    curves = {str(k): _learning_curve(run_dir) for k, run_dir, _, _, _ in done}
    return {
        "seeds": seeds,
        "episodes_per_seed": episodes,
        "jobs": jobs,
        "controllers": controllers,
        "correlations": corr,
        **_verdicts(controllers),
        "learning_curves": curves,
        "train_seconds": [t for _, _, t, _, _ in done],
        "eval_seconds": [t for *_, t in done],
        "seconds": time.perf_counter() - t0,
        "run_root": str(run_root),
        "train_args": train_args,
        "first_seed": first_seed,
    }


def _learning_curve(run_dir: Path) -> dict[str, list[float]]:
    by_update: dict[int, list[dict]] = {}
    for ev in read_events(run_dir / "events.jsonl", "episode"):
        by_update.setdefault(ev["update"], []).append(ev)
    ups = sorted(by_update)
    mean = lambda k: [float(np.mean([e[k] for e in by_update[u]])) for u in ups]
    return {
        "update": ups,
        "test_acc": mean("final_test_acc"),
        "return": mean("return"),
        "params_added": mean("params_added"),
    }


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
        base = c["static"]["test_acc_mean"]
        gain_ppo, gain_all = ppo["test_acc_mean"] - base, c["grow_all"]["test_acc_mean"] - base
        share_gain = gain_ppo / gain_all if gain_all > 0 else float("nan")
        share_params = (
            ppo["params_added_mean"] / c["grow_all"]["params_added_mean"]
            if c["grow_all"]["params_added_mean"] > 0
            else float("nan")
        )
        out.update(
            gain_share_of_grow_all=share_gain,
            params_share_of_grow_all=share_params,
            efficient_vs_grow_all=share_gain >= 0.9 and share_params <= 0.6,
            beats_grow_all=ppo["test_acc_ci95"][0] > c["grow_all"]["test_acc_ci95"][1],
        )
    return out


# ------------------------------------------------------------------------------------------- writing
def _plots(out: Path, stem: str, learned: dict | None) -> list[str]:
    if not learned:
        return []
    from esper.shell.evaluate import COLORS, finish_figure, new_figure, plot_acc_vs_params

    unit = "runs" if learned.get("pooled_from") else "seeds"
    title = f"{learned['seeds']} training {unit} x {learned['episodes_per_seed']} fresh hosts each"
    files = [plot_acc_vs_params(learned, out / f"{stem}-acc-vs-params.png", title=title).name]

    fig, ax = new_figure((7.0, 4.0))
    for k, curve in learned["learning_curves"].items():
        ax.plot(curve["update"], curve["test_acc"], alpha=0.8, label=f"seed {k}")
    for name in ("static", "grow_all"):
        if name in learned["controllers"]:
            ax.axhline(
                learned["controllers"][name]["test_acc_mean"], ls="--", color=COLORS.get(name), label=name
            )
    ax.set_xlabel("PPO update")
    ax.set_ylabel("test accuracy of the update's final hosts (%)")
    files.append(finish_figure(fig, ax, out / f"{stem}-learning.png", legend_size=7, ncol=2).name)
    return files


def _ci(s: dict, key: str = "test_acc") -> str:
    lo, hi = s[f"{key}_ci95"]
    return f"{s[f'{key}_mean']:.1f} [{lo:.1f}, {hi:.1f}]"


def _schedule_table(rows: list[dict]) -> list[str]:
    out = [
        "| controller | test acc % [95 % CI] | gain over static [95 % CI] | params added | fossilized |",
        "|---|---|---|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['controller']} | {_ci(r)} | {_ci(r, 'gain')} | {r['params_added_mean']:.0f} | "
            f"{r['fossilized_mean']:.1f} |"
        )
    return out


def _frontier(rows: list[dict]) -> list[str]:
    """What a schedule must reach to meet the efficiency target, and which measured ones do."""
    by = {r["controller"]: r for r in rows}
    if "grow_all" not in by or "static" not in by:
        return []
    gain_all, params_all = by["grow_all"]["gain_mean"], by["grow_all"]["params_added_mean"]
    lines = [
        "",
        f"`grow_all` gains {gain_all:.1f} points for {params_all:.0f} parameters. Share of that gain and of "
        "those parameters for each placement (target: >= 90 % of the gain with <= 60 % of the parameters):",
        "",
        "| placement | gain share | params share | meets it |",
        "|---|---:|---:|---|",
    ]
    for r in rows:
        if r["controller"] in ("static", "grow_all"):
            continue
        g, q = r["gain_mean"] / gain_all, r["params_added_mean"] / params_all
        meets = "yes" if g >= 0.9 and q <= 0.6 else "no"
        lines.append(f"| {r['controller']} | {g:.2f} | {q:.2f} | {meets} |")
    return lines


def _seed_span(m: dict) -> str:
    """The seeds of a pooled file's entry, e.g. ', training seeds 5-9' ('' where not recorded)."""
    if "first_seed" not in m:
        return ""
    first, last = m["first_seed"], m["first_seed"] + m["runs"] - 1
    return f", training seed {first}" if first == last else f", training seeds {first}-{last}"


def markdown(info: dict, swept: dict | None, learned: dict | None, plots: list[str], command: str,
             placed: dict | None = None) -> str:  # fmt: skip
    pooled = (learned or {}).get("pooled_from")
    lines = [
        f"# Growth results, {info['date']}",
        "",
        f"`{command}`: the runs of {len(pooled)} results files (below)."
        if pooled
        else f"`{command}` on {info.get('cpu', '?')} "
        f"({info.get('cpu_count', '?')} cores, torch {info.get('torch', '?')}).",
        "",
    ]
    if swept:
        lines += [
            f"## Headroom: fixed schedules vs the static host ({swept['episodes']} fresh hosts, paired)",
            "",
        ]
        lines += _schedule_table(swept["rows"])
        lines += [
            "",
            f"Best schedule: `{swept['best']}`; `grow_all` grows `{swept['grow_all_blueprint']}`.",
            "",
        ]
    if placed:
        lines += [
            f"## Where growth pays: fixed placements ({placed['episodes']} fresh hosts, paired)",
            "",
            "`grow:b0=conv_heavy+b2=depthwise` grows only those slots, each with its blueprint, as fast as "
            "the gates allow (slot order, one germination per epoch).",
            "",
            *_schedule_table(placed["rows"]),
            *_frontier(placed["rows"]),
            "",
        ]
    if learned:
        v = learned["verdict"]
        unit = "runs" if pooled else "seeds"
        lines += [
            f"## The learned controller ({learned['seeds']} training {unit} x "
            f"{learned['episodes_per_seed']} fresh hosts each; 95 % CI over training {unit})",
            "",
            *(
                [f"Trained with `{learned['train_args']}` on top of the default.", ""]
                if learned.get("train_args")
                else []
            ),
            *(
                [
                    "Pooled: each file's runs count as training runs of their own (a training seed run on "
                    "another machine follows another trajectory; every run is evaluated on its training "
                    "seed's hosts). "
                    + "; ".join(
                        f"`{m['file']}`: {m['runs']} runs{_seed_span(m)} on {m['cpu']} ({m['cpu_count']} "
                        f"cores, torch {m['torch']}, git {m['git']})"
                        for m in pooled
                    )
                    + ".",
                    "",
                ]
                if pooled
                else []
            ),
            "| controller | test acc % [95 % CI] | params added [95 % CI] | per-seed means |",
            "|---|---|---|---|",
        ]
        for name, s in learned["controllers"].items():
            per = ", ".join(f"{a:.1f}" for a in s["per_seed_test_acc"])
            lines.append(f"| {name} | {_ci(s)} | {_ci(s, 'params_added')} | {per} |")
        corr = learned["correlations"]
        fmt = lambda v: ", ".join(
            f"{k} = {val:.2f}" if isinstance(val, float) else f"{k} = {val}" for k, val in v.items()
        )
        from esper.shell.evaluate import PPO_READOUTS

        greedy, mixed = learned.get("verdict_greedy"), learned.get("verdict_mixed")
        shown = ("ppo", "ppo_greedy", *(("ppo_mixed",) if mixed else ()))
        lines += [
            "",
            "; ".join(f"`{name}` {PPO_READOUTS[name][1]}" for name in shown)
            + ". Targets (ppo): "
            + fmt(v)
            + "."
            + (f" Targets (ppo_greedy): {fmt(greedy)}." if greedy else "")
            + (f" Targets (ppo_mixed): {fmt(mixed)}." if mixed else ""),
            "",
            f"Spearman correlation of the episode return with the final test accuracy over all evaluation "
            f"episodes: {corr['return_vs_test_acc']:.3f}; with the held-out objective: "
            f"{corr['return_vs_test_objective']:.3f}.",
            "",
            f"Training took {np.median(learned['train_seconds']) / 60:.1f} min per seed (median, "
            + ("over the machines" if pooled else f"{learned['jobs']} at a time")
            + f"), evaluation {np.median(learned['eval_seconds']) / 60:.1f} min per "
            f"seed; {(sum(learned['train_seconds']) + sum(learned['eval_seconds'])) / 60:.1f} min of "
            "training and evaluation in all.",
            "",
        ]
    lines += [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def command_line(argv: list[str]) -> str:
    """The command a results file says it came from, quoted so that it can be pasted into a shell."""
    return "python -m bench.growth " + shlex.join(argv)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.growth", description=__doc__.split("\n\n")[0])
    p.add_argument("--stage", choices=("all", "sweep", "placement", "learn", "plans"), default="all")
    p.add_argument("--seeds", type=int, default=5, help="training seeds (default 5)")
    p.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="the learn stage trains seeds first_seed .. first_seed + seeds - 1 (0); pool batches of seeds "
        "with --pool",
    )
    p.add_argument("--episodes", type=int, default=10, help="evaluation episodes per training seed (10)")
    p.add_argument("--sweep-episodes", type=int, default=10, help="fresh hosts per sweep controller (10)")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="training runs at a time (default 1: a run keeps both cores busy with its two env "
        "threads; two runs of one thread each took ~2x longer in total on the 2-core VM)",
    )
    p.add_argument(
        "--train-args",
        default="",
        help='flags for every training run of the learn stage, e.g. "--ppo.lr 1e-3" (default: none, '
        "the embedded default)",
    )
    p.add_argument(
        "--more-controllers",
        default="",
        help="the learn stage evaluates these too, on the same hosts (e.g. ppo_mixed); re-run a finished "
        "stage with them to add them without re-evaluating the rest",
    )
    p.add_argument("--runs", type=Path, default=ROOT / "runs" / "growth", help="where the training runs go")
    p.add_argument("--out", type=Path, default=ROOT / "results")
    p.add_argument(
        "--pool",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="pool the learn stages of these results files (runs of one variant, e.g. on two machines) "
        "into one table; trains and evaluates nothing",
    )
    p.add_argument(
        "--compare",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="the base arm of a paired comparison (learn-stage results files of one variant, e.g. seeds "
        "0-4 and 5-9); with --against; trains and evaluates nothing",
    )
    p.add_argument("--against", type=Path, nargs="+", metavar="JSON", help="the variant arm of --compare")
    p.add_argument(
        "--plans",
        default=",".join(PLANS),
        help="the plans stage's fixed schedules, comma-separated (default: " + ",".join(PLANS) + ")",
    )
    p.add_argument(
        "--learned",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="with --stage plans: learn-stage results files of the same seeds, whose controllers are paired "
        "with each plan",
    )
    p.add_argument(
        "--tag",
        default="",
        help="appended to the results files' names (e.g. replay-blend: ...-growth-learn-replay-blend.md)",
    )
    args = p.parse_args(argv)
    if args.tag and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.tag):
        p.error(f"--tag {args.tag!r}: letters, digits, '.', '_' and '-' only (it goes into file names)")
    tag = f"-{args.tag}" if args.tag else ""
    if bool(args.compare) != bool(args.against):
        p.error("--compare and --against go together: the base arm's files and the variant arm's")
    command = command_line(argv if argv is not None else sys.argv[1:])
    info = machine_info(torch.device("cpu"))
    info["date"] = dt.date.today().isoformat()
    if args.compare:
        cmp = compare(args.compare, args.against)
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"{info['date']}-compare-growth-learn{tag}"
        (args.out / f"{stem}.md").write_text(compare_markdown(info, cmp, command.strip()))
        (args.out / f"{stem}.json").write_text(json.dumps({"machine": info, "compare": cmp}, indent=1))
        print((args.out / f"{stem}.md").read_text())
        return 0
    if args.pool:
        learned = pool(args.pool)
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"{info['date']}-pooled-growth-learn{tag}"
        plots = _plots(args.out, stem, learned)
        (args.out / f"{stem}.md").write_text(markdown(info, None, learned, plots, command.strip()))
        (args.out / f"{stem}.json").write_text(json.dumps({"machine": info, "learn": learned}, indent=1))
        print((args.out / f"{stem}.md").read_text())
        return 0
    if args.learned and args.stage != "plans":
        p.error("--learned goes with --stage plans")
    if args.stage == "plans":
        planned = plans([n.strip() for n in args.plans.split(",") if n.strip()], args.seeds, args.episodes,
                        args.first_seed, args.learned)  # fmt: skip
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"{info['date']}-{info.get('host', 'host')}-growth-plans{tag}"
        (args.out / f"{stem}.md").write_text(plans_markdown(info, planned, command.strip()))
        (args.out / f"{stem}.json").write_text(json.dumps({"machine": info, "plans": planned}, indent=1))
        print((args.out / f"{stem}.md").read_text())
        return 0
    swept = sweep(args.sweep_episodes, seed=500) if args.stage in ("all", "sweep") else None
    placed = placement(args.sweep_episodes, seed=500) if args.stage in ("all", "placement") else None
    more = [n.strip() for n in args.more_controllers.split(",") if n.strip()]
    learned = (
        learn(args.seeds, args.episodes, args.jobs, args.runs, args.train_args, args.first_seed, more)
        if args.stage in ("all", "learn")
        else None
    )
    args.out.mkdir(parents=True, exist_ok=True)
    stem = (
        f"{info['date']}-{info.get('host', 'host')}-growth"
        + ("" if args.stage == "all" else f"-{args.stage}")
        + tag
    )
    plots = _plots(args.out, stem, learned)
    (args.out / f"{stem}.md").write_text(markdown(info, swept, learned, plots, command.strip(), placed))
    (args.out / f"{stem}.json").write_text(
        json.dumps({"machine": info, "sweep": swept, "placement": placed, "learn": learned}, indent=1)
    )
    print((args.out / f"{stem}.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
