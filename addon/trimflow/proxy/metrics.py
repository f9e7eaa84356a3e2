"""The metrics addon: completes each LLM request's record with the answer (status, the provider's usage:
input tokens, cache reads and writes, output tokens; or the error), logs one line per request and appends
the record to trimflow_metrics (JSONL). `listeners` get each record as it is written (the prometheus addon).

Streamed answers (server-sent events and the like) are passed through as they come, not buffered,
with the usage read on the way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

from .._click_stream import ClickStream
from .._decode import DecodeError, decode_body
from .._metrics_file import MetricsFile
from .._record import Record
from .._usage import Usage, UsageScanner, usage_of
from ..formats import openai_responses, streamed_path
from .options import check_writable, exits_at_startup, starting
from .state import FlowState, SharedState, write

log = logging.getLogger("trimflow")

# The per-flow line and record wait this long (seconds) after mitmproxy sends the answer: a line through
# mitmproxy's log handlers is not free, and written at once it competed with the client reading its answer
# (docs/performance.md). Flows finishing within it share one flush.
FLUSH_DELAY = 0.005
_STREAMED_TYPES = ("text/event-stream", "application/x-ndjson", "application/vnd.amazon.eventstream")


class Metrics:
    name = "trimflow_metrics"

    def __init__(self, flows: SharedState) -> None:
        self.flows = flows
        self.file: MetricsFile | None = None
        self._unfinished: list[tuple[Record, str | None]] = []  # finished flows not yet logged, with their error (see _finish)
        self.listeners: list[Callable[[Record, str | None], None]] = []  # each gets every record written, with its error
        self._answering: dict[http.HTTPFlow, FlowState] = {}  # answers sent whose record is still to be completed

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "trimflow_metrics",
            str,
            "",
            "Append one JSON line per finished LLM request to this file (sizes and counts only). Empty: off.",
        )

    @exits_at_startup
    def configure(self, updated: set[str]) -> None:
        if "trimflow_metrics" in updated:
            path = ctx.options.trimflow_metrics
            if path and starting():
                # A path that cannot be written stops mitmproxy at start; later, writing fails open (one error line).
                check_writable("trimflow_metrics", path)
            self._flush()  # into the file they were meant for
            if self.file is not None:
                self.file.close()
            self.file = MetricsFile(path) if path else None

    def done(self) -> None:
        self._answer_waiting()  # answered as mitmproxy stops, before the loop turned again
        self._flush()
        if self.file is not None:
            self.file.close()

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        state = self.flows.get(flow)
        if state is None or (state.pending is None and state.record is None) or flow.response is None:
            return
        if flow.response.headers.get("content-type", "").startswith(_STREAMED_TYPES) or streamed_path(flow.request.path):
            # An answer that may stream for minutes: what a pending record holds (the parsed body) is not kept that long.
            self.flows.settle(flow, state)
            # Pass events through as they come (mitmproxy buffers by default) and read usage on the way; an addon
            # before this one that rewrites the events (the clicks addon) gets them after they are read.
            previous = flow.response.stream
            flow.response.stream = AnswerScanner(previous if isinstance(previous, ClickStream) else None)

    def response(self, flow: http.HTTPFlow) -> None:
        state = self.flows.get(flow)
        if state is None:
            return
        if state.pending is not None and not getattr(ctx.options, "save_stream_file", None):
            # A record left pending (a request nothing changed) is worked out once the answer has gone to the client,
            # and as its line is written, FLUSH_DELAY later: worked out at once, it competed with the client reading
            # the answer (docs/performance.md). A recording (-w) is written from this hook's round: its flows get
            # their record here.
            self._answering[flow] = state
            asyncio.get_running_loop().call_later(FLUSH_DELAY, self._answer_later, flow)
            return
        self._answer_waiting()
        self._answered(flow, state)

    def _answer_later(self, flow: http.HTTPFlow) -> None:
        state = self._answering.pop(flow, None)
        if state is not None:
            # Already FLUSH_DELAY after its answer: its line goes now (no second timer, no second wakeup of the loop).
            self._answered(flow, state, at_once=True)

    def _answer_waiting(self) -> None:
        """The answers still waiting for FLUSH_DELAY, now, in the order they came: before a later one is counted, since
        the cache breaks read a conversation's answers in order (an agent's next turn may be answered within it)."""
        while self._answering:
            flow = next(iter(self._answering))
            self._answered(flow, self._answering.pop(flow))

    def _answered(self, flow: http.HTTPFlow, state: FlowState, at_once: bool = False) -> None:
        """The record completed with the answer: status, usage, a Responses answer's id; logged and written FLUSH_DELAY
        later, or `at_once`."""
        record = self.flows.settle(flow, state)
        if record is None or flow.response is None:
            return
        record.status = flow.response.status_code
        scanner = flow.response.stream
        content = b""
        if isinstance(scanner, AnswerScanner):
            self._set_usage(record, scanner.usage)
            content = scanner.head
        elif flow.response.raw_content is not None:
            try:  # bounded like requests: an upstream's compressed answer is not inflated past the limit
                content = decode_body(flow.response.raw_content, flow.response.headers.get("content-encoding"), self.flows.max_decoded_bytes)
            except DecodeError:
                content = b""  # usage unknown; the client gets the answer as it came
            self._set_usage(record, usage_of(content))
        self.flows.responded(record, state.history_line, content[:ANSWER_HEAD])
        write(flow, state)  # before mitmproxy's save addon, later in its chain, writes the flow
        self._finish(record, None, at_once)

    def error(self, flow: http.HTTPFlow) -> None:
        state = self.flows.get(flow)
        if state is None:
            return
        self._answer_waiting()
        record = self.flows.settle(flow, state)
        if record is not None and record.status is None:
            state.error = flow.error.msg if flow.error else "error"
            response = flow.response
            if response is not None:
                # The answer had begun: an agent may hang up once it has read the final event (Codex does), and
                # what streamed through before that, its status and usage, is still what the provider said.
                record.status = response.status_code
                if isinstance(response.stream, AnswerScanner):
                    self._set_usage(record, response.stream.usage)
            write(flow, state)
            self._finish(record, state.error)

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        """A client's `response.create` the prune addon made a record of waits for the server's answer to it;
        the server event that ends that response (one at a time per connection) gives its status and usage."""
        state = self.flows.get(flow)
        if state is None or flow.websocket is None:
            return
        if state.record is not None:
            state.waiting.append((state.record, state.history_line))
            state.record = state.history_line = None
            return
        message = flow.websocket.messages[-1]
        if message.from_client or not state.waiting:
            return
        answer = openai_responses.websocket_answer(message.content)
        if answer is None:
            return
        record, history_line = state.waiting.pop(0)
        record.status, _, response_id = answer
        self._set_usage(record, usage_of(message.content))  # the answer event carries the response's usage, details and all
        self.flows.conversations.responded(history_line, response_id)
        self._finish(record, None)

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        """Requests still waiting when the connection closed: their records, with no answer."""
        state = self.flows.get(flow)
        if state is not None and state.waiting:
            waiting, state.waiting = state.waiting, []
            for record, _ in waiting:
                self._finish(record, "connection closed before the answer")

    def _set_usage(self, record: Record, usage: Usage) -> None:
        """The answer's usage into the record, and with it why the cache broke, if it did (trimflow._cache_break)."""
        for name, value in usage.record_fields().items():
            setattr(record, name, value)
        self.flows.cache_breaks.answered(record)

    def _finish(self, record: Record, error: str | None, at_once: bool = False) -> None:
        """Logs the flow's line and writes its record shortly after the answer has gone out (see FLUSH_DELAY), or
        `at_once` where that time has passed (unless others wait: then with them, in order, as their flush comes)."""
        at_once = at_once and not self._unfinished
        self._unfinished.append((record, error))
        if at_once:
            self._flush()
            return
        if len(self._unfinished) > 1:
            return  # a flush is already scheduled
        try:
            asyncio.get_running_loop().call_later(FLUSH_DELAY, self._flush)
        except RuntimeError:  # no event loop (a direct call): now
            self._flush()

    def _flush(self) -> None:
        finished, self._unfinished = self._unfinished, []
        for record, error in finished:
            log.info("trimflow: %s", record.log_line())
            if self.file is not None:
                self.file.write(record, error)
            for listener in self.listeners:
                listener(record, error)


ANSWER_HEAD = 4096  # bytes of an answer kept for its id (a Responses answer names it first)


class AnswerScanner(UsageScanner):
    """A UsageScanner that also keeps the first bytes of the answer, where a Responses answer names its id; `then`,
    when given, is the stream callable whose output goes to the client."""

    def __init__(self, then: ClickStream | None = None) -> None:
        super().__init__()
        self.head = b""
        self.then = then

    def __call__(self, chunk: bytes) -> bytes | list[bytes]:
        self.feed(chunk)
        return chunk if self.then is None else self.then(chunk)

    def feed(self, chunk: bytes) -> None:
        if len(self.head) < ANSWER_HEAD:
            self.head += chunk[: ANSWER_HEAD - len(self.head)]
        super().feed(chunk)
