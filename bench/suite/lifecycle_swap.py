"""A lifecycle setting screened on controllers already trained (issue 45): each run's controllers evaluated
on the same fresh hosts under the lifecycle the run trained with and under that lifecycle with ``--set``
changes, paired host by host, with the episodes that end at chance counted in each.

    python -m bench.suite.lifecycle_swap RUNS/fb4 --tasks longrange,mnist1d --first-seed 300 --seeds 5 \\
        --set lifecycle.g2_evidence=what_if --episodes 20 --out bench/results/suite/DATE-vm-swap.json

``ARM_DIR/TASK/seedK`` is a training run (``config.json``, ``checkpoint.pt``). The hosts are the suite's
selection measure, evaluation seed :data:`EVAL_SEED` and data draw :data:`DATA_SEED` (a fixed dataset
reads its test split): never a host or draw a suite table reads. ``--eval-seed E --data-seed D
--plus-seed`` evaluates seed K on hosts of evaluation seed E + K and data draw D + K instead (fresh hosts
and draws for a rule's confirming run). ``--base-set`` changes both arms (the base is then the run's
lifecycle with those changes, the swapped arm that with ``--set`` on top), to compare two settings
neither of which the controller trained under. With ``--out`` the record is written after every run,
and a later call with the same settings keeps the runs it holds and measures only the others. The
controller was trained under the first lifecycle, so the swap shows what the setting does to a policy
that never saw it (zero-shot): a screen, which decides nothing. An episode *stays at chance* when its
test accuracy ends below chance (100 / classes) plus :data:`AT_CHANCE_MARGIN` points (a ``longrange``
host either learns the task or stays there, docs/experiment-log.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from esper.shell.common.checkpoint import load_checkpoint
from esper.shell.common.fields import from_dict
from esper.shell.config.presets import RunConfig
from esper.shell.env.config import GENERATED_TASKS
from esper.shell.eval.episodes import compare_on_config
from esper.shell.eval.stats import mean_ci95

#: The suite's selection hosts and draw (docs/suite.md): screens read these, suite tables never do.
EVAL_SEED, DATA_SEED = 500, 100000
#: Points above chance under which an episode's final test accuracy counts as staying at chance.
AT_CHANCE_MARGIN = 15.0


def parse_sets(items: list[str], *, required: bool = True) -> dict[str, Any]:
    """``["lifecycle.g2_evidence=what_if", ...]`` -> ``{field: value}`` of the lifecycle, each value
    parsed as the field's type (the swap changes the lifecycle only: a controller setting would change
    what the trained policy was trained for, and a task size the hosts)."""
    fields = {f.name: f for f in dataclasses.fields(RunConfig().lifecycle)}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        section, _, name = key.partition(".")
        if not sep or section != "lifecycle" or name not in fields:
            raise SystemExit(f"--set {item!r}: write lifecycle.FIELD=VALUE with a lifecycle field, "
                             f"e.g. lifecycle.g2_evidence=what_if")  # fmt: skip
        kind = type(getattr(RunConfig().lifecycle, name))
        if kind is bool:
            if value not in ("true", "false"):
                raise SystemExit(f"--set {key}: write true or false, got {value!r}")
            out[name] = value == "true"
        else:
            out[name] = kind(value)
    if required and not out:
        raise SystemExit("give at least one --set lifecycle.FIELD=VALUE")
    return out


def swap(run: Path, sets: dict[str, Any], controllers: list[str], episodes: int, *,
         eval_seed: int = EVAL_SEED, data_seed: int = DATA_SEED,
         base_sets: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """One run's ``controllers`` on ``episodes`` hosts under its own lifecycle with ``base_sets`` (``base``)
    and under that with ``sets`` (``swapped``): per controller and arm, each episode's final test
    accuracy."""
    cfg = from_dict(RunConfig, json.loads((run / "config.json").read_text()))
    checkpoint = load_checkpoint(run / "checkpoint.pt", map_location="cpu")
    env = dataclasses.replace(cfg.env, workers=1)
    if cfg.env.task in GENERATED_TASKS:
        env = dataclasses.replace(env, data_seed=data_seed)
    task = env.build_task()  # the same data for both arms: only the lifecycle differs
    base = dataclasses.replace(cfg.lifecycle, **(base_sets or {}))
    arms = {"base": base, "swapped": dataclasses.replace(base, **sets)}
    out: dict[str, Any] = {"task": cfg.env.task, "eval_seed": eval_seed, "controllers": {},
                           "data_seed": env.data_seed if cfg.env.task in GENERATED_TASKS else None,
                           "chance": 100.0 / task.n_classes}  # fmt: skip
    for arm, lifecycle in arms.items():
        arm_cfg = dataclasses.replace(cfg, env=env, lifecycle=lifecycle)
        res = compare_on_config(arm_cfg, controllers, episodes=episodes, seed=eval_seed,
                                checkpoint=checkpoint, show_progress=False, task=task)  # fmt: skip
        for name, s in res["controllers"].items():
            out["controllers"].setdefault(name, {})[arm] = {
                "test_acc": [float(r["final_test_acc"]) for r in s["per_episode"]],
                "params_added_mean": float(s["params_added_mean"]),
            }
    return out


def at_chance(accs: list[float], chance: float) -> int:
    """Episodes whose final test accuracy stayed under chance plus :data:`AT_CHANCE_MARGIN`."""
    return sum(a < chance + AT_CHANCE_MARGIN for a in accs)


def summary(records: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown rows, one per (run, controller): each arm's mean and episodes at chance, and the swap's
    paired difference host by host; then per controller the difference pooled over runs (the runs' means,
    a Student-t 95 % interval over them)."""
    lines = ["| run | controller | base | swapped | swapped - base | at chance (base, swapped) |",
             "|---|---|---:|---:|---:|---|"]  # fmt: skip
    pooled: dict[str, list[float]] = {}
    for run, rec in records.items():
        for name, arms in rec["controllers"].items():
            a, b = arms["base"]["test_acc"], arms["swapped"]["test_acc"]
            diff = sum(y - x for x, y in zip(a, b)) / len(a)
            pooled.setdefault(name, []).append(diff)
            counts = f"{at_chance(a, rec['chance'])}, {at_chance(b, rec['chance'])} of {len(a)}"
            means = f"{sum(a) / len(a):.1f} | {sum(b) / len(b):.1f}"
            lines.append(f"| {run} | `{name}` | {means} | {diff:+.2f} | {counts} |")
    for name, diffs in pooled.items():
        mean, (lo, hi) = mean_ci95(diffs)
        interval = f"**{mean:+.2f}** [{lo:+.2f}, {hi:+.2f}]"
        lines.append(f"| pooled over {len(diffs)} runs | `{name}` | | | {interval} | |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.suite.lifecycle_swap", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("arm_dir", type=Path, help="ARM_DIR holding TASK/seedK training runs")
    ap.add_argument("--tasks", required=True, help="comma-separated tasks")
    ap.add_argument("--first-seed", type=int, required=True)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--set", action="append", default=[], metavar="lifecycle.FIELD=VALUE", dest="sets")
    ap.add_argument("--base-set", action="append", default=[], metavar="lifecycle.FIELD=VALUE",
                    dest="base_sets", help="a change to both arms (the base too)")  # fmt: skip
    ap.add_argument("--controllers", default="ppo_greedy", help="comma-separated evaluate controllers")
    ap.add_argument("--episodes", type=int, default=20, help="fresh hosts per run and arm (20)")
    ap.add_argument("--eval-seed", type=int, default=EVAL_SEED, help=f"the hosts' seed ({EVAL_SEED})")
    ap.add_argument("--data-seed", type=int, default=DATA_SEED, help=f"generated data's draw ({DATA_SEED})")
    ap.add_argument("--plus-seed", action="store_true",
                    help="add each run's training seed K to --eval-seed and --data-seed")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None, help="write the record (JSON) here")
    args = ap.parse_args(argv)
    sets = parse_sets(args.sets)
    base_sets = parse_sets(args.base_sets, required=False)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    records: dict[str, dict[str, Any]] = {}
    settings = {"sets": sets, "base_sets": base_sets, "eval_seed": args.eval_seed,
                "data_seed": args.data_seed, "plus_seed": args.plus_seed, "episodes": args.episodes,
                "controllers": args.controllers}  # fmt: skip
    kept: dict[str, dict[str, Any]] = {}
    if args.out is not None and args.out.is_file():  # a stopped screen goes on where it stopped
        old = json.loads(args.out.read_text())
        if {k: old.get(k) for k in settings} != settings:
            raise SystemExit(f"{args.out}: a record with other settings is there; give another --out")
        kept = old["runs"]
    plus = " (+ K)" if args.plus_seed else ""
    where = f"evaluation seed {args.eval_seed}{plus}, data draw {args.data_seed}{plus}"

    def write() -> None:  # after every run: a stopped screen keeps what it measured
        if args.out is None:
            return
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "what": "trained controllers under their own lifecycle with the --base-set changes (base) and "
                    "with the --set changes on top (swapped), the same hosts; final test accuracy per "
                    "episode",
            **settings,
            "at_chance_margin": AT_CHANCE_MARGIN, "runs": records, "table": summary(records),
            "seconds": time.perf_counter() - t0, "torch_threads": torch.get_num_threads(),
        }, indent=1))  # fmt: skip

    for task in args.tasks.split(","):
        for k in range(args.first_seed, args.first_seed + args.seeds):
            run = args.arm_dir / task / f"seed{k}"
            if not (run / "checkpoint.pt").is_file():
                raise SystemExit(f"{run}: no trained run there (config.json and checkpoint.pt)")
            shift = k if args.plus_seed else 0
            key = f"{task}/seed{k}"
            if key in kept:
                records[key] = rec = kept[key]
                print(f"{key}: kept from {args.out}", flush=True)
                continue
            records[key] = rec = swap(run, sets, args.controllers.split(","), args.episodes,
                                      eval_seed=args.eval_seed + shift, data_seed=args.data_seed + shift,
                                      base_sets=base_sets)  # fmt: skip
            print("\n".join(summary({f"{task}/seed{k}": rec})[2:]), flush=True)
            write()
    against = f"each run's own with {base_sets}" if base_sets else "each run's own"
    print(f"\nlifecycle {sets} against {against}, {where}:")
    print("\n".join(summary(records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
