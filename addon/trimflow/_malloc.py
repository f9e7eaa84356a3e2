"""Keep freed request-body memory in the proxy process (glibc only).

A pruned request swaps a 16 MB body for a 5 MB one. With glibc's default heuristics that pattern
leaves enough free memory at the top of the heap to cross its trim threshold, so the heap is given
back to the kernel after a request and faulted in again, page by page, while mitmproxy reads the
next body: many more page faults per request than a plain mitmdump (figures: docs/how-it-works.md and
docs/performance.md). A plain mitmdump gains from the same setting too (scripts/bench: "plain keeping freed
memory").

Setting the thresholds fixes them (glibc stops adjusting them itself): allocations up to the mmap
threshold come from the heap, and up to the trim threshold of free memory stays in the process.
"""

from __future__ import annotations

import ctypes
import os

MMAP_THRESHOLD = 32 * 2**20  # the upper limit mallopt(3) documents on 64-bit: bodies up to this come from the heap
TRIM_THRESHOLD = 256 * 2**20  # measured: 64 MiB still trims after 16 MB turns, 256 MiB does not
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # from glibc's malloc.h


def keep_freed_memory(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> str | None:
    """Set glibc's malloc thresholds for this process. Returns None when set, else why not."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):  # not a name this system knows, or no confstr at all
        libc = ""
    if not libc.startswith("glibc"):
        return "not glibc"
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols, glibc's among them
    except (OSError, AttributeError) as exc:
        return f"no mallopt in the C library ({type(exc).__name__})"
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success, 0 for a value out of range.
    if not mallopt(_M_MMAP_THRESHOLD, mmap_threshold) or not mallopt(_M_TRIM_THRESHOLD, trim_threshold):
        return "glibc refused the thresholds"
    return None
