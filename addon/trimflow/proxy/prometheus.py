"""The prometheus addon: `trimflow_prometheus` (HOST:PORT) serves counters and histograms of the LLM requests at
/metrics, for Prometheus to scrape (docs/deployment.md).

The figures are the JSONL's: the metrics addon hands each record to this addon as it writes it (its `listeners`),
so a counter is the sum of one record field over the records written. Labels stay few and bounded: the wire
format, the model's family (claude, gpt, gemini or other: never the free-form name), the rule that applied (the
rules file names them), and for the request count the kind, the outcome and the status class; never a host, a
conversation or anything a request carries.

prometheus_client is imported here only, when the option is set: without it, trimflow runs as ever and says in
one line how to add it. The endpoint is served from mitmproxy's own event loop (the exposition is rendered in a
worker thread), so an answer from /metrics also says that the proxy's loop runs: a balancer's health check can use it.

The endpoint shares the proxy's process, its file descriptors and its loop, so anyone who can reach it is held to
little: at most MAX_CONNECTIONS open connections, each answered once and closed; a connection that has not sent its
request head within HEAD_TIMEOUT is closed, and so is the oldest such idle one when a new connection would pass the
bound (a scraper that sends its request at once is served while idle connections crowd the port); one log line
when the bound is reached, repeated at most once a minute with a count. Connections are taken at ACCEPT_RATE per
second at most, so a flood of cheap scrapes cannot take the loop from the proxy; a scrape gets the last render
again while no record has been counted and no limit learned since, and scrapes that arrive during a render share it.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mitmproxy import ctx, exceptions
from mitmproxy.addonmanager import Loader

from .._record import ENFORCE, Record
from .metrics import Metrics
from .options import exits_at_startup
from .recover import Recover
from .state import SharedState

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("trimflow")

OPTION = "trimflow_prometheus"
ENABLE = "pip install 'trimflow[prometheus]' (a pipx mitmproxy: pipx inject mitmproxy prometheus-client)"
PATH = b"/metrics"
FAMILIES = ("claude", "gpt", "gemini", "other")
# Upper bounds: request bodies around the limits providers and gateways set (2 MiB axum, 16 MiB the shipped
# budget, 32 MiB Anthropic), and trimflow's time per request from a fraction of a millisecond to a slow re-encode.
BODY_BUCKETS = (64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20, 64 << 20)
OVERHEAD_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
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
# What a render depends on: records counted, learned limits held and learned, the conversations file in use and its
# writes dropped.
RenderState = tuple[int, int, int, bool, int]


def model_family(model: str | None) -> str:
    """claude, gpt (OpenAI's gpt-*, chatgpt-*, o1/o3/o4..., codex-*), gemini, or other: a bounded label for any model name."""
    if not model:
        return "other"
    name = model.lower().rsplit("/", 1)[-1]  # publishers/google/models/gemini-..., openai/gpt-4o
    if "claude" in name:
        return "claude"
    if "gemini" in name:
        return "gemini"
    if "gpt" in name or name.startswith(("codex", "o1", "o3", "o4")):
        return "gpt"
    return "other"


def outcome_of(record: Record) -> str:
    """What happened to the request, the first that applies: simulated (a limit profile answered), retried (refused
    for a limit and sent again), failed_open (forwarded as it came for the reason the log line gives), observed
    (observe mode: measured, forwarded as it came), pruned (images dropped, shrunk or thinned), untouched."""
    if record.simulated:
        return "simulated"
    if record.retries:
        return "retried"
    if record.reason is not None:
        return "failed_open"
    if record.mode != ENFORCE:
        return "observed"
    if record.pruned or record.shrunk or record.thinned:
        return "pruned"
    return "untouched"


def status_class(status: int | None) -> str:
    """2xx, 4xx, ...; none when the flow ended without an answer."""
    return f"{status // 100}xx" if status is not None and 100 <= status < 600 else "none"


def parse_address(value: str) -> tuple[str, int]:
    """HOST:PORT ([::1]:PORT for IPv6) as (host, port); ValueError says what is wrong."""
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{OPTION} must be HOST:PORT (127.0.0.1:9101, [::1]:9101, 0.0.0.0:9101 for every interface), not {value!r}")
    return host, int(port)


# The counters that sum a record field (each labelled format, family, rule): name (Prometheus adds _total), help, value.
# What was forwarded is the record's to say (Record.sent_*): in observe mode, the body as received.
SUMS: tuple[tuple[str, str, Callable[[Record], int | None]], ...] = (
    ("trimflow_images_received", "Images in the LLM requests as received.", lambda r: r.images_before),
    ("trimflow_images_pruned", "Images replaced by a placeholder in what was forwarded.", lambda r: r.sent_pruned),
    ("trimflow_body_bytes_received", "Request body bytes as received (decoded).", lambda r: r.body_bytes_before),
    ("trimflow_body_bytes_forwarded", "Request body bytes as forwarded upstream (decoded).", lambda r: r.sent_body_bytes),
    ("trimflow_estimated_tokens_received", "trimflow's input token estimate of the requests as received.", lambda r: r.est_tokens_before),
    ("trimflow_estimated_tokens_forwarded", "trimflow's input token estimate of what was forwarded.", lambda r: r.sent_est_tokens),
    ("trimflow_input_tokens", "Input tokens the provider reported, cache reads and writes included.", lambda r: r.usage_input_tokens),
    ("trimflow_cache_read_tokens", "Input tokens the provider reported reading from its prompt cache.", lambda r: r.usage_cache_read_tokens),
    ("trimflow_cache_write_tokens", "Input tokens the provider reported writing to its prompt cache.", lambda r: r.usage_cache_write_tokens),
    ("trimflow_output_tokens", "Output tokens the provider reported.", lambda r: r.usage_output_tokens),
    ("trimflow_limit_refusals", "Requests the provider refused for a limit (docs/recovery.md).", lambda r: int(r.refused_status is not None)),
    ("trimflow_retries", "Times requests were sent again within a limit the provider named.", lambda r: r.retries),
)


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        return None
    return prometheus_client


class Instruments:
    """The counters and histograms of one registry, and how a record adds to them."""

    def __init__(self, client: Any, recover: Recover, flows: SharedState) -> None:
        self.registry: CollectorRegistry = client.CollectorRegistry()
        self._choose_encoder: Callable[[str], tuple[Callable[[CollectorRegistry], bytes], str]] = client.exposition.choose_encoder
        registry, labels = self.registry, ("format", "family", "rule")
        requests_by, requests_doc = (*labels, "kind", "outcome", "status"), "LLM requests finished: by kind, outcome and answer status class."
        self.requests = client.Counter("trimflow_requests", requests_doc, requests_by, registry=registry)
        self._sums = [(client.Counter(name, doc, labels, registry=registry), value) for name, doc, value in SUMS]
        by = ("format", "family")
        body_doc, overhead_doc = "Request body size as received (decoded).", "Time trimflow spent on a request."
        self.body = client.Histogram("trimflow_request_body_bytes", body_doc, by, buckets=BODY_BUCKETS, registry=registry)
        self.overhead = client.Histogram("trimflow_overhead_seconds", overhead_doc, by, buckets=OVERHEAD_BUCKETS, registry=registry)
        self.registry.register(_Learned(client, recover))
        self.registry.register(_SharedConversations(client, flows))
        self.recover, self.flows = recover, flows
        self.observed = 0  # records counted: with the learned limits, what a render depends on
        self._children: dict[tuple[str, str, str], tuple[list[Any], Any, Any]] = {}

    def observe(self, record: Record) -> None:
        self.observed += 1
        family = model_family(record.model)
        key = (record.format, family, record.rule or "none")
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                [counter.labels(*key) for counter, _ in self._sums],
                self.body.labels(record.format, family),
                self.overhead.labels(record.format, family),
            )
        sums, body, overhead = children
        self.requests.labels(*key, record.kind, outcome_of(record), status_class(record.status)).inc()
        for child, (_, value) in zip(sums, self._sums, strict=True):
            amount = value(record)
            if amount:
                child.inc(amount)
        body.observe(record.body_bytes_before)
        overhead.observe(record.overhead_ms / 1000)

    def render(self, accept: str) -> tuple[bytes, str]:
        """The exposition in the format the scraper asks for (Accept), and its content type."""
        encoder, content_type = self._choose_encoder(accept)
        return encoder(self.registry), content_type

    def content_type(self, accept: str) -> str:
        """The content type `render` answers `accept` with."""
        return self._choose_encoder(accept)[1]

    def state(self) -> RenderState:
        """What a render shows changes only with this: the records counted, the learned limits and the conversations
        file's state."""
        return self.observed, len(self.recover.learned.live()), self.recover.limits_learned, *_conversations_file(self.flows)


class _Learned:
    """The learned limits, read when scraped: how many hold now (the file, which instances may share), and how many
    this process learned."""

    def __init__(self, client: Any, recover: Recover) -> None:
        self.client, self.recover = client, recover

    def collect(self) -> list[Any]:
        held = self.client.metrics_core.GaugeMetricFamily(
            "trimflow_learned_limits", "Learned limits that apply now (the learned-limits file, shared by the instances that use it)."
        )
        held.add_metric([], len(self.recover.learned.live()))
        learned = self.client.metrics_core.CounterMetricFamily("trimflow_limits_learned", "Limits this process learned from providers' answers.")
        learned.add_metric([], self.recover.limits_learned)
        return [held, learned]


def _conversations_file(flows: SharedState) -> tuple[bool, int]:
    """Whether this instance shares its turns through the conversations file, and how many writes a busy file dropped."""
    shared = flows.conversations.shared
    return (shared.in_use, shared.writes_dropped) if shared is not None else (False, 0)


class _SharedConversations:
    """The conversations file (trimflow._last_turns), read when scraped: whether this instance shares each
    conversation's last turn through it, and how many of its turns a busy file kept from being shared."""

    def __init__(self, client: Any, flows: SharedState) -> None:
        self.client, self.flows = client, flows

    def collect(self) -> list[Any]:
        sharing, dropped_writes = _conversations_file(self.flows)
        in_use = self.client.metrics_core.GaugeMetricFamily(
            "trimflow_conversations_file",
            "1 when this instance shares each conversation's last turn through the conversations file, 0 when it keeps "
            "its own only (trimflow_conversations empty, or the file could not be used: see the log).",
        )
        in_use.add_metric([], 1 if sharing else 0)
        dropped = self.client.metrics_core.CounterMetricFamily(
            "trimflow_conversations_writes_dropped",
            "Turns never written to the conversations file: too many waited for it while another process held it.",
        )
        dropped.add_metric([], dropped_writes)
        return [in_use, dropped]


class Prometheus:
    name = "trimflow_prometheus"

    def __init__(self, metrics: Metrics, recover: Recover) -> None:
        self.recover, self.flows = recover, metrics.flows
        self.instruments: Instruments | None = None
        self.address: tuple[str, int] | None = None  # where /metrics is served, once bound
        self._socket: socket.socket | None = None
        self._serving: asyncio.AbstractEventLoop | None = None  # the loop watching the socket, once serving
        self._failed = False
        self._value = ""  # the option's value in effect
        self._clients: dict[_Client, None] = {}  # the endpoint's open connections, oldest first
        self._at_bound = _Throttled()
        self._tokens, self._refilled = float(_ACCEPT_BATCH), time.monotonic()  # the accept rate's bucket
        self._accept_failed = _Throttled()
        self._renders: dict[tuple[Instruments, str], asyncio.Future[tuple[bytes, str]]] = {}  # renders in progress
        self._rendered: dict[tuple[Instruments, str], tuple[RenderState, bytes]] = {}  # the last, by its state
        metrics.listeners.append(self.observe)

    def load(self, loader: Loader) -> None:
        loader.add_option(
            OPTION,
            str,
            "",
            f"HOST:PORT to serve Prometheus metrics on, at /metrics (counters and histograms of the LLM requests); "
            f"needs prometheus_client: {ENABLE}. Empty: off.",
        )

    @exits_at_startup
    def configure(self, updated: set[str]) -> None:
        if OPTION not in updated:
            return
        value = getattr(ctx.options, OPTION).strip()
        if value == self._value:
            return  # a refused change rolled back: what runs stays
        address = None
        if value:
            try:
                address = parse_address(value)
            except ValueError as exc:
                raise exceptions.OptionsError(f"trimflow: {exc}") from None
        client = _client() if address is not None else None
        if address is not None and client is None:
            log.warning("trimflow: %s needs prometheus_client, which this Python lacks: %s", OPTION, ENABLE)
        sock = _bind(*address) if address is not None and client is not None else None  # before the old one stops: a refusal leaves it
        self._stop()
        self.instruments, self._value = None, value
        self._rendered.clear()
        if sock is None:
            return
        self._socket, self.address = sock, sock.getsockname()[:2]
        if every_interface(self.address[0]):
            log.warning(
                "trimflow: %s=%s serves /metrics on every interface: anyone who can reach this machine can read it "
                "(127.0.0.1:PORT keeps it on this machine)",
                OPTION,
                value,
            )
        self.instruments = Instruments(client, self.recover, self.flows)
        self._failed = False
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop yet: `running` starts serving
            return
        self._serve_on_loop()

    def running(self) -> None:
        if self._socket is not None and self._serving is None:
            self._serve_on_loop()

    def done(self) -> None:
        self._stop()

    def observe(self, record: Record, error: str | None) -> None:
        """A record as the metrics addon writes it (`error`, when the flow failed, is in its status: none)."""
        if self.instruments is None:
            return
        try:
            self.instruments.observe(record)
        except Exception as exc:  # noqa: BLE001 - the counters are lost for this record, nothing else
            if not self._failed:
                self._failed = True
                log.warning("trimflow: a record was not counted for Prometheus: internal error %s", type(exc).__name__)

    # -- the endpoint

    def _serve_on_loop(self) -> None:
        assert self._socket is not None and self.address is not None
        self._serving = asyncio.get_running_loop()
        self._serving.add_reader(self._socket.fileno(), self._accept, self._socket)
        host, port = self.address
        log.info("trimflow: Prometheus metrics at http://%s:%d/metrics", f"[{host}]" if ":" in host else host, port)

    def _stop(self) -> None:
        if self._serving is not None and self._socket is not None:
            self._serving.remove_reader(self._socket.fileno())  # before the socket closes: its number may be reused
        if self._socket is not None:
            self._socket.close()
        if self._serving is not None and not self._serving.is_closed():
            for client in list(self._clients):
                client.task.cancel()  # each closes its connection
        self._serving = self._socket = self.address = None

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
        instruments = self.instruments
        if instruments is None:
            return 404, {"Content-Type": "text/plain"}, b"trimflow: metrics are off\n"
        try:
            body, content_type = await self._render(instruments, accept)
        except Exception as exc:  # noqa: BLE001 - this scrape fails; the proxy goes on
            log.warning("trimflow: Prometheus metrics not rendered: internal error %s", type(exc).__name__)
            return 500, {"Content-Type": "text/plain"}, b"trimflow: internal error\n"
        return 200, {"Content-Type": content_type}, body

    async def _render(self, instruments: Instruments, accept: str) -> tuple[bytes, str]:
        """The exposition, rendered in a worker thread (with many label sets a render takes milliseconds, which the
        loop spends proxying); the last render again while nothing it shows has changed, and a scrape that asks for
        a format being rendered waits for that render: a scrape flood costs the loop little."""
        content_type = instruments.content_type(accept)
        key, state = (instruments, content_type), instruments.state()
        last = self._rendered.get(key)
        if last is not None and last[0] == state:
            return last[1], content_type
        render = self._renders.get(key)
        if render is None:
            render = self._renders[key] = asyncio.ensure_future(asyncio.to_thread(instruments.render, accept))
            render.add_done_callback(lambda _: self._renders.pop(key, None))
            render.add_done_callback(lambda done: self._keep(key, state, done))
        return await asyncio.shield(render)  # one scraper gone does not cancel the render the others wait for

    def _keep(self, key: tuple[Instruments, str], state: RenderState, render: asyncio.Future[tuple[bytes, str]]) -> None:
        if not render.cancelled() and render.exception() is None and key[0] is self.instruments:
            self._rendered[key] = (state, render.result()[0])


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


def every_interface(host: str) -> bool:
    """Whether a bound address is the unspecified one (0.0.0.0, ::): every interface of the machine."""
    try:
        return ipaddress.ip_address(host.partition("%")[0]).is_unspecified
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket, bound now, so that a taken port or a wrong address stops mitmproxy at start."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise exceptions.OptionsError(f"trimflow: {OPTION}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(64)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise exceptions.OptionsError(f"trimflow: {OPTION}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


__all__ = [
    "ACCEPT_RATE",
    "HEAD_TIMEOUT",
    "MAX_CONNECTIONS",
    "OPTION",
    "Instruments",
    "Prometheus",
    "every_interface",
    "model_family",
    "outcome_of",
    "parse_address",
    "status_class",
]
