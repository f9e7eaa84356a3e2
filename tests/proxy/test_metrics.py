"""trimflow.proxy.metrics: usage from streamed and buffered answers, the per-flow line and JSONL record
after the answer, a failed flow's record, and the final record in a recording (mitmproxy's save addon)."""

from __future__ import annotations

import logging

import orjson
from mitmproxy import http, io
from mitmproxy.addons import save
from mitmproxy.proxy.layers import http as http_layer
from mitmproxy.test import taddons, tflow, tutils

from trimflow import proxy
from trimflow.testing import PATHS

from ..helpers import answer_sent, requested
from .flows import json_answer, llm_flow, write_rules


def test_options_have_defaults_and_help() -> None:
    metrics = proxy.Metrics(proxy.Flows())
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
    events = [b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":1200,"cache_read_input_tokens":300}}}\n\n',
              b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":9}}\n\n']
    assert [scanner(e) for e in events] == events  # bytes pass through unchanged
    addon.response(flow)
    await answer_sent()
    (line,) = (tmp_path / "m.jsonl").read_bytes().splitlines()
    record = orjson.loads(line)
    assert record["usage_input_tokens"] == 1500 and record["status"] == 200


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
        await answered(4)
        assert not metrics.exists() or metrics.read_bytes() == b""  # mitmproxy sends the answer first
        await answer_sent()
        assert len(metrics.read_bytes().splitlines()) == 2
        await answered(5)
        addon.done()  # mitmproxy stops before the loop turns again: what is pending is written now
    assert [orjson.loads(line)["turn"] for line in metrics.read_bytes().splitlines()] == [1, 2, 3]
    assert sum("trimflow: conv" in r.getMessage() for r in caplog.records) == 3


async def test_no_key_reaches_logs_or_metrics(addon, tmp_path, caplog) -> None:
    addon.tctx.configure(addon, trimflow_metrics=str(tmp_path / "m.jsonl"))
    secret = "sk-ant-TOPSECRET0123456789"
    flow = llm_flow("gemini", host="generativelanguage.googleapis.com",
                    path=PATHS["gemini"] + "?key=AIzaTOPSECRET", headers={"x-api-key": secret, "authorization": f"Bearer {secret}"})
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

