"""The input tokens a provider reports, read from a JSON, SSE, NDJSON or event-stream response.

A scanner sees the response chunk by chunk (so a stream passes through untouched and unbuffered)
and keeps only a short tail between chunks. It looks for each API's usage keys by pattern, which
works alike for whole JSON bodies, SSE `data:` lines, Gemini's streamed JSON array and Bedrock's
binary event-stream frames. The last value seen wins: streams send final counts last.
"""

from __future__ import annotations

import re

# A key is matched only where it opens a JSON key (not escaped inside model output text).
_KEYS = (
    "prompt_tokens",  # OpenAI chat
    "input_tokens",  # Responses, Anthropic
    "cache_read_input_tokens",  # Anthropic: cached prompt, reported apart from input_tokens
    "cache_creation_input_tokens",
    "promptTokenCount",  # Gemini
    "prompt_eval_count",  # Ollama
    "inputTokens",  # Bedrock Converse
)
_PATTERN = re.compile(rb'(?<!\\)"(' + b"|".join(k.encode() for k in _KEYS) + rb')"\s*:\s*(\d+)')
_TAIL = 64  # longer than any key and its number, so a match split across chunks is still found


class UsageScanner:
    """Feed it response bytes; `input_tokens` is the provider's whole prompt count (cached included)."""

    def __init__(self) -> None:
        self._seen: dict[bytes, int] = {}
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        data = self._tail + chunk
        for match in _PATTERN.finditer(data):
            self._seen[match.group(1)] = int(match.group(2))
        self._tail = data[-_TAIL:]

    def __call__(self, chunk: bytes) -> bytes:
        """As mitmproxy's stream callable: observe each chunk and pass it on unchanged."""
        self.feed(chunk)
        return chunk

    @property
    def input_tokens(self) -> int | None:
        seen = self._seen
        if b"input_tokens" in seen:
            # Anthropic counts cache reads and writes apart from input_tokens; the prompt is their sum.
            return seen[b"input_tokens"] + seen.get(b"cache_read_input_tokens", 0) + seen.get(b"cache_creation_input_tokens", 0)
        for key in (b"prompt_tokens", b"promptTokenCount", b"prompt_eval_count", b"inputTokens"):
            if key in seen:
                return seen[key]
        return None


def input_tokens_of(body: bytes) -> int | None:
    scanner = UsageScanner()
    scanner.feed(body)
    return scanner.input_tokens
