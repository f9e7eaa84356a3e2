"""Hostile request bodies on LLM paths: each case, the wire coding it is sent in, and what must happen to it.

Every hostile body is either pruned correctly or forwarded byte-identical with one log line saying why, and
no log line quotes it. The engine and the addon are checked on these in test_hostile.py, a real mitmdump
in tests/e2e/test_load_faults.py.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

import orjson
import pytest
import zstandard

from trimflow import prune_request
from trimflow._rules_file import parse_rules
from trimflow.formats import FORMATS
from trimflow.testing import PATHS, b64, data_url, image, session_body

from ..bombs import MiB, gzip_bomb

HOST = "api.example.test"
MAX_IMAGES = 2
RULES_TEXT = f"defaults:\n  max_images: {MAX_IMAGES}\n  keep_recent: 1\n  max_body_bytes: 16MiB\n"
RULES = parse_rules(RULES_TEXT, "hostile-rules.yaml")
SHOT = image(48, 32, "PNG", seed=81)

PRUNED = "pruned"  # pruned to MAX_IMAGES (or `images_after`), the rest of the body as sent
AS_SENT = "as-sent"  # a valid LLM request with nothing to prune: byte-identical, no complaint
UNTOUCHED = "untouched"  # cannot be handled: byte-identical, one log line saying why


def marker(case_id: str) -> str:
    """Text planted in a case's body; no log line or error message may quote it."""
    return f"hostile-marker-{case_id}"


def session_json(fmt: str, mark: str, turns: int = 5, shot: bytes = SHOT) -> bytes:
    """A whole-history body with `turns` screenshots and `mark` in every question."""
    body = orjson.dumps(session_body(fmt, turns, shot, "image/png"))
    return body.replace(b"What should I click next?", f"What should I click next? {mark}".encode())


def _with(fmt: str, mark: str, tail: bytes) -> bytes:
    """The session body with extra top-level members written verbatim (numbers orjson cannot write)."""
    return session_json(fmt, mark)[:-1] + b"," + tail + b"}"


def _chat(mark: str, content: list | str | int | dict | None, **extra) -> bytes:
    return orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": content}, {"role": "user", "content": mark}], **extra})


def _image_part(url) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


@cache
def _pool(count: int, kilobytes: int) -> tuple[str, ...]:
    """Distinct real PNGs of about `kilobytes` KB each, as base64."""
    side = int((kilobytes * 1024 / 3) ** 0.5)
    return tuple(b64(image(side, side, "PNG", seed=900 + i)) for i in range(count))


@cache  # built once for the engine and the addon tests
def big_valid_body(mark: str, megabytes: int = 40) -> bytes:
    """A valid OpenAI chat body of about `megabytes` MB: screenshots of ~1 MB in 30-odd user turns."""
    pool = _pool(6, 768)
    messages, size, turn = [], 0, 0
    while size < megabytes * 1_000_000:
        shot = pool[turn % len(pool)]
        messages.append({"role": "user", "content": [{"type": "text", "text": f"turn {turn} {mark}"}, _image_part(f"data:image/png;base64,{shot}")]})
        messages.append({"role": "assistant", "content": f"answer {turn}"})
        size += len(shot) + 100
        turn += 1
    return orjson.dumps({"model": "gpt-4o", "messages": messages})


@cache
def tiny_parts_body(mark: str) -> bytes:
    """100,000 text parts and 300 one-pixel images in one message."""
    dot = data_url(image(1, 1, "PNG", seed=3), "image/png")
    parts = [{"type": "text", "text": f"{i}"} for i in range(100_000)]
    for i in range(300):
        parts.insert(i * 300, _image_part(dot))
    return orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": parts + [{"type": "text", "text": mark}]}]})


@cache
def huge_data_url_body(mark: str) -> bytes:
    """One image part whose data URL is 100 MB of fake base64, then three real screenshots."""
    fake = "data:image/png;base64," + "QUFB" * 25_000_000
    parts = [_image_part(fake)] + [_image_part(data_url(image(40, 30, "PNG", seed=s), "image/png")) for s in (1, 2, 3)]
    return orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": parts + [{"type": "text", "text": mark}]}]})


def deep(kind: str, depth: int = 10_000) -> bytes:
    opening, closing = (b"[", b"]") if kind == "list" else (b'{"a":', b"}")
    inner = b"1" if kind == "dict" else b""
    return opening * depth + inner + closing * depth


def sigv4_headers(body: bytes) -> dict[str, str]:
    """What an AWS SDK sends: the signature covers a hash of the body, so any edit breaks it."""
    return {
        "authorization": "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20250101/us-east-1/bedrock/aws4_request, "
        "SignedHeaders=content-type;host;x-amz-content-sha256;x-amz-date, Signature=" + "0" * 64,
        "x-amz-date": "20250101T000000Z",
        "x-amz-content-sha256": hashlib.sha256(body).hexdigest(),
    }


@dataclass(frozen=True)
class Hostile:
    """One hostile request: its body (decoded), the wire coding, and what must happen to it."""

    id: str
    fmt: str  # the wire format whose path it is sent to
    build: Callable[[str], bytes]  # the body before any content-encoding, from the case's marker
    outcome: str
    why: str | None = None  # what the reason (and the log line) says, for UNTOUCHED
    coding: str | None = None  # Content-Encoding on the wire
    encode: Callable[[bytes], bytes] | None = None  # how the wire body is made from the plain one
    signed: bool = False  # SigV4 headers over the wire body
    images_after: int = MAX_IMAGES
    keep: tuple[bytes, ...] = ()  # byte strings the pruned body must still hold exactly
    engine: bool = True  # the case has no content-encoding: the engine sees the same bytes
    e2e: bool = True  # cheap enough for the end-to-end run
    headers: dict[str, str] = field(default_factory=dict)

    def plain(self) -> bytes:
        return self.build(marker(self.id))

    def wire(self, plain: bytes | None = None) -> bytes:
        plain = self.plain() if plain is None else plain
        return self.encode(plain) if self.encode else plain

    def request_headers(self, wire: bytes) -> dict[str, str]:
        headers = {"content-type": "application/json", **self.headers}
        if self.coding:
            headers["content-encoding"] = self.coding
        if self.signed:
            headers.update(sigv4_headers(wire))
        return headers

    @property
    def path(self) -> str:
        return PATHS[self.fmt]

    @property
    def url(self) -> str:
        return f"https://{HOST}{self.path}"


CHAT, ANTHROPIC, GEMINI, RESPONSES, BEDROCK, OLLAMA = "openai-chat", "anthropic", "gemini", "openai-responses", "bedrock-converse", "ollama"
_WRONG_CHAT_CONTENT = [
    42,
    None,
    "str",
    [1, 2],
    {"type": "image_url"},
    {"type": "image_url", "image_url": 7},
    {"type": "image_url", "image_url": {"url": None}},
    {"type": "image_url", "image_url": {"url": 5}},
    {"type": "image_url", "image_url": {"url": ["data:image/png;base64,AAAA"]}},
    {"type": 7},
]

HOSTILE: list[Hostile] = [
    # Not JSON at all.
    Hostile(
        "invalid-json", CHAT, lambda m: b'{"model":"gpt-4o","messages":[{"role":"user","content":"' + m.encode() + b'"}],,}', UNTOUCHED, "not JSON"
    ),
    Hostile("truncated-json", CHAT, lambda m: session_json(CHAT, m)[:-2000], UNTOUCHED, "not JSON"),
    Hostile("trailing-garbage", CHAT, lambda m: session_json(CHAT, m) + b" {}", UNTOUCHED, "not JSON"),
    Hostile("json-with-comments", CHAT, lambda m: b"/* " + m.encode() + b" */" + session_json(CHAT, m), UNTOUCHED, "not JSON"),
    Hostile("single-quotes", ANTHROPIC, lambda m: b"{'model': 'claude', 'messages': '" + m.encode() + b"'}", UNTOUCHED, "not JSON"),
    Hostile("empty-body", CHAT, lambda m: b"", UNTOUCHED, "not JSON"),
    Hostile("whitespace-only", GEMINI, lambda m: b" \r\n\t ", UNTOUCHED, "not JSON"),
    Hostile("utf8-bom", ANTHROPIC, lambda m: b"\xef\xbb\xbf" + session_json(ANTHROPIC, m), UNTOUCHED, "BOM"),
    Hostile("invalid-utf8", CHAT, lambda m: session_json(CHAT, m).replace(m.encode(), m.encode() + b" \xff\xfe\xc3("), UNTOUCHED, "not UTF-8"),
    Hostile("utf16-body", CHAT, lambda m: session_json(CHAT, m).decode().encode("utf-16"), UNTOUCHED, "not"),
    # JSON, but not an object.
    Hostile("top-level-array", CHAT, lambda m: b"[" + session_json(CHAT, m) + b"]", UNTOUCHED, "JSON array, not an object"),
    Hostile("top-level-string", ANTHROPIC, lambda m: orjson.dumps(m), UNTOUCHED, "JSON string, not an object"),
    Hostile("top-level-number", GEMINI, lambda m: b"12345", UNTOUCHED, "JSON number, not an object"),
    Hostile("top-level-null", RESPONSES, lambda m: b"null", UNTOUCHED, "not an object"),
    Hostile(
        "nested-10000-lists",
        CHAT,
        lambda m: b'{"model":"gpt-4o","m":"' + m.encode() + b'","messages":' + deep("list") + b"}",
        UNTOUCHED,
        "nested too deeply",
    ),
    Hostile(
        "nested-10000-objects",
        ANTHROPIC,
        lambda m: b'{"model":"claude","m":"' + m.encode() + b'","messages":[],"x":' + deep("dict") + b"}",
        UNTOUCHED,
        "nested too deeply",
    ),
    # Valid JSON the fast parser refuses or misreads: the exact parser takes it, values kept as sent.
    Hostile(
        "integers-over-64-bits",
        CHAT,
        lambda m: _with(CHAT, m, b'"seed":123456789012345678901234567890,"n":-9223372036854775809'),
        PRUNED,
        keep=(b"123456789012345678901234567890", b"-9223372036854775809"),
    ),
    Hostile(
        "integers-over-64-bits-with-nan",
        CHAT,
        lambda m: _with(CHAT, m, b'"seed":123456789012345678901234567890,"t":NaN'),
        PRUNED,
        keep=(b"123456789012345678901234567890",),
    ),
    Hostile(
        "nan-and-infinity",
        ANTHROPIC,
        lambda m: _with(ANTHROPIC, m, b'"temperature":NaN,"top_p":-Infinity,"top_k":Infinity'),
        PRUNED,
        keep=(b'"temperature":NaN', b'"top_p":-Infinity', b'"top_k":Infinity'),
    ),
    # A double overflows: read as inf, it would be written back as Infinity, which is not JSON.
    Hostile("number-overflowing-a-double", GEMINI, lambda m: _with(GEMINI, m, b'"x":1e400'), UNTOUCHED, "number too large"),
    Hostile(
        "lone-surrogates",
        CHAT,
        lambda m: session_json(CHAT, m).replace(m.encode(), m.encode() + rb" \ud800 \udfff"),
        PRUNED,
        keep=(rb"\ud800", rb"\udfff"),
    ),
    Hostile("nul-and-control-escapes", BEDROCK, lambda m: session_json(BEDROCK, m).replace(m.encode(), m.encode() + rb" \u0000\u001f\b"), PRUNED),
    Hostile(
        "duplicate-keys",
        CHAT,
        lambda m: (
            session_json(CHAT, m, turns=1)[:-1] + b',"messages":' + orjson.dumps(orjson.loads(session_json(CHAT, m, turns=4))["messages"]) + b"}"
        ),
        PRUNED,
    ),  # the last one wins, as in Python, Go and JavaScript; the pruned body holds it once
    # LLM requests of the wrong shape: nothing to prune, forwarded as sent.
    Hostile("messages-a-string", CHAT, lambda m: orjson.dumps({"model": "gpt-4o", "messages": m}), AS_SENT),
    Hostile("messages-an-object", ANTHROPIC, lambda m: orjson.dumps({"model": "claude", "messages": {"0": {"role": "user", "content": m}}}), AS_SENT),
    Hostile("messages-null", OLLAMA, lambda m: orjson.dumps({"model": "llava", "messages": None, "m": m}), AS_SENT),
    Hostile(
        "content-of-wrong-types",
        CHAT,
        lambda m: orjson.dumps(
            {
                "model": "gpt-4o",
                "messages": (
                    [{"role": "user", "content": c} for c in _WRONG_CHAT_CONTENT]
                    + [{"role": "user", "content": _WRONG_CHAT_CONTENT}, {"role": "user", "content": m}, 5, None, "x"]
                ),
            }
        ),
        AS_SENT,
    ),
    Hostile(
        "anthropic-wrong-types",
        ANTHROPIC,
        lambda m: orjson.dumps(
            {
                "model": "claude",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "source": "x"},
                            {"type": "image", "source": {"type": "base64", "data": 5}},
                            {"type": "tool_result", "content": 7},
                            {"type": "tool_result", "content": [None, 1, {"type": "image", "source": None}]},
                            {"type": "document", "source": {"type": "text", "data": m}},
                        ],
                    }
                ],
            }
        ),
        AS_SENT,
    ),
    Hostile(
        "gemini-wrong-types",
        GEMINI,
        lambda m: orjson.dumps(
            {"contents": [{"parts": {"text": m}}, {"parts": [{"inlineData": []}, {"inlineData": {"data": 5}}, {"inline_data": None}, 7]}, "x", None]}
        ),
        AS_SENT,
    ),
    Hostile("responses-input-a-string", RESPONSES, lambda m: orjson.dumps({"model": "gpt-4.1", "input": m}), AS_SENT),
    Hostile(
        "ollama-images-wrong-types",
        OLLAMA,
        lambda m: orjson.dumps(
            {"model": "llava", "messages": [{"role": "user", "content": m, "images": "AAAA"}, {"role": "user", "images": [1, None, {}]}]}
        ),
        AS_SENT,
    ),
    Hostile(
        "bedrock-wrong-types",
        BEDROCK,
        lambda m: orjson.dumps(
            {
                "messages": [
                    {"role": "user", "content": {"text": m}},
                    {"role": "user", "content": [{"image": {"source": {"bytes": 5}}}, {"image": "x"}]},
                ]
            }
        ),
        AS_SENT,
    ),
    # Media that is not what it claims.
    Hostile("data-url-with-garbage-base64", CHAT, lambda m: _chat(m, [_image_part("data:image/png;base64,!!!not@@base64%%")] * 4), PRUNED),
    Hostile("data-url-without-base64", CHAT, lambda m: _chat(m, [_image_part("data:image/png,raw bytes")] * 3), PRUNED),
    Hostile("image-part-with-100mb-fake-data-url", CHAT, huge_data_url_body, PRUNED, e2e=False),
    Hostile("100000-tiny-parts", CHAT, tiny_parts_body, PRUNED),
    Hostile("40mb-valid-body", CHAT, big_valid_body, PRUNED),
    # Signed: any change would break the signature.
    Hostile("sigv4-signed-bedrock", BEDROCK, lambda m: session_json(BEDROCK, m), UNTOUCHED, "SigV4", signed=True),
    # Content-Encoding: the engine never sees these bytes, the addon decodes them first.
    Hostile("gzip-body", ANTHROPIC, lambda m: session_json(ANTHROPIC, m), PRUNED, coding="gzip", encode=gzip.compress, engine=False),
    Hostile(
        "zstd-body",
        RESPONSES,
        lambda m: session_json(RESPONSES, m),
        PRUNED,
        coding="zstd",
        encode=lambda b: zstandard.ZstdCompressor().compress(b),
        engine=False,
    ),  # what Codex sends
    Hostile("deflate-body", CHAT, lambda m: session_json(CHAT, m), PRUNED, coding="deflate", encode=zlib.compress, engine=False),
    Hostile(
        "gzip-bomb", CHAT, lambda m: b"", UNTOUCHED, "decodes to more than 16.0MB", coding="gzip", encode=lambda _: gzip_bomb(64 * MiB), engine=False
    ),  # with the addon's limit at 16MiB (the fixture): cheap, yet four times over it
    Hostile("wrong-content-encoding", CHAT, lambda m: session_json(CHAT, m), UNTOUCHED, "gzip", coding="gzip", engine=False),
    Hostile(
        "truncated-gzip",
        ANTHROPIC,
        lambda m: session_json(ANTHROPIC, m),
        UNTOUCHED,
        "",
        coding="gzip",
        encode=lambda b: gzip.compress(b)[:-1000],
        engine=False,
    ),
    Hostile("unknown-content-encoding", CHAT, lambda m: session_json(CHAT, m), UNTOUCHED, "compress", coding="compress", engine=False),
    Hostile(
        "stacked-content-encodings",
        CHAT,
        lambda m: session_json(CHAT, m),
        UNTOUCHED,
        "gzip, gzip",
        coding="gzip, gzip",
        encode=lambda b: gzip.compress(gzip.compress(b)),
        engine=False,
    ),
    # Python codec names mitmproxy's decoder applies (bz2 is a bomb of its own): not HTTP codings.
    Hostile(
        "bz2-content-encoding",
        CHAT,
        lambda m: session_json(CHAT, m),
        UNTOUCHED,
        "bz2",
        coding="bz2",
        encode=lambda b: __import__("bz2").compress(b),
        engine=False,
    ),
    Hostile(
        "base64-content-encoding",
        CHAT,
        lambda m: session_json(CHAT, m),
        UNTOUCHED,
        "base64",
        coding="base64",
        encode=base64.encodebytes,
        engine=False,
    ),
]
assert len({case.id for case in HOSTILE}) == len(HOSTILE)


def params(cases: list[Hostile]) -> list:
    return [pytest.param(c, id=c.id) for c in cases]


def image_count(fmt: str, body: bytes) -> int:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = json.loads(body)
    return sum(1 for m in FORMATS[fmt].find_media(parsed) if m.kind == "image")


def expected_body(case: Hostile, plain: bytes) -> bytes:
    """What must go upstream (before re-encoding): the engine's output for the decoded body."""
    return prune_request(case.url, case.request_headers(case.wire(plain)), plain, RULES).body


def _reserialised(body: bytes) -> bytes:
    try:
        return orjson.dumps(orjson.loads(body))
    except orjson.JSONDecodeError:
        return json.dumps(json.loads(body)).encode()


def check_pruned(case: Hostile, plain: bytes, out: bytes) -> None:
    assert out != plain
    _reserialised(out)  # valid JSON (for the exact parser: NaN stays NaN where it came as NaN)
    assert image_count(case.fmt, out) == case.images_after
    for kept in case.keep:
        assert kept in out
    mark = marker(case.id)
    # The text is all there (as a parser that keeps the last of duplicate keys reads the body).
    assert _reserialised(plain).count(mark.encode()) == out.count(mark.encode())
