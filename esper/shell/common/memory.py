"""The process's memory allocator, tuned for many short-lived tensors of a few hundred KB to a few MB.

glibc's ``malloc`` serves blocks above its mmap threshold (128 KB, raised only as far as the largest
block freed so far) with fresh ``mmap`` pages and returns freed heap tops to the system past its trim
threshold. A training step of a small host allocates and frees such blocks hundreds of times, and on a
VM every fresh page is a page fault: the batched host step spent more time faulting than computing. One
call at start-up raises both thresholds, so freed blocks are reused. Nothing changes off glibc (the call
reports False), and ``ESPER_MALLOC_TUNING=0`` leaves the allocator alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

#: ``mallopt`` parameters (glibc ``malloc.h``).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: Blocks up to this size come from the heap (glibc's 64-bit maximum).
MMAP_THRESHOLD = 32 * 1024 * 1024
#: Free heap memory kept before any is returned to the system.
TRIM_THRESHOLD = 512 * 1024 * 1024


def tune_allocator() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True if it was done."""
    if os.environ.get("ESPER_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


__all__ = ["tune_allocator"]
