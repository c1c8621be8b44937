from __future__ import annotations

import math

import pytest

from esper.shell.eval.stats import grouped_mean_ci95, mean_ci95, spearman, t_quantile_975


def test_t_quantiles_match_the_table_and_approach_the_normal():
    assert t_quantile_975(1) == 12.706 and t_quantile_975(4) == 2.776 and t_quantile_975(30) == 2.042
    assert t_quantile_975(40) == pytest.approx(2.021, abs=1e-3)  # textbook t_{0.975, 40}
    assert t_quantile_975(120) == pytest.approx(1.980, abs=1e-3)
    assert t_quantile_975(10**6) == pytest.approx(1.95996, abs=1e-4)
    with pytest.raises(ValueError):
        t_quantile_975(0)


def test_mean_ci95_is_the_student_t_interval():
    m, (lo, hi) = mean_ci95([1, 2, 3, 4, 5])
    half = 2.776 * math.sqrt(2.5) / math.sqrt(5)
    assert m == 3 and lo == pytest.approx(3 - half) and hi == pytest.approx(3 + half)
    assert mean_ci95([7.0]) == (7.0, (7.0, 7.0))
    for bad in ([], [1.0, float("nan")]):
        with pytest.raises(ValueError):
            mean_ci95(bad)


def test_spearman_handles_ties_and_degenerate_input():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(22.5))  # by hand
    assert spearman([1, 2, 3], [1, 4, 9]) == pytest.approx(1.0)  # ranks, not values
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3])) and math.isnan(spearman([1, 2], [1, 2]))
    with pytest.raises(ValueError):
        spearman([1, 2, 3], [1, 2])


def test_grouped_interval_is_over_group_means():
    groups = [[60.0, 62.0], [70.0, 72.0, 74.0], [65.0]]
    m, (lo, hi) = grouped_mean_ci95(groups)
    ref_m, (ref_lo, ref_hi) = mean_ci95([61.0, 72.0, 65.0])
    assert (m, lo, hi) == pytest.approx((ref_m, ref_lo, ref_hi))
    assert grouped_mean_ci95([[1.0, 3.0]]) == mean_ci95([1.0, 3.0])
