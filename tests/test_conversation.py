"""trimflow._conversation: conversations told apart by their history (trimflow._history) or a session id, turns and segments
numbered by Conversations, token counts and warm-ups that are not turns, and memory that stays bounded.

Histories are digested as the engine digests them (Outcome.history of a real prune run) and numbered by a
Conversations, as the proxy's SharedState and the audit's Reader number them.
"""

from __future__ import annotations

import copy
import random
import re
import sqlite3
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from trimflow import OBSERVE, _conversation, prune_request
from trimflow._conversation import MAX_SEGMENTS, Conversations
from trimflow._history import SESSION_HEADERS, History, Images, image_key, session_key
from trimflow._last_turns import LastTurn, LastTurns, conversation_key
from trimflow._record import COUNT_TOKENS, TURN, WARMUP
from trimflow.formats import FORMATS, Media, counted_turn_path, openai_responses
from trimflow.testing import PATHS, b64, image, session_body

from .helpers import rules_with

SHOT = image(24, 16, "PNG", seed=4)
ALL_FORMATS = sorted(FORMATS)
HOST = "api.example.test"
# Texts of every synthetic session (trimflow.testing), in every format.
SYSTEM = "You are a desktop assistant."
FIRST_QUESTION = "Turn 1: here is my screen. What should I click next?"


def session(fmt: str, turns: int) -> dict:
    return session_body(fmt, turns, SHOT, "image/png")


def run(body: dict | bytes, fmt: str, headers: dict[str, str] | None = None, host: str = HOST, path: str | None = None, **limits):
    """The engine's outcome for one request, as the proxy runs it."""
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return prune_request(f"https://{host}{path or PATHS[fmt]}", headers or {}, raw, rules_with(**limits))


def history(body: dict | bytes, fmt: str, **kwargs) -> History:
    outcome = run(body, fmt, **kwargs)
    assert outcome.history is not None
    return outcome.history


def numbered(conversations: Conversations, body: dict | bytes, fmt: str, **kwargs) -> tuple[str | None, int | None, int | None]:
    outcome = run(body, fmt, **kwargs)
    assert outcome.record is not None and outcome.history is not None
    a = conversations.assign(outcome.history, outcome.record.kind)
    return a.conversation, a.turn, a.segment


def numbering(requests: list[tuple[dict, str]], **kwargs) -> list[tuple[str | None, int | None, int | None]]:
    conversations = Conversations(salt=b"")
    return [numbered(conversations, body, fmt, **kwargs) for body, fmt in requests]


def replaced(body: dict, old: str, new: str) -> dict:
    """The body with every occurrence of the text `old` replaced by `new`."""
    text = orjson.dumps(body).decode()
    assert old in text
    return orjson.loads(text.replace(old, new))


def without_system(body: dict, fmt: str) -> dict:
    body = copy.deepcopy(body)
    if "messages" in body and fmt in ("openai-chat", "ollama"):
        body["messages"] = [m for m in body["messages"] if m.get("role") != "system"]
    for key in ("system", "systemInstruction", "instructions"):
        body.pop(key, None)
    assert SYSTEM not in orjson.dumps(body).decode()
    return body


def one_conversation(numbers: list[tuple[str | None, int | None, int | None]], turns: int) -> str:
    """The id of the one conversation `numbers` all fall in, checked to be turns 1..turns of segment 1."""
    assert [(turn, segment) for _, turn, segment in numbers] == [(t, 1) for t in range(1, turns + 1)], numbers
    (conversation,) = {c for c, _, _ in numbers}
    assert conversation is not None
    return conversation


# --- one conversation, whatever the format ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_every_turn_of_one_session_is_one_conversation_numbered_from_one(fmt: str) -> None:
    one_conversation(numbering([(session(fmt, n), fmt) for n in range(1, 7)]), 6)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_a_history_without_a_system_message_is_one_conversation_from_turn_one(fmt: str) -> None:
    one_conversation(numbering([(without_system(session(fmt, n), fmt), fmt) for n in range(1, 7)]), 6)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_two_identical_runs_back_to_back_are_two_conversations(fmt: str) -> None:
    numbers = numbering([(session(fmt, n), fmt) for _ in range(2) for n in range(1, 5)])
    first, second = one_conversation(numbers[:4], 4), one_conversation(numbers[4:], 4)
    assert first != second


def test_a_rerun_is_told_apart_even_when_it_repeats_the_last_request_of_the_run_before() -> None:
    # The second run's third turn is the first run's last request again, byte for byte: a shorter history
    # of the second run (its second turn) is the better match, so it stays in its own run.
    numbers = numbering([(session("anthropic", n), "anthropic") for _ in range(2) for n in range(1, 4)])
    assert [t for _, t, _ in numbers] == [1, 2, 3, 1, 2, 3] and len({c for c, _, _ in numbers}) == 2


def test_a_retry_of_the_same_request_goes_on_in_its_conversation() -> None:
    body = session("openai-chat", 3)
    numbers = numbering([(session("openai-chat", 2), "openai-chat"), (body, "openai-chat"), (body, "openai-chat")])
    one_conversation(numbers, 3)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_an_edited_earlier_message_with_the_later_turns_sent_again_goes_on_in_its_conversation(fmt: str) -> None:
    """As aider rewrites its system prompt and its message of images on every request: the later turns, sent again
    where they sat, say which conversation it goes on."""
    edited = replaced(session(fmt, 4), FIRST_QUESTION, "Turn 1: open the terminal, please.")
    one_conversation(numbering([(session(fmt, 3), fmt), (edited, fmt)]), 2)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_an_edited_earlier_message_without_the_later_turns_is_a_new_conversation(fmt: str) -> None:
    edited = replaced(session(fmt, 2), FIRST_QUESTION, "Turn 1: open the terminal, please.")
    numbers = numbering([(session(fmt, 3), fmt), (edited, fmt)])
    assert [t for _, t, _ in numbers] == [1, 1] and numbers[0][0] != numbers[1][0]


def rewritten_history(turn: int, shift: int = 0) -> History:
    """An aider-like request (its system message, first, names the time; its message of images, second, changes as
    images are added; then one question and answer a turn), or with `shift` OpenClaw-like: a context message at the
    end that the next request drops."""
    messages = [hash(("system", turn)), hash(("images", turn)), hash("Ok.")]
    for n in range(1, turn):
        messages += [hash(("question", n)), hash(("answer", n))]
    messages.append(hash(("question", turn)))
    if shift:
        messages.append(hash(("context", turn)))
    return History(HOST, None, 0, messages, b"origin", images=Images([image_key(Media("image", (), f"{i:04d}" * 800)) for i in range(turn)]))


@pytest.mark.parametrize("shift", [0, 1], ids=["aider", "openclaw"])
def test_an_agent_that_rewrites_early_history_every_request_is_one_conversation(shift: int) -> None:
    conversations = Conversations(salt=b"")
    numbers = [conversations.assign(rewritten_history(turn, shift)) for turn in range(1, 14)]
    assert [a.turn for a in numbers] == list(range(1, 14)) and len({a.conversation for a in numbers}) == 1
    other = conversations.assign(History(HOST, None, 0, [hash("another"), hash(("question", 3)), hash("more")], b"other"))
    assert other.turn == 1 and other.conversation != numbers[0].conversation  # one message alike is not enough


def test_a_fork_from_an_earlier_turn_is_a_new_conversation() -> None:
    later = session("anthropic", 3)
    fork = replaced(session("anthropic", 3), "Turn 3: here is my screen.", "Turn 3: something else entirely.")
    numbers = numbering([(session("anthropic", 2), "anthropic"), (later, "anthropic"), (fork, "anthropic")])
    assert [t for _, t, _ in numbers] == [1, 2, 1] and numbers[2][0] not in (numbers[0][0], None)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_a_different_system_prompt_is_a_different_conversation(fmt: str) -> None:
    body = session(fmt, 3)
    numbers = numbering([(body, fmt), (replaced(body, SYSTEM, "You are a code reviewer."), fmt)])
    assert [t for _, t, _ in numbers] == [1, 1] and numbers[0][0] != numbers[1][0]


def test_the_same_history_sent_to_another_host_is_another_conversation() -> None:
    conversations = Conversations(salt=b"")
    a = numbered(conversations, session("anthropic", 2), "anthropic", host="a.example.test")
    b = numbered(conversations, session("anthropic", 3), "anthropic", host="b.example.test")
    assert (a[1], b[1]) == (1, 1) and a[0] != b[0]


def test_interleaved_conversations_each_keep_their_turns() -> None:
    requests = []
    for n in range(1, 4):
        requests += [(session("anthropic", n), "anthropic"), (session("gemini", n), "gemini"), (session("openai-chat", n), "openai-chat")]
    numbers = numbering(requests)
    for start in range(3):
        one_conversation(numbers[start::3], 3)


# --- what a digest leaves out -------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ALL_FORMATS)
@pytest.mark.parametrize(
    "limits", [{"max_images": 2}, {"max_images": 8, "dedupe": True}, {"max_images": 8, "max_image_side": 12}], ids=["pruned", "repeats", "shrunk"]
)
def test_a_body_trimflow_rewrote_digests_as_the_client_sent_it(fmt: str, limits: dict) -> None:
    # A recording made behind trimflow holds what it forwarded: the audit must number it as the proxy did.
    body = session(fmt, 5)
    outcome = run(body, fmt, **limits)
    assert outcome.record is not None and outcome.body != orjson.dumps(body)  # really rewritten
    sent, forwarded = history(body, fmt), history(outcome.body, fmt)
    assert (forwarded.head, forwarded.messages, forwarded.origin) == (sent.head, sent.messages, sent.origin)


def test_a_session_recorded_behind_trimflow_is_one_conversation() -> None:
    forwarded = [run(session("ollama", n), "ollama", max_images=2).body for n in range(1, 7)]
    one_conversation(numbering([(body, "ollama") for body in forwarded]), 6)


def test_moving_cache_breakpoints_keep_the_conversation() -> None:
    # Agents mark the newest message for the prompt cache on every turn: the mark moves, the history stays.
    def anthropic(turns: int) -> dict:
        body = session("anthropic", turns)
        body["messages"][-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        body["system"] = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
        return body

    def bedrock(turns: int) -> dict:
        body = session("bedrock-converse", turns)
        body["messages"][-1]["content"].append({"cachePoint": {"type": "default"}})
        return body

    one_conversation(numbering([(anthropic(n), "anthropic") for n in range(1, 5)]), 4)
    one_conversation(numbering([(bedrock(n), "bedrock-converse") for n in range(1, 5)]), 4)


@pytest.mark.parametrize("tail", ["B" * 5000, "\n".join(["line"] * 1200), "caf\u00e9 " * 1200], ids=["plain", "escapes", "non-ascii"])
def test_a_long_string_digests_alike_in_a_small_body_and_in_a_skeleton(tail: str) -> None:
    # A small body is parsed whole; a larger one as a skeleton that leaves long strings in the bytes. The same
    # message must digest alike either way, or a conversation would split when its body grows past the line.
    first = {"role": "user", "content": "A" * 700 + tail}
    small = {"model": "m", "messages": [first]}
    large = {"model": "m", "messages": [first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "C" * 20000}]}
    assert len(orjson.dumps(small)) < 16384 <= len(orjson.dumps(large))
    assert history(small, "openai-chat").messages[0] == history(large, "openai-chat").messages[0]
    one_conversation(numbering([(small, "openai-chat"), (large, "openai-chat")]), 2)


def test_a_body_that_is_not_json_has_no_history() -> None:
    outcome = prune_request(f"https://{HOST}{PATHS['anthropic']}", {}, b'{"messages": [oops', rules_with())
    assert outcome.record is not None and outcome.record.reason and outcome.history is None


# --- session ids ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("header", SESSION_HEADERS)
def test_a_session_header_names_the_conversation_whatever_the_body(header: str) -> None:
    one, other = session("anthropic", 2), replaced(session("anthropic", 5), SYSTEM, "You are someone else.")
    conversations = Conversations(salt=b"")
    a = numbered(conversations, one, "anthropic", headers={header: "sess-1"})
    b = numbered(conversations, other, "anthropic", headers={header: "sess-1"})
    c = numbered(conversations, one, "anthropic", headers={header: "sess-2"})
    assert a[0] == b[0] == session_key({header: "sess-1"}, {}) != c[0]
    assert run(one, "anthropic", headers={header: "sess-1"}).record.conversation == a[0]  # the engine's record names it too


def test_a_history_that_restarts_under_one_session_id_is_a_new_segment() -> None:
    headers = {"x-claude-code-session-id": "sess-9"}
    bodies = [session("anthropic", 1), session("anthropic", 2), session("anthropic", 3)]
    cleared = replaced(session("anthropic", 2), FIRST_QUESTION, "After /clear: a new question.")
    requests = [*bodies, replaced(session("anthropic", 1), FIRST_QUESTION, "After /clear: a new question."), cleared, session("anthropic", 4)]
    conversations = Conversations(salt=b"")
    numbers = [numbered(conversations, body, "anthropic", headers=headers) for body in requests]
    assert len({c for c, _, _ in numbers}) == 1
    # Turns go on across segments; the first segment goes on where its history is extended again.
    assert [(t, s) for _, t, s in numbers] == [(1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (6, 1)]


def test_segments_remembered_per_session_are_bounded() -> None:
    conversations = Conversations(salt=b"")
    headers = {"session_id": "s"}
    for n in range(MAX_SEGMENTS + 3):
        body = replaced(session("anthropic", 1), FIRST_QUESTION, f"Question {n}")
        assert numbered(conversations, body, "anthropic", headers=headers)[2] == n + 1
    (conversation,) = conversations._conversations.values()
    assert len(conversation.threads) == MAX_SEGMENTS


def test_ids_are_short_hashes_that_hold_neither_the_session_id_nor_the_text() -> None:
    conversations = Conversations()
    secret = replaced(session("openai-chat", 2), SYSTEM, "You are a SECRET assistant")
    ids = [
        session_key({"x-session-id": "sess-SECRET-123"}, {}),
        session_key({}, {"conversation": "conv-SECRET"}),
        conversations.assign(history(secret, "openai-chat")).conversation,
    ]
    for cid in ids:
        assert cid is not None and re.fullmatch(r"[0-9a-f]{8}", cid), cid


def test_the_audit_numbers_alike_on_every_run_and_proxies_apart() -> None:
    requests = [history(session("gemini", n), "gemini") for n in (1, 2)]
    audit_ids = [[Conversations(salt=b"").assign(h).conversation for h in requests] for _ in range(2)]
    assert audit_ids[0] == audit_ids[1]
    proxy_ids = {Conversations().assign(requests[0]).conversation for _ in range(4)}
    assert len(proxy_ids) == 4  # each proxy process salts its ids: two proxies' records never merge


# --- token counts and warm-ups -------------------------------------------------------------------------------


@pytest.mark.parametrize(("fmt", "module"), sorted(FORMATS.items()))
def test_each_count_ending_is_an_endpoint_of_its_format_and_measures_one(fmt: str, module) -> None:
    rules = rules_with()
    for count_ending, turn_ending in module.COUNT_ENDINGS:
        path = "/v1/projects/p/locations/l" + count_ending
        assert rules.format_for(HOST, path) == fmt, path
        turn = counted_turn_path(fmt, path)
        assert turn is not None and turn.endswith(turn_ending) and rules.format_for(HOST, turn) == fmt
    assert counted_turn_path(fmt, PATHS[fmt]) is None


COUNTS = {
    "anthropic": "/v1/messages/count_tokens",
    "gemini": "/v1beta/models/gemini-2.5-flash:countTokens",
    "openai-responses": "/v1/responses/input_tokens",
}


@pytest.mark.parametrize("fmt", sorted(COUNTS))
def test_a_token_count_is_pruned_as_the_turn_it_measures(fmt: str) -> None:
    body = session(fmt, 6)
    turn, count = run(body, fmt, max_images=2), run(body, fmt, path=COUNTS[fmt], max_images=2)
    assert count.body == turn.body != orjson.dumps(body)  # so the count is what the turn will send
    assert (count.record.kind, turn.record.kind) == (COUNT_TOKENS, TURN)
    assert count.record.images_after == turn.record.images_after == 2


def test_a_token_count_meets_the_rules_of_the_path_it_measures() -> None:
    rules = rules_with(max_images=8)
    rules = rules.__class__(rules.source, rules.defaults, (_rule("messages", "*/v1/messages", 1),), rules.endpoints)
    body = orjson.dumps(session("anthropic", 4))
    count = prune_request(f"https://{HOST}{COUNTS['anthropic']}", {}, body, rules)
    assert (count.record.rule, count.record.images_after) == ("messages", 1)


def _rule(name: str, path: str, max_images: int):
    from trimflow._rules import Rule

    return Rule(name, path=(path,), overrides={"max_images": max_images})


@pytest.mark.parametrize("wrapped", [False, True], ids=["contents", "generateContentRequest"])
def test_gemini_count_bodies_are_read_in_both_shapes(wrapped: bool) -> None:
    # Gemini CLI (Google's SDK) sends {"contents": [...]}; the API also takes a whole request, wrapped.
    turn = session("gemini", 5)
    body: dict[str, Any] = {"contents": turn["contents"]}
    if wrapped:
        body = {"generateContentRequest": {"model": "models/gemini-2.5-flash", **turn}}
    count = run(body, "gemini", path=COUNTS["gemini"], max_images=2)
    assert (count.record.kind, count.record.images_before, count.record.images_after) == (COUNT_TOKENS, 5, 2)
    assert orjson.loads(count.body)  # valid JSON, the wrapper kept
    assert ("generateContentRequest" in orjson.loads(count.body)) is wrapped


def test_token_counts_carry_their_conversation_without_being_turns() -> None:
    # Gemini CLI counts the next request's tokens before each turn: a count, then the turn, with the same contents.
    conversations = Conversations(salt=b"")
    numbers = []
    for n in range(1, 4):
        contents = {"contents": session("gemini", n)["contents"]}  # the count carries no systemInstruction
        numbers.append((COUNT_TOKENS, *numbered(conversations, contents, "gemini", path=COUNTS["gemini"])))
        numbers.append((TURN, *numbered(conversations, session("gemini", n), "gemini")))
    (conversation,) = {c for kind, c, _, _ in numbers if kind == TURN}
    assert numbers == [
        (COUNT_TOKENS, None, None, None),  # before the first turn there is no conversation to extend
        (TURN, conversation, 1, 1),
        (COUNT_TOKENS, conversation, None, 1),
        (TURN, conversation, 2, 1),
        (COUNT_TOKENS, conversation, None, 1),
        (TURN, conversation, 3, 1),
    ]


def test_a_count_under_a_session_id_carries_it() -> None:
    headers = {"x-claude-code-session-id": "sess-1"}
    numbers = numbering([(session("anthropic", 2), "anthropic")], headers=headers, path=COUNTS["anthropic"])
    assert numbers == [(session_key(headers, {}), None, None)]


def response_create(turns: int, **fields: Any) -> dict:
    return {"type": "response.create", **session("openai-responses", turns), **fields}


def test_a_warmup_is_not_a_turn_and_the_turns_that_chain_to_it_are_its_conversation() -> None:
    conversations = Conversations(salt=b"")
    warmup = run(response_create(1, generate=False, input=[]), "openai-responses")
    assert warmup.record.kind == WARMUP
    a = conversations.assign(warmup.history, warmup.record.kind)
    assert a.conversation is not None and a.turn is None
    conversations.responded(a.history_line, "resp_warm")
    first = run(response_create(1, previous_response_id="resp_warm"), "openai-responses")
    b = conversations.assign(first.history, first.record.kind)
    conversations.responded(b.history_line, "resp_1")
    second = run({**response_create(2, previous_response_id="resp_1"), "input": [{"role": "user", "content": "next"}]}, "openai-responses")
    c = conversations.assign(second.history, second.record.kind)
    assert (b.conversation, b.turn, c.conversation, c.turn) == (a.conversation, 1, a.conversation, 2)


def test_an_unknown_previous_response_starts_a_conversation_and_a_session_keeps_its_segment() -> None:
    body = {**session("openai-responses", 1), "previous_response_id": "resp_from_before_a_restart"}
    first, second = numbering([(body, "openai-responses"), (body, "openai-responses")])
    assert first[1] == second[1] == 1 and first[0] != second[0]
    headers = {"session_id": "codex-1"}
    numbers = numbering([(session("openai-responses", 2), "openai-responses"), (body, "openai-responses")], headers=headers)
    assert [(t, s) for _, t, s in numbers] == [(1, 1), (2, 1)]


@pytest.mark.parametrize(
    ("event", "answer"),
    [
        ({"type": "response.completed", "response": {"id": "r1", "status": "completed", "usage": {"input_tokens": 42}}}, (200, 42, "r1")),
        ({"type": "response.incomplete", "response": {"id": "r2", "usage": {"input_tokens": 7}}}, (200, 7, "r2")),
        ({"type": "response.failed", "response": {"id": "r3", "status": "failed"}}, (500, None, "r3")),
        ({"type": "error", "status": 400, "error": {"code": "previous_response_not_found"}}, (400, None, None)),
        ({"type": "error", "error": {"code": "x"}}, (400, None, None)),
        ({"type": "response.output_text.delta", "delta": '{"type":"response.completed"}'}, None),
        ({"type": "response.created", "response": {"id": "r4"}}, None),
    ],
)
def test_the_server_events_that_end_a_websocket_response(event: dict, answer: tuple | None) -> None:
    assert openai_responses.websocket_answer(orjson.dumps(event)) == answer


# --- memory --------------------------------------------------------------------------------------------------


def synthetic_history(n: int, messages: int) -> History:
    digests = [hash((n, i)) for i in range(messages)]
    return History(HOST, None, 0, digests, n.to_bytes(8, "big"))


def test_past_capacity_the_least_recently_seen_conversation_is_forgotten() -> None:
    conversations = Conversations(capacity=3, salt=b"")
    first = {n: conversations.assign(synthetic_history(n, 2)).conversation for n in range(3)}
    conversations.assign(synthetic_history(0, 3))  # 0 seen again: 1 is now the least recent
    conversations.assign(synthetic_history(3, 2))  # a fourth: 1 is forgotten
    assert len(conversations) == 3
    assert conversations.assign(synthetic_history(0, 4)).conversation == first[0]  # kept: its turn 3
    again = conversations.assign(synthetic_history(1, 3))
    assert again.conversation != first[1] and again.turn == 1  # forgotten: a new conversation
    assert len(conversations._by_tip) == 3 and len(conversations) == 3  # and its index went with it


@pytest.mark.parametrize("messages", [5, 200])
def test_memory_per_conversation_is_small_and_does_not_grow_with_the_history(messages: int) -> None:
    histories = [synthetic_history(n, messages) for n in range(2000)]
    assert all(len(h.prefixes) == messages for h in histories)  # worked out per request, not kept
    conversations = Conversations(capacity=2000, salt=b"")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for h in histories:
            conversations.assign(h)
        per_conversation = (tracemalloc.get_traced_memory()[0] - before) / len(histories)
    finally:
        tracemalloc.stop()
    assert 200 < per_conversation < 1000, per_conversation  # docs/how-it-works.md says ~800 bytes


def test_a_remembered_image_costs_about_150_bytes() -> None:
    # The images' arrivals are most of the memory's bound (MAX_IMAGES_REMEMBERED copies): docs/performance.md states it.
    images = 30
    histories = []
    for n in range(1000):
        keys = [(n * images + i).to_bytes(8, "big") for i in range(images)]
        histories.append(History(HOST, None, 0, [hash((n, 0))], n.to_bytes(8, "big"), images=Images(keys, lambda i: i)))
    conversations = Conversations(capacity=1000, salt=b"")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for h in histories:
            conversations.assign(h, cut=range(10))
        per_image = (tracemalloc.get_traced_memory()[0] - before) / len(histories) / images
    finally:
        tracemalloc.stop()
    assert per_image < 200, per_image  # a list of a Copy and its ints took about 300


def test_a_session_header_with_other_headers_reads_lower_case_names() -> None:
    assert run(session("anthropic", 1), "anthropic", headers={"X-Claude-Code-Session-Id": "s"}).record.conversation == session_key(
        {"x-claude-code-session-id": "s"}, {}
    )


def test_observe_and_enforce_give_the_same_history() -> None:
    body = orjson.dumps(session("gemini", 4))
    url = f"https://{HOST}{PATHS['gemini']}"
    enforce = prune_request(url, {}, body, rules_with(max_images=1))
    observe = prune_request(url, {}, body, rules_with(max_images=1), OBSERVE)
    assert enforce.history.messages == observe.history.messages


# --- what a conversation's last turn leaves for the next (the cache-aware cut) ----------------------------------


def test_recall_gives_the_last_turns_cut_and_how_long_ago_it_went() -> None:
    clock = [100.0]
    conversations = Conversations(clock=lambda: clock[0])
    first, second = history(session("anthropic", 3), "anthropic"), history(session("anthropic", 4), "anthropic")
    assert conversations.recall(first) is None  # nothing seen yet
    conversations.assign(first, TURN, cut={0, 1})
    clock[0] = 130.0
    recalled = conversations.recall(second)
    assert recalled is not None and (recalled.cut, recalled.idle) == (2, 30.0)
    assert conversations.recall(history(session("anthropic", 2), "anthropic")) is None  # a shorter history continues nothing
    conversations.assign(second, COUNT_TOKENS, cut=range(9))  # a token count never moves the cut on
    recalled = conversations.recall(second)
    assert recalled is not None and recalled.cut == 2


def test_recall_knows_nothing_of_a_history_the_provider_keeps() -> None:
    conversations = Conversations()
    body = session("openai-responses", 2)
    conversations.assign(history(body, "openai-responses"), TURN, cut={0})
    assert conversations.recall(history({**body, "previous_response_id": "resp_1"}, "openai-responses")) is None


# --- an image's age: when it first came, not where it sits --------------------------------------------------------


def line(n: int, turn: int, keys: list[bytes], crcs: list[int] | None = None, session: str | None = None) -> History:
    """Turn `turn` of synthetic conversation `n` (one message a turn), sending images of these keys (and CRC-32s)."""
    images = Images(keys, (lambda i: crcs[i]) if crcs is not None else None)
    return History(HOST, session, 0, [hash((n, i)) for i in range(turn)], n.to_bytes(8, "big"), images=images)


A, B, C, D, E, F = (image_key(Media("image", (), c * 3000)) for c in "ABCDEF")


def test_images_are_ordered_by_when_they_came_and_position_decides_among_those_that_came_together() -> None:
    conversations = Conversations()
    assert conversations.recall(line(0, 1, [B, A])) is None  # new to the memory: position decides
    conversations.assign(line(0, 1, [B, A]))
    recalled = conversations.recall(line(0, 2, [C, A, B]))
    # A and B came together (where they sit now decides between them), then C.
    assert recalled is not None and recalled.order == (1, 2, 0) and recalled.cut == 0
    conversations.assign(line(0, 2, [C, A, B]))
    assert conversations.recall(line(0, 3, [A, D, C, B])).order == (0, 3, 2, 1)


def test_an_image_once_cut_comes_first_and_stays_cut_and_one_no_longer_sent_is_forgotten() -> None:
    conversations = Conversations()
    conversations.assign(line(0, 1, [A, B]))
    conversations.assign(line(0, 2, [C, A, B]), TURN, cut={1})  # A is cut
    assert conversations.was_cut([A]) and not conversations.was_cut([B])
    recalled = conversations.recall(line(0, 3, [B, D, C, A]))
    assert recalled.cut == 1 and recalled.order == (3, 0, 2, 1)  # A first: cut before
    conversations.assign(line(0, 3, [B, D, C]))  # the agent dropped A
    assert not conversations.was_cut([A])
    recalled = conversations.recall(line(0, 4, [A, B, D, C]))
    assert recalled.cut == 0 and recalled.order == (1, 3, 2, 0)  # A again: new, the newest


def test_a_retry_that_cut_more_is_what_the_next_turn_holds() -> None:
    conversations = Conversations()
    conversations.assign(line(0, 1, [A, B]))
    sent = line(0, 2, [C, A, B])
    history_line = conversations.assign(sent, TURN).history_line
    assert not conversations.was_cut([A])
    recalled = conversations.recall(sent)  # the retry of that turn reads the same order
    assert recalled is not None and recalled.order == (1, 2, 0) and recalled.cut == 0
    conversations.recut(history_line, sent, {1, 2})  # the retry cut A and B, and the provider took it
    assert conversations.was_cut([A]) and conversations.was_cut([B]) and not conversations.was_cut([C])
    recalled = conversations.recall(line(0, 3, [A, D, C, B]))
    assert recalled.cut == 2 and recalled.order == (0, 3, 2, 1)  # A and B first: cut; then C, then D
    assert conversations._images == 3 and sum(conversations._cut_keys.values()) == 2  # replaced, not added


def test_a_cut_that_keeps_an_older_image_is_remembered_image_by_image(closing: Callable[[LastTurns], LastTurns]) -> None:
    """The user's mock-up (A) kept while the screens after it (B, C) are cut: this memory and one reading the shared
    file both recall B and C as cut, A as the oldest kept."""
    shared = closing(LastTurns(":memory:"))
    a, b = Conversations(shared=shared), Conversations(shared=shared)
    a.assign(line(0, 1, [A, B, C]))
    a.assign(line(0, 2, [A, B, C, D]), TURN, cut={1, 2})
    assert a.was_cut([B]) and a.was_cut([C]) and not a.was_cut([A])
    for memory in (a, b):
        found = memory.recall(line(0, 3, [A, B, C, D, E]))
        assert found is not None and found.cut == 2 and found.order == (1, 2, 0, 3, 4)


def test_a_retry_of_a_conversation_forgotten_meanwhile_changes_nothing() -> None:
    conversations = Conversations(capacity=1)
    sent = line(0, 1, [A, B])
    history_line = conversations.assign(sent).history_line
    conversations.assign(line(1, 1, [C]))  # pushes the first conversation out
    conversations.recut(history_line, sent, {0, 1})
    assert not conversations.was_cut([A]) and conversations._images == 1


def test_copies_of_one_image_match_the_newest_remembered_in_the_order_they_sit() -> None:
    conversations = Conversations()
    conversations.assign(line(0, 1, [A]))
    conversations.assign(line(0, 2, [A, B]))
    conversations.assign(line(0, 3, [A, B, A]), TURN, cut={0})  # the same screenshot again: the second A is new
    recalled = conversations.recall(line(0, 4, [A, B, A, C]))
    assert recalled.order == (0, 1, 2, 3) and recalled.cut == 1
    recalled = conversations.recall(line(0, 4, [B, A, C]))  # one A left: it is the newer, which was never cut
    assert recalled.order == (0, 1, 2) and recalled.cut == 0


def test_a_request_that_continues_no_history_takes_the_arrivals_of_the_line_whose_images_it_sends_again() -> None:
    conversations = Conversations()
    conversations.assign(line(0, 1, [A, B]))
    # Another history (a rewritten early message) with the same images and one more: B, A, C oldest first. B is cut.
    conversations.assign(line(1, 2, [C, B, A]), TURN, cut={1})
    recalled = conversations.recall(line(2, 3, [D, B, C, A]))
    assert recalled is not None and recalled.order == (1, 3, 2, 0) and recalled.cut == 1
    assert conversations.recall(line(3, 1, [A, D, E])) is None  # half of a line's images or less: another conversation
    assert conversations.recall(line(3, 1, [A, B, E])) is not None


def test_a_history_the_provider_keeps_leaves_the_arrivals_as_they_were() -> None:
    conversations = Conversations()
    conversations.assign(line(0, 1, [A, B]), TURN, cut={0})
    kept = History(HOST, None, 0, [], b"", previous_response=b"r", images=Images([C]))
    conversations.assign(kept)
    assert conversations.was_cut([A])


def test_what_a_line_remembers_is_bounded_and_all_of_it_goes_with_the_conversation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_conversation, "MAX_IMAGES_PER_LINE", 4)
    monkeypatch.setattr(_conversation, "MAX_IMAGES_REMEMBERED", 10)
    conversations = Conversations()
    shots = [image_key(Media("image", (), chr(0x61 + i) * 3000)) for i in range(6)]
    conversations.assign(line(0, 1, shots), TURN, cut={0, 1, 2})
    recalled = conversations.recall(line(0, 2, shots))
    assert recalled.order == (2, 3, 4, 5, 0, 1) and recalled.cut == 1  # the two oldest forgotten: new again
    for n in range(1, 4):  # four conversations of four images: past ten, the least recently seen go
        conversations.assign(line(n, 1, [image_key(Media("image", (), f"{n}{i}" * 3000)) for i in range(4)]), TURN, cut={0, 1})
    assert len(conversations) == 2
    assert conversations._images == 8 and len(conversations._by_image) == 8 and sum(conversations._cut_keys.values()) == 4
    for n in range(4, 8):  # conversations with no image push the rest out: nothing of them is left behind
        conversations.assign(line(n, 1, []))
    conversations.capacity = 1
    conversations.assign(line(9, 1, []))
    assert conversations._images == 0 and not conversations._by_image and not conversations._cut_keys


def test_images_with_one_key_are_told_apart_by_their_crc() -> None:
    """Two JPEG screenshots with the same length and ends (a cursor moved): the CRC-32 says which is which."""
    conversations = Conversations()
    conversations.assign(line(0, 1, [A, B], [1, 0]), TURN, cut={0})  # A (CRC 1) is cut
    recalled = conversations.recall(line(0, 2, [A, B, A], [2, 0, 1]))  # a new image with A's key, sent first
    assert recalled.order == (2, 1, 0) and recalled.cut == 1
    conversations.assign(line(0, 2, [A, B, A], [2, 0, 1]), TURN, cut={2})
    recalled = conversations.recall(line(0, 3, [B, A, A, C], [0, 1, 2, 0]))
    assert recalled.order == (1, 0, 2, 3) and recalled.cut == 1  # the CRC-1 copy stays cut wherever it sits
    assert conversations.recall(line(0, 3, [A, B], [7, 0])).order == (1, 0)  # neither A: the key alone is new


# --- several processes sharing one file of last turns (trimflow._last_turns) ----------------------------------------


@pytest.fixture
def closing() -> Iterator[Callable[[LastTurns], LastTurns]]:
    """Closes the files of last turns a test opens."""
    opened: list[LastTurns] = []
    yield lambda shared: opened.append(shared) or shared
    for shared in opened:
        shared.close()


def shuffled_turns(count: int) -> list[tuple[float, int, History]]:
    """An agent that adds a screenshot a turn and sends them in an order that changes (as aider), with think times
    of all sizes (pauses past any cache lifetime too) and a cut that moves now and then: (think, cut, history)."""
    keys = [image_key(Media("image", (), f"{i:04d}" * 800)) for i in range(count)]
    rng = random.Random(7)
    turns = []
    for turn in range(1, count + 1):
        sent = keys[:turn]
        rng.shuffle(sent)
        turns.append((rng.choice([2.0, 30.0, 400.0]), (turn // 3) * 2 if turn > 4 else 0, line(0, turn, sent)))
    return turns


def recalled(conversations: Conversations, history: History) -> tuple[int, float, tuple[int, ...] | None] | None:
    found = conversations.recall(history)
    return None if found is None else (found.cut, found.idle, found.order)


def test_two_memories_sharing_a_file_recall_each_turn_as_one_memory_would(closing: Callable[[LastTurns], LastTurns]) -> None:
    """Turns alternate between two processes' memories, as behind a round-robin balancer: with the file each recalls
    the cut, idle time and order of arrival one memory of every turn recalls; without it they do not."""
    now = [1000.0]
    one = Conversations(clock=lambda: now[0])
    shared = closing(LastTurns(":memory:", clock=lambda: now[0]))
    pair = [Conversations(clock=lambda: now[0], shared=shared) for _ in range(2)]
    apart = [Conversations(clock=lambda: now[0]) for _ in range(2)]
    differed = 0
    for number, (think, cut, history) in enumerate(shuffled_turns(12)):
        now[0] += think
        expected = recalled(one, history)
        assert recalled(pair[number % 2], history) == expected, number
        differed += recalled(apart[number % 2], history) != expected
        order = expected[2] if expected is not None and expected[2] is not None else range(len(history.images))
        for memory in (one, pair[number % 2], apart[number % 2]):
            memory.assign(history, TURN, order[:cut])  # the first `cut` in the order one memory recalls
    assert differed > 6  # on their own, each misses the other's turns: every turn but the first two


def test_a_retry_cut_on_one_process_is_what_the_other_holds(closing: Callable[[LastTurns], LastTurns]) -> None:
    shared = closing(LastTurns(":memory:"))
    a, b = Conversations(shared=shared), Conversations(shared=shared)
    a.assign(line(0, 1, [A, B]))
    sent = line(0, 2, [C, A, B])
    a.recut(a.assign(sent, TURN).history_line, sent, {1, 2})
    found = b.recall(line(0, 3, [A, D, C, B]))
    assert found is not None and found.cut == 2 and found.order == (0, 3, 2, 1)


def test_a_shared_turn_is_taken_only_when_newer_and_by_a_request_that_sends_all_its_images_again(
    tmp_path: Path, closing: Callable[[LastTurns], LastTurns]
) -> None:
    now = [50.0]
    path = tmp_path / "conversations.sqlite3"
    shared = closing(LastTurns(str(path), clock=lambda: now[0]))
    a, b = Conversations(clock=lambda: now[0], shared=shared), Conversations(clock=lambda: now[0], shared=shared)
    a.assign(line(0, 1, [A, B, C]), TURN, cut={0, 1})
    # Another run of the same conversation (same system prompt and first message) that has not come to all of a's
    # images: a's cut is not its own.
    assert b.recall(line(0, 2, [D, E])) is None and b.recall(line(0, 2, [A, B, D])) is None
    now[0] = 60.0
    b.assign(line(0, 2, [A, B, C, D]), TURN, cut={0})  # b's own turn, newer than a's
    now[0] = 70.0
    found = b.recall(line(0, 3, [A, B, C, D, E]))
    assert found is not None and (found.cut, found.idle) == (1, 10.0)
    # The file lost b's turn (the queue of writes waiting for it was full): b's own memory is newer, and a, which
    # has only its own older turn and the file's, takes the file's.
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM last_turn")
    db.close()
    shared.put(conversation_key(HOST, None, (0).to_bytes(8, "big")), LastTurn(55.0, 3, ((A, 0), (B, 0), (C, 0))))
    assert b.recall(line(0, 3, [A, B, C, D, E])).cut == 1
    assert a.recall(line(0, 3, [A, B, C, D, E])).cut == 3


def test_the_shared_file_holds_digests_only(tmp_path: Path, closing: Callable[[LastTurns], LastTurns]) -> None:
    path = tmp_path / "conversations.sqlite3"
    shared = closing(LastTurns(str(path)))
    conversations = Conversations(shared=shared)
    body = session("anthropic", 3)
    outcome = run(body, "anthropic", headers={"x-claude-code-session-id": "session-secret-1234"})
    conversations.assign(outcome.history, TURN, cut={0})
    shared.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    raw = orjson.dumps(body)
    payload = re.search(rb'"data":"([^"]{200,})"', raw).group(1)
    for secret in (SYSTEM.encode(), FIRST_QUESTION.encode(), b"session-secret-1234", payload[:64], payload[-64:]):
        assert secret not in stored
    with LastTurns(str(path)) as again:
        assert again.get(conversation_key(HOST, outcome.history.session, outcome.history.origin)) is not None


def screens(shots: list[bytes], answers: str = "") -> bytes:
    """Turn len(shots) of an agent's session to Anthropic: the whole history, shots[i] the screenshot of turn i+1 (the
    first in the first message, so two runs of one task with the same first screen share a row of the file), the
    model's answers starting with `answers` (another run of the task is answered otherwise)."""
    text = orjson.dumps(session_body("anthropic", len(shots), SHOT, "image/png")).decode()
    for shot in shots:
        text = text.replace(b64(SHOT), b64(shot), 1)
    return text.replace("On turn ", f"{answers}On turn ").encode()


@pytest.mark.parametrize("instances", [1, 3])
def test_two_users_with_the_same_opening_never_change_each_others_cuts(closing: Callable[[LastTurns], LastTurns], instances: int) -> None:
    """Runs of one task with the same system prompt and first screen (so one key in the file): one going on, one that
    sends its first turn again and again, one going on with screens of its own; their requests spread over
    `instances` processes sharing one file, round robin. Each is forwarded as it would be alone. A row of another run
    once made the first send 3 images a turn instead of 4 to 8, a different first one each turn (a prompt cache
    broken every turn); with 3 processes, runs writing over each other's row did the same."""
    now = [1000.0]
    rules = rules_with(max_images=8, prune_batch=6, keep_recent=1, low_water=0.4, cache_ttl=300.0)
    url = f"https://{HOST}{PATHS['anthropic']}"
    first = [image(24, 16, "PNG", seed=100 + i) for i in range(20)]
    again = first[:1]
    other = first[:1] + [image(24, 16, "PNG", seed=200 + i) for i in range(19)]
    answers = {id(other): "Run two. "}

    def forwarded(runs: list[list[bytes]], processes: int) -> list[list[bytes]]:
        shared = closing(LastTurns(":memory:", clock=lambda: now[0]))
        memories = [Conversations(clock=lambda: now[0], shared=shared) for _ in range(processes)]
        bodies: list[list[bytes]] = [[] for _ in runs]
        for turn in range(1, len(first) + 1):
            for run, shots in enumerate(runs):
                now[0] += 5.0
                memory = memories[(turn + run) % processes]  # each run on the next process each turn
                body = screens(shots[: min(turn, len(shots))], answers.get(id(shots), ""))
                outcome = prune_request(url, {}, body, rules, memory=memory)
                assert outcome.record is not None and outcome.history is not None
                memory.assign(outcome.history, outcome.record.kind, outcome.cut)
                bodies[run].append(outcome.body)
        return bodies

    alone = [forwarded([run], 1)[0] for run in (first, again, other)]
    assert [body.count(b'"type":"image"') for body in alone[0]][7:] == [8, 3, 4, 5, 6, 7, 8, 3, 4, 5, 6, 7, 8]  # held, cut, held
    assert forwarded([first, again, other], instances) == alone


def test_a_row_taken_leaves_its_images_older_than_every_image_that_comes_after(closing: Callable[[LastTurns], LastTurns]) -> None:
    """The row's ranks stand for arrivals before anything this memory sees next: an image new on a later turn of the
    process's own is the newest, however few requests the memory counted before (its clock for arrivals)."""
    now = [10.0]
    shared = closing(LastTurns(":memory:", clock=lambda: now[0]))
    a = Conversations(clock=lambda: now[0], shared=shared)
    a.assign(line(0, 1, [A]))
    key = conversation_key(HOST, None, (0).to_bytes(8, "big"))
    shared.put(key, LastTurn(15.0, 0, ((A, 0), (B, 0), (C, 0), (D, 0))))  # another process sent turns 2 to 4
    now[0] = 20.0
    a.assign(line(0, 5, [A, B, C, D, E]))  # takes the row; E is new
    assert a.recall(line(0, 6, [A, B, C, D, E, F])).order == (0, 1, 2, 3, 4, 5)


def test_a_planted_row_cutting_every_image_still_leaves_the_newest(closing: Callable[[LastTurns], LastTurns]) -> None:
    """Whoever can write the file can make images count as cut before, never the newest keep_recent."""
    now = [500.0]
    shared = closing(LastTurns(":memory:", clock=lambda: now[0]))
    body = orjson.dumps(session_body("anthropic", 6, image(24, 16, "PNG", seed=9), "image/png"))
    url = f"https://{HOST}{PATHS['anthropic']}"
    rules = rules_with(max_images=8, low_water=0.4, cache_ttl=300.0)
    known = prune_request(url, {}, body, rules, memory=Conversations(clock=lambda: now[0])).history
    assert known is not None and len(known.images) == 6
    images = tuple((key, known.images.crc(i)) for i, key in enumerate(known.images.keys))
    shared.put(conversation_key(HOST, known.session, known.origin), LastTurn(now[0], len(images), images))
    outcome = prune_request(url, {}, body, rules, memory=Conversations(clock=lambda: now[0], shared=shared))
    assert outcome.record is not None and (outcome.record.images_before, outcome.record.images_after) == (6, 1)
    newest = re.findall(rb'"data":"([^"]+)"', body)[-1]
    assert newest in outcome.body


def test_past_the_images_a_line_remembers_the_shared_turn_keeps_the_newest_and_the_cut_among_them(
    monkeypatch: pytest.MonkeyPatch, closing: Callable[[LastTurns], LastTurns]
) -> None:
    monkeypatch.setattr(_conversation, "MAX_IMAGES_PER_LINE", 2)
    shared = closing(LastTurns(":memory:"))
    Conversations(shared=shared).assign(line(0, 1, [A, B, C, D]), TURN, cut={0, 1, 2})
    last = shared.get(conversation_key(HOST, None, (0).to_bytes(8, "big")))
    assert last is not None and [key for key, _ in last.images] == [C, D] and last.cut == 1


def test_a_turn_reads_the_file_once_and_remembers_itself_in_the_order_it_was_cut_in(
    monkeypatch: pytest.MonkeyPatch, closing: Callable[[LastTurns], LastTurns]
) -> None:
    """`assign` takes the row `recall` read for the same request, even when another process wrote since."""
    now = [10.0]
    shared = closing(LastTurns(":memory:", clock=lambda: now[0]))
    a, b = Conversations(clock=lambda: now[0], shared=shared), Conversations(clock=lambda: now[0], shared=shared)
    a.assign(line(0, 1, [A, B]), TURN)
    reads = []
    get_many = shared.get_many
    monkeypatch.setattr(shared, "get_many", lambda keys: reads.append(keys) or get_many(keys))
    request = line(0, 2, [A, B, C])
    now[0] = 20.0
    assert b.recall(request).cut == 0  # a's turn: nothing cut
    key = conversation_key(HOST, None, (0).to_bytes(8, "big"))
    shared.put(key, LastTurn(15.0, 2, ((B, 0), (A, 0))))  # meanwhile, another process's row with another order
    b.assign(request, TURN, cut={0})
    assert len(reads) == 1
    (last, *_) = get_many([key])
    assert last is not None and last.images[0][0] == A and last.cut == 1  # A first, as recall ordered: A was cut
    assert b.recall(line(0, 3, [A, B, C, D])) is not None and len(reads) == 2  # a new request: read again
