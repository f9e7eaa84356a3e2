"""trimflow._clicks: which pixels a model reads coordinates in, when an answer's computer-tool coordinates map back,
and the mapping of JSON answers and of event streams cut anywhere: only the numbers change, every other byte stays."""

from __future__ import annotations

import gc
import random
import re

import orjson
import pytest

from trimflow import _clicks, prune_request
from trimflow._clicks import ClickStream, HeldBytes, Malformed, Screen, map_answer, screen_for, view_of
from trimflow.testing import b64, image

from .helpers import lines_run, rules_with, url_for

ANTHROPIC_TOOLS = {"tools": [{"type": "computer_20250124", "name": "computer", "display_width_px": 2560, "display_height_px": 1440}]}
OPENAI_TOOLS = {"tools": [{"type": "computer_use_preview", "display_width": 5120, "display_height": 2880, "environment": "mac"}]}
CLAUDE = Screen("anthropic", "computer", (2000, 1125), (2560, 1440))  # x and y times 1.28
OPENAI = Screen("openai-responses", None, (2000, 1125), (5120, 2880))  # times 2.56


# --- which pixels -------------------------------------------------------------------------------------------


def test_claude_reads_coordinates_in_its_native_resolution() -> None:
    # Standard tier: long edge 1568 and 1568 patches of 28x28 px; the high-resolution tier (Opus 4.7): 2576 and 4784.
    assert view_of("anthropic", "claude-sonnet-4-6", (5120, 2880)) == (1456, 819)
    assert view_of("anthropic", "claude-sonnet-4-6", (2880, 1620)) == (1456, 819)
    assert view_of("anthropic", "claude-sonnet-4-6", (1280, 800)) == (1280, 800)  # within: as sent
    assert view_of("anthropic", "claude-opus-4-7", (2560, 1440)) == (2560, 1440)
    assert view_of("anthropic", "claude-opus-4-7", (5120, 2880)) == (2576, 1449)
    assert view_of("anthropic", None, (8000, 20)) == (1568, 4)
    for size in ((5120, 2880), (2000, 3000), (1600, 1600), (9999, 7)):
        w, h = view_of("anthropic", "claude-haiku-4-5", size)
        assert max(w, h) <= 1568 and -(-w // 28) * -(-h // 28) <= 1568


def test_openai_reads_coordinates_in_the_screenshot_as_sent() -> None:
    assert view_of("openai-responses", "computer-use-preview", (5120, 2880)) == (5120, 2880)


def test_a_screen_only_when_a_computer_tool_is_declared_and_the_model_reads_other_pixels() -> None:
    assert screen_for("anthropic", ANTHROPIC_TOOLS, "claude-opus-4-7", (2560, 1440), (2000, 1125)) == CLAUDE
    assert screen_for("openai-responses", OPENAI_TOOLS, "computer-use-preview", (5120, 2880), (2000, 1125)) == OPENAI
    # Claude would have resized the original to the same native size: its answer reads the same.
    assert screen_for("anthropic", ANTHROPIC_TOOLS, "claude-sonnet-4-6", (5120, 2880), (2880, 1620)) is None
    assert screen_for("anthropic", {"tools": [{"name": "bash", "type": "bash_20250124"}]}, "claude-opus-4-7", (2560, 1440), (2000, 1125)) is None
    assert screen_for("anthropic", {"tools": "computer"}, "claude-opus-4-7", (2560, 1440), (2000, 1125)) is None
    assert screen_for("openai-responses", {"tools": [{"type": "function", "name": "computer"}]}, None, (5120, 2880), (2000, 1125)) is None
    ga = {"tools": [{"type": "computer"}]}
    assert screen_for("openai-responses", ga, "gpt-5.4", (5120, 2880), (2000, 1125)) == OPENAI
    ws = {"type": "response.create", "response": OPENAI_TOOLS}  # a WebSocket message nests the request
    assert screen_for("openai-responses", ws, None, (5120, 2880), (2000, 1125)) == OPENAI


def test_a_point_is_rounded_and_clamped_to_the_original_screen() -> None:
    assert CLAUDE.point(1000, 500) == (1280, 640)
    assert CLAUDE.point(0.4, 1124.6) == (1, 1439)
    assert CLAUDE.point(-30, 99999) == (0, 1439)
    assert CLAUDE.point(1999, 0) == (2559, 0)
    assert CLAUDE.point(1e308, -1e308) == (2559, 0)  # no overflow


# --- JSON answers -------------------------------------------------------------------------------------------

CLAUDE_ANSWER = (
    b'{"id":"msg_1","type":"message","content":['
    b'{"type":"text","text":"Clicking \\"coordinate\\": [1000, 500] \\u00e9 \xc3\xa9"},\n'
    b'  {"type":"tool_use","id":"toolu_1","name":"computer","input":{"action":"left_click","coordinate":[1000, 500]}},'
    b'{"type":"tool_use","id":"toolu_2","name":"computer","input":{"action":"left_click_drag","start_coordinate":[10,20],"coordinate":[1999.6,1125]}},'
    b'{"type":"tool_use","id":"toolu_3","name":"computer","input":{"action":"zoom","region":[0,0,1000,500]}},'
    b'{"type":"tool_use","id":"toolu_4","name":"computer","input":{"action":"key","text":"Return"}},'
    b'{"type":"tool_use","id":"toolu_5","name":"bash","input":{"coordinate":[1000,500]}}],'
    b'"stop_reason":"tool_use","usage":{"input_tokens":1,"output_tokens":2}}'
)


def test_claude_json_answer_maps_the_computer_tool_and_leaves_every_other_byte() -> None:
    out, calls = map_answer(CLAUDE, CLAUDE_ANSWER)
    assert calls == 3
    expected = (
        CLAUDE_ANSWER.replace(b'"left_click","coordinate":[1000, 500]', b'"left_click","coordinate":[1280, 640]')
        .replace(b'"start_coordinate":[10,20],"coordinate":[1999.6,1125]', b'"start_coordinate":[13,26],"coordinate":[2559,1439]')
        .replace(b'"region":[0,0,1000,500]', b'"region":[0,0,1280,640]')
    )
    assert out == expected


def test_openai_json_answer_maps_actions_batches_and_drag_paths() -> None:
    answer = orjson.dumps(
        {
            "id": "resp_1",
            "output": [
                {"type": "message", "content": [{"type": "output_text", "text": '"x": 100, "y": 100'}]},
                {"type": "computer_call", "call_id": "c1", "action": {"type": "click", "button": "left", "x": 100, "y": 50}},
                {"type": "computer_call", "call_id": "c2", "actions": [{"type": "move", "x": 1, "y": 1}, {"type": "type", "text": "hi"}]},
                {"type": "computer_call", "call_id": "c3", "action": {"type": "drag", "path": [{"x": 0, "y": 0}, {"x": 10, "y": 10}]}},
                {"type": "computer_call", "call_id": "c4", "action": {"type": "screenshot"}},
                {"type": "function_call", "name": "f", "arguments": '{"x": 100, "y": 50}', "x": 100, "y": 50},
            ],
        }
    )
    out, calls = map_answer(OPENAI, answer)
    assert calls == 3
    mapped = orjson.loads(out)["output"]
    assert mapped[1]["action"] == {"type": "click", "button": "left", "x": 256, "y": 128}
    assert mapped[2]["actions"] == [{"type": "move", "x": 3, "y": 3}, {"type": "type", "text": "hi"}]
    assert mapped[3]["action"]["path"] == [{"x": 0, "y": 0}, {"x": 26, "y": 26}]
    # Everything but the numbers: the same bytes.
    assert re.sub(rb"\d+", b"N", out) == re.sub(rb"\d+", b"N", answer)
    assert orjson.loads(out)["output"][0] == orjson.loads(answer)["output"][0] and mapped[5] == orjson.loads(answer)["output"][5]


def test_an_answer_with_nothing_to_map_is_the_same_object() -> None:
    answer = b'{"content":[{"type":"text","text":"done"}]}'
    assert map_answer(CLAUDE, answer) == (answer, 0)
    odd = (
        b'{"content":[{"type":"tool_use","name":"computer","input":{"coordinate":["a",true]}},'
        b'{"type":"tool_use","name":"computer","input":{"coordinate":[1,2,3]}}]}'
    )
    assert map_answer(CLAUDE, odd) == (odd, 0)


@pytest.mark.parametrize("body", [b"", b"not json", b'{"content":[', b"\xff\xfe"])
def test_a_malformed_answer_raises_malformed(body: bytes) -> None:
    with pytest.raises(Malformed):
        map_answer(CLAUDE, body)


def test_a_repeated_key_maps_the_value_a_json_reader_takes() -> None:
    answer = b'{"content":[{"type":"tool_use","name":"computer","input":{"coordinate":[1,1],"coordinate":[1000,500]}}]}'
    out, calls = map_answer(CLAUDE, answer)
    assert calls == 1 and out == answer.replace(b"[1000,500]", b"[1280,640]")


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
        stream = ClickStream(CLAUDE)
        assert run(stream, [data[:at], data[at:]]) == expected, at
        assert stream.mapped == 1 and stream.problem is None
    rng = random.Random(5)
    for _ in range(200):
        stream = ClickStream(CLAUDE)
        assert run(stream, cuts(data, rng, rng.randint(2, 40))) == expected


def test_claude_stream_events_pass_as_soon_as_they_are_whole() -> None:
    events = claude_events()
    stream = ClickStream(CLAUDE)
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
    stream = ClickStream(CLAUDE, problems.append)
    assert run(stream, [data]) == b"".join([*broken[:4], broken[8], *broken[4:8], *broken[9:]])
    assert stream.mapped == 0 and len(problems) == 1 and "cannot be read" in problems[0]


def test_an_event_that_is_not_json_passes_and_the_stream_goes_on() -> None:
    events = claude_events()
    junk = b"event: content_block_start\ndata: {not json\n\n"
    data = junk + b"".join(events)
    stream = ClickStream(CLAUDE)
    assert run(stream, [data]) == junk + expected_claude(events)
    assert stream.mapped == 1 and stream.problem == "not JSON"


def test_an_internal_error_passes_the_rest_of_the_stream_as_it_came(monkeypatch: pytest.MonkeyPatch) -> None:
    events = claude_events()
    problems: list[str] = []
    stream = ClickStream(CLAUDE, problems.append)
    head = run_open(stream, events[:6])

    def broken(*args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(_clicks, "input_edits", broken)
    # The ping passed while the block was held; at the error the held block goes as it came, then the rest.
    assert head + run(stream, [b"".join(events[6:])]) == b"".join([*events[:4], events[8], *events[4:8], *events[9:]])
    assert problems == ["internal error RuntimeError"]


def run_open(stream: ClickStream, chunks: list[bytes]) -> bytes:
    return b"".join(b"".join(stream(chunk)) for chunk in chunks)


def test_a_stream_that_ends_inside_a_held_block_gets_what_was_held() -> None:
    events = claude_events()[:6]
    stream = ClickStream(CLAUDE)
    assert run(stream, [b"".join(events) + b"event: trailing"]) == b"".join(events) + b"event: trailing"


def test_an_event_larger_than_the_bound_stops_the_mapping_and_passes_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_clicks, "MAX_HELD", 64)
    events = claude_events()
    stream = ClickStream(CLAUDE)
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
        stream = ClickStream(OPENAI)
        out = run(stream, [data[:at], data[at:]])
        assert stream.mapped == 1
        assert out.count(b'"x":2560,"y":1280') == 3 and out.count(b'{\\"x\\":1000,\\"y\\":500}') == 2
        assert re.sub(rb"\d+", b"N", out) == re.sub(rb"\d+", b"N", data)


# --- bounds: work that grows with the answer, one bound on what an answer holds and one across answers -------


def clicks_answer(clicks: int) -> bytes:
    """A JSON Messages answer of `clicks` computer-tool calls, with text between them."""
    blocks: list[dict] = []
    for i in range(clicks):
        blocks.append({"type": "text", "text": f"step {i}"})
        blocks.append(
            {"type": "tool_use", "id": f"toolu_{i}", "name": "computer", "input": {"action": "left_click", "coordinate": [i % 2000, i % 1125]}}
        )
    return orjson.dumps({"id": "msg_1", "type": "message", "content": blocks, "usage": {"input_tokens": 1, "output_tokens": 2}})


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


def test_a_json_answer_is_mapped_in_work_that_grows_with_its_size_alone() -> None:
    """Twice the clicks, twice the work: a splice that walked from the answer's root for every number made it four
    times (3,000 clicks took a minute)."""
    answers = {n: clicks_answer(n) for n in (100, 200)}
    for n, answer in answers.items():
        assert map_answer(CLAUDE, answer)[1] == n
    work = [lines_run(lambda answer=answer: map_answer(CLAUDE, answer)) for answer in answers.values()]
    assert work[1] < 2.3 * work[0], work


def test_a_streamed_drag_is_mapped_in_work_that_grows_with_its_size_alone() -> None:
    streams = {n: drag_events(n) for n in (300, 600)}
    work = []
    for data in streams.values():
        stream = ClickStream(OPENAI)
        work.append(lines_run(lambda stream=stream, data=data: run(stream, [data])))
        assert stream.mapped == 1 and stream.problem is None
    assert work[1] < 2.3 * work[0], work
    out = run(ClickStream(OPENAI), [streams[300]])
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
    monkeypatch.setattr(_clicks, "MAX_HELD", 64 * 2**10)
    budget = HeldBytes()
    problems: list[str] = []
    stream = ClickStream(CLAUDE, problems.append, budget)
    events = open_blocks(40, 8 * 2**10)
    out = b""
    for event in events:
        out += b"".join(stream(event))
        assert budget.held <= _clicks.MAX_HELD
    out += b"".join(stream(b""))
    assert out == b"".join(events)
    assert problems == [_clicks.OVER_ANSWER] and stream.mapped == 0 and budget.held == 0


def test_answers_together_share_one_budget() -> None:
    """The answer that would take the budget past its limit passes unmapped; the others map on, and give their
    share back when they end."""
    budget = HeldBytes(limit=160 * 2**10)  # a block holds its events and its input: about twice its size
    first, second = ClickStream(CLAUDE, budget=budget), ClickStream(CLAUDE, budget=budget)
    held_first = run_open(first, open_blocks(1, 60 * 2**10))
    assert held_first == open_blocks(1, 60 * 2**10)[0] and budget.held > 60 * 2**10
    second_events = open_blocks(1, 60 * 2**10)
    assert run_open(second, second_events) == b"".join(second_events)  # over the budget: as it came
    assert second.problem == _clicks.OVER_BUDGET and budget.held == first._lease.size
    rest = json_delta(0, '", "coordinate": [1000, 500]}') + sse("content_block_stop", {"type": "content_block_stop", "index": 0})
    out = run(first, [rest])
    assert first.mapped == 1 and first.problem is None and b"[1280, 640]" in out
    assert budget.held == 0


def test_an_answer_dropped_midway_gives_its_share_back() -> None:
    budget = HeldBytes()
    stream = ClickStream(CLAUDE, budget=budget)
    run_open(stream, open_blocks(3, 10 * 2**10))
    assert budget.held > 30 * 2**10
    stream.close()  # the flow failed: the addon lets go at once
    assert budget.held == 0
    forgotten = ClickStream(CLAUDE, budget=budget)
    run_open(forgotten, open_blocks(3, 10 * 2**10))
    assert budget.held > 30 * 2**10
    del forgotten
    gc.collect()  # a stream no one closed: its share comes back when it is collected
    assert budget.held == 0


def test_an_event_with_too_many_members_to_map_on_the_event_loop_passes_unmapped() -> None:
    data = drag_events(8000)  # over MAX_STRUCTURE quotes, brackets and commas
    stream = ClickStream(OPENAI)
    assert run(stream, [data]) == data
    assert stream.mapped == 0 and stream.problem == _clicks.OVER_STRUCTURE


def test_an_event_cut_into_many_small_chunks_is_mapped_whole() -> None:
    """Each chunk is looked through for an event's end from where the last one stopped (less the three bytes an end
    may be cut across), so a large event that comes in small chunks is found whole, once."""
    data = drag_events(2000)
    chunks = [data[i : i + 512] for i in range(0, len(data), 512)]
    stream = ClickStream(OPENAI)
    assert re.sub(rb"\d+", b"N", run(stream, chunks)) == re.sub(rb"\d+", b"N", data) and stream.mapped == 1


# --- the engine: the newest screenshot decides ----------------------------------------------------------------


def computer_request(*sizes: tuple[int, int], tools: list | None = None) -> bytes:
    blocks = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(image(w, h, "PNG", seed=w))}} for w, h in sizes]
    body = {"model": "claude-opus-4-7", "max_tokens": 10, "tools": ANTHROPIC_TOOLS["tools"] if tools is None else tools}
    body["messages"] = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [b]}]} for b in blocks]
    return orjson.dumps(body)


@pytest.mark.parametrize(
    ("sizes", "mode", "tools", "expected"),
    [
        (((400, 300),), "enforce", None, Screen("anthropic", "computer", (200, 150), (400, 300))),
        (((400, 300), (160, 120)), "enforce", None, None),  # an older screenshot shrank, the newest did not
        (((160, 120), (400, 300)), "enforce", None, Screen("anthropic", "computer", (200, 150), (400, 300))),
        (((400, 300),), "observe", None, None),
        (((400, 300),), "enforce", [], None),
    ],
    ids=["newest-shrunk", "older-shrunk", "both", "observe", "no-computer-tool"],
)
def test_the_engine_gives_a_screen_for_the_newest_screenshot_only(sizes, mode: str, tools: list | None, expected: Screen | None) -> None:
    outcome = prune_request(url_for("anthropic"), {}, computer_request(*sizes, tools=tools), rules_with(max_image_side=200), mode)
    assert outcome.record is not None and outcome.record.images_rescaled == sum(1 for w, _ in sizes if w > 200)
    assert outcome.screen == expected
