"""The audit's inputs: mitmproxy dumps (.mitm, mitmproxy 11 and 12), HAR files and trimflow's metrics JSONL.

Each input is read one flow (or line) at a time and turned into small rows of figures: the engine's
metrics record for the request, in observe mode, plus the recorded answer (status, provider usage,
a failure category). Bodies are dropped as soon as a flow is measured, so memory does not grow with
the size of a recording, only with its number of requests (a few hundred bytes each). HAR is the
exception: mitmproxy parses a HAR file as one JSON document.

mitmproxy reads the dumps and HAR files (trimflow.proxy.recordings), imported only when one is read:
the audit of a metrics JSONL, and `import trimflow.audit`, work without mitmproxy.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from .._cache_break import CacheBreaks
from .._conversation import Conversations, HistoryLine
from .._decode import DEFAULT_MAX_DECODED_BYTES, BodyTooLarge, DecodeError, decode_body
from .._engine import prune
from .._history import History, response_id_of
from .._human import format_size
from .._record import ENFORCE, OBSERVE, Record, utc_timestamp
from .._rules import Rules, Target
from .._usage import Usage, usage_of
from ..errors import InputError
from ..formats import openai_responses

if TYPE_CHECKING:
    from mitmproxy import http

PROXY_META = "trimflow"  # the flow.metadata key where the addon keeps its record (trimflow.proxy.META)

# Failure categories: fixed labels, never the provider's text itself (it may quote the request).
BODY_TOO_LARGE = "body too large"
TOO_MANY_IMAGES = "too many images"
IMAGE_TOO_LARGE = "image too large"
NO_RESPONSE = "no response"

# Provider error texts (see providers.md, "Error texts users hit"), checked in this order: an image's
# own size error also says "exceeds ... maximum", so it comes before the body checks.
_FAILURE_TEXTS = (
    (IMAGE_TOO_LARGE, re.compile(r"image exceeds|image dimensions exceed")),
    (TOO_MANY_IMAGES, re.compile(r"too many images|max images exceeded|too much media|images?,? exceeding the maximum")),
    (
        BODY_TOO_LARGE,
        re.compile(
            r"request_too_large|request entity too large|payload too large|exceeds the maximum|length limit exceeded"
            r"|request payload size exceeds|request size cannot exceed|maximum request body size"
        ),
    ),
)
_FAILURE_SCAN = 64 * 1024  # error texts are short; a long answer is not read past this

# The Record's before figures: what the client sent.
BEFORE_FIELDS = ("images_before", "documents", "media_bytes_before", "body_bytes_before", "est_tokens_before")
_INT_FIELDS = frozenset(name for name, spec in Record.__dataclass_fields__.items() if spec.type in ("int", "int | None"))
_STR_FIELDS = frozenset(name for name, spec in Record.__dataclass_fields__.items() if spec.type in ("str", "str | None"))
_ENCODING_NAME = re.compile(r"[A-Za-z0-9_, -]{1,40}")

WHAT_IF = "what-if"  # the audit's own offline pruning with --rules
PROXY = "proxy"  # what trimflow did when the traffic was recorded (the addon's record)


@dataclass(slots=True)
class Row:
    """One LLM request of a recording: its metrics record and what the recording says happened."""

    record: Record
    source: int  # index of the input file
    failure: str | None = None  # a category above, when the answer was an error
    limits_rule: str | None = None  # the reference rule for limit crossings, and its limits
    max_images: int | None = None
    max_body_bytes: int | None = None
    after: str | None = None  # where the after figures come from: WHAT_IF, PROXY, or None (the same as before)
    # USD for the request at the price table's rates (set by the summary); None when unknown, with `unpriced`
    # saying why, or for a request that is not billed (a token count): then `unpriced` is None too.
    cost: float | None = None
    unpriced: str | None = None
    # USD the request would have cost as the agent sent it, without trimflow (an estimate: _summary.WITHOUT_METHOD);
    # None where `cost` is.
    cost_without: float | None = None


@dataclass
class InputTally:
    """What one input held."""

    path: str
    kind: str
    flows: int = 0  # flows, or lines of a JSONL file
    llm_requests: int = 0
    skipped: int = 0  # not LLM requests (other hosts and paths, GETs, TCP/DNS flows)
    unreadable: Counter[str] = field(default_factory=Counter)  # LLM requests that could not be measured, by reason
    unread_answers: Counter[str] = field(default_factory=Counter)  # measured requests whose answer was not read, by reason
    truncated: str | None = None  # why reading stopped before the end of the file
    proxy_records: int = 0  # flows carrying the addon's own record (recorded through trimflow)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "flows": self.flows,
            "llm_requests": self.llm_requests,
            "skipped": self.skipped,
            "unreadable": dict(self.unreadable),
            "unread_answers": dict(self.unread_answers),
            "truncated": self.truncated,
            "proxy_records": self.proxy_records,
        }


def classify_failure(status: int | None, text: bytes | None) -> str | None:
    """A fixed category for an error answer (None for success or no answer)."""
    if status is None or status < 400:
        return None
    if status == 413:
        return BODY_TOO_LARGE
    if text:
        lowered = text[:_FAILURE_SCAN].decode("utf-8", "replace").lower()
        for category, pattern in _FAILURE_TEXTS:
            if pattern.search(lowered):
                return category
    return f"http {status}"


def detect_kind(path: Path) -> str:
    """mitm, har or jsonl, from the name, else from the first bytes."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix == ".har":
        return "har"
    if suffix in (".mitm", ".flows", ".dump"):
        return "mitm"
    with open(path, "rb") as f:
        first = f.readline(1 << 20).lstrip(b"\xef\xbb\xbf \t\r\n")
    if not first.startswith(b"{"):
        return "mitm"
    try:
        parsed = orjson.loads(first)
    except orjson.JSONDecodeError:
        return "har"  # a HAR file is one JSON document over many lines
    return "jsonl" if isinstance(parsed, dict) and "body_bytes_before" in parsed else "har"


def record_from_dict(data: Any) -> Record:
    """A Record from a metrics line (the addon's JSONL, or a flow's metadata). ValueError if it is not one."""
    if not isinstance(data, dict) or not isinstance(data.get("format"), str) or "body_bytes_before" not in data:
        raise ValueError("not a trimflow metrics record")
    values: dict[str, Any] = {}
    for name in Record.__dataclass_fields__:
        if name not in data:
            continue
        value = data[name]
        if name in _INT_FIELDS:
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"field {name} is not a whole number")
        elif name in _STR_FIELDS:
            if value is not None and not isinstance(value, str):
                raise ValueError(f"field {name} is not text")
        elif name in ("over_budget", "server_side_history"):
            value = bool(value)
        elif name == "overhead_ms":
            value = float(value) if isinstance(value, (int, float)) else 0.0
        values[name] = value
    record = Record(
        ts=values.pop("ts", None) or "",
        conversation=values.pop("conversation", None),
        turn=values.pop("turn", None),
        host=values.pop("host", None) or "",
        path=values.pop("path", None) or "/",
        format=values.pop("format"),
        model=values.pop("model", None),
        rule=values.pop("rule", None),
        mode=values.pop("mode", None) or OBSERVE,
    )
    for name, value in values.items():
        if value is not None or name in ("status", "usage_input_tokens", "reason"):
            setattr(record, name, value)
    record.path = record.path.partition("?")[0]  # a query string may hold a key
    return record


class Reader:
    """Reads the inputs into rows, telling conversations apart and numbering their turns in input order as the
    proxy does (trimflow._conversation). A flow the proxy recorded keeps the proxy's numbering: the proxy saw
    the body the client sent, the recording holds what was forwarded.

    `rules` is what the engine runs with: the built-in endpoints (no limits) for the recording as it
    is, or a rules file for a what-if. `limits` gives the reference limits of each request for the
    crossing report. `max_decoded_bytes` bounds what a recorded compressed body, request or answer, may
    inflate to, as `trimflow_max_decoded_bytes` does in the proxy: a recording may come from anywhere,
    and one gzip bomb in it would otherwise inflate in full.
    """

    def __init__(self, rules: Rules, limits: Rules, *, what_if: bool, max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES) -> None:
        self.rules = rules
        self.limits = limits
        self.what_if = what_if
        self.max_decoded_bytes = max_decoded_bytes
        # An audit sees every conversation of the recording; no salt: the same input gives the same ids on every run.
        self.conversations = Conversations(capacity=1 << 20, salt=b"")
        # Why a recorded turn's cache read fell, on the recording's clock, for flows the proxy left no record on.
        self._flow_time = 0.0
        self.cache_breaks = CacheBreaks(clock=lambda: self._flow_time)
        self.tallies: list[InputTally] = []

    def check(self, paths: list[str]) -> list[tuple[Path, str]]:
        """Each input with its kind; InputError for one that is missing or not a file."""
        checked = []
        for name in paths:
            path = Path(name)
            if not path.exists():
                raise InputError(f"{name}: no such file")
            if not path.is_file():
                raise InputError(f"{name}: not a file")
            try:
                checked.append((path, detect_kind(path)))
            except OSError as exc:
                raise InputError(f"{name}: cannot read ({exc.strerror or type(exc).__name__})") from None
        return checked

    def rows(self, inputs: list[tuple[Path, str]]) -> Iterator[Row]:
        for index, (path, kind) in enumerate(inputs):
            tally = InputTally(str(path), kind)
            self.tallies.append(tally)
            try:
                with open(path, "rb") as f:
                    if kind == "jsonl":
                        yield from self._jsonl_rows(f, index, tally)
                    else:
                        yield from self._flow_file_rows(f, index, tally)
            except OSError as exc:
                raise InputError(f"{path}: cannot read ({exc.strerror or type(exc).__name__})") from None

    # --- mitmproxy dumps and HAR

    def _flow_file_rows(self, f: Any, index: int, tally: InputTally) -> Iterator[Row]:
        try:
            from ..proxy.recordings import read_flows
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] != "mitmproxy":
                raise
            raise InputError(f"{tally.path}: reading a mitmproxy dump or HAR file needs mitmproxy (pip install mitmproxy)") from None
        flows = read_flows(f)
        while True:
            try:
                flow = next(flows)
            except StopIteration:
                return
            except Exception:  # noqa: BLE001 - FlowReadException, or a malformed flow state
                # A fixed reason: mitmproxy's own message may quote the file's content.
                what, reason = ("a HAR file", "not valid HAR JSON") if tally.kind == "har" else ("a mitmproxy dump", "invalid data")
                if cut_short(Path(tally.path), tally.kind):
                    tally.truncated = (
                        f"cut short: the file ends inside flow {tally.flows + 1}"
                        if tally.kind == "mitm"
                        else "cut short: the file ends before its JSON does"
                    )
                    return
                if tally.flows == 0:
                    raise InputError(f"{tally.path}: not {what} ({reason})") from None
                tally.truncated = f"unreadable after flow {tally.flows} ({reason}); the rest of the file was skipped"
                return
            tally.flows += 1
            try:
                rows = self._flow_rows(flow, index, tally)
            except Exception as exc:  # noqa: BLE001 - one odd flow must not end the audit
                tally.unreadable[f"internal error {type(exc).__name__}"] += 1
                continue
            yield from rows

    def _flow_rows(self, flow: http.HTTPFlow | None, index: int, tally: InputTally) -> list[Row]:
        if flow is None:  # a TCP, UDP or DNS flow
            tally.skipped += 1
            return []
        if flow.websocket is not None:
            return self._websocket_rows(flow, index, tally)
        request = flow.request
        path = request.path.partition("?")[0]
        proxy = flow.metadata.get(PROXY_META)
        proxy_record = None
        if isinstance(proxy, dict):
            try:
                proxy_record = record_from_dict(proxy)
            except ValueError:
                proxy_record = None
        target = self.rules.target(request.pretty_host, path, method=request.method, content_type=request.headers.get("content-type", ""))
        if proxy_record is None and target is None:
            tally.skipped += 1
            return []
        # A record with a kind was numbered by the proxy as the history-aware tracker numbers it; an older one is renumbered.
        numbered = proxy_record is not None and isinstance(proxy, dict) and "kind" in proxy
        history: History | None = None
        taken: tuple[frozenset[int], frozenset[int]] = (frozenset(), frozenset())  # the engine's Outcome.taken, for the next turn
        after: str | None  # where the after figures come from (Row.after)
        if proxy_record is not None and not self.what_if:
            record, after = proxy_record, PROXY  # as trimflow recorded it: before, after and all it did
            if not numbered and target is not None:
                history = self._history(request, target, tally)
        else:
            body = self._body(request, tally)
            if body is None:
                return []
            # Numbered here, the request is cut as the proxy cuts it: its images aged by arrival in its conversation.
            memory = None if numbered else self.conversations
            outcome = prune(target, request.headers, body, self.rules, OBSERVE, memory=memory) if target is not None else None
            if outcome is not None and outcome.record is not None:
                record, after, history, taken = outcome.record, WHAT_IF if self.what_if else None, outcome.history, outcome.taken
                if proxy_record is not None:
                    self._what_if_after_proxy(record, proxy_record, numbered)
            elif proxy_record is not None:
                record, after = proxy_record, PROXY
            else:
                tally.skipped += 1
                return []
        history_line = None if numbered else self._number(record, history, *taken)
        causes = proxy_record is None and not self.what_if  # the usage is the recording's: its causes, of what was sent
        if causes:
            self._flow_time = request.timestamp_start
            self.cache_breaks.sent(record, history, taken[0])
        tally.llm_requests += 1
        tally.proxy_records += proxy_record is not None
        record.ts = _utc(request.timestamp_start)
        status, failure, usage = None, None, Usage()
        if flow.response is not None:
            status = flow.response.status_code
            content = self._answer(flow.response, tally)
            if content:
                usage = usage_of(content)
                if history_line is not None and record.format == openai_responses.NAME:
                    self.conversations.responded(history_line, response_id_of(content[:4096]))
            failure = classify_failure(status, content)
        elif flow.error is not None:
            failure = NO_RESPONSE
        if usage.input_tokens is None and proxy_record is not None:  # e.g. a streamed answer mitmproxy did not keep
            usage = Usage(
                proxy_record.usage_input_tokens,
                proxy_record.usage_cache_read_tokens,
                proxy_record.usage_cache_write_tokens,
                proxy_record.usage_output_tokens,
            )
        record.status = status
        _set_usage(record, usage)
        if causes:
            self.cache_breaks.answered(record)
        elif proxy_record is not None and record is not proxy_record:  # why the cache broke, as the proxy saw it
            record.cache_break, record.cache_break_at = proxy_record.cache_break, proxy_record.cache_break_at
        return [self._row(record, index, failure, after)]

    def _body(self, request: http.Request, tally: InputTally) -> bytes | None:
        """The decoded request body; None (counted with the reason) when there is none to measure."""
        if request.raw_content is None:
            tally.unreadable["request body not recorded (streamed by mitmproxy)"] += 1
            return None
        return self._decoded(request, tally.unreadable, "request body ")

    def _answer(self, response: http.Response, tally: InputTally) -> bytes:
        """The decoded answer; empty (counted with the reason) when it cannot be read: its usage is then unknown and
        its failure category comes from the status alone."""
        if not response.raw_content:
            return b""
        return self._decoded(response, tally.unread_answers, "") or b""

    def _decoded(self, message: http.Message, counts: Counter[str], what: str) -> bytes | None:
        """`message`'s body decoded within --max-decoded-bytes; None, counted in `counts` with the reason, when it
        cannot be."""
        try:
            return decode_body(message.raw_content or b"", message.headers.get("content-encoding"), self.max_decoded_bytes)
        except BodyTooLarge:
            counts[f"{what}inflates past {format_size(self.max_decoded_bytes)} (--max-decoded-bytes); not inflated"] += 1
        except DecodeError:
            counts[f"cannot decode content-encoding {_encoding_shown(message)}"] += 1
        return None

    def _history(self, request: http.Request, target: Target, tally: InputTally) -> History | None:
        """The history of a recorded body, for numbering a record the proxy did not number."""
        body = self._body(request, tally)
        return None if body is None else prune(target, request.headers, body, self.rules, OBSERVE).history

    def _number(self, record: Record, history: History | None, cut: Collection[int] = (), like: Collection[int] = ()) -> HistoryLine | None:
        """The record's conversation, turn and segment, as the proxy's SharedState assigns them (with the images its cut took)."""
        if history is None:
            return None
        assignment = self.conversations.assign(history, record.kind, cut, like)
        record.conversation, record.turn, record.segment = assignment.conversation, assignment.turn, assignment.segment
        return assignment.history_line

    @staticmethod
    def _what_if_after_proxy(record: Record, proxy: Record, numbered: bool) -> None:
        """A what-if over a flow recorded through trimflow: the flow holds the body the proxy forwarded,
        the addon's record what the client sent, and, when the proxy numbered it, its conversation."""
        for name in BEFORE_FIELDS:
            setattr(record, name, getattr(proxy, name))
        if numbered:
            record.conversation, record.turn, record.segment, record.kind = proxy.conversation, proxy.turn, proxy.segment, proxy.kind
        if proxy.mode == ENFORCE and proxy.pruned:
            # The what-if can only prune further what the proxy already pruned.
            record.reason = record.reason or "pruned by the proxy when recorded: the what-if starts from the forwarded body"

    def _websocket_rows(self, flow: http.HTTPFlow, index: int, tally: InputTally) -> list[Row]:
        """Codex's Responses requests over WebSocket: one row per `response.create` message, as the addon prunes them,
        with the status and usage of the server event that ends its response (one response at a time per connection)."""
        assert flow.websocket is not None
        rows = []
        waiting: list[tuple[Row, HistoryLine | None]] = []
        for message in flow.websocket.messages:
            if not message.from_client:
                answer = openai_responses.websocket_answer(message.content) if waiting else None
                if answer is not None:
                    row, history_line = waiting.pop(0)
                    row.record.status, _, response_id = answer
                    _set_usage(row.record, usage_of(message.content))
                    row.failure = classify_failure(row.record.status, message.content)
                    self.conversations.responded(history_line, response_id)
                continue
            if b"response.create" not in message.content[:256]:
                continue
            target = self.rules.target(flow.request.pretty_host, flow.request.path, wire_format=openai_responses.NAME)
            assert target is not None  # a forced format always resolves
            outcome = prune(target, flow.request.headers, message.content, self.rules, OBSERVE, memory=self.conversations)
            if outcome.record is None:
                continue
            outcome.record.ts = _utc(message.timestamp)
            history_line = self._number(outcome.record, outcome.history, *outcome.taken)
            rows.append(self._row(outcome.record, index, None, WHAT_IF if self.what_if else None))
            waiting.append((rows[-1], history_line))
        if rows:
            tally.llm_requests += len(rows)
        else:
            tally.skipped += 1
        return rows

    # --- trimflow's JSONL

    def _jsonl_rows(self, f: Any, index: int, tally: InputTally) -> Iterator[Row]:
        for raw in f:
            line = raw.strip()
            if not line:
                continue
            tally.flows += 1
            try:
                data = orjson.loads(line)
                record = record_from_dict(data)
            except (orjson.JSONDecodeError, ValueError, TypeError):
                if not raw.endswith(b"\n") and line.startswith(b"{"):  # the writer ends every record with a newline
                    tally.truncated = f"cut short: line {tally.flows}, the last, ends inside its record"
                    return
                if tally.llm_requests == 0 and tally.flows == 1:
                    raise InputError(f"{tally.path}: not trimflow metrics JSONL (line 1 is not a metrics record)") from None
                tally.unreadable["line is not a metrics record"] += 1
                continue
            tally.llm_requests += 1
            failure = classify_failure(record.status, None)
            if record.status is None and data.get("error"):
                failure = NO_RESPONSE
            # The record's after figures and numbering are what the proxy did: without the body there is nothing to re-run.
            yield self._row(record, index, failure, PROXY)

    # --- shared

    def _row(self, record: Record, index: int, failure: str | None, after: str | None) -> Row:
        limits = self.limits.limits_for(record.host, record.path, record.model)
        return Row(record, index, failure, limits.rule, limits.max_images, limits.max_body_bytes, after)


def _encoding_shown(message: http.Message) -> str:
    """The Content-Encoding header quoted for a reason, or '?' for a value that is no plain coding name."""
    encoding = message.headers.get("content-encoding", "")
    return repr(encoding if _ENCODING_NAME.fullmatch(encoding) else "?")


def _set_usage(record: Record, usage: Usage) -> None:
    for name, value in usage.record_fields().items():
        setattr(record, name, value)


def cut_short(path: Path, kind: str) -> bool:
    """Whether a dump or HAR file that mitmproxy stopped reading ends inside a flow (or its JSON document)."""
    with open(path, "rb") as f:
        if kind == "har":
            data = f.read()
            try:
                orjson.loads(data)
            except orjson.JSONDecodeError as exc:
                return "end of data" in str(exc) or exc.pos >= len(data.rstrip())
            return False
        # A dump is a run of tnetstrings, each `LENGTH:PAYLOAD` and a type byte: follow the lengths to the end.
        size = f.seek(0, 2)
        at = f.seek(0)
        while at < size:
            head = f.read(13)
            digits, colon, _ = head.partition(b":")
            if not colon:
                return head.isdigit() and at + len(head) == size  # the file ends inside a length
            if not digits.isdigit():
                return False
            at += len(digits) + 1 + int(digits) + 1
            f.seek(at)
        return at > size


def _utc(timestamp: float | None) -> str:
    return utc_timestamp(timestamp) if timestamp else ""
