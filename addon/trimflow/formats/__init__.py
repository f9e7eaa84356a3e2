"""The wire formats trimflow understands, one module each behind the WireFormat interface."""

from __future__ import annotations

from typing import Any

from .._media import DOCUMENT, IMAGE, JsonPath, Media, split_data_url
from . import anthropic, bedrock, gemini, ollama, openai_chat, openai_responses
from ._base import HistoryParts, WireFormat

FORMATS: dict[str, WireFormat] = {module.NAME: module for module in (openai_chat, openai_responses, anthropic, gemini, bedrock, ollama)}

# Every format's endpoint path globs, as (glob, format name), in first-match order. No built-in glob's literal
# ending is the ending of another's (a test checks), so no path matches two and the order changes no answer.
ENDPOINTS: tuple[tuple[str, str], ...] = tuple((glob, name) for name, module in FORMATS.items() for glob in module.ENDPOINTS)

_STREAM_SUFFIXES: tuple[str, ...] = tuple(suffix for module in FORMATS.values() for suffix in module.STREAM_SUFFIXES)


def streamed_path(path: str) -> bool:
    """Whether the URL path (query ignored) asks for a streamed answer, whatever the body says."""
    return path.partition("?")[0].endswith(_STREAM_SUFFIXES)


def counted_turn_path(wire_format: str, path: str) -> str | None:
    """For a token-count call (its format's COUNT_ENDINGS), the path of the turn it measures; None for any other path."""
    path = path.partition("?")[0]
    for count_ending, turn_ending in FORMATS[wire_format].COUNT_ENDINGS:
        if path.endswith(count_ending):
            return path[: len(path) - len(count_ending)] + turn_ending
    return None


# Shape detection order: the most distinctive shapes first, OpenAI chat (the most generic) last.
_SHAPE_ORDER = (gemini, openai_responses, ollama, bedrock, anthropic, openai_chat)


def detect_shape(body: Any) -> str | None:
    """The format a body looks like when its URL path named none, or None."""
    if not isinstance(body, dict):
        return None
    for module in _SHAPE_ORDER:
        if module.matches_shape(body):
            return module.NAME
    return None


__all__ = [
    "DOCUMENT",
    "ENDPOINTS",
    "FORMATS",
    "IMAGE",
    "HistoryParts",
    "JsonPath",
    "Media",
    "WireFormat",
    "counted_turn_path",
    "detect_shape",
    "split_data_url",
    "streamed_path",
]
