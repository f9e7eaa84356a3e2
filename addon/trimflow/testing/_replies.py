"""The fake provider's answers, per wire format: which format answers a path (`route`), and its reply as JSON or
streamed (SSE, NDJSON, Google's JSON array) in each API's own shapes and event sequence. The builders a scripted
model needs (`trimflow.testing._agent_script`, `_clicking`) are public here.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from .._record import utc_timestamp
from .._rules import builtin_rules
from ..formats import FORMATS, streamed_path
from ._fake_usage import REPLY_DELTAS, REPLY_TEXT, FakeUsage

DEFAULT_MODEL = "fake-model"


# --- routing -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Route:
    """Which format answers a path. ``stream`` is forced by the path when not None, else the body decides;
    ``unsupported`` says why the fake cannot answer this endpoint of the format (a 501)."""

    fmt: str
    model: str | None = None
    stream: bool | None = None
    unsupported: str | None = None


# Endpoints that exist but that this fake does not speak: path ending -> why (answered 501).
UNSUPPORTED = {
    "/converse-stream": "converse-stream answers in AWS binary event-stream, which fake-provider does not implement; use /converse",
    "/invoke-with-response-stream": "invoke-with-response-stream answers in AWS binary event-stream, which "
    "fake-provider does not implement; use /invoke",
    "/responses/compact": "responses/compact answers a compacted conversation, which fake-provider does not implement; use /responses",
}
# Paths whose answer is JSON whatever the body says: these APIs stream on a sibling path instead.
_NEVER_STREAMED = (":generateContent", "/converse", "/invoke")


def route(path: str) -> Route | None:
    """The format that answers ``path`` (no query), or None for a 404.

    The fake answers the paths trimflow's built-in endpoints name (the format modules own them), and
    Anthropic's token counting; the model is read from the path as trimflow reads it."""
    path = path.rstrip("/")
    if path.endswith("/messages/count_tokens"):
        return Route("anthropic-count-tokens", stream=False)
    fmt = builtin_rules().format_for("", path)
    if fmt is None:
        return None
    stream = True if streamed_path(path) else False if path.endswith(_NEVER_STREAMED) else None
    unsupported = next((why for ending, why in UNSUPPORTED.items() if path.endswith(ending)), None)
    return Route(fmt, FORMATS[fmt].model({}, path), stream, unsupported)


def wants_stream(r: Route, request_json: dict[str, Any]) -> bool:
    if r.stream is not None:
        return r.stream
    # Ollama streams unless told not to; everyone else only when asked.
    return bool(request_json.get("stream", r.fmt == "ollama"))


# --- replies -----------------------------------------------------------------------------------------------

_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    # A process-wide counter: ids are unique and reproducible run to run (no randomness).
    return f"{prefix}fake{next(_ids):06d}"


def _model(r: Route, request_json: dict[str, Any]) -> str:
    model = request_json.get("model")
    return model if isinstance(model, str) and model else (r.model or DEFAULT_MODEL)


def chat_usage(u: FakeUsage) -> dict[str, Any]:
    return {
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cache_read_tokens or 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def responses_usage(u: FakeUsage) -> dict[str, Any]:
    return {
        "input_tokens": u.input_tokens,
        "input_tokens_details": {"cached_tokens": u.cache_read_tokens or 0},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.total_tokens,
    }


def anthropic_usage(u: FakeUsage, output_tokens: int) -> dict[str, Any]:
    # Anthropic's input_tokens is what follows the last cache breakpoint: neither read nor written.
    usage: dict[str, Any] = {
        "input_tokens": u.uncached_tokens,
        "cache_creation_input_tokens": u.cache_write_tokens or 0,
        "cache_read_input_tokens": u.cache_read_tokens or 0,
    }
    if u.cache_write_tokens is not None:
        usage["cache_creation"] = {
            "ephemeral_5m_input_tokens": u.cache_write_tokens - u.cache_write_1h_tokens,
            "ephemeral_1h_input_tokens": u.cache_write_1h_tokens,
        }
    usage["output_tokens"] = output_tokens
    usage["service_tier"] = "standard"
    return usage


def gemini_usage(u: FakeUsage, final: bool) -> dict[str, Any]:
    usage: dict[str, Any] = {"promptTokenCount": u.input_tokens}
    if final:
        usage["candidatesTokenCount"] = u.output_tokens
    usage["totalTokenCount"] = u.total_tokens if final else u.input_tokens
    details = [{"modality": "TEXT", "tokenCount": u.input_tokens - u.image_tokens}]
    if u.images:
        details.append({"modality": "IMAGE", "tokenCount": u.image_tokens})
    usage["promptTokensDetails"] = details
    if u.cache_read_tokens:
        # Gemini leaves out what is zero: the cached count appears only on a hit. promptTokenCount includes it.
        usage["cachedContentTokenCount"] = u.cache_read_tokens
        cached = [{"modality": "TEXT", "tokenCount": u.cache_read_tokens - u.cached_image_tokens}]
        if u.cached_image_tokens:
            cached.append({"modality": "IMAGE", "tokenCount": u.cached_image_tokens})
        usage["cacheTokensDetails"] = cached
    return usage


def responses_message(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = []
    if status == "completed":
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def responses_object(rid: str, request_json: dict[str, Any], model: str, status: str, output: list[Any], usage: FakeUsage | None) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": request_json.get("instructions"),
        "max_output_tokens": request_json.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": request_json.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": request_json.get("store", True),
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": responses_usage(usage) if usage else None,
        "user": None,
        "metadata": {},
    }


def anthropic_message(mid: str, model: str, content: list[Any], stop: str | None, usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }


def _gemini_chunk(rid: str, model: str, text: str, usage: FakeUsage, final: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "model"}, "index": 0}
    if final:
        candidate["finishReason"] = "STOP"
    return {
        "candidates": [candidate],
        "usageMetadata": gemini_usage(usage, final),
        "modelVersion": model,
        "responseId": rid,
    }


def _ollama_final(model: str, usage: FakeUsage, content: str) -> dict[str, Any]:
    return {
        "model": model,
        "created_at": utc_timestamp(),
        "message": {"role": "assistant", "content": content},
        "done": True,
        "done_reason": "stop",
        "total_duration": 1_000_000,
        "load_duration": 100_000,
        "prompt_eval_count": usage.input_tokens,
        "prompt_eval_duration": 500_000,
        "eval_count": usage.output_tokens,
        "eval_duration": 400_000,
    }


def build_json_reply(r: Route, request_json: dict[str, Any], usage: FakeUsage) -> dict[str, Any]:
    """The non-streamed answer of format ``r.fmt`` to ``request_json``."""
    model = _model(r, request_json)
    if r.fmt == "openai-chat":
        return {
            "id": new_id("chatcmpl-"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": REPLY_TEXT, "refusal": None, "annotations": []},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": chat_usage(usage),
            "service_tier": "default",
            "system_fingerprint": "fp_fake",
        }
    if r.fmt == "openai-responses":
        msg = responses_message(new_id("msg_"), REPLY_TEXT, "completed")
        return responses_object(new_id("resp_"), request_json, model, "completed", [msg], usage)
    if r.fmt == "anthropic":
        return anthropic_message(
            new_id("msg_"),
            model,
            [{"type": "text", "text": REPLY_TEXT}],
            "end_turn",
            anthropic_usage(usage, usage.output_tokens),
        )
    if r.fmt == "anthropic-count-tokens":
        return {"input_tokens": usage.input_tokens}
    if r.fmt == "gemini":
        return _gemini_chunk(new_id("resp-"), model, REPLY_TEXT, usage, final=True)
    if r.fmt == "ollama":
        return _ollama_final(model, usage, REPLY_TEXT)
    if r.fmt == "bedrock-converse":
        return {
            "output": {"message": {"role": "assistant", "content": [{"text": REPLY_TEXT}]}},
            "stopReason": "end_turn",
            "usage": _bedrock_usage(usage),
            "metrics": {"latencyMs": 1},
        }
    raise ValueError(f"no JSON reply for format {r.fmt!r}")


def _bedrock_usage(u: FakeUsage) -> dict[str, Any]:
    # Like Anthropic's, Converse's inputTokens leaves out what was read from or written to the cache.
    usage: dict[str, Any] = {"inputTokens": u.uncached_tokens, "outputTokens": u.output_tokens, "totalTokens": u.total_tokens}
    if u.cache_read_tokens is not None:
        usage["cacheReadInputTokens"] = u.cache_read_tokens
        usage["cacheWriteInputTokens"] = u.cache_write_tokens or 0
    return usage


def stream_content_type(r: Route, sse: bool) -> str:
    if r.fmt == "ollama":
        return "application/x-ndjson"
    if r.fmt == "gemini" and not sse:
        return "application/json; charset=UTF-8"
    return "text/event-stream; charset=utf-8"


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


def iter_stream_events(r: Route, request_json: dict[str, Any], usage: FakeUsage, *, sse: bool = True) -> Iterator[bytes]:
    """The streamed answer as wire frames, one event each: SSE events, NDJSON lines or Google JSON-array items.

    ``sse`` only matters for Gemini (``?alt=sse``); every other streaming format has a single framing.
    """
    model = _model(r, request_json)
    if r.fmt == "openai-chat":
        yield from _chat_events(request_json, model, usage)
    elif r.fmt == "openai-responses":
        yield from _responses_events(request_json, model, usage)
    elif r.fmt == "anthropic":
        yield from _anthropic_events(model, usage)
    elif r.fmt == "gemini":
        yield from _gemini_events(model, usage, sse)
    elif r.fmt == "ollama":
        for delta in REPLY_DELTAS:
            message = {"role": "assistant", "content": delta}
            line = {"model": model, "created_at": utc_timestamp(), "message": message, "done": False}
            yield orjson.dumps(line) + b"\n"
        yield orjson.dumps(_ollama_final(model, usage, "")) + b"\n"
    else:
        raise ValueError(f"no stream for format {r.fmt!r}")


def _chat_events(request_json: dict[str, Any], model: str, usage: FakeUsage) -> Iterator[bytes]:
    opts = request_json.get("stream_options")
    include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
    cid, created = new_id("chatcmpl-"), int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        c: dict[str, Any] = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            c["usage"] = None  # real chunks carry "usage": null until the last one
        return c

    yield sse(chunk({"role": "assistant", "content": "", "refusal": None}, None))
    for delta in REPLY_DELTAS:
        yield sse(chunk({"content": delta}, None))
    yield sse(chunk({}, "stop"))
    if include_usage:
        last = chunk({}, None)
        last["choices"] = []
        last["usage"] = chat_usage(usage)
        yield sse(last)
    yield b"data: [DONE]\n\n"


class ResponsesEvents:
    """The server events of one streamed Responses answer, each numbered in order (`sequence_number`) and named by
    its type. The fake's own reply and the scripted models' are built with it, so they share the API's sequence."""

    def __init__(self, rid: str, request_json: dict[str, Any], model: str) -> None:
        self.rid, self.request_json, self.model = rid, request_json, model
        self._numbers = itertools.count()

    def event(self, kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, "sequence_number": next(self._numbers), **fields}, kind)

    def started(self) -> list[bytes]:
        """`response.created` and `response.in_progress`, the response still empty."""
        return [self.event(kind, response=self._response("in_progress", [], None)) for kind in ("response.created", "response.in_progress")]

    def text_message(self, item_id: str, deltas: Sequence[str], output_index: int = 0) -> tuple[list[bytes], dict[str, Any]]:
        """The events of one assistant message whose text comes in `deltas`, to its `response.output_item.done`;
        and the message item as it ends."""
        text = "".join(deltas)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        where = {"item_id": item_id, "output_index": output_index, "content_index": 0}
        item = responses_message(item_id, text, "completed")
        frames = [
            self.event("response.output_item.added", output_index=output_index, item=responses_message(item_id, "", "in_progress")),
            self.event("response.content_part.added", **where, part=part),
            *(self.event("response.output_text.delta", **where, delta=delta, logprobs=[]) for delta in deltas),
            self.event("response.output_text.done", **where, text=text, logprobs=[]),
            self.event("response.content_part.done", **where, part={**part, "text": text}),
            self.event("response.output_item.done", output_index=output_index, item=item),
        ]
        return frames, item

    def completed(self, output: list[Any], usage: FakeUsage) -> bytes:
        """`response.completed`, with the whole output and the usage."""
        return self.event("response.completed", response=self._response("completed", output, usage))

    def _response(self, status: str, output: list[Any], usage: FakeUsage | None) -> dict[str, Any]:
        return responses_object(self.rid, self.request_json, self.model, status, output, usage)


def _responses_events(request_json: dict[str, Any], model: str, usage: FakeUsage) -> Iterator[bytes]:
    events = ResponsesEvents(new_id("resp_"), request_json, model)
    yield from events.started()  # first: the events are numbered as they are made
    frames, item = events.text_message(new_id("msg_"), REPLY_DELTAS)
    yield from frames
    yield events.completed([item], usage)


def _anthropic_events(model: str, usage: FakeUsage) -> Iterator[bytes]:
    start = anthropic_message(new_id("msg_"), model, [], None, anthropic_usage(usage, 1))
    yield sse({"type": "message_start", "message": start}, "message_start")
    block = {"type": "text", "text": ""}
    yield sse({"type": "content_block_start", "index": 0, "content_block": block}, "content_block_start")
    yield sse({"type": "ping"}, "ping")
    for delta in REPLY_DELTAS:
        data = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": delta}}
        yield sse(data, "content_block_delta")
    yield sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
    stop = {"stop_reason": "end_turn", "stop_sequence": None}
    data = {"type": "message_delta", "delta": stop, "usage": {"output_tokens": usage.output_tokens}}
    yield sse(data, "message_delta")
    yield sse({"type": "message_stop"}, "message_stop")


def _gemini_events(model: str, usage: FakeUsage, sse: bool) -> Iterator[bytes]:
    rid = new_id("resp-")
    last = len(REPLY_DELTAS) - 1
    for i, delta in enumerate(REPLY_DELTAS):
        data = orjson.dumps(_gemini_chunk(rid, model, delta, usage, final=i == last))
        if sse:
            yield b"data: " + data + b"\r\n\r\n"  # Google ends SSE events with CRLF CRLF
        else:
            # Without alt=sse Google streams one JSON array, item by item.
            yield (b"[" if i == 0 else b"\n,\r\n") + data
    if not sse:
        yield b"]"


def error_body(kind: str, message: str) -> bytes:
    return orjson.dumps({"error": {"type": kind, "message": message}})
