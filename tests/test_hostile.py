"""Hostile request bodies on LLM paths, through the engine and through the addon's hooks (mitmproxy's
taddons/tflow); runtime faults (rules file gone or broken, metrics unwritable, catastrophic globs).

Every hostile body is either pruned correctly or forwarded byte-identical with one log line saying why,
no log line quotes it, and the next request is served. The cases (HOSTILE) also run end to end through a
real mitmdump in tests/e2e/test_load_faults.py.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import logging
import os
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import orjson
import pytest
import zstandard
from mitmproxy import http
from mitmproxy.test import taddons, tflow, tutils

from trimflow import prune_request
from trimflow._rules import RulesFile, parse_rules
from trimflow.testing import PATHS, b64, data_url, image, session_body
from trimflow.formats import FORMATS

from .helpers import TrimflowAddons, answer_sent, requested
from .test_decode import MiB, gzip_bomb

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
_WRONG_CHAT_CONTENT = [42, None, "str", [1, 2], {"type": "image_url"}, {"type": "image_url", "image_url": 7},
                       {"type": "image_url", "image_url": {"url": None}}, {"type": "image_url", "image_url": {"url": 5}},
                       {"type": "image_url", "image_url": {"url": ["data:image/png;base64,AAAA"]}}, {"type": 7}]

HOSTILE: list[Hostile] = [
    # Not JSON at all.
    Hostile("invalid-json", CHAT, lambda m: b'{"model":"gpt-4o","messages":[{"role":"user","content":"' + m.encode() + b'"}],,}', UNTOUCHED, "not JSON"),
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
    Hostile("nested-10000-lists", CHAT, lambda m: b'{"model":"gpt-4o","m":"' + m.encode() + b'","messages":' + deep("list") + b"}", UNTOUCHED, "nested too deeply"),
    Hostile("nested-10000-objects", ANTHROPIC, lambda m: b'{"model":"claude","m":"' + m.encode() + b'","messages":[],"x":' + deep("dict") + b"}", UNTOUCHED, "nested too deeply"),
    # Valid JSON the fast parser refuses or misreads: the exact parser takes it, values kept as sent.
    Hostile("integers-over-64-bits", CHAT, lambda m: _with(CHAT, m, b'"seed":123456789012345678901234567890,"n":-9223372036854775809'), PRUNED,
            keep=(b"123456789012345678901234567890", b"-9223372036854775809")),
    Hostile("integers-over-64-bits-with-nan", CHAT, lambda m: _with(CHAT, m, b'"seed":123456789012345678901234567890,"t":NaN'), PRUNED,
            keep=(b"123456789012345678901234567890",)),
    Hostile("nan-and-infinity", ANTHROPIC, lambda m: _with(ANTHROPIC, m, b'"temperature":NaN,"top_p":-Infinity,"top_k":Infinity'), PRUNED,
            keep=(b'"temperature":NaN', b'"top_p":-Infinity', b'"top_k":Infinity')),
    # A double overflows: read as inf, it would be written back as Infinity, which is not JSON.
    Hostile("number-overflowing-a-double", GEMINI, lambda m: _with(GEMINI, m, b'"x":1e400'), UNTOUCHED, "number too large"),
    Hostile("lone-surrogates", CHAT, lambda m: session_json(CHAT, m).replace(m.encode(), m.encode() + rb" \ud800 \udfff"), PRUNED, keep=(rb"\ud800", rb"\udfff")),
    Hostile("nul-and-control-escapes", BEDROCK, lambda m: session_json(BEDROCK, m).replace(m.encode(), m.encode() + rb" \u0000\u001f\b"), PRUNED),
    Hostile("duplicate-keys", CHAT, lambda m: session_json(CHAT, m, turns=1)[:-1] + b',"messages":' + orjson.dumps(orjson.loads(session_json(CHAT, m, turns=4))["messages"]) + b"}",
            PRUNED),  # the last one wins, as in Python, Go and JavaScript; the pruned body holds it once
    # LLM requests of the wrong shape: nothing to prune, forwarded as sent.
    Hostile("messages-a-string", CHAT, lambda m: orjson.dumps({"model": "gpt-4o", "messages": m}), AS_SENT),
    Hostile("messages-an-object", ANTHROPIC, lambda m: orjson.dumps({"model": "claude", "messages": {"0": {"role": "user", "content": m}}}), AS_SENT),
    Hostile("messages-null", OLLAMA, lambda m: orjson.dumps({"model": "llava", "messages": None, "m": m}), AS_SENT),
    Hostile("content-of-wrong-types", CHAT, lambda m: orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": c} for c in _WRONG_CHAT_CONTENT]
                                                                   + [{"role": "user", "content": _WRONG_CHAT_CONTENT}, {"role": "user", "content": m}, 5, None, "x"]}), AS_SENT),
    Hostile("anthropic-wrong-types", ANTHROPIC, lambda m: orjson.dumps({"model": "claude", "messages": [
        {"role": "user", "content": [{"type": "image", "source": "x"}, {"type": "image", "source": {"type": "base64", "data": 5}},
                                     {"type": "tool_result", "content": 7}, {"type": "tool_result", "content": [None, 1, {"type": "image", "source": None}]},
                                     {"type": "document", "source": {"type": "text", "data": m}}]}]}), AS_SENT),
    Hostile("gemini-wrong-types", GEMINI, lambda m: orjson.dumps({"contents": [{"parts": {"text": m}}, {"parts": [{"inlineData": []}, {"inlineData": {"data": 5}}, {"inline_data": None}, 7]}, "x", None]}), AS_SENT),
    Hostile("responses-input-a-string", RESPONSES, lambda m: orjson.dumps({"model": "gpt-4.1", "input": m}), AS_SENT),
    Hostile("ollama-images-wrong-types", OLLAMA, lambda m: orjson.dumps({"model": "llava", "messages": [{"role": "user", "content": m, "images": "AAAA"}, {"role": "user", "images": [1, None, {}]}]}), AS_SENT),
    Hostile("bedrock-wrong-types", BEDROCK, lambda m: orjson.dumps({"messages": [{"role": "user", "content": {"text": m}}, {"role": "user", "content": [{"image": {"source": {"bytes": 5}}}, {"image": "x"}]}]}), AS_SENT),
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
    Hostile("zstd-body", RESPONSES, lambda m: session_json(RESPONSES, m), PRUNED, coding="zstd",
            encode=lambda b: zstandard.ZstdCompressor().compress(b), engine=False),  # what Codex sends
    Hostile("deflate-body", CHAT, lambda m: session_json(CHAT, m), PRUNED, coding="deflate", encode=zlib.compress, engine=False),
    Hostile("gzip-bomb", CHAT, lambda m: b"", UNTOUCHED, "decodes to more than 16.0MB", coding="gzip", encode=lambda _: gzip_bomb(64 * MiB),
            engine=False),  # with the addon's limit at 16MiB (the fixture): cheap, yet four times over it
    Hostile("wrong-content-encoding", CHAT, lambda m: session_json(CHAT, m), UNTOUCHED, "gzip", coding="gzip", engine=False),
    Hostile("truncated-gzip", ANTHROPIC, lambda m: session_json(ANTHROPIC, m), UNTOUCHED, "", coding="gzip",
            encode=lambda b: gzip.compress(b)[:-1000], engine=False),
    Hostile("unknown-content-encoding", CHAT, lambda m: session_json(CHAT, m), UNTOUCHED, "compress", coding="compress", engine=False),
    Hostile("stacked-content-encodings", CHAT, lambda m: session_json(CHAT, m), UNTOUCHED, "gzip, gzip", coding="gzip, gzip",
            encode=lambda b: gzip.compress(gzip.compress(b)), engine=False),
    # Python codec names mitmproxy's decoder applies (bz2 is a bomb of its own): not HTTP codings.
    Hostile("bz2-content-encoding", CHAT, lambda m: session_json(CHAT, m), UNTOUCHED, "bz2", coding="bz2",
            encode=lambda b: __import__("bz2").compress(b), engine=False),
    Hostile("base64-content-encoding", CHAT, lambda m: session_json(CHAT, m), UNTOUCHED, "base64", coding="base64",
            encode=base64.encodebytes, engine=False),
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


# --- the engine ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", params([c for c in HOSTILE if c.engine]))
def test_engine_prunes_or_returns_the_same_bytes_with_a_reason(case: Hostile) -> None:
    body = case.wire()
    outcome = prune_request(case.url, case.request_headers(body), body, RULES)
    record = outcome.record
    assert record is not None  # an LLM path: always a record
    if case.outcome == PRUNED:
        assert record.reason is None and record.pruned > 0
        check_pruned(case, body, outcome.body)
        again = prune_request(case.url, {}, outcome.body, RULES)
        assert again.body == outcome.body  # idempotent
    else:
        assert outcome.body is body  # the very bytes: nothing re-serialised
        assert record.pruned == 0 or record.mode == "observe"
        if case.outcome == UNTOUCHED:
            assert record.reason and case.why in record.reason
        else:
            assert record.reason is None
    assert record.reason is None or "internal error" not in record.reason
    assert marker(case.id) not in (record.reason or "") and marker(case.id) not in record.summary()


# --- the addon ----------------------------------------------------------------------------------------------




def make_flow(path: str, wire: bytes, headers: dict[str, str]) -> http.HTTPFlow:
    request = tutils.treq(host=HOST, port=443, scheme=b"https", method=b"POST", authority=b"", path=path.encode(),
                          headers=http.Headers([(k.encode(), v.encode()) for k, v in headers.items()]), content=b"")
    request.raw_content = wire  # as it came off the wire, content-encoding and all
    request.headers["content-length"] = str(len(wire))
    return tflow.tflow(req=request)


NORMAL = "normal-request-text-5b1"


def normal_flow() -> http.HTTPFlow:
    return make_flow(PATHS[CHAT], session_json(CHAT, NORMAL), {"content-type": "application/json"})


@pytest.fixture
def addon(tmp_path):
    instance = TrimflowAddons()
    with taddons.context(instance) as tctx:
        rules = tmp_path / "rules.yaml"
        rules.write_text(RULES_TEXT)
        tctx.configure(instance, trimflow_rules=str(rules), trimflow_metrics=str(tmp_path / "metrics.jsonl"), trimflow_max_decoded_bytes="16MiB")
        instance.tctx = tctx
        instance.metrics_path = tmp_path / "metrics.jsonl"
        yield instance


def trimflow_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "trimflow"]


async def answer(addon, flow: http.HTTPFlow) -> None:
    """The provider's answer, through the response hooks, and the addon's flush after it (FLUSH_DELAY)."""
    flow.response = tutils.tresp(content=b'{"usage":{"prompt_tokens":7}}', headers=http.Headers(content_type="application/json"))
    addon.responseheaders(flow)
    addon.response(flow)
    await answer_sent()


@pytest.mark.parametrize("case", params(HOSTILE))
async def test_addon_prunes_or_forwards_byte_identical_with_one_line_why(addon, caplog, case: Hostile) -> None:
    plain = case.plain()
    wire = case.wire(plain)
    flow = make_flow(case.path, wire, case.request_headers(wire))
    with caplog.at_level(logging.INFO, logger="trimflow"):
        await requested(addon, flow)
        await answer(addon, flow)
    lines = trimflow_lines(caplog)
    warnings = [r.getMessage() for r in lines if r.levelno >= logging.WARNING]
    if case.outcome == PRUNED:
        out = flow.request.get_content()
        assert out == expected_body(case, plain)
        check_pruned(case, plain, out)
        assert flow.request.headers.get("content-encoding") == case.coding
        assert int(flow.request.headers["content-length"]) == len(flow.request.raw_content)
        assert warnings == []
    else:
        assert flow.request.raw_content == wire
        assert flow.request.headers.get("content-encoding") == case.coding
        if case.outcome == UNTOUCHED:
            assert len(warnings) == 1 and "forwarded untouched" in warnings[0] and case.why in warnings[0], warnings
        else:
            assert warnings == []
    assert all("internal error" not in r.getMessage() for r in lines)
    logged = "\n".join(r.getMessage() for r in lines) + (flow.comment or "") + json.dumps(flow.metadata.get("trimflow"))
    assert marker(case.id) not in logged
    if "trimflow" in flow.metadata:  # one metrics line, with the answer's status and the reason if any
        (line,) = addon.metrics_path.read_bytes().splitlines()
        record = orjson.loads(line)
        assert record["status"] == 200
        assert record["reason"] is None if case.outcome != UNTOUCHED else case.why in record["reason"]
    # The next request is served as usual.
    after = normal_flow()
    await requested(addon, after)
    assert image_count(CHAT, after.request.get_content()) == MAX_IMAGES


async def test_a_gzip_bomb_of_gigabytes_is_never_inflated_by_the_addon(addon, caplog) -> None:
    """A 8 GiB bomb at the default limit, sent only once the addon has shown it bounds a small one: an
    unbounded decoder (mitmproxy's own) would inflate the 8 GiB in this process."""
    with caplog.at_level(logging.WARNING, logger="trimflow"):
        addon.tctx.configure(addon, trimflow_max_decoded_bytes="1MiB")
        small = gzip_bomb(32 * MiB)
        flow = make_flow(PATHS[CHAT], small, {"content-type": "application/json", "content-encoding": "gzip"})
        await requested(addon, flow)
        assert "decodes to more than 1.0MB" in caplog.text
        addon.tctx.configure(addon, trimflow_max_decoded_bytes=addon.tctx.options._options["trimflow_max_decoded_bytes"].default)
        bomb = gzip_bomb(8 * 1024 * MiB)
        flow = make_flow(PATHS[CHAT], bomb, {"content-type": "application/json", "content-encoding": "gzip"})
        await requested(addon, flow)
    assert flow.request.raw_content is bomb
    assert "decodes to more than 256MB" in caplog.text




async def test_a_compressed_answer_past_the_limit_is_not_inflated_for_its_usage(addon) -> None:
    """Valid JSON with its usage up front, then 64 MiB of spaces: bounded at 16MiB, the usage stays unknown."""
    flow = normal_flow()
    await requested(addon, flow)
    answer = gzip.compress(b'{"usage":{"prompt_tokens":5}}' + b" " * (64 * MiB), compresslevel=1)
    flow.response = tutils.tresp(content=b"", headers=http.Headers(content_type="application/json", content_encoding="gzip"))
    flow.response.raw_content = answer
    addon.responseheaders(flow)
    addon.response(flow)
    assert flow.response.raw_content is answer  # the client gets it as it came
    assert flow.metadata["trimflow"]["status"] == 200 and flow.metadata["trimflow"]["usage_input_tokens"] is None


# --- runtime faults -------------------------------------------------------------------------------------------


def _touch_later(path: Path, seconds: float) -> None:
    os.utime(path, (time.time() + seconds, time.time() + seconds))


async def test_rules_file_deleted_while_running_keeps_the_last_good_rules(addon, caplog, tmp_path) -> None:
    path = Path(addon.rules.path)
    addon.rules = RulesFile(path, check_interval=0)  # look at the file on every request
    with caplog.at_level(logging.INFO, logger="trimflow"):
        path.unlink()
        for _ in range(3):
            flow = normal_flow()
            await requested(addon, flow)
            assert image_count(CHAT, flow.request.get_content()) == MAX_IMAGES
        errors = [r.getMessage() for r in trimflow_lines(caplog) if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and str(path) in errors[0] and "keeping the last good rules" in errors[0]
        path.write_text(RULES_TEXT.replace("max_images: 2", "max_images: 3"))  # back, edited
        flow = normal_flow()
        await requested(addon, flow)
    assert image_count(CHAT, flow.request.get_content()) == 3
    assert f"reloaded rules from {path}" in caplog.text


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("invalid-yaml", lambda p: p.write_text("defaults: [unclosed\n")),
        ("invalid-value", lambda p: p.write_text("defaults:\n  max_images: many\n")),
        ("emptied", lambda p: p.write_text("")),
        ("binary", lambda p: p.write_bytes(b"\xff\xfe\x00garbage")),
        ("replaced-by-a-directory", lambda p: (p.unlink(), p.mkdir())),
    ],
)
async def test_rules_file_made_invalid_while_running_keeps_the_last_good_rules(addon, caplog, name: str, damage) -> None:
    path = Path(addon.rules.path)
    addon.rules = RulesFile(path, check_interval=0)
    with caplog.at_level(logging.INFO, logger="trimflow"):
        damage(path)
        if path.is_file():
            _touch_later(path, 5)
        for _ in range(3):
            flow = normal_flow()
            await requested(addon, flow)
            assert image_count(CHAT, flow.request.get_content()) == MAX_IMAGES
    errors = [r.getMessage() for r in trimflow_lines(caplog) if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and str(path) in errors[0], errors
    assert NORMAL not in caplog.text


@pytest.mark.parametrize(
    "where",
    [
        pytest.param(lambda tmp: tmp / "a-file" / "metrics.jsonl", id="parent-is-a-regular-file"),
        pytest.param(lambda tmp: Path("/dev/full"), id="disk-full-dev-full"),
        pytest.param(lambda tmp: tmp, id="path-is-a-directory"),
    ],
)
async def test_unwritable_metrics_never_stop_forwarding_and_say_so_once(addon, caplog, tmp_path, where) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    path = where(tmp_path)
    with caplog.at_level(logging.INFO, logger="trimflow"):
        addon.tctx.configure(addon, trimflow_metrics=str(path))
        for _ in range(3):
            flow = normal_flow()
            await requested(addon, flow)
            await answer(addon, flow)
            assert image_count(CHAT, flow.request.get_content()) == MAX_IMAGES
            assert flow.metadata["trimflow"]["status"] == 200
    errors = [r.getMessage() for r in trimflow_lines(caplog) if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "cannot write metrics" in errors[0] and "forwarding continues" in errors[0], errors
    assert len([r for r in trimflow_lines(caplog) if "images 5->2" in r.getMessage()]) == 3  # the log line per flow stays


CATASTROPHIC = "*a*a*a*a*a*a*a*a*b"  # backtracks exponentially with a naive glob-to-regex translation


def _returns(fn: Callable[[], object], seconds: float = 60.0) -> object:
    """fn's result; fails (rather than hanging the suite) if it has not returned within `seconds`."""
    result: list[object] = []
    worker = threading.Thread(target=lambda: result.append(fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert result, f"did not return within {seconds}s: catastrophic backtracking"
    return result[0]


def test_catastrophic_globs_on_10000_char_inputs_return() -> None:
    rules = parse_rules(
        f'defaults:\n  max_images: 2\nrules:\n  - name: evil\n    match:\n      host: "{CATASTROPHIC}"\n      path: "{CATASTROPHIC}"\n'
        f'      model: "{CATASTROPHIC}"\n    max_images: 1\nendpoints:\n  - {{path: "{CATASTROPHIC}", format: openai-chat}}\n',
        "evil.yaml",
    )
    long = "a" * 10_000
    assert _returns(lambda: rules.limits_for(long, "/" + long, long)).rule == "defaults"
    assert _returns(lambda: rules.format_for(long, "/" + long)) is None
    assert _returns(lambda: rules.limits_for(long + "b", "/" + long + "b", long + "b")).rule == "evil"  # and it still matches


async def test_a_request_with_a_10000_char_path_and_model_under_catastrophic_rules_is_served(addon, tmp_path) -> None:
    path = Path(addon.rules.path)
    path.write_text(RULES_TEXT + f'rules:\n  - name: evil\n    match:\n      path: "{CATASTROPHIC}"\n      model: "{CATASTROPHIC}"\n    max_images: 1\n')
    addon.tctx.configure(addon, trimflow_rules=str(path))
    body = session_json(CHAT, "long").replace(b'"model":"gpt-4o"', b'"model":"' + b"a" * 10_000 + b'"')
    flow = make_flow("/" + "a" * 10_000 + "/chat/completions", body, {"content-type": "application/json"})
    await requested(addon, flow)
    assert image_count(CHAT, flow.request.get_content()) == MAX_IMAGES
