"""trimflow._clicks: which pixels a model reads coordinates in, when an answer's computer-tool coordinates map back,
and the mapping of JSON answers: only the numbers change, every other byte stays (streamed answers: test_click_stream)."""

from __future__ import annotations

import re

import orjson
import pytest

from trimflow import prune_request
from trimflow._clicks import Malformed, Screen, map_answer, screen_for, view_of
from trimflow.testing import b64, image

from .helpers import CLAUDE_SCREEN, OPENAI_SCREEN, lines_run, rules_with, url_for

ANTHROPIC_TOOLS = {"tools": [{"type": "computer_20250124", "name": "computer", "display_width_px": 2560, "display_height_px": 1440}]}
OPENAI_TOOLS = {"tools": [{"type": "computer_use_preview", "display_width": 5120, "display_height": 2880, "environment": "mac"}]}


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
    assert screen_for("anthropic", ANTHROPIC_TOOLS, "claude-opus-4-7", (2560, 1440), (2000, 1125)) == CLAUDE_SCREEN
    assert screen_for("openai-responses", OPENAI_TOOLS, "computer-use-preview", (5120, 2880), (2000, 1125)) == OPENAI_SCREEN
    # Claude would have resized the original to the same native size: its answer reads the same.
    assert screen_for("anthropic", ANTHROPIC_TOOLS, "claude-sonnet-4-6", (5120, 2880), (2880, 1620)) is None
    assert screen_for("anthropic", {"tools": [{"name": "bash", "type": "bash_20250124"}]}, "claude-opus-4-7", (2560, 1440), (2000, 1125)) is None
    assert screen_for("anthropic", {"tools": "computer"}, "claude-opus-4-7", (2560, 1440), (2000, 1125)) is None
    assert screen_for("openai-responses", {"tools": [{"type": "function", "name": "computer"}]}, None, (5120, 2880), (2000, 1125)) is None
    ga = {"tools": [{"type": "computer"}]}
    assert screen_for("openai-responses", ga, "gpt-5.4", (5120, 2880), (2000, 1125)) == OPENAI_SCREEN
    ws = {"type": "response.create", "response": OPENAI_TOOLS}  # a WebSocket message nests the request
    assert screen_for("openai-responses", ws, None, (5120, 2880), (2000, 1125)) == OPENAI_SCREEN


def test_a_point_is_rounded_and_clamped_to_the_original_screen() -> None:
    assert CLAUDE_SCREEN.point(1000, 500) == (1280, 640)
    assert CLAUDE_SCREEN.point(0.4, 1124.6) == (1, 1439)
    assert CLAUDE_SCREEN.point(-30, 99999) == (0, 1439)
    assert CLAUDE_SCREEN.point(1999, 0) == (2559, 0)
    assert CLAUDE_SCREEN.point(1e308, -1e308) == (2559, 0)  # no overflow


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
    out, calls = map_answer(CLAUDE_SCREEN, CLAUDE_ANSWER)
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
    out, calls = map_answer(OPENAI_SCREEN, answer)
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
    assert map_answer(CLAUDE_SCREEN, answer) == (answer, 0)
    odd = (
        b'{"content":[{"type":"tool_use","name":"computer","input":{"coordinate":["a",true]}},'
        b'{"type":"tool_use","name":"computer","input":{"coordinate":[1,2,3]}}]}'
    )
    assert map_answer(CLAUDE_SCREEN, odd) == (odd, 0)


@pytest.mark.parametrize("body", [b"", b"not json", b'{"content":[', b"\xff\xfe"])
def test_a_malformed_answer_raises_malformed(body: bytes) -> None:
    with pytest.raises(Malformed):
        map_answer(CLAUDE_SCREEN, body)


def test_a_repeated_key_maps_the_value_a_json_reader_takes() -> None:
    answer = b'{"content":[{"type":"tool_use","name":"computer","input":{"coordinate":[1,1],"coordinate":[1000,500]}}]}'
    out, calls = map_answer(CLAUDE_SCREEN, answer)
    assert calls == 1 and out == answer.replace(b"[1000,500]", b"[1280,640]")


# --- bounds: work that grows with the answer ---------------------------------------------------------------


def clicks_answer(clicks: int) -> bytes:
    """A JSON Messages answer of `clicks` computer-tool calls, with text between them."""
    blocks: list[dict] = []
    for i in range(clicks):
        blocks.append({"type": "text", "text": f"step {i}"})
        blocks.append(
            {"type": "tool_use", "id": f"toolu_{i}", "name": "computer", "input": {"action": "left_click", "coordinate": [i % 2000, i % 1125]}}
        )
    return orjson.dumps({"id": "msg_1", "type": "message", "content": blocks, "usage": {"input_tokens": 1, "output_tokens": 2}})


def test_a_json_answer_is_mapped_in_work_that_grows_with_its_size_alone() -> None:
    """Twice the clicks, twice the work: a splice that walked from the answer's root for every number made it four
    times (3,000 clicks took a minute)."""
    answers = {n: clicks_answer(n) for n in (100, 200)}
    for n, answer in answers.items():
        assert map_answer(CLAUDE_SCREEN, answer)[1] == n
    work = [lines_run(lambda answer=answer: map_answer(CLAUDE_SCREEN, answer)) for answer in answers.values()]
    assert work[1] < 2.3 * work[0], work


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
