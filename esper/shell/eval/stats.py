"""Small, dependency-free statistics for evaluation reports: Student-t confidence intervals of a mean,
Spearman rank correlation, and the mean of group means (for results over several training seeds).

Kept in plain Python/NumPy on purpose (no SciPy dependency); each function is tested against a
closed form or a textbook value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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


__all__ = ["grouped_mean_ci95", "mean_ci95", "spearman", "t_quantile_975"]
