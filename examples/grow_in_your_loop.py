"""Grow your model in your own training loop: AdamW, a cosine schedule and a DataLoader, grown by a
:class:`esper.shell.user.Grower`, saved, and reloaded without Esper's environment.

    python -m examples.grow_in_your_loop                      # the heuristic grows it
    python -m examples.grow_in_your_loop --run runs/RUN       # a run's trained controller
    python -m examples.grow_in_your_loop --train 256 --epochs 6   # a few seconds

The network and the data are ``examples/grow_your_model.py``'s: :class:`SignalNet` (pointwise blocks, a
slot after each) on noisy two-bump signals whose class is the bumps' signs in order, which a pointwise
network cannot read. The loop is an ordinary PyTorch loop; the Grower joins it at two lines
(``g.after_backward`` after the backward, ``g.on_epoch_end`` after each epoch), adds the seeds'
parameters to the AdamW optimizer as they are germinated and removes them when pruned. The same network,
initialized and fed the same way, is also trained without a Grower (static), for comparison. At the end
the grown network is saved (``torch.save(model.state_dict())``), loaded into a fresh ``SignalNet()``,
and tested again: the same accuracy. Everything runs on the CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from esper.shell.user import Grower
from examples.grow_your_model import CLASSES, SignalNet, make_signals


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", metavar="RUN_DIR", help="grow with this run's trained controller")
    p.add_argument(
        "--readout",
        default="ppo",
        choices=("ppo", "ppo_greedy"),
        help="with --run: sample the policy (seeded), or take its most likely actions",
    )
    p.add_argument(
        "--controller",
        default="heuristic",
        help="without --run: a baseline or plan (heuristic, grow_all, grow:grow1=conv_light, ...)",
    )
    p.add_argument("--epochs", type=int, help="epochs (default: the controller's episode, 25 without --run)")
    p.add_argument("--train", type=int, default=2000, help="training signals (val: a quarter, test: a half)")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01, help="AdamW's learning rate (cosine to 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the network, the data and the seeds")
    p.add_argument("--save", type=Path, help="the grown network's state dict (default: in a temp dir)")
    p.add_argument("--out", type=Path, help="write the results as JSON")
    return p.parse_args(argv)


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    return float((model(x).argmax(-1) == y).float().mean() * 100)


def train(model: nn.Module, train_data: TensorDataset, epochs: int | None, args: argparse.Namespace,
          grower_args: dict | None) -> Grower | None:  # fmt: skip
    """The user's loop: AdamW, a cosine schedule, a shuffled DataLoader; with ``grower_args``, a Grower
    joins it."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    loader = DataLoader(train_data, batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(args.seed))  # fmt: skip
    g = Grower(model, opt, epochs=epochs, seed=args.seed, **grower_args) if grower_args is not None else None
    epochs = g.epochs if g is not None else epochs
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    for epoch in range(1, epochs + 1):
        model.train()
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            out = model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            if g is not None:
                g.after_backward(x, y, loss=loss, output=out)  # incubating seeds learn here
            opt.step()
        sched.step()
        if g is not None:
            r = g.on_epoch_end()  # validate, the controller acts, seeds are built / blended / removed
            happened = ", ".join(f"{e['slot']} {e['kind']} {e['blueprint']}" for e in r["events"])
            print(f"  epoch {epoch:2d}  val {r['val_acc']:5.1f} %  {happened}")
    return g


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    n_val, n_test = max(args.train // 4, 1), max(args.train // 2, 1)
    (tx, ty), val, test = [make_signals(n, seed=args.seed * 3 + k)
                           for k, n in enumerate((args.train, n_val, n_test))]  # fmt: skip
    controller = Path(args.run) if args.run else args.controller
    who = f"the controller of {args.run} ({args.readout})" if args.run else f"the {args.controller}"
    print(f"your data: {args.train} training, {n_val} validation, {n_test} test signals, "
          f"{len(CLASSES)} classes")  # fmt: skip
    print(f"growing SignalNet in your loop (AdamW, cosine, DataLoader) with {who}")
    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    model = SignalNet()
    grower = {"val": DataLoader(TensorDataset(*val), batch_size=256), "controller": controller,
              "readout": args.readout}  # fmt: skip
    g = train(model, TensorDataset(tx, ty), args.epochs, args, grower)
    grown_acc = accuracy(model, *test)
    save = args.save or Path(tempfile.mkdtemp()) / "grown.pt"
    torch.save(model.state_dict(), save)
    # a fresh network of the user's class, without Esper's environment: the slots rebuild their seeds
    reloaded = SignalNet()
    reloaded.load_state_dict(torch.load(save, weights_only=True))
    reloaded_acc = accuracy(reloaded, *test)
    torch.manual_seed(args.seed)  # the same network, data and loop, no Grower
    static = SignalNet()
    train(static, TensorDataset(tx, ty), g.epochs, args, None)
    static_acc = accuracy(static, *test)
    seconds = time.perf_counter() - t0
    count = lambda m: sum(p.numel() for p in m.parameters())
    print(f"\n{'':10}{'test accuracy':>15}   parameters")
    print(f"{'static':10}{static_acc:>13.1f} %   {count(static):,}")
    print(f"{'grown':10}{grown_acc:>13.1f} %   {count(static):,} + {count(model) - count(static):,} grown "
          f"({'+'.join(f'{s}={b}' for s, b in g.grown.items()) or 'nothing'})")  # fmt: skip
    print(f"{'reloaded':10}{reloaded_acc:>13.1f} %   from {save}")
    print(f"{g.epochs} epochs x 2 networks in {seconds:.0f} s")
    report = {"controller": str(controller), "epochs": g.epochs, "static_test_acc": static_acc,
              "grown_test_acc": grown_acc, "reloaded_test_acc": reloaded_acc, "grown": g.grown,
              "params_grown": count(model) - count(static), "events": g.events, "saved": str(save),
              "seconds": seconds}  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError) as e:  # a request the example cannot serve: one line, status 2
        print(f"grow_in_your_loop: error: {e}", file=sys.stderr)
        sys.exit(2)
