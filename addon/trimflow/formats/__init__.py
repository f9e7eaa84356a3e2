"""The wire formats trimflow understands, one module each behind the WireFormat interface."""

from __future__ import annotations

from typing import Any

from . import anthropic, bedrock, gemini, ollama, openai_chat, openai_responses
from ._base import DOCUMENT, IMAGE, JsonPath, Media, WireFormat, split_data_url

FORMATS: dict[str, WireFormat] = {
    module.NAME: module  # type: ignore[misc]
    for module in (openai_chat, openai_responses, anthropic, gemini, bedrock, ollama)
}

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


__all__ = ["DOCUMENT", "FORMATS", "IMAGE", "JsonPath", "Media", "WireFormat", "detect_shape", "split_data_url"]
