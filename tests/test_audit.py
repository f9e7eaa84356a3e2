"""scripts/audit: inputs made in-process with mitmproxy's own flow helpers and writers, run through main()."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import orjson
import pytest
from mitmproxy import http
from mitmproxy import io as mitm_io
from mitmproxy.addons.savehar import SaveHar
from mitmproxy.test import tflow, tutils
from mitmproxy.websocket import WebSocketMessage
from wsproto.frame_protocol import Opcode

from trimflow import ENFORCE, prune_request
from trimflow.audit import main
from trimflow.audit._gate import ExpressionError, parse
from trimflow.audit._read import classify_failure, record_from_dict
from trimflow.audit._summary import slope
from trimflow._sizes import parse_size
from trimflow.testing import PATHS, image, session_body

from .helpers import rules_with

SHOT = image(120, 80, "PNG", seed=5)
SECRET = "sk-test-SECRET-audit-4411"
QUERY_SECRET = "AIzaSECRET-query-9911"
PROMPT = "What should I click next?"
OK_ANSWER = b'{"id":"x","usage":{"input_tokens":1234,"output_tokens":5}}'
LIMIT_413 = b'{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum size"}}'


def body_of(wire_format: str, turn: int, system: str | None = None) -> bytes:
    body = session_body(wire_format, turn, SHOT, "image/png")
    if system is not None:  # a different head: another conversation
        body["system"] = system
    return orjson.dumps(body)


def llm_flow(wire_format: str = "anthropic", turn: int = 1, *, status: int | None = 200, answer: bytes = OK_ANSWER,
             encoding: str | None = None, host: str = "api.anthropic.com", path: str | None = None,
             body: bytes | None = None, system: str | None = None, method: bytes = b"POST") -> http.HTTPFlow:
    headers = http.Headers(content_type="application/json", x_api_key=SECRET)
    request = tutils.treq(host=host, port=443, scheme=b"https", method=method, authority=b"",
                          path=(path or PATHS[wire_format]).encode(), headers=headers, content=b"")
    if encoding:
        request.headers["content-encoding"] = encoding
    request.content = body if body is not None else body_of(wire_format, turn, system)  # encoded as the header says
    response = None
    if status is not None:
        response = tutils.tresp(status_code=status, content=answer, headers=http.Headers(content_type="application/json"))
    return tflow.tflow(req=request, resp=response or False, err=status is None)


def write_dump(path: Path, flows) -> Path:
    with open(path, "wb") as f:
        writer = mitm_io.FlowWriter(f)
        for flow in flows:
            writer.add(flow)
    return path


def read_dump(path: Path) -> list:
    with open(path, "rb") as f:
        return list(mitm_io.FlowReader(f).stream())


def write_har(path: Path, flows) -> Path:
    path.write_text(json.dumps(SaveHar().make_har(flows)))
    return path


def session(turns: int = 10, **kwargs) -> list[http.HTTPFlow]:
    return [llm_flow(turn=t, **kwargs) for t in range(1, turns + 1)]


def audit(capsys, *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def audit_json(capsys, *args: str) -> tuple[int, dict, str]:
    code, out, err = audit(capsys, *args, "--format", "json")
    return code, orjson.loads(out), err


def rows(report: dict) -> list[dict]:
    return report["records"]


def only_conversation(report: dict) -> dict:
    conversations = report["summary"]["conversations"]
    assert len(conversations) == 1, conversations
    return conversations[0]


def write_rules(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- reading dumps --------------------------------------------------------------------------------------------


def test_a_dump_gives_one_row_per_turn_with_the_sizes_sent(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", session(6))
    code, report, err = audit_json(capsys, dump)
    assert code == 0, err
    records = rows(report)
    assert [r["turn"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["images_before"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["body_bytes_before"] for r in records] == [len(body_of("anthropic", t)) for t in range(1, 7)]
    # No rules: the recording as it is, nothing pruned.
    assert all(r["images_after"] == r["images_before"] and r["body_bytes_after"] == r["body_bytes_before"] for r in records)
    assert {r["status"] for r in records} == {200}
    assert {r["usage_input_tokens"] for r in records} == {1234}
    assert {r["conversation"] for r in records} == {only_conversation(report)["conversation"]}
    assert report["summary"]["llm_requests"] == 6 and report["summary"]["flows"] == 6


def test_growth_is_the_least_squares_slope_per_turn(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", session(5))
    _, report, _ = audit_json(capsys, dump)
    growth = only_conversation(report)["growth_per_turn"]
    sizes = [len(body_of("anthropic", t)) for t in range(1, 6)]
    assert growth["images"] == pytest.approx(1.0)
    assert growth["body_bytes"] == pytest.approx(slope([1, 2, 3, 4, 5], sizes))
    assert report["summary"]["growth_method"].startswith("least-squares")


def test_slope() -> None:
    assert slope([1, 2, 3], [10, 20, 30]) == pytest.approx(10)
    assert slope([1, 2, 3, 4], [0, 10, 0, 10]) == pytest.approx(2)  # reads through the zigzag
    assert slope([1], [5]) is None and slope([2, 2], [1, 3]) is None


def test_conversations_are_told_apart_and_numbered_in_file_order(tmp_path, capsys) -> None:
    flows = []
    for t in range(1, 4):
        flows.append(llm_flow(turn=t))
        flows.append(llm_flow(turn=t, system="You are another assistant."))
        flows.append(llm_flow("openai-chat", t, host="api.openai.com"))
    _, report, _ = audit_json(capsys, write_dump(tmp_path / "run.mitm", flows))
    conversations = report["summary"]["conversations"]
    assert len(conversations) == 3
    assert all(c["turns"] == 3 and (c["first_turn"], c["last_turn"]) == (1, 3) for c in conversations)
    for record in rows(report):
        assert record["images_before"] == record["turn"]


@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd", "deflate"])
def test_compressed_bodies_are_measured_decoded(tmp_path, capsys, encoding) -> None:
    flows = session(3, encoding=encoding)
    assert flows[0].request.raw_content != flows[0].request.content  # really on the wire compressed
    _, report, _ = audit_json(capsys, write_dump(tmp_path / "run.mitm", flows))
    assert [r["body_bytes_before"] for r in rows(report)] == [len(body_of("anthropic", t)) for t in (1, 2, 3)]


def test_an_undecodable_body_is_counted_with_its_reason(tmp_path, capsys) -> None:
    broken = llm_flow(turn=1)
    broken.request.headers["content-encoding"] = "gzip"
    broken.request.raw_content = b"this is not gzip"
    code, report, err = audit_json(capsys, write_dump(tmp_path / "run.mitm", [broken, llm_flow(turn=1)]))
    assert code == 0, err
    assert report["summary"]["unreadable"] == {"cannot decode content-encoding 'gzip'": 1}
    assert report["summary"]["llm_requests"] == 1


def test_non_llm_flows_are_skipped_and_counted(tmp_path, capsys) -> None:
    others = [
        tflow.tflow(resp=True),  # GET http://address:22/path
        llm_flow(turn=1, method=b"GET"),  # a GET to an LLM path
        llm_flow(path="/upload", body=b"\x89PNG not json"),  # a POST elsewhere, not JSON
        tflow.ttcpflow(),
        tflow.tdnsflow(),
    ]
    others[2].request.headers["content-type"] = "image/png"
    code, report, _ = audit_json(capsys, write_dump(tmp_path / "run.mitm", [*others, llm_flow(turn=1)]))
    assert code == 0
    assert report["summary"]["skipped_not_llm"] == 5
    assert report["summary"]["llm_requests"] == 1 and report["summary"]["flows"] == 6


def test_a_json_body_on_an_unknown_path_is_found_by_its_shape(tmp_path, capsys) -> None:
    flow = llm_flow("openai-chat", 2, host="llm.internal", path="/gateway/v2/generate")
    _, report, _ = audit_json(capsys, write_dump(tmp_path / "run.mitm", [flow]))
    (record,) = rows(report)
    assert (record["format"], record["images_before"]) == ("openai-chat", 2)


def test_an_llm_request_whose_body_is_not_json_is_listed_with_the_reason(tmp_path, capsys) -> None:
    flows = [llm_flow(turn=1), llm_flow(body=b'{"messages": [oops')]
    dump = write_dump(tmp_path / "run.mitm", flows)
    _, report, _ = audit_json(capsys, dump)
    odd = next(c for c in report["summary"]["conversations"] if c["conversation"] == "-")
    assert (odd["turns"], odd["first_turn"]) == (1, None)
    assert rows(report)[-1]["reason"].startswith("body is not JSON")
    code, out, _ = audit(capsys, dump, "--format", "html")
    assert code == 0 and out.count('data-series="before"') == 2  # one chart pair, for the real conversation
    assert "note: turn -: body is not JSON" in audit(capsys, dump)[1]


def test_a_request_without_an_answer_is_a_failure(tmp_path, capsys) -> None:
    _, report, _ = audit_json(capsys, write_dump(tmp_path / "run.mitm", [llm_flow(turn=1, status=None)]))
    assert only_conversation(report)["failures"] == [{"turn": 1, "status": None, "category": "no response"}]


def test_websocket_response_create_messages_are_requests(tmp_path, capsys) -> None:
    flow = tflow.twebsocketflow(messages=False)
    flow.request.host, flow.request.path = "chatgpt.com", "/backend-api/codex/responses"
    body = {"type": "response.create", **session_body("openai-responses", 3, SHOT, "image/png")}
    flow.websocket.messages = [WebSocketMessage(Opcode.TEXT, True, orjson.dumps(body), 946681204),
                               WebSocketMessage(Opcode.TEXT, False, b'{"type":"response.completed"}', 946681205)]
    _, report, _ = audit_json(capsys, write_dump(tmp_path / "run.mitm", [flow]))
    (record,) = rows(report)
    assert (record["format"], record["images_before"], record["turn"]) == ("openai-responses", 3, 1)


# --- a recording made through trimflow ------------------------------------------------------------------------


def proxied_flow(turn: int, max_images: int) -> http.HTTPFlow:
    """A flow as mitmdump -w saves it behind the addon: the pruned body, the addon's record in metadata."""
    flow = llm_flow(turn=turn)
    outcome = prune_request(flow.request.url, flow.request.headers, flow.request.content, rules_with(max_images=max_images), ENFORCE)
    outcome.record.turn = turn
    flow.request.content = outcome.body
    flow.metadata["trimflow"] = outcome.record.to_dict()
    return flow


def test_the_addons_record_gives_what_the_client_sent_and_what_was_forwarded(tmp_path, capsys) -> None:
    flows = [proxied_flow(t, max_images=3) for t in range(1, 7)]
    forwarded = [len(f.request.content) for f in flows]
    code, report, err = audit_json(capsys, write_dump(tmp_path / "run.mitm", flows))
    assert code == 0, err
    records = rows(report)
    assert [r["images_before"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["images_after"] for r in records] == [1, 2, 3, 3, 3, 3]
    assert [r["body_bytes_before"] for r in records] == [len(body_of("anthropic", t)) for t in range(1, 7)]
    assert [r["body_bytes_after"] for r in records] == forwarded
    # One conversation, although pruning the first image changed the head the engine would hash.
    assert only_conversation(report)["turns"] == 6
    assert report["summary"]["inputs"][0]["proxy_records"] == 6


def test_a_what_if_over_a_recording_made_through_trimflow_starts_from_what_was_forwarded(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", [proxied_flow(t, max_images=4) for t in range(1, 7)])
    rules = write_rules(tmp_path / "rules.yaml", "defaults:\n  max_images: 2\n")
    _, report, _ = audit_json(capsys, dump, "--rules", rules)
    records = rows(report)
    assert [r["images_before"] for r in records] == [1, 2, 3, 4, 5, 6]  # what the client sent
    assert [r["images_after"] for r in records] == [1, 2, 2, 2, 2, 2]
    assert [bool(r["reason"]) for r in records] == [False] * 4 + [True] * 2  # turns the proxy had pruned
    assert only_conversation(report)["turns"] == 6


# --- HAR and JSONL --------------------------------------------------------------------------------------------


def comparable(report: dict) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("ts", "overhead_ms")} for r in rows(report)]


def test_a_har_export_of_the_same_flows_gives_the_same_report(tmp_path, capsys) -> None:
    flows = session(5, encoding="gzip") + [llm_flow(turn=6, status=413, answer=LIMIT_413), tflow.tflow(resp=True)]
    dump = write_dump(tmp_path / "run.mitm", flows)
    har = write_har(tmp_path / "run.har", read_dump(dump))
    _, from_dump, _ = audit_json(capsys, dump)
    _, from_har, _ = audit_json(capsys, har)
    assert comparable(from_har) == comparable(from_dump)
    assert from_har["summary"]["conversations"] == from_dump["summary"]["conversations"]
    assert from_har["summary"]["inputs"][0]["kind"] == "har"


def test_jsonl_metrics_are_read_as_records(tmp_path, capsys) -> None:
    records = []
    for t in range(1, 5):
        outcome = prune_request("https://api.anthropic.com/v1/messages", {}, body_of("anthropic", t), rules_with(max_images=2), ENFORCE)
        record = outcome.record.to_dict() | {"turn": t, "status": 200 if t < 4 else 413, "usage_input_tokens": 100 * t}
        records.append(record)
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records) + b"not json\n\n")
    code, report, err = audit_json(capsys, path)
    assert code == 0, err
    got = rows(report)
    assert [(r["images_before"], r["images_after"]) for r in got] == [(1, 1), (2, 2), (3, 2), (4, 2)]
    assert [r["usage_input_tokens"] for r in got] == [100, 200, 300, 400]
    assert only_conversation(report)["failures"] == [{"turn": 4, "status": 413, "category": "body too large"}]
    assert report["summary"]["unreadable"] == {"line is not a metrics record": 1}


def test_record_from_dict_rejects_what_is_not_a_record() -> None:
    with pytest.raises(ValueError):
        record_from_dict({"hello": 1})
    with pytest.raises(ValueError):
        record_from_dict({"format": "anthropic", "body_bytes_before": "many"})
    record = record_from_dict({"format": "anthropic", "body_bytes_before": 5, "path": "/v1/messages?key=abc", "extra": 1})
    assert record.path == "/v1/messages" and record.body_bytes_before == 5


def test_several_inputs_at_once(tmp_path, capsys) -> None:
    first = write_dump(tmp_path / "a.mitm", session(3))
    second = write_har(tmp_path / "b.har", [llm_flow(turn=t) for t in (4, 5)])
    _, report, _ = audit_json(capsys, first, second)
    assert only_conversation(report)["turns"] == 5  # the conversation goes on across the files
    assert [i["kind"] for i in report["summary"]["inputs"]] == ["mitm", "har"]


# --- failures -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "text", "category"),
    [
        (413, b"", "body too large"),
        (413, b"<html>413 Request Entity Too Large</html>", "body too large"),
        (400, b"HTTP 400 \xe2\x80\x93 Max images exceeded", "too many images"),
        (400, b'{"error":{"message":"too many images: maximum allowed for model gemini-3.1-pro-preview is 10, got 11"}}', "too many images"),
        (400, b'{"message":"too many images and documents: 104 + 1 > 100"}', "too many images"),
        (400, b'{"message":"messages.0.content.2.image.source.base64: image exceeds 5 MB maximum: 15908784 bytes > 5242880 bytes"}', "image too large"),
        (400, b"Bad request (400): Request size cannot exceed 8999999 bytes", "body too large"),
        (400, b'{"error":{"message":"Request payload size exceeds the limit: 314572800 bytes."}}', "body too large"),
        (400, b'{"error":"unknown field"}', "http 400"),
        (500, b"oops", "http 500"),
        (200, b"too many images", None),
        (None, None, None),
    ],
)
def test_failures_are_recognised_by_status_and_text(status, text, category) -> None:
    assert classify_failure(status, text) == category


def test_failures_are_listed_per_conversation_without_the_answer_text(tmp_path, capsys) -> None:
    flows = session(3) + [llm_flow(turn=4, status=413, answer=LIMIT_413),
                          llm_flow(turn=5, status=400, answer=b'{"message":"too many images: got 5 ' + PROMPT.encode() + b'"}')]
    code, out, _ = audit(capsys, write_dump(tmp_path / "run.mitm", flows))
    assert code == 0
    assert "failures: turn 4: 413 body too large; turn 5: 400 too many images" in out
    assert "request_too_large" not in out and PROMPT not in out


# --- what-if --------------------------------------------------------------------------------------------------


def test_rules_give_a_what_if_with_the_bytes_and_tokens_saved(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", session(6))
    rules = write_rules(tmp_path / "rules.yaml", "defaults:\n  max_images: 2\n  keep_recent: 1\n")
    code, report, err = audit_json(capsys, dump, "--rules", rules)
    assert code == 0, err
    records = rows(report)
    assert [r["images_after"] for r in records] == [1, 2, 2, 2, 2, 2]
    assert all(r["body_bytes_after"] < r["body_bytes_before"] for r in records[2:])
    totals = report["summary"]["totals"]
    assert totals["body_bytes_saved"] == sum(r["body_bytes_before"] - r["body_bytes_after"] for r in records) > 0
    assert totals["est_tokens_saved"] > 0
    crossing = next(c for c in only_conversation(report)["limits"] if c["limit"] == "max_images")
    assert (crossing["value"], crossing["crossed_at"], crossing["after_crossed_at"]) == (2, 3, None)
    assert report["summary"]["what_if_rules"] == str(rules)


def test_without_rules_the_default_rules_give_the_limits_to_cross(tmp_path, capsys) -> None:
    _, report, _ = audit_json(capsys, write_dump(tmp_path / "run.mitm", session(10)))
    limits = {c["limit"]: c for c in only_conversation(report)["limits"]}
    assert (limits["max_images"]["value"], limits["max_images"]["crossed_at"], limits["max_images"]["projected"]) == (8, 9, False)
    body = limits["max_body_bytes"]
    assert body["value"] == parse_size("16MiB") and body["projected"] is True
    sizes = [len(body_of("anthropic", t)) for t in range(1, 11)]
    # The crossing extends the fitted line: the first whole turn past the limit.
    b = slope(list(range(1, 11)), sizes)
    a = sum(sizes) / 10 - b * 5.5
    assert a + b * body["crossed_at"] > body["value"] >= a + b * (body["crossed_at"] - 1)


def test_a_limit_profile_adds_its_crossings(tmp_path, capsys) -> None:
    _, report, _ = audit_json(capsys, write_dump(tmp_path / "run.mitm", session(4)), "--profile", "generic-8")
    sources = {(c["limit"], c["source"]) for c in only_conversation(report)["limits"]}
    assert ("max_images", "profile generic-8") in sources
    assert [s for limit, s in sources if limit == "max_images" and s.startswith("rule ")]


# --- the gate -------------------------------------------------------------------------------------------------


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


# --- unusable input -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "args", "says"),
    [
        (lambda d: d / "missing.mitm", (), "missing.mitm: no such file"),
        (lambda d: d, (), "not a file"),
        (lambda d: _write(d / "junk.mitm", b"PK\x03\x04 a zip, not a dump"), (), "junk.mitm: not a mitmproxy dump (invalid data)"),
        (lambda d: _write(d / "junk.har", b'{"log": 5}'), (), "junk.har: not a HAR file"),
        (lambda d: _write(d / "junk.jsonl", b'{"a": 1}\n'), (), "junk.jsonl: not trimflow metrics JSONL"),
        (lambda d: _write(d / "ok.mitm", b""), ("--fail-on", "images>>8"), "--fail-on 'images>>8'"),
        (lambda d: _write(d / "ok.mitm", b""), ("--rules", "/nonexistent/rules.yaml"), "rules.yaml: cannot read"),
        (lambda d: _write(d / "ok.mitm", b""), ("--profile", "no-such-profile"), "unknown profile 'no-such-profile'"),
        (lambda d: _write(d / "ok.mitm", b""), ("--format", "pdf"), "invalid choice: 'pdf'"),
    ],
)
def test_unusable_input_exits_2_with_one_line(tmp_path, capsys, make, args, says) -> None:
    code, out, err = audit(capsys, make(tmp_path), *args)
    assert code == 2
    assert out == ""
    reason = [line for line in err.splitlines() if line.startswith("trimflow audit:")]
    assert len(reason) == 1 and says in reason[0], err


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_a_dump_cut_short_keeps_what_was_read_and_warns(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", session(3))
    with open(dump, "ab") as f:
        f.write(b"123456:not a whole flow")
    code, report, err = audit_json(capsys, dump)
    assert code == 0
    assert len(rows(report)) == 3
    assert "unreadable after flow 3" in report["summary"]["inputs"][0]["truncated"]
    assert "warning: " in err and "unreadable after flow 3" in err


def test_an_empty_recording_passes_with_a_warning(tmp_path, capsys) -> None:
    code, out, err = audit(capsys, _write(tmp_path / "empty.mitm", b""), "--fail-on", "images>8")
    assert code == 0 and "no LLM requests found" in err


# --- formats --------------------------------------------------------------------------------------------------


@pytest.fixture
def recording(tmp_path) -> Path:
    flows = session(4) + [llm_flow(turn=5, status=413, answer=LIMIT_413)]
    for flow in flows:
        flow.request.path += f"?key={QUERY_SECRET}"
    return write_dump(tmp_path / "run.mitm", flows)


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


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.append((tag, dict(attrs)))


def test_html_is_self_contained_with_one_point_per_turn(recording, tmp_path, capsys) -> None:
    out_path = tmp_path / "report.html"
    code, out, _ = audit(capsys, recording, "--format", "html", "--out", out_path)
    assert code == 0 and out == ""
    page = out_path.read_text()
    parser = _Elements()
    parser.feed(page)
    circles = [attrs for tag, attrs in parser.tags if tag == "circle"]
    assert sorted(int(c["data-turn"]) for c in circles if c["data-series"] == "before") == sorted([1, 2, 3, 4, 5] * 2)
    assert not [c for c in circles if c["data-series"] == "after"]  # no rules: nothing to compare
    assert not re.search(r"\b(src|href)\s*=|url\(|@import|https?://", page)
    assert [a.get("class") for t, a in parser.tags if t == "line" and "limit" in (a.get("class") or "")]


def test_html_what_if_draws_both_series(recording, tmp_path, capsys) -> None:
    rules = write_rules(tmp_path / "rules.yaml", "defaults:\n  max_images: 2\n")
    _, page, _ = audit(capsys, recording, "--format", "html", "--rules", rules)
    parser = _Elements()
    parser.feed(page)
    after = [a for t, a in parser.tags if t == "circle" and a["data-series"] == "after"]
    assert [int(a["data-value"]) for a in after if a["data-label"].startswith("turn") and "images" in a["data-label"]] == [1, 2, 2, 2, 2]


@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "html"])
def test_no_format_prints_a_credential_query_prompt_or_base64(recording, capsys, fmt) -> None:
    _, out, err = audit(capsys, recording, "--format", fmt, "--fail-on", "status=413")
    for text in (out, err):
        assert SECRET not in text and QUERY_SECRET not in text and "key=" not in text
        assert PROMPT not in text and "request_too_large" not in text
        assert base64.b64encode(SHOT)[:40].decode() not in text
        assert not re.search(r"[A-Za-z0-9+/]{200,}", text)


def test_out_writes_a_file(recording, tmp_path, capsys) -> None:
    target = tmp_path / "report.md"
    code, out, _ = audit(capsys, recording, "--format", "markdown", "--out", target)
    assert code == 0 and out == "" and target.read_text().startswith("## trimflow audit")
    assert audit(capsys, recording, "--out", tmp_path / "no" / "such" / "dir.txt")[0] == 2


def test_scripts_audit_runs_the_module(tmp_path) -> None:
    import subprocess
    import sys

    dump = write_dump(tmp_path / "run.mitm", session(2))
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "trimflow", "audit", str(dump), "--fail-on", "images>1"],
                          capture_output=True, text=True, cwd=root, timeout=60)
    assert done.returncode == 1 and "FAIL images>1" in done.stderr
    assert (root / "scripts" / "audit").stat().st_mode & 0o111
    assert "-m trimflow audit" in (root / "scripts" / "audit").read_text()


def test_record_fields_are_dataclass_fields() -> None:
    # JSONL records are rebuilt field by field: every Record field must round-trip.
    outcome = prune_request("https://api.anthropic.com/v1/messages", {}, body_of("anthropic", 3), rules_with(max_images=1), ENFORCE)
    record = dataclasses.replace(outcome.record, status=200, usage_input_tokens=7, turn=3, conversation="abc")
    assert record_from_dict(orjson.loads(record.to_json())) == record
