"""The prune addon: applies the rules to LLM requests, streams LLM answers through while reading the usage
they report, and logs one line (and optionally one JSONL record) per request.

The work is done by the pure-Python engine (trimflow._engine); this module binds it to mitmproxy's
hooks and options.
"""

from __future__ import annotations

import asyncio
import logging
import weakref

from mitmproxy import ctx, exceptions, http

from .. import ENFORCE, MODES, NeedsWorker, Outcome, prune
from .._conversation import TurnCounter
from .._decode import DEFAULT_MAX_DECODED_BYTES, DecodeError, decode_body, is_identity
from .._decode import OPTION as DECODE_OPTION
from .._malloc import TRIM_THRESHOLD, keep_freed_memory
from .._metrics import MetricsFile
from .._profiles import DEFAULT_PROFILES_PATH, OFF, Profile, check_request, select_profile
from .._record import Record, utc_timestamp
from .._rules import DEFAULT_RULES_PATH, RulesError, RulesFile, Target
from .._sizes import format_size, parse_size
from .._usage import UsageScanner, input_tokens_of
from ..formats import gemini, openai_responses

log = logging.getLogger("trimflow")

META = "trimflow"  # flow.metadata key holding the flow's metrics record
# The per-flow line and record wait this long (seconds) after mitmproxy sends the answer: one line
# through mitmproxy's log handlers takes ~0.3 ms, and written at once it competed with the client
# reading its answer (bench: +0.25 ms per request on a 2-core machine). Flows finishing within it share one flush.
FLUSH_DELAY = 0.005
_STREAMED_TYPES = ("text/event-stream", "application/x-ndjson", "application/vnd.amazon.eventstream")
_STREAMED_PATHS = (":streamGenerateContent", ":streamRawPredict", "/converse-stream", "/invoke-with-response-stream")


class Trimflow:
    def __init__(self) -> None:
        self.rules: RulesFile | None = None
        self.metrics: MetricsFile | None = None
        self.turns = TurnCounter()
        self.max_decoded_bytes: int | None = None
        self.simulated: Profile | None = None  # trimflow_simulate's profile; None when off
        self._warned_streamed: set[str] = set()
        self._unfinished: list[dict] = []  # records of finished flows not yet logged (see _finish)
        self._pending: dict[str, Outcome] = {}  # flow id -> forwarded as it came, record not yet worked out
        # Per flow, not in flow.metadata: metadata goes into recordings (-w), and a Target is not serializable.
        self._targets: weakref.WeakKeyDictionary[http.HTTPFlow, Target | None] = weakref.WeakKeyDictionary()
        self._kept_memory = False  # trimflow_keep_memory took effect (it cannot be undone)

    def load(self, loader) -> None:
        loader.add_option(
            "trimflow_rules", str, str(DEFAULT_RULES_PATH),
            "YAML rules file: which endpoints are LLM APIs and the image and size limits per host and model. "
            "Reloaded when edited; an invalid edit keeps the last good rules.",
        )
        loader.add_option(
            "trimflow_metrics", str, "",
            "Append one JSON line per finished LLM request to this file (sizes and counts only). Empty: off.",
        )
        loader.add_option(
            "trimflow_mode", str, ENFORCE,
            "enforce: prune and forward. observe: measure and log what enforce would do, forward untouched.",
            choices=MODES,
        )
        loader.add_option(
            DECODE_OPTION, str, format_size(DEFAULT_MAX_DECODED_BYTES),
            "Largest decoded size of a compressed LLM request body; a body that would inflate further "
            "(a gzip bomb) is forwarded untouched and never inflated in memory. Bytes or k/m/g (binary).",
        )
        loader.add_option(
            "trimflow_simulate", str, OFF,
            "Name of a limit profile (see trimflow_profiles) to play the provider: a request that would be forwarded "
            "breaking it gets that provider's error answer instead, and its record says simulated. off: forward all.",
        )
        loader.add_option(
            "trimflow_keep_memory", bool, True,
            f"On Linux with glibc, keep up to {format_size(TRIM_THRESHOLD)} of freed memory in this process instead of "
            "returning it after each request: a pruned body otherwise makes glibc give the heap back and fault it in "
            "again while the next body is read (~2 ms per 16 MB request). Affects the whole process; turning it off takes a restart.",
        )
        loader.add_option(
            "trimflow_profiles", str, str(DEFAULT_PROFILES_PATH),
            "YAML file of limit profiles for trimflow_simulate; read when trimflow_simulate is not off.",
        )

    def configure(self, updated: set[str]) -> None:
        if "trimflow_mode" in updated and ctx.options.trimflow_mode not in MODES:
            # mitmproxy lists choices in the help but does not enforce them.
            raise exceptions.OptionsError(f"trimflow_mode must be one of {', '.join(MODES)}, not {ctx.options.trimflow_mode!r}")
        if "trimflow_rules" in updated or self.rules is None:
            try:
                self.rules = RulesFile(ctx.options.trimflow_rules)
            except RulesError as exc:
                raise exceptions.OptionsError(f"trimflow: {exc}") from None
            log.info("trimflow: rules from %s", self.rules.path)
        if DECODE_OPTION in updated or self.max_decoded_bytes is None:
            try:
                self.max_decoded_bytes = parse_size(getattr(ctx.options, DECODE_OPTION))
            except ValueError as exc:
                raise exceptions.OptionsError(f"trimflow: {DECODE_OPTION}: {exc}") from None
            if self.max_decoded_bytes is None:
                raise exceptions.OptionsError(f"trimflow: {DECODE_OPTION} needs a size: a compressed body must have a bound")
        if "trimflow_simulate" in updated or "trimflow_profiles" in updated:
            try:
                self.simulated = select_profile(ctx.options.trimflow_simulate, ctx.options.trimflow_profiles)
            except ValueError as exc:  # ProfilesError (file:line: problem) or UnknownProfile (lists the names)
                raise exceptions.OptionsError(f"trimflow: {exc}") from None
            if self.simulated is not None:
                log.info("trimflow: simulating limit profile %s from %s", self.simulated.name, ctx.options.trimflow_profiles)
        if "stream_large_bodies" in updated and ctx.options.stream_large_bodies:
            # mitmproxy re-checks the buffered size on every chunk and streams the rest of a larger body
            # on its own; no per-flow setting keeps it whole, so such a request cannot be pruned.
            log.warning(
                "trimflow: stream_large_bodies=%s: LLM requests larger than that are streamed by mitmproxy and go "
                "upstream unpruned; leave it unset or set it above your largest LLM request",
                ctx.options.stream_large_bodies,
            )
        if "trimflow_keep_memory" in updated and ctx.options.trimflow_keep_memory and not self._kept_memory:
            why_not = keep_freed_memory()
            self._kept_memory = why_not is None
            if why_not is not None:
                log.info("trimflow: trimflow_keep_memory has no effect here: %s", why_not)
        if "trimflow_metrics" in updated:
            self._flush()  # into the file they were meant for
            if self.metrics is not None:
                self.metrics.close()
            path = ctx.options.trimflow_metrics
            self.metrics = MetricsFile(path) if path else None

    def done(self) -> None:
        self._flush()
        if self.metrics is not None:
            self.metrics.close()

    def _target(self, flow: http.HTTPFlow) -> Target | None:
        """The flow's Target, resolved once from the host the client addressed (pretty_host: the Host
        header in transparent mode, where request.host is an address)."""
        if flow not in self._targets:
            assert self.rules is not None
            request = flow.request
            self._targets[flow] = self.rules.current().target(
                request.pretty_host, request.path, method=request.method, content_type=request.headers.get("content-type", "")
            )
        return self._targets[flow]

    def _format_for(self, flow: http.HTTPFlow) -> str | None:
        target = self._target(flow)
        return target.format if target is not None else None

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if "key=" in flow.request.path and self._format_for(flow) == gemini.NAME:
            _move_query_key_to_header(flow.request)

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or flow.request.method != "POST":
            return
        if flow.request.raw_content is None:
            self._warn_streamed(flow)
            return
        try:
            try:
                record, outcome = self._prune_flow(flow, inline=True)
            except NeedsWorker:
                record, outcome = await asyncio.to_thread(self._prune_in_worker, flow)
            if outcome is not None and outcome.record_pending:
                # Nothing to change: mitmproxy forwards the request as soon as this hook returns, and the
                # record is worked out on the next turn of the loop, while the provider answers.
                self._pending[flow.id] = outcome
                asyncio.get_running_loop().call_soon(self._account, flow)
                return
            if outcome is not None and outcome.changed:
                # Here, not in the worker: the new body is joined in this thread (see trimflow._document.Written).
                flow.request.content = outcome.body  # re-encodes with the request's content-encoding, fixes content-length
        except Exception as exc:  # noqa: BLE001 - fail open: the request goes as it came
            log.warning("trimflow: %s%s forwarded untouched: internal error %s", flow.request.pretty_host, _path(flow), type(exc).__name__)
            return
        if record is not None:
            self._annotate(flow, record)

    def _account(self, flow: http.HTTPFlow) -> None:
        """The record of a request that went as it came (Outcome.record_pending), if still pending. Also
        called by the hooks that read the record, should the answer ever come first."""
        outcome = self._pending.pop(flow.id, None)
        if outcome is None:
            return
        try:
            record = outcome.record
        except Exception as exc:  # noqa: BLE001 - the request is gone; only its record is lost
            log.warning("trimflow: %s%s no record: internal error %s", flow.request.pretty_host, _path(flow), type(exc).__name__)
            return
        if record is not None:
            self._log_reason(flow, record)
            self._annotate(flow, record)

    def _prune_in_worker(self, flow: http.HTTPFlow) -> tuple[Record | None, Outcome | None]:
        record, outcome = self._prune_flow(flow, inline=False)
        if outcome is not None and outcome.changed and not is_identity(flow.request.headers.get("content-encoding")):
            # Compressing the new body is slow: done here, and nothing is left for the loop to forward.
            flow.request.content = outcome.body
            outcome = None
        return record, outcome

    def _prune_flow(self, flow: http.HTTPFlow, inline: bool) -> tuple[Record | None, Outcome | None]:
        """The record, and the outcome whose body the caller forwards. With `inline` (on the event loop)
        raises NeedsWorker before slow work: inflating a body, simulating a provider, or what the
        engine finds slow (trimflow._engine); the caller then runs it again in a worker thread."""
        assert self.rules is not None
        rules = self.rules.current()
        request = flow.request
        target = self._target(flow)
        if target is None:
            return None, None
        headers = _plain_headers(request)
        encoding = headers.get("content-encoding")
        if inline and (not is_identity(encoding) or self.simulated):
            raise NeedsWorker("a compressed body or a simulated provider")
        try:
            # Bounded: a compressed body is never inflated past the limit (mitmproxy's decoder would).
            body = decode_body(request.raw_content or b"", encoding, self.max_decoded_bytes)
        except DecodeError as exc:
            log.warning("trimflow: %s%s forwarded untouched: %s", request.pretty_host, _path(flow), exc)
            return self._undecodable(flow, str(exc)), None
        outcome = prune(target, headers, body, rules, ctx.options.trimflow_mode, inline=inline)
        if outcome.record_pending:
            return None, outcome
        if outcome.record is None:
            return None, None
        self._log_reason(flow, outcome.record)
        if self.simulated is not None:
            # outcome.body is what goes upstream: pruned in enforce, as sent in observe.
            violation = check_request(self.simulated, request.path, outcome.body, outcome.record.format)
            if violation is not None:
                flow.response = http.Response.make(violation.status, violation.body, {"content-type": violation.content_type})
                outcome.record.simulated, outcome.record.status = violation.profile, violation.status
        return outcome.record, outcome

    def _log_reason(self, flow: http.HTTPFlow, record: Record) -> None:
        if record.reason:
            log.warning("trimflow: %s%s forwarded untouched: %s", flow.request.pretty_host, _path(flow), record.reason)

    def _undecodable(self, flow: http.HTTPFlow, reason: str) -> Record | None:
        """The record of an LLM request whose body cannot be decoded: in the metrics like any untouched one."""
        fmt = self._format_for(flow)
        if fmt is None:  # only the body's shape could have told
            return None
        request = flow.request
        record = Record(utc_timestamp(), None, None, request.pretty_host, _path(flow), fmt, None, None, ctx.options.trimflow_mode, reason=reason)
        record.body_bytes_before = record.body_bytes_after = len(request.raw_content or b"")
        return record

    def _number_turn(self, record: Record) -> None:
        if record.conversation is not None:
            record.turn = self.turns.next(record.conversation)

    def _annotate(self, flow: http.HTTPFlow, record: Record) -> None:
        self._number_turn(record)
        flow.metadata[META] = record.to_dict()
        flow.comment = f"trimflow: images {record.images_before}->{record.images_after}, body {record.body_bytes_before}->{record.body_bytes_after} bytes"

    def _warn_streamed(self, flow: http.HTTPFlow) -> None:
        host = flow.request.pretty_host
        if self._format_for(flow) is not None and host not in self._warned_streamed:
            self._warned_streamed.add(host)
            log.warning(
                "trimflow: an LLM request to %s was streamed by mitmproxy (stream_large_bodies=%s) and went upstream "
                "unpruned; set stream_large_bodies above your largest LLM request",
                host, ctx.options.stream_large_bodies,
            )

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        self._account(flow)
        if META not in flow.metadata or flow.response is None:
            return
        content_type = flow.response.headers.get("content-type", "")
        if content_type.startswith(_STREAMED_TYPES) or flow.request.path.split("?", 1)[0].endswith(_STREAMED_PATHS):
            # Pass events through as they come (mitmproxy buffers by default) and read usage on the way.
            flow.response.stream = UsageScanner()

    def response(self, flow: http.HTTPFlow) -> None:
        self._account(flow)
        record = flow.metadata.get(META)
        if record is None or flow.response is None:
            return
        record["status"] = flow.response.status_code
        scanner = flow.response.stream
        if isinstance(scanner, UsageScanner):
            record["usage_input_tokens"] = scanner.input_tokens
        elif flow.response.raw_content is not None:
            try:  # bounded like requests: an upstream's compressed answer is not inflated past the limit
                content = decode_body(flow.response.raw_content, flow.response.headers.get("content-encoding"), self.max_decoded_bytes)
            except DecodeError:
                content = b""  # usage unknown; the client gets the answer as it came
            record["usage_input_tokens"] = input_tokens_of(content)
        self._finish(record)

    def error(self, flow: http.HTTPFlow) -> None:
        self._account(flow)
        record = flow.metadata.get(META)
        if record is not None and record.get("status") is None:
            record["error"] = flow.error.msg if flow.error else "error"
            self._finish(record)

    def _finish(self, record: dict) -> None:
        """Logs the flow's line and writes its record shortly after the answer has gone out (see FLUSH_DELAY)."""
        self._unfinished.append(record)
        if len(self._unfinished) > 1:
            return  # a flush is already scheduled
        try:
            asyncio.get_running_loop().call_later(FLUSH_DELAY, self._flush)
        except RuntimeError:  # no event loop (a direct call): now
            self._flush()

    def _flush(self) -> None:
        records, self._unfinished = self._unfinished, []
        for record in records:
            log.info("trimflow: %s", Record(**{k: v for k, v in record.items() if k in Record.__dataclass_fields__}).summary())
            if self.metrics is not None:
                self.metrics.write(record)

    async def websocket_message(self, flow: http.HTTPFlow) -> None:
        """Codex sends Responses requests as WebSocket `response.create` messages: prune them the same way."""
        assert flow.websocket is not None and self.rules is not None
        message = flow.websocket.messages[-1]
        if not message.from_client or b"response.create" not in message.content[:256]:
            return
        rules = self.rules.current()
        target = rules.target(flow.request.pretty_host, flow.request.path, wire_format=openai_responses.NAME)
        assert target is not None  # a forced format always resolves
        args = (target, _plain_headers(flow.request), message.content, rules, ctx.options.trimflow_mode)
        try:
            try:
                outcome = prune(*args, inline=True)
            except NeedsWorker:
                outcome = await asyncio.to_thread(prune, *args)
        except Exception as exc:  # noqa: BLE001 - fail open
            log.warning("trimflow: websocket message forwarded untouched: internal error %s", type(exc).__name__)
            return
        if outcome.record is None:
            return
        if outcome.changed:
            message.content = outcome.body
        self._number_turn(outcome.record)
        self._finish(outcome.record.to_dict())


def _move_query_key_to_header(request: http.Request) -> None:
    """Gemini's `?key=` would show in mitmproxy's own flow log. The API takes the same key as the
    `x-goog-api-key` header, which is how Google's own SDK always sends it, so gateways accept it too.
    A query key beside a different header key is left alone: which one the provider uses is unknown."""
    key = request.query.get("key")
    if not key:
        return
    header = request.headers.get("x-goog-api-key")
    if header is None:
        request.headers["x-goog-api-key"] = key
    if header is None or header == key:
        del request.query["key"]


def _plain_headers(message: http.Message) -> dict[str, str]:
    """The headers as a dict with lower-case names (a repeated one joined as mitmproxy joins it): a
    lookup in mitmproxy's Headers scans every field, and the engine makes several per request."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in message.headers.fields:
        # Decoded as mitmproxy decodes them, so session header values hash alike here and in recordings.
        name, value = raw_name.decode("utf-8", "surrogateescape").lower(), raw_value.decode("utf-8", "surrogateescape")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def _path(flow: http.HTTPFlow) -> str:
    return flow.request.path.split("?", 1)[0]


addons = [Trimflow()]
