"""Session files as JSON lines: what counts as a broken file, and that the fixtures read and write back whole."""

from __future__ import annotations

import pytest

from trimflow.repair._lines import SessionError, join_lines, split_lines

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
