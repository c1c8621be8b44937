"""The README's first command, alone, against a base revision's, in interleaved rounds (issue 102).

    python -m bench.front_door --base 9ba4421 --rounds 2 --quality bench/results/perf/ttq-102 --label C8

Each round runs ``python -m esper.shell.run`` (the README's command: the embedded default, its held-out
check included) once at the base revision and once in this checkout, in alternating order (base, this;
this, base; ...), each in a fresh process with its own run directory, and reads the process's wall time
and the held-out line the run prints. The ratio is the median over rounds of the per-round ratio
this / base, so a machine whose speed drifts between rounds hits both alike. The base revision is checked
out into a temporary git worktree (removed after).

The file it writes is the one the README and docs quote for *today's default*: it records the
configuration hash of this checkout's default (:func:`esper.shell.config.presets.config_hash`, which
``tests/test_default_figures.py`` compares with the code), the revision, the machine, and, with
``--quality``, the time-to-quality reading of the same configuration (``bench.ttq``'s pooled label)
beside the wall times. Writes ``bench/results/perf/<date>-<host>-default.{md,json}`` (``<host>`` the
hostname, renamed by hand as bench/results/README.md says).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "perf"


def run_once(cwd: Path, run_dir: Path) -> dict:
    """``python -m esper.shell.run`` in ``cwd`` (its default, nothing but where it writes): wall seconds,
    the held-out line, the exit status."""
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "esper.shell.run", "--run_dir", str(run_dir)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - t0
    heldout = [ln.strip() for ln in proc.stdout.splitlines() if "held-out" in ln]
    return {"seconds": wall, "status": proc.returncode, "heldout": heldout[-1] if heldout else "",
            "tail": proc.stdout[-2000:] + proc.stderr[-2000:]}  # fmt: skip


def measure(base: str, rounds: int) -> dict:
    """``rounds`` interleaved rounds of the base revision's command and this checkout's."""
    from esper.shell.common.revision import git_revision, machine
    from esper.shell.config.presets import config_hash, preset

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), base], cwd=ROOT, check=True,
                       capture_output=True)  # fmt: skip
        try:
            for r in range(rounds):
                order = ("base", "this") if r % 2 == 0 else ("this", "base")
                got = {}
                for arm in order:
                    cwd = tree if arm == "base" else ROOT
                    got[arm] = run_once(cwd, Path(tmp) / f"runs-{arm}-{r}")
                    if got[arm]["status"]:
                        raise RuntimeError(
                            f"round {r} {arm} exited {got[arm]['status']}:\n{got[arm]['tail']}"
                        )
                    print(f"round {r + 1} {arm}: {got[arm]['seconds']:.1f} s", file=sys.stderr)
                rows.append({"round": r + 1, "order": list(order),
                             **{f"{a}_seconds": got[a]["seconds"] for a in got},
                             **{f"{a}_heldout": got[a]["heldout"] for a in got},
                             "ratio": got["this"]["seconds"] / got["base"]["seconds"]})  # fmt: skip
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False,
                           capture_output=True)  # fmt: skip
    return {
        "base": base,
        "revision": git_revision(),
        "config_hash": config_hash(preset("default")),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "rounds": rows,
        "ratio_median": statistics.median(r["ratio"] for r in rows),
        "this_seconds_median": statistics.median(r["this_seconds"] for r in rows),
        "base_seconds_median": statistics.median(r["base_seconds"] for r in rows),
    }


def quality(folder: Path, label: str) -> dict:
    """``bench.ttq``'s pooled reading of ``label`` in ``folder`` (its ``pooled.json``)."""
    pooled = json.loads((folder / "pooled.json").read_text())
    if label not in pooled:
        raise SystemExit(f"--label {label!r}: not in {folder}/pooled.json (labels: {', '.join(pooled)})")
    return pooled[label]


def write(record: dict, path: Path) -> Path:
    rows = record["rounds"]
    lines = [
        "# Today's default: the README's first command alone, and its controller on every seed",
        "",
        f"Revision {record['revision']}, configuration hash {record['config_hash']}; {record['machine']}; "
        f"{record['date']}. `python -m esper.shell.run` (held-out check included) alone on the machine, "
        f"in {len(rows)} interleaved rounds against {record['base']}'s default.",
        "",
        "| round | order | base s | this s | this / base |",
        "|---:|---|---:|---:|---:|",
    ]
    lines += [f"| {r['round']} | {', '.join(r['order'])} | {r['base_seconds']:.1f} | "
              f"{r['this_seconds']:.1f} | {r['ratio']:.3f} |" for r in rows]  # fmt: skip
    lines += [
        "",
        f"Median: this {record['this_seconds_median']:.1f} s, base {record['base_seconds_median']:.1f} s, "
        f"ratio {record['ratio_median']:.3f} (median of the per-round ratios).",
        "",
        f"The held-out line of this checkout's run (every round): `{rows[0]['this_heldout']}`",
        "",
    ]
    if record.get("note"):
        lines += [record["note"], ""]
    q = record.get("quality")
    if q:
        last, worst = q["last"], q["worst_seed"]
        greedy, lo_hi = last["ppo_greedy"]["mean"], last["ppo_greedy"]["ci95"]
        lines += [
            f"## Its controller on every seed (`bench.ttq`, label {record['quality_label']})",
            "",
            f"Training seeds {q['seeds']}, {q['episodes']} fresh hosts each (evaluation seed 1000 + k); "
            f"revision {', '.join(q['revision'])}; configuration hash {', '.join(q['config_hash'])}. "
            f"At update {last['update']}: `ppo_greedy` {greedy:.1f} [{lo_hi[0]:.1f}, {lo_hi[1]:.1f}] % with "
            f"{last['params_added']:.0f} parameters added, `grow_all` {last['grow_all']['mean']:.1f} %, "
            f"static {last['static']['mean']:.1f} %; share of `grow_all`'s gain "
            f"{q['curve'][-1]['share']:.3f} pooled, worst seed {worst['seed']} at {worst['share']:.3f}.",
            "",
            "| seed | share of grow_all's gain at the last update |",
            "|---:|---:|",
        ]
        lines += [
            f"| {s} | {x:.3f} |" for s, x in zip(q["seeds"], q["curve"][-1]["per_seed_share"], strict=True)
        ]
        if q.get("fresh_draw"):
            fd = q["fresh_draw"]
            lines += [
                "",
                f"On a fresh data draw (data seed 60000 + k), greedy minus `random`: mean {fd['mean']:+.1f} "
                f"points, worst seed {fd['worst_seed']['seed']} {fd['worst_seed']['gap']:+.1f}.",
            ]
        lines.append("")
    path.with_suffix(".md").write_text("\n".join(lines))
    path.with_suffix(".json").write_text(json.dumps(record, indent=1))
    return path.with_suffix(".md")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.front_door", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="9ba4421", help="the revision whose default run is the yardstick")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--quality", type=Path, default=None, help="a bench.ttq output folder (its pooled.json)")
    p.add_argument("--label", default="", help="the label in --quality that measured this default")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    record = measure(a.base, a.rounds)
    if a.quality is not None:
        record["quality"] = quality(a.quality, a.label)
        record["quality_label"] = a.label
    out = a.out or RESULTS / f"{record['date']}-{socket.gethostname()}-default"  # rename by hand: vm, ...
    print(write(record, out).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
