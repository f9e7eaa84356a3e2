"""trimflow._usage: the input tokens a provider reports, read from real answers of the fake provider (JSON, and
streams as SSE, NDJSON and Google's JSON array) however the stream is cut into chunks, and from an AWS
event-stream frame.
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

from trimflow._usage import UsageScanner, input_tokens_of
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
