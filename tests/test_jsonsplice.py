"""trimflow._jsonsplice: the byte span of the value at a JSON path however the JSON is written, and new values
spliced in at many paths in one pass: every other byte stays, and the work grows with the text, not with the
number of edits times the text."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimflow._jsonsplice import NoValue, spans, splice, value_span

from .helpers import lines_run


@pytest.mark.parametrize(
    ("raw", "path", "expected"),
    [
        (b'{"a":{"b":[1,{"c":"x"}]}}', ("a", "b", 1, "c"), b'"x"'),
        (b'{ "a" : [ 10 , 20 , 30 ] }', ("a", 2), b"30"),
        (b'{"a":"q\\"uo\\\\","b":true}', ("b",), b"true"),  # an escaped quote and a trailing backslash in a string before it
        (b'{"k\\u00e9y":null}', ("k\u00e9y",), b"null"),  # a key written with an escape
        (b'{"a":1,"a":2}', ("a",), b"2"),  # a repeated key: the last, as parsers read it
        (b'{"a":"[{\\"not\\":1}]","b":{"c":-1.5e3}}', ("b", "c"), b"-1.5e3"),  # brackets inside a string are text
        (b'{"a":{}, "b":[]}', ("b",), b"[]"),
        (b'{"a":{"x":[{"y":"}"}]},"b":0}', ("a",), b'{"x":[{"y":"}"}]}'),
        (b" \n[1, 2]", (), b"[1, 2]"),  # the whole text
    ],
)
def test_value_span_finds_the_value(raw: bytes, path: tuple[str | int, ...], expected: bytes) -> None:
    start, end = value_span(raw, path)
    assert raw[start:end] == expected


@pytest.mark.parametrize(
    ("raw", "path"),
    [(b'{"a":1}', ("b",)), (b'{"a":[1]}', ("a", 1)), (b'{"a":1}', ("a", 0)), (b"[1]", ("a",)), (b'{"a":[1', ("a", 1))],
)
def test_value_span_of_a_missing_path_is_a_key_error(raw: bytes, path: tuple[str | int, ...]) -> None:
    with pytest.raises(NoValue):
        value_span(raw, path)
    with pytest.raises(KeyError):  # NoValue is one: a caller may catch either
        value_span(raw, path)


def test_a_repeated_key_takes_everything_under_its_last_value() -> None:
    raw = b'{"a":{"x":1,"y":2},"a":{"x":3}}'
    assert spans(raw, [("a", "x")]) == {("a", "x"): (28, 29)}
    with pytest.raises(NoValue):  # the last "a" has no "y", whatever the first one held
        spans(raw, [("a", "x"), ("a", "y")])


def test_splice_changes_the_spans_and_keeps_every_other_byte() -> None:
    raw = b'{"x": 1,  "m":{"content":[{"type":"image","data":"AAAA"}, {"type":"text"}]} , "copy":"AAAA"}'
    out = splice(raw, [(("m", "content", 0), b'{"type":"text","text":"gone"}'), (("copy",), b'""')])
    assert out == b'{"x": 1,  "m":{"content":[{"type":"text","text":"gone"}, {"type":"text"}]} , "copy":""}'


@pytest.mark.parametrize(
    "paths",
    [[("a",), ("a", "b")], [("a", "b"), ("a",)], [("a", "b"), ("a", "b")], [(), ("a",)], [("a",), ()]],
)
def test_overlapping_edits_are_refused(paths: list[tuple[str | int, ...]]) -> None:
    with pytest.raises(ValueError, match="overlap"):
        splice(b'{"a":{"b":1}}', [(path, b"2") for path in paths])


def test_splice_work_grows_with_the_text_not_with_edits_times_text() -> None:
    """One pass: twice the points and twice the edits, about twice the work (edits walked one by one from the
    root would make it four times)."""

    def drag(points: int) -> tuple[bytes, list[tuple[tuple[str | int, ...], bytes]]]:
        path = [{"x": i, "y": i} for i in range(points)]
        raw = orjson.dumps({"output": [{"type": "message", "text": "a" * 1000}, {"action": {"type": "drag", "path": path}}]})
        return raw, [(("output", 1, "action", "path", i, axis), b"7") for i in range(points) for axis in "xy"]

    work = []
    for points in (300, 600):
        raw, edits = drag(points)
        work.append(lines_run(lambda raw=raw, edits=edits: splice(raw, edits)))
    assert work[1] < 2.3 * work[0], work


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20,
)


def _paths(value: Any, path: tuple[str | int, ...] = ()) -> list[tuple[tuple[str | int, ...], Any]]:
    found = [(path, value)]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*path, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            found += _paths(child, (*path, i))
    return found


def _dumps(value: Any, spaced: bool, ascii_only: bool) -> bytes:
    return json.dumps(value, ensure_ascii=ascii_only, separators=(", ", ": ") if spaced else (",", ":")).encode()


@settings(max_examples=200, deadline=None)
@given(value=json_values, spaced=st.booleans(), ascii_only=st.booleans())
def test_value_span_agrees_with_a_parser_however_the_json_is_written(value: Any, spaced: bool, ascii_only: bool) -> None:
    """Written compact (as Claude Code, Codex and Gemini CLI write) or spaced, escaped or not: the text at every
    path's span parses to the value at that path."""
    raw = _dumps(value, spaced, ascii_only)
    for path, expected in _paths(value):
        start, end = value_span(raw, path)
        assert orjson.loads(raw[start:end]) == expected


@settings(max_examples=200, deadline=None)
@given(value=json_values, spaced=st.booleans(), ascii_only=st.booleans())
def test_splicing_every_leaf_at_once_changes_those_values_and_nothing_else(value: Any, spaced: bool, ascii_only: bool) -> None:
    raw = _dumps(value, spaced, ascii_only)
    leaves = [path for path, child in _paths(value) if not isinstance(child, (dict, list)) or not child]
    out = splice(raw, [(path, b'"#%d"' % i) for i, path in enumerate(leaves)])
    expected = value
    for i, path in enumerate(leaves):
        if not path:
            expected = f"#{i}"
            continue
        node = expected
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = f"#{i}"
    assert orjson.loads(out) == expected
