"""A quick screen for suite task designs (issue 45): each 1-D blueprint grown in every slot of a
three-block pointwise host from the start (alpha 1, fossilized, no lifecycle, no controller), trained
with the host by SGD for E epochs; test accuracy per blueprint, mean over training seeds. It screens
designs only: a task enters the suite after its headroom is measured on its preset with the lifecycle
(docs/suite.md).

usage: python -m bench.suite.blueprints_everywhere VARIANT [epochs] [seeds] [first_seed] [blueprints]
VARIANT: lr_small:N (``longrange`` with N training signals), m1d_small:N (MNIST-1D with N), lr_spike:N
(``longrange`` with width-1 pulses of height 4 and N training signals), retrieval:N (:func:`load_retrieval`
with N); ``@S`` after it draws the data from seed S (default 11), e.g. lr_spike:4000@12. blueprints: a
comma-separated subset to screen (``static`` among them; default: static and every blueprint)."""
import sys
import time

import torch
import torch.nn.functional as F

from esper.core.spec import Stage, Style
from esper.shell.data.datasets import load_longrange, load_mnist1d, load_retrieval
from esper.shell.host.blueprints import BLUEPRINTS
from esper.shell.host.hosts import CNN1dHost


def variant(name: str):
    """``((train, val, test), n_classes, pools)`` of a VARIANT (see the module's docstring)."""
    kind, _, rest = name.partition(":")
    n, _, data_seed = rest.partition("@")
    if not n.isdigit() or not (data_seed or "11").isdigit():
        raise SystemExit(f"{name}: give the training signals as KIND:N[@S], e.g. lr_spike:4000@12")
    splits, seed = (int(n), 1000, 2000), int(data_seed or 11)
    if kind == "lr_small":  # longrange with a small training split
        return load_longrange(splits=splits, seed=seed), 2, (4, 1, 1)
    if kind == "m1d_small":
        return load_mnist1d(splits=splits, seed=seed), 10, (2, 2, 1)
    if kind == "lr_spike":  # width-1 pulses: nothing local to denoise
        return load_longrange(splits=splits, seed=seed, width=1, amplitude=4.0), 2, (4, 1, 1)
    if kind == "retrieval":
        return load_retrieval(splits, seed), 2, (4, 1, 1)
    raise SystemExit(f"unknown variant {name}")


def screened(names: str | None) -> tuple[str, ...]:
    """The blueprints to screen: ``names`` comma-separated (``static``: no seed), or None for static and
    every 1-D blueprint."""
    every = ("static", *BLUEPRINTS["cnn1d"][1:])
    chosen = tuple(names.split(",")) if names else every
    if unknown := set(chosen) - set(every):
        raise SystemExit(f"unknown blueprints {sorted(unknown)}; choose from {', '.join(every)}")
    return chosen


def run(data, bp: str, seed: int, epochs: int) -> tuple[float, float, int]:
    """Test and train accuracy (%) and parameters added of one host with ``bp`` in every slot (``static``:
    none), trained on ``data`` (:func:`variant`'s) with one SGD optimizer over host and seeds alike (lr
    0.01, momentum 0.9, weight decay 5e-4; the env's step decays only the host's weights)."""
    ((tx, ty), _, (sx, sy)), n_classes, pools = data
    torch.manual_seed(seed)
    host = CNN1dHost(tx.shape[1], tx.shape[-1], (8, 8, 8), n_classes, (1, 1, 1), pools)
    if bp != "static":
        b = BLUEPRINTS["cnn1d"].index(bp)
        for i in range(host.n_slots):
            host.germinate(i, b, Style.LINEAR_ADD)
            host.set_slot(i, alpha=1.0, stage=Stage.FOSSILIZED)
    n_add = sum(p.numel() for p in host.parameters()) - sum(p.numel() for p in host.host_parameters())
    opt = torch.optim.SGD(host.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        host.train()
        perm = torch.randperm(len(tx), generator=g)
        for i in range(0, len(tx), 64):
            idx = perm[i:i + 64]
            loss = F.cross_entropy(host(tx[idx]), ty[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    host.eval()
    with torch.no_grad():
        acc = (host(sx).argmax(-1) == sy).float().mean().item() * 100
        tr = (host(tx).argmax(-1) == ty).float().mean().item() * 100
    return acc, tr, n_add


if __name__ == "__main__":
    torch.set_num_threads(1)
    name = sys.argv[1]
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    seeds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    first = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    chosen = screened(sys.argv[5] if len(sys.argv) > 5 else None)
    t0 = time.time()
    data = variant(name)  # drawn once: every blueprint and seed trains on the same signals
    for bp in chosen:
        rs = [run(data, bp, s, epochs) for s in range(first, first + seeds)]
        te = sum(r[0] for r in rs) / seeds
        tr = sum(r[1] for r in rs) / seeds
        print(f"{name:14s} {bp:15s} test {te:5.1f} train {tr:5.1f} params {rs[0][2]:4d}  "
              f"per-seed {[round(r[0], 1) for r in rs]}", flush=True)
    print(f"{time.time() - t0:.0f} s")
