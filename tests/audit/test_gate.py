"""trimflow.audit._gate: --fail-on expressions parsed or refused with the reason, the gate's verdict naming the
expression, the conversation and the turn with a value that reads as over its limit, and the inputs that fail
the gate by themselves (no LLM request, or cut short)."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from mitmproxy.test import tflow

from trimflow import ENFORCE, prune_request
from trimflow.audit._gate import ExpressionError, parse

from ..helpers import rules_with
from .helpers import LIMIT_413, audit, audit_json, body_of, llm_flow, session, write_bytes, write_dump, write_har, write_rules


@pytest.mark.parametrize(
    ("text", "field", "after", "op", "value"),
    [
        ("body>16MB", "body", False, ">", 16 * 1024**2),
        ("images>8", "images", False, ">", 8),
        (" after.body >= 2MiB ", "body", True, ">=", 2 * 1024**2),
        ("growth>1MB/turn", "growth", False, ">", 1024**2),
        ("after.growth<=500KB / turn", "growth", True, "<=", 500 * 1024),
        ("image_growth>0.5/turn", "image_growth", False, ">", 0.5),
        ("status=413", "status", False, "=", 413),
        ("status!=200", "status", False, "!=", 200),
        ("turns>50", "turns", False, ">", 50),
        ("tokens<1000", "tokens", False, "<", 1000),
        ("input_tokens>100000", "input_tokens", False, ">", 100000),
    ],
)
def test_expressions_parse(text, field, after, op, value) -> None:
    expr = parse(text)
    assert (expr.field, expr.after, expr.op, expr.value) == (field, after, op, value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("body", "expected FIELD OP VALUE"),
        ("bodies>1MB", "unknown field 'bodies'"),
        ("after.status=413", "no after"),
        ("body>lots", "invalid size"),
        ("images>8/turn", "'/turn' belongs to growth"),
        ("images>2.5", "not a whole number"),
        ("status=>413", "not a whole number"),
    ],
)
def test_bad_expressions_say_why(text, says) -> None:
    with pytest.raises(ExpressionError, match=re.escape(says)):
        parse(text)


def test_the_gate_passes_when_every_expression_holds_nowhere(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", session(5))
    code, out, err = audit(capsys, dump, "--fail-on", "images>8", "--fail-on", "body>16MB", "--fail-on", "status=413", "--fail-on", "growth>1MB/turn")
    assert code == 0, err
    assert "gate: ok (0 of 4 --fail-on broken)" in out


def test_the_gate_fails_naming_the_expression_conversation_and_turn(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", session(10) + [llm_flow(turn=11, status=413, answer=LIMIT_413)])
    code, out, err = audit(
        capsys, dump, "--fail-on", "images>8", "--fail-on", "status=413", "--fail-on", "body>16MB", "--fail-on", "image_growth>=1/turn"
    )
    assert code == 1
    conversation = re.search(r"conversation (\w+) ·", out).group(1)
    assert f"FAIL images>8: conversation {conversation} turn 9 (images 9, and 2 later turns)" in err
    assert f"FAIL status=413: conversation {conversation} turn 11 (status 413)" in err
    assert f"FAIL image_growth>=1/turn: conversation {conversation} turn 11 (image_growth 1.00/turn)" in err
    assert "body>16MB" not in err
    assert "gate: FAIL (3 of 4 --fail-on broken)" in out and "ok    body>16MB" in out


def test_after_expressions_gate_on_the_pruned_requests(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", session(6))
    rules = write_rules(tmp_path / "rules.yaml", "defaults:\n  max_images: 3\n")
    assert audit(capsys, dump, "--rules", rules, "--fail-on", "after.images>3")[0] == 0
    code, _, err = audit(capsys, dump, "--rules", rules, "--fail-on", "after.images>=3")
    assert code == 1 and "turn 3 (after.images 3, and 3 later turns)" in err


# --- a failing value never reads as its limit -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "actual", "shown"),
    [
        ("after.body>2MB", 2_141_104, "2,141,104 bytes"),  # 2.04MiB: "2.0MB" would read as the limit itself
        ("body>2MB", 2 * 1024**2 + 1, "2,097,153 bytes"),
        ("body>2MB", 3 * 1024**2, "3.0MB"),  # plainly over: the short form
        ("body>=2MB", 2 * 1024**2, "2.0MB"),  # exactly the limit, and the limit fails: the short form is right
        ("body<2MB", 2_090_000, "2,090,000 bytes"),
        ("growth>100KB/turn", 102_400.4, "102,400.4 bytes/turn"),
        ("growth>100KB/turn", 250_000.0, "244KB/turn"),
        ("growth<-1KB/turn", -1_100.0, "-1,100 bytes/turn"),
        ("image_growth>1/turn", 1.0004, "1.0004/turn"),
        ("image_growth>1/turn", 1.5, "1.50/turn"),
        ("images>8", 9, "9"),
    ],
)
def test_a_breaking_value_is_shown_with_enough_digits_to_differ_from_the_limit(text, actual, shown) -> None:
    expr = parse(text)
    assert expr.holds_for(actual)
    assert expr.show(actual) == shown


def test_the_gate_names_the_exact_bytes_of_a_body_just_over_its_limit(tmp_path, capsys) -> None:
    head, tail = body_of("anthropic", 1)[:-1] + b',"metadata":{"user_id":"', b'"}}'
    body = head + b"x" * (2_141_104 - len(head) - len(tail)) + tail
    assert len(body) == 2_141_104
    dump = write_dump(tmp_path / "run.mitm", [llm_flow(body=body)])
    code, out, err = audit(capsys, dump, "--fail-on", "body>2MB")
    assert code == 1
    assert "(body 2,141,104 bytes)" in err and "2.0MB" not in err
    assert "FAIL  body>2MB: conversation" in out and "(body 2,141,104 bytes)" in out


# --- inputs the gate fails on by themselves -------------------------------------------------------------------


def only_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def cut(path: Path, nbytes: int) -> Path:
    path.write_bytes(path.read_bytes()[:-nbytes])
    return path


@pytest.mark.parametrize("allow_empty", [False, True])
@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda d: write_bytes(d / "empty.mitm", b""), "empty.mitm: no LLM request measured (0 flows)"),
        (lambda d: write_dump(d / "other.mitm", [tflow.tflow(resp=True)]), "other.mitm: no LLM request measured (1 flow: 1 not LLM"),
        (lambda d: write_har(d / "empty.har", []), "empty.har: no LLM request measured (0 flows)"),
        (lambda d: write_bytes(d / "empty.jsonl", b""), "empty.jsonl: no LLM request measured (0 lines)"),
    ],
)
def test_an_input_with_no_llm_request_fails_the_gate_unless_allowed(tmp_path, capsys, make, says, allow_empty) -> None:
    path = make(tmp_path)
    code, out, err = audit(capsys, path, *(["--allow-empty"] if allow_empty else []))
    if allow_empty:
        assert code == 0 and only_line(err).startswith(f"trimflow audit: warning: {path.parent}/") and says in err
        assert "gate:" not in out
    else:
        line = only_line(err)
        assert code == 1 and line.startswith("trimflow audit: FAIL ") and says in line, err
        assert "did the client go through the proxy? (--allow-empty lets this pass)" in line
        assert "gate: FAIL (0 of 0 --fail-on broken, 1 input failing)" in out


@pytest.mark.parametrize("allow_empty", [False, True])
@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda d: cut(write_dump(d / "run.mitm", session(3)), 40), "run.mitm: cut short: the file ends inside flow 3"),
        (lambda d: cut(write_dump(d / "run.mitm", session(1)), 40), "run.mitm: cut short: the file ends inside flow 1"),
        (
            lambda d: cut(write_dump(d / "run.mitm", session(2)), write_dump(d / "one.mitm", session(2)[1:]).stat().st_size - 3),
            "run.mitm: cut short: the file ends inside flow 2",
        ),  # cut inside the second flow's length
        (lambda d: cut(write_har(d / "run.har", session(3)), 100), "run.har: cut short: the file ends before its JSON does"),
        (lambda d: cut(jsonl_of(d / "metrics.jsonl", 3), 20), "metrics.jsonl: cut short: line 3, the last, ends inside its record"),
        (lambda d: cut(jsonl_of(d / "metrics.jsonl", 1), 20), "metrics.jsonl: cut short: line 1, the last, ends inside its record"),
    ],
)
def test_an_input_cut_short_fails_the_gate_even_when_empty_is_allowed(tmp_path, capsys, make, says, allow_empty) -> None:
    path = make(tmp_path)
    code, out, err = audit(capsys, path, "--fail-on", "images>8", *(["--allow-empty"] if allow_empty else []))
    line = only_line(err)
    assert code == 1 and line.startswith("trimflow audit: FAIL ") and says in line, err
    assert "gate: FAIL (0 of 1 --fail-on broken, 1 input failing)" in out


def test_the_flows_before_the_cut_are_reported(tmp_path, capsys) -> None:
    dump = cut(write_dump(tmp_path / "run.mitm", session(3)), 40)
    code, report, _ = audit_json(capsys, dump)
    assert code == 1
    assert [r["turn"] for r in report["records"]] == [1, 2]
    assert report["summary"]["gate"]["input_failures"] == [f"{dump}: cut short: the file ends inside flow 3"]


def test_one_empty_input_among_others_fails_naming_it(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", session(2))
    empty = write_bytes(tmp_path / "agent-b.mitm", b"")
    code, _, err = audit(capsys, dump, empty, "--fail-on", "images>8")
    assert code == 1 and f"FAIL {empty}: no LLM request measured" in only_line(err)
    assert audit(capsys, dump, empty, "--fail-on", "images>8", "--allow-empty")[0] == 0


def jsonl_of(path: Path, turns: int) -> Path:
    """Metrics lines as the addon writes them: one record a line, each ended by a newline."""
    lines = []
    for t in range(1, turns + 1):
        outcome = prune_request("https://api.anthropic.com/v1/messages", {}, body_of("anthropic", t), rules_with(max_images=2), ENFORCE)
        lines.append(orjson.dumps(outcome.record.to_dict() | {"turn": t, "status": 200}) + b"\n")
    return write_bytes(path, b"".join(lines))
