"""The benchmark harness: a registry of suites, interleaved timing with medians, machine provenance,
and the results files.

A suite is a function ``(ctx: Context) -> SuiteResult`` registered with ``@suite("name", help=...)``;
it builds its inputs, calls ``ctx.compare({...})`` with zero-argument callables (every callable of a
case timed in the same rounds, so the ratios share the machine's state), and returns rows, ratios and
targets. Add a suite by dropping a module in ``bench/perf/`` and importing it from
``bench/perf/__init__.py``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from esper.shell.common.revision import machine_info as machine_info  # the results files' provenance


# ---------------------------------------------------------------------------------------------- data
@dataclass(slots=True)
class Stats:
    """Per-call wall time of one callable, in milliseconds, over ``samples`` samples of ``inner`` calls."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    samples: int
    inner: int
    #: the samples in the order taken (round by round), for per-round ratios
    rounds_ms: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, per_call_s: list[float], inner: int) -> Stats:
        in_order = [x * 1e3 for x in per_call_s]
        ms = sorted(in_order)
        return cls(statistics.median(ms), _quantile(ms, 0.1), _quantile(ms, 0.9), len(ms), inner, in_order)


def round_ratio(base: Stats, other: Stats) -> float:
    """Median over rounds of ``base / other``, each ratio taken within one round of the same
    :meth:`Context.compare` call (steadier than a ratio of medians when the machine's speed drifts)."""
    if len(base.rounds_ms) != len(other.rounds_ms) or not base.rounds_ms:
        raise ValueError("round_ratio needs two Stats from the same compare() call")
    return statistics.median(b / o for b, o in zip(base.rounds_ms, other.rounds_ms))


@dataclass(slots=True)
class Row:
    """One measured (or not measurable) implementation of one case."""

    case: str
    impl: str
    stats: Stats | None = None
    #: "faster TorchRL / this" style ratio against the case's baseline (>1: this is faster)
    ratio: float | None = None
    note: str = ""


@dataclass(slots=True)
class Target:
    name: str
    value: float | None
    goal: str
    met: bool | None  # None: not measurable here


@dataclass(slots=True)
class SuiteResult:
    rows: list[Row] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the label of the ratio column ("x vs faster TorchRL", ...)
    ratio_label: str = "ratio"


@dataclass(slots=True)
class Suite:
    name: str
    help: str
    fn: Callable[[Context], SuiteResult]
    #: default run order (lower first)
    order: int


SUITES: dict[str, Suite] = {}


def suite(name: str, *, help: str, order: int = 100) -> Callable:
    """Register ``fn(ctx) -> SuiteResult`` under ``name``; ``order`` places it in a default run."""

    def register(fn: Callable[[Context], SuiteResult]) -> Callable[[Context], SuiteResult]:
        if name in SUITES:
            raise ValueError(f"bench suite {name!r} registered twice")
        SUITES[name] = Suite(name, help, fn, order)
        return fn

    return register


# -------------------------------------------------------------------------------------------- timing
@dataclass(slots=True)
class Context:
    """What a suite needs: the device, the quick flag and the timing policy."""

    device: torch.device
    quick: bool = False
    #: one sample lasts at least this long (calls are batched inside a sample)
    min_sample_s: float = 0.004
    #: samples per callable (interleaved rounds)
    samples: int = 25
    #: no callable gets more than this much measuring time (the sample count shrinks, never below 5)
    budget_s: float = 2.0
    warmup: int = 3
    #: measured episodes of the ``episode`` suite (0: the suite's default, smaller with --quick)
    episodes: int = 0

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def compare(self, fns: dict[str, Callable[[], object]], *, rounds: int | None = None) -> dict[str, Stats]:
        """Warm up every callable, size its inner loop (a block of calls lasting ``min_sample_s``),
        then take the samples in interleaved rounds, one block per callable per round (A B C, C B A,
        A B C, ...: the order flips each round, so no callable always follows the same one), so slow
        drifts of a shared machine hit every implementation alike. ``rounds`` fixes the round count
        (else ``samples``, fewer when a round would overrun ``budget_s``)."""
        inner: dict[str, int] = {}
        per_call: dict[str, float] = {}
        for name, fn in fns.items():
            for _ in range(self.warmup):
                fn()
            self.sync()
            n, elapsed = 1, self._time(fn, 1)
            while elapsed < self.min_sample_s and n < 1 << 20:
                n *= 2 if elapsed * 4 > self.min_sample_s else 8
                elapsed = self._time(fn, n)
            inner[name], per_call[name] = n, elapsed / n
        if rounds is None:
            rounds = max(5, min(self.samples, *(int(self.budget_s / (per_call[k] * inner[k])) for k in fns)))
        times: dict[str, list[float]] = {k: [] for k in fns}
        names = list(fns)
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                times[name].append(self._time(fns[name], inner[name]) / inner[name])
        return {k: Stats.of(v, inner[k]) for k, v in times.items()}

    def time_once(self, fn: Callable[[], object]) -> float:
        """Seconds of one call (compile timing)."""
        return self._time(fn, 1)

    def _time(self, fn: Callable[[], object], n: int) -> float:
        self.sync()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        self.sync()
        return time.perf_counter() - start


def _quantile(sorted_xs: list[float], q: float) -> float:
    if len(sorted_xs) == 1:
        return sorted_xs[0]
    pos = q * (len(sorted_xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


# ------------------------------------------------------------------------------------------- reports
def fmt_ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.4f}" if x < 0.1 else f"{x:.3f}" if x < 10 else f"{x:.1f}"


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def markdown(info: dict[str, object], results: dict[str, SuiteResult], command: str, wall_s: float) -> str:
    lines = [
        f"# Esper benchmarks: {info['date_utc']} UTC, {info['device_name']}",
        "",
        f"Command: `{command}` (whole run {wall_s:.0f} s). Times are per call, in ms: median (p10-p90)",
        "over interleaved samples after warm-up; ratios compare timings taken in the same rounds (medians,",
        "or where a suite says so the median of per-round ratios).",
        "",
        "| machine | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in info.items()),
    ]
    for name, res in results.items():
        lines += ["", f"## {name}", "", f"| case | impl | median ms | p10 | p90 | {res.ratio_label} | note |"]
        lines.append("|---|---|---:|---:|---:|---:|---|")
        for r in res.rows:
            s = r.stats
            lines.append(
                f"| {r.case} | {r.impl} | {fmt_ms(s and s.median_ms)} | {fmt_ms(s and s.p10_ms)} | "
                f"{fmt_ms(s and s.p90_ms)} | {fmt_ratio(r.ratio)} | {r.note} |"
            )
        if res.targets:
            lines += ["", "| target | value | goal | met |", "|---|---:|---|---|"]
            for t in res.targets:
                met = "n/a" if t.met is None else "yes" if t.met else "**no**"
                value = "-" if t.value is None else f"{t.value:.2f}"
                lines.append(f"| {t.name} | {value} | {t.goal} | {met} |")
        lines += [f"- {n}" for n in (["", *res.notes] if res.notes else [])]
    return "\n".join(lines).replace("\n- \n", "\n\n") + "\n"


def console(results: dict[str, SuiteResult]) -> str:
    out = []
    for name, res in results.items():
        out.append(f"\n== {name} ==")
        out.append(f"{'case':<22} {'impl':<46} {'median ms':>10} {'p10':>9} {'p90':>9} {res.ratio_label:>12}")
        for r in res.rows:
            s = r.stats
            out.append(
                f"{r.case:<22} {r.impl:<46} {fmt_ms(s and s.median_ms):>10} {fmt_ms(s and s.p10_ms):>9} "
                f"{fmt_ms(s and s.p90_ms):>9} {fmt_ratio(r.ratio):>12}  {r.note}"
            )
        for t in res.targets:
            met = "n/a" if t.met is None else "MET" if t.met else "MISSED"
            value = "-" if t.value is None else f"{t.value:.2f}"
            out.append(f"  target {t.name}: {value} (goal {t.goal}) {met}")
        out += [f"  note: {n}" for n in res.notes]
    return "\n".join(out)


def write(
    results_dir: Path, info: dict[str, object], results: dict[str, SuiteResult], md: str, tag: str
) -> Path:
    """``<dir>/<YYYY-MM-DD>-<host>-<device>[-tag].md`` and the raw numbers as ``.json`` beside it."""
    device = str(info["device_name"]) if str(info["device"]).startswith("cuda") else "cpu"
    stem = "-".join(_slug(x) for x in (str(info["date_utc"])[:10], str(info["host"]), device, tag) if x)
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / f"{stem}.md").write_text(md)
    raw = {"machine": info, "suites": {k: dataclasses.asdict(v) for k, v in results.items()}}
    (results_dir / f"{stem}.json").write_text(json.dumps(raw, indent=1) + "\n")
    return results_dir / f"{stem}.md"


def _slug(x: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", x).strip("-").lower()
