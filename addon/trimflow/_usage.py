"""The usage a provider reports (prompt, cache reads and writes, output), read from a JSON, SSE, NDJSON or
event-stream response.

A scanner sees the response chunk by chunk (so a stream passes through untouched and unbuffered)
and keeps only a short tail between chunks. It looks for each API's usage keys by pattern, which
works alike for whole JSON bodies, SSE `data:` lines, Gemini's streamed JSON array and Bedrock's
binary event-stream frames. The last value seen wins: streams send final counts last.

What each API reports, and what the scanner makes of it:

    API                 prompt (all of it)                    cache read                     cache write                   output
    Anthropic, Bedrock  input_tokens + cache_read_input_tokens cache_read_input_tokens        cache_creation_input_tokens   output_tokens
    InvokeModel           + cache_creation_input_tokens
    OpenAI chat         prompt_tokens                         prompt_tokens_details          -                             completion_tokens
                                                                .cached_tokens
    OpenAI Responses    input_tokens                          input_tokens_details           -                             output_tokens
                                                                .cached_tokens
    Gemini              promptTokenCount                      cachedContentTokenCount        -                             candidatesTokenCount
                                                                                                                             + thoughtsTokenCount
    Bedrock Converse    inputTokens + cacheReadInputTokens    cacheReadInputTokens           cacheWriteInputTokens         outputTokens
                          + cacheWriteInputTokens
    Ollama              prompt_eval_count                     -                              -                             eval_count

A count the answer does not carry is None ("-" above: OpenAI and Gemini never report a write).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A key is matched only where it opens a JSON key (not escaped inside model output text), and whole:
# "prompt_eval_count" is not "eval_count", "cache_creation" (Anthropic's per-TTL breakdown) is not
# "cache_creation_input_tokens".
_KEYS = (
    "prompt_tokens",  # OpenAI chat
    "completion_tokens",
    "input_tokens",  # Responses (cached included), Anthropic (cached apart)
    "output_tokens",
    "cache_read_input_tokens",  # Anthropic
    "cache_creation_input_tokens",
    "promptTokenCount",  # Gemini (cached included)
    "cachedContentTokenCount",
    "candidatesTokenCount",
    "thoughtsTokenCount",  # Gemini bills thinking as output, apart from the candidates
    "prompt_eval_count",  # Ollama
    "eval_count",
    "inputTokens",  # Bedrock Converse (cached apart)
    "outputTokens",
    "cacheReadInputTokens",
    "cacheWriteInputTokens",
)
_CACHED = b"cached_tokens"  # OpenAI's cached prompt, read only inside one of:
_DETAILS = (b"prompt_tokens_details", b"input_tokens_details")  # chat, Responses
_CACHE_DETAILS = b"cacheDetails"  # Bedrock's per-TTL breakdown of the write, entries with an "inputTokens" each


def _trie(words: list[str]) -> bytes:
    """A regex matching exactly one of `words`, factored by common prefix: at each quote of the answer
    the engine tries a branch per first letter rather than one per key."""
    groups: dict[str, list[str]] = {}
    for word in words:
        groups.setdefault(word[:1], []).append(word[1:])
    branches = [re.escape(first).encode() + _trie(rests) for first, rests in sorted(groups.items()) if first]
    if "" in groups:
        return b"(?:" + b"|".join(branches) + b")?" if branches else b""
    return b"(?:" + b"|".join(branches) + b")" if len(branches) > 1 else branches[0]


# A key and its count (groups 1 and 2), or a key that opens one of the objects above (group 2 None).
_PATTERN = re.compile(
    rb'(?<!\\)"(' + _trie([*_KEYS, _CACHED.decode(), *(d.decode() for d in _DETAILS), _CACHE_DETAILS.decode()]) + rb')"\s*:\s*(?:(\d+)|[{\[])'
)
_TAIL = 64  # longer than any key and its number, so a match split across chunks is still found


@dataclass(frozen=True, slots=True)
class Usage:
    """One answer's counts; None where the answer does not say."""

    input_tokens: int | None = None  # the whole prompt, cached and written included
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    output_tokens: int | None = None

    def record_fields(self) -> dict[str, int | None]:
        """The counts as a metrics record names them (trimflow._record.Record.usage_*)."""
        return {
            "usage_input_tokens": self.input_tokens,
            "usage_cache_read_tokens": self.cache_read_tokens,
            "usage_cache_write_tokens": self.cache_write_tokens,
            "usage_output_tokens": self.output_tokens,
        }


class UsageScanner:
    """Feed it response bytes; read the counts (each None until seen) or `usage` for all four."""

    def __init__(self) -> None:
        self._seen: dict[bytes, int] = {}
        self._tail = b""
        # Where prompt_tokens_details / input_tokens_details, and Bedrock's cacheDetails, end in the next
        # chunk's data (which starts with the tail): None while still open; 0 or less when not in the tail.
        self._details_end: int | None = 0
        self._cache_details_end: int | None = 0

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        data = self._tail + chunk
        seen = self._seen
        # Two kinds of object are read by where a key sits, not by its name alone: "cached_tokens" counts
        # only inside OpenAI's prompt_tokens_details / input_tokens_details (another API's key of that name
        # is no cached prompt), and an "inputTokens" inside Bedrock's cacheDetails array is a write, not the
        # prompt. Each lasts up to its closing bracket, which may come chunks later; and the tail, scanned
        # again with the next chunk, may hold the inside of one whose opening has left it.
        details_end = _closing(data, b"}") if self._details_end is None else self._details_end
        skip_end = _closing(data, b"]") if self._cache_details_end is None else self._cache_details_end
        for match in _PATTERN.finditer(data):
            key, count = match.groups()
            if count is not None:
                if key == _CACHED:
                    if match.start() < details_end:
                        seen[key] = int(count)
                elif key != b"inputTokens" or match.start() >= skip_end:
                    seen[key] = int(count)
            elif key == _CACHE_DETAILS:
                skip_end = _closing(data, b"]", match.end())
            elif key in _DETAILS:
                details_end = _closing(data, b"}", match.end())
        self._tail = data[-_TAIL:]
        shift = len(data) - len(self._tail)  # where the tail starts in data
        self._details_end = None if details_end == len(data) else details_end - shift
        self._cache_details_end = None if skip_end == len(data) else skip_end - shift

    def __call__(self, chunk: bytes) -> bytes | list[bytes]:
        """As mitmproxy's stream callable: observe each chunk and pass it on unchanged (a subclass may pass on
        a list of chunks: mitmproxy sends each; an empty bytes would end a chunked answer early)."""
        self.feed(chunk)
        return chunk

    @property
    def input_tokens(self) -> int | None:
        """The provider's whole prompt count, cache reads and writes included."""
        seen = self._seen
        if b"input_tokens" in seen:
            # Anthropic counts cache reads and writes apart from input_tokens; the prompt is their sum.
            return seen[b"input_tokens"] + seen.get(b"cache_read_input_tokens", 0) + seen.get(b"cache_creation_input_tokens", 0)
        if b"inputTokens" in seen:  # Bedrock Converse, likewise
            return seen[b"inputTokens"] + seen.get(b"cacheReadInputTokens", 0) + seen.get(b"cacheWriteInputTokens", 0)
        for key in (b"prompt_tokens", b"promptTokenCount", b"prompt_eval_count"):
            if key in seen:
                return seen[key]
        return None

    @property
    def cache_read_tokens(self) -> int | None:
        seen = self._seen
        for key in (b"cache_read_input_tokens", _CACHED, b"cachedContentTokenCount", b"cacheReadInputTokens"):
            if key in seen:
                return seen[key]
        return None

    @property
    def cache_write_tokens(self) -> int | None:
        seen = self._seen
        for key in (b"cache_creation_input_tokens", b"cacheWriteInputTokens"):
            if key in seen:
                return seen[key]
        return None

    @property
    def output_tokens(self) -> int | None:
        seen = self._seen
        if b"candidatesTokenCount" in seen or b"thoughtsTokenCount" in seen:
            return seen.get(b"candidatesTokenCount", 0) + seen.get(b"thoughtsTokenCount", 0)
        for key in (b"output_tokens", b"completion_tokens", b"outputTokens", b"eval_count"):
            if key in seen:
                return seen[key]
        return None

    @property
    def usage(self) -> Usage:
        return Usage(self.input_tokens, self.cache_read_tokens, self.cache_write_tokens, self.output_tokens)


def _closing(data: bytes, bracket: bytes, start: int = 0) -> int:
    """Where the object or array open at `start` closes in data (its nested ones hold no such bracket
    here: counts only); len(data) when it has not closed yet."""
    end = data.find(bracket, start)
    return end if end >= 0 else len(data)


def usage_of(body: bytes) -> Usage:
    """The counts of a whole answer."""
    scanner = UsageScanner()
    scanner.feed(body)
    return scanner.usage


def input_tokens_of(body: bytes) -> int | None:
    scanner = UsageScanner()
    scanner.feed(body)
    return scanner.input_tokens
