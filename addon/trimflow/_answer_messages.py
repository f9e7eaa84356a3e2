"""Where a provider's own error message is in its answer (`answer_messages`): the message of the JSON, not every
string of it, so that an echoed prompt or file name is never read as a verdict. trimflow._limit_errors reads limits
in what it gives. Pure Python, no mitmproxy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

ANSWER_TEXT_MAX = 64 * 1024  # bytes of an answer read: error texts come first, and a body may echo a request
MESSAGE_MAX = 2000  # characters of one message read
_MESSAGES_MAX = 8  # messages read from one answer
_DEPTH_MAX = 5  # JSON levels walked, embedded JSON strings included

_TAGS = re.compile(r"<[^>]*>")
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_HTML = re.compile(r"<(?:!doctype|html|head|body|title)\b", re.IGNORECASE)
# Bedrock's InvokeModel wraps the model's own message: the message is what follows.
_BEDROCK_WRAPPER = re.compile(r"^\s*(?:\w+Exception:\s*)?the model returned the following errors?:\s*", re.IGNORECASE)


def answer_messages(body: bytes) -> list[str]:
    """The provider's own error messages in an answer, outermost first: in JSON `error` (a string, or its
    `message`), `message`, `detail` (a string, or a list of validation errors: where and what, never the
    input they quote), `errors[].message`, and a provider's error JSON embedded as a string (OpenRouter's
    `error.metadata.raw`, a gateway's "OpenAIException - {...}"); Bedrock's "The model returned the
    following errors:" wrapper taken off. Not JSON: an HTML page's title, or the text itself. Other
    strings of the answer (a `param`, an `input`, a request id) are never read."""
    head = body[:ANSWER_TEXT_MAX]
    text = head.decode("utf-8", "replace").strip()
    out: list[str] = []
    if text[:1] in ("{", "["):
        if len(body) <= ANSWER_TEXT_MAX:  # a JSON answer cut short cannot be read safely
            parsed = _json(text)
            if parsed is not None:
                _from_json(parsed, out, 0)
        return out[:_MESSAGES_MAX]
    if _HTML.search(text):
        title = _TITLE.search(text)
        page = title.group(1) if title is not None else _TAGS.sub(" ", text)
        _add(" ".join(page.split())[:200], out, 0)
    else:
        _add(text, out, 0)
    return out[:_MESSAGES_MAX]


def _json(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _from_json(node: Any, out: list[str], depth: int) -> None:
    if depth > _DEPTH_MAX or len(out) >= _MESSAGES_MAX:
        return
    if isinstance(node, list):  # Gemini's streamed errors: [{"error": {...}}]; errors: [{"message": ...}]
        for item in node[:4]:
            _from_json(item, out, depth + 1)
        return
    if not isinstance(node, dict):
        return
    error = node.get("error")
    if isinstance(error, str):
        _add(error, out, depth)
    elif isinstance(error, (dict, list)):
        _from_json(error, out, depth + 1)
    for key in ("message", "Message", "msg", "error_message", "errorMessage"):
        value = node.get(key)
        if isinstance(value, str):
            _add(value, out, depth)
    detail = node.get("detail")
    if isinstance(detail, str):
        _add(detail, out, depth)
    elif isinstance(detail, list):
        for item in detail[:4]:
            if isinstance(item, dict):
                _add(_validation_message(item), out, depth)
    errors = node.get("errors")
    if isinstance(errors, (dict, list)):
        _from_json(errors, out, depth + 1)
    metadata = node.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("raw"), str):
        _add(metadata["raw"], out, depth)


def _validation_message(item: Mapping[str, Any]) -> str:
    """A FastAPI/pydantic validation error as "body.messages.3.content.str: Input should be a valid string
    (string_type)": where and what, without the `input` it quotes (the request's own content)."""
    loc = item.get("loc")
    where = ".".join(str(part) for part in loc if isinstance(part, (str, int))) if isinstance(loc, list) else ""
    msg = item.get("msg") if isinstance(item.get("msg"), str) else ""
    kind = item.get("type") if isinstance(item.get("type"), str) else ""
    text = f"{where}: {msg}" if where else str(msg)
    return f"{text} ({kind})" if kind else text


def _add(text: str, out: list[str], depth: int) -> None:
    text = text.strip()
    if not text or len(out) >= _MESSAGES_MAX:
        return
    start = text.find("{")
    if start >= 0 and text.endswith("}"):
        embedded = _json(text[start:])
        if isinstance(embedded, (dict, list)):
            prefix = text[:start].strip(" -:")
            if prefix:
                out.append(" ".join(prefix.split())[:MESSAGE_MAX])
            _from_json(embedded, out, depth + 1)
            return
    text = _BEDROCK_WRAPPER.sub("", text, count=1)
    out.append(" ".join(text.split())[:MESSAGE_MAX])
