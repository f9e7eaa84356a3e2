"""Cache usage end to end: the real openai (chat and Responses), anthropic and google-genai clients, streaming and
not, hold three-turn screenshot conversations with a long system prompt (and Anthropic's cache breakpoints, as
Claude Code places them) through a real mitmdump with the addon, in front of FakeProvider(cache=True). Each
record carries the cache reads and writes and the output tokens the SDK reports for the same answer, and the
audit of the metrics JSONL (run as a user runs it) prices each conversation from them."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import orjson
import pytest
from google import genai
from google.genai import types

from trimflow._prices import load_prices
from trimflow.testing import FakeProvider, b64

from .helpers import ANTHROPIC_KEY, GOOGLE_KEY, OPENAI_KEY, ROOT, Proxy, direct_http_client, genai_client_args, shots, start_proxy, stop_all

pytestmark = pytest.mark.e2e

TURNS = 3
# About 5,000 tokens: over every provider's minimum cacheable prefix (Anthropic 1,024 to 4,096, OpenAI 1,024, Gemini 2,048).
SYSTEM = "You are a careful desktop assistant. Read the screen before you act, then say which control to use. " * 200
EPHEMERAL = {"type": "ephemeral"}


@dataclass(frozen=True)
class Usage:
    """What the SDK's response object reports for one answer, in the record's terms (None: the SDK says nothing)."""

    input_tokens: int  # the whole prompt
    cache_read: int | None
    cache_write: int | None
    output: int


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProvider]:
    with FakeProvider(cache=True) as p:
        yield p


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, provider: FakeProvider) -> Iterator[Proxy]:
    started = start_proxy(tmp_path_factory.mktemp("cache-usage"), "--mode", f"reverse:{provider.url}", rules=None)
    yield started
    stop_all(started.mitm)


# --- one conversation per SDK: each turn sends the whole history, one screenshot more ------------------------


def claude_turns(client: anthropic.Anthropic, stream: bool, images: list[bytes], system: str) -> list[Usage]:
    """Claude Code's breakpoints: the system prompt, and the last block of the newest user message (moved each turn)."""
    messages: list[dict[str, Any]] = []
    out = []
    for turn, shot in enumerate(images, 1):
        shot_block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(shot)}}
        messages.append({"role": "user", "content": [shot_block, {"type": "text", "text": f"Turn {turn}: what should I click next?"}]})
        for message in messages[:-1]:  # one breakpoint on the newest message only
            for block in message["content"]:
                block.pop("cache_control", None)
        messages[-1]["content"][-1]["cache_control"] = EPHEMERAL
        args = {
            "model": "claude-sonnet-4-6",
            "max_tokens": 200,
            "system": [{"type": "text", "text": system, "cache_control": EPHEMERAL}],
            "messages": messages,
        }
        if stream:
            with client.messages.stream(**args) as events:
                reply = events.get_final_message()
        else:
            reply = client.messages.create(**args)
        u = reply.usage
        read, write = u.cache_read_input_tokens, u.cache_creation_input_tokens
        out.append(Usage(u.input_tokens + (read or 0) + (write or 0), read, write, u.output_tokens))
        messages.append({"role": "assistant", "content": [{"type": "text", "text": reply.content[0].text}]})
    return out


def chat_turns(client: openai.OpenAI, stream: bool, images: list[bytes], system: str) -> list[Usage]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    out = []
    for turn, shot in enumerate(images, 1):
        url = f"data:image/png;base64,{b64(shot)}"
        content = [{"type": "text", "text": f"Turn {turn}: what should I click next?"}, {"type": "image_url", "image_url": {"url": url}}]
        messages.append({"role": "user", "content": content})
        if stream:
            chunks = list(client.chat.completions.create(model="gpt-4o", messages=messages, stream=True, stream_options={"include_usage": True}))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            usage = chunks[-1].usage
        else:
            reply = client.chat.completions.create(model="gpt-4o", messages=messages)
            text, usage = reply.choices[0].message.content, reply.usage
        assert usage is not None and usage.prompt_tokens_details is not None
        out.append(Usage(usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens, None, usage.completion_tokens))
        messages.append({"role": "assistant", "content": text})
    return out


def responses_turns(client: openai.OpenAI, stream: bool, images: list[bytes], system: str) -> list[Usage]:
    items: list[dict[str, Any]] = []
    out = []
    for turn, shot in enumerate(images, 1):
        url = f"data:image/png;base64,{b64(shot)}"
        content = [{"type": "input_text", "text": f"Turn {turn}: what should I click next?"}, {"type": "input_image", "image_url": url}]
        items.append({"role": "user", "content": content})
        if stream:
            with client.responses.stream(model="gpt-4.1", instructions=system, input=items) as events:
                reply = events.get_final_response()
        else:
            reply = client.responses.create(model="gpt-4.1", instructions=system, input=items)
        usage = reply.usage
        assert usage is not None
        out.append(Usage(usage.input_tokens, usage.input_tokens_details.cached_tokens, None, usage.output_tokens))
        items.append({"role": "assistant", "content": reply.output_text})
    return out


def gemini_turns(client: genai.Client, stream: bool, images: list[bytes], system: str) -> list[Usage]:
    config = types.GenerateContentConfig(system_instruction=system)
    contents: list[types.Content] = []
    out = []
    for turn, shot in enumerate(images, 1):
        parts = [types.Part.from_text(text=f"Turn {turn}: what should I click next?"), types.Part.from_bytes(data=shot, mime_type="image/png")]
        contents.append(types.Content(role="user", parts=parts))
        if stream:
            chunks = list(client.models.generate_content_stream(model="gemini-2.5-flash", contents=contents, config=config))
            text, usage = "".join(c.text or "" for c in chunks), chunks[-1].usage_metadata
        else:
            reply = client.models.generate_content(model="gemini-2.5-flash", contents=contents, config=config)
            text, usage = reply.text or "", reply.usage_metadata
        assert usage is not None and usage.prompt_token_count is not None
        output = (usage.candidates_token_count or 0) + (usage.thoughts_token_count or 0)
        out.append(Usage(usage.prompt_token_count, usage.cached_content_token_count, None, output))
        contents.append(types.Content(role="model", parts=[types.Part.from_text(text=text)]))
    return out


@dataclass(frozen=True)
class Client:
    name: str
    model: str
    run: Callable[[Proxy, bool, list[bytes], str], list[Usage]]


def with_claude(proxy: Proxy, stream: bool, images: list[bytes], system: str) -> list[Usage]:
    with anthropic.Anthropic(api_key=ANTHROPIC_KEY, base_url=proxy.url, http_client=direct_http_client(), max_retries=0, timeout=30) as client:
        return claude_turns(client, stream, images, system)


def with_openai(turns: Callable[[openai.OpenAI, bool, list[bytes], str], list[Usage]]) -> Callable[[Proxy, bool, list[bytes], str], list[Usage]]:
    def run(proxy: Proxy, stream: bool, images: list[bytes], system: str) -> list[Usage]:
        base = f"{proxy.url}/v1"
        with openai.OpenAI(api_key=OPENAI_KEY, base_url=base, http_client=direct_http_client(), max_retries=0, timeout=30) as client:
            return turns(client, stream, images, system)

    return run


def with_genai(proxy: Proxy, stream: bool, images: list[bytes], system: str) -> list[Usage]:
    options = types.HttpOptions(base_url=proxy.url, timeout=30_000, client_args=genai_client_args())
    with genai.Client(api_key=GOOGLE_KEY, http_options=options) as client:
        return gemini_turns(client, stream, images, system)


CLIENTS = [
    Client("anthropic", "claude-sonnet-4-6", with_claude),
    Client("openai-chat", "gpt-4o", with_openai(chat_turns)),
    Client("openai-responses", "gpt-4.1", with_openai(responses_turns)),
    Client("gemini", "gemini-2.5-flash", with_genai),
]
CASES = [(client, stream) for client in CLIENTS for stream in (False, True)]


@pytest.fixture(scope="module")
def conversations(proxy: Proxy) -> dict[tuple[str, bool], tuple[list[Usage], list[dict[str, Any]]]]:
    """Every client's conversation, streaming and not, one after another: (the SDK's usage, the records) per case.
    Each opens with a system prompt of its own, so each starts with a cold cache."""
    out = {}
    for seed, (client, stream) in enumerate(CASES, 1):
        with proxy.expect_records(TURNS) as records:
            usage = client.run(proxy, stream, shots(TURNS, seed=100 + seed), f"Session {seed}. {SYSTEM}")
        out[client.name, stream] = (usage, list(records))
    return out


@pytest.mark.parametrize(("client", "stream"), CASES, ids=[f"{c.name}-{'stream' if s else 'json'}" for c, s in CASES])
def test_records_carry_the_cache_usage_the_sdk_reports(conversations: dict, client: Client, stream: bool) -> None:
    usage, records = conversations[client.name, stream]
    assert [r["turn"] for r in records] == list(range(1, TURNS + 1))
    assert len({r["conversation"] for r in records}) == 1
    got = [Usage(r["usage_input_tokens"], r["usage_cache_read_tokens"], r["usage_cache_write_tokens"], r["usage_output_tokens"]) for r in records]
    assert got == usage
    # The conversation did use the cache: the first turn finds it cold, every later one reads what the turns before left.
    assert not usage[0].cache_read and all(u.cache_read for u in usage[1:]), usage
    if client.name == "anthropic":  # the only API here that reports its writes: each turn writes up to its new breakpoint
        assert all(u.cache_write for u in usage) and usage[0].cache_write > usage[1].cache_write
    else:
        assert all(u.cache_write is None for u in usage)


def test_the_audit_prices_each_conversation(proxy: Proxy, conversations: dict, tmp_path) -> None:
    report_path = tmp_path / "audit.json"
    audit = [sys.executable, "-m", "trimflow", "audit", str(proxy.metrics), "--format", "json", "--out", str(report_path)]
    done = subprocess.run(audit, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = orjson.loads(report_path.read_bytes())
    by_id = {c["conversation"]: c for c in report["summary"]["conversations"]}
    prices = load_prices()
    for client, stream in CASES:
        usage, records = conversations[client.name, stream]
        totals = by_id[records[0]["conversation"]]["totals"]
        assert totals["usage_cache_read_tokens"] == sum(u.cache_read or 0 for u in usage) > 0
        price = prices.for_model(client.model)
        if price is None:  # Gemini 2.5: no price confirmed in the shipped table
            assert totals["cost_usd"] is None and totals["cost_unpriced_requests"] == {f"no price for {client.model}": TURNS}
            continue
        expected = sum(
            price.cost(u.input_tokens - (u.cache_read or 0) - (u.cache_write or 0), u.cache_write or 0, u.cache_read or 0, u.output) for u in usage
        )
        assert totals["cost_usd"] == pytest.approx(expected), client.name
        assert totals["cost_unpriced_requests"] == {}
    text = subprocess.run(
        [sys.executable, "-m", "trimflow", "audit", str(proxy.metrics)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert text.count("  usage: in ") == len(CASES)
    assert "cost unknown (no price for gemini-2.5-flash)" in text
    claude = next(c for c in by_id.values() if "claude-sonnet-4-6" in c["models"])
    assert f"written {claude['totals']['usage_cache_write_tokens']:,}) · out" in text
