"""An offline LLM provider on loopback: the upstream for tests, and for reproducing failures with no API key.

It answers the wire formats trimflow handles with a short fixed reply ("ok from fake-provider"), as JSON
or streamed (SSE, NDJSON, Google's JSON array) the way the real provider does, on the paths of trimflow's
built-in endpoints (trimflow.formats: each format's ENDPOINTS):

- openai-chat       POST */chat/completions                 (SSE when "stream": true)
- openai-responses  POST */responses                        (SSE with the real event sequence)
- anthropic         POST */v1/messages, Vertex */publishers/anthropic/models/{m}:rawPredict | :streamRawPredict,
                    Bedrock */model/{id}/invoke (JSON only); and */messages/count_tokens
- gemini            POST *:generateContent | *:streamGenerateContent (?alt=sse: SSE, else a JSON array)
- ollama            POST */api/chat                         (NDJSON unless "stream": false)
- bedrock-converse  POST */model/{id}/converse

Anthropic's and OpenAI's Files APIs (*/v1/files: upload, list, get, delete; per API key), Gemini's (*/upload/v1beta/files,
*/v1beta/files), and file references in messages, answered as if the image were inline (trimflow.testing._fake_files).

converse-stream and invoke-with-response-stream (AWS binary event-stream) and responses/compact are 501 here.
Anything else is a 404 JSON error.

Usage is a deterministic estimate from the request body, realistic in magnitude (trimflow.testing._fake_usage);
the replies per format are built by trimflow.testing._replies.

With ``cache=True`` (CLI ``--cache``) every request also goes through trimflow.testing._cache_model, a model
of each provider's documented prompt caching on the wall clock, and the usage reports what it read from
and wrote to the cache where the real API puts it: Anthropic ``cache_read_input_tokens``,
``cache_creation_input_tokens`` (and ``cache_creation`` by TTL), with ``input_tokens`` the rest; OpenAI
``prompt_tokens_details.cached_tokens`` and ``input_tokens_details.cached_tokens``; Gemini
``cachedContentTokenCount`` and ``cacheTokensDetails``; Bedrock ``cacheReadInputTokens`` and
``cacheWriteInputTokens``. Token counts then come from trimflow's estimator (text by bytes, each image by
its provider's formula), not from the formula above; an Anthropic request with more than 4
``cache_control`` markers is refused with Anthropic's 400. Without it the answers are as described above.

Request bodies with Content-Encoding gzip, deflate, br and zstd (also stacked, as a server accepts them)
are decoded before anything looks at them. ``FakeProvider(check=...)`` is the hook for answers
that come before the normal reply (limit profiles: a provider's exact error status, content type and text).

The CLI (``python -m trimflow fake-provider``, trimflow.testing._fake_provider_cli) logs one line per request to stderr: method, path (never
the query, which may hold ``?key=``), status, sizes, image count; never headers or body content. With
``--profile NAME`` it refuses what that limit profile (rules/profiles.yaml) refuses, as the provider would.
Every answer carries ``X-Fake-Provider-Received-Bytes``: the decoded body size it received.
"""

from __future__ import annotations

import gzip
import ipaddress
import socket
import ssl
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import TCPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import brotli
import orjson
import zstandard

from ..formats import FORMATS
from ._cache_model import CacheModel, TooManyBreakpoints
from ._fake_files import FakeFiles, ReferenceRefused
from ._fake_usage import FakeUsage, cached_usage, count_images, estimate_usage
from ._replies import build_json_reply, error_body, iter_stream_events, route, stream_content_type, wants_stream

DEFAULT_PORT = 8700

# Every answer says how many (decoded) body bytes the provider received: scripts/replay shows it.
RECEIVED_BYTES_HEADER = "X-Fake-Provider-Received-Bytes"

CheckAnswer = tuple[int, str, bytes]
"""(status, content type, body) that a check hook answers instead of the normal reply."""


@dataclass(slots=True)
class Received:
    """One request as the provider got it. ``headers`` has lower-case names; ``body`` is decoded."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    wire_bytes: int = 0  # body size on the wire, before Content-Encoding was undone

    def json(self) -> Any:
        return orjson.loads(self.body)


# --- body decoding -----------------------------------------------------------------------------------------


def decode_received(wire: bytes, content_encoding: str) -> bytes:
    """Undo Content-Encoding (possibly a list, applied left to right). Raises ValueError when it cannot."""
    body = wire
    for enc in reversed([e.strip().lower() for e in content_encoding.split(",") if e.strip()]):
        try:
            body = _decode_one(body, enc)
        except ValueError:
            raise
        except Exception as e:  # each codec has its own error type (zlib.error, OSError, brotli.error, ...)
            raise ValueError(f"cannot decode {enc} body: {e}") from e
    return body


def _decode_one(data: bytes, enc: str) -> bytes:
    if enc == "identity":
        return data
    if enc in ("gzip", "x-gzip"):
        return gzip.decompress(data)
    if enc == "deflate":
        try:
            return zlib.decompress(data)
        except zlib.error:  # some clients send raw deflate without the zlib header
            return zlib.decompress(data, -zlib.MAX_WBITS)
    if enc == "br":
        return brotli.decompress(data)
    if enc == "zstd":
        # A stream reader copes with frames that do not record their content size.
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    raise ValueError(f"unsupported content-encoding {enc!r}")


# --- server ------------------------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # other names could resolve anywhere


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # socketserver's 5 refuses a burst of agents' turns that a real provider takes

    def __init__(self, addr: tuple[str, int], provider: FakeProvider, tls: ssl.SSLContext | None, family: int):
        self.address_family = family
        self.provider = provider
        self.tls = tls
        self.conns: set[socket.socket] = set()
        self.conns_lock = threading.Lock()
        super().__init__(addr, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn); skip it, we are offline on loopback.
        TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def finish_request(self, request: Any, client_address: Any) -> None:
        # Runs in the connection's thread, so a slow TLS handshake never blocks accept().
        conn = request
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError):
                return  # the client gave up on the handshake (e.g. it does not trust the cert)
        with self.conns_lock:
            self.conns.add(conn)
        try:
            super().finish_request(conn, client_address)
        finally:
            with self.conns_lock:
                self.conns.discard(conn)
            if conn is not request:
                conn.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a client that went away is no news; other errors keep the stdlib traceback
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        """End kept-alive connections so their threads stop serving after stop()."""
        with self.conns_lock:
            conns = list(self.conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streaming
    server: _Server

    def version_string(self) -> str:
        return "fake-provider"

    def log_message(self, format: str, *args: Any) -> None:
        # http.server would print the request line, query (a Gemini ?key=) included; FakeProvider logs instead.
        pass

    def _handle(self) -> None:
        self.server.provider._serve(self)

    do_POST = do_GET = do_PUT = do_PATCH = do_DELETE = _handle

    def read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline(65537).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    # The decoded size of the request being answered, sent back in RECEIVED_BYTES_HEADER.
    received_bytes: int | None = None

    def send_received_bytes(self) -> None:
        if self.received_bytes is not None:
            self.send_header(RECEIVED_BYTES_HEADER, str(self.received_bytes))

    def send_body(self, status: int, content_type: str, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_received_bytes()
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_stream(self, content_type: str, frames: Iterable[bytes], delay: float) -> None:
        """Write each frame as its own HTTP chunk and flush it, so a reader sees events one at a time."""
        chunked = self.request_version != "HTTP/1.0"
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-cache")
        self.send_received_bytes()
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        for i, frame in enumerate(frames):
            if i and delay > 0:
                time.sleep(delay)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame) if chunked else frame)
            self.wfile.flush()
        if chunked:
            self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class FakeProvider:
    """The fake provider as a server in this process: ``with FakeProvider() as p: ... p.url ... p.received``.

    ``check(received)`` runs first for every request; when it returns ``(status, content_type, body)`` that is
    the answer (the seam for limit profiles). ``log`` gets one line per request (never headers or content).
    ``received`` lists every request (unless ``record=False``); ``event_delay`` (seconds) may be changed live.
    ``cache=True`` answers every request through a model of the provider's prompt caching on the wall clock
    (``cache_model``; see the module docstring).
    ``script(format, request, usage, stream, sse)`` may answer a request in its place, as ``(content_type, frames)``
    (trimflow.testing._agent_script plays a model that calls an agent's image tool); None leaves it to the usual reply.
    ``files`` (a FakeFiles) holds the files uploaded to its Files APIs.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        certfile: str | None = None,
        keyfile: str | None = None,
        event_delay: float = 0.0,
        log: Callable[[str], None] | None = None,
        check: Callable[[Received], CheckAnswer | None] | None = None,
        record: bool = True,
        cache: bool = False,
        script: Callable[[str, dict[str, Any], FakeUsage, bool, bool], tuple[str, list[bytes]] | None] | None = None,
    ) -> None:
        if not is_loopback(host):
            raise ValueError(f"fake-provider listens on loopback only (127.0.0.1, ::1, localhost): {host!r}")
        if host == "localhost":
            host = "127.0.0.1"
        tls = None
        if certfile:
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.load_cert_chain(certfile, keyfile)
            tls.set_alpn_protocols(["http/1.1"])  # no HTTP/2 here
        elif keyfile:
            raise ValueError("keyfile given without certfile")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.event_delay = event_delay
        self.log = log
        self.check = check
        self.script = script
        self.record = record  # the CLI turns this off: a long session of 20 MB bodies would pile up
        self.cache_model = CacheModel(time.monotonic) if cache else None
        self.files = FakeFiles()
        self.received: list[Received] = []
        self._received_lock = threading.Lock()
        self._server = _Server((host, port), self, tls, family)
        self.host = host
        self.port: int = self._server.server_port
        url_host = f"[{host}]" if family == socket.AF_INET6 else host
        self.url = f"{'https' if tls else 'http'}://{url_host}:{self.port}"
        self.files.scheme = "https" if tls else "http"  # of the upload URL Gemini's resumable start answers
        self._thread: threading.Thread | None = None

    def start(self) -> FakeProvider:
        if self._thread is None:
            serve = self._server.serve_forever
            self._thread = threading.Thread(target=serve, name="fake-provider", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.close_connections()
        self._server.server_close()

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def clear(self) -> None:
        with self._received_lock:
            self.received.clear()

    # One request, from the handler thread.
    def _serve(self, h: _Handler) -> None:
        started = time.monotonic()
        h.received_bytes = None
        target = h.path
        if "://" in target:  # absolute-form request target (a client that thinks we are a proxy)
            parts = urlsplit(target)
            target = parts.path + (f"?{parts.query}" if parts.query else "")
        path, _, query = target.partition("?")
        headers: dict[str, str] = {}
        for name, value in h.headers.items():
            name = name.lower()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value

        try:
            wire = h.read_body()
        except (ValueError, OSError):  # a bad Content-Length or chunk size, or the client went away
            h.close_connection = True
            if self.log is not None:
                self.log(f"{h.command} {path} - unreadable body")
            return
        decode_error = None
        try:
            body = decode_received(wire, headers.get("content-encoding", ""))
        except ValueError as e:
            body, decode_error = wire, str(e)
        rec = Received(h.command, path, query, headers, body, len(wire))
        h.received_bytes = len(body)
        if self.record:
            with self._received_lock:
                self.received.append(rec)

        out = _Outcome()
        try:
            self._answer(h, rec, decode_error, out)
        except (BrokenPipeError, ConnectionResetError):
            h.close_connection = True
            out.note = " client-gone"
        except Exception as e:  # noqa: BLE001 - a failing check hook must not kill the server or print request data
            h.close_connection = True
            out.note = f" error={type(e).__name__}"
            if not out.sent:
                h.send_body(500, "application/json", error_body("api_error", "fake-provider: internal error"))
                out.status = 500
        finally:
            if self.log is not None:
                self.log(
                    f"{h.command} {path} {out.status} {out.fmt}{' stream' if out.streamed else ''}{out.note} "
                    f"body={len(body)}B wire={len(wire)}B images={count_images(body)} "
                    f"{int((time.monotonic() - started) * 1000)}ms"
                )

    def _answer(self, h: _Handler, rec: Received, decode_error: str | None, out: _Outcome) -> None:
        """Send the answer, noting in ``out`` what was sent (for the log line)."""

        def send(status: int, content_type: str, body: bytes, headers: dict[str, str] | None = None) -> None:
            out.status, out.sent = status, True
            h.send_body(status, content_type, body, headers)

        if self.check is not None and (answer := self.check(rec)) is not None:
            out.fmt = "check"
            send(*answer)
            return
        if decode_error is not None:
            send(400, "application/json", error_body("invalid_request_error", f"fake-provider: {decode_error}"))
            return
        files_answer = self.files.route(rec.method, rec.path, rec.query, rec.headers, rec.body)
        if files_answer is not None:
            out.fmt = "files"
            send(*files_answer)
            return
        r = route(rec.path) if rec.method == "POST" else None
        if r is None:
            msg = f"fake-provider: no route for {rec.method} {rec.path}"
            send(404, "application/json", error_body("not_found_error", msg))
            return
        out.fmt = r.fmt
        if r.unsupported is not None:
            msg = f"fake-provider: {r.unsupported}"
            # Bedrock errors carry a top-level "message"; "error" keeps generic clients happy too.
            send(501, "application/json", orjson.dumps({"message": msg, "error": {"message": msg}}))
            return
        try:
            request_json = orjson.loads(rec.body)
        except orjson.JSONDecodeError as e:
            request_json, why = None, f"body is not JSON: {e}"
        else:
            why = "body is not a JSON object"
        if not isinstance(request_json, dict):
            send(400, "application/json", error_body("invalid_request_error", f"fake-provider: {why}"))
            return
        try:
            body, request_json = self.files.resolve(r.fmt, rec.headers, rec.body, request_json, rec.query)
        except ReferenceRefused as refused:  # a reference the key cannot use, refused as the provider refuses it
            send(*refused.answer)
            return
        usage = estimate_usage(body)
        if self.cache_model is not None and r.fmt in FORMATS:
            try:
                cached = self.cache_model.request(r.fmt, rec.path, request_json)
            except TooManyBreakpoints as e:
                send(400, "application/json", _breakpoints_refused(r.fmt, e))
                return
            if cached is not None:
                usage = cached_usage(cached, usage.images)
                out.note = f" cache read={cached.cache_read_tokens} write={cached.cache_write_tokens}"
        if self.script is not None:
            stream, sse = wants_stream(r, request_json), parse_qs(rec.query).get("alt") == ["sse"]
            scripted = self.script(r.fmt, request_json, usage, stream, sse)
            if scripted is not None:
                out.note += " scripted"
                if not stream:
                    send(200, scripted[0], b"".join(scripted[1]))
                    return
                out.status, out.sent, out.streamed = 200, True, True
                h.send_stream(scripted[0], scripted[1], self.event_delay)
                return
        if not wants_stream(r, request_json):
            send(200, "application/json", orjson.dumps(build_json_reply(r, request_json, usage)))
            return
        sse = parse_qs(rec.query).get("alt") == ["sse"]
        frames = iter_stream_events(r, request_json, usage, sse=sse)
        out.status, out.sent, out.streamed = 200, True, True
        h.send_stream(stream_content_type(r, sse), frames, self.event_delay)


def _breakpoints_refused(fmt: str, e: TooManyBreakpoints) -> bytes:
    if fmt == "anthropic":
        return orjson.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": str(e)}})
    # Bedrock's own text for too many cachePoint blocks is not known here: this one says whose it is.
    return orjson.dumps({"message": f"fake-provider: more than 4 cachePoint blocks ({e.found})"})


@dataclass(slots=True)
class _Outcome:
    """What one request was answered, for the log line."""

    status: int = 500
    fmt: str = "-"
    streamed: bool = False
    sent: bool = False
    note: str = ""
