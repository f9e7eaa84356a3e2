"""/metrics on a real mitmdump against a crowd of idle connections: the endpoint shares the proxy's process and
its file descriptors, so whoever reaches the port must not be able to take them, nor the proxy's log.

The mitmdump runs with a file descriptor limit a little above what it uses at rest, below the crowd's size: an
endpoint that held every idle connection would run out (mitmproxy logs a traceback per refused accept, and the
proxy port stops accepting too).
"""

from __future__ import annotations

import errno
import http.client
import os
import resource
import socket
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from trimflow.proxy._metrics_server import MAX_CONNECTIONS
from trimflow.testing import PATHS, FakeProvider, image, session_body

from ..e2e.helpers import Proxy, post, start_all, stop_all
from ..helpers import tcp_sockets, wait_for

pytestmark = pytest.mark.e2e

IDLE = 200
# Above what mitmdump holds at rest plus the endpoint's bound and a proxied request; below the rest plus IDLE.
HEADROOM = MAX_CONNECTIONS + 60


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as fake:
        yield fake


def open_idle(port: int, count: int) -> list[socket.socket]:
    """`count` connections that will never send a byte, opened without waiting for each to be accepted."""
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        sockets.append(sock)
    return sockets


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False  # open
    except OSError as exc:
        return exc.errno != errno.ENOTCONN  # a reset; not yet connected is still open


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def held_connections(pid: int, port: int) -> int:
    """The TCP connections on local `port` that process `pid` holds open (its listening socket aside)."""
    return sum(local == port and state != "0A" for local, state in tcp_sockets(pid))


def scrape(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read()
        assert b"trimflow_requests_total" in body or response.status != 200
        return response.status
    finally:
        conn.close()


def test_200_idle_connections_take_neither_the_descriptors_nor_the_log(tmp_path: Path, provider: FakeProvider) -> None:
    proxy = Proxy(tmp_path, "--mode", f"reverse:{provider.url}", rules=None, trimflow_prometheus="127.0.0.1:0")
    start_all(proxy.mitm)
    idle: list[socket.socket] = []
    try:
        assert proxy.mitm.process is not None
        pid = proxy.mitm.process.pid
        metrics_port = proxy.metrics_port()  # from the endpoint's start line
        at_rest = descriptors(pid)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (at_rest + HEADROOM, at_rest + HEADROOM))
        assert at_rest + HEADROOM < at_rest + IDLE

        idle = open_idle(metrics_port, IDLE)
        wait_for(lambda: "reached its bound" in proxy.log(), "the line saying the bound is reached")
        # A scraper is served while the crowd is still open, and the proxy goes on proxying.
        assert scrape(metrics_port) == 200
        body = orjson.dumps(session_body("openai-chat", 3, image(64, 48, "PNG", seed=7), "image/png"))
        with proxy.expect_records(1) as records:
            status, _ = post(proxy.port, PATHS["openai-chat"], body)
        assert status == 200 and records[0]["status"] == 200
        # The endpoint closes every idle connection it took on its own (some of a burst past the listen backlog the
        # kernel never hands over: the client thinks them open, the endpoint never sees them): none is held open.
        wait_for(lambda: held_connections(pid, metrics_port) == 0, "every idle connection closed by the endpoint")
        assert sum(closed_by_peer(sock) for sock in idle) > MAX_CONNECTIONS  # it took more than its bound, closing the idle
    finally:
        for sock in idle:
            sock.close()
        stop_all(proxy.mitm)
    log = proxy.log()
    for trouble in ("Traceback", "Too many open files", "out of system resource", "cannot accept"):
        assert trouble not in log, log[-3000:]
    bound_lines = [line for line in log.splitlines() if "bound" in line]
    assert 1 <= len(bound_lines) <= 3, bound_lines
