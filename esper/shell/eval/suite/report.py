"""The suite's tables and plots: per task, every controller's held-out accuracy with its 95 % interval
over training seeds, parameters added and compute; the issue's two goals read off each table; accuracy
against parameters per task and accuracy against compute (``plan_search``'s curve, the learned
controller on the same axes)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from esper.shell.eval.output import COLORS, FLOP_COLUMNS, format_flops
from esper.shell.eval.suite import verdict
from esper.shell.eval.suite.pooling import shares
from esper.shell.eval.suite.tasks import (
    BORN_OWN,
    CAP_SEARCH,
    FOSSILIZING,
    IN_CAP,
    LEARNED,
    OWN_PLAN,
    PLAN_MULTIPLES,
    TRYING,
    beside_readout,
    plan_name,
)
from esper.shell.eval.suite.transfer import READOUT
from esper.shell.telemetry.plots import finish_figure, new_figure

#: Whom the learned controller must beat with disjoint intervals (the issue's first goal).
MUST_BEAT = ("static", "random", "heuristic", "heuristic_tuned")
#: Within this many points of ``plan_search`` at equal compute, or above it (the issue's second goal).
WITHIN = 1.0
#: The transferred controller's share of ``grow_all``'s gain over ``static`` on the held-out task
#: (issue 46's goal, with :data:`MUST_BEAT` by disjoint intervals).
TRANSFER_GAIN_SHARE = 0.80


def _f(x: float | None, nd: int = 1) -> str:
    return "n/a" if x is None else f"{x:,.{nd}f}"


def learned_rows(controllers: dict[str, dict]) -> list[str]:
    """The learned readouts among ``controllers``: the judged arm's (:data:`LEARNED`), then any arm's kept
    beside it (``ppo_greedy[default]``: :func:`esper.shell.eval.suite.tasks.beside_name`)."""
    return [n for n in LEARNED if n in controllers] + [n for n in controllers if beside_readout(n)]


def goals(controllers: dict[str, dict]) -> dict[str, Any]:
    """Per learned readout (:func:`learned_rows`): whom it is above with disjoint 95 % intervals, and its
    distance to ``plan_search`` at equal compute (``plan_search@1x``)."""
    out: dict[str, Any] = {}
    equal = controllers.get(plan_name(1.0))
    for name in learned_rows(controllers):
        c = controllers[name]
        above = {b: c["test_acc_ci95"][0] > controllers[b]["test_acc_ci95"][1]
                 for b in MUST_BEAT if b in controllers}  # fmt: skip
        gap = c["test_acc_mean"] - equal["test_acc_mean"] if equal else None
        out[name] = {"disjoint_above": above, "all_disjoint_above": bool(above) and all(above.values()),
                     "minus_plan_search_equal_compute": gap,
                     "within_1_of_plan_search": gap is not None and gap >= -WITHIN,
                     "gain_share": _gain_share(controllers, name)}  # fmt: skip
        if (capped := controllers.get(CAP_SEARCH)) is not None:
            # the same search within the controller's cap: reported beside the goal, not for it
            cap_gap = c["test_acc_mean"] - capped["test_acc_mean"]
            out[name]["minus_plan_search_cap_equal_compute"] = cap_gap
            out[name]["within_1_of_plan_search_cap"] = cap_gap >= -WITHIN
        own = controllers.get(OWN_PLAN)
        if name == "ppo_greedy" and own is not None and gap is not None:
            # the gap split: the plans chosen (plan search's against the controller's own, both grown as
            # fixed plans) and how the controller grew its plan (its plan fixed against the controller)
            out[name]["gap_split"] = {"plan": equal["test_acc_mean"] - own["test_acc_mean"],
                                      "growing": own["test_acc_mean"] - c["test_acc_mean"]}  # fmt: skip
            if (in_cap := controllers.get(IN_CAP)) is not None:
                # the plan part split again: what the search's lack of a cap buys it, and the best plan
                # within the cap against the controller's own
                out[name]["gap_split"]["cap"] = equal["test_acc_mean"] - in_cap["test_acc_mean"]
                out[name]["gap_split"]["plan_within_cap"] = in_cap["test_acc_mean"] - own["test_acc_mean"]
            if (fossilizing := controllers.get(FOSSILIZING)) is not None:
                # of the growing part, what fossilizing as soon as legal recovers
                recovers = fossilizing["test_acc_mean"] - c["test_acc_mean"]
                out[name]["gap_split"]["fossilizing_recovers"] = recovers
    return out


def suite_verdict(tasks: dict[str, dict], readout: str = "ppo_greedy") -> dict[str, Any] | None:
    """The issue's two goals over the suite's tasks, read off each task's :func:`goals` for ``readout``:
    the first met where it is met on every task; the second where it is met on at least half of them
    (``ceil(n / 2)``), against ``plan_search@1x`` and, beside it, against ``plan_search_cap@1x``. The tasks
    that meet each are listed. None where no task has the readout."""
    per = {t: goals(v["controllers"]).get(readout) for t, v in tasks.items()}
    per = {t: g for t, g in per.items() if g is not None}
    if not per:
        return None
    need = math.ceil(len(per) / 2)
    first = [t for t, g in per.items() if g["all_disjoint_above"]]
    second = [t for t, g in per.items() if g["within_1_of_plan_search"]]
    capped = [t for t, g in per.items() if "within_1_of_plan_search_cap" in g]
    second_cap = [t for t in capped if per[t]["within_1_of_plan_search_cap"]]
    return {
        "readout": readout, "tasks": list(per),
        "first_goal": {"tasks_met": first, "met": len(first) == len(per)},
        "second_goal": {"needs": need, "tasks_met": second, "met": len(second) >= need},
        "second_goal_within_cap": ({"needs": need, "tasks_met": second_cap, "met": len(second_cap) >= need}
                                   if len(capped) == len(per) else None),
    }  # fmt: skip


def beside_verdicts(tasks: dict[str, dict]) -> dict[str, dict[str, Any]]:
    """:func:`suite_verdict` for each greedy readout of an arm kept beside the judged one and present on
    every task (``ppo_greedy[default]``): where the two arms would meet a goal differently, it shows."""
    rows = [learned_rows(t["controllers"]) for t in tasks.values()]
    names = [n for n in rows[0] if beside_readout(n) == "ppo_greedy"] if rows else []
    return {n: suite_verdict(tasks, readout=n) for n in names if all(n in r for r in rows)}


def verdict_lines(v: dict[str, Any] | None) -> list[str]:
    """:func:`suite_verdict` in words (nothing where there is none)."""
    if v is None:
        return []
    n, r = len(v["tasks"]), v["readout"]

    def said(goal: dict[str, Any], of: str) -> str:
        met = goal["tasks_met"]
        where = ", ".join(f"`{t}`" for t in met) if met else "none"
        return f"**{'met' if goal['met'] else 'not met'}**: {len(met)} of {n}{of} ({where})"

    first = said(v["first_goal"], ", every task needed")
    second = said(v["second_goal"], f", {v['second_goal']['needs']} needed")
    beside = ", the arm kept beside the judged one (it judges nothing)" if beside_readout(r) else ""
    whose = f"`{r}`{beside}"
    line = (f"**The issue's goals over the {n} tasks, for {whose}.** First (above `static`, `random`, "
            f"`heuristic` and `heuristic_tuned` with disjoint 95 % intervals on every task): {first}. Second "
            f"(within {WITHIN:g} point of `plan_search@1x` or above it on at least half of the tasks): "
            f"{second}.")  # fmt: skip
    if (cap := v.get("second_goal_within_cap")) is not None:
        capped = said(cap, f", {cap['needs']} needed")
        line += (f" The same against `{CAP_SEARCH}`, the search within the controller's cap (reported "
                 f"beside the issue's goal): {capped}.")  # fmt: skip
    return [line, ""]


def _gain_share(controllers: dict[str, dict], name: str) -> float | None:
    """``name``'s gain over ``static`` as a share of ``grow_all``'s
    (:func:`esper.shell.eval.suite.pooling.shares`); None without both rows or without headroom to share."""
    static, grow_all, c = controllers.get("static"), controllers.get("grow_all"), controllers[name]
    if not (static and grow_all):
        return None
    return shares(c["test_acc_mean"], c["params_added_mean"], static["test_acc_mean"],
                  grow_all["test_acc_mean"], grow_all["params_added_mean"])[0]  # fmt: skip


def _flags(settings: dict[str, Any]) -> str:
    return " ".join(f"--{k} {v:g}" if isinstance(v, float) else f"--{k} {v}" for k, v in settings.items())


def configuration_sentence(tasks: dict[str, dict]) -> str:
    """What the tasks' controllers were trained with, from each task's ``controller_settings`` (the
    recorded settings that depart from its preset; tasks pooled before they were recorded say nothing):
    the default's on every task, the default's with the same flags on every task, or, where the tasks
    differ or a task's seeds do (a setting recorded as a list of per-seed values), each task's flags --
    which is not one configuration."""
    known = {task: t["controller_settings"] for task, t in tasks.items() if "controller_settings" in t}
    distinct = {_flags(s) for s in known.values()}
    if len(distinct) > 1 or any(isinstance(v, list) for s in known.values() for v in s.values()):
        each = "; ".join(f"`{task}` {f'`{_flags(s)}`' if s else 'none'}" for task, s in known.items())
        return (f"**Not one controller configuration**: the tasks' controllers depart from their presets "
                f"differently ({each}).")  # fmt: skip
    flags = f" with `{distinct.pop()}` on every task" if distinct and any(known.values()) else ""
    return (f"One controller configuration: every task trains the default's controller, reward and lifecycle"
            f"{flags} (its preset sets only the task and its sizes).")  # fmt: skip


def markdown(info: dict, suite: dict[str, Any], command: str, plot_files: dict[str, list[Path]]) -> str:
    lines = [
        f"# The task suite ({info.get('date')}, {info.get('host')}, revision {info.get('git')})",
        "",
        f"`{command}`",
        "",
        f"{info.get('cpu')}, {info.get('cpu_count')} cores, torch {info.get('torch')}. "
        f"{configuration_sentence(suite['tasks'])} Each training seed k is evaluated on its own fresh hosts "
        "(evaluation seed 1000 + k) and, for generated data, a fresh draw (data seed 100000 + k; a fixed "
        "dataset is read on its test split); 95 % intervals are over training seeds (Student-t of the "
        "per-seed means). Everything chosen (the controller's weights, `heuristic_tuned`'s thresholds, "
        "`plan_search`'s plan) was chosen on the training seed's own hosts and the task's own data draw, "
        "by validation accuracy. Host epochs: what a controller spent before the evaluation (training or "
        "search; an episode is `max_epochs` host epochs per env).",
        "",
    ]
    protocol = verdict.protocol_of(suite)
    if protocol >= 2:  # issue 89's claims (esper.shell.eval.suite.verdict)
        lines += verdict.verdict_lines(verdict.judge(suite))
    elif len(suite["tasks"]) > 1:  # issue 45's goals: the runs judged before protocol 2 render as they did
        lines += verdict_lines(suite_verdict(suite["tasks"]))
        for v in beside_verdicts(suite["tasks"]).values():
            lines += verdict_lines(v)
    lines += verdict.trying_lines(suite.get("trying"))
    for task, t in suite["tasks"].items():
        src = [f"Pooled earlier, as in `{t['merged_from']}` (`--merge`).", ""] if t.get("merged_from") else []
        lines += _section(f"## {task} (preset `{t['preset']}`)", t, src, plot_files.get(task, []), protocol)
    for task, t in suite.get("transfer", {}).items():
        am = t.get("amortization") or {}
        trained = ", ".join(f"`{x}`" for x in t.get("trained_on", []))
        flags = " ".join(t.get("flags", []))
        intro = [
            f"Zero-shot: the controller trained on {trained} (the default with `{flags}`) acts on `{task}`, "
            "which it never saw; it spent no host epochs there (the column counts its training elsewhere). "
            "The baselines and the searches run on this task's training hosts and own draw.",
            "",
        ]
        intro += [transfer_verdict(goals(t["controllers"]), am.get("readout", READOUT)), ""]
        if am.get("host_epochs") is not None:
            intro += [
                f"**Amortization:** `plan_search` on `{task}` needs {am['bound']} "
                f"{_f(am['host_epochs'], 0)} host epochs to reach the transferred `{am['readout']}`'s "
                f"{_f(am['test_acc_mean'])} % (read off its curve at "
                f"{', '.join(f'{m:g}' for m in PLAN_MULTIPLES)} times the learned controller's training "
                "compute).",
                "",
            ]
        key = f"transfer-{task}"
        lines += _section(f"## Transfer to {task} (held out of training)", t, intro, plot_files.get(key, []))
    lines += [f"![{p.stem}]({p.name})" for p in plot_files.get("", [])]
    return "\n".join(lines) + "\n"


def _section(title: str, t: dict[str, Any], intro: list[str], plot_files: list[Path],
             protocol: int = 1) -> list[str]:  # fmt: skip
    """One task's (or one held-out task's) table, its goals (protocol 1) or, under protocol 2, its
    pre-check where it is a family, its rows paired by seed against each readout and its budgets, and
    its plots."""
    ctl = t["controllers"]
    d = t["data"]
    seeds = next(iter(ctl.values()))["training_seeds"] if ctl else []
    draws = d["final_data_seeds"]
    draw = "the test split of a fixed dataset" if draws and draws[0] is None else f"data seeds {draws}"
    # the FLOPs an evaluation episode spent, where some row records them (a file pooled before they were
    # counted renders as it did; a row without them in a table with them reads —)
    counted = any(c.get(k) is not None for c in ctl.values() for _, k in FLOP_COLUMNS)
    flops_head = " FLOPs an episode: train · validation · what-if |" if counted else ""
    lines = [
        title,
        "",
        *intro,
        f"Training seeds {seeds}; {d['episodes_per_seed']} fresh hosts each (evaluation seeds "
        f"{d['eval_seeds']}); final draw: {draw}; selection draw: data seed {d['selection_data_seed']}. "
        f"The learned controller's training: {_f(t.get('learned_compute_host_epochs'), 0)} host epochs."
        f"{_revision_line(t.get('revisions', {}))}",
        "",
        f"| controller | test acc % [95 % CI] | params added | host epochs spent |{flops_head} chosen on "
        "training hosts | grown most (share of episodes) |",
        f"|---|---|---:|---:|{'---:|' if counted else ''}---|---|",
    ]
    for name, c in ctl.items():
        lo, hi = c["test_acc_ci95"]
        chosen = c.get("chosen", {})
        picks = sorted({str(v) if not isinstance(v, dict) else _thresholds(v) for v in chosen.values()})
        flops = f" {' · '.join(format_flops(c.get(k)) for _, k in FLOP_COLUMNS)} |" if counted else ""
        lines.append(
            f"| {name} | {_f(c['test_acc_mean'])} [{_f(lo)}, {_f(hi)}] | "
            f"{_f(c['params_added_mean'], 0)} | "
            f"{_f(c['compute_host_epochs'], 0)} |{flops} {'; '.join(f'`{p}`' for p in picks[:3])}"
            f"{f' (+{len(picks) - 3} more)' if len(picks) > 3 else ''} | {_grown(c.get('grown', {}))} |"
        )
    view = _search_view_lines(t.get("search_view", {}))
    if protocol >= 2:
        blocks = [b for b in (verdict.family_lines(t), verdict.paired_lines(t), verdict.budget_lines(t)) if b]
        judged = [ln for i, b in enumerate(blocks) for ln in ([""] if i else []) + b]
    else:
        judged = _goal_lines(goals(ctl))
    lines += ["", *judged, *_fates_lines(ctl), *view, ""]
    lines += [f"![{p.stem}]({p.name})" for p in plot_files]
    lines.append("")
    return lines


def _grown(grown: dict[str, int], top: int = 2) -> str:
    """The plans grown most often, each with its share of the episodes (``none`` for the empty plan)."""
    total = sum(grown.values())
    if not total:
        return ""
    return "; ".join(f"`{plan or 'none'}` {n / total:.0%}" for plan, n in list(grown.items())[:top])


def _revision_line(revs: dict[str, dict]) -> str:
    """ " Trained at `abc1234` (seeds ...), evaluated at ...; trained on MACHINE (seeds ...), evaluated on
    ..." from the per-seed revisions and machines (the machines only where some seed recorded one)."""
    parts = []
    for what, verb in (("train", "Trained at"), ("evaluate", "evaluated at"),
                       ("train_machine", "trained on"), ("evaluate_machine", "evaluated on")):  # fmt: skip
        by: dict[str, list[str]] = {}
        for k, r in revs.items():
            by.setdefault(r.get(what) or "unrecorded", []).append(k)
        if not by or (what.endswith("machine") and set(by) == {"unrecorded"}):
            continue
        fmt = "`{}`" if not what.endswith("machine") else "{}"
        seeds = (f"{fmt.format(x)} (seeds {', '.join(ks)})" for x, ks in by.items())
        parts.append(f"{verb} {', '.join(seeds)}")
    return f" {'; '.join(parts)}." if parts else ""


def _fates_lines(ctl: dict[str, dict]) -> list[str]:
    """What became of the seeds each controller germinated
    (:func:`esper.shell.eval.suite.pooling.seed_fates`)."""
    rows = [(n, c["seed_fates"]) for n, c in ctl.items() if c.get("seed_fates", {}).get("germinated")]
    if not rows:
        return []
    parts = "; ".join(f"`{n}` {f['unfossilized']:.2f} / {f['lost']:.2f} / {f['kept_nothing_share']:.0%}"
                      for n, f in rows)  # fmt: skip
    return [
        "",
        "Seeds per episode in the final host but never fossilized (their input detached to the "
        "end) / germinated but neither pruned nor in the final host / episodes that germinated and "
        f"kept nothing: {parts}.",
    ]


def _search_view_lines(view: dict[str, dict]) -> list[str]:
    """Per seed, what the largest plan search scored on the training hosts, beside the controller's plan."""
    if not view:
        return []

    def plan(c: dict | None) -> str:
        if c is None:
            return "none"
        return f"`{c['plan']}` {c['val_acc']:.1f} % ({c['params']:,} params, {c['episodes']} episodes)"

    out = ["", "What the largest plan search scored on each seed's training hosts (validation accuracy; "
           "a plan that ran few episodes is noisy), beside `ppo_greedy`'s most grown plan:", ""]  # fmt: skip
    for k, v in view.items():
        mine = v["controller_plan_scored"]
        unscored = f"`{v['controller_plan']}`, not among the {v['plans_scored']} scored"
        in_cap = (
            ""
            if v["cap"] is None
            else (f"best within the controller's cap of {v['cap']:g}: {plan(v['best_within_cap'])}; ")
        )
        out.append(f"- seed {k} (`{v['search']}`): best {plan(v['best'])}; {in_cap}the controller's: "
                   f"{plan(mine) if mine else unscored}.")  # fmt: skip
    return out


def _thresholds(chosen: dict) -> str:
    """A tuned rule's choice in words: the heuristic's settings that differ from the reference's, or
    another rule's settings (``probe``'s) as they are."""
    from esper.shell.baselines.heuristic import HeuristicThresholds

    if not set(chosen) <= set(HeuristicThresholds.__slots__):
        return ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in chosen.items())
    changed = HeuristicThresholds(**chosen).changed()
    return ", ".join(f"{k} {v:g}" if not isinstance(v, str) else f"{k} {v}"
                     for k, v in changed.items()) or "the reference's"  # fmt: skip


def _goal_lines(g: dict[str, Any]) -> list[str]:
    out = []
    for name, v in g.items():
        missed = [b for b, ok in v["disjoint_above"].items() if not ok]
        beats = "above all four with disjoint intervals" if v["all_disjoint_above"] else (
            f"**not** above {', '.join(missed)} with disjoint intervals")  # fmt: skip
        gap = v["minus_plan_search_equal_compute"]
        near = (
            "n/a"
            if gap is None
            else f"{gap:+.1f} points against `plan_search` at equal compute"
            + (" (within 1 point or above)" if v["within_1_of_plan_search"] else " (**trails**: diagnose)")
        )
        if (cap_gap := v.get("minus_plan_search_cap_equal_compute")) is not None:
            near += (
                f"; {cap_gap:+.1f} against the same search within the controller's cap, `{CAP_SEARCH}`"
                + (" (within 1 point or above)" if v["within_1_of_plan_search_cap"] else "")
            )
        split = v.get("gap_split")
        if split is not None:
            near += (
                f"; of the points it trails by, {split['plan']:+.1f} are the plan chosen "
                f"(`plan_search@1x` against `{OWN_PLAN}`, its own most grown plan grown as a "
                f"fixed plan"
            )
            if "cap" in split:
                near += (
                    f"; of those, {split['cap']:+.1f} are the search's lack of a cap, against its best "
                    f"plan within the controller's cap, `{IN_CAP}`, and {split['plan_within_cap']:+.1f} "
                    f"that plan against the controller's own"
                )
            near += f") and {split['growing']:+.1f} how it grew that plan (timing, blending)"
            if "fossilizing_recovers" in split:
                near += (
                    f"; fossilizing wherever it is legal (`{FOSSILIZING}`) changes `ppo_greedy` by "
                    f"{split['fossilizing_recovers']:+.1f}"
                )
        share = v.get("gain_share")
        share = "" if share is None else f"; {share:.2f} of `grow_all`'s gain over `static`"
        out.append(f"- `{name}`: {beats}{share}; {near}.")
    return out


def transfer_verdict(g: dict[str, Any], readout: str) -> str:
    """Issue 46's goal, read off a held-out task's goals: ``readout`` above :data:`MUST_BEAT` with
    disjoint intervals and at least :data:`TRANSFER_GAIN_SHARE` of ``grow_all``'s gain."""
    v = g.get(readout)
    if v is None or v.get("gain_share") is None:
        return f"**Transfer goal:** not judged (no `{readout}`, `static` or `grow_all` row)."
    share_ok = v["gain_share"] >= TRANSFER_GAIN_SHARE
    met = share_ok and v["all_disjoint_above"]
    return (
        f"**Transfer goal** (`{readout}` at least {TRANSFER_GAIN_SHARE:.2f} of `grow_all`'s gain over "
        f"`static`, and above {', '.join(MUST_BEAT)} with disjoint 95 % intervals): "
        f"**{'met' if met else 'not met'}** ({v['gain_share']:.2f} of the gain, "
        f"{'above all four' if v['all_disjoint_above'] else 'not above all four'})."
    )


#: The plan searches' colours, lightest at the smallest budget (none of them a controller's colour).
PLAN_COLORS = dict(zip(map(plan_name, PLAN_MULTIPLES), ("#f6bd9f", "#ee9674", "#e76f51", "#a8442a")))
#: The diagnostic rows (the controller's own plan, its fossilizing readout, the search's plan in the cap)
#: and the search within the cap.
READING_COLORS = {OWN_PLAN: "#0077b6", FOSSILIZING: "#48cae4", IN_CAP: "#6a4c93", CAP_SEARCH: "#9d4edd"}
#: The baselines that try harder (``--trying``, issue 89): the networks born at their final size in greens,
#: the probe and the widened heuristic and the timed search beside them.
TRYING_COLORS = {"born_big": "#2d6a4f", BORN_OWN: "#74c69d", "probe": "#ffb703",
                 "heuristic_tuned_wide": "#8d6e63", "plan_search_timed@1x": "#ff006e"}  # fmt: skip


def color(name: str) -> str | None:
    """A controller's colour in every suite plot (None: matplotlib's next)."""
    return COLORS.get(name) or PLAN_COLORS.get(name) or READING_COLORS.get(name) or TRYING_COLORS.get(name)


def plots(out: Path, stem: str, suite: dict[str, Any]) -> dict[str, list[Path]]:
    """Per task (and per held-out task of a transfer run, ``transfer-TASK``), test accuracy against
    parameters added and against host epochs spent; ``{task: [paths]}``."""
    files: dict[str, list[Path]] = {}
    entries = [*suite["tasks"].items(), *((f"transfer-{k}", v) for k, v in suite.get("transfer", {}).items())]
    for task, t in entries:
        ctl = t["controllers"]
        if not ctl:
            continue
        fig, ax = new_figure()
        for name, c in ctl.items():
            m, (lo, hi) = c["test_acc_mean"], c["test_acc_ci95"]
            ax.errorbar([c["params_added_mean"]], [m], yerr=[[m - lo], [hi - m]], marker="D", capsize=4,
                        color=color(name), label=f"{name} ({m:.1f} %)")  # fmt: skip
        ax.set_xlabel("parameters added to the host (mean over training seeds)")
        ax.set_ylabel("final test accuracy (%)")
        ax.set_title(f"{task}: accuracy vs growth (95 % CI over training seeds)")
        a = finish_figure(fig, ax, out / f"{stem}-{task}-acc-vs-params.png", legend_size=7)
        fig, ax = new_figure()
        plans = [(c["compute_host_epochs"], c) for m in PLAN_MULTIPLES if (c := ctl.get(plan_name(m)))]
        if plans:
            xs = [x for x, _ in plans]
            ms = [c["test_acc_mean"] for _, c in plans]
            err = [[c["test_acc_mean"] - c["test_acc_ci95"][0] for _, c in plans],
                   [c["test_acc_ci95"][1] - c["test_acc_mean"] for _, c in plans]]  # fmt: skip
            ax.errorbar(xs, ms, yerr=err, marker="o", capsize=4, color="#e76f51", label="plan_search")
        for name in (*LEARNED, "heuristic_tuned", CAP_SEARCH, *TRYING):
            if (c := ctl.get(name)) and c["compute_host_epochs"] > 0:
                m, (lo, hi) = c["test_acc_mean"], c["test_acc_ci95"]
                ax.errorbar([c["compute_host_epochs"]], [m], yerr=[[m - lo], [hi - m]], marker="D", capsize=4,
                            color=color(name), label=name)  # fmt: skip
        for name in ("static", "grow_all"):
            if c := ctl.get(name):
                ax.axhline(c["test_acc_mean"], ls="--", lw=1, color=color(name),
                           label=f"{name} (no search)")  # fmt: skip
        ax.set_xscale("log")
        ax.set_xlabel("host epochs spent on training or search (log)")
        ax.set_ylabel("final test accuracy (%)")
        ax.set_title(f"{task}: accuracy vs compute (95 % CI over training seeds)")
        b = finish_figure(fig, ax, out / f"{stem}-{task}-acc-vs-compute.png", legend_size=7)
        files[task] = [a, b]
    if len(suite["tasks"]) > 1:
        files[""] = [overview(out / f"{stem}-overview.png", suite["tasks"])]
    return files


#: The rows of the overview, left to right within a task: the baselines the first goal names, the
#: controller judged, the searches at equal compute.
OVERVIEW = (*MUST_BEAT, "ppo_greedy", plan_name(1.0), CAP_SEARCH)


def overview(path: Path, tasks: dict[str, dict]) -> Path:
    """Every task on one axes: :data:`OVERVIEW`'s controllers side by side per task, each its mean test
    accuracy with its 95 % interval over training seeds (a controller a task lacks is left out)."""
    fig, ax = new_figure(size=(max(7.0, 2.2 * len(tasks)), 4.5))
    width = 0.8 / len(OVERVIEW)
    for i, name in enumerate(OVERVIEW):
        xs, ms, lo, hi = [], [], [], []
        for j, t in enumerate(tasks.values()):
            if (c := t["controllers"].get(name)) is not None:
                xs.append(j - 0.4 + width * (i + 0.5))
                ms.append(c["test_acc_mean"])
                lo.append(c["test_acc_mean"] - c["test_acc_ci95"][0])
                hi.append(c["test_acc_ci95"][1] - c["test_acc_mean"])
        if xs:
            ax.errorbar(xs, ms, yerr=[lo, hi], marker="D" if name == "ppo_greedy" else "o", ls="none",
                        capsize=3, color=color(name), label=name)  # fmt: skip
    ax.set_xticks(range(len(tasks)), list(tasks))
    ax.set_ylabel("final test accuracy (%)")
    ax.set_title("the suite: each controller on each task (95 % CI over training seeds)")
    return finish_figure(fig, ax, path, legend_size=7, ncol=2)


__all__ = [
    "MUST_BEAT", "OVERVIEW", "TRANSFER_GAIN_SHARE", "WITHIN", "beside_verdicts", "goals",
    "learned_rows", "markdown", "overview", "plots", "suite_verdict", "transfer_verdict", "verdict_lines",
]  # fmt: skip
