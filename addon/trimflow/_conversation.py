"""Numbering conversations and their turns, and remembering when each of their images first came.

`Conversations` assigns each request's History (trimflow._history) a conversation id, a turn and a segment.
A shorter or diverging history starts a new conversation: a rerun of the same test, a /clear, a fork, an edited
message; a history under a session id that extends none of its earlier ones is a new *segment* of it. The proxy's
SharedState and the audit's Reader use it alike, so a session is numbered the same live and in a recording. What is
kept: 8-byte digests, and per line of history the position of its last history, which images its last turn cut
and when that turn went (no text, no id).

An image's age is when it first came, not where it sits: some agents (aider) send every image again in one
early message, in an order that changes from request to request. Each line of history remembers the images its
last turn sent (`Copy`: when each first came, whether it was cut); `recall` orders the next request's images
oldest first by that (position decides only among images that came together, or in a conversation new to this
memory), and an image once cut comes first, so it stays cut (the turn says which it cut: not always the oldest, the
user's images go last, trimflow._value). Copies of one image are matched in the order they
sit to the newest remembered ones (by key, and by CRC-32 where a key is not the only one of its kind); a copy
more is new. An image a turn no longer sends is forgotten (the agent dropped it: sent again, it is new). A
request that continues no line of history takes the arrivals of the line whose images it sends again
(`_sent_again`). Bounded: at most MAX_IMAGES_PER_LINE per line, the oldest forgotten first, and
MAX_IMAGES_REMEMBERED in all, past which the least recently seen conversations go.

Several processes behind a balancer each see only some turns of a conversation. With `shared` (a LastTurns file,
trimflow._last_turns) every turn is written there too, and `recall` takes the conversation's last turn from there
when another process sent it after this one's own last turn, the request sends all its images again, and the row
goes on from what this process remembers of the conversation, if anything (`_goes_on`): its cut, its time and its
images' arrivals; and from a store that keeps them (trimflow._state_store), its turn number and the conversation's
id, so that a conversation spread over instances is numbered 1, 2, 3 under one id. A row is keyed by the
conversation's opening, which two runs of one task share: each writes a row of its own under that key
(`_row_for`), and neither takes the other's. A caller that may not wait on the store (the proxy's event loop, with a
store on another machine: TurnStore.across_hosts) reads a request's rows in another thread (`read_rows`) and hands them
to `recall` and `assign`.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import NamedTuple

from ._history import History, Images, digest, short_id
from ._last_turns import MAX_IMAGES, LastTurn, TurnStore, conversation_key, row_keys
from ._record import COUNT_TOKENS, TURN

DEFAULT_CAPACITY = 10_000  # conversations the proxy remembers (least recently seen forgotten first)
MAX_SEGMENTS = 8  # histories remembered per session id
# Images a line of history remembers the arrival of (the oldest forgotten first): as many as the shared file keeps.
MAX_IMAGES_PER_LINE = MAX_IMAGES
MAX_IMAGES_REMEMBERED = 1 << 18  # in all conversations (past it, the least recently seen are forgotten)
_SENT_AGAIN_HOLDERS = 16  # lines of history that remember an image looked at for a request that continues none
_NEW = 1 << 62  # when an image its line of history has not seen came: now, after every remembered one
Rows = tuple[tuple[bytes, LastTurn | None], ...]  # the shared file's rows under a conversation's key: (row key, row)


class Assignment:
    """Where a request falls: its conversation, its turn (None when it is not a turn) and segment."""

    __slots__ = ("conversation", "turn", "segment", "history_line")

    def __init__(self, conversation: str | None, turn: int | None, segment: int | None, history_line: HistoryLine | None) -> None:
        self.conversation, self.turn, self.segment, self.history_line = conversation, turn, segment, history_line


class _Conversation:
    __slots__ = ("id", "turns", "segments", "threads", "named")

    def __init__(self, cid: str, named: bool) -> None:
        self.id, self.named = cid, named
        self.turns = self.segments = 0
        self.threads: list[HistoryLine] = []  # most recently used last


class HistoryLine:
    """One line of history of a conversation (a segment): where its last request's history ended, and for
    the cache-aware cut (trimflow._policy: low_water) where its last turn's cut ended and when that turn went;
    the images its last turn sent: by key, when each copy first came, whether it was cut, and its CRC-32."""

    __slots__ = ("conversation", "segment", "head", "tip", "length", "last_end", "end", "response", "used", "cut", "sent_at", "images", "row")

    def __init__(self, conversation: _Conversation, segment: int, head: int) -> None:
        self.conversation, self.segment, self.head = conversation, segment, head
        self.tip: int | None = None
        self.length = 0  # messages in its last history
        # its last history's keys in Conversations._by_end: at its last message, and at the one before it
        self.last_end: int | None = None
        self.end: int | None = None
        self.response: bytes | None = None  # digest of the id of its last answer (Responses)
        self.used = 0
        self.cut = 0  # how many of its last turn's images were cut: what the next turn holds
        self.sent_at: float | None = None  # its last turn's time on the memory's clock
        self.images: dict[bytes, Stored] = {}  # image_key -> its copies, oldest first (packed: see Stored)
        self.row: bytes | None = None  # the shared file's row its last turn went to (trimflow._last_turns.row_keys)


class Copy(NamedTuple):
    """One copy of an image a line of history sent: when it first came (the memory's request count then), whether
    it was cut, its CRC-32 (image_crc), and whether it was cut as a look-alike of the image after it
    (trimflow._lookalike; None: not known, a copy read from the shared file)."""

    came: int
    cut: bool
    crc: int
    like: bool | None = False


# A line of history's copies of one image, packed (`_store`): one int for a single copy, as most images have, else a
# tuple of them. An int holds when the copy came, its CRC-32 and its two flags: about 40 bytes against some 200 for a
# list of a Copy and its two ints, the most of what a remembered image costs.
Stored = int | tuple[int, ...]
_CRC_SHIFT, _CAME_SHIFT = 3, 35
_LIKE_BITS = {False: 0, True: 2, None: 4}
_LIKE_OF = {0: False, 2: True, 4: None}


def _pack(copy: Copy) -> int:
    return copy.came << _CAME_SHIFT | (copy.crc & 0xFFFFFFFF) << _CRC_SHIFT | _LIKE_BITS[copy.like] | copy.cut


def _unpack(packed: int) -> Copy:
    return Copy(packed >> _CAME_SHIFT, bool(packed & 1), packed >> _CRC_SHIFT & 0xFFFFFFFF, _LIKE_OF[packed & 6])


def _store(copies: Sequence[Copy]) -> Stored:
    return _pack(copies[0]) if len(copies) == 1 else tuple(_pack(copy) for copy in copies)


def _unstore(stored: Stored) -> list[Copy]:
    return [_unpack(stored)] if isinstance(stored, int) else [_unpack(packed) for packed in stored]


def _count(stored: Stored) -> tuple[int, int]:
    """How many copies, and of those how many were cut."""
    if isinstance(stored, int):
        return 1, stored & 1
    return len(stored), sum(packed & 1 for packed in stored)


class Recall(NamedTuple):
    """What a conversation's last turn left for the next one: where its cut ended and how long ago it went.

    Given the request's images (History.images), `order` is its images oldest first by arrival (indices in the
    order they sit; the ones cut before first) and `cut` how many of them at its front were cut before; `like`, per
    image (in the order they sit), whether it was cut as a look-alike (None: not known)."""

    cut: int
    idle: float
    order: tuple[int, ...] | None = None
    like: tuple[bool | None, ...] | None = None


def _arrivals(remembered: Mapping[bytes, Stored], images: Images) -> list[Copy | None]:
    """Each image's remembered copy (None: new). An image whose key is the only one on both sides is that copy; where
    a key has several (a screen sent again, or two screenshots with the same length and ends), CRC-32s tell them
    apart, and copies of one image, in the order they sit, take the newest remembered ones: a copy more is new."""
    found: list[Copy | None] = [None] * len(images)
    places: dict[bytes, list[int]] = {}
    for i, key in enumerate(images.keys):
        places.setdefault(key, []).append(i)
    for key, where in places.items():
        stored = remembered.get(key)
        if stored is None:
            continue
        seen = _unstore(stored)
        if len(where) == 1 and len(seen) == 1:
            found[where[0]] = seen[0]
            continue
        same: dict[int, list[int]] = {}
        for i in where:
            same.setdefault(images.crc(i), []).append(i)
        for crc, spots in same.items():
            copies = [c for c in seen if c.crc == crc]
            for i, copy in zip(spots, copies[max(0, len(copies) - len(spots)) :], strict=False):
                found[i] = copy
    return found


def _copies(last: LastTurn) -> dict[bytes, Stored]:
    """A shared last turn's images as a line of history remembers them: each copy's rank stands for when it came,
    counted back from the memory's first request, so that every image the memory sees from now on came after them."""
    table: dict[bytes, list[Copy]] = {}
    first = -len(last.images)
    for rank, (key, crc) in enumerate(last.images):
        table.setdefault(key, []).append(Copy(first + rank, rank < last.cut, crc, None if rank < last.cut else False))
    return {key: _store(copies) for key, copies in table.items()}


def _goes_on(remembered: Mapping[bytes, Stored], last: LastTurn, images: Images) -> bool:
    """Whether the shared turn `last` goes on from the turn a line of history remembers (`remembered`), for a request
    sending `images`: it lists every image of that turn the request sends again, the ones cut still cut, in the order
    they came (those that came together in any order), and the images new to the line after them. A row that does
    not is another conversation with the same opening (a second run of one task) or a turn that lost what the line
    knows: taking it would move the line's cut and reorder its images, and its prompt cache with them."""
    # A row lists the images its turn cut first, then the rest, each part by arrival (trimflow._value may cut other than
    # the oldest): within each part its ranks must follow when the line's copies came.
    ranked: list[tuple[tuple[int, int], int]] = []  # ((the row's part, when the line's copy came); the row's rank)
    for mine, theirs in zip(_arrivals(remembered, images), _arrivals(_copies(last), images), strict=True):
        if mine is None:
            if theirs is not None:
                ranked.append(((0 if theirs.cut else 1, _NEW), theirs.came))
        elif theirs is None or (mine.cut and not theirs.cut):
            return False
        else:
            ranked.append(((0 if theirs.cut else 1, mine.came), theirs.came))
    ranked.sort()
    before = top = -_NEW  # the row's highest rank among the copies that came before this group, and in this group so far
    group: tuple[int, int] | None = None
    for when, rank in ranked:
        if when != group:
            group, before = when, top
        if rank <= before:
            return False
        top = max(top, rank)
    return True


def _continues(line: HistoryLine | None, last: LastTurn, images: Images) -> bool:
    """Whether a request sending `images` continues the shared turn `last`: it sends every image of it again, and the
    row goes on from the turn `line` (this process's memory of the conversation, if any) remembers."""
    sent = set(images.keys)
    if not all(key in sent for key, _ in last.images):
        return False
    return line is None or line.sent_at is None or _goes_on(line.images, last, images)


def _extent(row: tuple[bytes, LastTurn]) -> tuple[int, float]:
    """Of rows a request continues, the one that knows the most of it, then the newest."""
    return len(row[1].images), row[1].sent_at


def _end_key(history: History, k: int) -> int:
    """The message at position `k` of a history, after the one before it (the head, at the first position), on its
    host: what a history that rewrites early messages is matched by (Conversations._rewritten)."""
    messages = history.messages
    return hash(("end", history.host, k, messages[k - 1] if k else history.head, messages[k]))


def _id_bytes(cid: str) -> bytes:
    """A conversation id as a shared turn holds it: the 4 bytes of a short_id (a named one's id is its session's, the
    same on every instance: none)."""
    try:
        raw = bytes.fromhex(cid)
    except ValueError:
        return b""
    return raw if len(raw) == 4 else b""


def _holders(held: HistoryLine | dict[HistoryLine, None] | None) -> Sequence[HistoryLine] | dict[HistoryLine, None] | None:
    """The lines of history that remember an image (Conversations._by_image), the most recent last."""
    return (held,) if isinstance(held, HistoryLine) else held


def _oldest_first(found: Sequence[Copy | None], cut: Collection[int] | None = None) -> list[int]:
    """Image indices oldest first: the ones cut (`cut`, or else as remembered), then by arrival (new ones last); position
    among those that came together."""

    def age(i: int) -> tuple[int, int, int]:
        copy = found[i]
        was_cut = i in cut if cut is not None else copy is not None and copy.cut
        return (0 if was_cut else 1, _NEW if copy is None else copy.came, i)

    return sorted(range(len(found)), key=age)


class Conversations:
    """Assigns each request's History a conversation id, a turn and a segment; forgets the least recently
    seen conversation past `capacity`.

    Among the conversations whose last history this one extends, the longest such history wins; one equal
    to this one (a retry) only when none is shorter, so a rerun's turn that repeats an earlier run's last
    request still follows its own run. Equal candidates: the most recently used. `salt` makes ids differ
    between proxy processes (a new conversation's id counts the conversations started before it, which
    restarts with each process); the audit uses none, so its ids are the same on every run. `shared`: the file of
    last turns this process shares with others (see the module's docstring).
    """

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        salt: bytes | None = None,
        clock: Callable[[], float] = time.time,
        shared: TurnStore | None = None,
    ) -> None:
        self.capacity = capacity
        # Seconds on the wall clock, which processes sharing a file agree on; a replay of recorded or simulated
        # sessions gives its own.
        self.clock = clock
        self.shared = shared
        self._read: tuple[bytes, int, Rows] | None = None  # (key, tip, rows) of the last read of `shared`
        self._salt = os.urandom(8) if salt is None else salt
        self._conversations: OrderedDict[str, _Conversation] = OrderedDict()
        self._by_tip: dict[int, list[HistoryLine]] = {}
        # A line's last history's last message, and the one before it, each with its position, the message before it
        # (or the head) and the host -> the line that last ended so (Conversations._rewritten)
        self._by_end: dict[int, HistoryLine] = {}
        self._by_response: dict[bytes, HistoryLine] = {}
        self._started = 0
        self._uses = 0  # requests numbered: the logical time a line was last used and an image copy came at
        self._images = 0  # image copies remembered in all lines of history
        self._cut_keys: dict[bytes, int] = {}  # image_key -> copies remembered as cut
        # image_key -> the lines of history that remember it, the most recent last (a dict: removal in constant time);
        # the line itself while it is the only one, as most images are (a dict of one costs four times a line's entry)
        self._by_image: dict[bytes, HistoryLine | dict[HistoryLine, None]] = {}

    def __len__(self) -> int:
        return len(self._conversations)

    def recall(self, history: History, rows: Rows | None = None) -> Recall | None:
        """Where the cut of the conversation this history continues ended on its last turn, and how long ago
        that turn went; None for a new conversation or a history the provider keeps (previous_response_id),
        whose positions are not this request's. Reads only: `assign` moves the conversation on. `rows`: the shared
        store's rows read for this request (`read_rows`), taken instead of reading the store here."""
        if history.previous_response is not None:
            return None
        named = self._conversations.get(history.session) if history.session is not None else None
        thread = None if history.session is not None and named is None else self._continued(history, TURN, named)
        if thread is None or thread.sent_at is None:
            thread = self._sent_again(history.images.keys)
            if thread is not None and thread.sent_at is None:
                thread = None
        taken = self._newer_shared_turn(history, thread, self._rows(history, fresh=True, given=rows))
        if taken is not None:  # another process sent the conversation's last turn
            last = taken[1]
            sent_at, cut, remembered = last.sent_at, last.cut, _copies(last)
        elif thread is not None and thread.sent_at is not None:
            sent_at, cut, remembered = thread.sent_at, thread.cut, thread.images
        else:
            return None
        idle = max(0.0, self.clock() - sent_at)
        if not history.images:
            return Recall(cut, idle)
        found = _arrivals(remembered, history.images)
        cut = sum(1 for copy in found if copy is not None and copy.cut)
        like = tuple(copy.like if copy is not None and copy.cut else False for copy in found)
        return Recall(cut, idle, tuple(_oldest_first(found)), like)

    def _newer_shared_turn(self, history: History, line: HistoryLine | None, rows: Rows) -> tuple[bytes, LastTurn] | None:
        """The conversation's last turn in the shared file (`rows`, its rows read for this request), with its row's key,
        when it went after `line`'s (this process's own memory of it, if any) and this request continues it
        (`_continues`). Two runs of one task share a key: a later turn of the other run sent images this one has not
        come to, an earlier one lacks images this one remembers, and neither's cut may be held here. Of several rows,
        the one that holds the most images, then the newest."""
        newer = [
            (key, last)
            for key, last in rows
            if last is not None and (line is None or line.sent_at is None or last.sent_at > line.sent_at) and _continues(line, last, history.images)
        ]
        return max(newer, key=_extent, default=None)

    def row_keys_of(self, history: History) -> tuple[bytes, ...]:
        """The shared store's rows a turn of this history reads: none without a store, or for a history the provider
        keeps (previous_response_id)."""
        if self.shared is None or history.previous_response is not None:
            return ()
        return row_keys(conversation_key(history.host, history.session, history.origin))

    def read_rows(self, history: History) -> Rows | None:
        """The shared store's rows of this history's conversation, read now, in the caller's thread (a store whose
        reads wait on another machine, TurnStore.across_hosts, is read in a worker thread, never on an event loop), for
        `recall` and `assign` to take; None where a turn of it reads none."""
        shared, keys = self.shared, self.row_keys_of(history)
        if shared is None or not keys:
            return None
        return tuple(zip(keys, shared.get_many(keys), strict=True))

    def nothing_read(self, history: History) -> Rows | None:
        """The rows of this history's conversation as a store that answered nothing gives them (a read past its
        deadline): for a caller that may not wait on the store, which numbers the turn on this process's memory."""
        keys = self.row_keys_of(history)
        return tuple((key, None) for key in keys) if keys else None

    def _rows(self, history: History, fresh: bool, given: Rows | None = None) -> Rows:
        """The shared rows of the history's conversation: `given` (read ahead for this request) when they are its rows;
        else those the last read of the same request got (`recall` reads, `assign` takes them: one read a turn, and
        the turn remembered in the order it was cut in), until a turn is written; else read now (none without a store)."""
        if self.shared is None:
            return ()
        key = conversation_key(history.host, history.session, history.origin)
        if given is not None and given and given[0][0] == key:
            return given
        read = self._read
        if not fresh and read is not None and read[0] == key and read[1] == history.tip:
            return read[2]
        keys = row_keys(key)
        rows = tuple(zip(keys, self.shared.get_many(keys), strict=True))
        self._read = (key, history.tip, rows)
        return rows

    def _row_for(self, history: History, line: HistoryLine | None, taken: tuple[bytes, LastTurn] | None, rows: Rows) -> bytes:
        """The row a turn goes to (of `rows`, its conversation's): the one it took; else the one it continues, though
        older than `line`; else a free one; else the least recently sent (another conversation that opened alike gives
        way)."""
        if taken is not None:
            return taken[0]
        continued = [(key, last) for key, last in rows if last is not None and _continues(line, last, history.images)]
        if continued:
            return max(continued, key=_extent)[0]
        free = [key for key, last in rows if last is None]
        return free[0] if free else min(rows, key=lambda row: row[1].sent_at if row[1] is not None else 0.0)[0]

    def was_cut(self, keys: Iterable[bytes]) -> bool:
        """Whether an image with one of these keys (image_key) was cut in a line of history remembered: a request
        holding one needs its order (`recall`) even when no limit would change it."""
        index = self._cut_keys
        return bool(index) and any(key in index for key in keys)

    def assign(
        self, history: History, kind: str = TURN, cut: Collection[int] = (), like: Collection[int] = (), rows: Rows | None = None
    ) -> Assignment:
        """Number a request of `kind`; a turn also leaves `cut` (the engine's Outcome.cut: which of its images, by index
        in document order, were cut; `like`: of those, the look-alikes) and its time for the next one, and its images'
        arrivals (a history the provider keeps, previous_response_id, sends only its new items: the arrivals stay).
        `rows`: as for `recall`."""
        self._uses += 1
        named = None
        if history.session is not None:
            named = self._conversations.get(history.session)
            if named is None:
                named = self._add(_Conversation(history.session, named=True))
        thread = self._continued(history, kind, named)
        # When this turn's images came: as its own line remembers them, or one whose images it sends again (see
        # _sent_again). Taken before a new line may make room by forgetting that one.
        source = thread if thread is not None and thread.sent_at is not None else self._sent_again(history.images.keys)
        remembered = source.images if source is not None else {}
        taken = None
        shared_rows: Rows = ()
        if kind == TURN and history.previous_response is None:
            shared_rows = self._rows(history, fresh=False, given=rows)
            taken = self._newer_shared_turn(history, source, shared_rows)
            if taken is not None:
                remembered = _copies(taken[1])  # as `recall` took them
        if thread is None:
            if kind == COUNT_TOKENS:  # never a conversation or segment of its own
                return Assignment(named.id if named else None, None, None, None)
            conversation = named or self._add(_Conversation(self._new_id(history, taken), named=False))
            conversation.segments += 1
            thread = HistoryLine(conversation, conversation.segments, history.head)
            conversation.threads.append(thread)
            if len(conversation.threads) > MAX_SEGMENTS:
                self._drop_thread(conversation.threads.pop(0))
        conversation = thread.conversation
        self._conversations.move_to_end(conversation.id)
        thread.used = self._uses
        conversation.threads.remove(thread)
        conversation.threads.append(thread)
        turn = None
        if kind != COUNT_TOKENS:  # a turn or a warm-up moves the conversation on
            self._move(thread, history)
            if kind == TURN:
                if taken is not None and taken[1].conversation == _id_bytes(conversation.id):
                    conversation.turns = max(conversation.turns, taken[1].turn)  # the other instances' turns too
                conversation.turns += 1
                turn = conversation.turns
                thread.cut = len(cut)
                thread.sent_at = self.clock()
                if history.previous_response is None:
                    if self.shared is not None:
                        thread.row = self._row_for(history, source, taken, shared_rows)
                    self._share(thread, self._remember(thread, remembered, history.images, cut, like))
        return Assignment(conversation.id, turn, thread.segment, thread)

    def recut(self, thread: HistoryLine | None, history: History, cut: Collection[int], like: Collection[int] = ()) -> None:
        """The turn `thread` last sent went again with more cut (a retry within a limit the provider named, pruned in
        the order `recall` gave, `cut` as in `assign`): its line remembers that cut, so the next turn holds it and never
        brings back an image the provider was not sent."""
        if thread is None or thread.sent_at is None or history.previous_response is not None:
            return
        if thread.conversation.id not in self._conversations:  # forgotten meanwhile: the next turn starts afresh
            return
        thread.cut = len(cut)
        self._share(thread, self._remember(thread, thread.images, history.images, cut, like))

    def _share(self, thread: HistoryLine, kept: tuple[list[tuple[bytes, int]], int]) -> None:
        """The turn `thread` just sent, into its row of the shared file: its images oldest first by arrival and how many
        of them were cut, as `_remember` kept them."""
        if self.shared is not None and thread.sent_at is not None and thread.row is not None:
            images, cut = kept
            conversation = thread.conversation
            self.shared.put(thread.row, LastTurn(thread.sent_at, cut, tuple(images), conversation.turns, _id_bytes(conversation.id)))
            self._read = None  # the next request reads the file again

    def _sent_again(self, keys: Sequence[bytes]) -> HistoryLine | None:
        """The line of history whose images a request that continues no history sends again, more than half of them:
        an agent that rewrites an early message every turn (aider puts every image the user added into one, and the
        date into its system prompt) starts a new history each time, but not a new set of images. The line with the
        most of them, the most recently used of equals."""
        shared: dict[HistoryLine, int] = {}
        for key in set(keys):
            holders = _holders(self._by_image.get(key))
            # The most recent few: one image many conversations sent costs a request that sends it no more than that.
            for thread in itertools.islice(reversed(holders), _SENT_AGAIN_HOLDERS) if holders else ():
                shared[thread] = shared.get(thread, 0) + 1
        best, most = None, 0
        for thread, n in shared.items():
            if 2 * n > len(thread.images) and (n > most or (n == most and best is not None and thread.used > best.used)):
                best, most = thread, n
        return best

    def _remember(
        self, thread: HistoryLine, remembered: Mapping[bytes, Stored], images: Images, cut: Collection[int], like: Collection[int] = ()
    ) -> tuple[list[tuple[bytes, int]], int]:
        """The images of the turn `thread` just sent: when each copy came (as `remembered`; now for a new one, on the
        memory's clock, which runs on across conversations), whether it is in `cut` (indices into `images`) and in
        `like` (cut as a look-alike). What
        the turn no longer sends is forgotten. Returns the images it keeps, the cut ones first, each part oldest first
        by arrival, as (key, CRC-32), and how many of those were cut: a shared row (trimflow._last_turns) says which
        images were cut as a count of its first, whatever the order the cut took them in (trimflow._value)."""
        found = _arrivals(remembered, images)
        order = _oldest_first(found, cut)
        table: dict[bytes, list[Copy]] = {}
        kept: list[tuple[bytes, int]] = []
        first = max(0, len(order) - MAX_IMAGES_PER_LINE)
        for rank in range(first, len(order)):
            i = order[rank]
            copy = found[i]
            came, crc = (self._uses, images.crc(i)) if copy is None else (copy.came, copy.crc)
            table.setdefault(images.keys[i], []).append(Copy(came, i in cut, crc, i in cut and i in like))
            kept.append((images.keys[i], crc))
        for copies in table.values():
            copies.sort(key=lambda copy: (copy.came, not copy.cut))  # as _oldest_first: of copies that came together, the cut first
        self._forget_images(thread)
        thread.images = {key: _store(copies) for key, copies in table.items()}
        for key, copies in table.items():
            self._hold(key, thread)
            self._images += len(copies)
            cuts = sum(1 for copy in copies if copy.cut)
            if cuts:
                self._cut_keys[key] = self._cut_keys.get(key, 0) + cuts
        while self._images > MAX_IMAGES_REMEMBERED and len(self._conversations) > 1:
            _, forgotten = self._conversations.popitem(last=False)  # never this one: just made the most recent
            for dropped in forgotten.threads:
                self._drop_thread(dropped)
        return kept, sum(1 for rank in range(first, len(order)) if order[rank] in cut)

    def _hold(self, key: bytes, thread: HistoryLine) -> None:
        held = self._by_image.get(key)
        if held is None or held is thread:
            self._by_image[key] = thread
        elif isinstance(held, HistoryLine):
            self._by_image[key] = {held: None, thread: None}
        else:
            held[thread] = None

    def _release(self, key: bytes, thread: HistoryLine) -> None:
        held = self._by_image[key]
        if isinstance(held, HistoryLine):
            del self._by_image[key]
            return
        del held[thread]
        if len(held) == 1:
            self._by_image[key] = next(iter(held))

    def _forget_images(self, thread: HistoryLine) -> None:
        for key, stored in thread.images.items():
            self._release(key, thread)
            copies, cuts = _count(stored)
            self._images -= copies
            if cuts:
                left = self._cut_keys[key] - cuts
                if left:
                    self._cut_keys[key] = left
                else:
                    del self._cut_keys[key]
        thread.images = {}

    def responded(self, thread: HistoryLine | None, response_id: str | None) -> None:
        """The answer to `thread`'s last request had this id: a request naming it as previous_response_id continues it."""
        if thread is None or not response_id or thread.conversation.id not in self._conversations:
            return
        if thread.response is not None and self._by_response.get(thread.response) is thread:
            del self._by_response[thread.response]
        thread.response = digest(b"r", response_id.encode())
        self._by_response[thread.response] = thread

    def _continued(self, history: History, kind: str, named: _Conversation | None) -> HistoryLine | None:
        if history.previous_response is not None:
            # The provider keeps the history: the answer it follows names the conversation.
            thread = self._by_response.get(history.previous_response)
            if thread is not None and (named is None or thread.conversation is named):
                return thread
            return named.threads[-1] if named is not None and named.threads else None
        prefixes = history.prefixes
        n = len(prefixes)
        # Strictly shorter histories first, the longest first; then an equal one.
        for k in [*range(n - 2, -1, -1), n - 1] if n else []:
            best = None
            for thread in self._by_tip.get(prefixes[k], ()):
                if named is not None and thread.conversation is not named:
                    continue
                if named is None and (thread.conversation.named or (kind != COUNT_TOKENS and thread.head != history.head)):
                    continue
                if best is None or thread.used > best.used:
                    best = thread
            if best is not None:
                return best
        return self._rewritten(history, kind, named)

    def _rewritten(self, history: History, kind: str, named: _Conversation | None) -> HistoryLine | None:
        """The line of history a request continues though it rewrites early messages: OpenClaw ends each request with a
        context message the next one drops, aider rewrites its system prompt (the time) and its message of images on
        every request. This history is longer than the line's last one, and holds that one's last message (aider's
        question), or the one before it (OpenClaw's, whose last is dropped), at the same position after the same
        message (or, at the first position, the same head), with messages after it. Of several, the one matched
        furthest along."""
        messages = history.messages
        for k in range(len(messages) - 2, -1, -1):
            thread = self._by_end.get(_end_key(history, k))
            if thread is None or (named is not None and thread.conversation is not named):
                continue
            if named is None and (thread.conversation.named or (kind == COUNT_TOKENS and thread.head != history.head)):
                continue
            if len(messages) <= thread.length:  # not longer: a fork, or an edit of the last message
                continue
            return thread
        return None

    def _new_id(self, history: History, taken: tuple[bytes, LastTurn] | None = None) -> str:
        """A new conversation's id; the one another instance gave it, where this turn continues its shared turn."""
        if taken is not None and len(taken[1].conversation) == 4 and taken[1].conversation.hex() not in self._conversations:
            return taken[1].conversation.hex()
        self._started += 1
        return short_id(self._salt, history.host.encode(), history.origin, str(self._started).encode())

    def _add(self, conversation: _Conversation) -> _Conversation:
        self._conversations[conversation.id] = conversation
        while len(self._conversations) > self.capacity:
            _, forgotten = self._conversations.popitem(last=False)
            for thread in forgotten.threads:
                self._drop_thread(thread)
        return conversation

    def _move(self, thread: HistoryLine, history: History) -> None:
        if thread.tip == history.tip:
            return
        self._unindex(thread)
        thread.tip = history.tip
        self._by_tip.setdefault(history.tip, []).append(thread)
        thread.head = history.head
        n = thread.length = len(history.messages)
        thread.last_end = self._end(thread, history, n - 1)
        thread.end = self._end(thread, history, n - 2)

    def _end(self, thread: HistoryLine, history: History, k: int) -> int | None:
        if k < 0:
            return None
        key = _end_key(history, k)
        self._by_end[key] = thread
        return key

    def _unindex(self, thread: HistoryLine) -> None:
        for key in (thread.last_end, thread.end):
            if key is not None and self._by_end.get(key) is thread:
                del self._by_end[key]
        thread.last_end = thread.end = None
        if thread.tip is not None:
            threads = self._by_tip.get(thread.tip)
            if threads is not None:
                threads.remove(thread)
                if not threads:
                    del self._by_tip[thread.tip]
            thread.tip = None

    def _drop_thread(self, thread: HistoryLine) -> None:
        self._unindex(thread)
        self._forget_images(thread)
        if thread.response is not None and self._by_response.get(thread.response) is thread:
            del self._by_response[thread.response]
