"""esper/shell/data/cache.py: a generated draw is kept on disk and served back bit for bit; a bad file
is made again, an unwritable folder or a cache turned off only costs the generation."""

from __future__ import annotations

import mnist1d.data
import pytest
import torch

from esper.shell.data.cache import ENV, cache_dir, cached_tensors, digest
from esper.shell.data.datasets import _mnist1d_draw, load_mnist1d


def _maker(calls: list[int]):
    def make() -> dict[str, torch.Tensor]:
        calls.append(1)
        return {"x": torch.arange(12, dtype=torch.float32).reshape(3, 4), "y": torch.tensor([1, 2, 3])}

    return make


def test_a_cached_mnist1d_draw_is_the_generated_one_and_the_generator_is_not_run_again(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, "off")
    _mnist1d_draw.cache_clear()
    generated = load_mnist1d(splits=(100, 20, 20), seed=11)
    monkeypatch.setenv(ENV, str(tmp_path))
    _mnist1d_draw.cache_clear()
    first = load_mnist1d(splits=(100, 20, 20), seed=11)  # generated, and kept
    (kept,) = tmp_path.iterdir()
    assert kept.name.startswith("mnist1d-") and kept.name.endswith("-n140-seed11.pt")

    def no_generator(*a, **k):
        raise AssertionError("the cached draw was generated again")

    monkeypatch.setattr(mnist1d.data, "make_dataset", no_generator)
    _mnist1d_draw.cache_clear()
    second = load_mnist1d(splits=(100, 20, 20), seed=11)  # read back from the file
    for a, b, c in zip(generated, first, second):
        for gen, t1, t2 in zip(a, b, c):
            assert gen.dtype == t2.dtype and torch.equal(gen, t1) and torch.equal(gen, t2)
    _mnist1d_draw.cache_clear()
    with pytest.raises(AssertionError, match="generated again"):  # another draw is another key
        load_mnist1d(splits=(100, 20, 20), seed=12)


@pytest.mark.parametrize("damage", ["truncated", "tampered", "foreign"])
def test_a_damaged_cache_file_is_made_again_and_rewritten(tmp_path, monkeypatch, damage):
    monkeypatch.setenv(ENV, str(tmp_path))
    calls: list[int] = []
    made = cached_tensors("k", _maker(calls))
    path = tmp_path / "k.pt"
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:50])
    elif damage == "tampered":  # a whole file whose tensors no longer match their digest
        blob = torch.load(path, weights_only=True)
        blob["tensors"]["x"][0, 0] = 99.0
        torch.save(blob, path)
    else:
        torch.save({"x": torch.zeros(3)}, path)
    again = cached_tensors("k", _maker(calls))
    assert len(calls) == 2 and all(torch.equal(made[k], again[k]) for k in made)
    cached_tensors("k", _maker(calls))  # the rewritten file serves the next call
    assert len(calls) == 2
    assert torch.load(path, weights_only=True)["sha256"] == digest(made)


def test_an_unwritable_cache_folder_or_a_cache_turned_off_still_gives_the_data(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(ENV, str(blocker / "cache"))  # mkdir fails under a file
    calls: list[int] = []
    for _ in range(2):
        assert torch.equal(cached_tensors("k", _maker(calls))["y"], torch.tensor([1, 2, 3]))
    assert len(calls) == 2 and list(tmp_path.iterdir()) == [blocker]
    for off in ("off", "0", ""):
        monkeypatch.setenv(ENV, off)
        assert cache_dir() is None
        cached_tensors("k", _maker(calls))
    assert len(calls) == 5


def test_the_cache_folder_follows_the_environment_and_keys_are_file_names(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "esper"
    monkeypatch.setenv(ENV, str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv(ENV)
    monkeypatch.delenv("XDG_CACHE_HOME")

    def homeless():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr("esper.shell.data.cache.Path.home", homeless)
    assert cache_dir() is None
    for bad in ("", "../up", "a/b", "sp ace"):
        with pytest.raises(ValueError, match="cache key"):
            cached_tensors(bad, _maker([]))
