"""The skeleton parse: large strings stay in the body's bytes and come back byte for byte."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trimflow._document import MIN_PAYLOAD, Payload, parse
from trimflow._jsoncodec import BodyError
from trimflow._synthetic import b64, image, session_body
from trimflow.formats import FORMATS

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
    out = doc.dumps(module.replace_media(doc.parsed, {p: "[gone]" for p in paths}))
    full = orjson.loads(body)
    assert out == orjson.dumps(module.replace_media(full, {p: "[gone]" for p in paths}))
    assert doc.size(module.replace_media(doc.parsed, {paths[0]: "[gone]"})) == len(
        orjson.dumps(module.replace_media(full, {paths[0]: "[gone]"}))
    )


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"messages": [{"content": "' + b"A" * 5 * MIN_PAYLOAD + b'"}]}', "one payload"),
        (b'{"x": "\xee\x80\x80", "y": "' + b"A" * 5 * MIN_PAYLOAD + b'"}', "marker byte"),
        (b'{"y": "' + b"A" * 2 * MIN_PAYLOAD + b"\\n" + b"A" * 3 * MIN_PAYLOAD + b'"}', "escaped payload"),
        (b"[" + b",".join(b'"t%d"' % i for i in range(5000)) + b"]", "text-heavy"),
    ],
)
def test_unusual_bodies_round_trip_and_take_the_full_parse_where_needed(body: bytes, why: str) -> None:
    doc = parse(body)
    assert doc.dumps(doc.parsed) == orjson.dumps(orjson.loads(body))
    if why in ("marker byte", "escaped payload", "text-heavy"):
        assert not doc.is_skeleton, why


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
