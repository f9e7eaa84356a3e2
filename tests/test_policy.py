"""The policy: each step's decisions on real requests and images (repeats, the count cap, per-image limits,
thinning, the body and token budgets), the fast path derived from the steps, and the limits' metadata.

A decision is checked on what the engine sends: every image that had to meet a limit is decoded with
Pillow and checked against it, and against the type its part declares.
"""

from __future__ import annotations

import io

import orjson
import pytest
from PIL import Image

from trimflow import NeedsWorker, _shrink, prune, prune_request
from trimflow._clicks import Screen, map_answer
from trimflow._conversation import Conversations
from trimflow._limits import Limits
from trimflow._policy import count_pruned, nothing_to_change, prune_to_budgets
from trimflow._rules import builtin_rules
from trimflow._tokens import anthropic_image_tokens, image_tokens, text_tokens
from trimflow.formats import FORMATS, IMAGE
from trimflow.testing import b64, data_url, image, screenshot, session_body

from .bombs import png_header
from .helpers import encode, rules_with, url_for
from .images import (
    FIVE_MB,
    anthropic,
    chat,
    chat_with_images,
    check_image,
    decoded,
    images_left,
    payload,
    prune_with,
    sent,
    texts,
)
from .shrink_bench import screenshot as rendered_screen

# --- the count cap --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("images", "max_images", "batch", "keep", "pruned"),
    [(8, 8, 1, 1, 0), (9, 8, 1, 1, 1), (9, 8, 6, 1, 6), (14, 8, 6, 1, 6), (15, 8, 6, 1, 12), (3, 0, 1, 1, 2), (3, 0, 1, 0, 3)],
)
def test_the_count_cap_cuts_in_whole_batches_and_keeps_the_newest(images, max_images, batch, keep, pruned) -> None:
    assert count_pruned(images, Limits(max_images=max_images, prune_batch=batch, keep_recent=keep)) == pruned


@pytest.mark.parametrize(
    ("count", "limit", "kept"),
    [(0, 10, 0), (9, 10, 9), (10, 10, 10), (11, 10, 10), (12, 10, 10), (15, 10, 10), (12, 8, 8)],
)
def test_count_limit_boundaries(count: int, limit: int, kept: int) -> None:
    body = chat_with_images(count)
    original = [m.data for m in FORMATS["openai-chat"].find_media(body)]
    outcome = prune_with("openai-chat", body, max_images=limit)
    assert images_left(outcome.body) == original[len(original) - kept :], "the newest images must be the ones kept"
    assert outcome.record.images_before == count and outcome.record.images_after == kept
    assert outcome.record.pruned == count - kept == outcome.record.pruned_for_count


def test_limit_zero_keeps_only_keep_recent() -> None:
    body = chat_with_images(4)
    assert len(images_left(prune_with("openai-chat", body, max_images=0, keep_recent=1).body)) == 1
    assert images_left(prune_with("openai-chat", body, max_images=0, keep_recent=0).body) == []


def test_keep_recent_wins_over_a_smaller_max_images() -> None:
    body = chat_with_images(5)
    newest = [m.data for m in FORMATS["openai-chat"].find_media(body)][-3:]
    assert images_left(prune_with("openai-chat", body, max_images=1, keep_recent=3).body) == newest


def test_the_current_message_alone_over_the_limit_keeps_its_newest() -> None:
    shots = [data_url(image(20 + i, 20, "PNG", seed=i), "image/png") for i in range(12)]
    body = {"model": "gemini-2.5-pro", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in shots]}]}
    assert images_left(prune_with("openai-chat", body, max_images=10).body) == shots[2:]


def test_batch_pruning_moves_the_cut_every_few_turns() -> None:
    shot = screenshot(10)

    def prefix_breaks(batch: int) -> int:
        """Turns whose body changes an earlier byte of the previous turn's messages."""
        breaks, previous = 0, None
        for turns in range(1, 31):
            out = orjson.loads(prune_with("openai-chat", session_body("openai-chat", turns, shot), max_images=8, prune_batch=batch).body)
            messages = [orjson.dumps(m) for m in out["messages"]]
            if previous is not None and messages[: len(previous)] != previous:
                breaks += 1
            previous = messages
        return breaks

    every_turn, batched = prefix_breaks(1), prefix_breaks(4)
    assert every_turn == 22  # turns 9..30 each move the cut
    assert batched == 6  # the cut moves on turns 9, 13, 17, 21, 25, 29


# --- the cache-aware cut: low_water and cache_ttl -----------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _drive(
    turns: int, gaps: dict[int, float] | None = None, fmt: str = "openai-chat", memory: bool = True, extra: dict | None = None, **limits
) -> list[dict]:
    """A session of `turns` turns through the engine as the proxy runs it (the conversations as memory, each turn
    numbered with its cut), 30 s apart but for `gaps` (turn -> seconds before it); `extra`: top-level fields of
    every body. One row per turn: what went."""
    shot, clock, rows, previous = screenshot(10), _Clock(), [], None
    conversations = Conversations(clock=clock)
    rules = rules_with(**limits)
    for turn in range(1, turns + 1):
        clock.now += (gaps or {}).get(turn, 30.0)
        body = encode({**session_body(fmt, turn, shot), **(extra or {})})
        outcome = prune_request(url_for(fmt), {}, body, rules, memory=conversations if memory else None)
        record = outcome.record
        assert record is not None
        if memory:
            conversations.assign(outcome.history, record.kind, outcome.cut)
        messages = [orjson.dumps(m) for m in orjson.loads(outcome.body)["messages"]]
        broke = previous is not None and messages[: len(previous)] != previous
        previous = messages
        causes = (record.pruned_for_count, record.pruned_for_body, record.pruned_for_tokens, record.pruned_for_cache)
        assert sum(causes) == record.pruned  # each pruned image has one cause
        rows.append({"sent": record.images_after, "broke": broke, "cache": record.pruned_for_cache, "count": record.pruned_for_count})
    return rows


def test_low_water_cuts_to_the_mark_and_holds_the_cut_until_the_cap_breaks_again() -> None:
    rows = _drive(30, max_images=8, low_water=0.5)
    assert [r["sent"] for r in rows] == [1, 2, 3, 4, 5, 6, 7, 8] + [4, 5, 6, 7, 8] * 4 + [4, 5]
    assert [turn for turn, r in enumerate(rows, 1) if r["broke"]] == [9, 14, 19, 24, 29]  # one break in five turns
    # Turn 9: one image for the cap, four more for the cache; turn 10 holds five, of which the cap needs two.
    assert (rows[8]["count"], rows[8]["cache"]) == (1, 4)
    assert (rows[9]["count"], rows[9]["cache"]) == (2, 3)


def test_low_water_moves_the_cut_as_often_as_rolling_would_without_a_memory() -> None:
    """Each request on its own (the command-line prune): cut to the mark whenever over the cap."""
    rows = _drive(12, memory=False, max_images=8, low_water=0.5)
    assert [r["sent"] for r in rows] == [1, 2, 3, 4, 5, 6, 7, 8, 4, 4, 4, 4]


def test_a_cold_cache_is_cut_to_the_mark_at_once_and_the_next_turns_hold_it() -> None:
    rows = _drive(16, gaps={12: 600.0}, max_images=8, low_water=0.5, cache_ttl=300)
    assert [r["sent"] for r in rows] == [1, 2, 3, 4, 5, 6, 7, 8, 4, 5, 6, 4, 5, 6, 7, 8]
    assert [turn for turn, r in enumerate(rows, 1) if r["broke"]] == [9, 12]
    warm = _drive(16, gaps={12: 200.0}, max_images=8, low_water=0.5, cache_ttl=300)
    assert [r["sent"] for r in warm][11] == 7  # within the TTL: the cut holds


@pytest.mark.parametrize(
    ("fmt", "extra", "lifetime"),
    [
        ("anthropic", {"cache_control": {"type": "ephemeral", "ttl": "1h"}}, 3600.0),
        ("openai-chat", {"prompt_cache_retention": "24h"}, 86400.0),
    ],
)
def test_a_request_asking_for_a_longer_cache_lifetime_is_cold_only_past_it(fmt: str, extra: dict, lifetime: float) -> None:
    limits = {"max_images": 8, "low_water": 0.5, "cache_ttl": 300}
    warm = _drive(12, gaps={12: lifetime - 60}, fmt=fmt, extra=extra, **limits)
    assert warm[11]["sent"] == 7  # past the rules' 5 minutes, within the lifetime asked for: the cut holds
    cold = _drive(12, gaps={12: lifetime + 60}, fmt=fmt, extra=extra, **limits)
    assert cold[11]["sent"] == 4 and cold[11]["cache"] == 4  # past it: cut to the mark, 4 of the 8 for the cache


def test_a_cold_cache_under_the_mark_changes_nothing() -> None:
    rows = _drive(4, gaps={3: 3600.0}, max_images=8, low_water=0.5, cache_ttl=300)
    assert [r["sent"] for r in rows] == [1, 2, 3, 4] and not any(r["broke"] for r in rows)


def test_a_conversation_within_its_cap_is_never_cut_even_when_its_cache_went_cold() -> None:
    rows = _drive(8, gaps={6: 3600.0}, max_images=8, low_water=0.4, cache_ttl=300, max_images_after_overflow=5)
    assert [r["sent"] for r in rows] == [1, 2, 3, 4, 5, 6, 7, 8] and not any(r["broke"] for r in rows)


def test_after_its_first_overflow_a_conversation_holds_at_most_max_images_after_overflow() -> None:
    rows = _drive(20, max_images=8, low_water=0.4, max_images_after_overflow=5)
    assert [r["sent"] for r in rows] == [1, 2, 3, 4, 5, 6, 7, 8] + [3, 4, 5] * 4
    assert [turn for turn, r in enumerate(rows, 1) if r["broke"]] == [9, 12, 15, 18]
    # Turn 9: one image for the cap of 8, five more for the cache; turn 12: four for the cap, five for the cache.
    assert (rows[8]["count"], rows[8]["cache"]) == (1, 5)
    assert (rows[11]["count"], rows[11]["cache"]) == (4, 5)


def test_without_a_memory_a_request_over_the_cap_is_past_the_first_overflow() -> None:
    rows = _drive(12, memory=False, max_images=8, low_water=0.4, max_images_after_overflow=5)
    assert [r["sent"] for r in rows] == [1, 2, 3, 4, 5, 6, 7, 8, 3, 3, 3, 3]
    batches = _drive(14, memory=False, max_images=8, prune_batch=3, max_images_after_overflow=5)
    assert [r["sent"] for r in batches] == [1, 2, 3, 4, 5, 6, 7, 8, 3, 4, 5, 3, 4, 5]


def test_the_held_cut_never_takes_the_newest_images() -> None:
    """A conversation whose next turn sends fewer new images than the held cut covers still keeps keep_recent."""
    rows = _drive(12, max_images=2, keep_recent=2, low_water=0.5)
    assert all(r["sent"] >= 2 for r in rows[1:])


def test_low_water_holds_a_body_budget_cut_too() -> None:
    shot = screenshot(10)
    sizes = [len(encode(session_body("openai-chat", n, shot))) for n in range(1, 21)]
    rows = _drive(20, max_images=None, max_body_bytes=sizes[9], low_water=0.5)
    assert all(r["sent"] <= 10 for r in rows)
    breaks = [turn for turn, r in enumerate(rows, 1) if r["broke"]]
    assert breaks and breaks[0] == 11 and len(breaks) <= 3  # rolling would move the cut on every turn from 11 on
    rolling = _drive(20, max_images=None, max_body_bytes=sizes[9])
    assert sum(r["broke"] for r in rolling) == 10


def test_a_new_conversation_starts_with_no_held_cut() -> None:
    shot, conversations, rules = screenshot(10), Conversations(), rules_with(max_images=8, low_water=0.5)
    for turns in (12, 3):  # a long session, then the same one run again: a shorter history continues nothing
        body = encode(session_body("openai-chat", turns, shot))
        outcome = prune_request(url_for("openai-chat"), {}, body, rules, memory=conversations)
        conversations.assign(outcome.history, "turn", outcome.cut)
    assert outcome.record is not None and outcome.record.images_after == 3 and not outcome.cut


# --- repeats --------------------------------------------------------------------------------------------------


def test_repeats_point_at_the_next_copy_and_count_as_pruned() -> None:
    a, b, c = (data_url(image(30 + i, 20, "PNG", seed=i), "image/png") for i in range(3))
    outcome = prune_with("openai-chat", chat(a, b, a, c, a), dedupe=True)
    assert [m.data for m in sent("openai-chat", outcome.body)] == [b, c, a]
    assert "[trimflow: image #1 repeated as image #3]" in texts(outcome.body)
    assert "[trimflow: image #3 repeated as image #5]" in texts(outcome.body)
    record = outcome.record
    assert record.deduplicated == record.pruned == 2 and record.images_after == 3
    assert "2 repeated" in record.log_line()


def test_repeats_are_off_by_default() -> None:
    a = data_url(image(30, 20, "PNG", seed=1), "image/png")
    raw = encode(chat(a, a))
    assert prune_with("openai-chat", raw).body is raw


def test_a_repeat_text_stays_the_same_on_later_turns() -> None:
    a, b = (data_url(image(30 + i, 20, "PNG", seed=i), "image/png") for i in range(2))
    turn3 = texts(prune_with("openai-chat", chat(a, b, a), dedupe=True).body)
    turn4 = texts(prune_with("openai-chat", chat(a, b, a, a), dedupe=True).body)
    assert turn3[1] == turn4[1] == "[trimflow: image #1 repeated as image #3]"


def test_repeat_placeholder_is_configurable() -> None:
    a = data_url(image(30, 20, "PNG", seed=1), "image/png")
    outcome = prune_with("openai-chat", chat(a, a), dedupe=True, repeat_placeholder="<{kind} {ordinal} = {later}, {dims}>")
    assert "<image 1 = 2, 30x20>" in texts(outcome.body)


def test_the_same_bytes_behind_different_declared_types_are_a_repeat() -> None:
    raw_png = image(30, 20, "PNG", seed=1)
    outcome = prune_with("openai-chat", chat(data_url(raw_png, "image/png"), data_url(raw_png, "image/jpeg")), dedupe=True)
    assert outcome.record.deduplicated == 1 and outcome.record.mime_mismatches == 1


def test_repeats_go_before_the_count_cap() -> None:
    a, b, c = (data_url(image(30 + i, 20, "PNG", seed=i), "image/png") for i in range(3))
    with_dedupe = prune_with("openai-chat", chat(a, b, a, c), dedupe=True, max_images=2)
    assert [m.data for m in sent("openai-chat", with_dedupe.body)] == [a, c]
    assert (with_dedupe.record.deduplicated, with_dedupe.record.pruned_for_count) == (1, 1)
    without = prune_with("openai-chat", chat(a, b, a, c), max_images=2)
    assert [m.data for m in sent("openai-chat", without.body)] == [a, c]
    assert (without.record.deduplicated, without.record.pruned_for_count) == (0, 2)


def test_repeats_in_ollama_and_gemini() -> None:
    shot = image(30, 20, "PNG", seed=1)
    for fmt in ("ollama", "gemini"):
        outcome = prune_with(fmt, session_body(fmt, 3, shot, "image/png"), dedupe=True)
        assert outcome.record.deduplicated == 2 and len(sent(fmt, outcome.body)) == 1
        assert b"repeated as image #2" in outcome.body and b"repeated as image #3" in outcome.body


# --- per-image limits -----------------------------------------------------------------------------------------


# The ladder for a limit alone: these run with `native_size` off (the size the model sees is tested below it).


def test_an_image_over_5mb_is_shrunk_under_it(png_over_5mb: str) -> None:
    body = anthropic((png_over_5mb, "image/png"))
    raw = encode(body)
    outcome = prune_with("anthropic", raw, max_image_bytes=FIVE_MB, native_size=False)
    [media] = sent("anthropic", outcome.body)
    im = check_image("anthropic", media, max_bytes=FIVE_MB)
    assert im.format == "WEBP" and im.size == (1600, 1000)  # Claude takes WebP: kept at its size
    record = outcome.record
    assert outcome.changed and record.shrunk == 1 and record.pruned == 0 and record.images_after == 1
    assert record.shrunk_bytes_saved == len(png_over_5mb) - len(payload(media)) > 0
    assert record.media_bytes_after == len(payload(media)) and record.body_bytes_after == len(outcome.body)
    assert record.est_tokens_after == record.est_tokens_before  # same size: Claude counts the same


def test_a_side_over_8000_px_is_scaled_to_8000_and_stays_png() -> None:
    wide = b64(image(9000, 300, "PNG", seed=12, noise=0.0))
    outcome = prune_with("anthropic", anthropic((wide, "image/png")), max_image_side=8000, native_size=False)
    [media] = sent("anthropic", outcome.body)
    im = check_image("anthropic", media, max_side=8000)
    assert im.format == "PNG" and im.size == (8000, 267)
    assert outcome.record.shrunk == 1


def test_many_images_over_the_threshold_get_no_side_over_2000(wide_2500: list[bytes]) -> None:
    limits = {"max_image_side": 8000, "many_images_threshold": 20, "many_images_max_side": 2000, "native_size": False}
    body = anthropic(*((b64(shot), "image/jpeg") for shot in wide_2500))
    outcome = prune_with("anthropic", body, **limits)
    images = sent("anthropic", outcome.body)
    assert len(images) == 25 and outcome.record.shrunk == 25
    for media, original in zip(images, wide_2500, strict=True):
        im = check_image("anthropic", media, max_side=2000)
        assert im.format == "JPEG" and im.size[0] == 2000
        assert abs(im.size[1] - Image.open(io.BytesIO(original)).size[1] * 0.8) <= 1
    # Its output is within the rule it met: a second pass changes nothing.
    assert prune_with("anthropic", outcome.body, **limits).body is outcome.body


def test_the_many_image_rule_needs_more_than_the_threshold(wide_2500: list[bytes]) -> None:
    limits = {"many_images_threshold": 20, "many_images_max_side": 2000, "native_size": False}
    raw = encode(anthropic(*((b64(shot), "image/jpeg") for shot in wide_2500[:20])))
    outcome = prune_with("anthropic", raw, **limits)
    assert outcome.body is raw and outcome.record.shrunk == 0


def test_the_many_image_rule_counts_after_the_count_cap(wide_2500: list[bytes]) -> None:
    body = anthropic(*((b64(shot), "image/jpeg") for shot in wide_2500))
    outcome = prune_with("anthropic", body, max_images=20, many_images_threshold=20, many_images_max_side=2000, native_size=False)
    images = sent("anthropic", outcome.body)
    assert len(images) == 20 and outcome.record.shrunk == 0 and outcome.record.pruned_for_count == 5
    assert [payload(m) for m in images] == [b64(shot) for shot in wide_2500[5:]]  # sent as they came


def test_images_within_every_limit_are_never_decoded(monkeypatch: pytest.MonkeyPatch, screens: list[bytes]) -> None:
    calls = []
    monkeypatch.setattr(_shrink, "shrink", lambda *a, **k: calls.append(1))
    body = anthropic(*((b64(s), "image/png") for s in screens[:4]))
    body["messages"][0]["content"].append({"type": "image", "source": {"type": "url", "url": "https://example.invalid/a.png"}})
    raw = encode(body)
    limits = {"max_image_bytes": FIVE_MB, "max_image_side": 8000, "many_images_threshold": 3, "many_images_max_side": 2000}
    outcome = prune_with("anthropic", raw, **limits)
    assert calls == [] and outcome.body is raw and not outcome.changed
    assert outcome.record.shrunk == outcome.record.pruned == 0


def test_an_image_that_cannot_be_decoded_is_dropped_with_the_reason() -> None:
    junk = b64(bytes(range(256)) * 12)  # 3 KB of something that is no image
    ok = b64(image(40, 30, "PNG", seed=1, noise=0.0))
    body = anthropic((junk, "image/png"), (ok, "image/png"))
    outcome = prune_with("anthropic", body, max_image_bytes=2048, placeholder="[{kind} #{ordinal}: {reason}]")
    assert "[image #1: over 2KB, could not be decoded]" in texts(outcome.body)
    assert [payload(m) for m in sent("anthropic", outcome.body)] == [ok]
    record = outcome.record
    assert record.pruned == record.pruned_for_image_limit == 1 and record.images_after == 1


def test_a_pixel_bomb_is_dropped_unopened_even_when_it_is_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_shrink.Image, "open", lambda *a, **k: pytest.fail("a bomb must not be opened"))
    body = anthropic((b64(png_header(20_000, 20_000)), "image/png"))
    outcome = prune_with("anthropic", body, max_image_side=8000, keep_recent=1, placeholder="[{dims}: {reason}]")
    [text] = [t for t in texts(outcome.body) if t.startswith("[")]
    assert text == "[20000x20000: over 8000px, 20000x20000 is over the 100-megapixel decoding limit]"
    assert outcome.record.images_after == 0 and outcome.record.pruned_for_image_limit == 1


# --- the size the model sees (native_size) ------------------------------------------------------------------


def native_request(fmt: str, model: str, shot: bytes, detail: str | None = None) -> bytes:
    """One user turn with `shot` as a PNG, to `model`; OpenAI's `detail` set when given."""
    body = session_body(fmt, 1, shot, "image/png", model=model)
    if detail is not None:
        for media in FORMATS[fmt].find_media(body):
            part = body
            for key in media.path:
                part = part[key]
            (part["image_url"] if fmt == "openai-chat" else part)["detail"] = detail
    return encode(body)


def lanczos(png: bytes, size: tuple[int, int]) -> bytes:
    """The pixels of `png` scaled to `size` as _shrink scales them."""
    return Image.open(io.BytesIO(png)).convert("RGB").resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0).tobytes()


@pytest.mark.parametrize(
    ("fmt", "model", "detail", "mime", "size"),
    [
        ("anthropic", "claude-sonnet-4-5", None, "image/webp", (1389, 868)),  # long edge 1568, 1568 patches of 28 px
        ("openai-responses", "gpt-4.1-mini", None, "image/webp", (1536, 960)),  # 1536 patches of 32 px
        ("openai-responses", "gpt-4.1", "high", "image/webp", (1229, 768)),  # tiles: 2048 box, short side 768
        ("openai-chat", "gpt-4o", "auto", "image/png", (1229, 768)),  # the chat format also fronts runtimes without WebP
        ("openai-chat", "gpt-4o", "low", "image/png", (512, 320)),
    ],
)
def test_an_image_larger_than_its_model_sees_goes_at_that_size_losslessly(
    retina_desktop: bytes, fmt: str, model: str, detail: str | None, mime: str, size: tuple[int, int]
) -> None:
    raw = native_request(fmt, model, retina_desktop, detail)
    outcome = prune_request(url_for(fmt), {}, raw, rules_with())
    [media] = sent(fmt, outcome.body)
    im = decoded(media)
    assert (Image.MIME[im.format], im.size) == (mime, size) and im.convert("RGB").tobytes() == lanczos(retina_desktop, size)
    record = outcome.record
    assert outcome.changed and (record.native_sized, record.shrunk, record.images_rescaled, record.pruned) == (1, 0, 1, 0)
    assert record.native_bytes_saved == record.media_bytes_before - record.media_bytes_after > 0
    assert record.media_bytes_after == len(media.data)
    assert image_tokens(fmt, model, *size, detail) == image_tokens(fmt, model, 2880, 1800, detail)
    assert b"[trimflow:" not in outcome.body  # no note: the model sees what it would have seen of the original
    # What went out is within the size the model sees: a second pass changes nothing.
    assert prune_request(url_for(fmt), {}, outcome.body, rules_with()).body is outcome.body


def test_an_image_that_goes_up_once_is_encoded_for_its_one_upload(retina_desktop: bytes, fresh_cache: _shrink.ShrinkCache) -> None:
    # With send_once an image's bytes go up once and its encoding delays the turn that brings it: the same pixels at the
    # least effort where that costs most (photo-like pixels), the usual effort where it is cheap (a flat screen).
    flat = rendered_screen("ui", scale=2).png()  # a light app window at 2880x1800
    for shot, same_bytes in ((retina_desktop, False), (flat, True)):
        raw = native_request("anthropic", "claude-sonnet-4-5", shot)
        [inline] = sent("anthropic", prune_request(url_for("anthropic"), {}, raw, rules_with()).body)
        [once] = sent("anthropic", prune_request(url_for("anthropic"), {}, raw, rules_with(send_once=True)).body)
        assert decoded(once).size == decoded(inline).size == (1389, 868)
        assert decoded(once).convert("RGB").tobytes() == decoded(inline).convert("RGB").tobytes()  # lossless either way
        assert (once.data == inline.data) is same_bytes
        # Where the route has no Files API (Vertex), the image goes inline on every turn: the usual effort.
        vertex = "https://aiplatform.googleapis.com/v1/projects/p/locations/l/publishers/anthropic/models/claude-sonnet-4-5:rawPredict"
        [routed] = sent("anthropic", prune_request(vertex, {}, raw, rules_with(send_once=True)).body)
        assert routed.data == inline.data


def test_native_size_false_sends_the_image_as_it_came(retina_desktop: bytes) -> None:
    raw = native_request("anthropic", "claude-sonnet-4-5", retina_desktop)
    for limits in ({}, {"max_image_bytes": FIVE_MB, "max_image_side": 8000}):  # within Claude's limits, which are checked
        outcome = prune_request(url_for("anthropic"), {}, raw, rules_with(native_size=False, **limits))
        assert outcome.body is raw and outcome.record.native_sized == 0


@pytest.mark.parametrize(
    ("fmt", "model", "detail"),
    [
        ("gemini", "gemini-2.5-pro", None),  # Gemini counts tiles of crops: no documented resize
        ("openai-responses", "gpt-5.4", None),  # later GPT-5 releases see larger images than the guide's tiles
        ("openai-chat", "gpt-4o", "original"),  # a detail the formulas do not know
        ("openai-chat", "qwen2.5-vl-72b", None),  # a model the tables do not name
        ("anthropic", "glm-4.6", None),  # another provider behind the Messages API
        ("ollama", "llava:13b", None),
    ],
)
def test_where_the_resize_is_not_documented_nothing_changes(
    monkeypatch: pytest.MonkeyPatch, retina_desktop: bytes, fmt: str, model: str, detail: str | None
) -> None:
    monkeypatch.setattr(_shrink, "shrink", lambda *a, **k: pytest.fail("nothing to shrink"))
    raw = native_request(fmt, model, retina_desktop, detail)
    assert prune_request(url_for(fmt), {}, raw, rules_with()).body is raw


def test_never_more_bytes_than_the_image_came_with(fresh_cache: _shrink.ShrinkCache) -> None:
    # A photo as JPEG: lossless at Claude's size it is larger than the JPEG, so the JPEG goes as it came.
    photo = image(2400, 1600, "JPEG", seed=4, noise=0.4)
    raw = native_request("anthropic", "claude-sonnet-4-5", photo)
    first = prune_request(url_for("anthropic"), {}, raw, rules_with())
    assert first.body is raw and first.record.native_sized == 0
    # Worked out once per process: the next turn is a cache hit.
    assert prune_request(url_for("anthropic"), {}, raw, rules_with()).body is raw
    assert (fresh_cache.misses, fresh_cache.hits) == (1, 1)


def test_an_image_over_a_limit_goes_at_the_size_the_model_sees_when_that_is_smaller(retina_desktop: bytes) -> None:
    # The many-image rule asks for 2000 px; Claude sees 1389x868 anyway: that is what goes, and it counts as shrunk.
    raw = native_request("anthropic", "claude-sonnet-4-5", retina_desktop)
    outcome = prune_request(url_for("anthropic"), {}, raw, rules_with(max_image_side=2000))
    [media] = sent("anthropic", outcome.body)
    assert decoded(media).size == (1389, 868) and b"[trimflow:" not in outcome.body
    assert (outcome.record.shrunk, outcome.record.native_sized) == (1, 0)
    # A smaller limit wins: a 1000 px side is below what Claude sees, and the model is told.
    smaller = prune_request(url_for("anthropic"), {}, raw, rules_with(max_image_side=1000))
    [media] = sent("anthropic", smaller.body)
    assert decoded(media).size == (1000, 625) and b"was resized from 2880x1800 to 1000x625" in smaller.body


def computer_use(fmt: str, shot: bytes, model: str) -> bytes:
    """A computer-use turn whose newest image is `shot`: Anthropic's computer tool, or OpenAI's computer_screenshot."""
    if fmt == "anthropic":
        body = orjson.loads(native_request(fmt, model, shot))
        body["tools"] = [{"type": "computer_20250124", "name": "computer", "display_width_px": 2880, "display_height_px": 1800}]
        return encode(body)
    output = {"type": "computer_screenshot", "image_url": data_url(shot, "image/png")}
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Press the button."}]},
        {"type": "computer_call_output", "call_id": "c1", "output": output},
    ]
    tools = [{"type": "computer_use_preview", "display_width": 2880, "display_height": 1800, "environment": "mac"}]
    return encode({"model": model, "tools": tools, "input": items})


def test_a_claude_screenshot_at_its_native_size_needs_no_note_and_no_click_mapping(retina_desktop: bytes) -> None:
    outcome = prune_request(url_for("anthropic"), {}, computer_use("anthropic", retina_desktop, "claude-sonnet-4-5"), rules_with())
    assert outcome.record.native_sized == 1 and outcome.screen is None and b"[trimflow:" not in outcome.body
    # The control: shrunk to a limit below what Claude sees, the same screenshot gets the note and a mapping.
    limited = prune_request(url_for("anthropic"), {}, computer_use("anthropic", retina_desktop, "claude-sonnet-4-5"), rules_with(max_image_side=1000))
    assert limited.screen is not None and b"answer coordinates in this image's pixels" in limited.body


def test_an_openai_screenshot_at_its_native_size_has_its_clicks_mapped_back(retina_desktop: bytes) -> None:
    outcome = prune_request(url_for("openai-responses"), {}, computer_use("openai-responses", retina_desktop, "computer-use-preview"), rules_with())
    assert outcome.record.native_sized == 1 and outcome.screen == Screen("openai-responses", None, (1229, 768), (2880, 1800))
    answer = {"output": [{"type": "computer_call", "call_id": "c2", "action": {"type": "click", "x": 614, "y": 384}}]}
    mapped, calls = map_answer(outcome.screen, orjson.dumps(answer))
    assert calls == 1 and orjson.loads(mapped)["output"][0]["action"] == {"type": "click", "x": 1439, "y": 900}


# --- thinning -------------------------------------------------------------------------------------------------


def test_older_images_become_thumbnails_and_the_newest_stays_whole(fresh_cache: _shrink.ShrinkCache, screens: list[bytes]) -> None:
    shots = [b64(s) for s in screens[:6]]
    body = anthropic(*((s, "image/png") for s in shots))
    outcome = prune_with("anthropic", body, thumbnail_side=256, keep_recent=1)
    images = sent("anthropic", outcome.body)
    assert len(images) == 6 and payload(images[-1]) == shots[-1]
    for media in images[:-1]:
        im = check_image("anthropic", media, max_side=256)
        assert im.format == "PNG" and im.size == (256, 160)
    record = outcome.record
    assert record.thinned == 5 and record.shrunk == 0 and record.pruned == 0
    assert record.thinned_bytes_saved == sum(len(s) for s in shots[:-1]) - sum(len(payload(m)) for m in images[:-1])
    # Tokens move exactly by the image formula: 5 x (1280x800 -> 256x160) on Claude.
    saved = 5 * (anthropic_image_tokens(1280, 800) - anthropic_image_tokens(256, 160))
    assert record.est_tokens_before - record.est_tokens_after == saved
    assert record.est_tokens_after == text_tokens(len(outcome.body) - record.media_bytes_after) + 5 * 60 + anthropic_image_tokens(1280, 800)
    assert "(5 thinned)" in record.log_line()


def test_thumbnails_are_byte_identical_on_the_next_turn_and_come_from_the_cache(
    fresh_cache: _shrink.ShrinkCache, encodes: list[str], screens: list[bytes]
) -> None:
    shots = [(b64(s), "image/png") for s in screens]
    turn6 = prune_with("anthropic", anthropic(*shots[:6]), thumbnail_side=256)
    encoded = len(encodes)
    turn7 = prune_with("anthropic", anthropic(*shots[:7]), thumbnail_side=256)
    assert len(encodes) == encoded + 1  # only the image that just became old
    assert fresh_cache.hits == 5
    old = [payload(m) for m in sent("anthropic", turn6.body)[:5]]
    assert [payload(m) for m in sent("anthropic", turn7.body)[:5]] == old
    assert prune_with("anthropic", turn7.body, thumbnail_side=256).body is turn7.body  # idempotent


def test_thumbnails_before_budgets_mean_fewer_images_dropped(screens: list[bytes]) -> None:
    body = anthropic(*((b64(s), "image/png") for s in screens[:6]))
    budget = len(b64(screens[5])) + 5 * 60_000  # the newest whole, five thumbnails of well under 60 KB
    dropped = prune_with("anthropic", body, max_body_bytes=budget)
    thinned = prune_with("anthropic", body, max_body_bytes=budget, thumbnail_side=256)
    assert dropped.record.pruned >= 4
    assert thinned.record.pruned == 0 and thinned.record.thinned == 5 and len(thinned.body) <= budget


def test_thinning_respects_the_count_cap_and_keep_recent(screens: list[bytes]) -> None:
    shots = [b64(s) for s in screens[:6]]
    outcome = prune_with("anthropic", anthropic(*((s, "image/png") for s in shots)), max_images=4, keep_recent=2, thumbnail_side=256)
    images = sent("anthropic", outcome.body)
    assert len(images) == 4 and outcome.record.pruned_for_count == 2 and outcome.record.thinned == 2
    assert [payload(m) for m in images[2:]] == shots[4:]  # the newest two whole
    assert all(max(decoded(m).size) == 256 for m in images[:2])


def test_an_image_already_small_is_not_thinned(screens: list[bytes]) -> None:
    small = b64(image(200, 120, "PNG", seed=5))
    raw = encode(anthropic((small, "image/png"), (b64(screens[0]), "image/png")))
    outcome = prune_with("anthropic", raw, thumbnail_side=256)
    assert outcome.body is raw and outcome.record.thinned == 0


def test_a_thumbnail_that_cannot_be_made_leaves_the_image_as_it_was(screens: list[bytes]) -> None:
    bomb = b64(png_header(20_000, 20_000))
    raw = encode(anthropic((bomb, "image/png"), (b64(screens[0]), "image/png")))
    outcome = prune_with("anthropic", raw, thumbnail_side=256)  # no per-image limit requires anything
    assert outcome.body is raw and outcome.record.pruned == 0


# --- the body and token budgets -------------------------------------------------------------------------------


def test_budgets_prune_oldest_first_and_name_the_first_budget_over() -> None:
    body = lambda k: 1500 - 200 * k  # noqa: E731 - over 1000 until 3 pruned
    tokens = lambda k: 900 - 100 * k  # noqa: E731 - over 500 until 4 pruned
    assert prune_to_budgets(8, [(1000, body), (500, tokens)]) == ([0, 0, 0, 1], False)
    assert prune_to_budgets(8, [(1000, body), (None, tokens)]) == ([0, 0, 0], False)  # no limit: not applied
    assert prune_to_budgets(2, [(1000, body), (500, tokens)]) == ([0, 0], True)  # only 2 prunable: still over


def test_body_budget_boundary_exactly_at_the_limit_is_fine() -> None:
    raw = encode(chat_with_images(4))
    assert prune_with("openai-chat", raw, max_body_bytes=len(raw)).body is raw
    over = prune_with("openai-chat", raw, max_body_bytes=len(raw) - 1)
    assert over.record.pruned == 1 and over.record.pruned_for_body == 1
    assert len(over.body) <= len(raw) - 1


def test_body_budget_prunes_oldest_survivors_to_the_exact_size() -> None:
    body = chat_with_images(6)
    sizes = []
    for k in range(6):
        sizes.append(len(prune_with("openai-chat", body, max_images=6 - k, keep_recent=0).body))
    # With the budget at exactly the size of "oldest k pruned", exactly k are pruned.
    for k in range(1, 6):
        outcome = prune_with("openai-chat", body, max_body_bytes=sizes[k], keep_recent=0)
        assert outcome.record.pruned == k, (k, sizes)
        assert len(outcome.body) == sizes[k] and not outcome.record.over_budget


def test_body_budget_never_prunes_keep_recent_and_says_when_unmet() -> None:
    body = chat_with_images(3)
    outcome = prune_with("openai-chat", body, max_body_bytes=100, keep_recent=1)
    assert outcome.record.images_after == 1 and outcome.record.over_budget
    assert len(images_left(outcome.body)) == 1
    assert "OVER BUDGET" in outcome.record.log_line()


def test_the_token_budget_prunes_the_oldest_until_the_estimate_fits() -> None:
    urls = [data_url(image(512, 512, "PNG", seed=i, noise=0.0), "image/png") for i in range(6)]
    body = chat(*urls)
    full = prune_with("openai-chat", body).record.est_tokens_after
    assert image_tokens("openai-chat", "gpt-4o", 512, 512) == 255
    outcome = prune_with("openai-chat", body, max_est_tokens=full - 2 * 255 - 1)  # room for three images fewer, minus one token
    record = outcome.record
    assert record.pruned == record.pruned_for_tokens == 3 and record.pruned_for_body == 0
    assert record.est_tokens_after <= full - 2 * 255 - 1 and not record.over_budget
    assert [m.data for m in sent("openai-chat", outcome.body)] == urls[3:]
    assert "[trimflow: image #1 omitted" in texts(outcome.body)[1]


def test_the_token_budget_never_prunes_keep_recent_and_says_when_unmet() -> None:
    body = chat(*(data_url(image(512, 512, "PNG", seed=i, noise=0.0), "image/png") for i in range(4)))
    outcome = prune_with("openai-chat", body, max_est_tokens=10, keep_recent=2)
    assert outcome.record.images_after == 2 and outcome.record.over_budget and outcome.record.pruned_for_tokens == 2
    assert "OVER BUDGET" in outcome.record.log_line()


def test_body_and_token_budgets_each_take_their_share() -> None:
    urls = [data_url(image(512, 512, "PNG", seed=i, noise=0.3), "image/png") for i in range(5)]
    raw = encode(chat(*urls))
    by_body = prune_with("openai-chat", raw, max_images=None, keep_recent=0, max_body_bytes=len(raw) - 1)
    assert by_body.record.pruned_for_body == 1
    est = by_body.record.est_tokens_after
    both = prune_with("openai-chat", raw, keep_recent=0, max_body_bytes=len(raw) - 1, max_est_tokens=est - 200)
    assert (both.record.pruned_for_body, both.record.pruned_for_tokens) == (1, 1)


def test_ollama_body_budget_prunes_and_says_so() -> None:
    """An earlier size accounting failed on Ollama (its images leave their list): now exact and corrected."""
    raw = encode(session_body("ollama", 4, image(50, 50, "PNG", seed=1), "image/png"))
    outcome = prune_with("ollama", raw, max_body_bytes=len(raw) - 10)
    assert outcome.record.reason is None and outcome.record.pruned == 1
    assert len(outcome.body) <= len(raw) - 10 == outcome.record.body_bytes_after + (len(raw) - 10 - len(outcome.body))


# --- the fast path --------------------------------------------------------------------------------------------


# Limits that each make one step act on the request below, and one set that makes none act.
_SHOT = image(300, 200, "PNG", seed=3)
_BODY = orjson.dumps(session_body("openai-chat", 6, _SHOT, "image/png"))
_ACTING = {
    "count": {"max_images": 3},
    "body budget": {"max_body_bytes": len(_BODY) - 1},
    "image bytes": {"max_image_bytes": 2048},
    "image side": {"max_image_side": 100},
    "many images": {"many_images_threshold": 2, "many_images_max_side": 100},
    "thumbnails": {"thumbnail_side": 64},
    "tokens": {"max_est_tokens": 10},
}


def _images(raw: bytes):
    parsed = orjson.loads(raw)
    return [m for m in FORMATS["openai-chat"].find_media(parsed) if m.kind == IMAGE]


@pytest.mark.parametrize("name", sorted(_ACTING))
def test_the_fast_path_never_skips_a_limit_that_acts(name: str) -> None:
    limits = Limits(**_ACTING[name])
    outcome = prune_request(url_for("openai-chat"), {}, _BODY, rules_with(**_ACTING[name]))
    assert outcome.changed, name  # the limit does act on this request
    assert not nothing_to_change(_images(_BODY), limits, len(_BODY))


def test_the_fast_path_lets_through_what_no_step_changes() -> None:
    limits = Limits(max_images=8, max_body_bytes=len(_BODY), max_image_bytes=len(_BODY))
    assert nothing_to_change(_images(_BODY), limits, len(_BODY))
    assert not prune_request(url_for("openai-chat"), {}, _BODY, rules_with(max_images=8, max_body_bytes=len(_BODY))).changed


def test_the_fast_path_reads_headers_for_the_size_the_model_sees(retina_desktop: bytes, screens: list[bytes]) -> None:
    def images(raw: bytes) -> list:
        return [m for m in FORMATS["anthropic"].find_media(orjson.loads(raw)) if m.kind == IMAGE]

    over = native_request("anthropic", "claude-sonnet-4-5", retina_desktop)
    within = native_request("anthropic", "claude-sonnet-4-5", screens[0])  # 1280x800: Claude sees it as it is
    assert not nothing_to_change(images(over), Limits(), len(over), "anthropic", "claude-sonnet-4-5")
    assert nothing_to_change(images(within), Limits(), len(within), "anthropic", "claude-sonnet-4-5")
    assert nothing_to_change(images(over), Limits(native_size=False), len(over), "anthropic", "claude-sonnet-4-5")
    assert nothing_to_change(images(over), Limits(), len(over), "anthropic", "glm-4.6")
    # On an event loop, the image to re-encode sends the request to a worker; within the size, it goes inline.
    rules = rules_with()
    target = rules.target_for_url(url_for("anthropic"))
    with pytest.raises(NeedsWorker):
        prune(target, {}, over, rules, inline=True)
    assert prune(target, {}, within, rules, inline=True).body is within


def test_the_shipped_defaults_send_a_short_session_as_it_came() -> None:
    rules = builtin_rules()
    outcome = prune_request(url_for("openai-chat"), {}, _BODY, rules)
    assert outcome.body is _BODY and not outcome.changed


def test_a_memory_that_fails_leaves_the_request_cut_on_its_own() -> None:
    class Broken:
        def recall(self, history):
            raise RuntimeError("dictionary changed size during iteration")

    body = encode(session_body("openai-chat", 10, screenshot(10)))
    outcome = prune_request(url_for("openai-chat"), {}, body, rules_with(max_images=8, low_water=0.5), memory=Broken())
    assert outcome.record is not None and outcome.record.reason is None and outcome.record.images_after == 4
