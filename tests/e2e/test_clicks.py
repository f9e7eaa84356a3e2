"""Computer-use clicks through a real mitmdump: the fake provider plays a model that finds a pink button in the
screenshot it received and clicks its centre in that image's pixels; trimflow shrank the screenshot, so it maps
every click of the answer back, and the real SDKs' agent clicks on the button on its original screen. What the
model answered (what the control, the mapping off, hands the agent) misses it. Text and the other tool's call come through unchanged.
JSON and SSE; Anthropic Messages and OpenAI Responses. Shrunk for a side limit (`native_size` off), and at the size
the model sees (the shipped `native_size`): OpenAI's answer mapped back, Claude's needing nothing, nor a note. Then
what a hostile answer costs: a long drag mapped while another request goes through, and an answer of many computer
blocks that never end."""

from __future__ import annotations

import hashlib
import io
import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import orjson
import pytest
from PIL import Image, ImageDraw

from trimflow._click_stream import OVER_ANSWER
from trimflow.testing import FakeProvider, b64, image
from trimflow.testing._clicking import OTHER_TOOL, SAYS, SSE, ClickingModel, find
from trimflow.testing._fake_usage import FakeUsage
from trimflow.testing._replies import ResponsesEvents, new_id, sse

from .. import shrink_bench
from .helpers import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    Proxy,
    direct_http_client,
    open_connection,
    peak_growth_during,
    post,
    replace_text,
    start_all,
    stop_all,
)

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


# --- what a hostile answer costs: no other request waits, what is held stays bounded --------------------------

SMALL = image(400, 300, "PNG", seed=21)  # shrunk to 200x150 by the rule below: the model's coordinates double
DRAG_MODEL = "computer-use-drag"
OPEN_BLOCKS_MODEL = "claude-opus-4-7-open-blocks"
WAIT = 60.0


class HostileModels:
    """The fake provider's script for the tests below, chosen by the request's model:

    - DRAG_MODEL (Responses, streamed): a drag through `points` points, `calls` times (each call in its
      output_item.added and .done events, and all of them again in response.completed), sent at once;
    - OPEN_BLOCKS_MODEL (Messages, streamed): `blocks` computer tool_use blocks whose input streams `block_bytes`
      each and never ends; `sent` hashes what went out."""

    def __init__(self, points: int, calls: int, blocks: int, block_bytes: int) -> None:
        self.points, self.calls, self.blocks, self.block_bytes = points, calls, blocks, block_bytes
        self.sent = hashlib.sha256()
        self.sent_bytes = 0

    def __call__(self, fmt: str, request: dict[str, Any], usage: FakeUsage, stream: bool, sse_wanted: bool) -> tuple[str, Iterator[bytes]] | None:
        if stream and fmt == "openai-responses" and request.get("model") == DRAG_MODEL:
            return SSE, self._drag(request, usage)
        if stream and fmt == "anthropic" and request.get("model") == OPEN_BLOCKS_MODEL:
            return SSE, self._counted(self._open_blocks())
        return None

    def drag_path(self) -> list[dict[str, int]]:
        return [{"x": 20 + i % 150, "y": 10 + i % 130} for i in range(self.points)]

    def _drag(self, request: dict[str, Any], usage: FakeUsage) -> Iterator[bytes]:
        events = ResponsesEvents(new_id("resp_"), request, DRAG_MODEL)
        yield from events.started()
        calls = []
        for index in range(self.calls):
            call = {"type": "computer_call", "id": new_id("cu_"), "call_id": new_id("call_"), "action": {"type": "drag", "path": self.drag_path()}}
            yield events.event("response.output_item.added", output_index=index, item={**call, "status": "in_progress"})
            calls.append({**call, "pending_safety_checks": [], "status": "completed"})
            yield events.event("response.output_item.done", output_index=index, item=calls[-1])
        yield events.completed(calls, usage)

    def _open_blocks(self) -> Iterator[bytes]:
        yield sse(
            {"type": "message_start", "message": {"id": new_id("msg_"), "type": "message", "role": "assistant", "content": [], "usage": {}}},
            "message_start",
        )
        piece = "a" * 16384
        for index in range(self.blocks):
            block = {"type": "tool_use", "id": new_id("toolu_"), "name": "computer", "input": {}}
            yield sse({"type": "content_block_start", "index": index, "content_block": block}, "content_block_start")
            yield sse(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": '{"action": "type", "text": "'},
                },
                "content_block_delta",
            )
            for _ in range(self.block_bytes // len(piece)):
                yield sse(
                    {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}},
                    "content_block_delta",
                )
        yield sse({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 1}}, "message_delta")
        yield sse({"type": "message_stop"}, "message_stop")

    def _counted(self, frames: Iterator[bytes]) -> Iterator[bytes]:
        for frame in frames:
            self.sent.update(frame)
            self.sent_bytes += len(frame)
            yield frame


@pytest.fixture(scope="module")
def hostile() -> HostileModels:
    # One 600-point drag is 11 KB an event, 33 KB an answer; two of them. Forty open blocks of 2 MiB each: every
    # block under what one held block may be, their sum ten times what one answer may hold.
    return HostileModels(points=600, calls=2, blocks=40, block_bytes=2 * 2**20)


@pytest.fixture(scope="module")
def hostile_proxy(tmp_path_factory: pytest.TempPathFactory, hostile: HostileModels) -> Iterator[Proxy]:
    with FakeProvider(script=hostile) as provider:
        workdir = tmp_path_factory.mktemp("hostile")
        rules = replace_text(workdir / "rules.yaml", "defaults:\n  max_image_side: 200\n")
        proxy = Proxy(workdir, "--mode", f"reverse:{provider.url}", rules=rules)
        start_all(proxy.mitm)
        yield proxy
        stop_all(proxy.mitm)


def small_screenshot_request(fmt: str, model: str) -> bytes:
    data = b64(SMALL)
    if fmt == "anthropic":
        shot_block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
        tool = {"type": "computer_20250124", "name": "computer", "display_width_px": 400, "display_height_px": 300}
        messages = [
            {"role": "user", "content": [{"type": "text", "text": "Type something."}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_shot", "name": "computer", "input": {"action": "screenshot"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_shot", "content": [shot_block]}]},
        ]
        return orjson.dumps({"model": model, "max_tokens": 1024, "stream": True, "tools": [tool], "messages": messages})
    shot = {"type": "computer_call", "id": "cu_shot", "call_id": "call_shot", "action": {"type": "screenshot"}, "status": "completed"}
    output = {"type": "computer_screenshot", "image_url": "data:image/png;base64," + data}
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Drag the slider."}]},
        shot,
        {"type": "computer_call_output", "call_id": "call_shot", "output": output},
    ]
    tool = {"type": "computer_use_preview", "display_width": 400, "display_height": 300, "environment": "mac"}
    return orjson.dumps({"model": model, "stream": True, "tools": [tool], "input": items, "truncation": "auto"})


def unrelated_request(proxy: Proxy) -> float:
    """The seconds a small chat request through the proxy takes, answered in full."""
    body = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    started = time.monotonic()
    status, _ = post(proxy.port, "/v1/chat/completions", body, {"Authorization": f"Bearer {OPENAI_KEY}"})
    assert status == 200
    return time.monotonic() - started


def test_a_long_drag_being_mapped_holds_up_no_other_request(hostile_proxy: Proxy, hostile: HostileModels) -> None:
    """The unrelated request goes once the agent has the drag's first event, while the proxy maps the rest. A mapping
    that took a second an event on the event loop (each number spliced from the answer's root) held every other flow
    for as long; the request's delay stays under a second (beside its own latency on this machine just before)."""
    proxy = hostile_proxy
    baseline = sorted(unrelated_request(proxy) for _ in range(3))[1]
    begun = threading.Event()
    got: dict[str, Any] = {}

    def drag() -> None:
        conn = open_connection(proxy.port)
        try:
            conn.request(
                "POST",
                "/v1/responses",
                small_screenshot_request("openai-responses", DRAG_MODEL),
                {"Content-Type": "application/json", "Authorization": f"Bearer {OPENAI_KEY}"},
            )
            response = conn.getresponse()
            lines = []
            while line := response.readline():
                lines.append(line)
                if line.startswith(b"data: ") and b'"computer_call"' in line:
                    begun.set()
            got["lines"] = lines
        finally:
            begun.set()
            conn.close()

    with proxy.expect_records(2) as records:
        client = threading.Thread(target=drag)
        client.start()
        assert begun.wait(WAIT), "the drag never began"
        delay = unrelated_request(proxy) - baseline
        print(f"\nthe unrelated request took {delay:+.3f} s beside its {baseline:.3f} s while the drag was mapped")
        client.join(WAIT)
    assert not client.is_alive()
    completed = [orjson.loads(line[6:]) for line in got["lines"] if line.startswith(b"data: ") and b'"response.completed"' in line]
    assert len(completed) == 1
    mapped = [{"x": 2 * p["x"], "y": 2 * p["y"]} for p in hostile.drag_path()]
    calls = [item for item in completed[0]["response"]["output"] if item["type"] == "computer_call"]
    assert [call["action"]["path"] for call in calls] == [mapped] * hostile.calls  # the mapping did run
    assert delay < 1.0, f"the unrelated request waited {delay:.2f} s longer than its {baseline:.2f} s"
    [record] = [r for r in records if r["model"] == DRAG_MODEL]
    assert (record["clicks_mapped"], record["clicks_unmapped"]) == (hostile.calls, None)


def test_the_open_blocks_of_one_answer_are_held_within_one_bound(hostile_proxy: Proxy, hostile: HostileModels) -> None:
    """Forty computer blocks that never end, 80 MiB in all: each under what one held block may be, so a bound per
    block held them all (twice: the events and their input). One bound over the answer lets the rest pass as it
    came: the proxy's peak memory grows by a fraction of the answer, and the agent gets every byte."""
    proxy = hostile_proxy
    assert proxy.mitm.process is not None
    got: dict[str, Any] = {}

    def fetch() -> None:
        conn = open_connection(proxy.port)
        try:
            conn.request(
                "POST",
                "/v1/messages",
                small_screenshot_request("anthropic", OPEN_BLOCKS_MODEL),
                {"Content-Type": "application/json", "x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"},
            )
            response = conn.getresponse()
            digest, size = hashlib.sha256(), 0
            while block := response.read(2**16):
                digest.update(block)
                size += len(block)
            got.update(status=response.status, size=size, digest=digest.hexdigest())
        finally:
            conn.close()

    with proxy.expect_records(1) as records:
        growth = peak_growth_during(proxy.mitm.process.pid, fetch)
    answer = hostile.blocks * hostile.block_bytes
    print(f"\npeak RSS growth {growth / 2**20:.0f} MiB for a {answer / 2**20:.0f} MiB answer of {hostile.blocks} open blocks")
    assert got == {"status": 200, "size": hostile.sent_bytes, "digest": hostile.sent.hexdigest()}  # as it came
    assert growth < answer / 2, f"peak RSS grew {growth / 2**20:.0f} MiB"  # what was held alone: over twice the answer
    assert records[0]["clicks_unmapped"] == OVER_ANSWER and records[0]["clicks_mapped"] == 0
    assert proxy.log().count("computer-use answer passed unmapped: " + OVER_ANSWER) == 1
