"""Console output of a run: the progress bar on stderr and the plain-text summary table."""

from __future__ import annotations

import enum
import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm import tqdm


def progress(total: int | None, desc: str, enabled: bool = True):
    """A tqdm progress bar on stderr (a no-op bar when not ``enabled``); use as a context manager and
    call ``.update(n)`` / ``.set_postfix(...)``."""
    return tqdm(total=total, desc=desc, disable=not enabled, file=sys.stderr, dynamic_ncols=True)


def summary_table(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *, float_fmt: str = ".4g"
) -> str:
    """Plain-text table of ``rows`` restricted to ``columns``: numbers right-aligned (floats with
    ``float_fmt``), text left-aligned, a missing value shown as ``-``."""

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return format(v, float_fmt) if math.isfinite(v) else str(v)
        if isinstance(v, enum.Enum):
            return v.name
        return str(v)

    body = [[cell(row[c]) if c in row else "-" for c in columns] for row in rows]
    numeric = [
        all(
            isinstance(row.get(c), (int, float)) and not isinstance(row.get(c), bool)
            for row in rows
            if c in row
        )
        and any(c in row for row in rows)
        for c in columns
    ]
    widths = [max([len(c)] + [len(r[i]) for r in body]) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        parts = [x.rjust(w) if num else x.ljust(w) for x, w, num in zip(cells, widths, numeric)]
        return "  ".join(parts).rstrip()

    out = [line(list(columns)), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in body)
    return "\n".join(out)


__all__ = ["progress", "summary_table"]
