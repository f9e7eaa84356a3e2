"""The skeleton parse against a full `json.loads`: over random bodies in every wire format, text-heavy as an
agent's (quoted JSON, code with quotes and backslashes, escaped surrogates, deep nesting), written by several
JSON writers, with and without image payloads, it finds the same media and writes the same bytes."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from trimflow import prune_request
from trimflow._body import MIN_PAYLOAD, Payload, parse
from trimflow._jsoncodec import dumps
from trimflow.formats import FORMATS, Media
from trimflow.testing import image

from ..helpers import rules_with, url_for
from .strategies import render

# Real images whose base64 is longer than MIN_PAYLOAD: the skeleton leaves them in the body's bytes.
BIG_POOL = [image(40, 40 + i, "PNG", seed=100 + i) for i in range(4)]

# Any character, lone surrogates included (a writer can only send those as escapes).
any_char = st.characters(codec=None, categories=None)
code_line = st.lists(st.sampled_from(['print("hi")', "x = 'a\\\\b'", '\t"\\""', "if a: return b", "s = r'\\d+'"]), max_size=6)
scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.text(any_char, max_size=12))
nested = st.recursive(
    scalar, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)), max_leaves=12
)
strings = st.one_of(
    st.text(any_char, max_size=40),
    # A tool result of JSON: a quote escaped every few bytes.
    nested.map(lambda value: json.dumps(value, indent=1)),
    code_line.map("\n".join),
    # Long runs: of escaped quotes, of backslashes (odd and even before a quote), of plain text.
    st.builds(lambda n, unit: unit * n, st.integers(1, MIN_PAYLOAD), st.sampled_from(['"', "\\", '\\"', "a", "é", "1"])),
    # A long string with a clean head and escapes after it (the skeleton leaves it in place).
    st.builds(lambda n, tail: "p" * n + tail, st.integers(MIN_PAYLOAD - 10, MIN_PAYLOAD + 700), st.text(any_char, max_size=20)),
    st.just("id 12345678901234567890123 at 1732680000123456789 ns"),
)
part = st.one_of(st.tuples(st.just("text"), strings), st.tuples(st.just("image"), st.integers(0, len(BIG_POOL) - 1)))
message = st.tuples(st.sampled_from(["user", "assistant"]), st.booleans(), st.lists(part, min_size=1, max_size=4))
conversation = st.lists(message, min_size=1, max_size=6)


def deep(depth: int, leaf: Any) -> Any:
    for n in range(depth):
        leaf = [leaf] if n % 2 else {"k": leaf}
    return leaf


def _ascii_json(value: Any) -> bytes:
    return json.dumps(value).encode()


# Bodies of a few hundred kilobytes, some nested past orjson's depth: no deadline.
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

WRITERS = {
    "orjson": orjson.dumps,
    "json, ensure_ascii": _ascii_json,  # non-ASCII and lone surrogates as \\u escapes
    "json, indented": lambda value: json.dumps(value, indent=2, ensure_ascii=False).encode("utf-8", "surrogatepass"),
    "escaped slashes": lambda value: _ascii_json(value).replace(b"/", b"\\/"),  # PHP's json_encode
}


def encoded(writer: str, value: Any) -> tuple[bytes, str]:
    """The body as `writer` writes it, and the writer used: only an escape carries a lone surrogate, and orjson
    writes no deeper than 1024."""
    if writer in ("orjson", "json, indented") and any(0xD800 <= ord(c) <= 0xDFFF for c in json.dumps(value, ensure_ascii=False)):
        writer = "json, ensure_ascii"
    try:
        return WRITERS[writer](value), writer
    except orjson.JSONEncodeError:
        return _ascii_json(value), "json, ensure_ascii"


def _facts(media: list[Media]) -> list[tuple[Any, ...]]:
    """What the engine reads of each media: kind, path, type, header and the payload it decodes to."""
    return [(m.kind, m.path, m.declared_mime, m.data_offset, m.detail, m.data.decoded() if isinstance(m.data, Payload) else m.data) for m in media]


@SETTINGS
@given(
    fmt=st.sampled_from(sorted(FORMATS)),
    conv=conversation,
    writer=st.sampled_from(sorted(WRITERS)),
    extra=st.dictionaries(st.sampled_from(["x_tool_state", "metadata_x"]), nested, max_size=2),
    depth=st.sampled_from([0, 2, 40, 1100]),  # 1100: deeper than orjson reads, the exact parser's
)
def test_the_skeleton_finds_and_writes_what_a_full_parse_does(fmt: str, conv: list, writer: str, extra: dict, depth: int) -> None:
    value = render(fmt, conv, {**extra, "x_deep": deep(depth, "leaf")}, BIG_POOL)
    body, writer = encoded(writer, value)
    reference = json.loads(body)
    doc = parse(body, exact=False)  # as the engine parses: integers made exact only for a write
    assert doc is not None
    event(f"skeleton: {doc.is_skeleton}, writer: {writer}")
    module = FORMATS[fmt]
    found = [doc.resolve(m) for m in module.find_media(doc.parsed)]
    assert _facts(found) == _facts(module.find_media(reference))
    doc.make_exact()

    # Everything left as it came, every image but the newest pruned: the bytes a full parse would write.
    assert json.loads(doc.dumps(doc.parsed)) == reference
    paths = {m.path: "[pruned]" for m in found[:-1] if m.kind == "image"}
    written = doc.dumps(module.replace_media(doc.parsed, paths))
    want = dumps(module.replace_media(reference, paths), doc.fallback)
    if writer == "orjson":
        assert written == want  # a payload the skeleton spliced back is byte for byte what orjson writes
    else:
        assert json.loads(written) == json.loads(want)  # spliced as the client wrote them: its escapes kept
    assert doc.size(module.replace_media(doc.parsed, paths)) == len(written)


@SETTINGS
@given(fmt=st.sampled_from(sorted(FORMATS)), conv=conversation, writer=st.sampled_from(sorted(WRITERS)))
def test_the_engine_counts_every_image_and_forwards_a_body_it_leaves_alone_as_it_came(fmt: str, conv: list, writer: str) -> None:
    value = render(fmt, conv, {}, BIG_POOL)
    body, _ = encoded(writer, value)
    images = [m for m in FORMATS[fmt].find_media(json.loads(body)) if m.kind == "image"]
    outcome = prune_request(url_for(fmt), {}, body, rules_with(max_images=None))
    assert outcome.record is not None and outcome.record.images_before == len(images)
    assert outcome.body is body
    pruned = prune_request(url_for(fmt), {}, body, rules_with(max_images=1, keep_recent=1, prune_batch=1))
    assert pruned.record is not None and pruned.record.images_after == min(1, len(images))
    kept = [m.data for m in FORMATS[fmt].find_media(json.loads(pruned.body)) if m.kind == "image"]
    assert kept == [m.data for m in images][-1:]  # the newest, as it came
