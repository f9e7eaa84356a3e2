"""trimflow.proxy.clicks: through the whole chain of addons, a computer-use answer's coordinates are mapped back
when the prune addon sent the newest screenshot rescaled: JSON (compressed too) and streamed, with the metrics
addon still reading the usage and recording clicks_mapped; anything else passes as it came."""

from __future__ import annotations

import gzip
import logging
import threading

import orjson
import pytest
from mitmproxy import flow as mitmproxy_flow
from mitmproxy import http
from mitmproxy.test import tutils

from trimflow import _click_stream, _clicks, proxy
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


# --- what the mapping holds: one budget across answers; large answers off the event loop ----------------------


def open_block_events(size: int) -> list[bytes]:
    """The start of an answer whose computer tool_use block streams `size` bytes of input and has not ended."""
    tool = {"type": "tool_use", "name": "computer", "input": {}}
    piece = '{"action": "type", "text": "' + "a" * size
    return [
        event({"type": "message_start", "message": {"usage": {"input_tokens": 9}}}),
        event({"type": "content_block_start", "index": 0, "content_block": tool}),
        *[
            event({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": piece[i : i + 4096]}})
            for i in range(0, len(piece), 4096)
        ],
    ]


def closing_events() -> list[bytes]:
    return [
        event({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": '", "coordinate": [10, 5]}'}}),
        event({"type": "content_block_stop", "index": 0}),
        event({"type": "message_stop"}),
    ]


def records_of(addon) -> list[dict]:
    return [orjson.loads(line) for line in addon.metrics_path.read_bytes().splitlines()]


async def test_answers_past_the_budget_pass_unmapped_with_one_line_and_the_record_says_why(shrinking, caplog: pytest.LogCaptureFixture) -> None:
    """Three answers hold a computer block each; the budget has room for two. The third passes as it came, with
    one log line and `clicks_unmapped`; the other two are mapped; every share comes back when the answers end."""
    clicks = shrinking.get(proxy.Clicks)
    clicks.held.limit = 160 * 2**10  # a 30 KiB block holds about 60 KiB (its events and its input)
    flows, sent = [], []
    with caplog.at_level(logging.WARNING, logger="trimflow"):
        for _ in range(3):
            flow = computer_flow()
            await answered(shrinking, flow, tutils.tresp(content=None, headers=http.Headers(content_type="text/event-stream")))
            sent.append(b"".join(b"".join(flow.response.stream(e)) for e in open_block_events(30 * 2**10)))
            flows.append(flow)
            assert clicks.held.held <= clicks.held.limit
        assert sent[:2] == [open_block_events(0)[0]] * 2  # the blocks held back: only the message's start went on
        assert sent[2] == b"".join(open_block_events(30 * 2**10))  # the third: everything as it came
        for flow in flows:
            out = b"".join(b"".join(flow.response.stream(e)) for e in closing_events()) + b"".join(flow.response.stream(b""))
            assert (b"[20, 10]" in out) == (flow is not flows[2])
            shrinking.response(flow)
    await answer_sent()
    assert clicks.held.held == 0
    assert [(r["clicks_mapped"], r["clicks_unmapped"]) for r in records_of(shrinking)] == [(1, None), (1, None), (0, _click_stream.OVER_BUDGET)]
    lines = [r.getMessage() for r in caplog.records if "unmapped" in r.getMessage()]
    assert lines == [f"trimflow: api.anthropic.com/v1/messages computer-use answer passed unmapped: {_click_stream.OVER_BUDGET}"]


async def test_an_answer_that_fails_midway_gives_its_share_back(shrinking) -> None:
    clicks = shrinking.get(proxy.Clicks)
    flow = computer_flow()
    await answered(shrinking, flow, tutils.tresp(content=None, headers=http.Headers(content_type="text/event-stream")))
    for e in open_block_events(30 * 2**10):
        flow.response.stream(e)
    assert clicks.held.held > 30 * 2**10
    flow.error = mitmproxy_flow.Error("Client disconnected.")
    shrinking.error(flow)
    assert clicks.held.held == 0


async def test_a_large_json_answer_is_mapped_in_a_worker_thread(shrinking, monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[threading.Thread] = []

    def map_answer(*args):
        threads.append(threading.current_thread())
        return _clicks.map_answer(*args)

    monkeypatch.setattr(proxy.clicks, "map_answer", map_answer)
    block = {"type": "tool_use", "id": "t", "name": "computer", "input": {"action": "left_click", "coordinate": [100, 50]}}
    answer = orjson.dumps({"id": "m", "type": "message", "content": [block] * 1000, "usage": {"input_tokens": 7, "output_tokens": 3}})
    assert len(answer) > proxy.clicks.INLINE_JSON
    flow = computer_flow()
    await answered(shrinking, flow, json_answer(answer))
    await shrinking.response_async(flow)
    await answer_sent()
    assert threads and threads[0] is not threading.main_thread()
    assert flow.response.content == answer.replace(b"[100,50]", b"[200,100]")
    assert record_of(shrinking)["clicks_mapped"] == 1000
