"""trimflow.audit._gate: --fail-on expressions parsed or refused with the reason, and the gate's verdict
naming the expression, the conversation and the turn."""

from __future__ import annotations

import re

import pytest

from trimflow.audit._gate import ExpressionError, parse

from .helpers import LIMIT_413, audit, llm_flow, session, write_dump, write_rules


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
    code, out, err = audit(capsys, dump, "--fail-on", "images>8", "--fail-on", "body>16MB", "--fail-on", "status=413",
                           "--fail-on", "growth>1MB/turn")
    assert code == 0, err
    assert "gate: ok (0 of 4 --fail-on broken)" in out


def test_the_gate_fails_naming_the_expression_conversation_and_turn(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", session(10) + [llm_flow(turn=11, status=413, answer=LIMIT_413)])
    code, out, err = audit(capsys, dump, "--fail-on", "images>8", "--fail-on", "status=413", "--fail-on", "body>16MB",
                           "--fail-on", "image_growth>=1/turn")
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
