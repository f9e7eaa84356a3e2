"""A scripted computer-use model for the fake provider: it finds a target of a known colour in the newest
screenshot it received and clicks its centre, in that image's pixels, as a real model does with the image it sees.

`FakeProvider(script=ClickingModel(colour))` answers each request that declares a computer tool (Anthropic's
`computer_YYYYMMDD`, OpenAI's `computer_use_preview` / `computer`) with:

- a text part (`SAYS`);
- a computer-tool call that clicks the target's centre: Anthropic a `tool_use` `left_click` at `coordinate` and a
  `left_click_drag` from `start_coordinate` to `coordinate`; OpenAI a `computer_call` `click` at `x`, `y` and a
  `drag` whose `path` goes through the centre;
- a call of another tool (`OTHER_TOOL`) whose arguments hold the same numbers under the same names: a proxy must
  leave it alone.

The model sees the image as it arrived (no provider-side resize: the tests keep screenshots within the provider's
native resolution). Answers come as JSON or streamed in each API's event sequence; a streamed Anthropic tool input
arrives in several `input_json_delta` fragments, cut inside its numbers. A request without a computer tool, or
whose newest image holds no target, is left to the fake provider's usual reply.
"""

from __future__ import annotations

import base64
import binascii
import io
import itertools
from typing import Any

import orjson
from PIL import Image, ImageChops, UnidentifiedImageError

from ..formats._base import dicts
from ._fake_usage import FakeUsage
from ._replies import ResponsesEvents, anthropic_message, anthropic_usage, new_id, responses_message, responses_object, sse

Scripted = tuple[str, list[bytes]]
SSE = "text/event-stream; charset=utf-8"
JSON = "application/json"
SAYS = "The button is there; clicking it."
OTHER_TOOL = "note_position"
TOLERANCE = 48  # per channel: a lossy re-encode moves a flat colour by a few levels
_OPENAI_COMPUTER = ("computer_use_preview", "computer-preview", "computer", "computer_use")


class ClickingModel:
    """The fake provider's `script` hook (see the module docstring). `seen` lists the (width, height) of each
    newest screenshot it looked at; `clicks` the point it clicked in each."""

    def __init__(self, colour: tuple[int, int, int]) -> None:
        self.colour = colour
        self.seen: list[tuple[int, int]] = []
        self.clicks: list[tuple[int, int]] = []

    def __call__(self, fmt: str, request: dict[str, Any], usage: FakeUsage, stream: bool, sse: bool) -> Scripted | None:
        tool = computer_tool(fmt, request)
        data = newest_image(fmt, request) if tool is not None else None
        if tool is None or data is None:
            return None
        try:
            with Image.open(io.BytesIO(data)) as image:
                rgb = image.convert("RGB")
        except (UnidentifiedImageError, OSError):
            return None
        centre = find(rgb, self.colour)
        if centre is None:
            return None
        self.seen.append(rgb.size)
        self.clicks.append(centre)
        model = request.get("model")
        model = model if isinstance(model, str) else "fake-model"
        if fmt == "anthropic":
            return _anthropic(model, tool, centre, usage, stream)
        return _responses(request, model, centre, usage, stream)


def find(image: Image.Image, colour: tuple[int, int, int]) -> tuple[int, int] | None:
    """The centre of the pixels within TOLERANCE of `colour`, in the image's pixels (None when there are none)."""
    masks = [band.point(lambda v, c=c: 255 if abs(v - c) <= TOLERANCE else 0) for band, c in zip(image.split(), colour, strict=True)]
    box = ImageChops.multiply(ImageChops.multiply(masks[0], masks[1]), masks[2]).getbbox()
    if box is None:
        return None
    left, top, right, bottom = box
    return (left + right - 1) // 2, (top + bottom - 1) // 2


def computer_tool(fmt: str, request: dict[str, Any]) -> str | None:
    """The declared computer tool's name (Anthropic) or type (OpenAI Responses)."""
    for _, tool in dicts(request.get("tools")):
        kind = tool.get("type")
        if not isinstance(kind, str):
            continue
        if fmt == "anthropic" and kind.startswith("computer_") and isinstance(tool.get("name"), str):
            return str(tool["name"])
        if fmt == "openai-responses" and kind in _OPENAI_COMPUTER:
            return kind
    return None


def newest_image(fmt: str, request: dict[str, Any]) -> bytes | None:
    """The bytes of the last image in the request (a tool result's, a computer_call_output's, a user's)."""
    found: list[str] = []
    if fmt == "anthropic":
        for _, message in dicts(request.get("messages")):
            for _, block in dicts(message.get("content")):
                for part in [block, *(item for _, item in dicts(block.get("content")))]:
                    source = part.get("source")
                    if part.get("type") == "image" and isinstance(source, dict) and isinstance(source.get("data"), str):
                        found.append(source["data"])
    else:
        for _, item in dicts(request.get("input")):
            output = item.get("output")
            if isinstance(output, dict) and isinstance(output.get("image_url"), str):
                found.append(output["image_url"].split(",", 1)[-1])
            for _, part in dicts(item.get("content")):
                if part.get("type") == "input_image" and isinstance(part.get("image_url"), str):
                    found.append(part["image_url"].split(",", 1)[-1])
    if not found:
        return None
    try:
        return base64.b64decode(found[-1], validate=True)
    except (binascii.Error, ValueError):
        return None


# --- Anthropic Messages ------------------------------------------------------------------------------------


def _anthropic(model: str, tool: str, centre: tuple[int, int], usage: FakeUsage, stream: bool) -> Scripted:
    x, y = centre
    blocks: list[dict[str, Any]] = [
        {"type": "text", "text": SAYS},
        {"type": "tool_use", "id": new_id("toolu_"), "name": tool, "input": {"action": "left_click", "coordinate": [x, y]}},
        {
            "type": "tool_use",
            "id": new_id("toolu_"),
            "name": tool,
            "input": {"action": "left_click_drag", "start_coordinate": [x, y], "coordinate": [x, y]},
        },
        {"type": "tool_use", "id": new_id("toolu_"), "name": OTHER_TOOL, "input": {"coordinate": [x, y]}},
    ]
    if not stream:
        return JSON, [orjson.dumps(anthropic_message(new_id("msg_"), model, blocks, "tool_use", anthropic_usage(usage, usage.output_tokens)))]
    start = anthropic_message(new_id("msg_"), model, [], None, anthropic_usage(usage, 1))
    frames = [sse({"type": "message_start", "message": start}, "message_start")]
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            empty: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}]
        else:
            empty = {**block, "input": {}}
            text = orjson.dumps(block["input"]).decode()
            # Cut inside the numbers: a proxy must join the fragments before it reads them.
            cuts = [0, len(text) // 3, 2 * len(text) // 3 + 1, len(text)]
            deltas = [{"type": "input_json_delta", "partial_json": text[a:b]} for a, b in itertools.pairwise(cuts)]
        frames.append(sse({"type": "content_block_start", "index": index, "content_block": empty}, "content_block_start"))
        frames += [sse({"type": "content_block_delta", "index": index, "delta": d}, "content_block_delta") for d in deltas]
        frames.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    stop = {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": usage.output_tokens}}
    frames += [sse(stop, "message_delta"), sse({"type": "message_stop"}, "message_stop")]
    return SSE, frames


# --- OpenAI Responses --------------------------------------------------------------------------------------


def _responses(request: dict[str, Any], model: str, centre: tuple[int, int], usage: FakeUsage, stream: bool) -> Scripted:
    x, y = centre
    rid = new_id("resp_")

    def call(action: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "computer_call",
            "id": new_id("cu_"),
            "call_id": new_id("call_"),
            "action": action,
            "pending_safety_checks": [],
            "status": "completed",
        }

    items: list[dict[str, Any]] = [
        responses_message(new_id("msg_"), SAYS, "completed"),
        call({"type": "click", "button": "left", "x": x, "y": y}),
        call({"type": "drag", "path": [{"x": x, "y": y}, {"x": x, "y": y}]}),
        {
            "type": "function_call",
            "id": new_id("fc_"),
            "call_id": new_id("call_"),
            "name": OTHER_TOOL,
            "arguments": orjson.dumps({"x": x, "y": y}).decode(),
            "status": "completed",
        },
    ]
    if not stream:
        return JSON, [orjson.dumps(responses_object(rid, request, model, "completed", items, usage))]
    events = ResponsesEvents(rid, request, model)
    frames = events.started()
    for index, item in enumerate(items):
        frames.append(events.event("response.output_item.added", output_index=index, item={**item, "status": "in_progress"}))
        frames.append(events.event("response.output_item.done", output_index=index, item=item))
    frames.append(events.completed(items, usage))
    return SSE, frames
