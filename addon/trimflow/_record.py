"""The metrics record: one per LLM request, shared by the engine's report, the proxy's JSONL and the audit.

No field ever holds a credential, prompt text or base64 data: only names, counts and sizes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Any

import orjson

from ._human import format_size, format_thousands
from ._text import for_text

# What was done with the body (Record.mode).
ENFORCE = "enforce"  # forwarded within the limits
OBSERVE = "observe"  # measured only: forwarded as it came, the *_after fields saying what enforce would send
MODES = (ENFORCE, OBSERVE)
# What a request is to its conversation (Record.kind).
TURN = "turn"
COUNT_TOKENS = "count_tokens"  # a token count of the next turn: never a turn, never a conversation of its own
WARMUP = "warmup"  # a Responses `generate: false`: prepares the next turn, answers nothing


@dataclass(slots=True, kw_only=True)
class Record:
    ts: str
    conversation: str | None
    turn: int | None
    host: str
    path: str  # without the query string, which may hold a key
    format: str
    model: str | None
    rule: str | None
    mode: str  # enforce or observe: what was done with the body
    kind: str = TURN  # TURN, COUNT_TOKENS or WARMUP
    segment: int | None = None  # the line of history within the conversation: a new one when it restarts under a session id
    images_before: int = 0
    images_after: int = 0
    documents: int = 0  # documents, audio and video: counted, never pruned by an image limit
    # Of images_before, by where each came from (trimflow._media): attached by the user, a tool's output, attached by
    # the agent. The pruned_* below count the pruned of each (all causes).
    images_user: int = 0
    images_tool: int = 0
    images_agent: int = 0
    media_bytes_before: int = 0
    media_bytes_after: int = 0
    body_bytes_before: int = 0
    body_bytes_after: int = 0
    est_tokens_before: int = 0
    est_tokens_after: int = 0
    pruned: int = 0
    pruned_for_count: int = 0
    pruned_for_body: int = 0
    over_budget: bool = False  # the body or token budget could not be met: the best effort was forwarded
    # Beyond dropping: pruned images by cause, images re-encoded and still sent, and the wire bytes
    # (base64 text) those saved. Each image counts once: a thumbnail that also had to meet a
    # per-image limit is thinned, and an image re-encoded then pruned by a budget is pruned.
    pruned_for_tokens: int = 0  # to meet max_est_tokens
    pruned_for_cache: int = 0  # ahead of need, so later turns keep the cached prefix (low_water, cache_ttl)
    pruned_for_image_limit: int = 0  # over a per-image limit and could not be shrunk under it
    deduplicated: int = 0  # repeats of a later image of the same request (also in pruned)
    pruned_user: int = 0  # of pruned, images the user attached (cut last)
    pruned_tool: int = 0
    pruned_agent: int = 0
    shrunk: int = 0  # re-encoded to meet max_image_bytes / max_image_side / the many-image rule
    shrunk_bytes_saved: int = 0
    thinned: int = 0  # older images sent as thumbnails (thumbnail_side)
    thinned_bytes_saved: int = 0
    native_sized: int = 0  # sent at the size the model sees them at (native_size), over no limit
    native_bytes_saved: int = 0
    # Send once (docs/how-it-works.md#send-once): images that went as a reference to a file at the provider, the base64
    # bytes those references kept off the wire, and of them the images this request uploaded (once each).
    by_reference: int = 0
    reference_bytes_saved: int = 0
    uploaded: int = 0
    references_refused: int = 0  # references the provider refused (a file gone): the request went again inline
    images_rescaled: int = 0  # of the shrunk and native-sized, sent at other dimensions than they came (see Plan.notes)
    clicks_mapped: int = 0  # computer-tool calls in the answer whose coordinates were mapped back to the original screenshot
    clicks_unmapped: str | None = None  # why (some of) the answer's clicks reached the agent unmapped: the first reason
    mime_mismatches: int = 0  # declared type differs from the bytes' real type (reported, left alone)
    server_side_history: bool = False  # earlier turns live at the provider (previous_response_id)
    reason: str | None = None  # why the body was forwarded as it came, when it could not be handled
    status: int | None = None
    usage_input_tokens: int | None = None  # the whole prompt as the provider counts it, cache reads and writes included
    usage_cache_read_tokens: int | None = None  # of which read from the provider's prompt cache
    usage_cache_write_tokens: int | None = None  # of which written to it (Anthropic, Bedrock; OpenAI and Gemini never say)
    usage_output_tokens: int | None = None
    # The provider's cache read fell below the conversation's previous turn's (or this is its first turn): whose doing
    # it was (trimflow._cache_break: first_turn, agent_prefix, trimflow_cut, cache_expired, unexplained) and where
    # ("system", "tools", "message 7", "image 5"; None for the others).
    cache_break: str | None = None
    cache_break_at: str | None = None
    overhead_ms: float = 0.0
    simulated: str | None = None  # the limit profile (trimflow_simulate) that answered instead of the provider
    # The provider refused the request for a limit and the proxy sent it again within it (docs/recovery.md): how many
    # times, the status of the first refusal, and per retry (joined by "; ") why and under which tightened limits.
    retries: int = 0
    refused_status: int | None = None
    retry_reasons: str | None = None  # e.g. "too many images (max 10, from the answer)"
    retry_limits: str | None = None  # e.g. "max_images=10 keep_recent=10"
    # The learned limits (docs/recovery.md) that applied on top of the rule, e.g. "max_images=10 keep_recent=10".
    learned_limits: str | None = None
    # The run's recall_image answers since the previous request (docs/how-it-works.md#recall): images brought back,
    # and ids refused (unknown, expired); the request that follows a recall carries its result.
    recalls: int = 0
    recalls_refused: int = 0

    @classmethod
    def untouched(cls, host: str, path: str, wire_format: str, mode: str, reason: str, body_bytes: int) -> Record:
        """The record of an LLM request forwarded as it came, for `reason` (a body that could not be read)."""
        record = cls(
            ts=utc_timestamp(),
            conversation=None,
            turn=None,
            host=host,
            path=path,
            format=wire_format,
            model=None,
            rule=None,
            mode=mode,
            reason=reason,
        )
        record.body_bytes_before = record.body_bytes_after = body_bytes
        return record

    @property
    def sent_body_bytes(self) -> int:
        """The body's bytes as forwarded: in observe mode the body as received."""
        return self.body_bytes_after if self.mode == ENFORCE else self.body_bytes_before

    @property
    def sent_est_tokens(self) -> int:
        """The token estimate of the body as forwarded."""
        return self.est_tokens_after if self.mode == ENFORCE else self.est_tokens_before

    @property
    def sent_pruned(self) -> int:
        """Images pruned from the body as forwarded: none in observe mode."""
        return self.pruned if self.mode == ENFORCE else 0

    def to_dict(self) -> dict[str, Any]:
        # Every field is a scalar: a shallow copy is what dataclasses.asdict gives, at a tenth of its cost.
        return {name: getattr(self, name) for name in _FIELDS}

    def to_json(self) -> bytes:
        return orjson.dumps(self)

    @property
    def place(self) -> str:
        """Where the request stands in its conversation: "turn 4", "segment 2 turn 1", or its kind
        ("count_tokens", "warmup") for a request that is no turn."""
        segment = f"segment {self.segment} " if self.segment is not None and self.segment > 1 else ""
        return f"{segment}turn {self.turn if self.turn is not None else '-'}" if self.kind == TURN else self.kind

    def log_line(self) -> str:
        """The per-turn log line: sizes and counts only."""
        parts = [f"conv {self.conversation or '-'} {self.place}"]
        parts.append(for_text(self.model) if self.model else self.format)  # the client chose it: one line, no escapes
        if self.reason:
            parts.append(f"untouched ({for_text(self.reason)})")
        images = f"images {self.images_before}->{self.images_after}"
        done = [
            f"{n} {what}"
            for n, what in (
                (self.pruned_for_cache, "cut for the cache"),
                (self.thinned, "thinned"),
                (self.native_sized, "at the model's size"),
                (self.shrunk, "shrunk"),
                (self.deduplicated, "repeated"),
                (self.pruned_for_image_limit, "too big"),
                (self.mime_mismatches, "mime mismatch"),
            )
            if n
        ]
        parts.append(f"{images} ({', '.join(done)})" if done else images)
        parts.append(f"body {format_size(self.body_bytes_before)}->{format_size(self.body_bytes_after)}")
        if self.by_reference or self.references_refused:
            sent = f"by reference {self.by_reference} ({self.uploaded} uploaded, {format_size(self.reference_bytes_saved)} not sent)"
            parts.append(sent + (f" {self.references_refused} refused, sent again inline" if self.references_refused else ""))
        parts.append(f"~{format_thousands(self.est_tokens_before)}->{format_thousands(self.est_tokens_after)} tok")
        if self.mode == OBSERVE:
            parts.append("(observe)")
        if self.over_budget:
            parts.append("OVER BUDGET")
        if self.learned_limits:
            parts.append(f"learned: {self.learned_limits}")
        if self.retries:
            parts.append(f"retried: {self.retry_reasons}")
        if self.status is not None:
            parts.append(str(self.status))
        if self.usage_input_tokens is not None:
            parts.append(f"in={self.usage_input_tokens}")
            cache = [
                f"{what} {n}" for what, n in (("cached", self.usage_cache_read_tokens), ("written", self.usage_cache_write_tokens)) if n is not None
            ]
            if cache:
                parts.append(f"({', '.join(cache)})")
        if self.usage_output_tokens is not None:
            parts.append(f"out={self.usage_output_tokens}")
        if self.cache_break is not None:
            parts.append(f"cache break: {self.cache_break}" + (f" at {self.cache_break_at}" if self.cache_break_at else ""))
        if self.clicks_mapped:
            parts.append(f"clicks mapped {self.clicks_mapped}")
        if self.recalls or self.recalls_refused:
            parts.append(f"recalled {self.recalls}" + (f" ({self.recalls_refused} refused)" if self.recalls_refused else ""))
        ratio = self.est_to_usage_ratio()
        if ratio is not None:
            parts.append(f"est/in={ratio:.2f}")
        return " ".join(parts)

    def est_to_usage_ratio(self) -> float | None:
        """The token estimate of the body that went out over the provider's input tokens (None until known).

        Kept out of the record's fields: usage arrives with the response, and a consumer of the
        JSONL has both numbers. Above 1 the estimate runs high (the safe side for budgets).
        """
        if not self.usage_input_tokens:
            return None
        sent = self.sent_est_tokens
        return sent / self.usage_input_tokens if sent else None


_FIELDS = tuple(f.name for f in fields(Record))


def utc_timestamp(when: float | None = None) -> str:
    """`when` (seconds since the epoch; now when None) as UTC ISO 8601 with milliseconds: 2026-11-22T13:35:21.226Z."""
    when = time.time() if when is None else when
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when)) + f".{int(when % 1 * 1000):03d}Z"
