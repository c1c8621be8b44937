"""Fine-tuning after transfer (issue 46): how fast the transferred controller learns the held-out task,
next to the same controller trained there from scratch.

For each training seed k of a finished transfer run (``--runs/transfer-TASK/seedk``, from
``python -m esper.shell.suite --transfer TASK``), two runs of the task's suite preset with the set policy:
``tuned`` starts from the transfer run's weights and observation statistics (``--init_from``),
``scratch`` from a fresh network, both ``--seed k`` (the same training hosts, data order and draws).
The curve is each update's training episodes' final test accuracy (the task's training hosts and own
draw: a learning curve, not the held-out table), averaged over the envs, then over seeds with a 95 %
interval (the runs: :func:`esper.shell.suite.runs.run_finetune`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from esper.shell.eval.stats import mean_ci95
from esper.shell.telemetry.events import read_events

#: The two arms: started from the transferred controller, and from a fresh network.
ARMS = ("tuned", "scratch")


def curve(run_dir: Path) -> list[float]:
    """Per update (1, 2, ...), the mean final test accuracy of that update's training episodes."""
    by_update: dict[int, list[float]] = {}
    for ev in read_events(run_dir / "events.jsonl", "episode"):
        by_update.setdefault(int(ev["update"]), []).append(float(ev["final_test_acc"]))
    return [float(np.mean(by_update[u])) for u in sorted(by_update)]


def closing_check(run_dir: Path) -> float | None:
    """The run's closing held-out check (fresh hosts, each head's most likely action): its test accuracy,
    or None where the run wrote none."""
    checks = list(read_events(run_dir / "events.jsonl", "heldout_check"))
    return float(checks[-1]["greedy_test_acc"]) if checks else None


def catch_up(tuned: dict[str, Any], scratch: dict[str, Any]) -> int | None:
    """The first update at which ``scratch``'s mean reaches ``tuned``'s first update (the updates the
    transferred start saves), or None if it never does."""
    start = tuned["test_acc_mean"][0]
    return next((u for u, m in zip(scratch["updates"], scratch["test_acc_mean"]) if m >= start), None)


def pool_curves(per_seed: dict[int, list[float]]) -> dict[str, Any]:
    """Seeds' curves (cut to the shortest) -> per update the mean over seeds and its 95 % interval."""
    n = min(len(c) for c in per_seed.values())
    stats = [mean_ci95([c[u] for c in per_seed.values()]) for u in range(n)]
    return {"updates": list(range(1, n + 1)), "test_acc_mean": [m for m, _ in stats],
            "test_acc_ci95": [list(ci) for _, ci in stats], "training_seeds": sorted(per_seed)}  # fmt: skip


def plot(out: Path, stem: str, heldout: str, finetune: dict[str, Any]) -> Path:
    """The two arms' curves with their 95 % bands."""
    from esper.shell.telemetry.plots import finish_figure, new_figure

    fig, ax = new_figure()
    for arm, color in zip(ARMS, ("#2a9d8f", "#8d99ae")):
        c = finetune[arm]
        lo, hi = zip(*c["test_acc_ci95"])
        ax.plot(c["updates"], c["test_acc_mean"], marker="o", ms=3, color=color,
                label=f"{arm} ({len(c['training_seeds'])} seeds)")  # fmt: skip
        ax.fill_between(c["updates"], lo, hi, color=color, alpha=0.2)
    ax.set_xlabel("update")
    ax.set_ylabel("training episodes' final test accuracy (%)")
    ax.set_title(f"{heldout}: fine-tuned after transfer vs from scratch (95 % CI over seeds)")
    return finish_figure(fig, ax, out / f"{stem}-finetune.png")


def _cell(mean: float, ci: list[float]) -> str:
    return f"{mean:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]"


def markdown(heldout: str, finetune: dict[str, Any], png: Path) -> list[str]:
    """The curves at a few updates, as a table, and the plot."""
    tuned, scratch = finetune["tuned"], finetune["scratch"]
    n = len(tuned["updates"])
    picks = sorted({u for u in (1, 2, 4, 8, 16, n) if u <= n})
    lines = [
        f"## Fine-tuning on {heldout} after transfer",
        "",
        f"`tuned`: the set policy trained on {', '.join(f'`{t}`' for t in finetune['trained_on'])}, "
        f"fine-tuned on `{heldout}` (`--init_from`); `scratch`: the same network fresh. Preset "
        f"`{finetune['preset']}`, {finetune['updates']} updates, training seeds {tuned['training_seeds']}. "
        "Each update's training episodes' final test accuracy (training hosts, the task's own draw), "
        "mean over seeds [95 % CI].",
        "",
        "| update | tuned | scratch |",
        "|---:|---|---|",
    ]
    for u in picks:
        cells = [_cell(c["test_acc_mean"][u - 1], c["test_acc_ci95"][u - 1]) for c in (tuned, scratch)]
        lines.append(f"| {u} | {cells[0]} | {cells[1]} |")
    lines.append("")
    up = finetune.get("catch_up_update")
    start = tuned["test_acc_mean"][0]
    when = f"at update {up}." if up is not None else f"at no update of {n}."
    lines.append(f"From scratch, the mean first reaches the fine-tuned first update ({start:.1f} %) {when}")
    if all("heldout_greedy" in c for c in (tuned, scratch)):
        cells = [_cell(c["heldout_greedy"]["test_acc_mean"], c["heldout_greedy"]["test_acc_ci95"])
                 for c in (tuned, scratch)]  # fmt: skip
        lines.append(
            f"After the last update, each run's held-out check (fresh hosts, `ppo_greedy`): tuned "
            f"{cells[0]} %, scratch {cells[1]} %."
        )
    return [*lines, "", f"![{png.stem}]({png.name})", ""]


__all__ = ["ARMS", "catch_up", "closing_check", "curve", "markdown", "plot", "pool_curves"]
