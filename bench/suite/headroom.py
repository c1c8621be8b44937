"""A suite task's headroom on its preset, with the lifecycle (issue 45): ``static``, ``grow_all`` and
``grow_all:BLUEPRINT`` (or any evaluate controller) on the same fresh hosts and data draw, with each
episode's accuracy kept so that two controllers can be compared host by host.

    python -m bench.suite.headroom retrieval --hosts 12 \\
        --controllers static,grow_all:conv_light,grow_all:conv_heavy \\
        --paired grow_all:conv_light-grow_all:conv_heavy --set lifecycle.max_epochs=60 --out h.json

Hosts are evaluation seeds ``--eval-seed + i`` (the same hosts for every controller); generated tasks
read data draw ``--data-seed`` (a fresh draw by default, not the one the task was designed on), fixed
datasets their test split. All the
hosts run side by side (``env.n_envs = --hosts``), one torch thread: the numbers repeat at the same
seeds. ``--set`` takes a task's own sizes only (``TASK_SIZE_FIELDS``), as a suite preset would.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from esper.shell.config.presets import PRESETS, TASK_SIZE_FIELDS, preset
from esper.shell.env.config import GENERATED_TASKS
from esper.shell.eval.episodes import compare_on_config
from esper.shell.eval.stats import mean_ci95

#: The fresh hosts and draw of the suite's first headroom measure (docs/suite.md).
EVAL_SEED, DATA_SEED = 500, 100000


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``["lifecycle.max_epochs=60", ...]`` -> overrides; only a task's own sizes are taken."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: write KEY=VALUE, e.g. lifecycle.max_epochs=60")
        if not key.startswith(TASK_SIZE_FIELDS):
            raise SystemExit(
                f"--set {key}: a headroom measure sets the task's own sizes only "
                f"(env.*, lifecycle.max_epochs)"
            )
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def paired(per_episode: dict[str, list[float]], a: str, b: str) -> dict[str, Any]:
    """``a`` minus ``b``, host by host: mean, 95 % interval, and on how many hosts ``a`` is ahead,
    level (within 0.05 points) or behind."""
    if a not in per_episode or b not in per_episode:
        raise SystemExit(f"--paired {a}-{b}: both must be among --controllers")
    d = [x - y for x, y in zip(per_episode[a], per_episode[b], strict=True)]
    m, (lo, hi) = mean_ci95(d)
    return {
        "mean": m,
        "ci95": [lo, hi],
        "ahead": sum(v > 0.05 for v in d),
        "level": sum(abs(v) <= 0.05 for v in d),
        "behind": sum(v < -0.05 for v in d),
        "per_episode": d,
    }


def measure(name: str, hosts: int, controllers: list[str], *, eval_seed: int = EVAL_SEED,
            data_seed: int = DATA_SEED, sets: dict[str, Any] | None = None,
            pairs: list[tuple[str, str]] = ()) -> dict[str, Any]:  # fmt: skip
    """The headroom record (what :func:`main` writes)."""
    sets = dict(sets or {})
    base = {"env.n_envs": hosts, "env.workers": 1, **sets}
    if preset(name, base).env.task in GENERATED_TASKS:
        base["env.data_seed"] = data_seed
    elif data_seed != DATA_SEED:
        raise SystemExit(f"--data-seed: {name} reads a fixed dataset, whose test split is the only "
                         "held-out draw")  # fmt: skip
    cfg = preset(name, base)
    t0 = time.perf_counter()
    res = compare_on_config(cfg, controllers, episodes=hosts, seed=eval_seed, show_progress=False)
    per_episode = {c: [float(r["final_test_acc"]) for r in s["per_episode"]]
                   for c, s in res["controllers"].items()}  # fmt: skip
    return {
        "what": "headroom on a suite preset with the lifecycle: test accuracy in %, 95 % Student-t "
        "intervals over the hosts (the same hosts for every controller)",
        "preset": name,
        "task": cfg.env.task,
        "hosts": hosts,
        "eval_seed": eval_seed,
        "data_seed": res["meta"]["data_seed"],
        "sets": sets,
        "max_epochs": cfg.lifecycle.max_epochs,
        "grow_all_blueprint": res["meta"]["grow_all_blueprint"],
        "controllers": {
            c: {
                "test_acc_mean": s["test_acc_mean"],
                "test_acc_ci95": s["test_acc_ci95"],
                "params_added_mean": s["params_added_mean"],
                "per_episode": per_episode[c],
            }
            for c, s in res["controllers"].items()
        },
        "paired": {f"{a}-{b}": paired(per_episode, a, b) for a, b in pairs},
        "seconds": time.perf_counter() - t0,
        "torch_threads": torch.get_num_threads(),
    }


def markdown(rec: dict[str, Any]) -> str:
    sets = f" {rec['sets']}" if rec["sets"] else ""
    lines = [f"{rec['preset']}: {rec['hosts']} hosts (evaluation seed {rec['eval_seed']}), data draw "
             f"{rec['data_seed']}, {rec['max_epochs']}-epoch episodes{sets}",
             "", "| controller | params added | test acc % | 95 % CI |", "|---|---:|---:|---|"]  # fmt: skip
    for c, s in rec["controllers"].items():
        lo, hi = s["test_acc_ci95"]
        acc = f"{s['test_acc_mean']:.1f} | [{lo:.1f}, {hi:.1f}]"
        lines.append(f"| `{c}` | {s['params_added_mean']:.0f} | {acc} |")
    for k, p in rec["paired"].items():
        lo, hi = p["ci95"]
        lines.append(f"\n{k}, host by host: {p['mean']:+.1f} [{lo:+.1f}, {hi:+.1f}]; ahead on {p['ahead']}, "
                     f"level on {p['level']}, behind on {p['behind']}")  # fmt: skip
    return "\n".join(lines)


def _revision() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, check=True)  # fmt: skip
        return out.stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.suite.headroom", description=__doc__.split("\n\n")[0])
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("--hosts", type=int, default=4, help="fresh hosts, run side by side (4)")
    ap.add_argument("--controllers", default="static,grow_all",
                    help="comma-separated evaluate controllers, e.g. static,grow_all,grow_all:conv_light")
    ap.add_argument("--eval-seed", type=int, default=EVAL_SEED,
                    help=f"the hosts' evaluation seed ({EVAL_SEED}, the suite's headroom hosts)")
    ap.add_argument("--data-seed", type=int, default=DATA_SEED,
                    help=f"generated data's draw ({DATA_SEED}; a fixed dataset reads its test split)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a task's own size (env.*, lifecycle.max_epochs), repeatable")
    ap.add_argument(
        "--paired",
        action="append",
        default=[],
        metavar="A-B",
        help="report A minus B host by host (controller names, e.g. grow_all:conv_light-static)",
    )
    ap.add_argument("--out", type=Path, help="write the record (JSON) here")
    args = ap.parse_args(argv)
    if args.hosts < 2:
        ap.error("--hosts: at least 2 (an interval needs two)")
    pairs = []
    for p in args.paired:
        a, sep, b = p.partition("-")
        if not sep:
            ap.error(f"--paired {p!r}: write A-B")
        pairs.append((a, b))
    torch.set_num_threads(1)
    rec = measure(args.preset, args.hosts, args.controllers.split(","), eval_seed=args.eval_seed,
                  data_seed=args.data_seed, sets=parse_sets(args.set), pairs=pairs)  # fmt: skip
    rec["revision"] = _revision()
    rec["machine"] = f"{platform.node()} ({platform.machine()}, torch {torch.__version__})"
    rec["date"] = time.strftime("%Y-%m-%d")
    rec["command"] = "python -m bench.suite.headroom " + " ".join(sys.argv[1:] if argv is None else argv)
    print(markdown(rec))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
