"""Send once to the Gemini API end to end: the real google-genai client holds screenshot conversations through a real
mitmdump with send-once on, in front of the fake provider and its Gemini Files API (FakeProvider(cache=True)), beside
the same conversation through a mitmdump without it. Each screenshot goes up once (the resumable protocol) at its first
appearance and by `fileData.fileUri` on every later turn, with the inline run's usage and cache reads; a file deleted
at the provider between two turns is answered by one inline re-send; two keys never share a file; a file is offered to
the instances sharing a store for no longer than Gemini keeps it, whatever the lifetime option says."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from google import genai
from google.genai import types

from trimflow.testing import FakeProvider, Received, b64
from trimflow.testing._fake_files import StoredFile, owner_of

from ..helpers import RedisServer, wait_for
from .helpers import GOOGLE_KEY, Proxy, deleting_before_turn_two, genai_client_args, shots, start_all, stop_all

pytestmark = pytest.mark.e2e

TURNS = 5
MODEL = "gemini-2.5-flash"
SYSTEM = "You are a careful desktop assistant. Read the screen before you act, then say which control to use. " * 150
OTHER_KEY = "AIzaSECRET-google-other-tenant-7e1f"
SCREENS = shots(TURNS, seed=43, width=220, height=160)  # noisy PNGs of ~100 KB


def gemini_session(url: str, key: str, screens: list[bytes], stream: bool = False, between: Callable[[int], None] = lambda turn: None) -> list[str]:
    """A conversation of one screenshot more each turn, as a google-genai app holds it; the answers' texts."""
    options = types.HttpOptions(base_url=url, timeout=60_000, client_args=genai_client_args())
    config = types.GenerateContentConfig(system_instruction=SYSTEM)
    contents: list[types.Content] = []
    answers = []
    with genai.Client(api_key=key, http_options=options) as client:
        for turn, shot in enumerate(screens, 1):
            between(turn)
            parts = [types.Part.from_bytes(data=shot, mime_type="image/png"), types.Part.from_text(text=f"Turn {turn}: what should I click next?")]
            contents.append(types.Content(role="user", parts=parts))
            if stream:
                text = "".join(c.text or "" for c in client.models.generate_content_stream(model=MODEL, contents=contents, config=config))
            else:
                text = client.models.generate_content(model=MODEL, contents=contents, config=config).text or ""
            answers.append(text)
            contents.append(types.Content(role="model", parts=[types.Part.from_text(text=text)]))
    return answers


def turns(provider: FakeProvider) -> list[Received]:
    return [r for r in provider.received if r.method == "POST" and r.path.endswith((":generateContent", ":streamGenerateContent"))]


def upload_starts(provider: FakeProvider) -> list[Received]:
    return [r for r in provider.received if r.method == "POST" and "/upload/" in r.path and r.path.endswith("/files") and "upload_id" not in r.query]


def file_uris(received: Received) -> list[str]:
    found = []
    for content in received.json()["contents"]:
        for part in content["parts"]:
            reference = part.get("fileData", part.get("file_data"))
            if reference is not None:
                found.append(reference.get("fileUri", reference.get("file_uri")))
    return found


def inline_images(received: Received) -> int:
    return sum(1 for content in received.json()["contents"] for part in content["parts"] if "inlineData" in part or "inline_data" in part)


def uri_of(file: StoredFile) -> str:
    """The file's URI, under the API version it was uploaded with (google-genai's: v1)."""
    return f"https://generativelanguage.googleapis.com/{file.version}/{file.file_id}"


def test_a_gemini_session_uploads_each_screenshot_once_and_references_it_on_every_later_turn(
    send_once_providers: tuple[FakeProvider, FakeProvider], send_once_proxies: tuple[Proxy, Proxy]
) -> None:
    (once_provider, inline_provider), (once, inline) = send_once_providers, send_once_proxies
    once_provider.clear()
    inline_provider.clear()
    with once.expect_records(TURNS) as once_records, inline.expect_records(TURNS) as inline_records:
        assert gemini_session(once.url, GOOGLE_KEY, SCREENS) == gemini_session(inline.url, GOOGLE_KEY, SCREENS)

    assert len(upload_starts(once_provider)) == TURNS  # each screenshot once, at its first appearance
    files = once_provider.files.files(GOOGLE_KEY)
    assert [f.data for f in files] == SCREENS and all(f.filename.startswith("trimflow-") for f in files)
    messages = turns(once_provider)
    assert len(messages) == TURNS
    for turn, received in enumerate(messages, 1):
        assert file_uris(received) == [uri_of(f) for f in files[:turn]]  # the same file for the same screenshot, from its first turn on
        assert inline_images(received) == 0
    # The provider counts what it would have counted inline: the same tokens, the same cache reads.
    usage = [(r["usage_input_tokens"], r["usage_cache_read_tokens"]) for r in once_records]
    assert usage == [(r["usage_input_tokens"], r["usage_cache_read_tokens"]) for r in inline_records]
    assert all(r["usage_cache_read_tokens"] for r in once_records[1:])
    assert [(r["by_reference"], r["uploaded"]) for r in once_records] == [(turn, 1) for turn in range(1, TURNS + 1)]
    # Bytes on the wire, uploads included: a fraction of the inline run's.
    sent = sum(r.wire_bytes for r in once_provider.received)
    assert sent < 0.5 * sum(r.wire_bytes for r in inline_provider.received)
    assert max(r.wire_bytes for r in messages) < len(b64(SCREENS[0])) / 4  # every turn: its text, and references
    log = once.log()
    assert GOOGLE_KEY not in log and b64(SCREENS[0])[:64] not in log and "Traceback" not in log


def test_a_gemini_file_deleted_at_the_provider_between_turns_is_answered_by_one_inline_resend(
    send_once_providers: tuple[FakeProvider, FakeProvider], send_once_proxies: tuple[Proxy, Proxy]
) -> None:
    once_provider, once = send_once_providers[0], send_once_proxies[0]
    screens = shots(3, seed=93, width=220, height=160)
    once_provider.clear()

    with once.expect_records(3) as records:
        answers = gemini_session(once.url, GOOGLE_KEY, screens, stream=True, between=deleting_before_turn_two(once_provider, GOOGLE_KEY, screens[0]))
    assert all(answers)
    assert [r["status"] for r in records] == [200, 200, 200]
    assert records[1]["references_refused"] == 1 and records[1]["by_reference"] == 0
    messages = turns(once_provider)
    assert len(messages) == 4  # turn 2 went twice: with its references (refused with a 403), then inline
    assert inline_images(messages[1]) == 0 and inline_images(messages[2]) == 2
    # Turn 3: the first screenshot's entry is gone, so it stays inline (as turn 2 finally sent it); the others by reference.
    assert inline_images(messages[3]) == 1 and len(file_uris(messages[3])) == 2
    assert "refused 1 file references; sent again inline" in once.log()


def test_two_gemini_keys_sending_the_same_screenshot_never_reference_each_others_files(
    send_once_providers: tuple[FakeProvider, FakeProvider], send_once_proxies: tuple[Proxy, Proxy]
) -> None:
    once_provider, once = send_once_providers[0], send_once_proxies[0]
    screen = shots(1, seed=79, width=220, height=160)
    once_provider.clear()
    with once.expect_records(4) as records:
        for key in (GOOGLE_KEY, OTHER_KEY, GOOGLE_KEY, OTHER_KEY):
            gemini_session(once.url, key, screen)
    own = {key: {uri_of(f) for f in once_provider.files.files(key) if f.data == screen[0]} for key in (GOOGLE_KEY, OTHER_KEY)}
    assert all(len(uris) == 1 for uris in own.values()) and not own[GOOGLE_KEY] & own[OTHER_KEY]
    for received in turns(once_provider):
        assert set(file_uris(received)) == own[owner_of(received.headers, received.query)]
    assert [(r["uploaded"], r["by_reference"], r["references_refused"]) for r in records] == [(1, 1, 0), (1, 1, 0), (0, 1, 0), (0, 1, 0)]
    assert len(upload_starts(once_provider)) == 2


def test_a_gemini_file_is_shared_for_less_than_the_48_hours_gemini_keeps_it_whatever_the_lifetime(tmp_path: Any) -> None:
    store = RedisServer(tmp_path)
    try:
        with FakeProvider() as provider:
            options = {
                "trimflow_send_once": "true",
                "trimflow_send_once_lifetime": "3d",  # longer than Gemini keeps a file
                "trimflow_conversations": "",
                "trimflow_state": store.url,
                "trimflow_state_deadline": "1",
                "trimflow_prometheus": "127.0.0.1:0",
            }
            proxy = Proxy(tmp_path / "proxy", "--mode", f"reverse:{provider.url}", rules=None, **options)
            start_all(proxy.mitm)
            try:
                proxy.wait_sharing()
                with proxy.expect_records(1) as records:
                    gemini_session(proxy.url, GOOGLE_KEY, shots(1, seed=97, width=220, height=160))
                assert records[0]["uploaded"] == 1
                with store.raw() as raw:
                    wait_for(lambda: len(raw.keys(b"trimflow:v1:file:*")) == 1, "the file in the store")
                    (key,) = raw.keys(b"trimflow:v1:file:*")
                    assert 46 * 3600 * 1000 < raw.pttl(key) <= (47 * 3600 - 600) * 1000
            finally:
                stop_all(proxy.mitm)
    finally:
        store.stop()
