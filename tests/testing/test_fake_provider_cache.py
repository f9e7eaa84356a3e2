"""FakeProvider(cache=True) against the real SDK clients: the cache usage sits where each SDK reads it.

Two requests with the same long prefix: the first writes it (Anthropic, Bedrock) or caches it (OpenAI,
Gemini), the second reads it. No mocks: the real openai, anthropic and google-genai clients parse the answers.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import types
from PIL import Image

from trimflow.testing import FakeProvider
from trimflow.testing._cache_model import MAX_BREAKPOINTS_TEXT


def png_bytes(size: int) -> bytes:
    buf = io.BytesIO()
    Image.effect_noise((size, size), 64).convert("RGB").save(buf, "PNG")
    return buf.getvalue()


def post(url: str, body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as r:
        return r.status, r.read()


# A real 64x64 PNG of noise, as the fake provider's own tests send.
PNG = png_bytes(64)
PNG_B64 = base64.b64encode(PNG).decode()

# About 5,000 tokens of instructions: over every provider's minimum cacheable prefix.
LONG = "You are a careful desktop assistant. Read the screen before you act. " * 290


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider(cache=True) as p:  # one per test: each starts with a cold cache
        yield p


def claude(p: FakeProvider) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=p.url, api_key="test-key", max_retries=0)


def claude_request(question: str) -> dict[str, Any]:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}}
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 100,
        "system": [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [image, {"type": "text", "text": question}]}],
    }


def test_anthropic_json_reads_what_the_first_request_wrote(provider: FakeProvider) -> None:
    first = claude(provider).messages.create(**claude_request("what is this?"))
    second = claude(provider).messages.create(**claude_request("what is that?"))
    u1, u2 = first.usage, second.usage
    assert u1.cache_read_input_tokens == 0 and u1.cache_creation_input_tokens > 1024
    assert u1.cache_creation.ephemeral_5m_input_tokens == u1.cache_creation_input_tokens
    assert u1.cache_creation.ephemeral_1h_input_tokens == 0
    # The system prompt was written once and is read now; the message after the breakpoint is neither.
    assert u2.cache_read_input_tokens == u1.cache_creation_input_tokens and u2.cache_creation_input_tokens == 0
    assert u2.input_tokens == u1.input_tokens > 0  # the image and the question: after the last breakpoint


def test_anthropic_stream_reports_the_cache_in_message_start(provider: FakeProvider) -> None:
    claude(provider).messages.create(**claude_request("what is this?"))
    with claude(provider).messages.stream(**claude_request("what is that?")) as s:
        final = s.get_final_message()
    assert (final.usage.cache_read_input_tokens or 0) > 1024 and final.usage.cache_creation_input_tokens == 0


def test_anthropic_fifth_breakpoint_is_refused_with_anthropics_text(provider: FakeProvider) -> None:
    body = claude_request("what is this?")
    body["messages"][0]["content"] = [{"type": "text", "text": f"part {i}", "cache_control": {"type": "ephemeral"}} for i in range(4)]
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude(provider).messages.create(**body)
    assert refused.value.status_code == 400
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["error"] == {"type": "invalid_request_error", "message": MAX_BREAKPOINTS_TEXT.format(found=5)}


def oai(p: FakeProvider) -> openai.OpenAI:
    return openai.OpenAI(base_url=p.url + "/v1", api_key="test-key", max_retries=0)


def chat(question: str) -> list[Any]:
    return [{"role": "system", "content": LONG}, {"role": "user", "content": question}]


def test_openai_chat_cached_tokens_in_128_token_steps(provider: FakeProvider) -> None:
    first = oai(provider).chat.completions.create(model="gpt-4o", messages=chat("first?"))
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    stream = oai(provider).chat.completions.create(model="gpt-4o", messages=chat("second?"), stream=True, stream_options={"include_usage": True})
    usage = [c.usage for c in stream if c.usage is not None][-1]
    assert usage.prompt_tokens_details is not None and (cached := usage.prompt_tokens_details.cached_tokens) is not None
    assert cached >= 1024 and cached % 128 == 0
    assert usage.prompt_tokens - 128 < cached < usage.prompt_tokens  # the prompt counts the cached tokens too


def test_openai_responses_cached_tokens(provider: FakeProvider) -> None:
    client = oai(provider)
    client.responses.create(model="gpt-5", instructions=LONG, input="first?")
    with client.responses.stream(model="gpt-5", instructions=LONG, input="second?") as s:
        final = s.get_final_response()
    assert final.usage is not None
    cached = final.usage.input_tokens_details.cached_tokens
    assert cached >= 1024 and cached % 128 == 0 and cached < final.usage.input_tokens


def test_gemini_cached_content_token_count(provider: FakeProvider) -> None:
    with genai.Client(api_key="test-key", http_options=types.HttpOptions(base_url=provider.url)) as client:
        config = types.GenerateContentConfig(system_instruction=LONG)
        image = types.Part.from_bytes(data=PNG, mime_type="image/png")
        first = client.models.generate_content(
            model="gemini-2.5-flash", contents=types.Content(role="user", parts=[image, types.Part.from_text(text="first?")]), config=config
        )
        assert first.usage_metadata is not None
        assert first.usage_metadata.cached_content_token_count is None  # Gemini leaves a zero out
        chunks = list(
            client.models.generate_content_stream(
                model="gemini-2.5-flash", contents=types.Content(role="user", parts=[image, types.Part.from_text(text="second?")]), config=config
            )
        )
    usage = chunks[-1].usage_metadata
    assert usage is not None and usage.cache_tokens_details is not None
    cached, prompt = usage.cached_content_token_count or 0, usage.prompt_token_count or 0
    assert 2048 < cached < prompt
    by_modality = {d.modality.name if d.modality else None: d.token_count or 0 for d in usage.cache_tokens_details}
    assert sum(by_modality.values()) == cached and by_modality["IMAGE"] > 0


def test_bedrock_converse_cache_point(provider: FakeProvider) -> None:
    def converse(question: str) -> dict[str, int]:
        body = {
            "system": [{"text": LONG}, {"cachePoint": {"type": "default"}}],
            "messages": [{"role": "user", "content": [{"text": question}]}],
        }
        path = "/model/anthropic.claude-sonnet-4-6/converse"
        status, data = post(provider.url + path, json.dumps(body).encode())
        assert status == 200
        return json.loads(data)["usage"]

    first, second = converse("first?"), converse("second?")
    assert first["cacheWriteInputTokens"] > 1024 and first["cacheReadInputTokens"] == 0
    assert second["cacheReadInputTokens"] == first["cacheWriteInputTokens"] and second["cacheWriteInputTokens"] == 0
    assert second["totalTokens"] == second["inputTokens"] + second["cacheReadInputTokens"] + second["outputTokens"]


def test_without_cache_the_answers_are_unchanged() -> None:
    with FakeProvider() as p:
        for _ in range(2):
            m = claude(p).messages.create(**claude_request("what is this?"))
            assert m.usage.cache_read_input_tokens == 0 and m.usage.cache_creation_input_tokens == 0
            assert m.usage.cache_creation is None


def test_cli_cache_option() -> None:
    command = [sys.executable, "-m", "trimflow", "fake-provider", "--port", "0", "--cache"]
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True) as proc:  # leaving it closes the pipe
        try:
            assert proc.stderr is not None
            line = proc.stderr.readline()
            assert "modelling prompt caching" in line
            url = line.split("listening on ", 1)[1].split(",", 1)[0].strip()
            body = json.dumps(claude_request("what is this?")).encode()
            usages = []
            for _ in range(2):
                request = urllib.request.Request(url + "/v1/messages", data=body, headers={"content-type": "application/json"})
                with urllib.request.urlopen(request, timeout=10) as r:
                    usages.append(json.loads(r.read())["usage"])
            assert usages[1]["cache_read_input_tokens"] == usages[0]["cache_creation_input_tokens"] > 1024
            assert "cache read=" in proc.stderr.readline()
        finally:
            proc.terminate()
            proc.wait(timeout=10)
