"""A parsed request body that leaves its large strings where they are.

Images make up nearly all of an agent's request, and a full JSON parse copies every byte of them
into Python strings only for most to be written back unchanged. Instead, the body is split into a
skeleton, in which each long plain string (a base64 payload, a data URL) is replaced by a short
stub, and the spans of those strings in the original bytes. Only the skeleton is parsed; a value
written from it gets each surviving stub's original bytes spliced back in, so kept payloads are
never decoded, re-encoded or escaped, and a body's bytes stay exactly as the client wrote them.

A stub is the string's first characters (so a data URL keeps its header, and a format can read its
type) followed by a private-use marker and the span's index. A format module sees a stub as an
ordinary string; `Document.resolve` turns the media it finds back into a `Payload` that reads the
original bytes on demand.

Anything unusual falls back to parsing the whole body: a body that already holds the marker
character, a skeleton that orjson cannot parse, or more strings than a payload-heavy body has.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from . import _jsoncodec
from .formats import Media

MARK, END = "\ue000", "\ue001"  # private-use characters: never in a provider's API text
_MARK_BYTES, _END_BYTES = MARK.encode(), END.encode()
MIN_PAYLOAD = 4096  # strings shorter than this stay in the skeleton
HEAD = 600  # characters of a payload kept in its stub: more than any data URL header
_QUOTE, _BACKSLASH = b'"', 0x5C
_LEAD = b"\xee"


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Payload:
    """A long string of the original body, read in place. Acts as the `str` it stands for where
    the engine needs it: length, slices, equality."""

    body: bytes
    start: int
    end: int

    def __len__(self) -> int:
        return self.end - self.start

    def __getitem__(self, key: slice) -> str:
        start, stop, step = key.indices(self.end - self.start)
        if step != 1:
            raise ValueError("a payload slice has no step")
        # latin-1 maps every byte to one character, as base64 text is; it never fails on junk.
        return self.body[self.start + start : self.start + max(start, stop)].decode("latin-1")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Payload):
            mine, theirs = memoryview(self.body)[self.start : self.end], memoryview(other.body)[other.start : other.end]
            return mine == theirs  # compares in place, no copy
        if isinstance(other, str):
            return len(other) == len(self) and self[:] == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash((len(self), self[:64], self[-64:]))


class Document:
    """The parsed body, and how to write or measure a value built from it."""

    def __init__(self, parsed: Any, fallback: bool, body: bytes, spans: list[tuple[int, int]] | None = None) -> None:
        self.parsed, self.fallback, self.body = parsed, fallback, body
        self._spans = spans or []

    @property
    def is_skeleton(self) -> bool:
        return bool(self._spans)

    def dumps(self, value: Any) -> bytes:
        out = _jsoncodec.dumps(value, self.fallback)
        if not self._spans or _MARK_BYTES not in out:
            return out
        return b"".join(self._splice(out))

    def size(self, value: Any) -> int:
        """len(self.dumps(value)), without building the spliced bytes."""
        out = _jsoncodec.dumps(value, self.fallback)
        if not self._spans or _MARK_BYTES not in out:
            return len(out)
        return sum(len(piece) for piece in self._splice(out))

    def _splice(self, out: bytes) -> list[memoryview | bytes]:
        """`out` with each stub's text replaced by the original string's bytes."""
        view, source = memoryview(out), memoryview(self.body)
        pieces: list[memoryview | bytes] = []
        pos = 0
        while (mark := out.find(_MARK_BYTES, pos)) >= 0:
            opening = out.rfind(_QUOTE, pos, mark)  # the head holds no quote: it was a plain string
            end = out.find(_END_BYTES, mark)
            start, stop = self._spans[int(out[mark + len(_MARK_BYTES) : end])]
            pieces += [view[pos : opening + 1], source[start:stop]]
            pos = end + len(_END_BYTES)
        pieces.append(view[pos:])
        return pieces

    def resolve(self, media: Media) -> Media:
        """The media with its stub replaced by the payload it stands for."""
        data = media.data
        if not self._spans or not isinstance(data, str) or not data.endswith(END):
            return media
        mark = data.rfind(MARK)
        start, stop = self._spans[int(data[mark + 1 : -1])]
        return dataclasses.replace(media, data=Payload(self.body, start, stop))  # type: ignore[arg-type]


def parse(body: bytes) -> Document:
    """The body as a Document: a skeleton where that is safe and worth it, else fully parsed.

    Raises _jsoncodec.BodyError for a body that is not JSON, as a full parse would.
    """
    split = _split(body) if len(body) >= 4 * MIN_PAYLOAD else None
    if split is not None:
        skeleton, spans = split
        try:
            parsed, fallback = _jsoncodec.loads(skeleton)
        except _jsoncodec.BodyError:
            parsed, fallback = None, True
        # The standard library writes the marker as an escape with ensure_ascii: keep to orjson.
        if not fallback:
            return Document(parsed, False, body, spans)
    parsed, fallback = _jsoncodec.loads(body)
    return Document(parsed, fallback, body)


def _split(body: bytes) -> tuple[bytes, list[tuple[int, int]]] | None:
    """The skeleton and the spans of its stubbed strings, or None when it would not pay off."""
    # Both markers encode with lead byte 0xEE (U+E000..U+EFFF, all private use); one byte is found at
    # memchr speed, where a three-byte search of 16 MB of base64 takes ~10x longer.
    if _LEAD in body:
        return None
    # A payload-heavy body has few strings per byte; a text-heavy one is parsed whole instead.
    budget = 64 + len(body) // 512
    find = body.find
    pieces: list[bytes] = []
    spans: list[tuple[int, int]] = []
    copied = i = 0
    while (opening := find(_QUOTE, i)) >= 0:
        budget -= 1
        if budget < 0:
            return None
        closing = find(_QUOTE, opening + 1)
        while closing > 0 and body[closing - 1] == _BACKSLASH:
            # Escaped unless the backslashes before it pair up.
            k = closing - 1
            while body[k] == _BACKSLASH:
                k -= 1
            if (closing - 1 - k) % 2 == 0:
                break
            closing = find(_QUOTE, closing + 1)
        if closing < 0:
            return None  # unterminated: the full parse says why
        start = opening + 1
        if closing - start >= MIN_PAYLOAD and find(b"\\", start, closing) < 0:
            head = body[start : start + HEAD]
            if head.isascii():
                pieces += [body[copied:start], head, _MARK_BYTES, str(len(spans)).encode(), _END_BYTES]
                spans.append((start, closing))
                copied = closing
        i = closing + 1
    if not spans:
        return None
    pieces.append(body[copied:])
    return b"".join(pieces), spans
