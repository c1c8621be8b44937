"""Host training: one epoch of every env's host, env by env (the per-env reference path,
:class:`~esper.shell.host.bank.PerEnvHosts`) against all envs as one batch
(:class:`~esper.shell.host.batched.BatchedHosts`) and as two batches on two threads
(:class:`~esper.shell.host.batched.ShardedHosts`, the default's ``env.workers 2``), at the embedded
default's shape (MNIST-1D, batch 128, 31 batches an epoch, validation with counterfactuals), interleaved
in rounds.

Three seed populations, because the batch's cost depends on how alike the envs' seeds are (a group of
envs holding one blueprint in a slot runs as one module):

- ``host only``: no seed (the first epochs of every episode);
- ``converged``: conv_heavy fossilized in b0 everywhere, self_attention blending in b2 in half the envs
  (what the default's trained controller grows);
- ``diverse``: every env a different blueprint in every slot, mixed stages and styles, two envs with an
  incubating seed (what an untrained controller grows: the batch's worst case).

Each row also gives the step's FLOPs (counted by ``torch.utils.flop_counter`` on one batched training
step, forward and backward; a convolution's backward counted as twice its forward, :func:`step_flops`)
and its ratio to the FLOP floor: the time the FLOPs would take at this machine's measured single-thread
sgemm rate (the rate a dense matmul reaches here, an upper bound no small-kernel workload attains).
"""

from __future__ import annotations

import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from bench.harness import Context, Row, SuiteResult, Target, round_ratio, suite
from esper.core.spec import Stage, Style
from esper.shell.common.memory import tune_allocator
from esper.shell.env.config import EnvConfig
from esper.shell.host.bank import PerEnvHosts
from esper.shell.host.batched import BatchedHosts, ShardedHosts
from esper.shell.host.stacked import plan, stack_inputs

POPULATIONS = ("host only", "converged", "diverse")
#: a fourth, for ``hosts_whatif``: every env incubates a ``conv_heavy`` in ``b0``
INCUBATING = "incubating in b0"


def populate(bank, names: tuple[str, ...], population: str) -> None:
    """Put the population's seeds into every env of ``bank`` (either path: the same calls)."""
    n = bank.n
    bp = names.index
    for e in range(n):
        if population == "converged":
            bank.germinate(e, 0, bp("conv_heavy"), Style.LINEAR_ADD, 1)
            bank.set_slot(e, 0, alpha=1.0, stage=int(Stage.FOSSILIZED))
            if e % 2:
                bank.germinate(e, 2, bp("self_attention"), Style.LINEAR_ADD, 1)
                bank.set_slot(e, 2, alpha=0.5, stage=int(Stage.BLENDING))
        elif population == INCUBATING:  # the epochs after a trained controller's first germination
            bank.germinate(e, 0, bp("conv_heavy"), Style.LINEAR_ADD, 1)
            bank.set_slot(e, 0, alpha=0.0, stage=int(Stage.TRAINING))
        elif population == "diverse":
            real = [b for b in names if b != "noop"]
            for s in range(3):
                incubating = (e, s) in ((1, 0), (5, 2))
                stage = Stage.TRAINING if incubating else (Stage.BLENDING, Stage.FOSSILIZED)[e % 2]
                bank.germinate(e, s, bp(real[(e + 3 * s) % len(real)]), list(Style)[(e + s) % 4], 1)
                bank.set_slot(e, s, alpha=0.0 if stage == Stage.TRAINING else 0.6, stage=int(stage))


def step_flops(bank: BatchedHosts) -> int:
    """FLOPs of one batched training step (forward and backward) of ``bank``'s hosts as they stand."""
    train_plan = plan(bank.hosts)
    x, y = stack_inputs([next(iter(ld.train)) for ld in bank.loaders])
    with FlopCounterMode(display=False) as counter:
        total, _, _ = bank.stack.loss(x, y, train_plan, None)
        total.backward()
    bank.optimizer.zero_grad(set_to_none=True)
    counts = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    # torch's count of a grouped convolution's backward ignores the groups (it grew with the square of
    # the envs here); a convolution's backward is its input and its weight gradient, twice its forward
    conv = counts.pop("aten.convolution", 0)
    counts.pop("aten.convolution_backward", None)
    return sum(counts.values()) + 3 * conv


def sgemm_rate(n: int = 512, seconds: float = 0.5) -> float:
    """This machine's float32 matmul rate (FLOP/s) on the current threads."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b)
        count += 1
    return 2 * n**3 * count / (time.perf_counter() - start)


@suite("hosts", help="one epoch of every env's host: env by env vs all envs as one batch", order=60)
def run(ctx: Context) -> SuiteResult:
    tune_allocator()
    res = SuiteResult(ratio_label="x vs per-env")
    rate = sgemm_rate()
    for envs in (8,) if ctx.quick else (8, 32):
        for population in POPULATIONS:
            _case(ctx, res, envs, population, rate)
    res.notes.append(
        f"One epoch = 31 training steps of batch 128 per env and the validation with counterfactuals; "
        f"every path on {torch.get_num_threads()} torch thread(s), the per-env path one env after the other, "
        f"the sharded one two batches at once (it wants a second core). "
        f"FLOP floor: the batched step's FLOPs at this machine's measured sgemm rate "
        f"({rate / 1e9:.1f} GFLOP/s on one 512x512 matmul)."
    )
    return res


def _case(ctx: Context, res: SuiteResult, envs: int, population: str, rate: float) -> None:
    device = torch.device("cpu")
    cfg = EnvConfig(task="mnist1d", n_envs=envs, batch_size=128, workers=1)
    task = cfg.build_task()
    names = task.make_host().blueprint_names
    banks = {"per-env": PerEnvHosts(cfg, task, device), "batched": BatchedHosts(cfg, task, device),
             "sharded": ShardedHosts(cfg, task, device, 2)}  # fmt: skip
    for bank in banks.values():
        bank.reset(list(range(envs)))
        populate(bank, names, population)
    flops = step_flops(banks["batched"])
    rounds = 3 if ctx.quick else 5
    stats = ctx.compare({k: (lambda b=b: b.measure(1.0)) for k, b in banks.items()}, rounds=rounds)
    case = f"{envs} envs, {population}"
    step_ms = stats["batched"].median_ms / 31  # the epoch's training steps dominate
    floor_ms = flops / rate * 1e3
    res.rows.append(Row(case, "per-env (reference)", stats["per-env"], ratio=1.0))
    res.rows.append(Row(
        case, "batched", stats["batched"], ratio=round_ratio(stats["per-env"], stats["batched"]),
        note=f"step {flops / 1e6:.0f} MFLOP: ~{step_ms:.1f} ms a step, {step_ms / floor_ms:.0f}x the floor "
             f"({floor_ms:.2f} ms)",
    ))  # fmt: skip
    res.rows.append(Row(
        case, "sharded (2 batches, a thread each)", stats["sharded"],
        ratio=round_ratio(stats["per-env"], stats["sharded"]),
        note=f"{round_ratio(stats['batched'], stats['sharded']):.2f}x one batch",
    ))  # fmt: skip
    banks["sharded"].close()
    if population == "converged":
        ratio = round_ratio(stats["per-env"], stats["batched"])
        res.targets.append(Target(f"batched host epoch, {case}", ratio, ">= 5x the per-env path", ratio >= 5))


@suite(
    "hosts_compiled",
    help="one epoch of the batched hosts: eager against its training step compiled with inductor",
    order=61,
)
def run_compiled(ctx: Context) -> SuiteResult:
    """Does a compiler close the gap to the FLOP floor on this machine? The batched training step
    (``StackedHosts.loss``, forward; its backward through AOT autograd) compiled with inductor, against
    the same step eager, one epoch of 8 envs for two populations, interleaved. Validation stays eager on
    both sides (a few percent of an epoch). The first compiled epoch's time, compile included, is a note:
    every new seed structure (blueprint, slot, stage per group) compiles again."""
    return _one_batch_epochs(
        ctx, "x vs eager", _compiled_case, ("host only", "converged"),
        "the compiled row compiles `StackedHosts.loss` with torch.compile's default (inductor) backend.",
    )  # fmt: skip


def _one_batch_epochs(
    ctx: Context, ratio_label: str, case, populations: tuple[str, ...], what: str
) -> SuiteResult:
    """A suite of two twin batched banks timed epoch by epoch: ``case(ctx, res, 8, population)`` for each
    population (the first alone with ``--quick``), and the note that says what an epoch is."""
    tune_allocator()
    res = SuiteResult(ratio_label=ratio_label)
    for population in populations[:1] if ctx.quick else populations:
        case(ctx, res, 8, population)
    res.notes.append(
        f"One epoch = 31 training steps of batch 128 per env and the validation with counterfactuals, "
        f"one batch of all envs on {torch.get_num_threads()} torch thread(s); {what}"
    )
    return res


def compile_step(bank: BatchedHosts, backend: str = "inductor") -> None:
    """Compile ``bank``'s batched training step (``StackedHosts.loss``) in place; validation stays eager."""
    bank.stack.loss = torch.compile(bank.stack.loss, backend=backend)


def twin_banks(
    envs: int, population: str, device: torch.device | None = None
) -> tuple[BatchedHosts, BatchedHosts]:
    """Two batched banks of ``envs`` hosts at the default's shape (MNIST-1D, batch 128, 31 batches an
    epoch, one batch of all envs) holding the same hosts and the seeds of ``population``: one to time as
    it is, one to change (``reset`` seeds each host, so both draw the same seeds)."""
    device = device if device is not None else torch.device("cpu")
    cfg = EnvConfig(task="mnist1d", n_envs=envs, batch_size=128, workers=1, device=str(device))
    task = cfg.build_task()
    names = task.make_host().blueprint_names
    banks = BatchedHosts(cfg, task, device), BatchedHosts(cfg, task, device)
    for bank in banks:
        bank.reset(list(range(envs)))
        populate(bank, names, population)
    return banks


def _compiled_case(ctx: Context, res: SuiteResult, envs: int, population: str) -> None:
    eager, compiled = twin_banks(envs, population)
    compile_step(compiled)
    first_s = ctx.time_once(lambda: compiled.measure(1.0))
    epochs = {"batched, eager": lambda: eager.measure(1.0),
              "batched, training step compiled (inductor)": lambda: compiled.measure(1.0)}  # fmt: skip
    _timed_rows(
        ctx, res, f"{envs} envs, {population}", epochs, f"first epoch with its compile {first_s:.1f} s"
    )


@suite(
    "hosts_whatif",
    help="one epoch of the batched hosts: validation without and with the what-if reading G2 may ask",
    order=62,
)
def run_whatif(ctx: Context) -> SuiteResult:
    """What ``lifecycle.g2_evidence`` other than ``host`` costs: each epoch's validation also scores
    every incubating seed blended in at alpha 1 (one more validation pass from its slot onwards, per
    incubating seed). One epoch of 8 envs, without and with that reading, interleaved, for the diverse
    population (two incubating seeds among 24 slots) and for one where every env incubates a
    ``conv_heavy`` in ``b0`` (the epochs after a trained controller's first germination)."""
    return _one_batch_epochs(
        ctx, "x vs without", _whatif_case, ("diverse", INCUBATING),
        "'with' also measures `whatif_gain` (what `lifecycle.g2_evidence` `what_if` and `either` read), "
        "on the host's running batch-norm statistics or on each batch's own (`lifecycle.whatif_statistics`).",
    )  # fmt: skip


def _whatif_case(ctx: Context, res: SuiteResult, envs: int, population: str) -> None:
    without, running = twin_banks(envs, population)
    batch = twin_banks(envs, population)[0]
    epochs = {
        "without the what-if reading (g2_evidence host)": lambda: without.measure(1.0),
        "with it (g2_evidence what_if, either)": lambda: running.measure(1.0, whatif=True),
        "with it on batch statistics (whatif_statistics batch)":
            lambda: batch.measure(1.0, whatif=True, whatif_statistics="batch"),
    }  # fmt: skip
    _timed_rows(ctx, res, f"{envs} envs, {population}", epochs)


def _timed_rows(ctx: Context, res: SuiteResult, case: str, epochs: dict, note: str = "") -> None:
    """Time the ``epochs`` (row label -> one epoch) in interleaved rounds; the first is the ratios' 1, and
    ``note`` goes on the last row."""
    stats = ctx.compare(epochs, rounds=3 if ctx.quick else 5)
    base, *others = epochs
    res.rows.append(Row(case, base, stats[base], ratio=1.0))
    for k, other in enumerate(others):
        res.rows.append(Row(case, other, stats[other], ratio=round_ratio(stats[base], stats[other]),
                            note=note if k == len(others) - 1 else ""))  # fmt: skip
