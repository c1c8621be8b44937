"""The code's git revision and the machine that ran it, as training runs (``provenance.json``) and
evaluations (``results.json``'s meta) record them."""

from __future__ import annotations

import os
import platform
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


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; elsewhere what the platform says, or "unknown")."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> str:
    """One line naming the machine: its CPU model and core count (``AMD EPYC 7B13, 2 cores``)."""
    return f"{cpu_model()}, {os.cpu_count()} cores"


__all__ = ["cpu_model", "git_revision", "machine"]
