"""Load, faults and hostile bodies through a real mitmdump with the addon (reverse mode).

- Load: TRIMFLOW_LOAD_REQUESTS requests (48 by default; the issue's full run is 500) from 16 concurrent
  clients, six wire formats, bodies up to 16 MB, JSON and streamed answers. Every body the FakeProvider gets
  equals the one trimflow.prune_request makes in-process from the same rules: none lost, none duplicated,
  none mixed up between conversations (each request carries a unique id in its text).
- Faults, from a purpose-built upstream on 127.0.0.1 (the FakeProvider answers properly; this one does not):
  connection reset, clean close, stall past the client's timeout, 500, SSE cut mid-stream, garbage instead of
  HTTP; the client vanishing mid-upload. A normal request after each succeeds, and the metrics JSONL has one
  line per flow with its real outcome.
- Hostile bodies (tests/hostile/cases.py's cases) end to end: byte-identical or pruned on the wire.
- Runtime faults: rules file deleted, metrics on a full disk.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest

from trimflow import prune_request
from trimflow._decode import decode_body
from trimflow._rules_file import parse_rules
from trimflow.testing import PATHS, REPLY_TEXT, FakeProvider, Received, image

from ..bombs import GiB, MiB, gzip_bomb
from ..helpers import wait_for
from ..hostile.cases import HOSTILE, PRUNED, RULES_TEXT, UNTOUCHED, Hostile, check_pruned, expected_body, marker, params, session_json
from .helpers import Proxy, session, start_proxy

pytestmark = pytest.mark.e2e

LOAD_REQUESTS = int(os.environ.get("TRIMFLOW_LOAD_REQUESTS", "48"))
CLIENTS = 16
LOAD_RULES = "defaults:\n  max_images: 4\n  keep_recent: 1\n  max_body_bytes: 4MiB\n"
FORMATS_CYCLE = ("openai-chat", "anthropic", "gemini", "openai-responses", "ollama", "bedrock-converse")
STREAMABLE = {"openai-chat", "anthropic", "openai-responses"}  # "stream": true in the body makes them SSE
TAG = re.compile(rb"\[req-(\d{5})\]")


# --- load -----------------------------------------------------------------------------------------------------


def _pool(count: int, side: int, seed: int) -> list[bytes]:
    return [image(side, side * 3 // 4, "PNG", seed=seed + i) for i in range(count)]


@dataclass(frozen=True)
class LoadRequest:
    n: int
    fmt: str
    images: int
    size: str  # which image pool: s (~9 KB), m (~200 KB), l (~1 MB)
    stream: bool

    @property
    def tag(self) -> bytes:
        return b"[req-%05d]" % self.n


def load_plan(count: int) -> list[LoadRequest]:
    """Mixed sizes: mostly small, every 8th ~2-3 MB, every 16th ~10 MB, every 24th the full 16 MB."""
    plan = []
    for n in range(count):
        fmt = FORMATS_CYCLE[n % len(FORMATS_CYCLE)]
        if n % 24 == 7:
            images, size = 12, "l"  # 12 x ~1.33 MB of base64: the 16 MB body
        elif n % 16 == 3:
            images, size = 8, "l"
        elif n % 8 == 5:
            images, size = 10, "m"
        else:
            images, size = 1 + n % 6, "s"
        plan.append(LoadRequest(n, fmt, images, size, stream=fmt in STREAMABLE and n % 3 == 0))
    return plan


class LoadRun:
    """Builds each request, computes the body that must reach the provider, and tallies what did."""

    def __init__(self, proxy: Proxy, pools: dict[str, list[bytes]]) -> None:
        self.proxy, self.pools = proxy, pools
        self.rules = parse_rules(LOAD_RULES)
        self.expected: dict[int, tuple[str, tuple]] = {}  # n -> (sha256 of the upstream body, record figures)
        self.received: dict[int, list[str]] = {}
        self.untagged = 0
        self.lock = threading.Lock()

    def check(self, received: Received) -> None:
        """The FakeProvider's hook: digest what arrived, then let it answer as usual."""
        tags = set(TAG.findall(received.body))
        digest = hashlib.sha256(received.body).hexdigest()
        with self.lock:
            if len(tags) != 1:
                self.untagged += 1
                return None
            self.received.setdefault(int(tags.pop()), []).append(digest)
        return None

    def body(self, req: LoadRequest) -> bytes:
        pool = self.pools[req.size]
        # Each conversation's images are its own (bytes after a PNG's end, which decoders ignore): the proxy remembers
        # when an image first came across conversations (an agent may rewrite its history around the same images),
        # which the in-process engine this is checked against does not.
        trailer = b"load-request-%06d" % req.n
        images = [pool[(req.n + i) % len(pool)] + trailer for i in range(req.images)]
        built = session(req.fmt, images)
        if req.stream:
            built["stream"] = True
            if req.fmt == "openai-chat":
                built["stream_options"] = {"include_usage": True}  # else OpenAI streams carry no usage
        return orjson.dumps(built).replace(b"What should I click next?", b"What should I click next? " + req.tag)

    def send(self, conn: http.client.HTTPConnection, req: LoadRequest) -> tuple[int, bytes]:
        body = self.body(req)
        headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-load-test"}
        outcome = prune_request(f"http://127.0.0.1{PATHS[req.fmt]}", headers, body, self.rules)
        record = outcome.record
        figures = (req.fmt, record.images_before, record.images_after, record.body_bytes_before, record.body_bytes_after)
        with self.lock:
            self.expected[req.n] = (hashlib.sha256(outcome.body).hexdigest(), figures)
        conn.request("POST", PATHS[req.fmt], body, headers)
        response = conn.getresponse()
        return response.status, response.read()


@pytest.fixture(scope="module")
def load_provider() -> Iterator[FakeProvider]:
    with FakeProvider(record=False) as provider:  # bodies are digested by the check hook, not kept
        yield provider


@pytest.mark.load
def test_load_from_16_clients_loses_duplicates_and_mixes_up_nothing(tmp_path: Path, load_provider: FakeProvider) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(LOAD_RULES)
    proxy = start_proxy(tmp_path, "--mode", f"reverse:{load_provider.url}", rules=rules)
    pools = {"s": _pool(8, 64, 100), "m": _pool(8, 300, 200), "l": _pool(8, 660, 300)}
    run = LoadRun(proxy, pools)
    load_provider.check = run.check
    plan = load_plan(LOAD_REQUESTS)
    assert max(len(run.body(r)) for r in plan if r.n % 24 == 7) > 15_500_000  # the 16 MB body is in the mix

    def client(share: list[LoadRequest]) -> list[tuple[int, int, bytes]]:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=120)  # kept alive, as SDK clients do
        try:
            return [(req.n, *run.send(conn, req)) for req in share]
        finally:
            conn.close()

    try:
        with proxy.expect_records(LOAD_REQUESTS, timeout=120) as records:
            with ThreadPoolExecutor(CLIENTS) as pool:
                answers = [a for share in pool.map(client, [plan[i::CLIENTS] for i in range(CLIENTS)]) for a in share]
    finally:
        load_provider.check = None
        proxy.mitm.stop()
    assert sorted(n for n, _, _ in answers) == list(range(LOAD_REQUESTS))
    assert all(status == 200 for _, status, _ in answers), [(n, s, a[:200]) for n, s, a in answers if s != 200]
    for n, _, answer in answers:  # every client got its own complete answer (JSON or the whole stream)
        text = answer.decode()
        assert REPLY_TEXT in text or all(d in text for d in ('"ok"', '" from"', '" fake"', '"-provider"')), (n, text[:300])
    assert run.untagged == 0
    assert sorted(run.received) == list(range(LOAD_REQUESTS)), "lost requests"
    assert [n for n, digests in run.received.items() if len(digests) != 1] == [], "duplicated requests"
    wrong = [n for n, (digest, _) in run.expected.items() if run.received[n] != [digest]]
    assert wrong == [], f"bodies upstream differ from the in-process pruning: {wrong}"
    # One metrics line per flow, with what the engine in this process computed and the provider's answer.
    assert Counter((r["format"], r["images_before"], r["images_after"], r["body_bytes_before"], r["body_bytes_after"]) for r in records) == Counter(
        figures for _, figures in run.expected.values()
    )
    assert [(r["format"], r["status"], r["usage_input_tokens"]) for r in records if r["status"] != 200 or not r["usage_input_tokens"]] == []
    assert sum(r["pruned"] for r in records) > 0 and any(r["pruned_for_body"] for r in records)


# --- a misbehaving upstream -------------------------------------------------------------------------------------


@dataclass
class Got:
    """One request as the raw upstream read it off the wire (nothing decoded)."""

    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class RawUpstream:
    """HTTP/1.1 on 127.0.0.1 that answers per the request's `x-fault` header: ok (a JSON answer), reset,
    close, stall, 500, sse-cut, garbage. It records every request body byte for byte, as sent on the wire."""

    got: list[Got] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def close(self) -> None:
        self.release.set()
        # shutdown() wakes the accept() in _accept. A bare close() would leave it blocked on a descriptor number
        # that the next socket opened reuses: restarted after a signal, it took a later test's connections.
        self.sock.shutdown(socket.SHUT_RDWR)
        self.acceptor.join(10)
        self.sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            while True:
                request = self._read(reader)
                if request is None:
                    return
                if not self._answer(conn, request):
                    return
        except OSError:
            pass
        finally:
            reader.close()
            conn.close()

    def _read(self, reader) -> Got | None:
        line = reader.readline(65536)
        if not line:
            return None
        _method, target, _version = line.decode("latin-1").split(" ", 2)
        headers: dict[str, str] = {}
        while (line := reader.readline(65536)) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("x-fault") == "reset-early":
            return Got(target, headers, b"")  # before reading the body
        body = reader.read(int(headers.get("content-length", "0")))
        got = Got(target, headers, body)
        self.got.append(got)
        return got

    def _answer(self, conn: socket.socket, got: Got) -> bool:
        """Send the answer; False when the connection must end."""
        fault = got.headers.get("x-fault", "ok")
        if fault in ("reset", "reset-early"):
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends RST
            return False
        if fault == "close":
            return False
        if fault == "stall":
            self.release.wait(60)
            return False
        if fault == "garbage":
            conn.sendall(b"THIS IS NOT HTTP\r\n\r\n")
            return False
        if fault == "500":
            body = b'{"error":{"type":"api_error","message":"upstream broke"}}'
            conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            return True
        if fault == "sse-cut":
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for event in (b'data: {"choices":[{"delta":{"content":"par"}}]}\n\n', b'data: {"choices":[{"delta":{"content":"tial"}}]}\n\n'):
                conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))
                time.sleep(0.05)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False  # no last chunk: the stream ends mid-way
        body = b'{"usage":{"prompt_tokens":%d}}' % len(got.body)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        return True


@pytest.fixture(scope="module")
def raw_upstream() -> Iterator[RawUpstream]:
    upstream = RawUpstream()
    yield upstream
    upstream.close()


@pytest.fixture(scope="module")
def raw_proxy(tmp_path_factory: pytest.TempPathFactory, raw_upstream: RawUpstream) -> Iterator[Proxy]:
    workdir = tmp_path_factory.mktemp("raw")
    rules = workdir / "rules.yaml"
    rules.write_text(RULES_TEXT)
    proxy = start_proxy(workdir, "--mode", f"reverse:{raw_upstream.url}", rules=rules)
    yield proxy
    proxy.mitm.stop()


def send(port: int, path: str, body: bytes, headers: dict[str, str], timeout: float = 30) -> tuple[int, bytes]:
    status, answer, broken = send_raw(port, path, body, headers, timeout)
    assert not broken, "the answer broke off"
    return status, answer


def send_raw(port: int, path: str, body: bytes, headers: dict[str, str], timeout: float = 30) -> tuple[int, bytes, bool]:
    """(status, the answer as far as it came, whether it broke off). TimeoutError when nothing came in time."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body, headers)
        response = conn.getresponse()
        chunks = []
        try:
            while chunk := response.read1(65536):
                chunks.append(chunk)
        except (http.client.IncompleteRead, ConnectionError):
            return response.status, b"".join(chunks), True
        return response.status, b"".join(chunks), False
    finally:
        conn.close()


def assert_still_serving(proxy: Proxy, upstream: RawUpstream, records: int = 1) -> None:
    """A normal request right after: answered, and pruned on the way; `records`: 0 when metrics cannot be written."""
    body = session_json("openai-chat", "after-fault")
    before = len(upstream.got)
    with proxy.expect_records(records) as new:  # its own record, so the next test counts only its own
        status, _ = send(proxy.port, PATHS["openai-chat"], body, {"content-type": "application/json"})
    assert status == 200 and all(r["status"] == 200 for r in new)
    assert len(upstream.got) == before + 1
    assert upstream.got[-1].body == prune_request(f"http://h{PATHS['openai-chat']}", {}, body, parse_rules(RULES_TEXT)).body


FAULTS = [
    # (fault, what the client sees, what the metrics line says)
    ("reset", "502", "error"),
    ("reset-early", "502", "error"),
    ("close", "502", "error"),
    ("garbage", "502", "error"),
    ("stall", "timeout", "error"),
    ("500", "500", "status 500"),
    ("sse-cut", "partial", "status 200, then error"),  # the answer began: its status stands beside the error
]


@pytest.mark.parametrize(("fault", "client_sees", "metrics_say"), FAULTS, ids=[f[0] for f in FAULTS])
def test_upstream_faults_never_stop_the_proxy_and_each_flow_gets_its_real_outcome(
    raw_proxy: Proxy, raw_upstream: RawUpstream, fault: str, client_sees: str, metrics_say: str
) -> None:
    body = session_json("openai-chat", f"fault-{fault}")
    with raw_proxy.expect_records(1) as new:
        try:
            status, answer, broken = send_raw(
                raw_proxy.port,
                PATHS["openai-chat"],
                body,
                {"content-type": "application/json", "x-fault": fault},
                timeout=2 if fault == "stall" else 30,
            )
        except TimeoutError:
            status, answer, broken = None, b"", True
    if client_sees == "timeout":
        assert status is None
    elif client_sees == "partial":
        assert status == 200 and broken and b'"par"' in answer  # what came before the cut came through
    else:
        assert status == int(client_sees) and not broken, answer[:300]
    record = new[0]
    assert record["images_before"] == 5 and record["images_after"] == 2  # pruned before the fault hit
    if metrics_say.endswith("then error"):
        assert record["status"] == int(metrics_say.split()[1].rstrip(",")) and record["error"], record
    elif metrics_say.startswith("status"):
        assert record["status"] == int(metrics_say.split()[1]) and "error" not in record
    else:
        assert record["status"] is None and record["error"], record
    assert marker(f"fault-{fault}") not in raw_proxy.log()
    assert_still_serving(raw_proxy, raw_upstream)


def test_client_vanishing_mid_upload_leaves_no_trace_upstream(raw_proxy: Proxy, raw_upstream: RawUpstream) -> None:
    before_got, before_records = len(raw_upstream.got), len(raw_proxy.settled_records())
    body = session_json("openai-chat", "vanishing")
    with socket.create_connection(("127.0.0.1", raw_proxy.port)) as sock:
        head = b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        sock.sendall(head % (PATHS["openai-chat"].encode(), len(body) * 4))
        sock.sendall(body)  # a quarter of what it announced
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    assert_still_serving(raw_proxy, raw_upstream)
    # Nothing half-sent went upstream; the record count grew by the one normal request only (the addon never
    # saw the unfinished upload: mitmproxy calls request hooks on whole requests).
    assert len(raw_upstream.got) == before_got + 1
    assert len(raw_proxy.settled_records()) == before_records + 1  # assert_still_serving waited for its own


# --- hostile bodies end to end -------------------------------------------------------------------------------


E2E_HOSTILE = [c for c in HOSTILE if c.e2e and c.id != "gzip-bomb"]  # the bomb needs a small limit: its own test


@pytest.mark.parametrize("case", params(E2E_HOSTILE))
def test_hostile_bodies_reach_the_upstream_pruned_or_byte_identical(raw_proxy: Proxy, raw_upstream: RawUpstream, case: Hostile) -> None:
    plain = case.plain()
    wire = case.wire(plain)
    log_before = len(raw_proxy.log())
    status, _ = send(raw_proxy.port, case.path, wire, case.request_headers(wire))
    assert status == 200
    got = raw_upstream.got[-1]
    assert got.path == case.path
    if case.outcome == PRUNED:
        upstream = decode_body(got.body, got.headers.get("content-encoding"), 64 * MiB)
        assert upstream == expected_body(case, plain)
        check_pruned(case, plain, upstream)
        assert got.headers.get("content-encoding") == case.coding
    else:
        assert got.body == wire
        assert got.headers.get("content-encoding") == case.coding
    assert_still_serving(raw_proxy, raw_upstream)
    log = raw_proxy.log()[log_before:]
    untouched = [line for line in log.splitlines() if "forwarded untouched" in line]
    if case.outcome == UNTOUCHED:
        assert len(untouched) == 1 and case.why in untouched[0], untouched
    else:
        assert untouched == []
    assert marker(case.id) not in log


def test_gzip_bombs_are_forwarded_untouched_never_inflated(tmp_path: Path, raw_upstream: RawUpstream) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES_TEXT)
    proxy = start_proxy(tmp_path, "--mode", f"reverse:{raw_upstream.url}", rules=rules, trimflow_max_decoded_bytes="1MiB")
    try:

        def refusals() -> int:
            return sum("forwarded untouched" in line and "decodes to more than 1.0MB" in line for line in proxy.log().splitlines())

        # 64 MiB first: even an unbounded decoder survives it, and the log line shows whether the bound holds.
        for inflated in (64 * MiB, 8 * GiB):
            if inflated > 64 * MiB:
                assert refusals() == 1, "unbounded: not sending gigabytes"
            bomb = gzip_bomb(inflated)
            status, _ = send(proxy.port, PATHS["openai-chat"], bomb, {"content-type": "application/json", "content-encoding": "gzip"})
            assert status == 200 and raw_upstream.got[-1].body == bomb
        assert refusals() == 2
        assert_still_serving(proxy, raw_upstream)
    finally:
        proxy.mitm.stop()


# --- runtime faults -------------------------------------------------------------------------------------------


def test_rules_deleted_and_metrics_on_a_full_disk_while_serving(tmp_path: Path, raw_upstream: RawUpstream) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES_TEXT)
    # trimflow_rules_check=0: the rules file is looked at on every request, so the next one finds it gone.
    proxy = start_proxy(tmp_path, "--mode", f"reverse:{raw_upstream.url}", rules=rules, trimflow_metrics="/dev/full", trimflow_rules_check="0")
    try:
        assert_still_serving(proxy, raw_upstream, records=0)
        rules.unlink()
        for _ in range(3):
            assert_still_serving(proxy, raw_upstream, records=0)  # the last good rules still prune
        # No record to wait for: each request's log line, which comes with its record, is what says it is done.
        wait_for(lambda: proxy.log().count("images 5->2") == 4, "log line of each request")
        log = proxy.log()
    finally:
        proxy.mitm.stop()
    rules_errors = [line for line in log.splitlines() if "keeping the last good rules" in line]
    metrics_errors = [line for line in log.splitlines() if "cannot write metrics" in line]
    assert len(rules_errors) == 1 and str(rules) in rules_errors[0]
    assert len(metrics_errors) == 1 and "/dev/full" in metrics_errors[0] and "forwarding continues" in metrics_errors[0]
    assert log.count("images 5->2") == 4  # the per-flow log line goes on
