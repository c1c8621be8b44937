from __future__ import annotations

import numpy as np
import pytest
import torch

from esper.shell.data.batches import TensorBatches, WindowBatches
from esper.shell.data.datasets import (
    CIFAR_RECORD,
    ImageTransform,
    load_cifar10,
    load_digits,
    load_text_file,
    random_crop_flip,
    split_bytes,
    stdlib_source_bytes,
)
from esper.shell.env.tasks import Task, make_task


# ---------------------------------------------------------------------------------------- fixtures
def _write_cifar(root, n_train: int = 3, n_test: int = 2, bad: str | None = None):
    """Fake binary batches: record k of file f has label (f + k) % 10, pixel (c, i, j) = (c*7 + i + j +
    f) % 256."""
    root.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    c, i, j = np.meshgrid(np.arange(3), np.arange(32), np.arange(32), indexing="ij")
    for f, name in enumerate(names):
        n = n_test if name == "test_batch.bin" else n_train
        image = ((c * 7 + i + j + f) % 256).astype(np.uint8).reshape(-1)
        records = [np.concatenate([[np.uint8((f + k) % 10)], image]) for k in range(n)]
        data = np.concatenate(records).astype(np.uint8).tobytes()
        if name == bad:
            data = data[:-5]
        (root / name).write_bytes(data)
    return root


# ------------------------------------------------------------------------------------------ digits
def test_digits_shapes_split_and_normalization():
    (tx, ty), (vx, vy), (sx, sy) = load_digits()
    assert tx.shape == (1257, 1, 8, 8) and vx.shape == (270, 1, 8, 8) and sx.shape == (270, 1, 8, 8)
    assert ty.dtype == torch.int64 and set(ty.tolist()) == set(range(10)) and vy.max() <= 9 and sy.max() <= 9
    assert abs(float(tx.mean())) < 1e-4 and abs(float(tx.std()) - 1) < 1e-3
    again = load_digits()
    for (x, y), (x2, y2) in zip(((tx, ty), (vx, vy), (sx, sy)), again):
        assert torch.equal(x, x2) and torch.equal(y, y2)  # deterministic split
    # the three splits are disjoint (no image appears in two of them)
    rows = [{tuple(r.tolist()) for r in x.flatten(1)} for x in (tx, vx, sx)]
    assert not (rows[0] & rows[2]) and not (rows[1] & rows[2]) and not (rows[0] & rows[1])
    (ux, _), (uvx, _), _ = load_digits(image_size=16, interpolation="nearest")
    assert ux.shape == (1257, 1, 16, 16) and uvx.shape == (270, 1, 16, 16)
    with pytest.raises(ValueError, match="sum < 1"):
        load_digits(val_fraction=0.5, test_fraction=0.5)


def test_digits_task_end_to_end():
    task = make_task("digits")
    assert isinstance(task, Task) and task.family == "cnn" and task.input_shape == (1, 16, 16)
    assert task.n_classes == 10
    host = task.make_host()
    train, val, test = task.make_loaders(0, device="cpu")
    assert len(train) == 1257 // 64 and len(val) == len(test) == -(-270 // 64)
    x, y = next(iter(train))
    assert x.shape == (64, 1, 16, 16) and y.shape == (64,)
    loss, correct, n = host.loss_and_correct((x, y))
    assert torch.isfinite(loss) and n == 64 and 0 <= int(correct) <= 64
    assert sum(len(b[1]) for b in val) == sum(len(b[1]) for b in test) == 270
    train2, _, _ = task.make_loaders(1)
    assert train2.generator is not train.generator
    assert not torch.equal(next(iter(train2))[1], next(iter(task.make_loaders(0).train))[1])


# -------------------------------------------------------------------------------------------- text
def test_stdlib_text_is_deterministic_and_split_by_position():
    data = stdlib_source_bytes(50_000)
    assert len(data) == 50_000 and data == stdlib_source_bytes(50_000)
    assert b"def " in data
    train, val, test = split_bytes(data, 0.1)
    assert train.dtype == torch.uint8 and len(train) == 45_000 and len(val) == len(test) == 2_500
    assert bytes(torch.cat([train, val, test]).tolist()) == data


def test_stdlib_text_task_batches():
    task = make_task("stdlib_text", max_bytes=100_000, ctx=32, batch_size=4, max_batches=5, d_model=32)
    assert task.family == "transformer" and task.input_shape == (32,) and task.n_classes == 256
    host = task.make_host()
    train, val, test = task.make_loaders(3)
    batches = list(train)
    assert len(batches) == len(train) == 5
    x, y = batches[0]
    assert x.shape == y.shape == (4, 32) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one byte
    loss, _, n = host.loss_and_correct((x, y))
    assert n == 128 and torch.isfinite(loss)
    assert len(val) == 8 and [torch.equal(a[0], b[0]) for a, b in zip(val, val)] == [True] * 8
    assert not torch.equal(next(iter(val))[0], next(iter(test))[0])  # different held-out bytes


def test_window_batches_read_the_stream():
    tokens = torch.arange(200, dtype=torch.uint8)
    seq = WindowBatches(tokens, ctx=10, batch_size=3, shuffle=False, drop_last=False)
    assert len(seq) == -(-19 // 3)  # (200 - 1) // 10 windows from offset 0
    xs = torch.cat([x for x, _ in seq])
    assert xs.shape == (19, 10) and torch.equal(xs[:, 0], torch.arange(0, 190, 10))
    shuf = WindowBatches(tokens, ctx=10, batch_size=3, seed=1)
    for x, y in shuf:
        assert torch.equal(x + 1, y) and torch.equal(x[:, 1:] - x[:, :1], torch.arange(1, 10).expand(3, -1))
    e1, e2 = [torch.cat([x for x, _ in shuf]) for _ in range(2)]
    assert not torch.equal(e1, e2)  # reshuffled (and re-offset) every epoch
    with pytest.raises(ValueError, match="no window"):
        WindowBatches(torch.zeros(5, dtype=torch.uint8), ctx=10, batch_size=1)


def test_tinystories_loader(tmp_path):
    text = ("Once upon a time there was a tiny story. " * 50).encode()
    path = tmp_path / "stories.txt"
    path.write_bytes(text)
    train, val, test = load_text_file(path, val_fraction=0.1)
    assert len(train) + len(val) + len(test) == len(text)
    assert bytes(torch.cat([val, test]).tolist()) == text[len(train) :]
    vpath = tmp_path / "valid.txt"
    vpath.write_bytes(b"The end. " * 20)
    train, val, test = load_text_file(path, val_path=vpath, max_bytes=500)
    assert len(train) == 500 and len(val) == len(test) == 90
    task = make_task("tinystories", path=path, ctx=16, batch_size=2, d_model=32, n_layers=2, n_heads=2)
    assert task.input_shape == (16,) and task.make_host().ctx == 16
    x, y = next(iter(task.make_loaders(0).train))
    assert x.shape == y.shape == (2, 16)


def test_text_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        load_text_file(missing)
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        make_task("tinystories", path=missing)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        load_text_file(empty)


# ------------------------------------------------------------------------------------------- CIFAR
def test_cifar10_loader_reads_binary_records(tmp_path):
    root = _write_cifar(tmp_path / "cifar-10-batches-bin")
    for where in (root, tmp_path):  # the folder itself, or its parent
        (tx, ty), (vx, vy), (sx, sy) = load_cifar10(where)
        assert tx.shape == (13, 3, 32, 32) and tx.dtype == torch.uint8 and vx.shape == (2, 3, 32, 32)
        assert sx.shape == (2, 3, 32, 32) and sy.tolist() == [5, 6]  # test: the test file, in order
        # train + val: a partition of the five training files' records. CHW layout: pixel (c, i, j) of
        # file f is (c*7 + i + j + f) % 256, so pixel (2, 4, 5) names the file and the label its record.
        images, labels = torch.cat([tx, vx]), torch.cat([ty, vy])
        records = sorted((int(x[2, 4, 5]) - 23, int(y)) for x, y in zip(images, labels))
        assert records == sorted((f, (f + k) % 10) for f in range(5) for k in range(3))
        assert int(sx[0, 1, 0, 31]) == 7 + 31 + 5


def test_cifar10_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_cifar10(tmp_path / "missing")
    root = _write_cifar(tmp_path / "c")
    (root / "data_batch_3.bin").unlink()
    (root / "test_batch.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"data_batch_3\.bin, test_batch\.bin"):
        load_cifar10(root)
    bad = _write_cifar(tmp_path / "b", bad="data_batch_2.bin")
    with pytest.raises(ValueError, match=f"multiple of {CIFAR_RECORD}"):
        load_cifar10(bad)
    with pytest.raises(TypeError, match="path"):
        make_task("cifar10")


def test_cifar10_task_and_augmentation(tmp_path):
    root = _write_cifar(tmp_path / "c", n_train=8, n_test=4)
    task = make_task("cifar10", path=root, batch_size=16)
    assert task.input_shape == (3, 32, 32)
    train, val, test = task.make_loaders(0)
    assert len(train) == 2 and len(val) == len(test) == 1
    x, y = next(iter(train))
    assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32
    _, (raw_val, _), (raw_test, _) = load_cifar10(root)
    for loader, raw in ((val, raw_val), (test, raw_test)):  # held out: normalized, not augmented
        torch.testing.assert_close(next(iter(loader))[0], ImageTransform()(raw, torch.Generator()))
    loss, _, _ = task.make_host().loss_and_correct((x, y))
    assert torch.isfinite(loss)


def test_random_crop_flip_is_a_shifted_or_flipped_crop():
    x = torch.randn(32, 3, 8, 8)
    out = random_crop_flip(x, torch.Generator().manual_seed(0), pad=2)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for n in range(32):
        crops = [
            padded[n, :, i : i + 8, j : j + 8].flip(-1) if f else padded[n, :, i : i + 8, j : j + 8]
            for i in range(5)
            for j in range(5)
            for f in (0, 1)
        ]
        assert any(torch.equal(out[n], c) for c in crops)
    same = random_crop_flip(x, torch.Generator().manual_seed(0), pad=0)
    flipped = torch.tensor([torch.equal(s, xi.flip(-1)) and not torch.equal(s, xi) for s, xi in zip(same, x)])
    assert 0 < int(flipped.sum()) < 32


# --------------------------------------------------------------------------------------- iterators
def test_tensor_batches_epochs():
    x, y = torch.arange(10).float()[:, None], torch.arange(10)
    it = TensorBatches(x, y, batch_size=3, seed=0)
    assert len(it) == 3
    e1 = torch.cat([b[1] for b in it])
    e2 = torch.cat([b[1] for b in it])
    assert len(e1) == 9 and len(set(e1.tolist())) == 9 and not torch.equal(e1, e2)
    again = torch.cat([b[1] for b in TensorBatches(x, y, batch_size=3, seed=0)])
    assert torch.equal(again, e1)  # the generator is the env's own: same seed, same order
    full = TensorBatches(x, y, batch_size=3, shuffle=False, drop_last=False)
    assert len(full) == 4 and torch.equal(torch.cat([b[1] for b in full]), y)
    capped = TensorBatches(x, y, batch_size=2, max_batches=2)
    assert len(list(capped)) == len(capped) == 2
    with pytest.raises(ValueError, match="same"):
        TensorBatches(x, y[:5], batch_size=2)


def test_make_task_rejects_unknown_names_and_keys():
    with pytest.raises(ValueError, match="digits"):
        make_task("mnist")
    with pytest.raises(TypeError, match="image_sise"):
        make_task("digits", image_sise=16)
