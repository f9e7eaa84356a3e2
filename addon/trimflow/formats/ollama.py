"""Ollama's native chat API: /api/chat.

Images are raw base64 strings in `messages[].images[]`. A pruned image leaves that list and a
note joins the message's `content`, since Ollama has no text parts.
Origins: in a `tool` message the tool's; in a user message right after the tool messages with no text of its own
(the screen an agent attaches after a call), or in an assistant message, the agent's; in any other the user's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .._media import AGENT, IMAGE, TOOL, USER, JsonPath, Media
from .._placeholder import PLACEHOLDER_PREFIX
from ._base import HistoryParts, default_lifetime, dicts, listed, never, rebuild

NAME = "ollama"

# URL path globs of this format's endpoints (fnmatch, whole path, query excluded).
ENDPOINTS: tuple[str, ...] = ("*/api/chat",)
# Ollama streams unless the body says "stream": false; the path never says.
STREAM_SUFFIXES: tuple[str, ...] = ()
COUNT_ENDINGS: tuple[tuple[str, str], ...] = ()
# Ollama's runtimes may not decode WebP (docs/providers.md): a shrunk image becomes JPEG or PNG, never WebP.
ACCEPTS_WEBP = False


def find_media(body: dict[str, Any]) -> list[Media]:
    found: list[Media] = []
    after_tool = False  # the messages so far since the last tool message are the agent's screens
    for m, message in dicts(body.get("messages")):
        role, images = message.get("role"), message.get("images")
        if role == "tool":
            origin = TOOL
        elif role == "assistant":
            origin = AGENT
        else:
            agents = after_tool and role == "user" and isinstance(images, list) and bool(images) and _no_text(message.get("content"))
            origin = AGENT if agents else USER
        after_tool = role == "tool" or (role == "user" and origin == AGENT)
        if isinstance(images, list):
            for i, image in enumerate(images):
                if isinstance(image, str):
                    found.append(Media(IMAGE, ("messages", m, "images", i), image, origin=origin))
    return found


def _no_text(content: Any) -> bool:
    """Whether a message's content says nothing of its own: empty, or only notes trimflow joined to it."""
    if not isinstance(content, str):
        return content is None
    return all(not line.strip() or line.startswith(PLACEHOLDER_PREFIX) for line in content.split("\n"))


def replace_media(body: dict[str, Any], texts: Mapping[JsonPath, str]) -> dict[str, Any]:
    by_message: dict[JsonPath, dict[int, str]] = {}
    for path, text in texts.items():
        *message_path, _images, index = path
        by_message.setdefault(tuple(message_path), {})[int(index)] = text

    def edit(notes: dict[int, str]) -> Any:
        def apply(message: dict[str, Any]) -> dict[str, Any]:
            copy = dict(message)
            copy["images"] = [image for i, image in enumerate(message["images"]) if i not in notes]
            added = "\n".join(notes[i] for i in sorted(notes))
            content = message.get("content")
            copy["content"] = f"{content}\n{added}" if isinstance(content, str) and content else added
            return copy

        return apply

    return rebuild(body, {path: edit(notes) for path, notes in by_message.items()})


def add_notes(body: dict[str, Any], notes: Mapping[JsonPath, str]) -> dict[str, Any]:
    # The images are a list of bare base64 strings: a note joins the message's text, like a placeholder.
    by_message: dict[JsonPath, list[str]] = {}
    for path, text in notes.items():
        by_message.setdefault(tuple(path[:-2]), []).append(text)

    def edit(texts: list[str]) -> Callable[[Any], Any]:
        def apply(message: Any) -> Any:
            if not isinstance(message, dict):
                return message
            content = message.get("content")
            added = "\n".join(texts)
            return {**message, "content": f"{content}\n{added}" if isinstance(content, str) and content else added}

        return apply

    return rebuild(body, {path: edit(texts) for path, texts in by_message.items()})


def replace_data(body: dict[str, Any], images: Mapping[JsonPath, tuple[str, str]]) -> dict[str, Any]:
    # Raw base64 with no declared type: Ollama sniffs the bytes itself.
    return rebuild(body, {path: _constant(data) for path, (data, _mime) in images.items()})


def _constant(value: str) -> Callable[[Any], str]:
    """An edit for `rebuild` that puts `value` where the old one was."""
    return lambda _old: value


def model(body: dict[str, Any], path: str) -> str | None:
    value = body.get("model")
    return value if isinstance(value, str) else None


def matches_shape(body: dict[str, Any]) -> bool:
    return any(isinstance(message.get("images"), list) for _, message in dicts(body.get("messages")))


def history(body: dict[str, Any]) -> HistoryParts:
    # The system prompt is the first message.
    return HistoryParts(body, None, listed(body.get("messages")), ("messages",))


# Every request is a turn, its whole history in it.
is_warmup = server_side_history = never
cache_lifetime = default_lifetime
