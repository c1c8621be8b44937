"""What an evaluation writes: ``results.json``, ``report.md`` and ``plots/`` (:func:`write_eval`), the
plots of held-out accuracy against parameters added and over the epochs, and the report's markdown.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from esper.shell.host.flops import FLOP_KINDS
from esper.shell.telemetry.plots import finish_figure, new_figure

COLORS = {"ppo": "#d62828", "ppo_greedy": "#9d0208", "ppo_mixed": "#7b2cbf", "static": "#6c757d",
          "random": "#f4a261", "heuristic": "#2a9d8f", "heuristic_tuned": "#165a52",
          "grow_all": "#264653"}  # fmt: skip


def write_eval(out: Path, results: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, allow_nan=True))
    plots = [
        plot_acc_vs_params(results, out / "plots" / "acc_vs_params.png"),
        plot_acc_over_epochs(results, out / "plots" / "acc_over_epochs.png"),
    ]
    plots = [p for p in plots if p is not None]
    (out / "report.md").write_text(report_markdown(results, [p.relative_to(out) for p in plots]))
    return out


def plot_acc_vs_params(results: dict, path: Path, title: str | None = None) -> Path | None:
    """Final test accuracy vs parameters added, one point per episode, a diamond with its 95 % CI per
    controller. ``results``: ``{"controllers": {name: {"per_episode", "test_acc_mean",
    "test_acc_ci95", "params_added_mean"}}}`` (:func:`~esper.shell.eval.episodes.compare_on_config`'s,
    or bench.growth's pooled one)."""
    ctl = results["controllers"]
    if not ctl:
        return None
    fig, ax = new_figure()
    for name, s in ctl.items():
        eps = s["per_episode"]
        ax.scatter([e["params_added"] for e in eps], [e["final_test_acc"] for e in eps], s=14, alpha=0.6,
                   color=COLORS.get(name), label=f"{name} ({s['test_acc_mean']:.1f} %)")  # fmt: skip
        m, (lo, hi) = s["test_acc_mean"], s["test_acc_ci95"]
        ax.errorbar([s["params_added_mean"]], [m], yerr=[[m - lo], [hi - m]], color=COLORS.get(name),
                    marker="D", markersize=7, markeredgecolor="black", capsize=4)  # fmt: skip
    ax.set_xlabel("parameters added to the host")
    ax.set_ylabel("final test accuracy (%)")
    ax.set_title(title or "held-out accuracy vs growth (one point per episode; diamond: mean, 95 % CI)")
    return finish_figure(fig, ax, path)


def plot_acc_over_epochs(results: dict, path: Path) -> Path | None:
    ctl = results["controllers"]
    if not ctl:
        return None
    fig, ax = new_figure()
    for name, s in ctl.items():
        curves = np.array([c for c in (s.get("val_acc_curve_mean"),) if c])
        if not curves.size:
            continue
        x = np.arange(1, curves.shape[1] + 1)
        ax.plot(x, curves[0], color=COLORS.get(name), label=name)
        ax.scatter([x[-1] + 1], [s["test_acc_mean"]], color=COLORS.get(name), marker="*", s=80)
    ax.set_xlabel("host epoch (the star: final test accuracy)")
    ax.set_ylabel("validation accuracy (%), mean over episodes")
    return finish_figure(fig, ax, path)


def _f(x: float, nd: int = 1) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


#: The FLOPs columns of an evaluation's tables: per kind (:data:`~esper.shell.host.flops.FLOP_KINDS`), its
#: header and the summary's key (the mean over the evaluation episodes of what one spent).
FLOP_COLUMNS = tuple((f"{k.replace('whatif', 'what-if')} FLOPs", f"{k}_flops_mean") for k in FLOP_KINDS)
_SI = ("", "k", "M", "G", "T", "P", "E")


def format_flops(x: float | None) -> str:
    """FLOPs in SI units (``7.67 G``), three significant figures; ``—`` where none were recorded (a results
    file written before they were counted)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    k = 0
    while abs(x) >= 999.5 and k < len(_SI) - 1:
        x, k = x / 1000.0, k + 1
    return f"{x:.3g} {_SI[k]}".rstrip()


def _per_member(values: dict[str, float]) -> str:
    """A family's per-member sizes in words: ``12 on channels 2-8-8, ...; 20 on channels 8-8-8, ...``."""
    return "; ".join(f"{v:g} on {m}" for m, v in values.items())


def _price(meta: dict) -> str:
    """The held-out objective's parameter price in words (``2.0 × added / host parameters``)."""
    text = f"{meta['param_weight']} × added / host parameters"
    budget = meta.get("param_budget", 0)
    if isinstance(budget, dict) and any(v > 0 for v in budget.values()):  # a family: each member's own
        over = f"(added − the host's budget, where > 0: {_per_member(budget)})"
        text += f" − {meta['param_over_weight']} × {over} / host parameters"
    elif not isinstance(budget, dict) and budget > 0:
        over = f"(added − {budget:g}, where > 0)"
        text += f" − {meta['param_over_weight']} × {over} / host parameters"
    return text


def _cap(meta: dict) -> str:
    """The learned controller's hard cap in words (empty where it has none); on a family, each member's."""
    cap, share = meta.get("ppo_param_cap", 0), meta.get("ppo_param_cap_share", 0)
    family = isinstance(cap, dict)  # each member's own: a share of its own grow_all
    if not (any(v > 0 for v in cap.values()) if family else cap > 0):
        return ""
    if family and share > 0:
        held = (
            f"{share:g} of what `grow_all` adds to its host (`ppo.param_cap_share`), in seed parameters "
            f"{_per_member(cap)} (`grow_all` adds {_per_member(meta['grow_all_params'])})"
        )
    elif family:
        held = f"{next(iter(cap.values())):g} seed parameters (`ppo.param_cap`)"
    elif share > 0:
        held = (
            f"{cap:g} seed parameters ({share:g} of the {meta['grow_all_params']:g} that `grow_all` adds, "
            "`ppo.param_cap_share`)"
        )
    else:
        held = f"{cap:g} seed parameters (`ppo.param_cap`)"
    return f" The learned controller may hold at most {held}; the baselines have no cap."


def _blend(summary: dict) -> str:
    """``LINEAR_ADD 80 %, FAST 60 %, alpha 1.0 90 %``: each blend setting's most common value."""
    parts = []
    for k, counts in summary.get("blend_counts", {}).items():
        if counts:
            value, n = next(iter(counts.items()))
            share = 100 * n / sum(counts.values())
            parts.append(f"{'alpha ' if k == 'alpha_target' else ''}{value} {share:.0f} %")
    return ", ".join(parts) or "-"


def report_markdown(results: dict, plots: Sequence[Path]) -> str:
    meta, ctl, corr = results["meta"], results["controllers"], results["correlations"]
    static = ctl.get("static")
    lines = [
        f"# Evaluation of `{meta['run_dir']}`",
        "",
        f"{meta['episodes']} episodes per controller on fresh hosts (evaluation seed "
        f"{meta['eval_seed']}; the same host seeds for every controller; {meta['torch_threads']} torch "
        f"thread(s): another count trains the hosts to other numbers), task `{meta['task']}`; "
        f"{meta['ppo_acts']}. Accuracy is the final host's **test** accuracy (held out "
        "from host training and from the controller); intervals are 95 % Student-t over episodes."
        + _cap(meta),
        "",
        "| controller | test acc % | 95 % CI | gain over static | params added | return | fossilized | "
        f"host epochs spent | {' | '.join(h for h, _ in FLOP_COLUMNS)} |",
        "|---|---:|---|---:|---:|---:|---:|---:|" + "---:|" * len(FLOP_COLUMNS),
    ]
    for name, s in ctl.items():
        gain = _f(s["test_acc_mean"] - static["test_acc_mean"]) if static else "n/a"
        lo, hi = s["test_acc_ci95"]
        spent = s.get("compute_host_epochs")
        flops = " | ".join(format_flops(s.get(k)) for _, k in FLOP_COLUMNS)
        lines.append(
            f"| {name} | {_f(s['test_acc_mean'])} | [{_f(lo)}, {_f(hi)}] | {gain} | "
            f"{_f(s['params_added_mean'], 0)} | {_f(s['return_mean'], 2)} | "
            f"{_f(s['n_fossilized_mean'], 2)} | {'—' if spent is None else spent} | {flops} |"
        )
    lines += [
        "",
        "Host epochs spent: what the controller spent before the evaluation (training, a search). FLOPs: "
        "the mean over its evaluation episodes of what one episode spent (`esper.shell.host.flops`, "
        "PyTorch's FlopCounterMode): training, the host's and its seeds' forward and backward passes on "
        "training batches; validation, every epoch's validation with each live seed's alpha-0 "
        "counterfactual and the final validation; what-if, the incubating seeds' what-if passes (— where "
        "the results file predates them).",
        "",
        f"Spearman correlation of the episode return with the held-out outcome, over all "
        f"{corr['n_episodes']} episodes: test accuracy {_f(corr['return_vs_test_acc'], 3)}, test accuracy "
        f"per 1k parameters {_f(corr['return_vs_test_acc_per_kparam'], 3)}, held-out objective (test "
        f"accuracy − {_price(meta)}) "
        f"{_f(corr['return_vs_test_objective'], 3)}.",
        "",
        "What each controller grew: the seeds blended into its final hosts (`slot=blueprint`, as in the "
        "`grow:` placements; episodes out of "
        f"{meta['episodes']}), the mean epoch of its first germination, and how its germinations "
        "blend (the most common style, tempo and alpha target, with their share of all germinations).",
        "",
        "| controller | final hosts' seeds (episodes) | first germination, epoch | blend |",
        "|---|---|---:|---|",
    ]
    for name, s in ctl.items():
        counts = s["grown_counts"]
        plans = ", ".join(f"`{k or 'none'}` ({n})" for k, n in list(counts.items())[:3])
        plans += f", {len(counts) - 3} more" if len(counts) > 3 else ""
        first = s["first_germination_mean"]
        lines.append(f"| {name} | {plans} | {'-' if first is None else _f(first)} | {_blend(s)} |")
    lines.append("")
    lines += [f"![{p.stem}]({p.as_posix()})" for p in plots]
    return "\n".join(lines) + "\n"
