"""Batch iterators over in-memory data: shuffled by each env's own generator (training) or in a fixed
order (validation and test), ``batch_size`` items a batch, at most ``max_batches`` an epoch."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch

#: One batch: inputs and targets.
Batch = tuple[torch.Tensor, torch.Tensor]
#: What a batch is made of, not what it holds: its inputs' shape and dtype, then its targets' (what
#: counting a pass's FLOPs needs, :mod:`esper.shell.host.flops`).
BatchShape = tuple[tuple[int, ...], torch.dtype, tuple[int, ...], torch.dtype]


# ------------------------------------------------------------------------------------- batch iterators
class _Batches:
    """Shared epoch logic: an order over the items (shuffled by this iterator's own generator each
    epoch, or in sequence), cut into ``batch_size`` chunks, at most ``max_batches`` per epoch."""

    def __init__(
        self, *, batch_size: int, shuffle: bool, drop_last: bool, max_batches: int | None, seed: int
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_batches is not None and max_batches < 1:
            raise ValueError(f"max_batches must be >= 1 or None, got {max_batches}")
        self.batch_size, self.shuffle, self.drop_last, self.max_batches = (
            batch_size,
            shuffle,
            drop_last,
            max_batches,
        )
        self.generator = torch.Generator().manual_seed(seed)

    def _n_items(self) -> int:
        raise NotImplementedError

    def __len__(self) -> int:
        n, b = self._n_items(), self.batch_size
        full = n // b if self.drop_last else -(-n // b)
        return full if self.max_batches is None else min(full, self.max_batches)

    def epoch_shapes(self) -> dict[BatchShape, int]:
        """The shapes of an epoch's batches, each with how many of them an epoch yields: read off the
        sizes, nothing drawn (the data order and the augmentation are as without the call)."""
        n, b = self._n_items(), self.batch_size
        sizes = Counter(min(b, n - k * b) for k in range(len(self)))
        return {self._shape(size): count for size, count in sizes.items()}

    def _shape(self, size: int) -> BatchShape:
        raise NotImplementedError

    def _chunks(self) -> Iterator[torch.Tensor]:
        n = self._n_items()
        order = torch.randperm(n, generator=self.generator) if self.shuffle else torch.arange(n)
        for k in range(len(self)):
            yield order[k * self.batch_size : (k + 1) * self.batch_size]


class TensorBatches(_Batches):
    """``(x[idx], y[idx])`` mini-batches over in-memory tensors (on any device), with
    ``transform(x, generator)`` applied per batch (e.g. :class:`ImageTransform`)."""

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        batch_size: int,
        shuffle: bool = True,
        drop_last: bool = True,
        max_batches: int | None = None,
        seed: int = 0,
        transform: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None,
    ):
        super().__init__(
            batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, max_batches=max_batches, seed=seed
        )
        if len(x) != len(y) or len(y) == 0:
            raise ValueError(
                f"TensorBatches: x and y need the same, non-zero length, got {len(x)} / {len(y)}"
            )
        self.x, self.y, self.transform = x, y, transform
        self._item: tuple[tuple[int, ...], torch.dtype] | None = None

    def _n_items(self) -> int:
        return len(self.y)

    def _shape(self, size: int) -> BatchShape:
        if self._item is None:  # one example's shape and dtype as the model gets it (after the transform)
            x = self.x[:1]
            if self.transform is not None:  # on a zero example, with a generator of its own: nothing drawn
                with torch.random.fork_rng(devices=[]):
                    x = self.transform(torch.zeros_like(x), torch.Generator())
            self._item = (tuple(x.shape[1:]), x.dtype)
        shape, dtype = self._item
        return (size, *shape), dtype, (size, *self.y.shape[1:]), self.y.dtype

    def __iter__(self) -> Iterator[Batch]:
        for idx in self._chunks():
            idx = idx.to(self.x.device)
            x = self.x[idx]
            yield (x if self.transform is None else self.transform(x, self.generator)), self.y[idx]


class WindowBatches(_Batches):
    """Next-byte windows of a 1-D uint8 token tensor: ``x = t[s : s + ctx]``, ``y = t[s + 1 : s + ctx
    + 1]``, int64 ``[B, ctx]``. Windows do not overlap; when shuffled, each epoch starts them at a
    random offset in ``[0, ctx)`` and visits them in random order, otherwise at offset 0 in order."""

    def __init__(
        self,
        tokens: torch.Tensor,
        *,
        ctx: int,
        batch_size: int,
        shuffle: bool = True,
        drop_last: bool = True,
        max_batches: int | None = None,
        seed: int = 0,
    ):
        super().__init__(
            batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, max_batches=max_batches, seed=seed
        )
        if tokens.dim() != 1:
            raise ValueError(f"WindowBatches: tokens must be 1-D, got shape {list(tokens.shape)}")
        self.tokens, self.ctx = tokens, ctx
        if self._n_items() < 1:
            raise ValueError(f"WindowBatches: {len(tokens)} tokens hold no window of ctx {ctx} (+1 target)")

    def _n_items(self) -> int:
        # windows that fit for every offset in [0, ctx) when shuffling, from offset 0 otherwise
        slack = self.ctx if self.shuffle else 1
        return max(0, (len(self.tokens) - slack) // self.ctx)

    def _shape(self, size: int) -> BatchShape:
        return (size, self.ctx), torch.int64, (size, self.ctx), torch.int64

    def __iter__(self) -> Iterator[Batch]:
        offset = int(torch.randint(0, self.ctx, (), generator=self.generator)) if self.shuffle else 0
        span = torch.arange(self.ctx + 1, device=self.tokens.device)
        for idx in self._chunks():
            starts = offset + idx.to(self.tokens.device) * self.ctx
            w = self.tokens[starts[:, None] + span].long()  # [B, ctx + 1]
            yield w[:, :-1], w[:, 1:]


__all__ = ["BatchShape", "TensorBatches", "WindowBatches"]


class Loaders(NamedTuple):
    """One env's iterators over the three splits."""

    train: _Batches  # shuffled by the env's own generator, ``max_batches`` per epoch
    val: _Batches  # fixed order, the same batches every epoch (what the controller sees)
    test: _Batches  # fixed order, only for reporting (never seen by host training or the controller)
