"""Grow a small transformer language model in your own training loop: a byte-level causal LM of torch's
own layers, with a slot on its residual stream after each block, trained on the source of a few modules
of the Python standard library (text that ships with Python) and grown by a
:class:`esper.shell.user.Grower`.

    python -m examples.grow_transformer                              # the plan below, 25 epochs
    python -m examples.grow_transformer --controller grow_all        # an mlp seed in every slot
    python -m examples.grow_transformer --controller heuristic
    python -m examples.grow_transformer --static                     # and the same LM not grown
    python -m examples.grow_transformer --epochs 6 --batches 8       # a few seconds
    python -m examples.grow_transformer --export lm.pt2              # and a torch.export program

The network (:class:`ByteLM`) is the user's own ``nn.Module``: byte and position embeddings,
``nn.TransformerEncoderLayer`` blocks (pre-norm, causal mask), a ``Slot(d, family="transformer")`` after
each block (a residual stream ``[N, L, D]`` is stated ``transformer``: its seeds are causal), a final
LayerNorm and a linear head over the 256 byte values. The loop is an ordinary PyTorch loop (AdamW, a
cosine schedule, gradient clipping of the network's own parameters, random windows of the text); the
Grower joins it at two lines. The
loss is the default one, cross-entropy of the logits ``[N, L, 256]`` against the next bytes ``[N, L]``,
and the accuracy the controller reads is the share of next bytes predicted (top-1). The example prints
the validation and test loss (nats and bits per byte) before and after, each epoch's lifecycle events,
and what grew; with ``--static``, also the losses of the same LM (same initial weights, windows and loop)
trained without a Grower. ``--export`` saves the grown LM as a ``torch.export`` program
(:func:`esper.shell.user.export_program`, batch size and length free), which runs without esper.
Everything runs on the CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from esper.shell.user import Grower, Slot, export_program

#: The standard-library modules whose source is the text (present in every Python this project runs on).
STDLIB_FILES = ("textwrap.py", "heapq.py", "string.py", "fnmatch.py", "shlex.py", "bisect.py", "difflib.py")
#: The default plan: self-attention after the first block, an MLP after the second.
PLAN = "grow:grow1=attention+grow2=mlp"


class ByteLM(nn.Module):
    """A byte-level causal LM of torch's own layers with a seed slot after each block (``grow1``,
    ``grow2``, ...). Input ``[N, L]`` int64 bytes, ``L <= ctx``; logits ``[N, L, 256]``."""

    def __init__(self, d: int = 32, n_layers: int = 2, n_heads: int = 4, ctx: int = 64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(256, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d, n_heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(n_layers)
        )
        self.grows = nn.ModuleList(
            Slot(d, name=f"grow{i + 1}", family="transformer") for i in range(n_layers)
        )
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        length = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(length, device=idx.device))
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=idx.device)
        for block, grow in zip(self.blocks, self.grows, strict=True):
            h = grow(block(h, src_mask=mask, is_causal=True))
        return self.head(self.ln(h))


def stdlib_text(files: tuple[str, ...] = STDLIB_FILES) -> bytes:
    """The source of ``files`` in this Python's standard library, joined by a newline."""
    root = Path(sysconfig.get_paths()["stdlib"])
    missing = [f for f in files if not (root / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{', '.join(missing)} not found in this Python's standard library {root}")
    return b"\n".join((root / f).read_bytes() for f in files)


def windows(tokens: torch.Tensor, ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Consecutive non-overlapping windows of ``tokens``: inputs ``[W, ctx]`` and next bytes ``[W, ctx]``."""
    n = (len(tokens) - 1) // ctx
    x = tokens[: n * ctx].reshape(n, ctx)
    y = tokens[1 : n * ctx + 1].reshape(n, ctx)
    return x, y


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--controller", default=PLAN, help=f"a plan or baseline (default {PLAN}; grow_all, heuristic)"
    )
    p.add_argument("--epochs", type=int, default=25, help="epochs (the controller's episode)")
    p.add_argument("--batches", type=int, default=64, help="training batches per epoch (random windows)")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--ctx", type=int, default=64, help="window length (bytes)")
    p.add_argument("--d", type=int, default=32, help="model width")
    p.add_argument("--layers", type=int, default=2, help="blocks (a slot after each)")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW's learning rate (cosine to 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the network, the windows and the seeds")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a setting on top of the defaults, e.g. lifecycle.g5_min_contribution=0 (repeat for more)",
    )
    p.add_argument("--static", action="store_true", help="also train the same LM without a Grower")
    p.add_argument("--export", type=Path, help="also save the grown LM as a torch.export program here")
    p.add_argument("--out", type=Path, help="write the results as JSON")
    return p.parse_args(argv)


def overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--set takes FIELD=VALUE, got {pair!r}")
        out[key] = json.loads(value)
    return out


@torch.no_grad()
def mean_loss(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Mean cross-entropy per byte (nats) of ``model`` in eval mode."""
    model.eval()
    total = sum(
        F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum").item() for x, y in batches
    )
    return total / sum(y.numel() for _, y in batches)


def train(model: nn.Module, tokens: torch.Tensor, args: argparse.Namespace, grower: dict | None):
    """The user's loop: AdamW, a cosine schedule, gradient clipping, ``args.batches`` batches of random
    windows of ``tokens`` per epoch; with ``grower``, a Grower joins it (returned)."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    g = Grower(model, opt, epochs=args.epochs, seed=args.seed, **grower) if grower is not None else None
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)
    if g is not None:
        print(f"growing ByteLM ({args.layers} blocks, d {args.d}, slots {', '.join(g.host.slot_names)}) in "
              f"your loop with {g.controller_name}")  # fmt: skip
    # clip the network's own parameters: an incubating seed's what-if gradients would change the norm
    clipped = g.host_parameters() if g is not None else list(model.parameters())
    gen = torch.Generator().manual_seed(args.seed)
    for epoch in range(1, args.epochs + 1):
        model.train()
        for _ in range(args.batches):
            start = torch.randint(len(tokens) - args.ctx - 1, (args.batch_size, 1), generator=gen)
            at = start + torch.arange(args.ctx + 1)
            x, y = tokens[at[:, :-1]], tokens[at[:, 1:]]
            opt.zero_grad(set_to_none=True)
            out = model(x)
            loss = F.cross_entropy(out.flatten(0, 1), y.flatten())
            loss.backward()
            if g is not None:
                g.after_backward(x, y, loss=loss, output=out)  # incubating seeds learn here
            nn.utils.clip_grad_norm_(clipped, 1.0)
            opt.step()
        sched.step()
        if g is not None:
            r = g.on_epoch_end()  # validate, the controller acts, seeds are built / blended / removed
            happened = ", ".join(f"{e['slot']} {e['kind']} {e['blueprint']}" for e in r["events"])
            print(f"  epoch {epoch:2d}  val loss {r['val_loss']:.3f}  next byte {r['val_acc']:5.1f} %  "
                  f"{happened}".rstrip())  # fmt: skip
    return g


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    t0 = time.perf_counter()
    text = stdlib_text()
    tokens = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    cut = int(len(tokens) * 0.9)
    mid = cut + (len(tokens) - cut) // 2
    val, test = (list(zip(*(t.split(args.batch_size) for t in windows(part, args.ctx)), strict=True))
                 for part in (tokens[cut:mid], tokens[mid:]))  # fmt: skip
    print(f"your text: {len(text):,} bytes of {len(STDLIB_FILES)} standard-library modules "
          f"({', '.join(STDLIB_FILES)}); {cut:,} to train on, {len(val)} + {len(test)} batches "
          "held out")  # fmt: skip
    torch.manual_seed(args.seed)
    model = ByteLM(args.d, args.layers, ctx=args.ctx)
    count = lambda m: sum(p.numel() for p in m.parameters())
    host_params = count(model)
    losses = lambda m: {"val": mean_loss(m, val), "test": mean_loss(m, test)}
    rows = {"before": losses(model)}
    g = train(model, tokens[:cut], args, {"val": val, "controller": args.controller,
                                           "overrides": overrides(args.set)})  # fmt: skip
    rows["grown"] = losses(model)
    if args.static:
        torch.manual_seed(args.seed)  # the same LM, windows and loop, no Grower
        static = ByteLM(args.d, args.layers, ctx=args.ctx)
        train(static, tokens[:cut], args, None)
        rows["static"] = losses(static)
    grown_params = count(model) - host_params
    seconds = time.perf_counter() - t0
    bits = lambda nats: nats / math.log(2)
    print(f"\n{'':8}{'val loss':>10}{'test loss':>11}   (nats per byte; bits per byte)")
    for name, r in rows.items():
        print(f"{name:8}{r['val']:>10.3f}{r['test']:>11.3f}   ({bits(r['val']):.2f}, {bits(r['test']):.2f})")
    grown = "+".join(f"{s}={b}" for s, b in g.grown.items()) or "nothing"
    print(f"grown: {grown}; {host_params:,} + {grown_params:,} parameters; {args.epochs} epochs "
          f"x {1 + args.static} LMs in {seconds:.0f} s")  # fmt: skip
    report = {"controller": g.controller_name, "epochs": args.epochs, "loss_before": rows["before"],
              "loss_after": rows["grown"], "loss_static": rows.get("static"), "grown": g.grown,
              "host_params": host_params, "params_grown": grown_params, "events": g.events,
              "seconds": seconds}  # fmt: skip
    if args.export:
        dim = torch.export.Dim.AUTO  # batch size and length free
        export_program(model, val[0][0], args.export, dynamic_shapes=({0: dim, 1: dim},))
        print(f"exported: {args.export} (torch.export.load(path).module() runs it with torch alone)")
        report["exported"] = str(args.export)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError) as e:  # a request the example cannot serve: one line, status 2
        print(f"grow_transformer: error: {e}", file=sys.stderr)
        sys.exit(2)
