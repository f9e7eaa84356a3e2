"""Why a conversation's prompt cache broke: for a turn whose provider-reported cache read fell below the previous
turn's, whose doing it was (Record.cache_break, and where: Record.cache_break_at).

    cause           where (cache_break_at)       when
    first_turn      -                            no earlier turn of the conversation is remembered
    agent_prefix    "tools", "system",            the agent sent its prefix changed: the first block that differs from
                    "message N"                  the previous turn's (tools, then system prompt, then messages: the
                                                 order providers cache them in; N counts from 1)
    trimflow_cut    "image N"                    trimflow's cut moved: N is the first image (in the order they sit in
                                                 the request, 1 = the first) the previous turn also sent that is cut
                                                 now and was not then, or the other way round
    cache_expired   -                            the conversation was idle past the cache's lifetime (LIFETIME, or
                                                 the longer one the request asks for: History.asked_lifetime)
    unexplained     -                            none of these: the provider dropped it on its own

The agent's blocks are compared as `trimflow._history.History` digests them (media parts and trimflow's placeholders
left out, so a cut is never taken for the agent's change): the head's and the tools' digests, and the messages'
prefix chain, where equal values at one position mean equal prefixes up to it, so the first difference is a binary
search. The previous turn is the conversation's (and segment's) last; a request that starts a new conversation
because the agent rewrote an early block (a system prompt edited mid-session, without a session id) is matched to
the remembered turn it shares the longest opening with and goes on from.

Memory: per remembered turn, three digests, counts, a time, its prefix chain (8 bytes a message) and the indices of
the images its cut took; at most
MAX_TURNS turns and MAX_BLOCKS chain entries in all (8 MiB), the least recently sent forgotten first. No text, no id.
"""

from __future__ import annotations

import itertools
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Collection

from ._history import History
from ._record import ENFORCE, TURN, Record

FIRST_TURN = "first_turn"
AGENT_PREFIX = "agent_prefix"
TRIMFLOW_CUT = "trimflow_cut"
CACHE_EXPIRED = "cache_expired"
UNEXPLAINED = "unexplained"
CAUSES = (FIRST_TURN, AGENT_PREFIX, TRIMFLOW_CUT, CACHE_EXPIRED, UNEXPLAINED)

LIFETIME = 300.0  # seconds: the shortest lifetime providers give a prompt cache (Anthropic's default, OpenAI's least)
MAX_TURNS = 10_000
MAX_BLOCKS = 1 << 20  # prefix-chain entries (8 bytes each) and cut image indices in all remembered turns
_REWRITTEN_CANDIDATES = 16


class _Turn:
    """A conversation's last turn as sent: its digests, its cut, when it went, and (once answered) its cache read;
    `change`: what changed from the turn before it (a cause and where), and `previous_read` that turn's cache read."""

    __slots__ = ("turn", "head", "tools", "chain", "cut", "images", "sent_at", "cache_read", "previous_read", "unanswered", "previous", "change")

    def __init__(self, turn: int, history: History, cut: frozenset[int], sent_at: float) -> None:
        self.turn, self.head, self.tools, self.cut, self.sent_at = turn, history.head, history.tools, cut, sent_at
        self.images = len(history.images)
        self.chain = array("q", history.prefixes)
        self.cache_read: int | None = None
        self.previous_read: int | None = None
        # The turn before, while its answer has not been counted (a fast agent's next turn may go first): its read is
        # taken when this one's answer comes. Only the unanswered hold one, so such links are as long as turns in flight.
        self.unanswered: _Turn | None = None
        self.previous: tuple[frozenset[int], int] | None = None  # the turn before's cut and image count
        self.change: tuple[str, str | None] | None = None  # None: no earlier turn (a first turn)

    @property
    def size(self) -> int:
        """What it holds, in chain entries and image indices."""
        return len(self.chain) + len(self.cut)


def _moved(cut: frozenset[int], before: frozenset[int], images: int) -> str | None:
    """Where a cut moved from the one before, over the `images` the turn before sent (an image new this turn is new to
    the cache anyway): "image N" for the first that changed; None when none did."""
    changed = [i for i in cut ^ before if i < images]
    return f"image {min(changed) + 1}" if changed else None


def _common(a: array[int] | list[int], b: array[int] | list[int]) -> int:
    """How many leading messages two prefix chains share (equal at k: equal up to k)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class CacheBreaks:
    """Remembers each conversation's last turn as sent (`sent`, when the request goes) and names the cause of a fall
    in its cache read when the answer says it (`answered`). `clock`: seconds, as Conversations' clock."""

    def __init__(
        self, lifetime: float = LIFETIME, clock: Callable[[], float] = time.time, max_turns: int = MAX_TURNS, max_blocks: int = MAX_BLOCKS
    ) -> None:
        self.lifetime, self.clock = lifetime, clock
        self.max_turns, self.max_blocks = max_turns, max_blocks
        self._turns: OrderedDict[tuple[str, int | None], _Turn] = OrderedDict()
        self._by_opening: dict[int, dict[tuple[str, int | None], None]] = {}  # first chain value -> keys, most recent last
        self._blocks = 0

    def __len__(self) -> int:
        return len(self._turns)

    def sent(self, record: Record, history: History | None, cut: Collection[int]) -> None:
        """A turn went: what changed from its conversation's last turn, kept until its answer (`answered`). `cut`: the
        images its cut took, as indices into its images in the order they sit (the engine's Outcome.cut)."""
        if history is None or record.kind != TURN or record.turn is None or record.conversation is None or history.previous_response is not None:
            return
        key = (record.conversation, record.segment)
        taken = frozenset(cut) if record.mode == ENFORCE else frozenset()  # observe forwards the body as it came
        previous = self._turns.get(key) if record.turn > 1 else None
        if previous is None:
            previous = self._rewritten(history)
        now = self.clock()
        turn = _Turn(record.turn, history, taken, now)
        if previous is not None:
            turn.previous_read, turn.previous = previous.cache_read, (previous.cut, previous.images)
            if previous.cache_read is None:
                turn.unanswered = previous
            turn.change = self._change(previous, history, taken, now)
        self._put(key, turn)

    def recut(self, record: Record, cut: Collection[int]) -> None:
        """The turn went again with more cut (a retry within a limit the provider named): that cut is what the provider
        got, and the next turn is compared with it."""
        turn = self._turns.get((record.conversation, record.segment)) if record.conversation is not None else None
        if turn is None or turn.turn != record.turn or record.mode != ENFORCE:
            return
        self._blocks -= len(turn.cut)
        turn.cut = frozenset(cut)
        self._blocks += len(turn.cut)
        if turn.change is not None and turn.change[0] != AGENT_PREFIX and turn.previous is not None:
            where = _moved(turn.cut, *turn.previous)
            if where is not None:
                turn.change = TRIMFLOW_CUT, where

    def answered(self, record: Record) -> None:
        """The turn's answer came with its usage: its cause (Record.cache_break) when its cache read fell."""
        if record.kind != TURN or record.conversation is None:
            return
        turn = self._turns.get((record.conversation, record.segment))
        while turn is not None and turn.turn != record.turn:  # a later turn went before this answer was counted
            turn = turn.unanswered
        read = record.usage_cache_read_tokens
        if turn is None or read is None:
            return
        turn.cache_read = read
        if turn.unanswered is not None:
            turn.previous_read, turn.unanswered = turn.unanswered.cache_read, None
        if turn.change is None:
            record.cache_break = FIRST_TURN
        elif turn.previous_read is not None and read < turn.previous_read:
            record.cache_break, record.cache_break_at = turn.change

    def _change(self, previous: _Turn, history: History, cut: frozenset[int], now: float) -> tuple[str, str | None]:
        if history.tools != previous.tools:
            return AGENT_PREFIX, "tools"
        if history.head != previous.head:
            return AGENT_PREFIX, "system"
        same = _common(previous.chain, history.prefixes)
        if same < len(previous.chain):
            return AGENT_PREFIX, f"message {same + 1}"
        where = _moved(cut, previous.cut, previous.images)
        if where is not None:
            return TRIMFLOW_CUT, where
        idle = now - previous.sent_at
        # The longer lifetime a request asks for (Anthropic's "ttl": "1h", OpenAI's 24 h retention) is read only when
        # the default has passed; an agent asks for the same one on every turn.
        if idle > self.lifetime and idle > history.asked_lifetime():
            return CACHE_EXPIRED, None
        return UNEXPLAINED, None

    def _rewritten(self, history: History) -> _Turn | None:
        """The remembered turn a request that starts a conversation goes on from: the one sharing its first message and
        the longest opening with it, that it sends more after (a rerun of a task's first turn goes on from none)."""
        chain = history.prefixes
        if not chain:
            return None
        best, most = None, 0
        # The most recent few: many conversations opening alike cost a new one no more than that.
        for key in itertools.islice(reversed(self._by_opening.get(chain[0], {})), _REWRITTEN_CANDIDATES):
            turn = self._turns[key]
            same = _common(turn.chain, chain)
            if same > most and len(chain) > same:
                best, most = turn, same
        return best

    def _put(self, key: tuple[str, int | None], turn: _Turn) -> None:
        self._drop(key)
        self._turns[key] = turn
        self._blocks += turn.size
        if turn.chain:
            self._by_opening.setdefault(turn.chain[0], {})[key] = None
        while len(self._turns) > self.max_turns or (self._blocks > self.max_blocks and len(self._turns) > 1):
            self._drop(next(iter(self._turns)))

    def _drop(self, key: tuple[str, int | None]) -> None:
        turn = self._turns.pop(key, None)
        if turn is None:
            return
        self._blocks -= turn.size
        if turn.chain:
            keys = self._by_opening[turn.chain[0]]
            del keys[key]
            if not keys:
                del self._by_opening[turn.chain[0]]
            turn.chain = array("q")  # a later turn may still hold it for its cache read (`unanswered`): not its chain
