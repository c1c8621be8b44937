"""A screen for a suite task design (issue 45): in-context recall on the transformer host, where only an
attention seed can help and the largest blueprint (``mlp``) cannot.

Each sequence repeats a prefix of ``k`` distinct tokens (``k`` drawn per sequence) to its full length,
so after the first ``k`` positions every next token is the one that followed the current token's
earlier occurrence. That lookup takes two attention steps (the previous token written into each
position, then a match of the current token against it: an induction head), and a one-layer host has
one. A seed that mixes positions (``attention``) can supply the second; the per-position blueprints
(``norm``, ``lora``, ``lora_large``, ``mlp_small``, ``mlp``) cannot, whatever their size.

One blueprint in the host's one slot from the start (alpha 1, no lifecycle, no controller), trained
with the host by the env's SGD (lr 0.05, momentum 0.9) for STEPS batches of 64; next-token test
accuracy over every position of 1,024 held-out sequences. ``--stage`` sets the seed's stage:
``FOSSILIZED`` trains through the seed into the host below it; ``BLENDING`` detaches the seed's input,
as the lifecycle does until a seed is fossilized. ``--place embed`` puts the slot between the embedding
and layer 0 (the host has no such slot; the screen builds one), so the host's layer can learn to use
the seed's output. ``--tokenwise`` screens the ``recall`` task's host instead: a block without
attention and the previous token's embedding in each input, so one attention step recalls by itself and
nothing below the seed has to adapt. It screens designs only.

    python -m bench.suite.induction_screen 1500 --blueprints static,attention,mlp --stage BLENDING
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from esper.core.spec import Stage, Style
from esper.shell.data.datasets import load_recall
from esper.shell.host.blueprints import BLUEPRINTS
from esper.shell.host.hosts import TransformerHost

#: Vocabulary, sequence length and the range of the repeated prefix's length.
VOCAB, LENGTH, K_RANGE = 32, 48, (6, 16)


def recall_data(
    n: int, seed: int, vocab: int = VOCAB, length: int = LENGTH, k_range: tuple[int, int] = K_RANGE
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``, int64 ``[n, length]`` each: :func:`~esper.shell.data.datasets.load_recall`'s sequences
    (``k`` distinct tokens repeated, ``k`` uniform in ``k_range``) and their next tokens."""
    return load_recall(splits=(n, 1, 1), seed=seed, vocab=vocab, length=length, k_range=k_range)[0]


class EmbedSlotHost(TransformerHost):
    """The one-slot transformer host with its slot between the embedding and layer 0."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        x = self.slots[0](x)
        for layer in self.layers:
            x = layer(x)
        return F.linear(self.ln_f(x), self.tok.weight)


def run(
    bp: str, seed: int, steps: int, place: str = "after", stage: Stage = Stage.FOSSILIZED,
    tokenwise: bool = False,
) -> tuple[float, int]:
    """Next-token test accuracy (%) and parameters added of a one-layer host (d_model 32, 2 heads) with
    ``bp`` in its slot (``static``: none), trained ``steps`` batches. ``tokenwise``: the host's block has
    no attention and its input adds the previous token's embedding, so one attention step recalls."""
    torch.manual_seed(seed)
    cls = EmbedSlotHost if place == "embed" else TransformerHost
    host = cls(vocab=VOCAB, d_model=32, n_layers=1, n_heads=2, ctx=LENGTH, slot_every=1,
               attention=not tokenwise, prev_token=tokenwise)  # fmt: skip
    if bp != "static":
        host.germinate(0, BLUEPRINTS["transformer"].index(bp), Style.LINEAR_ADD)
        host.set_slot(0, alpha=1.0, stage=stage)
    added = sum(p.numel() for p in host.parameters()) - sum(p.numel() for p in host.host_parameters())
    opt = torch.optim.SGD(host.parameters(), lr=0.05, momentum=0.9)
    (tx, ty), (sx, sy) = recall_data(4096, 100 + seed), recall_data(1024, 999)
    g = torch.Generator().manual_seed(seed)
    host.train()
    for _ in range(steps):
        i = torch.randint(0, len(tx), (64,), generator=g)
        loss = F.cross_entropy(host(tx[i]).reshape(-1, VOCAB), ty[i].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    host.eval()
    with torch.no_grad():
        return (host(sx).argmax(-1) == sy).float().mean().item() * 100, added


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.suite.induction_screen", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("steps", type=int)
    every = ("static", *BLUEPRINTS["transformer"][1:])
    p.add_argument(
        "--blueprints", default="static,attention,mlp", help=f"comma-separated, of {', '.join(every)}"
    )
    p.add_argument(
        "--place", choices=("after", "embed"), default="after", help="the slot after layer 0, or before it"
    )
    p.add_argument("--stage", choices=("FOSSILIZED", "BLENDING"), default="FOSSILIZED")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument(
        "--tokenwise", action="store_true", help="a host whose positions do not mix, given the previous token"
    )
    args = p.parse_args(argv)
    chosen = args.blueprints.split(",")
    if unknown := set(chosen) - set(every):
        p.error(f"unknown blueprints {sorted(unknown)}; choose from {', '.join(every)}")
    torch.set_num_threads(1)
    for bp in chosen:
        t0 = time.time()
        stage = Stage[args.stage]
        rs = [run(bp, s, args.steps, args.place, stage, args.tokenwise) for s in range(args.seeds)]
        mean, per_seed = sum(r[0] for r in rs) / len(rs), [round(r[0], 1) for r in rs]
        host = ", tokenwise" if args.tokenwise else ""
        where = f"{args.place}, {args.stage}, {args.steps} steps{host}; {time.time() - t0:.0f} s"
        print(f"{bp:11s} test {mean:5.1f} per seed {per_seed} params {rs[0][1]:5d} ({where})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
