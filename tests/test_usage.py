"""trimflow._usage: the input tokens a provider reports, read from real answers of the fake provider (JSON, and
streams as SSE, NDJSON and Google's JSON array) however the stream is cut into chunks, and from an AWS
event-stream frame; and the cache reads, cache writes and output tokens, from answers shaped as each provider's
documentation shows them, whole and cut at every byte.
"""

from __future__ import annotations

import http.client
import itertools
import random
import struct
import zlib
from collections.abc import Iterator

import orjson
import pytest

from trimflow._usage import Usage, UsageScanner, input_tokens_of, usage_of
from trimflow.testing import PATHS, FakeProvider, estimate_usage, image, session_body

SHOT = image(64, 48, "PNG", seed=9)
GEMINI_STREAM = PATHS["gemini"].replace(":generateContent", ":streamGenerateContent")

# name -> (format, path, extra body fields): every streamed answer the fake provider gives.
STREAMS = {
    "openai-chat-sse": ("openai-chat", PATHS["openai-chat"], {"stream": True, "stream_options": {"include_usage": True}}),
    "openai-responses-sse": ("openai-responses", PATHS["openai-responses"], {"stream": True}),
    "anthropic-sse": ("anthropic", PATHS["anthropic"], {"stream": True}),
    "gemini-sse": ("gemini", GEMINI_STREAM + "?alt=sse", {}),
    "gemini-json-array": ("gemini", GEMINI_STREAM, {}),
    "ollama-ndjson": ("ollama", PATHS["ollama"], {}),
}


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


def answer(provider: FakeProvider, fmt: str, path: str, extra: dict, turns: int = 3) -> tuple[bytes, int]:
    """The provider's answer body to a `turns`-turn session, and the input tokens it reports for it."""
    body = orjson.dumps({**session_body(fmt, turns, SHOT, "image/png"), **extra})
    conn = http.client.HTTPConnection(provider.host, provider.port, timeout=30)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    assert response.status == 200, data[:200]
    return data, estimate_usage(body).input_tokens


def scanned(chunks: list[bytes]) -> int | None:
    scanner = UsageScanner()
    for chunk in chunks:
        assert scanner(chunk) is chunk  # passed on unchanged
    return scanner.input_tokens


def cut(data: bytes, points: list[int]) -> list[bytes]:
    edges = [0, *sorted(points), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_a_stream_cut_at_any_byte_gives_the_reported_count(provider: FakeProvider, name: str) -> None:
    data, expected = answer(provider, *STREAMS[name])
    assert scanned([data]) == expected
    assert scanned([data[i : i + 1] for i in range(len(data))]) == expected  # a byte at a time
    for i in range(len(data) + 1):  # every single cut
        assert scanned([data[:i], data[i:]]) == expected, i
    rng = random.Random(name)
    for _ in range(200):  # many cuts at once, empty chunks included
        assert scanned(cut(data, [rng.randrange(len(data) + 1) for _ in range(rng.randrange(1, 12))])) == expected


@pytest.mark.parametrize("fmt", sorted(PATHS))
def test_a_json_answer_gives_the_reported_count(provider: FakeProvider, fmt: str) -> None:
    data, expected = answer(provider, fmt, PATHS[fmt], {"stream": False})
    assert input_tokens_of(data) == expected
    assert input_tokens_of(data) != answer(provider, fmt, PATHS[fmt], {"stream": False}, turns=5)[1]  # a count that follows the body


def test_anthropic_counts_cache_reads_and_writes_into_the_prompt() -> None:
    usage = b'{"usage":{"input_tokens":12,"cache_creation_input_tokens":300,"cache_read_input_tokens":4000,"output_tokens":7}}'
    assert input_tokens_of(usage) == 4312
    assert input_tokens_of(b'{"usage":{"input_tokens":12}}') == 12  # no cache fields: none counted


def test_the_last_value_of_a_stream_wins() -> None:
    stream = (
        b'event: message_start\ndata: {"message":{"usage":{"input_tokens":1,"output_tokens":1}}}\n\n'
        b'event: message_delta\ndata: {"usage":{"input_tokens":950,"output_tokens":40}}\n\n'
    )
    assert input_tokens_of(stream) == 950
    gemini = b'data: {"usageMetadata":{"promptTokenCount":10}}\r\n\r\ndata: {"usageMetadata":{"promptTokenCount":12}}\r\n\r\n'
    assert input_tokens_of(gemini) == 12


def test_a_key_inside_model_output_text_is_not_a_count() -> None:
    text = 'The field is "prompt_tokens": 99999, and "input_tokens": 5 in their API.'
    data = orjson.dumps({"choices": [{"delta": {"content": text}}]}) + orjson.dumps({"usage": {"prompt_tokens": 321}})
    assert b'\\"prompt_tokens\\": 99999' in data  # escaped, as JSON writes quotes inside a string
    for i in range(len(data) + 1):
        assert scanned([data[:i], data[i:]]) == 321, i
    assert input_tokens_of(orjson.dumps({"choices": [{"delta": {"content": text}}]})) is None


@pytest.mark.parametrize(
    ("data", "tokens"),
    [
        (b'{"usage":{"prompt_tokens":17,"completion_tokens":3}}', 17),  # OpenAI chat
        (b'{"usageMetadata":{"promptTokenCount":2048,"totalTokenCount":2100}}', 2048),  # Gemini
        (b'{"done":true,"prompt_eval_count":640,"eval_count":9}', 640),  # Ollama
        (b'{"usage":{"inputTokens":77,"outputTokens":5,"totalTokens":82}}', 77),  # Bedrock Converse
        (b'{"usage" : { "prompt_tokens" :\n 5 }}', 5),  # any whitespace JSON allows
    ],
)
def test_each_apis_key(data: bytes, tokens: int) -> None:
    assert input_tokens_of(data) == tokens


@pytest.mark.parametrize("data", [b"", b"{}", b'{"error":{"message":"too many images"}}', b'{"usage":null}', b'{"prompt_tokens":"12"}'])
def test_no_count_is_none(data: bytes) -> None:
    assert input_tokens_of(data) is None


def event_stream_frame(event: str, payload: bytes) -> bytes:
    """One AWS event-stream message (as Bedrock's converse-stream sends): prelude, headers, payload, CRCs."""
    headers = b""
    for name, value in ((":event-type", event), (":content-type", "application/json"), (":message-type", "event")):
        headers += bytes([len(name)]) + name.encode() + b"\x07" + struct.pack(">H", len(value)) + value.encode()
    total = 12 + len(headers) + len(payload) + 4
    prelude = struct.pack(">II", total, len(headers))
    head = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + payload
    return head + struct.pack(">I", zlib.crc32(head))


def test_bedrock_event_stream_frames() -> None:
    frames = (
        event_stream_frame("messageStart", b'{"role":"assistant"}')
        + event_stream_frame("contentBlockDelta", b'{"contentBlockIndex":0,"delta":{"text":"ok"}}')
        + event_stream_frame("metadata", b'{"usage":{"inputTokens":1234,"outputTokens":2,"totalTokens":1236},"metrics":{"latencyMs":9}}')
    )
    for i in range(len(frames) + 1):
        assert scanned([frames[:i], frames[i:]]) == 1234, i


# --- cache reads and writes, and output tokens -------------------------------------------------------------


def scanned_usage(chunks: list[bytes]) -> Usage:
    scanner = UsageScanner()
    for chunk in chunks:
        scanner(chunk)
    return scanner.usage


def assert_usage_everywhere(data: bytes, expected: Usage) -> None:
    """The same counts from the whole answer, a byte at a time, cut once anywhere, and cut many times."""
    assert usage_of(data) == expected
    assert scanned_usage([data[i : i + 1] for i in range(len(data))]) == expected
    for i in range(len(data) + 1):
        assert scanned_usage([data[:i], data[i:]]) == expected, i
    rng = random.Random(len(data))
    for _ in range(100):
        assert scanned_usage(cut(data, [rng.randrange(len(data) + 1) for _ in range(rng.randrange(1, 12))])) == expected


def sse(*events: tuple[str | None, dict]) -> bytes:
    return b"".join((f"event: {name}\n".encode() if name else b"") + b"data: " + orjson.dumps(data) + b"\n\n" for name, data in events)


def pretty(data: dict) -> bytes:
    """As OpenAI's API writes a JSON answer: indented, a space after each colon."""
    return orjson.dumps(data, option=orjson.OPT_INDENT_2)


ANTHROPIC_MESSAGE = {
    "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
    "type": "message",
    "role": "assistant",
    "content": [{"type": "text", "text": "The screenshot shows a login form."}],
    "model": "claude-sonnet-4-5-20250929",
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 2095,
        "cache_creation_input_tokens": 2051,
        "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 2051, "ephemeral_1h_input_tokens": 0},
        "output_tokens": 503,
        "service_tier": "standard",
    },
}


def test_anthropic_message_cache_write() -> None:
    # the prompt is input_tokens plus what was read and written; the per-TTL breakdown is not counted again
    assert_usage_everywhere(orjson.dumps(ANTHROPIC_MESSAGE), Usage(2095 + 2051, 0, 2051, 503))


def test_anthropic_stream_cache_read() -> None:
    start = {**ANTHROPIC_MESSAGE, "content": [], "stop_reason": None}
    start["usage"] = {"input_tokens": 25, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 1800, "output_tokens": 1}
    stream = sse(
        ("message_start", {"type": "message_start", "message": start}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "A form."}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 15}}),
        ("message_stop", {"type": "message_stop"}),
    )
    assert_usage_everywhere(stream, Usage(1825, 1800, 0, 15))


def test_bedrock_invoke_model_answers_as_anthropic() -> None:
    # InvokeModel with an Anthropic body answers with Anthropic's message, usage and all
    body = {**ANTHROPIC_MESSAGE, "usage": {"input_tokens": 12, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4000, "output_tokens": 9}}
    assert usage_of(orjson.dumps(body)) == Usage(4012, 4000, 0, 9)


OPENAI_CHAT = {
    "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
    "object": "chat.completion",
    "created": 1741570283,
    "model": "gpt-4.1-2025-04-14",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "A login form.", "refusal": None}, "logprobs": None, "finish_reason": "stop"}
    ],
    "usage": {
        "prompt_tokens": 2006,
        "completion_tokens": 300,
        "total_tokens": 2306,
        "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
    },
    "service_tier": "default",
}


def test_openai_chat_cached_prompt() -> None:
    # prompt_tokens already holds the cached part; OpenAI reports no write
    assert_usage_everywhere(pretty(OPENAI_CHAT), Usage(2006, 1920, None, 300))
    assert usage_of(orjson.dumps(OPENAI_CHAT)) == Usage(2006, 1920, None, 300)


def test_openai_chat_stream_usage_in_the_last_chunk() -> None:
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-2024-08-06", "usage": None}
    stream = sse(
        (None, {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}),
        (None, {**chunk, "choices": [{"index": 0, "delta": {"content": "A form."}, "finish_reason": None}]}),
        (None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        (None, {**chunk, "choices": [], "usage": OPENAI_CHAT["usage"]}),
    )
    assert_usage_everywhere(stream + b"data: [DONE]\n\n", Usage(2006, 1920, None, 300))


def test_openai_chat_without_details_has_no_cached_count() -> None:
    assert usage_of(b'{"usage":{"prompt_tokens":17,"completion_tokens":3,"total_tokens":20}}') == Usage(17, None, None, 3)
    assert usage_of(b'{"usage":{"prompt_tokens":17,"prompt_tokens_details":null}}') == Usage(17, None, None, None)


RESPONSES_USAGE = {
    "input_tokens": 328,
    "input_tokens_details": {"cached_tokens": 256},
    "output_tokens": 52,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 380,
}
RESPONSE = {
    "id": "resp_67ccd3a9da748190baa7f1570fe91ac604becb25c45c1d41",
    "object": "response",
    "created_at": 1741476777,
    "status": "completed",
    "max_output_tokens": None,
    "model": "gpt-4o-2024-08-06",
    "output": [
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant", "content": [{"type": "output_text", "text": "A form."}]}
    ],
    "previous_response_id": None,
    "usage": RESPONSES_USAGE,
}


def test_openai_responses_cached_prompt() -> None:
    assert_usage_everywhere(pretty(RESPONSE), Usage(328, 256, None, 52))


def test_openai_responses_stream() -> None:
    created = {**RESPONSE, "status": "in_progress", "output": [], "usage": None}
    stream = sse(
        ("response.created", {"type": "response.created", "response": created}),
        ("response.output_text.delta", {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "delta": "A form."}),
        ("response.completed", {"type": "response.completed", "response": RESPONSE}),
    )
    assert_usage_everywhere(stream, Usage(328, 256, None, 52))


GEMINI = {
    "candidates": [{"content": {"parts": [{"text": "A login form."}], "role": "model"}, "finishReason": "STOP", "index": 0}],
    "usageMetadata": {
        "promptTokenCount": 2050,
        "candidatesTokenCount": 120,
        "totalTokenCount": 2400,
        "cachedContentTokenCount": 2048,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 792}, {"modality": "IMAGE", "tokenCount": 1258}],
        "cacheTokensDetails": [{"modality": "TEXT", "tokenCount": 790}, {"modality": "IMAGE", "tokenCount": 1258}],
        "thoughtsTokenCount": 230,
    },
    "modelVersion": "gemini-2.5-flash",
    "responseId": "mQ3qaN3xFcWrkdUPnJ6xqAw",
}


def test_gemini_cached_content_and_thinking_as_output() -> None:
    # promptTokenCount holds the cached part; output is the candidates and the thinking, both billed as output
    assert_usage_everywhere(orjson.dumps(GEMINI), Usage(2050, 2048, None, 350))


def test_gemini_streams() -> None:
    first = {**GEMINI, "usageMetadata": {"promptTokenCount": 2050, "totalTokenCount": 2050, "cachedContentTokenCount": 2048}}
    events = [first, GEMINI]
    assert_usage_everywhere(b"".join(b"data: " + orjson.dumps(e) + b"\r\n\r\n" for e in events), Usage(2050, 2048, None, 350))
    assert_usage_everywhere(b"[" + b",\r\n".join(orjson.dumps(e) for e in events) + b"]", Usage(2050, 2048, None, 350))


def test_gemini_leaves_out_what_is_zero() -> None:
    # Gemini's JSON omits a zero count: no cachedContentTokenCount, no cache read reported
    usage = usage_of(b'{"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":2,"totalTokenCount":12}}')
    assert usage == Usage(10, None, None, 2)


BEDROCK = {
    "output": {"message": {"role": "assistant", "content": [{"text": "A login form."}]}},
    "stopReason": "end_turn",
    "usage": {"inputTokens": 10, "outputTokens": 378, "totalTokens": 1509, "cacheReadInputTokens": 1121, "cacheWriteInputTokens": 0},
    "metrics": {"latencyMs": 3114},
}


def test_bedrock_converse_cache_read() -> None:
    # inputTokens is the uncached part: the prompt is it plus what was read and written (totalTokens agrees)
    assert_usage_everywhere(orjson.dumps(BEDROCK), Usage(1131, 1121, 0, 378))


def test_bedrock_converse_cache_details_are_no_prompt_count() -> None:
    # each cacheDetails entry names the tokens written with one TTL as "inputTokens": a write, not the prompt
    usage = {
        "inputTokens": 20,
        "outputTokens": 100,
        "totalTokens": 5120,
        "cacheReadInputTokens": 0,
        "cacheWriteInputTokens": 5000,
        "cacheDetails": [{"inputTokens": 3000, "ttl": "1h"}, {"inputTokens": 2000, "ttl": "5m"}],
    }
    assert_usage_everywhere(orjson.dumps({**BEDROCK, "usage": usage}), Usage(5020, 0, 5000, 100))
    # with room between the array's opening and its entries, longer than the tail a scanner keeps
    spaced = orjson.dumps({**BEDROCK, "usage": usage}).replace(b'"cacheDetails":[', b'"cacheDetails":[' + b" " * 100)
    assert_usage_everywhere(spaced, Usage(5020, 0, 5000, 100))


def test_bedrock_converse_stream_metadata_frame() -> None:
    usage = {"inputTokens": 8, "outputTokens": 2, "totalTokens": 2010, "cacheReadInputTokens": 0, "cacheWriteInputTokens": 2000}
    usage["cacheDetails"] = [{"inputTokens": 2000, "ttl": "5m"}]
    frames = (
        event_stream_frame("messageStart", b'{"role":"assistant"}')
        + event_stream_frame("contentBlockDelta", b'{"contentBlockIndex":0,"delta":{"text":"ok"}}')
        + event_stream_frame("messageStop", b'{"stopReason":"end_turn"}')
        + event_stream_frame("metadata", orjson.dumps({"usage": usage, "metrics": {"latencyMs": 9}}))
    )
    assert_usage_everywhere(frames, Usage(2008, 0, 2000, 2))


def test_ollama_counts() -> None:
    answer = {
        "model": "llava",
        "created_at": "2023-12-12T14:13:43.416799Z",
        "message": {"role": "assistant", "content": "A form."},
        "done": True,
        "total_duration": 5191566416,
        "load_duration": 2154458,
        "prompt_eval_count": 26,
        "prompt_eval_duration": 383809000,
        "eval_count": 298,
        "eval_duration": 4799921000,
    }
    assert_usage_everywhere(orjson.dumps(answer) + b"\n", Usage(26, None, None, 298))


@pytest.mark.parametrize(
    "data",
    [
        b'{"usage":{"prompt_tokens":10,"cached_tokens":99}}',  # a cached_tokens outside the details
        b'{"usage":{"prompt_tokens":10,"other_details":{"cached_tokens":99}}}',  # inside another object
        b'{"usage":{"prompt_tokens_details":{"audio_tokens":0},"x":{"cached_tokens":99},"prompt_tokens":10}}',  # after the details closed
        orjson.dumps({"choices": [{"delta": {"content": 'see "prompt_tokens_details": {"cached_tokens": 99}'}}], "usage": {"prompt_tokens": 10}}),
    ],
)
def test_a_cached_tokens_elsewhere_is_not_a_cache_read(data: bytes) -> None:
    assert_usage_everywhere(data, Usage(10, None, None, None))


def test_cached_tokens_far_into_its_details() -> None:
    # the details object may be open over several chunks: more than the tail a scanner keeps lies between
    data = b'{"usage":{"prompt_tokens":10,"prompt_tokens_details":{' + b" " * 150 + b'"audio_tokens": 0,\n      "cached_tokens": 7}}}'
    assert_usage_everywhere(data, Usage(10, 7, None, None))
