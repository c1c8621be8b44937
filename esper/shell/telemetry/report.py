"""The markdown summary of a run (``RUN_DIR/report.md``), and :func:`write_report`, which writes it
with the run's plots (:mod:`esper.shell.telemetry.plots`) from its event log. The command line is
``python -m esper.shell.report RUN_DIR`` (:mod:`esper.shell.report`)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from esper.shell.telemetry.events import RunEvents, scan_events
from esper.shell.telemetry.plots import PLOTS, reward_flag_counts

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


def summary_markdown(run: RunEvents, run_dir: Path, plots: Sequence[Path]) -> str:
    lines = [f"# Esper run report: `{run_dir.name}`", ""]
    if run.start is not None:
        prov = run.start.get("provenance") or {}  # esper.shell.run's variant: one dict with all of these
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
                + (
                    f", gain {_fmt(h['greedy_gain'])} points (95 % CI {_fmt(h['greedy_gain_ci95'][0])} to "
                    f"{_fmt(h['greedy_gain_ci95'][1])})"
                    if h.get("greedy_gain") is not None
                    else ""
                )
                if h.get("greedy_test_acc") is not None
                else ""
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
    flags = reward_flag_counts(run)
    if flags:
        steps = _env_steps(run)
        said = [f"{k} {sum(per.values())}" + (f" of {steps}" if steps else "") + _worst(per)
                for k, per in sorted(flags.items())]  # fmt: skip
        lines.append("- reward flags (env-steps whose reward raised them): " + ", ".join(said))
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
        kinds = Counter(a.get("kind") for a in run.anomalies)
        lines += ["by kind: " + ", ".join(f"{k} {n}" for k, n in kinds.most_common()), ""]
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
    if run.notes:
        lines += ["", f"## Notes ({len(run.notes)})", "",
                  "Findings of the anomaly detector that are no fault: a head whose entropy collapsed onto "
                  "the choice its start bias favours (`ppo.blend_bias`) committed to what the run told it "
                  "to prefer (`anomaly.entropy_prior_note`).", "",
                  "| update | kind | value | threshold | detail |", "|---|---|---|---|---|"]  # fmt: skip
        lines += [f"| {_fmt(a.get('update'))} | {_fmt(a.get('kind'))} | {_fmt(a.get('value'))} | "
                  f"{_fmt(a.get('threshold'))} | {_fmt(a.get('detail'))} |"
                  for a in run.notes[:50]]  # fmt: skip
    lines += _profile_lines(run.profile)
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{p.stem}](plots/{p.name})" for p in plots]
    if run.end is not None and run.end.get("summary"):
        lines += ["", "## Run end summary", "", "| key | value |", "|---|---|"]
        lines += [f"| `{k}` | {_fmt(v)} |" for k, v in _flatten(run.end["summary"]).items()]
    return "\n".join(lines) + "\n"


def _profile_lines(profile: dict | None) -> list[str]:
    """The ``--profile`` section: where the trace is, and the operators that took most time."""
    if not profile or not isinstance(profile.get("top"), list):
        return []
    where = "GPU" if "device" in str(profile.get("sort_by")) else "CPU"
    lines = ["", f"## Profile ({_fmt(profile.get('updates'))} update(s))", "",
             f"Trace: `{_fmt(profile.get('trace'))}` (open it in ui.perfetto.dev); the full table: "
             f"`{_fmt(profile.get('table'))}`. The operators that took most {where} time by themselves:", "",
             "| operator | calls | self ms | total ms |", "|---|---:|---:|---:|"]  # fmt: skip
    row = lambda r: [f"`{r.get('name')}`", *(_fmt(r.get(k)) for k in ("calls", "self_ms", "total_ms"))]
    lines += ["| " + " | ".join(row(r)) + " |" for r in profile["top"] if isinstance(r, dict)]
    return lines


def _env_steps(run: RunEvents) -> int:
    """Env-steps of the logged episodes: each ``epoch`` event holds one step of each env."""
    return sum(len(e["val_acc"]) for e in run.epochs if isinstance(e.get("val_acc"), list))


def _worst(per_update: dict[int, int]) -> str:
    """`` (most in update u: n)`` for a flag raised at all, else nothing."""
    if not any(per_update.values()):
        return ""
    u, n = max(per_update.items(), key=lambda kv: kv[1])
    return f" (most in update {u}: {n})"


def write_report(run_dir: str | Path) -> Path:
    """Write the plots and ``report.md`` for ``run_dir``; returns the path of ``report.md``."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    log = run_dir / "events.jsonl"
    if not log.is_file():
        raise FileNotFoundError(f"{log} does not exist (is {run_dir} a run directory?)")
    run = RunEvents(*scan_events(log))
    plot_dir = run_dir / "plots"
    plot_dir.mkdir(exist_ok=True)
    written = [p for name, fn in PLOTS if (p := fn(run, plot_dir / name)) is not None]
    out = run_dir / "report.md"
    out.write_text(summary_markdown(run, run_dir, written), encoding="utf-8")
    return out
