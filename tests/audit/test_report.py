"""trimflow.audit._report: the text table, JSON and Markdown reports, and what no report ever prints."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser

import orjson
import pytest

from trimflow import ENFORCE, prune_request

from ..helpers import rules_with
from .helpers import (
    LIMIT_413,
    PROMPT,
    QUERY_SECRET,
    SECRET,
    SHOT,
    audit,
    audit_json,
    body_of,
    llm_flow,
    markdown_as_text,
    markdown_html,
    rows,
    session,
    write_bytes,
    write_dump,
)


def test_text_is_a_table_per_conversation(recording, capsys) -> None:
    code, out, _ = audit(capsys, recording)
    assert code == 0
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["turn", "model", "images"])
    table = [line.split() for line in lines[header + 1 : header + 6]]
    assert [row[0] for row in table] == ["1", "2", "3", "4", "5"]
    assert [row[2] for row in table] == ["1", "2", "3", "4", "5"]
    assert "api.anthropic.com/v1/messages" in out
    assert "growth per turn over all 5 turns: body +" in out
    assert re.search(r"max_images 8 \(rule [\w-]+\): would be crossed at turn 9 \(projected", out)


def test_json_has_records_and_summary(recording, capsys) -> None:
    _, report, _ = audit_json(capsys, recording)
    assert set(report) == {"records", "summary"}
    record = rows(report)[0]
    assert {
        "conversation",
        "turn",
        "images_before",
        "images_after",
        "body_bytes_before",
        "body_bytes_after",
        "est_tokens_before",
        "status",
        "usage_input_tokens",
        "failure",
    } <= set(record)
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
    flows = session(3) + [
        llm_flow(turn=4, status=413, answer=LIMIT_413),
        llm_flow(turn=5, status=400, answer=b'{"message":"too many images: got 5 ' + PROMPT.encode() + b'"}'),
    ]
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


# --- Markdown as GitHub renders it ----------------------------------------------------------------------------


class _Blocks(HTMLParser):
    """The block elements of rendered Markdown, and the text that ended up in paragraphs."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.open: list[str] = []
        self.paragraph_text = ""

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.append(tag)
        self.open.append(tag)

    def handle_endtag(self, tag) -> None:
        while self.open and self.open.pop() != tag:
            pass

    def handle_data(self, data) -> None:
        if "p" in self.open:
            self.paragraph_text += data


def render_markdown(text: str) -> _Blocks:
    blocks = _Blocks()
    blocks.feed(markdown_html(text))
    return blocks


@pytest.mark.parametrize("gate", [(), ("--fail-on", "images>8")], ids=["no-gate", "gate"])
@pytest.mark.parametrize("empty_inputs", [0, 1, 2])
def test_markdown_renders_tables_and_warnings_as_blocks(recording, tmp_path, capsys, empty_inputs, gate) -> None:
    empties = [write_bytes(tmp_path / f"empty{i}.mitm", b"") for i in range(empty_inputs)]
    code, out, err = audit(capsys, recording, *empties, "--allow-empty", "--format", "markdown", *gate)
    assert code == 0, err
    assert out.count("> **Warning:**") == empty_inputs
    blocks = render_markdown(out)
    assert blocks.tags.count("blockquote") == empty_inputs
    assert blocks.tags.count("table") == 2  # the totals, and the one conversation's turns
    assert blocks.tags.count("ul") == 1 + bool(gate)  # the conversation's facts, and the gate
    assert "|" not in blocks.paragraph_text, blocks.paragraph_text  # no table read as the text of a paragraph


def test_markdown_lists_the_inputs_that_fail_the_gate(recording, tmp_path, capsys) -> None:
    cut = write_bytes(tmp_path / "cut.mitm", recording.read_bytes()[:-50])
    empty = write_bytes(tmp_path / "empty.mitm", b"")
    code, out, _ = audit(capsys, recording, cut, empty, "--format", "markdown")
    assert code == 1
    assert "### Gate: ❌ failed (0 of 0 --fail-on broken, 2 inputs failing)" in out
    assert f"❌ {cut}: cut short: the file ends inside flow 5" in markdown_as_text(out)
    assert "> **Warning:**" not in out  # each problem is said once, in the gate
    blocks = render_markdown(out)
    assert blocks.tags.count("table") == 1 + out.count("### Conversation") and "|" not in blocks.paragraph_text


# --- what the figures are -------------------------------------------------------------------------------------


def test_trimflows_jsonl_is_reported_as_pruned_by_trimflow(recording, tmp_path, capsys) -> None:
    lines = []
    for t in range(1, 5):
        outcome = prune_request("https://api.anthropic.com/v1/messages", {}, body_of("anthropic", t), rules_with(max_images=2), ENFORCE)
        lines.append(orjson.dumps(outcome.record.to_dict() | {"turn": t, "status": 200}) + b"\n")
    metrics = write_bytes(tmp_path / "metrics.jsonl", b"".join(lines))
    for fmt in ("text", "markdown", "html"):
        _, out, _ = audit(capsys, metrics, "--format", fmt)
        assert "no pruning applied" not in out
        assert "as trimflow pruned them: before is what the client sent, after what trimflow forwarded" in out
        assert "from its metrics JSONL" in out
    _, out, _ = audit(capsys, recording)
    assert "as recorded (no pruning applied)" in out
    _, out, _ = audit(capsys, recording, metrics)
    assert "as trimflow pruned them (4 of 9 requests; the rest as recorded)" in out
