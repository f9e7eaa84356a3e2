"""Gemini and Vertex generateContent / streamGenerateContent.

Media are parts of `contents[].parts[]` and of `functionResponse.parts[]` (Gemini 3 tool results),
spelled `inline_data{mime_type,data}` or `inlineData{mimeType,data}`; `file_data`/`fileData` point
at stored files. The model is named in the URL path only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._base import JsonPath, Media, dicts, first_items, kind_of_mime, replace_images, replace_parts

NAME = "gemini"


def find_media(body: dict[str, Any]) -> list[Media]:
    found: list[Media] = []
    for c, content in dicts(body.get("contents")):
        for p, part in dicts(content.get("parts")):
            path = ("contents", c, "parts", p)
            _add(found, path, part)
            for key in ("functionResponse", "function_response"):
                response = part.get(key)
                if isinstance(response, dict):
                    for q, inner in dicts(response.get("parts")):
                        _add(found, (*path, key, "parts", q), inner)
    return found


def _add(found: list[Media], path: JsonPath, part: dict[str, Any]) -> None:
    for key, mime_key in (("inline_data", "mime_type"), ("inlineData", "mimeType")):
        inline = part.get(key)
        if isinstance(inline, dict) and isinstance(inline.get("data"), str):
            mime = inline.get(mime_key)
            mime = mime if isinstance(mime, str) else None
            found.append(Media(kind_of_mime(mime), path, inline["data"], 0, mime))
            return
    for key, mime_key in (("file_data", "mime_type"), ("fileData", "mimeType")):
        stored = part.get(key)
        if isinstance(stored, dict):
            mime = stored.get(mime_key)
            found.append(Media(kind_of_mime(mime if isinstance(mime, str) else None), path, None))
            return


def replace_media(body: dict[str, Any], texts: Mapping[JsonPath, str]) -> dict[str, Any]:
    return replace_parts(body, texts, lambda _old, text: {"text": text})


def _with_image(part: Any, data: str, mime: str) -> dict[str, Any]:
    # Keep the spelling the client used: inline_data{mime_type} or inlineData{mimeType}.
    for key, mime_key in (("inline_data", "mime_type"), ("inlineData", "mimeType")):
        inline = part.get(key)
        if isinstance(inline, dict) and isinstance(inline.get("data"), str):
            return {**part, key: {**inline, mime_key: mime, "data": data}}
    raise ValueError("not an inline image part")


def replace_data(body: dict[str, Any], images: Mapping[JsonPath, tuple[str, str]]) -> dict[str, Any]:
    return replace_images(body, images, _with_image)


def model(body: dict[str, Any], path: str) -> str | None:
    marker = "/models/"
    if marker not in path:
        return None
    return path.rsplit(marker, 1)[1].split(":", 1)[0] or None


def matches_shape(body: dict[str, Any]) -> bool:
    contents = body.get("contents")
    return isinstance(contents, list) and any("parts" in item for _, item in dicts(contents))


def conversation_anchor(body: dict[str, Any]) -> Any:
    return first_items(body, "systemInstruction", "system_instruction", "contents")
