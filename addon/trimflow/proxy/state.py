"""What trimflow's addons share: the rules, the decode limit, turn numbers, and per LLM flow a FlowState.

A FlowState lives beside its flow (a WeakKeyDictionary: it goes when mitmproxy drops the flow), not in
flow.metadata: mitmproxy writes metadata into recordings (-w), and a Target or an Outcome is not
serializable. The record stays a Record until it is written: `write` puts it into flow.metadata[META]
as a dict where a reader needs it, when it is made and when the answer completes it, before mitmproxy's
save addon (later in its chain than any script) writes the flow.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import ThreadPoolExecutor

from mitmproxy import http

from .. import NeedsWorker, Outcome
from .._cache_break import CacheBreaks
from .._clicks import Screen
from .._conversation import Conversations, HistoryLine, Recall, Rows
from .._decode import DEFAULT_MAX_DECODED_BYTES
from .._engine import Tighten
from .._history import History, response_id_of
from .._learned_limits import upstream_key
from .._limits import Limits
from .._recall import Kept, RecallStore
from .._record import Record, utc_timestamp
from .._rules import Target
from .._rules_file import RulesFile
from .._state_store import FRONT_CONNECTIONS
from ..formats import openai_responses
from .comment import flow_comment

log = logging.getLogger("trimflow")

# Flows whose record waits for their answer, at most, and their bodies in all (the oldest are worked out past either).
MAX_UNSETTLED = 64
MAX_UNSETTLED_BYTES = 16 * 2**20
META = "trimflow"  # flow.metadata key holding the flow's record as a dict (the audit reads it from recordings)


class FlowState:
    """One LLM flow: its Target, resolved once; its record; the outcome whose record is still to be
    worked out (Outcome.record_pending); the error that ended the flow, if one did; its place in its
    conversation (`history_line`, which learns the answer's id). For a WebSocket flow, `record` and `history_line`
    hold the last client message's until the metrics addon takes them into `waiting`, where each
    waits for the server's answer to it. `screen`: how the answer's computer-use coordinates map back
    (trimflow._clicks), set by the prune addon when the newest screenshot went rescaled. `kept`: the images its
    placeholders name for recall (trimflow._recall), handed to the store once the request is on its way. `rows`: the
    shared store's rows of its conversation, read in a worker thread where the store's reads wait (SharedState.read_ahead),
    for the cut and the numbering of its turn (a WebSocket flow's: its last client message's)."""

    __slots__ = ("target", "record", "pending", "error", "history_line", "waiting", "screen", "kept", "rows")

    def __init__(self, target: Target) -> None:
        self.target = target
        self.record: Record | None = None
        self.pending: Outcome | None = None
        self.error: str | None = None
        self.history_line: HistoryLine | None = None
        self.waiting: list[tuple[Record, HistoryLine | None]] = []
        self.screen: Screen | None = None
        self.kept: list[Kept] = []
        self.rows: Rows | None = None


class NeedsRows(NeedsWorker):
    """Raised on the event loop by a request's memory (`SharedState.memory_for`) when the request needs its
    conversation's rows in a store whose reads wait on the network (TurnStore.across_hosts) and none were read for it: the caller reads
    them in a worker thread (`SharedState.read_ahead`) and runs the request inline again. A NeedsWorker, so a caller
    that does not read them runs the request in a worker thread, whose memory reads them there."""

    def __init__(self, history: History) -> None:
        super().__init__("the shared store's rows of the conversation")
        self.history = history


class SharedState:
    """The addons' shared state. `rules` and `max_decoded_bytes` are set by the prune addon's options, `recall` (the
    store of the images cut, when recall is on) by the recall addon's."""

    def __init__(self) -> None:
        self.rules: RulesFile | None = None
        self.max_decoded_bytes = DEFAULT_MAX_DECODED_BYTES
        # A turn worked out after its answer is timed as it was sent (`_settle_one`): the idle time between turns that the
        # conversations and the cache breaks read is the agent's, not the provider's.
        self._sent_at: float | None = None
        self.conversations = Conversations(clock=self._clock)
        self.cache_breaks = CacheBreaks(clock=self._clock)
        # The recover addon's learned limits for (upstream, model, limits), applied on top of the rules.
        self.learned: Callable[[str, str | None, Limits], Limits] | None = None
        self.recall: RecallStore | None = None
        self._states: weakref.WeakKeyDictionary[http.HTTPFlow, FlowState | None] = weakref.WeakKeyDictionary()
        # Flows whose record is left pending (Outcome.record_pending), oldest first: numbered in that order.
        self._unsettled: OrderedDict[http.HTTPFlow, tuple[FlowState, float]] = OrderedDict()  # with when each went
        self._unsettled_bytes = 0  # their request bodies, in all
        # The threads reading a store whose reads wait, as many as the Redis store reads at once on (more read nothing):
        # their own, so that no read queues behind the engine's slow work in the default executor (a shrink).
        self._readers: ThreadPoolExecutor | None = None

    def memory_for(self, state: FlowState | None, on_loop: bool = True) -> _RequestMemory:
        """What the engine asks of the conversations for the request of `state` (trimflow._engine: CutMemory): on the
        event loop (`on_loop`), once every pending turn before it is numbered; in a worker thread, as they stand (the
        caller numbered them before it went there)."""
        return _RequestMemory(self, state, on_loop)

    @property
    def across_hosts(self) -> bool:
        """Whether the shared store is a server other hosts share (TurnStore.across_hosts): its reads may wait on the
        network, so never on the loop, and a turn goes to it before its request goes (`defer`)."""
        shared = self.conversations.shared
        return shared is not None and shared.across_hosts

    async def read_ahead(self, state: FlowState, history: History | None) -> None:
        """Where the store's reads wait, the rows of the request's conversation into `state.rows`, read in one of the
        store's reading threads (the store's deadline bounds it; the loop serves other requests meanwhile), unless they
        were read for it already: its cut (NeedsRows) and the numbering of its turn (`keep`, `number`) take them."""
        if history is None or not self.across_hosts or _rows_of(self.conversations, state.rows, history) is not None:
            return
        if self._readers is None:
            self._readers = ThreadPoolExecutor(FRONT_CONNECTIONS, thread_name_prefix="trimflow-state-read")
        state.rows = await asyncio.get_running_loop().run_in_executor(self._readers, self.conversations.read_rows, history)

    def _clock(self) -> float:
        return time.time() if self._sent_at is None else self._sent_at

    def state(self, flow: http.HTTPFlow) -> FlowState | None:
        """The flow's state when it is (or may be) an LLM request, else None. Its Target is resolved on
        first use from the host the client addressed (pretty_host: the Host header in transparent mode,
        where request.host is an address)."""
        if flow in self._states:
            return self._states[flow]
        assert self.rules is not None
        request = flow.request
        target = self.rules.current().target(
            request.pretty_host, request.path, method=request.method, content_type=request.headers.get("content-type", "")
        )
        state = self._states[flow] = FlowState(target) if target is not None else None
        return state

    def tighten_for(self, flow: http.HTTPFlow) -> Tighten | None:
        """The learned limits that apply to the flow's request: those of the upstream it goes to."""
        learned = self.learned
        if learned is None:
            return None
        upstream = upstream_of(flow)
        return lambda model, limits: learned(upstream, model, limits)

    def get(self, flow: http.HTTPFlow) -> FlowState | None:
        """The flow's state if an addon has resolved it, without resolving it."""
        return self._states.get(flow)

    def websocket(self, flow: http.HTTPFlow) -> FlowState:
        """The state of a WebSocket flow whose client messages are Responses requests (Codex)."""
        state = self._states.get(flow)
        if state is None:  # its upgrade was a GET: not an LLM request of its own
            assert self.rules is not None
            target = self.rules.current().target(flow.request.pretty_host, flow.request.path, wire_format=openai_responses.NAME)
            assert target is not None  # a forced format always resolves
            state = self._states[flow] = FlowState(target)
        return state

    def defer(self, flow: http.HTTPFlow, state: FlowState, outcome: Outcome) -> None:
        """Leave the flow's record pending: worked out once its answer has gone to the client (the metrics addon), or
        sooner when a hook reads it, or when a later request needs the conversations (`settle_all`)."""
        state.pending = outcome
        if self.across_hosts:
            # Another host may take the conversation's next turn as soon as this answer is back: the turn goes to the
            # store now, before the request (the window a deferred turn leaves, docs/performance.md).
            self.settle(flow, state)
            return
        self._unsettled[flow] = state, time.time()
        self._unsettled_bytes += len(outcome.body)
        # Bounded across requests: a pending record holds its parsed body, so past either bound the oldest are
        # worked out now, as they come.
        while self._unsettled and (len(self._unsettled) > MAX_UNSETTLED or self._unsettled_bytes > MAX_UNSETTLED_BYTES):
            self._settle_oldest()

    def settle_all(self) -> None:
        """Work out every pending record, oldest first: before anything reads or moves the conversations."""
        while self._unsettled:
            self._settle_oldest()

    def settle(self, flow: http.HTTPFlow, state: FlowState) -> Record | None:
        """The flow's record, worked out now if it was left pending, after every record pending before it (turns
        are numbered in the order they came)."""
        if state.pending is None:
            return state.record
        while self._unsettled:
            if self._settle_oldest() is flow:
                break
        if state.pending is not None:  # not queued (deferred by another SharedState's caller): as it comes
            self._settle_one(flow, state)
        return state.record

    def _settle_oldest(self) -> http.HTTPFlow:
        flow, (state, sent_at) = self._unsettled.popitem(last=False)
        if state.pending is not None:
            self._unsettled_bytes -= len(state.pending.body)
        self._settle_one(flow, state, sent_at)
        return flow

    def _settle_one(self, flow: http.HTTPFlow, state: FlowState, sent_at: float | None = None) -> Record | None:
        outcome = state.pending
        if outcome is None:
            return state.record
        state.pending = None
        try:
            record = outcome.record
            if record is not None:
                log_reason(flow, record)
                if sent_at is not None:  # the record's time is when the request came (an OTel span starts there)
                    record.ts = utc_timestamp(sent_at)
                self._sent_at = sent_at
                self.keep(flow, state, record, outcome.history, *outcome.taken)
        except Exception as exc:  # noqa: BLE001 - the request is gone; only its record is lost
            log.warning("trimflow: %s%s no record: internal error %s", flow.request.pretty_host, path_of(flow), type(exc).__name__)
            return None
        finally:
            self._sent_at = None
        return record

    def keep(
        self, flow: http.HTTPFlow, state: FlowState, record: Record, history: History | None, cut: Collection[int] = (), like: Collection[int] = ()
    ) -> None:
        """Make `record` the flow's record: numbered in its conversation (with the images its cut took, and of those the
        look-alikes: the engine's Outcome.taken), with the recalls answered since the previous request, written to the
        flow."""
        state.history_line = self.number(record, history, cut, like, state.rows)
        state.rows = None  # read for this turn only
        if self.recall is not None:
            record.recalls, record.recalls_refused = self.recall.take_recalls()
        state.record = record
        write(flow, state)
        flow.comment = flow_comment(record)

    def number(
        self, record: Record, history: History | None, cut: Collection[int] = (), like: Collection[int] = (), rows: Rows | None = None
    ) -> HistoryLine | None:
        """The record's conversation, turn and segment, from its history (trimflow._conversation); returns its
        place in the conversation, for `responded`. A body that could not be read has none. `rows`: the store's rows
        read for it (`read_ahead`); where the store's reads wait, none is read here, on the loop: without them the turn
        is numbered as if the store had answered nothing (this instance's own memory)."""
        if history is None:
            return None
        conversations = self.conversations
        if self.across_hosts:
            rows = _rows_of(conversations, rows, history) or conversations.nothing_read(history)
        assignment = conversations.assign(history, record.kind, cut, like, rows)
        record.conversation, record.turn, record.segment = assignment.conversation, assignment.turn, assignment.segment
        self.cache_breaks.sent(record, history, cut)
        return assignment.history_line

    def responded(self, record: Record, history_line: HistoryLine | None, answer_head: bytes) -> None:
        """A Responses answer names its id: a later request naming it as previous_response_id continues this conversation."""
        if history_line is not None and record.format == openai_responses.NAME:
            self.conversations.responded(history_line, response_id_of(answer_head))


class _RequestMemory:
    """The conversations as the engine reads them for one request (trimflow._engine: CutMemory). On the loop, every
    pending turn is numbered first: a request that needs its conversation's memory waits for the turns before it, one
    that does not never does. Where the store's reads wait, the conversation's rows are the request's own
    (FlowState.rows): on the loop, none read yet raises NeedsRows; in a worker thread, they are read there."""

    def __init__(self, flows: SharedState, state: FlowState | None, on_loop: bool) -> None:
        self._flows, self._state, self._on_loop = flows, state, on_loop

    def recall(self, history: History) -> Recall | None:
        flows = self._flows
        if self._on_loop:
            flows.settle_all()
        conversations = flows.conversations
        if not flows.across_hosts:
            return conversations.recall(history)
        state = self._state
        rows = _rows_of(conversations, state.rows if state is not None else None, history)
        if rows is None and conversations.row_keys_of(history):
            if self._on_loop:
                raise NeedsRows(history)
            rows = conversations.read_rows(history)
            if state is not None:
                state.rows = rows
        return conversations.recall(history, rows)

    def was_cut(self, keys: Iterable[bytes]) -> bool:
        # A pending turn changed nothing, so it cut nothing: numbering it first could not make an image cut.
        return self._flows.conversations.was_cut(keys)


def _rows_of(conversations: Conversations, rows: Rows | None, history: History) -> Rows | None:
    """`rows` if they are those of the history's conversation (read for this request), else None."""
    keys = conversations.row_keys_of(history)
    return rows if rows is not None and keys and rows[0][0] == keys[0] else None


def after_hook(callback: Callable[..., object], *args: object) -> None:
    """Run `callback(*args)` once mitmproxy has done what the running hook lets it do (forward the request, send the
    answer). mitmproxy ends a hook in a task that waits for its connection's lock, held while the hook began, so that
    task goes on at the loop's next turn: a call_soon callback would run before it, a timer due now runs after it (the
    loop runs the callbacks that were ready first, then the timers that fell due)."""
    asyncio.get_running_loop().call_later(0, callback, *args)


def write(flow: http.HTTPFlow, state: FlowState) -> None:
    """The record as it stands, into flow.metadata (and so into a recording)."""
    assert state.record is not None
    data = state.record.to_dict()
    if state.error is not None:
        data["error"] = state.error
    flow.metadata[META] = data


def log_reason(flow: http.HTTPFlow, record: Record) -> None:
    if record.reason:
        log.warning("trimflow: %s%s forwarded untouched: %s", flow.request.pretty_host, path_of(flow), record.reason)


def upstream_of(flow: http.HTTPFlow) -> str:
    """The upstream the request goes to, as learned limits are keyed: the scheme, host and port mitmproxy connects
    to (in reverse mode the configured upstream, through a CONNECT tunnel its target), never the Host header,
    which the client chooses."""
    request = flow.request
    return upstream_key(request.scheme, request.host, request.port)


def path_of(flow: http.HTTPFlow) -> str:
    """The request's path without its query string, which may hold a key."""
    return flow.request.path.split("?", 1)[0]
