"""Learning curves of the CartPole example, esper's GAE + loss next to TorchRL's GAE + ClipPPOLoss,
over several seeds of the same script, written as a results file and a plot.

    python -m examples.cartpole_curves                          # seeds 0 1 2, 32768 frames each
    python -m examples.cartpole_curves --seeds 0 1 2 3 --frames 65536

Writes ``examples/results/cartpole-<date>-<host>.{json,md,png}``: every curve (mean return of the
last 20 finished episodes after each batch), the command, the machine, and per variant the mean,
minimum and maximum over seeds at a few points.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
from pathlib import Path

import torch

from bench.harness import machine_info
from examples.cartpole_ppo import Args, train

VARIANTS = {"esper gae + ppo_loss": False, "torchrl GAE + ClipPPOLoss": True}


def run(seeds: list[int], frames: int) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for seed in seeds:
        for name, torchrl_loss in VARIANTS.items():
            print(f"[curves] {name}, seed {seed}", file=sys.stderr, flush=True)
            result = train(Args(seed=seed, frames=frames, torchrl_loss=torchrl_loss), log=lambda _: None)
            result["seed"] = seed
            out[name].append(result)
            print(
                f"[curves]   final return {result['curve'][-1][1]:.1f}, {result['wall_s']:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    return out


def summary(curves: dict[str, list[dict]], points: list[int]) -> list[str]:
    """A markdown table: per variant, mean (min-max) over seeds of the return at ``points`` frames."""
    lines = ["| variant | " + " | ".join(f"{p} frames" for p in points) + " | wall s (mean) |"]
    lines.append("|---|" + "---:|" * (len(points) + 1))
    for name, runs in curves.items():
        cells = []
        for p in points:
            values = [_at(r["curve"], p) for r in runs]
            values = [v for v in values if not math.isnan(v)]
            mean = sum(values) / len(values) if values else math.nan
            cells.append(f"{mean:.1f} ({min(values):.0f}-{max(values):.0f})" if values else "-")
        wall = sum(r["wall_s"] for r in runs) / len(runs)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {wall:.0f} |")
    return lines


def _at(curve: list[list[float]], frames: int) -> float:
    """The return of the last batch at or before ``frames``."""
    before = [ret for f, ret in curve if f <= frames]
    return before[-1] if before else float("nan")


def plot(curves: dict[str, list[dict]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for (name, runs), color in zip(curves.items(), ("tab:blue", "tab:orange")):
        frames = [f for f, _ in runs[0]["curve"]]
        per_seed = [[ret for _, ret in r["curve"]] for r in runs]
        rows = list(zip(*per_seed))
        ok = lambda row: [x for x in row if not math.isnan(x)]
        mean = [sum(ok(r)) / len(ok(r)) if ok(r) else math.nan for r in rows]
        lo = [min(ok(r)) if ok(r) else math.nan for r in rows]
        hi = [max(ok(r)) if ok(r) else math.nan for r in rows]
        ax.plot(frames, mean, color=color, label=f"{name} (mean of {len(runs)} seeds)")
        ax.fill_between(frames, lo, hi, color=color, alpha=0.2, linewidth=0)
    ax.axhline(22, color="grey", linestyle=":", label="random policy (~22)")
    ax.set_xlabel("environment frames")
    ax.set_ylabel("return (last 20 episodes)")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.cartpole_curves")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--frames", type=int, default=32768)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    info = machine_info(torch.device("cpu"))
    curves = run(args.seeds, args.frames)
    command = "python -m examples.cartpole_curves " + " ".join(argv if argv is not None else sys.argv[1:])
    stem = f"cartpole-{dt.date.today().isoformat()}-{info['host']}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(
        json.dumps({"command": command.strip(), "machine": info, "curves": curves}) + "\n"
    )
    title = f"CartPole-v1, {len(args.seeds)} seeds, {info['cpu']} ({info['date_utc']})"
    plot(curves, args.out / f"{stem}.png", title)
    points = [p for p in (4096, 8192, 16384, 24576, 32768, 65536) if p <= args.frames]
    md = [
        f"# CartPole-v1: esper's gae + ppo_loss vs TorchRL's GAE + ClipPPOLoss ({info['date_utc']} UTC)",
        "",
        f"Command: `{command.strip()}`. The same script (`examples/cartpole_ppo.py`): TorchRL "
        "`GymEnv` x 8 in a `SerialEnv`, its `Collector`, the same MLPs, Adam, seeds and minibatches; "
        "only the advantage and the loss differ (esper's called with the arguments that reproduce "
        "`ClipPPOLoss`). Return: mean of the last 20 finished episodes, mean (min-max) over seeds. "
        "Wall time includes the environments.",
        "",
        *summary(curves, points),
        "",
        f"![curves]({stem}.png)",
        "",
        "| machine | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in info.items()),
    ]
    (args.out / f"{stem}.md").write_text("\n".join(md) + "\n")
    print(f"wrote {args.out / stem}.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
