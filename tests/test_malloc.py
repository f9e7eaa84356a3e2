"""trimflow._malloc: glibc keeps freed body memory in the process once the thresholds are set."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trimflow import _malloc

from .helpers import ROOT

# Run in a child process: the thresholds are process-wide and cannot be reset.
_PROBE = """
import ctypes, sys
sys.path.insert(0, sys.argv[1])
from trimflow._malloc import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
    )]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2

def body_lands_in_heap():
    before = libc.mallinfo2()
    body = bytes(20 * 2**20)  # a 20 MB request body
    during = libc.mallinfo2()
    del body
    after = libc.mallinfo2()
    mmapped = during.hblkhd - before.hblkhd >= 20 * 2**20
    kept = after.arena >= during.arena  # the heap was not trimmed when the body was freed
    return mmapped, kept

print(body_lands_in_heap()[0], keep_freed_memory(), *body_lands_in_heap())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
def test_a_body_comes_from_the_heap_and_stays_there_once_set() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE, str(ROOT / "addon")], capture_output=True, text=True, check=True).stdout.split()
    default_mmapped, why_not, mmapped, kept = out
    assert default_mmapped == "True"  # glibc's default: a fresh process maps a 20 MB block and unmaps it when freed
    assert why_not == "None" and mmapped == "False" and kept == "True"


def test_anything_but_glibc_is_left_alone_with_a_reason(monkeypatch) -> None:
    # musl or macOS cannot run here: only what the module asks the system is replaced.
    def no_such_name(name: str) -> str:
        raise ValueError(f"unrecognized configuration name {name}")

    monkeypatch.setattr(_malloc.os, "confstr", no_such_name)
    assert _malloc.keep_freed_memory() == "not glibc"
