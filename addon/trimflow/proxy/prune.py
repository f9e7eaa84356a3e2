"""The prune addon: applies the rules to LLM requests (HTTP bodies, and Codex's WebSocket `response.create`
messages) with the pure-Python engine (trimflow._engine).

Light work runs on the event loop; the engine raises NeedsWorker before slow work (a large body, a full
parse, Pillow), and so does this addon before inflating a compressed body: that run goes to a worker
thread. A shared store whose reads wait on another machine (trimflow_state) is never read on the loop: a
request's conversation rows are read in a worker thread (NeedsRows, SharedState.read_ahead), and the run goes
on inline with them. A request needing no change is forwarded as soon as the hook returns; its record and its turn
(the conversation digest) are worked out once its answer has gone to the client (SharedState.defer).
"""

from __future__ import annotations

import asyncio
import logging

from mitmproxy import ctx, exceptions, http
from mitmproxy.addonmanager import Loader

from .. import ENFORCE, MODES, NeedsWorker, Outcome, prune
from .._decode import DEFAULT_MAX_DECODED_BYTES, DecodeError, decode_body, is_identity
from .._decode import OPTION as DECODE_OPTION
from .._history import History
from .._human import format_size, parse_duration, parse_size
from .._recall import RecallIds, owner_of
from .._record import TURN, Record
from .._rules_file import CHECK_INTERVAL, DEFAULT_RULES_PATH, RulesFile
from ..errors import RulesError
from .options import exits_at_startup
from .state import FlowState, NeedsRows, SharedState, after_hook, log_reason, path_of

log = logging.getLogger("trimflow")

RULES_CHECK_OPTION = "trimflow_rules_check"
# What a turn's cut took: the engine's Outcome.taken (the images cut, and of those the look-alikes).
Taken = tuple[frozenset[int], frozenset[int]]
_NOTHING_TAKEN: Taken = (frozenset(), frozenset())


class Prune:
    name = "trimflow_prune"  # mitmproxy names addons by class; a prefix keeps clear of other scripts'

    def __init__(self, flows: SharedState) -> None:
        self.flows = flows
        self.rules_check = CHECK_INTERVAL
        self._warned_streamed: set[str] = set()

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "trimflow_rules",
            str,
            str(DEFAULT_RULES_PATH),
            "YAML rules file: which endpoints are LLM APIs and the image and size limits per host and model. "
            "Reloaded when edited; an invalid edit keeps the last good rules.",
        )
        loader.add_option(
            RULES_CHECK_OPTION,
            str,
            f"{CHECK_INTERVAL:g}s",
            "How often, at most, the rules file is looked at for edits, when a request comes (e.g. 1s, 0.2s, 5m); 0: on every request.",
        )
        loader.add_option(
            "trimflow_mode",
            str,
            ENFORCE,
            "enforce: prune and forward. observe: measure and log what enforce would do, forward untouched.",
            choices=MODES,
        )
        loader.add_option(
            DECODE_OPTION,
            str,
            format_size(DEFAULT_MAX_DECODED_BYTES),
            "Largest decoded size of a compressed LLM request body; a body that would inflate further "
            "(a gzip bomb) is forwarded untouched and never inflated in memory. Bytes or k/m/g (binary).",
        )

    @exits_at_startup
    def configure(self, updated: set[str]) -> None:
        if "trimflow_mode" in updated and ctx.options.trimflow_mode not in MODES:
            # mitmproxy lists choices in the help but does not enforce them.
            raise exceptions.OptionsError(f"trimflow: trimflow_mode must be one of {', '.join(MODES)}, not {ctx.options.trimflow_mode!r}")
        if RULES_CHECK_OPTION in updated:
            try:
                interval = parse_duration(getattr(ctx.options, RULES_CHECK_OPTION))
            except ValueError as exc:
                raise exceptions.OptionsError(f"trimflow: {RULES_CHECK_OPTION}: {exc}") from None
            if interval is None:
                raise exceptions.OptionsError(f"trimflow: {RULES_CHECK_OPTION} needs a duration (0: on every request)")
            self.rules_check = interval
            if self.flows.rules is not None:  # from its next look at the file on
                self.flows.rules.check_interval = interval
        if "trimflow_rules" in updated or self.flows.rules is None:
            try:
                self.flows.rules = RulesFile(ctx.options.trimflow_rules, check_interval=self.rules_check)
            except RulesError as exc:
                raise exceptions.OptionsError(f"trimflow: {exc}") from None
            log.info("trimflow: rules from %s", self.flows.rules.path)
        if DECODE_OPTION in updated:
            try:
                limit = parse_size(getattr(ctx.options, DECODE_OPTION))
            except ValueError as exc:
                raise exceptions.OptionsError(f"trimflow: {DECODE_OPTION}: {exc}") from None
            if limit is None:
                raise exceptions.OptionsError(f"trimflow: {DECODE_OPTION} needs a size: a compressed body must have a bound")
            self.flows.max_decoded_bytes = limit
        if "stream_large_bodies" in updated and ctx.options.stream_large_bodies:
            # mitmproxy re-checks the buffered size on every chunk and streams the rest of a larger body
            # on its own; no per-flow setting keeps it whole, so such a request cannot be pruned.
            log.warning(
                "trimflow: stream_large_bodies=%s: LLM requests larger than that are streamed by mitmproxy and go "
                "upstream unpruned; leave it unset or set it above your largest LLM request",
                ctx.options.stream_large_bodies,
            )

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or flow.request.method != "POST":
            return
        try:
            state = self.flows.state(flow)
            if state is None:
                return
            if flow.request.raw_content is None:
                self._warn_streamed(flow, state)
                return
            history, taken = None, _NOTHING_TAKEN
            state.rows = None
            try:
                record, outcome = await self._prune_inline(flow, state)
            except NeedsWorker:
                self.flows.settle_all()  # the worker reads the conversations: every turn before this one first
                record, outcome, history, taken = await asyncio.to_thread(self._prune_in_worker, flow, state)
            if outcome is not None and outcome.record_pending:
                if self.flows.across_hosts and outcome.record is not None and outcome.record.kind == TURN:
                    await self.flows.read_ahead(state, outcome.history)  # in a worker thread, for numbering its turn
                # Nothing to change: mitmproxy forwards the request as soon as this hook returns; the record and
                # the turn wait for the answer to have gone out (the metrics addon).
                self.flows.defer(flow, state, outcome)
                return
            if outcome is not None and outcome.changed:
                # Here, not in the worker: the new body is joined in this thread (see trimflow._body.Written).
                flow.request.content = outcome.body  # re-encodes with the request's content-encoding, fixes content-length
        except Exception as exc:  # noqa: BLE001 - fail open: the request goes as it came
            log.warning("trimflow: %s%s forwarded untouched: internal error %s", flow.request.pretty_host, path_of(flow), type(exc).__name__)
            return
        if record is not None:
            if outcome is not None:
                history, taken = outcome.history, outcome.taken
            if record.kind == TURN:
                await self.flows.read_ahead(state, history)  # where the store's reads wait: in a worker thread
            self.flows.settle_all()  # numbered after the turns that came before it
            self.flows.keep(flow, state, record, history, *taken)
            store = self.flows.recall
            if state.kept and store is not None:
                # Its cut images are copied for the store once the request has gone.
                after_hook(store.offer, record.conversation, state.kept)
            state.kept = []

    async def _prune_inline(self, flow: http.HTTPFlow, state: FlowState) -> tuple[Record | None, Outcome | None]:
        """`_prune_flow` on the event loop. A request whose cut needs its conversation's rows in a store whose reads
        wait (NeedsRows) has them read in a worker thread, then runs inline again; raises NeedsWorker for slow work."""
        try:
            return self._prune_flow(flow, state, inline=True)
        except NeedsRows as need:
            await self.flows.read_ahead(state, need.history)
        return self._prune_flow(flow, state, inline=True)  # NeedsRows again (the store changed meanwhile): a worker's run

    def _prune_in_worker(self, flow: http.HTTPFlow, state: FlowState) -> tuple[Record | None, Outcome | None, History | None, Taken]:
        """As `_prune_flow`, in a worker thread: also the history (digested here, off the loop) and the images the cut
        took, for when the outcome is already forwarded (None: a compressed body re-encoded here)."""
        record, outcome = self._prune_flow(flow, state, inline=False)
        if outcome is None:
            return record, None, None, _NOTHING_TAKEN
        history = outcome.history if record is not None else None
        taken = outcome.taken
        if outcome.changed and not is_identity(flow.request.headers.get("content-encoding")):
            # Compressing the new body is slow: done here, and nothing is left for the loop to forward.
            flow.request.content = outcome.body
            outcome = None
        return record, outcome, history, taken

    def _prune_flow(self, flow: http.HTTPFlow, state: FlowState, inline: bool) -> tuple[Record | None, Outcome | None]:
        """The record, and the outcome whose body the caller forwards. With `inline` (on the event loop)
        raises NeedsWorker before slow work: inflating a body, or what the engine finds slow
        (trimflow._engine); the caller then runs it again in a worker thread."""
        assert self.flows.rules is not None
        rules = self.flows.rules.current()
        request = flow.request
        headers = plain_headers(request)
        encoding = headers.get("content-encoding")
        if inline and not is_identity(encoding):
            raise NeedsWorker("a compressed body")
        try:
            # Bounded: a compressed body is never inflated past the limit (mitmproxy's decoder would).
            body = decode_body(request.raw_content or b"", encoding, self.flows.max_decoded_bytes)
        except DecodeError as exc:
            log.warning("trimflow: %s%s forwarded untouched: %s", request.pretty_host, path_of(flow), exc)
            return self._undecodable(flow, state, str(exc)), None
        outcome = prune(
            state.target,
            headers,
            body,
            rules,
            ctx.options.trimflow_mode,
            inline=inline,
            memory=self.flows.memory_for(state, on_loop=inline),
            tighten=self.flows.tighten_for(flow),
            recall=self._recall_ids(headers, inline),
        )
        state.screen = outcome.screen
        state.kept = outcome.kept
        if outcome.record_pending:
            return None, outcome
        if outcome.record is None:
            return None, None
        log_reason(flow, outcome.record)
        return outcome.record, outcome

    def _recall_ids(self, headers: dict[str, str], inline: bool) -> RecallIds | None:
        """With recall on, the ids of the request's images, for its placeholders: when its credentials are the run's."""
        store = self.flows.recall
        if store is None or not store.in_use:
            return None
        owner = owner_of(store.token, headers)
        if not store.accepts(owner):
            return None
        return store.ids(owner, _hash_in_worker if inline else None)

    @staticmethod
    def _undecodable(flow: http.HTTPFlow, state: FlowState, reason: str) -> Record | None:
        """The record of an LLM request whose body cannot be decoded: in the metrics like any untouched one."""
        fmt = state.target.format
        if fmt is None:  # only the body's shape could have told
            return None
        request = flow.request
        return Record.untouched(request.pretty_host, path_of(flow), fmt, ctx.options.trimflow_mode, reason, len(request.raw_content or b""))

    def _warn_streamed(self, flow: http.HTTPFlow, state: FlowState) -> None:
        host = flow.request.pretty_host
        if state.target.format is not None and host not in self._warned_streamed:
            self._warned_streamed.add(host)
            log.warning(
                "trimflow: an LLM request to %s was streamed by mitmproxy (stream_large_bodies=%s) and went upstream "
                "unpruned; set stream_large_bodies above your largest LLM request",
                host,
                ctx.options.stream_large_bodies,
            )

    async def websocket_message(self, flow: http.HTTPFlow) -> None:
        """Codex sends Responses requests as WebSocket `response.create` messages: prune them the same way."""
        assert flow.websocket is not None and self.flows.rules is not None
        message = flow.websocket.messages[-1]
        if not message.from_client or b"response.create" not in message.content[:256]:
            return
        state = self.flows.websocket(flow)
        args = (state.target, plain_headers(flow.request), message.content, self.flows.rules.current(), ctx.options.trimflow_mode)
        tighten = self.flows.tighten_for(flow)
        state.rows = None  # read for each message
        try:
            try:
                try:
                    outcome = prune(*args, inline=True, memory=self.flows.memory_for(state), tighten=tighten)
                except NeedsRows as need:
                    await self.flows.read_ahead(state, need.history)
                    outcome = prune(*args, inline=True, memory=self.flows.memory_for(state), tighten=tighten)
            except NeedsWorker:
                self.flows.settle_all()
                memory = self.flows.memory_for(state, on_loop=False)
                outcome = await asyncio.to_thread(prune, *args, memory=memory, tighten=tighten)
            record = outcome.record
            if record is None:
                return
            if record.kind == TURN:
                await self.flows.read_ahead(state, outcome.history)
        except Exception as exc:  # noqa: BLE001 - fail open
            log.warning("trimflow: websocket message forwarded untouched: internal error %s", type(exc).__name__)
            return
        if outcome.changed:
            message.content = outcome.body
        self.flows.settle_all()
        state.history_line = self.flows.number(record, outcome.history, *outcome.taken, state.rows)
        state.rows = None
        state.record = record  # for the metrics addon's websocket_message, next in the chain


def _hash_in_worker() -> None:
    raise NeedsWorker("images to hash for recall")


def plain_headers(message: http.Message) -> dict[str, str]:
    """The headers as a dict with lower-case names (a repeated one joined as mitmproxy joins it): a
    lookup in mitmproxy's Headers scans every field, and the engine makes several per request."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in message.headers.fields:
        # Decoded as mitmproxy decodes them, so session header values hash alike here and in recordings.
        name, value = raw_name.decode("utf-8", "surrogateescape").lower(), raw_value.decode("utf-8", "surrogateescape")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers
