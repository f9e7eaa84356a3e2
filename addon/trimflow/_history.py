"""A request's conversation as digests (`History`): what tells one conversation from another, and its images' keys.

Agents send the whole history on every turn. A request continues a conversation when its history
extends the history of that conversation's last request: the same earlier messages in the same order,
new ones after (or none: a retry). An explicit session id (SESSION_HEADERS, SESSION_FIELDS, Anthropic's
`metadata.user_id`) names the conversation instead; a Responses request with `previous_response_id` continues
the conversation whose answer had that id. The engine digests each request into a `History`
(trimflow._engine: Outcome.history); trimflow._conversation numbers it.

What is hashed, per message: its JSON as sent, with its media parts left out and text placeholders
trimflow wrote left out (so a session recorded behind trimflow, pruned, digests as the client sent it),
without `cache_control` (agents move their cache breakpoints every turn), and with each payload the
skeleton left in the body (trimflow._body: a string of 4 KiB or more) as written there, so a body digests alike
parsed as a skeleton or whole. Media are left out before anything is hashed; what is hashed is JSON orjson writes
and payload bytes read in place, at C speed.

An image is known by its key (`image_key`): its payload's length and first and last KiB, read without the bytes
in between. That tells PNG screenshots apart (a PNG ends with the Adler-32 of all its pixel rows and the CRC-32
of its last chunk), but not always JPEG or WebP ones that differ by a cursor: those can have the same length and
ends (docs/how-it-works.md). So each image also has the CRC-32 of its whole payload (`image_crc`, 0 for a PNG),
read only where the conversation's memory needs it (`Images.crc`).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import re
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson

from ._body import Payload
from ._media import JsonPath, Media
from ._placeholder import PLACEHOLDER_PREFIX
from ._seen_prefixes import Match, SeenPrefixes, Written, key_of
from .formats import HistoryParts

# Headers agents use for a session id (lower case).
SESSION_HEADERS = ("x-claude-code-session-id", "session_id", "session-id", "x-session-id", "conversation_id", "x-conversation-id")
# Body fields that name a conversation across turns.
SESSION_FIELDS = ("prompt_cache_key", "conversation")
# Body fields that define the tools (Bedrock Converse: toolConfig), part of the prompt a provider caches.
TOOLS_FIELDS = ("tools", "toolConfig")

_PLACEHOLDER_BYTES = PLACEHOLDER_PREFIX.encode()
_VOLATILE_KEY = "cache_control"
# What a digest leaves out, as JSON writes it: cache breakpoints (Anthropic's cache_control, Bedrock's cachePoint) and
# trimflow's placeholders. Long needles of few letters: found at memchr-like speed in text.
_LOOKED_FOR = (b"cache_control", b"cachePoint")
_RESPONSE_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,256})"')
_RESPONSE_ID_SCAN = 4096  # a Responses answer names its id first (the object's first key, or response.created's)

_IMAGE_ENDS = 1024  # characters of an image payload's start and end its key reads
_PNG = "iVBORw0KGgo"  # a PNG's signature as base64

# JSON written from a parsed body with each payload's stub replaced by the payload as written (trimflow._body).
Unstub = Callable[[bytes], bytes]


def digest(*parts: bytes, size: int = 8) -> bytes:
    """8 bytes (or `size`) of BLAKE2b over the parts: what the history and the conversation table keep."""
    return hashlib.blake2b(b"\0".join(parts), digest_size=size).digest()


def short_id(*parts: bytes) -> str:
    """A conversation id: 4 bytes as 8 hex digits, never the id or text it comes from."""
    return digest(*parts, size=4).hex()


def session_key(headers: Mapping[str, str], request: Mapping[str, Any]) -> str | None:
    """The conversation an explicit session id names (headers first, then body fields), else None."""
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return short_id(b"h", name.encode(), value.encode())
    for name in SESSION_FIELDS:
        value = request.get(name)
        if isinstance(value, str) and value:
            return short_id(b"b", name.encode(), value.encode())
    metadata = request.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        # Claude Code puts its session id into metadata.user_id.
        return short_id(b"u", metadata["user_id"].encode())
    return None


def response_id_of(head: bytes) -> str | None:
    """The id a Responses answer gives itself (a JSON body, or an event stream's response.created), from its first bytes."""
    found = _RESPONSE_ID.search(head, 0, _RESPONSE_ID_SCAN)
    return found.group(1).decode("utf-8", "replace") if found else None


def image_key(media: Media) -> bytes:
    """8 bytes of an image's payload length and its first and last KiB (as written, like a payload's stub above):
    no read in between. A remote image has no payload: every one has the same key. (A payload with JSON escapes,
    `\\/`, reads otherwise parsed whole than as a skeleton: should its body's parse change, it counts as new.)"""
    data, start = media.data, media.data_offset
    if data is None:
        return digest(b"remote")
    if isinstance(data, Payload):
        body, first, end = data.body, data.start + start, data.end
        return digest(str(end - first).encode(), body[first : first + _IMAGE_ENDS], body[max(first, end - _IMAGE_ENDS) : end])
    # Parsed whole: the string's ends stand for the bytes a skeleton would read (base64 has no escape).
    end = len(data)
    head, tail = data[start : start + _IMAGE_ENDS], data[max(start, end - _IMAGE_ENDS) :]
    return digest(str(end - start).encode(), head.encode("utf-8", "surrogatepass"), tail.encode("utf-8", "surrogatepass"))


def image_crc(media: Media) -> int:
    """The CRC-32 of an image's whole payload as written (read in place), where its key may not tell it apart:
    0 for a PNG, whose last bytes (in its key) hold checksums of all of it, and for a remote image."""
    data, start = media.data, media.data_offset
    if data is None or data[start : start + len(_PNG)] == _PNG:
        return 0
    if isinstance(data, Payload):
        return zlib.crc32(memoryview(data.body)[data.start + start : data.end])
    return zlib.crc32(data[start:].encode("utf-8", "surrogatepass"))


class Images:
    """A request's images as its memory tells them apart: each one's key (image_key), in the order they sit, and its
    CRC-32 (image_crc), read only when asked for (a new image, or one whose key is not the only one)."""

    __slots__ = ("keys", "_crc", "_crcs")

    def __init__(self, keys: Sequence[bytes] = (), crc: Callable[[int], int] | None = None) -> None:
        self.keys = tuple(keys)
        self._crc = crc
        self._crcs: dict[int, int] = {}

    @classmethod
    def of(cls, media: Sequence[Media]) -> Images:
        return cls([image_key(m) for m in media], lambda i: image_crc(media[i]))

    def __len__(self) -> int:
        return len(self.keys)

    def crc(self, i: int) -> int:
        if i not in self._crcs:
            self._crcs[i] = self._crc(i) if self._crc is not None else 0
        return self._crcs[i]


def _default_lifetime() -> float:
    return 0.0


class History:
    """A request's conversation as digests: its host, session id (hashed), head (system prompt, instructions), tool
    definitions (`tools`: 0 when none) and one digest per message, oldest first; `origin`, a stable digest of the head and first message, seeds a new
    conversation's id. `previous_response` stands for a Responses `previous_response_id`. `images`: the request's
    images (Images); none when the caller keeps no memory. `asked_lifetime()`: the seconds of prompt-cache lifetime the
    request asks for beyond its provider's default (0: none), read from the body only when asked (the engine sets it).

    The head and message digests are Python's keyed hash of the message's canonical JSON: 64 bits, the same for
    the same message within a process (they are compared, never stored or written)."""

    __slots__ = ("host", "session", "head", "messages", "origin", "previous_response", "images", "tools", "asked_lifetime", "_prefixes")

    def __init__(
        self,
        host: str,
        session: str | None,
        head: int,
        messages: Sequence[int],
        origin: bytes = b"",
        previous_response: bytes | None = None,
        images: Images | None = None,
        tools: int = 0,
    ) -> None:
        self.host, self.session, self.head, self.tools = host, session, head, tools
        self.messages = tuple(messages)
        self.origin, self.previous_response = origin, previous_response
        self.images = images if images is not None else Images()
        self.asked_lifetime: Callable[[], float] = _default_lifetime
        self._prefixes: list[int] | None = None

    @property
    def prefixes(self) -> list[int]:
        """One value per prefix of the history (the first message, the first two, ... all): equal values, equal
        prefixes (a 64-bit chain: process-local, and only a conversation's last one is kept)."""
        if self._prefixes is None:
            value, out = hash(("host", self.host)), []
            for message in self.messages:
                value = hash((value, message))
                out.append(value)
            self._prefixes = out
        return self._prefixes

    @property
    def tip(self) -> int:
        """The whole history's prefix value (the host's for a history with no message)."""
        return self.prefixes[-1] if self.messages else hash(("host", self.host))


def history_of(
    host: str,
    headers: Mapping[str, str],
    parts: HistoryParts,
    media_paths: Iterable[JsonPath],
    unstub: Unstub | None,
    images: Images | None = None,
    *,
    body: bytes | None = None,
    spliced: Match | None = None,
) -> History:
    """A request's History: `parts` is its format's view of the body (formats' `history`), `media_paths` every
    media part the format found (left out of the digests), `unstub` puts the payloads a skeleton left out back
    into JSON written from it (trimflow._body: ParsedBody.unstubbed; None for a body parsed whole, which has none),
    `images` are its images and `body` the bytes `parts` were parsed from (None: not known). `spliced`: `parts` were
    parsed from `body` spliced (trimflow._seen_prefixes: SeenPrefixes.splice), as this match cut it."""
    root, paths = len(parts.path), list(media_paths)
    media: dict[int, list[JsonPath]] = {}
    for path in paths:
        index = path[root] if len(path) > root else None
        if isinstance(index, int) and tuple(path[:root]) == parts.path:
            media.setdefault(index, []).append(tuple(path[root + 1 :]))
    canonical = _Canonical(unstub)
    head = canonical.of(parts.head, None)
    items = parts.items
    text_body = body is not None and unstub is None and not paths and bool(items)
    if spliced is not None and not text_body:
        raise ValueError("a spliced body is a text body parsed whole")
    if text_body:
        # A text body parsed whole: the messages it shares with a body seen before keep their digests (trimflow._seen_prefixes).
        assert body is not None
        first = canonical.message(items[0], None)
        origin = _origin(head, first)
        key = key_of(host, body)
        if spliced is not None:
            # Its items are the first message and those after the ones spliced out, which stand as None here.
            items, match = [items[0], *itertools.repeat(None, spliced.spliced), *items[1:]], spliced
        else:
            match = SEEN.match(key, body, len(items), parts.path)
        messages, _ = canonical.digests(items, media, match.digests, first)
        SEEN.remember(key, body, items, messages, _written(items), match, items_path=parts.path)
    else:
        messages, first = canonical.digests(items, media)
        origin = _origin(head, first)
    previous = parts.request.get("previous_response_id")
    tools = next((parts.request[name] for name in TOOLS_FIELDS if parts.request.get(name)), None)
    return History(
        host,
        session_key(headers, parts.request),
        hash(head),
        messages,
        origin,
        digest(b"r", previous.encode()) if isinstance(previous, str) and previous else None,
        images,
        _tools_digest(tools) if tools is not None else 0,
    )


def _origin(head: bytes, first: bytes) -> bytes:
    return hashlib.blake2b(head + b"\0" + first, digest_size=8).digest()


def _written(items: list[Any]) -> Written:
    def written(i: int) -> bytes | None:
        try:
            return orjson.dumps(items[i])
        except (orjson.JSONEncodeError, TypeError):
            return None

    return written


def _tools_digest(tools: Any) -> int:
    """The tool definitions' digest, without the cache breakpoints an agent moves (`cache_control` among a tool's own
    keys, Bedrock's `cachePoint` entries), looked for at that level only: where agents put them, and a walk of the whole
    definitions would cost more than the rest of the history on a large tool list."""
    if isinstance(tools, dict) and isinstance(tools.get("tools"), list):  # Bedrock's toolConfig
        tools = {**tools, "tools": _without_breakpoints(tools["tools"])}
    elif isinstance(tools, list):
        tools = _without_breakpoints(tools)
    return hash(_dumps(tools))


def _without_breakpoints(tools: list[Any]) -> list[Any]:
    return [{k: v for k, v in tool.items() if k != _VOLATILE_KEY} if isinstance(tool, dict) else tool for tool in tools if not _left_out(tool)]


class _Canonical:
    """A message (or head) as the JSON its digest is taken of, as the module's docstring says."""

    def __init__(self, unstub: Unstub | None) -> None:
        self._unstub: Unstub = unstub if unstub is not None else _as_written
        self._whole = unstub is None

    def of(self, item: Any, media: list[JsonPath] | None, raw: bytes | None = None) -> bytes:
        if raw is None:
            if media:
                item = _without(item, media)
            try:
                raw = orjson.dumps(item)
            except (orjson.JSONEncodeError, TypeError):
                return _dumps(self._canonical(item))
        # Usually nothing to leave out: the message's JSON as it is, each payload as written.
        if _looked_into(raw):
            return self._unstub(_dumps(self._canonical(_without(item, media) if media else item)))
        return self._unstub(raw)

    def digests(
        self, items: list[Any], media: Mapping[int, list[JsonPath]], shared: Sequence[int] = (), first: bytes | None = None
    ) -> tuple[list[int], bytes]:
        """Every message's digest, and the first message's JSON (the origin's; `first` when given). `shared`: the
        digests of the first messages, known already. Each message is written and hashed in turn: its JSON is hashed
        while the CPU's cache still holds it, and its buffer is reused for the next one (writing them all, then hashing
        them, would read every byte back from memory)."""
        known = len(shared)
        if self._whole and not media:
            # A body parsed whole, no media in it (a text body): a message's JSON as orjson writes it is what is hashed,
            # unless it holds what a digest leaves out. Agents send the whole history every turn: a message whose JSON
            # was seen clean before is clean again, and only the others (the new ones) take the general path.
            checked = known or int(first is not None)  # digests known to be what the general path gives
            try:
                if known or not items:
                    digests = list(shared)
                else:
                    first = first if first is not None else orjson.dumps(items[0])
                    digests = [hash(first)]
                digests += [hash(orjson.dumps(item)) for item in itertools.islice(items, len(digests), None)]
            except (orjson.JSONEncodeError, TypeError):
                pass
            else:
                for i in range(checked, len(digests)):
                    if digests[i] not in _CLEAN:
                        raw = self.message(items[i], None)
                        digests[i] = hash(raw)
                        if i == 0:
                            first = raw
                return digests, first if first is not None else b""
        digests = list(shared)
        for i in range(known, len(items)):
            raw = self.message(items[i], media.get(i))
            digests.append(hash(raw))
            if i == 0:
                first = raw
        return digests, first if first is not None else b""

    def message(self, item: Any, media: list[JsonPath] | None) -> bytes:
        """A message's JSON as its digest reads it."""
        try:
            raw = orjson.dumps(_without(item, media) if media else item)
        except (orjson.JSONEncodeError, TypeError):
            return self.of(item, media)
        # hash(raw) is kept in the bytes object: the digest reads it again for free.
        return self._unstub(raw) if hash(raw) in _CLEAN or _clean(raw) else self.of(item, media, raw)

    def _canonical(self, node: Any) -> Any:
        if isinstance(node, dict):
            return {key: self._canonical(value) for key, value in node.items() if key != _VOLATILE_KEY}
        if isinstance(node, list):
            return [self._canonical(value) for value in node if not _left_out(value)]
        if isinstance(node, str):
            return _without_placeholder(node)
        return node


def _as_written(raw: bytes) -> bytes:
    return raw


def _without_placeholder(text: str) -> str:
    # Ollama's placeholders join the message's text, after a newline.
    cut = text.find(PLACEHOLDER_PREFIX)
    if cut == 0:
        return ""
    if cut > 0 and text[cut - 1] == "\n":
        return text[: cut - 1]
    return text


SEEN = SeenPrefixes()  # the text bodies seen lately, whose messages a later body may share
_CLEAN: dict[int, None] = {}  # hashes of message JSON found holding nothing to leave out, the oldest first
_CLEAN_MAX = 1 << 14  # about 1.5 MiB


def _clean(raw: bytes) -> bool:
    """Whether `raw` holds nothing a digest leaves out; remembered when it does not (bounded: the oldest forgotten)."""
    if _looked_into(raw):
        return False
    _CLEAN[hash(raw)] = None
    if len(_CLEAN) > _CLEAN_MAX:
        # Worker threads digest too: another may have taken the oldest first.
        with contextlib.suppress(KeyError, RuntimeError, StopIteration):
            del _CLEAN[next(iter(_CLEAN))]
    return True


def _looked_into(raw: bytes) -> bool:
    """Whether JSON text may hold what a digest leaves out: a placeholder, a cache breakpoint."""
    return _LOOKED_FOR[0] in raw or _LOOKED_FOR[1] in raw or _PLACEHOLDER_BYTES in raw


def _left_out(value: Any) -> bool:
    """A part a digest leaves out: a placeholder trimflow wrote, or a Bedrock cache breakpoint (moved every turn)."""
    if not isinstance(value, dict):
        return False
    if len(value) == 1 and "cachePoint" in value:
        return True
    return any(isinstance(v, str) and v.startswith(PLACEHOLDER_PREFIX) for v in value.values())


def _without(node: Any, paths: list[JsonPath]) -> Any:
    """`node` without the parts at `paths` (relative to it); only the containers on those paths are copied."""
    drop: set[Any] = set()
    below: dict[Any, list[JsonPath]] = {}
    for path in paths:
        if not path:
            return None  # the message is itself a media part
        if len(path) == 1:
            drop.add(path[0])
        else:
            below.setdefault(path[0], []).append(path[1:])
    if isinstance(node, list):
        return [_without(value, below[i]) if i in below else value for i, value in enumerate(node) if i not in drop]
    if isinstance(node, dict):
        return {key: _without(value, below[key]) if key in below else value for key, value in node.items() if key not in drop}
    return node


def _dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError):  # integers over 64 bits, NaN: still stable
        return repr(value).encode("utf-8", "surrogatepass")
