"""The messages a text body shares with a body seen before, found from its raw bytes (`SeenPrefixes`).

Agents send the whole history on every turn, so a turn's body starts with the bytes of the last one's: the same
earlier messages, written the same way, then the new ones. A body remembers where runs of its messages end in its raw
bytes (`bounds`: its last few messages' ends, and some earlier ones), and the hash of the bytes from each bound to the
next. A later body whose bytes up to a bound hash the same holds the same messages up to there (a JSON prefix parses
to the same values wherever it is followed by the same structure). Two things follow:

- `splice`: before the body is parsed, the messages it shares (but the first) are cut out of it, leaving a small
  document of the same shape: its first message, then its new ones, and every other field. The engine reads that
  instead of the whole body when it holds no media (trimflow._engine): the shared messages were read before and held
  none. The first message stays, for the conversation's origin (trimflow._history).
- `match`: the digests of the shared messages (trimflow._history) are taken as they are; only the new messages are
  written and hashed.

Only the bytes after the last bound a body shares are hashed for the body after it: the bounds a body shares with
the one before carry over (at most MAX_BOUNDS; past that they are hashed again as one). The bodies seen last are kept
as they came, up to MAX_RETAINED bytes in all: a body is compared with those bytes (at memory speed) rather than
hashed (Python's hash is a fraction of that speed); the bodies past that budget keep their hashes only.

The ends are found by looking for each of the last messages as orjson writes it, from the end of the body: where a
client writes JSON otherwise (spaces, other escapes), none is found and that body is read and digested in full, as
before. A found end is taken only where what follows it is the next message's comma or the array's closing bracket;
the first message's, only where the messages' key opens the array just before it.

The last few ends are kept, not only the last: Anthropic clients move a cache breakpoint from the last message to
the new last one, so the last messages of a turn are seldom written the same in the next.

Bodies are looked up by their host and first bytes (`key_of`), then by what they share. Bounded: at most MAX_BODIES
bodies and MAX_DIGESTS message digests over all of them (the oldest forgotten first), PER_KEY bodies per key, and
MAX_RETAINED bytes of bodies kept as they came; a lookup compares or hashes at most WORK bytes per byte of the body
(bodies crafted to open alike make it give up, and the body is read in full).
The hashes are Python's keyed hash, like the digests they stand for: 64 bits, process-local, never written.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ._body import has_clean_block

ENDS_KEPT = 4  # the last messages whose ends a body remembers
MAX_BOUNDS = 16  # bounds a body remembers: more are hashed again as one
PER_KEY = 32  # bodies remembered per key: conversations that open alike (an agent's sub-agents, one project's sessions)
MAX_DIGESTS = 1 << 15  # message digests kept over all bodies
MAX_BODIES = 256  # bodies kept over all keys: with MAX_DIGESTS, at most about 2.5 MiB (docs/performance.md)
MAX_RETAINED = 16 << 20  # bytes of the bodies seen last kept as they came, to compare with
OPENING = 256  # a body's first bytes, in its key
WORK = 8  # bytes compared or hashed against the bodies seen, at most, per byte of a body looked up (a few parses of it)
_TAIL = 32  # bytes before a bound compared before anything is hashed
_SEPARATORS = b" \t\r\n"
_BEFORE_FIRST = 256  # bytes before the first message the messages' key is looked for in

# A key (key_of): the body's host and the hash of its first bytes.
Key = tuple[str, int]
# A path to the messages in the body (trimflow.formats: HistoryParts.path).
ItemsPath = tuple[Any, ...]
# The i-th message as orjson writes it (None: it cannot).
Written = Callable[[int], bytes | None]


class Match(NamedTuple):
    """What a body shares with one seen before: the digests of its first messages, and the bounds it shares (each
    with its message count and the hash of the bytes from the bound before); where its first message ends (None: not
    found) and where its messages sit."""

    digests: tuple[int, ...] = ()
    bounds: tuple[int, ...] = ()
    counts: tuple[int, ...] = ()
    hashes: tuple[int, ...] = ()
    first_end: int | None = None
    items_path: ItemsPath = ()

    @property
    def spliced(self) -> int:
        """The messages `splice` cuts out of the body: those shared, but the first."""
        return self.counts[-1] - 1 if self.counts else 0


class Spliced(NamedTuple):
    """A body with the messages it shares cut out (`match.spliced` of them, after its first): `document`."""

    document: bytes
    match: Match


class _Seen(NamedTuple):
    bounds: tuple[int, ...]  # raw offsets where a message ends, ascending; the last is the last message's end
    counts: tuple[int, ...]  # messages up to each bound
    hashes: tuple[int, ...]  # hash of the bytes from the bound before (the body's start for the first) to each bound
    tails: tuple[bytes, ...]  # the _TAIL bytes before each bound
    digests: tuple[int, ...]  # every message's digest
    first_end: int | None  # where the first message ends (None: not found)
    items_path: ItemsPath


_NOTHING = Match()


def key_of(host: str, body: bytes) -> Key:
    """The key a body is remembered and looked up by."""
    return host, hash(body[:OPENING])


class SeenPrefixes:
    """Bodies seen lately, by key: what a new body shares with them (`match`, `splice`) and what it leaves for the
    next one (`remember`). Safe to call from several threads."""

    def __init__(
        self, max_digests: int = MAX_DIGESTS, max_bodies: int = MAX_BODIES, per_key: int = PER_KEY, max_retained: int = MAX_RETAINED
    ) -> None:
        self._max_digests, self._max_bodies, self._per_key, self._max_retained = max_digests, max_bodies, per_key, max_retained
        self._seen: dict[Key, list[_Seen]] = {}
        self._kept = self._bodies = 0
        # The bytes of the bodies seen last, by the id of what each left (held with it, so the id stays its), oldest first.
        self._retained: dict[int, tuple[_Seen, bytes]] = {}
        self._retained_bytes = 0
        self._lock = threading.Lock()

    def match(self, key: Key, body: bytes, count: int | None = None, items_path: ItemsPath | None = None) -> Match:
        """What `body` (holding `count` messages at `items_path`, when known) shares with the bodies seen under `key`:
        the most messages."""
        with self._lock:
            candidates = [(seen, self._retained.get(id(seen), (seen, None))[1]) for seen in self._seen.get(key, ())]
        best, budget = _NOTHING, WORK * len(body) + _TAIL * len(candidates)
        for seen, retained in candidates:
            if items_path is not None and seen.items_path != items_path:
                continue
            if budget <= 0:
                break  # bodies crafted to open alike cost a request no more than a few reads of it
            found, work = _shared(seen, retained, body, count)
            budget -= work
            if len(found.digests) > len(best.digests):
                best = found
                if len(best.digests) == count:
                    break
        return best

    def splice(self, key: Key, body: bytes) -> Spliced | None:
        """`body` with the messages it shares with a body seen under `key` cut out, but the first (None: it shares
        fewer than two, or its first message's end is not known)."""
        match = self.match(key, body)
        if match.spliced < 1 or match.first_end is None or has_clean_block(body, match.bounds[-1]):
            return None  # (a clean block: what follows may hold a payload, an image, and is read in full)
        return Spliced(body[: match.first_end] + body[match.bounds[-1] :], match)

    def remember(
        self, key: Key, body: bytes, items: Sequence[Any], digests: Sequence[int], written: Written, match: Match = _NOTHING, *, items_path: ItemsPath
    ) -> None:
        """Remember `body` for the next one under `key`: its messages `items` (those it shares may stand as None: they
        are not read), their `digests`, `written(i)` (the i-th message as orjson writes it, None if it cannot), what it
        shares with an earlier body (`match`) and where its messages sit (`items_path`)."""
        seen = _seen_of(body, items, tuple(digests), written, match, items_path)
        if seen is None:
            return
        with self._lock:
            before = self._seen.pop(key, [])
            self._count(before, -1)
            # A body this one extends (the same messages, digested: breakpoints moved or not) is this conversation's past.
            bodies = [seen, *(other for other in before if seen.digests[: len(other.digests)] != other.digests)][: self._per_key]
            self._let_go([other for other in before if not any(other is kept for kept in bodies)])
            self._seen[key] = bodies  # the newest key last: the oldest are dropped first
            self._count(bodies, 1)
            while (self._kept > self._max_digests or self._bodies > self._max_bodies) and self._seen:
                dropped = self._seen.pop(next(iter(self._seen)))
                self._count(dropped, -1)
                self._let_go(dropped)
            if key in self._seen and len(body) <= self._max_retained:
                self._retained[id(seen)] = (seen, body)
                self._retained_bytes += len(body)
            while self._retained_bytes > self._max_retained:
                self._retained_bytes -= len(self._retained.pop(next(iter(self._retained)))[1])

    def _count(self, bodies: list[_Seen], sign: int) -> None:
        self._kept += sign * sum(len(seen.digests) for seen in bodies)
        self._bodies += sign * len(bodies)

    def _let_go(self, bodies: list[_Seen]) -> None:
        """The bytes of bodies no longer remembered."""
        for seen in bodies:
            retained = self._retained.pop(id(seen), None)
            if retained is not None:
                self._retained_bytes -= len(retained[1])

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()
            self._retained.clear()
            self._kept = self._bodies = self._retained_bytes = 0

    @property
    def kept(self) -> int:
        """The message digests kept over all bodies."""
        return self._kept

    @property
    def retained(self) -> int:
        """The bytes of the bodies kept as they came."""
        return self._retained_bytes


@functools.lru_cache(maxsize=16)
def _array_key(name: str) -> re.Pattern[bytes]:
    """The messages' key opening an array, as JSON writes it: a second one is a second array of messages."""
    return re.compile(rb'"%s"\s*:\s*\[' % re.escape(name.encode()))


@functools.lru_cache(maxsize=16)
def _array_opening(name: str) -> re.Pattern[bytes]:
    """The messages' key opening an array, right before its first item."""
    return re.compile(rb'"%s"\s*:\s*\[\s*\Z' % re.escape(name.encode()))


def _shared(seen: _Seen, retained: bytes | None, body: bytes, count: int | None) -> tuple[Match, int]:
    """The bounds of `seen` that `body` shares, and the bytes compared, hashed or searched to know it: the bytes up to
    them the same as the body `seen` was left by (`retained`: those bytes, when kept), or else, in order, each one's
    tail the same, then the bytes since the bound before hashed the same. Nothing if the messages' key opens an array
    after them: a second array of messages there, which a parser takes instead of the first. (A key written with
    escapes is not looked for: such a body misleads only its own conversation.)"""
    shared, work = 0, 0
    bounds = [b for b, n in zip(seen.bounds, seen.counts, strict=True) if b <= len(body) and (count is None or n <= count)]
    if retained is not None:
        seen_bytes = memoryview(retained)
        # The same up to a bound, the same up to every bound before it: the last first (usually all are shared, or all
        # but the last few), then halving.
        low, high, k = 0, len(bounds), len(bounds)
        while low < high:
            bound = bounds[k - 1]
            work += _TAIL + bound
            if body[bound - _TAIL : bound] == seen.tails[k - 1] and body.startswith(seen_bytes[:bound]):
                low = k
            else:
                high = k - 1
            k = (low + high + 1) // 2
        shared = low
    else:
        start = 0
        for bound, tail, value in zip(bounds, seen.tails, seen.hashes, strict=False):
            work += _TAIL
            if body[bound - _TAIL : bound] != tail:
                break
            work += bound - start
            if hash(body[start:bound]) != value:
                break
            start, shared = bound, shared + 1
    if not shared:
        return _NOTHING, work
    work += len(body) - seen.bounds[shared - 1]
    if _array_key(str(seen.items_path[-1])).search(body, seen.bounds[shared - 1]) is not None:
        return _NOTHING, work
    counts = seen.counts[:shared]
    return Match(seen.digests[: counts[-1]], seen.bounds[:shared], counts, seen.hashes[:shared], seen.first_end, seen.items_path), work


def _seen_of(body: bytes, items: Sequence[Any], digests: tuple[int, ...], written: Written, match: Match, items_path: ItemsPath) -> _Seen | None:
    """What `body` leaves for the next body: the bounds it shares with the body before (`match`), then the ends of its
    last messages (as orjson writes them, each followed by the next one's comma or the closing bracket); None when
    not even the last one is found so."""
    if not items or len(digests) != len(items) or not items_path:
        return None
    shared_end, shared_count = (match.bounds[-1], match.counts[-1]) if match.bounds else (0, 0)
    ends: list[tuple[int, int]] = []  # (end, messages up to it), the last first
    limit, follows = len(body), b"]"
    for i in range(len(items) - 1, max(shared_count, len(items) - ENDS_KEPT) - 1, -1):  # not the messages it shares
        raw = written(i)
        if not raw:
            break
        start = body.rfind(raw, 0, limit)
        end = start + len(raw)
        if start < shared_end or end < _TAIL or body[end : end + 64].lstrip(_SEPARATORS)[:1] != follows:
            break
        if follows == b"," and body[end:limit].strip(_SEPARATORS) != b",":
            break
        ends.append((end, i + 1))
        limit, follows = start, b","
    if not ends and shared_count != len(items):
        return None  # the last message's end unknown: nothing to match a next body against
    ends.reverse()
    bounds, counts, hashes = list(match.bounds), list(match.counts), list(match.hashes)
    for end, messages in ends:
        hashes.append(hash(body[bounds[-1] if bounds else 0 : end]))
        bounds.append(end)
        counts.append(messages)
    if len(bounds) > MAX_BOUNDS:
        # Hashed again as one: the bytes up to the first of the last ENDS_KEPT bounds.
        keep = len(bounds) - ENDS_KEPT
        bounds, counts = bounds[keep - 1 :], counts[keep - 1 :]
        hashes = [hash(body[: bounds[0]])] + hashes[keep:]
    first_end = match.first_end if match.bounds else _first_end(body, written(0), str(items_path[-1]))
    tails = tuple(body[b - _TAIL : b] for b in bounds)
    return _Seen(tuple(bounds), tuple(counts), tuple(hashes), tails, digests, first_end, items_path)


def _first_end(body: bytes, first: bytes | None, name: str) -> int | None:
    """Where the first message (`first`, as orjson writes it) ends: where the messages' key opens the array just
    before it and the next message's comma or the closing bracket follows it; None when not found so."""
    start = body.find(first) if first else -1
    if start < 0 or _array_opening(name).search(body, max(0, start - _BEFORE_FIRST), start) is None:
        return None
    end = start + len(first or b"")
    return end if body[end : end + 64].lstrip(_SEPARATORS)[:1] in (b",", b"]") else None
