"""Keeping a seed at its HOLDING deadline by its validation loss (issue 104 item 3): ``lifecycle.keep_by``
``either`` against ``accuracy`` (the default), paired on the same fresh hosts.

Each arm is a suite task's preset with the fourth run's flags (no cap, no budget) and only ``keep_by``
changed (:data:`ARMS`), written as a run directory's ``config.json`` (``OUT/TASK-ARM/``), so that
``python -m esper.shell.evaluate OUT/TASK-ARM --controllers random,heuristic --episodes N --seed S
--data-seed D --threads 1`` runs the same episodes (the same host seeds, data and controller seeds: this
script runs them through the same :func:`esper.shell.eval.runner.run_hosts`). It also records what the
command does not: each host's final validation loss, and every seed that reached its HOLDING deadline,
with its accuracy contribution, its loss contribution and whether it was kept (the controller is wrapped
by :class:`DeadlineLog`, which reads the slot state the controller acts on and changes nothing).

    python -m bench.keep_by_loss run --task mnist1d --hosts 16 --seed 10400 --data-seed 104000 --out DIR
    python -m bench.keep_by_loss judge DIR/*.json --md OUT.md --json OUT.json

``run`` adds to ``DIR/TASK.json`` (an arm and controller already there is not run again). ``judge`` reads
the rule written before the run (docs/experiment-log.md, "Keeping a seed by its validation loss").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from esper.core.spec import Stage
from esper.shell.common.fields import from_dict, to_dict
from esper.shell.common.revision import git_revision
from esper.shell.common.seeding import eval_host_seeds
from esper.shell.config.presets import RunConfig, config_hash, preset
from esper.shell.env.config import GENERATED_TASKS
from esper.shell.eval.controllers import make_controller
from esper.shell.eval.runner import run_hosts
from esper.shell.eval.stats import mean_ci95

TASKS = ("mnist1d", "mnist1d_deep", "longrange", "digits_shallow", "recall")
CONTROLLERS = ("random", "heuristic")
#: The fourth suite run's flags (every task judged without the cap and the budget).
BASE = {"ppo.param_cap_share": 0.0, "reward.param_budget_share": 0.0}
#: The lifecycle of each arm, on top of the task's configuration.
ARMS: dict[str, dict[str, Any]] = {
    "off": {},  # keep_by accuracy: today's deadline
    "on": {"lifecycle.keep_by": "either"},  # also keep a seed that lowers the validation loss by >= 5 %
}


def arm_config(task: str, arm: str, data_seed: int | None) -> RunConfig:
    """The task's preset with the fourth run's flags, ``arm``'s lifecycle and the data draw."""
    extra = {} if data_seed is None or task not in GENERATED_TASKS else {"env.data_seed": data_seed}
    return preset(task, {**BASE, **ARMS[arm], **extra})


def write_run_dir(cfg: RunConfig, path: Path) -> RunConfig:
    """``path/config.json`` from ``cfg``, read back as the evaluation reads it."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
    return from_dict(RunConfig, json.loads((path / "config.json").read_text()))


class DeadlineLog:
    """A controller that acts as ``inner`` does and notes, at every step, each HOLDING seed whose deadline
    falls at this step's end (``epochs_in_stage + 1 >= holding_timeout``): env, slot, epoch, its alpha, its
    accuracy contribution (points), its loss contribution and the env's validation loss as blended. What
    became of it is read from the step's lifecycle events afterwards."""

    def __init__(self, inner: Any, holding_timeout: int, first_host: int) -> None:
        self._inner, self._timeout, self._first = inner, holding_timeout, first_host
        self.deadlines: list[dict] = []
        self._epoch = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def begin(self, n_envs: int) -> None:
        self._epoch = 0
        self._inner.begin(n_envs)

    def act(self, step) -> Any:
        self._epoch += 1
        s = step.slots
        due = (s["stage"] == int(Stage.HOLDING)) & (s["epochs_in_stage"] + 1 >= self._timeout)
        for e, k in due.nonzero().tolist():
            self.deadlines.append({
                "env": e, "slot": k, "epoch": self._epoch, "alpha": float(s["alpha"][e, k]),
                "contribution": float(s["contribution"][e, k]),
                "loss_contribution": float(s["loss_contribution"][e, k]),
                "val_loss": float(step.signals["val_loss"][e]),
            })  # fmt: skip
        return self._inner.act(step)


def run_arm(cfg: RunConfig, name: str, hosts: list[int], eval_seed: int) -> dict[str, list]:
    """``name``'s episodes on ``hosts`` under ``cfg``: per host its final test accuracy, validation loss and
    accuracy, parameters added, fossilized and removed seeds, and its deadline seeds."""
    task = cfg.env.build_task()
    logs: list[DeadlineLog] = []
    finals: list[Any] = []

    def make(env, batch: list[int]):
        inner = make_controller(
            name, cfg, env, checkpoint=None, seed=eval_seed + batch[0], host_seed=hosts[batch[0]]
        )
        logs.append(DeadlineLog(inner, cfg.lifecycle.holding_timeout, batch[0]))
        return logs[-1]

    def on_result(result) -> None:
        kept = {
            (e["epoch"], e["env"], e["slot"]) for e in result.lifecycle if e["kind"] == "timeout_fossilized"
        }
        for d in logs[len(finals)].deadlines:
            d["kept"] = (d["epoch"], d["env"], d["slot"]) in kept
        finals.append(result.final["val_loss"].tolist())

    recs = run_hosts(cfg, task, make, hosts, on_result=on_result)
    val_loss = [v for batch in finals for v in batch]
    deadlines: list[list[dict]] = [[] for _ in hosts]
    for log in logs:
        for d in log.deadlines:
            deadlines[log._first + d["env"]].append(d)
    keep = ("final_test_acc", "final_val_acc", "params_added", "n_fossilized", "n_pruned")
    return {k: [r[k] for r in recs] for k in keep} | {"final_val_loss": val_loss, "deadlines": deadlines}


def run(task: str, hosts: int, seed: int, data_seed: int | None, out: Path, controllers: list[str]) -> dict:
    path = out / f"{task}.json"
    doc = json.loads(path.read_text()) if path.is_file() else {"task": task, "arms": {}}
    meta = {"hosts": hosts, "seed": seed, "data_seed": data_seed if task in GENERATED_TASKS else None}
    if any(doc.get("meta", {}).get(k) not in (None, v) for k, v in meta.items()):
        raise SystemExit(f"{path}: holds another run's hosts ({doc['meta']}); give another --out")
    doc["meta"] = {**meta, "machine": os.environ.get("ESPER_MACHINE", "VM, AMD EPYC, 2 cores"),
                   "threads": torch.get_num_threads()}  # fmt: skip
    host_seeds = eval_host_seeds(seed, range(hosts))
    for arm in ARMS:
        cfg = write_run_dir(arm_config(task, arm, data_seed), out / f"{task}-{arm}")
        entry = doc["arms"].setdefault(arm, {})
        for name in controllers:
            if name in entry:
                continue
            t0 = time.perf_counter()
            entry[name] = run_arm(cfg, name, host_seeds, seed) | {
                "revision": git_revision(), "config_hash": config_hash(cfg), "lifecycle": ARMS[arm],
                "seconds": round(time.perf_counter() - t0, 1),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            }  # fmt: skip
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(doc, indent=1))
            acc = entry[name]["final_test_acc"]
            print(
                f"{task} {arm} {name}: test {sum(acc) / len(acc):.2f} in {entry[name]['seconds']} s",
                flush=True,
            )
    return doc


def _paired(a: list[float], b: list[float]) -> list[float]:
    return [float(x) - float(y) for x, y in zip(a, b, strict=True)]


def _deadline_counts(rec: dict, min_contribution: float) -> dict[str, int]:
    """The seeds that reached their deadline step: how many, how many paid in accuracy, how many were kept
    (``kept`` in the record is the deadline's keep, ``timeout_fossilized``; a seed that pays in accuracy is
    kept either way, by the controller's FOSSILIZE at that step or by the deadline, as the prune gate of
    every suite preset keeps PRUNE off it), and how many the deadline kept that paid in loss alone."""
    seeds = [d for host in rec["deadlines"] for d in host]
    pays_acc = [d["alpha"] > 0 and d["contribution"] >= min_contribution for d in seeds]
    return {
        "reached": len(seeds),
        "pays_in_accuracy": sum(pays_acc),
        "kept": sum(d["kept"] or p for d, p in zip(seeds, pays_acc)),
        "kept_by_loss_alone": sum(d["kept"] and not p for d, p in zip(seeds, pays_acc)),
    }


def judge(docs: list[dict], min_contribution: float = 1.0) -> dict:
    """Per task and controller: each arm's means, on minus off paired by host (test accuracy, final
    validation loss, parameters added) and the deadline seeds; the rule's verdict (module docstring)."""
    rows: dict[str, dict] = {}
    for d in docs:
        task, arms = d["task"], d["arms"]
        for name in sorted(set(arms.get("on", {})) & set(arms.get("off", {}))):
            on, off = arms["on"][name], arms["off"][name]
            row: dict[str, Any] = {"hosts": len(on["final_test_acc"])}
            for key in ("final_test_acc", "final_val_loss", "params_added"):
                diff = _paired(on[key], off[key])
                m, ci = mean_ci95(diff)
                row[key] = {
                    "off": sum(off[key]) / len(off[key]),
                    "on": sum(on[key]) / len(on[key]),
                    "diff": m,
                    "ci95": list(ci),
                    "identical_hosts": sum(x == 0 for x in diff),
                }
            row["deadlines"] = {"off": _deadline_counts(off, min_contribution),
                                "on": _deadline_counts(on, min_contribution)}  # fmt: skip
            rows.setdefault(task, {})[name] = row
    cells = [r for t in rows.values() for r in t.values()]
    worse = [(t, c) for t, r in rows.items() for c, x in r.items() if x["final_test_acc"]["ci95"][1] < 0 or
             x["final_test_acc"]["diff"] < -0.5]  # fmt: skip
    better = sorted(
        {
            t
            for t, r in rows.items()
            for x in r.values()
            if x["final_val_loss"]["ci95"][1] < 0 or x["final_test_acc"]["ci95"][0] > 0
        }
    )
    return {
        "tasks": rows,
        "worse": worse,
        "better_tasks": better,
        "worth_proposing": bool(cells) and not worse and len(better) >= 2 and len(rows) == len(TASKS),
    }


def _md(verdict: dict, docs: list[dict]) -> str:
    meta = docs[0]["meta"] if docs else {}
    revs = sorted({rec["revision"] for d in docs for a in d["arms"].values() for rec in a.values()})
    dates = sorted({rec["date"] for d in docs for a in d["arms"].values() for rec in a.values()})
    seconds = sum(rec["seconds"] for d in docs for a in d["arms"].values() for rec in a.values())
    lines = [
        "# Keeping a seed at its HOLDING deadline by validation loss (issue 104 item 3)",
        "",
        f"Machine: {meta.get('machine')}, {meta.get('threads')} torch thread. Revision {', '.join(revs)}; "
        f"{dates[0] if dates else ''} to {dates[-1] if dates else ''}; {seconds / 60:.1f} min of episodes.",
        f"Hosts: evaluation seed {meta.get('seed')}, data draw {meta.get('data_seed')} (digits_shallow its "
        "fixed test split), the same hosts in both arms. `off`: `lifecycle.keep_by accuracy` (the default); "
        "`on`: `lifecycle.keep_by either` (`g5_min_loss_drop` 0.05). Rule: docs/experiment-log.md, "
        '"Keeping a seed by its validation loss". `python -m bench.keep_by_loss judge`.',
        "",
        "| task | controller | hosts | test acc off | on | on - off [95 % CI] | val loss off | on "
        "| on - off [95 % CI] | params added on - off | deadline seeds off / on | kept there off / on "
        "| kept by loss alone (on) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task, by in verdict["tasks"].items():
        for name, r in by.items():
            a, v, p, dl = r["final_test_acc"], r["final_val_loss"], r["params_added"], r["deadlines"]
            lines.append(
                f"| {task} | {name} | {r['hosts']} | {a['off']:.2f} | {a['on']:.2f} | {a['diff']:+.2f} "
                f"[{a['ci95'][0]:+.2f}, {a['ci95'][1]:+.2f}] | {v['off']:.4f} | {v['on']:.4f} "
                f"| {v['diff']:+.4f} [{v['ci95'][0]:+.4f}, {v['ci95'][1]:+.4f}] | {p['diff']:+.0f} "
                f"| {dl['off']['reached']} / {dl['on']['reached']} "
                f"| {dl['off']['kept']} / {dl['on']['kept']} | {dl['on']['kept_by_loss_alone']} |"
            )
    lines += [
        "",
        f"Worse (test-accuracy interval below 0, or mean below -0.5): {verdict['worse'] or 'none'}. "
        f"Better (val-loss interval below 0 or test-accuracy interval above 0): "
        f"{', '.join(verdict['better_tasks']) or 'none'}. Worth proposing as a default by the rule: "
        f"{'yes' if verdict['worth_proposing'] else 'no'}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.keep_by_loss", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--task", required=True, choices=TASKS)
    r.add_argument("--hosts", type=int, default=16)
    r.add_argument("--seed", type=int, default=10400)
    r.add_argument("--data-seed", type=int, default=104000)
    r.add_argument("--controllers", default=",".join(CONTROLLERS))
    r.add_argument("--out", type=Path, required=True)
    j = sub.add_parser("judge")
    j.add_argument("files", nargs="+", type=Path)
    j.add_argument("--md", type=Path)
    j.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    if a.cmd == "run":
        torch.set_num_threads(1)
        run(a.task, a.hosts, a.seed, a.data_seed, a.out, [c for c in a.controllers.split(",") if c])
        return 0
    docs = [json.loads(f.read_text()) for f in a.files]
    docs.sort(key=lambda d: TASKS.index(d["task"]))
    verdict = judge(docs)
    md = _md(verdict, docs)
    print(md)
    if a.md:
        a.md.write_text(md)
    if a.json:
        a.json.write_text(json.dumps({"verdict": verdict, "runs": docs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
