"""Re-judge finished runs with today's anomaly detector: the alarms their logs hold against the alarms
and notes the current :class:`~esper.shell.telemetry.anomaly.AnomalyDetector` raises on the same
updates.

    python -m bench.anomaly_replay RUN_DIR [RUN_DIR ...] [--out FILE.md]

Each run's ``events.jsonl`` is read back: its ``ppo_update`` metrics and its episodes' reward flags go
through a detector built from the run's own config (its ``anomaly`` section, run length, entropy
coefficient, KL target and ``ppo.blend_bias``; thresholds the run's config does not name take today's
defaults), in the order the run checked them. The detector never changes training, so a replay is
what the run would have logged. A log from before ``head_choice_share`` (issue 47) lacks what the
blend heads chose; the replay then counts it from the run's ``germinated`` and ``alpha_set``
lifecycle events of the same update, the steps where those heads counted.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from esper.core.spec import ALPHA_TARGETS, CHOICE_NAMES
from esper.shell.agent.policy import prior_choices
from esper.shell.telemetry.anomaly import AnomalyConfig, AnomalyDetector
from esper.shell.telemetry.events import read_events

#: The blend heads whose choices a lifecycle event names, and how it writes each choice (the alpha
#: target as its value).
_LOGGED_CHOICES = {
    "style": list(CHOICE_NAMES["style"]),
    "tempo": list(CHOICE_NAMES["tempo"]),
    "alpha_target": list(ALPHA_TARGETS),
}


@dataclasses.dataclass
class Replay:
    """One run: the alarms its log holds and the alarms and notes the current detector raises."""

    run: str
    logged: Counter
    alarms: Counter
    notes: Counter
    found: list[dict[str, Any]]


def detector_for(config: dict[str, Any]) -> AnomalyDetector:
    """The detector a run with ``config`` (its ``run_start`` config) builds today."""
    fields = {f.name for f in dataclasses.fields(AnomalyConfig)}
    section = config.get("anomaly", {})
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in section.items() if k in fields}
    ppo = config.get("ppo", {})
    return AnomalyDetector(
        AnomalyConfig(**given), target_kl=ppo.get("target_kl"), updates=config.get("updates"),
        entropy_coef=ppo.get("entropy_coef"), priors=prior_choices(float(ppo.get("blend_bias", 0.0))),
    )  # fmt: skip


def shares_from_lifecycle(events: Sequence[dict[str, Any]]) -> dict[int, dict[str, list[float]]]:
    """``{update: {head: share of each choice}}`` of the blend heads, from the lifecycle events that name
    them (``germinated``: style, tempo, alpha_target; ``alpha_set``: alpha_target)."""
    counts: dict[int, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for e in events:
        if e.get("event") != "lifecycle" or e.get("kind") not in ("germinated", "alpha_set"):
            continue
        heads = ("style", "tempo", "alpha_target") if e["kind"] == "germinated" else ("alpha_target",)
        for head in heads:
            if e.get(head) in _LOGGED_CHOICES[head]:  # (an alpha 0 is a prune's, not the head's)
                counts[e["update"]][head][_LOGGED_CHOICES[head].index(e[head])] += 1
    out: dict[int, dict[str, list[float]]] = {}
    for update, by_head in counts.items():
        out[update] = {}
        for head, c in by_head.items():
            total = sum(c.values())
            out[update][head] = [c[i] / total for i in range(len(_LOGGED_CHOICES[head]))]
    return out


def replay(run_dir: Path) -> Replay:
    events = read_events(run_dir / "events.jsonl")
    start = next(e for e in events if e["event"] == "run_start")
    det = detector_for(start["config"])
    derived = shares_from_lifecycle(events)
    flags: dict[int, Counter] = defaultdict(Counter)
    steps: Counter = Counter()
    for e in events:
        if e["event"] == "episode":
            flags[e["update"]].update(e.get("reward_flags", {}))
            steps[e["update"]] += sum(e.get("op_counts", {}).values())
    updates = {e["update"]: e for e in events if e["event"] == "ppo_update"}  # the last copy of each
    found = []
    for u in sorted(set(updates) | set(flags)):
        out = det.check_rewards(flags[u], steps[u], update=u) if u in flags else []
        if u in updates:
            metrics = dict(updates[u])
            if "head_choice_share" not in metrics:
                metrics["head_choice_share"] = derived.get(u, {})
            out += det.check(metrics, update=u)
        found += [{"update": u, "severity": a.severity, **a.as_dict()} for a in out]
    return Replay(
        run=str(run_dir),
        logged=Counter(e["kind"] for e in events if e["event"] == "anomaly"),
        alarms=Counter(a["kind"] for a in found if a["severity"] == "alarm"),
        notes=Counter(a["kind"] for a in found if a["severity"] == "note"),
        found=found,
    )


def _counts(c: Counter) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(c.items())) or "none"


def render(replays: Sequence[Replay]) -> str:
    lines = ["| run | logged alarms | alarms now | notes now |", "|---|---|---|---|"]
    for r in replays:
        lines.append(f"| `{r.run}` | {_counts(r.logged)} | {_counts(r.alarms)} | {_counts(r.notes)} |")
    total = [sum((getattr(r, k) for r in replays), Counter()) for k in ("logged", "alarms", "notes")]
    with_alarm = [sum(1 for r in replays if getattr(r, k)) for k in ("logged", "alarms", "notes")]
    lines.append(
        f"| all {len(replays)} runs | {sum(total[0].values())} ({with_alarm[0]} runs) | "
        f"{sum(total[1].values())} ({with_alarm[1]} runs) | {sum(total[2].values())} ({with_alarm[2]} runs) |"
    )
    lines += ["", "What the current detector raises:", ""]
    for r in replays:
        for a in r.found:
            lines.append(f"- `{r.run}` update {a['update']}: {a['severity']} `{a['kind']}`, {a['detail']}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.anomaly_replay", description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (each with an events.jsonl)")
    ap.add_argument("--out", type=Path, help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    missing = [str(r) for r in args.runs if not (r / "events.jsonl").is_file()]
    if missing:
        ap.error(f"no events.jsonl in {', '.join(missing)}")
    text = render([replay(r) for r in args.runs])
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
