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


def test_the_t_distribution_matches_closed_forms_and_scipy():
    """df 1 is Cauchy and df 2 has a closed form; the table's quantiles come back; SciPy agrees where
    it is installed."""
    from esper.shell.eval.stats import t_quantile, t_sf

    for t in (-3.0, -0.5, 0.0, 0.7, 12.0):
        assert t_sf(t, 1) == pytest.approx(0.5 - math.atan(t) / math.pi, abs=1e-12)
        assert t_sf(t, 2) == pytest.approx(0.5 - t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    assert t_sf(math.inf, 3) == 0.0 and t_sf(-math.inf, 3) == 1.0
    for df in (1, 4, 9, 30):
        assert t_quantile(0.975, df) == pytest.approx(t_quantile_975(df), abs=1e-3)
        assert t_quantile(0.025, df) == pytest.approx(-t_quantile_975(df), abs=1e-3)
    assert t_quantile(0.5, 7) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 4, 9, 19, 100):
        for t in (-40.0, -2.5, -0.1, 0.0, 1.3, 3.1, 25.0):
            assert t_sf(t, df) == pytest.approx(scipy_stats.t.sf(t, df), rel=1e-9, abs=1e-14)
        for p in (0.0005, 0.0125, 0.05, 0.4, 0.9, 0.99):
            assert t_quantile(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), rel=1e-8)


def test_paired_differences_pair_by_seed_and_refuse_unequal_rows():
    from esper.shell.eval.stats import paired_differences

    assert paired_differences([3.0, 5.0, 4.0], [1.0, 5.5, 2.0]) == [2.0, -0.5, 2.0]
    for a, b in (([1.0, 2.0], [1.0]), ([1.0, math.nan], [0.0, 0.0])):
        with pytest.raises(ValueError):
            paired_differences(a, b)


#: Ten paired differences, as ten training seeds give: mean 0.4, standard deviation 0.6 * sqrt(7 / 9).
DIFFS = [0.4 + 0.6 * z for z in (-1.5, -1.0, -0.5, 0.0, 0.0, 0.0, 0.0, 0.5, 1.0, 1.5)]


def test_one_sided_t_tests_and_intervals_by_hand_and_against_scipy():
    """mean 0.4, sd 0.6 * sqrt(7 / 9) over ten values: the one-sided tests and the interval at any
    level are Student's; 0.95 gives mean_ci95's; values that do not vary are decided by their mean."""
    from esper.shell.eval.stats import mean_interval, t_sf, t_test_greater, t_test_less

    sd = 0.6 * math.sqrt(7 / 9)
    se = sd / math.sqrt(10)
    assert t_test_greater(DIFFS) == pytest.approx(t_sf(0.4 / se, 9))
    assert t_test_greater(DIFFS, -0.5) == pytest.approx(t_sf(0.9 / se, 9))
    assert t_test_less(DIFFS, 1.0) == pytest.approx(t_sf(0.6 / se, 9))
    m, (lo, hi) = mean_interval(DIFFS, 0.95)
    ref_m, (ref_lo, ref_hi) = mean_ci95(DIFFS)
    assert (m, lo, hi) == pytest.approx((ref_m, ref_lo, ref_hi), abs=1e-3)
    assert t_test_greater([1.0, 1.0, 1.0]) == 0.0 and t_test_greater([0.0, 0.0]) == 1.0
    with pytest.raises(ValueError):
        t_test_greater([1.0])
    scipy_stats = pytest.importorskip("scipy.stats")
    ttest = scipy_stats.ttest_1samp
    assert t_test_greater(DIFFS) == pytest.approx(ttest(DIFFS, 0.0, alternative="greater").pvalue)
    assert t_test_less(DIFFS, 1.0) == pytest.approx(ttest(DIFFS, 1.0, alternative="less").pvalue)
    ref = scipy_stats.t.interval(0.8, 9, loc=0.4, scale=se)
    assert mean_interval(DIFFS, 0.8)[1] == pytest.approx(ref)


def test_tost_claims_equivalence_only_when_the_90_interval_lies_inside_the_margin():
    """TOST at alpha 0.05: its p-value is the larger of the two one-sided tests', and it is equivalent
    exactly when the 90 % interval is inside ±margin; a tight difference of 0.4 is equivalent within 1
    point, not within 0.5; a wide one is equivalent to nothing, whatever its mean."""
    from esper.shell.eval.stats import mean_interval, t_test_greater, t_test_less, tost_equivalent

    r = tost_equivalent(DIFFS, margin=1.0)
    assert r["p_lower"] == pytest.approx(t_test_greater(DIFFS, -1.0))
    assert r["p_upper"] == pytest.approx(t_test_less(DIFFS, 1.0))
    assert r["p"] == max(r["p_lower"], r["p_upper"]) and r["equivalent"]
    assert r["interval"] == pytest.approx(mean_interval(DIFFS, 0.90)[1])
    assert -1.0 < r["interval"][0] and r["interval"][1] < 1.0
    narrow = tost_equivalent(DIFFS, margin=0.5)
    assert not narrow["equivalent"] and narrow["interval"][1] > 0.5
    wide = tost_equivalent([-3.0, 3.0, -2.0, 2.0, 0.0], margin=1.0)
    assert wide["mean"] == 0.0 and not wide["equivalent"]
    with pytest.raises(ValueError):
        tost_equivalent(DIFFS, margin=0.0)
    scipy_stats = pytest.importorskip("scipy.stats")
    lower = scipy_stats.ttest_1samp(DIFFS, -1.0, alternative="greater").pvalue
    upper = scipy_stats.ttest_1samp(DIFFS, 1.0, alternative="less").pvalue
    assert r["p"] == pytest.approx(max(lower, upper))


def test_holm_adjusts_step_down_in_the_input_order_and_skips_what_was_not_tested():
    """By hand: sorted 0.005, 0.01, 0.03, 0.04 of four become 0.02, 0.03, 0.06, 0.06 (the last held up
    to the one before it); each test's level is alpha over the tests left at its step; a NaN (no test)
    counts in no step."""
    from esper.shell.eval.stats import holm

    h = holm([0.01, 0.04, 0.03, 0.005, math.nan], alpha=0.05)
    assert h["adjusted"][:4] == pytest.approx([0.03, 0.06, 0.06, 0.02]) and math.isnan(h["adjusted"][4])
    assert h["reject"] == [True, False, False, True, False]
    assert h["levels"][:4] == pytest.approx([0.05 / 3, 0.05 / 1, 0.05 / 2, 0.05 / 4])
    assert holm([0.04])["reject"] == [True] and holm([0.6, 0.7])["adjusted"] == [1.0, 1.0]
    assert holm([]) == {"adjusted": [], "reject": [], "levels": []}
    # Holm never rejects less than Bonferroni, nor more than the unadjusted tests
    ps = [0.001, 0.011, 0.02, 0.3, 0.012]
    bonferroni = [p * len(ps) <= 0.05 for p in ps]
    rejected = holm(ps)["reject"]
    assert all(r or not b for r, b in zip(rejected, bonferroni))
    assert all(p <= 0.05 for p, r in zip(ps, rejected) if r)
    with pytest.raises(ValueError):
        holm([1.5])
