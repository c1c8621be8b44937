from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from esper.core.spec import Stage
from esper.shell.common import checkpoint as ckpt
from esper.shell.common.checkpoint import (
    CHECKPOINT_VERSION,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def _touch(path: str) -> None:  # what the malicious pickle would run
    Path(path).write_text("pwned")


class Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (_touch, (self.marker,))


def _trained():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(6, 4)).pow(2).mean().backward()
        opt.step()
    return model, opt


def _assert_equal(a, b, where="payload"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        torch.testing.assert_close(b, a, rtol=0, atol=0, equal_nan=True, msg=where)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_equal(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def test_round_trip_restores_tensors_and_rng_streams(tmp_path):
    model, opt = _trained()
    random.seed(3)
    np.random.seed(4)  # noqa: NPY002
    torch.manual_seed(5)
    np.random.standard_normal()  # leaves a cached gaussian in numpy's state  # noqa: NPY002
    payload = {
        "policy": model.state_dict(),
        "optimizer": opt.state_dict(),
        "normalizer": {"obs": {"mean": torch.randn(5, dtype=torch.float64), "count": torch.tensor(7.0)}},
        "config": {"ppo": {"lr": 3e-4, "target_kl": None, "heads": ("op", "slot")}, "seed": 42, "amp": False},
        "generator": torch.Generator().manual_seed(9).get_state(),
        "updates": 12,
        "rng": rng_state(),
    }
    path = save_checkpoint(tmp_path / "ckpt" / "last.pt", payload)
    expected = (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3))  # noqa: NPY002

    random.seed(0)
    np.random.seed(0)  # noqa: NPY002
    torch.manual_seed(0)
    loaded = load_checkpoint(path)
    _assert_equal(payload, loaded)
    set_rng_state(loaded["rng"])
    got = (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3))  # noqa: NPY002
    assert got[0] == expected[0] and got[1] == expected[1]
    torch.testing.assert_close(got[2], expected[2], rtol=0, atol=0)

    # the loaded state dicts load back into fresh objects
    model2, opt2 = _trained()
    model2.load_state_dict(loaded["policy"])
    opt2.load_state_dict(loaded["optimizer"])
    for p, q in zip(model.parameters(), model2.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert list(path.parent.iterdir()) == [path]  # no temp files left behind


def test_P7_pickle_payload_is_refused(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    torch.save({"version": CHECKPOINT_VERSION, "policy": {}, "extra": Evil(str(marker))}, path)
    with pytest.raises(ValueError, match="evil.pt") as err:
        load_checkpoint(path)
    assert "weights_only" in str(err.value) and "_touch" in str(err.value)  # the refused global named
    assert not marker.exists()  # nothing was executed
    # the file really is malicious: a plain torch.load (weights_only=False) runs the payload
    torch.load(path, weights_only=False)
    assert marker.read_text() == "pwned"
    # and save_checkpoint never writes such a file in the first place
    with pytest.raises(TypeError, match=r"payload\['extra'\]"):
        save_checkpoint(tmp_path / "x.pt", {"extra": Evil(str(marker))})
    with pytest.raises(TypeError, match="numpy"):
        save_checkpoint(tmp_path / "x.pt", {"a": {"b": [np.zeros(2)]}})
    with pytest.raises(TypeError, match="Stage"):
        save_checkpoint(tmp_path / "x.pt", {"stage": Stage.TRAINING})  # an IntEnum pickles by class
    assert not (tmp_path / "x.pt").exists()


def test_failed_write_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"updates": 1, "w": torch.ones(3)})
    before = path.read_bytes()
    real_save = torch.save

    def crashing_save(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 partial output")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crashing_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, {"updates": 2, "w": torch.zeros(3)})
    monkeypatch.setattr(torch, "save", real_save)
    assert path.read_bytes() == before
    assert load_checkpoint(path)["updates"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # temp file cleaned up


def test_missing_file_and_version_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope.pt"
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        load_checkpoint(missing)
    for version, what in ((CHECKPOINT_VERSION + 1, "newer"), (0, "older")):
        p = tmp_path / f"v{version}.pt"
        torch.save({"version": version, "w": torch.ones(1)}, p)
        with pytest.raises(ValueError, match=f"v{version}.pt.*{what}"):
            load_checkpoint(p)
    p = tmp_path / "noversion.pt"
    torch.save({"w": torch.ones(1)}, p)
    with pytest.raises(ValueError, match="noversion.pt.*no 'version'"):
        load_checkpoint(p)
    p = tmp_path / "garbage.pt"
    p.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="garbage.pt.*not a torch checkpoint"):
        load_checkpoint(p)
    good = save_checkpoint(tmp_path / "good.pt", {"w": torch.ones(1000)})
    p = tmp_path / "truncated.pt"
    p.write_bytes(good.read_bytes()[:2000])
    with pytest.raises(ValueError, match="truncated.pt"):
        load_checkpoint(p)
    with pytest.raises(ValueError, match="reserved"):
        save_checkpoint(tmp_path / "v.pt", {"version": 3})


def test_rng_state_is_accepted_by_weights_only(tmp_path):
    state = rng_state()
    assert set(state) >= {"python", "numpy", "torch"}
    ckpt._check_loadable(state, "rng")  # plain data only
    path = save_checkpoint(tmp_path / "r.pt", {"rng": state})
    _assert_equal(state, load_checkpoint(path)["rng"])


# ------------------------------------------------------------------------------- integrity (issue 10)
def test_a_flipped_byte_anywhere_is_refused_in_one_line(tmp_path):
    """The header holds the SHA-256 of the serialized payload: a flipped byte anywhere (header, zip
    structure, pickle, tensor storage) is refused, never loaded as damaged weights."""
    model, opt = _trained()
    path = save_checkpoint(tmp_path / "c.pt", {"policy": model.state_dict(), "optimizer": opt.state_dict()})
    raw = path.read_bytes()
    assert raw.startswith(f"ESPER-CHECKPOINT {CHECKPOINT_VERSION} sha256=".encode())
    rng = random.Random(0)
    positions = sorted({0, 20, len(raw) // 2, len(raw) - 1, *(rng.randrange(len(raw)) for _ in range(60))})
    bad = tmp_path / "bad.pt"
    for i in positions:
        flipped = bytearray(raw)
        flipped[i] ^= 1 << rng.randrange(8)
        bad.write_bytes(bytes(flipped))
        with pytest.raises(ValueError, match="bad.pt") as err:
            load_checkpoint(bad)
        assert "\n" not in str(err.value), i
    many = bytearray(raw)  # the case: 400 bytes flipped across the file
    for i in rng.sample(range(len(raw)), 400):
        many[i] ^= 0xFF
    bad.write_bytes(bytes(many))
    with pytest.raises(ValueError, match="bad.pt"):
        load_checkpoint(bad)
    assert load_checkpoint(path).keys() == {"policy", "optimizer"}  # the intact file still loads


def test_version_1_checkpoints_still_load_unverified(tmp_path):
    p = tmp_path / "v1.pt"
    torch.save({"version": 1, "w": torch.ones(2)}, p)
    with pytest.warns(UserWarning, match="no integrity hash"):
        assert torch.equal(load_checkpoint(p)["w"], torch.ones(2))


def write_version_2(path: Path, payload: dict) -> Path:
    """``payload`` written as version 2 wrote it: the header (version 2) and hash, then the bytes."""
    import hashlib
    import io

    body = io.BytesIO()
    torch.save(dict(payload), body)
    data = body.getvalue()
    path.write_bytes(f"ESPER-CHECKPOINT 2 sha256={hashlib.sha256(data).hexdigest()}\n".encode() + data)
    return path


def test_the_trainer_entry_of_versions_1_and_2_loads_as_agent_and_learner(tmp_path):
    """Versions 1 and 2 held a run's policy, observation statistics and training state in one
    ``trainer`` entry; they load as version 3's ``agent`` (policy, obs_stats) and ``learner`` (the rest),
    the other entries as they were. A payload without ``trainer`` is left alone."""
    model, opt = _trained()
    trainer = {"policy": model.state_dict(), "optimizer": opt.state_dict(),
               "obs_stats": {"count": torch.ones(())}, "updates": 4, "replay": []}  # fmt: skip
    old = {"trainer": trainer, "progress": {"update": 4}}
    v2 = write_version_2(tmp_path / "v2.pt", old)
    v1 = tmp_path / "v1.pt"
    torch.save({"version": 1, **old}, v1)
    with pytest.warns(UserWarning, match="no integrity hash"):
        loaded = [load_checkpoint(v2), load_checkpoint(v1)]
    for got in loaded:
        assert got.keys() == {"agent", "learner", "progress"}
        assert got["agent"].keys() == {"policy", "obs_stats"}
        assert got["learner"].keys() == {"optimizer", "updates", "replay"}
        _assert_equal(got["agent"]["policy"], model.state_dict())
        _assert_equal(got["learner"]["optimizer"], opt.state_dict())
        assert got["progress"] == {"update": 4}
    assert load_checkpoint(write_version_2(tmp_path / "plain.pt", {"w": torch.ones(2)})).keys() == {"w"}
    new = save_checkpoint(tmp_path / "v3.pt", {"trainer": {"policy": {}}})  # version 3 is never rewritten
    assert load_checkpoint(new).keys() == {"trainer"}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_checkpoint_is_never_written_with_nonfinite_tensors(tmp_path, bad):
    path = save_checkpoint(tmp_path / "c.pt", {"w": torch.ones(3)})
    before = path.read_bytes()
    w = torch.ones(2, 3)
    w[1, 2] = bad
    with pytest.raises(FloatingPointError, match=r"payload\['agent'\]\['policy'\]\['w'\] holds NaN or Inf"):
        save_checkpoint(path, {"agent": {"policy": {"w": w, "b": torch.zeros(2)}}, "n": torch.tensor(3)})
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


def test_disk_full_mid_write_leaves_the_previous_checkpoint_and_no_temporary(tmp_path, monkeypatch):
    """A full disk fails the write with OSError(ENOSPC) part-way through the file (the old format
    failed inside torch.save with a RuntimeError from inline_container.cc)."""
    import errno

    path = save_checkpoint(tmp_path / "c.pt", {"w": torch.ones(3)})
    before = path.read_bytes()

    def full(f, data):
        f.write(bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "_write_all", full)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(path, {"w": torch.zeros(3)})
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


def test_stale_temporaries_of_a_killed_writer_are_removed(tmp_path):
    path = save_checkpoint(tmp_path / "checkpoint.pt", {"w": torch.ones(3)})
    stale = tmp_path / ".checkpoint.pt.abc123.tmp"
    stale.write_bytes(b"half a checkpoint")
    other = tmp_path / ".other.pt.x.tmp"
    other.write_bytes(b"not ours")
    assert ckpt.remove_stale_temporaries(path) == [stale]
    assert not stale.exists() and other.exists() and path.exists()
