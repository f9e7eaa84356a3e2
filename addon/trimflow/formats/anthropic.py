"""Anthropic Messages: /v1/messages, Vertex rawPredict, Bedrock InvokeModel with a Claude body.

Images and documents are blocks of `messages[].content[]` and of `tool_result.content[]` (where
computer-use screenshots come back). A replaced block keeps its `cache_control` breakpoint.
Origins: inside a `tool_result` the tool's; beside one in the same user message, or in an assistant message, the
agent's; any other block of a user message the user's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from .._media import AGENT, DOCUMENT, IMAGE, TOOL, USER, JsonPath, Media, kind_of_mime
from ._base import (
    HistoryParts,
    append_notes,
    breakpoint_ttl,
    dicts,
    listed,
    longest_message_ttl,
    never,
    replace_images,
    replace_parts,
    text_part,
)

NAME = "anthropic"

# URL path globs of this format's endpoints (fnmatch, whole path, query excluded).
# Vertex AI (the body has anthropic_version and no model), Bedrock InvokeModel with a Claude body, then the
# direct API and its token counting. /v1/messages/batches is not matched: a glob matches the whole path.
ENDPOINTS: tuple[str, ...] = (
    "*/publishers/anthropic/models/*:rawPredict",
    "*/publishers/anthropic/models/*:streamRawPredict",
    "*/model/*/invoke",
    "*/model/*/invoke-with-response-stream",
    "*/v1/messages",
    "*/v1/messages/count_tokens",
)
# Path endings that ask for a streamed answer whatever the body says.
STREAM_SUFFIXES: tuple[str, ...] = (":streamRawPredict", "/invoke-with-response-stream")
# Token counting, and the turn it measures: the direct API, and Vertex's count-tokens model (its own rawPredict path).
COUNT_ENDINGS: tuple[tuple[str, str], ...] = (
    ("/v1/messages/count_tokens", "/v1/messages"),
    ("/publishers/anthropic/models/count-tokens:rawPredict", "/publishers/anthropic/models/count-tokens:rawPredict"),
)
# Image types Claude takes: JPEG, PNG, GIF, WebP (docs/providers.md): a shrunk image may become WebP.
ACCEPTS_WEBP = True


def find_media(body: dict[str, Any]) -> list[Media]:
    found: list[Media] = []
    for m, message in dicts(body.get("messages")):
        blocks = dicts(message.get("content"))
        # A user message that carries a tool result is the agent's: an image beside the result is the screen it attached.
        agents = message.get("role") == "assistant" or any(block.get("type") == "tool_result" for _, block in blocks)
        for b, block in blocks:
            path = ("messages", m, "content", b)
            if block.get("type") == "tool_result":
                for c, inner in dicts(block.get("content")):
                    _add(found, (*path, "content", c), inner, TOOL)
            else:
                _add(found, path, block, AGENT if agents else USER)
    return found


def _add(found: list[Media], path: JsonPath, block: dict[str, Any], origin: str) -> None:
    kind = block.get("type")
    if kind not in (IMAGE, DOCUMENT):
        return
    source = block.get("source")
    if not isinstance(source, dict):
        return
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        mime = source.get("media_type")
        mime = mime if isinstance(mime, str) else None
        found.append(Media(kind if kind == DOCUMENT else kind_of_mime(mime or "image/"), path, source["data"], 0, mime, None, origin))
    elif kind == DOCUMENT and source.get("type") == "text":
        return  # a plain-text document carries no binary payload
    else:
        found.append(Media(kind, path, None, 0, None, None, origin))  # url or file id: fetched by the provider


def replace_media(body: dict[str, Any], texts: Mapping[JsonPath, str]) -> dict[str, Any]:
    return replace_parts(body, texts, text_part)


def _with_image(block: Any, data: str, mime: str) -> dict[str, Any]:
    return {**block, "source": {**block["source"], "media_type": mime, "data": data}}


def replace_data(body: dict[str, Any], images: Mapping[JsonPath, tuple[str, str]]) -> dict[str, Any]:
    return replace_images(body, images, _with_image)


def add_notes(body: dict[str, Any], notes: Mapping[JsonPath, str]) -> dict[str, Any]:
    return append_notes(body, notes, lambda text: {"type": "text", "text": text})


def model(body: dict[str, Any], path: str) -> str | None:
    value = body.get("model")
    if isinstance(value, str):
        return value
    # Vertex: .../publishers/anthropic/models/{m}:rawPredict; Bedrock: /model/{id}/invoke.
    for marker in ("/models/", "/model/"):
        if marker in path:
            tail = path.rsplit(marker, 1)[1]
            return unquote(tail.split(":", 1)[0].split("/", 1)[0]) or None
    return None


def matches_shape(body: dict[str, Any]) -> bool:
    if not isinstance(body.get("messages"), list):
        return False
    if "anthropic_version" in body or isinstance(body.get("system"), list):
        return True
    # Anthropic's image blocks carry a `source`; OpenAI's carry `image_url`.
    for _, message in dicts(body.get("messages")):
        for _, block in dicts(message.get("content")):
            if block.get("type") in ("image", "document", "tool_result", "tool_use"):
                return True
    return False


def history(body: dict[str, Any]) -> HistoryParts:
    return HistoryParts(body, body.get("system"), listed(body.get("messages")), ("messages",))


# Every request is a turn, its whole history in it.
is_warmup = server_side_history = never


def cache_lifetime(body: dict[str, Any]) -> float | None:
    """The longest `ttl` of the breakpoints that cache the messages: the automatic one at the top level (it marks the
    last block), or one on a message's block."""
    ttls = [ttl for ttl in (breakpoint_ttl(body.get("cache_control")), longest_message_ttl(body, "cache_control")) if ttl is not None]
    return max(ttls) if ttls else None
