"""Keep the C heap's freed memory in the process, so a training step's tensors reuse pages.

A zoo step on the CPU allocates and frees the same few dozen activation and gradient tensors of
0.5-8 MB every step. glibc serves blocks that large by ``mmap`` and returns them with ``munmap``
(its dynamic threshold only partly adapts), so every step faults its pages in again: about 10 000
minor page faults per forward + backward of the zoo ResNet on two views, 8-12 % of its time
(benchmarks/zoo.py measures it). Raising glibc's mmap and trim thresholds keeps those blocks in
the heap, where the next step reuses them. The memory a process keeps is its peak heap, which a
training process reaches anyway; numerics are untouched.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
KEEP_BELOW = 1 << 30  # blocks under 1 GiB come from (and return to) the heap
_applied: bool | None = None


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (musl and macOS have no ``gnu_get_libc_version``)."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    glibc = hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt")
    return libc if glibc else None


def keep_freed_memory() -> bool:
    """Set glibc's mmap threshold and trim threshold to 1 GiB for the rest of the process (once;
    later calls return the first answer): large blocks then come from the heap and freed ones
    stay there for reuse. Returns whether it applied (False off glibc, where nothing changes)."""
    global _applied
    if _applied is None:
        libc = _glibc()
        _applied = bool(
            libc is not None
            and libc.mallopt(M_MMAP_THRESHOLD, KEEP_BELOW) == 1
            and libc.mallopt(M_TRIM_THRESHOLD, KEEP_BELOW) == 1
        )
        log.debug("freed heap memory kept for reuse: %s", _applied)
    return _applied
