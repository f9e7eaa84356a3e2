"""The recover addon: when the provider refuses a request for a limit the rules did not know, send it again
within the limit its answer names, remember that limit for later requests, and give the client the retry's
answer.

- `request` (before the prune addon) keeps a reference to the body as the client sent it, until the answer's
  status shows it cannot be a limit error, or the flow ends.
- `response` (before the metrics addon) reads an error answer against the limit-error patterns
  (trimflow._limit_errors); the original body is pruned again under the tightened limits, and the request goes
  upstream once more through mitmproxy's own connection machinery, as client replay sends a flow
  (trimflow.proxy._resend: where recovery reaches into mitmproxy's proxy core). At most
  trimflow_retries times, and never when the tightened limits change nothing. Only when the upstream accepts
  a retry are its limits learned (trimflow._learned_limits, option trimflow_learned), for the upstream the request
  went to; a limit played by trimflow_simulate is learned in memory only.
- `HoldErrorAnswers` (after the metrics addon) holds a candidate error answer back from the client, up to ANSWER_MAX bytes:
  an answer streamed to the client could not be taken back. A larger one goes to the client as it comes and is
  not retried, so a long answer is never all in memory (for an answer of unknown length, through mitmproxy's size
  check, extended while the addon runs: from its `running` hook to its `done`).
- A retry ends with its client: when the client's connection closes, the retry's upstream connection is closed
  (`client_disconnected`), and nothing is learned from it.

The retry's answer reaches the client whole: mitmproxy sends a response set in the `response` hook from
its content, in one piece, so a streamed retry arrives at once when it is complete (docs/recovery.md).
A retry is a flow of its own that no addon sees: the original flow went through them all (headers,
keys, upstream auth), and its record and log line tell the retries.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, fields

from mitmproxy import connection, ctx, exceptions, http
from mitmproxy.addonmanager import Loader
from mitmproxy.net.http.http1 import expected_http_body_size

from .. import ENFORCE, Limits, prune
from .._decode import DecodeError, decode_body
from .._engine import Tighten, is_sigv4
from .._history import History
from .._human import parse_duration
from .._learned_limits import DEFAULT_TTL, FILE_NAME, LearnedBackend, LearnedLimits
from .._limit_errors import ANSWER_MAX, HOST, NEVER, LimitError, Patterns, Refused, Rejected, assess, load_patterns, scope
from .._limit_profiles import check_request
from .._record import TURN, Record
from ..errors import RulesError
from ..formats import counted_turn_path
from ._resend import HeldAnswer, cancel_retries, extend_size_check, held_answer_body, held_answers, resend, restore_size_check
from .comment import flow_comment
from .options import confdir_path, exits_at_startup
from .prune import plain_headers
from .simulate import Simulate
from .state import FlowState, SharedState, path_of, upstream_of, write

log = logging.getLogger("trimflow")

DEFAULT_LEARNED = "{confdir}/" + FILE_NAME
DEFAULT_RETRIES = 2
# What the retry sent, copied into the original flow's record over what the refused request sent.
_SENT_FIELDS = tuple(
    f.name
    for f in fields(Record)
    if f.name.endswith("_after")
    or f.name.startswith(("pruned", "shrunk", "thinned", "native"))
    or f.name in ("over_budget", "deduplicated", "by_reference", "reference_bytes_saved")
)


@dataclass(slots=True)
class _Sent:
    """One request as it went upstream: its body (decoded), and what it held."""

    body: bytes
    body_bytes: int
    images: int


class Recover:
    name = "trimflow_recover"

    def __init__(self, flows: SharedState, simulate: Simulate) -> None:
        self.flows = flows
        self.simulate = simulate  # its profile answers a retry as it answered the request
        self._patterns: Patterns | None = None  # the shipped ones until trimflow_limit_errors is configured
        self.learned = LearnedLimits(None)
        self._learned_store: Callable[[float | None], LearnedBackend] | None = None
        self.simulated = LearnedLimits(None)  # what answers played by trimflow_simulate taught: never in the file
        self.hold = HoldErrorAnswers(self)
        self._originals: weakref.WeakKeyDictionary[http.HTTPFlow, bytes] = weakref.WeakKeyDictionary()
        self.refused = self.recovered = self.limits_learned = 0

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "trimflow_recover",
            bool,
            True,
            "In enforce mode, when the provider refuses a request for a limit (its answer names it), prune it within "
            "that limit, send it again and give the client that answer; remember the limit (trimflow_learned).",
        )
        loader.add_option("trimflow_retries", int, DEFAULT_RETRIES, "Most times one request is sent again after a limit error.")
        loader.add_option(
            "trimflow_learned",
            str,
            DEFAULT_LEARNED,
            "YAML file of the limits learned from providers' answers, applied to later requests on top of the rules; "
            "{confdir} is mitmproxy's confdir. Empty: kept in memory only.",
        )
        loader.add_option(
            "trimflow_learned_ttl",
            str,
            f"{DEFAULT_TTL / 86400:.0f}d",
            "How long a learned limit applies (e.g. 12h, 7d); then it is learned again if the provider still refuses.",
        )
        loader.add_option(
            "trimflow_limit_errors",
            str,
            "",
            "YAML file of limit-error patterns for your gateways, tried before the shipped rules/limit_errors.yaml.",
        )

    @exits_at_startup
    def configure(self, updated: set[str]) -> None:
        if "trimflow_retries" in updated and ctx.options.trimflow_retries < 0:
            raise exceptions.OptionsError(f"trimflow: trimflow_retries must be 0 or more, not {ctx.options.trimflow_retries}")
        if "trimflow_limit_errors" in updated:
            try:
                self._patterns = load_patterns(ctx.options.trimflow_limit_errors or None)
            except RulesError as exc:
                raise exceptions.OptionsError(f"trimflow: {exc}") from None
        if "trimflow_learned_ttl" in updated:
            try:
                ttl = parse_duration(ctx.options.trimflow_learned_ttl)
            except ValueError as exc:
                raise exceptions.OptionsError(f"trimflow: trimflow_learned_ttl: {exc}") from None
            if ttl is not None and ttl <= 0:
                raise exceptions.OptionsError("trimflow: trimflow_learned_ttl must be more than 0 (or none: never expire)")
            self.learned.ttl = self.simulated.ttl = ttl
        if "trimflow_learned" in updated or "confdir" in updated:
            self._open_learned()

    def share_learned(self, store: Callable[[float | None], LearnedBackend] | None) -> None:
        """The shared store (trimflow_state, ShareConversations) keeps the learned limits in place of the file: `store`
        makes its backend for a time to live; None, the file again."""
        self._learned_store = store
        self._open_learned()

    def _open_learned(self) -> None:
        self.learned.close()
        if self._learned_store is not None:
            kept_in: str | None = "the shared state"
            self.learned = LearnedLimits(None, ttl=self.learned.ttl, store=self._learned_store(self.learned.ttl))
        else:
            kept_in = confdir_path(ctx.options.trimflow_learned, ctx.options.confdir)
            self.learned = LearnedLimits(kept_in, ttl=self.learned.ttl)
        # Read in the learned limits' own thread; a file or store that does not answer in time is read when it does.
        if not self.learned.start():
            log.warning("trimflow: learned limits file %s not read yet; its limits apply once it is", kept_in)
        elif kept_in is not None and self.learned.live():
            log.info("trimflow: %d learned limits from %s", len(self.learned.live()), kept_in)
        self.flows.learned = self.tighten

    def done(self) -> None:
        self.learned.close()

    def tighten(self, upstream: str, model: str | None, limits: Limits) -> Limits:
        """`limits` with what was learned for this upstream and model (and, while a profile plays the provider, what
        its answers taught) applied."""
        limits = self.learned.tighten(upstream, model, limits)
        return self.simulated.tighten(upstream, model, limits) if self.simulate.profile is not None else limits

    @property
    def patterns(self) -> Patterns:
        if self._patterns is None:
            self._patterns = load_patterns()
        return self._patterns

    def summary(self) -> str | None:
        """The exit line: requests refused for a limit, recovered, and limits learned (None when none was refused)."""
        if not self.refused:
            return None
        where = self.learned.path if self.learned.path is not None else "memory only"
        return (
            f"trimflow: refused for a limit: {self.refused} requests, recovered by a retry: {self.recovered}; "
            f"limits learned: {self.limits_learned} ({where})"
        )

    # -- hooks

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or not ctx.options.trimflow_recover or ctx.options.trimflow_mode != ENFORCE:
            return
        if flow.request.method != "POST" or flow.request.raw_content is None or is_sigv4(flow.request.headers):
            return  # a streamed body cannot be sent again; a signed one must not change
        if self.flows.state(flow) is None:
            return
        self._originals[flow] = flow.request.raw_content  # a reference: the prune addon assigns a new body

    def error(self, flow: http.HTTPFlow) -> None:
        self._originals.pop(flow, None)

    def client_disconnected(self, client: connection.Client) -> None:
        cancel_retries(client)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        # An answer that cannot be a limit error lets the client's body go now, not when a long streamed answer ends:
        # a pruned request's original would otherwise live as long as the provider takes to answer.
        if flow.response is not None and not _may_be_limit(flow.response.status_code):
            self._originals.pop(flow, None)

    def response(self, flow: http.HTTPFlow) -> Coroutine[None, None, None] | None:
        # Not `async def`: an answer that cannot be a limit error, the usual case, makes no coroutine.
        # mitmproxy awaits what a hook returns when it is awaitable.
        original = self._originals.pop(flow, None)
        if original is None or flow.response is None or not _may_be_limit(flow.response.status_code):
            return None
        if flow.response.stream:
            return None  # it has gone to the client as it came (stream_large_bodies): it cannot be replaced
        return self._answer(flow, original)

    async def _answer(self, flow: http.HTTPFlow, original: bytes) -> None:
        state = self.flows.get(flow)
        record = self.flows.settle(flow, state) if state is not None else None
        if state is None or record is None or record.mode != ENFORCE or record.reason is not None:
            return
        try:
            await self._recover(flow, state, record, original)
        except Exception as exc:  # noqa: BLE001 - fail open: the client gets the provider's answer as it came
            log.warning("trimflow: %s%s not retried: internal error %s", flow.request.pretty_host, path_of(flow), type(exc).__name__)

    async def _recover(self, flow: http.HTTPFlow, state: FlowState, record: Record, original: bytes) -> None:
        assert flow.response is not None and self.flows.rules is not None
        upstream = upstream_of(flow)
        error = self._limit_error(flow.response, state.target.host)
        if error is None:
            return
        self.refused += 1
        request = flow.request
        sent = _Sent(b"", record.body_bytes_after, record.images_after)
        retries: list[tuple[str, str]] = []  # (why, the limits tightened) per retry
        # What the refusals taught, applied to the retries; learned only once the upstream accepts one of them.
        taught = LearnedLimits(None, ttl=None)
        refused_status: int | None = None
        last_response = flow.response
        simulated = record.simulated
        while True:
            tighten = self._tighten_for(upstream, taught)
            limits = tighten(record.model, self._rule_limits(state, record.model))
            tightening = assess(error, limits, Refused(sent.body_bytes, sent.images))
            if isinstance(tightening, Rejected):
                log.info("trimflow: %s%s not retried: %s", request.pretty_host, path_of(flow), tightening.reason)
                break
            taught.learn(upstream, None if scope(error) == HOST else record.model, tightening.fields, error.source)
            if len(retries) >= ctx.options.trimflow_retries:
                break
            attempt = await asyncio.to_thread(self._prepare, flow, state, original, sent.body, self._tighten_for(upstream, taught))
            if attempt is None:
                log.info("trimflow: %s%s not retried: %s, and the tightened limits change nothing", request.pretty_host, path_of(flow), error.reason)
                break
            retry_request, retry_record, body, retry_cut = attempt
            retries.append((tightening.describe(error), " ".join(f"{k}={v}" for k, v in tightening.fields.items())))
            refused_status = refused_status or last_response.status_code
            answer, simulated_by = await self._send(retry_request, flow, body, record.format)
            if isinstance(answer, str):  # no answer: the client gets the last one the provider gave
                log.warning("trimflow: %s%s retry failed: %s", request.pretty_host, path_of(flow), answer)
                break
            last_response, simulated = answer, simulated_by
            sent = _Sent(body, retry_record.body_bytes_after, retry_record.images_after)
            for name in _SENT_FIELDS:
                setattr(record, name, getattr(retry_record, name))
            if 200 <= answer.status_code < 300:
                self._learn(flow, upstream, taught, self.simulate.profile is not None)
                if retry_cut is not None:
                    self.flows.conversations.recut(state.history_line, *retry_cut)
                    self.flows.cache_breaks.recut(record, retry_cut[1])
                break
            if not _may_be_limit(answer.status_code):
                break
            next_error = self._limit_error(answer, state.target.host)
            if next_error is None:
                break
            error = next_error
        if not retries:
            return
        flow.response = last_response
        record.retries, record.refused_status = len(retries), refused_status
        record.retry_reasons = "; ".join(why for why, _ in retries)
        record.retry_limits = "; ".join(limits for _, limits in retries)
        record.simulated = simulated
        record.status = last_response.status_code
        if last_response.status_code < 400:
            self.recovered += 1
        write(flow, state)
        flow.comment = flow_comment(record)

    def _learn(self, flow: http.HTTPFlow, upstream: str, taught: LearnedLimits, simulated: bool) -> None:
        """Keep what the refusals taught: the upstream accepted a request within it. A profile's answers teach the
        in-memory limits only: the file holds what real providers said."""
        store = self.simulated if simulated else self.learned
        for lesson in taught.entries:
            try:
                changed = store.learn(upstream, lesson.model, {lesson.limit: lesson.value}, lesson.source)
            except ValueError as exc:  # under a floor: `tightened` keeps to them, a user's pattern may not
                log.warning("trimflow: %s%s not learned: %s", flow.request.pretty_host, path_of(flow), exc)
                continue
            if changed:
                self.limits_learned += len(changed)
                for_what = f"model {lesson.model}" if lesson.model is not None else "every model"
                where = "in memory (simulated)" if simulated else "learned"
                log.info("trimflow: %s %s=%d for %s at %s (%s)", where, lesson.limit, lesson.value, for_what, upstream, lesson.source)

    def _limit_error(self, response: http.Response, host: str) -> LimitError | None:
        body = held_answer_body(response)
        return None if body is None else self.patterns.recognise(response.status_code, body, host)

    def _rule_limits(self, state: FlowState, model: str | None) -> Limits:
        """The limits the request's rule gives (a token count's: its turn's)."""
        assert self.flows.rules is not None
        target = state.target
        path = target.path
        if target.format is not None:
            path = counted_turn_path(target.format, path) or path
        return self.flows.rules.current().limits_for(target.host, path, model)

    def _tighten_for(self, upstream: str, taught: LearnedLimits) -> Tighten:
        """What is learned for the upstream, then what this request's refusals taught, on top of a rule's limits."""

        def tighten(model: str | None, limits: Limits) -> Limits:
            return taught.tighten(upstream, model, self.tighten(upstream, model, limits))

        return tighten

    def _prepare(
        self, flow: http.HTTPFlow, state: FlowState, original: bytes, last_body: bytes, tighten: Tighten
    ) -> tuple[http.Request, Record, bytes, tuple[History, frozenset[int], frozenset[int]] | None] | None:
        """In a worker thread: the original body pruned again under `tighten` (the limits learned now and those the
        refusals taught), in the order the conversation's images came (its memory reads only, as the prune's does),
        as a request to send with the turn's history and the images its cut took (None for a request that is not a
        turn); None when that is the body already refused."""
        assert self.flows.rules is not None
        request = flow.request
        encoding = request.headers.get("content-encoding")
        try:
            body = decode_body(original, encoding, self.flows.max_decoded_bytes)
        except DecodeError:
            return None
        memory = self.flows.conversations
        outcome = prune(state.target, plain_headers(request), body, self.flows.rules.current(), ENFORCE, memory=memory, tighten=tighten)
        retry_record = outcome.record
        if retry_record is None or retry_record.mode != ENFORCE:
            return None
        new_body = outcome.body
        refused = last_body or decode_body(request.raw_content or b"", encoding, self.flows.max_decoded_bytes)
        if new_body == refused:
            return None
        state.screen = outcome.screen  # the answer to come is the retry's: its coordinates map as its screenshot went
        retry = request.copy()
        retry.content = new_body  # encoded as the request was (content-encoding), with its content-length
        retry.timestamp_start, retry.timestamp_end = time.time(), None
        history = outcome.history if retry_record.kind == TURN else None
        return retry, retry_record, new_body, (history, *outcome.taken) if history is not None else None

    async def _send(self, request: http.Request, original: http.HTTPFlow, body: bytes, wire_format: str) -> tuple[http.Response | str, str | None]:
        """The answer to `request` (or why there is none), and the simulated profile when one answered."""
        profile = self.simulate.profile
        if profile is not None:
            violation = await asyncio.to_thread(check_request, profile, request.path, body, wire_format)
            if violation is not None:
                response = http.Response.make(violation.status, violation.body, {"content-type": violation.content_type})
                return response, violation.profile
        return await resend(request, original.client_conn, original.server_conn.sni), None


def _may_be_limit(status: int) -> bool:
    return 400 <= status < 500 and status not in NEVER


class HoldErrorAnswers:
    """After the metrics addon: holds an error answer that may be a limit error back from the client, up to
    ANSWER_MAX bytes, so that the recover addon can read it and answer with the retry's. A larger answer goes to
    the client as it comes, the held part first, and is not retried (the metrics addon streams answers on streamed
    paths; mitmproxy buffers the rest whole)."""

    name = "trimflow_recover_hold"

    def __init__(self, recover: Recover) -> None:
        self.recover = recover
        self.bounded = False  # whether mitmproxy's size check streams a held answer past ANSWER_MAX: while running

    def running(self) -> None:
        # Here, not at construction: building the addons (or importing trimflow) leaves mitmproxy as it is.
        if not self.bounded:
            self.bounded = extend_size_check()

    def done(self) -> None:
        summary = self.recover.summary()  # here, after the metrics addon has written its last lines
        if summary is not None:
            log.info("%s", summary)
        if self.bounded:
            self.bounded = False
            restore_size_check()

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is None or flow not in self.recover._originals or not _may_be_limit(response.status_code):
            return
        try:
            length = expected_http_body_size(flow.request, response)  # None or -1: unknown until the answer ends
        except ValueError:
            length = None
        if (length is not None and length > ANSWER_MAX) or (length in (None, -1) and not self.bounded):
            self.recover._originals.pop(flow, None)  # no retry: the client's body can go
            response.stream = response.stream or True
            return
        held_answers[flow] = HeldAnswer(response.stream, self.recover._originals)
        response.stream = False

    def response(self, flow: http.HTTPFlow) -> None:
        held_answers.pop(flow, None)

    def error(self, flow: http.HTTPFlow) -> None:
        held_answers.pop(flow, None)


__all__ = ["DEFAULT_LEARNED", "HoldErrorAnswers", "Recover"]
