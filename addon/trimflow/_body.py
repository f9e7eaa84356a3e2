"""A parsed request body that leaves its large strings where they are.

Images make up nearly all of an agent's request, and a full JSON parse copies every byte of them
into Python strings only for most to be written back unchanged. Instead, the body is split into a
skeleton, in which each long plain string (a base64 payload, a data URL) is replaced by a short
stub, and the spans of those strings in the original bytes. Only the skeleton is parsed; a value
written from it gets each surviving stub's original bytes spliced back in, so kept payloads are
never decoded, re-encoded or escaped, and a body's bytes stay exactly as the client wrote them.

A stub is the string's first characters (so a data URL keeps its header, and a format can read its
type) followed by a private-use marker and the span's index. A format module sees a stub as an
ordinary string; `ParsedBody.resolve` turns the media it finds back into a `Payload` that reads the
original bytes on demand.

The body's bytes are scanned only at memchr speed, once for quotes: a payload is not searched for
escapes up front, since most are never read (kept ones are spliced back as written, dropped ones
only have their first kilobytes sniffed). A read that meets an escape gets the decoded string.

Most of what an agent sends is text: tool results of JSON, code, diffs, where a quote is escaped
every few bytes. orjson parses that whole faster than any walk over its quotes in Python, so a body
with no run of unescaped text long enough to be a payload is parsed whole without a walk, and the
walk gives up (at a bounded cost) once a body proves to hold more strings or escaped quotes than a
payload-heavy body has.

Anything unusual falls back to parsing the whole body: a skeleton that holds the marker characters
(raw or escaped), that orjson cannot parse, or text-heavy as above.

Writing a value gives a `Written`: the pieces of the new body, joined only when its bytes are
asked for, so the caller picks the thread that pays for the copy (see `Written`).
"""

from __future__ import annotations

from typing import Any

from . import _jsoncodec
from ._media import Media

MARK, END = "\ue000", "\ue001"  # private-use characters: never in a provider's API text
_MARK_BYTES, _END_BYTES = MARK.encode(), END.encode()
MIN_PAYLOAD = 4096  # strings shorter than this stay in the skeleton
HEAD = 600  # characters of a payload kept in its stub: more than any data URL header
_QUOTE, _BACKSLASH = b'"', 0x5C
CLEAN_BLOCK = MIN_PAYLOAD // 2  # see has_clean_block
_COMPARED = 1 << 16  # bytes compared at a time when two payloads are compared
_ESCAPED_MARKS = (b"\\ue00", b"\\uE00")  # U+E000..U+E00F written as JSON escapes


class Payload:
    """A long string of the original body, read in place. Acts as the `str` it stands for where
    the engine needs it: length, slices, equality.

    Its length is the string as written in the body, which is what it weighs in a body that splices
    it back. A slice is always the decoded string's: the written bytes while no escape comes before
    the slice's end (the usual case, found at memchr speed), else cut from the whole string decoded
    once. The stub's head holds no escape, so offsets within it (a data URL's header) agree either way.
    """

    __slots__ = ("body", "start", "end", "_decoded")

    def __init__(self, body: bytes, start: int, end: int) -> None:
        self.body, self.start, self.end = body, start, end
        self._decoded: str | None = None

    def __len__(self) -> int:
        return self.end - self.start

    def __getitem__(self, key: slice) -> str:
        start, stop, step = key.indices(self.end - self.start)
        if step != 1:
            raise ValueError("a payload slice has no step")
        stop = max(start, stop)
        # The head has no escape: a read starting in it need only check itself.
        checked_from = self.start + min(start, HEAD)
        if self._decoded is None and self.body.find(b"\\", checked_from, self.start + stop) < 0:
            # latin-1 maps every byte to one character, as base64 text is; it never fails on junk.
            return self.body[self.start + start : self.start + stop].decode("latin-1")
        return self.decoded()[key]

    def decoded(self) -> str:
        """The whole string with its escapes decoded, as a full parse would give it."""
        if self._decoded is None:
            raw = memoryview(self.body)[self.start - 1 : self.end + 1]  # with its quotes: a JSON string
            self._decoded = _jsoncodec.loads(bytes(raw), exact=False)[0]  # a string: no number to keep
        return self._decoded

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Payload):
            if len(other) != len(self):
                return False
            # In slices: stops at the first that differs, and never copies a whole payload at once
            # (a memoryview comparison would, but goes item by item: ~100x slower).
            a, b, n = self.body, other.body, len(self)
            return all(
                a[self.start + k : self.start + min(n, k + _COMPARED)] == b[other.start + k : other.start + min(n, k + _COMPARED)]
                for k in range(0, n, _COMPARED)
            )
        if isinstance(other, str):
            return len(other) == len(self) and self[:] == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash((len(self), self[:64], self[-64:]))


class Written:
    """A body written from a ParsedBody: its pieces (kept payloads are views of the original bytes)
    and its length, joined into bytes on the first `bytes()`.

    The engine may run in a worker thread (a slow request), and a large buffer allocated there comes
    from that thread's malloc arena: measured in mitmdump, that slowed the proxy's reading of the next
    request bodies by a third. Leaving the one large copy to the caller's thread avoids it.
    """

    __slots__ = ("_pieces", "_size", "_joined")

    def __init__(self, pieces: list[memoryview | bytes]) -> None:
        self._pieces: list[memoryview | bytes] | None = pieces
        self._size = sum(len(piece) for piece in pieces)
        self._joined: bytes | None = None

    def __len__(self) -> int:
        return self._size

    def __bytes__(self) -> bytes:
        if self._joined is None:
            assert self._pieces is not None
            pieces, self._pieces = self._pieces, None
            self._joined = pieces[0] if len(pieces) == 1 and isinstance(pieces[0], bytes) else b"".join(pieces)
        return self._joined


class ParsedBody:
    """The parsed body, and how to write or measure a value built from it.

    Parsed with `exact=False`, a body may hold an integer orjson read as a float (_jsoncodec): nothing but a
    write needs it exact, and a body that changes nothing is forwarded as it came. `make_exact` must then come
    before any value to write is built from `parsed`.
    """

    def __init__(
        self,
        parsed: Any,
        fallback: bool,
        body: bytes,
        spans: list[tuple[int, int]] | None = None,
        source: bytes | None = None,
        exact: bool = True,
    ) -> None:
        self.parsed, self.fallback, self.body = parsed, fallback, body
        self._spans = spans or []
        self._splices = bool(self._spans)  # whether a write splices payloads back (else `parsed` holds them)
        self._source = body if source is None else source  # the bytes `parsed` came from: the skeleton or the body
        self._exact = exact or fallback

    def make_exact(self) -> None:
        """Parse again with the exact parser if `parsed` may hold an integer read as a float. A skeleton is then
        replaced by the whole body parsed (its stubs still resolve), so a write never depends on how the standard
        library escapes the marker."""
        if self._exact:
            return
        self._exact = True
        if _jsoncodec.may_hold_big_integer(self._source):
            self.parsed, self.fallback = _jsoncodec.loads(self.body)
            self._splices = False

    @property
    def is_skeleton(self) -> bool:
        return bool(self._spans)

    def dumps(self, value: Any) -> bytes:
        return bytes(self.write(value))

    def write(self, value: Any) -> Written:
        """The value written as the body, not yet joined (see Written)."""
        assert self._exact, "make_exact() comes before a value to write is built"
        out = _jsoncodec.dumps(value, self.fallback)
        if not self._splices or _MARK_BYTES not in out:
            return Written([out])
        return Written(self._splice(out))

    def size(self, value: Any) -> int:
        """len(self.dumps(value)), without joining the spliced bytes."""
        return len(self.write(value))

    def unstubbed(self, out: bytes) -> bytes:
        """JSON written from `parsed` (orjson, as is) with each stub's string as written in the body: what writing the
        whole body parsed gives, but for escapes the client writes otherwise than orjson past a payload's head."""
        if not self._spans or _MARK_BYTES not in out:
            return out
        return bytes(Written(self._splice(out)))

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
        # Built directly: dataclasses.replace costs ~10x more, per image of every request. The Payload stands in for
        # the str `data` (length, slices, equality are all the engine reads), which the type of Media.data cannot say.
        payload = Payload(self.body, start, stop)
        return Media(media.kind, media.path, payload, media.data_offset, media.declared_mime, media.detail, media.origin)  # type: ignore[arg-type]


def parse(body: bytes, whole_max: int | None = None, exact: bool = True) -> ParsedBody | None:
    """The body as a ParsedBody: a skeleton where that is safe and worth it, else fully parsed.

    None when the body would need a full parse and is larger than `whole_max` bytes. With `exact=False`, the
    check for integers orjson would read as floats waits for `ParsedBody.make_exact` (see ParsedBody).
    Raises _jsoncodec.BodyError for a body that is not JSON, as a full parse would.
    """
    split = _split(body) if len(body) >= 4 * MIN_PAYLOAD else None
    if split is not None:
        skeleton, spans = split
        try:
            parsed, fallback = _jsoncodec.loads(skeleton, exact)
        except _jsoncodec.BodyError:
            parsed, fallback = None, True
        # The standard library writes the marker as an escape with ensure_ascii: keep to orjson.
        if not fallback:
            return ParsedBody(parsed, False, body, spans, skeleton, exact)
    if whole_max is not None and len(body) > whole_max:
        return None
    parsed, fallback = _jsoncodec.loads(body, exact)
    return ParsedBody(parsed, fallback, body, exact=exact)


def _split(body: bytes) -> tuple[bytes, list[tuple[int, int]]] | None:
    """The skeleton and the spans of its stubbed strings, or None when it would not pay off or the
    body already holds a marker character outside its payloads."""
    if not has_clean_block(body):
        return None  # no payload to leave out: the whole parse is the cheaper one
    # Each step of the walk below is a little Python: a string, or a quote inside one that an escape
    # hides. A payload-heavy body takes few steps per byte; a text-heavy one, where JSON, code and
    # diffs escape a quote every few bytes, is parsed whole instead, at C speed.
    budget = 64 + len(body) // 512
    find = body.find
    pieces: list[bytes] = []
    spans: list[tuple[int, int]] = []
    copied = i = 0
    while (opening := find(_QUOTE, i)) >= 0:
        budget -= 1
        closing = find(_QUOTE, opening + 1)
        while closing > 0 and body[closing - 1] == _BACKSLASH and _escaped(body, closing, opening + 1):
            budget -= 1
            if budget < 0:
                return None
            closing = find(_QUOTE, closing + 1)
        if budget < 0:
            return None
        if closing < 0:
            return None  # unterminated: the full parse says why
        start = opening + 1
        if closing - start >= MIN_PAYLOAD:
            head = body[start : start + HEAD]
            if head.isascii() and b"\\" not in head:
                pieces += [body[copied:start], head, _MARK_BYTES, str(len(spans)).encode(), _END_BYTES]
                spans.append((start, closing))
                copied = closing
        i = closing + 1
    if not spans:
        return None
    pieces.append(body[copied:])
    skeleton = b"".join(pieces)
    # Only the skeleton can hold a marker that is not a stub's: payloads stay out of it.
    stubs = len(spans)
    if skeleton.count(_MARK_BYTES) != stubs or skeleton.count(_END_BYTES) != stubs or any(e in skeleton for e in _ESCAPED_MARKS):
        return None
    return skeleton, spans


def has_clean_block(body: bytes, start: int = 0) -> bool:
    """Whether an aligned block of CLEAN_BLOCK bytes (from `start`) holds neither a quote nor a backslash.

    Every string the skeleton would leave out as written (MIN_PAYLOAD bytes or more with no escape: a
    base64 payload, a data URL) holds such a block, since MIN_PAYLOAD >= 2 * CLEAN_BLOCK - 1. Text,
    whose lines end in an escaped newline, seldom does. A memchr per block: this costs a small part of
    the full parse it chooses."""
    find = body.find
    for block in range(start, len(body) - CLEAN_BLOCK + 1, CLEAN_BLOCK):
        end = block + CLEAN_BLOCK
        if find(_QUOTE, block, end) < 0 and find(b"\\", block, end) < 0:
            return True
    return False


def _escaped(body: bytes, quote: int, floor: int) -> bool:
    """Whether the quote at `quote`, inside a string whose text starts at `floor`, is escaped: an odd
    run of backslashes before it. A long run is measured at C speed, never byte by byte in Python."""
    if body[quote - 2] != _BACKSLASH or quote - 2 < floor:
        return True  # one backslash: the usual \"
    reach = 64
    while True:
        start = max(floor, quote - reach)
        run = quote - start - len(body[start:quote].rstrip(b"\\"))
        if run < quote - start or start == floor:
            return run % 2 == 1
        reach *= 8
