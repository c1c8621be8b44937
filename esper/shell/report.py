"""Plots and a markdown summary of a finished (or interrupted) run: ``python -m esper.shell.report RUN_DIR``.

Reads ``RUN_DIR/events.jsonl`` (schema in :mod:`esper.shell.telemetry.events`) and writes into
``RUN_DIR/plots/``:

* ``returns.png``: mean episode return per update, with the min-max band over envs;
* ``accuracy.png``: final and best validation accuracy per update (mean over envs);
* ``entropy.png``: normalized entropy of each head per update (PPO runs only);
* ``losses.png``: policy and value loss, KL, clip fraction per update (PPO runs only);
* ``seed_timeline.png``: the last update's episodes, one row per env and slot, coloured by stage over
  epochs, with markers for germinate / fossilize / prune;
* ``blueprints.png``: per slot, the blueprints the episodes of each update germinated there (the
  ``germinations`` of episode events): what the controller learned to grow where, and when it committed;

and ``RUN_DIR/report.md`` (config highlights, update count, accuracies, return trend, lifecycle
counts, governor rollbacks, anomalies, links to the plots). Plots without data are skipped. Uses
matplotlib's object API on the Agg canvas: no pyplot, no global backend state.
"""

from __future__ import annotations

import math
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from esper.core.spec import Stage
from esper.shell.runtime.cli import OneLineParser, describe
from esper.shell.telemetry.events import scan_events

STAGE_COLORS = {
    "DORMANT": "#e6e6e6",
    "GERMINATED": "#f2e394",
    "TRAINING": "#8ecae6",
    "BLENDING": "#ffb703",
    "HOLDING": "#c77dff",
    "FOSSILIZED": "#2a9d8f",
    "PRUNED": "#e63946",
    "EMBARGOED": "#6c757d",
}
UNKNOWN_COLOR = "#222222"
LIFECYCLE_MARKERS = {"germinate": ("^", "#1b4332"), "fossilize": ("*", "#000000"), "prune": ("X", "#9d0208")}
#: Lifecycle event kinds drawn on the timeline, by marker (the env logs past-tense kinds).
MARKER_OF_KIND = {
    "germinate": "germinate",
    "germinated": "germinate",
    "fossilize": "fossilize",
    "fossilized": "fossilize",
    "prune": "prune",
    "pruned": "prune",
    "prune_started": "prune",
    "timeout_pruned": "prune",
    "timeout_fossilized": "fossilize",
}
CONFIG_HIGHLIGHTS = (
    "task",
    "preset",
    "host",
    "family",
    "controller",
    "policy",
    "n_envs",
    "n_updates",
    "updates",
    "n_episodes",
    "max_epochs",
    "seed",
    "lr",
    "gamma",
    "entropy_coef",
    "n_epochs",
    "target_kl",
    "slots",
)


# --------------------------------------------------------------------------------------------- data
class Run:
    """The events of one log, grouped by kind."""

    def __init__(self, events: list[dict[str, Any]], torn: str | None = None) -> None:
        by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for e in events:
            by_kind[e["event"]].append(e)
        self.start = by_kind["run_start"][-1] if by_kind["run_start"] else None
        self.end = by_kind["run_end"][-1] if by_kind["run_end"] else None
        # An update logged twice (a log written before resumes rewound it) counts once: its last copy.
        self.episodes = _last_of(by_kind["episode"], ("update", "env"))
        self.ppo = sorted(_last_of(by_kind["ppo_update"], ("update",)), key=lambda e: e["update"])
        logged = len(by_kind["episode"]) + len(by_kind["ppo_update"])
        self.duplicates = logged - len(self.episodes) - len(self.ppo)
        self.rewound = sum(int(e.get("discarded", 0)) for e in by_kind["log_rewound"])
        self.torn = torn
        self.epochs = by_kind["epoch"]
        self.lifecycle = by_kind["lifecycle"]
        self.anomalies = by_kind["anomaly"]
        self.governor = by_kind["governor"]
        self.checkpoints = by_kind["checkpoint"]
        self.heldout = by_kind["heldout_check"][-1] if by_kind["heldout_check"] else None

    def per_update(self, field: str) -> dict[int, list[float]]:
        """``{update: [field of each episode]}`` (finite values only), updates in order."""
        out: dict[int, list[float]] = defaultdict(list)
        for e in self.episodes:
            v = e.get(field)
            if _num(v):
                out[e["update"]].append(float(v))
        return dict(sorted(out.items()))

    def updates(self) -> list[int]:
        seen = {e["update"] for e in self.episodes} | {e["update"] for e in self.ppo}
        return sorted(seen)


def _last_of(events: list[dict[str, Any]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """``events`` with one event per value of ``keys`` (the last one), in the order of those."""
    last = {tuple(e.get(k) for k in keys): e for e in events}
    return list(last.values())


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _series(events: Sequence[dict[str, Any]], field: str, sub: str | None = None) -> np.ndarray:
    vals = []
    for e in events:
        v = e.get(field)
        if sub is not None:
            v = v.get(sub) if isinstance(v, dict) else None
        vals.append(float(v) if _num(v) else math.nan)
    return np.asarray(vals, dtype=float)


def _stage_name(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(Stage):
        return Stage(v).name
    return str(v)


# -------------------------------------------------------------------------------------------- plots
def _figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (7.0, 4.0)):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110, format="png")
    return path


def plot_returns(run: Run, path: Path) -> Path | None:
    data = run.per_update("return")
    if not data:
        return None
    x = np.array(list(data))
    mean = np.array([np.mean(v) for v in data.values()])
    fig, ax = _figure()
    ax = ax[0, 0]
    ax.fill_between(
        x,
        [min(v) for v in data.values()],
        [max(v) for v in data.values()],
        alpha=0.25,
        label="min-max over envs",
    )
    ax.plot(x, mean, marker="o" if len(x) < 30 else None, label="mean return")
    ax.set(xlabel="update", ylabel="episode return", title="Episode return")
    ax.legend(loc="best")
    return _save(fig, path)


def plot_accuracy(run: Run, path: Path) -> Path | None:
    """Accuracy of the final hosts per update (validation, best validation, test) and, beside it, the
    parameters the controller added to them: what growth bought, and at what cost."""
    final, best = run.per_update("final_val_acc"), run.per_update("best_val_acc")
    test, added = run.per_update("final_test_acc"), run.per_update("params_added")
    if not final and not best and not test:
        return None
    fig, axes = _figure(1, 2 if added else 1, size=(11.0, 4.0) if added else (7.0, 4.0))
    ax = axes[0, 0]
    for data, label in ((final, "final val acc"), (best, "best val acc"), (test, "final test acc")):
        if data:
            ax.plot(
                list(data),
                [np.mean(v) for v in data.values()],
                marker="o" if len(data) < 30 else None,
                label=label,
            )
    ax.set(xlabel="update", ylabel="accuracy % (mean over envs)", title="Accuracy of the final hosts")
    ax.legend(loc="best")
    if added:
        ax = axes[0, 1]
        x = list(added)
        ax.fill_between(x, [min(v) for v in added.values()], [max(v) for v in added.values()], alpha=0.25,
                        label="min-max over envs")  # fmt: skip
        ax.plot(x, [np.mean(v) for v in added.values()], marker="o" if len(x) < 30 else None, label="mean")
        ax.set(xlabel="update", ylabel="parameters added", title="Parameters the seeds added")
        ax.legend(loc="best")
    return _save(fig, path)


def plot_entropy(run: Run, path: Path) -> Path | None:
    heads = _ordered_keys(e.get("head_entropy") for e in run.ppo)
    if not heads:
        return None
    x = [e["update"] for e in run.ppo]
    fig, ax = _figure(size=(8.0, 4.5))
    ax = ax[0, 0]
    for head in heads:
        ax.plot(x, _series(run.ppo, "head_entropy", head), label=head)
    ax.set(xlabel="update", ylabel="normalized entropy", title="Per-head entropy", ylim=(-0.02, 1.02))
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    return _save(fig, path)


def plot_losses(run: Run, path: Path) -> Path | None:
    if not run.ppo:
        return None
    x = [e["update"] for e in run.ppo]
    fig, axes = _figure(2, 2, size=(9.0, 6.0))
    panels = (
        ("loss_objective", "policy loss"),
        ("loss_critic", "value loss"),
        ("kl_approx", "KL (k3)"),
        ("clip_fraction", "clip fraction"),
    )
    for ax, (field, title) in zip(axes.flat, panels):
        ax.plot(x, _series(run.ppo, field), marker="." if len(x) < 50 else None)
        ax.set(title=title, xlabel="update")
    return _save(fig, path)


def plot_seed_timeline(run: Run, path: Path) -> Path | None:
    staged = [e for e in run.epochs if isinstance(e.get("stage"), list) and e["stage"]]
    if not staged:
        return None
    from matplotlib.colors import ListedColormap
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    last = max(e["update"] for e in staged)
    epochs = sorted((e for e in staged if e["update"] == last), key=lambda e: e["epoch"])
    n_envs = max(len(e["stage"]) for e in epochs)
    n_slots = max(len(row) for e in epochs for row in e["stage"])
    slot_names = epochs[-1].get("slot_names") or [f"slot{i}" for i in range(n_slots)]
    names = list(STAGE_COLORS)
    first, final = epochs[0]["epoch"], epochs[-1]["epoch"]
    grid = np.full((n_envs * n_slots, final - first + 1), np.nan)
    for e in epochs:
        for env, row in enumerate(e["stage"]):
            for s, stage in enumerate(row):
                name = _stage_name(stage)
                grid[env * n_slots + s, e["epoch"] - first] = (
                    names.index(name) if name in names else len(names)
                )
    cmap = ListedColormap([*STAGE_COLORS.values(), UNKNOWN_COLOR]).with_extremes(bad="white")
    fig, ax = _figure(size=(9.0, 1.0 + 0.35 * grid.shape[0]))
    ax = ax[0, 0]
    ax.imshow(
        np.ma.masked_invalid(grid),
        aspect="auto",
        interpolation="nearest",
        cmap=cmap,
        vmin=-0.5,
        vmax=len(names) + 0.5,
        extent=(first - 0.5, final + 0.5, grid.shape[0] - 0.5, -0.5),
    )
    kinds_seen = set()
    for ev in run.lifecycle:
        mark = MARKER_OF_KIND.get(ev.get("kind"))
        if ev.get("update") != last or mark is None:
            continue
        slot = ev.get("slot")
        s = slot_names.index(slot) if slot in slot_names else slot if isinstance(slot, int) else None
        if s is None:
            continue
        marker, color = LIFECYCLE_MARKERS[mark]
        ax.scatter([ev["epoch"]], [ev["env"] * n_slots + s], marker=marker, c=color, s=60, zorder=3)
        kinds_seen.add(mark)
    ax.set_yticks(
        range(grid.shape[0]),
        [f"env {e} / {slot_names[s]}" for e in range(n_envs) for s in range(n_slots)],
        fontsize="small",
    )
    ax.set(xlabel="epoch", title=f"Seed lifecycle, update {last}")
    present = {int(v) for v in grid[np.isfinite(grid)].ravel()}
    handles = [Patch(color=c, label=n) for i, (n, c) in enumerate(STAGE_COLORS.items()) if i in present]
    if len(names) in present:
        handles.append(Patch(color=UNKNOWN_COLOR, label="other"))
    handles += [
        Line2D([], [], ls="", marker=m, color=c, label=k)
        for k, (m, c) in LIFECYCLE_MARKERS.items()
        if k in kinds_seen
    ]
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    return _save(fig, path)


def germination_counts(run: Run) -> dict[tuple[Any, str], Counter]:
    """``{(slot, blueprint): {update: germinations}}`` from the episodes' ``germinations``."""
    counts: dict[tuple[Any, str], Counter] = defaultdict(Counter)
    for e in run.episodes:
        for g in e.get("germinations") or ():
            if isinstance(g, dict) and "slot" in g and "blueprint" in g:
                counts[g["slot"], str(g["blueprint"])][e["update"]] += 1
    return dict(counts)


def plot_blueprints(run: Run, path: Path) -> Path | None:
    """One panel per slot: for each update, how many of its episodes' germinations in that slot were of
    each blueprint (stacked bars). A controller that learns "what where" narrows to one colour per slot;
    one that commits early to a worse blueprint shows it here before the evaluation does."""
    counts = germination_counts(run)
    if not counts:
        return None
    names = next((e["slot_names"] for e in reversed(run.epochs) if e.get("slot_names")), None)
    from matplotlib.patches import Patch

    slots = sorted(
        {s for s, _ in counts}, key=lambda s: (not isinstance(s, int), s if isinstance(s, int) else 0, str(s))
    )
    blueprints = sorted({b for _, b in counts})
    updates = run.updates()
    colors = {b: f"C{i % 10}" for i, b in enumerate(blueprints)}
    fig, axes = _figure(1, len(slots), size=(3.6 * len(slots) + 1.6, 3.6))
    for ax, slot in zip(axes.flat, slots):
        bottom = np.zeros(len(updates))
        for b in blueprints:
            n = np.array([counts.get((slot, b), Counter())[u] for u in updates], dtype=float)
            if n.any():
                ax.bar(updates, n, bottom=bottom, color=colors[b], width=0.85, label=b)
                bottom += n
        label = names[slot] if isinstance(slot, int) and names and 0 <= slot < len(names) else str(slot)
        ax.set(title=f"slot {label}", xlabel="update", ylabel="germinations")
    handles = [Patch(color=colors[b], label=b) for b in blueprints]
    axes[0, -1].legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    fig.suptitle("Blueprints germinated per slot and update")
    return _save(fig, path)


def _ordered_keys(dicts: Iterable[Any]) -> list[str]:
    keys: dict[str, None] = {}
    for d in dicts:
        if isinstance(d, dict):
            keys.update(dict.fromkeys(d))
    return list(keys)


PLOTS = (
    ("returns.png", plot_returns),
    ("accuracy.png", plot_accuracy),
    ("entropy.png", plot_entropy),
    ("losses.png", plot_losses),
    ("seed_timeline.png", plot_seed_timeline),
    ("blueprints.png", plot_blueprints),
)


# ------------------------------------------------------------------------------------------ summary
def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    if isinstance(v, list):
        return ", ".join(_fmt(x) for x in v)
    return "–" if v is None else str(v)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(_flatten(v, name))
        else:
            out[name] = v
    return out


def summary_markdown(run: Run, run_dir: Path, plots: Sequence[Path]) -> str:
    lines = [f"# Esper run report: `{run_dir.name}`", ""]
    if run.start is not None:
        prov = run.start.get("provenance") or {}  # run.py's variant: one dict with all of these
        versions = run.start.get("versions") or {
            k: prov[k] for k in ("python", "torch", "tensordict", "torchrl") if k in prov
        }
        device = run.start.get("device", prov.get("device"))
        git_rev = run.start.get("git_rev", prov.get("git_rev"))
        facts = [f"device: {_fmt(device)}", f"git: `{_fmt(git_rev)}`"]
        facts += [f"{k} {v}" for k, v in versions.items()]
        lines += ["- " + "; ".join(facts), ""]
        flat = _flatten(run.start.get("config") or {})
        chosen = {k: v for k, v in flat.items() if k.rsplit(".", 1)[-1] in CONFIG_HIGHLIGHTS}
        chosen = chosen or dict(list(flat.items())[:12])
        if chosen:
            lines += ["## Config highlights", "", "| key | value |", "|---|---|"]
            lines += [f"| `{k}` | {_fmt(v)} |" for k, v in chosen.items()]
            lines.append("")
    lines += ["## Results", ""]
    updates = run.updates()
    lines.append(f"- updates: {len(updates)} ({len(run.ppo)} PPO updates, {len(run.episodes)} episodes)")
    final, best = run.per_update("final_val_acc"), run.per_update("best_val_acc")
    if final:
        u, v = list(final.items())[-1]
        lines.append(f"- final val accuracy (update {u}, mean over {len(v)} envs): {_fmt(float(np.mean(v)))}")
    if best:
        lines.append(f"- best val accuracy (any episode): {_fmt(max(max(v) for v in best.values()))}")
    test, added = run.per_update("final_test_acc"), run.per_update("params_added")
    if test:
        u, v = list(test.items())[-1]
        pa = added.get(u)
        lines.append(
            f"- final test accuracy (update {u}, mean over {len(v)} envs): {_fmt(float(np.mean(v)))}"
            + (f", {_fmt(float(np.mean(pa)))} parameters added" if pa else "")
        )
    if run.heldout is not None:
        h = run.heldout
        lines.append(
            f"- held-out check ({_fmt(h.get('episodes'))} fresh hosts): {_fmt(h.get('controller'))} "
            f"{_fmt(h.get('test_acc'))} % test accuracy with {_fmt(h.get('params_added'))} parameters "
            f"added vs the static host {_fmt(h.get('static_test_acc'))} %; gain {_fmt(h.get('gain'))} "
            f"points (95 % CI {_fmt((h.get('gain_ci95') or [None])[0])} to "
            f"{_fmt((h.get('gain_ci95') or [None, None])[-1])})"
            + (
                f"; its most likely actions (ppo_greedy) {_fmt(h['greedy_test_acc'])} % with "
                f"{_fmt(h.get('greedy_params_added'))} parameters"
                + (f", gain {_fmt(h['greedy_gain'])} points (95 % CI {_fmt(h['greedy_gain_ci95'][0])} to "
                   f"{_fmt(h['greedy_gain_ci95'][1])})" if h.get("greedy_gain") is not None else "")
                if h.get("greedy_test_acc") is not None else ""
            )
        )
    returns = run.per_update("return")
    if returns:
        means = np.array([np.mean(v) for v in returns.values()])
        trend = f"- mean return: {_fmt(float(means[0]))} (update {next(iter(returns))})"
        if len(means) > 1:
            slope = float(np.polyfit(np.array(list(returns), dtype=float), means, 1)[0])
            trend += (
                f" → {_fmt(float(means[-1]))} (update {list(returns)[-1]}); slope {_fmt(slope)} per update"
            )
        lines.append(trend)
    counts = Counter(e.get("kind") for e in run.lifecycle)
    if counts:
        lines.append(
            "- lifecycle events: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items(), key=str))
        )
    if run.governor:
        reasons = Counter(e.get("reason") for e in run.governor)
        lines.append(
            f"- governor rollbacks: {len(run.governor)} ("
            + ", ".join(f"{k} {n}" for k, n in reasons.items())
            + ")"
        )
    if run.checkpoints:
        lines.append(f"- last checkpoint: `{_fmt(run.checkpoints[-1].get('path'))}`")
    if run.rewound:
        lines.append(f"- {run.rewound} event line(s) of updates lost in a crash were moved to "
                     "`events.discarded.jsonl` on resume (logged again by the resumed run)")  # fmt: skip
    if run.duplicates:
        lines.append(f"- {run.duplicates} duplicate episode / PPO-update event(s) counted once")
    if run.torn is not None:
        lines.append(f"- the log ends with a torn line ({len(run.torn)} characters, skipped)")
    lines += ["", f"## Anomalies ({len(run.anomalies)})", ""]
    if run.anomalies:
        lines += ["| update | kind | value | threshold | detail |", "|---|---|---|---|---|"]
        for a in run.anomalies[:50]:
            lines.append(
                f"| {_fmt(a.get('update'))} | {_fmt(a.get('kind'))} | {_fmt(a.get('value'))} | "
                f"{_fmt(a.get('threshold'))} | {_fmt(a.get('detail'))} |"
            )
        if len(run.anomalies) > 50:
            lines.append(f"\n… and {len(run.anomalies) - 50} more (see events.jsonl)")
    else:
        lines.append("none")
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{p.stem}](plots/{p.name})" for p in plots]
    if run.end is not None and run.end.get("summary"):
        lines += ["", "## Run end summary", "", "| key | value |", "|---|---|"]
        lines += [f"| `{k}` | {_fmt(v)} |" for k, v in _flatten(run.end["summary"]).items()]
    return "\n".join(lines) + "\n"


def write_report(run_dir: str | Path) -> Path:
    """Write the plots and ``report.md`` for ``run_dir``; returns the path of ``report.md``."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    log = run_dir / "events.jsonl"
    if not log.is_file():
        raise FileNotFoundError(f"{log} does not exist (is {run_dir} a run directory?)")
    run = Run(*scan_events(log))
    plot_dir = run_dir / "plots"
    plot_dir.mkdir(exist_ok=True)
    written = [p for name, fn in PLOTS if (p := fn(run, plot_dir / name)) is not None]
    out = run_dir / "report.md"
    out.write_text(summary_markdown(run, run_dir, written), encoding="utf-8")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m esper.shell.report", description="Plots and a markdown summary of an esper run."
    )
    parser.add_argument("run_dir", type=Path, help="run directory holding events.jsonl")
    args = parser.parse_args(argv)
    try:
        out = write_report(args.run_dir)
    except (OSError, ValueError) as e:  # a missing directory or log, a malformed log line, ...
        parser.error(describe(e))
    print(f"wrote {out} and {out.parent / 'plots'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
