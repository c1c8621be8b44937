"""Tasks: what a run trains its hosts on, by preset name (:func:`make_task`).

A :class:`Task` names its host family, input shape and class count, and holds two factories: a fresh
host (:mod:`esper.shell.host.hosts`) and one env's :class:`Loaders`. Every task has three splits:
**train** (the host trains on it), **validation** (what the controller sees: accuracy, loss,
counterfactuals) and **test** (seen by neither; only reported, at the end of an episode). Every env
gets its own iterators with their own ``torch.Generator``; the data tensors are loaded once per task
and shared (one copy per device). The datasets themselves are in :mod:`esper.shell.data.datasets`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch

from esper.shell.common.seeding import derive_seed
from esper.shell.data.batches import Batch, Loaders, TensorBatches, WindowBatches
from esper.shell.data.datasets import (
    LONGRANGE_SPLITS,
    MNIST1D_SPLITS,
    RECALL_SPLITS,
    RECALL_VOCAB,
    RETRIEVAL_SPLITS,
    ImageTransform,
    load_cifar10,
    load_digits,
    load_longrange,
    load_mnist1d,
    load_recall,
    load_retrieval,
    load_text_file,
    split_bytes,
    stdlib_source_bytes,
)
from esper.shell.host.blueprints import build_blueprint, param_count
from esper.shell.host.hosts import CNN1dHost, CNNHost, Host, TransformerHost

#: The blueprint ``grow_all`` germinates on a task that names none, per host family: the one with the
#: largest mean gain in held-out accuracy when grown into every slot (bench suite ``growth``).
#: (``mlp``, the flat family, is not measured: its largest.)
GROW_ALL_BLUEPRINT = {"cnn1d": "conv_heavy", "cnn": "conv_light", "transformer": "mlp", "mlp": "mlp"}

#: ``digits_shallow``: the side its 8×8 images are resized to.
DIGITS_SHALLOW_SIZE = 32


# ------------------------------------------------------------------------------------------- tasks


@dataclass(frozen=True, slots=True)
class Task:
    """What the shell needs to know about a task, and the factories for its pieces."""

    #: Task name (a key of :data:`TASK_FACTORIES`: "mnist1d", "longrange", "digits", "stdlib_text", ...).
    name: str
    #: Host family, "cnn", "cnn1d" or "transformer" (selects the blueprint registry).
    family: str
    #: One example's shape: ``(C, H, W)`` for images, ``(ctx,)`` for text.
    input_shape: tuple[int, ...]
    #: Number of classes; for a language model, the vocabulary size.
    n_classes: int
    #: ``make_host() -> Host``: a fresh host with default-initialized weights.
    make_host: Callable[[], Host]
    #: ``make_loaders(seed, device=None) -> Loaders(train, val, test)``: one env's iterators; train
    #: shuffled by a generator seeded with ``seed``, validation and test in fixed order.
    make_loaders: Callable[..., Loaders]
    #: Generated data: the seed of this draw (another seed is a fresh draw of all three splits). None
    #: for a fixed dataset, whose test split is the only held-out draw.
    data_seed: int | None = None
    #: The blueprint ``grow_all`` germinates in every slot: the one that gained most on this task (None:
    #: its family's, :data:`GROW_ALL_BLUEPRINT`; :attr:`grow_all` is the one in force).
    grow_all_blueprint: str | None = None
    #: A task whose hosts differ (issue 89: a *family* of hosts): ``make_host_for(host_seed) -> Host``,
    #: the host of that seed, its architecture drawn from the family by the seed alone (the same seed,
    #: the same host; its weights drawn, as any host's, from the global generator the caller seeded).
    #: ``make_host()`` is then one member (a probe: the slot names and the catalogue, which every member
    #: shares). None: every host of the task is ``make_host()``'s.
    make_host_for: Callable[[int], Host] | None = None
    #: A family's member of a host seed, as its draw states it (``{"channels": ..., "n_train": ...}``):
    #: for reports only (the pre-check's rows), never an observation. None for a task of one host.
    describe_member: Callable[[int], dict] | None = None

    @property
    def grow_all(self) -> str:
        """The blueprint ``grow_all`` grows on this task: its own, else its family's."""
        return self.grow_all_blueprint or GROW_ALL_BLUEPRINT[self.family]

    @property
    def varies(self) -> bool:
        """Whether the hosts of this task differ from host seed to host seed (a family of hosts)."""
        return self.make_host_for is not None

    def host_for(self, seed: int) -> Host:
        """The host of host seed ``seed``: the family's member of that seed, else ``make_host()``."""
        return self.make_host_for(int(seed)) if self.make_host_for is not None else self.make_host()


def grow_all_params(task: Task, host: Host, slots: tuple[int, ...] = ()) -> int:
    """The seed parameters ``grow_all`` adds to ``host`` (a host of ``task``): its blueprint
    (:attr:`Task.grow_all`) in every enabled slot (``slots``: their indices; empty: all), gates not
    counted. The unit of the budgets stated as a share of it (``reward.param_budget_share``,
    ``ppo.param_cap_share``): "60 % of what growing everything adds" reads the same on any host."""
    enabled = slots or tuple(range(host.n_slots))
    return seed_params(task, host, {s: task.grow_all for s in enabled})


def written_plan(plan: str, slot_names: Sequence[str]) -> dict[int, str]:
    """A plan as the searches and evaluations write it (``"b0=conv_heavy+b2=self_attention"``; ``""``:
    nothing grown) -> ``{slot index: blueprint name}``. For plans a search made; a user's ``grow:``
    controller name is checked by :func:`esper.shell.eval.controllers.parse_plan`."""
    names = list(slot_names)
    return {names.index(s): b for s, _, b in (part.partition("=") for part in plan.split("+") if part)}


def seed_params(task: Task, host: Host, plan: dict[int, str] | str) -> int:
    """The seed parameters a fixed plan adds to ``host`` (a host of ``task``), gates not counted:
    ``plan`` maps slot indices to blueprint names, or is written (:func:`written_plan`)."""
    if isinstance(plan, str):
        plan = written_plan(plan, host.slot_names)
    with torch.random.fork_rng(devices=[]):  # building a seed draws its init: leave the caller's stream
        seeds = [build_blueprint(task.family, b, host.slots[s].width) for s, b in plan.items()]
    return sum(param_count(seed) for seed in seeds)


class _PerDevice:
    """The task's data tensors, loaded once, copied at most once per device."""

    def __init__(self, tensors: tuple[torch.Tensor, ...]):
        self._copies: dict[str, tuple[torch.Tensor, ...]] = {"cpu": tensors}

    def get(self, device: torch.device | str | None) -> tuple[torch.Tensor, ...]:
        key = str(torch.device(device if device is not None else "cpu"))
        if key not in self._copies:
            self._copies[key] = tuple(t.to(key) for t in self._copies["cpu"])
        return self._copies[key]


def _tensor_loaders(
    data, batch_size, max_batches, val_max_batches, transform, val_transform, seed, device=None,
    eval_batch_size=None,
) -> Loaders:  # fmt: skip
    tx, ty, vx, vy, sx, sy = data.get(device)
    train = TensorBatches(
        tx, ty, batch_size=batch_size, max_batches=max_batches, seed=seed, transform=transform
    )
    held = lambda x, y: TensorBatches(
        x, y, batch_size=eval_batch_size or batch_size, shuffle=False, drop_last=False,
        max_batches=val_max_batches, transform=val_transform,
    )  # fmt: skip
    return Loaders(train, held(vx, vy), held(sx, sy))


def _text_loaders(data, ctx, batch_size, max_batches, val_max_batches, seed, device=None) -> Loaders:
    train_tokens, val_tokens, test_tokens = data.get(device)
    train = WindowBatches(train_tokens, ctx=ctx, batch_size=batch_size, max_batches=max_batches, seed=seed)
    held = lambda tokens: WindowBatches(
        tokens, ctx=ctx, batch_size=batch_size, shuffle=False, drop_last=False, max_batches=val_max_batches
    )
    return Loaders(train, held(val_tokens), held(test_tokens))


def _signal_task(
    name: str, splits: tuple[Batch, Batch, Batch], n_classes: int, *, channels: tuple[int, ...],
    kernels: tuple[int, ...], pools: tuple[int, ...], batch_size: int, max_batches: int | None,
    val_max_batches: int | None, eval_batch_size: int, data_seed: int, grow_all_blueprint: str | None,
) -> Task:  # fmt: skip
    """A 1-D signal task on a :class:`~esper.shell.host.hosts.CNN1dHost` (one block per entry of
    ``channels``, ``kernels`` and ``pools``); validation and test run in batches of ``eval_batch_size``."""
    (tx, ty), (vx, vy), (sx, sy) = splits
    data = _PerDevice((tx, ty, vx, vy, sx, sy))
    return Task(
        name, "cnn1d", (tx.shape[1], tx.shape[-1]), n_classes,
        partial(CNN1dHost, tx.shape[1], tx.shape[-1], tuple(channels), n_classes, tuple(kernels),
                tuple(pools)),
        partial(_tensor_loaders, data, batch_size, max_batches, val_max_batches, None, None,
                eval_batch_size=eval_batch_size),
        data_seed=data_seed, grow_all_blueprint=grow_all_blueprint,
    )  # fmt: skip


def mnist1d_task(
    *,
    channels: tuple[int, ...] = (8, 8, 8),
    kernels: tuple[int, ...] = (1, 1, 1),
    pools: tuple[int, ...] = (2, 2, 1),
    batch_size: int = 64,
    max_batches: int | None = None,
    val_max_batches: int | None = None,
    eval_batch_size: int = 1000,
    splits: tuple[int, int, int] = MNIST1D_SPLITS,
    data_seed: int = 42,
    name: str = "mnist1d",
) -> Task:
    """MNIST-1D (:func:`load_mnist1d`, drawn from ``data_seed``) with a small
    :class:`~esper.shell.host.hosts.CNN1dHost`: three pointwise blocks, so the host sees one position
    at a time and the seeds add the spatial context it lacks; validation and test run in batches of
    ``eval_batch_size`` (one batch each by default)."""
    return _signal_task(
        name, load_mnist1d(splits=splits, seed=data_seed), 10, channels=channels, kernels=kernels,
        pools=pools, batch_size=batch_size, max_batches=max_batches, val_max_batches=val_max_batches,
        eval_batch_size=eval_batch_size, data_seed=data_seed, grow_all_blueprint="conv_heavy",
    )  # fmt: skip


#: The deep MNIST-1D host: five pointwise blocks, pooled twice (40 -> 20 -> 10 positions), five slots.
DEEP_BLOCKS = 5


def mnist1d_deep_task(
    *,
    channels: tuple[int, ...] = (8,) * DEEP_BLOCKS,
    kernels: tuple[int, ...] = (1,) * DEEP_BLOCKS,
    pools: tuple[int, ...] = (2, 2, 1, 1, 1),
    **kwargs,
) -> Task:
    """MNIST-1D (the default's data) with a deeper host: :data:`DEEP_BLOCKS` pointwise blocks and as many
    slots (``b0``-``b4``), so where to grow has more answers than on the default's three slots."""
    return mnist1d_task(channels=channels, kernels=kernels, pools=pools, name="mnist1d_deep", **kwargs)


def _pointwise_host(
    *,
    channels: tuple[int, ...] = (8, 8, 8),
    kernels: tuple[int, ...] = (1, 1, 1),
    pools: tuple[int, ...] = (4, 1, 1),
    batch_size: int = 64,
    max_batches: int | None = None,
    val_max_batches: int | None = None,
    eval_batch_size: int = 1000,
) -> dict:
    """The signal tasks' three-block pointwise host, pooled once by 4, and its batch sizes: the keyword
    arguments of :func:`_signal_task` (the defaults of ``longrange`` and ``retrieval``)."""
    return dict(channels=channels, kernels=kernels, pools=pools, batch_size=batch_size,
                max_batches=max_batches, val_max_batches=val_max_batches,
                eval_batch_size=eval_batch_size)  # fmt: skip


def longrange_task(
    *, splits: tuple[int, int, int] = LONGRANGE_SPLITS, data_seed: int = 7, length: int = 64, **host
) -> Task:
    """Two distant pulses, same sign or not (:func:`load_longrange`, drawn from ``data_seed``), on a
    three-block pointwise :class:`~esper.shell.host.hosts.CNN1dHost` pooled once by 4 (64 -> 16
    positions; ``host``: :func:`_pointwise_host`'s sizes). The static host averages local features and
    cannot relate the pulses (it stays at chance). A seed that sees the whole length can:
    ``self_attention`` over the positions, the ``attention`` (squeeze-excite) gate from the global mean,
    and, through the GroupNorm each of them holds (a per-signal statistic over the whole length), ``norm``
    and every convolution blueprint, although a convolution alone reaches at most 24 input positions
    further in all three slots, short of the 40 between the pulses. The measured best, grown everywhere,
    is ``conv_heavy`` (docs/suite.md)."""
    return _signal_task(
        "longrange", load_longrange(splits=splits, seed=data_seed, length=length), 2, data_seed=data_seed,
        grow_all_blueprint="conv_heavy", **_pointwise_host(**host),
    )  # fmt: skip


def retrieval_task(*, splits: tuple[int, int, int] = RETRIEVAL_SPLITS, data_seed: int = 11, **host) -> Task:
    """Is the query's level among the items'? (:func:`load_retrieval`, two channels, drawn from
    ``data_seed``) on the same host as ``longrange`` (``host``: :func:`_pointwise_host`'s sizes). It was
    made to have a best blueprint that is not the largest: ``conv_light`` led ``conv_heavy`` on two
    screening draws, but by only 1.3 points (95 % interval -1.6 to +4.2) on its confirming run, so it is
    not in the suite (docs/suite.md). ``grow_all`` grows ``conv_heavy``, the largest blueprint."""
    return _signal_task(
        "retrieval", load_retrieval(splits=splits, seed=data_seed), 2, data_seed=data_seed,
        grow_all_blueprint="conv_heavy", **_pointwise_host(**host),
    )  # fmt: skip


def recall_task(
    *,
    splits: tuple[int, int, int] = RECALL_SPLITS,
    data_seed: int = 13,
    batch_size: int = 32,
    max_batches: int | None = 24,
    val_max_batches: int | None = None,
    eval_batch_size: int = 1024,
    d_model: int = 32,
    n_layers: int = 2,
) -> Task:
    """In-context recall (:func:`load_recall`: 16 tokens, sequences of 32, drawn from ``data_seed``) on a
    :class:`~esper.shell.host.hosts.TransformerHost` whose positions do not mix: ``n_layers`` blocks
    without attention, each followed by a slot, and the previous token's embedding added to each
    position's input. Accuracy is next-token accuracy over every position.

    The task is made so that the best blueprint is not the largest. The host alone can learn only what
    the current and previous token say about the next, which on these sequences is nothing. Recall takes
    one attention step over the positions (match the current token against each position's previous
    token, read that position's token), which only the ``attention`` seed brings; every other transformer
    blueprint, the largest (``mlp``) included, acts on each position alone. ``grow_all`` grows
    ``attention``."""
    (tx, ty), (vx, vy), (sx, sy) = load_recall(splits=splits, seed=data_seed)
    vocab, length = RECALL_VOCAB, tx.shape[1]
    data = _PerDevice((tx, ty, vx, vy, sx, sy))
    return Task(
        "recall", "transformer", (length,), vocab,
        partial(TransformerHost, vocab=vocab, d_model=d_model, n_layers=n_layers, n_heads=2, ctx=length,
                slot_every=1, attention=False, prev_token=True),
        partial(_tensor_loaders, data, batch_size, max_batches, val_max_batches, None, None,
                eval_batch_size=eval_batch_size),
        data_seed=data_seed, grow_all_blueprint="attention",
    )  # fmt: skip


def digits_task(
    *,
    image_size: int = 16,
    channels: tuple[int, ...] = (16, 32, 64),
    batch_size: int = 64,
    max_batches: int | None = None,
    val_max_batches: int | None = None,
    interpolation: str = "bilinear",
    val_fraction: float = 0.15,
    test_fraction: float = 0.15,
    split_seed: int = 0,
    name: str = "digits",
    grow_all_blueprint: str | None = None,
) -> Task:
    """scikit-learn's digits (:func:`load_digits`; a fixed dataset), resized to ``image_size``, on a
    :class:`~esper.shell.host.hosts.CNNHost` with one 3×3 block per entry of ``channels``."""
    splits = load_digits(
        image_size=image_size, interpolation=interpolation, val_fraction=val_fraction,
        test_fraction=test_fraction, split_seed=split_seed,
    )  # fmt: skip
    data = _PerDevice(tuple(t for split in splits for t in split))
    return Task(
        name, "cnn", (1, image_size, image_size), 10,
        partial(CNNHost, 1, image_size, tuple(channels), 10),
        partial(_tensor_loaders, data, batch_size, max_batches, val_max_batches, None, None),
        grow_all_blueprint=grow_all_blueprint,
    )  # fmt: skip


def digits_shallow_task(
    *, image_size: int = DIGITS_SHALLOW_SIZE, channels: tuple[int, ...] = (8, 8), **kwargs
) -> Task:
    """The digits, resized to ``image_size`` (32), on a shallow :class:`~esper.shell.host.hosts.CNNHost`
    of two 3×3 blocks of 8 channels (two slots): its receptive field (10 pixels) covers a third of the
    image, so the global average reads a bag of stroke pieces, and seeds that add 3×3 convolutions
    widen it. (Fewer channels on the 8×8 images do not make room: a seed keeps its slot's width, so a
    narrow host stays narrow; see docs/suite.md.)"""
    return digits_task(image_size=image_size, channels=channels, name="digits_shallow",
                       grow_all_blueprint="conv_heavy", **kwargs)  # fmt: skip


def cifar10_task(
    *,
    path: str | Path,
    channels: tuple[int, ...] = (16, 32, 64),
    batch_size: int = 128,
    max_batches: int | None = None,
    val_max_batches: int | None = None,
    augment: bool = True,
) -> Task:
    data = _PerDevice(tuple(t for split in load_cifar10(path) for t in split))
    return Task(
        "cifar10", "cnn", (3, 32, 32), 10,
        partial(CNNHost, 3, 32, tuple(channels), 10),
        partial(_tensor_loaders, data, batch_size, max_batches, val_max_batches,
                ImageTransform(augment=augment), ImageTransform(augment=False)),
    )  # fmt: skip


def _text_task(name: str, splits: tuple[torch.Tensor, ...], *, ctx: int, batch_size: int,
               max_batches: int | None, val_max_batches: int | None, d_model: int, n_layers: int,
               n_heads: int, dropout: float, slot_every: int) -> Task:  # fmt: skip
    # Every split must hold a window (plus its target byte); training starts at a random offset in
    # [0, ctx), so it needs ctx more. Refused here, when the task is built, not an episode later.
    needs = {"training": 2 * ctx, "validation": ctx + 1, "test": ctx + 1}
    short = [f"{what} {len(t)} (needs {n})" for (what, n), t in zip(needs.items(), splits) if len(t) < n]
    if short:
        raise ValueError(
            f"{name}: the text is too short for windows of ctx {ctx} bytes: {', '.join(short)} bytes; "
            "use a longer file"
        )
    data = _PerDevice(tuple(splits))
    return Task(
        name, "transformer", (ctx,), 256,
        partial(TransformerHost, 256, d_model, n_layers, n_heads, ctx, dropout, slot_every),
        partial(_text_loaders, data, ctx, batch_size, max_batches, val_max_batches),
    )  # fmt: skip


def stdlib_text_task(
    *,
    max_bytes: int = 2_000_000,
    val_fraction: float = 0.1,
    ctx: int = 64,
    batch_size: int = 32,
    max_batches: int | None = 32,
    val_max_batches: int | None = 8,
    d_model: int = 64,
    n_layers: int = 4,
    n_heads: int = 4,
    dropout: float = 0.0,
    slot_every: int = 2,
) -> Task:
    return _text_task(
        "stdlib_text", split_bytes(stdlib_source_bytes(max_bytes), val_fraction), ctx=ctx,
        batch_size=batch_size, max_batches=max_batches, val_max_batches=val_max_batches,
        d_model=d_model, n_layers=n_layers, n_heads=n_heads, dropout=dropout, slot_every=slot_every,
    )  # fmt: skip


def tinystories_task(
    *,
    path: str | Path,
    val_path: str | Path | None = None,
    max_bytes: int | None = None,
    val_fraction: float = 0.05,
    ctx: int = 256,
    batch_size: int = 32,
    max_batches: int | None = 200,
    val_max_batches: int | None = 50,
    d_model: int = 384,
    n_layers: int = 6,
    n_heads: int = 6,
    dropout: float = 0.1,
    slot_every: int = 2,
) -> Task:
    splits = load_text_file(path, val_path=val_path, max_bytes=max_bytes, val_fraction=val_fraction)
    return _text_task(
        "tinystories", splits, ctx=ctx, batch_size=batch_size, max_batches=max_batches,
        val_max_batches=val_max_batches, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
        dropout=dropout, slot_every=slot_every,
    )  # fmt: skip


# ---------------------------------------------------------------------------- families (issue 89)
# A family task's hosts differ by host seed: each host's architecture (and, for some, its data) is drawn
# from the family by the seed alone, so a controller meets a different host each episode and can tell
# them apart only by what any host shows (its slots' widths and descriptors, its training signals, what
# its seeds measure). Every member has the same slots and the same blueprint catalogue. Nothing in a
# host, its data or an observation names the family or the member; :attr:`Task.describe_member` is
# for reports only.


def family_draw(name: str, seed: int) -> random.Random:
    """The generator family ``name`` draws host ``seed``'s member from: its own stream (the host's weights
    are drawn after, from the global generator), the same for the same family and seed."""
    return random.Random(derive_seed("family", name, int(seed)))


def _family(task: Task, name: str, member: Callable[[int], dict], **fields) -> Task:
    """``task`` as family ``name``: the host of seed ``s`` is a :class:`CNN1dHost` of ``member(s)``'s
    ``channels``, ``kernels`` and ``pools`` (the base task's input and classes); ``make_host()`` is seed
    0's. ``fields``: other :class:`Task` fields to replace (``make_loaders`` for data drawn per host)."""
    (in_channels, length), n_classes = task.input_shape, task.n_classes

    def host_for(seed: int) -> Host:
        m = member(seed)
        return CNN1dHost(in_channels, length, m["channels"], n_classes, m["kernels"], m["pools"])

    return replace(task, name=name, make_host=partial(host_for, 0), make_host_for=host_for,
                   describe_member=member, **fields)  # fmt: skip


#: ``mnist1d_where``: the width of its narrow block and the widths its blocks draw from (one for all).
WHERE_NARROW, WHERE_WIDE = 2, (8, 12)
#: ``mnist1d_where``'s two bottlenecks, each on half of the hosts: the first block narrow, the positions
#: pooled by 4 after the last block (the wide full-resolution slot is ``b1``); or no narrow block, the
#: positions pooled by 4 after the second (the wide full-resolution slot is ``b0``).
WHERE_KINDS = {"narrow_first": ((True, False, False), (1, 1, 4)), "pool_early": ((False,) * 3, (1, 4, 1))}


def where_member(seed: int) -> dict:
    """``mnist1d_where``'s host of ``seed``: one of :data:`WHERE_KINDS` (each with probability 1/2), its
    wide blocks one width of :data:`WHERE_WIDE`, its narrow block :data:`WHERE_NARROW`; pointwise
    kernels."""
    rng = family_draw("mnist1d_where", seed)
    narrow, pools = WHERE_KINDS[rng.choice(sorted(WHERE_KINDS))]
    wide = rng.choice(WHERE_WIDE)
    channels = tuple(WHERE_NARROW if n else wide for n in narrow)
    return {"channels": channels, "kernels": (1, 1, 1), "pools": pools}


def mnist1d_where_task(**kwargs) -> Task:
    """A family of MNIST-1D hosts whose bottleneck sits in a different place per host (issue 89, *where
    and what under a budget*): three pointwise blocks, on half of the hosts the first one only
    :data:`WHERE_NARROW` channels wide with the positions kept whole until the last block, on the other
    half every block wide with the positions pooled by 4 after the second (:func:`where_member`). Spatial
    context pays most in a wide slot at full resolution, and which slot that is (``b1`` or ``b0``)
    differs from host to host. The data is the default's (``kwargs``: :func:`mnist1d_task`'s, not the
    host's)."""
    for key in ("channels", "kernels", "pools"):
        if key in kwargs:
            raise TypeError(f"mnist1d_where: the family draws each host's {key}; it takes no {key!r}")
    return _family(mnist1d_task(**kwargs), "mnist1d_where", where_member)


def _family_loaders(
    data, name: str, member: Callable[[int], dict], batch_size: int, max_batches: int | None,
    val_max_batches: int | None, eval_batch_size: int, n_classes: int, seed: int, device=None,
) -> Loaders:  # fmt: skip
    """One env's iterators where the family draws the host's data: ``member(seed)``'s ``n_train``
    training examples of the task's draw (picked by the seed) with a share ``noise`` of their labels
    replaced by another class, as many of the validation labels; the test split clean. The examples are
    repeated to the full training split's length, so every host trains the same steps an epoch."""
    tx, ty, vx, vy, sx, sy = data.get(device)
    m = member(seed)
    g = torch.Generator().manual_seed(derive_seed("family-data", name, int(seed)))

    def noisy(y: torch.Tensor) -> torch.Tensor:
        flip = torch.rand(len(y), generator=g) < m["noise"]
        shift = torch.randint(1, n_classes, (len(y),), generator=g)
        return torch.where(flip.to(y.device), (y + shift.to(y.device)) % n_classes, y)

    pick = torch.randperm(len(ty), generator=g)[: m["n_train"]].to(tx.device)
    x, y = tx[pick], noisy(ty[pick])
    reps = -(-len(ty) // len(y))
    x, y = x.repeat(reps, 1, 1)[: len(ty)], y.repeat(reps)[: len(ty)]
    train = TensorBatches(x, y, batch_size=batch_size, max_batches=max_batches, seed=seed)
    held = lambda a, b: TensorBatches(a, b, batch_size=eval_batch_size, shuffle=False, drop_last=False,
                                      max_batches=val_max_batches)  # fmt: skip
    return Loaders(train, held(vx, noisy(vy)), held(sx, sy))


#: ``mnist1d_when``: the training-set sizes and the label-noise shares its hosts draw from.
WHEN_TRAIN, WHEN_NOISE = (250, 500, 1000, 2000, 4000), (0.0, 0.1, 0.2, 0.3, 0.4)


def when_member(seed: int) -> dict:
    """``mnist1d_when``'s host of ``seed``: the default's host (three pointwise blocks of 8, pools 2, 2,
    1) on ``n_train`` examples of :data:`WHEN_TRAIN` with a share ``noise`` of :data:`WHEN_NOISE` of
    their labels (and as many of the validation labels) replaced by another class."""
    rng = family_draw("mnist1d_when", seed)
    return {"channels": (8, 8, 8), "kernels": (1, 1, 1), "pools": (2, 2, 1),
            "n_train": rng.choice(WHEN_TRAIN), "noise": rng.choice(WHEN_NOISE)}  # fmt: skip


def mnist1d_when_task(
    *,
    batch_size: int = 64,
    max_batches: int | None = None,
    val_max_batches: int | None = None,
    eval_batch_size: int = 1000,
    splits: tuple[int, int, int] = MNIST1D_SPLITS,
    data_seed: int = 42,
) -> Task:
    """A family of MNIST-1D hosts whose data differs per host (issue 89, *when, and whether to keep*):
    the default's host trained on a small or large, clean or noisy training set (:func:`when_member`,
    :func:`_family_loaders`; every host trains the same steps an epoch), read on a clean test split. A
    large seed pays early on a large clean set; on a small or noisy one it may fit the noise, so when to
    germinate it, and whether, may differ from host to host."""
    (tx, ty), (vx, vy), (sx, sy) = load_mnist1d(splits=splits, seed=data_seed)
    data = _PerDevice((tx, ty, vx, vy, sx, sy))
    base = mnist1d_task(batch_size=batch_size, eval_batch_size=eval_batch_size, splits=splits,
                        data_seed=data_seed)  # fmt: skip
    loaders = partial(_family_loaders, data, "mnist1d_when", when_member, batch_size, max_batches,
                      val_max_batches, eval_batch_size, 10)  # fmt: skip
    return _family(base, "mnist1d_when", when_member, make_loaders=loaders)


#: Task name -> task factory (keyword arguments only; unknown keywords raise TypeError); the task names
#: are :data:`esper.shell.env.config.TASKS`.
TASK_FACTORIES: dict[str, Callable[..., Task]] = {
    "mnist1d": mnist1d_task,
    "mnist1d_deep": mnist1d_deep_task,
    "mnist1d_where": mnist1d_where_task,
    "mnist1d_when": mnist1d_when_task,
    "longrange": longrange_task,
    "retrieval": retrieval_task,
    "recall": recall_task,
    "digits": digits_task,
    "digits_shallow": digits_shallow_task,
    "stdlib_text": stdlib_text_task,
    "cifar10": cifar10_task,
    "tinystories": tinystories_task,
}


def make_task(name: str, **kwargs) -> Task:
    """Build preset ``name`` with keyword overrides, e.g. ``make_task("cifar10", path="/data/c10")``."""
    if name not in TASK_FACTORIES:
        raise ValueError(f"unknown task {name!r}; presets: {', '.join(TASK_FACTORIES)}")
    return TASK_FACTORIES[name](**kwargs)


__all__ = [
    "DEEP_BLOCKS",
    "DIGITS_SHALLOW_SIZE",
    "GROW_ALL_BLUEPRINT",
    "TASK_FACTORIES",
    "WHEN_NOISE",
    "WHEN_TRAIN",
    "WHERE_KINDS",
    "WHERE_NARROW",
    "WHERE_WIDE",
    "Task",
    "cifar10_task",
    "digits_shallow_task",
    "digits_task",
    "family_draw",
    "grow_all_params",
    "longrange_task",
    "make_task",
    "mnist1d_deep_task",
    "mnist1d_task",
    "mnist1d_when_task",
    "mnist1d_where_task",
    "recall_task",
    "retrieval_task",
    "seed_params",
    "stdlib_text_task",
    "tinystories_task",
    "when_member",
    "where_member",
    "written_plan",
]
