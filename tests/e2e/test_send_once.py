"""Send once end to end: the real anthropic and openai clients hold screenshot conversations through a real mitmdump
with send-once on, in front of the fake provider and its Files APIs (FakeProvider(cache=True)), beside the same
conversation through a mitmdump without it. The first appearance of each screenshot uploads it, every later turn
references it, the provider's usage and cache reads are the inline run's, and far fewer bytes reach it. Two keys never
share a file; an upload that fails or hangs leaves the image inline; a file deleted at the provider between two turns
is answered by one inline re-send."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import orjson
import pytest

from trimflow.testing import FakeProvider, Received, b64
from trimflow.testing._fake_files import owner_of

from ..helpers import RedisServer, wait_for
from .helpers import ANTHROPIC_KEY, OPENAI_KEY, Proxy, deleting_before_turn_two, direct_http_client, post, shots, start_all, stop_all

pytestmark = pytest.mark.e2e

TURNS = 6
SYSTEM = "You are a careful desktop assistant. Read the screen before you act, then say which control to use. " * 60
EPHEMERAL = {"type": "ephemeral"}
OTHER_KEY = "sk-ant-test-SECRET-other-tenant-4c2d9e"
SCREENS = shots(TURNS, seed=41, width=220, height=160)  # noisy PNGs of ~100 KB: within Claude's native size


def claude_session(url: str, key: str, screens: list[bytes], between: Callable[[int], None] = lambda turn: None) -> list[str]:
    """A conversation of one screenshot more each turn, Claude Code's breakpoints; the answers' texts."""
    messages: list[dict[str, Any]] = []
    answers = []
    with anthropic.Anthropic(api_key=key, base_url=url, http_client=direct_http_client(), max_retries=0, timeout=60) as client:
        for turn, shot in enumerate(screens, 1):
            between(turn)
            for message in messages:
                for block in message["content"]:
                    block.pop("cache_control", None)
            shot_block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(shot)}}
            text = {"type": "text", "text": f"Turn {turn}: what should I click next?", "cache_control": EPHEMERAL}
            messages.append({"role": "user", "content": [shot_block, text]})
            system = [{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}]
            reply = client.messages.create(model="claude-sonnet-4-6", max_tokens=200, system=system, messages=messages)  # type: ignore[arg-type]
            answers.append(reply.content[0].text)  # type: ignore[union-attr]
            messages.append({"role": "assistant", "content": [{"type": "text", "text": answers[-1]}]})
    return answers


def turns(provider: FakeProvider, ending: str) -> list[Received]:
    return [r for r in provider.received if r.method == "POST" and r.path.endswith(ending)]


def uploads(provider: FakeProvider) -> list[Received]:
    return [r for r in provider.received if r.method == "POST" and r.path.endswith("/v1/files")]


def anthropic_file_ids(received: Received) -> list[str]:
    body = received.json()
    return [
        block["source"]["file_id"]
        for message in body["messages"]
        for block in message["content"]
        if block.get("type") == "image" and block["source"].get("type") == "file"
    ]


def inline_images(received: Received) -> int:
    return received.body.count(b'"type":"base64"') + received.body.count(b'"type": "base64"')


def test_a_claude_session_uploads_each_screenshot_once_and_references_it_on_every_later_turn(
    send_once_providers: tuple[FakeProvider, FakeProvider], send_once_proxies: tuple[Proxy, Proxy]
) -> None:
    (once_provider, inline_provider), (once, inline) = send_once_providers, send_once_proxies
    once_provider.clear()
    inline_provider.clear()
    with once.expect_records(TURNS) as once_records, inline.expect_records(TURNS) as inline_records:
        assert claude_session(once.url, ANTHROPIC_KEY, SCREENS) == claude_session(inline.url, ANTHROPIC_KEY, SCREENS)

    assert len(uploads(once_provider)) == TURNS  # each screenshot once, at its first appearance
    assert [f.data for f in once_provider.files.files(ANTHROPIC_KEY)] == SCREENS
    messages = turns(once_provider, "/v1/messages")
    seen: list[str] = []
    for turn, received in enumerate(messages, 1):
        ids = anthropic_file_ids(received)
        assert ids[: turn - 1] == seen and len(ids) == turn  # the same file for the same screenshot, from the first turn on
        assert inline_images(received) == 0
        assert "files-api-2025-04-14" in received.headers["anthropic-beta"]
        seen = ids
    # The provider counts what it would have counted inline: the same tokens, the same cache reads and writes.
    usage = [(r["usage_input_tokens"], r["usage_cache_read_tokens"], r["usage_cache_write_tokens"]) for r in once_records]
    assert usage == [(r["usage_input_tokens"], r["usage_cache_read_tokens"], r["usage_cache_write_tokens"]) for r in inline_records]
    assert all(r["usage_cache_read_tokens"] for r in once_records[1:])
    assert [(r["by_reference"], r["uploaded"]) for r in once_records] == [(turn, 1) for turn in range(1, TURNS + 1)]
    assert all(r["reference_bytes_saved"] > 100_000 * r["by_reference"] for r in once_records)
    # Bytes on the wire, uploads included: a fraction of the inline run's (inline it is 1).
    sent = sum(r.wire_bytes for r in once_provider.received)
    assert sent < 0.4 * sum(r.wire_bytes for r in inline_provider.received)
    assert max(r.wire_bytes for r in messages) < len(b64(SCREENS[0])) / 4  # every turn: its text, and references
    log = once.log()
    assert "by reference 6 (1 uploaded" in log
    assert ANTHROPIC_KEY not in log and b64(SCREENS[0])[:64] not in log


def test_two_keys_sending_the_same_screenshot_never_reference_each_others_files(
    send_once_providers: tuple[FakeProvider, FakeProvider], send_once_proxies: tuple[Proxy, Proxy]
) -> None:
    once_provider, once = send_once_providers[0], send_once_proxies[0]
    screen = shots(1, seed=77, width=220, height=160)
    once_provider.clear()
    with once.expect_records(2) as records:
        claude_session(once.url, ANTHROPIC_KEY, screen)
        claude_session(once.url, OTHER_KEY, screen)
    own = {key: {f.file_id for f in once_provider.files.files(key) if f.data == screen[0]} for key in (ANTHROPIC_KEY, OTHER_KEY)}
    assert all(len(ids) == 1 for ids in own.values()) and not own[ANTHROPIC_KEY] & own[OTHER_KEY]
    for received in turns(once_provider, "/v1/messages"):
        assert set(anthropic_file_ids(received)) == own[owner_of(received.headers)]
    assert [r["references_refused"] for r in records] == [0, 0]


def test_a_file_deleted_at_the_provider_between_turns_is_answered_by_one_inline_resend(
    send_once_providers: tuple[FakeProvider, FakeProvider], send_once_proxies: tuple[Proxy, Proxy]
) -> None:
    once_provider, once = send_once_providers[0], send_once_proxies[0]
    screens = shots(3, seed=91, width=220, height=160)
    once_provider.clear()

    with once.expect_records(3) as records:
        claude_session(once.url, ANTHROPIC_KEY, screens, between=deleting_before_turn_two(once_provider, ANTHROPIC_KEY, screens[0]))
    assert [r["status"] for r in records] == [200, 200, 200]
    assert records[1]["references_refused"] == 1 and records[1]["by_reference"] == 0
    messages = turns(once_provider, "/v1/messages")
    assert len(messages) == 4  # turn 2 went twice: with its references (refused), then inline
    assert inline_images(messages[1]) == 0 and inline_images(messages[2]) == 2
    # Turn 3: the first screenshot's entry is gone, so it stays inline (as turn 2 finally sent it); the others by reference.
    assert inline_images(messages[3]) == 1 and len(anthropic_file_ids(messages[3])) == 2
    assert "refused 1 file references; sent again inline" in once.log()


@pytest.fixture
def failing_uploads(tmp_path: Any) -> Iterator[tuple[FakeProvider, Proxy, threading.Event]]:
    """A provider whose Files API answers 500 for the first upload and then hangs until released, behind a proxy with
    a short upload deadline."""
    release = threading.Event()
    calls = []

    def check(received: Received) -> tuple[int, str, bytes] | None:
        if received.method != "POST" or not received.path.endswith("/v1/files"):
            return None
        calls.append(received)
        if len(calls) == 1:
            return 500, "application/json", orjson.dumps({"type": "error", "error": {"type": "api_error", "message": "boom"}})
        release.wait(120)
        return 503, "application/json", b"{}"

    with FakeProvider(check=check) as provider:
        proxy = Proxy(tmp_path, "--mode", f"reverse:{provider.url}", rules=None, trimflow_send_once="true", trimflow_send_once_deadline="1s")
        start_all(proxy.mitm)
        try:
            yield provider, proxy, release
        finally:
            release.set()
            stop_all(proxy.mitm)


def test_an_upload_that_fails_or_hangs_leaves_the_image_inline_and_the_turn_succeeds(
    failing_uploads: tuple[FakeProvider, Proxy, threading.Event],
) -> None:
    provider, proxy, release = failing_uploads
    screens = shots(2, seed=5, width=220, height=160)
    with proxy.expect_records(2) as records:
        claude_session(proxy.url, ANTHROPIC_KEY, screens)  # turn 1's upload fails (500), turn 2's hangs past the deadline
    release.set()
    assert [(r["status"], r["by_reference"], r["uploaded"]) for r in records] == [(200, 0, 0), (200, 0, 0)]
    messages = turns(provider, "/v1/messages")
    assert [inline_images(m) for m in messages] == [1, 2]
    assert len(uploads(provider)) == 2  # the first screenshot stays inline on turn 2: never uploaded again
    log = proxy.log()
    assert "answered 500: the image goes inline" in log and "no answer before the deadline" in log


def openai_session(url: str, screens: list[bytes]) -> list[str]:
    items: list[dict[str, Any]] = []
    answers = []
    with openai.OpenAI(api_key=OPENAI_KEY, base_url=f"{url}/v1", http_client=direct_http_client(), max_retries=0, timeout=60) as client:
        for turn, shot in enumerate(screens, 1):
            image = {"type": "input_image", "image_url": f"data:image/png;base64,{b64(shot)}", "detail": "high"}
            items.append({"role": "user", "content": [image, {"type": "input_text", "text": f"Turn {turn}: what next?"}]})
            reply = client.responses.create(model="gpt-5", instructions=SYSTEM, input=items)  # type: ignore[arg-type]
            answers.append(reply.output_text)
            items.append({"role": "assistant", "content": reply.output_text})
    return answers


def test_an_openai_responses_session_references_each_screenshot_by_file_id_keeping_its_detail(
    tmp_path: Any, send_once_providers: tuple[FakeProvider, FakeProvider]
) -> None:
    once_provider, inline_provider = send_once_providers
    once = Proxy(tmp_path / "once", "--mode", f"reverse:{once_provider.url}", rules=None, trimflow_send_once="true")
    inline = Proxy(tmp_path / "inline", "--mode", f"reverse:{inline_provider.url}", rules=None)
    start_all(once.mitm, inline.mitm)
    try:
        once_provider.clear()
        inline_provider.clear()
        screens = shots(4, seed=13, width=220, height=160)
        with once.expect_records(4) as once_records, inline.expect_records(4) as inline_records:
            assert openai_session(once.url, screens) == openai_session(inline.url, screens)
        files = once_provider.files.files(OPENAI_KEY)
    finally:
        stop_all(once.mitm, inline.mitm)
    assert once_provider.files.files(OPENAI_KEY) == []  # deleted as the proxy stopped: nothing would reference them again
    assert [f.data for f in files] == screens and {f.purpose for f in files} == {"vision"}
    assert all(f.expires_at is not None for f in files)  # OpenAI deletes them on its own should trimflow not
    for turn, received in enumerate(turns(once_provider, "/v1/responses"), 1):
        parts = [p for item in received.json()["input"] if item["role"] == "user" for p in item["content"] if p["type"] == "input_image"]
        assert [p["file_id"] for p in parts] == [f.file_id for f in files[:turn]]
        assert all(p["detail"] == "high" and "image_url" not in p for p in parts)
    usage = [(r["usage_input_tokens"], r["usage_cache_read_tokens"]) for r in once_records]
    assert usage == [(r["usage_input_tokens"], r["usage_cache_read_tokens"]) for r in inline_records]
    assert [r["by_reference"] for r in once_records] == [1, 2, 3, 4]
    assert OPENAI_KEY not in once.log()


def test_a_file_is_deleted_at_the_provider_when_its_lifetime_ends(tmp_path: Any) -> None:
    with FakeProvider() as provider:
        proxy = Proxy(tmp_path, "--mode", f"reverse:{provider.url}", rules=None, trimflow_send_once="true", trimflow_send_once_lifetime="1s")
        start_all(proxy.mitm)
        try:
            with proxy.expect_records(1) as records:
                claude_session(proxy.url, ANTHROPIC_KEY, shots(1, seed=61, width=220, height=160))
            assert records[0]["uploaded"] == 1
            wait_for(lambda: provider.files.files(ANTHROPIC_KEY) == [], "the file deleted at the end of its lifetime")
            deletions = [r for r in provider.received if r.method == "DELETE"]
            assert len(deletions) == 1 and owner_of(deletions[0].headers) == ANTHROPIC_KEY  # with the key that uploaded it
        finally:
            stop_all(proxy.mitm)


def test_a_compressed_body_goes_with_its_references_compressed_as_it_came(
    send_once_providers: tuple[FakeProvider, FakeProvider], send_once_proxies: tuple[Proxy, Proxy]
) -> None:
    once_provider, once = send_once_providers[0], send_once_proxies[0]
    once_provider.clear()
    shot = shots(1, seed=123, width=220, height=160)[0]
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(shot)}}
    body = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": [block, {"type": "text", "text": "What is this?"}]}],
    }
    headers = {"x-api-key": OTHER_KEY, "anthropic-version": "2023-06-01", "content-encoding": "gzip", "anthropic-beta": "prompt-caching-2024-07-31"}
    status, _ = post(once.port, "/v1/messages", gzip.compress(orjson.dumps(body)), headers)
    assert status == 200
    (received,) = turns(once_provider, "/v1/messages")
    assert received.headers["content-encoding"] == "gzip" and received.wire_bytes < len(b64(shot)) / 4
    assert len(anthropic_file_ids(received)) == 1 and inline_images(received) == 0
    assert received.headers["anthropic-beta"] == "prompt-caching-2024-07-31, files-api-2025-04-14"  # the client's betas kept


# --- instances sharing a store -----------------------------------------------------------------------------------

FILE_KEYS = b"trimflow:v1:file:*"


@pytest.fixture
def shared_pair(tmp_path: Any) -> Iterator[tuple[FakeProvider, Proxy, Proxy, RedisServer]]:
    """Two mitmdumps with send-once on, as on two hosts (no shared file) sharing a real redis-server, in front of one
    fake provider; each answering through the store before the test begins."""
    store = RedisServer(tmp_path)
    provider = FakeProvider().start()
    options = {
        "trimflow_send_once": "true",
        "trimflow_conversations": "",
        "trimflow_state": store.url,
        "trimflow_state_deadline": "1",  # a busy machine's slow answer is no test of sharing
        "trimflow_prometheus": "127.0.0.1:0",
    }
    a, b = (Proxy(tmp_path / name, "--mode", f"reverse:{provider.url}", rules=None, **options) for name in ("a", "b"))
    start_all(a.mitm, b.mitm)
    try:
        for proxy in (a, b):
            proxy.wait_sharing()
        yield provider, a, b, store
    finally:
        stop_all(a.mitm, b.mitm)
        provider.stop()
        store.stop()


def file_keys(store: RedisServer) -> list[bytes]:
    with store.raw() as raw:
        return sorted(raw.keys(FILE_KEYS))


def test_an_instance_sharing_the_store_references_the_files_another_uploaded_and_never_deletes_them(
    shared_pair: tuple[FakeProvider, Proxy, Proxy, RedisServer],
) -> None:
    provider, a, b, store = shared_pair
    screens = shots(3, seed=201, width=220, height=160)
    with a.expect_records(2):
        claude_session(a.url, ANTHROPIC_KEY, screens[:2])
    wait_for(lambda: len(file_keys(store)) == 2, "the first instance's files in the store")
    # The same conversation goes on through the other instance: only the new screenshot goes up.
    with b.expect_records(3) as records:
        claude_session(b.url, ANTHROPIC_KEY, screens)
    assert len(uploads(provider)) == 3  # each screenshot once, across both instances
    ids = {f.data: f.file_id for f in provider.files.files(ANTHROPIC_KEY)}
    assert list(ids) == screens
    through_b = turns(provider, "/v1/messages")[2:]
    assert [anthropic_file_ids(r) for r in through_b] == [[ids[s] for s in screens[:n]] for n in (1, 2, 3)]
    assert all(inline_images(r) == 0 for r in through_b)
    assert [(r["by_reference"], r["uploaded"], r["references_refused"]) for r in records] == [(1, 0, 0), (2, 0, 0), (3, 1, 0)]
    # The store holds digests, a time and the file id: no key, no image; each key expires before its uploader deletes it.
    wait_for(lambda: len(file_keys(store)) == 3, "the second instance's file in the store")
    keys = file_keys(store)
    with store.raw() as raw:
        for key in keys:
            value = raw.get(key)
            assert key.startswith(b"trimflow:v1:file:") and len(key.split(b":")[3]) == 32 and len(key.split(b":")[4]) == 32
            assert value[8:].decode() in ids.values() and len(value) < 64
            assert 0 < raw.pttl(key) <= (86400 - 600) * 1000
    for text in (a.log(), b.log()):
        assert ANTHROPIC_KEY not in text and "Traceback" not in text
    # Each instance deletes the files it uploaded, and only those (with their store entries) as it stops.
    stop_all(a.mitm)
    deleted = [r.path.rsplit("/", 1)[1] for r in provider.received if r.method == "DELETE"]
    assert sorted(deleted) == sorted(ids[s] for s in screens[:2])
    assert len(file_keys(store)) == 1
    stop_all(b.mitm)
    deleted = [r.path.rsplit("/", 1)[1] for r in provider.received if r.method == "DELETE"]
    assert sorted(deleted) == sorted(ids.values()) and provider.files.files(ANTHROPIC_KEY) == []


def test_through_the_store_a_file_is_referenced_under_the_key_that_uploaded_it_and_never_another(
    shared_pair: tuple[FakeProvider, Proxy, Proxy, RedisServer],
) -> None:
    provider, a, b, store = shared_pair
    screen = shots(1, seed=202, width=220, height=160)
    with a.expect_records(1):
        claude_session(a.url, ANTHROPIC_KEY, screen)
    wait_for(lambda: len(file_keys(store)) == 1, "the first instance's file in the store")
    with b.expect_records(2) as records:
        claude_session(b.url, OTHER_KEY, screen)  # another key: its own upload
        claude_session(b.url, ANTHROPIC_KEY, screen)  # the first key: the first instance's file
    own = {key: {f.file_id for f in provider.files.files(key) if f.data == screen[0]} for key in (ANTHROPIC_KEY, OTHER_KEY)}
    assert all(len(ids) == 1 for ids in own.values()) and not own[ANTHROPIC_KEY] & own[OTHER_KEY]
    messages = turns(provider, "/v1/messages")
    assert len(messages) == 3  # none refused, none sent again
    for received in messages:
        assert set(anthropic_file_ids(received)) == own[owner_of(received.headers)]
    assert [(r["uploaded"], r["by_reference"], r["references_refused"]) for r in records] == [(1, 1, 0), (0, 1, 0)]
    assert len(uploads(provider)) == 2


def test_a_file_the_provider_refuses_is_taken_out_of_the_store_and_not_read_again(
    shared_pair: tuple[FakeProvider, Proxy, Proxy, RedisServer],
) -> None:
    provider, a, b, store = shared_pair
    screens = shots(2, seed=203, width=220, height=160)
    with a.expect_records(1):
        claude_session(a.url, ANTHROPIC_KEY, screens[:1])
    wait_for(lambda: len(file_keys(store)) == 1, "the first instance's file in the store")
    (first,) = provider.files.files(ANTHROPIC_KEY)
    assert provider.files.delete(first.file_id)  # gone at the provider, still named in the store
    with store.raw() as raw:
        (key,) = file_keys(store)
        entry = raw.get(key)

        def named_again(turn: int) -> None:
            if turn == 2:
                wait_for(lambda: file_keys(store) == [], "the refused entry out of the store")
                raw.set(key, entry, px=60_000)  # as a write of another instance's that came late

        with b.expect_records(2) as records:
            claude_session(b.url, ANTHROPIC_KEY, screens, between=named_again)
    assert [(r["status"], r["references_refused"]) for r in records] == [(200, 1), (200, 0)]
    messages = turns(provider, "/v1/messages")[1:]
    assert len(messages) == 3  # turn 1 through the second instance went twice: with the reference (refused), then inline
    assert anthropic_file_ids(messages[0]) == [first.file_id] and inline_images(messages[1]) == 1
    # Turn 2: the refused file is not referenced again though the store names it; the first screenshot inline (as
    # turn 1 finally went), the new one by reference.
    (second,) = provider.files.files(ANTHROPIC_KEY)
    assert anthropic_file_ids(messages[2]) == [second.file_id] and inline_images(messages[2]) == 1
