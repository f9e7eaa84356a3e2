"""OpenAI Responses: /v1/responses, Codex's /backend-api/codex/responses, and WebSocket response.create.

Images are `input_image` parts of `input[].content[]` and of `function_call_output.output[]` and
`custom_tool_call_output.output[]` arrays (tool screenshots); `input_file` parts are documents. A computer-use
`computer_call_output` carries one `computer_screenshot` as its `output` (not a list): an image like the others,
whose placeholder is a card (formats._card), since that item takes no text. With `previous_response_id` the earlier
turns live on the provider, where no proxy can prune them.
Origins: in a tool's output item the tool's; in a user message right after tool outputs that holds nothing but
images, or in an assistant message, the agent's; in any other message the user's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from .._media import AGENT, DOCUMENT, IMAGE, TOOL, USER, JsonPath, Media, data_url, split_data_url
from ._base import HistoryParts, append_notes, dicts, replace_images, replace_parts, url_media, user_or_agent
from ._card import CARD_MIME, card, is_card
from .openai_chat import cache_lifetime as chat_cache_lifetime

NAME = "openai-responses"

# URL path globs of this format's endpoints (fnmatch, whole path, query excluded).
# /v1/responses, Codex's /backend-api/codex/responses, .../responses/compact, and the input token count.
ENDPOINTS: tuple[str, ...] = ("*/responses/compact", "*/responses/input_tokens", "*/responses")
# Streaming is asked in the body ("stream": true), never by the path.
STREAM_SUFFIXES: tuple[str, ...] = ()
# POST /v1/responses/input_tokens counts the tokens of a Responses request body.
COUNT_ENDINGS: tuple[tuple[str, str], ...] = (("/responses/input_tokens", "/responses"),)
# OpenAI takes PNG, JPEG, WebP and non-animated GIF (docs/providers.md): a shrunk image may become WebP.
ACCEPTS_WEBP = True


# Tool results whose `output` may be an array of content parts: a function's, and a custom (freeform) tool's,
# which is how Codex returns screenshots from its JavaScript `exec` tool.
_TOOL_OUTPUTS = ("function_call_output", "custom_tool_call_output")
COMPUTER_OUTPUT = "computer_call_output"
SCREENSHOT = "computer_screenshot"


def request_of(body: dict[str, Any]) -> tuple[dict[str, Any], JsonPath]:
    """The Responses request inside a body, and its path: a WebSocket `response.create` may nest it."""
    nested = body.get("response")
    if body.get("type") == "response.create" and isinstance(nested, dict) and "input" not in body:
        return nested, ("response",)
    return body, ()


def find_media(body: dict[str, Any]) -> list[Media]:
    request, root = request_of(body)
    found: list[Media] = []
    after_tool = False  # the items so far since the last tool output are the agent's screens
    for i, item in dicts(request.get("input")):
        base = (*root, "input", i)
        kind = item.get("type")
        if kind in _TOOL_OUTPUTS:
            _collect(found, (*base, "output"), item.get("output"), TOOL)
            after_tool = True
        elif kind == COMPUTER_OUTPUT:
            screenshot = item.get("output")
            media = _screenshot_media((*base, "output"), screenshot) if isinstance(screenshot, dict) else None
            if media is not None:
                found.append(media)
            after_tool = True
        else:
            role = item.get("role")
            origin = AGENT if role == "assistant" else user_or_agent(after_tool and role == "user", item.get("content"), _is_image, _text)
            after_tool = role == "user" and origin == AGENT
            _collect(found, (*base, "content"), item.get("content"), origin)
    return found


def _is_image(part: dict[str, Any]) -> bool:
    return part.get("type") == "input_image"


def _text(part: dict[str, Any]) -> Any:
    return part.get("text") if part.get("type") == "input_text" else None


def _collect(found: list[Media], path: JsonPath, parts: Any, origin: str) -> None:
    for p, part in dicts(parts):
        media = _part_media((*path, p), part, origin)
        if media is not None:
            found.append(media)


def _image_media(path: JsonPath, part: dict[str, Any], origin: str) -> Media | None:
    detail = part.get("detail")
    detail = detail if isinstance(detail, str) else None
    if "image_url" in part:
        return url_media(IMAGE, path, part.get("image_url"), detail, origin)
    return Media(IMAGE, path, None, 0, None, detail, origin)  # a file_id: stored at the provider


def _screenshot_media(path: JsonPath, output: dict[str, Any]) -> Media | None:
    if output.get("type") != SCREENSHOT:
        return None
    url = output.get("image_url")
    if isinstance(url, str) and _is_card_url(url):
        return None  # a pruned screenshot's card: a placeholder, not an image of the conversation
    return _image_media(path, output, TOOL)


def _is_card_url(url: str) -> bool:
    parsed = split_data_url(url)
    return parsed is not None and is_card(url[parsed[1] :])


def _part_media(path: JsonPath, part: dict[str, Any], origin: str = USER) -> Media | None:
    kind = part.get("type")
    if kind == "input_image":
        return _image_media(path, part, origin)
    if kind == "input_file":
        if "file_data" in part:
            return url_media(DOCUMENT, path, part.get("file_data"), None, origin)
        return Media(DOCUMENT, path, None, 0, None, None, origin)
    return None


def _placeholder_part(old: Any, text: str) -> dict[str, Any]:
    if isinstance(old, dict) and old.get("type") == SCREENSHOT:
        # The screenshot keeps its place and detail; a card showing the text stands for its pixels.
        kept = {key: value for key, value in old.items() if key not in ("image_url", "file_id")}
        return {**kept, "image_url": data_url(card(text), CARD_MIME)}
    return {"type": "input_text", "text": text}


def replace_media(body: dict[str, Any], texts: Mapping[JsonPath, str]) -> dict[str, Any]:
    return replace_parts(body, texts, _placeholder_part)


def replace_data(body: dict[str, Any], images: Mapping[JsonPath, tuple[str, str]]) -> dict[str, Any]:
    return replace_images(body, images, lambda old, data, mime: {**old, "image_url": data_url(data, mime)})


def add_notes(body: dict[str, Any], notes: Mapping[JsonPath, str]) -> dict[str, Any]:
    # A computer_call_output's screenshot is not in a list: that item takes no text, so it gets no note.
    return append_notes(body, notes, lambda text: {"type": "input_text", "text": text})


def model(body: dict[str, Any], path: str) -> str | None:
    request, _ = request_of(body)
    value = request.get("model")
    return value if isinstance(value, str) else None


def matches_shape(body: dict[str, Any]) -> bool:
    # Embeddings and moderations also send a model and an input, but never a list of items.
    request, _ = request_of(body)
    items = request.get("input")
    return isinstance(request.get("model"), str) and isinstance(items, list) and any(isinstance(i, dict) for i in items)


def server_side_history(body: dict[str, Any]) -> bool:
    """A request naming `previous_response_id`: the provider keeps the turns before it."""
    request, _ = request_of(body)
    return bool(request.get("previous_response_id"))


# Server events that end a response on the WebSocket. Each event's type is its first key.
_ANSWER_EVENT = re.compile(rb'\s*\{\s*"type"\s*:\s*"(response\.completed|response\.incomplete|response\.failed|error)"')
# The HTTP status each stands for: a response that ran (completed, or cut short by a limit such as max_output_tokens)
# is a 200; a failed one a server error; an `error` event carries its own status (400 when it does not).
_ANSWER_STATUS = {b"response.completed": 200, b"response.incomplete": 200, b"response.failed": 500}


def websocket_answer(message: bytes) -> tuple[int, int | None, str | None] | None:
    """(status, input tokens, response id) from a server WebSocket message that ends a response, else None."""
    found = _ANSWER_EVENT.match(message)
    if found is None:
        return None
    try:
        event = orjson.loads(message)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(event, dict):
        return None
    status = _ANSWER_STATUS.get(found.group(1))
    if status is None:
        given = event.get("status")
        status = given if isinstance(given, int) and not isinstance(given, bool) else 400
    response = event.get("response")
    response = response if isinstance(response, dict) else {}
    usage = response.get("usage")
    tokens = usage.get("input_tokens") if isinstance(usage, dict) else None
    rid = response.get("id")
    return status, tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None, rid if isinstance(rid, str) else None


def is_warmup(body: dict[str, Any]) -> bool:
    """A WebSocket `response.create` with `generate: false` only prepares the next turn: no output, not a turn."""
    request, _ = request_of(body)
    return request.get("generate") is False or body.get("generate") is False


def history(body: dict[str, Any]) -> HistoryParts:
    request, root = request_of(body)
    items = request.get("input")
    # A plain string input is one user message.
    listed = items if isinstance(items, list) else [items] if isinstance(items, str) else []
    return HistoryParts(request, request.get("instructions"), listed, (*root, "input"))


def cache_lifetime(body: dict[str, Any]) -> float | None:
    """As on chat: the request's `prompt_cache_retention` (inside a `response.create` message's request too)."""
    return chat_cache_lifetime(request_of(body)[0])
