"""The reference sessions: real screenshots, the bodies agents send, the agents' own breakpoints, think times past the TTL."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest

from trimflow._imageinfo import sniff_bytes
from trimflow.formats import FORMATS, IMAGE

from .cache_sessions import REFERENCE_SESSIONS, SCREEN, ReferenceSession, desktop_screenshot

BY_NAME = {s.name: s for s in REFERENCE_SESSIONS}


def test_screenshots_are_distinct_1280x800_pngs_of_a_realistic_size() -> None:
    shots = [desktop_screenshot(seed) for seed in range(8)]
    assert len(set(shots)) == len(shots)
    for shot in shots:
        info = sniff_bytes(shot)
        assert info is not None and (info.mime, info.width, info.height) == ("image/png", *SCREEN)
        assert 150_000 < len(shot) < 400_000  # a desktop screenshot's PNG, not a flat or a noise image
    assert desktop_screenshot(3) is desktop_screenshot(3)  # made once per run


def last_turn(session: ReferenceSession) -> tuple[dict[str, Any], list[Any]]:
    *_, last = session.turns()
    parsed = orjson.loads(last.body)
    return parsed, FORMATS[session.fmt].find_media(parsed)


SHOTS = {
    "computer-use": 60,
    "claude-code": 20,
    "chat": 45,
    "gemini": 40,
    "computer-use-openai": 60,
    "idle": 60,
    "idle-openai": 60,
    "chat-anthropic": 45,
    "claude-code-openai": 20,
    "gemini-idle": 60,
    "codex": 20,
    "computer-use-responses": 60,
}


def test_every_reference_session_is_checked() -> None:
    assert set(SHOTS) == set(BY_NAME)


@pytest.mark.parametrize(("name", "images"), SHOTS.items())
def test_each_session_sends_its_screenshots_in_the_whole_history(name: str, images: int) -> None:
    session = BY_NAME[name]
    turns = list(session.turns())
    assert len(turns) == session.length
    parsed, media = last_turn(session)
    found = [m for m in media if m.kind == IMAGE]
    assert len(found) == images and len({m.data for m in found}) == images  # each screenshot distinct
    assert FORMATS[session.fmt].model(parsed, session.path) == session.model
    sizes = [len(t.body) for t in turns]
    assert sizes == sorted(sizes)  # the history only grows
    assert turns[0].think == 0 and all(t.think > 0 for t in turns[1:])
    assert sum(t.think > 300 for t in turns) >= 2  # gaps past the 5-minute TTL
    assert all(t.output_tokens > 0 for t in turns)


def test_sessions_are_built_the_same_every_time() -> None:
    for session in REFERENCE_SESSIONS:
        first = [t.body for t, _ in zip(session.turns(), range(3), strict=False)]
        again = [t.body for t, _ in zip(session.turns(), range(3), strict=False)]
        assert first == again


def cache_controls(node: Any, where: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        found = [where] if "cache_control" in node else []
        return found + [p for k, v in node.items() for p in cache_controls(v, (*where, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in cache_controls(v, (*where, i))]
    return []


@pytest.mark.parametrize("name", ["computer-use", "claude-code", "idle", "chat-anthropic"])
def test_claude_sessions_mark_the_system_prompt_and_the_last_block(name: str) -> None:
    for turn in list(BY_NAME[name].turns())[:5]:
        parsed = orjson.loads(turn.body)
        last = len(parsed["messages"]) - 1
        marks = cache_controls(parsed)
        assert len(marks) == 2
        assert marks[0][0] == "system"
        assert marks[1] == ("messages", last, "content", len(parsed["messages"][last]["content"]) - 1)


def test_computer_use_screenshots_come_back_in_tool_results() -> None:
    parsed, media = last_turn(BY_NAME["computer-use"])
    assert [m.path[-2:] for m in media[1:]] == [("content", 0)] * 59
    assert all(parsed["messages"][m.path[1]]["content"][m.path[3]]["type"] == "tool_result" for m in media[1:])


@pytest.mark.parametrize("name", ["idle", "idle-openai", "gemini-idle"])
def test_idle_sessions_pause_past_the_ttl_every_fifteen_turns(name: str) -> None:
    paused = [n for n, turn in enumerate(BY_NAME[name].turns(), start=1) if turn.think > 300]
    assert [later - earlier for earlier, later in itertools.pairwise(paused)] == [15, 15]


@pytest.mark.parametrize(("anthropic", "openai"), [("claude-code", "claude-code-openai"), ("computer-use", "computer-use-openai")])
def test_each_shape_is_priced_under_both_caches(anthropic: str, openai: str) -> None:
    assert (BY_NAME[anthropic].fmt, BY_NAME[openai].fmt) == ("anthropic", "openai-chat")
    assert BY_NAME[anthropic].length == BY_NAME[openai].length
    if anthropic == "claude-code":  # the same conversation: the same pauses, the same screenshots read
        pairs = zip(BY_NAME[anthropic].turns(), BY_NAME[openai].turns(), strict=True)
        assert all(a.think == o.think and a.output_tokens == o.output_tokens for a, o in pairs)


def test_the_responses_sessions_carry_their_screenshots_in_tool_outputs_and_the_whole_history() -> None:
    """Codex over HTTP and computer use on Responses: every turn sends its whole history in `input` (no
    previous_response_id), the screenshots in the tool calls' outputs; codex is claude-code's conversation."""
    parsed, media = last_turn(BY_NAME["computer-use-responses"])
    assert "previous_response_id" not in parsed and parsed["store"] is False
    outputs = [parsed["input"][m.path[1]] for m in media[1:]]
    assert len(outputs) == 59 and all(o["type"] == "computer_call_output" and o["output"]["type"] == "computer_screenshot" for o in outputs)
    parsed, media = last_turn(BY_NAME["codex"])
    assert "previous_response_id" not in parsed and parsed["store"] is False
    assert all(parsed["input"][m.path[1]]["type"] == "function_call_output" for m in media)
    pairs = zip(BY_NAME["claude-code"].turns(), BY_NAME["codex"].turns(), strict=True)
    assert all(a.think == c.think and a.output_tokens == c.output_tokens for a, c in pairs)
