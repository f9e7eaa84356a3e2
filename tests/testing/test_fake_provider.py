"""The fake provider against the real SDK clients (openai, anthropic, google-genai) and raw HTTP.

No proxy and no mocks: these pin down that the fake speaks each wire format well enough for the real clients.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import io
import json
import math
import re
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest
from google import genai
from google.genai import types
from PIL import Image

from trimflow.testing import REPLY_TEXT, FakeProvider, Received, count_images, estimate_usage
from trimflow.testing._fake_usage import base64_bytes

from ..certs import make_server_cert


def png_bytes(size: int = 64) -> bytes:
    """A real PNG of noise, so it does not compress to a few bytes."""
    buf = io.BytesIO()
    Image.effect_noise((size, size), 64).convert("RGB").save(buf, "PNG")
    return buf.getvalue()


PNG = png_bytes()
PNG_B64 = base64.b64encode(PNG).decode()
DATA_URL = f"data:image/png;base64,{PNG_B64}"


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


def last(p: FakeProvider) -> Received:
    return p.received[-1]


def post(url: str, body: bytes, headers: dict[str, str] | None = None, context=None) -> tuple[int, str, bytes]:
    headers = {"content-type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return r.status, r.headers["content-type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["content-type"], e.read()


# --- OpenAI -------------------------------------------------------------------------------------------------


def oai(p: FakeProvider, prefix: str = "/v1") -> openai.OpenAI:
    return openai.OpenAI(base_url=p.url + prefix, api_key="test-key", max_retries=0)


def chat_messages() -> list:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is in this image?"},
                {"type": "image_url", "image_url": {"url": DATA_URL}},
            ],
        }
    ]


def test_openai_chat_json(provider: FakeProvider) -> None:
    r = oai(provider).chat.completions.create(model="gpt-4o", messages=chat_messages())
    assert r.choices[0].message.content == REPLY_TEXT
    assert r.choices[0].finish_reason == "stop"
    rec = last(provider)
    assert rec.path == "/v1/chat/completions" and rec.json()["model"] == "gpt-4o"
    assert rec.headers["authorization"] == "Bearer test-key"
    # The image costs 1600 tokens, its base64 nothing more.
    assert r.usage.prompt_tokens == estimate_usage(rec.body).input_tokens
    assert 1600 < r.usage.prompt_tokens < 1700
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


@pytest.mark.parametrize("include_usage", [True, False])
def test_openai_chat_stream(provider: FakeProvider, include_usage: bool) -> None:
    stream = oai(provider).chat.completions.create(
        model="gpt-4o",
        messages=chat_messages(),
        stream=True,
        stream_options={"include_usage": include_usage},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == REPLY_TEXT
    with_usage = [c for c in chunks if c.usage is not None]
    if include_usage:
        assert with_usage == [chunks[-1]] and chunks[-1].choices == []
        assert chunks[-1].usage.prompt_tokens == estimate_usage(last(provider).body).input_tokens
    else:
        assert with_usage == []


def test_openai_other_prefix(provider: FakeProvider) -> None:
    r = oai(provider, "/v2").chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == REPLY_TEXT
    assert last(provider).path == "/v2/chat/completions"


def responses_input() -> list:
    return [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "describe"},
                {"type": "input_image", "image_url": DATA_URL},
            ],
        }
    ]


def test_openai_responses_json(provider: FakeProvider) -> None:
    r = oai(provider).responses.create(model="gpt-5", input=responses_input())
    assert r.output_text == REPLY_TEXT and r.status == "completed"
    assert last(provider).path == "/v1/responses"
    assert r.usage.input_tokens == estimate_usage(last(provider).body).input_tokens > 1600
    assert r.usage.input_tokens_details.cached_tokens == 0
    assert r.usage.output_tokens_details.reasoning_tokens == 0


def test_openai_responses_stream(provider: FakeProvider) -> None:
    events = list(oai(provider).responses.create(model="gpt-5", input=responses_input(), stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    for kind in (
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ):
        assert kinds.count(kind) == 1, kind
    assert kinds.count("response.output_text.delta") >= 3
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == REPLY_TEXT
    completed = events[-1]
    assert isinstance(completed, openai.types.responses.ResponseCompletedEvent)
    usage = completed.response.usage
    assert usage.input_tokens == estimate_usage(last(provider).body).input_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens

    # The SDK's stream helper accumulates the events into a response: item ids and indexes must line up.
    with oai(provider).responses.stream(model="gpt-5", input=responses_input()) as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert text == REPLY_TEXT and final.output_text == REPLY_TEXT
    assert final.usage.input_tokens == usage.input_tokens


# --- Anthropic ----------------------------------------------------------------------------------------------


def claude_messages() -> list:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}}
    return [{"role": "user", "content": [image, {"type": "text", "text": "what is this?"}]}]


def claude(p: FakeProvider) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=p.url, api_key="test-key", max_retries=0)


def test_anthropic_json(provider: FakeProvider) -> None:
    m = claude(provider).messages.create(model="claude-test", max_tokens=100, messages=claude_messages())
    assert m.content[0].text == REPLY_TEXT and m.stop_reason == "end_turn"
    rec = last(provider)
    assert rec.path == "/v1/messages"
    # anthropic 2.x sends the key as "authorization: Bearer", older versions as "x-api-key".
    assert "test-key" in rec.headers.get("x-api-key", rec.headers.get("authorization", ""))
    assert m.usage.input_tokens == estimate_usage(rec.body).input_tokens > 1600
    counted = claude(provider).messages.count_tokens(model="claude-test", messages=claude_messages())
    assert last(provider).path == "/v1/messages/count_tokens"
    assert counted.input_tokens == estimate_usage(last(provider).body).input_tokens > 1600


def test_anthropic_stream(provider: FakeProvider) -> None:
    with claude(provider).messages.stream(model="claude-test", max_tokens=100, messages=claude_messages()) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == REPLY_TEXT and final.content[0].text == REPLY_TEXT
    assert final.usage.input_tokens == estimate_usage(last(provider).body).input_tokens
    assert final.usage.output_tokens == estimate_usage(b"").output_tokens
    assert final.stop_reason == "end_turn"


def test_anthropic_vertex_stream_raw_predict(provider: FakeProvider) -> None:
    path = "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-test:streamRawPredict"
    body = json.dumps({"anthropic_version": "vertex-2023-10-16", "messages": claude_messages()})
    status, ctype, data = post(provider.url + path, body.encode())
    assert status == 200 and ctype.startswith("text/event-stream")
    events = [line[7:] for line in data.decode().splitlines() if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "ping" in events and events.count("content_block_delta") >= 3
    start = json.loads(data.decode().split("data: ", 2)[1].split("\n")[0])
    assert start["message"]["model"] == "claude-test"  # from the path: Vertex bodies carry no model


# --- Gemini -------------------------------------------------------------------------------------------------


@pytest.fixture
def gemini(provider: FakeProvider) -> Iterator[genai.Client]:
    # Keep the client referenced while it is used: a collected genai.Client closes its HTTP client.
    with genai.Client(api_key="test-key", http_options=types.HttpOptions(base_url=provider.url)) as client:
        yield client


def gemini_contents() -> list:
    return [types.Part.from_bytes(data=PNG, mime_type="image/png"), "what is this?"]


def test_gemini_json(provider: FakeProvider, gemini: genai.Client) -> None:
    r = gemini.models.generate_content(model="gemini-2.5-flash", contents=gemini_contents())
    assert r.text == REPLY_TEXT
    rec = last(provider)
    assert rec.path.endswith("/models/gemini-2.5-flash:generateContent")  # /v1 or /v1beta, per SDK version
    assert r.usage_metadata.prompt_token_count == estimate_usage(rec.body).input_tokens > 1600
    assert r.usage_metadata.total_token_count == (r.usage_metadata.prompt_token_count + r.usage_metadata.candidates_token_count)


def test_url_safe_base64_is_image_data(provider: FakeProvider, gemini: genai.Client) -> None:
    """google-genai sends inline data in the URL-safe alphabet: the estimate counts it as the image, not as text."""
    encoded = base64.urlsafe_b64encode(PNG)
    assert b"-" in encoded and b"_" in encoded  # both URL-safe characters are really in play
    part = {"inline_data": {"mime_type": "image/png", "data": encoded.decode()}}
    body = json.dumps({"contents": [{"role": "user", "parts": [part, {"text": "what is this?"}]}]}).encode()
    assert base64_bytes(body) == len(encoded)
    assert estimate_usage(body).input_tokens == math.ceil((len(body) - len(encoded)) / 4) + 1600
    gemini.models.generate_content(model="gemini-2.5-flash", contents=gemini_contents())
    sent = last(provider).body
    data = json.loads(sent)["contents"][0]["parts"][0]["inlineData"]["data"]
    assert data == encoded.decode()  # the SDK's own encoding of the same PNG
    assert base64_bytes(sent) == len(data)
    assert estimate_usage(sent).input_tokens == math.ceil((len(sent) - len(data)) / 4) + 1600


def test_gemini_stream_sse(provider: FakeProvider, gemini: genai.Client) -> None:
    chunks = list(gemini.models.generate_content_stream(model="gemini-2.5-flash", contents=gemini_contents()))
    assert len(chunks) >= 3 and "".join(c.text for c in chunks) == REPLY_TEXT
    rec = last(provider)
    assert rec.path.endswith(":streamGenerateContent") and rec.query == "alt=sse"
    final = chunks[-1].usage_metadata
    assert final.prompt_token_count == estimate_usage(rec.body).input_tokens
    assert final.candidates_token_count
    assert final.total_token_count == final.prompt_token_count + final.candidates_token_count
    assert chunks[0].usage_metadata.candidates_token_count is None  # final counts only on the last chunk
    assert str(chunks[-1].candidates[0].finish_reason).endswith("STOP")


def test_gemini_stream_json_array(provider: FakeProvider) -> None:
    part = {"inlineData": {"mimeType": "image/png", "data": PNG_B64}}
    body = json.dumps({"contents": [{"role": "user", "parts": [part]}]}).encode()
    status, ctype, data = post(provider.url + "/v1beta/models/gemini-x:streamGenerateContent", body)
    assert status == 200 and ctype.startswith("application/json")
    assert data.startswith(b"[{") and b"\n,\r\n{" in data and data.endswith(b"}]")
    items = json.loads(data)
    assert "".join(i["candidates"][0]["content"]["parts"][0]["text"] for i in items) == REPLY_TEXT
    assert items[-1]["usageMetadata"]["promptTokenCount"] == estimate_usage(last(provider).body).input_tokens


# --- Ollama, Bedrock, errors --------------------------------------------------------------------------------


def test_ollama_ndjson_and_json(provider: FakeProvider) -> None:
    msg = {"role": "user", "content": "what is this?", "images": [PNG_B64, PNG_B64]}
    conn = http.client.HTTPConnection("127.0.0.1", provider.port, timeout=10)
    conn.request("POST", "/api/chat", json.dumps({"model": "llava", "messages": [msg]}))
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("content-type") == "application/x-ndjson"
    assert resp.getheader("transfer-encoding") == "chunked"
    lines = [json.loads(line) for line in resp.read().splitlines()]
    assert all(not line["done"] for line in lines[:-1]) and lines[-1]["done"] is True
    assert "".join(line["message"]["content"] for line in lines) == REPLY_TEXT
    usage = estimate_usage(last(provider).body)
    assert usage.images == 2 and lines[-1]["prompt_eval_count"] == usage.input_tokens > 3200

    # Same connection (keep-alive), "stream": false gives one JSON object.
    conn.request("POST", "/api/chat", json.dumps({"model": "llava", "messages": [msg], "stream": False}))
    resp = conn.getresponse()
    reply = json.loads(resp.read())
    assert reply["done"] is True and reply["message"]["content"] == REPLY_TEXT
    # Ollama's created_at is UTC ISO 8601, as trimflow writes every timestamp.
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", reply["created_at"])
    assert {line["created_at"][:4] for line in lines} == {reply["created_at"][:4]}
    conn.close()


def test_bedrock_converse(provider: FakeProvider) -> None:
    image = {"image": {"format": "png", "source": {"bytes": PNG_B64}}}
    body = json.dumps({"messages": [{"role": "user", "content": [image, {"text": "what?"}]}]}).encode()
    status, _, data = post(provider.url + "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse", body)
    reply = json.loads(data)
    assert status == 200 and reply["output"]["message"]["content"][0]["text"] == REPLY_TEXT
    assert reply["usage"]["inputTokens"] == estimate_usage(body).input_tokens > 1600

    status, ctype, data = post(provider.url + "/model/some.model/converse-stream", body)
    assert status == 501 and ctype == "application/json"
    assert "event-stream" in json.loads(data)["message"]


def test_errors(provider: FakeProvider) -> None:
    status, ctype, data = post(provider.url + "/v1/embeddings", b"{}")
    assert status == 404 and ctype == "application/json" and "no route" in json.loads(data)["error"]["message"]
    status, _, _ = post(provider.url + "/v1/messages", b"not json")
    assert status == 400
    status, _, _ = post(provider.url + "/v1/messages", b"{}", {"content-encoding": "gzip"})  # not gzip at all
    assert status == 400


# --- plumbing -----------------------------------------------------------------------------------------------


def test_received_body_is_decoded(provider: FakeProvider) -> None:
    raw = json.dumps({"model": "m", "messages": chat_messages()}).encode()
    encodings = {"gzip": gzip.compress(raw)}
    try:
        import brotli

        encodings["br"] = brotli.compress(raw)
    except ImportError:
        pass
    try:
        import zstandard

        encodings["zstd"] = zstandard.ZstdCompressor().compress(raw)
    except ImportError:
        pass
    for enc, wire in encodings.items():
        status, _, data = post(provider.url + "/v1/chat/completions", wire, {"content-encoding": enc})
        assert status == 200, enc
        rec = last(provider)
        assert rec.body == raw and rec.wire_bytes == len(wire) < len(raw), enc
        assert json.loads(data)["usage"]["prompt_tokens"] == estimate_usage(raw).input_tokens


def test_check_hook_answers_first() -> None:
    message = "Request exceeds the maximum size"
    error = {"type": "error", "error": {"type": "request_too_large", "message": message}}
    too_large = json.dumps(error).encode()

    def check(rec: Received):
        return (413, "application/json", too_large) if count_images(rec.body) > 1 else None

    with FakeProvider(check=check) as p:
        client = claude(p)
        with pytest.raises(anthropic.APIStatusError) as err:
            client.messages.create(model="c", max_tokens=5, messages=claude_messages() * 2)
        assert err.value.status_code == 413 and "maximum size" in str(err.value)
        m = client.messages.create(model="c", max_tokens=5, messages=claude_messages())
        assert m.content[0].text == REPLY_TEXT
        assert len(p.received) == 2


def test_https(tmp_path: Path) -> None:
    cert, key = make_server_cert(tmp_path)
    with FakeProvider(certfile=str(cert), keyfile=str(key)) as p:
        assert p.url.startswith("https://127.0.0.1:")
        ctx = ssl.create_default_context(cafile=str(cert))
        status, _, data = post(p.url + "/v1/chat/completions", b'{"model":"m","messages":[]}', context=ctx)
        assert status == 200 and json.loads(data)["choices"][0]["message"]["content"] == REPLY_TEXT
        # A client that does not trust the certificate is refused; the server keeps serving.
        with pytest.raises(urllib.error.URLError):
            post(p.url + "/v1/messages", b"{}", context=ssl.create_default_context())
        status, _, _ = post(p.url.replace("127.0.0.1", "localhost") + "/v1/messages", b"{}", context=ctx)
        assert status == 200


def test_stream_arrives_event_by_event() -> None:
    """Each event is its own flushed chunk: with a delay, the first arrives long before the last."""
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
    with FakeProvider(event_delay=0.2) as p, socket.create_connection(("127.0.0.1", p.port), 10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        seen: list[float] = []  # arrival time of each SSE event
        data = b""
        while chunk := sock.recv(65536):
            now = time.monotonic()
            seen += [now] * (chunk.count(b"data: "))
            data += chunk
    head, _, _ = data.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower()
    assert len(seen) >= 5 and data.rstrip().endswith(b"0")
    assert seen[-1] - seen[0] >= 0.5
    assert len(set(seen)) >= 5  # not one burst: events came in separate reads


def test_count_images_per_format() -> None:
    assert count_images(json.dumps({"messages": chat_messages()}).encode()) == 1
    assert count_images(json.dumps({"input": responses_input()}, separators=(",", ":")).encode()) == 1
    assert count_images(json.dumps({"messages": claude_messages() * 3}).encode()) == 3
    assert count_images(b'{"parts":[{"inline_data":{}},{"inlineData":{}},{"text":"image"}]}') == 2
    assert count_images(b'{"content":[{"image":{"format":"png"}},{"text":"an image"}]}') == 1
    assert count_images(b'{"messages":[{"images":["AAAA","BBBB"]},{"images":[]}]}') == 2
    u = estimate_usage(json.dumps({"messages": claude_messages()}).encode())
    assert u.images == 1 and 1600 < u.input_tokens < 1700  # the base64 counts as the image, not as text
