"""Data: embedded defaults (no download), local CIFAR-10 / TinyStories loaders, batch iterators, tasks.

Every task has three splits: **train** (the host trains on it), **validation** (what the controller
sees: accuracy, loss, counterfactuals) and **test** (seen by neither; only reported, at the end of an
episode). :meth:`Task.make_loaders` returns them as :class:`Loaders`.

- ``mnist1d`` (the default): MNIST-1D, generated procedurally by the ``mnist1d`` package (no download,
  deterministic for a seed, ~1 s): 6,000 1-D signals of length 40, 10 classes, split 4,000 / 1,000 /
  1,000 in generation order (the package shuffles). Standardized by the package.
- ``digits``: scikit-learn's bundled handwritten digits (1797 8×8 grayscale images, 10 classes), read
  from the csv.gz inside the installed package without importing sklearn. Scaled to [0, 1],
  normalized with the train split's mean/std, optionally resized; split 70/15/15 by a fixed permutation.
- ``stdlib_text``: this Python's standard-library ``*.py`` files (depth-first walk in name order,
  site-packages excluded, joined by newlines, capped at ``max_bytes``) as a byte corpus; the last
  ``val_fraction`` of it is held out, its first half validation and its second half test.
  Deterministic for a given Python installation.
- ``cifar10``: the official binary batches at a local path (train: 45,000 images of
  ``data_batch_1..5.bin``, validation: the other 5,000 (a fixed permutation), test: ``test_batch.bin``);
  uint8 in memory, normalized (and augmented) per batch.
- ``tinystories``: a local text file, byte-level (optionally a separate validation file); the held-out
  bytes are halved into validation and test.

Every env gets its own iterators (:meth:`Task.make_loaders`) with their own ``torch.Generator``;
the data tensors are loaded once per task and shared (one copy per device).
"""

from __future__ import annotations

import gzip
import importlib.util
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from esper.shell.host.hosts import Batch, CNN1dHost, CNNHost, Host, TransformerHost

CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR_TEST_FILE = "test_batch.bin"
CIFAR_RECORD = 1 + 3 * 32 * 32
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


# ------------------------------------------------------------------------------------------- digits
def digits_csv_path() -> Path:
    """``sklearn/datasets/data/digits.csv.gz`` of the installed scikit-learn (sklearn not imported)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("scikit-learn is not installed; the digits data ships inside it")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: expected scikit-learn's bundled digits.csv.gz")
    return path


def load_digits(
    *,
    image_size: int = 8,
    interpolation: str = "bilinear",
    val_fraction: float = 0.15,
    test_fraction: float = 0.15,
    split_seed: int = 0,
) -> tuple[Batch, Batch, Batch]:
    """``(train, val, test)``, each ``(x, y)``: x float32 ``[N, 1, S, S]`` normalized with the train
    split's statistics, y int64."""
    with gzip.open(digits_csv_path(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)  # [1797, 65]: 64 pixels (0-16), label
    x = torch.from_numpy(table[:, :64] / 16.0).reshape(-1, 1, 8, 8)
    y = torch.from_numpy(table[:, 64].astype(np.int64))
    if image_size != 8:
        kw = {"align_corners": False} if interpolation in ("bilinear", "bicubic") else {}
        x = F.interpolate(x, size=(image_size, image_size), mode=interpolation, **kw)
    _check_fractions(val_fraction, test_fraction)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(split_seed))
    n_val, n_test = round(val_fraction * len(y)), round(test_fraction * len(y))
    val, test, train = perm[:n_val], perm[n_val : n_val + n_test], perm[n_val + n_test :]
    mean, std = x[train].mean(), x[train].std()
    x = (x - mean) / std
    return tuple((x[i].contiguous(), y[i]) for i in (train, val, test))


def _check_fractions(val_fraction: float, test_fraction: float) -> None:
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError(
            f"val_fraction and test_fraction must be in (0, 1) with a sum < 1, got {val_fraction}, "
            f"{test_fraction}"
        )


# ------------------------------------------------------------------------------------------ MNIST-1D
#: MNIST-1D split sizes: train, validation, test (generated in one call, split in order).
MNIST1D_SPLITS = (4000, 1000, 1000)


def load_mnist1d(
    *, splits: tuple[int, int, int] = MNIST1D_SPLITS, seed: int = 42
) -> tuple[Batch, Batch, Batch]:
    """MNIST-1D generated by the ``mnist1d`` package with its default arguments (``seed`` and the
    sample count aside): ``(train, val, test)``, each ``(x float32 [N, 1, 40], y int64 [N])``.

    The package seeds Python's and NumPy's global generators; their states are restored after, so
    generating the data leaves the caller's random streams untouched."""
    import random

    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as e:  # a dependency of esper; only a broken install gets here
        raise ImportError("the mnist1d task needs the `mnist1d` package: pip install mnist1d") from e
    if len(splits) != 3 or min(splits) < 10:
        raise ValueError(f"MNIST-1D splits: three sizes >= 10 (train, val, test), got {splits}")
    args = get_dataset_args()
    args.num_samples = sum(splits)
    args.train_split = 1.0  # the package's own split is not used: all samples come back in "x"
    args.seed = seed
    py_state, np_state = random.getstate(), np.random.get_state()  # noqa: NPY002 (the package's global)
    try:
        data = make_dataset(args)
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)  # noqa: NPY002
    x = torch.as_tensor(data["x"], dtype=torch.float32).unsqueeze(1)  # [N, 1, L]
    y = torch.as_tensor(data["y"], dtype=torch.int64)
    if len(y) < sum(splits):  # the package makes num_samples // 10 per class
        raise ValueError(f"mnist1d returned {len(y)} samples, fewer than the {sum(splits)} asked for")
    a, b = splits[0], splits[0] + splits[1]
    return (x[:a], y[:a]), (x[a:b], y[a:b]), (x[b : b + splits[2]], y[b : b + splits[2]])


# ------------------------------------------------------------------------------------------ CIFAR-10
def _cifar_dir(path: str | Path) -> Path:
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(
            f"CIFAR-10 path {root} is not a directory; expected the binary version's folder "
            f"(cifar-10-batches-bin) with {', '.join((*CIFAR_TRAIN_FILES, CIFAR_TEST_FILE))}"
        )
    if not (root / CIFAR_TEST_FILE).exists() and (root / "cifar-10-batches-bin").is_dir():
        root = root / "cifar-10-batches-bin"
    missing = [n for n in (*CIFAR_TRAIN_FILES, CIFAR_TEST_FILE) if not (root / n).is_file()]
    if missing:
        raise FileNotFoundError(f"CIFAR-10 binary files missing under {root}: {', '.join(missing)}")
    return root


def _read_cifar_file(path: Path) -> Batch:
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % CIFAR_RECORD:
        raise ValueError(f"{path}: size {raw.size} is not a positive multiple of {CIFAR_RECORD} bytes")
    records = torch.from_numpy(raw.reshape(-1, CIFAR_RECORD))
    y = records[:, 0].long()
    if int(y.max()) > 9:
        raise ValueError(f"{path}: label {int(y.max())} > 9; not a CIFAR-10 binary batch")
    return records[:, 1:].reshape(-1, 3, 32, 32).clone(), y


def load_cifar10(
    path: str | Path, *, val_fraction: float = 0.1, split_seed: int = 0
) -> tuple[Batch, Batch, Batch]:
    """``(train, val, test)``, each ``(x uint8 [N, 3, 32, 32] (CHW), y int64)``: ``val_fraction`` of
    the training files' images (a fixed permutation; 5,000 of the official 50,000) are validation,
    ``test_batch.bin`` is the test split."""
    root = _cifar_dir(path)
    parts = [_read_cifar_file(root / n) for n in CIFAR_TRAIN_FILES]
    x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    n_val = round(val_fraction * len(y))
    if not 1 <= n_val < len(y):
        raise ValueError(
            f"CIFAR-10: val_fraction {val_fraction} of {len(y)} training images leaves a split empty"
        )
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(split_seed))
    val, train = perm[:n_val], perm[n_val:]
    return (x[train], y[train]), (x[val], y[val]), _read_cifar_file(root / CIFAR_TEST_FILE)


@dataclass(frozen=True, slots=True)
class ImageTransform:
    """Per-batch uint8 -> normalized float32, optionally random crop (zero padding) + horizontal flip."""

    mean: tuple[float, ...] = CIFAR_MEAN
    std: tuple[float, ...] = CIFAR_STD
    augment: bool = False
    pad: int = 4

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        mean = torch.tensor(self.mean, device=x.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, device=x.device).view(1, -1, 1, 1)
        x = (x.float() / 255.0 - mean) / std
        return random_crop_flip(x, generator, self.pad) if self.augment else x


def random_crop_flip(x: torch.Tensor, generator: torch.Generator, pad: int = 4) -> torch.Tensor:
    """Per-sample random crop of ``[N, C, H, W]`` from its zero-padded version, and a random
    horizontal flip with probability 1/2. Randomness from ``generator`` (CPU)."""
    n, _, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    oy, ox, flip = (
        torch.randint(0, 2 * pad + 1, (n,), generator=generator).to(x.device),
        torch.randint(0, 2 * pad + 1, (n,), generator=generator).to(x.device),
        torch.rand(n, generator=generator).to(x.device) < 0.5,
    )
    cols = torch.arange(w, device=x.device)
    cols = torch.where(flip[:, None], cols.flip(0), cols) + ox[:, None]  # [N, W]
    rows = torch.arange(h, device=x.device) + oy[:, None]  # [N, H]
    batch = torch.arange(n, device=x.device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]  # [N, H, W, C]
    return out.permute(0, 3, 1, 2).contiguous()


# --------------------------------------------------------------------------------------------- text
def _walk_py(directory: Path, skip: frozenset[str]) -> Iterator[Path]:
    """``*.py`` files under ``directory``, depth first, entries in name order (lazy)."""
    for entry in sorted(directory.iterdir(), key=lambda p: p.name):
        if entry.is_dir() and not entry.is_symlink():
            if entry.name not in skip:
                yield from _walk_py(entry, skip)
        elif entry.suffix == ".py" and entry.is_file():
            yield entry


def stdlib_source_bytes(max_bytes: int = 2_000_000) -> bytes:
    """The first ``max_bytes`` of this Python's standard-library ``*.py`` sources: a depth-first walk
    in name order (site-packages and __pycache__ skipped), files joined by a newline."""
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise FileNotFoundError(f"stdlib directory {root} not found; expected this Python's Lib folder")
    chunks, total = [], 0
    for p in _walk_py(root, frozenset({"site-packages", "dist-packages", "__pycache__"})):
        chunks.append(p.read_bytes() + b"\n")
        total += len(chunks[-1])
        if total >= max_bytes:
            break
    if total == 0:
        raise FileNotFoundError(f"no *.py files under the stdlib directory {root}")
    return b"".join(chunks)[:max_bytes]


def _bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def split_bytes(data: bytes, val_fraction: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split a byte string by position into ``(train, val, test)``: the last ``val_fraction`` is held
    out, its first half validation and its second half test."""
    n_held = int(len(data) * val_fraction)
    tokens = _bytes_tensor(data)
    cut = len(data) - n_held
    mid = cut + n_held // 2
    return tokens[:cut].clone(), tokens[cut:mid].clone(), tokens[mid:].clone()


def _read_text(path: str | Path, max_bytes: int | None, what: str) -> bytes:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(
            f"{what} {p} does not exist or is not a file; expected a UTF-8/byte text file"
        )
    with p.open("rb") as f:
        data = f.read() if max_bytes is None else f.read(max_bytes)
    if not data:
        raise ValueError(f"{what} {p} is empty; expected text")
    return data


def load_text_file(
    path: str | Path,
    *,
    val_path: str | Path | None = None,
    max_bytes: int | None = None,
    val_fraction: float = 0.05,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Byte-level ``(train, val, test)`` uint8 1-D token tensors from a local text file (e.g.
    TinyStories). With ``val_path`` the held-out bytes come from that file (same ``max_bytes`` cap),
    its first half validation and its second half test; otherwise the last ``val_fraction`` of
    ``path`` is held out and halved the same way (:func:`split_bytes`)."""
    data = _read_text(path, max_bytes, "text file")
    if val_path is None:
        return split_bytes(data, val_fraction)
    held = _bytes_tensor(_read_text(val_path, max_bytes, "validation file"))
    mid = len(held) // 2
    return _bytes_tensor(data).clone(), held[:mid].clone(), held[mid:].clone()


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

    def _n_items(self) -> int:
        return len(self.y)

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

    def __iter__(self) -> Iterator[Batch]:
        offset = int(torch.randint(0, self.ctx, (), generator=self.generator)) if self.shuffle else 0
        span = torch.arange(self.ctx + 1, device=self.tokens.device)
        for idx in self._chunks():
            starts = offset + idx.to(self.tokens.device) * self.ctx
            w = self.tokens[starts[:, None] + span].long()  # [B, ctx + 1]
            yield w[:, :-1], w[:, 1:]


# ------------------------------------------------------------------------------------------- tasks
class Loaders(NamedTuple):
    """One env's iterators over the three splits."""

    train: _Batches  # shuffled by the env's own generator, ``max_batches`` per epoch
    val: _Batches  # fixed order, the same batches every epoch (what the controller sees)
    test: _Batches  # fixed order, only for reporting (never seen by host training or the controller)


@dataclass(frozen=True, slots=True)
class Task:
    """What the shell needs to know about a task, and the factories for its pieces."""

    #: Preset name ("digits", "stdlib_text", "cifar10", "tinystories").
    name: str
    #: Host family, "cnn" or "transformer" (selects the blueprint registry).
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
) -> Task:
    """MNIST-1D (:func:`load_mnist1d`) with a small :class:`~esper.shell.host.hosts.CNN1dHost`; validation
    and test run in batches of ``eval_batch_size`` (one batch each by default)."""
    (tx, ty), (vx, vy), (sx, sy) = load_mnist1d(splits=splits, seed=data_seed)
    data = _PerDevice((tx, ty, vx, vy, sx, sy))
    return Task(
        "mnist1d", "cnn1d", (1, tx.shape[-1]), 10,
        partial(CNN1dHost, 1, tx.shape[-1], tuple(channels), 10, tuple(kernels), tuple(pools)),
        partial(_tensor_loaders, data, batch_size, max_batches, val_max_batches, None, None,
                eval_batch_size=eval_batch_size),
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
) -> Task:
    splits = load_digits(
        image_size=image_size, interpolation=interpolation, val_fraction=val_fraction,
        test_fraction=test_fraction, split_seed=split_seed,
    )  # fmt: skip
    data = _PerDevice(tuple(t for split in splits for t in split))
    return Task(
        "digits", "cnn", (1, image_size, image_size), 10,
        partial(CNNHost, 1, image_size, tuple(channels), 10),
        partial(_tensor_loaders, data, batch_size, max_batches, val_max_batches, None, None),
    )  # fmt: skip


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


#: Preset name -> task factory (keyword arguments only; unknown keywords raise TypeError).
PRESETS: dict[str, Callable[..., Task]] = {
    "mnist1d": mnist1d_task,
    "digits": digits_task,
    "stdlib_text": stdlib_text_task,
    "cifar10": cifar10_task,
    "tinystories": tinystories_task,
}


def make_task(name: str, **kwargs) -> Task:
    """Build preset ``name`` with keyword overrides, e.g. ``make_task("cifar10", path="/data/c10")``."""
    if name not in PRESETS:
        raise ValueError(f"unknown task {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name](**kwargs)


__all__ = [
    "CIFAR_MEAN",
    "CIFAR_STD",
    "MNIST1D_SPLITS",
    "PRESETS",
    "ImageTransform",
    "Loaders",
    "Task",
    "TensorBatches",
    "WindowBatches",
    "cifar10_task",
    "digits_csv_path",
    "digits_task",
    "load_cifar10",
    "load_digits",
    "load_mnist1d",
    "load_text_file",
    "make_task",
    "mnist1d_task",
    "random_crop_flip",
    "split_bytes",
    "stdlib_source_bytes",
    "stdlib_text_task",
    "tinystories_task",
]
