"""trimflow.proxy.clicks: through the whole chain of addons, a computer-use answer's coordinates are mapped back
when the prune addon sent the newest screenshot rescaled: JSON (compressed too) and streamed, with the metrics
addon still reading the usage and recording clicks_mapped; anything else passes as it came."""

from __future__ import annotations

import gzip
import logging

import orjson
import pytest
from mitmproxy import http
from mitmproxy.test import tutils

from trimflow import proxy
from trimflow.testing import b64, image

from ..helpers import answer_sent, requested
from .flows import json_answer, llm_flow, write_rules

SCREEN = image(400, 300, "PNG", seed=11)  # sent at 200x150: the model's coordinates double
COMPUTER = {"type": "computer_20250124", "name": "computer", "display_width_px": 400, "display_height_px": 300}


def computer_flow(tools: list | None = None):
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(SCREEN)}}
    body = {
        "model": "claude-opus-4-7",
        "max_tokens": 100,
        "tools": [COMPUTER] if tools is None else tools,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "click"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t0", "name": "computer", "input": {"action": "screenshot"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t0", "content": [block]}]},
        ],
    }
    return llm_flow("anthropic", host="api.anthropic.com", body=orjson.dumps(body))


ANSWER = (
    b'{"id":"m","type":"message","content":[{"type":"text","text":"[100, 50]"},'
    b'{"type":"tool_use","id":"t1","name":"computer","input":{"action":"left_click","coordinate":[100, 50]}}],'
    b'"usage":{"input_tokens":7,"output_tokens":3}}'
)
MAPPED = ANSWER.replace(b'"coordinate":[100, 50]', b'"coordinate":[200, 100]')


@pytest.fixture
def shrinking(addon, tmp_path):
    addon.tctx.configure(
        addon,
        trimflow_rules=str(write_rules(tmp_path / "side.yaml", 8, "  max_image_side: 200\n")),
        trimflow_metrics=str(tmp_path / "m.jsonl"),
    )
    addon.metrics_path = tmp_path / "m.jsonl"
    return addon


def event(data: dict) -> bytes:
    return b"event: " + data["type"].encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


async def answered(addon, flow, response: http.Response) -> None:
    await requested(addon, flow)
    flow.response = response
    addon.responseheaders(flow)


def record_of(addon) -> dict:
    (line,) = addon.metrics_path.read_bytes().splitlines()
    return orjson.loads(line)


async def test_a_json_answer_is_mapped_and_counted(shrinking) -> None:
    flow = computer_flow()
    await answered(shrinking, flow, json_answer(ANSWER))
    shrinking.response(flow)
    await answer_sent()
    assert flow.response.content == MAPPED
    record = record_of(shrinking)
    assert (record["images_rescaled"], record["clicks_mapped"], record["usage_input_tokens"]) == (1, 1, 7)


async def test_a_compressed_json_answer_is_mapped_and_sent_compressed(shrinking) -> None:
    flow = computer_flow()
    await answered(shrinking, flow, json_answer(gzip.compress(ANSWER), content_encoding="gzip"))
    await shrinking.response_async(flow)  # decoded and mapped in a worker thread
    assert flow.response.headers["content-encoding"] == "gzip" and gzip.decompress(flow.response.raw_content) == MAPPED


async def test_a_streamed_answer_is_mapped_after_its_usage_is_read(shrinking) -> None:
    flow = computer_flow()
    await answered(shrinking, flow, tutils.tresp(content=None, headers=http.Headers(content_type="text/event-stream")))
    stream = flow.response.stream
    assert isinstance(stream, proxy.metrics.AnswerScanner)
    tool = {"type": "tool_use", "name": "computer", "input": {}}
    events = [
        event({"type": "message_start", "message": {"usage": {"input_tokens": 9}}}),
        event({"type": "content_block_start", "index": 0, "content_block": tool}),
        event({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": '{"coordinate": [10'}}),
        event({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "0, 50]}"}}),
        event({"type": "content_block_stop", "index": 0}),
    ]
    sent = [stream(e) for e in events] + [stream(b"")]
    assert sent[0] == [events[0]] and sent[1:4] == [[], [], []]  # the computer block is held: never an empty chunk
    assert b"".join(sent[4]) == events[1] + events[2].replace(b'[10"', b'[200, 100]}"') + events[4]
    shrinking.response(flow)
    await answer_sent()
    record = record_of(shrinking)
    assert (record["clicks_mapped"], record["usage_input_tokens"]) == (1, 9)


async def test_a_malformed_answer_passes_as_it_came_with_one_line(shrinking, caplog: pytest.LogCaptureFixture) -> None:
    flow = computer_flow()
    await answered(shrinking, flow, json_answer(b'{"content":[{"type":"tool_use",'))
    with caplog.at_level(logging.WARNING, logger="trimflow"):
        shrinking.response(flow)
    assert flow.response.content == b'{"content":[{"type":"tool_use",'
    [line] = [r.getMessage() for r in caplog.records if "unmapped" in r.getMessage()]
    assert "computer-use answer passed unmapped: not JSON" in line


@pytest.mark.parametrize(
    "case",
    ["no computer tool", "an error answer", "observe mode", "a small screenshot", "the mapping off"],
)
async def test_other_answers_pass_as_they_came(shrinking, case: str) -> None:
    flow = computer_flow(tools=[] if case == "no computer tool" else None)
    if case == "observe mode":
        shrinking.tctx.configure(shrinking, trimflow_mode="observe")
    if case == "the mapping off":
        shrinking.tctx.configure(shrinking, trimflow_clicks=False)
    if case == "a small screenshot":
        shrinking.tctx.configure(
            shrinking, trimflow_rules=str(write_rules(shrinking.metrics_path.parent / "big.yaml", 8, "  max_image_side: 2000\n"))
        )
    answer = json_answer(ANSWER)
    if case == "an error answer":
        answer.status_code = 500
    await answered(shrinking, flow, answer)
    shrinking.response(flow)
    await answer_sent()
    assert flow.response.content == ANSWER
    assert record_of(shrinking)["clicks_mapped"] == 0
