"""trimflow.proxy.metrics: usage from streamed and buffered answers, the per-flow line and JSONL record
after the answer, a failed flow's record, and the final record in a recording (mitmproxy's save addon)."""

from __future__ import annotations

import logging

import orjson
import pytest
from mitmproxy import http, io
from mitmproxy.addons import save
from mitmproxy.proxy.layers import http as http_layer
from mitmproxy.test import taddons, tflow, tutils
from mitmproxy.websocket import WebSocketMessage
from wsproto.frame_protocol import Opcode

from trimflow import proxy
from trimflow.testing import PATHS, session_body

from ..helpers import answer_sent, requested
from .flows import SHOT, json_answer, llm_flow, write_rules


def test_options_have_defaults_and_help() -> None:
    metrics = proxy.Metrics(proxy.SharedState())
    with taddons.context(metrics) as tctx:
        assert tctx.options.trimflow_metrics == "" and metrics.file is None
        assert tctx.options._options["trimflow_metrics"].help


async def test_sse_responses_stream_through_and_usage_is_read(addon, tmp_path) -> None:
    addon.tctx.configure(addon, trimflow_metrics=str(tmp_path / "m.jsonl"))
    flow = llm_flow("anthropic", host="api.anthropic.com")
    await requested(addon, flow)
    flow.response = tutils.tresp(content=None, headers=http.Headers(content_type="text/event-stream"))
    addon.responseheaders(flow)
    scanner = flow.response.stream
    assert callable(scanner)
    events = [
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":1200,"cache_read_input_tokens":300}}}\n\n',
        b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":9}}\n\n',
    ]
    assert [scanner(e) for e in events] == events  # bytes pass through unchanged
    addon.response(flow)
    await answer_sent()
    (line,) = (tmp_path / "m.jsonl").read_bytes().splitlines()
    record = orjson.loads(line)
    assert record["usage_input_tokens"] == 1500 and record["status"] == 200
    assert (record["usage_cache_read_tokens"], record["usage_cache_write_tokens"], record["usage_output_tokens"]) == (300, None, 9)


async def test_a_client_that_hangs_up_after_the_last_event_still_gets_status_and_usage_recorded(addon, tmp_path) -> None:
    """Codex closes the connection once it has read response.completed: the flow ends in an error, but the
    answer went through, and the usage in it is what the provider billed."""
    addon.tctx.configure(addon, trimflow_metrics=str(tmp_path / "m.jsonl"))
    flow = llm_flow("openai-responses")
    await requested(addon, flow)
    flow.response = tutils.tresp(content=None, headers=http.Headers(content_type="text/event-stream"))
    addon.responseheaders(flow)
    flow.response.stream(b'event: response.completed\ndata: {"response":{"usage":{"input_tokens":2100,"output_tokens":7}}}\n\n')
    flow.error = tflow.terr("Client disconnected.")
    addon.error(flow)
    await answer_sent()
    record = orjson.loads((tmp_path / "m.jsonl").read_bytes())
    assert (record["status"], record["usage_input_tokens"], record["usage_output_tokens"]) == (200, 2100, 7)
    assert record["error"] == "Client disconnected."


async def test_a_streaming_path_streams_whatever_the_content_type_says(addon) -> None:
    flow = llm_flow("gemini", host="generativelanguage.googleapis.com", path=PATHS["gemini"].replace(":generateContent", ":streamGenerateContent"))
    await requested(addon, flow)
    flow.response = json_answer(content=None)
    addon.responseheaders(flow)
    assert callable(flow.response.stream)
    plain = llm_flow("gemini", host="generativelanguage.googleapis.com")
    await requested(addon, plain)
    plain.response = json_answer(content=None)
    addon.responseheaders(plain)
    assert not callable(plain.response.stream)


async def test_json_responses_give_usage_too(addon, tmp_path) -> None:
    addon.tctx.configure(addon, trimflow_metrics=str(tmp_path / "m.jsonl"))
    flow = llm_flow()
    await requested(addon, flow)
    flow.response = json_answer(b'{"usage":{"prompt_tokens":321,"completion_tokens":5}}')
    addon.responseheaders(flow)
    assert not callable(flow.response.stream)
    addon.response(flow)
    await answer_sent()
    assert orjson.loads((tmp_path / "m.jsonl").read_bytes())["usage_input_tokens"] == 321
    assert flow.metadata["trimflow"]["usage_input_tokens"] == 321 and flow.metadata["trimflow"]["status"] == 200
    assert flow.metadata["trimflow"]["usage_output_tokens"] == 5 and flow.metadata["trimflow"]["usage_cache_read_tokens"] is None


async def test_json_answers_give_cache_reads_and_writes(addon, tmp_path) -> None:
    addon.tctx.configure(addon, trimflow_metrics=str(tmp_path / "m.jsonl"))
    flow = llm_flow("anthropic", host="api.anthropic.com")
    await requested(addon, flow)
    usage = b'{"usage":{"input_tokens":20,"cache_creation_input_tokens":3000,"cache_read_input_tokens":9000,"output_tokens":300}}'
    flow.response = json_answer(usage)
    addon.responseheaders(flow)
    addon.response(flow)
    await answer_sent()
    record = orjson.loads((tmp_path / "m.jsonl").read_bytes())
    got = [record[f"usage_{what}_tokens"] for what in ("input", "cache_read", "cache_write", "output")]
    assert got == [12_020, 9000, 3000, 300]


async def test_a_failed_flow_still_gets_its_record(addon, tmp_path) -> None:
    addon.tctx.configure(addon, trimflow_metrics=str(tmp_path / "m.jsonl"))
    flow = llm_flow()
    await requested(addon, flow)
    flow.error = tflow.terr("connection reset")
    addon.error(flow)
    await answer_sent()
    record = orjson.loads((tmp_path / "m.jsonl").read_bytes())
    assert record["status"] is None and record["error"] == "connection reset"
    assert flow.metadata["trimflow"]["error"] == "connection reset"


async def test_the_line_and_record_come_after_the_hook_and_none_is_lost_at_exit(addon, tmp_path, caplog) -> None:
    metrics = tmp_path / "m.jsonl"
    addon.tctx.configure(addon, trimflow_metrics=str(metrics))

    async def answered(turns: int) -> None:
        flow = llm_flow(turns=turns)
        await requested(addon, flow)
        flow.response = json_answer()
        addon.response(flow)

    with caplog.at_level(logging.INFO, logger="trimflow"):
        await answered(3)
        assert not metrics.exists() or metrics.read_bytes() == b""  # mitmproxy sends the answer first
        await answered(4)
        await answer_sent()
        assert len(metrics.read_bytes().splitlines()) == 2
        await answered(5)
        untouched = llm_flow(turns=2)  # nothing to change: its record is worked out once its answer has gone
        await addon.request(untouched)
        untouched.response = json_answer()
        addon.response(untouched)
        addon.done()  # mitmproxy stops before the loop turns again: what is pending is written now
    assert [orjson.loads(line)["turn"] for line in metrics.read_bytes().splitlines()] == [1, 2, 3, 1]  # the last: a new history
    assert sum("trimflow: conv" in r.getMessage() for r in caplog.records) == 4


async def test_no_key_reaches_logs_or_metrics(addon, tmp_path, caplog) -> None:
    addon.tctx.configure(addon, trimflow_metrics=str(tmp_path / "m.jsonl"))
    secret = "sk-ant-TOPSECRET0123456789"
    flow = llm_flow(
        "gemini",
        host="generativelanguage.googleapis.com",
        path=PATHS["gemini"] + "?key=AIzaTOPSECRET",
        headers={"x-api-key": secret, "authorization": f"Bearer {secret}"},
    )
    with caplog.at_level(logging.DEBUG):
        addon.requestheaders(flow)
        await requested(addon, flow)
        flow.response = tutils.tresp(content=b'{"usageMetadata":{"promptTokenCount":77}}')
        addon.responseheaders(flow)
        addon.response(flow)
        await answer_sent()
    logged = "\n".join(r.getMessage() for r in caplog.records) + (tmp_path / "m.jsonl").read_text() + flow.comment
    assert "TOPSECRET" not in logged and "AIza" not in logged
    assert "gemini-2.5-flash" in logged


async def test_a_recording_holds_the_final_record(tmp_path) -> None:
    """mitmproxy's save addon (`-w`) writes a flow at its response hook, after the script's addons:
    the recorded record has the answer's status and usage, as the audit reads them."""
    dump = tmp_path / "flows.mitm"
    addons = proxy.make_addons()
    with taddons.context(*addons, save.Save()) as tctx:
        tctx.configure(addons[0], trimflow_rules=str(write_rules(tmp_path / "rules.yaml", 2)), save_stream_file=str(dump))
        flow = llm_flow(turns=3)
        for hook in (http_layer.HttpRequestHeadersHook, http_layer.HttpRequestHook):
            await tctx.master.addons.trigger_event(hook(flow))
        assert flow.metadata[proxy.META]["status"] is None
        flow.response = json_answer(b'{"usage":{"prompt_tokens":99}}')
        for hook in (http_layer.HttpResponseHeadersHook, http_layer.HttpResponseHook):
            await tctx.master.addons.trigger_event(hook(flow))
        tctx.configure(addons[0], save_stream_file=None)  # closes the file
    with open(dump, "rb") as f:
        (recorded,) = io.FlowReader(f).stream()
    record = recorded.metadata[proxy.META]
    assert (record["images_before"], record["images_after"], record["status"], record["usage_input_tokens"]) == (3, 2, 200, 99)


# --- conversations: WebSocket answers, Responses chains, reruns ----------------------------------------------


def ws_send(flow, payload: dict, from_client: bool) -> None:
    flow.websocket.messages.append(WebSocketMessage(Opcode.TEXT, from_client, orjson.dumps(payload)))


def completed(response_id: str, input_tokens: int) -> dict:
    usage = {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": input_tokens // 2}, "output_tokens": 7}
    return {
        "type": "response.completed",
        "sequence_number": 9,
        "response": {"id": response_id, "object": "response", "status": "completed", "usage": usage},
    }


async def test_websocket_records_carry_their_answer_and_a_warmup_is_no_turn(addon, tmp_path) -> None:
    """Codex over its WebSocket: a warm-up (generate: false), then turns that chain to the answer before them."""
    addon.tctx.configure(addon, trimflow_metrics=str(tmp_path / "m.jsonl"))
    flow = tflow.twebsocketflow(messages=False)
    flow.request.path = "/backend-api/codex/responses"
    warmup = {"type": "response.create", "model": "gpt-5", "instructions": "You are Codex.", "input": [], "generate": False}
    turns = [
        {**session_body("openai-responses", 3, SHOT, "image/png"), "previous_response_id": "resp_warm"},
        {"model": "gpt-5", "previous_response_id": "resp_1", "input": [{"role": "user", "content": [{"type": "input_text", "text": "go on"}]}]},
    ]
    for request, answer in zip([warmup, *turns], [completed("resp_warm", 5), completed("resp_1", 1234), completed("resp_2", 2345)], strict=True):
        ws_send(flow, {"type": "response.create", **request}, True)
        await addon.websocket_message(flow)
        for event in (
            {"type": "response.created", "response": {"id": answer["response"]["id"]}},
            {"type": "response.output_text.delta", "delta": '"type":"response.completed"'},
            answer,
        ):
            ws_send(flow, event, False)
            await addon.websocket_message(flow)
    await answer_sent()
    records = [orjson.loads(line) for line in (tmp_path / "m.jsonl").read_bytes().splitlines()]
    assert [(r["kind"], r["turn"], r["status"], r["usage_input_tokens"]) for r in records] == [
        ("warmup", None, 200, 5),
        ("turn", 1, 200, 1234),
        ("turn", 2, 200, 2345),
    ]
    assert [(r["usage_cache_read_tokens"], r["usage_cache_write_tokens"], r["usage_output_tokens"]) for r in records] == [
        (2, None, 7),
        (617, None, 7),
        (1172, None, 7),
    ]
    assert len({r["conversation"] for r in records}) == 1 and records[0]["conversation"] is not None
    assert records[1]["images_before"] == 3 and records[1]["images_after"] == 2


async def test_a_websocket_error_event_and_a_closed_connection_are_recorded(addon, tmp_path) -> None:
    addon.tctx.configure(addon, trimflow_metrics=str(tmp_path / "m.jsonl"))
    flow = tflow.twebsocketflow(messages=False)
    flow.request.path = "/v1/responses"
    for _ in range(2):
        ws_send(flow, {"type": "response.create", **session_body("openai-responses", 1, SHOT, "image/png")}, True)
        await addon.websocket_message(flow)
    ws_send(flow, {"type": "error", "status": 400, "error": {"code": "previous_response_not_found", "message": "no"}}, False)
    await addon.websocket_message(flow)
    addon.get(proxy.Metrics).websocket_end(flow)  # the second never got its answer
    await answer_sent()
    lines = (tmp_path / "m.jsonl").read_bytes().splitlines()
    assert [(r["status"], r.get("error")) for r in map(orjson.loads, lines)] == [(400, None), (None, "connection closed before the answer")]


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "sse"])
async def test_a_responses_chain_over_http_follows_the_answers_id(addon, streamed: bool) -> None:
    first = llm_flow("openai-responses", turns=2)
    await requested(addon, first)
    if streamed:
        first.response = tutils.tresp(content=None, headers=http.Headers(content_type="text/event-stream"))
        addon.responseheaders(first)
        for event in (
            b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_http_1"}}\n\n',
            b'event: response.completed\ndata: {"type":"response.completed","response":{"id":"resp_http_1"}}\n\n',
        ):
            first.response.stream(event)
    else:
        first.response = json_answer(b'{"id":"resp_http_1","object":"response","output":[{"id":"msg_9"}]}')
        addon.responseheaders(first)
    addon.response(first)
    chained = llm_flow(
        "openai-responses",
        body=orjson.dumps({"model": "gpt-4.1", "previous_response_id": "resp_http_1", "input": [{"role": "user", "content": "and now?"}]}),
    )
    await requested(addon, chained)
    unknown = llm_flow(
        "openai-responses",
        body=orjson.dumps({"model": "gpt-4.1", "previous_response_id": "resp_never_seen", "input": [{"role": "user", "content": "and now?"}]}),
    )
    await requested(addon, unknown)
    a, b, c = (f.metadata[proxy.META] for f in (first, chained, unknown))
    assert (a["turn"], b["turn"], b["conversation"]) == (1, 2, a["conversation"])
    assert c["turn"] == 1 and c["conversation"] != a["conversation"]


async def test_two_identical_runs_through_the_proxy_are_two_conversations(addon) -> None:
    numbers = []
    for _ in range(2):
        for turns in range(1, 5):
            flow = llm_flow("openai-chat", turns=turns)
            await requested(addon, flow)
            numbers.append((flow.metadata[proxy.META]["conversation"], flow.metadata[proxy.META]["turn"]))
    assert [t for _, t in numbers] == [1, 2, 3, 4] * 2
    assert len({c for c, _ in numbers[:4]}) == len({c for c, _ in numbers[4:]}) == 1 and numbers[0][0] != numbers[4][0]
