"""The datasets: embedded (generated or shipped with an installed package) and local files, loaded
whole into tensors; nothing is ever downloaded.

Every task has three splits: **train** (the host trains on it), **validation** (what the controller
sees: accuracy, loss, counterfactuals) and **test** (seen by neither; only reported, at the end of an
episode). :meth:`Task.make_loaders` returns them as :class:`Loaders`.

- ``mnist1d`` (the default): MNIST-1D, generated procedurally by the ``mnist1d`` package (no download,
  deterministic for a seed; 3-7 s, then read from the disk cache, :mod:`esper.shell.data.cache`):
  6,000 1-D signals of length 40, 10 classes, split 4,000 / 1,000 / 1,000 in generation order (the
  package shuffles). Standardized by the package. ``mnist1d_deep`` draws the same data for a deeper
  host.
- ``longrange``: generated here from a seed (:func:`load_longrange`): noise with two pulses far apart,
  the class whether they point the same way; 6,000 signals of length 64, split 4,000 / 1,000 / 1,000.
- ``digits``: scikit-learn's bundled handwritten digits (1797 8×8 grayscale images, 10 classes), read
  from the csv.gz inside the installed package without importing sklearn. Scaled to [0, 1],
  normalized with the train split's mean/std, optionally resized; split 70/15/15 by a fixed permutation.
  A fixed dataset: its test split is the only held-out draw. ``digits_shallow`` reads the same images,
  resized larger, for a shallow host.
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

import functools
import gzip
import importlib.util
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from esper.shell.data.batches import Batch
from esper.shell.data.cache import cached_tensors

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
    generating the data leaves the caller's random streams untouched. A draw is generated once per
    machine (3-7 s for the default's 6,000 samples on the 2-core VM), then read from the disk cache
    (:mod:`esper.shell.data.cache`; ``ESPER_CACHE_DIR=off`` turns it off) and kept per process; each
    call gets its own copy."""
    if len(splits) != 3 or min(splits) < 10:
        raise ValueError(f"MNIST-1D splits: three sizes >= 10 (train, val, test), got {splits}")
    x, y = _mnist1d_draw(sum(splits), seed)
    x, y = x.clone(), y.clone()
    a, b = splits[0], splits[0] + splits[1]
    return (x[:a], y[:a]), (x[a:b], y[a:b]), (x[b : b + splits[2]], y[b : b + splits[2]])


@functools.lru_cache(maxsize=4)
def _mnist1d_draw(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` MNIST-1D samples of draw ``seed``: ``x float32 [n, 1, 40]``, ``y int64 [n]`` (kept per
    process, and on disk per machine by :mod:`esper.shell.data.cache`; never handed out without a
    copy)."""
    from importlib.metadata import PackageNotFoundError, version

    try:  # the versions only (a cache hit imports neither package: mnist1d imports matplotlib)
        versions = f"{version('mnist1d')}-np{np.__version__}-scipy{version('scipy')}"
    except PackageNotFoundError as e:  # a dependency of esper; only a broken install gets here
        raise ImportError("the mnist1d task needs the `mnist1d` package: pip install mnist1d") from e

    def make() -> dict[str, torch.Tensor]:
        import random

        from mnist1d.data import get_dataset_args, make_dataset

        args = get_dataset_args()
        args.num_samples = n
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
        return {"x": x, "y": y}

    # the key names what the samples depend on: the count, the seed and the code that computes them
    key = f"mnist1d-{versions}-n{n}-seed{seed}"
    data = cached_tensors(key, make)
    x, y = data["x"], data["y"]
    if len(y) < n:  # the package makes num_samples // 10 per class
        raise ValueError(f"mnist1d returned {len(y)} samples, fewer than the {n} asked for")
    return x, y


# --------------------------------------------------------------------------------------- long range
#: Retrieval split sizes: train, validation, test (the design screen's; generated at once, split in order).
RETRIEVAL_SPLITS = (4000, 1000, 2000)


def load_retrieval(
    splits: tuple[int, int, int] = RETRIEVAL_SPLITS, seed: int = 11, length: int = 64, items: int = 3,
    levels: int = 6, noise: float = 0.3,
) -> tuple[Batch, Batch, Batch]:  # fmt: skip
    """Does an item carry the query's value? Two channels of noise (std ``noise``): channel 0 holds
    ``items`` one-position pulses of heights ``1 + v`` at distinct random positions, channel 1 one query
    pulse of height ``1 + q`` elsewhere (``v, q`` in ``range(levels)``, the items' values distinct); the
    class is whether some item's value is ``q`` (balanced: drawn first, the items built to match). What
    each channel holds is a histogram a global average keeps, but the class is their product (is the
    query's level among the items' levels), which a linear read-out of averaged features cannot form:
    a seed must relate the two channels across the whole length. ``x float32 [n, 2, length]``."""
    g = torch.Generator().manual_seed(seed)
    n = sum(splits)
    x = noise * torch.randn(n, 2, length, generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    q = torch.randint(0, levels, (n,), generator=g)
    for i in range(n):
        others = torch.tensor([v for v in range(levels) if v != q[i]])
        vals = others[torch.randperm(len(others), generator=g)[:items]]
        if y[i]:
            vals[torch.randint(0, items, (1,), generator=g)] = q[i]
        pos = torch.randperm(length, generator=g)[: items + 1]
        x[i, 0, pos[:items]] += 1.0 + vals.float()
        x[i, 1, pos[items]] += 1.0 + q[i].float()
    a, b = splits[0], splits[0] + splits[1]
    return (x[:a], y[:a]), (x[a:b], y[a:b]), (x[b:], y[b:])


#: In-context recall split sizes: train, validation, test (generated in one call, split in order).
RECALL_SPLITS = (4096, 1024, 1024)
#: In-context recall's vocabulary and sequence length.
RECALL_VOCAB, RECALL_LENGTH = 16, 32


def load_recall(
    splits: tuple[int, int, int] = RECALL_SPLITS, seed: int = 13, vocab: int = RECALL_VOCAB,
    length: int = RECALL_LENGTH,
    k_range: tuple[int, int] = (4, 10),
) -> tuple[Batch, Batch, Batch]:  # fmt: skip
    """In-context recall: each sequence repeats a prefix of ``k`` distinct tokens (``k`` uniform in
    ``k_range`` per sequence, the tokens drawn from ``range(vocab)``) to ``length`` positions, and each
    target is the next token. After the first ``k`` positions every next token is the one that followed
    the current token's earlier occurrence: an induction head's lookup (the previous token written into
    each position, then the current token matched against it), which only a step that mixes positions
    can make; given the previous token in its input (the ``recall`` task's host), one attention step
    does. ``(x, y)`` int64 ``[n, length]`` per split."""
    lo, hi = k_range
    if not 1 <= lo <= hi <= min(vocab, length):
        raise ValueError(f"recall: need 1 <= k_range[0] <= k_range[1] <= min(vocab, length), got {k_range}, "
                         f"vocab {vocab}, length {length}")  # fmt: skip
    if len(splits) != 3 or min(splits) < 1:
        raise ValueError(f"recall splits: three sizes >= 1 (train, val, test), got {splits}")
    g = torch.Generator().manual_seed(seed)
    n = sum(splits)
    seq = torch.empty(n, length + 1, dtype=torch.long)
    for i in range(n):
        k = int(torch.randint(lo, hi + 1, (1,), generator=g))
        seq[i] = torch.randperm(vocab, generator=g)[:k][torch.arange(length + 1) % k]
    x, y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    a, b = splits[0], splits[0] + splits[1]
    return (x[:a], y[:a]), (x[a:b], y[a:b]), (x[b:], y[b:])


#: Long-range split sizes: train, validation, test (generated in one call, split in order).
LONGRANGE_SPLITS = (4000, 1000, 1000)


def load_longrange(
    *,
    splits: tuple[int, int, int] = LONGRANGE_SPLITS,
    seed: int = 7,
    length: int = 64,
    edge: int = 12,
    width: int = 3,
    amplitude: float = 3.0,
    noise: float = 1.0,
) -> tuple[Batch, Batch, Batch]:
    """Two pulses far apart, and whether they point the same way: ``(train, val, test)``, each
    ``(x float32 [N, 1, length], y int64 [N])``, generated from ``seed`` (a ``torch.Generator``; no
    download, milliseconds).

    Each signal is Gaussian noise (std ``noise``) with two pulses of ``width`` positions and height
    ``±amplitude``: one starts in the first ``edge`` positions, the other ends in the last ``edge``, so
    they are at least ``length - 2 * edge`` positions apart. The class is 1 when both pulses have the
    same sign, 0 when they differ (a balanced XOR). Each pulse alone says nothing about the class, so
    a host that sums local features over the length (pointwise or short convolutions, then a global
    average) cannot solve it; a seed that mixes the whole length (self-attention over positions, a
    squeeze-excite gate from the global mean, a GroupNorm's per-signal statistics) can."""
    if len(splits) != 3 or min(splits) < 10:
        raise ValueError(f"long-range splits: three sizes >= 10 (train, val, test), got {splits}")
    if not 1 <= width <= edge or 2 * edge > length:
        raise ValueError(f"long-range: need 1 <= width <= edge and 2 * edge <= length, got width {width}, "
                         f"edge {edge}, length {length}")  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    n = sum(splits)
    x = noise * torch.randn(n, 1, length, generator=g)
    signs = torch.randint(0, 2, (n, 2), generator=g) * 2 - 1
    first = torch.randint(0, edge - width + 1, (n,), generator=g)
    second = torch.randint(length - edge, length - width + 1, (n,), generator=g)
    pos = torch.arange(length)
    for start, sign in ((first, signs[:, 0]), (second, signs[:, 1])):
        inside = (pos >= start[:, None]) & (pos < start[:, None] + width)  # [N, L]
        x[:, 0] += amplitude * sign[:, None].float() * inside
    y = (signs[:, 0] == signs[:, 1]).long()
    a, b = splits[0], splits[0] + splits[1]
    return (x[:a], y[:a]), (x[a:b], y[a:b]), (x[b:], y[b:])


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


__all__ = [
    "CIFAR_MEAN",
    "CIFAR_STD",
    "LONGRANGE_SPLITS",
    "MNIST1D_SPLITS",
    "RECALL_LENGTH",
    "RECALL_SPLITS",
    "RECALL_VOCAB",
    "RETRIEVAL_SPLITS",
    "ImageTransform",
    "digits_csv_path",
    "load_cifar10",
    "load_digits",
    "load_longrange",
    "load_mnist1d",
    "load_recall",
    "load_retrieval",
    "load_text_file",
    "random_crop_flip",
    "split_bytes",
    "stdlib_source_bytes",
]
