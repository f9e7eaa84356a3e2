"""The engine end to end on request bytes: what every format carries after pruning and re-encoding, fidelity,
modes, the record, bad input, and what may run inline on the proxy's event loop."""

from __future__ import annotations

import copy
import json

import orjson
import pytest

from trimflow import _shrink, prune, prune_request
from trimflow._conversation import Conversations
from trimflow.formats import FORMATS
from trimflow.testing import b64, data_url, image, screenshot, session_body

from .helpers import encode, rules_with, url_for
from .images import FIVE_MB, anthropic, chat, chat_with_images, check_image, images_left, prune_with, reshuffled_chat, sent

SHOT = image(96, 64, "PNG", seed=3)
ALL_FORMATS = sorted(FORMATS)


def run(body: dict | bytes, wire_format: str = "openai-chat", **limits):
    raw = body if isinstance(body, bytes) else encode(body)
    return prune_request(url_for(wire_format), {}, raw, rules_with(**limits))


def test_nothing_to_prune_forwards_the_very_same_bytes() -> None:
    raw = json.dumps(chat_with_images(3), indent=2).encode()  # whitespace that a rewrite would lose
    outcome = run(raw, max_images=8, max_body_bytes=len(raw))
    assert outcome.body is raw
    assert not outcome.changed and outcome.record.pruned == 0


def test_text_only_follow_up_after_the_limit_was_exceeded() -> None:
    body = chat_with_images(12, text_last=True)
    outcome = run(body, max_images=10)
    assert outcome.record.images_after == 10
    assert orjson.loads(outcome.body)["messages"][-1] == {"role": "user", "content": "and now?"}


def test_an_image_only_message_keeps_a_placeholder_and_text_stays() -> None:
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(SHOT, "image/png")}}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": "keep me"}, {"type": "image_url", "image_url": {"url": data_url(SHOT, "image/png")}}],
            },
        ],
    }
    out = orjson.loads(run(body, max_images=0, keep_recent=0).body)
    first, second = out["messages"]
    assert len(first["content"]) == 1 and first["content"][0]["type"] == "text" and first["content"][0]["text"]
    assert second["content"][0] == {"type": "text", "text": "keep me"}


def test_images_only_in_tool_results_and_a_tool_image_before_the_newest_user_image() -> None:
    tool_shot, user_shot = data_url(image(30, 30, "PNG", seed=7), "image/png"), data_url(SHOT, "image/png")
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "tool", "tool_call_id": "a", "content": [{"type": "image_url", "image_url": {"url": tool_shot}}]},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": user_shot}}]},
        ],
    }
    assert images_left(run(body, max_images=1).body) == [user_shot]
    only_tool = {"model": "gpt-4o", "messages": body["messages"][:2]}
    assert images_left(run(only_tool, max_images=1).body) == [tool_shot]


def test_the_record_counts_images_by_where_they_came_from() -> None:
    """The user's mock-up, a tool's screenshot and the screen the agent attached after a call: each counted as received
    and as pruned."""
    shot = {"type": "image_url", "image_url": {"url": data_url(SHOT, "image/png")}}
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "build this"}, shot]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function", "function": {"name": "look", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": [shot]},
            {"role": "user", "content": [shot, shot]},
        ],
    }
    record = run(body, max_images=8, dedupe=True).record
    assert (record.images_user, record.images_tool, record.images_agent) == (1, 1, 2)
    assert (record.pruned_user, record.pruned_tool, record.pruned_agent) == (1, 1, 1)  # repeats of the newest
    assert record.pruned == record.deduplicated == 3


def test_image_only_in_the_first_message() -> None:
    body = chat_with_images(1)
    body["messages"] += [{"role": "user", "content": f"more {i}"} for i in range(5)]
    assert len(images_left(run(body, max_images=0, keep_recent=0).body)) == 0
    assert run(body, max_images=1).body == encode(body)


def test_documents_are_counted_but_never_pruned_by_an_image_limit() -> None:
    pdf = data_url(b"%PDF-1.7 " + b"x" * 100, "application/pdf")
    body = chat_with_images(3)
    body["messages"][0]["content"].append({"type": "file", "file": {"filename": "a.pdf", "file_data": pdf}})
    outcome = run(body, max_images=1)
    assert outcome.record.documents == 1
    assert pdf.encode() in outcome.body


def test_remote_images_count_and_are_pruned_with_no_media_bytes() -> None:
    body = {
        "model": "gpt-4o",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "https://example.invalid/1.png"}},
                    {"type": "image_url", "image_url": {"url": data_url(SHOT, "image/png")}},
                ],
            }
        ],
    }
    outcome = run(body, max_images=1)
    assert outcome.record.images_before == 2 and outcome.record.images_after == 1
    assert b"example.invalid" not in outcome.body
    assert outcome.record.media_bytes_before == outcome.record.media_bytes_after


def test_running_on_its_own_output_changes_nothing() -> None:
    first = run(chat_with_images(12), max_images=8, max_body_bytes=4000)
    second = run(first.body, max_images=8, max_body_bytes=4000)
    assert second.body is not None and second.body == first.body and second.record.pruned == 0


def test_placeholder_is_identical_on_every_later_turn() -> None:
    shot = screenshot(20)
    bodies = [encode(session_body("anthropic", turns, shot)) for turns in (9, 10, 11)]
    outs = [orjson.loads(run(raw, "anthropic", max_images=2, prune_batch=1).body) for raw in bodies]
    first_blocks = [out["messages"][0]["content"][0] for out in outs]
    assert first_blocks[0]["type"] == "text"
    assert first_blocks[0] == first_blocks[1] == first_blocks[2]
    text = first_blocks[0]["text"]
    assert "#1" in text and "image/webp" in text and "KB" in text and "x" in text


def test_placeholder_template_is_configurable() -> None:
    out = run(chat_with_images(2), max_images=1, placeholder="<{kind} {ordinal}: {mime} {width}x{height} {reason}>")
    assert b"<image 1: image/png 40x30 too many images>" in out.body


def test_anthropic_cache_control_survives_pruning() -> None:
    body = session_body("anthropic", 3, SHOT, "image/png")
    body["messages"][0]["content"][0]["cache_control"] = {"type": "ephemeral"}
    out = orjson.loads(run(body, "anthropic", max_images=1).body)
    assert out["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral"}


@pytest.mark.parametrize("wire_format", ALL_FORMATS)
def test_every_format_prunes_a_session_to_the_limit_and_keeps_the_rest(wire_format: str) -> None:
    body = session_body(wire_format, 6, SHOT, "image/png")
    pristine = copy.deepcopy(body)
    raw = encode(body)
    outcome = prune_request(url_for(wire_format), {}, raw, rules_with(max_images=2))
    assert body == pristine
    assert outcome.record.format == wire_format
    assert outcome.record.images_before == 6 and outcome.record.images_after == 2
    assert len(images_left(outcome.body, wire_format)) == 2
    assert outcome.record.body_bytes_after == len(outcome.body) < len(raw)
    for turn in range(1, 7):  # every turn's text survives
        assert f"Turn {turn}: here is my screen".encode() in outcome.body
    again = prune_request(url_for(wire_format), {}, outcome.body, rules_with(max_images=2))
    assert again.body == outcome.body


def test_a_24_turn_screenshot_session_of_16_mb_prunes_to_8() -> None:
    shot = screenshot(500, "WEBP")
    raw = encode(session_body("openai-chat", 24, shot))
    assert 14_000_000 < len(raw) < 19_000_000
    outcome = prune_request("https://api.example.test/v2/chat/completions", {}, raw, rules_with(max_images=8, max_body_bytes=16 * 2**20))
    assert outcome.record.images_before == 24 and outcome.record.images_after == 8
    assert images_left(outcome.body) == images_left(raw)[-8:]
    assert len(outcome.body) < 6_000_000


def test_sigv4_signed_bodies_are_measured_but_never_rewritten() -> None:
    raw = encode(session_body("bedrock-converse", 5, SHOT, "image/png"))
    headers = {"Authorization": "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261122/us-east-1/bedrock/aws4_request, Signature=abc"}
    url = "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse"
    outcome = prune_request(url, headers, raw, rules_with(max_images=1))
    assert outcome.body is raw and not outcome.changed
    assert outcome.record.mode == "observe" and "SigV4" in outcome.record.reason
    assert outcome.record.images_after == 1  # what enforce would have sent
    bearer = prune_request(url, {"Authorization": "Bearer bedrock-api-key"}, raw, rules_with(max_images=1))
    assert bearer.changed


def test_observe_mode_forwards_the_original_and_reports_what_enforce_would_send() -> None:
    raw = encode(chat_with_images(5))
    observed = prune_request(url_for("openai-chat"), {}, raw, rules_with(max_images=2), mode="observe")
    enforced = prune_request(url_for("openai-chat"), {}, raw, rules_with(max_images=2))
    assert observed.body is raw and not observed.changed
    assert observed.record.mode == "observe"
    assert observed.record.body_bytes_after == len(enforced.body)
    assert observed.record.images_after == enforced.record.images_after == 2


def test_values_orjson_refuses_fall_back_and_survive() -> None:
    body = chat_with_images(3)
    raw = encode(body)[:-1] + b',"seed":123456789012345678901234567890,"bias":NaN,"t":1.5e300,"s":"\\u00e9\\ud83d\\ude00"}'
    outcome = run(raw, max_images=1)
    assert outcome.changed
    tail = json.loads(outcome.body)
    assert tail["seed"] == 123456789012345678901234567890
    assert tail["bias"] != tail["bias"]  # NaN
    assert tail["t"] == 1.5e300 and tail["s"] == "é😀"
    assert b"123456789012345678901234567890" in outcome.body


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"model": "gpt-4o", "messages": [', "not JSON"),
        (b"[1, 2, 3]", "JSON array"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"", "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_bad_bodies_on_llm_paths_pass_untouched_with_a_reason(raw: bytes, reason: str) -> None:
    outcome = run(raw, max_images=1)
    assert outcome.body is raw
    assert reason in outcome.record.reason
    assert "gpt-4o" not in outcome.record.reason  # the reason never quotes the body


def test_non_llm_requests_get_no_record() -> None:
    raw = b'{"query": "hello"}'
    outcome = prune_request("https://example.test/search", {}, raw, rules_with(max_images=1))
    assert outcome.body is raw and outcome.record is None


def test_shape_detection_on_an_unknown_path() -> None:
    raw = encode(chat_with_images(3))
    outcome = prune_request("http://gateway.internal/proxy/llm", {}, raw, rules_with(max_images=1))
    assert outcome.record.format == "openai-chat" and outcome.record.images_after == 1


def test_responses_with_previous_response_id_says_history_is_at_the_provider() -> None:
    body = session_body("openai-responses", 2, SHOT, "image/png")
    body["previous_response_id"] = "resp_123"
    outcome = run(body, "openai-responses", max_images=8)
    assert outcome.record.server_side_history


def test_the_record_holds_no_body_text_and_no_base64() -> None:
    body = chat_with_images(4)
    body["messages"][0]["content"][0]["text"] = "SECRET PROMPT TEXT"
    record = run(body, max_images=1).record.to_json()
    assert b"SECRET" not in record and b64(SHOT)[:20].encode() not in record
    fields = orjson.loads(record)
    for name in (
        "ts",
        "conversation",
        "turn",
        "host",
        "path",
        "format",
        "model",
        "rule",
        "mode",
        "images_before",
        "images_after",
        "media_bytes_before",
        "media_bytes_after",
        "body_bytes_before",
        "body_bytes_after",
        "est_tokens_before",
        "est_tokens_after",
        "pruned",
        "status",
        "usage_input_tokens",
        "overhead_ms",
    ):
        assert name in fields
    assert fields["est_tokens_after"] < fields["est_tokens_before"]


def test_path_in_the_record_has_no_query_string() -> None:
    raw = encode(session_body("gemini", 2, SHOT, "image/png"))
    url = "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-pro:generateContent?key=AIzaSECRET"
    outcome = prune_request(url, {}, raw, rules_with())
    assert outcome.record.path == "/v1beta/models/gemini-2.5-pro:generateContent"
    assert b"AIza" not in outcome.record.to_json()


# --- re-encoded images ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("wire_format", ALL_FORMATS)
def test_every_format_carries_the_shrunk_bytes_with_their_new_type(wire_format: str, noisy_png: bytes) -> None:
    body = session_body(wire_format, 2, noisy_png, "image/png")
    pristine = copy.deepcopy(body)
    raw = encode(body)
    outcome = prune_request(url_for(wire_format), {}, raw, rules_with(max_image_bytes=300_000))
    assert body == pristine
    images = sent(wire_format, outcome.body)
    assert len(images) == 2 and outcome.record.shrunk == 2
    for media in images:
        assert check_image(wire_format, media, max_bytes=300_000).format == ("WEBP" if FORMATS[wire_format].ACCEPTS_WEBP else "JPEG")
    for turn in (1, 2):
        assert f"Turn {turn}: here is my screen".encode() in outcome.body
    again = prune_request(url_for(wire_format), {}, outcome.body, rules_with(max_image_bytes=300_000))
    assert again.body is outcome.body and again.record.shrunk == 0  # idempotent: the very same bytes


def test_observe_mode_reports_the_shrink_and_sends_the_original(noisy_png: bytes) -> None:
    raw = encode(anthropic((b64(noisy_png), "image/png")))
    outcome = prune_with("anthropic", raw, mode="observe", max_image_bytes=300_000)
    assert outcome.body is raw and not outcome.changed
    assert outcome.record.shrunk == 1 and outcome.record.body_bytes_after < len(raw)


def test_same_input_same_output_bytes_and_the_second_run_encodes_nothing(
    fresh_cache: _shrink.ShrinkCache, encodes: list[str], noisy_png: bytes, wide_2500: list[bytes]
) -> None:
    body = anthropic((b64(noisy_png), "image/png"), (b64(wide_2500[0]), "image/jpeg"), (b64(wide_2500[1]), "image/jpeg"))
    limits = {"max_image_bytes": 300_000, "max_image_side": 1000}
    first = prune_with("anthropic", body, **limits)
    work = len(encodes)
    assert first.record.shrunk == 3 and work >= 3 and fresh_cache.misses == 3
    second = prune_with("anthropic", body, **limits)
    assert second.body == first.body and len(encodes) == work and fresh_cache.hits == 3
    fresh_cache.clear()  # and without the cache: the encoders themselves are deterministic
    assert prune_with("anthropic", body, **limits).body == first.body


def test_a_declared_type_that_is_not_the_real_one_is_counted_and_left_alone() -> None:
    jpeg, png = image(30, 20, "JPEG", seed=1), image(30, 20, "PNG", seed=2)
    raw = encode(chat(data_url(jpeg, "image/png"), data_url(jpeg, "image/jpg"), data_url(png, "IMAGE/PNG")))
    outcome = prune_with("openai-chat", raw)
    assert outcome.body is raw and outcome.record.mime_mismatches == 1  # jpg is jpeg; case is ignored
    assert "1 mime mismatch" in outcome.record.log_line()
    anth = encode(anthropic((b64(png), "image/jpeg"), (b64(jpeg), "image/jpeg")))
    assert prune_with("anthropic", anth).record.mime_mismatches == 1


def test_the_record_reports_every_new_figure_and_no_base64(png_over_5mb: str, screens: list[bytes]) -> None:
    body = anthropic((png_over_5mb, "image/png"), (b64(screens[0]), "image/png"), (b64(screens[0]), "image/jpeg"))
    record = prune_with("anthropic", body, max_image_bytes=FIVE_MB, thumbnail_side=256, dedupe=True).record
    fields = orjson.loads(record.to_json())
    for name in (
        "shrunk",
        "shrunk_bytes_saved",
        "thinned",
        "thinned_bytes_saved",
        "deduplicated",
        "pruned_for_image_limit",
        "pruned_for_tokens",
        "mime_mismatches",
    ):
        assert name in fields
    # #2 repeats #3 and goes; #1 is old: thinned (which also meets the 5 MB limit); #3 is whole.
    assert (record.deduplicated, record.thinned, record.shrunk, record.mime_mismatches) == (1, 1, 0, 1)
    assert record.pruned == 1 and record.images_after == 2
    assert png_over_5mb[:40].encode() not in record.to_json()


def test_a_smaller_image_costs_fewer_estimated_tokens_by_the_providers_formula() -> None:
    big = data_url(image(1600, 1600, "PNG", seed=3, noise=0.0), "image/png")
    outcome = prune_with("openai-chat", chat(big), max_image_side=512, rescale_note=False)
    [media] = sent("openai-chat", outcome.body)
    assert check_image("openai-chat", media, max_side=512).size == (512, 512)
    record = outcome.record
    # gpt-4o tiles: 1600x1600 -> 768x768 -> 4 tiles = 765; 512x512 -> 1 tile = 255. Text unchanged (no note).
    assert record.est_tokens_before - record.est_tokens_after == 765 - 255
    assert record.shrunk == 1 and record.thinned == 0


# --- inline: what may run on the proxy's event loop ---------------------------------------------------------


def _comparable(outcome) -> tuple:
    record = outcome.record.to_dict()
    for volatile in ("ts", "overhead_ms"):
        record.pop(volatile)
    return outcome.body, record


def prune_inline(raw: bytes, rules):
    """As the proxy runs the engine: on the event loop, for a target it resolved."""
    return prune(rules.target_for_url(url_for("openai-chat")), {}, raw, rules, inline=True)


def test_inline_gives_what_a_worker_run_gives() -> None:
    raw = orjson.dumps(session_body("openai-chat", 12, screenshot(40, "PNG", seed=1), "image/png"))
    for limits in ({"max_images": 8}, {"max_images": 20}, {"max_images": 20, "max_body_bytes": len(raw) // 2}):
        inline = prune_inline(raw, rules_with(**limits))
        assert _comparable(inline) == _comparable(run(raw, **limits))


def test_inline_stops_before_slow_work_and_says_which(monkeypatch) -> None:
    from trimflow import NeedsWorker, _engine

    def inline(raw: bytes, **limits):
        return prune_inline(raw, rules_with(**limits))

    raw = orjson.dumps(session_body("openai-chat", 3, screenshot(40, "PNG", seed=2), "image/png"))
    with pytest.raises(NeedsWorker, match="image to re-encode"):
        inline(raw, max_image_side=64)  # a shrink: Pillow, 25-250 ms per megapixel
    monkeypatch.setattr(_engine, "INLINE_MAX_BODY", len(raw) - 1)
    with pytest.raises(NeedsWorker, match="a body over"):
        inline(raw)
    monkeypatch.setattr(_engine, "INLINE_MAX_BODY", len(raw))
    assert inline(raw).record.images_before == 3  # at the limit: inline
    text_heavy = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": f"line {i}"} for i in range(3000)]})
    monkeypatch.setattr(_engine, "INLINE_MAX_BODY", len(text_heavy))
    monkeypatch.setattr(_engine, "INLINE_MAX_WHOLE", len(text_heavy) - 1)
    with pytest.raises(NeedsWorker, match="full parse"):
        inline(text_heavy)  # no skeleton for a body of many short strings
    assert run(text_heavy).record.images_before == 0  # the worker's run parses it whole


def test_a_bad_escape_inside_an_image_that_is_read_forwards_the_body_with_the_reason() -> None:
    # The skeleton never parses a payload; a read that meets an escape decodes it, and a bad one says so.
    encoded = b64(screenshot(20, "PNG", seed=4))
    bad = encoded[:1000] + "\\q" + encoded[1000:]
    part = b'{"type":"image_url","image_url":{"url":"data:image/png;base64,' + bad.encode() + b'"}}'
    raw = b'{"model":"gpt-4o","messages":[{"role":"user","content":[' + part + b"]}]}"
    outcome = prune_inline(raw, rules_with(max_images=8))
    assert outcome.body is raw and not outcome.changed
    assert "not JSON" in outcome.record.reason


# --- with a memory: an image's age is when it first came in the conversation -----------------------------------


def _shot(n: int, fmt: str = "PNG") -> str:
    return data_url(image(64, 40, fmt, seed=n), MIME_OF[fmt])


MIME_OF = {"PNG": "image/png", "JPEG": "image/jpeg"}


def _reshuffled(turns: int, memory: Conversations | None, fmt: str = "PNG", **limits) -> list[tuple[list[str], list[str]]]:
    """An aider-like session, one image added a turn, all re-sent in a new order: per turn (the images the agent had
    added, oldest first; the images that went), each turn numbered in `memory` as the proxy numbers it."""
    rules, urls, turns_seen = rules_with(**limits), [], []
    for turn in range(1, turns + 1):
        urls.append(_shot(turn, fmt))
        raw = encode(reshuffled_chat(urls, turn))
        outcome = prune(rules.target_for_url(url_for("openai-chat")), {}, raw, rules, inline=True, memory=memory)
        if memory is not None:
            memory.assign(outcome.history, outcome.record.kind, outcome.cut)
        turns_seen.append((list(urls), [m.data for m in sent("openai-chat", outcome.body)]))
    return turns_seen


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_with_a_memory_the_newest_image_by_arrival_goes_and_one_once_cut_never_comes_back(fmt: str) -> None:
    cut: set[str] = set()
    for added, went in _reshuffled(12, Conversations(), fmt, max_images=8):
        assert len(went) == min(len(added), 8)
        assert added[-1] in went  # the one just added, byte for byte
        assert not cut & set(went)
        cut |= set(added) - set(went)
    assert len(cut) == 4
    # By position alone the same session loses the newest image or brings a cut one back (the test can fail).
    cut, lost = set(), 0
    for added, went in _reshuffled(12, None, fmt, max_images=8):
        lost += added[-1] not in went or bool(cut & set(went))
        cut |= set(added) - set(went)
    assert lost


def test_with_a_memory_batches_and_the_cache_aware_cut_follow_arrival_too() -> None:
    for limits in ({"max_images": 8, "prune_batch": 6}, {"max_images": 8, "low_water": 0.5}):
        cut: set[str] = set()
        for added, went in _reshuffled(14, Conversations(), **limits):
            assert added[-1] in went and not cut & set(went) and len(went) <= 8
            cut |= set(added) - set(went)


def test_an_image_cut_stays_cut_when_the_agent_sends_fewer_images() -> None:
    rules, memory = rules_with(max_images=8), Conversations()
    urls = [_shot(n) for n in range(10)]
    first = chat(*urls)
    outcome = prune(rules.target_for_url(url_for("openai-chat")), {}, encode(first), rules, inline=True, memory=memory)
    memory.assign(outcome.history, outcome.record.kind, outcome.cut)
    assert [m.data for m in sent("openai-chat", outcome.body)] == urls[2:]  # new to the memory: position decides
    # The next turn: the agent left out four images it still had (under the cap now) and asks again.
    fewer = chat(*urls[:3], *urls[7:])
    fewer["messages"].append({"role": "user", "content": "and now?"})
    outcome = prune(rules.target_for_url(url_for("openai-chat")), {}, encode(fewer), rules, inline=True, memory=memory)
    assert [m.data for m in sent("openai-chat", outcome.body)] == [urls[2], *urls[7:]]
    assert outcome.record.pruned == 2 and outcome.record.images_after == 4
    # Without a memory that request is under every limit: it goes as it came.
    assert not prune_request(url_for("openai-chat"), {}, encode(fewer), rules).changed


def test_copies_of_one_screenshot_keep_their_places() -> None:
    """The same screen sent every turn: a new copy is the newest, so the copies cut are the first ones."""
    shot, rules, memory = screenshot(10, "PNG"), rules_with(max_images=3), Conversations()
    for turn in range(1, 7):
        outcome = prune_request(url_for("openai-chat"), {}, encode(session_body("openai-chat", turn, shot, "image/png")), rules, memory=memory)
        memory.assign(outcome.history, outcome.record.kind, outcome.cut)
    messages = orjson.loads(outcome.body)["messages"]
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    with_image = [i for i in users if any(p.get("type") == "image_url" for p in messages[i]["content"])]
    assert len(users) == 6 and with_image == users[-3:]
