"""Lifecycle candidates against the network born at its final size (issue 103, item 2).

Each *arm* is a suite task's configuration (its preset, the fourth run's flags: no cap, no budget) with
only the lifecycle changed (:data:`ARMS`). On fresh evaluation hosts it runs ``grow_all`` under every arm,
and once per task ``born_big`` (the same plan at its final size from epoch 0: no lifecycle touches it)
and ``static``; and, for *what isolation was for*, a seed that is germinated in every slot, blended in
fully, held and then pruned at epoch ``K`` (:class:`GrowPruneController`), paired against ``static``
on the same hosts (the cost a pruned seed leaves the host).

    python -m bench.lifecycle run --task mnist1d --arms D,E --hosts 30 --seed 10300 --data-seed 103000 \\
        --out bench/results/suite/lifecycle/mnist1d.json
    python -m bench.lifecycle judge bench/results/suite/lifecycle/*.json --md OUT.md

``run`` adds to ``--out`` (an arm or controller already there is not run again), so a task's arms can
run in several processes' turns. ``judge`` reads the rule written before the run
(docs/experiment-log.md, "Lifecycle candidates against born big"): per arm and task ``grow_all`` minus
``born_big`` paired by host, TOST at +-1 point (+-3 on ``recall``), and the pruned seed's cost.
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
from tensordict import TensorDict

from esper.core.spec import Op, Stage
from esper.shell.baselines.simple import GrowAllController, _actions, _first
from esper.shell.common.revision import git_revision
from esper.shell.common.seeding import eval_host_seeds
from esper.shell.config.presets import RunConfig, config_hash, preset
from esper.shell.eval.episodes import run_episodes
from esper.shell.eval.runner import run_hosts
from esper.shell.eval.stats import holm, mean_ci95, t_test_greater, tost_equivalent

TASKS = ("mnist1d", "mnist1d_deep", "longrange", "digits_shallow", "recall")
#: The fourth suite run's flags (every task trained and judged without the cap and the budget).
BASE = {"ppo.param_cap_share": 0.0, "reward.param_budget_share": 0.0}
#: The lifecycle of each arm, on top of the task's configuration.
ARMS: dict[str, dict[str, Any]] = {
    "A": {},  # the reference's isolation, as the suite's tasks run today
    "B": {"lifecycle.attach_at": "blending", "lifecycle.g2_min_epochs": 1},  # issue 89's B
    "D": {"lifecycle.attach_at": "blending", "lifecycle.incubate": False},  # no incubation, attached
    "E": {"lifecycle.attach_at": "blending", "lifecycle.incubate": False, "lifecycle.grad_init": True},
    # issue 103's next candidate (its rule: docs/experiment-log.md, "An instant blend ...")
    "F": {"lifecycle.attach_at": "blending", "lifecycle.incubate": False, "lifecycle.instant_blend": True},
}
#: TOST margin per task (points): the issue's +-1, and "within 3 points" on recall.
MARGIN = {"recall": 3.0}
#: The pruned seed's allowed cost to the host (points, mean paired against static).
PRUNE_COST_MAX = 0.5
#: The PRUNE's ramp (ALPHA_SPEED_STEPS index 1: 3 epochs, as the FAST blend-in).
PRUNE_SPEED = 1


def arm_config(task: str, arm: str, extra: dict[str, Any] | None = None) -> RunConfig:
    """The task's preset with the fourth run's flags and ``arm``'s lifecycle (and ``extra``)."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; arms: {', '.join(ARMS)}")
    return preset(task, {**BASE, **ARMS[arm], **(extra or {})})


def prune_config(task: str, arm: str, extra: dict[str, Any] | None = None) -> RunConfig:
    """``arm``'s configuration for the pruned-seed measurement: nothing is fossilized or timed out before
    the controller's PRUNE (holding_timeout = the episode), and a seed that pays may be pruned."""
    T = preset(task).lifecycle.max_epochs
    return arm_config(
        task,
        arm,
        {
            **(extra or {}),
            "lifecycle.holding_timeout": T,
            "lifecycle.prune_gate": False,
            "lifecycle.timeout_fossilizes": False,
        },
    )


class GrowPruneController(GrowAllController):
    """``grow_all``'s germinations and advances, never a FOSSILIZE; from the measurement of epoch
    ``prune_at`` on, PRUNE every seed it may (ramped out over ``ALPHA_SPEED_STEPS[PRUNE_SPEED]``
    epochs): a seed the host carried as long as the lifecycle let it, removed."""

    def __init__(self, blueprint: int, lifecycle, *, prune_at: int) -> None:
        super().__init__(blueprint, lifecycle)
        self.prune_at = int(prune_at)

    def act(self, step) -> TensorDict:
        out = super().act(step)
        legal = step.legal["slot_by_op"]
        op, slot = out["op", "action"].clone(), out["slot", "action"].clone()
        fossil = op == int(Op.FOSSILIZE)
        op = torch.where(fossil, int(Op.WAIT), op)
        slot = torch.where(fossil, _first(legal[:, int(Op.WAIT)]), slot)
        late = step.signals["epoch"].to(op.device) >= self.prune_at
        prune = legal[:, int(Op.PRUNE)] & (step.slots["stage"] == int(Stage.HOLDING)) & late.unsqueeze(-1)
        any_ = prune.any(-1)
        op = torch.where(any_, int(Op.PRUNE), op)
        slot = torch.where(any_, _first(prune), slot)
        heads = {k: out[k, "action"] for k in out.keys()}
        heads.update(op=op, slot=slot, alpha_speed=torch.full_like(op, PRUNE_SPEED))
        return _actions(heads, op.shape[0], op.device)


def _per_host(records: list[dict]) -> dict[str, list]:
    keep = ("final_test_acc", "params_added", "train_flops", "validation_flops", "whatif_flops")
    return {k: [r.get(k) for r in records] for k in keep} | {"plan": [r.get("plan") for r in records]}


def run(
    task: str,
    arms: list[str],
    hosts: int,
    seed: int,
    data_seed: int | None,
    out: Path,
    prune_at: list[int],
    baselines: bool,
    grow: bool = True,
) -> dict:
    """Run what ``out`` lacks of ``task``'s arms (``grow_all``; ``prune@K`` for each K) and, with
    ``baselines``, ``born_big`` and ``static``; write ``out`` after each."""
    doc = json.loads(out.read_text()) if out.is_file() else {"task": task, "arms": {}, "baselines": {}}
    extra = {} if data_seed is None else {"env.data_seed": data_seed}
    meta = {"hosts": hosts, "seed": seed, "data_seed": data_seed}
    if doc.get("meta", {}).get("hosts") not in (None, hosts) or doc.get("meta", {}).get("seed") not in (
        None,
        seed,
    ):
        raise SystemExit(f"{out}: holds another run's hosts ({doc['meta']}); give another --out")
    doc["meta"] = {
        **doc.get("meta", {}),
        **meta,
        "machine": os.environ.get("ESPER_MACHINE", "VM, AMD EPYC, 2 cores"),
        "threads": torch.get_num_threads(),
    }
    episodes = range(hosts)

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1))

    def stamp(cfg: RunConfig, t0: float) -> dict:
        return {
            "revision": git_revision(),
            "config_hash": config_hash(cfg),
            "seconds": round(time.perf_counter() - t0, 1),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }

    if baselines:
        for name in ("born_big", "static"):
            if name in doc["baselines"]:
                continue
            cfg = arm_config(task, "A", extra)
            t0 = time.perf_counter()
            recs = run_episodes(cfg, cfg.env.build_task(), name, episodes, eval_seed=seed, checkpoint=None)
            doc["baselines"][name] = {**_per_host(recs), **stamp(cfg, t0)}
            save()
            print(f"{task} {name}: {sum(doc['baselines'][name]['final_test_acc']) / hosts:.2f}", flush=True)
    for arm in arms:
        entry = doc["arms"].setdefault(arm, {})
        if grow and "grow_all" not in entry:
            cfg = arm_config(task, arm, extra)
            t0 = time.perf_counter()
            recs = run_episodes(
                cfg, cfg.env.build_task(), "grow_all", episodes, eval_seed=seed, checkpoint=None
            )
            entry["grow_all"] = {**_per_host(recs), **stamp(cfg, t0), "lifecycle": ARMS[arm]}
            save()
            print(
                f"{task} {arm} grow_all: {sum(entry['grow_all']['final_test_acc']) / hosts:.2f}", flush=True
            )
        for k in prune_at:
            name = f"prune@{k}"
            if name in entry:
                continue
            cfg = prune_config(task, arm, extra)
            task_obj = cfg.env.build_task()
            t0 = time.perf_counter()

            def make(env, batch, cfg=cfg, task_obj=task_obj, k=k):
                return GrowPruneController(
                    env.blueprint_names.index(task_obj.grow_all), cfg.lifecycle, prune_at=k
                )

            recs = run_hosts(cfg, task_obj, make, eval_host_seeds(seed, episodes))
            entry[name] = {**_per_host(recs), **stamp(cfg, t0)}
            save()
            print(f"{task} {arm} {name}: {sum(entry[name]['final_test_acc']) / hosts:.2f}", flush=True)
    return doc


def _paired(a: list[float], b: list[float]) -> list[float]:
    return [float(x) - float(y) for x, y in zip(a, b, strict=True)]


def _is_prune_doc(d: dict) -> bool:
    """A pruned-seed file: prune@K entries and no grow_all."""
    entries = [k for e in d["arms"].values() for k in e]
    return bool(entries) and all(k.startswith("prune@") for k in entries)


def prune_costs(docs: list[dict]) -> dict[str, dict[str, dict]]:
    """``{task: {"ARM prune@K": {cost, ci95, p_cost_above_max, hosts}}}``: ``static`` minus the pruned
    seed's host, paired by host, each file against its own ``static``."""
    out: dict[str, dict[str, dict]] = {}
    for d in docs:
        st = d["baselines"].get("static")
        if not _is_prune_doc(d) or st is None:
            continue
        for arm, entry in sorted(d["arms"].items()):
            for name, rec in entry.items():
                cost = _paired(st["final_test_acc"], rec["final_test_acc"])
                m, ci = mean_ci95(cost)
                p = t_test_greater(cost, PRUNE_COST_MAX)
                row = {"cost": m, "ci95": ci, "p_cost_above_max": p, "hosts": len(cost)}
                out.setdefault(d["task"], {})[f"{arm} {name}"] = row
    return out


def judge(docs: list[dict]) -> dict:
    """The rule's verdict (module docstring) over the tasks' files (the pruned-seed files reported apart)."""
    by_task = {d["task"]: d for d in docs if not _is_prune_doc(d)}
    arms = sorted({a for d in by_task.values() for a, e in d["arms"].items() if "grow_all" in e})
    out: dict[str, Any] = {"arms": {}, "prune": prune_costs(docs)}
    for arm in arms:
        rows, pvals = {}, []
        for task in TASKS:
            d = by_task.get(task)
            if d is None or "grow_all" not in d["arms"].get(arm, {}) or "born_big" not in d["baselines"]:
                continue
            g = d["arms"][arm]["grow_all"]["final_test_acc"]
            bb = d["baselines"]["born_big"]["final_test_acc"]
            diff = _paired(g, bb)
            margin = MARGIN.get(task, 1.0)
            m, ci = mean_ci95(diff)
            tost = tost_equivalent(diff, margin=margin)
            row = {
                "grow_all": sum(g) / len(g),
                "born_big": sum(bb) / len(bb),
                "minus_born_big": m,
                "ci95": ci,
                "tost_p": tost["p"],
                "equivalent": bool(tost["p"] < 0.05),
                "margin": margin,
                "hosts": len(diff),
                "sd": float(torch.tensor(diff).std().item()) if len(diff) > 1 else 0.0,
            }
            if "A" in d["arms"] and "grow_all" in d["arms"]["A"] and arm != "A":
                vs = _paired(g, d["arms"]["A"]["grow_all"]["final_test_acc"])
                row["minus_A"] = mean_ci95(vs)
                pvals.append(t_test_greater(vs))
            rows[task] = row
        equiv = [t for t, r in rows.items() if t != "recall" and r["equivalent"]]
        recall_ok = rows.get("recall", {}).get("equivalent", False)
        out["arms"][arm] = {
            "tasks": rows,
            "equivalent_tasks": equiv,
            "recall_within_3": recall_ok,
            "meets_equivalence": len(equiv) >= 4 and recall_ok,
            # reported beside it: not more than a point below born big (the one-sided half of the TOST)
            "not_below_by_1": [t for t, r in rows.items() if t != "recall" and r["ci95"][0] > -1.0],
            "holm_above_A": holm(pvals)["reject"] if pvals else None,
        }
    # the rule judges equivalence alone (the pruned seed's cost is reported, not judged); among the arms
    # that meet it, the one closest to born big: the smallest summed |gap| over the tasks
    passing = [a for a, r in out["arms"].items() if a != "A" and r["meets_equivalence"]]
    gap = lambda a: sum(abs(r["minus_born_big"]) for r in out["arms"][a]["tasks"].values())
    out["winner"] = min(passing, key=gap) if passing else None
    return out


def _md(verdict: dict) -> str:
    lines = [
        "| arm | task | hosts | `grow_all` | `born_big` | minus `born_big` [95 %] (sd) | TOST p (margin) |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for arm, r in verdict["arms"].items():
        for task, row in r["tasks"].items():
            lines.append(
                f"| {arm} | `{task}` | {row['hosts']} | {row['grow_all']:.2f} | {row['born_big']:.2f} | "
                f"{row['minus_born_big']:+.2f} [{row['ci95'][0]:+.2f}, {row['ci95'][1]:+.2f}] "
                f"({row['sd']:.2f}) | "
                f"{row['tost_p']:.3f} (±{row['margin']:g}) |"
            )
    lines.append("")
    for arm, r in verdict["arms"].items():
        lines.append(
            f"- **{arm}**: shown equivalent on {len(r['equivalent_tasks'])} of the four "
            f"({', '.join(r['equivalent_tasks']) or 'none'}); `recall` within ±3: {r['recall_within_3']}; "
            f"not a point below `born_big` (lower end above -1): {', '.join(r['not_below_by_1']) or 'none'}"
        )
    lines.append(
        f"- **by the rule, the default lifecycle becomes**: {verdict['winner'] or 'none (no arm met it)'}"
    )
    if verdict["prune"]:
        head = "A seed pruned at epoch K: `static` minus it, paired by host (the issue asks at most 0.5):"
        lines += ["", head, "",
                  "| task | arm, K | hosts | cost [95 %] |", "|---|---|---:|---|"]  # fmt: skip
        for task, rows in verdict["prune"].items():
            for name, c in rows.items():
                lines.append(f"| `{task}` | {name} | {c['hosts']} | {c['cost']:+.2f} [{c['ci95'][0]:+.2f}, "
                             f"{c['ci95'][1]:+.2f}] |")  # fmt: skip
    return "\n".join(lines) + "\n"


def frontier(docs: list[dict], png: Path) -> str:
    """Per task, test accuracy (mean and 95 % interval over hosts) against training FLOPs (mean per
    episode): ``static``, ``born_big`` and ``grow_all`` under each arm (and each timed arm). Writes the
    figure to ``png`` and returns its table (markdown)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = sorted((d for d in docs if not _is_prune_doc(d)), key=lambda d: TASKS.index(d["task"]))
    fig, axes = plt.subplots(1, len(docs), figsize=(3.2 * len(docs), 3.2), squeeze=False)
    lines = [
        "| task | run | test acc [95 %] | training FLOPs an episode | of `born_big`'s |",
        "|---|---|---|---:|---:|",
    ]
    for ax, d in zip(axes[0], docs, strict=True):
        points = [(name, rec) for name, rec in d["baselines"].items()]
        points += [(f"grow_all ({arm})", e["grow_all"]) for arm, e in d["arms"].items() if "grow_all" in e]
        big = d["baselines"].get("born_big")
        big_flops = sum(big["train_flops"]) / len(big["train_flops"]) if big else None
        for name, rec in points:
            if any(f is None for f in rec.get("train_flops", [None])):
                continue
            m, (lo, hi) = mean_ci95(rec["final_test_acc"])
            flops = sum(rec["train_flops"]) / len(rec["train_flops"])
            ax.errorbar([flops / 1e9], [m], yerr=[[m - lo], [hi - m]], fmt="o", capsize=3, label=name)
            share = f"{flops / big_flops:.2f}" if big_flops else "—"
            lines.append(
                f"| `{d['task']}` | {name} | {m:.2f} [{lo:.2f}, {hi:.2f}] | {flops / 1e9:.2f} G | {share} |"
            )
        ax.set_title(f"{d['task']} ({d['meta']['hosts']} hosts)", fontsize=9)
        ax.set_xlabel("training FLOPs an episode (G)", fontsize=8)
        ax.set_xlim(left=0)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("test accuracy (%)", fontsize=8)
    axes[0][-1].legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.lifecycle", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--task", required=True, choices=TASKS)
    r.add_argument("--arms", default="", help="comma-separated arms of ARMS")
    r.add_argument("--hosts", type=int, default=30)
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--data-seed", type=int, default=None)
    r.add_argument("--prune-at", default="", help="comma-separated epochs K of the pruned-seed measurement")
    r.add_argument("--no-baselines", action="store_true")
    r.add_argument("--no-grow", action="store_true", help="only the prune@K measurements of the arms")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--out", type=Path, required=True)
    j = sub.add_parser("judge")
    j.add_argument("files", nargs="+", type=Path)
    j.add_argument("--md", type=Path, default=None)
    j.add_argument("--json", type=Path, default=None)
    j.add_argument("--png", type=Path, default=None, help="also the accuracy-against-FLOPs figure")
    a = p.parse_args(argv)
    if a.cmd == "run":
        torch.set_num_threads(a.threads)
        arms = [x for x in a.arms.split(",") if x]
        for arm in arms:
            if arm not in ARMS:
                p.error(f"unknown arm {arm!r}; arms: {', '.join(ARMS)}")
        prune_at = [int(x) for x in a.prune_at.split(",") if x]
        run(a.task, arms, a.hosts, a.seed, a.data_seed, a.out, prune_at, not a.no_baselines, not a.no_grow)
    else:
        verdict = judge([json.loads(f.read_text()) for f in a.files])
        text = _md(verdict)
        sys.stdout.write(text)
        if a.md:
            a.md.write_text(text)
        if a.json:
            a.json.write_text(json.dumps(verdict, indent=1))
        if a.png:
            sys.stdout.write("\n" + frontier([json.loads(f.read_text()) for f in a.files], a.png))


if __name__ == "__main__":
    main()
