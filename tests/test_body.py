"""The skeleton parse: large strings stay in the body's bytes and come back byte for byte."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trimflow._body import MIN_PAYLOAD, Payload, parse
from trimflow._jsoncodec import BodyError
from trimflow.formats import FORMATS, Media
from trimflow.testing import b64, image, session_body

SHOT = image(200, 150, "PNG", seed=9)  # ~90 KB of noise: far over MIN_PAYLOAD as base64


def test_a_payload_heavy_body_is_parsed_as_a_skeleton_and_written_back_exactly() -> None:
    body = orjson.dumps(session_body("anthropic", 4, SHOT, "image/png"))
    doc = parse(body)
    assert doc.is_skeleton
    assert len(orjson.dumps(doc.parsed)) < len(body) // 20  # the images were not parsed
    assert doc.dumps(doc.parsed) == body
    assert doc.size(doc.parsed) == len(body)


def test_resolved_media_read_the_original_bytes() -> None:
    body = orjson.dumps(session_body("openai-chat", 2, SHOT, "image/png"))
    doc = parse(body)
    media = [doc.resolve(m) for m in FORMATS["openai-chat"].find_media(doc.parsed)]
    assert all(isinstance(m.data, Payload) for m in media)
    first = media[0]
    assert first.declared_mime == "image/png" and first.data_offset == len("data:image/png;base64,")
    assert first.wire_bytes == len("data:image/png;base64,") + len(b64(SHOT))
    assert first.base64_prefix(16) == b64(SHOT)[:16]
    assert first.data[first.data_offset :] == b64(SHOT)
    assert first.data == media[1].data and first.data == "data:image/png;base64," + b64(SHOT)
    assert first.data[-4:] == b64(SHOT)[-4:]


def test_pruning_a_skeleton_writes_what_a_full_parse_would() -> None:
    body = orjson.dumps(session_body("gemini", 3, SHOT, "image/png"))
    doc = parse(body)
    module = FORMATS["gemini"]
    paths = [m.path for m in module.find_media(doc.parsed)][:2]
    out = doc.dumps(module.replace_media(doc.parsed, dict.fromkeys(paths, "[gone]")))
    full = orjson.loads(body)
    assert out == orjson.dumps(module.replace_media(full, dict.fromkeys(paths, "[gone]")))
    assert doc.size(module.replace_media(doc.parsed, {paths[0]: "[gone]"})) == len(orjson.dumps(module.replace_media(full, {paths[0]: "[gone]"})))


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"messages": [{"content": "' + b"A" * 5 * MIN_PAYLOAD + b'"}]}', "one payload"),
        (b'{"x": "\xee\x80\x80", "y": "' + b"A" * 5 * MIN_PAYLOAD + b'"}', "marker byte"),
        (b'{"x": "\\ue000", "y": "' + b"A" * 5 * MIN_PAYLOAD + b'"}', "escaped marker"),
        (b'{"x": "\\uE001", "y": "' + b"A" * 5 * MIN_PAYLOAD + b'"}', "escaped end marker"),
        (b'{"x": "\\ue0000\\ue001", "y": "' + b"A" * 5 * MIN_PAYLOAD + b'"}', "a forged stub"),
        (b'{"y": "\\n' + b"A" * 5 * MIN_PAYLOAD + b'"}', "escape in the head"),
        (b"[" + b",".join(b'"t%d"' % i for i in range(5000)) + b"]", "text-heavy"),
    ],
)
def test_unusual_bodies_round_trip_and_take_the_full_parse_where_needed(body: bytes, why: str) -> None:
    doc = parse(body)
    assert doc.dumps(doc.parsed) == orjson.dumps(orjson.loads(body))
    if why != "one payload":
        assert not doc.is_skeleton, why


def test_an_escaped_payload_is_written_as_sent_and_read_decoded() -> None:
    # Some JSON writers escape slashes (PHP's json_encode escapes every one, and such a body, with escapes in
    # the head of every payload, is parsed whole). Past the head, escapes are found only when a read meets them.
    encoded = b64(SHOT)
    assert "/" in encoded[1000:]
    written = "data:image/png;base64," + encoded[:1000] + encoded[1000:].replace("/", "\\/")
    escaped = b'{"type":"image_url","image_url":{"url":"' + written.encode() + b'"}}'
    # Another, plain payload in the body: one escaped all along is no reason to leave the rest in place.
    plain = b'{"type":"image_url","image_url":{"url":"data:image/png;base64,' + encoded.encode() + b'"}}'
    body = b'{"messages":[{"role":"user","content":[' + escaped + b"," + plain + b"]}]}"
    doc = parse(body)
    assert doc.is_skeleton
    media = doc.resolve(FORMATS["openai-chat"].find_media(doc.parsed)[0])
    assert isinstance(media.data, Payload)
    assert media.declared_mime == "image/png" and media.data_offset == len("data:image/png;base64,")
    assert media.wire_bytes == len(written)  # its weight as written, which is what a spliced body carries
    assert media.base64_prefix(500) == encoded[:500]  # before any escape: the written bytes
    assert media.base64_prefix(2000) == encoded[:2000]  # meets one: decoded
    assert media.data[media.data_offset :] == encoded
    assert media.data[-64:] == encoded[-64:]
    assert doc.dumps(doc.parsed) == body  # kept as the client wrote it
    unescaped = parse(body.replace(b"\\/", b"/"))
    assert media.data != unescaped.resolve(FORMATS["openai-chat"].find_media(unescaped.parsed)[0]).data  # written differently
    alone = parse(body.replace(b"," + plain, b""))  # no clean run long enough for a payload: parsed whole
    assert not alone.is_skeleton and alone.dumps(alone.parsed) == orjson.dumps(orjson.loads(body.replace(b"," + plain, b"")))


def test_payloads_compare_by_their_bytes() -> None:
    a, b = b64(SHOT), b64(image(200, 150, "PNG", seed=10))
    body = orjson.dumps([a, a, b, a[:-1] + "x"])
    doc = parse(body)
    payloads = [Payload(body, start, end) for start, end in doc._spans]
    assert payloads[0] == payloads[1] and payloads[0] == a
    assert payloads[0] != payloads[2] and payloads[0] != payloads[3]


def test_escaped_quotes_before_a_payload_do_not_shift_the_spans() -> None:
    payload = b"B" * 2 * MIN_PAYLOAD
    body = b'{"a": "say \\"hi\\" \\\\", "b": "' + payload + b'", "c": ["\\\\\\"", "' + payload + b'"]}'
    doc = parse(body)
    assert doc.is_skeleton
    assert doc.parsed["a"] == 'say "hi" \\' and doc.parsed["c"][0] == '\\"'
    assert doc.dumps(doc.parsed) == orjson.dumps(orjson.loads(body))


def test_a_body_that_is_not_json_fails_as_the_full_parse_does() -> None:
    bad = b'{"a": "' + b"A" * 5 * MIN_PAYLOAD + b'", }'
    with pytest.raises(BodyError, match="not JSON"):
        parse(bad)
    with pytest.raises(BodyError):
        parse(b'{"a": "' + b"A" * 5 * MIN_PAYLOAD)  # unterminated


strings = st.one_of(
    st.text(max_size=20),
    st.builds(lambda n, c: c * n, st.integers(MIN_PAYLOAD - 2, MIN_PAYLOAD + 300), st.sampled_from(["A", "/", "é", "+="])),
    st.builds(lambda n: "x" * n + '"\\\n', st.integers(MIN_PAYLOAD, MIN_PAYLOAD + 10)),
)
values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**60), 2**60), strings),
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=5)),
    max_leaves=20,
)


@given(values)
def test_any_document_writes_what_a_full_parse_writes(value) -> None:
    body = orjson.dumps(value)
    doc = parse(body)
    assert doc.parsed == value or doc.is_skeleton
    assert doc.dumps(doc.parsed) == body
    assert doc.size(doc.parsed) == len(body)


PAYLOAD = b64(SHOT).encode()


def _with_text(text: bytes, payloads: int = 1) -> bytes:
    """A chat body: a text string as written (escapes and all), then `payloads` images."""
    images = b",".join(b'{"type":"image_url","image_url":{"url":"data:image/png;base64,' + PAYLOAD + b'"}}' for _ in range(payloads))
    return b'{"messages":[{"role":"tool","content":"' + text + b'"},{"role":"user","content":[' + images + b"]}]}"


@pytest.mark.parametrize("backslashes", [2, 3, 64, 65, 100_000, 100_001])
def test_a_run_of_backslashes_before_a_quote_is_counted_whole(backslashes: int) -> None:
    # An even run ends the string at the quote after it; an odd one escapes that quote.
    text = b"x" + b"\\" * backslashes + (b'"y' if backslashes % 2 else b"")
    body = _with_text(text)
    doc = parse(body)
    assert doc.is_skeleton
    assert doc.parsed["messages"][0]["content"] == orjson.loads(body)["messages"][0]["content"]
    assert doc.dumps(doc.parsed) == body


def test_escaped_quotes_count_against_the_walk_and_a_text_heavy_body_is_parsed_whole() -> None:
    quoted = orjson.dumps(orjson.dumps([{"name": f"file{i}.py", "size": i} for i in range(200)]).decode())[1:-1]
    few, many = _with_text(quoted, payloads=8), _with_text(quoted * 40, payloads=1)
    assert few.count(b'\\"') < len(few) // 512 < many.count(b'\\"') // 4
    assert parse(few).is_skeleton
    doc = parse(many)
    assert not doc.is_skeleton
    assert doc.dumps(doc.parsed) == many  # orjson wrote it: the whole parse writes it back the same


def test_text_with_no_run_long_enough_for_a_payload_is_parsed_whole() -> None:
    lines = b"\\n".join(b"def f%d(x):  # a line of code, escaped newline after it" % i for i in range(2000))
    body = b'{"messages":[{"role":"tool","content":"' + lines + b'"}]}'
    doc = parse(body)
    assert not doc.is_skeleton and doc.parsed == orjson.loads(body)


@pytest.mark.parametrize("payloads", [0, 3])
def test_a_lazy_parse_reads_a_big_integer_as_a_float_until_made_exact_for_a_write(payloads: int) -> None:
    body = _with_text(b"line\\n" * 4000, payloads)[:-1] + b',"seed":123456789012345678901234567890}'
    doc = parse(body, exact=False)
    assert doc is not None and doc.is_skeleton == (payloads > 0)
    assert isinstance(doc.parsed["seed"], float)  # orjson's reading: harmless while nothing is written
    stubs = [m.data for m in FORMATS["openai-chat"].find_media(doc.parsed)]
    with pytest.raises(AssertionError, match="make_exact"):
        doc.write(doc.parsed)
    doc.make_exact()
    assert doc.parsed["seed"] == 123456789012345678901234567890
    out = doc.dumps(doc.parsed)
    assert b'"seed":123456789012345678901234567890}' in out and json.loads(out) == json.loads(body)
    assert all(doc.resolve(Media("image", (), stub)).data == "data:image/png;base64," + b64(SHOT) for stub in stubs)


def test_a_lazy_parse_with_no_big_integer_stays_as_it_was() -> None:
    body = _with_text(b"x" * 20_000, 3)[:-1] + b',"n":[123456789012345678,"12345678901234567890123"]}'
    doc = parse(body, exact=False)
    parsed = doc.parsed
    doc.make_exact()
    assert doc.parsed is parsed and doc.is_skeleton
    assert doc.dumps(doc.parsed) == orjson.dumps(orjson.loads(body))
