"""Gradient-informed seeds against today's near-zero start, on fresh hosts (issue 91 item 5).

``python -m bench.grad_init --stage calibrate`` reads the slots' predicted decrease per parameter
(``grad_gain_rms``) on the default task's first training hosts under ``static`` and prints the median of
each epoch's largest from epoch 5 on: the value ``heuristic_gain``'s trigger was set to
(:data:`esper.shell.baselines.heuristic.GAIN_TRIGGER`). ``--stage reading`` runs ``static``, ``grow_all``
and ``heuristic`` on the same fresh evaluation hosts with the option off, on (``lifecycle.grad_init``, the
default scale 0.1) and on at the blueprints' own near-zero size (scale 0.01: the projection's direction
alone), and ``heuristic_gain`` with it on; each pair of conditions is compared host by host (final test
accuracy, mean validation accuracy over the episode, parameters added, the epoch each seed blended in),
with Student-t 95 % intervals, and written to ``OUT/<date>-vm-grad-init.{md,json}``. ``--stage training
--runs OFF_DIR ON_DIR`` reads two training runs of the default preset, one seed, with the option off and on
(``lifecycle.grad_init`` and ``lifecycle.grad_gain_features``): each trained controller, sampled and by its
most likely actions, on the reading's hosts, paired by host, added to that file pair.

One thread, the default preset's hosts one batch at a time (``env.workers 1``): a shared 2-core VM.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from esper.core.spec import HEADS
from esper.shell.baselines.heuristic import GAIN_TRIGGER
from esper.shell.common.revision import git_revision, machine
from esper.shell.common.seeding import eval_host_seeds
from esper.shell.config.presets import RunConfig, preset
from esper.shell.env.vecenv import VecEnv
from esper.shell.eval.controllers import make_controller
from esper.shell.eval.episodes import compare_on_config
from esper.shell.eval.runner import run_hosts
from esper.shell.eval.search import selection_host_seeds
from esper.shell.eval.stats import mean_ci95
from esper.shell.user.grow import load_run

#: The conditions: the lifecycle settings on top of the default preset.
CONDITIONS: dict[str, dict[str, Any]] = {
    "off": {},
    "on": {"lifecycle.grad_init": True},
    "on_direction": {"lifecycle.grad_init": True, "lifecycle.grad_init_scale": 0.01},
}
#: (condition, controller) pairs run, in order.
RUNS = (
    ("off", "static"), ("off", "grow_all"), ("off", "heuristic"),
    ("on", "static"), ("on", "grow_all"), ("on", "heuristic"), ("on", "heuristic_gain"),
    ("on_direction", "grow_all"), ("on_direction", "heuristic"),
)  # fmt: skip
#: The comparisons, each ``(treated, baseline)``, paired by host.
PAIRS = (
    (("on", "static"), ("off", "static")),
    (("on", "grow_all"), ("off", "grow_all")),
    (("on_direction", "grow_all"), ("off", "grow_all")),
    (("on", "heuristic"), ("off", "heuristic")),
    (("on_direction", "heuristic"), ("off", "heuristic")),
    (("on", "heuristic_gain"), ("off", "heuristic")),
    (("on", "heuristic_gain"), ("on", "heuristic")),
)
BLENDED = ("BLENDING", "HOLDING", "FOSSILIZED")


def config(condition: str) -> RunConfig:
    """``condition`` on the suite's configuration (preset ``mnist1d``: the hosts its committed results
    ran on; the default's hosts train on larger batches since issue 90)."""
    return preset("mnist1d", {"env.workers": 1, "threads": 1, **CONDITIONS[condition]})


def calibrate(hosts: int) -> dict[str, Any]:
    """The largest ``grad_gain_rms`` over the slots, per host and epoch, on the run's first ``hosts``
    training hosts under ``static``; the median from epoch 5 on."""
    cfg = config("on")
    seeds = selection_host_seeds(cfg, hosts)
    env = VecEnv(cfg.env, cfg.lifecycle, cfg.governor, seed=cfg.seed, reward=cfg.reward, gamma=cfg.ppo.gamma)
    best: list[list[float]] = [[] for _ in seeds]
    for start in range(0, hosts, env.n):
        chunk = seeds[start : start + env.n]
        ts = env.reset(0, host_seeds=chunk)
        static = make_controller("static", cfg, env, checkpoint=None, seed=0)
        static.begin(env.n)
        for t in range(cfg.lifecycle.max_epochs):
            rms = ts.obs.signals["slots", "grad_gain_rms"].amax(-1).tolist()
            for i, v in enumerate(rms):
                best[start + i].append(v)
            if t + 1 < cfg.lifecycle.max_epochs:
                out = static.act(ts.obs)
                ts = env.step(TensorDict({h: out[h, "action"] for h in HEADS}, batch_size=[env.n])).next
    env.close()
    late = [v for row in best for v in row[4:]]
    return {"host_seeds": seeds, "best_rms_by_epoch": best, "median_from_epoch_5": statistics.median(late),
            "quartiles_from_epoch_5": [float(q) for q in np.quantile(late, [0.25, 0.5, 0.75])]}  # fmt: skip


def run(condition: str, controller: str, episodes: int, seed: int) -> dict[str, Any]:
    """``controller`` on the evaluation hosts of ``seed`` under ``condition``: per host its record."""
    cfg = config(condition)
    task = cfg.env.build_task()
    blend: list[list[int | None]] = []

    def take(result) -> None:
        n = len(result.episodes)
        names = result.epochs[0]["slot_names"]
        for i in range(n):
            first = []
            for s in range(len(names)):
                hit = [ev["epoch"] for ev in result.epochs if ev["stage"][i][s] in BLENDED]
                first.append(hit[0] if hit else None)
            blend.append(first)

    def make(env, batch: list[int]):
        return make_controller(controller, cfg, env, checkpoint=None, seed=seed + batch[0])

    t0 = time.perf_counter()
    records = run_hosts(cfg, task, make, eval_host_seeds(seed, range(episodes)), on_result=take)
    wall = time.perf_counter() - t0
    rows = []
    for rec, first in zip(records, blend, strict=True):
        rows.append({
            "host_seed": rec["host_seed"], "final_test_acc": rec["final_test_acc"],
            "final_val_acc": rec["final_val_acc"], "mean_val_acc": float(np.mean(rec["val_acc_curve"])),
            "params_added": rec["params_added"], "n_fossilized": rec["n_fossilized"],
            "germinated_at": rec.get("germinated_at"), "blended_at": first,
        })  # fmt: skip
    return {"condition": condition, "controller": controller, "seconds": wall, "hosts": rows}


def training(run_dirs: list[Path], episodes: int, seed: int) -> dict[str, Any]:
    """Each run's controller (``ppo_greedy``, ``ppo``) on the evaluation hosts of ``seed``, with the run's
    own settings (its observation included); the second run minus the first, host by host."""
    out: dict[str, Any] = {"runs": []}
    for d in run_dirs:
        cfg, checkpoint = load_run(d)
        t0 = time.perf_counter()
        res = compare_on_config(cfg, ["ppo_greedy", "ppo"], episodes=episodes, seed=seed,
                                checkpoint=checkpoint, show_progress=False)  # fmt: skip
        lc, keep = cfg.lifecycle, ("host_seed", "final_test_acc", "params_added")
        out["runs"].append({
            "run_dir": str(d), "seed": cfg.seed, "updates": int(checkpoint["progress"]["update"]),
            "grad_init": lc.grad_init, "grad_gain_features": lc.grad_gain_features,
            "seconds": time.perf_counter() - t0,
            "controllers": {name: {"hosts": [{k: e[k] for k in keep} for e in c["per_episode"]]}
                            for name, c in res["controllers"].items()},
        })  # fmt: skip
    a, b = out["runs"]
    out["difference"] = {}
    for name in ("ppo_greedy", "ppo"):
        pairs = list(zip(b["controllers"][name]["hosts"], a["controllers"][name]["hosts"], strict=True))
        assert all(x["host_seed"] == y["host_seed"] for x, y in pairs)
        out["difference"][name] = {k: _ci([x[k] - y[k] for x, y in pairs])
                                   for k in ("final_test_acc", "params_added")}  # fmt: skip
    return out


def _ci(values: list[float]) -> dict[str, Any]:
    m, (lo, hi) = mean_ci95(values)
    return {"mean": m, "ci95": [lo, hi], "n": len(values)}


def _first_blend(row: dict) -> float | None:
    hits = [e for e in row["blended_at"] if e is not None]
    return float(min(hits)) if hits else None


def compare(a: dict, b: dict) -> dict[str, Any]:
    """``a`` minus ``b``, host by host (both on the same hosts, in order)."""
    pairs = list(zip(a["hosts"], b["hosts"], strict=True))
    assert all(x["host_seed"] == y["host_seed"] for x, y in pairs)
    out = {k: _ci([x[k] - y[k] for x, y in pairs])
           for k in ("final_test_acc", "mean_val_acc", "params_added", "n_fossilized")}  # fmt: skip
    both = [(_first_blend(x), _first_blend(y)) for x, y in pairs]
    both = [(x, y) for x, y in both if x is not None and y is not None]
    out["first_blend_epoch"] = _ci([x - y for x, y in both]) if both else None
    out["identical_test_acc_hosts"] = sum(x["final_test_acc"] == y["final_test_acc"] for x, y in pairs)
    return out


def _fmt(d: dict | None, digits: int = 1) -> str:
    if d is None:
        return "n/a"
    lo, hi = d["ci95"]
    return f"{d['mean']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def write(out: Path, results: dict[str, Any]) -> Path:
    stem = out / f"{results['date']}-vm-grad-init"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    runs = {(r["condition"], r["controller"]): r for r in results["runs"]}
    lines = [
        f"# Gradient-informed seeds on fresh hosts ({results['date']})", "",
        f"`python -m bench.grad_init --stage reading --episodes {results['episodes']} "
        f"--seed {results['seed']}` at {results['revision']}, on {results['machine']} (the project's 2-core "
        "VM, shared with other jobs while it ran: wall times are rough), one torch thread, the default "
        "preset (`env.workers 1`).", "",
        "## Each controller, by condition", "",
        "| condition | controller | test acc % [95 % CI] | mean val acc over the episode | params added | "
        "fossilized | wall s |",
        "|---|---|---|---|---:|---:|---:|",
    ]  # fmt: skip
    for (cond, ctl), r in runs.items():
        acc = _ci([h["final_test_acc"] for h in r["hosts"]])
        curve = _ci([h["mean_val_acc"] for h in r["hosts"]])
        lines.append(
            f"| {cond} | {ctl} | {acc['mean']:.1f} [{acc['ci95'][0]:.1f}, {acc['ci95'][1]:.1f}] | "
            f"{curve['mean']:.1f} | {np.mean([h['params_added'] for h in r['hosts']]):.0f} | "
            f"{np.mean([h['n_fossilized'] for h in r['hosts']]):.2f} | {r['seconds']:.0f} |"
        )
    lines += ["", "## Paired by host (treated minus baseline, 95 % CI)", "",
              "| treated | baseline | test acc (points) | mean val acc (points) | params added | first blend "
              "(epochs) | hosts with equal test acc |",
              "|---|---|---|---|---|---|---:|"]  # fmt: skip
    for c in results["comparisons"]:
        d = c["difference"]
        lines.append(
            f"| {' '.join(c['treated'])} | {' '.join(c['baseline'])} | {_fmt(d['final_test_acc'])} | "
            f"{_fmt(d['mean_val_acc'])} | {_fmt(d['params_added'], 0)} | {_fmt(d['first_blend_epoch'])} | "
            f"{d['identical_test_acc_hosts']} of {d['final_test_acc']['n']} |"
        )
    cal = results.get("calibration")
    if cal:
        q = cal["quartiles_from_epoch_5"]
        lines += ["", f"`heuristic_gain`'s trigger: {results['gain_trigger']} (predicted decrease per "
                  f"parameter); on {len(cal['host_seeds'])} training hosts under `static` the largest slot's "
                  f"reading from epoch 5 on had quartiles {q[0]:.4f} / {q[1]:.4f} / {q[2]:.4f}."]  # fmt: skip
    tr = results.get("training")
    if tr:
        lines += ["", "## One training run each, option off and on (the same seed)", "",
                  "`python -m esper.shell.run --seed S --threads 1 --env.workers 1` (the default preset), "
                  "and the same with `--lifecycle.grad_init true --lifecycle.grad_gain_features true`; each "
                  "run's controller on the hosts above, with the run's own settings.", "",
                  "| run | controller | test acc % [95 % CI] | params added |",
                  "|---|---|---|---:|"]  # fmt: skip
        for r in tr["runs"]:
            label = f"seed {r['seed']}, " + ("on" if r["grad_init"] else "off")
            for name, c in r["controllers"].items():
                acc = _ci([h["final_test_acc"] for h in c["hosts"]])
                lo, hi = acc["ci95"]
                lines.append(f"| {label} | {name} | {acc['mean']:.1f} [{lo:.1f}, {hi:.1f}] | "
                             f"{np.mean([h['params_added'] for h in c['hosts']]):.0f} |")  # fmt: skip
        lines += ["", "| controller | on minus off, test acc (points) | params added |", "|---|---|---|"]
        for name, d in tr["difference"].items():
            lines.append(f"| {name} | {_fmt(d['final_test_acc'])} | {_fmt(d['params_added'], 0)} |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return stem


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.grad_init", description=__doc__.split("\n\n")[0])
    p.add_argument("--stage", choices=("calibrate", "reading", "training"), default="reading")
    p.add_argument("--runs", type=Path, nargs=2, metavar=("OFF_DIR", "ON_DIR"), help="--stage training")
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--seed", type=int, default=9105)
    p.add_argument("--calibration-hosts", type=int, default=8)
    p.add_argument("--out", type=Path, default=Path("bench/results/growth"))
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    if a.stage == "training":
        path = sorted(a.out.glob("*-vm-grad-init.json"))[-1]
        results = json.loads(path.read_text())
        results["training"] = training(list(a.runs), results["episodes"], results["seed"])
        results["training"]["revision"] = git_revision()
        print(f"wrote {write(a.out, results)}.{{md,json}}")
        return 0
    cal = calibrate(a.calibration_hosts)
    print(f"calibration: median {cal['median_from_epoch_5']:.4f}, quartiles {cal['quartiles_from_epoch_5']}")
    if a.stage == "calibrate":
        return 0
    runs = []
    for cond, ctl in RUNS:
        runs.append(run(cond, ctl, a.episodes, a.seed))
        acc = np.mean([h["final_test_acc"] for h in runs[-1]["hosts"]])
        print(f"{cond:>13} {ctl:<15} test acc {acc:.2f}  ({runs[-1]['seconds']:.0f} s)", flush=True)
    by = {(r["condition"], r["controller"]): r for r in runs}
    comparisons = [{"treated": list(t), "baseline": list(b), "difference": compare(by[t], by[b])}
                   for t, b in PAIRS]  # fmt: skip
    results = {
        "date": date.today().isoformat(), "revision": git_revision(), "machine": machine(),
        "episodes": a.episodes, "seed": a.seed, "host_seeds": eval_host_seeds(a.seed, range(a.episodes)),
        "conditions": CONDITIONS, "gain_trigger": GAIN_TRIGGER, "calibration": cal,
        "runs": runs, "comparisons": comparisons,
    }  # fmt: skip
    a.out.mkdir(parents=True, exist_ok=True)
    print(f"wrote {write(a.out, results)}.{{md,json}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
