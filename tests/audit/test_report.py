"""trimflow.audit._report: the text table, JSON and Markdown reports, and what no report ever prints."""

from __future__ import annotations

import base64
import re

import pytest

from .helpers import LIMIT_413, PROMPT, QUERY_SECRET, SECRET, SHOT, audit, audit_json, llm_flow, rows, session, write_dump


def test_text_is_a_table_per_conversation(recording, capsys) -> None:
    code, out, _ = audit(capsys, recording)
    assert code == 0
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["turn", "model", "images"])
    table = [line.split() for line in lines[header + 1 : header + 6]]
    assert [row[0] for row in table] == ["1", "2", "3", "4", "5"]
    assert [row[2] for row in table] == ["1", "2", "3", "4", "5"]
    assert "api.anthropic.com/v1/messages" in out
    assert "growth per turn: body +" in out
    assert re.search(r"max_images 8 \(rule [\w-]+\): would be crossed at turn 9 \(projected", out)


def test_json_has_records_and_summary(recording, capsys) -> None:
    _, report, _ = audit_json(capsys, recording)
    assert set(report) == {"records", "summary"}
    record = rows(report)[0]
    assert {"conversation", "turn", "images_before", "images_after", "body_bytes_before", "body_bytes_after",
            "est_tokens_before", "status", "usage_input_tokens", "failure"} <= set(record)
    assert report["summary"]["gate"] is None
    assert set(report["summary"]) >= {"inputs", "totals", "conversations", "what_if_rules", "limits_source", "growth_method"}


def test_markdown_has_the_gate_totals_and_turn_tables(recording, capsys) -> None:
    code, out, _ = audit(capsys, recording, "--format", "markdown", "--fail-on", "status=413", "--fail-on", "images>8")
    assert code == 1
    assert out.startswith("## trimflow audit")
    assert "### Gate: ❌ failed" in out and "- ❌ `status=413`: conversation" in out and "- ✅ `images>8`" in out
    assert "| body |" in out and "| turn | model | images |" in out
    assert out.count("| claude-sonnet-4-5 |") == 5


def test_failures_are_listed_per_conversation_without_the_answer_text(tmp_path, capsys) -> None:
    flows = session(3) + [llm_flow(turn=4, status=413, answer=LIMIT_413),
                          llm_flow(turn=5, status=400, answer=b'{"message":"too many images: got 5 ' + PROMPT.encode() + b'"}')]
    code, out, _ = audit(capsys, write_dump(tmp_path / "run.mitm", flows))
    assert code == 0
    assert "failures: turn 4: 413 body too large; turn 5: 400 too many images" in out
    assert "request_too_large" not in out and PROMPT not in out


@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "html"])
def test_no_format_prints_a_credential_query_prompt_or_base64(recording, capsys, fmt) -> None:
    _, out, err = audit(capsys, recording, "--format", fmt, "--fail-on", "status=413")
    for text in (out, err):
        assert SECRET not in text and QUERY_SECRET not in text and "key=" not in text
        assert PROMPT not in text and "request_too_large" not in text
        assert base64.b64encode(SHOT)[:40].decode() not in text
        assert not re.search(r"[A-Za-z0-9+/]{200,}", text)
