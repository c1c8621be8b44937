"""bench.suite.blueprints_everywhere: the screen's variants and one screened host."""

import pytest
import torch

from bench.suite.blueprints_everywhere import load_retrieval, run, screened, variant


def test_retrieval_class_is_whether_an_item_carries_the_query_level():
    (tx, ty), (vx, vy), (sx, sy) = load_retrieval((300, 50, 60), seed=3, noise=0.0)
    assert tx.shape == (300, 2, 64) and len(vy) == 50 and len(sy) == 60
    x = torch.cat([tx, vx, sx])  # without noise: each pulse is its height 1 + level, zeros elsewhere
    y = torch.cat([ty, vy, sy])
    for xi, yi in zip(x, y):
        items = {int(v) for v in xi[0] if v >= 1}
        query = [int(v) for v in xi[1] if v >= 1]
        assert len(query) == 1 and len(items) == 3, "three distinct item levels, one query"
        assert (query[0] in items) == bool(yi)
    assert 0.4 < y.float().mean() < 0.6
    again = load_retrieval((300, 50, 60), seed=3, noise=0.0)[0]
    assert torch.equal(again[0], tx) and torch.equal(again[1], ty)


def test_variant_names_and_a_screened_host():
    data = variant("retrieval:40@5")
    assert data[1:] == (2, (4, 1, 1)) and len(data[0][0][1]) == 40 and len(data[0][2][1]) == 2000
    with pytest.raises(SystemExit, match="unknown variant"):
        variant("nope:10")
    with pytest.raises(SystemExit, match="KIND:N"):
        variant("retrieval:ten")
    acc, train_acc, added = run(((data[0][0], data[0][1], data[0][0]), 2, (4, 1, 1)), "norm", 0, 1)
    assert 0 <= acc <= 100 and 0 <= train_acc <= 100 and added > 0
    assert run(((data[0][0], data[0][1], data[0][0]), 2, (4, 1, 1)), "static", 0, 1)[2] == 0


def test_a_screen_can_take_a_subset_of_the_blueprints():
    assert screened("conv_light,static") == ("conv_light", "static")
    assert screened(None)[0] == "static" and "conv_heavy" in screened(None) and "noop" not in screened(None)
    with pytest.raises(SystemExit, match="unknown blueprints"):
        screened("conv_heavy,huge")
