"""Prompt-cache breakpoints survive pruning in every format: none is moved, dropped or added.

A provider caches the prefix up to each breakpoint (Anthropic's `cache_control`, at most 4 per request;
Bedrock Converse's `cachePoint` blocks; gateways that route OpenAI chat to Claude take `cache_control` on
content parts). trimflow replaces images in place, so each breakpoint must stay where the client put it,
on the placeholder when it sat on the image that was pruned.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from trimflow.formats import FORMATS
from trimflow.testing import b64, image, session_body

from ..images import prune_with

EPHEMERAL = {"type": "ephemeral"}
SHOT = image(64, 48, "PNG", seed=11)


def breakpoints(node: Any, path: tuple = ()) -> list[tuple]:
    """The JSON path of every breakpoint in a body, in document order."""
    found: list[tuple] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("cache_control", "cachePoint"):
                found.append(path)
            found += breakpoints(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += breakpoints(value, (*path, i))
    return found


def _anthropic() -> dict:
    """Claude Code's placement: the system prompt, a screenshot block, and the last block of the last turn."""
    body = session_body("anthropic", 6, SHOT, "image/png")
    body["system"] = [{"type": "text", "text": "You are a desktop assistant.", "cache_control": EPHEMERAL}]
    first = next(block for block in body["messages"][0]["content"] if block["type"] == "image")
    first["cache_control"] = EPHEMERAL
    body["messages"][-1]["content"][-1]["cache_control"] = EPHEMERAL
    return body


def _anthropic_tool_results() -> dict:
    """Computer use: screenshots inside tool_result blocks, the breakpoint on the tool_result."""
    messages: list[dict] = [{"role": "user", "content": [{"type": "text", "text": "Open the settings."}]}]
    for turn in range(6):
        messages.append(
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{turn}", "name": "computer", "input": {"action": "screenshot"}}]}
        )
        shot = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(image(64, 48, "PNG", seed=turn))}}
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{turn}", "content": [shot]}]})
    messages[2]["content"][0]["cache_control"] = EPHEMERAL  # on the oldest screenshot's tool_result, which gets pruned
    messages[-1]["content"][0]["cache_control"] = EPHEMERAL
    return {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": messages}


def _openai_chat_via_gateway() -> dict:
    body = session_body("openai-chat", 6, SHOT, "image/png", model="anthropic/claude-sonnet-4.5")
    parts = [part for message in body["messages"] if isinstance(message["content"], list) for part in message["content"]]
    images = [part for part in parts if part["type"] == "image_url"]
    images[0]["cache_control"] = EPHEMERAL
    parts[-1]["cache_control"] = EPHEMERAL
    return body


def _bedrock() -> dict:
    body = session_body("bedrock-converse", 6, SHOT, "image/png")
    body["system"] = [{"text": "You are a desktop assistant."}, {"cachePoint": {"type": "default"}}]
    for message in body["messages"][:3]:
        message["content"].append({"cachePoint": {"type": "default"}})
    return body


CASES = {
    "anthropic": ("anthropic", _anthropic),
    "anthropic tool_result": ("anthropic", _anthropic_tool_results),
    "openai-chat via a gateway": ("openai-chat", _openai_chat_via_gateway),
    "bedrock-converse": ("bedrock-converse", _bedrock),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_breakpoint_stays_where_the_client_put_it(case: str) -> None:
    fmt, build = CASES[case]
    body = build()
    before = breakpoints(body)
    assert 2 <= len(before) <= 4
    outcome = prune_with(fmt, body, max_images=2)
    assert outcome.record is not None and outcome.record.pruned >= 3  # the images breakpoints sat on went too
    out = orjson.loads(outcome.body)
    assert breakpoints(out) == before
    for path in before:  # each on the same kind of node: the placeholder stands in for the image it was on
        node = out
        for key in path:
            node = node[key]
        assert node.get("cache_control", node.get("cachePoint")) is not None


@pytest.mark.parametrize("fmt", ["openai-responses", "gemini", "ollama", "openai-chat"])
def test_no_breakpoint_is_ever_added(fmt: str) -> None:
    body = session_body(fmt, 6, SHOT, "image/png")
    assert breakpoints(body) == []
    outcome = prune_with(fmt, body, max_images=2)
    assert outcome.record is not None and outcome.record.pruned == 4
    assert b"cache_control" not in outcome.body and b"cachePoint" not in outcome.body


def test_a_placeholder_on_a_breakpoint_keeps_its_ttl() -> None:
    body = _anthropic()
    one_hour = {"type": "ephemeral", "ttl": "1h"}
    body["system"][0]["cache_control"] = one_hour
    index = next(i for i, block in enumerate(body["messages"][0]["content"]) if "cache_control" in block)
    body["messages"][0]["content"][index]["cache_control"] = one_hour
    out = orjson.loads(prune_with("anthropic", body, max_images=2).body)
    placeholder = out["messages"][0]["content"][index]
    assert placeholder["type"] == "text" and placeholder["cache_control"] == one_hour


def test_the_formats_under_test_are_every_format_that_has_breakpoints() -> None:
    assert {fmt for fmt, _ in CASES.values()} | {"openai-responses", "gemini", "ollama"} == set(FORMATS)
