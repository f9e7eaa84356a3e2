"""OpenAI chat completions: /v1/chat/completions and every gateway that copies it.

Images are `image_url` parts of `messages[].content[]` (a data URL or a remote URL); documents are
`file` parts, audio is `input_audio`. Agents move tool screenshots into a user message after the
tool messages, and gateways also accept them inside tool messages: every message is searched.
Origins: in a `tool` (or `function`) message the tool's; in a user message right after the tool messages that holds
nothing but images (the screen an agent attaches after a call), or in an assistant message, the agent's; in any
other message the user's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._media import AGENT, DOCUMENT, IMAGE, TOOL, USER, JsonPath, Media, data_url
from ._base import HistoryParts, append_notes, dicts, listed, never, replace_images, replace_parts, text_part, url_media, user_or_agent

NAME = "openai-chat"

# URL path globs of this format's endpoints (fnmatch, whole path, query excluded).
# fnmatch's "*" also matches "/": any prefix (/v1/, /v2/, Azure's /openai/deployments/{d}/, OpenRouter's /api/v1/).
ENDPOINTS: tuple[str, ...] = ("*/chat/completions",)
# Streaming is asked in the body ("stream": true), never by the path.
STREAM_SUFFIXES: tuple[str, ...] = ()
COUNT_ENDINGS: tuple[tuple[str, str], ...] = ()
# The chat format also fronts local runtimes (llama.cpp's server, LM Studio) whose decoders may lack WebP
# (docs/providers.md): a shrunk image becomes JPEG or PNG here, never WebP.
ACCEPTS_WEBP = False


_TOOL_ROLES = ("tool", "function")


def find_media(body: dict[str, Any]) -> list[Media]:
    found: list[Media] = []
    after_tool = False  # the messages so far since the last tool message are the agent's screens
    for m, message in dicts(body.get("messages")):
        role, content = message.get("role"), message.get("content")
        if role in _TOOL_ROLES:
            origin = TOOL
        elif role == "assistant":
            origin = AGENT
        else:
            origin = user_or_agent(after_tool and role == "user", content, _is_image, _text)
        after_tool = role in _TOOL_ROLES or (role == "user" and origin == AGENT)
        for p, part in dicts(content):
            media = _part_media(("messages", m, "content", p), part, origin)
            if media is not None:
                found.append(media)
    return found


def _is_image(part: dict[str, Any]) -> bool:
    return part.get("type") == "image_url"


def _text(part: dict[str, Any]) -> Any:
    return part.get("text") if part.get("type") == "text" else None


def _part_media(path: JsonPath, part: dict[str, Any], origin: str = USER) -> Media | None:
    kind = part.get("type")
    if kind == "image_url":
        image = part.get("image_url")
        # Most clients send {"url": ..., "detail": ...}; some gateways accept the bare URL string.
        if isinstance(image, dict):
            detail = image.get("detail")
            return url_media(IMAGE, path, image.get("url"), detail if isinstance(detail, str) else None, origin)
        return url_media(IMAGE, path, image, None, origin)
    if kind == "file":
        file = part.get("file")
        if isinstance(file, dict):
            if "file_data" in file:
                return url_media(DOCUMENT, path, file.get("file_data"), None, origin)
            return Media(DOCUMENT, path, None, 0, None, None, origin)
    if kind == "input_audio":
        audio = part.get("input_audio")
        if isinstance(audio, dict) and isinstance(audio.get("data"), str):
            fmt = audio.get("format")
            return Media("audio", path, audio["data"], 0, f"audio/{fmt}" if isinstance(fmt, str) else None, None, origin)
    return None


def replace_media(body: dict[str, Any], texts: Mapping[JsonPath, str]) -> dict[str, Any]:
    return replace_parts(body, texts, text_part)


def _with_image(part: Any, data: str, mime: str) -> dict[str, Any]:
    copy = dict(part)
    image = part.get("image_url")
    url = data_url(data, mime)
    copy["image_url"] = {**image, "url": url} if isinstance(image, dict) else url
    return copy


def replace_data(body: dict[str, Any], images: Mapping[JsonPath, tuple[str, str]]) -> dict[str, Any]:
    return replace_images(body, images, _with_image)


def add_notes(body: dict[str, Any], notes: Mapping[JsonPath, str]) -> dict[str, Any]:
    return append_notes(body, notes, lambda text: {"type": "text", "text": text})


def model(body: dict[str, Any], path: str) -> str | None:
    value = body.get("model")
    if isinstance(value, str):
        return value
    # Azure names the deployment in the path and may omit the model.
    marker = "/deployments/"
    if marker in path:
        return path.split(marker, 1)[1].split("/", 1)[0] or None
    return None


def matches_shape(body: dict[str, Any]) -> bool:
    messages = body.get("messages")
    return isinstance(messages, list) and isinstance(body.get("model"), str)


def history(body: dict[str, Any]) -> HistoryParts:
    # The system (or developer) prompt is the first message.
    return HistoryParts(body, None, listed(body.get("messages")), ("messages",))


# Every request is a turn, its whole history in it.
is_warmup = server_side_history = never


_RETENTION_SECONDS = {"24h": 86400.0}  # prompt_cache_retention values longer than the default in-memory lifetime


def cache_lifetime(body: dict[str, Any]) -> float | None:
    """A request with `prompt_cache_retention: "24h"` keeps its cached prefix for a day."""
    retention = body.get("prompt_cache_retention")
    return _RETENTION_SECONDS.get(retention) if isinstance(retention, str) else None
