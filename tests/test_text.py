"""trimflow._text: what a client or a file chose becomes one inert line of text."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from trimflow import builtin_rules, prune
from trimflow._text import escape_controls, for_text


def test_controls_become_visible_escapes() -> None:
    assert for_text("gpt-4o\n::error::owned\x1b[2J\u202e\ud800") == "gpt-4o\\n::error::owned\\x1b[2J\\u202e\\ud800"
    assert for_text("::add-mask::x") == "\\x3a:add-mask::x"
    assert for_text("a ##[error] b") == "a #\\x23[error] b"
    assert escape_controls("claude-sonnet-4-6") == "claude-sonnet-4-6"


@given(st.text())
def test_any_text_is_one_valid_line_and_stable(text: str) -> None:
    line = for_text(text)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    line.encode("utf-8")  # no lone surrogate left
    assert for_text(line) == line


def test_a_hostile_model_name_reaches_the_record_and_its_log_line_as_one_line() -> None:
    body = b'{"model": "gpt-4o\\n[12:00:00] trimflow: forged\\ud800", "messages": [{"role": "user", "content": "hi"}]}'
    rules = builtin_rules()
    target = rules.target("api.openai.com", "/v1/chat/completions")
    assert target is not None
    record = prune(target, {}, body, rules).record
    assert record is not None and record.model == "gpt-4o\\n[12:00:00] trimflow: forged\\ud800"
    assert "\n" not in record.log_line()
    orjson.loads(record.to_json())  # the JSONL line is written
