"""trimflow._seen_prefixes: a text body's messages it shares with a body seen before keep their digests and are not
read again, found from its raw bytes; every digest and record is the one a body read in full gets, whatever changed,
moved or was written otherwise, and a body whose new messages hold media is read in full."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
from collections.abc import Callable, Iterator

import orjson
import pytest

from trimflow import _engine, _seen_prefixes, prune_request
from trimflow._engine import Outcome
from trimflow._history import SEEN, History
from trimflow._record import Record
from trimflow._seen_prefixes import MAX_BOUNDS, SeenPrefixes, key_of
from trimflow.testing import PATHS, data_url, image

from .bench import coding_session
from .helpers import rules_with

HOST = "api.example.test"
SYSTEM = "You are a coding agent. Read, run and change the repository. " * 10


@pytest.fixture(autouse=True, params=["compared", "hashed"])
def _no_body_seen(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test twice: with the bodies seen kept as they came (compared byte for byte), and with none kept (hashed)."""
    if request.param == "hashed":
        monkeypatch.setattr(SEEN, "_max_retained", 0)
    SEEN.clear()
    yield
    SEEN.clear()


def outcome(body: bytes, fmt: str = "openai-chat", **limits: object) -> Outcome:
    return prune_request(f"https://{HOST}{PATHS[fmt]}", {}, body, rules_with(**limits))


def history(body: bytes, fmt: str = "openai-chat") -> History:
    made = outcome(body, fmt).history
    assert made is not None
    return made


@contextlib.contextmanager
def seen_kept() -> Iterator[None]:
    """What SEEN remembers now, put back as it was on leaving."""
    kept = (
        {key: list(bodies) for key, bodies in SEEN._seen.items()},
        dict(SEEN._retained),
        (SEEN._kept, SEEN._bodies, SEEN._retained_bytes),
    )
    try:
        yield
    finally:
        SEEN._seen.clear()
        SEEN._seen.update(kept[0])
        SEEN._retained.clear()
        SEEN._retained.update(kept[1])
        SEEN._kept, SEEN._bodies, SEEN._retained_bytes = kept[2]


def read_in_full(body: bytes, fmt: str = "openai-chat", **limits: object) -> Outcome:
    """The outcome of `body` with no body seen before it, its history worked out."""
    with seen_kept():
        SEEN.clear()
        made = outcome(body, fmt, **limits)
        assert made.history is not None
        return made


def same_record(a: Record | None, b: Record | None) -> bool:
    """Records alike but for when they were made and how long that took."""
    assert a is not None and b is not None
    return dataclasses.replace(a, ts="", overhead_ms=0.0) == dataclasses.replace(b, ts="", overhead_ms=0.0)


@contextlib.contextmanager
def counting_spliced() -> Iterator[list[int]]:
    """How many requests the engine read from their spliced document (one entry each)."""
    read: list[int] = []
    prune = _engine._prune

    def counted(*args: object, **kwargs: object) -> Outcome:
        made = prune(*args, **kwargs)  # type: ignore[arg-type]
        if kwargs.get("spliced") is not None:  # an outcome of the document (one it cannot tell raises)
            read.append(1)
        return made

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_engine, "_prune", counted)
        yield read


def digested_in_full(body: bytes, fmt: str = "openai-chat") -> tuple[int, ...]:
    """The digests of `body` with no body seen before it."""
    made = read_in_full(body, fmt).history
    assert made is not None
    return made.messages


def reused(body: bytes, fmt: str = "openai-chat") -> int:
    """How many of the body's messages the bodies seen before give their digests to."""
    return len(SEEN.match(key_of(HOST, body), body).digests)


def tool_turn(n: int, rng: random.Random) -> list[dict]:
    output = json.dumps({"file": f"src/m{n}.py", "lines": [f'def f{i}(x):\n    return "{rng.random()}"' for i in range(30)]})
    call = {"id": f"call_{n}", "type": "function", "function": {"name": "run", "arguments": json.dumps({"cmd": f"cat src/m{n}.py"})}}
    return [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": f"call_{n}", "content": output}]


def chat_session(turns: int, seed: int = 0, task: str = "Fix the failing test.") -> list[bytes]:
    rng = random.Random(seed)
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    bodies = []
    for n in range(turns):
        messages += tool_turn(n, rng)
        bodies.append(orjson.dumps({"model": "gpt-4o", "messages": messages, "stream": True}))
    return bodies


def test_a_session_reuses_what_each_turn_shares_and_digests_as_in_full() -> None:
    bodies = chat_session(30)
    for n, body in enumerate(bodies):
        if n:
            assert reused(body) == 2 + 2 * n  # every message of the turn before
        assert history(body).messages == digested_in_full(body)
    assert history(bodies[-1]).messages == digested_in_full(bodies[-1])  # the same body again: all of it
    assert reused(bodies[-1]) == 2 + 2 * 30
    assert sum(map(len, SEEN._seen.values())) == 1  # each turn took the place of the one it extends
    assert SEEN.kept == 2 + 2 * 30


def test_a_message_changed_in_place_is_digested_again() -> None:
    first, second = chat_session(8)[6:8]
    history(first)
    # The same length, one byte: the tails around it and every end stay where they were.
    at = second.index(b"src/m3.py") + len("src/m")
    edited = second[:at] + b"4" + second[at + 1 :]
    assert len(edited) == len(second)
    got = history(edited).messages
    assert got == digested_in_full(edited) != digested_in_full(second)
    changed = 2 + 2 * 3  # the call that reads src/m3.py
    assert got[:changed] == digested_in_full(second)[:changed] and got[changed] != digested_in_full(second)[changed]


def test_a_moved_cache_breakpoint_keeps_what_comes_before_it() -> None:
    # Anthropic clients mark the last message, then the new last one: the message marked before is written otherwise.
    def body(turns: int) -> bytes:
        rng, messages = random.Random(1), [{"role": "user", "content": [{"type": "text", "text": "Fix the failing test."}]}]
        for n in range(turns):
            messages.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"t{n}", "name": "run", "input": {"cmd": f"cat m{n}"}}]})
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{n}", "content": str(rng.random()) * 40}]})
        marked = json.loads(json.dumps(messages))
        marked[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        return orjson.dumps({"model": "claude-sonnet-4-5", "max_tokens": 4096, "system": SYSTEM, "messages": marked})

    for turns in range(1, 12):
        if turns > 1:
            assert reused(body(turns), "anthropic") == 1 + 2 * (turns - 1) - 1  # all but the one marked before
        assert history(body(turns), "anthropic").messages == digested_in_full(body(turns), "anthropic")
    assert sum(map(len, SEEN._seen.values())) == 1


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda value: json.dumps(value).encode(), id="spaces and ASCII escapes"),
        pytest.param(lambda value: json.dumps(value, indent=1).encode(), id="indented"),
    ],
)
def test_json_written_otherwise_than_orjson_is_digested_in_full(write: Callable[[object], bytes]) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Corrige le test qui échoue."}]
    for n in range(4):
        messages += tool_turn(n, random.Random(n))
        body = write({"model": "gpt-4o", "messages": messages})
        assert history(body).messages == digested_in_full(body)
    assert SEEN.kept == 0


def test_conversations_that_open_alike_each_reuse_their_own() -> None:
    # Sub-agents with the same system prompt and first message, taking turns.
    ours, theirs = chat_session(6, seed=1), chat_session(6, seed=2)
    for n in range(6):
        for bodies in (ours, theirs):
            if n:
                assert reused(bodies[n]) == 2 + 2 * n
            assert history(bodies[n]).messages == digested_in_full(bodies[n])
    assert sum(map(len, SEEN._seen.values())) == 2
    # Each one's last body kept as it came, whichever remembered a body after it.
    assert SEEN.retained == (len(ours[-1]) + len(theirs[-1]) if SEEN._max_retained else 0)


def test_a_long_session_hashes_its_bounds_again_as_one_and_stays_right() -> None:
    rng, messages, bodies = random.Random(3), [{"role": "system", "content": SYSTEM}], []
    for n in range(3 * MAX_BOUNDS):
        messages.append({"role": "user" if n % 2 else "assistant", "content": f"step {n}: {rng.random()}"})
        bodies.append(orjson.dumps({"model": "gpt-4o", "messages": messages}))
    for n, body in enumerate(bodies):
        if n:
            assert reused(body) == n + 1
        assert history(body).messages == digested_in_full(body)
        assert all(len(seen.bounds) <= MAX_BOUNDS for bodies_seen in SEEN._seen.values() for seen in bodies_seen)


def test_what_is_kept_is_bounded_over_all_conversations() -> None:
    seen = SeenPrefixes(max_digests=40, max_bodies=12, per_key=2, max_retained=2000)

    def remember(opening: bytes, messages: list[dict], digests: list[int]) -> None:
        body = orjson.dumps({"messages": messages})
        seen.remember(("h", hash(opening)), body, messages, digests, lambda i: orjson.dumps(messages[i]), items_path=("messages",))
        assert seen.retained == sum(len(body) for _, body in seen._retained.values()) <= 2000
        remembered = [id(body) for bodies in seen._seen.values() for body in bodies]
        assert all(id(kept) in remembered for kept, _ in seen._retained.values())

    for n in range(50):
        remember(bytes([n]), [{"role": "user", "content": f"task {n}"}, {"role": "assistant", "content": "ok"}], [n, n + 1])
        assert seen.kept <= 40 and sum(map(len, seen._seen.values())) <= 12
    assert sum(map(len, seen._seen.values())) == 12  # bodies of two messages: the bodies' bound holds first
    for n in range(50):
        many = [{"role": "user", "content": f"long task {n} {i}"} for i in range(15)]
        remember(bytes([n, n]), many, list(range(15)))
        assert seen.kept <= 40
    assert seen.kept == 30  # two bodies of 15
    for n in range(5):  # one origin, many bodies: the oldest go
        remember(b"same", [{"role": "user", "content": "same"}, {"role": "assistant", "content": str(n)}], [1, n])
    assert len(seen._seen[("h", hash(b"same"))]) == 2
    assert seen.kept == sum(len(s.digests) for bodies in seen._seen.values() for s in bodies) <= 40


def test_a_body_with_a_second_messages_array_is_digested_as_parsed() -> None:
    # orjson keeps the last of two equal keys: the bytes of the first array prove nothing about the messages parsed.
    first = chat_session(3)[2]
    history(first)
    messages = orjson.loads(first)["messages"]
    other = messages[:2] + [{"role": "user", "content": f"something else {n}"} for n in range(10)]  # the same origin
    doubled = first[:-1] + b',"messages":' + orjson.dumps(other) + b"}"
    assert orjson.loads(doubled)["messages"] == other
    assert history(doubled).messages == digested_in_full(doubled)
    assert history(doubled).messages[:2] == history(first).messages[:2]


def test_the_messages_key_in_a_new_message_leaves_its_turn_sharing() -> None:
    # Codex's freeform tools answer with custom_tool_call items whose "input" is a string: not a second array of items.
    def body(turns: int) -> bytes:
        items: list[dict] = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the test."}]}]
        for n in range(turns):
            items.append({"type": "custom_tool_call", "call_id": f"c{n}", "name": "apply_patch", "input": f"*** Begin Patch {n}"})
            items.append({"type": "custom_tool_call_output", "call_id": f"c{n}", "output": f"patched {n}"})
        return orjson.dumps({"model": "gpt-5-codex", "instructions": SYSTEM, "input": items, "store": False})

    for turns in range(1, 6):
        if turns > 1:
            assert reused(body(turns), "openai-responses") == 1 + 2 * (turns - 1)
        assert history(body(turns), "openai-responses").messages == digested_in_full(body(turns), "openai-responses")


FORMATS = ("openai-chat", "openai-responses", "anthropic", "gemini", "bedrock-converse", "ollama")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_turn_is_read_from_what_it_shares_as_in_full(fmt: str) -> None:
    turns = [coding_session(fmt, n, lines=20, seed=4) for n in range(1, 9)]
    with counting_spliced() as spliced:
        for body in [*turns, turns[-1]]:  # the last one again: a retry shares all of it
            got, full = outcome(body, fmt), read_in_full(body, fmt)
            assert got.body is body and not got.changed
            assert same_record(got.record, full.record)
            assert got.history is not None and full.history is not None
            assert (got.history.messages, got.history.origin, got.history.head, got.history.tools) == (
                full.history.messages,
                full.history.origin,
                full.history.head,
                full.history.tools,
            )
    assert len(spliced) == len(turns)  # every turn after the first, and the retry


@pytest.mark.parametrize("side", [8, 400], ids=["tiny images", "screenshots"])
def test_new_messages_with_images_are_read_in_full_and_cut(side: int) -> None:
    bodies = chat_session(4)
    for body in bodies:
        history(body)
    messages = orjson.loads(bodies[-1])["messages"]
    shots = [image(side, side * 3 // 4, "PNG", seed=n) for n in range(3)]
    parts = [{"type": "image_url", "image_url": {"url": data_url(shot, "image/png")}} for shot in shots]
    with_images = orjson.dumps({"model": "gpt-4o", "messages": [*messages, {"role": "user", "content": parts}], "stream": True})
    # A payload long enough to be one (a screenshot) is seen in the bytes: no document is made; a tiny one is found in it.
    assert (SEEN.splice(key_of(HOST, with_images), with_images) is None) == (side > 8)
    with counting_spliced() as spliced:
        got = outcome(with_images, max_images=1)
    full = read_in_full(with_images, max_images=1)
    assert not spliced
    assert got.record is not None and got.record.images_before == 3 and got.record.pruned == 2
    assert got.changed and got.body == full.body and same_record(got.record, full.record)


def test_a_text_body_over_a_limit_is_read_in_full() -> None:
    bodies = chat_session(6)
    for body in bodies[:-1]:
        history(body)
    with counting_spliced() as spliced:
        got = outcome(bodies[-1], max_body_bytes=len(bodies[-1]) // 2)
    full = read_in_full(bodies[-1], max_body_bytes=len(bodies[-1]) // 2)
    assert not spliced
    assert got.record is not None and got.record.over_budget and same_record(got.record, full.record)


def test_what_follows_the_messages_is_read_as_it_is_now() -> None:
    # The system prompt after the messages, changed between turns: the conversation's origin is the new one's.
    def body(turns: int, system: str) -> bytes:
        messages: list[dict] = [{"role": "user", "content": "Fix the failing test."}]
        for n in range(turns):
            messages += [{"role": "assistant", "content": f"step {n}"}, {"role": "user", "content": f"result {n}"}]
        return orjson.dumps({"model": "claude-sonnet-4-5", "messages": messages, "system": system, "max_tokens": 1024})

    history(body(3, SYSTEM), "anthropic")
    changed = body(4, SYSTEM + " Be brief.")
    with counting_spliced() as spliced:
        got = outcome(changed, "anthropic")
    full = read_in_full(changed, "anthropic")
    assert spliced and got.history is not None and full.history is not None
    assert (got.history.origin, got.history.head, got.history.messages) == (full.history.origin, full.history.head, full.history.messages)
    assert got.history.origin != history(body(3, SYSTEM), "anthropic").origin


def test_bodies_crafted_to_open_alike_cost_a_lookup_a_few_reads_of_the_body(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every body remembered under one key shares all but the last bytes before its last message's end with the next.
    seen = SeenPrefixes(per_key=32)
    opening = [{"role": "user", "content": "x" * 50_000}]
    for n in range(32):
        messages = [*opening, {"role": "assistant", "content": "y" * 50_000 + f"{n:04}"}]
        body = orjson.dumps({"messages": messages})
        seen.remember(key_of("h", body), body, messages, [1, n], lambda i, m=messages: orjson.dumps(m[i]), items_path=("messages",))  # type: ignore[misc]
    assert len(seen._seen[key_of("h", body)]) == 32
    looked_up = orjson.dumps({"messages": [*opening, {"role": "assistant", "content": "y" * 50_000 + "9999"}]})
    work: list[int] = []
    shared = _seen_prefixes._shared

    def counted(*args: object) -> object:
        found, done = shared(*args)  # type: ignore[arg-type]
        work.append(done)
        return found, done

    monkeypatch.setattr(_seen_prefixes, "_shared", counted)
    assert len(seen.match(key_of("h", looked_up), looked_up).digests) == 1  # the first message, from the first tried
    # The budget, then the last body tried: at most a few halvings of its bounds past it.
    assert len(work) < 32 and sum(work) <= (_seen_prefixes.WORK + 6) * len(looked_up)
