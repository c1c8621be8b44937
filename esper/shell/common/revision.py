"""The code's git revision and the machine that ran it, as training runs (``provenance.json``),
evaluations (``results.json``'s meta) and results files (:func:`machine_info`) record them."""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
import subprocess
from pathlib import Path

import torch


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


def machine_info(device: torch.device) -> dict[str, object]:
    """CPU, cores, threads, library versions, device, date, git revision: the ``machine`` of a results
    file of ``bench/`` or of the task suite."""
    info: dict[str, object] = {
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    for lib in ("tensordict", "torchrl", "triton"):
        try:
            info[lib] = __import__(lib).__version__
        except ImportError:
            info[lib] = "absent"
    info["git"] = _git_revision()
    return info


def _git_revision() -> str:
    """``<sha>[+dirty]`` from read-only git queries (dirty: changed or untracked files under esper/ or
    bench/, the code measured); without git, ``$ESPER_REVISION`` or "unknown"."""
    root = Path(__file__).resolve().parents[3]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "esper", "bench"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        # a copy of the tree without .git (a lent GPU machine): the revision its sender named, if any
        return os.environ.get("ESPER_REVISION", "unknown")


__all__ = ["cpu_model", "git_revision", "machine", "machine_info"]
