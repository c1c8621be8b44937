"""The code's git revision, as training runs (``provenance.json``) and evaluations (``results.json``'s
meta) record it."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_revision() -> str | None:
    """The full hash of the checkout this package runs from, or None outside git (an installed wheel)."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return rev or None


__all__ = ["git_revision"]
