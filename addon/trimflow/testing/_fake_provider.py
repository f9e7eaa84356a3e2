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

converse-stream and invoke-with-response-stream (AWS binary event-stream) and responses/compact are 501 here.
Anything else is a 404 JSON error.

Usage is a deterministic estimate from the request body, realistic in magnitude:

    input_tokens  = ceil((body_bytes - base64_bytes) / 4) + 1600 * images
    output_tokens = ceil(len(REPLY_TEXT) / 4)

``body_bytes`` is the decoded body length; ``base64_bytes`` the total length of runs of 256 or more base64
characters (image payloads, in the standard or the URL-safe alphabet: google-genai sends ``-`` and ``_``);
``images`` counts image markers with a regex scan, without parsing:
``"type":"image_url"`` (OpenAI chat), ``"type":"input_image"`` and ``"type":"computer_screenshot"``
(Responses; a pruned screenshot's card counts too, as the provider counts it), ``"type":"image"`` (Anthropic),
``"inline_data":``/``"inlineData":`` (Gemini), ``"image":{`` (Bedrock) and the strings in
each Ollama ``"images":[...]`` list.

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

The CLI (``python -m trimflow._fake_provider``) logs one line per request to stderr: method, path (never
the query, which may hold ``?key=``), status, sizes, image count; never headers or body content. With
``--profile NAME`` it refuses what that limit profile (rules/profiles.yaml) refuses, as the provider would.
Every answer carries ``X-Fake-Provider-Received-Bytes``: the decoded body size it received.
"""

from __future__ import annotations

import argparse
import gzip
import ipaddress
import itertools
import math
import re
import signal
import socket
import ssl
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import TCPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import brotli
import orjson
import zstandard

from .._limit_profiles import DEFAULT_PROFILES_PATH, load_profiles, provider_check
from .._record import utc_timestamp
from .._rules import builtin_rules
from ..formats import FORMATS, streamed_path
from ._cache_model import CacheModel, CacheUsage, TooManyBreakpoints

REPLY_TEXT = "ok from fake-provider"
# The reply streamed as a few deltas; joined they give REPLY_TEXT.
REPLY_DELTAS = ("ok", " from", " fake", "-provider")
assert "".join(REPLY_DELTAS) == REPLY_TEXT

IMAGE_TOKENS = 1600
DEFAULT_PORT = 8700
DEFAULT_MODEL = "fake-model"

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


# --- usage estimate ----------------------------------------------------------------------------------------

_B64_RUN = re.compile(rb"[A-Za-z0-9+/_-]{256,}={0,2}")  # both alphabets: standard (+/) and URL-safe (-_)
_IMAGE_MARKER = re.compile(
    rb'"type"\s*:\s*"(?:image_url|input_image|computer_screenshot|image)"'  # OpenAI chat, Responses (computer use too), Anthropic
    rb'|"(?:inline_data|inlineData)"\s*:'  # Gemini, both spellings
    rb'|"image"\s*:\s*\{'  # Bedrock Converse
)
# Ollama images are raw base64 strings, which contain neither quotes nor brackets.
_OLLAMA_IMAGES = re.compile(rb'"images"\s*:\s*\[([^\]]*)\]')


def count_images(body: bytes) -> int:
    """Images in a request body of any supported format, by a cheap marker scan."""
    n = len(_IMAGE_MARKER.findall(body))
    for m in _OLLAMA_IMAGES.finditer(body):
        n += m.group(1).count(b'"') // 2
    return n


def base64_bytes(body: bytes) -> int:
    """Bytes in long base64 runs: the image payloads that count as images, not as text."""
    return sum(m.end() - m.start() for m in _B64_RUN.finditer(body))


@dataclass(frozen=True, slots=True)
class Usage:
    """The token usage the provider reports for one request (see the module docstring for the formula).

    `input_tokens` is the whole prompt. The cache fields are None when the provider models no cache
    (`FakeProvider(cache=False)`): the answers then carry the fixed zeros they always had.
    """

    input_tokens: int
    output_tokens: int
    images: int = 0
    image_tokens: int = 0
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_write_1h_tokens: int = 0
    cached_image_tokens: int = 0

    @property
    def uncached_tokens(self) -> int:
        return self.input_tokens - (self.cache_read_tokens or 0) - (self.cache_write_tokens or 0)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def cached_usage(cached: CacheUsage, images: int) -> Usage:
    """The usage of a request the cache model answered: its token counts, and the reply's output."""
    return Usage(
        input_tokens=cached.prompt_tokens,
        output_tokens=math.ceil(len(REPLY_TEXT) / 4),
        images=images,
        image_tokens=cached.image_tokens,
        cache_read_tokens=cached.cache_read_tokens,
        cache_write_tokens=cached.cache_write_tokens,
        cache_write_1h_tokens=cached.cache_write_1h_tokens,
        cached_image_tokens=cached.cached_image_tokens,
    )


def estimate_usage(body: bytes) -> Usage:
    images = count_images(body)
    text_bytes = max(len(body) - base64_bytes(body), 0)
    image_tokens = IMAGE_TOKENS * images
    return Usage(
        input_tokens=math.ceil(text_bytes / 4) + image_tokens,
        output_tokens=math.ceil(len(REPLY_TEXT) / 4),
        images=images,
        image_tokens=image_tokens,
    )


# --- routing -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Route:
    """Which format answers a path. ``stream`` is forced by the path when not None, else the body decides;
    ``unsupported`` says why the fake cannot answer this endpoint of the format (a 501)."""

    fmt: str
    model: str | None = None
    stream: bool | None = None
    unsupported: str | None = None


# Endpoints that exist but that this fake does not speak: path ending -> why (answered 501).
UNSUPPORTED = {
    "/converse-stream": "converse-stream answers in AWS binary event-stream, which fake-provider does not implement; use /converse",
    "/invoke-with-response-stream": "invoke-with-response-stream answers in AWS binary event-stream, which "
    "fake-provider does not implement; use /invoke",
    "/responses/compact": "responses/compact answers a compacted conversation, which fake-provider does not implement; use /responses",
}
# Paths whose answer is JSON whatever the body says: these APIs stream on a sibling path instead.
_NEVER_STREAMED = (":generateContent", "/converse", "/invoke")


def route(path: str) -> Route | None:
    """The format that answers ``path`` (no query), or None for a 404.

    The fake answers the paths trimflow's built-in endpoints name (the format modules own them), and
    Anthropic's token counting; the model is read from the path as trimflow reads it."""
    path = path.rstrip("/")
    if path.endswith("/messages/count_tokens"):
        return Route("anthropic-count-tokens", stream=False)
    fmt = builtin_rules().format_for("", path)
    if fmt is None:
        return None
    stream = True if streamed_path(path) else False if path.endswith(_NEVER_STREAMED) else None
    unsupported = next((why for ending, why in UNSUPPORTED.items() if path.endswith(ending)), None)
    return Route(fmt, FORMATS[fmt].model({}, path), stream, unsupported)


def wants_stream(r: Route, request_json: dict[str, Any]) -> bool:
    if r.stream is not None:
        return r.stream
    # Ollama streams unless told not to; everyone else only when asked.
    return bool(request_json.get("stream", r.fmt == "ollama"))


# --- replies -----------------------------------------------------------------------------------------------

_ids = itertools.count(1)


def _new_id(prefix: str) -> str:
    # A process-wide counter: ids are unique and reproducible run to run (no randomness).
    return f"{prefix}fake{next(_ids):06d}"


def _model(r: Route, request_json: dict[str, Any]) -> str:
    model = request_json.get("model")
    return model if isinstance(model, str) and model else (r.model or DEFAULT_MODEL)


def _chat_usage(u: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cache_read_tokens or 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _responses_usage(u: Usage) -> dict[str, Any]:
    return {
        "input_tokens": u.input_tokens,
        "input_tokens_details": {"cached_tokens": u.cache_read_tokens or 0},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.total_tokens,
    }


def _anthropic_usage(u: Usage, output_tokens: int) -> dict[str, Any]:
    # Anthropic's input_tokens is what follows the last cache breakpoint: neither read nor written.
    usage: dict[str, Any] = {
        "input_tokens": u.uncached_tokens,
        "cache_creation_input_tokens": u.cache_write_tokens or 0,
        "cache_read_input_tokens": u.cache_read_tokens or 0,
    }
    if u.cache_write_tokens is not None:
        usage["cache_creation"] = {
            "ephemeral_5m_input_tokens": u.cache_write_tokens - u.cache_write_1h_tokens,
            "ephemeral_1h_input_tokens": u.cache_write_1h_tokens,
        }
    usage["output_tokens"] = output_tokens
    usage["service_tier"] = "standard"
    return usage


def _gemini_usage(u: Usage, final: bool) -> dict[str, Any]:
    usage: dict[str, Any] = {"promptTokenCount": u.input_tokens}
    if final:
        usage["candidatesTokenCount"] = u.output_tokens
    usage["totalTokenCount"] = u.total_tokens if final else u.input_tokens
    details = [{"modality": "TEXT", "tokenCount": u.input_tokens - u.image_tokens}]
    if u.images:
        details.append({"modality": "IMAGE", "tokenCount": u.image_tokens})
    usage["promptTokensDetails"] = details
    if u.cache_read_tokens:
        # Gemini leaves out what is zero: the cached count appears only on a hit. promptTokenCount includes it.
        usage["cachedContentTokenCount"] = u.cache_read_tokens
        cached = [{"modality": "TEXT", "tokenCount": u.cache_read_tokens - u.cached_image_tokens}]
        if u.cached_image_tokens:
            cached.append({"modality": "IMAGE", "tokenCount": u.cached_image_tokens})
        usage["cacheTokensDetails"] = cached
    return usage


def _responses_message(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = []
    if status == "completed":
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def _responses_object(rid: str, request_json: dict[str, Any], model: str, status: str, output: list[Any], usage: Usage | None) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": request_json.get("instructions"),
        "max_output_tokens": request_json.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": request_json.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": request_json.get("store", True),
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": _responses_usage(usage) if usage else None,
        "user": None,
        "metadata": {},
    }


def _anthropic_message(mid: str, model: str, content: list[Any], stop: str | None, usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }


def _gemini_chunk(rid: str, model: str, text: str, usage: Usage, final: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "model"}, "index": 0}
    if final:
        candidate["finishReason"] = "STOP"
    return {
        "candidates": [candidate],
        "usageMetadata": _gemini_usage(usage, final),
        "modelVersion": model,
        "responseId": rid,
    }


def _ollama_final(model: str, usage: Usage, content: str) -> dict[str, Any]:
    return {
        "model": model,
        "created_at": utc_timestamp(),
        "message": {"role": "assistant", "content": content},
        "done": True,
        "done_reason": "stop",
        "total_duration": 1_000_000,
        "load_duration": 100_000,
        "prompt_eval_count": usage.input_tokens,
        "prompt_eval_duration": 500_000,
        "eval_count": usage.output_tokens,
        "eval_duration": 400_000,
    }


def build_json_reply(r: Route, request_json: dict[str, Any], usage: Usage) -> dict[str, Any]:
    """The non-streamed answer of format ``r.fmt`` to ``request_json``."""
    model = _model(r, request_json)
    if r.fmt == "openai-chat":
        return {
            "id": _new_id("chatcmpl-"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": REPLY_TEXT, "refusal": None, "annotations": []},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": _chat_usage(usage),
            "service_tier": "default",
            "system_fingerprint": "fp_fake",
        }
    if r.fmt == "openai-responses":
        msg = _responses_message(_new_id("msg_"), REPLY_TEXT, "completed")
        return _responses_object(_new_id("resp_"), request_json, model, "completed", [msg], usage)
    if r.fmt == "anthropic":
        return _anthropic_message(
            _new_id("msg_"),
            model,
            [{"type": "text", "text": REPLY_TEXT}],
            "end_turn",
            _anthropic_usage(usage, usage.output_tokens),
        )
    if r.fmt == "anthropic-count-tokens":
        return {"input_tokens": usage.input_tokens}
    if r.fmt == "gemini":
        return _gemini_chunk(_new_id("resp-"), model, REPLY_TEXT, usage, final=True)
    if r.fmt == "ollama":
        return _ollama_final(model, usage, REPLY_TEXT)
    if r.fmt == "bedrock-converse":
        return {
            "output": {"message": {"role": "assistant", "content": [{"text": REPLY_TEXT}]}},
            "stopReason": "end_turn",
            "usage": _bedrock_usage(usage),
            "metrics": {"latencyMs": 1},
        }
    raise ValueError(f"no JSON reply for format {r.fmt!r}")


def _bedrock_usage(u: Usage) -> dict[str, Any]:
    # Like Anthropic's, Converse's inputTokens leaves out what was read from or written to the cache.
    usage: dict[str, Any] = {"inputTokens": u.uncached_tokens, "outputTokens": u.output_tokens, "totalTokens": u.total_tokens}
    if u.cache_read_tokens is not None:
        usage["cacheReadInputTokens"] = u.cache_read_tokens
        usage["cacheWriteInputTokens"] = u.cache_write_tokens or 0
    return usage


def stream_content_type(r: Route, sse: bool) -> str:
    if r.fmt == "ollama":
        return "application/x-ndjson"
    if r.fmt == "gemini" and not sse:
        return "application/json; charset=UTF-8"
    return "text/event-stream; charset=utf-8"


def _sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


def iter_stream_events(r: Route, request_json: dict[str, Any], usage: Usage, *, sse: bool = True) -> Iterator[bytes]:
    """The streamed answer as wire frames, one event each: SSE events, NDJSON lines or Google JSON-array items.

    ``sse`` only matters for Gemini (``?alt=sse``); every other streaming format has a single framing.
    """
    model = _model(r, request_json)
    if r.fmt == "openai-chat":
        yield from _chat_events(request_json, model, usage)
    elif r.fmt == "openai-responses":
        yield from _responses_events(request_json, model, usage)
    elif r.fmt == "anthropic":
        yield from _anthropic_events(model, usage)
    elif r.fmt == "gemini":
        yield from _gemini_events(model, usage, sse)
    elif r.fmt == "ollama":
        for delta in REPLY_DELTAS:
            message = {"role": "assistant", "content": delta}
            line = {"model": model, "created_at": utc_timestamp(), "message": message, "done": False}
            yield orjson.dumps(line) + b"\n"
        yield orjson.dumps(_ollama_final(model, usage, "")) + b"\n"
    else:
        raise ValueError(f"no stream for format {r.fmt!r}")


def _chat_events(request_json: dict[str, Any], model: str, usage: Usage) -> Iterator[bytes]:
    opts = request_json.get("stream_options")
    include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
    cid, created = _new_id("chatcmpl-"), int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        c: dict[str, Any] = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            c["usage"] = None  # real chunks carry "usage": null until the last one
        return c

    yield _sse(chunk({"role": "assistant", "content": "", "refusal": None}, None))
    for delta in REPLY_DELTAS:
        yield _sse(chunk({"content": delta}, None))
    yield _sse(chunk({}, "stop"))
    if include_usage:
        last = chunk({}, None)
        last["choices"] = []
        last["usage"] = _chat_usage(usage)
        yield _sse(last)
    yield b"data: [DONE]\n\n"


def _responses_events(request_json: dict[str, Any], model: str, usage: Usage) -> Iterator[bytes]:
    rid, item_id = _new_id("resp_"), _new_id("msg_")
    seq = itertools.count()

    def ev(kind: str, **fields: Any) -> bytes:
        return _sse({"type": kind, "sequence_number": next(seq), **fields}, kind)

    def response(status: str, output: list[Any], u: Usage | None) -> dict[str, Any]:
        return _responses_object(rid, request_json, model, status, output, u)

    empty_part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    done_part = {**empty_part, "text": REPLY_TEXT}
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    yield ev("response.created", response=response("in_progress", [], None))
    yield ev("response.in_progress", response=response("in_progress", [], None))
    yield ev("response.output_item.added", output_index=0, item=_responses_message(item_id, "", "in_progress"))
    yield ev("response.content_part.added", **where, part=empty_part)
    for delta in REPLY_DELTAS:
        yield ev("response.output_text.delta", **where, delta=delta, logprobs=[])
    yield ev("response.output_text.done", **where, text=REPLY_TEXT, logprobs=[])
    yield ev("response.content_part.done", **where, part=done_part)
    item = _responses_message(item_id, REPLY_TEXT, "completed")
    yield ev("response.output_item.done", output_index=0, item=item)
    yield ev("response.completed", response=response("completed", [item], usage))


def _anthropic_events(model: str, usage: Usage) -> Iterator[bytes]:
    start = _anthropic_message(_new_id("msg_"), model, [], None, _anthropic_usage(usage, 1))
    yield _sse({"type": "message_start", "message": start}, "message_start")
    block = {"type": "text", "text": ""}
    yield _sse({"type": "content_block_start", "index": 0, "content_block": block}, "content_block_start")
    yield _sse({"type": "ping"}, "ping")
    for delta in REPLY_DELTAS:
        data = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": delta}}
        yield _sse(data, "content_block_delta")
    yield _sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
    stop = {"stop_reason": "end_turn", "stop_sequence": None}
    data = {"type": "message_delta", "delta": stop, "usage": {"output_tokens": usage.output_tokens}}
    yield _sse(data, "message_delta")
    yield _sse({"type": "message_stop"}, "message_stop")


def _gemini_events(model: str, usage: Usage, sse: bool) -> Iterator[bytes]:
    rid = _new_id("resp-")
    last = len(REPLY_DELTAS) - 1
    for i, delta in enumerate(REPLY_DELTAS):
        data = orjson.dumps(_gemini_chunk(rid, model, delta, usage, final=i == last))
        if sse:
            yield b"data: " + data + b"\r\n\r\n"  # Google ends SSE events with CRLF CRLF
        else:
            # Without alt=sse Google streams one JSON array, item by item.
            yield (b"[" if i == 0 else b"\n,\r\n") + data
    if not sse:
        yield b"]"


def error_body(kind: str, message: str) -> bytes:
    return orjson.dumps({"error": {"type": kind, "message": message}})


# --- body decoding -----------------------------------------------------------------------------------------


def decode_body(wire: bytes, content_encoding: str) -> bytes:
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

    def send_body(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
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
        script: Callable[[str, dict[str, Any], Usage, bool, bool], tuple[str, list[bytes]] | None] | None = None,
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
        self.received: list[Received] = []
        self._received_lock = threading.Lock()
        self._server = _Server((host, port), self, tls, family)
        self.host = host
        self.port: int = self._server.server_port
        url_host = f"[{host}]" if family == socket.AF_INET6 else host
        self.url = f"{'https' if tls else 'http'}://{url_host}:{self.port}"
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
            body = decode_body(wire, headers.get("content-encoding", ""))
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

        def send(status: int, content_type: str, body: bytes) -> None:
            out.status, out.sent = status, True
            h.send_body(status, content_type, body)

        if self.check is not None and (answer := self.check(rec)) is not None:
            out.fmt = "check"
            send(*answer)
            return
        if decode_error is not None:
            send(400, "application/json", error_body("invalid_request_error", f"fake-provider: {decode_error}"))
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
        usage = estimate_usage(rec.body)
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


# --- CLI ---------------------------------------------------------------------------------------------------


def _stderr_log(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fake-provider",
        description="An offline LLM provider on loopback (OpenAI chat/Responses, Anthropic, Gemini, Ollama, "
        "Bedrock Converse) that answers a fixed reply with realistic usage. Runs until Ctrl-C.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0: any free")
    parser.add_argument("--event-delay-ms", type=float, default=0.0, help="pause between streamed events")
    parser.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-key", help="the certificate's private key (PEM)")
    parser.add_argument(
        "--profile",
        help="refuse requests that break this limit profile, with the provider's own status, content type and text (names: rules/profiles.yaml)",
    )
    parser.add_argument("--profiles", default=str(DEFAULT_PROFILES_PATH), help="the profiles file (default: %(default)s)")
    parser.add_argument(
        "--cache",
        action="store_true",
        help="model each provider's prompt caching (reads, writes, TTL) and report it in the usage as the real API does",
    )
    args = parser.parse_args(argv)

    if not is_loopback(args.host):
        print(
            f"fake-provider: refusing to listen on {args.host!r}: only loopback hosts (127.0.0.1, ::1, localhost) are allowed",
            file=sys.stderr,
        )
        return 2
    if bool(args.tls_cert) != bool(args.tls_key):
        print("fake-provider: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    check = None
    if args.profile:
        try:
            check = provider_check(load_profiles(args.profiles).get(args.profile))
        except ValueError as e:  # ProfilesError (file:line: problem) or UnknownProfile (lists the names)
            print(f"fake-provider: {e}", file=sys.stderr)
            return 2
    try:
        provider = FakeProvider(
            args.host,
            args.port,
            certfile=args.tls_cert,
            keyfile=args.tls_key,
            event_delay=max(args.event_delay_ms, 0.0) / 1000,
            log=_stderr_log,
            check=check,
            record=False,
            cache=args.cache,
        )
    except (OSError, ssl.SSLError) as e:
        print(f"fake-provider: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    provider.start()
    enforcing = f", refusing like profile {args.profile}" if args.profile else ""
    caching = ", modelling prompt caching" if args.cache else ""
    print(f"fake-provider listening on {provider.url}{enforcing}{caching}", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        provider.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
