"""Bedrock Converse: /model/{id}/converse and /converse-stream.

Media are `{"image": {"format", "source": {"bytes"}}}` (and `document`, `video`) blocks of
`messages[].content[]` and of `toolResult.content[]`. Bytes travel as base64 in the JSON API.
Origins as on Anthropic: inside a `toolResult` the tool's; beside one, or in an assistant message, the agent's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from .._media import AGENT, DOCUMENT, IMAGE, TOOL, USER, JsonPath, Media
from ._base import HistoryParts, append_notes, dicts, listed, longest_message_ttl, never, replace_images, replace_parts

NAME = "bedrock-converse"

# URL path globs of this format's endpoints (fnmatch, whole path, query excluded).
# The model id is URL-encoded in the path.
ENDPOINTS: tuple[str, ...] = ("*/model/*/converse", "*/model/*/converse-stream")
# Path endings that ask for a streamed answer whatever the body says.
STREAM_SUFFIXES: tuple[str, ...] = ("/converse-stream",)
# Bedrock's CountTokens wraps the request in another shape (input.converse): not read.
COUNT_ENDINGS: tuple[tuple[str, str], ...] = ()
# Converse's image formats: png, jpeg, gif, webp (docs/providers.md): a shrunk image may become WebP.
ACCEPTS_WEBP = True

_KINDS = {"image": IMAGE, "document": DOCUMENT, "video": "video"}


def find_media(body: dict[str, Any]) -> list[Media]:
    found: list[Media] = []
    for m, message in dicts(body.get("messages")):
        blocks = dicts(message.get("content"))
        agents = message.get("role") == "assistant" or any(isinstance(block.get("toolResult"), dict) for _, block in blocks)
        for b, block in blocks:
            path = ("messages", m, "content", b)
            result = block.get("toolResult")
            if isinstance(result, dict):
                for c, inner in dicts(result.get("content")):
                    _add(found, (*path, "toolResult", "content", c), inner, TOOL)
            else:
                _add(found, path, block, AGENT if agents else USER)
    return found


def _add(found: list[Media], path: JsonPath, block: dict[str, Any], origin: str) -> None:
    for key, kind in _KINDS.items():
        media = block.get(key)
        if not isinstance(media, dict):
            continue
        source = media.get("source")
        fmt = media.get("format")
        mime = f"{'application' if kind == DOCUMENT else kind}/{fmt}" if isinstance(fmt, str) else None
        if isinstance(source, dict) and isinstance(source.get("bytes"), str):
            found.append(Media(kind, path, source["bytes"], 0, mime, None, origin))
        else:
            found.append(Media(kind, path, None, 0, mime, None, origin))  # s3Location: fetched by the service
        return


def replace_media(body: dict[str, Any], texts: Mapping[JsonPath, str]) -> dict[str, Any]:
    return replace_parts(body, texts, lambda _old, text: {"text": text})


def _with_image(block: Any, data: str, mime: str) -> dict[str, Any]:
    image = block["image"]
    # Converse names the type by format alone: png, jpeg, gif or webp.
    return {**block, "image": {**image, "format": mime.split("/", 1)[1], "source": {**image["source"], "bytes": data}}}


def replace_data(body: dict[str, Any], images: Mapping[JsonPath, tuple[str, str]]) -> dict[str, Any]:
    return replace_images(body, images, _with_image)


def add_notes(body: dict[str, Any], notes: Mapping[JsonPath, str]) -> dict[str, Any]:
    return append_notes(body, notes, lambda text: {"text": text})


def model(body: dict[str, Any], path: str) -> str | None:
    marker = "/model/"
    if marker not in path:
        return None
    return unquote(path.split(marker, 1)[1].split("/", 1)[0]) or None


def matches_shape(body: dict[str, Any]) -> bool:
    if not isinstance(body.get("messages"), list) or "model" in body:
        return False
    for _, message in dicts(body.get("messages")):
        for _, block in dicts(message.get("content")):
            if any(key in block for key in ("text", "image", "toolResult", "toolUse", "document")) and "type" not in block:
                return True
    return False


def history(body: dict[str, Any]) -> HistoryParts:
    return HistoryParts(body, body.get("system"), listed(body.get("messages")), ("messages",))


# Every request is a turn, its whole history in it.
is_warmup = server_side_history = never


def cache_lifetime(body: dict[str, Any]) -> float | None:
    """The longest `ttl` of the `cachePoint` blocks among the messages (5m or 1h, as on Anthropic)."""
    return longest_message_ttl(body, "cachePoint")
