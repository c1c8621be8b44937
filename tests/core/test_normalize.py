"""Running statistics: exact and EMA merges against references, purity (finding H13)."""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from esper.core.normalize import normalize, running_stats, scale, update_running_stats


def ref_stats(batches):
    """Mean and population variance of every valid sample seen so far, by brute force."""
    xs = torch.cat([x[v] for x, v in batches]).double()
    if xs.shape[0] == 0:
        return None
    return xs.mean(0), xs.var(0, unbiased=False), xs.shape[0]


def ref_ema(batches, m):
    mean = var = None
    for x, v in batches:
        xs = x[v].double()
        if xs.shape[0] == 0:
            continue
        bm, bv = xs.mean(0), xs.var(0, unbiased=False)
        if mean is None:
            mean, var = bm, bv
        else:
            mean, var = m * mean + (1 - m) * bm, m * var + (1 - m) * bv + m * (1 - m) * (bm - mean) ** 2
    return mean, var


def test_running_stats_layout():
    s = running_stats((3, 2), dtype=torch.float32)
    assert s.batch_size == ()
    assert torch.equal(s["mean"], torch.zeros(3, 2)) and torch.equal(s["var"], torch.ones(3, 2))
    assert s["count"].dtype == torch.float64 and s["count"].shape == () and s["count"] == 0
    assert running_stats(4)["mean"].dtype == torch.float64


def test_exact_merge_matches_all_samples_at_once():
    g = torch.Generator().manual_seed(0)
    stats = running_stats((3,))
    batches = []
    for n in (5, 1, 17, 3):
        x = torch.randn(n, 2, 3, generator=g) * 4 + 1
        v = torch.rand(n, 2, generator=g) < 0.7
        stats = update_running_stats(stats, x, valid=v)
        batches.append((x.reshape(-1, 3), v.reshape(-1)))
        mean, var, count = ref_stats(batches)
        torch.testing.assert_close(stats["mean"], mean)
        torch.testing.assert_close(stats["var"], var)
        assert stats["count"] == count


@given(
    sizes=st.lists(st.integers(0, 6), min_size=1, max_size=5),
    p=st.sampled_from([0.0, 0.3, 1.0]),
    feat=st.lists(st.integers(1, 3), max_size=2),
    momentum=st.sampled_from([None, 0.0, 0.5, 0.9]),
    seed=st.integers(0, 2**16),
)
def test_update_matches_reference_hypothesis(sizes, p, feat, momentum, seed):
    g = torch.Generator().manual_seed(seed)
    stats = running_stats(tuple(feat))
    batches = []
    for n in sizes:
        x = torch.randn(n, *feat, generator=g, dtype=torch.float64) * 3
        v = torch.rand(n, generator=g) < p
        stats = update_running_stats(stats, x, valid=v, momentum=momentum)
        batches.append((x, v))
        assert torch.isfinite(stats["mean"]).all() and torch.isfinite(stats["var"]).all()
    assert stats["count"] == sum(int(v.sum()) for _, v in batches)
    if momentum is None:
        ref = ref_stats(batches)
        mean, var = (ref[0], ref[1]) if ref is not None else (torch.zeros(feat), torch.ones(feat))
    else:
        mean, var = ref_ema(batches, momentum)
        if mean is None:
            mean, var = torch.zeros(feat, dtype=torch.float64), torch.ones(feat, dtype=torch.float64)
    torch.testing.assert_close(stats["mean"], mean.double(), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(stats["var"], var.double(), rtol=1e-9, atol=1e-9)


def test_zero_count_takes_batch_stats_and_empty_batch_changes_nothing():
    x = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    s = update_running_stats(running_stats(2), x)
    torch.testing.assert_close(s["mean"], torch.tensor([2.0, 4.0], dtype=torch.float64))
    torch.testing.assert_close(s["var"], torch.tensor([1.0, 4.0], dtype=torch.float64))
    s2 = update_running_stats(s, x, valid=torch.zeros(2, dtype=torch.bool))
    for k in ("mean", "var", "count"):
        assert torch.equal(s2[k], s[k])
    empty = update_running_stats(running_stats(2), torch.zeros(0, 2))
    assert torch.equal(empty["mean"], torch.zeros(2, dtype=torch.float64)) and empty["count"] == 0


def test_normalize_and_scale():
    g = torch.Generator().manual_seed(1)
    stats = update_running_stats(running_stats(4), torch.randn(50, 4, generator=g) * 2 + 3)
    x = (torch.randn(7, 4, generator=g) * 2 + 3).half()
    mean, std = stats["mean"], (stats["var"] + 1e-8).sqrt()
    out = normalize(stats, x)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, ((x.double() - mean) / std).half())
    torch.testing.assert_close(scale(stats, x), (x.double() / std).clamp(-10, 10).half())
    big = torch.full((2, 4), 1e6)
    assert (normalize(stats, big, clip=5.0) == 5.0).all() and (scale(stats, -big, clip=3.0) == -3.0).all()
    assert (normalize(stats, big, clip=None) > 1e4).all()


def test_bad_inputs_name_what_is_wrong():
    s = running_stats(3)
    with pytest.raises(ValueError, match=r"x must .*\[3\].*\[4, 2\]"):
        update_running_stats(s, torch.randn(4, 2))
    with pytest.raises(ValueError, match=r"valid.*\[4\].*\[3\]"):
        update_running_stats(s, torch.randn(4, 3), valid=torch.ones(3, dtype=torch.bool))
    with pytest.raises(TypeError, match="valid"):
        update_running_stats(s, torch.randn(4, 3), valid=torch.ones(4))
    with pytest.raises(TypeError, match="'x'"):
        update_running_stats(s, torch.ones(4, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="momentum"):
        update_running_stats(s, torch.randn(4, 3), momentum=1.5)
    with pytest.raises(KeyError, match="'var'"):
        normalize(s.exclude("var"), torch.randn(3))
    with pytest.raises(ValueError, match=r"x must end with .*\[3\]"):
        scale(s, torch.randn(3, 2))
    with pytest.raises(ValueError, match="clip"):
        normalize(s, torch.randn(3), clip=0.0)


def test_H13_update_is_pure_and_thread_safe():
    g = torch.Generator().manual_seed(2)
    base = update_running_stats(running_stats((5,)), torch.randn(20, 5, generator=g))
    snapshot = base.clone()
    batches = [torch.randn(64, 5, generator=g) for _ in range(8)]
    expected = [update_running_stats(base, x) for x in batches]
    for k in ("mean", "var", "count"):
        assert torch.equal(base[k], snapshot[k])  # the input was never mutated
    assert all(e is not base for e in expected)

    results: list = [None] * len(batches)

    def work(i):
        for _ in range(20):  # many overlapping calls on the same input TensorDict
            results[i] = update_running_stats(base, batches[i])
            normalize(base, batches[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, exp in zip(results, expected):
        for k in ("mean", "var", "count"):
            assert torch.equal(got[k], exp[k])
    for k in ("mean", "var", "count"):
        assert torch.equal(base[k], snapshot[k])
