"""The plan search on Optuna against the old successive halving (issue 105; the rule: docs/experiment-log.md,
"The plan search on Optuna: the rule").

``python -m bench.search_optuna run --tasks mnist1d,... --seeds 500 --root DIR --minutes 60`` makes, per
(task, seed), a run folder with the fourth run's configuration (the task's preset, ``ppo.param_cap_share 0``,
``reward.param_budget_share 0``, ``--seed k``), evaluates ``plan_search@1x`` (the search at this revision)
and ``grow:OLD`` (the old search's choice, from the fourth run's JSON) on the seed's evaluation hosts
(``python -m esper.shell.evaluate --seed 1000+k --data-seed 100000+k --episodes 10 --threads 1``), one pair at
a time, none started after ``--minutes``; ``write`` pools what ran into a JSON and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

from esper.shell.common.fields import to_dict
from esper.shell.config.presets import preset

OLD = Path("bench/results/suite/2026-12-06-vm.json")
NEW = "plan_search@1x"
EPISODES = 10


def old_choice(task: str, seed: int) -> tuple[str, float]:
    """The fourth run's ``plan_search@1x`` choice on ``task`` at ``seed`` and its test accuracy then."""
    row = json.loads(OLD.read_text())["tasks"][task]["controllers"][NEW]
    k = row["training_seeds"].index(seed)
    return row["chosen"][str(seed)], row["per_seed_test_acc"][k]


def run_dir(root: Path, task: str, seed: int) -> Path:
    """A run folder with the fourth run's config of ``task`` at ``seed`` (no checkpoint: baselines only)."""
    d = root / f"{task}-seed{seed}"
    d.mkdir(parents=True, exist_ok=True)
    cfg = preset(task, {"ppo.param_cap_share": 0.0, "reward.param_budget_share": 0.0, "seed": seed})
    (d / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    return d


def evaluate(root: Path, task: str, seed: int) -> dict:
    d = run_dir(root, task, seed)
    plan, _ = old_choice(task, seed)
    fixed = cfg_fixed_dataset(task)
    cmd = [sys.executable, "-m", "esper.shell.evaluate", str(d), "--episodes", str(EPISODES), "--seed",
           str(1000 + seed), "--controllers", f"{NEW},grow:{plan}", "--threads", "1", "--no-progress",
           "--out", str(d / "eval"), *([] if fixed else ["--data-seed", str(100000 + seed)])]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    out = json.loads((d / "eval" / "results.json").read_text())
    out["wall_seconds"] = time.perf_counter() - t0
    (d / "eval" / "results.json").write_text(json.dumps(out))
    return out


def cfg_fixed_dataset(task: str) -> bool:
    """Whether ``task`` reads a fixed dataset (no ``--data-seed``: its own test split)."""
    return task == "digits_shallow"


def cmd_run(args) -> None:
    t0 = time.monotonic()
    for task in args.tasks.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            if time.monotonic() - t0 > args.minutes * 60:
                print(f"not started: {task} seed {seed} (past {args.minutes} minutes)", flush=True)
                continue
            if (Path(args.root) / f"{task}-seed{seed}" / "eval" / "results.json").exists():
                continue
            res = evaluate(Path(args.root), task, seed)
            print(f"{task} seed {seed}: {res['wall_seconds']:.0f} s", flush=True)


def pair(res: dict, task: str, seed: int) -> dict:
    """One (task, seed): the new search's choice and the old one's, their test accuracy per host, the
    difference with its paired 95 % interval, and the new search's compute."""
    ctl = res["controllers"]
    plan, old_then = old_choice(task, seed)
    new, old = ctl[NEW], ctl[f"grow:{plan}"]
    acc = lambda c: [e["final_test_acc"] for e in c["per_episode"]]
    a, b = np.array(acc(new)), np.array(acc(old))
    d = a - b
    half = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))) if d.std() > 0 else 0.0
    lo, hi = float(d.mean()) - half, float(d.mean()) + half
    s = new["search"]
    same = s["chosen"] == plan
    verdict = "better" if lo > 0 else "worse" if hi < 0 else "no difference shown"
    verdict = "the same plan" if same else verdict
    scored = {c["plan"]: c for c in s["candidates"]}
    return {
        "task": task, "seed": seed, "new_plan": s["chosen"], "old_plan": plan,
        "new_test_acc": float(a.mean()), "old_test_acc": float(b.mean()), "old_test_acc_fourth_run": old_then,
        "new_minus_old": float(d.mean()), "ci95": [lo, hi], "verdict": verdict,
        "new_val_acc": scored[s["chosen"]]["val_acc_mean"],
        "new_val_episodes": scored[s["chosen"]]["episodes"],
        "old_plan_val_acc_in_new_search": scored.get(plan, {}).get("val_acc_mean"),
        "new_params_added": new["params_added_mean"], "old_params_added": old["params_added_mean"],
        "compute_host_epochs": s["compute_host_epochs"], "trials": s["trials"],
        "trials_pruned": s["trials_pruned"], "search_seconds": s["seconds"],
        "wall_seconds": res.get("wall_seconds"),
        "hosts": res["meta"]["host_seeds"], "data_seed": res["meta"].get("data_seed"),
        "git_rev": (res["meta"].get("git_rev") or "")[:7],
    }  # fmt: skip


def cmd_write(args) -> None:
    root, rows = Path(args.root), []
    for d in sorted(root.glob("*-seed*")):
        saved = d / "eval" / "results.json"
        if saved.exists():
            task, _, seed = d.name.rpartition("-seed")
            rows.append(pair(json.loads(saved.read_text()), task, int(seed)))
    order = ["mnist1d", "mnist1d_deep", "longrange", "digits_shallow", "recall"]
    rows.sort(key=lambda r: (order.index(r["task"]), r["seed"]))
    meta = {"machine": "VM, AMD EPYC, 2 cores", "date": args.date, "revision": args.revision,
            "rule": "docs/experiment-log.md, 'The plan search on Optuna: the rule'",
            "not_run": args.not_run, "threads": 1}  # fmt: skip
    Path(args.out + ".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        f"# plan_search@1x on Optuna (TPE + successive-halving pruner) against the old successive halving "
        f"({args.date}, {meta['machine']}, {args.revision})",
        "",
        f"Rule: {meta['rule']}. The search at {args.revision}; both choices grown as fixed plans on the "
        f"fourth run's hosts of the seed ({EPISODES} episodes, evaluation seed 1000 + k, final draw "
        "100000 + k), in one evaluation (`rev`: the revision it recorded); test accuracy in %, difference "
        "new minus old with its paired 95 % interval; `new's val`: the chosen plan's validation accuracy "
        "on the training hosts (its episodes); search s: the search's wall time on one thread of the "
        "shared VM. One thread each (`--threads 1`).",
        "",
        "| task | seed | new plan (TPE) | old plan (halving) | new | old | old, fourth run "
        "| new - old [95 %] | verdict | new's val (episodes) | trials (pruned) | search s | rev |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['seed']} | `{r['new_plan']}` | `{r['old_plan']}` | "
            f"{r['new_test_acc']:.2f} | {r['old_test_acc']:.2f} | {r['old_test_acc_fourth_run']:.2f} | "
            f"{r['new_minus_old']:+.2f} "
            f"[{r['ci95'][0]:+.2f}, {r['ci95'][1]:+.2f}] | {r['verdict']} | {r['new_val_acc']:.2f} "
            f"({r['new_val_episodes']}) | {r['trials']} ({r['trials_pruned']}) | {r['search_seconds']:.0f} | "
            f"{r['git_rev']} |"
        )
    if args.not_run:
        lines += ["", f"Not run: {args.not_run}."]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.search_optuna", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--tasks", default="mnist1d,mnist1d_deep,longrange,digits_shallow,recall")
    r.add_argument("--seeds", default="500")
    r.add_argument("--root", required=True)
    r.add_argument("--minutes", type=float, default=60.0)
    w = sub.add_parser("write")
    w.add_argument("--root", required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--date", required=True)
    w.add_argument("--revision", required=True)
    w.add_argument("--not-run", default="")
    args = p.parse_args(argv)
    cmd_run(args) if args.cmd == "run" else cmd_write(args)


if __name__ == "__main__":
    main()
