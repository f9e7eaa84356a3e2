"""Recovery and its client, end to end: a real mitmdump in front of an upstream of this module's own, whose every
connection the tests can watch.

- A retry ends with its client: when the client hangs up while the retry waits for its answer or receives it, the
  upstream sees the retry's connection closed, one log line says so, and nothing more is learned.
- An error answer is held back only up to ANSWER_MAX: a larger one (64 MiB of events, chunked or with its length
  given) reaches the client byte for byte and is not retried, and mitmdump's peak memory grows by far less than it.
- A small limit error, with its length given or chunked, is still read and retried.
"""

from __future__ import annotations

import hashlib
import http.client
import re
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import pytest
import yaml

from trimflow._limit_errors import ANSWER_MAX

from ..helpers import wait_for
from .helpers import OPENAI_KEY, Proxy, peak_growth_during, session, shots, start_all, stop_all, write_rules

pytestmark = pytest.mark.e2e

RULES_MAX_IMAGES = 8
LIMIT = 4  # the upstream refuses more images than this, with GitHub Copilot's text that names the limit
BIG = 64 << 20  # the large error answer: far over ANSWER_MAX
BLOCK = 64 << 10
EVENT_GAP = 0.02  # seconds between the events of a slow answer
WAIT = 20.0  # a failure bound for conditions that take milliseconds when all is well
_IMAGE = re.compile(rb'"type":\s*"image_url"')


def big_blocks(size: int) -> Iterator[bytes]:
    """`size` bytes of server-sent events, made block by block (never all in memory): each block differs."""
    sent = 0
    index = 0
    while sent < size:
        line = b"data: " + hashlib.sha256(b"%d" % index).hexdigest().encode() + b"\n\n"
        block = (line * (BLOCK // len(line) + 1))[: min(BLOCK, size - sent)]
        yield block
        sent += len(block)
        index += 1


def big_digest(size: int) -> str:
    digest = hashlib.sha256()
    for block in big_blocks(size):
        digest.update(block)
    return digest.hexdigest()


@dataclass
class Seen:
    """What the upstream saw of one request: its path, images, and when its connection closed (monotonic)."""

    path: str
    images: int
    closed_at: float | None = None
    closed: threading.Event = field(default_factory=threading.Event)
    answering: threading.Event = field(default_factory=threading.Event)  # it has begun to answer (or to wait)


class Upstream(ThreadingHTTPServer):
    """The provider: a request with more than LIMIT images is refused with a limit error (chunked when the path
    starts /chunked-limit); any other is answered as the path's first segment says: /ok a 200 JSON, /hang nothing
    until the client leaves, /trickle a 200 event stream that never ends, /big-chunked and /big-length a 400
    event stream of BIG bytes."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[Seen] = []
        self.arrived = threading.Condition()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def first_seen(self, count: int) -> list[Seen]:
        """The requests seen, once `count` have arrived (each arrival notifies the condition)."""
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.seen) >= count, WAIT), [s.path for s in self.seen]
            return list(self.seen)


LIMIT_ERROR = b'{"error":{"message":"too many images: maximum allowed for model %s is %d, got %d","code":"invalid_request_body"}}'
OK = b'{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}'


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Upstream

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        seen = Seen(self.path, len(_IMAGE.findall(body)))
        with self.server.arrived:
            self.server.seen.append(seen)
            self.server.arrived.notify_all()
        kind = self.path.split("/")[1]
        try:
            if seen.images > LIMIT:
                model = orjson.loads(body)["model"].encode()
                self.answer(400, "application/json", LIMIT_ERROR % (model, LIMIT, seen.images), chunked=kind == "chunked-limit")
            elif kind == "hang":
                seen.answering.set()
                self.wait_for_close(seen)
            elif kind == "trickle":
                self.trickle(seen)
            elif kind in ("big-chunked", "big-length"):
                self.big(kind == "big-chunked")
            else:
                self.answer(200, "application/json", OK, chunked=False)
        except OSError:
            self.mark_closed(seen)

    def answer(self, status: int, content_type: str, body: bytes, chunked: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            half = len(body) // 2
            for part in (body[:half], body[half:]):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        self.wfile.flush()

    def wait_for_close(self, seen: Seen) -> None:
        """Send nothing; return once the other end has closed the connection."""
        while not self.peer_closed(timeout=1.0):
            pass
        self.mark_closed(seen)
        self.close_connection = True

    def trickle(self, seen: Seen) -> None:
        """A 200 event stream, one event every EVENT_GAP, until the other end closes the connection."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        index = 0
        while True:
            event = b'data: {"choices":[{"index":0,"delta":{"content":"%d "}}]}\n\n' % index
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
            index += 1
            if index == 3:
                seen.answering.set()  # the retry is receiving its answer
            if self.peer_closed(timeout=EVENT_GAP):
                self.mark_closed(seen)
                self.close_connection = True
                return

    def big(self, chunked: bool) -> None:
        self.send_response(400)
        self.send_header("Content-Type", "text/event-stream")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(BIG))
        self.end_headers()
        for block in big_blocks(BIG):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
        if chunked:
            self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def peer_closed(self, timeout: float) -> bool:
        readable, _, _ = select.select([self.connection], [], [], timeout)
        if not readable:
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def mark_closed(self, seen: Seen) -> None:
        if not seen.closed.is_set():
            seen.closed_at = time.monotonic()
            seen.closed.set()


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def started_proxy(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[Proxy]:
    root = tmp_path_factory.mktemp("recovery-client")
    rules = write_rules(root / "rules.yaml", RULES_MAX_IMAGES)
    started = Proxy(root, "--mode", f"reverse:{upstream.url}", rules=rules, trimflow_learned=str(root / "learned.yaml"))
    start_all(started.mitm)
    yield started
    stop_all(started.mitm)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[Proxy]:
    yield from started_proxy(tmp_path_factory, upstream)


@pytest.fixture
def new_proxy(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[Proxy]:
    """A mitmdump of its own: memory an earlier answer left in the process would hide a peak."""
    yield from started_proxy(tmp_path_factory, upstream)


@pytest.fixture
def fresh(upstream: Upstream) -> Upstream:
    with upstream.arrived:
        upstream.seen.clear()
    return upstream


def learned(proxy: Proxy) -> list[dict[str, Any]]:
    path = proxy.metrics.parent / "learned.yaml"
    # Empty between the lock that creates it and the first write.
    return (yaml.safe_load(path.read_text()) or {}).get("learned") or [] if path.exists() else []


def request_body(model: str, images: int = 6, seed: int = 0) -> bytes:
    return orjson.dumps(session("openai-chat", shots(images, seed=seed), model))


def open_request(proxy: Proxy, path: str, body: bytes) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=60)
    conn.request("POST", path, body, {"Content-Type": "application/json", "Authorization": f"Bearer {OPENAI_KEY}"})
    return conn


def post(proxy: Proxy, path: str, body: bytes) -> tuple[int, bytes]:
    conn = open_request(proxy, path, body)
    try:
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# --- a retry ends with its client --------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["hang", "trickle"], ids=["waiting", "receiving"])
def test_a_retry_is_cancelled_when_its_client_hangs_up(proxy: Proxy, fresh: Upstream, stage: str) -> None:
    model = f"gpt-4o-hangup-{stage}"
    log_before = len(proxy.log())
    records_before = len(proxy.settled_records())
    conn = open_request(proxy, f"/{stage}/v1/chat/completions", request_body(model, seed=1))
    refused, retry = fresh.first_seen(2)
    assert (refused.images, retry.images) == (6, LIMIT)
    assert retry.answering.wait(WAIT), "the retry's answer never began"
    assert not retry.closed.is_set()
    hung_up = time.monotonic()
    conn.sock.close()  # the client hangs up while the retry is in flight
    conn.close()
    assert retry.closed.wait(WAIT), "the upstream never saw the retry's connection close"
    assert retry.closed_at is not None
    print(f"\n{stage}: the upstream saw the retry's connection close {1000 * (retry.closed_at - hung_up):.1f} ms after the client hung up")
    wait_for(lambda: "retry failed" in proxy.log()[log_before:], "line saying the retry failed", WAIT)
    lines = [line for line in proxy.log()[log_before:].splitlines() if "retry failed" in line]
    assert len(lines) == 1, lines
    assert lines[0].endswith(f"trimflow: 127.0.0.1/{stage}/v1/chat/completions retry failed: the client closed its connection; cancelled")
    (record,) = proxy.records_after(records_before, 1)
    assert (record["status"], record["retries"], record["refused_status"]) == (400, 1, 400)  # what the provider last said
    assert [e for e in learned(proxy) if e["model"] == model] == []  # no retry was accepted: nothing proven, nothing learned
    assert len(fresh.seen) == 2  # no other retry went out
    # the proxy serves on
    assert post(proxy, "/ok/v1/chat/completions", request_body(model, images=3, seed=2)) == (200, OK)
    assert fresh.seen[-1].images == 3


# --- how much of an error answer is held --------------------------------------------------------------------------


@pytest.mark.parametrize("framing", ["chunked", "length"])
def test_a_large_error_answer_streams_through_unchanged_in_bounded_memory(new_proxy: Proxy, fresh: Upstream, framing: str) -> None:
    proxy = new_proxy
    assert BIG > 32 * ANSWER_MAX
    model = f"gpt-4o-big-{framing}"
    got: dict[str, Any] = {}

    def fetch() -> None:
        conn = open_request(proxy, f"/big-{framing}/v1/chat/completions", request_body(model, images=3, seed=3))
        try:
            response = conn.getresponse()
            digest, size = hashlib.sha256(), 0
            while block := response.read(BLOCK):
                digest.update(block)
                size += len(block)
            got.update(status=response.status, type=response.getheader("content-type"), size=size, digest=digest.hexdigest())
        finally:
            conn.close()

    assert proxy.mitm.process is not None
    with proxy.expect_records(1) as records:
        growth = peak_growth_during(proxy.mitm.process.pid, fetch)
    print(f"\n{framing}: mitmdump's peak resident memory rose {growth / 2**20:.1f} MiB while a {BIG >> 20} MiB error answer went through")
    assert got == {"status": 400, "type": "text/event-stream", "size": BIG, "digest": big_digest(BIG)}
    assert growth < BIG // 2
    assert len(fresh.seen) == 1  # never retried
    assert (records[0]["status"], records[0]["retries"]) == (400, 0)


# --- a small limit error is still read and retried ----------------------------------------------------------------


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_a_small_limit_error_is_read_and_retried(proxy: Proxy, fresh: Upstream, framing: str) -> None:
    model = f"gpt-4o-small-{framing}"
    prefix = "chunked-limit" if framing == "chunked" else "ok"
    # Other screenshots for each framing: the proxy remembers which images a retry cut, and the same six again
    # would come with those already cut.
    seed = 4 if framing == "length" else 5
    with proxy.expect_records(1) as records:
        assert post(proxy, f"/{prefix}/v1/chat/completions", request_body(model, seed=seed)) == (200, OK)
    assert [s.images for s in fresh.seen] == [6, LIMIT]
    assert (records[0]["status"], records[0]["retries"], records[0]["refused_status"]) == (200, 1, 400)
    wait_for(lambda: [(e["limit"], e["value"]) for e in learned(proxy) if e["model"] == model] == [("max_images", LIMIT)], "the limit in the file")
