"""How a suite run is judged under protocol 2 (issue 89), as a function of its results file: the rule
written before any run it judges (docs/suite.md, "How a run is judged (issue 89)").

A run's JSON says which protocol judges it (``"protocol"``; a file without one is protocol 1, the issue-45
goals of :mod:`esper.shell.eval.suite.report`, and renders as it always did). Under protocol 2,
:func:`judge` reads each task's rows (``per_seed_test_acc`` in training seed order, the same order for
every row of a task) and returns every claim with its estimate, interval, p-value, Holm-adjusted p-value
and verdict, for both readouts (``ppo_greedy`` judged, ``ppo`` reported beside it, judging nothing):

- On each family (a task with ``"family": true`` whose pre-check passes; one that fails is dropped, not
  judged), against every fixed-plan search at equal compute (:func:`equal_compute_plans`):
  ``family_gain``, the readout minus the search at least :data:`GAIN_OVER_CONSTANT` points with its
  Holm-adjusted paired interval above zero; ``family_probe``, the readout minus ``probe`` with a
  Holm-adjusted paired lower bound above ``-PROBE_MARGIN``; ``family_oracle_gap``, the readout closes at
  least :data:`ORACLE_GAP_SHARE` of the gap between the strongest such search and ``oracle_per_host``;
  ``family_plans_vary``, the share of its episodes whose plan differs from the plan it grew most on that
  seed's hosts is at least :data:`PLANS_VARY_SHARE`.
- ``not_dominated``, at each budget on each family and on the default task: against every fixed-plan search
  at equal compute that adds no more parameters than the readout, the readout is above (its paired
  interval above zero) or equivalent within ``±EQUIVALENCE_MARGIN`` (TOST).

Holm's correction runs over one claim's comparisons for one readout, across every family, task, budget and
comparator it is made on (:data:`TESTED`). "Equal compute" is read off a search's name: its budget in host
epochs (:func:`search_budget`) equals the task's ``learned_compute_host_epochs``, the controller's training.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from esper.shell.eval.search import PROBE, parse_search, plan_kind
from esper.shell.eval.stats import (
    holm,
    mean_interval,
    paired_differences,
    t_test_greater,
    t_test_less,
    tost_equivalent,
)
from esper.shell.eval.suite.tasks import BORN_OWN, DEFAULT_TASK, LEARNED, ORACLE

#: The protocol new runs are judged by (the ``"protocol"`` of their JSON; absent: 1, issue 45's goals).
PROTOCOL = 2
#: The family-wise error rate of each claim's Holm family; each test is one-sided at its Holm level.
ALPHA = 0.05
#: Training seeds a judged run has on every task.
TRAINING_SEEDS = 10
#: "As good as": equivalent within this many points (TOST).
EQUIVALENCE_MARGIN = 1.0
#: On a family the judged readout is at least this many points above every constant plan at equal compute.
GAIN_OVER_CONSTANT = 2.0
#: On a family the readout's paired lower bound against ``probe`` is above minus this many points.
PROBE_MARGIN = 0.5
#: The share of the gap between the best constant plan and the per-host oracle the readout closes.
ORACLE_GAP_SHARE = 0.5
#: The share of a readout's episodes whose plan differs from its seed's most grown plan, for "its plans
#: vary from host to host": half the pre-check's 30 % of hosts whose best plan differs.
PLANS_VARY_SHARE = 0.15
#: A family's pre-check (committed before any controller trains on it): at least this many hosts, the
#: per-host oracle at least this many points above the best constant plan, the best plan differing from
#: the best constant's on at least this share of hosts.
PRECHECK_BAR = {"hosts": 30, "oracle_minus_best_constant": 4.0, "share_best_differs": 0.30}
#: Families that pass their pre-check, at least.
MIN_FAMILIES = 2
#: The readout judged; the other of :data:`~esper.shell.eval.suite.tasks.LEARNED` is reported beside it.
JUDGED = "ppo_greedy"
#: The claims decided by a paired test, each its own Holm family per readout.
TESTED = ("family_gain", "family_probe", "not_dominated")
#: A claim that needs a search the run lacks.
NO_SEARCH = "no fixed-plan search at equal compute"
#: The rows the controller is read against beside the baselines that try (issue 89's five tasks; reported,
#: judging nothing): the plan it grows, that network born at its final size, its own most grown plan born
#: so, the greedy what-if probe and the widened heuristic.
AGAINST_TRYING = ("grow_all", "born_big", BORN_OWN, PROBE, "heuristic_tuned_wide")
#: What each of :func:`trying_view`'s tests says where it rejects.
TRYING_WORDS = {"above": "above", "below": "below", "tost": f"as good as (±{EQUIVALENCE_MARGIN:g})"}
#: Every claim, in the order they are reported.
CLAIMS = ("family_gain", "family_probe", "family_oracle_gap", "family_plans_vary", "not_dominated")
#: What each claim says, in words.
CLAIM_WORDS = {
    "family_gain": "on each family, the readout minus every fixed-plan search at equal compute is at least "
                   f"+{GAIN_OVER_CONSTANT:g} points, with its Holm-adjusted paired interval above zero",
    "family_probe": f"on each family, the readout minus `{PROBE}` has a Holm-adjusted paired lower bound "
                    f"above -{PROBE_MARGIN:g}",
    "family_oracle_gap": f"on each family, the readout closes at least {ORACLE_GAP_SHARE:g} of the gap "
                         f"between the strongest fixed-plan search at equal compute and `{ORACLE}`",
    "family_plans_vary": f"on each family, at least {100 * PLANS_VARY_SHARE:g} % of the readout's episodes "
                         "grow another plan than the one it grew most on the seed's hosts",
    "not_dominated": "at each budget, on each family and on the default task, the readout is above (Holm-"
                     f"adjusted paired interval above zero) or equivalent within ±{EQUIVALENCE_MARGIN:g} "
                     "(TOST) to every fixed-plan search at equal compute that adds no more parameters",
}  # fmt: skip


def protocol_of(suite: dict[str, Any]) -> int:
    """The protocol that judges a results file: its ``"protocol"``, 1 where it has none."""
    return int(suite.get("protocol", 1))


def search_budget(name: str, learned: float | None) -> float | None:
    """The host epochs a fixed-plan search's name gives it (``plan_search``: the learned controller's
    training, ``learned``; ``plan_search@Kx``: K times it; ``plan_search@H``: H); None for a row that is
    not a plan search, or a multiple of an unknown ``learned``."""
    parsed = parse_search(name) if plan_kind(name) is not None else None
    if parsed is None:
        return None
    spec = parsed[1]  # the search module's own parse: a sampler after the budget is not the budget
    if spec is None:
        return learned
    if spec.endswith("x"):
        return None if learned is None else float(spec[:-1]) * learned
    return float(spec)


def equal_compute_plans(controllers: dict[str, dict], learned: float | None) -> list[str]:
    """The rows of ``controllers`` that are a fixed-plan search (``plan_search``, ``plan_search_cap``,
    ``plan_search_timed``) whose budget is the learned controller's training compute, ``learned``."""
    if not learned:
        return []
    spans = {n: search_budget(n, learned) for n in controllers}
    return [n for n, b in spans.items() if b is not None and math.isclose(b, learned)]


def paired(controllers: dict[str, dict], a: str, b: str) -> list[float]:
    """Row ``a`` minus row ``b``, training seed by training seed (refused where their seeds differ)."""
    ca, cb = controllers[a], controllers[b]
    if ca.get("training_seeds") != cb.get("training_seeds"):
        raise ValueError(f"{a} and {b} were pooled over other training seeds: they cannot be paired")
    return paired_differences(ca["per_seed_test_acc"], cb["per_seed_test_acc"])


def precheck_verdict(entry: dict[str, Any]) -> dict[str, Any]:
    """A family's pre-check against :data:`PRECHECK_BAR`: ``passes`` and, where it does not, ``why``."""
    pc = entry.get("precheck")
    if not pc:
        return {"precheck": None, "passes": False, "why": ["no pre-check recorded"]}
    why = [f"{k} {pc.get(k)} under {bar:g}" for k, bar in PRECHECK_BAR.items()
           if pc.get(k) is None or pc[k] < bar]  # fmt: skip
    return {"precheck": pc, "passes": not why, "why": why}


def budgets(entry: dict[str, Any]) -> list[tuple[str | None, dict[str, dict]]]:
    """A task's budgets: ``(label, controllers)`` of each entry of its ``budgets`` (the controller evaluated
    with the budget as an input, beside the searches within it; the task's own rows are then no budget of
    their own), else its own rows as one (label None)."""
    if entry.get("budgets"):
        return [(label, b["controllers"]) for label, b in entry["budgets"].items()]
    return [(None, entry["controllers"])]


def _row(claim: str, readout: str, task: str, budget: str | None = None, against: str | None = None,
         **kw: Any) -> dict[str, Any]:  # fmt: skip
    return {"claim": claim, "readout": readout, "task": task, "budget": budget, "against": against,
            "estimate": None, "interval": None, "level": None, "p": None, "p_holm": None, "holm_m": None,
            "met": None, "note": "", "compute": None, **kw}  # fmt: skip


def _compute(ctl: dict[str, dict], readout: str, against: str | None) -> dict[str, Any]:
    """The host epochs each side spent before the evaluation: the controller's training, the search's."""
    return {"readout": ctl[readout].get("compute_host_epochs"),
            "against": None if against is None else ctl[against].get("compute_host_epochs")}  # fmt: skip


def _tested(claim: str, readout: str, task: str, budget: str | None, ctl: dict[str, dict], against: str,
            p_of: Any) -> dict[str, Any]:  # fmt: skip
    """A claim decided by a paired test: the differences, the estimate and the raw p-value ``p_of(diffs)``
    (a dict: ``p`` and any part to keep); the interval and verdict wait for Holm (:func:`_correct`)."""
    row = _row(claim, readout, task, budget, against, compute=_compute(ctl, readout, against))
    diffs = paired(ctl, readout, against)
    if len(diffs) < 2:
        return {**row, "met": False, "note": "fewer than 2 training seeds: no paired test"}
    return {**row, "estimate": sum(diffs) / len(diffs), "_diffs": diffs, **p_of(diffs)}


def family_claims(readout: str, task: str, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The four claims on one family (before Holm's correction)."""
    ctl, learned = entry["controllers"], entry.get("learned_compute_host_epochs")
    if readout not in ctl:
        return [_row(c, readout, task, met=False, note=f"no `{readout}` row") for c in CLAIMS[:4]]
    rows: list[dict[str, Any]] = []
    plans = equal_compute_plans(ctl, learned)
    for s in plans:
        rows.append(_tested("family_gain", readout, task, None, ctl, s, lambda d: {"p": t_test_greater(d)}))
    if not plans:
        rows.append(_row("family_gain", readout, task, met=False, note=NO_SEARCH))
    if PROBE in ctl:
        p_of = lambda d: {"p": t_test_greater(d, -PROBE_MARGIN)}
        rows.append(_tested("family_probe", readout, task, None, ctl, PROBE, p_of))
    else:
        rows.append(_row("family_probe", readout, task, against=PROBE, met=False, note=f"no `{PROBE}` row"))
    rows.append(_oracle_gap(readout, task, ctl, plans))
    rows.append(_plans_vary(readout, task, ctl))
    return rows


def _oracle_gap(readout: str, task: str, ctl: dict[str, dict], plans: list[str]) -> dict[str, Any]:
    """The share of the gap from the strongest fixed-plan search at equal compute (by the table's own
    means: the claim harder, never easier) to the per-host oracle that the readout closes, on the means."""
    if not plans or ORACLE not in ctl:
        miss = NO_SEARCH if not plans else f"no `{ORACLE}` row"
        return _row("family_oracle_gap", readout, task, met=False, note=miss)
    best = max(plans, key=lambda n: ctl[n]["test_acc_mean"])
    r, c, o = (ctl[n]["test_acc_mean"] for n in (readout, best, ORACLE))
    row = _row("family_oracle_gap", readout, task, against=best, compute=_compute(ctl, readout, best),
               gap=o - c, closed=r - c)  # fmt: skip
    if o - c <= 0:
        return {**row, "met": False, "note": f"`{ORACLE}` is not above `{best}`: no gap to close"}
    share = (r - c) / (o - c)
    return {**row, "estimate": share, "met": share >= ORACLE_GAP_SHARE,
            "note": f"{r - c:+.2f} of the {o - c:.2f} points from `{best}` to `{ORACLE}`"}  # fmt: skip


def plan_variation(plans_per_seed: list[list[str]]) -> dict[str, Any]:
    """Of each seed's episodes (one fresh host each), those whose plan differs from the plan grown most on
    that seed: the share pooled over seeds, per seed, and how many distinct plans each seed grew."""
    differ = [len(p) - Counter(p).most_common(1)[0][1] if p else 0 for p in plans_per_seed]
    total = sum(len(p) for p in plans_per_seed)
    return {"share": sum(differ) / total if total else None,
            "per_seed": [d / len(p) if p else None for d, p in zip(differ, plans_per_seed)],
            "distinct_per_seed": [len(set(p)) for p in plans_per_seed]}  # fmt: skip


def _plans_vary(readout: str, task: str, ctl: dict[str, dict]) -> dict[str, Any]:
    plans = ctl[readout].get("plans_per_seed")
    if not plans:
        return _row("family_plans_vary", readout, task, met=False, note="no per-episode plans recorded")
    v = plan_variation(plans)
    oracle = ctl.get(ORACLE, {}).get("plans_per_seed")
    beside = f"; `{ORACLE}`'s {100 * plan_variation(oracle)['share']:.0f} %" if oracle else ""
    note = (f"{sum(len(p) for p in plans)} episodes; distinct plans per seed "
            f"{v['distinct_per_seed']}{beside}")  # fmt: skip
    return _row("family_plans_vary", readout, task, estimate=v["share"], per_seed=v["per_seed"],
                met=v["share"] is not None and v["share"] >= PLANS_VARY_SHARE, note=note)  # fmt: skip


def not_dominated(readout: str, task: str, budget: str | None, ctl: dict[str, dict],
                  learned: float | None) -> list[dict[str, Any]]:  # fmt: skip
    """The readout against every fixed-plan search at equal compute with no more parameters (its mean
    parameters added at most the readout's); its p-value, for H0 "the search is at least
    ``EQUIVALENCE_MARGIN`` points better", is the smaller of the test of "above" and TOST's, which is valid:
    each is at least the p-value of the lower one-sided test of that H0."""
    if readout not in ctl:
        return [_row("not_dominated", readout, task, budget, met=False, note=f"no `{readout}` row")]
    plans = equal_compute_plans(ctl, learned)
    if not plans:
        return [_row("not_dominated", readout, task, budget, met=False, note=NO_SEARCH)]
    mine = ctl[readout]["params_added_mean"]
    smaller = [s for s in plans if ctl[s]["params_added_mean"] <= mine]
    if not smaller:
        more = ", ".join(f"`{s}` {ctl[s]['params_added_mean']:,.0f}" for s in plans)
        return [_row("not_dominated", readout, task, budget, met=True,
                     note=f"no fixed plan at equal compute adds no more than its {mine:,.0f} parameters "
                          f"({more}): none dominates it")]  # fmt: skip

    def p_of(d: list[float]) -> dict[str, Any]:
        above, tost = t_test_greater(d), tost_equivalent(d, EQUIVALENCE_MARGIN, ALPHA)
        return {"p": min(above, tost["p"]), "p_above": above, "p_tost": tost["p"]}

    return [_tested("not_dominated", readout, task, budget, ctl, s, p_of) for s in smaller]


def _decide(row: dict[str, Any]) -> bool:
    """A tested claim's verdict from its Holm-adjusted p-value (and, for ``family_gain``, its estimate)."""
    ok = row["p_holm"] <= ALPHA
    if row["claim"] == "family_gain":
        return ok and row["estimate"] >= GAIN_OVER_CONSTANT
    return ok


def _correct(rows: list[dict[str, Any]]) -> None:
    """Holm's correction over each tested claim's rows (one readout's), in place: the adjusted p-value, the
    family's size, the interval at the level of the row's Holm step (two-sided ``1 - 2 level``, so its lower
    end is the one-sided bound the step tests) and the verdict."""
    for claim in TESTED:
        group = [r for r in rows if r["claim"] == claim and r["p"] is not None]
        h = holm([r["p"] for r in group], ALPHA)
        for r, adjusted, level in zip(group, h["adjusted"], h["levels"]):
            r["p_holm"], r["holm_m"], r["level"] = adjusted, len(group), 1.0 - 2.0 * level
            r["interval"] = list(mean_interval(r.pop("_diffs"), r["level"])[1])
            r["met"] = _decide(r)


def _unit(row: dict[str, Any]) -> str:
    return row["task"] if row["budget"] is None else f"{row['task']} at {row['budget']}"


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per claim: the units (a family, or a task at a budget) it is made on, those where every row of it is
    met, and ``met`` (on every unit; None where it is made on none)."""
    out = {}
    for claim in CLAIMS:
        units: dict[str, bool] = {}
        for r in rows:
            if r["claim"] == claim:
                units[_unit(r)] = units.get(_unit(r), True) and bool(r["met"])
        out[claim] = {"units": list(units), "met_units": [u for u, ok in units.items() if ok],
                      "met": all(units.values()) if units else None}  # fmt: skip
    return out


def checks(tasks: dict[str, dict], families: dict[str, dict]) -> dict[str, dict[str, Any]]:
    """What a judged run must be before its claims count: :data:`TRAINING_SEEDS` seeds on every task; final
    draws that are none of the selection draw, differ between seeds and meet no draw or host a family's
    pre-check recorded (``precheck.data_seeds``, ``precheck.eval_seeds``); :data:`MIN_FAMILIES` families
    that pass their pre-check."""
    seeds = {t: len(next(iter(e["controllers"].values()), {}).get("training_seeds") or [])
             for t, e in tasks.items()}  # fmt: skip
    why = []
    for t, e in tasks.items():
        d, pc = e.get("data", {}), e.get("precheck") or {}
        draws = [x for x in d.get("final_data_seeds", []) if x is not None]
        hosts = d.get("eval_seeds", [])
        if d.get("selection_data_seed") in draws:
            why.append(f"`{t}`'s final draws include its selection draw")
        if len(set(draws)) < len(draws) or len(set(hosts)) < len(hosts):
            why.append(f"`{t}`'s seeds share a final draw or evaluation hosts")
        if set(draws) & set(pc.get("data_seeds", [])) or set(hosts) & set(pc.get("eval_seeds", [])):
            why.append(f"`{t}` reads a draw or hosts its pre-check used")
    passing = [t for t, f in families.items() if f["passes"]]
    return {
        "training_seeds": {"needs": TRAINING_SEEDS, "per_task": seeds,
                           "met": bool(seeds) and min(seeds.values()) >= TRAINING_SEEDS},
        "draws": {"why": why, "met": not why},
        "families": {"needs": MIN_FAMILIES, "passing": passing,
                     "dropped": [t for t in families if t not in passing],
                     "met": len(passing) >= MIN_FAMILIES},
    }  # fmt: skip


def compute_view(tasks: dict[str, dict]) -> dict[str, dict[str, Any]]:
    """The controller's training compute counted against every row that spent host epochs before the
    evaluation (each search, each tuned rule): per task, the controller's ``learned_compute_host_epochs``
    and each such row's spend, its budget where it is a plan search, and its spend in units of it."""
    out = {}
    for t, e in tasks.items():
        learned = e.get("learned_compute_host_epochs")
        spent = {n: c["compute_host_epochs"] for n, c in e["controllers"].items()
                 if n not in LEARNED and c.get("compute_host_epochs")}  # fmt: skip
        rows = {n: {"compute_host_epochs": x, "budget_host_epochs": search_budget(n, learned),
                    "times_learned": x / learned if learned else None} for n, x in spent.items()}  # fmt: skip
        out[t] = {"learned_compute_host_epochs": learned, "rows": rows}
    return out


def judge(suite: dict[str, Any]) -> dict[str, Any]:
    """Every claim of protocol 2 on a results file's ``tasks``, for each readout of
    :data:`~esper.shell.eval.suite.tasks.LEARNED`: ``readouts[R]`` holds its ``claims`` (rows: ``claim``,
    ``task``, ``budget``, ``against``, ``estimate``, ``interval`` at ``level``, ``p``, ``p_holm`` of
    ``holm_m``, ``met``, ``note``, ``compute``), their ``summary`` and ``met``; ``families`` each family's
    pre-check; ``checks`` the run's; ``compute`` :func:`compute_view`; ``met``, the verdict: every check
    and every claim of :data:`JUDGED` met."""
    tasks = suite["tasks"]
    families = {t: precheck_verdict(e) for t, e in tasks.items() if e.get("family")}
    judged = [t for t, f in families.items() if f["passes"]]
    budget_units = [*judged, *(t for t in (DEFAULT_TASK,) if t in tasks and t not in judged)]
    readouts = {}
    for r in LEARNED:
        rows = [row for t in judged for row in family_claims(r, t, tasks[t])]
        for t in budget_units:
            learned = tasks[t].get("learned_compute_host_epochs")
            for label, ctl in budgets(tasks[t]):
                rows += not_dominated(r, t, label, ctl, learned)
        _correct(rows)
        s = summary(rows)
        readouts[r] = {"claims": rows, "summary": s,
                       "met": bool(rows) and all(v["met"] is not False for v in s.values())}  # fmt: skip
    ran = checks(tasks, families)
    met = readouts[JUDGED]["met"] and all(c["met"] for c in ran.values())
    return {"protocol": PROTOCOL, "alpha": ALPHA, "judged": JUDGED, "families": families, "checks": ran,
            "readouts": readouts, "compute": compute_view(tasks), "met": met}  # fmt: skip


def _pct(level: float | None) -> str:
    return "" if level is None else f" ({100 * level:.4g} %)"


def _p(x: float | None) -> str:
    return "" if x is None else ("< 0.0001" if x < 1e-4 else f"{x:.4f}")


def _estimate(row: dict[str, Any]) -> str:
    e = row["estimate"]
    if e is None:
        return ""
    if row["claim"] == "family_oracle_gap":
        return f"{e:.2f} of the gap"
    if row["claim"] == "family_plans_vary":
        return f"{100 * e:.0f} % of episodes"
    return f"{e:+.2f}"


def _said(row: dict[str, Any]) -> str:
    if row["met"] is None:
        return "not judged"
    how = ""
    if row["claim"] == "not_dominated" and row["interval"] is not None and row["met"]:
        lo, hi = row["interval"]
        inside = -EQUIVALENCE_MARGIN < lo and hi < EQUIVALENCE_MARGIN
        ways = [w for w, ok in (("above", lo > 0), (f"within ±{EQUIVALENCE_MARGIN:g}", inside)) if ok]
        how = f" ({', '.join(ways)})" if ways else ""
    return ("met" if row["met"] else "**not met**") + how


def claim_table(rows: list[dict[str, Any]]) -> list[str]:
    """The claims of one readout as a table: estimate, interval at its Holm step's level, p-values, verdict
    and the host epochs each side spent before the evaluation."""
    out = ["| claim | task | budget | against | host epochs (readout / against) | estimate | interval | p | "
           "Holm p (of m) | verdict |", "|---|---|---|---|---|---:|---|---:|---:|---|"]  # fmt: skip
    for r in rows:
        c = r["compute"] or {}
        spent = " / ".join("n/a" if x is None else f"{x:,.0f}" for x in (c.get("readout"), c.get("against")))
        iv = "" if r["interval"] is None else "[{:+.2f}, {:+.2f}]".format(*r["interval"]) + _pct(r["level"])
        holm_p = "" if r["p_holm"] is None else f"{_p(r['p_holm'])} (of {r['holm_m']})"
        against = f"`{r['against']}`" if r["against"] else ""
        note = f"; {r['note']}" if r["note"] else ""
        spent = spent if c else ""
        out.append(f"| `{r['claim']}` | `{r['task']}` | {r['budget'] or ''} | {against} | {spent} | "
                   f"{_estimate(r)} | {iv} | {_p(r['p'])} | {holm_p} | {_said(r)}{note} |")  # fmt: skip
    return out


def verdict_lines(v: dict[str, Any]) -> list[str]:
    """:func:`judge`'s verdict in words and tables: the run's checks, each claim of the judged readout over
    its units, and every claim's row, for both readouts."""
    c = v["checks"]
    seeds = c["training_seeds"]
    per = ", ".join(f"`{t}` {n}" for t, n in seeds["per_task"].items())
    fam = c["families"]
    passing = ", ".join(f"`{t}`" for t in fam["passing"]) or "none"
    dropped = "; ".join(f"`{t}` ({', '.join(v['families'][t]['why'])})" for t in fam["dropped"])
    draws = "met" if c["draws"]["met"] else f"**not met** ({'; '.join(c['draws']['why'])})"
    lines = [
        f"**The verdict (protocol {v['protocol']}, issue 89; the rule is docs/suite.md's \"How a run is "
        f"judged (issue 89)\"): {'met' if v['met'] else 'not met'}** for `{v['judged']}`; "
        + ", ".join(f"`{r}`" for r in v["readouts"] if r != v["judged"])
        + " reported beside it, judging nothing. Each claim's Holm family is its comparisons for one readout "
        f"across every family, task and budget (family-wise error {v['alpha']:g}); an interval is drawn at "
        "the level of its Holm step.",
        "",
        f"- Training seeds ({seeds['needs']} asked on every task): {per}: "
        f"{'met' if seeds['met'] else '**not met**'}.",
        f"- Fresh draws and hosts: {draws}.",
        f"- Families that pass their pre-check ({fam['needs']} asked): {passing}"
        f"{f'; dropped by it: {dropped}' if dropped else ''}: {'met' if fam['met'] else '**not met**'}.",
    ]  # fmt: skip
    for claim, s in v["readouts"][v["judged"]]["summary"].items():
        if s["met"] is None:
            said = "made on nothing in this run"
        else:
            where = ", ".join(s["met_units"]) or "none"
            met = "met" if s["met"] else "**not met**"
            said = f"{met}: {len(s['met_units'])} of {len(s['units'])} ({where})"
        lines.append(f"- `{claim}`: {CLAIM_WORDS[claim]}: {said}.")
    for r in sorted(v["readouts"], key=lambda r: r != v["judged"]):  # the judged readout first
        if (got := v["readouts"][r])["claims"]:
            role = "judged" if r == v["judged"] else "reported, judging nothing"
            lines += ["", f"Every claim for `{r}` ({role}):", "", *claim_table(got["claims"])]
    return [*lines, ""]


def paired_lines(entry: dict[str, Any]) -> list[str]:
    """One task's rows paired by training seed against each readout, with the host epochs each row spent
    beside the controller's training: unadjusted 95 % intervals, for reading (the claims carry the
    corrected ones)."""
    ctl = entry["controllers"]
    readouts = [r for r in (JUDGED, *LEARNED) if r in ctl]
    readouts = list(dict.fromkeys(readouts))
    if not readouts:
        return []
    learned = entry.get("learned_compute_host_epochs")

    def diff(r: str, n: str) -> str:
        try:
            d = paired(ctl, r, n)
            m, (lo, hi) = mean_interval(d, 0.95)
        except ValueError:
            return "n/a"
        return f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]"

    head = " | ".join(f"`{r}` minus it" for r in readouts)
    training = "n/a" if learned is None else f"{learned:,.0f}"
    out = ["Paired by training seed (the readout minus each row, seed by seed; 95 % intervals, "
           "unadjusted; host epochs spent before the evaluation, beside the controller's training, "
           f"{training}):", "", f"| row | host epochs (x the controller's) | {head} |",
           "|---|---:|" + "---|" * len(readouts)]  # fmt: skip
    for n, c in ctl.items():
        if n in readouts:
            continue
        spent = c.get("compute_host_epochs", 0)
        times = f" ({spent / learned:.2f}x)" if learned and spent else ""
        out.append(f"| {n} | {spent:,.0f}{times} | " + " | ".join(diff(r, n) for r in readouts) + " |")
    return out


def family_lines(entry: dict[str, Any]) -> list[str]:
    """A family's pre-check against its bar, and whether it stays in the run."""
    if not entry.get("family"):
        return []
    f = precheck_verdict(entry)
    pc = f["precheck"] or {}
    said = "passes" if f["passes"] else f"**fails** ({', '.join(f['why'])}): dropped, not judged"
    bar = ", ".join(f"{k} {b:g}" for k, b in PRECHECK_BAR.items())
    gap, differs = pc.get("oracle_minus_best_constant"), pc.get("share_best_differs")
    return [f"A family. Its pre-check, committed before any controller trained on it: {pc.get('hosts')} "
                f"hosts, `{ORACLE}` minus the best constant plan {gap} points, the best plan differing on "
                f"{differs} of hosts (the bar: {bar}): {said}."]  # fmt: skip


def budget_lines(entry: dict[str, Any]) -> list[str]:
    """Each budget's rows (the controller given the budget as an input, beside the searches within it)."""
    if not entry.get("budgets"):
        return []
    out = ["At each budget (the controller reads it; the searches hold to it):", "",
           "| budget | row | test acc % [95 % CI] | params added | host epochs spent |",
           "|---|---|---|---:|---:|"]  # fmt: skip
    for label, b in entry["budgets"].items():
        for n, c in b["controllers"].items():
            lo, hi = c["test_acc_ci95"]
            out.append(
                f"| {label} | {n} | {c['test_acc_mean']:.1f} [{lo:.1f}, {hi:.1f}] | "
                f"{c['params_added_mean']:,.0f} | {c.get('compute_host_epochs', 0):,.0f} |"
            )
    return out


def trying_view(tasks: dict[str, dict], readout: str = JUDGED) -> dict[str, Any] | None:
    """``readout`` minus each row of :data:`AGAINST_TRYING`, on every task that has ``readout`` and a row that
    tries (``born_big`` or ``probe``), paired by training seed: per row and task the estimate, its 95 %
    interval (unadjusted), the one-sided p-values of "above" and "below" and TOST's within
    ``±EQUIVALENCE_MARGIN``, each Holm-adjusted across the tasks (one family per row and test), the row's
    parameters added and host epochs, and ``said``: "above" or "below" where its adjusted test rejects,
    "as good as" where TOST's does (both may hold), else "not told apart". Reported, judging nothing; None
    where no task has a row that tries."""
    present = [t for t, e in tasks.items() if readout in e["controllers"]
               and any(n in e["controllers"] for n in ("born_big", PROBE))]  # fmt: skip
    if not present:
        return None
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for n in AGAINST_TRYING:
        cells = {}
        for t in present:
            ctl = tasks[t]["controllers"]
            if n not in ctl or len(d := paired(ctl, readout, n)) < 2:
                continue
            m, interval = mean_interval(d, 0.95)
            cells[t] = {"estimate": m, "interval": list(interval), "seeds": len(d),
                        "p_above": t_test_greater(d), "p_below": t_test_less(d),
                        "p_tost": tost_equivalent(d, EQUIVALENCE_MARGIN, ALPHA)["p"],
                        "params_added": ctl[n]["params_added_mean"],
                        "compute_host_epochs": ctl[n].get("compute_host_epochs", 0)}  # fmt: skip
        for test in ("above", "below", "tost"):
            adjusted = holm([c[f"p_{test}"] for c in cells.values()], ALPHA)["adjusted"]
            for c, p in zip(cells.values(), adjusted):
                c[f"p_{test}_holm"] = p
        for c in cells.values():
            words = [w for k, w in TRYING_WORDS.items() if c[f"p_{k}_holm"] <= ALPHA]
            c["said"] = ", ".join(words) or "not told apart"
        if cells:
            rows[n] = cells
    return {"readout": readout, "tasks": present, "rows": rows, "alpha": ALPHA, "margin": EQUIVALENCE_MARGIN}


def trying_lines(view: dict[str, Any] | None) -> list[str]:
    """:func:`trying_view` as a table, a row per baseline and a column per task (nothing where there is
    none)."""
    if not view or not view["rows"]:
        return []
    tasks, r = view["tasks"], view["readout"]
    seeds = sorted({c["seeds"] for cells in view["rows"].values() for c in cells.values()})
    head = " | ".join(f"`{t}`" for t in tasks)
    out = [f"**The controller beside the baselines that try** (issue 89; reported, judging nothing): `{r}` "
           f"minus each row, paired by training seed ({'/'.join(map(str, seeds))} seeds), the mean and its "
           "95 % interval (unadjusted); \"above\" and \"below\" where a one-sided t test, Holm-adjusted "
           f"across the tasks for that row, rejects at {view['alpha']:g}; \"as good as\" where TOST within "
           f"±{view['margin']:g} point, adjusted alike, does; else \"not told apart\".", "",
           f"| minus | {head} |", "|---|" + "---|" * len(tasks)]  # fmt: skip
    for n, cells in view["rows"].items():
        shown = []
        for t in tasks:
            c = cells.get(t)
            shown.append("" if c is None else "{:+.2f} [{:+.2f}, {:+.2f}] {}".format(
                c["estimate"], *c["interval"], c["said"]))  # fmt: skip
        out.append(f"| `{n}` | " + " | ".join(shown) + " |")
    return [*out, ""]


__all__ = [
    "AGAINST_TRYING", "ALPHA", "CLAIMS", "CLAIM_WORDS", "EQUIVALENCE_MARGIN", "GAIN_OVER_CONSTANT", "JUDGED",
    "MIN_FAMILIES", "NO_SEARCH", "ORACLE_GAP_SHARE", "PLANS_VARY_SHARE", "PRECHECK_BAR", "PROBE_MARGIN",
    "PROTOCOL", "TESTED", "TRAINING_SEEDS", "TRYING_WORDS", "budget_lines", "budgets", "checks",
    "claim_table", "compute_view", "equal_compute_plans", "family_claims", "family_lines", "judge",
    "not_dominated", "paired",
    "paired_lines", "plan_variation", "precheck_verdict", "protocol_of", "search_budget", "summary",
    "trying_lines", "trying_view", "verdict_lines",
]  # fmt: skip
