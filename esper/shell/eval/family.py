"""A learned controller on a family of hosts, judged against fixed plans on the same hosts (issue 89).

The pre-check (:mod:`esper.shell.eval.precheck`) of fresh hosts gives each host's test and validation
accuracy under each enumerated plan; ``python -m esper.shell.evaluate RUN_DIR --seed S --data-seed D
--episodes N --controllers ppo_greedy`` on the same hosts (evaluation seed and data draw) gives the
controller's. Per training seed, :func:`judge` pairs them host by host:

- against the **best constant** (one plan for every host, chosen before the run, on other hosts),
- against the **kind rule** (a plan per kind of host, chosen the same way: what a researcher who knows
  the family would write),
- against the honest **oracle** (each host's plan chosen by validation, scored on test),

and over training seeds reports each difference's mean with its 95 % t-interval. The controller
**beats the best fixed plan** when the interval of its difference to the best constant lies above 0.
Below :data:`MIN_SEEDS` training seeds there is no interval over seeds, and the judge says it did not
judge (each reading is reported, with no interval, no verdict and no equivalence test).
``python -m esper.shell.eval.family --precheck P.json --evals E1.json E2.json ... --out X.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from esper.shell.eval.precheck import summarize
from esper.shell.eval.stats import mean_ci95, tost_equivalent

#: Per family, what a controller on it is judged against, fixed before its run (docs/experiment-log.md):
#: the best constant, and the kind rule (a host's kind, read off its member, -> the plan).
FAMILY_BARS: dict[str, dict[str, Any]] = {
    "mnist1d_where": {
        "constant": "b0=depthwise",
        "kind_of": lambda member: "-".join(str(p) for p in member["pools"]),
        "kind_rule": {"1-4-1": "b0=depthwise", "1-1-4": "b0=conv_small+b1=depthwise"},
    },
}
#: The controller's readout judged.
READOUT = "ppo_greedy"
#: Training seeds below which nothing is judged: a t-interval over seeds (and TOST) needs two. (A judged
#: run's rule may ask more, docs/suite.md's ten; this tool checks only that there is an interval.)
MIN_SEEDS = 2


def _seeds(n: int) -> str:
    """``1 training seed``, ``2 training seeds``."""
    return f"{n} training seed{'' if n == 1 else 's'}"


def _pooled(values: Sequence[float]) -> dict[str, Any]:
    """The mean over seeds and its 95 % t-interval (None below :data:`MIN_SEEDS` seeds: no interval)."""
    if len(values) < MIN_SEEDS:
        return {"mean": float(np.mean(values)), "ci95": None}
    mean, (lo, hi) = mean_ci95(values)
    return {"mean": mean, "ci95": [lo, hi]}


def _readout_of(res: Mapping[str, Any], readout: str, seed: int) -> Mapping[str, Any]:
    """``readout``'s results in one seed's ``evaluate`` output, or a one-line error naming those present."""
    ctl = res.get("controllers", {})
    if readout not in ctl:
        raise ValueError(f"family judge: seed {seed}'s evaluation has no readout {readout!r}; its readouts: "
                         f"{', '.join(ctl) or 'none'}")  # fmt: skip
    return ctl[readout]


def _slots(plan: str) -> frozenset[str]:
    """The slots a written plan (or a ``grown`` string) grows: ``b0=x+b1=y`` -> {b0, b1}."""
    return frozenset(part.split("=", 1)[0] for part in plan.split("+") if "=" in part)


def judge(precheck: Mapping[str, Any], evals: Mapping[int, Mapping[str, Any]], *, constant: str,
          kind_of: Callable[[dict], str], kind_rule: Mapping[str, str],
          readout: str = READOUT) -> dict[str, Any]:  # fmt: skip
    """``precheck``: a pre-check's results (its ``per_host`` rows and ``plans``) on the evaluation hosts;
    ``evals``: training seed -> ``evaluate``'s results on the same hosts. Returns per seed and pooled over
    seeds: the controller's mean test accuracy and parameters, and its paired differences to the best
    constant, the kind rule and the oracle, with the share of hosts whose grown slots are the kind rule's."""
    plans = list(precheck["plans"])
    rows = summarize(precheck["per_host"], plans)["per_host"]  # the oracle's choice per host
    by_seed = {int(r["host_seed"]): r for r in rows}
    per_seed: dict[int, dict[str, Any]] = {}
    kinds: dict[str, dict[str, Any]] = {}  # over every seed's episodes: what it does on each kind of host
    for k, res in sorted(evals.items()):
        episodes = _readout_of(res, readout, k)["per_episode"]
        seen = {int(e["host_seed"]) for e in episodes}
        if seen != set(by_seed):
            raise ValueError(f"family judge: seed {k}'s hosts are not the pre-check's ({len(seen)} against "
                             f"{len(by_seed)}, {len(seen & set(by_seed))} shared)")  # fmt: skip
        diffs: dict[str, list[float]] = {"constant": [], "kind_rule": [], "oracle": [], "static": []}
        same_slots, accs, params = [], [], []
        for e in episodes:
            row = by_seed[int(e["host_seed"])]
            acc, test, kind = float(e["final_test_acc"]), row["plans"], kind_of(row["member"])
            rule, grown = kind_rule[kind], str(e.get("grown", ""))
            bars = {"constant": test[constant]["test"], "kind_rule": test[rule]["test"],
                    "oracle": test[row["best_val_plan"]]["test"], "static": test[""]["test"]}  # fmt: skip
            for name, bar in bars.items():
                diffs[name].append(acc - bar)
            same_slots.append(_slots(grown) == _slots(rule))
            accs.append(acc)
            params.append(float(e["params_added"]))
            entry = kinds.setdefault(kind, {"controller": [], "constant": [], "kind_rule": [], "oracle": [],
                                            "grown": Counter()})  # fmt: skip
            entry["controller"].append(acc)
            for name in ("constant", "kind_rule", "oracle"):
                entry[name].append(bars[name])
            entry["grown"][grown] += 1
        per_seed[k] = {
            "test_acc": float(np.mean(accs)),
            "params_added": float(np.mean(params)),
            **{f"minus_{name}": float(np.mean(d)) for name, d in diffs.items()},
            "slots_as_kind_rule": float(np.mean(same_slots)),
        }
    judged = len(per_seed) >= MIN_SEEDS
    per_kind = {
        kind: {
            "episodes": len(v["controller"]),
            "hosts": len(v["controller"]) // len(per_seed),
            **{
                f"{name}_test_mean": float(np.mean(v[name]))
                for name in ("controller", "constant", "kind_rule", "oracle")
            },
            "grown_top": v["grown"].most_common(5),
        }
        for kind, v in sorted(kinds.items())
    }
    pooled = {key: _pooled([s[key] for s in per_seed.values()]) for key in next(iter(per_seed.values()))}
    # "as good as the kind rule" is claimed only by an equivalence test (TOST, ±1 point, paired by seed)
    tost = tost_equivalent([s["minus_kind_rule"] for s in per_seed.values()], 1.0) if judged else None
    return {
        "judged": judged,
        "min_training_seeds": MIN_SEEDS,
        "kind_rule_tost": None
        if tost is None
        else {**tost, "interval": list(tost["interval"]), "margin": 1.0},
        "per_seed": per_seed,
        "pooled": pooled,
        "per_kind": per_kind,
        # None: not judged (too few seeds for an interval)
        "beats_best_constant": bool(pooled["minus_constant"]["ci95"][0] > 0) if judged else None,
        "bars": {"constant": constant, "kind_rule": dict(kind_rule)},
        "hosts": len(rows),
        "training_seeds": sorted(per_seed),
    }


def against(evals: Mapping[int, Mapping[str, Any]], names: Sequence[str], *, readout: str = READOUT,
            oracle: float | None = None) -> dict[str, Any]:  # fmt: skip
    """The controller against other controllers evaluated beside it on the same hosts (``evals``: training
    seed -> ``evaluate``'s results holding ``readout`` and each of ``names``, e.g. the searched baselines of
    issue 89: ``plan_search_cap``, ``probe``): per baseline, the paired difference (per training seed,
    ``readout``'s mean test accuracy minus the baseline's over the same hosts) with its mean and 95 %
    t-interval over seeds, the baseline's accuracy, parameters and compute, and what its search chose
    per seed. With ``oracle`` (the honest oracle's mean test accuracy on these hosts), the share of the gap
    from each baseline to the oracle that the controller closes, on the means."""
    out: dict[str, Any] = {}
    for name in names:
        diffs, accs, params, compute, chosen = [], [], [], [], {}
        for k, res in sorted(evals.items()):
            ctl, base = _readout_of(res, readout, k), res["controllers"].get(name)
            if base is None:
                raise ValueError(f"family judge: seed {k}'s evaluation has no {name!r}")
            hosts = [int(e["host_seed"]) for e in ctl["per_episode"]]
            if [int(e["host_seed"]) for e in base["per_episode"]] != hosts:
                raise ValueError(f"family judge: seed {k}: {name} ran on other hosts than {readout}")
            diffs.append(float(ctl["test_acc_mean"]) - float(base["test_acc_mean"]))
            accs.append(float(base["test_acc_mean"]))
            params.append(float(base["params_added_mean"]))
            compute.append(float(base.get("compute_host_epochs", 0)))
            search = base.get("search") or {}
            chosen[k] = search.get("chosen", base.get("plan"))
        minus = _pooled(diffs)
        base_mean = float(np.mean(accs))
        ctl_mean = base_mean + minus["mean"]
        row = {"minus": {**minus, "per_seed": diffs},
               "test_acc_mean": base_mean, "params_added_mean": float(np.mean(params)),
               "compute_host_epochs_mean": float(np.mean(compute)), "chosen": chosen}  # fmt: skip
        if oracle is not None and oracle > base_mean:
            row["gap_closed"] = (ctl_mean - base_mean) / (oracle - base_mean)
        out[name] = row
    return out


def _tost_cell(tost: dict[str, Any] | None) -> str:
    if tost is None:
        return f"fewer than {MIN_SEEDS} training seeds: not tested"
    lo, hi = tost["interval"]
    return (
        f"{'yes' if tost['equivalent'] else 'no'} (p {tost['p']:.3f}; 90 % interval [{lo:+.2f}, {hi:+.2f}])"
    )


def _cell(r: Mapping[str, Any], signed: bool = False) -> str:
    """A pooled reading: its mean and 95 % interval, or the mean alone where there is no interval."""
    f = "{:+.2f}" if signed else "{:.2f}"
    if r.get("ci95") is None:
        return f.format(r["mean"])
    return f"{f.format(r['mean'])} [{f.format(r['ci95'][0])}, {f.format(r['ci95'][1])}]"


def to_markdown(out: dict[str, Any], title: str, readout: str = READOUT) -> str:
    p = out["pooled"]

    def cell(key: str, signed: bool = False) -> str:
        return _cell(p[key], signed)

    seeds = out["training_seeds"]
    said = f"{_seeds(len(seeds))} ({seeds[0]}" + (f"-{seeds[-1]})" if len(seeds) > 1 else ")")
    judged = out.get("judged", True)  # a file written before issue 102 was judged on every seed count
    if judged:
        verdict = "**beats**" if out["beats_best_constant"] else "**does not beat**"
        head = (
            f"{said}, {out['hosts']} fresh hosts each; means over seeds with 95 % intervals. The controller "
            f"({readout}) {verdict} the best constant `{out['bars']['constant']}`."
        )
    else:
        head = (
            f"{said}, {out['hosts']} fresh hosts each. **Not judged**: a judgement needs at least "
            f"{out.get('min_training_seeds', MIN_SEEDS)} training seeds (an interval over seeds); each "
            "reading below is this seed's mean over the hosts, with no interval, and no test."
        )
    lines = [
        f"# {title}",
        "",
        head,
        "",
        f"| reading | mean{' [95 % CI]' if judged else ''} |",
        "|---|---|",
        f"| controller's test accuracy % | {cell('test_acc')} |",
        f"| parameters added | {cell('params_added')} |",
        f"| minus the best constant{' (judged)' if judged else ''} | {cell('minus_constant', True)} |",
        f"| minus the kind rule | {cell('minus_kind_rule', True)} |",
        f"| within ±1 of the kind rule (TOST, paired by seed) | {_tost_cell(out['kind_rule_tost'])} |",
        f"| minus the oracle (chosen on validation) | {cell('minus_oracle', True)} |",
        f"| minus the static host | {cell('minus_static', True)} |",
        f"| share of hosts grown in the kind rule's slots | {cell('slots_as_kind_rule')} |",
    ]
    lines += [
        "",
        "Per kind of host (every seed's episodes): mean test accuracy %, and what the controller grew most.",
        "",
        "| kind | hosts | controller | best constant | kind rule | oracle | grown most (episodes) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for kind, v in out["per_kind"].items():
        grown = ", ".join(f"`{g or 'nothing'}` ({n})" for g, n in v["grown_top"][:3])
        lines.append(
            f"| {kind} | {v['hosts']} | {v['controller_test_mean']:.2f} | {v['constant_test_mean']:.2f} | "
            f"{v['kind_rule_test_mean']:.2f} | {v['oracle_test_mean']:.2f} | {grown} |"
        )
    lines += [
        "",
        "| training seed | test % | params | minus constant | minus kind rule | minus oracle "
        "| kind rule's slots |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for k, s in out["per_seed"].items():
        lines.append(
            f"| {k} | {s['test_acc']:.2f} | {s['params_added']:.0f} | {s['minus_constant']:+.2f} | "
            f"{s['minus_kind_rule']:+.2f} | {s['minus_oracle']:+.2f} | {s['slots_as_kind_rule']:.2f} |"
        )
    if out.get("against"):
        lines += [
            "",
            "Against the baselines evaluated beside it on the same hosts (paired by training seed; each "
            "search selects on the run's own training hosts, its compute counted):",
            "",
            "| baseline | its test % | params | host epochs | controller minus it"
            f"{' [95 % CI]' if judged else ''} | gap to the oracle closed | chosen (seeds) |",
            "|---|---:|---:|---:|---|---:|---|",
        ]
        for name, r in out["against"].items():
            m = r["minus"]
            closed = f"{r['gap_closed']:.2f}" if "gap_closed" in r else "-"
            picks = Counter(json.dumps(c, sort_keys=True) if isinstance(c, dict) else str(c)
                            for c in r["chosen"].values())  # fmt: skip
            chosen = "; ".join(f"`{c}` ({n})" for c, n in picks.most_common(3))
            lines.append(
                f"| `{name}` | {r['test_acc_mean']:.2f} | {r['params_added_mean']:.0f} | "
                f"{r['compute_host_epochs_mean']:.0f} | {_cell(m, True)} | {closed} | {chosen} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m esper.shell.eval.family", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--precheck", type=Path, required=True, help="the pre-check's JSON on the evaluation hosts"
    )
    p.add_argument("--evals", type=Path, nargs="+", required=True,
                   help="evaluate's results.json of each training run, on the pre-check's hosts")  # fmt: skip
    p.add_argument(
        "--seeds", type=int, nargs="+", required=True, help="the training seed of each --evals file"
    )
    p.add_argument("--readout", default=READOUT, help=f"the controller's readout judged ({READOUT})")
    p.add_argument("--against", default="",
                   help="comma-separated controllers evaluated beside the readout in the same --evals files "
                        "(e.g. plan_search_cap,probe): each one's paired difference, what its search chose, "
                        "and the share of its gap to the oracle the controller closes")  # fmt: skip
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--md", type=Path, default=None)
    a = p.parse_args(argv)
    if len(a.seeds) != len(a.evals):
        p.error("--seeds: one per --evals file")
    pre = json.loads(a.precheck.read_text())
    task = pre["meta"]["task"]
    if task not in FAMILY_BARS:
        p.error(f"no bars are written for {task!r}; families with bars: {', '.join(FAMILY_BARS)}")
    bars = FAMILY_BARS[task]
    evals = {k: json.loads(f.read_text()) for k, f in zip(a.seeds, a.evals, strict=True)}
    try:
        out = judge(pre, evals, constant=bars["constant"], kind_of=bars["kind_of"],
                    kind_rule=bars["kind_rule"], readout=a.readout)  # fmt: skip
    except ValueError as e:
        print(f"esper.shell.eval.family: {e}", file=sys.stderr)
        return 2
    names = [n.strip() for n in a.against.split(",") if n.strip()]
    if names:
        rows = summarize(pre["per_host"], list(pre["plans"]))["per_host"]
        oracle = float(np.mean([r["plans"][r["best_val_plan"]]["test"] for r in rows]))
        try:
            out["against"] = against(evals, names, readout=a.readout, oracle=oracle)
        except ValueError as e:
            print(f"esper.shell.eval.family: {e}", file=sys.stderr)
            return 2
        out["oracle_test_mean"] = oracle
    out["meta"] = {"task": task, "precheck": str(a.precheck), "evals": [str(f) for f in a.evals],
                   "eval_seed": pre["meta"]["eval_seed"], "data_seed": pre["meta"]["data_seed"]}  # fmt: skip
    a.out.write_text(json.dumps(out, indent=1))
    out["readout"] = a.readout
    md = to_markdown(out, f"A controller on `{task}` against fixed plans on the same hosts", a.readout)
    if a.md is not None:
        a.md.write_text(md)
    print(md)
    return 0


__all__ = ["FAMILY_BARS", "MIN_SEEDS", "READOUT", "against", "judge", "main", "to_markdown"]


if __name__ == "__main__":
    raise SystemExit(main())
