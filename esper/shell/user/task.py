"""A task from the user's own model and data (:func:`user_task`): what the environment trains, validates
and tests, as for the built-in tasks (:class:`~esper.shell.env.tasks.Task`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from esper.shell.data.batches import Batch, Loaders, TensorBatches
from esper.shell.env.tasks import Task
from esper.shell.user.host import Loss, Metric, UserHost

#: Examples of the training split the host runs once to find and check its slots.
PROBE_EXAMPLES = 2


def _check_splits(splits: dict[str, Batch]) -> tuple[int, ...]:
    """The shape of one example, after checking that every split is ``(x, y)`` of tensors of one length
    and that the splits' examples have one shape."""
    shapes = {}
    for what, split in splits.items():
        if not (isinstance(split, (tuple, list)) and len(split) == 2
                and all(isinstance(t, torch.Tensor) for t in split)):  # fmt: skip
            raise ValueError(f"user_task: {what} must be a pair of tensors (x, y)")
        x, y = split
        if len(x) != len(y) or len(x) == 0:
            raise ValueError(
                f"user_task: {what} needs as many inputs as targets, at least one; got {len(x)} / {len(y)}"
            )
        shapes[what] = tuple(x.shape[1:])
    if len(set(shapes.values())) > 1:
        raise ValueError(f"user_task: the splits' examples differ in shape: {shapes}")
    return shapes["train"]


class _Splits:
    """The three splits' tensors, copied at most once per device."""

    def __init__(self, tensors: tuple[torch.Tensor, ...]):
        self._copies = {"cpu": tuple(t.cpu() for t in tensors)}

    def get(self, device: torch.device | str | None) -> tuple[torch.Tensor, ...]:
        key = str(torch.device(device if device is not None else "cpu"))
        if key not in self._copies:
            self._copies[key] = tuple(t.to(key) for t in self._copies["cpu"])
        return self._copies[key]


def _loaders(splits: _Splits, batch_size: int, max_batches: int | None, val_max_batches: int | None,
             eval_batch_size: int, seed: int, device=None) -> Loaders:  # fmt: skip
    tx, ty, vx, vy, sx, sy = splits.get(device)
    held = lambda x, y: TensorBatches(
        x, y, batch_size=eval_batch_size, shuffle=False, drop_last=False, max_batches=val_max_batches
    )
    train = TensorBatches(tx, ty, batch_size=batch_size, max_batches=max_batches, seed=seed)
    return Loaders(train, held(vx, vy), held(sx, sy))


def _host(model_factory: Callable[[], nn.Module], example: torch.Tensor, family: str | None,
          loss: Loss | None, metric: Metric | None) -> UserHost:  # fmt: skip
    return UserHost(model_factory(), example_input=example, family=family, loss=loss, metric=metric)


def user_task(
    model_factory: Callable[[], nn.Module],
    *,
    train: Batch,
    val: Batch,
    test: Batch,
    family: str | None = None,
    loss: Loss | None = None,
    metric: Metric | None = None,
    n_classes: int | None = None,
    name: str = "user",
    batch_size: int = 64,
    max_batches: int | None = None,
    val_max_batches: int | None = None,
    eval_batch_size: int = 1000,
) -> Task:
    """A :class:`~esper.shell.env.tasks.Task` that grows the user's network on their data.

    ``model_factory() -> nn.Module``: a fresh network with its :class:`~esper.shell.user.host.Slot`\\ s,
    initialized from the global torch generator (the environment seeds it before each host, so hosts
    repeat by seed). ``train``, ``val``, ``test``: ``(x, y)`` tensors; the host trains on ``train`` in
    shuffled batches of ``batch_size`` (at most ``max_batches`` an epoch), the controller sees ``val``,
    and ``test`` is only reported; both held-out splits run in fixed batches of ``eval_batch_size`` (at
    most ``val_max_batches``). ``family``, ``loss``, ``metric``: as :class:`~esper.shell.user.host.UserHost`
    takes them. ``n_classes`` (the governor's random-guess loss is its log): default, the size of the
    network's last output dim.

    Builds one host now (the global generator left as it was), so a network without slots or with a slot
    of the wrong width is refused here, in one line, not an episode later."""
    if isinstance(model_factory, nn.Module):
        kind = type(model_factory).__name__
        raise ValueError(
            f"user_task: model_factory is a {kind} instance; pass what builds a fresh one per host (the "
            f"class {kind}, or lambda: {kind}(...)): each host trains its own network"
        )
    if not callable(model_factory):
        raise ValueError(f"user_task: model_factory must be callable() -> nn.Module, got {model_factory!r}")
    input_shape = _check_splits({"train": train, "val": val, "test": test})
    example = train[0][:PROBE_EXAMPLES].detach().cpu()
    make_host = partial(_host, model_factory, example, family, loss, metric)
    with torch.random.fork_rng(devices=[]):
        probe = make_host()
    if n_classes is None:
        n_classes = probe.output_shape[-1] if probe.output_shape else 1
    splits = _Splits((*train, *val, *test))
    return Task(
        name, probe.family, input_shape, int(n_classes), make_host,
        partial(_loaders, splits, batch_size, max_batches, val_max_batches, eval_batch_size),
    )  # fmt: skip


__all__ = ["PROBE_EXAMPLES", "user_task"]
