"""OpenAI Responses: /v1/responses, Codex's /backend-api/codex/responses, and WebSocket response.create.

Images are `input_image` parts of `input[].content[]` and of `function_call_output.output[]` arrays
(tool screenshots); `input_file` parts are documents. With `previous_response_id` the earlier turns
live on the provider, where no proxy can prune them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._base import DOCUMENT, IMAGE, JsonPath, Media, data_url, dicts, replace_images, replace_parts, url_media

NAME = "openai-responses"

# URL path globs of this format's endpoints (fnmatch, whole path, query excluded).
# /v1/responses, Codex's /backend-api/codex/responses and .../responses/compact.
ENDPOINTS: tuple[str, ...] = ("*/responses/compact", "*/responses")
# Streaming is asked in the body ("stream": true), never by the path.
STREAM_SUFFIXES: tuple[str, ...] = ()


def request_of(body: dict[str, Any]) -> tuple[dict[str, Any], JsonPath]:
    """The Responses request inside a body, and its path: a WebSocket `response.create` may nest it."""
    nested = body.get("response")
    if body.get("type") == "response.create" and isinstance(nested, dict) and "input" not in body:
        return nested, ("response",)
    return body, ()


def find_media(body: dict[str, Any]) -> list[Media]:
    request, root = request_of(body)
    found: list[Media] = []
    for i, item in dicts(request.get("input")):
        base = (*root, "input", i)
        if item.get("type") == "function_call_output":
            _collect(found, (*base, "output"), item.get("output"))
        else:
            _collect(found, (*base, "content"), item.get("content"))
    return found


def _collect(found: list[Media], path: JsonPath, parts: Any) -> None:
    for p, part in dicts(parts):
        media = _part_media((*path, p), part)
        if media is not None:
            found.append(media)


def _part_media(path: JsonPath, part: dict[str, Any]) -> Media | None:
    kind = part.get("type")
    if kind == "input_image":
        detail = part.get("detail")
        detail = detail if isinstance(detail, str) else None
        if "image_url" in part:
            return url_media(IMAGE, path, part.get("image_url"), detail)
        return Media(IMAGE, path, None, 0, None, detail)  # a file_id: stored at the provider
    if kind == "input_file":
        if "file_data" in part:
            return url_media(DOCUMENT, path, part.get("file_data"))
        return Media(DOCUMENT, path, None)
    return None


def replace_media(body: dict[str, Any], texts: Mapping[JsonPath, str]) -> dict[str, Any]:
    return replace_parts(body, texts, lambda _old, text: {"type": "input_text", "text": text})


def replace_data(body: dict[str, Any], images: Mapping[JsonPath, tuple[str, str]]) -> dict[str, Any]:
    return replace_images(body, images, lambda old, data, mime: {**old, "image_url": data_url(data, mime)})


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
    request, _ = request_of(body)
    return bool(request.get("previous_response_id"))


def conversation_anchor(body: dict[str, Any]) -> Any:
    request, _ = request_of(body)
    items = request.get("input")
    return [request.get("instructions"), items[:2] if isinstance(items, list) else items]
