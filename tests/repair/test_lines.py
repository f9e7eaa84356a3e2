"""Session files as JSON lines: what counts as a broken file, and the byte span of a value inside a line, which
is what lets a repair change one block of a line and keep every other byte of it."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimflow.repair._lines import SessionError, join_lines, splice, split_lines, value_span

from .helpers import SESSIONS


def test_lines_are_numbered_from_1_and_blank_lines_kept() -> None:
    lines = split_lines(b'{"a":1}\n\n  \n[2]\n')
    assert [(line.number, line.raw, line.value) for line in lines] == [(1, b'{"a":1}', {"a": 1}), (2, b"", None), (3, b"  ", None), (4, b"[2]", [2])]
    assert join_lines(lines, True) == b'{"a":1}\n\n  \n[2]\n'


def test_a_last_line_without_newline_that_parses_is_a_line() -> None:
    lines = split_lines(b'{"a":1}\n{"b":2}')
    assert lines[-1].value == {"b": 2}
    assert join_lines(lines, False) == b'{"a":1}\n{"b":2}'


def test_a_cut_short_last_line_says_the_agent_may_still_be_writing() -> None:
    with pytest.raises(SessionError, match=r"the last line \(3\) is cut short: the agent may still be writing it, or was killed mid-write"):
        split_lines(b'{"a":1}\n{"b":2}\n{"c":"secret prompt te')


def test_a_line_that_is_not_json_is_named_by_its_number_without_its_text() -> None:
    with pytest.raises(SessionError) as raised:
        split_lines(b'{"a":1}\nsecret prompt text\n{"c":3}\n')
    assert str(raised.value).startswith("line 2 is not JSON (")
    assert "secret" not in str(raised.value)


def test_a_cut_short_line_in_the_middle_is_not_json_rather_than_cut_short() -> None:
    """Only the last line can be one an agent is still writing; a broken line before it is damage."""
    with pytest.raises(SessionError, match=r"^line 1 is not JSON"):
        split_lines(b'{"a":\n{"b":2}\n')


def test_every_line_of_the_fixtures_parses() -> None:
    for path in SESSIONS.glob("*.jsonl"):
        data = path.read_bytes()
        lines = split_lines(data)
        assert join_lines(lines, data.endswith(b"\n")) == data


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
    ],
)
def test_value_span_finds_the_value(raw: bytes, path: tuple[str | int, ...], expected: bytes) -> None:
    start, end = value_span(raw, path)
    assert raw[start:end] == expected


@pytest.mark.parametrize(("raw", "path"), [(b'{"a":1}', ("b",)), (b'{"a":[1]}', ("a", 1)), (b'{"a":1}', ("a", 0)), (b"[1]", ("a",))])
def test_value_span_of_a_missing_path_is_a_key_error(raw: bytes, path: tuple[str | int, ...]) -> None:
    with pytest.raises(KeyError):
        value_span(raw, path)


def test_splice_changes_the_spans_and_keeps_every_other_byte() -> None:
    raw = b'{"x": 1,  "m":{"content":[{"type":"image","data":"AAAA"}, {"type":"text"}]} , "copy":"AAAA"}'
    out = splice(raw, [(("m", "content", 0), b'{"type":"text","text":"gone"}'), (("copy",), b'""')])
    assert out == b'{"x": 1,  "m":{"content":[{"type":"text","text":"gone"}, {"type":"text"}]} , "copy":""}'


def test_overlapping_edits_are_refused() -> None:
    with pytest.raises(ValueError, match="overlap"):
        splice(b'{"a":{"b":1}}', [(("a",), b"2"), (("a", "b"), b"3")])


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


@settings(max_examples=200, deadline=None)
@given(value=json_values, spaced=st.booleans(), ascii_only=st.booleans())
def test_value_span_agrees_with_a_parser_however_the_json_is_written(value: Any, spaced: bool, ascii_only: bool) -> None:
    """Written compact (as Claude Code, Codex and Gemini CLI write) or spaced, escaped or not: the text at every
    path's span parses to the value at that path."""
    raw = json.dumps(value, ensure_ascii=ascii_only, separators=(", ", ": ") if spaced else (",", ":")).encode()
    for path, expected in _paths(value):
        start, end = value_span(raw, path)
        assert orjson.loads(raw[start:end]) == expected
