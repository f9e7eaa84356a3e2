"""trimflow.audit._read: mitmproxy dumps, HAR files and metrics JSONL read into rows, conversations told apart,
a recording made through trimflow, failures recognised, and input cut short."""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from mitmproxy import http
from mitmproxy.test import tflow
from mitmproxy.websocket import WebSocketMessage
from wsproto.frame_protocol import Opcode

from trimflow import ENFORCE, prune_request
from trimflow._conversation import Conversations
from trimflow._decode import BROTLI_BOUNDED
from trimflow._rules import builtin_rules
from trimflow.audit._read import Reader, classify_failure, record_from_dict
from trimflow.testing import PATHS, data_url, image, session_body

from ..helpers import rules_with
from ..images import chat
from .helpers import (
    LIMIT_413,
    SHOT,
    audit,
    audit_json,
    body_of,
    llm_flow,
    only_conversation,
    read_dump,
    rows,
    session,
    write_dump,
    write_har,
    write_rules,
)

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
    if encoding == "br" and not BROTLI_BOUNDED:  # brotli 1.1 (mitmproxy 11) cannot decode within a bound: never inflated
        assert rows(report) == [] and report["summary"]["unreadable"] == {"cannot decode content-encoding 'br'": 3}
        return
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
    flow.websocket.messages = [
        WebSocketMessage(Opcode.TEXT, True, orjson.dumps(body), 946681204),
        WebSocketMessage(Opcode.TEXT, False, b'{"type":"response.completed"}', 946681205),
    ]
    _, report, _ = audit_json(capsys, write_dump(tmp_path / "run.mitm", [flow]))
    (record,) = rows(report)
    assert (record["format"], record["images_before"], record["turn"]) == ("openai-responses", 3, 1)


def test_a_dump_cut_short_keeps_what_was_read_and_says_where_it_ends(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", session(3))
    with open(dump, "ab") as f:
        f.write(b"123456:not a whole flow")
    code, report, err = audit_json(capsys, dump)
    assert code == 1  # the gate fails on an input cut short
    assert len(rows(report)) == 3
    assert report["summary"]["inputs"][0]["truncated"] == "cut short: the file ends inside flow 4"
    assert f"FAIL {dump}: cut short: the file ends inside flow 4" in err


def test_a_dump_unreadable_in_the_middle_is_not_called_cut_short(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", session(3))
    data = dump.read_bytes()
    second = data.index(b":", 1) + 1  # the first flow's length, then its payload: where the second flow starts
    first_end = int(data[: second - 1]) + second + 1
    dump.write_bytes(data[:first_end] + b"x" + data[first_end + 1 :])  # the second flow's length made unreadable
    _, report, _ = audit_json(capsys, dump)
    assert len(rows(report)) == 1
    assert report["summary"]["inputs"][0]["truncated"] == "unreadable after flow 1 (invalid data); the rest of the file was skipped"


def test_a_metrics_jsonl_whose_last_line_is_cut_keeps_the_lines_before(tmp_path, capsys) -> None:
    lines = [
        orjson.dumps(
            prune_request("https://api.anthropic.com/v1/messages", {}, body_of("anthropic", t), rules_with(max_images=2), ENFORCE).record.to_dict()
        )
        + b"\n"
        for t in (1, 2, 3)
    ]
    whole = b"".join(lines)
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(whole[:-30])
    _, report, _ = audit_json(capsys, path)
    assert len(rows(report)) == 2 and report["summary"]["unreadable"] == {}
    assert report["summary"]["inputs"][0]["truncated"] == "cut short: line 3, the last, ends inside its record"
    path.write_bytes(whole + b"not a record\n")  # a bad line in the middle of a file is unreadable, not a cut
    _, report, _ = audit_json(capsys, path, "--allow-empty")
    assert len(rows(report)) == 3 and report["summary"]["inputs"][0]["truncated"] is None


# --- a recording made through trimflow ------------------------------------------------------------------------


def proxied_flow(turn: int, max_images: int, conversations: Conversations | None = None) -> http.HTTPFlow:
    """A flow as mitmdump -w saves it behind the addon: the pruned body, the addon's record in metadata,
    numbered in its conversation as the proxy numbers it."""
    flow = llm_flow(turn=turn)
    outcome = prune_request(flow.request.url, flow.request.headers, flow.request.content, rules_with(max_images=max_images), ENFORCE)
    assigned = (conversations if conversations is not None else Conversations()).assign(outcome.history, outcome.record.kind)
    outcome.record.conversation, outcome.record.turn, outcome.record.segment = assigned.conversation, assigned.turn, assigned.segment
    flow.request.content = outcome.body
    flow.metadata["trimflow"] = outcome.record.to_dict()
    return flow


def test_the_addons_record_gives_what_the_client_sent_and_what_was_forwarded(tmp_path, capsys) -> None:
    proxy = Conversations()
    flows = [proxied_flow(t, max_images=3, conversations=proxy) for t in range(1, 7)]
    forwarded = [len(f.request.content) for f in flows]
    code, report, err = audit_json(capsys, write_dump(tmp_path / "run.mitm", flows))
    assert code == 0, err
    records = rows(report)
    assert [r["images_before"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["images_after"] for r in records] == [1, 2, 3, 3, 3, 3]
    assert [r["body_bytes_before"] for r in records] == [len(body_of("anthropic", t)) for t in range(1, 7)]
    assert [r["body_bytes_after"] for r in records] == forwarded
    # One conversation, the proxy's: it saw what the client sent, the recording holds what was forwarded.
    assert only_conversation(report)["conversation"] == flows[0].metadata["trimflow"]["conversation"]
    assert [r["turn"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert report["summary"]["inputs"][0]["proxy_records"] == 6


def test_a_what_if_over_a_recording_made_through_trimflow_starts_from_what_was_forwarded(tmp_path, capsys) -> None:
    proxy = Conversations()
    dump = write_dump(tmp_path / "run.mitm", [proxied_flow(t, max_images=4, conversations=proxy) for t in range(1, 7)])
    rules = write_rules(tmp_path / "rules.yaml", "defaults:\n  max_images: 2\n")
    _, report, _ = audit_json(capsys, dump, "--rules", rules)
    records = rows(report)
    assert [r["images_before"] for r in records] == [1, 2, 3, 4, 5, 6]  # what the client sent
    assert [r["images_after"] for r in records] == [1, 2, 2, 2, 2, 2]
    assert [bool(r["reason"]) for r in records] == [False] * 4 + [True] * 2  # turns the proxy had pruned
    assert only_conversation(report)["turns"] == 6


def test_a_what_if_ages_images_by_arrival_as_the_proxy_does(tmp_path, capsys) -> None:
    """The second request sends fewer images, two of them cut on the first: under the cap now, they stay cut."""
    urls = [data_url(image(40, 30, "PNG", seed=n), "image/png") for n in range(10)]
    fewer = chat(*urls[:3], *urls[7:])
    fewer["messages"].append({"role": "user", "content": "and now?"})
    flows = [llm_flow("openai-chat", host="api.openai.com", body=orjson.dumps(body)) for body in (chat(*urls), fewer)]
    rules = write_rules(tmp_path / "rules.yaml", "defaults:\n  max_images: 8\n")
    _, report, _ = audit_json(capsys, write_dump(tmp_path / "run.mitm", flows), "--rules", rules)
    assert [(r["images_before"], r["images_after"]) for r in rows(report)] == [(10, 8), (6, 4)]  # by position: (6, 6)


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


def test_record_fields_are_dataclass_fields() -> None:
    # JSONL records are rebuilt field by field: every Record field must round-trip.
    outcome = prune_request("https://api.anthropic.com/v1/messages", {}, body_of("anthropic", 3), rules_with(max_images=1), ENFORCE)
    record = dataclasses.replace(outcome.record, status=200, usage_input_tokens=7, turn=3, conversation="abc")
    assert record_from_dict(orjson.loads(record.to_json())) == record


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
        (
            400,
            b'{"message":"messages.0.content.2.image.source.base64: image exceeds 5 MB maximum: 15908784 bytes > 5242880 bytes"}',
            "image too large",
        ),
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


# --- conversations told apart by their history ------------------------------------------------------------------


def conversations_of(report: dict, kind: str = "turn") -> dict[str, list[int]]:
    """Each conversation's turn numbers, in file order, over the records of one kind."""
    turns: dict[str, list[int]] = {}
    for r in rows(report):
        if r["kind"] == kind:
            turns.setdefault(r["conversation"], []).append(r["turn"])
    return turns


@pytest.mark.parametrize("kind", ["mitm", "har", "jsonl"])
def test_two_identical_runs_back_to_back_are_two_conversations(tmp_path, capsys, kind) -> None:
    # The same CI test run twice through one proxy: the second run's history starts over.
    flows = session(4) + session(4)
    if kind == "mitm":
        path = write_dump(tmp_path / "runs.mitm", flows)
    elif kind == "har":
        path = write_har(tmp_path / "runs.har", flows)
    else:  # what the proxy wrote: its numbering, as the audit keeps it
        proxy = Conversations()
        records = [proxied_flow(t, max_images=8, conversations=proxy).metadata["trimflow"] for t in [1, 2, 3, 4] * 2]
        path = tmp_path / "runs.jsonl"
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    _, report, _ = audit_json(capsys, path)
    assert list(conversations_of(report).values()) == [[1, 2, 3, 4], [1, 2, 3, 4]]
    assert len(report["summary"]["conversations"]) == 2


def test_old_records_that_merged_two_runs_are_renumbered_from_their_bodies(tmp_path, capsys) -> None:
    # Records written before conversations were told apart by history: one id for both runs, no kind.
    flows = session(3) + session(3)
    for turn, flow in enumerate(flows, 1):
        record = prune_request(flow.request.url, flow.request.headers, flow.request.content, rules_with(max_images=8)).record.to_dict()
        del record["kind"], record["segment"]
        flow.metadata["trimflow"] = {**record, "conversation": "0ld0ne00", "turn": turn}
    _, report, _ = audit_json(capsys, write_dump(tmp_path / "old.mitm", flows))
    assert list(conversations_of(report).values()) == [[1, 2, 3], [1, 2, 3]]


@pytest.mark.parametrize("wire_format", sorted(PATHS))
def test_a_history_without_a_system_message_is_one_conversation(tmp_path, capsys, wire_format) -> None:
    flows = []
    for turn in range(1, 6):
        body = session_body(wire_format, turn, SHOT, "image/png")
        body.pop("system", None), body.pop("systemInstruction", None), body.pop("instructions", None)
        if "messages" in body:
            body["messages"] = [m for m in body["messages"] if m.get("role") != "system"]
        flows.append(llm_flow(wire_format, body=orjson.dumps(body)))
    _, report, _ = audit_json(capsys, write_dump(tmp_path / "run.mitm", flows))
    assert list(conversations_of(report).values()) == [[1, 2, 3, 4, 5]]


def test_a_har_recorded_through_trimflow_is_one_conversation(tmp_path, capsys) -> None:
    # A HAR keeps no trimflow record: the audit reads the pruned bodies, whose placeholders it leaves out.
    flows = [proxied_flow(t, max_images=2) for t in range(1, 8)]
    assert b"[trimflow: image #" in flows[-1].request.content
    _, report, _ = audit_json(capsys, write_har(tmp_path / "through.har", flows))
    assert list(conversations_of(report).values()) == [[1, 2, 3, 4, 5, 6, 7]]


@pytest.mark.parametrize("kind", ["mitm", "har"])
def test_gemini_token_counts_are_in_their_conversation_and_are_no_turns(tmp_path, capsys, kind) -> None:
    host, count_path = "generativelanguage.googleapis.com", PATHS["gemini"].replace(":generateContent", ":countTokens")
    flows = []
    for turn in range(1, 4):
        contents = session_body("gemini", turn, SHOT, "image/png")["contents"]
        flows.append(llm_flow("gemini", host=host, path=count_path, body=orjson.dumps({"contents": contents}), answer=b'{"totalTokens": 99}'))
        flows.append(llm_flow("gemini", turn, host=host))
    path = write_dump(tmp_path / "gemini.mitm", flows) if kind == "mitm" else write_har(tmp_path / "gemini.har", flows)
    _, report, _ = audit_json(capsys, path)
    ((conversation, turns),) = conversations_of(report).items()
    assert turns == [1, 2, 3]
    counts = [r for r in rows(report) if r["kind"] == "count_tokens"]
    assert [(r["conversation"], r["turn"], r["images_before"]) for r in counts] == [(None, None, 1), (conversation, None, 2), (conversation, None, 3)]
    assert len(report["summary"]["conversations"]) == 2  # the first count extends nothing yet: listed apart, never a turn
    summary = next(c for c in report["summary"]["conversations"] if c["conversation"] == conversation)
    assert (summary["turns"], summary["first_turn"], summary["last_turn"]) == (3, 1, 3)  # its two counts are no turns


def test_a_codex_websocket_session_has_its_answers_and_no_warmup_turn(tmp_path, capsys) -> None:
    flow = tflow.twebsocketflow(messages=False)
    flow.request.host, flow.request.path = "chatgpt.com", "/backend-api/codex/responses"

    def event(payload: dict, from_client: bool, at: float) -> WebSocketMessage:
        return WebSocketMessage(Opcode.TEXT, from_client, orjson.dumps(payload), at)

    def completed(rid: str, tokens: int) -> dict:
        usage = {"input_tokens": tokens, "input_tokens_details": {"cached_tokens": tokens // 2}, "output_tokens": 3}
        return {"type": "response.completed", "response": {"id": rid, "status": "completed", "usage": usage}}

    first = {"type": "response.create", **session_body("openai-responses", 2, SHOT, "image/png"), "previous_response_id": "resp_w"}
    second = {"type": "response.create", "model": "gpt-5", "previous_response_id": "resp_1", "input": [{"role": "user", "content": "more"}]}
    flow.websocket.messages = [
        event({"type": "response.create", "model": "gpt-5", "instructions": "You are Codex.", "input": [], "generate": False}, True, 1.0),
        event(completed("resp_w", 11), False, 1.1),
        event(first, True, 2.0),
        event({"type": "response.output_text.delta", "delta": "..."}, False, 2.1),
        event(completed("resp_1", 2222), False, 2.2),
        event(second, True, 3.0),
        event({"type": "error", "status": 400, "error": {"message": "Max images exceeded"}}, False, 3.1),
    ]
    _, report, _ = audit_json(capsys, write_dump(tmp_path / "codex.mitm", [flow]))
    records = rows(report)
    assert [(r["kind"], r["turn"], r["status"], r["usage_input_tokens"]) for r in records] == [
        ("warmup", None, 200, 11),
        ("turn", 1, 200, 2222),
        ("turn", 2, 400, None),
    ]
    assert [(r["usage_cache_read_tokens"], r["usage_cache_write_tokens"], r["usage_output_tokens"]) for r in records] == [
        (5, None, 3),
        (1111, None, 3),
        (None, None, None),
    ]
    assert len({r["conversation"] for r in records}) == 1
    assert only_conversation(report)["failures"] == [{"turn": 2, "status": 400, "category": "too many images"}]


def test_a_recording_without_trimflow_names_why_its_cache_broke(tmp_path) -> None:
    """Recorded without trimflow (no addon record): the audit works the causes out as the proxy does. The agent edits
    its system prompt on turn 3 (a new conversation without a session id, matched to the turn it goes on from)."""

    def answer(read: int) -> bytes:
        usage = {"input_tokens": 50, "cache_read_input_tokens": read, "cache_creation_input_tokens": 900, "output_tokens": 5}
        return orjson.dumps({"id": "msg_1", "type": "message", "content": [{"type": "text", "text": "ok"}], "usage": usage})

    reads = [0, 3000, 0, 3500]
    flows = [llm_flow(turn=t, answer=answer(read), system="Edited." if t >= 3 else None) for t, read in enumerate(reads, 1)]
    dump = write_dump(tmp_path / "plain.mitm", flows)
    reader = Reader(builtin_rules(), builtin_rules(), what_if=False)
    records = [row.record for row in reader.rows(reader.check([str(dump)]))]
    assert [(r.cache_break, r.cache_break_at) for r in records] == [("first_turn", None), (None, None), ("agent_prefix", "system"), (None, None)]
