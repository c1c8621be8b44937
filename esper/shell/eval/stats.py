"""Small, dependency-free statistics for evaluation reports: Student-t confidence intervals of a mean,
Spearman rank correlation, the mean of group means (for results over several training seeds), and the
paired tests the suite's protocol judges by (issue 89): differences paired by training seed, one-sided
Student-t tests, the equivalence test TOST and Holm's step-down correction.

Kept in plain Python/NumPy on purpose (no SciPy dependency); each function is tested against a
closed form or a textbook value, and the t distribution against SciPy where it is installed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Two-sided 95 % Student-t quantiles t_{0.975, df} for df = 1..30 (textbook table).
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_quantile_975(df: int) -> float:
    """t_{0.975, df}: the table for df <= 30, then the Cornish-Fisher expansion around 1.95996 (error
    below 1e-3 for df > 30)."""
    if df < 1:
        raise ValueError(f"t_quantile_975: df must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959963984540054
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_ci95(values: Sequence[float]) -> tuple[float, tuple[float, float]]:
    """``(mean, (lo, hi))``: the Student-t 95 % confidence interval of the mean of ``values`` (i.i.d.
    assumed). One value gives a zero-width interval; NaN values are refused."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("mean_ci95: no values")
    if not np.isfinite(x).all():
        raise ValueError("mean_ci95: values must be finite")
    m = float(x.mean())
    if x.size == 1:
        return m, (m, m)
    half = t_quantile_975(x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return m, (m - half, m + half)


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their average rank."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(x.size, dtype=np.float64)
    sorted_x = x[order]
    i = 0
    while i < x.size:
        j = i
        while j + 1 < x.size and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i : j + 1]] = 0.5 * (i + j) + 1.0
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson's on average ranks, so ties are handled); NaN when either
    side is constant or there are fewer than 3 pairs."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"spearman: two 1-D sequences of one length, got {a.shape} and {b.shape}")
    if a.size < 3:
        return math.nan
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / denom) if denom > 0 else math.nan


def grouped_mean_ci95(groups: Sequence[Sequence[float]]) -> tuple[float, tuple[float, float]]:
    """Mean and 95 % CI over *groups* (for example one group of evaluation episodes per training seed):
    the t-interval of the group means, so the spread between training seeds, not only between
    episodes, sets the width. One group falls back to the episode-level interval."""
    groups = [g for g in groups if len(g)]
    if not groups:
        raise ValueError("grouped_mean_ci95: no values")
    if len(groups) == 1:
        return mean_ci95(groups[0])
    return mean_ci95([float(np.mean(g)) for g in groups])


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        even = m * (b - m) * x / ((qam + m2) * (a + m2))
        odd = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        for num in (even, odd):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (the upper tail; ``t`` may be infinite)."""
    if df <= 0:
        raise ValueError(f"t_sf: df must be > 0, got {df}")
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))  # P(T > |t|)
    return tail if t >= 0 else 1.0 - tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``0 < p < 1``), by bisection on
    :func:`t_sf` to 1e-10."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while 1.0 - t_sf(hi, df) < p:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-10 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if 1.0 - t_sf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


def paired_differences(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """``a[k] - b[k]`` for each k: two rows' per-training-seed values paired by seed (both in the same
    training seed order; refused where their lengths differ or a value is not finite)."""
    if len(a) != len(b):
        raise ValueError(f"paired_differences: {len(a)} values against {len(b)}: pair them by seed")
    d = [float(x) - float(y) for x, y in zip(a, b)]
    if not all(math.isfinite(x) for x in d):
        raise ValueError("paired_differences: values must be finite")
    return d


def _moments(values: Sequence[float]) -> tuple[float, float, int]:
    """``(mean, standard error, n)`` of at least two finite values."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        raise ValueError(f"a paired test needs at least 2 values, got {x.size}")
    if not np.isfinite(x).all():
        raise ValueError("values must be finite")
    return float(x.mean()), float(x.std(ddof=1)) / math.sqrt(x.size), int(x.size)


def mean_interval(values: Sequence[float], level: float) -> tuple[float, tuple[float, float]]:
    """``(mean, (lo, hi))``: the two-sided Student-t interval of the mean at confidence ``level`` (0.95
    gives :func:`mean_ci95`'s, to its table's rounding). Its lower end is the one-sided lower bound at
    ``(1 + level) / 2``: the 90 % interval's lower end is the 95 % one-sided bound."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"mean_interval: level must be in (0, 1), got {level}")
    m, se, n = _moments(values)
    half = t_quantile(0.5 + level / 2.0, n - 1) * se
    return m, (m - half, m + half)


def t_test_greater(values: Sequence[float], null: float = 0.0) -> float:
    """The one-sided p-value of Student's t test of H0: mean <= ``null`` against H1: mean > ``null``. Values
    that do not vary give 0 where their mean is above ``null`` and 1 otherwise."""
    m, se, n = _moments(values)
    if se == 0.0:
        return 0.0 if m > null else 1.0
    return t_sf((m - null) / se, n - 1)


def t_test_less(values: Sequence[float], null: float = 0.0) -> float:
    """The one-sided p-value of H0: mean >= ``null`` against H1: mean < ``null`` (:func:`t_test_greater`
    mirrored)."""
    return t_test_greater([-float(v) for v in values], -null)


def tost_equivalent(diffs: Sequence[float], margin: float = 1.0, alpha: float = 0.05) -> dict[str, Any]:
    """The equivalence test TOST (two one-sided t tests) of paired differences within ``±margin``:
    H0: mean <= -margin or mean >= +margin, against H1: -margin < mean < +margin. Returns ``mean``,
    ``p_lower`` (H0: mean <= -margin), ``p_upper`` (H0: mean >= +margin), ``p`` (their larger: TOST's
    p-value), ``interval`` (the ``1 - 2 alpha`` two-sided t interval, 90 % at 0.05) and ``equivalent``
    (``p <= alpha``, which holds exactly when that interval lies inside ``(-margin, +margin)``)."""
    if margin <= 0 or not 0.0 < alpha < 0.5:
        raise ValueError(f"tost_equivalent: margin > 0 and 0 < alpha < 0.5, got {margin} and {alpha}")
    p_lower, p_upper = t_test_greater(diffs, -margin), t_test_less(diffs, margin)
    p = max(p_lower, p_upper)
    m, interval = mean_interval(diffs, 1.0 - 2.0 * alpha)
    return {"mean": m, "p_lower": p_lower, "p_upper": p_upper, "p": p, "interval": interval,
            "equivalent": p <= alpha}  # fmt: skip


def holm(pvalues: Sequence[float], alpha: float = 0.05) -> dict[str, list]:
    """Holm's step-down correction of ``m`` p-values (the family-wise error rate at ``alpha``). Returns, in
    the input's order: ``adjusted`` (``max over j <= i of min(1, (m - j + 1) p_(j))`` along the ascending
    order), ``reject`` (``adjusted <= alpha``), and ``levels``, each test's per-comparison level at its
    step, ``alpha / (m - i + 1)`` for the i-th smallest p-value: the level an interval shown beside a
    claim is drawn at (two-sided ``1 - 2 level`` for a one-sided claim). Holm's own intervals are not as
    simple (the step-down has no simultaneous interval of its own), so a claim is decided by its
    adjusted p-value; its step's interval excludes the null exactly when its unadjusted test at that
    level rejects, which agrees with the decision except where an earlier step stopped Holm's procedure.
    NaN p-values (a comparison that could not be made) are left out of ``m`` and come back NaN, unrejected."""
    p = [float(x) for x in pvalues]
    live = sorted((x, i) for i, x in enumerate(p) if not math.isnan(x))
    m = len(live)
    adjusted, levels = [math.nan] * len(p), [math.nan] * len(p)
    running = 0.0
    for step, (x, i) in enumerate(live):
        if not 0.0 <= x <= 1.0:
            raise ValueError(f"holm: p-values must be in [0, 1], got {x}")
        running = max(running, min(1.0, (m - step) * x))
        adjusted[i], levels[i] = running, alpha / (m - step)
    return {"adjusted": adjusted, "reject": [a <= alpha for a in adjusted], "levels": levels}


__all__ = [
    "grouped_mean_ci95", "holm", "mean_ci95", "mean_interval", "paired_differences", "spearman", "t_quantile",
    "t_quantile_975", "t_sf", "t_test_greater", "t_test_less", "tost_equivalent",
]  # fmt: skip
