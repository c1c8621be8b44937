"""The results files' text and plots: the growth table (:func:`markdown`), the plans stage's
(:func:`plans_markdown`) and the paired comparison's (:func:`compare_markdown`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plans_markdown(info: dict, planned: dict, command: str) -> str:
    ks = planned["training_seeds"]
    lines = [
        f"# Fixed plans on the learn stage's hosts, {info['date']}",
        "",
        f"`{command}` on {info.get('cpu', '?')} ({info.get('cpu_count', '?')} cores, torch "
        f"{info.get('torch', '?')}).",
        "",
        f"Training seeds {ks[0]}-{ks[-1]}: for seed k, the `{planned['preset']}` config with `--seed k` on "
        f"the {planned['episodes_per_seed']} hosts of evaluation seed 1000 + k (the hosts the learn stage "
        "scores seed k's controllers on). Nothing is trained. The 95 % intervals are over seeds (Student-t "
        "of the per-seed means). `@STANDARD`, `@0.7`: the tempo and alpha target the schedule blends with "
        "(otherwise FAST to 1.0).",
        "",
        "| controller | test acc % [95 % CI] | params added | share of grow_all's gain | of its params |",
        "|---|---|---:|---:|---:|",
    ]
    for r in planned["rows"]:
        share = lambda v: "" if v is None else f"{v:.2f}"
        lines.append(
            f"| {r['controller']} | {r['test_acc_mean']:.1f} [{r['test_acc_ci95'][0]:.1f}, "
            f"{r['test_acc_ci95'][1]:.1f}] | {r['params_added_mean']:.0f} | "
            f"{share(r['gain_share_of_grow_all'])} | {share(r['params_share_of_grow_all'])} |"
        )
    learned = planned.get("learned")
    if learned:
        h = learned["hosts"]
        lines += [
            "",
            f"## The learned controllers against the plans (paired by training seed; "
            f"{', '.join(f'`{f}`' for f in learned['files'])})",
            "",
            "`grow_all` scored identically here and in those files, episode for episode."
            if h["identical"]
            else "`grow_all` did not score identically here and in those files (another machine or code): "
            f"per-seed means differ by at most {h['grow_all_seed_mean_max_abs_diff']:.2f} points, episodes "
            f"by {h['grow_all_episode_median_abs_diff']:.2f} (median). The same hosts; the pairs carry that "
            "noise.",
            "",
            "| learned | plan | learned - plan, points [95 % CI] | learned better on |",
            "|---|---|---|---|",
        ]
        for c, by_plan in learned["paired"].items():
            for n, d in by_plan.items():
                lines.append(f"| {c} | {n} | {d['mean']:+.1f} [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}] | "
                             f"{d['variant_better']} of {len(ks)} |")  # fmt: skip
        split = [
            (c, n, d) for c, by_plan in learned.get("by_placement", {}).items() for n, d in by_plan.items()
        ]
        if split:
            lines += [
                "",
                "Episode by episode on the same hosts: learned minus plan where the learned final host "
                "holds the plan's placement and where it misses it; a group's share is its part of the mean "
                "over all episodes (the two add up to it).",
                "",
                "| learned | plan | all: mean | holds: episodes, mean, share | misses: episodes, mean, "
                "share |",
                "|---|---|---:|---|---|",
            ]
            fmt = lambda g: "none" if g["mean"] is None else (
                f"{g['episodes']}, {g['mean']:+.1f}, {g['contribution']:+.2f}")  # fmt: skip
            for c, n, d in split:
                lines.append(f"| {c} | {n} | {d['mean']:+.2f} | {fmt(d['holds'])} | {fmt(d['misses'])} |")
            lines += ["", "What the missing hosts hold in the plan's slots instead:", ""]
            for c, n, d in split:
                held = (
                    ", ".join(f"`{k}` {v}" for k, v in d["misses"].get("held", {}).items())
                    or "nothing missed"
                )
                lines.append(f"- {c} against {n}: {held}")
    lines += ["", f"{planned['seconds'] / 60:.1f} min."]
    return "\n".join(lines) + "\n"


def compare_markdown(info: dict, cmp: dict, command: str) -> str:
    arm = lambda a: f"`{a['train_args']}`" if a["train_args"] else "the default"
    files = lambda a: ", ".join(f"`{f}`" for f in a["files"])
    n, eps = len(cmp["training_seeds"]), cmp["base"]["episodes_per_seed"]
    lines = [
        f"# Paired comparison, {info['date']}",
        "",
        f"`{command}`",
        "",
        f"Base: {arm(cmp['base'])} ({files(cmp['base'])}). Variant: {arm(cmp['variant'])} "
        f"({files(cmp['variant'])}). Training seeds {', '.join(map(str, cmp['training_seeds']))}, "
        f"{eps} fresh hosts each; the unit is the training seed (its mean over its hosts).",
        "",
        "The baselines scored identically in both arms, episode for episode: the arms are paired on "
        "evaluation hosts as well as training seeds."
        if cmp["same_hosts"]
        else "The baselines did not score identically in both arms (another machine or code?): the arms "
        "are paired on training seed only, not on evaluation hosts.",
        "",
    ]
    for c, s in cmp["controllers"].items():
        d, p = s["test_acc_diff"], s["params_added_diff"]
        lines += [
            f"## {c}",
            "",
            "| training seed | base test acc % | variant | variant - base | base params | variant params |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for i, k in enumerate(cmp["training_seeds"]):
            lines.append(
                f"| {k} | {s['base_test_acc'][i]:.1f} | {s['variant_test_acc'][i]:.1f} | "
                f"{round(d['per_seed'][i], 1) + 0.0:+.1f} | {s['base_params_added'][i]:.0f} | "
                f"{s['variant_params_added'][i]:.0f} |"
            )
        lines += [
            "",
            f"Test accuracy, variant - base: {d['mean']:+.2f} points [95 % CI {d['ci95'][0]:+.2f}, "
            f"{d['ci95'][1]:+.2f}], sd {d['sd']:.2f}, t {d['t']:.2f} (df {n - 1}); the variant better on "
            f"{d['variant_better']} of {n} seeds, worse on {d['variant_worse']}. Parameters added, variant - "
            f"base: {p['mean']:+.0f} [{p['ci95'][0]:+.0f}, {p['ci95'][1]:+.0f}].",
            "",
        ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- writing
def _plots(out: Path, stem: str, learned: dict | None) -> list[str]:
    if not learned:
        return []
    from esper.shell.eval.output import COLORS, plot_acc_vs_params
    from esper.shell.telemetry.plots import finish_figure, new_figure

    unit = "runs" if learned.get("pooled_from") else "seeds"
    title = f"{learned['seeds']} training {unit} x {learned['episodes_per_seed']} fresh hosts each"
    files = [plot_acc_vs_params(learned, out / f"{stem}-acc-vs-params.png", title=title).name]

    fig, ax = new_figure((7.0, 4.0))
    for k, curve in learned["learning_curves"].items():
        ax.plot(curve["update"], curve["test_acc"], alpha=0.8, label=f"seed {k}")
    for name in ("static", "grow_all"):
        if name in learned["controllers"]:
            ax.axhline(
                learned["controllers"][name]["test_acc_mean"], ls="--", color=COLORS.get(name), label=name
            )
    ax.set_xlabel("PPO update")
    ax.set_ylabel("test accuracy of the update's final hosts (%)")
    files.append(finish_figure(fig, ax, out / f"{stem}-learning.png", legend_size=7, ncol=2).name)
    return files


def _ci(s: dict, key: str = "test_acc") -> str:
    lo, hi = s[f"{key}_ci95"]
    return f"{s[f'{key}_mean']:.1f} [{lo:.1f}, {hi:.1f}]"


def _schedule_table(rows: list[dict]) -> list[str]:
    out = [
        "| controller | test acc % [95 % CI] | gain over static [95 % CI] | params added | fossilized |",
        "|---|---|---|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['controller']} | {_ci(r)} | {_ci(r, 'gain')} | {r['params_added_mean']:.0f} | "
            f"{r['fossilized_mean']:.1f} |"
        )
    return out


def _frontier(rows: list[dict]) -> list[str]:
    """What a schedule must reach to meet the efficiency target, and which measured ones do."""
    by = {r["controller"]: r for r in rows}
    if "grow_all" not in by or "static" not in by:
        return []
    gain_all, params_all = by["grow_all"]["gain_mean"], by["grow_all"]["params_added_mean"]
    lines = [
        "",
        f"`grow_all` gains {gain_all:.1f} points for {params_all:.0f} parameters. Share of that gain and of "
        "those parameters for each placement (target: >= 90 % of the gain with <= 60 % of the parameters):",
        "",
        "| placement | gain share | params share | meets it |",
        "|---|---:|---:|---|",
    ]
    for r in rows:
        if r["controller"] in ("static", "grow_all"):
            continue
        g, q = r["gain_mean"] / gain_all, r["params_added_mean"] / params_all
        meets = "yes" if g >= 0.9 and q <= 0.6 else "no"
        lines.append(f"| {r['controller']} | {g:.2f} | {q:.2f} | {meets} |")
    return lines


def _seed_span(m: dict) -> str:
    """The seeds of a pooled file's entry, e.g. ', training seeds 5-9' ('' where not recorded)."""
    if "first_seed" not in m:
        return ""
    first, last = m["first_seed"], m["first_seed"] + m["runs"] - 1
    return f", training seed {first}" if first == last else f", training seeds {first}-{last}"


def markdown(info: dict, swept: dict | None, learned: dict | None, plots: list[str], command: str,
             placed: dict | None = None) -> str:  # fmt: skip
    pooled = (learned or {}).get("pooled_from")
    lines = [
        f"# Growth results, {info['date']}",
        "",
        f"`{command}`: the runs of {len(pooled)} results files (below)."
        if pooled
        else f"`{command}` on {info.get('cpu', '?')} "
        f"({info.get('cpu_count', '?')} cores, torch {info.get('torch', '?')}).",
        "",
    ]
    if swept:
        lines += [
            f"## Headroom: fixed schedules vs the static host ({swept['episodes']} fresh hosts, paired)",
            "",
        ]
        lines += _schedule_table(swept["rows"])
        lines += [
            "",
            f"Best schedule: `{swept['best']}`; `grow_all` grows `{swept['grow_all_blueprint']}`.",
            "",
        ]
    if placed:
        lines += [
            f"## Where growth pays: fixed placements ({placed['episodes']} fresh hosts, paired)",
            "",
            "`grow:b0=conv_heavy+b2=depthwise` grows only those slots, each with its blueprint, as fast as "
            "the gates allow (slot order, one germination per epoch).",
            "",
            *_schedule_table(placed["rows"]),
            *_frontier(placed["rows"]),
            "",
        ]
    if learned:
        v = learned["verdict"]
        unit = "runs" if pooled else "seeds"
        lines += [
            f"## The learned controller ({learned['seeds']} training {unit} x "
            f"{learned['episodes_per_seed']} fresh hosts each; 95 % CI over training {unit})",
            "",
            *(
                [f"Trained with `{learned['train_args']}` on top of the default.", ""]
                if learned.get("train_args")
                else []
            ),
            *(
                [
                    "Pooled: each file's runs count as training runs of their own (a training seed run on "
                    "another machine follows another trajectory; every run is evaluated on its training "
                    "seed's hosts). "
                    + "; ".join(
                        f"`{m['file']}`: {m['runs']} runs{_seed_span(m)} on {m['cpu']} ({m['cpu_count']} "
                        f"cores, torch {m['torch']}, git {m['git']})"
                        for m in pooled
                    )
                    + ".",
                    "",
                ]
                if pooled
                else []
            ),
            "| controller | test acc % [95 % CI] | params added [95 % CI] | per-seed means |",
            "|---|---|---|---|",
        ]
        for name, s in learned["controllers"].items():
            per = ", ".join(f"{a:.1f}" for a in s["per_seed_test_acc"])
            lines.append(f"| {name} | {_ci(s)} | {_ci(s, 'params_added')} | {per} |")
        corr = learned["correlations"]
        fmt = lambda v: ", ".join(
            f"{k} = {val:.2f}" if isinstance(val, float) else f"{k} = {val}" for k, val in v.items()
        )
        from esper.shell.eval.controllers import PPO_READOUTS

        greedy, mixed = learned.get("verdict_greedy"), learned.get("verdict_mixed")
        shown = ("ppo", "ppo_greedy", *(("ppo_mixed",) if mixed else ()))
        lines += [
            "",
            "; ".join(f"`{name}` {PPO_READOUTS[name][1]}" for name in shown)
            + ". Targets (ppo): "
            + fmt(v)
            + "."
            + (f" Targets (ppo_greedy): {fmt(greedy)}." if greedy else "")
            + (f" Targets (ppo_mixed): {fmt(mixed)}." if mixed else ""),
            "",
            f"Spearman correlation of the episode return with the final test accuracy over all evaluation "
            f"episodes: {corr['return_vs_test_acc']:.3f}; with the held-out objective: "
            f"{corr['return_vs_test_objective']:.3f}.",
            "",
            f"Training took {np.median(learned['train_seconds']) / 60:.1f} min per seed (median, "
            + ("over the machines" if pooled else f"{learned['jobs']} at a time")
            + f"), evaluation {np.median(learned['eval_seconds']) / 60:.1f} min per "
            f"seed; {(sum(learned['train_seconds']) + sum(learned['eval_seconds'])) / 60:.1f} min of "
            "training and evaluation in all.",
            "",
        ]
    lines += [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"
