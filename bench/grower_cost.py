"""The Grower's cost (issue 104): the user's loop with a :class:`esper.shell.user.Grower` against the same
loop without it, and the Grower loop's time split into the seeds' own work, the validation the user runs
anyway, and everything else (the overhead).

    python -m bench.grower_cost                       # 5 interleaved rounds, 25 epochs, writes the results
    python -m bench.grower_cost --rounds 1 --epochs 4 --no-write          # a few seconds
    python -m bench.grower_cost --profile             # where "everything else" goes (cProfile, top 25)

The network and data are ``examples/grow_your_model.py``'s (:class:`SignalNet`, generated two-bump
signals; nothing downloaded). Both loops start from the same weights and see the same batches for the
same epochs; the static loop validates every epoch (what a user runs anyway), the Grower loop reads
that validation from ``g.on_epoch_end()``. The controller is a fixed plan growing two seeds
(:data:`PLAN`).

The split of the Grower loop (seconds, and shares of the static loop's time):

- **seeds' work**: the what-if passes of incubating seeds in ``after_backward`` (forward and backward,
  ``Grower._whatif`` less its random stream and batch-norm guards), the validation passes per live
  seed in ``on_epoch_end`` (counterfactuals and what-if readings, ``EnvModel._pass``), and what blended
  seeds add to the user's own training step and to the validation pass (the Grower loop's minus the
  static loop's, same rounds);
- **validation**: the static loop's validation (what the user runs anyway; the Grower's plain pass
  stands in for it, its excess over it counted as blended seeds above);
- **everything else**: ``after_backward`` and ``on_epoch_end`` less the above: bookkeeping, gradient
  statistics, the what-if pass's random stream and guards, the controller, the lifecycle step,
  optimizer groups, state copies.

Timings are ``time.perf_counter`` around those calls (the bench wraps the methods on the instances;
the library is not changed for it). FLOPs (``torch.utils.flop_counter.FlopCounterMode``) are counted in
one extra, untimed run, once per architecture (which seeds sit where, at which stage) and batch shape,
and multiplied by the calls. Rounds are interleaved (static block, Grower block); shares are medians of
per-round ratios.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

RESULTS = Path(__file__).resolve().parent / "results" / "perf"
#: The fixed plan: two seeds.
PLAN = {"grow1": "conv_light", "grow2": "conv_small"}
#: The split's parts, in the order the files list them.
PARTS = ("seeds", "validation", "other")


# ------------------------------------------------------------------------------------ pure arithmetic
def split(static: dict[str, float], grower: dict[str, float]) -> dict[str, float]:
    """One round's split in seconds from the two loops' timers (see the module docstring).

    ``static``: ``total``, ``train`` (forward, backward, step), ``validation``. ``grower``: ``total``,
    ``train``, ``after_backward``, ``whatif`` (of which ``whatif_setup``, optional: the pass's random
    stream and batch-norm guards, overhead), ``on_epoch_end``, ``val_plain`` (the host's validation
    pass, blended seeds in it), ``val_seed``. Returns ``seeds`` (what-if passes, per-seed validation
    passes, and what blended seeds add to the user's step and to the validation pass: the Grower loop's
    minus the static loop's), ``validation`` (the static loop's: what the user runs anyway), ``other``,
    ``static`` and ``grower`` (the totals), and ``unexplained`` (the Grower loop's extra time that
    ``seeds`` and ``other`` do not account for: the loops' own iteration, noise)."""
    setup = grower.get("whatif_setup", 0.0)
    whatif = grower["whatif"] - setup
    seeds_in_step = grower["train"] - static["train"]
    seeds_in_val = grower["val_plain"] - static["validation"]
    seeds = whatif + grower["val_seed"] + seeds_in_step + seeds_in_val
    validation = static["validation"]
    ab_other = grower["after_backward"] - whatif
    oee_other = grower["on_epoch_end"] - grower["val_plain"] - grower["val_seed"]
    other = ab_other + oee_other
    unexplained = grower["total"] - static["total"] - seeds - other
    return {"static": static["total"], "grower": grower["total"], "seeds": seeds, "seeds_whatif": whatif,
            "seeds_val": grower["val_seed"], "seeds_in_step": seeds_in_step, "seeds_in_val": seeds_in_val,
            "validation": validation, "val_plain": grower["val_plain"], "other": other,
            "after_backward_other": ab_other, "whatif_setup": setup, "on_epoch_end_other": oee_other,
            "unexplained": unexplained}  # fmt: skip


def summarize(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """Medians over rounds: seconds of each key, and each key's share of the static loop (the median of
    per-round ratios); ``ratio``: the Grower loop over the static one."""
    if not rounds:
        raise ValueError("summarize: no rounds")
    keys = list(rounds[0])
    seconds = {k: statistics.median(r[k] for r in rounds) for k in keys}
    shares = {k: statistics.median(r[k] / r["static"] for r in rounds) for k in keys}
    return {"seconds": seconds, "shares": shares, "ratio": shares["grower"], "rounds": len(rounds)}


def markdown(report: dict[str, Any]) -> str:
    """The results page."""
    info, s = report["machine"], report["summary"]
    sec, sh = s["seconds"], s["shares"]
    rows = [
        ("static loop (train + the user's validation)", "static"),
        ("Grower loop", "grower"),
        ("seeds' work", "seeds"),
        ("  what-if passes (after_backward)", "seeds_whatif"),
        ("  validation passes per seed (on_epoch_end)", "seeds_val"),
        ("  blended seeds in the user's step", "seeds_in_step"),
        ("  blended seeds in the validation pass", "seeds_in_val"),
        ("validation the user runs anyway (the static loop's)", "validation"),
        ("  the Grower's validation pass, seeds blended", "val_plain"),
        ("everything else (overhead)", "other"),
        ("  in after_backward", "after_backward_other"),
        ("    of which the what-if pass's random stream and guards", "whatif_setup"),
        ("  in on_epoch_end", "on_epoch_end_other"),
        ("unexplained (loop noise)", "unexplained"),
    ]
    lines = [
        f"# The Grower's cost: {info['date_utc']} UTC, cpu, {report['torch_threads']} torch thread",
        "",
        f"Command: `{report['command']}`. {report['config']['epochs']} epochs of "
        f"{report['config']['batches']} batches of {report['config']['batch_size']} "
        f"(SignalNet, generated signals), controller `{report['controller']}`; {s['rounds']} interleaved "
        "rounds (static block, Grower block); seconds are medians over rounds, shares are medians of "
        "per-round ratios to the static loop.",
        "",
        "| machine | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in info.items()),
        "",
        "## The split",
        "",
        "| part | seconds | share of the static loop |",
        "|---|---:|---:|",
        *(f"| {name} | {sec[k]:.3f} | {100 * sh[k]:.1f} % |" for name, k in rows),
        "",
        f"The Grower loop takes **{s['ratio']:.2f}x** the static loop; everything else (neither the seeds' "
        f"work nor the validation) is **{100 * sh['other']:.1f} %** of the static loop "
        f"(target: under 10 %: {'met' if sh['other'] < 0.10 else 'not met'}).",
        "",
        "## FLOPs (FlopCounterMode, once per architecture and batch shape)",
        "",
        "| part | GFLOP |",
        "|---|---:|",
        *(f"| {k} | {v / 1e9:.3f} |" for k, v in report["flops"].items()),
        "",
        "## Rounds (seconds)",
        "",
        "| round | static | Grower | seeds | validation | other | unexplained |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| {i} | {r['static']:.3f} | {r['grower']:.3f} | {r['seeds']:.3f} | {r['validation']:.3f} | "
          f"{r['other']:.3f} | {r['unexplained']:.3f} |" for i, r in enumerate(report["rounds"])),
    ]  # fmt: skip
    if report.get("notes"):
        lines += ["", "## Notes", "", *(f"- {n}" for n in report["notes"])]
    return "\n".join(lines) + "\n"


def write(report: dict[str, Any], out: Path, name: str) -> Path:
    """``out/name.md`` and ``out/name.json``; returns the .md path."""
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"{name}.md"
    md.write_text(markdown(report))
    (out / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    return md


# ------------------------------------------------------------------------------------------- the loops
class Timers(defaultdict):
    def __init__(self) -> None:
        super().__init__(float)

    @contextmanager
    def __call__(self, key: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self[key] += time.perf_counter() - t0

    def wrap(self, key: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            with self(key):
                return fn(*args, **kwargs)

        return timed


def make_data(n_train: int, n_val: int, batch_size: int, seed: int = 0):
    from examples.grow_your_model import make_signals

    (x, y), (xv, yv) = make_signals(n_train, seed=seed), make_signals(n_val, seed=seed + 1)
    train = [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, n_train, batch_size)]
    val = [(xv[i : i + 256], yv[i : i + 256]) for i in range(0, n_val, 256)]
    return train, val


def make_model(seed: int):
    from examples.grow_your_model import SignalNet

    torch.manual_seed(seed)
    model = SignalNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    return model, optimizer


def _order(train: list, epoch: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    return [train[i] for i in torch.randperm(len(train), generator=g).tolist()]


@torch.inference_mode()
def validate(model, val) -> dict[str, float]:
    model.eval()
    loss, correct, n = torch.zeros(()), torch.zeros((), dtype=torch.int64), 0
    for x, y in val:
        out = model(x)
        loss += F.cross_entropy(out, y, reduction="sum")
        correct += (out.argmax(-1) == y).sum()
        n += y.numel()
    return {"val_loss": float(loss) / n, "val_acc": 100.0 * float(correct) / n}


def static_loop(train, val, epochs: int, seed: int = 0) -> tuple[dict[str, float], Any]:
    model, optimizer = make_model(seed)
    t = Timers()
    t0 = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        for x, y in _order(train, epoch, seed):
            with t("train"):
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
        with t("validation"):
            validate(model, val)
    t["total"] = time.perf_counter() - t0
    return dict(t), model


def grower_loop(train, val, epochs: int, seed: int = 0, *, controller: Any = None, timed: bool = True,
                flops: dict | None = None) -> tuple[dict[str, float], Any]:  # fmt: skip
    """The user's loop with a Grower. ``timed``: wrap the Grower's parts in timers. ``flops``: count
    FLOPs instead (untimed), into this dict."""
    from esper.shell.user import Grower

    model, optimizer = make_model(seed)
    g = Grower(model, optimizer, val=val, controller=controller or dict(PLAN), epochs=epochs, seed=seed)
    t = Timers()
    if flops is not None:
        _count_flops(g, flops)
    elif timed:
        g._whatif = _timed_whatif(g, t)
        g._measurer._pass = t.wrap("val_seed", g._measurer._pass)
        for name in ("loss_and_correct", "loss_and_correct_inputs"):
            setattr(g.host, name, t.wrap("val_plain", getattr(g.host, name)))
    counting = flops is not None
    t0 = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        for x, y in _order(train, epoch, seed):
            with t("train"), _flops_once(flops, "train", g, x) if counting else nullcontext():
                optimizer.zero_grad()
                out = model(x)
                loss = F.cross_entropy(out, y)
                loss.backward()
            with t("after_backward"):
                g.after_backward(x, y, loss=loss, output=out)
            with t("train"):
                optimizer.step()
        with t("on_epoch_end"):
            g.on_epoch_end()
    t["total"] = time.perf_counter() - t0
    return dict(t), g


def _timed_whatif(g, t: Timers) -> Callable:
    """``g._whatif`` timed as ``whatif``, with the entry and exit of its random stream and batch-norm
    guard (``g._random()``, ``g.host.incubating``) timed as ``whatif_setup`` too."""
    whatif, random, incubating = g._whatif, g._random, g.host.incubating

    @contextmanager
    def timed_cm(cm):
        with t("whatif_setup"):
            cm.__enter__()
        try:
            yield
        except BaseException as e:
            with t("whatif_setup"):
                if not cm.__exit__(type(e), e, e.__traceback__):
                    raise
        else:
            with t("whatif_setup"):
                cm.__exit__(None, None, None)

    def timed(x, y, incubating_slots):
        g._random = lambda: timed_cm(random())
        g.host.incubating = lambda slots: timed_cm(incubating(slots))
        try:
            with t("whatif"):
                return whatif(x, y, incubating_slots)
        finally:
            g._random, g.host.incubating = random, incubating

    return timed


# ----------------------------------------------------------------------------------------------- FLOPs
def _arch(g) -> tuple:
    return tuple((s.blueprint, int(s.stage), s.incubating, s.contributes) for s in g.host.slots)


@contextmanager
def _flops_once(flops: dict, kind: str, g, x: torch.Tensor, cache: dict = {}):  # noqa: B006
    """Count ``kind``'s FLOPs for this architecture and batch shape the first time it is seen, and add
    the cached count to ``flops[kind]`` every time."""
    key = (id(flops), kind, _arch(g), tuple(x.shape))
    if key in cache:
        yield
        flops[kind] = flops.get(kind, 0) + cache[key]
        return
    with FlopCounterMode(display=False) as mode:
        yield
    cache[key] = mode.get_total_flops()
    flops[kind] = flops.get(kind, 0) + cache[key]


def _count_flops(g, flops: dict) -> None:
    whatif, vpass = g._whatif, g._measurer._pass

    def counted_whatif(x, y, incubating):
        with _flops_once(flops, "whatif", g, x):
            return whatif(x, y, incubating)

    def counted_pass(batch, i, inputs):
        with _flops_once(flops, f"val_seed/{i}/{g.host.slot(i).incubating}", g, batch[0]):
            return vpass(batch, i, inputs)

    g._whatif, g._measurer._pass = counted_whatif, counted_pass
    for name in ("loss_and_correct", "loss_and_correct_inputs"):
        fn = getattr(g.host, name)

        def counted(batch, fn=fn, name=name):
            with _flops_once(flops, f"val_plain/{name}", g, batch[0]):
                return fn(batch)

        setattr(g.host, name, counted)


def count_flops(train, val, epochs: int, seed: int) -> dict[str, float]:
    """FLOPs of each part over the whole loop, both loops (one untimed run each)."""
    grower: dict = {}
    grower_loop(train, val, epochs, seed, flops=grower)
    static: dict = {}
    model, _ = make_model(seed)
    with FlopCounterMode(display=False) as mode:
        x, y = train[0]
        F.cross_entropy(model(x), y).backward()
    per_batch = mode.get_total_flops()
    static["train"] = per_batch * len(train) * epochs  # one architecture, and every batch has one shape
    # (a shorter last batch counts as a full one: an upper bound within a batch)
    with FlopCounterMode(display=False) as mode:
        validate(model, val)
    static["validation"] = mode.get_total_flops() * epochs
    out = {"static/train": static["train"], "static/validation": static["validation"]}
    out.update({f"grower/{k}": v for k, v in sorted(grower.items())})
    out["grower/seeds_in_step"] = grower.get("train", 0) - static["train"]
    seeds = out["grower/seeds_in_step"] + grower.get("whatif", 0)
    seeds += sum(v for k, v in grower.items() if k.startswith("val_seed"))
    out["grower/seeds (what-if, per-seed validation, blended in the step)"] = seeds
    return out


# ------------------------------------------------------------------------------------------------ main
def profile(train, val, epochs: int, seed: int, top: int = 25) -> str:
    grower_loop(train, val, 2, seed, timed=False)  # warm-up
    prof = cProfile.Profile()
    prof.enable()
    grower_loop(train, val, epochs, seed, timed=False)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def _git() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "esper", "bench/grower_cost.py"],
                               capture_output=True, text=True).stdout.strip()  # fmt: skip
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=25)
    p.add_argument("--train", type=int, default=2048, help="training signals")
    p.add_argument("--val", type=int, default=512, help="validation signals")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--profile", action="store_true", help="print where the Grower loop's time goes and exit")
    p.add_argument("--tag", default="grower-cost", help="the results file's name after the date")
    p.add_argument("--note", action="append", default=[], help="a line for the results page's notes")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    train, val = make_data(args.train, args.val, args.batch_size, args.seed)
    if args.profile:
        print(profile(train, val, args.epochs, args.seed))
        return {}
    load_start = _load()
    static_loop(train, val, 2, args.seed), grower_loop(train, val, 2, args.seed)  # warm-up
    rounds = []
    for r in range(args.rounds):
        s, _ = static_loop(train, val, args.epochs, args.seed)
        gt, g = grower_loop(train, val, args.epochs, args.seed)
        rounds.append(split(s, gt))
        print(f"round {r}: static {s['total']:.2f} s, Grower {gt['total']:.2f} s, other "
              f"{rounds[-1]['other']:.2f} s ({100 * rounds[-1]['other'] / s['total']:.1f} %)",
              file=sys.stderr, flush=True)  # fmt: skip
    flops = count_flops(train, val, args.epochs, args.seed)
    from esper.shell.common.revision import machine_info

    now = dt.datetime.now(dt.UTC)
    info = {"date_utc": now.strftime("%Y-%m-%d %H:%M:%S"), "host": "vm", "cpu_count": os.cpu_count(),
            "torch": torch.__version__, "python": sys.version.split()[0], "git": _git(),
            "load_average_start": load_start, "load_average_end": _load()}  # fmt: skip
    try:
        info["cpu"] = machine_info(torch.device("cpu")).get("cpu", "unknown")
    except Exception:
        info["cpu"] = "unknown"
    report = {
        "command": "python -m bench.grower_cost " + " ".join(argv if argv is not None else sys.argv[1:]),
        "torch_threads": torch.get_num_threads(),
        "controller": g.controller_name,
        "events": g.events,
        "config": {
            "epochs": args.epochs,
            "batches": len(train),
            "batch_size": args.batch_size,
            "train": args.train,
            "val": args.val,
            "seed": args.seed,
        },
        "machine": info,
        "summary": summarize(rounds),
        "rounds": rounds,
        "flops": flops,
        "notes": args.note,
    }
    print(markdown(report))
    if not args.no_write:
        path = write(report, args.out, f"{now:%Y-%m-%d}-vm-{args.tag}")
        print(f"wrote {path} (+ .json)", file=sys.stderr)
    return report


if __name__ == "__main__":
    main()
