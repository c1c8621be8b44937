"""The pre-check of a family of hosts (issue 89): is there anything for a controller to learn on it?

A family task's hosts differ by host seed (:attr:`esper.shell.env.tasks.Task.make_host_for`). Before any
controller trains on a family, this check runs an enumerated set of fixed plans on each of N fresh hosts
of the family (evaluation host seeds, a fresh data draw) and asks whether the best plan differs from
host to host enough to pay: the **per-host oracle** (each host's best plan) against the **best constant
plan** (one plan for every host).

- Each plan runs once on each host, every plan of a host side by side in one batch (one host per batch:
  a family's batch must be one member, :meth:`esper.shell.env.vecenv.VecEnv.reset`). A plan that adds
  more than the host's budget (``budget_share`` of what ``grow_all`` adds to that host) is not run there;
  a constant plan must fit every host.
- The **best constant** is the plan with the best mean *test* accuracy over the pre-check hosts: chosen
  in-sample, so it is the strongest constant these hosts allow (the choice favours it).
- The **oracle** picks each host's plan by its *validation* accuracy (what a controller could see) and is
  scored on the host's *test* accuracy: the honest oracle, and the headline. The oracle that picks by test
  accuracy is reported beside it; it is biased upward (the best of several noisy readings).
- ``oracle_minus_best_constant``: the honest oracle's mean test accuracy minus the best constant's;
  ``share_best_differs``: the share of hosts whose validation-chosen plan is not the best constant.
  The rule a family passes by is written before its run (docs/experiment-log.md).

``python -m esper.shell.eval.precheck TASK --hosts 30 --eval-seed S --data-seed D --out FILE.json``
(``--md FILE.md`` a table too; ``--partial FILE.jsonl`` keeps each host's rows as they finish, and a
run stopped part-way resumes from them). :func:`summarize` is the arithmetic, on any table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from esper.shell.common.revision import git_revision, machine
from esper.shell.common.seeding import eval_host_seeds
from esper.shell.config.presets import RunConfig, preset
from esper.shell.env.tasks import Task, grow_all_params, seed_params
from esper.shell.eval.search import EPOCH_SEP, STYLE_SEP, run_plans
from esper.shell.eval.stats import mean_ci95

#: The rule's thresholds (issue 89): the honest oracle at least this many points above the best constant,
#: and the validation-chosen plan other than the constant on at least this share of the hosts.
MIN_GAP, MIN_SHARE = 4.0, 0.30

#: Each family's enumerated plans (written as ``grow:`` plans are; ``""``: nothing grown) and its budget
#: (a share of what ``grow_all`` adds to each host; None: none), as its rule states them.
FAMILY_PLANS: dict[str, dict[str, Any]] = {
    "mnist1d_where": {
        "plans": (
            "",
            "b0=conv_small",
            "b1=conv_small",
            "b2=conv_small",
            "b0=depthwise",
            "b1=depthwise",
            "b2=depthwise",
            "b0=conv_small+b1=depthwise",
        ),
        "budget_share": 1 / 6,
    },
    "mnist1d_when": {
        "plans": (
            "",
            "b0=conv_heavy",
            "b0=conv_heavy:7",
            "b0=conv_heavy:13",
            "b0=conv_heavy+b1=conv_heavy",
            "b0=conv_heavy:7+b1=conv_heavy:7",
            "b0=depthwise",
            "b0=depthwise:7",
        ),
        "budget_share": None,
    },
}


def untimed(plan: str) -> str:
    """A written plan without its timing and style (``b0=conv_heavy:7@GATED_GATE`` -> ``b0=conv_heavy``):
    what it grows, for counting its parameters."""
    body = plan.partition(STYLE_SEP)[0]
    return "+".join(part.partition(EPOCH_SEP)[0] for part in body.split("+") if part)


def _argmax(scores: dict[str, float], order: Sequence[str]) -> str:
    """The plan of ``scores`` with the highest score, the first in ``order`` on a tie."""
    return max((p for p in order if p in scores), key=lambda p: (scores[p], -order.index(p)))


def summarize(hosts: list[dict], plans: Sequence[str], *, min_gap: float = MIN_GAP,
              min_share: float = MIN_SHARE) -> dict[str, Any]:  # fmt: skip
    """The pre-check's arithmetic. ``hosts``: one row per host, ``{"host_seed", "plans": {plan: {"test",
    "val", ...}}}`` (a plan missing from a host's row did not fit its budget there); ``plans``: the
    enumerated plans, in order (ties go to the first). Returns the ``precheck`` entry (``hosts``,
    ``oracle_minus_best_constant``, ``share_best_differs``, ``passes``, ...), the best constant, the two
    oracles and each plan's means; each host row gains its chosen plans."""
    plans = list(plans)
    if not hosts:
        raise ValueError("precheck: no hosts")
    constant_ok = [p for p in plans if all(p in h["plans"] for h in hosts)]
    if not constant_ok:
        raise ValueError("precheck: no plan fits every host's budget, so there is no constant plan")
    mean = lambda plan, key: float(np.mean([h["plans"][plan][key] for h in hosts]))
    per_plan = {
        p: {"test_mean": mean(p, "test"), "val_mean": mean(p, "val"), "hosts": len(hosts)}
        for p in constant_ok
    }
    best = _argmax({p: per_plan[p]["test_mean"] for p in constant_ok}, plans)
    best_by_val = _argmax({p: per_plan[p]["val_mean"] for p in constant_ok}, plans)
    rows, gaps, gaps_biased = [], [], []
    for h in hosts:
        scores = h["plans"]
        by_val = _argmax({p: s["val"] for p, s in scores.items()}, plans)
        by_test = _argmax({p: s["test"] for p, s in scores.items()}, plans)
        gaps.append(scores[by_val]["test"] - scores[best]["test"])
        gaps_biased.append(scores[by_test]["test"] - scores[best]["test"])
        rows.append({**h, "best_val_plan": by_val, "best_test_plan": by_test,
                     "oracle_gain": gaps[-1]})  # fmt: skip
    gap, (lo, hi) = mean_ci95(gaps) if len(gaps) > 1 else (gaps[0], (gaps[0], gaps[0]))
    share = float(np.mean([r["best_val_plan"] != best for r in rows]))
    const = per_plan[best]["test_mean"]
    return {
        "precheck": {
            "hosts": len(hosts),
            "oracle_minus_best_constant": gap,
            "oracle_minus_best_constant_ci95": [lo, hi],
            "share_best_differs": share,
            "passes": bool(gap >= min_gap and share >= min_share),
            "thresholds": {"oracle_minus_best_constant": min_gap, "share_best_differs": min_share},
            "oracle_chosen_on": "validation accuracy, scored on test accuracy",
            "constant_chosen_on": "mean test accuracy over these hosts (in-sample: the strongest constant)",
        },
        "best_constant": {"plan": best, "test_mean": const},
        "best_constant_by_val": {"plan": best_by_val, "test_mean": per_plan[best_by_val]["test_mean"]},
        "oracle": {
            "val_chosen_test_mean": const + gap,
            "test_chosen_test_mean": const + float(np.mean(gaps_biased)),
            "test_chosen_minus_best_constant": float(np.mean(gaps_biased)),
            "share_best_differs_test_chosen": float(np.mean([r["best_test_plan"] != best for r in rows])),
        },
        "per_plan": per_plan,
        "per_host": rows,
    }


def precheck_config(task: str, data_seed: int | None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """The suite's settings (preset ``mnist1d``, the 22-update configuration the pre-checks ran with) on
    family ``task`` (its data draw ``data_seed``), one env-training thread
    (and one PPO minibatch, which no fixed plan reads, so that a batch may hold any number of envs);
    ``overrides`` (dotted paths) on top (tests: shorter episodes)."""
    over: dict[str, Any] = {"env.task": task, "env.workers": 1, "ppo.n_minibatches": 1, **(overrides or {})}
    if data_seed is not None:
        over["env.data_seed"] = data_seed
    return preset("mnist1d", over)


def host_plans(task: Task, seed: int, plans: Sequence[str], budget_share: float | None) -> dict[str, Any]:
    """Host ``seed``'s member, its budget and the plans that fit it, each with the parameters it adds."""
    with torch.random.fork_rng(devices=[]):  # a host draws its init: leave the caller's stream
        host = task.host_for(seed)
    full = grow_all_params(task, host)
    budget = budget_share * full if budget_share is not None else None
    added = {p: seed_params(task, host, untimed(p)) if untimed(p) else 0 for p in plans}
    return {
        "member": task.describe_member(seed) if task.describe_member is not None else None,
        "slot_widths": [s.width for s in host.slots],
        "host_params": sum(p.numel() for p in host.host_parameters()),
        "grow_all_params": full,
        "budget": budget,
        "plan_params": added,
        "fits": [p for p in plans if budget is None or added[p] <= budget],
    }


def run_precheck(task_name: str, *, hosts: int, eval_seed: int, data_seed: int | None,
                 plans: Sequence[str] | None = None, budget_share: float | None = None,
                 partial: Path | None = None, read: Sequence[Path] = (),
                 overrides: dict[str, Any] | None = None, shard: tuple[int, int] | None = None,
                 log=print) -> dict[str, Any] | None:  # fmt: skip
    """Run the pre-check of family ``task_name`` on ``hosts`` evaluation hosts of ``eval_seed``
    (:func:`~esper.shell.common.seeding.eval_host_seeds`) and draw ``data_seed``; ``plans`` and
    ``budget_share`` default to :data:`FAMILY_PLANS`'s. With ``partial`` (a JSON-lines file), each host's
    row is appended as it finishes and a host already there (or in a file of ``read``) is read, not run;
    ``overrides``: settings on top of the default's (:func:`precheck_config`). ``shard`` ``(i, n)``: run
    only the hosts whose index is ``i`` modulo ``n`` into ``partial`` and return None (two processes split
    the hosts; a last call without it reads their files and summarizes). Returns :func:`summarize`'s
    result with ``plans`` and ``meta``."""
    spec = FAMILY_PLANS.get(task_name, {})
    plans = list(plans if plans is not None else spec["plans"])
    budget_share = budget_share if budget_share is not None else spec.get("budget_share")
    cfg = precheck_config(task_name, data_seed, overrides)
    task = cfg.env.build_task()
    if not task.varies:
        raise ValueError(f"precheck: task {task_name!r} is not a family (its hosts do not differ by seed)")
    names = task.make_host().slot_names
    key = {"task": task_name, "eval_seed": eval_seed, "data_seed": task.data_seed, "plans": plans,
           "budget_share": budget_share, "overrides": overrides or {}}  # fmt: skip
    done: dict[int, dict] = {}
    for path in (*([partial] if partial is not None else []), *read):
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short
            if rec.get("key") == key:
                done[int(rec["row"]["host_seed"])] = rec["row"]
    t0, rev = time.perf_counter(), git_revision()  # the revision it starts at
    rows = []
    if shard is not None and partial is None:
        raise ValueError("precheck: a shard writes its hosts to a partial file; name one")
    for k, seed in enumerate(eval_host_seeds(eval_seed, range(hosts))):
        if shard is not None and k % shard[1] != shard[0]:
            continue
        if seed in done:
            rows.append(done[seed])
            continue
        t = time.perf_counter()
        info = host_plans(task, seed, plans, budget_share)
        fits = info.pop("fits")
        run_cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, n_envs=len(fits)))
        records, _ = run_plans(run_cfg, task, [(p, seed) for p in fits], names)
        row = {"host": k, "host_seed": seed, **info,
               "plans": {p: {"test": float(r["final_test_acc"]), "val": float(r["final_val_acc"]),
                             "params": int(r["params_added"]), "grown": r["grown"]}
                         for p, r in zip(fits, records, strict=True)}}  # fmt: skip
        rows.append(row)
        if partial is not None:
            partial.parent.mkdir(parents=True, exist_ok=True)
            with partial.open("a") as f:
                f.write(json.dumps({"key": key, "row": row}) + "\n")
        best = max(row["plans"], key=lambda p: row["plans"][p]["val"])
        log(
            f"host {k + 1}/{hosts} ({time.perf_counter() - t:.0f} s): {info['member']} best by val "
            f"{best or 'static'!r} {row['plans'][best]['test']:.1f}"
        )
    if shard is not None:
        return None
    out = summarize(rows, plans)
    out["plans"] = plans
    out["meta"] = {
        "task": task_name, "eval_seed": eval_seed, "data_seed": task.data_seed,
        "host_seeds": eval_host_seeds(eval_seed, range(hosts)), "budget_share": budget_share,
        "max_epochs": cfg.lifecycle.max_epochs, "episodes": sum(len(r["plans"]) for r in rows),
        "settings": "the default preset's (env.workers 1), one host's plans side by side per batch",
        "overrides": overrides or {},
        "torch_threads": torch.get_num_threads(), "seconds": time.perf_counter() - t0,
        "git_rev": rev, "machine": machine(),
    }  # fmt: skip
    return out


def to_markdown(result: dict[str, Any]) -> str:
    """The pre-check as a page: its verdict, each plan's mean, each host's row."""
    pc, meta, plans = result["precheck"], result["meta"], result["plans"]
    name = lambda p: f"`{p}`" if p else "static"
    lo, hi = pc["oracle_minus_best_constant_ci95"]
    budget = "none" if meta["budget_share"] is None else f"{meta['budget_share']:.3g} of grow_all's"
    lines = [
        f"# Pre-check: `{meta['task']}` ({pc['hosts']} hosts)", "",
        f"Evaluation seed {meta['eval_seed']}, data draw {meta['data_seed']}, budget share {budget}, "
        f"{meta['episodes']} episodes of {meta['max_epochs']} epochs, revision {meta['git_rev']}, "
        f"{meta['machine']}.", "",
        f"- **{'passes' if pc['passes'] else 'fails'}**: oracle (chosen on validation, scored on test) minus "
        f"the best constant plan **{pc['oracle_minus_best_constant']:+.2f}** points [{lo:+.2f}, {hi:+.2f}] "
        f"(at least {pc['thresholds']['oracle_minus_best_constant']:g} asked); the chosen plan differs from "
        f"the constant on **{pc['share_best_differs']:.0%}** of hosts (at least "
        f"{pc['thresholds']['share_best_differs']:.0%} asked).",
        f"- Best constant plan (best mean test accuracy over these hosts): "
        f"{name(result['best_constant']['plan'])} {result['best_constant']['test_mean']:.2f}; by mean "
        f"validation accuracy: "
        f"{name(result['best_constant_by_val']['plan'])} {result['best_constant_by_val']['test_mean']:.2f}.",
        f"- Oracle chosen on validation: {result['oracle']['val_chosen_test_mean']:.2f}; chosen on test "
        f"(biased upward): {result['oracle']['test_chosen_test_mean']:.2f} "
        f"({result['oracle']['test_chosen_minus_best_constant']:+.2f} over the constant, differs on "
        f"{result['oracle']['share_best_differs_test_chosen']:.0%}).", "",
        "| plan | mean test | mean val | chosen on val (hosts) |", "|---|---:|---:|---:|",
    ]  # fmt: skip
    chosen = [r["best_val_plan"] for r in result["per_host"]]
    for p in plans:
        if p in result["per_plan"]:
            s = result["per_plan"][p]
            lines.append(f"| {name(p)} | {s['test_mean']:.2f} | {s['val_mean']:.2f} | {chosen.count(p)} |")
        else:
            lines.append(f"| {name(p)} | — | — | {chosen.count(p)} |")
    lines += ["", "Per host (test accuracy of each plan; the plan chosen on validation in bold):", "",
              "| host | member | " + " | ".join(name(p) for p in plans) + " |",
              "|---|---|" + "---:|" * len(plans)]  # fmt: skip
    for r in result["per_host"]:
        cells = []
        for p in plans:
            s = r["plans"].get(p)
            cell = "—" if s is None else f"{s['test']:.1f}"
            cells.append(f"**{cell}**" if p == r["best_val_plan"] else cell)
        member = r["member"] if r["member"] is not None else r["slot_widths"]
        lines.append(f"| {r['host']} | {_short(member)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _short(member: Any) -> str:
    if isinstance(member, dict):
        return ", ".join(f"{k} {'-'.join(map(str, v)) if isinstance(v, list | tuple) else v}"
                         for k, v in member.items() if k not in ("kernels",))  # fmt: skip
    return str(member)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m esper.shell.eval.precheck", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("task", help="a family task (esper.shell.env.config.FAMILY_TASKS)")
    p.add_argument("--hosts", type=int, default=30, help="evaluation hosts (default 30)")
    p.add_argument("--eval-seed", type=int, required=True, help="the evaluation hosts' seed")
    p.add_argument("--data-seed", type=int, default=None, help="the data draw (default: the task's own)")
    p.add_argument("--plans", default=None, help="plans, comma-separated ('static' for none; default: the "
                   "family's, FAMILY_PLANS)")  # fmt: skip
    p.add_argument("--budget-share", type=float, default=None, help="budget, a share of grow_all's params")
    p.add_argument("--out", required=True, help="the results' JSON file")
    p.add_argument("--md", default=None, help="also write the table here")
    p.add_argument("--partial", default=None, help="JSON-lines file of finished hosts (resume)")
    p.add_argument("--read", default=None, help="other processes' partial files to read, comma-separated")
    p.add_argument("--shard", default=None, help="I/N: only the hosts of index I modulo N, into --partial")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = p.parse_args(argv)
    if args.hosts < 2:
        p.error("--hosts: at least 2")
    torch.set_num_threads(args.threads)
    plans = None if args.plans is None else ["" if q == "static" else q for q in args.plans.split(",")]
    shard = None
    if args.shard is not None:
        i, _, n = args.shard.partition("/")
        if not (i.isdigit() and n.isdigit() and 0 <= int(i) < int(n)):
            p.error(f"--shard: I/N with 0 <= I < N, got {args.shard!r}")
        shard = (int(i), int(n))
    try:
        result = run_precheck(args.task, hosts=args.hosts, eval_seed=args.eval_seed, data_seed=args.data_seed,
                              plans=plans, budget_share=args.budget_share,
                              partial=Path(args.partial) if args.partial else None,
                              read=[Path(f) for f in args.read.split(",")] if args.read else (),
                              shard=shard, log=lambda m: print(m, flush=True))  # fmt: skip
    except (KeyError, ValueError) as e:
        print(f"precheck: {e}", file=sys.stderr)
        return 2
    if result is None:
        print(f"shard {args.shard}: its hosts are in {args.partial}")
        return 0
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if args.md:
        Path(args.md).write_text(to_markdown(result))
    pc = result["precheck"]
    print(json.dumps({"precheck": {k: pc[k] for k in ("hosts", "oracle_minus_best_constant",
                                                      "share_best_differs", "passes")}}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
