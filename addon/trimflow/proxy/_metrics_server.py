"""The prometheus addon's endpoint (proxy/prometheus.py): a small HTTP/1 server on mitmproxy's event loop that
answers GET and HEAD /metrics with the exposition, one request per connection.

It is served from the proxy's own loop (the exposition is rendered in a worker thread), so an answer from /metrics
also says that the proxy's loop runs: a balancer's health check can use it.

The endpoint shares the proxy's process, its file descriptors and its loop, so anyone who can reach it is held to
little: at most MAX_CONNECTIONS open connections, each answered once and closed; a connection that has not sent its
request head within HEAD_TIMEOUT is closed, and so is the oldest such idle one when a new connection would pass the
bound (a scraper that sends its request at once is served while idle connections crowd the port); one log line
when the bound is reached, repeated at most once a minute with a count. Connections are taken at ACCEPT_RATE per
second at most, so a flood of cheap scrapes cannot take the loop from the proxy; a scrape gets the last render
again while the exposition's state has not changed, and scrapes that arrive during a render share it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time
from collections.abc import Hashable
from typing import Protocol

log = logging.getLogger("trimflow")

PATH = b"/metrics"
_HEAD_LIMIT = 16 << 10  # a scrape's request head is a few hundred bytes
MAX_CONNECTIONS = 32  # a few scrapers and health checks; an instance is scraped by a handful at most
HEAD_TIMEOUT = 2.0  # seconds for the request head: a scraper sends it at once
_WRITE_TIMEOUT = 10.0  # seconds for a client to take the answer
_ACCEPT_BATCH = 8  # connections accepted per wakeup, so that a flood of them leaves the loop to the proxy in between
# Connections taken per second at most: a scraper comes every few seconds, while a flood of them, each cheap, would
# otherwise take the proxy's loop for itself. Past it, the listening socket waits (the kernel keeps the backlog).
ACCEPT_RATE = 100
_ACCEPT_RETRY = 1.0  # seconds before accepting again when the process is out of descriptors (as asyncio's servers do)
_LOG_INTERVAL = 60.0  # seconds between two lines saying the same thing about the endpoint


class Exposition(Protocol):
    """What the endpoint serves: the metrics rendered in the format a scraper asks for."""

    def render(self, accept: str) -> tuple[bytes, str]:
        """The exposition in the format `accept` (a request's Accept header) asks for, and its content type;
        called in a worker thread."""
        ...

    def content_type(self, accept: str) -> str:
        """The content type `render` answers `accept` with."""
        ...

    def state(self) -> Hashable:
        """What a render shows changes only with this: equal states, equal renders."""
        ...


def listen(host: str, port: int) -> socket.socket:
    """A listening socket, bound now (so that a taken port or a wrong address is known at once); OSError says why not."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(64)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class MetricsServer:
    """/metrics on `sock` (from `listen`), answered from `exposition`: `start` serves it on the running event loop,
    `stop` closes the socket and every open connection."""

    def __init__(self, sock: socket.socket, exposition: Exposition) -> None:
        self.exposition = exposition
        self.address: tuple[str, int] = sock.getsockname()[:2]
        self._socket: socket.socket | None = sock
        self._serving: asyncio.AbstractEventLoop | None = None  # the loop watching the socket, once serving
        self._clients: dict[_Client, None] = {}  # the open connections, oldest first
        self._at_bound = _Throttled()
        self._tokens, self._refilled = float(_ACCEPT_BATCH), time.monotonic()  # the accept rate's bucket
        self._accept_failed = _Throttled()
        self._renders: dict[str, asyncio.Future[tuple[bytes, str]]] = {}  # renders in progress, by content type
        self._rendered: dict[str, tuple[Hashable, bytes]] = {}  # the last render of each content type, by its state

    @property
    def serving(self) -> bool:
        return self._serving is not None

    def start(self) -> None:
        """Serve on the running event loop (from a hook mitmproxy runs on it)."""
        assert self._socket is not None and self._serving is None
        self._serving = asyncio.get_running_loop()
        self._serving.add_reader(self._socket.fileno(), self._accept, self._socket)
        host, port = self.address
        log.info("trimflow: Prometheus metrics at http://%s:%d/metrics", f"[{host}]" if ":" in host else host, port)

    def stop(self) -> None:
        if self._serving is not None and self._socket is not None:
            self._serving.remove_reader(self._socket.fileno())  # before the socket closes: its number may be reused
        if self._socket is not None:
            self._socket.close()
        if self._serving is not None and not self._serving.is_closed():
            for client in list(self._clients):
                client.task.cancel()  # each closes its connection
        self._serving = self._socket = None

    def _accept(self, listener: socket.socket) -> None:
        """The listening socket is readable: accept what is waiting, a few at a time, admitting each before the next
        (asyncio's servers accept a whole backlog first, and hold a burst's descriptors before any can be refused)."""
        assert self._serving is not None
        now = time.monotonic()
        self._tokens, self._refilled = min(float(_ACCEPT_BATCH), self._tokens + (now - self._refilled) * ACCEPT_RATE), now
        for _ in range(_ACCEPT_BATCH):
            if self._tokens < 1:  # past the rate: wait until a connection's worth has come back
                self._serving.remove_reader(listener.fileno())
                self._serving.call_later((1 - self._tokens) / ACCEPT_RATE, self._resume, listener)
                return
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors (the proxy's connections share them): pause, then accept again
                self._accept_failed.say("trimflow: /metrics cannot accept a connection (%s); pausing a second", exc.strerror or type(exc).__name__)
                self._serving.remove_reader(listener.fileno())
                self._serving.call_later(_ACCEPT_RETRY, self._resume, listener)
                return
            self._tokens -= 1
            conn.setblocking(False)
            if not self._make_room():
                conn.close()
                continue
            client = _Client(conn)
            client.task = self._serving.create_task(self._answer(client))
            client.task.add_done_callback(functools.partial(self._closed, client))  # also for a task cancelled before it ran
            self._clients[client] = None

    def _resume(self, listener: socket.socket) -> None:
        if self._socket is listener and self._serving is not None:
            self._serving.add_reader(listener.fileno(), self._accept, listener)

    def _make_room(self) -> bool:
        """Whether a new connection may be served: within the bound, or once the oldest idle connection is closed;
        not when every open connection is being answered."""
        if len(self._clients) < MAX_CONNECTIONS:
            return True
        self._at_bound.say(
            "trimflow: /metrics reached its bound of %d open connections: the oldest idle one is closed for each new one",
            MAX_CONNECTIONS,
        )
        idle = next((client for client in self._clients if not client.answering), None)
        if idle is None:
            return False
        del self._clients[idle]
        idle.task.cancel()  # its handler closes the connection
        return True

    def _closed(self, client: _Client, _: asyncio.Task[None]) -> None:
        self._clients.pop(client, None)
        if client.writer is None:
            client.conn.close()  # no transport took it (one cancelled on its way closes the socket itself)

    async def _answer(self, client: _Client) -> None:
        """One request per connection: GET or HEAD /metrics."""
        answered = False
        try:
            reader, writer = await asyncio.open_connection(sock=client.conn, limit=_HEAD_LIMIT)
            client.writer = writer
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
            client.answering = True  # no longer the idle one a new connection may displace
            status, headers, body = await self._respond(head)
            reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error"}[status]
            lines = [f"HTTP/1.1 {status} {reason}", *(f"{k}: {v}" for k, v in headers.items()), f"Content-Length: {len(body)}", "Connection: close"]
            writer.write("\r\n".join(lines).encode("latin-1") + b"\r\n\r\n")
            if not head.startswith(b"HEAD "):
                writer.write(body)
            await asyncio.wait_for(writer.drain(), _WRITE_TIMEOUT)
            answered = True
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            pass  # an idle, slow or vanished client: nothing is owed to it
        finally:
            if client.writer is not None and answered:
                client.writer.close()
            elif client.writer is not None:
                client.writer.transport.abort()

    async def _respond(self, head: bytes) -> tuple[int, dict[str, str], bytes]:
        lines = head.split(b"\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return 400, {"Content-Type": "text/plain"}, b"trimflow: not an HTTP/1 request\n"
        method, target = parts[0], parts[1]
        if target.split(b"?", 1)[0] != PATH:
            return 404, {"Content-Type": "text/plain"}, b"trimflow: the metrics are at /metrics\n"
        if method not in (b"GET", b"HEAD"):
            return 405, {"Content-Type": "text/plain", "Allow": "GET, HEAD"}, b"trimflow: GET /metrics\n"
        accept = ""
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"accept":
                accept = value.strip().decode("latin-1")
        try:
            body, content_type = await self._render(accept)
        except Exception as exc:  # noqa: BLE001 - this scrape fails; the proxy goes on
            log.warning("trimflow: Prometheus metrics not rendered: internal error %s", type(exc).__name__)
            return 500, {"Content-Type": "text/plain"}, b"trimflow: internal error\n"
        return 200, {"Content-Type": content_type}, body

    async def _render(self, accept: str) -> tuple[bytes, str]:
        """The exposition, rendered in a worker thread (with many label sets a render takes milliseconds, which the
        loop spends proxying); the last render again while nothing it shows has changed, and a scrape that asks for
        a format being rendered waits for that render: a scrape flood costs the loop little."""
        content_type = self.exposition.content_type(accept)
        state = self.exposition.state()
        last = self._rendered.get(content_type)
        if last is not None and last[0] == state:
            return last[1], content_type
        render = self._renders.get(content_type)
        if render is None:
            render = self._renders[content_type] = asyncio.ensure_future(asyncio.to_thread(self.exposition.render, accept))
            render.add_done_callback(lambda _: self._renders.pop(content_type, None))
            render.add_done_callback(lambda done: self._keep(content_type, state, done))
        return await asyncio.shield(render)  # one scraper gone does not cancel the render the others wait for

    def _keep(self, content_type: str, state: Hashable, render: asyncio.Future[tuple[bytes, str]]) -> None:
        if not render.cancelled() and render.exception() is None:
            self._rendered[content_type] = (state, render.result()[0])


class _Client:
    """One connection to the endpoint: idle until its request head is in, then answering."""

    __slots__ = ("answering", "conn", "task", "writer")

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.answering = False
        self.writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None]


class _Throttled:
    """A log line said at most once per _LOG_INTERVAL, with how often it happened since it was last said."""

    def __init__(self) -> None:
        self.count = 0
        self.said: float | None = None  # time.monotonic() of the last line

    def say(self, message: str, *args: object) -> None:
        self.count += 1
        now = time.monotonic()
        if self.said is not None and now - self.said < _LOG_INTERVAL:
            return
        log.warning(message + " (times since the last such line: %d; it comes at most once a minute)", *args, self.count)
        self.said, self.count = now, 0


__all__ = ["ACCEPT_RATE", "HEAD_TIMEOUT", "MAX_CONNECTIONS", "PATH", "Exposition", "MetricsServer", "listen"]
