"""Gemini and Vertex generateContent / streamGenerateContent, and countTokens.

Media are parts of `contents[].parts[]` and of `functionResponse.parts[]` (Gemini 3 tool results),
spelled `inline_data{mime_type,data}` or `inlineData{mimeType,data}` (and mixes of the two); `file_data`/`fileData` point
at stored files. The model is named in the URL path only. A countTokens body is `{"contents": [...]}` (what
Google's SDK, and so Gemini CLI, sends to the Gemini API) or wraps a whole request in `generateContentRequest`.
Origins: inside a `functionResponse` (or a content of role `function`) the tool's; beside a `functionResponse` in
the same content, in a user content right after one that holds nothing but images, or in a `model` content, the
agent's; any other the user's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._media import AGENT, TOOL, USER, JsonPath, Media, kind_of_mime
from ._base import HistoryParts, append_notes, default_lifetime, dicts, listed, never, replace_images, replace_parts, user_or_agent

NAME = "gemini"

# URL path globs of this format's endpoints (fnmatch, whole path, query excluded).
# Gemini API and Vertex Gemini (.../publishers/google/models/{m}:generateContent).
ENDPOINTS: tuple[str, ...] = ("*:generateContent", "*:streamGenerateContent", "*:countTokens")
# Path endings that ask for a streamed answer whatever the body says.
STREAM_SUFFIXES: tuple[str, ...] = (":streamGenerateContent",)
# Token counting (Gemini CLI calls it before each turn), and the turn it measures.
COUNT_ENDINGS: tuple[tuple[str, str], ...] = ((":countTokens", ":generateContent"),)
# Gemini takes PNG, JPEG, WebP, HEIC, HEIF (docs/providers.md): a shrunk image may become WebP.
ACCEPTS_WEBP = True


def request_of(body: dict[str, Any]) -> tuple[dict[str, Any], JsonPath]:
    """The request inside a body, and its path: countTokens may wrap it in `generateContentRequest`."""
    wrapped = body.get("generateContentRequest")
    if "contents" not in body and isinstance(wrapped, dict):
        return wrapped, ("generateContentRequest",)
    return body, ()


def find_media(body: dict[str, Any]) -> list[Media]:
    request, root = request_of(body)
    found: list[Media] = []
    after_tool = False  # the contents so far since the last function response are the agent's screens
    for c, content in dicts(request.get("contents")):
        parts, role = content.get("parts"), content.get("role")
        responds = any(_response(part) is not None for _, part in dicts(parts))
        if role == "function":
            origin = TOOL
        elif role == "model" or responds:
            origin = AGENT
        else:
            origin = user_or_agent(after_tool and role != "model", parts, _is_media, _text)
        after_tool = responds or role == "function" or (role != "model" and origin == AGENT)
        for p, part in dicts(parts):
            path = (*root, "contents", c, "parts", p)
            _add(found, path, part, origin)
            found_response = _response(part)
            if found_response is not None:
                key, response = found_response
                for q, inner in dicts(response.get("parts")):
                    _add(found, (*path, key, "parts", q), inner, TOOL)
    return found


def _response(part: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """A part's function response and its key, if it is one."""
    for key in ("functionResponse", "function_response"):
        response = part.get(key)
        if isinstance(response, dict):
            return key, response
    return None


def _is_media(part: dict[str, Any]) -> bool:
    return _container(part, _INLINE) is not None or _container(part, _STORED) is not None


def _text(part: dict[str, Any]) -> Any:
    return part.get("text")


# Clients mix the spellings: google-genai sends inlineData with mime_type, for one.
_INLINE = ("inline_data", "inlineData")
_STORED = ("file_data", "fileData")
_MIME_KEYS = ("mime_type", "mimeType")


def _container(part: dict[str, Any], keys: tuple[str, str]) -> tuple[str, dict[str, Any]] | None:
    for key in keys:
        value = part.get(key)
        if isinstance(value, dict):
            return key, value
    return None


def _mime_key(container: dict[str, Any], key: str) -> str:
    """The mime key the client used in this container, else the one of the container's spelling."""
    for mime_key in _MIME_KEYS:
        if mime_key in container:
            return mime_key
    return "mime_type" if "_" in key else "mimeType"


def _mime(container: dict[str, Any], key: str) -> str | None:
    mime = container.get(_mime_key(container, key))
    return mime if isinstance(mime, str) else None


def _add(found: list[Media], path: JsonPath, part: dict[str, Any], origin: str = USER) -> None:
    inline = _container(part, _INLINE)
    if inline is not None and isinstance(inline[1].get("data"), str):
        key, value = inline
        mime = _mime(value, key)
        found.append(Media(kind_of_mime(mime), path, value["data"], 0, mime, None, origin))
        return
    stored = _container(part, _STORED)
    if stored is not None:
        found.append(Media(kind_of_mime(_mime(stored[1], stored[0])), path, None, 0, None, None, origin))


def replace_media(body: dict[str, Any], texts: Mapping[JsonPath, str]) -> dict[str, Any]:
    return replace_parts(body, texts, lambda _old, text: {"text": text})


def _with_image(part: Any, data: str, mime: str) -> dict[str, Any]:
    # Keep the spelling the client used for the container and for its mime key.
    inline = _container(part, _INLINE)
    if inline is None or not isinstance(inline[1].get("data"), str):
        raise ValueError("not an inline image part")
    key, value = inline
    return {**part, key: {**value, _mime_key(value, key): mime, "data": data}}


def replace_data(body: dict[str, Any], images: Mapping[JsonPath, tuple[str, str]]) -> dict[str, Any]:
    return replace_images(body, images, _with_image)


def _note_holder(path: JsonPath) -> JsonPath:
    """The parts list of the image's content: a functionResponse's own parts take only media."""
    for key in ("functionResponse", "function_response"):
        if key in path:
            return path[: path.index(key) - 1]
    return path[:-1]


def add_notes(body: dict[str, Any], notes: Mapping[JsonPath, str]) -> dict[str, Any]:
    return append_notes(body, notes, lambda text: {"text": text}, _note_holder)


def model(body: dict[str, Any], path: str) -> str | None:
    marker = "/models/"
    if marker not in path:
        return None
    return path.rsplit(marker, 1)[1].split(":", 1)[0] or None


def matches_shape(body: dict[str, Any]) -> bool:
    contents = body.get("contents")
    return isinstance(contents, list) and any("parts" in item for _, item in dicts(contents))


def history(body: dict[str, Any]) -> HistoryParts:
    request, root = request_of(body)
    head = request.get("systemInstruction", request.get("system_instruction"))
    return HistoryParts(request, head, listed(request.get("contents")), (*root, "contents"))


# Every request is a turn, its whole history in it.
is_warmup = server_side_history = never
cache_lifetime = default_lifetime
