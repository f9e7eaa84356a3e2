"""A model of prompt caching as each provider documents it: what a request reads from the cache, writes to it, and pays in full.

Pure Python: no mitmproxy, no I/O, and the time comes from an injected clock, so a test or a replay of a
recorded session runs at its own simulated time. The fake provider (`FakeProvider(cache=True)`) and the
policy runner beside the bench (tests/research/policy_runner.py) both use it.

A request is a sequence of units in prefix order (Anthropic: tools, system, messages; a content block or
tool is one unit), each with a digest of its canonical JSON (sorted keys, `cache_control` left out, the
section and the message it opens included) and its tokens by trimflow's estimator (trimflow._tokens:
text at ~4 bytes a token, each image by its provider's formula from the dimensions its header gives). A
prefix is known by a chained digest, so matching a prefix of N units is one dictionary lookup.

What each provider does, from its documentation (read 2026-11-24):

- Anthropic Messages, also on Vertex and as Bedrock InvokeModel bodies
  (https://platform.claude.com/docs/en/build-with-claude/prompt-caching): explicit `cache_control`
  breakpoints on tool, system and message blocks, at most 4 (a 5th is a 400, `MAX_BREAKPOINTS_TEXT`); a
  top-level `cache_control` (automatic caching) puts one on the last block. A breakpoint writes one
  entry, the prefix up to and including its block. A read looks for an entry at the breakpoint, then at
  each earlier block boundary back to `LOOKBACK_BLOCKS` blocks before it, breakpoint by breakpoint from
  the last: the longest live entry found is read. Everything from there to the last breakpoint is
  written (cache_creation_input_tokens), what follows the last breakpoint is neither
  (input_tokens). A breakpoint whose prefix is shorter than the model's minimum cacheable length writes
  nothing. Entries live 5 minutes, or an hour with `"ttl": "1h"`, and each read refreshes the entry.
- OpenAI chat and Responses (https://platform.openai.com/docs/guides/prompt-caching): automatic prefix
  caching of prompts of 1,024 tokens or more; `cached_tokens` is the longest cached prefix rounded down
  to 1,024 + 128n tokens (prompt_tokens includes it). The docs say a prefix stays cached for 5 to 10
  minutes of inactivity, at most an hour: modelled as 5 minutes, refreshed on every use;
  `prompt_cache_retention: "24h"` (extended retention) keeps it 24 hours.
- Gemini 2.5 and later, implicit caching (https://ai.google.dev/gemini-api/docs/caching): automatic
  prefix caching above a minimum of 2,048 tokens (2.5 Flash and Pro) or 4,096 (Gemini 3 and later);
  `cachedContentTokenCount`, included in promptTokenCount. The docs give no lifetime and no step: modelled
  as OpenAI's 5 minutes, token-exact. Earlier models have no implicit caching.
- Bedrock Converse (https://docs.aws.amazon.com/bedrock/latest/userguide/prompt-caching.html): `cachePoint`
  blocks in system, messages and toolConfig.tools mark a breakpoint after the block before them, and
  Claude models then cache as above; `cacheReadInputTokens`, `cacheWriteInputTokens`, and inputTokens
  for the rest.

What the model leaves out: a block that changed only inside counts as changed from its start (a
provider matches tokens, the model matches units), entries are never evicted before they expire, and
caches are per model (the scope), never shared between organisations, which one model does not need.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from .._imageinfo import sniff_media
from .._tokens import UNKNOWN_IMAGE_TOKENS, image_tokens, text_tokens
from ..formats import FORMATS, IMAGE, JsonPath, Media, counted_turn_path

__all__ = [
    "ANTHROPIC_MINIMUMS",
    "EXPLICIT",
    "IMPLICIT",
    "LOOKBACK_BLOCKS",
    "MAX_BREAKPOINTS",
    "MAX_BREAKPOINTS_TEXT",
    "CacheModel",
    "CacheUsage",
    "Caching",
    "Prompt",
    "TooManyBreakpoints",
    "Unit",
    "caching_for",
    "prompt_of",
]

EXPLICIT = "explicit"  # breakpoints the request marks (Anthropic, Bedrock)
IMPLICIT = "implicit"  # the provider caches every prompt's prefix (OpenAI, Gemini)

MAX_BREAKPOINTS = 4
# Anthropic's answer to a fifth breakpoint, as users report it (status 400, invalid_request_error).
MAX_BREAKPOINTS_TEXT = "A maximum of 4 blocks with cache_control may be provided. Found {found}."
LOOKBACK_BLOCKS = 20  # block boundaries a read checks per breakpoint: its own and the 19 before it ("about 20 blocks")
FIVE_MINUTES = 300.0
ONE_HOUR = 3600.0
OPENAI_STEP = 128
OPENAI_MINIMUM = 1024

# Anthropic's minimum cacheable prompt length by model, first match wins (the docs' table); others: 1,024.
ANTHROPIC_MINIMUMS: tuple[tuple[re.Pattern[str], int], ...] = (
    (re.compile(r"claude-opus-4-[56]|claude-haiku-4-5"), 4096),
    (re.compile(r"claude-3-5-haiku|claude-3-haiku|claude-haiku-3"), 2048),
)
# Gemini implicit caching: from 2.5 on, with these minimums (first match wins).
_GEMINI_MINIMUMS: tuple[tuple[re.Pattern[str], int], ...] = (
    (re.compile(r"gemini-2\.5"), 2048),
    (re.compile(r"gemini-(?:[3-9]|\d\d)"), 4096),
)


@dataclass(frozen=True, slots=True)
class Caching:
    """How one provider caches for one model: `kind` (EXPLICIT or IMPLICIT), the minimum cacheable
    prefix in tokens, the lifetime of an entry (IMPLICIT; an EXPLICIT breakpoint says its own), the step
    cached counts are rounded down to (IMPLICIT)."""

    provider: str  # anthropic, openai, gemini, bedrock: the answer's usage fields follow it
    kind: str
    minimum: int
    ttl: float = FIVE_MINUTES
    step: int = 1


def caching_for(fmt: str, model: str | None) -> Caching | None:
    """The caching of wire format `fmt` for `model`, or None where the provider caches nothing implicitly
    and has no breakpoints (Ollama, Gemini before 2.5)."""
    name = (model or "").lower()
    if fmt == "anthropic":
        minimum = next((m for pattern, m in ANTHROPIC_MINIMUMS if pattern.search(name)), 1024)
        return Caching("anthropic", EXPLICIT, minimum)
    if fmt == "bedrock-converse":
        minimum = next((m for pattern, m in ANTHROPIC_MINIMUMS if pattern.search(name)), 1024)
        return Caching("bedrock", EXPLICIT, minimum)
    if fmt in ("openai-chat", "openai-responses"):
        return Caching("openai", IMPLICIT, OPENAI_MINIMUM, FIVE_MINUTES, OPENAI_STEP)
    if fmt == "gemini":
        found = next((m for pattern, m in _GEMINI_MINIMUMS if pattern.search(name)), None)
        return None if found is None else Caching("gemini", IMPLICIT, found)
    return None


@dataclass(frozen=True, slots=True)
class Unit:
    """One block of a prompt: where it is, its digest (canonical JSON without cache_control), its tokens."""

    path: JsonPath
    digest: bytes
    tokens: int
    image_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Prompt:
    """A request as the cache sees it: units in prefix order, the breakpoints (unit index, TTL) it marks,
    and the count of `cache_control` markers (a limit counts markers, not distinct blocks)."""

    caching: Caching
    scope: str  # entries are per provider and model
    units: tuple[Unit, ...]
    breakpoints: tuple[tuple[int, float], ...] = ()
    markers: int = 0
    ttl: float | None = None  # IMPLICIT: the request's own retention (OpenAI's prompt_cache_retention), else the provider's

    @property
    def tokens(self) -> int:
        return sum(u.tokens for u in self.units)


@dataclass(frozen=True, slots=True)
class CacheUsage:
    """What one request cost in prompt tokens, as the provider accounts for them.

    `prompt_tokens` is the whole prompt; `cache_read_tokens` came from the cache, `cache_write_tokens` were
    written to it (EXPLICIT only: OpenAI and Gemini charge no write), the rest (`uncached_tokens`) neither.
    `stored_tokens` is the prefix this request leaves in the cache for the next one, for `stored_ttl` seconds.
    """

    prompt_tokens: int
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0  # of the writes, those to one-hour entries
    image_tokens: int = 0  # of the prompt
    cached_image_tokens: int = 0  # of the reads
    stored_tokens: int = 0
    stored_ttl: float = 0.0

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cache_read_tokens - self.cache_write_tokens


class TooManyBreakpoints(ValueError):
    """More `cache_control` markers than the provider accepts: the request is refused (HTTP 400)."""

    def __init__(self, found: int) -> None:
        self.found = found
        super().__init__(MAX_BREAKPOINTS_TEXT.format(found=found))


@dataclass(slots=True)
class _Entry:
    expires: float
    ttl: float


class CacheModel:
    """The provider side: entries by (scope, prefix digest), each with its expiry on `clock` (seconds).

    `use(prompt)` answers one request and updates the entries as the provider would. Safe to share
    between threads (the fake provider answers each connection in its own).
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._entries: dict[tuple[str, bytes], _Entry] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def request(self, fmt: str, path: str, body: Any) -> CacheUsage | None:
        """`use` for a request body of wire format `fmt` sent to `path`; None when the provider caches nothing there."""
        prompt = prompt_of(fmt, path, body)
        return None if prompt is None else self.use(prompt)

    def use(self, prompt: Prompt) -> CacheUsage:
        """Raises TooManyBreakpoints for an EXPLICIT prompt with more than MAX_BREAKPOINTS markers."""
        if prompt.caching.kind == EXPLICIT and prompt.markers > MAX_BREAKPOINTS:
            raise TooManyBreakpoints(prompt.markers)
        with self._lock:
            now = self.clock()
            self._expire(now)
            if prompt.caching.kind == EXPLICIT:
                return self._explicit(prompt, now)
            return self._implicit(prompt, now)

    def _expire(self, now: float) -> None:
        gone = [key for key, entry in self._entries.items() if entry.expires <= now]
        for key in gone:
            del self._entries[key]

    def _explicit(self, prompt: Prompt, now: float) -> CacheUsage:
        units, scope, minimum = prompt.units, prompt.scope, prompt.caching.minimum
        total, images = _sums(units)
        if not prompt.breakpoints:
            return CacheUsage(total, image_tokens=images)
        keys, cum, cum_images = _prefixes(units)
        hit = self._lookback(scope, keys, prompt.breakpoints)
        read = cum[hit] if hit >= 0 else 0
        stored, stored_ttl = read, 0.0
        if hit >= 0:
            read_entry = self._entries[(scope, keys[hit])]
            read_entry.expires = now + read_entry.ttl  # a read refreshes the entry it read
            stored_ttl = read_entry.ttl
        for position, _ in prompt.breakpoints:
            if position < hit and (earlier := self._entries.get((scope, keys[position]))) is not None:
                earlier.expires = now + earlier.ttl  # an earlier breakpoint inside what was read is used too
        written = written_1h = 0
        start = read
        for position, ttl in prompt.breakpoints:
            if position <= hit or cum[position] < minimum:
                continue
            self._entries[(scope, keys[position])] = _Entry(now + ttl, ttl)
            written += cum[position] - start
            if ttl > FIVE_MINUTES:
                written_1h += cum[position] - start
            start, stored, stored_ttl = cum[position], cum[position], ttl
        cached_images = cum_images[hit] if hit >= 0 else 0
        return CacheUsage(total, read, written, written_1h, images, cached_images, stored, stored_ttl)

    def _lookback(self, scope: str, keys: list[bytes], breakpoints: tuple[tuple[int, float], ...]) -> int:
        """The unit index of the longest live entry a read finds, or -1: from the last breakpoint back."""
        for position, _ in reversed(breakpoints):
            for at in range(position, max(position - LOOKBACK_BLOCKS, -1), -1):
                if (scope, keys[at]) in self._entries:
                    return at
        return -1

    def _implicit(self, prompt: Prompt, now: float) -> CacheUsage:
        units, scope, caching = prompt.units, prompt.scope, prompt.caching
        total, images = _sums(units)
        if total < caching.minimum:
            return CacheUsage(total, image_tokens=images)
        keys, cum, cum_images = _prefixes(units)
        hit = next((i for i in range(len(units) - 1, -1, -1) if (scope, keys[i]) in self._entries), -1)
        matched = cum[hit] if hit >= 0 else 0
        read = matched // caching.step * caching.step if matched >= caching.minimum else 0
        ttl = prompt.ttl or caching.ttl
        for i, key in enumerate(keys):
            if cum[i] >= caching.minimum:
                self._entries[(scope, key)] = _Entry(now + ttl, ttl)  # the whole prompt is cached, its use refreshes it
        cached_images = min(cum_images[hit], read) if read else 0
        stored = total // caching.step * caching.step
        return CacheUsage(total, read, 0, 0, images, cached_images, stored, ttl)


def _sums(units: tuple[Unit, ...]) -> tuple[int, int]:
    return sum(u.tokens for u in units), sum(u.image_tokens for u in units)


def _prefixes(units: tuple[Unit, ...]) -> tuple[list[bytes], list[int], list[int]]:
    """Per unit index: the chained digest of the prefix ending there, its tokens, its image tokens."""
    keys: list[bytes] = []
    cum: list[int] = []
    cum_images: list[int] = []
    key, tokens, image = b"", 0, 0
    for unit in units:
        key = hashlib.blake2b(key + unit.digest, digest_size=16).digest()
        tokens += unit.tokens
        image += unit.image_tokens
        keys.append(key)
        cum.append(tokens)
        cum_images.append(image)
    return keys, cum, cum_images


# --- requests as units --------------------------------------------------------------------------


def prompt_of(fmt: str, path: str, body: Any, media: list[Media] | None = None) -> Prompt | None:
    """The prompt of a request body of wire format `fmt` sent to `path`, or None when nothing is cached
    there (a token count, Ollama, a model without caching, a body that is not a JSON object). `media`:
    what the format's find_media found in `body`, when the caller has it already."""
    if not isinstance(body, dict) or fmt not in FORMATS or counted_turn_path(fmt, path) is not None:
        return None
    module = FORMATS[fmt]
    model = module.model(body, path)
    caching = caching_for(fmt, model)
    if caching is None:
        return None
    builder = _Builder(fmt, model, module.find_media(body) if media is None else media)
    retention = None
    if fmt == "anthropic":
        _anthropic(builder, body)
    elif fmt == "bedrock-converse":
        _bedrock(builder, body)
    elif fmt == "openai-chat":
        builder.items("tools", ("tools",), body.get("tools"), ())
        builder.items("messages", ("messages",), body.get("messages"), ("content",))
        retention = body.get("prompt_cache_retention")
    elif fmt == "openai-responses":
        request, root = _responses_request(body)
        builder.scalar("instructions", (*root, "instructions"), request.get("instructions"))
        builder.items("tools", (*root, "tools"), request.get("tools"), ())
        builder.items("input", (*root, "input"), request.get("input"), ("content", "output"))
        retention = request.get("prompt_cache_retention")
    elif fmt == "gemini":
        request, root = _gemini_request(body)
        for key in ("systemInstruction", "system_instruction"):
            system = request.get(key)
            if isinstance(system, dict):
                builder.items("system", (*root, key, "parts"), system.get("parts"), ())
        builder.items("tools", (*root, "tools"), request.get("tools"), ())
        builder.items("contents", (*root, "contents"), request.get("contents"), ("parts",))
    ttl = ONE_HOUR * 24 if retention == "24h" else None
    scope = f"{caching.provider}:{model or '-'}"
    return Prompt(caching, scope, tuple(builder.units), tuple(builder.breakpoints), builder.markers, ttl)


def _responses_request(body: dict[str, Any]) -> tuple[dict[str, Any], JsonPath]:
    nested = body.get("response")
    if body.get("type") == "response.create" and isinstance(nested, dict) and "input" not in body:
        return nested, ("response",)
    return body, ()


def _gemini_request(body: dict[str, Any]) -> tuple[dict[str, Any], JsonPath]:
    wrapped = body.get("generateContentRequest")
    if "contents" not in body and isinstance(wrapped, dict):
        return wrapped, ("generateContentRequest",)
    return body, ()


def _anthropic(builder: _Builder, body: dict[str, Any]) -> None:
    # Anthropic's prefix order: tools, system, messages.
    builder.items("tools", ("tools",), body.get("tools"), (), marks=True)
    system = body.get("system")
    if isinstance(system, list):
        builder.items("system", ("system",), system, (), marks=True)
    else:
        builder.scalar("system", ("system",), system)
    builder.items("messages", ("messages",), body.get("messages"), ("content",), marks=True)
    automatic = body.get("cache_control")
    if isinstance(automatic, dict) and builder.units:
        builder.mark(len(builder.units) - 1, automatic)


def _bedrock(builder: _Builder, body: dict[str, Any]) -> None:
    tool_config = body.get("toolConfig")
    if isinstance(tool_config, dict):
        builder.items("tools", ("toolConfig", "tools"), tool_config.get("tools"), (), cache_points=True)
    builder.items("system", ("system",), body.get("system"), (), cache_points=True)
    builder.items("messages", ("messages",), body.get("messages"), ("content",), cache_points=True)


class _Builder:
    """Collects a prompt's units and breakpoints, section by section, in prefix order."""

    def __init__(self, fmt: str, model: str | None, media: list[Media]) -> None:
        self.fmt, self.model = fmt, model
        self.media: dict[JsonPath, list[Media]] = {}
        for m in media:
            self.media.setdefault(m.path, []).append(m)
        self.units: list[Unit] = []
        self.breakpoints: list[tuple[int, float]] = []
        self.markers = 0

    def scalar(self, section: str, path: JsonPath, value: Any) -> None:
        if value is not None and value != "":
            self._add(section, path, value, value)

    def items(
        self,
        section: str,
        path: JsonPath,
        items: Any,
        content_keys: tuple[str, ...],
        *,
        marks: bool = False,
        cache_points: bool = False,
    ) -> None:
        """Each item of a list as units: an item whose content (the first of `content_keys` holding a list)
        is a list gives a unit per part, the first carrying the item's other fields; any other item is one unit.
        `marks`: `cache_control` in a part marks a breakpoint there; `cache_points`: a Bedrock `cachePoint`
        part marks one at the unit before it."""
        if isinstance(items, str):
            self.scalar(section, path, items)
            return
        if not isinstance(items, list):
            return
        for i, item in enumerate(items):
            key = next((k for k in content_keys if isinstance(item, dict) and isinstance(item.get(k), list)), None)
            if key is None:
                self._part(section, (*path, i), item, item, marks, cache_points)
                continue
            head = {k: v for k, v in item.items() if k != key}
            parts = item[key]
            if not parts:
                self._add(section, (*path, i), {"head": head}, head)
            first = True
            for j, part in enumerate(parts):
                shown = {"head": head, "part": part} if first else {"part": part}
                if self._part(section, (*path, i, key, j), shown, part, marks, cache_points):
                    first = False

    def _part(self, section: str, path: JsonPath, shown: Any, part: Any, marks: bool, cache_points: bool) -> bool:
        """Adds one part; False for a Bedrock cachePoint, which marks the unit before it instead."""
        if cache_points and isinstance(part, dict) and isinstance(part.get("cachePoint"), dict):
            self.markers += 1
            if self.units:
                self._breakpoint(len(self.units) - 1, part["cachePoint"])
            return False
        self._add(section, path, shown, part)
        if marks:
            for control in _cache_controls(part):
                self.mark(len(self.units) - 1, control)
        return True

    def mark(self, index: int, control: Any) -> None:
        self.markers += 1
        self._breakpoint(index, control)

    def _breakpoint(self, index: int, control: Any) -> None:
        ttl = ONE_HOUR if isinstance(control, dict) and control.get("ttl") == "1h" else FIVE_MINUTES
        for n, (at, old) in enumerate(self.breakpoints):
            if at == index:
                self.breakpoints[n] = (at, max(old, ttl))
                return
        self.breakpoints.append((index, ttl))
        self.breakpoints.sort()

    def _add(self, section: str, path: JsonPath, shown: Any, part: Any) -> None:
        canonical = orjson.dumps(_without_cache_control(shown), option=orjson.OPT_SORT_KEYS)
        digest = hashlib.blake2b(section.encode() + b"\0" + canonical, digest_size=16).digest()
        media = [m for p, found in self.media.items() if p[: len(path)] == path for m in found]
        media_tokens = sum(self._media_tokens(m) for m in media)
        image_share = sum(self._media_tokens(m) for m in media if m.kind == IMAGE)
        text = text_tokens(len(canonical) - sum(m.wire_bytes + _encoding_name(m) for m in media))
        self.units.append(Unit(path, digest, text + media_tokens, image_share))

    def _media_tokens(self, media: Media) -> int:
        if media.kind != IMAGE:
            return UNKNOWN_IMAGE_TOKENS  # a document or audio: no formula from its header, the estimator's large guess
        info = None if media.remote else sniff_media(media)
        width, height = (info.width, info.height) if info is not None else (None, None)
        return image_tokens(self.fmt, self.model, width, height, media.detail)


def _encoding_name(media: Media) -> int:
    """The characters of a medium's encoding name declared beside its data (`png` of Anthropic's `image/png`
    media_type, Gemini's mime_type, Bedrock's format; a data URL's is in its data): billed with the medium, not as
    text, so the same image costs the same as PNG or WebP."""
    if media.data_offset or not media.declared_mime:
        return 0
    return len(media.declared_mime.rpartition("/")[2])


def _cache_controls(node: Any) -> Iterator[Any]:
    """Every `cache_control` value in a block, nested ones (inside a tool_result) included."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "cache_control":
                yield value
            elif isinstance(value, (dict, list)):
                yield from _cache_controls(value)
    elif isinstance(node, list):
        for value in node:
            yield from _cache_controls(value)


def _without_cache_control(node: Any) -> Any:
    """`node` without any `cache_control` key (agents move their breakpoints; the content is what is cached)."""
    if isinstance(node, dict):
        if not any(key == "cache_control" or isinstance(value, (dict, list)) for key, value in node.items()):
            return node
        return {key: _without_cache_control(value) for key, value in node.items() if key != "cache_control"}
    if isinstance(node, list):
        return [_without_cache_control(value) for value in node]
    return node
