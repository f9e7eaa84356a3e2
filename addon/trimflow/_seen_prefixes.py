"""The digests of messages a text body shares with a body seen before, found from its raw bytes (`SeenPrefixes`).

Agents send the whole history on every turn, so a turn's body starts with the bytes of the last one's: the same
earlier messages, written the same way, then the new ones. Digesting a message (trimflow._history) writes it again
with orjson and hashes that; on a coding agent's text body this is most of what trimflow does beyond parsing it.
Here, a body remembers where runs of its messages end in its raw bytes (`bounds`: its last few messages' ends, and
some earlier ones), and the hash of the bytes from each bound to the next. A later body of the same conversation
(same host, items path and origin) whose bytes up to a bound hash the same holds the same messages up to there (a
JSON prefix parses to the same values wherever it is followed by the same structure), so their digests are taken as
they are: the raw bytes hashed once at C speed instead of a write and a hash per message. Only the messages after
that are digested, and only the bytes after the last bound it shares are hashed for the body after it: the bounds a
body shares with the one before carry over (at most MAX_BOUNDS; past that they are hashed again as one).

The ends are found by looking for each of the last messages as orjson writes it, from the end of the body: where a
client writes JSON otherwise (spaces, other escapes), none is found and that body is digested in full, as before.
A found end is taken only where what follows it is the next message's comma or the array's closing bracket.

The last few ends are kept, not only the last: Anthropic clients move a cache breakpoint from the last message to
the new last one, so the last messages of a turn are seldom written the same in the next.

Bounded: at most MAX_BODIES bodies and MAX_DIGESTS message digests over all of them (the oldest forgotten first), and
PER_ORIGIN bodies per conversation origin (agents' sub-conversations often share a system prompt and first message).
The hashes are Python's keyed hash, like the digests they stand for: 64 bits, process-local, never written.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

ENDS_KEPT = 4  # the last messages whose ends a body remembers
MAX_BOUNDS = 16  # bounds a body remembers: more are hashed again as one
PER_ORIGIN = 4  # bodies remembered per conversation origin
MAX_DIGESTS = 1 << 15  # message digests kept over all bodies
MAX_BODIES = 256  # bodies kept over all origins: with MAX_DIGESTS, at most about 2.5 MiB (docs/performance.md)
_TAIL = 32  # bytes before a bound compared before anything is hashed
_SEPARATORS = b" \t\r\n"

# A key: the body's host, where its messages sit in it, its origin (trimflow._history.History.origin).
Key = tuple[str, tuple[Any, ...], bytes]
# The i-th message as orjson writes it (None: it cannot).
Written = Callable[[int], bytes | None]


class Match(NamedTuple):
    """What a body shares with one seen before: the digests of its first messages, and the bounds it shares (each
    with its message count and the hash of the bytes from the bound before)."""

    digests: tuple[int, ...] = ()
    bounds: tuple[int, ...] = ()
    counts: tuple[int, ...] = ()
    hashes: tuple[int, ...] = ()


class _Seen(NamedTuple):
    bounds: tuple[int, ...]  # raw offsets where a message ends, ascending; the last is the last message's end
    counts: tuple[int, ...]  # messages up to each bound
    hashes: tuple[int, ...]  # hash of the bytes from the bound before (the body's start for the first) to each bound
    tails: tuple[bytes, ...]  # the _TAIL bytes before each bound
    digests: tuple[int, ...]  # every message's digest


_NOTHING = Match()


class SeenPrefixes:
    """Bodies seen lately, by key: what a new body of the same key shares with them (`match`) and what it leaves
    for the next one (`remember`). Safe to call from several threads."""

    def __init__(self, max_digests: int = MAX_DIGESTS, max_bodies: int = MAX_BODIES, per_origin: int = PER_ORIGIN) -> None:
        self._max_digests, self._max_bodies, self._per_origin = max_digests, max_bodies, per_origin
        self._seen: dict[Key, list[_Seen]] = {}
        self._kept = self._bodies = 0
        self._lock = threading.Lock()

    def match(self, key: Key, body: bytes, count: int) -> Match:
        """What `body`, holding `count` messages, shares with the bodies seen under `key`: the most messages."""
        with self._lock:
            candidates = list(self._seen.get(key, ()))
        best, second = _NOTHING, _array_key(str(key[1][-1]))
        for seen in candidates:
            found = _shared(seen, body, count, second)
            if len(found.digests) > len(best.digests):
                best = found
                if len(best.digests) == count:
                    break
        return best

    def remember(self, key: Key, body: bytes, items: Sequence[Any], digests: Sequence[int], written: Written, match: Match = _NOTHING) -> None:
        """Remember `body` for the next one under `key`: its messages `items`, their `digests`, `written(i)` (the i-th
        message as orjson writes it, None if it cannot) and what it shares with an earlier body (`match`)."""
        seen = _seen_of(body, items, tuple(digests), written, match)
        if seen is None:
            return
        with self._lock:
            before = self._seen.pop(key, [])
            self._count(before, -1)
            # A body this one extends (the same messages, digested: breakpoints moved or not) is this conversation's past.
            bodies = [seen, *(other for other in before if seen.digests[: len(other.digests)] != other.digests)][: self._per_origin]
            self._seen[key] = bodies  # the newest key last: the oldest are dropped first
            self._count(bodies, 1)
            while (self._kept > self._max_digests or self._bodies > self._max_bodies) and self._seen:
                self._count(self._seen.pop(next(iter(self._seen))), -1)

    def _count(self, bodies: list[_Seen], sign: int) -> None:
        self._kept += sign * sum(len(seen.digests) for seen in bodies)
        self._bodies += sign * len(bodies)

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()
            self._kept = self._bodies = 0

    @property
    def kept(self) -> int:
        """The message digests kept over all bodies."""
        return self._kept


@functools.lru_cache(maxsize=16)
def _array_key(name: str) -> re.Pattern[bytes]:
    """The messages' key opening an array, as JSON writes it: a second one is a second array of messages."""
    return re.compile(rb'"%s"\s*:\s*\[' % re.escape(name.encode()))


def _shared(seen: _Seen, body: bytes, count: int, second: re.Pattern[bytes]) -> Match:
    """The bounds of `seen` that `body` shares, in order: each one's tail the same, then the bytes since the bound
    before hashed the same. Nothing if `second` (the messages' key opening an array) comes after them: a second array
    of messages there, which a parser takes instead of the first. (A key written with escapes is not looked for: such
    a body misleads its own conversation's digests, no other's.)"""
    start, shared = 0, 0
    for bound, tail, value in zip(seen.bounds, seen.tails, seen.hashes, strict=True):
        if bound > len(body) or seen.counts[shared] > count or body[bound - _TAIL : bound] != tail or hash(body[start:bound]) != value:
            break
        start, shared = bound, shared + 1
    if not shared or second.search(body, seen.bounds[shared - 1]) is not None:
        return _NOTHING
    return Match(seen.digests[: seen.counts[shared - 1]], seen.bounds[:shared], seen.counts[:shared], seen.hashes[:shared])


def _seen_of(body: bytes, items: Sequence[Any], digests: tuple[int, ...], written: Written, match: Match) -> _Seen | None:
    """What `body` leaves for the next body: the bounds it shares with the body before (`match`), then the ends of its
    last messages (as orjson writes them, each followed by the next one's comma or the closing bracket); None when
    not even the last one is found so."""
    if not items or len(digests) != len(items):
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
    return _Seen(tuple(bounds), tuple(counts), tuple(hashes), tuple(body[b - _TAIL : b] for b in bounds), digests)
