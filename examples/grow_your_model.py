"""Grow your own model: a small 1-D CNN written here, with three seed slots, grown on data generated here.

    python -m examples.grow_your_model                     # the heuristic grows it
    python -m examples.grow_your_model --run runs/RUN      # a run's trained controller, zero-shot
    python -m examples.grow_your_model --episodes 2 --epochs 4 --train 256   # a few seconds

Everything runs on the CPU. The network (:class:`SignalNet`) is the user's: three pointwise blocks with an
``esper.shell.user.Slot`` after each, where it may grow. The data (:func:`make_signals`) are noisy
signals with two bumps; the class is the bumps' signs in order (up-down, down-up, up-up, down-down). A
pointwise network sees one position at a time and averages them at the end, so it tells up-up from
down-down but not up-down from down-up: what it lacks, spatial context, is what the ``cnn1d`` seeds add.

The static network and the grown one train on the same fresh hosts (same initial weights, same data
order); the script prints their test accuracy and parameters. With ``--run`` the controller is the one a
run of ``python -m esper.shell.run`` trained (``checkpoint.pt``), acting on a network it never saw: it
must have as many slots as the run's host and the same family (three ``cnn1d`` slots fit a run on the
default MNIST-1D task; docs/grow-your-model.md has the limits). ``--out`` writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from esper.shell.eval.stats import mean_ci95
from esper.shell.user import Slot, grow, user_task

CLASSES = ("up-down", "down-up", "up-up", "down-down")
#: The bumps' signs per class, first then second.
SIGNS = torch.tensor([[1.0, -1.0], [-1.0, 1.0], [1.0, 1.0], [-1.0, -1.0]])


# ------------------------------------------------------------------------------------ the user's network
class SignalNet(nn.Module):
    """Three blocks of pointwise conv → batch norm → ReLU → max-pool (2, 2, none), a slot after each,
    global average pool, linear classifier. Input ``[N, 1, length]``, logits ``[N, n_classes]``."""

    def __init__(self, width: int = 8, n_classes: int = len(CLASSES)):
        super().__init__()

        def block(c_in: int, pool: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv1d(c_in, width, 1, bias=False), nn.BatchNorm1d(width), nn.ReLU(),
                nn.MaxPool1d(pool) if pool > 1 else nn.Identity(),
            )  # fmt: skip

        self.block1, self.block2, self.block3 = block(1, 2), block(width, 2), block(width, 1)
        # where it may grow: a slot takes the channels of the activation it receives
        self.grow1, self.grow2, self.grow3 = Slot(width), Slot(width), Slot(width)
        self.head = nn.Linear(width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.grow1(self.block1(x))
        x = self.grow2(self.block2(x))
        x = self.grow3(self.block3(x))
        return self.head(x.mean(dim=-1))


# --------------------------------------------------------------------------------------- the user's data
def make_signals(n: int, *, length: int = 32, noise: float = 0.25, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """``n`` signals ``[n, 1, length]`` and their classes ``[n]``: two Gaussian bumps (width 1, height
    0.8-1.2) 2 or 3 positions apart at a random place, signed by the class, plus Gaussian noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(len(CLASSES), (n,), generator=g)
    gap = torch.randint(2, 4, (n, 1), generator=g).float()
    first = 2 + torch.rand(n, 1, generator=g) * (length - 5 - gap)
    height = 0.8 + 0.4 * torch.rand(n, 2, generator=g)
    t = torch.arange(length).float()
    bump = lambda centre: torch.exp(-0.5 * (t - centre) ** 2)  # [n, length]
    signs = SIGNS[y] * height
    x = signs[:, :1] * bump(first) + signs[:, 1:] * bump(first + gap)
    x = x + noise * torch.randn(n, length, generator=g)
    return x.unsqueeze(1), y


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", metavar="RUN_DIR", help="grow with this run's trained controller (zero-shot)")
    p.add_argument(
        "--readout",
        default="ppo",
        choices=("ppo", "ppo_greedy"),
        help="with --run: sample the policy (seeded, as in training), or its most likely actions",
    )
    p.add_argument(
        "--controller",
        default="heuristic",
        help="without --run: a baseline (heuristic, grow_all, random, grow:grow3=conv_heavy, ...)",
    )
    p.add_argument("--episodes", type=int, default=4, help="fresh hosts, each grown once (default 4)")
    p.add_argument(
        "--epochs",
        type=int,
        help="host epochs per episode (default: the run's; without --run, the default preset's)",
    )
    p.add_argument("--train", type=int, default=2000, help="training signals (val: a quarter, test: a half)")
    p.add_argument("--batches", type=int, help="training batches per epoch (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the hosts and the data")
    p.add_argument("--out", type=Path, help="write the results as JSON")
    return p.parse_args(argv)


def summary(records: list[dict]) -> dict:
    acc = [r["final_test_acc"] for r in records]
    mean, (lo, hi) = mean_ci95(acc)
    grown = Counter(r["grown"] or "nothing" for r in records)
    return {
        "test_acc_mean": mean, "test_acc_ci95": [lo, hi], "test_acc": acc,
        "host_params": records[0]["host_params"],
        "params_added_mean": sum(r["params_added"] for r in records) / len(records),
        "grown": dict(grown.most_common()),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    n_val, n_test = max(args.train // 4, 1), max(args.train // 2, 1)
    splits = [make_signals(n, seed=args.seed * 3 + k) for k, n in enumerate((args.train, n_val, n_test))]
    task = user_task(SignalNet, train=splits[0], val=splits[1], test=splits[2], max_batches=args.batches,
                     name="signals")  # fmt: skip
    host = task.make_host()
    params = sum(p.numel() for p in host.host_parameters())
    print(f"your model: SignalNet, {host.n_slots} slots ({', '.join(host.slot_names)}), family "
          f"{task.family}, {params:,} parameters")  # fmt: skip
    print(f"your data: {args.train} training, {n_val} validation, {n_test} test signals, "
          f"{task.n_classes} classes ({', '.join(CLASSES)})")  # fmt: skip
    grower = args.readout if args.run else args.controller
    who = f"the controller of {args.run} ({grower}, zero-shot)" if args.run else f"the {grower}"
    print(f"growing {args.episodes} fresh hosts with {who}; the static model on the same hosts")
    t0 = time.perf_counter()
    results = grow(task, ("static", grower), run_dir=args.run, episodes=args.episodes, epochs=args.epochs,
                   seed=args.seed)  # fmt: skip
    seconds = time.perf_counter() - t0
    epochs = len(results["static"][0]["val_acc_curve"])
    out = {name: summary(records) for name, records in results.items()}
    print(f"\n{'':12}{'test accuracy (95% CI)':>28}   parameters")
    for name, s in out.items():
        lo, hi = s["test_acc_ci95"]
        added = s["params_added_mean"]
        params = f"{s['host_params']:,}" + (f" + {added:,.0f} grown" if added else "")
        print(f"{name:12}{s['test_acc_mean']:>12.1f} % [{lo:5.1f}, {hi:5.1f}]   {params}")
    grown = ", ".join(f"{k} ({n})" for k, n in out[grower]["grown"].items())
    print(f"grown ({grower}, hosts): {grown}")
    print(f"{args.episodes} hosts x {epochs} epochs x 2 controllers in {seconds:.0f} s")
    report = {"controller": grower, "run": args.run, "episodes": args.episodes, "epochs": epochs,
              "seconds": seconds, "results": out}  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError) as e:  # a request the example cannot serve: one line, status 2
        print(f"grow_your_model: error: {e}", file=sys.stderr)
        sys.exit(2)
