"""bench.suite.blueprints_everywhere: the screen's variants and one screened host."""

import pytest

from bench.suite.blueprints_everywhere import run, screened, variant


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
