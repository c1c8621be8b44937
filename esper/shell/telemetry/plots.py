"""Every plot Esper draws, and the figure helpers they share.

A run's plots (:data:`PLOTS`, drawn by :func:`esper.shell.telemetry.report.write_report` into
``RUN_DIR/plots/``) read a :class:`~esper.shell.telemetry.events.RunEvents`: the episode returns, the
final hosts' accuracy and the parameters added, each head's entropy, the PPO losses, the update's health
(gradient norm, explained variance, the advantages), the LSTM's health, the last update's seed
lifecycle, each slot's contribution and its seed's gradient health over time, the blueprints germinated
per slot, what each head chose where it counted, and the reward's hacking and ransomware flags. An
evaluation's plots
(:mod:`esper.shell.eval.output`) and the growth bench's draw on :func:`new_figure` and
:func:`finish_figure`. Plots without data are skipped (their function returns None). Everything uses
matplotlib's object API on the Agg canvas: no pyplot, no global backend state.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from esper.core.spec import CHOICE_NAMES, Stage
from esper.shell.telemetry.events import RunEvents, finite_number

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


# ------------------------------------------------------------------------------------------ figures
def new_figure(size=(7.0, 4.5)):
    """A figure with one axes, for an evaluation's plots (:func:`finish_figure` saves it)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=110)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def finish_figure(fig, ax, path: Path, *, legend_size: int = 8, ncol: int = 1) -> Path:
    """Grid and legend on ``ax``, ``fig`` saved to ``path`` (its folder created)."""
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size, ncol=ncol)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    return path


def _figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (7.0, 4.0)):
    """A figure with a grid of axes, for a run's plots (:func:`_save` saves it)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110, format="png")
    return path


# ------------------------------------------------------------------------------------- a run's plots
def _series(events: Sequence[dict[str, Any]], field: str, sub: str | None = None) -> np.ndarray:
    vals = []
    for e in events:
        v = e.get(field)
        if sub is not None:
            v = v.get(sub) if isinstance(v, dict) else None
        vals.append(float(v) if finite_number(v) else math.nan)
    return np.asarray(vals, dtype=float)


def _stage_name(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(Stage):
        return Stage(v).name
    return str(v)


def plot_returns(run: RunEvents, path: Path) -> Path | None:
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


def plot_accuracy(run: RunEvents, path: Path) -> Path | None:
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


def plot_entropy(run: RunEvents, path: Path) -> Path | None:
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


def plot_choices(run: RunEvents, path: Path) -> Path | None:
    """Each head's choices over the updates (``head_choice_share``: the share of the steps where the head
    counted on which the batch took each choice), one stacked panel per head: what a head whose entropy
    fell committed to. Choices are named by :data:`~esper.core.spec.CHOICE_NAMES`, slots and blueprints
    by ``run_start``'s ``slots`` and ``blueprints`` (by index where the log has none)."""
    heads = _ordered_keys(e.get("head_choice_share") for e in run.ppo)
    if not heads:
        return None
    x = [e["update"] for e in run.ppo]
    cols = 4
    rows = -(-len(heads) // cols)
    fig, axes = _figure(rows, cols, size=(3.2 * cols, 2.6 * rows))
    for i, head in enumerate(heads):
        ax = axes[i // cols, i % cols]
        per_update = [e.get("head_choice_share", {}).get(head) for e in run.ppo]
        n = max((len(r) for r in per_update if isinstance(r, list)), default=0)
        shares = np.full((n, len(x)), np.nan)
        for j, r in enumerate(per_update):
            if isinstance(r, list) and len(r) == n:
                shares[:, j] = [float(v) if finite_number(v) else np.nan for v in r]
        names = CHOICE_NAMES.get(head) or (run.start or {}).get({"slot": "slots"}.get(head, head + "s"))
        names = list(names) if names and len(names) == n else [f"{head} {k}" for k in range(n)]
        ax.stackplot(x, np.nan_to_num(shares), labels=names)
        ax.set(title=head, ylim=(0, 1.02), xlabel="update" if i // cols == rows - 1 else None)
        ax.legend(fontsize=5, loc="lower left", ncol=2)
    for j in range(len(heads), rows * cols):
        axes[j // cols, j % cols].set_axis_off()
    fig.suptitle("What each head chose where it counted (share of its steps)")
    return _save(fig, path)


def plot_losses(run: RunEvents, path: Path) -> Path | None:
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


def plot_seed_timeline(run: RunEvents, path: Path) -> Path | None:
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


def germination_counts(run: RunEvents) -> dict[tuple[Any, str], Counter]:
    """``{(slot, blueprint): {update: germinations}}`` from the episodes' ``germinations``."""
    counts: dict[tuple[Any, str], Counter] = defaultdict(Counter)
    for e in run.episodes:
        for g in e.get("germinations") or ():
            if isinstance(g, dict) and "slot" in g and "blueprint" in g:
                counts[g["slot"], str(g["blueprint"])][e["update"]] += 1
    return dict(counts)


def plot_blueprints(run: RunEvents, path: Path) -> Path | None:
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


def plot_update_health(run: RunEvents, path: Path) -> Path | None:
    """Per update: the gradient norm before the clip, the explained variance of the critic, and the
    advantages GAE gave before normalizing (their spread, largest magnitude and share above 0)."""
    if not run.ppo:
        return None
    x = [e["update"] for e in run.ppo]
    fig, axes = _figure(2, 2, size=(9.0, 6.0))
    marker = "." if len(x) < 50 else None
    panels = (
        (("grad_norm", "gradient norm"),),
        (("explained_variance", "explained variance"),),
        (("adv_std", "std"), ("adv_max_abs", "max |adv|"), ("adv_mean", "mean")),
        (("adv_pos_frac", "share > 0"),),
    )
    titles = ("gradient norm (pre-clip)", "explained variance", "advantages (before normalizing)",
              "advantages above 0")  # fmt: skip
    for ax, fields, title in zip(axes.flat, panels, titles):
        for field, label in fields:
            ax.plot(x, _series(run.ppo, field), marker=marker, label=label)
        ax.set(title=title, xlabel="update")
        if len(fields) > 1:
            ax.legend(loc="best", fontsize="small")
    return _save(fig, path)


def plot_lstm_health(run: RunEvents, path: Path) -> Path | None:
    """Per update, the health of the rollout's LSTM states: the mean and largest norm of ``h`` and
    ``c``, and the share of saturated units and of dead or exploded state rows."""
    ppo = [e for e in run.ppo if "lstm_h_norm_mean" in e]
    if not ppo:
        return None
    x = [e["update"] for e in ppo]
    fig, axes = _figure(1, 2, size=(11.0, 4.0))
    marker = "." if len(x) < 50 else None
    ax = axes[0, 0]
    for field, label in (("lstm_h_norm_mean", "|h| mean"), ("lstm_h_norm_max", "|h| max"),
                         ("lstm_c_norm_mean", "|c| mean"), ("lstm_c_norm_max", "|c| max")):  # fmt: skip
        ax.plot(x, _series(ppo, field), marker=marker, label=label)
    ax.set(title="LSTM state norms", xlabel="update")
    ax.legend(loc="best", fontsize="small")
    ax = axes[0, 1]
    shares = (("lstm_h_saturated_frac", "h saturated"), ("lstm_c_saturated_frac", "c saturated"),
              ("lstm_too_small_frac", "rows dead"), ("lstm_too_large_frac", "rows exploded"))  # fmt: skip
    for field, label in shares:
        ax.plot(x, _series(ppo, field), marker=marker, label=label)
    ax.set(title="LSTM saturation", xlabel="update", ylabel="share", ylim=(-0.02, 1.02))
    ax.legend(loc="best", fontsize="small")
    return _save(fig, path)


def contributions(
    run: RunEvents, field: str = "contribution"
) -> tuple[list[str], dict[int, dict[int, list[float]]]]:
    """The slot names and ``{slot: {(update, epoch): [contribution of each env's seed]}}``: every
    measured contribution the epoch events carry (slots without a seed carry none); ``field``: another
    per-slot figure of the epoch events instead (``seed_grad_health``, ...)."""
    names: list[str] = []
    out: dict[int, dict[tuple[int, int], list[float]]] = defaultdict(lambda: defaultdict(list))
    for e in run.epochs:
        rows = e.get(field)
        if not isinstance(rows, list):
            continue
        names = e.get("slot_names") or names
        for row in rows:
            for s, v in enumerate(row if isinstance(row, list) else ()):
                if finite_number(v):
                    out[s][e["update"], e["epoch"]].append(float(v))
    if not names:
        names = [f"slot{s}" for s in range(max(out, default=-1) + 1)]
    return names, {s: dict(v) for s, v in out.items()}


def plot_contribution(run: RunEvents, path: Path) -> Path | None:
    """Each slot's seed contribution (validation accuracy lost without it, points) over time: along the
    last update's episodes, epoch by epoch (mean over the envs whose slot held a seed), and over the
    updates (mean over every epoch and env)."""
    names, data = contributions(run)
    if not data:
        return None
    last = max(u for per in data.values() for u, _ in per)
    fig, axes = _figure(1, 2, size=(11.0, 4.0))
    for s in sorted(data):
        label = names[s] if s < len(names) else f"slot{s}"
        per = data[s]
        epochs = sorted(ep for u, ep in per if u == last)
        if epochs:
            axes[0, 0].plot(epochs, [np.mean(per[last, ep]) for ep in epochs], marker=".", label=label)
        updates = sorted({u for u, _ in per})
        means = [np.mean([v for (u, _), vs in per.items() if u == up for v in vs]) for up in updates]
        axes[0, 1].plot(updates, means, marker="." if len(updates) < 50 else None, label=label)
    axes[0, 0].set(title=f"Seed contribution, update {last}", xlabel="epoch", ylabel="points (env mean)")
    axes[0, 1].set(title="Seed contribution per update", xlabel="update", ylabel="points (mean)")
    for ax in axes.flat:
        ax.axhline(0.0, color="0.6", lw=0.8)
        ax.legend(loc="best", fontsize="small")
    return _save(fig, path)


def plot_seed_grad_health(run: RunEvents, path: Path) -> Path | None:
    """Each slot's seed gradient health over time (:func:`esper.core.health.seed_grad_health`, from the
    epoch events): the health score and the gradient norm along the last update's episodes, epoch by
    epoch (mean over the envs whose slot held a seed), and per update (mean over every epoch and env),
    with the shares of vanishing and exploding parameter tensors where any was."""
    names, health = contributions(run, "seed_grad_health")
    if not health:
        return None
    norms = contributions(run, "seed_grad_norm")[1]
    bad = {k: contributions(run, f"seed_grad_{k}")[1] for k in ("vanishing", "exploding")}
    last = max(u for per in health.values() for u, _ in per)
    fig, axes = _figure(2, 2, size=(11.0, 7.0))
    for s in sorted(health):
        label = names[s] if s < len(names) else f"slot{s}"
        for row, data in ((0, health[s]), (1, norms.get(s, {}))):
            epochs = sorted(ep for u, ep in data if u == last)
            if epochs:
                axes[row, 0].plot(epochs, [np.mean(data[last, ep]) for ep in epochs], marker=".", label=label)
            updates = sorted({u for u, _ in data})
            means = [np.mean([v for (u, _), vs in data.items() if u == up for v in vs]) for up in updates]
            axes[row, 1].plot(updates, means, marker="." if len(updates) < 50 else None, label=label)
        for kind, style in (("vanishing", ":"), ("exploding", "--")):
            per = bad[kind].get(s, {})
            updates = sorted({u for u, _ in per})
            means = [np.mean([v for (u, _), vs in per.items() if u == up for v in vs]) for up in updates]
            if any(m > 0 for m in means):
                axes[0, 1].plot(updates, means, ls=style, label=f"{label} {kind} share")
    axes[0, 0].set(title=f"Seed gradient health, update {last}", xlabel="epoch", ylabel="score (env mean)",
                   ylim=(-0.02, 1.02))  # fmt: skip
    axes[0, 1].set(title="Seed gradient health per update", xlabel="update", ylabel="score (mean)",
                   ylim=(-0.02, 1.02))  # fmt: skip
    axes[1, 0].set(title=f"Seed gradient norm, update {last}", xlabel="epoch", ylabel="L2 norm (env mean)")
    axes[1, 1].set(title="Seed gradient norm per update", xlabel="update", ylabel="L2 norm (mean)")
    for ax in axes[1]:
        if any(line.get_ydata().size and np.nanmin(line.get_ydata()) > 0 for line in ax.get_lines()):
            ax.set_yscale("log")
    for ax in axes.flat:
        ax.legend(loc="best", fontsize="small")
    return _save(fig, path)


def reward_flag_counts(run: RunEvents) -> dict[str, dict[int, int]]:
    """``{flag: {update: env-steps flagged}}`` from the episodes' ``reward_flags`` (every update with
    an episode that reports them, zeros included)."""
    out: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for e in run.episodes:
        flags = e.get("reward_flags")
        if isinstance(flags, dict):
            for k, n in flags.items():
                out[k][e["update"]] += int(n) if finite_number(n) else 0
    return {k: dict(sorted(v.items())) for k, v in out.items()}


def plot_reward_flags(run: RunEvents, path: Path) -> Path | None:
    """Per update, the env-steps whose reward raised the hacking or ransomware flag (a seed claiming
    far more than the host gained; one the host depends on while it got worse). Drawn only when some
    step was flagged."""
    counts = reward_flag_counts(run)
    if not any(n for per in counts.values() for n in per.values()):
        return None
    fig, ax = _figure(size=(7.0, 3.5))
    ax = ax[0, 0]
    width = 0.8 / max(len(counts), 1)
    for i, (flag, per) in enumerate(sorted(counts.items())):
        x = np.array(list(per), dtype=float) + (i - (len(counts) - 1) / 2) * width
        ax.bar(x, list(per.values()), width=width, label=flag)
    ax.set(title="Reward flags", xlabel="update", ylabel="env-steps flagged")
    ax.legend(loc="best", fontsize="small")
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
    ("choices.png", plot_choices),
    ("losses.png", plot_losses),
    ("update_health.png", plot_update_health),
    ("lstm_health.png", plot_lstm_health),
    ("seed_timeline.png", plot_seed_timeline),
    ("contribution.png", plot_contribution),
    ("seed_grad_health.png", plot_seed_grad_health),
    ("blueprints.png", plot_blueprints),
    ("reward_flags.png", plot_reward_flags),
)
