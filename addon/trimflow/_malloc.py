"""Keep freed request-body memory in the proxy process, and give it back after large image decodes (glibc only).

A pruned request swaps a 16 MB body for a 5 MB one. With glibc's default heuristics that pattern
leaves enough free memory at the top of the heap to cross its trim threshold, so the heap is given
back to the kernel after a request and faulted in again, page by page, while mitmproxy reads the
next body: many more page faults per request than a plain mitmdump (figures: docs/how-it-works.md and
docs/performance.md). A plain mitmdump gains from the same setting too (scripts/bench: "plain keeping freed
memory").

Setting the thresholds fixes them (glibc stops adjusting them itself): allocations up to the mmap
threshold come from the heap, and up to the trim threshold of free memory stays in the process.

Decoding a large image frees hundreds of MB at once, in the arena of the worker thread that decoded
it; kept, that is a burst's peak held for good. `give_back_freed_memory` (malloc_trim) returns every
free page of every arena; trimflow._pixel_budget calls it once no image is being decoded. It cannot
return the free top of a thread's arena (up to one 64 MiB heap each), and glibc makes an arena per
new thread, up to 8 per core: `share_arenas` has the threads share ARENAS arenas instead.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

MMAP_THRESHOLD = 32 * 2**20  # the upper limit mallopt(3) documents on 64-bit: bodies up to this come from the heap
TRIM_THRESHOLD = 256 * 2**20  # measured: 64 MiB still trims after 16 MB turns, 256 MiB does not
ARENAS = 2  # the main thread's (the event loop's), and one the worker threads share with it
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # from glibc's malloc.h


def _libc() -> ctypes.CDLL | None:
    """The process's own C library when it is glibc, else None."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):  # not a name this system knows, or no confstr at all
        libc = ""
    if not libc.startswith("glibc"):
        return None
    return ctypes.CDLL(None)  # the process's own symbols, glibc's among them


def _mallopt() -> tuple[Callable[[int, int], int] | None, str]:
    """glibc's mallopt, typed; or None and why it cannot be had. It returns 1 on success, 0 for a value out of range."""
    try:
        libc = _libc()
        if libc is None:
            return None, "not glibc"
        mallopt = libc.mallopt
    except (OSError, AttributeError) as exc:
        return None, f"no mallopt in the C library ({type(exc).__name__})"
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt, ""


def keep_freed_memory(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> str | None:
    """Set glibc's malloc thresholds for this process. Returns None when set, else why not."""
    mallopt, why_not = _mallopt()
    if mallopt is None:
        return why_not
    if not mallopt(_M_MMAP_THRESHOLD, mmap_threshold) or not mallopt(_M_TRIM_THRESHOLD, trim_threshold):
        return "glibc refused the thresholds"
    return None


def share_arenas(arenas: int = ARENAS) -> str | None:
    """Have threads started from now on share `arenas` malloc arenas (glibc's M_ARENA_MAX); None when set, else
    why not. Threads allocate with the GIL held, so sharing costs them little."""
    mallopt, why_not = _mallopt()
    if mallopt is None:
        return why_not
    return None if mallopt(_M_ARENA_MAX, arenas) else "glibc refused the arena count"


def give_back_freed_memory() -> bool:
    """Return the free memory of every malloc arena to the system (glibc's malloc_trim); whether it ran."""
    try:
        libc = _libc()
        if libc is None:
            return False
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
    trim(0)
    return True
