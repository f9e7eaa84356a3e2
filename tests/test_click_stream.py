"""trimflow._click_stream: streamed computer-use answers mapped as their events pass, cut anywhere (only the numbers
change, every other byte stays), within one bound per answer and one budget across answers."""

from __future__ import annotations

import gc
import random
import re

import orjson
import pytest

from trimflow import _click_stream
from trimflow._click_stream import ClickStream, HeldBytes

from .helpers import CLAUDE_SCREEN, OPENAI_SCREEN, lines_run

# --- event streams ------------------------------------------------------------------------------------------


def sse(event: str, data: dict, end: bytes = b"\n") -> bytes:
    return b"event: " + event.encode() + end + b"data: " + orjson.dumps(data) + end + end


def start(index: int, block: dict, end: bytes = b"\n") -> bytes:
    return sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}, end)


def json_delta(index: int, piece: str, end: bytes = b"\n") -> bytes:
    return sse(
        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}}, end
    )


def claude_events(end: bytes = b"\n") -> list[bytes]:
    tool_input = '{"action": "left_click_drag", "start_coordinate": [10, 20], "coordinate": [1000, 500]}'
    pieces = [tool_input[:30], tool_input[30:62], tool_input[62:]]  # cut inside the numbers
    return [
        sse("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 5}}}, end),
        sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}, end),
        sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "coordinate [1, 2]"}}, end),
        sse("content_block_stop", {"type": "content_block_stop", "index": 0}, end),
        sse(
            "content_block_start",
            {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "name": "computer", "input": {}}},
            end,
        ),
        *[
            sse("content_block_delta", {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": p}}, end)
            for p in pieces
        ],
        sse("ping", {"type": "ping"}, end),
        sse("content_block_stop", {"type": "content_block_stop", "index": 1}, end),
        sse(
            "content_block_start",
            {"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "name": "bash", "input": {}}},
            end,
        ),
        sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '{"coordinate": [1000, 500]}'}},
            end,
        ),
        sse("content_block_stop", {"type": "content_block_stop", "index": 2}, end),
        sse("message_stop", {"type": "message_stop"}, end),
    ]


def run(stream: ClickStream, chunks: list[bytes]) -> bytes:
    out = [b"".join(stream(chunk)) for chunk in chunks]
    return b"".join(out) + b"".join(stream(b""))


def cuts(data: bytes, rng: random.Random, pieces: int) -> list[bytes]:
    points = sorted(rng.sample(range(1, len(data)), pieces - 1))
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def expected_claude(events: list[bytes], end: bytes = b"\n") -> bytes:
    mapped = '{"action": "left_click_drag", "start_coordinate": [13, 26], "coordinate": [1280, 640]}'
    delta = sse(
        "content_block_delta", {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": mapped}}, end
    )
    # The held block: its start, one delta with the whole mapped input, its stop; the ping held in between goes first.
    return b"".join([*events[:4], events[8], events[4], delta, *events[9:]])


@pytest.mark.parametrize("end", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_claude_stream_cut_anywhere_maps_the_computer_block_and_passes_the_rest(end: bytes) -> None:
    events = claude_events(end)
    data = b"".join(events)
    expected = expected_claude(events, end)
    for at in range(1, len(data)):
        stream = ClickStream(CLAUDE_SCREEN)
        assert run(stream, [data[:at], data[at:]]) == expected, at
        assert stream.mapped == 1 and stream.problem is None
    rng = random.Random(5)
    for _ in range(200):
        stream = ClickStream(CLAUDE_SCREEN)
        assert run(stream, cuts(data, rng, rng.randint(2, 40))) == expected


def test_claude_stream_events_pass_as_soon_as_they_are_whole() -> None:
    events = claude_events()
    stream = ClickStream(CLAUDE_SCREEN)
    assert stream(events[0][:10]) == [] and stream(events[0][10:]) == [events[0]]
    assert stream(events[4]) == [] and stream(events[5]) == []  # the computer block is held until its stop


def test_a_computer_input_that_is_not_json_passes_as_it_came_with_a_problem() -> None:
    problems: list[str] = []
    events = claude_events()
    broken = [e.replace(b"left_click_drag", b"left_click_drag\\u") if b"input_json_delta" in e and b'index":1' in e else e for e in events]
    broken[5] = sse(
        "content_block_delta", {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{nope"}}
    )
    data = b"".join(broken)
    stream = ClickStream(CLAUDE_SCREEN, problems.append)
    assert run(stream, [data]) == b"".join([*broken[:4], broken[8], *broken[4:8], *broken[9:]])
    assert stream.mapped == 0 and len(problems) == 1 and "cannot be read" in problems[0]


def test_an_event_that_is_not_json_passes_and_the_stream_goes_on() -> None:
    events = claude_events()
    junk = b"event: content_block_start\ndata: {not json\n\n"
    data = junk + b"".join(events)
    stream = ClickStream(CLAUDE_SCREEN)
    assert run(stream, [data]) == junk + expected_claude(events)
    assert stream.mapped == 1 and stream.problem == "not JSON"


def test_an_internal_error_passes_the_rest_of_the_stream_as_it_came(monkeypatch: pytest.MonkeyPatch) -> None:
    events = claude_events()
    problems: list[str] = []
    stream = ClickStream(CLAUDE_SCREEN, problems.append)
    head = run_open(stream, events[:6])

    def broken(*args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(_click_stream, "input_edits", broken)
    # The ping passed while the block was held; at the error the held block goes as it came, then the rest.
    assert head + run(stream, [b"".join(events[6:])]) == b"".join([*events[:4], events[8], *events[4:8], *events[9:]])
    assert problems == ["internal error RuntimeError"]


def run_open(stream: ClickStream, chunks: list[bytes]) -> bytes:
    return b"".join(b"".join(stream(chunk)) for chunk in chunks)


def test_a_stream_that_ends_inside_a_held_block_gets_what_was_held() -> None:
    events = claude_events()[:6]
    stream = ClickStream(CLAUDE_SCREEN)
    assert run(stream, [b"".join(events) + b"event: trailing"]) == b"".join(events) + b"event: trailing"


def test_an_event_larger_than_the_bound_stops_the_mapping_and_passes_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_click_stream, "MAX_HELD", 64)
    events = claude_events()
    stream = ClickStream(CLAUDE_SCREEN)
    data = b"data: " + b"x" * 100 + b"".join(events)
    assert run(stream, [data[:110], data[110:]]) == data
    assert stream.mapped == 0 and stream.problem is not None


def test_openai_stream_maps_each_event_that_carries_a_computer_call_and_counts_each_call_once() -> None:
    call = {"type": "computer_call", "id": "cu_1", "call_id": "call_1", "action": {"type": "click", "x": 1000, "y": 500}, "status": "completed"}
    other = {"type": "function_call", "id": "fc_1", "name": "f", "arguments": '{"x":1000,"y":500}'}
    events = [
        sse("response.created", {"type": "response.created", "response": {"output": []}}),
        sse("response.output_item.added", {"type": "response.output_item.added", "item": {**call, "status": "in_progress"}}),
        sse("response.output_item.done", {"type": "response.output_item.done", "item": call}),
        sse("response.output_item.done", {"type": "response.output_item.done", "item": other}),
        sse("response.completed", {"type": "response.completed", "response": {"output": [call, other], "usage": {"input_tokens": 3}}}),
    ]
    data = b"".join(events)
    for at in range(1, len(data), 7):
        stream = ClickStream(OPENAI_SCREEN)
        out = run(stream, [data[:at], data[at:]])
        assert stream.mapped == 1
        assert out.count(b'"x":2560,"y":1280') == 3 and out.count(b'{\\"x\\":1000,\\"y\\":500}') == 2
        assert re.sub(rb"\d+", b"N", out) == re.sub(rb"\d+", b"N", data)


# --- bounds: work that grows with the answer, one bound on what an answer holds and one across answers -------


def drag_events(points: int) -> bytes:
    """A streamed Responses answer with one drag through `points` points: the call comes in three events."""
    path = [{"x": i % 2000, "y": i % 1125} for i in range(points)]
    call = {"type": "computer_call", "id": "cu_1", "call_id": "call_1", "action": {"type": "drag", "path": path}, "status": "completed"}
    return b"".join(
        [
            sse("response.output_item.added", {"type": "response.output_item.added", "item": {**call, "status": "in_progress"}}),
            sse("response.output_item.done", {"type": "response.output_item.done", "item": call}),
            sse("response.completed", {"type": "response.completed", "response": {"output": [call]}}),
        ]
    )


def test_a_streamed_drag_is_mapped_in_work_that_grows_with_its_size_alone() -> None:
    streams = {n: drag_events(n) for n in (300, 600)}
    work = []
    for data in streams.values():
        stream = ClickStream(OPENAI_SCREEN)
        work.append(lines_run(lambda stream=stream, data=data: run(stream, [data])))
        assert stream.mapped == 1 and stream.problem is None
    assert work[1] < 2.3 * work[0], work
    out = run(ClickStream(OPENAI_SCREEN), [streams[300]])
    assert out.count(b'"x":2560,"y":1280') == 3 * sum(1 for i in range(300) if (i % 2000, i % 1125) == (1000, 500))
    assert re.sub(rb"\d+", b"N", out) == re.sub(rb"\d+", b"N", streams[300])


def open_blocks(count: int, size: int) -> list[bytes]:
    """An answer's start, then `count` computer tool_use blocks whose input streams `size` bytes each and never ends."""
    events = [sse("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 5}}})]
    piece = '{"action": "type", "text": "' + "a" * (size - 30)
    for index in range(count):
        events.append(start(index, {"type": "tool_use", "name": "computer", "input": {}}))
        events += [json_delta(index, piece[i : i + 4096]) for i in range(0, len(piece), 4096)]
    return events


def test_the_open_blocks_of_one_answer_share_one_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each block is small; forty of them are not. Past the answer's bound everything held goes on as it came, in
    order, and the rest of the answer passes."""
    monkeypatch.setattr(_click_stream, "MAX_HELD", 64 * 2**10)
    budget = HeldBytes()
    problems: list[str] = []
    stream = ClickStream(CLAUDE_SCREEN, problems.append, budget)
    events = open_blocks(40, 8 * 2**10)
    out = b""
    for event in events:
        out += b"".join(stream(event))
        assert budget.held <= _click_stream.MAX_HELD
    out += b"".join(stream(b""))
    assert out == b"".join(events)
    assert problems == [_click_stream.OVER_ANSWER] and stream.mapped == 0 and budget.held == 0


def test_answers_together_share_one_budget() -> None:
    """The answer that would take the budget past its limit passes unmapped; the others map on, and give their
    share back when they end."""
    budget = HeldBytes(limit=160 * 2**10)  # a block holds its events and its input: about twice its size
    first, second = ClickStream(CLAUDE_SCREEN, budget=budget), ClickStream(CLAUDE_SCREEN, budget=budget)
    held_first = run_open(first, open_blocks(1, 60 * 2**10))
    assert held_first == open_blocks(1, 60 * 2**10)[0] and budget.held > 60 * 2**10
    second_events = open_blocks(1, 60 * 2**10)
    assert run_open(second, second_events) == b"".join(second_events)  # over the budget: as it came
    assert second.problem == _click_stream.OVER_BUDGET and budget.held == first._lease.size
    rest = json_delta(0, '", "coordinate": [1000, 500]}') + sse("content_block_stop", {"type": "content_block_stop", "index": 0})
    out = run(first, [rest])
    assert first.mapped == 1 and first.problem is None and b"[1280, 640]" in out
    assert budget.held == 0


def test_an_answer_dropped_midway_gives_its_share_back() -> None:
    budget = HeldBytes()
    stream = ClickStream(CLAUDE_SCREEN, budget=budget)
    run_open(stream, open_blocks(3, 10 * 2**10))
    assert budget.held > 30 * 2**10
    stream.close()  # the flow failed: the addon lets go at once
    assert budget.held == 0
    forgotten = ClickStream(CLAUDE_SCREEN, budget=budget)
    run_open(forgotten, open_blocks(3, 10 * 2**10))
    assert budget.held > 30 * 2**10
    del forgotten
    gc.collect()  # a stream no one closed: its share comes back when it is collected
    assert budget.held == 0


def test_an_event_with_too_many_members_to_map_on_the_event_loop_passes_unmapped() -> None:
    data = drag_events(8000)  # over MAX_STRUCTURE quotes, brackets and commas
    stream = ClickStream(OPENAI_SCREEN)
    assert run(stream, [data]) == data
    assert stream.mapped == 0 and stream.problem == _click_stream.OVER_STRUCTURE


def test_an_event_cut_into_many_small_chunks_is_mapped_whole() -> None:
    """Each chunk is looked through for an event's end from where the last one stopped (less the three bytes an end
    may be cut across), so a large event that comes in small chunks is found whole, once."""
    data = drag_events(2000)
    chunks = [data[i : i + 512] for i in range(0, len(data), 512)]
    stream = ClickStream(OPENAI_SCREEN)
    assert re.sub(rb"\d+", b"N", run(stream, chunks)) == re.sub(rb"\d+", b"N", data) and stream.mapped == 1
