"""trimflow.testing._clicking: the fake computer-use model finds the target in the newest screenshot it received
and clicks its centre in that image's pixels, in each API's shape, JSON and streamed."""

from __future__ import annotations

import io

import orjson
import pytest
from PIL import Image, ImageDraw

from trimflow.testing import b64
from trimflow.testing._clicking import OTHER_TOOL, SAYS, ClickingModel, find
from trimflow.testing._fake_usage import FakeUsage

PINK = (255, 0, 255)
USAGE = FakeUsage(input_tokens=10, output_tokens=4)


def shot(size: tuple[int, int], box: tuple[int, int, int, int] | None, fmt: str = "PNG") -> bytes:
    picture = Image.new("RGB", size, (236, 238, 242))
    if box is not None:
        ImageDraw.Draw(picture).rectangle(box, fill=PINK)
    buf = io.BytesIO()
    picture.save(buf, fmt, quality=60)
    return buf.getvalue()


def claude_request(*images: bytes) -> dict:
    blocks = [
        {
            "type": "tool_result",
            "tool_use_id": "t",
            "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(i)}}],
        }
        for i in images
    ]
    return {
        "model": "claude-opus-4-7",
        "tools": [{"type": "computer_20250124", "name": "computer"}],
        "messages": [{"role": "user", "content": blocks}],
    }


def test_find_gives_the_centre_of_the_target_even_after_a_lossy_encode() -> None:
    with Image.open(io.BytesIO(shot((300, 200), (100, 40, 139, 59), "JPEG"))) as picture:
        assert find(picture.convert("RGB"), PINK) == (119, 49)
    with Image.open(io.BytesIO(shot((300, 200), None))) as picture:
        assert find(picture.convert("RGB"), PINK) is None


def test_claude_clicks_the_target_of_the_newest_screenshot() -> None:
    model = ClickingModel(PINK)
    content_type, [frame] = model(
        "anthropic", claude_request(shot((300, 200), (0, 0, 9, 9)), shot((300, 200), (100, 40, 139, 59))), USAGE, False, False
    )
    answer = orjson.loads(frame)
    assert content_type == "application/json" and model.seen == [(300, 200)] and model.clicks == [(119, 49)]
    assert [b.get("text") or b["input"] for b in answer["content"]] == [
        SAYS,
        {"action": "left_click", "coordinate": [119, 49]},
        {"action": "left_click_drag", "start_coordinate": [119, 49], "coordinate": [119, 49]},
        {"coordinate": [119, 49]},
    ]
    assert answer["content"][3]["name"] == OTHER_TOOL


def test_claude_streams_the_input_in_fragments_cut_inside_the_numbers() -> None:
    content_type, frames = ClickingModel(PINK)("anthropic", claude_request(shot((300, 200), (100, 40, 139, 59))), USAGE, True, False)
    assert content_type.startswith("text/event-stream")
    events = [orjson.loads(f.split(b"data: ", 1)[1]) for f in frames]
    fragments = [e["delta"]["partial_json"] for e in events if e.get("index") == 1 and e["type"] == "content_block_delta"]
    assert len(fragments) == 3 and orjson.loads("".join(fragments)) == {"action": "left_click", "coordinate": [119, 49]}
    assert not all(f.endswith(("[", ",", "]", "}", '"')) for f in fragments[:-1])


@pytest.mark.parametrize("stream", [False, True])
def test_openai_clicks_and_drags_through_the_target(stream: bool) -> None:
    output = {"type": "computer_screenshot", "image_url": "data:image/png;base64," + b64(shot((300, 200), (100, 40, 139, 59)))}
    request = {
        "model": "computer-use-preview",
        "tools": [{"type": "computer_use_preview"}],
        "input": [{"type": "computer_call_output", "call_id": "c", "output": output}],
    }
    _, frames = ClickingModel(PINK)("openai-responses", request, USAGE, stream, False)
    last = orjson.loads(frames[-1].split(b"data: ", 1)[1]) if stream else orjson.loads(frames[0])
    items = (last["response"] if stream else last)["output"]
    assert [i["type"] for i in items] == ["message", "computer_call", "computer_call", "function_call"]
    assert items[1]["action"] == {"type": "click", "button": "left", "x": 119, "y": 49}
    assert items[2]["action"]["path"] == [{"x": 119, "y": 49}, {"x": 119, "y": 49}]


def test_no_computer_tool_or_no_target_is_left_to_the_usual_reply() -> None:
    model = ClickingModel(PINK)
    request = claude_request(shot((300, 200), (100, 40, 139, 59)))
    assert model("anthropic", {**request, "tools": [{"name": "bash", "type": "custom"}]}, USAGE, False, False) is None
    assert model("anthropic", claude_request(shot((300, 200), None)), USAGE, False, False) is None
    assert model("anthropic", {**request, "messages": []}, USAGE, False, False) is None
    assert model.clicks == []
