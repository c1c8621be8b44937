"""A controller that reads its budget (``env.budget_shares``), judged at each budget against the fixed
plans on the same hosts (issue 89).

Inputs: one ``evaluate`` of the enumerated fixed plans (``--controllers static,grow:...``) on the
evaluation hosts, and, per training seed and budget share ``B``, ``evaluate RUN --budget-share B
--controllers ppo_greedy`` on the same hosts and data draw. At each budget the **bar** is the enumerated
plan with the best mean test accuracy among those adding at most ``B`` x ``grow_all``'s parameters,
chosen on the evaluation hosts themselves (in-sample: stronger than a search at equal compute could
find on training hosts). Per training seed the controller's mean test accuracy minus the bar's; over the
seeds, its mean and 95 % t-interval, the one-sided test of "above" (Holm's correction across the
budgets) and TOST within +-1 point. The controller is **not dominated** at ``B`` where "above" holds
after Holm or TOST does. The figure: every enumerated plan's test accuracy against its parameters, the
frontier among them, each budget's line and the controller's point at each budget.

``python -m esper.shell.eval.budget --plans PLANS/results.json --evals B:SEED:RESULTS.json ... --out X.json
--md X.md --png X.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from esper.shell.eval.stats import holm, mean_ci95, t_test_greater, tost_equivalent

#: TOST's margin, in points of test accuracy, and the tests' level.
MARGIN, ALPHA = 1.0, 0.05
#: The controller's readout judged.
READOUT = "ppo_greedy"


def plan_table(results: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``evaluate``'s results of fixed plans -> ``{plan: {test, params, hosts}}``, every controller but the
    learned ones (``static`` is the empty plan)."""
    out = {}
    for name, s in results["controllers"].items():
        if name.startswith("ppo"):
            continue
        out[name] = {"test": float(s["test_acc_mean"]), "params": float(s["params_added_mean"]),
                     "hosts": [int(e["host_seed"]) for e in s["per_episode"]]}  # fmt: skip
    return out


def frontier(table: Mapping[str, Mapping[str, float]]) -> list[str]:
    """The plans no other plan beats with no more parameters (ascending parameters): the frontier."""
    best, out = -1.0, []
    for name in sorted(table, key=lambda n: (table[n]["params"], -table[n]["test"], n)):
        if table[name]["test"] > best:
            out.append(name)
            best = table[name]["test"]
    return out


def bar_at(table: Mapping[str, Mapping[str, float]], budget: float) -> str:
    """The best plan (mean test accuracy; the first by name on a tie) adding at most ``budget`` parameters."""
    fits = [n for n in table if table[n]["params"] <= budget + 1e-9]
    if not fits:
        raise ValueError(f"budget judge: no enumerated plan adds at most {budget:g} parameters")
    return min(fits, key=lambda n: (-table[n]["test"], n))


def judge(table: Mapping[str, Mapping[str, Any]], evals: Mapping[float, Mapping[int, Mapping[str, Any]]],
          grow_all: float, readout: str = READOUT) -> dict[str, Any]:  # fmt: skip
    """``evals``: budget share -> training seed -> ``evaluate``'s results (holding ``readout``) on the
    plans' hosts. Returns, per budget, the bar, the paired differences and both tests, with Holm's
    correction of "above" across the budgets, and the verdict (not dominated at every budget)."""
    hosts = next(iter(table.values()))["hosts"]
    rows: dict[str, dict[str, Any]] = {}
    for share in sorted(evals):
        budget = share * grow_all
        bar = bar_at(table, budget)
        diffs, accs, params, grown = {}, [], [], Counter()
        for seed, res in sorted(evals[share].items()):
            ctl = res["controllers"][readout]
            if [int(e["host_seed"]) for e in ctl["per_episode"]] != hosts:
                raise ValueError(f"budget judge: seed {seed} at {share:g} ran on other hosts than the plans")
            diffs[seed] = float(ctl["test_acc_mean"]) - table[bar]["test"]
            accs.append(float(ctl["test_acc_mean"]))
            params.append(float(ctl["params_added_mean"]))
            grown.update(e["grown"] for e in ctl["per_episode"])
            over = [e["params_added"] for e in ctl["per_episode"] if e["params_added"] > budget + 1e-6]
            if over:
                raise ValueError(f"budget judge: seed {seed} added {max(over):g} over the budget {budget:g}")
        d = list(diffs.values())
        mean, (lo, hi) = mean_ci95(d) if len(d) > 1 else (d[0], (d[0], d[0]))
        tost = tost_equivalent(d, MARGIN, ALPHA) if len(d) > 1 else None
        rows[f"{share:g}"] = {
            "share": share, "budget_params": budget, "bar": bar, "bar_test": table[bar]["test"],
            "bar_params": table[bar]["params"], "test_acc_mean": sum(accs) / len(accs),
            "test_acc_ci95": list(mean_ci95(accs)[1]) if len(accs) > 1 else [accs[0], accs[0]],
            "params_added_mean": sum(params) / len(params), "minus_bar": {"mean": mean, "ci95": [lo, hi]},
            "per_seed": diffs, "p_above": t_test_greater(d) if len(d) > 1 else None,
            "tost": None if tost is None else {**tost, "interval": list(tost["interval"])},
            "grown_top": grown.most_common(5),
        }  # fmt: skip
    tested = [r for r in rows.values() if r["p_above"] is not None]
    for r, adj in zip(tested, holm([r["p_above"] for r in tested], ALPHA)["adjusted"], strict=True):
        r["p_above_holm"] = adj
        r["above"] = adj <= ALPHA
        r["equivalent"] = bool(r["tost"]["equivalent"])
        r["not_dominated"] = r["above"] or r["equivalent"]
    return {"budgets": rows, "frontier": frontier(table), "plans": len(table), "hosts": len(hosts),
            "grow_all_params": grow_all, "training_seeds": sorted({s for e in evals.values() for s in e}),
            "not_dominated_everywhere": bool(tested) and all(r["not_dominated"] for r in tested)}  # fmt: skip


def to_markdown(out: Mapping[str, Any], title: str) -> str:
    seeds = out["training_seeds"]
    lines = [
        f"# {title}",
        "",
        f"{len(seeds)} training seeds ({seeds[0]}-{seeds[-1]}), {out['hosts']} fresh hosts, {out['plans']} "
        f"enumerated fixed plans on the same hosts; `grow_all` adds {out['grow_all_params']:,.0f} "
        f"parameters. "
        f"At each budget the bar is the best enumerated plan within it, chosen on these hosts (in-sample). "
        f"Not dominated at every budget: **{'yes' if out['not_dominated_everywhere'] else 'no'}**.",
        "",
        "| budget (share, params) | controller test % | params added | bar (test %, params) | "
        "controller minus bar [95 % CI] | above (Holm p) | within ±1 (TOST p) | not dominated |",
        "|---|---:|---:|---|---|---:|---:|---|",
    ]
    for r in out["budgets"].values():
        m = r["minus_bar"]
        lines.append(
            f"| {r['share']:g} ({r['budget_params']:,.0f}) | {r['test_acc_mean']:.2f} | "
            f"{r['params_added_mean']:,.0f} | `{r['bar'] or 'static'}` ({r['bar_test']:.2f}, "
            f"{r['bar_params']:,.0f}) | {m['mean']:+.2f} [{m['ci95'][0]:+.2f}, {m['ci95'][1]:+.2f}] | "
            f"{r.get('p_above_holm', float('nan')):.3f} | {r['tost']['p']:.3f} | "
            f"{'yes' if r.get('not_dominated') else 'no'} |"
        )
    lines += ["", "What the controller grew most at each budget (episodes over every seed):", ""]
    for r in out["budgets"].values():
        top = ", ".join(f"`{g or 'nothing'}` ({n})" for g, n in r["grown_top"][:4])
        lines.append(f"- {r['share']:g}: {top}")
    lines += ["", "The frontier of the enumerated plans (parameters ascending): "
              + ", ".join(f"`{p or 'static'}`" for p in out["frontier"]) + "."]  # fmt: skip
    return "\n".join(lines) + "\n"


def figure(table: Mapping[str, Mapping[str, Any]], out: Mapping[str, Any], path: Path) -> Path | None:
    """Test accuracy against parameters added: every enumerated plan (grey), the frontier (line), each
    budget (dotted) and the controller at each budget (its mean over seeds, the interval over seeds)."""
    from esper.shell.telemetry.plots import finish_figure, new_figure

    fig, ax = new_figure()
    ax.scatter([t["params"] for t in table.values()], [t["test"] for t in table.values()], s=16, color="0.6",
               label=f"enumerated fixed plans ({len(table)})")  # fmt: skip
    front = out["frontier"]
    ax.plot([table[p]["params"] for p in front], [table[p]["test"] for p in front], color="0.3", lw=1,
            drawstyle="steps-post", label="their frontier")  # fmt: skip
    for r in out["budgets"].values():
        ax.axvline(r["budget_params"], color="tab:blue", ls=":", lw=1)
        m, (lo, hi) = r["test_acc_mean"], r["test_acc_ci95"]
        ax.errorbar([r["params_added_mean"]], [m], yerr=[[m - lo], [hi - m]], color="tab:red", marker="D",
                    markeredgecolor="black", capsize=4)  # fmt: skip
        ax.annotate(
            f"{r['share']:g}", (r["params_added_mean"], m), textcoords="offset points", xytext=(6, -12)
        )
    ax.errorbar([], [], color="tab:red", marker="D", label="the controller at each budget (dotted)")
    ax.set_xlabel("parameters added to the host")
    ax.set_ylabel("test accuracy (%), mean over the hosts")
    ax.set_title("A controller that reads its budget, against every enumerated fixed plan")
    return finish_figure(fig, ax, path)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m esper.shell.eval.budget", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--plans", type=Path, required=True, help="evaluate's results.json of the fixed plans")
    p.add_argument("--evals", nargs="+", required=True, metavar="SHARE:SEED:RESULTS",
                   help="each training seed's evaluate results.json under one --budget-share")  # fmt: skip
    p.add_argument("--readout", default=READOUT)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--md", type=Path, default=None)
    p.add_argument("--png", type=Path, default=None)
    a = p.parse_args(argv)
    plans = json.loads(a.plans.read_text())
    table = plan_table(plans)
    evals: dict[float, dict[int, Any]] = {}
    try:
        for item in a.evals:
            share, seed, path = item.split(":", 2)
            evals.setdefault(float(share), {})[int(seed)] = json.loads(Path(path).read_text())
        out = judge(table, evals, float(plans["meta"]["grow_all_params"]), a.readout)
    except (ValueError, OSError) as e:
        print(f"esper.shell.eval.budget: {e}", file=sys.stderr)
        return 2
    out["meta"] = {"task": plans["meta"]["task"], "eval_seed": plans["meta"]["eval_seed"],
                   "data_seed": plans["meta"]["data_seed"], "plans": str(a.plans)}  # fmt: skip
    a.out.write_text(json.dumps({**out, "table": table}, indent=1))
    md = to_markdown(out, f"A controller that reads its budget on `{out['meta']['task']}`")
    if a.md is not None:
        a.md.write_text(md)
    if a.png is not None:
        figure(table, out, a.png)
    print(md)
    return 0


__all__ = ["ALPHA", "MARGIN", "READOUT", "bar_at", "figure", "frontier", "judge", "main", "plan_table",
           "to_markdown"]  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
