"""Shrinking through a real mitmdump stays within its memory, across requests together: requests that each hold one
blank RGBA PNG just under the pixel limit (400 KB of PNG, 400 MB of pixels), three at once and then a mix of more,
keep the proxy's peak resident size under 2 GiB, every request is answered, and the memory goes back afterwards.

The shipped rules apply (Claude: 8000 px a side, 5 MiB an image). The images are refused before they decode (their
decoding may need more than the budget: trimflow._shrink) and go as placeholders; blank images of 22.5 MP decode, one
at a time; real ones of 2.5 MP (8 MB of base64) shrink beside them. A watcher kills the proxy the moment its peak passes the limit, so a
failing run never takes the shared machine's memory (without the budget, three of these images took 4.7 GB).
"""

from __future__ import annotations

import http.client
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest

from trimflow.testing import FakeProvider, b64, image

from ..bombs import MiB, blank_png
from .helpers import Proxy, start_proxy

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads memory from /proc (Linux)")]

PEAK_LIMIT = 2048 * MiB
HELD_LIMIT = 200 * MiB  # over the quiet figure, once the requests are done
MODEL = "claude-sonnet-4-6"  # the shipped `claude` rule: max_image_side 8000, max_image_bytes 5MiB
NEAR_100_MP = [(10_000, 9_999), (9_999, 9_999), (9_998, 9_999), (10_000, 9_998), (9_999, 9_998), (9_998, 9_998)]
DECODED = [(9_000, 2_500), (9_001, 2_500), (9_002, 2_500)]  # 22.5 MP each: within the budget alone, not two at once


def status(pid: int, key: str) -> int:
    """A /proc/PID/status figure in bytes (VmRSS: resident now, VmHWM: the peak of the process's life)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class Watch(threading.Thread):
    """Reads the process's peak every few milliseconds and kills the process once it passes `limit`."""

    def __init__(self, pid: int, limit: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.limit = pid, limit
        self.killed_at: int | None = None
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.done.wait(0.005):
            try:
                peak = status(self.pid, "VmHWM")
            except (OSError, KeyError):
                return  # the process is gone
            if peak > self.limit:
                self.killed_at = peak
                os.kill(self.pid, signal.SIGKILL)
                return

    def stop(self) -> None:
        self.done.set()
        self.join()

    def verdict(self) -> str:
        if self.killed_at is None:
            return "the proxy's peak stayed under the limit"
        return f"the proxy's peak passed {self.limit / MiB:.0f} MiB ({self.killed_at / MiB:.0f} MiB): killed"


def anthropic_body(png: bytes, text: str) -> bytes:
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(png)}}
    return orjson.dumps({"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": [block, {"type": "text", "text": text}]}]})


def post(port: int, body: bytes) -> int:
    """The answer's status; 0 when the proxy closed the connection without one. A request may wait its turn for the
    decoding budget behind others, hence the long timeout (it ends when the answer comes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST", "/v1/messages", body, {"content-type": "application/json", "x-api-key": "test-key"})
        response = conn.getresponse()
        response.read()
        return response.status
    except (ConnectionError, http.client.HTTPException):
        return 0
    finally:
        conn.close()


def all_at_once(proxy: Proxy, bodies: list[bytes]) -> list[int]:
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda body: post(proxy.port, body), bodies))


@pytest.fixture
def proxy(tmp_path: Path, fresh: FakeProvider) -> Iterator[Proxy]:
    running = start_proxy(tmp_path, "--mode", f"reverse:{fresh.url}", rules=None)
    try:
        yield running
    finally:
        running.mitm.stop()


def test_shrinking_stays_within_its_memory_and_gives_it_back(proxy: Proxy, fresh: FakeProvider) -> None:
    assert proxy.mitm.process is not None
    pid = proxy.mitm.process.pid
    small = [image(8400 + 100 * i, 300, "PNG", seed=70 + i, noise=0.2) for i in range(2)]  # over 8000 px and 5 MiB
    with proxy.expect_records(1):
        assert post(proxy.port, anthropic_body(image(8300, 300, "PNG", seed=69, noise=0.2), "warm up")) == 200
    quiet = status(pid, "VmRSS")  # Pillow and its codecs loaded, one image shrunk
    cpu_before = cpu_seconds(pid)
    watch = Watch(pid, PEAK_LIMIT)
    try:
        # Three at once, as the attack sent them.
        before = len(proxy.settled_records())
        answers = all_at_once(proxy, [anthropic_body(blank_png(*size), f"near 100 MP {i}") for i, size in enumerate(NEAR_100_MP[:3])])
        assert answers == [200] * 3, f"answers {answers}; {watch.verdict()}"
        three = proxy.records_after(before, 3)
        assert [(r["pruned_for_image_limit"], r["images_after"]) for r in three] == [(1, 0)] * 3  # placeholders
        # A mix of more: more of those, images that decode but not two at once, and small ones beside them.
        mix = [anthropic_body(blank_png(*size), "near 100 MP") for size in NEAR_100_MP[3:]]
        mix += [anthropic_body(blank_png(*size), "decoded") for size in DECODED]
        mix += [anthropic_body(png, "small") for png in small]
        before = len(proxy.settled_records())
        answers = all_at_once(proxy, mix)
        assert answers == [200] * len(mix), f"answers {answers}; {watch.verdict()}"
        records = proxy.records_after(before, len(mix))
    finally:
        watch.stop()
    peak = status(pid, "VmHWM")
    assert watch.killed_at is None and peak < PEAK_LIMIT, watch.verdict()
    # Every image went shrunk or, refused (over the budget, or no room within its wait), as a placeholder; the small
    # ones (the only ones over 5 MiB as they came) fit beside whatever decodes.
    assert all(r["shrunk"] + r["pruned_for_image_limit"] == 1 and r["status"] == 200 for r in records)
    assert [r["shrunk"] for r in records if r["media_bytes_before"] > 5 * MiB] == [1] * len(small)
    assert len(fresh.received) == 1 + 3 + len(mix)
    # The memory goes back once nothing decodes.
    deadline = time.monotonic() + 60
    while status(pid, "VmRSS") > quiet + HELD_LIMIT:
        assert time.monotonic() < deadline, f"still {(status(pid, 'VmRSS') - quiet) / MiB:.0f} MiB over the quiet {quiet / MiB:.0f} MiB"
        time.sleep(0.05)
    log = proxy.log()
    assert "decoding budget" in log and "Traceback" not in log
    print(
        f"\nquiet {quiet / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB, held after {(status(pid, 'VmRSS') - quiet) / MiB:.0f} MiB, "
        f"CPU {cpu_seconds(pid) - cpu_before:.1f} s for {3 + len(mix)} requests"
    )
