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


# Memory freed in a worker thread's arena, kept by the thresholds, then given back: the process's resident size.
_GIVE_BACK_PROBE = """
import sys, threading
sys.path.insert(0, sys.argv[1])
from trimflow._malloc import give_back_freed_memory, keep_freed_memory

def rss():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS:"))

kept = []

def decode_and_free():  # as a shrink does in a worker thread: 320 MB under the mmap threshold, and objects between
    blocks = []
    for _ in range(20):
        blocks.append(b"\\x01" * (16 * 2**20))
        kept.append(b"\\x02" * 2**16)  # outlives the blocks: the heap cannot shrink past it
    del blocks

keep_freed_memory()
quiet = rss()
worker = threading.Thread(target=decode_and_free)
worker.start()
worker.join()
held = rss()
ran = give_back_freed_memory()
print(quiet, held, ran, rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
def test_memory_freed_in_a_worker_thread_is_given_back() -> None:
    out = subprocess.run([sys.executable, "-c", _GIVE_BACK_PROBE, str(ROOT / "addon")], capture_output=True, text=True, check=True).stdout
    quiet, held, ran, after = out.split()
    assert int(held) - int(quiet) > 250  # kept in the thread's arena once freed
    assert ran == "True" and int(after) - int(quiet) < 50


def test_giving_back_is_skipped_but_for_glibc(monkeypatch) -> None:
    monkeypatch.setattr(_malloc.os, "confstr", lambda name: "musl 1.2")
    assert _malloc.give_back_freed_memory() is False


# Six worker threads decode at once, then the memory is given back: what stays is the free top of each arena.
_ARENAS_PROBE = """
import sys, threading
sys.path.insert(0, sys.argv[1])
from trimflow._malloc import give_back_freed_memory, keep_freed_memory, share_arenas

def rss():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS:"))

keep_freed_memory()
if sys.argv[2] == "shared":
    share_arenas()
quiet = rss()
together = threading.Barrier(6)

def decode():
    blocks = [b"\\x01" * (8 * 2**20) for _ in range(6)]  # 48 MB in this thread's arena
    together.wait()  # all six hold theirs at once: each in an arena of its own, unless they share
    del blocks

threads = [threading.Thread(target=decode) for _ in range(6)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
give_back_freed_memory()
print(rss() - quiet)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
def test_threads_that_share_arenas_leave_one_arena_top_held() -> None:
    def held(arenas: str) -> int:
        run = subprocess.run([sys.executable, "-c", _ARENAS_PROBE, str(ROOT / "addon"), arenas], capture_output=True, text=True, check=True)
        return int(run.stdout)

    assert held("own") > 200  # an arena each: malloc_trim leaves each one's top heap
    assert held("shared") < 100  # ARENAS of them: one top heap at most
