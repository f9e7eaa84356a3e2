"""Computer-use clicks through a real mitmdump: the fake provider plays a model that finds a pink button in the
screenshot it received and clicks its centre in that image's pixels; trimflow shrank the screenshot, so it maps
every click of the answer back, and the real SDKs' agent clicks on the button on its original screen. What the
model answered (what the control, the mapping off, hands the agent) misses it. Text and the other tool's call come through unchanged.
JSON and SSE; Anthropic Messages and OpenAI Responses. Shrunk for a side limit (`native_size` off), and at the size
the model sees (the shipped `native_size`): OpenAI's answer mapped back, Claude's needing nothing, nor a note."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from PIL import Image, ImageDraw

from trimflow.testing import FakeProvider, b64
from trimflow.testing._clicking import OTHER_TOOL, SAYS, ClickingModel, find

from .. import shrink_bench
from .helpers import ANTHROPIC_KEY, OPENAI_KEY, Proxy, direct_http_client, replace_text, start_all, stop_all

pytestmark = pytest.mark.e2e

PINK = (255, 0, 255)
SIDE = 2000  # the rule's max_image_side: both screenshots must shrink


class Screen:
    """A text-heavy screenshot with a pink button drawn at a known place (its box in the screenshot's pixels)."""

    def __init__(self, scale: int, button: tuple[int, int, int, int]) -> None:
        shot = shrink_bench.screenshot("ui", scale, size=(2560, 1440), seed=3)
        ImageDraw.Draw(shot.image).rectangle(button, fill=PINK)
        self.size = shot.image.size
        self.button = button
        buf = io.BytesIO()
        shot.image.save(buf, "PNG", compress_level=1)
        self.png = buf.getvalue()

    def hits(self, x: float, y: float) -> bool:
        left, top, right, bottom = self.button
        return left <= x <= right and top <= y <= bottom


@pytest.fixture(scope="module")
def retina() -> Screen:
    """5120x2880 (a 2x display), for OpenAI."""
    return Screen(2, (3320, 1900, 3520, 1990))


@pytest.fixture(scope="module")
def wide() -> Screen:
    """2560x1440, within Claude Opus 4.7's native resolution, for Anthropic."""
    return Screen(1, (1660, 950, 1770, 1000))


@pytest.fixture(scope="module")
def model() -> ClickingModel:
    return ClickingModel(PINK)


@pytest.fixture(scope="module")
def clicking(model: ClickingModel) -> Iterator[FakeProvider]:
    with FakeProvider(script=model) as provider:
        yield provider


@pytest.fixture(scope="module")
def proxies(tmp_path_factory: pytest.TempPathFactory, clicking: FakeProvider) -> Iterator[tuple[Proxy, Proxy]]:
    """trimflow as shipped, and the control: the same with the mapping off (trimflow_clicks=false)."""
    made = []
    for name, options in (("clicks", {}), ("unmapped", {"trimflow_clicks": "false"})):
        workdir = tmp_path_factory.mktemp(name)
        rules = replace_text(workdir / "rules.yaml", f"defaults:\n  max_image_side: {SIDE}\n  native_size: false\n")
        made.append(Proxy(workdir, "--mode", f"reverse:{clicking.url}", rules=rules, **options))
    start_all(*(p.mitm for p in made))
    yield made[0], made[1]
    stop_all(*(p.mitm for p in made))


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory, clicking: FakeProvider) -> Iterator[Proxy]:
    """No limit on the image but the size the model sees (`native_size`, on as shipped)."""
    workdir = tmp_path_factory.mktemp("native")
    rules = replace_text(workdir / "rules.yaml", "defaults:\n  native_size: true\n")
    proxy = Proxy(workdir, "--mode", f"reverse:{clicking.url}", rules=rules)
    start_all(proxy.mitm)
    yield proxy
    stop_all(proxy.mitm)


@pytest.fixture(scope="module")
def proxy(proxies: tuple[Proxy, Proxy]) -> Proxy:
    return proxies[0]


@pytest.fixture(scope="module")
def unmapped(proxies: tuple[Proxy, Proxy]) -> Proxy:
    return proxies[1]


def test_the_button_is_found_on_the_original_screens(retina: Screen, wide: Screen) -> None:
    for screen in (retina, wide):
        x, y = find(Image.open(io.BytesIO(screen.png)).convert("RGB"), PINK) or (-1, -1)
        assert screen.hits(x, y)


# --- Anthropic ---------------------------------------------------------------------------------------------


def anthropic_messages(screen: Screen) -> list[dict[str, Any]]:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(screen.png)}}
    return [
        {"role": "user", "content": [{"type": "text", "text": "Press the pink button."}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_shot", "name": "computer", "input": {"action": "screenshot"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_shot", "content": [image]}]},
    ]


def ask_claude(proxy: Proxy, screen: Screen, stream: bool, model: str = "claude-opus-4-7") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The answer's blocks as the agent got them, and the flow's record."""
    width, height = screen.size
    tools: list[Any] = [
        {"type": "computer_20250124", "name": "computer", "display_width_px": width, "display_height_px": height},
        {"name": OTHER_TOOL, "description": "Note a position.", "input_schema": {"type": "object", "properties": {"coordinate": {"type": "array"}}}},
    ]
    args: dict[str, Any] = {
        "model": model,
        "max_tokens": 1024,
        "tools": tools,
        "messages": anthropic_messages(screen),
        "extra_headers": {"anthropic-beta": "computer-use-2025-01-24"},
    }
    with anthropic.Anthropic(api_key=ANTHROPIC_KEY, base_url=proxy.url, http_client=direct_http_client(), max_retries=0, timeout=120) as client:
        with proxy.expect_records(1) as records:
            if stream:
                with client.messages.stream(**args) as events:
                    message = events.get_final_message()
            else:
                message = client.messages.create(**args)
    return [b.model_dump() for b in message.content], records[0]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_claude_clicks_land_on_the_button_of_the_original_screen(
    proxy: Proxy, unmapped: Proxy, model: ClickingModel, wide: Screen, stream: bool
) -> None:
    blocks, record = ask_claude(proxy, wide, stream)
    # The model saw the screenshot shrunk, and clicked the button in those pixels.
    assert max(model.seen[-1]) == SIDE
    said = model.clicks[-1]
    assert [b["type"] for b in blocks] == ["text", "tool_use", "tool_use", "tool_use"]
    assert blocks[0]["text"] == SAYS
    click, drag, other = (b["input"] for b in blocks[1:])
    assert click["action"] == "left_click" and wide.hits(*click["coordinate"])
    assert drag["action"] == "left_click_drag" and wide.hits(*drag["start_coordinate"]) and wide.hits(*drag["coordinate"])
    assert other == {"coordinate": list(said)}  # another tool's call: as the model gave it
    assert (record["images_rescaled"], record["clicks_mapped"]) == (1, 2)
    assert "clicks mapped 2" in proxy.log()
    # The control: the same turn with the mapping off clicks beside the button.
    blocks, record = ask_claude(unmapped, wide, stream)
    assert blocks[1]["input"]["coordinate"] == list(model.clicks[-1]) and not wide.hits(*blocks[1]["input"]["coordinate"])
    assert (record["images_rescaled"], record["clicks_mapped"]) == (1, 0)


# --- OpenAI Responses --------------------------------------------------------------------------------------


def responses_input(screen: Screen) -> list[dict[str, Any]]:
    shot = {"type": "computer_call", "id": "cu_shot", "call_id": "call_shot", "action": {"type": "screenshot"}, "status": "completed"}
    output = {"type": "computer_screenshot", "image_url": "data:image/png;base64," + b64(screen.png)}
    return [
        {"role": "user", "content": [{"type": "input_text", "text": "Press the pink button."}]},
        shot,
        {"type": "computer_call_output", "call_id": "call_shot", "output": output},
    ]


def ask_openai(proxy: Proxy, screen: Screen, stream: bool) -> tuple[Any, list[Any], dict[str, Any]]:
    """The response as the agent got it, the computer calls of its output_item.done events, and the flow's record."""
    width, height = screen.size
    tools: list[Any] = [
        {"type": "computer_use_preview", "display_width": width, "display_height": height, "environment": "mac"},
        {"type": "function", "name": OTHER_TOOL, "parameters": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}}},
    ]
    args: dict[str, Any] = {"model": "computer-use-preview", "tools": tools, "input": responses_input(screen), "truncation": "auto"}
    done: list[Any] = []
    with openai.OpenAI(api_key=OPENAI_KEY, base_url=f"{proxy.url}/v1", http_client=direct_http_client(), max_retries=0, timeout=120) as client:
        with proxy.expect_records(1) as records:
            if stream:
                events = list(client.responses.create(**args, stream=True))
                assert events[-1].type == "response.completed"
                response = events[-1].response
                done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "computer_call"]
            else:
                response = client.responses.create(**args)
    return response, done, records[0]


def points(call: Any) -> list[tuple[float, float]]:
    action = call.action
    return [(action.x, action.y)] if action.type == "click" else [(p.x, p.y) for p in action.path]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_openai_clicks_land_on_the_button_of_the_original_screen(
    proxy: Proxy, unmapped: Proxy, model: ClickingModel, retina: Screen, stream: bool
) -> None:
    response, done, record = ask_openai(proxy, retina, stream)
    assert max(model.seen[-1]) == SIDE
    said = model.clicks[-1]
    assert response.output_text == SAYS
    calls = [item for item in response.output if item.type == "computer_call"]
    assert len(calls) == 2 and len(done) == (2 if stream else 0)
    for call in [*calls, *done]:
        assert all(retina.hits(x, y) for x, y in points(call)), points(call)
    [other] = [item for item in response.output if item.type == "function_call"]
    assert other.name == OTHER_TOOL and other.arguments == f'{{"x":{said[0]},"y":{said[1]}}}'
    assert (record["images_rescaled"], record["clicks_mapped"]) == (1, 2)
    assert "clicks mapped 2" in proxy.log()
    # The control: the same turn with the mapping off clicks beside the button.
    response, _, record = ask_openai(unmapped, retina, stream)
    calls = [item for item in response.output if item.type == "computer_call"]
    assert points(calls[0]) == [model.clicks[-1]] and not retina.hits(*model.clicks[-1])
    assert (record["images_rescaled"], record["clicks_mapped"]) == (1, 0)


# --- at the size the model sees ----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_openai_clicks_at_the_size_the_model_sees_land_on_the_button(native: Proxy, model: ClickingModel, retina: Screen, stream: bool) -> None:
    """computer-use-preview sees a 5120x2880 screenshot scaled into 2048x2048 and to a short side of 768: trimflow
    sends it at that size, and maps the answer's clicks back to the original screen."""
    response, done, record = ask_openai(native, retina, stream)
    assert model.seen[-1] == (1366, 768)
    calls = [item for item in response.output if item.type == "computer_call"]
    for call in [*calls, *done]:
        assert all(retina.hits(x, y) for x, y in points(call)), points(call)
    assert (record["native_sized"], record["images_rescaled"], record["clicks_mapped"]) == (1, 1, 2)


def test_claude_over_its_native_size_sees_its_own_resize_with_no_note(
    native: Proxy, clicking: FakeProvider, model: ClickingModel, retina: Screen
) -> None:
    """Claude scales a 5120x2880 screenshot to 1456x819 before the model sees it, and answers in those pixels either
    way: trimflow sends it at that size, with no note beside it, and the answer's coordinates are the model's."""
    blocks, record = ask_claude(native, retina, stream=False, model="claude-sonnet-4-5")
    assert model.seen[-1] == (1456, 819)
    assert blocks[1]["input"]["coordinate"] == list(model.clicks[-1])
    assert (record["native_sized"], record["images_rescaled"], record["clicks_mapped"]) == (1, 1, 0)
    assert record["media_bytes_after"] * 4 < record["media_bytes_before"]
    assert b"[trimflow:" not in clicking.received[-1].body
