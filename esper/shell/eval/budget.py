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
after Holm or TOST does. A budget with fewer than :data:`MIN_SEEDS` training seeds has no interval and no
test: it is reported and not judged, and the verdict over the budgets is "not judged" unless a judged
budget already fails it. The figure: every enumerated plan's test accuracy against its parameters, the
frontier among them, each budget's line and the controller's point at each budget.

On a family (a task whose hosts differ by seed, :attr:`Task.varies`) each host has its own budget,
``B`` x what ``grow_all`` adds to *that* host: a plan fits ``B`` where it fits on every host (a constant
plan, runnable on every member), and the controller's cap was each host's own. Reported beside the bar,
not judged: the **per-member bar**, each member's best plan within its own hosts' budgets (in-sample),
and what the controller grew on each member.

``python -m esper.shell.eval.budget --plans PLANS/results.json --evals B:SEED:RESULTS.json ... --out X.json
--md X.md --png X.png``; ``--replot X.json Y.json --png Z.png`` draws judged outputs side by side.
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
#: Training seeds below which a budget is not judged: a t-interval over seeds (and each test) needs two.
MIN_SEEDS = 2


def plan_table(results: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``evaluate``'s results of fixed plans -> ``{plan: {test, params, hosts, host_test, host_params}}``
    (the means, then per host in the episodes' order), every controller but the learned ones (``static``
    is the empty plan)."""
    out = {}
    for name, s in results["controllers"].items():
        if name.startswith("ppo"):
            continue
        eps = s["per_episode"]
        out[name] = {"test": float(s["test_acc_mean"]), "params": float(s["params_added_mean"]),
                     "hosts": [int(e["host_seed"]) for e in eps],
                     "host_test": [float(e["final_test_acc"]) for e in eps],
                     "host_params": [float(e["params_added"]) for e in eps]}  # fmt: skip
    return out


def frontier(table: Mapping[str, Mapping[str, float]]) -> list[str]:
    """The plans no other plan beats with no more parameters (ascending parameters): the frontier."""
    best, out = -1.0, []
    for name in sorted(table, key=lambda n: (table[n]["params"], -table[n]["test"], n)):
        if table[name]["test"] > best:
            out.append(name)
            best = table[name]["test"]
    return out


def fits(
    plan: Mapping[str, Any], budget: float | Sequence[float], where: Sequence[int] | None = None
) -> bool:
    """Whether a plan (a :func:`plan_table` row) adds at most ``budget``: one number (its mean parameters
    against it), or one per host (in the row's hosts' order: on every host, or every host of ``where``,
    the indices of some)."""
    if isinstance(budget, (int, float)):
        return plan["params"] <= budget + 1e-9
    idx = range(len(budget)) if where is None else where
    return all(plan["host_params"][i] <= budget[i] + 1e-9 for i in idx)


def bar_at(table: Mapping[str, Mapping[str, Any]], budget: float | Sequence[float],
           where: Sequence[int] | None = None) -> str:  # fmt: skip
    """The best plan (mean test accuracy; the first by name on a tie) that :func:`fits` ``budget``; with
    ``where`` (host indices), the best on those hosts of those that fit there."""
    ok = [n for n in table if fits(table[n], budget, where)]
    if not ok:
        said = f"{budget:g}" if isinstance(budget, (int, float)) else f"{min(budget):g}-{max(budget):g}"
        raise ValueError(f"budget judge: no enumerated plan adds at most {said} parameters")
    if where is None:
        return min(ok, key=lambda n: (-table[n]["test"], n))
    return min(ok, key=lambda n: (-sum(table[n]["host_test"][i] for i in where) / len(where), n))


def _interval(d: Sequence[float]) -> dict[str, Any]:
    """The mean over seeds and its 95 % t-interval (None below :data:`MIN_SEEDS` seeds: no interval)."""
    if len(d) < MIN_SEEDS:
        return {"mean": sum(d) / len(d), "ci95": None}
    mean, (lo, hi) = mean_ci95(d)
    return {"mean": mean, "ci95": [lo, hi]}


def _readout_of(res: Mapping[str, Any], readout: str, seed: int, share: float) -> Mapping[str, Any]:
    """``readout``'s results in one evaluation, or a one-line error naming the readouts there."""
    ctl = res.get("controllers", {})
    if readout not in ctl:
        raise ValueError(f"budget judge: seed {seed} at {share:g} has no readout {readout!r}; its readouts: "
                         f"{', '.join(ctl) or 'none'}")  # fmt: skip
    return ctl[readout]


def judge(table: Mapping[str, Mapping[str, Any]], evals: Mapping[float, Mapping[int, Mapping[str, Any]]],
          grow_all: float | Sequence[float], readout: str = READOUT,
          members: Sequence[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """``evals``: budget share -> training seed -> ``evaluate``'s results (holding ``readout``) on the
    plans' hosts. Returns, per budget, the bar, the paired differences and both tests, with Holm's
    correction of "above" across the budgets, and the verdict (not dominated at every budget).

    ``grow_all``: what ``grow_all`` adds, one number for every host, or one per host (a family, in the
    plans' hosts' order): each host's budget is the share of its own, and a plan fits where it fits on
    every host. ``members`` (per host, a family's member): the per-member bar and the plans grown on each
    member are reported beside the verdict."""
    hosts = next(iter(table.values()))["hosts"]
    per_host = isinstance(grow_all, Sequence)
    if per_host and len(grow_all) != len(hosts):
        raise ValueError(f"budget judge: {len(grow_all)} grow_all sizes for {len(hosts)} hosts")
    if members is not None and len(members) != len(hosts):
        raise ValueError(f"budget judge: {len(members)} members for {len(hosts)} hosts")
    groups = (
        {m: [i for i, x in enumerate(members) if x == m] for m in dict.fromkeys(members)} if members else {}
    )
    rows: dict[str, dict[str, Any]] = {}
    for share in sorted(evals):
        budget: float | list[float] = [share * g for g in grow_all] if per_host else share * grow_all
        host_budget = budget if per_host else [budget] * len(hosts)
        bar = bar_at(table, budget)
        member_bar = {m: bar_at(table, budget, where) for m, where in groups.items()}
        member_test = [0.0] * len(hosts)
        for m, where in groups.items():
            for i in where:
                member_test[i] = table[member_bar[m]]["host_test"][i]
        diffs, to_member, accs, params, grown = {}, {}, [], [], Counter()
        grown_on: dict[str, Counter] = {m: Counter() for m in groups}
        for seed, res in sorted(evals[share].items()):
            ctl = _readout_of(res, readout, seed, share)
            eps = ctl["per_episode"]
            if [int(e["host_seed"]) for e in eps] != hosts:
                raise ValueError(f"budget judge: seed {seed} at {share:g} ran on other hosts than the plans")
            diffs[seed] = float(ctl["test_acc_mean"]) - table[bar]["test"]
            if groups:
                to_member[seed] = float(ctl["test_acc_mean"]) - sum(member_test) / len(hosts)
                for m, where in groups.items():
                    grown_on[m].update(eps[i]["grown"] for i in where)
            accs.append(float(ctl["test_acc_mean"]))
            params.append(float(ctl["params_added_mean"]))
            grown.update(e["grown"] for e in eps)
            over = [(e["params_added"], b) for e, b in zip(eps, host_budget, strict=True)
                    if e["params_added"] > b + 1e-6]  # fmt: skip
            if over:
                added, b = max(over)
                raise ValueError(f"budget judge: seed {seed} added {added:g} over the budget {b:g}")
        d = list(diffs.values())
        judged = len(d) >= MIN_SEEDS
        tost = tost_equivalent(d, MARGIN, ALPHA) if judged else None
        rows[f"{share:g}"] = {
            "share": share, "budget_params": sum(host_budget) / len(hosts), "bar": bar,
            "bar_test": table[bar]["test"], "bar_params": table[bar]["params"],
            "test_acc_mean": sum(accs) / len(accs),
            "test_acc_ci95": _interval(accs)["ci95"],
            "params_added_mean": sum(params) / len(params), "minus_bar": _interval(d),
            "per_seed": diffs, "p_above": t_test_greater(d) if judged else None,
            "tost": None if tost is None else {**tost, "interval": list(tost["interval"])},
            "grown_top": grown.most_common(5),
        }  # fmt: skip
        if per_host:
            rows[f"{share:g}"]["budget_params_range"] = [min(host_budget), max(host_budget)]
        if groups:
            rows[f"{share:g}"].update({
                "member_bars": member_bar, "member_bar_test": sum(member_test) / len(hosts),
                "minus_member_bar": _interval(list(to_member.values())),
                "per_seed_minus_member_bar": to_member,
                "grown_by_member": {m: c.most_common(3) for m, c in grown_on.items()},
            })  # fmt: skip
    tested = [r for r in rows.values() if r["p_above"] is not None]
    for r, adj in zip(tested, holm([r["p_above"] for r in tested], ALPHA)["adjusted"], strict=True):
        r["p_above_holm"] = adj
        r["above"] = adj <= ALPHA
        r["equivalent"] = bool(r["tost"]["equivalent"])
        r["not_dominated"] = r["above"] or r["equivalent"]
    # the verdict over the budgets: False where a judged budget is dominated, else None (not judged) where
    # some budget has too few seeds to judge, else True
    everywhere = (False if not all(r["not_dominated"] for r in tested)
                  else None if len(tested) < len(rows) or not tested else True)  # fmt: skip
    out = {"budgets": rows, "frontier": frontier(table), "plans": len(table), "hosts": len(hosts),
           "grow_all_params": sum(grow_all) / len(grow_all) if per_host else grow_all,
           "training_seeds": sorted({s for e in evals.values() for s in e}),
           "min_training_seeds": MIN_SEEDS, "not_dominated_everywhere": everywhere}  # fmt: skip
    if per_host:
        out["grow_all_params_per_host"] = list(grow_all)
    if members is not None:
        out["members"] = {m: len(where) for m, where in groups.items()}
    return out


def _p(p: float | None) -> str:
    """A p-value's cell: three decimals, or "—" where there is none (one training seed tests nothing)."""
    return "—" if p is None else f"{p:.3f}"


def _signed(r: Mapping[str, Any]) -> str:
    """A difference's mean and 95 % interval; the mean alone where there is no interval (one seed)."""
    if r["ci95"] is None:
        return f"{r['mean']:+.2f} (no interval)"
    return f"{r['mean']:+.2f} [{r['ci95'][0]:+.2f}, {r['ci95'][1]:+.2f}]"


def _budget(row: Mapping[str, Any]) -> str:
    lo_hi = row.get("budget_params_range")
    if lo_hi is None or lo_hi[0] == lo_hi[1]:
        return f"{row['budget_params']:,.0f}"
    return f"{lo_hi[0]:,.0f}-{lo_hi[1]:,.0f}"


def to_markdown(out: Mapping[str, Any], title: str) -> str:
    seeds = out["training_seeds"]
    sizes = out.get("grow_all_params_per_host")
    adds = (f"{out['grow_all_params']:,.0f} parameters" if sizes is None else
            f"{min(sizes):,.0f} to {max(sizes):,.0f} parameters by host (each host's budget is the share "
            "of its own, and a plan fits a budget where it fits on every host)")  # fmt: skip
    every = out["not_dominated_everywhere"]
    need = out.get("min_training_seeds", MIN_SEEDS)
    said = ("**not judged** (a budget is judged on at least "
            f"{need} training seeds, and not every budget has them)" if every is None
            else f"**{'yes' if every else 'no'}**")  # fmt: skip
    which = f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else f"{seeds[0]}"
    lines = [
        f"# {title}",
        "",
        f"{len(seeds)} training seed{'' if len(seeds) == 1 else 's'} ({which}), {out['hosts']} fresh hosts, "
        f"{out['plans']} enumerated fixed plans on the same hosts; `grow_all` adds {adds}. "
        f"At each budget the bar is the best enumerated plan within it, chosen on these hosts (in-sample). "
        f"Not dominated at every budget: {said}.",
        "",
        "| budget (share, params) | controller test % | params added | bar (test %, params) | "
        "controller minus bar [95 % CI] | above (Holm p) | within ±1 (TOST p) | not dominated |",
        "|---|---:|---:|---|---|---:|---:|---|",
    ]
    for r in out["budgets"].values():
        m = r["minus_bar"]
        lines.append(
            f"| {r['share']:g} ({_budget(r)}) | {r['test_acc_mean']:.2f} | "
            f"{r['params_added_mean']:,.0f} | `{r['bar'] or 'static'}` ({r['bar_test']:.2f}, "
            f"{r['bar_params']:,.0f}) | {_signed(m)} | "
            f"{_p(r.get('p_above_holm'))} | {_p((r['tost'] or {}).get('p'))} | "
            f"{'yes' if r.get('not_dominated') else 'no' if r['tost'] else '—'} |"
        )
    lines += ["", "What the controller grew most at each budget (episodes over every seed):", ""]
    for r in out["budgets"].values():
        top = ", ".join(f"`{g or 'nothing'}` ({n})" for g, n in r["grown_top"][:4])
        lines.append(f"- {r['share']:g}: {top}")
    if "members" in out:
        lines += ["", "Per member (reported, not judged): the **per-member bar** is each member's best "
                  "enumerated plan within its own hosts' budgets, chosen on them (in-sample); the controller "
                  "minus it, paired by seed, 95 % CI; what the controller grew most on each member.", "",
                  "| budget | per-member bar test % | controller minus it | the per-member bars |",
                  "|---|---:|---|---|"]  # fmt: skip
        for r in out["budgets"].values():
            m = r["minus_member_bar"]
            bars = "; ".join(f"{k}: `{v or 'static'}`" for k, v in r["member_bars"].items())
            lines.append(f"| {r['share']:g} | {r['member_bar_test']:.2f} | {_signed(m)} | {bars} |")
        lines.append("")
        for r in out["budgets"].values():
            for k, top in r["grown_by_member"].items():
                grew = ", ".join(f"`{g or 'nothing'}` ({n})" for g, n in top)
                lines.append(f"- {r['share']:g}, {k} ({out['members'][k]} hosts): {grew}")
    lines += ["", "The frontier of the enumerated plans (parameters ascending): "
              + ", ".join(f"`{p or 'static'}`" for p in out["frontier"]) + "."]  # fmt: skip
    return "\n".join(lines) + "\n"


def figure(table: Mapping[str, Mapping[str, Any]], out: Mapping[str, Any], path: Path) -> Path | None:
    """Test accuracy against parameters added: every enumerated plan (grey), the frontier (line), each
    budget (dotted; on a family, the span of its hosts' budgets) and the controller at each budget (its
    mean over seeds, the interval over seeds)."""
    return figure_panels([(table, out, "A controller that reads its budget, against every enumerated "
                                       "fixed plan")], path)  # fmt: skip


def figure_panels(
    panels: Sequence[tuple[Mapping[str, Any], Mapping[str, Any], str]], path: Path, columns: int = 0
) -> Path:
    """:func:`figure`'s plot for each ``(table, out, title)`` of ``panels`` in one file, ``columns`` a row
    (0: all in one row), row by row (one judged run a panel: the default task and a family, say)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if columns < 0:
        raise ValueError(f"figure_panels: columns must be >= 0, got {columns}")
    cols = min(columns or len(panels), len(panels))
    rows = -(-len(panels) // cols)
    fig = Figure(figsize=(7.0 * cols, 4.5 * rows), dpi=110)
    FigureCanvasAgg(fig)
    for k, (table, out, title) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, k + 1)
        _panel(ax, table, out)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if rows > 1:
        fig.subplots_adjust(hspace=0.3)  # room for a row's axis label under the row above
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    return path


def _panel(ax, table: Mapping[str, Mapping[str, Any]], out: Mapping[str, Any]) -> None:
    ax.scatter([t["params"] for t in table.values()], [t["test"] for t in table.values()], s=16, color="0.6",
               label=f"enumerated fixed plans ({len(table)})")  # fmt: skip
    front = out["frontier"]
    ax.plot([table[p]["params"] for p in front], [table[p]["test"] for p in front], color="0.3", lw=1,
            drawstyle="steps-post", label="their frontier")  # fmt: skip
    for r in out["budgets"].values():
        lo_hi = r.get("budget_params_range")
        if lo_hi is not None and lo_hi[0] != lo_hi[1]:  # a family: each host's own budget, its range
            ax.axvspan(lo_hi[0], lo_hi[1], color="tab:blue", alpha=0.08, lw=0)
        else:
            ax.axvline(r["budget_params"], color="tab:blue", ls=":", lw=1)
        m = r["test_acc_mean"]
        lo, hi = r["test_acc_ci95"] or (m, m)  # one seed: no interval, the point alone
        ax.errorbar([r["params_added_mean"]], [m], yerr=[[m - lo], [hi - m]], color="tab:red", marker="D",
                    markeredgecolor="black", capsize=4)  # fmt: skip
        ax.annotate(
            f"{r['share']:g}", (r["params_added_mean"], m), textcoords="offset points", xytext=(6, -12)
        )
    ax.errorbar(
        [], [], color="tab:red", marker="D", label="the controller at each budget (its budget dotted)"
    )
    ax.set_xlabel("parameters added to the host (a family's plans: mean over its hosts)")
    ax.set_ylabel("test accuracy (%), mean over the hosts")


def host_sizes(task_name: str, hosts: Sequence[int]) -> tuple[list[float] | None, list[str] | None]:
    """On a family (:attr:`Task.varies`), what ``grow_all`` adds to each host and each host's member (its
    description, the fields that differ between these hosts); otherwise ``(None, None)``."""
    from esper.shell.env.tasks import grow_all_params, make_task
    from esper.shell.eval.search import host_of

    task = make_task(task_name)
    if not task.varies:
        return None, None
    sizes = [float(grow_all_params(task, host_of(task, h))) for h in hosts]
    described = [task.describe_member(h) for h in hosts]
    differ = [k for k in described[0] if len({repr(d[k]) for d in described}) > 1]
    return sizes, [", ".join(f"{k} {d[k]}" for k in differ) for d in described]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m esper.shell.eval.budget", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--plans", type=Path, help="evaluate's results.json of the fixed plans")
    p.add_argument("--evals", nargs="+", metavar="SHARE:SEED:RESULTS",
                   help="each training seed's evaluate results.json under one --budget-share")  # fmt: skip
    p.add_argument("--readout", default=READOUT)
    p.add_argument("--out", type=Path)
    p.add_argument("--md", type=Path, default=None)
    p.add_argument("--png", type=Path, default=None)
    p.add_argument("--replot", type=Path, nargs="+", default=None, metavar="JUDGED.json",
                   help="draw these judged outputs (this tool's --out files) into --png, and judge "
                        "nothing; a judged output's meta.panel, where set, titles its panel")  # fmt: skip
    p.add_argument("--columns", type=int, default=0, help="--replot's panels a row (0: all in one row)")
    a = p.parse_args(argv)
    if a.replot:
        if a.png is None:
            p.error("--replot draws into --png; name one")
        judged = [json.loads(f.read_text()) for f in a.replot]
        default = ": the controller at each budget, against every enumerated fixed plan"
        titles = [j["meta"].get("panel") or j["meta"]["task"] + default for j in judged]
        figure_panels([(j["table"], j, t) for j, t in zip(judged, titles, strict=True)], a.png, a.columns)
        return 0
    if a.plans is None or not a.evals or a.out is None:
        p.error("--plans, --evals and --out are required (or --replot)")
    plans = json.loads(a.plans.read_text())
    table = plan_table(plans)
    evals: dict[float, dict[int, Any]] = {}
    try:
        for item in a.evals:
            share, seed, path = item.split(":", 2)
            evals.setdefault(float(share), {})[int(seed)] = json.loads(Path(path).read_text())
        grow_all, members = host_sizes(plans["meta"]["task"], next(iter(table.values()))["hosts"])
        out = judge(table, evals, float(plans["meta"]["grow_all_params"]) if grow_all is None else grow_all,
                    a.readout, members)  # fmt: skip
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


__all__ = ["ALPHA", "MARGIN", "MIN_SEEDS", "READOUT", "bar_at", "figure", "figure_panels", "fits", "frontier",
           "host_sizes", "judge", "main", "plan_table", "to_markdown"]  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
