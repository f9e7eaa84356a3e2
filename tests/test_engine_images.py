"""The engine beyond dropping: per-image limits, thumbnails, repeats, the token budget, mime checks.

Every image that had to meet a limit is decoded with Pillow and checked against it, and against
the type its part declares.
"""

from __future__ import annotations

import base64
import copy
import io
import random

import orjson
import pytest
from PIL import Image

from trimflow import _shrink, prune_request
from trimflow._policy import Limits
from trimflow._record import Record
from trimflow.testing import b64, data_url, image, session_body
from trimflow._tokens import anthropic_image_tokens, image_tokens, text_tokens
from trimflow.formats import FORMATS

from .helpers import encode, rules_with, url_for

MiB = 2**20
FIVE_MB = 5 * MiB
ALL_FORMATS = sorted(FORMATS)
MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}


# --- fixtures and helpers ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def png_over_5mb() -> str:
    data = b64(image(1600, 1000, "PNG", seed=11, noise=1.0))  # the same as test_shrink: made once
    assert len(data) > FIVE_MB
    return data


@pytest.fixture(scope="module")
def noisy_png() -> bytes:
    """Too noisy to stay PNG under 300 KB of base64, small enough to be quick."""
    raw = image(480, 300, "PNG", seed=22, noise=1.0)
    assert len(b64(raw)) > 300_000
    return raw


@pytest.fixture(scope="module")
def wide_2500() -> list[bytes]:
    """25 distinct images with a 2500 px side (the many-image rule's case)."""
    return [image(2500, 300 + i, "JPEG", seed=i, noise=0.0) for i in range(25)]


@pytest.fixture(scope="module")
def screens() -> list[bytes]:
    """Distinct screenshot-like PNGs of ~250 KB, one per turn: flat areas and a busy window that moves."""
    base = Image.open(io.BytesIO(image(1280, 800, "PNG", noise=0.0))).convert("RGB")
    shots = []
    for i in range(8):
        screen = base.copy()
        screen.paste((40 * i, 120, 200), (60 + 90 * i, 100, 460 + 90 * i, 400))
        busy = Image.frombytes("RGB", (300, 200), random.Random(i).randbytes(300 * 200 * 3))
        screen.paste(busy, (80 + 90 * i, 150))
        buf = io.BytesIO()
        screen.save(buf, "PNG")
        shots.append(buf.getvalue())
    return shots


@pytest.fixture
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> _shrink.ShrinkCache:
    cache = _shrink.ShrinkCache()
    monkeypatch.setattr(_shrink, "CACHE", cache)
    return cache


@pytest.fixture
def encodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every image encode, by format: counts the real work the ladder does."""
    calls: list[str] = []
    real = _shrink._encode
    monkeypatch.setattr(_shrink, "_encode", lambda im, fmt, q: calls.append(fmt) or real(im, fmt, q))
    return calls


def anthropic(*images: tuple[str, str]) -> dict:
    """A Claude conversation with one image (base64, media type) per user turn."""
    messages: list[dict] = []
    for n, (data, mime) in enumerate(images, 1):
        if n > 1:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": f"ok {n - 1}"}]})
        messages.append({"role": "user", "content": [
            {"type": "text", "text": f"turn {n}"},
            {"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}},
        ]})
    return {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": messages}


def chat(*urls: str) -> dict:
    return {"model": "gpt-4o", "messages": [
        {"role": "user", "content": [{"type": "text", "text": f"turn {n}"}, {"type": "image_url", "image_url": {"url": u}}]}
        for n, u in enumerate(urls, 1)
    ]}


def run(fmt: str, body: dict | bytes, mode: str = "enforce", **limits):
    raw = body if isinstance(body, bytes) else encode(body)
    return prune_request(url_for(fmt), {}, raw, rules_with(**limits), mode)


def sent(fmt: str, body: bytes) -> list:
    """The images a body carries, oldest first."""
    return [m for m in FORMATS[fmt].find_media(orjson.loads(body)) if m.kind == "image"]


def payload(media) -> str:
    return media.data[media.data_offset :]


def decoded(media) -> Image.Image:
    im = Image.open(io.BytesIO(base64.b64decode(payload(media))))
    im.load()
    return im


def check_image(fmt: str, media, *, max_side: int | None = None, max_bytes: int | None = None) -> Image.Image:
    """Decode the image: within its limits, and its part declares what the bytes really are."""
    im = decoded(media)
    if max_side is not None:
        assert max(im.size) <= max_side, im.size
    if max_bytes is not None:
        assert len(payload(media)) <= max_bytes
    if fmt != "ollama":  # Ollama declares no type
        assert media.declared_mime == MIME[im.format], (media.declared_mime, im.format)
    return im


def texts(body: bytes) -> list[str]:
    """Every text an Anthropic or OpenAI chat body holds, in order."""
    return [part["text"] for m in orjson.loads(body)["messages"] for part in m["content"] if isinstance(part, dict) and part.get("type") == "text"]


# --- per-image limits ---------------------------------------------------------------------------------


def test_an_image_over_5mb_is_shrunk_under_it(png_over_5mb: str) -> None:
    body = anthropic((png_over_5mb, "image/png"))
    raw = encode(body)
    outcome = run("anthropic", raw, max_image_bytes=FIVE_MB)
    [media] = sent("anthropic", outcome.body)
    im = check_image("anthropic", media, max_bytes=FIVE_MB)
    assert im.format == "JPEG" and im.size == (1600, 1000)
    record = outcome.record
    assert outcome.changed and record.shrunk == 1 and record.pruned == 0 and record.images_after == 1
    assert record.shrunk_bytes_saved == len(png_over_5mb) - len(payload(media)) > 0
    assert record.media_bytes_after == len(payload(media)) and record.body_bytes_after == len(outcome.body)
    assert record.est_tokens_after == record.est_tokens_before  # same size: Claude counts the same


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
        assert check_image(wire_format, media, max_bytes=300_000).format == "JPEG"
    for turn in (1, 2):
        assert f"Turn {turn}: here is my screen".encode() in outcome.body
    again = prune_request(url_for(wire_format), {}, outcome.body, rules_with(max_image_bytes=300_000))
    assert again.body is outcome.body and again.record.shrunk == 0  # idempotent: the very same bytes


def test_a_side_over_8000_px_is_scaled_to_8000_and_stays_png() -> None:
    wide = b64(image(9000, 300, "PNG", seed=12, noise=0.0))
    outcome = run("anthropic", anthropic((wide, "image/png")), max_image_side=8000)
    [media] = sent("anthropic", outcome.body)
    im = check_image("anthropic", media, max_side=8000)
    assert im.format == "PNG" and im.size == (8000, 267)
    assert outcome.record.shrunk == 1


def test_many_images_over_the_threshold_get_no_side_over_2000(wide_2500: list[bytes]) -> None:
    limits = {"max_image_side": 8000, "many_images_threshold": 20, "many_images_max_side": 2000}
    body = anthropic(*((b64(shot), "image/jpeg") for shot in wide_2500))
    outcome = run("anthropic", body, **limits)
    images = sent("anthropic", outcome.body)
    assert len(images) == 25 and outcome.record.shrunk == 25
    for media, original in zip(images, wide_2500, strict=True):
        im = check_image("anthropic", media, max_side=2000)
        assert im.format == "JPEG" and im.size[0] == 2000
        assert abs(im.size[1] - Image.open(io.BytesIO(original)).size[1] * 0.8) <= 1
    # Its output is within the rule it met: a second pass changes nothing.
    assert run("anthropic", outcome.body, **limits).body is outcome.body


def test_the_many_image_rule_needs_more_than_the_threshold(wide_2500: list[bytes]) -> None:
    limits = {"many_images_threshold": 20, "many_images_max_side": 2000}
    raw = encode(anthropic(*((b64(shot), "image/jpeg") for shot in wide_2500[:20])))
    outcome = run("anthropic", raw, **limits)
    assert outcome.body is raw and outcome.record.shrunk == 0


def test_the_many_image_rule_counts_after_the_count_cap(wide_2500: list[bytes]) -> None:
    body = anthropic(*((b64(shot), "image/jpeg") for shot in wide_2500))
    outcome = run("anthropic", body, max_images=20, many_images_threshold=20, many_images_max_side=2000)
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
    outcome = run("anthropic", raw, **limits)
    assert calls == [] and outcome.body is raw and not outcome.changed
    assert outcome.record.shrunk == outcome.record.pruned == 0


def test_an_image_that_cannot_be_decoded_is_dropped_with_the_reason() -> None:
    junk = b64(bytes(range(256)) * 12)  # 3 KB of something that is no image
    ok = b64(image(40, 30, "PNG", seed=1, noise=0.0))
    body = anthropic((junk, "image/png"), (ok, "image/png"))
    outcome = run("anthropic", body, max_image_bytes=2048, placeholder="[{kind} #{ordinal}: {reason}]")
    assert "[image #1: over 2KB, could not be decoded]" in texts(outcome.body)
    assert [payload(m) for m in sent("anthropic", outcome.body)] == [ok]
    record = outcome.record
    assert record.pruned == record.pruned_for_image_limit == 1 and record.images_after == 1


def test_a_pixel_bomb_is_dropped_unopened_even_when_it_is_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    from .test_shrink import png_header

    monkeypatch.setattr(_shrink.Image, "open", lambda *a, **k: pytest.fail("a bomb must not be opened"))
    body = anthropic((b64(png_header(20_000, 20_000)), "image/png"))
    outcome = run("anthropic", body, max_image_side=8000, keep_recent=1, placeholder="[{dims}: {reason}]")
    [text] = [t for t in texts(outcome.body) if t.startswith("[")]
    assert text == "[20000x20000: over 8000px, 20000x20000 is over the 100-megapixel decoding limit]"
    assert outcome.record.images_after == 0 and outcome.record.pruned_for_image_limit == 1


def test_observe_mode_reports_the_shrink_and_sends_the_original(noisy_png: bytes) -> None:
    raw = encode(anthropic((b64(noisy_png), "image/png")))
    outcome = run("anthropic", raw, mode="observe", max_image_bytes=300_000)
    assert outcome.body is raw and not outcome.changed
    assert outcome.record.shrunk == 1 and outcome.record.body_bytes_after < len(raw)


def test_same_input_same_output_bytes_and_the_second_run_encodes_nothing(
    fresh_cache: _shrink.ShrinkCache, encodes: list[str], noisy_png: bytes, wide_2500: list[bytes]
) -> None:
    body = anthropic((b64(noisy_png), "image/png"), (b64(wide_2500[0]), "image/jpeg"), (b64(wide_2500[1]), "image/jpeg"))
    limits = {"max_image_bytes": 300_000, "max_image_side": 1000}
    first = run("anthropic", body, **limits)
    work = len(encodes)
    assert first.record.shrunk == 3 and work >= 3 and fresh_cache.misses == 3
    second = run("anthropic", body, **limits)
    assert second.body == first.body and len(encodes) == work and fresh_cache.hits == 3
    fresh_cache.clear()  # and without the cache: the encoders themselves are deterministic
    assert run("anthropic", body, **limits).body == first.body


# --- thinning -------------------------------------------------------------------------------------


def test_older_images_become_thumbnails_and_the_newest_stays_whole(fresh_cache: _shrink.ShrinkCache, screens: list[bytes]) -> None:
    shots = [b64(s) for s in screens[:6]]
    body = anthropic(*((s, "image/png") for s in shots))
    outcome = run("anthropic", body, thumbnail_side=256, keep_recent=1)
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
    assert "(5 thinned)" in record.summary()


def test_thumbnails_are_byte_identical_on_the_next_turn_and_come_from_the_cache(
    fresh_cache: _shrink.ShrinkCache, encodes: list[str], screens: list[bytes]
) -> None:
    shots = [(b64(s), "image/png") for s in screens]
    turn6 = run("anthropic", anthropic(*shots[:6]), thumbnail_side=256)
    encoded = len(encodes)
    turn7 = run("anthropic", anthropic(*shots[:7]), thumbnail_side=256)
    assert len(encodes) == encoded + 1  # only the image that just became old
    assert fresh_cache.hits == 5
    old = [payload(m) for m in sent("anthropic", turn6.body)[:5]]
    assert [payload(m) for m in sent("anthropic", turn7.body)[:5]] == old
    assert run("anthropic", turn7.body, thumbnail_side=256).body is turn7.body  # idempotent


def test_thumbnails_before_budgets_mean_fewer_images_dropped(screens: list[bytes]) -> None:
    body = anthropic(*((b64(s), "image/png") for s in screens[:6]))
    budget = len(b64(screens[5])) + 5 * 60_000  # the newest whole, five thumbnails of well under 60 KB
    dropped = run("anthropic", body, max_body_bytes=budget)
    thinned = run("anthropic", body, max_body_bytes=budget, thumbnail_side=256)
    assert dropped.record.pruned >= 4
    assert thinned.record.pruned == 0 and thinned.record.thinned == 5 and len(thinned.body) <= budget


def test_thinning_respects_the_count_cap_and_keep_recent(screens: list[bytes]) -> None:
    shots = [b64(s) for s in screens[:6]]
    outcome = run("anthropic", anthropic(*((s, "image/png") for s in shots)), max_images=4, keep_recent=2, thumbnail_side=256)
    images = sent("anthropic", outcome.body)
    assert len(images) == 4 and outcome.record.pruned_for_count == 2 and outcome.record.thinned == 2
    assert [payload(m) for m in images[2:]] == shots[4:]  # the newest two whole
    assert all(max(decoded(m).size) == 256 for m in images[:2])


def test_an_image_already_small_is_not_thinned(screens: list[bytes]) -> None:
    small = b64(image(200, 120, "PNG", seed=5))
    raw = encode(anthropic((small, "image/png"), (b64(screens[0]), "image/png")))
    outcome = run("anthropic", raw, thumbnail_side=256)
    assert outcome.body is raw and outcome.record.thinned == 0


def test_a_thumbnail_that_cannot_be_made_leaves_the_image_as_it_was(screens: list[bytes]) -> None:
    from .test_shrink import png_header

    bomb = b64(png_header(20_000, 20_000))
    raw = encode(anthropic((bomb, "image/png"), (b64(screens[0]), "image/png")))
    outcome = run("anthropic", raw, thumbnail_side=256)  # no per-image limit requires anything
    assert outcome.body is raw and outcome.record.pruned == 0


# --- repeats ------------------------------------------------------------------------------------------


def test_repeats_point_at_the_next_copy_and_count_as_pruned() -> None:
    a, b, c = (data_url(image(30 + i, 20, "PNG", seed=i), "image/png") for i in range(3))
    outcome = run("openai-chat", chat(a, b, a, c, a), dedupe=True)
    assert [m.data for m in sent("openai-chat", outcome.body)] == [b, c, a]
    assert "[trimflow: image #1 repeated as image #3]" in texts(outcome.body)
    assert "[trimflow: image #3 repeated as image #5]" in texts(outcome.body)
    record = outcome.record
    assert record.deduplicated == record.pruned == 2 and record.images_after == 3
    assert "2 repeated" in record.summary()


def test_repeats_are_off_by_default() -> None:
    a = data_url(image(30, 20, "PNG", seed=1), "image/png")
    raw = encode(chat(a, a))
    assert run("openai-chat", raw).body is raw


def test_a_repeat_text_stays_the_same_on_later_turns() -> None:
    a, b = (data_url(image(30 + i, 20, "PNG", seed=i), "image/png") for i in range(2))
    turn3 = texts(run("openai-chat", chat(a, b, a), dedupe=True).body)
    turn4 = texts(run("openai-chat", chat(a, b, a, a), dedupe=True).body)
    assert turn3[1] == turn4[1] == "[trimflow: image #1 repeated as image #3]"


def test_repeat_placeholder_is_configurable() -> None:
    a = data_url(image(30, 20, "PNG", seed=1), "image/png")
    outcome = run("openai-chat", chat(a, a), dedupe=True, repeat_placeholder="<{kind} {ordinal} = {later}, {dims}>")
    assert "<image 1 = 2, 30x20>" in texts(outcome.body)


def test_the_same_bytes_behind_different_declared_types_are_a_repeat() -> None:
    raw_png = image(30, 20, "PNG", seed=1)
    outcome = run("openai-chat", chat(data_url(raw_png, "image/png"), data_url(raw_png, "image/jpeg")), dedupe=True)
    assert outcome.record.deduplicated == 1 and outcome.record.mime_mismatches == 1


def test_repeats_go_before_the_count_cap() -> None:
    a, b, c = (data_url(image(30 + i, 20, "PNG", seed=i), "image/png") for i in range(3))
    with_dedupe = run("openai-chat", chat(a, b, a, c), dedupe=True, max_images=2)
    assert [m.data for m in sent("openai-chat", with_dedupe.body)] == [a, c]
    assert (with_dedupe.record.deduplicated, with_dedupe.record.pruned_for_count) == (1, 1)
    without = run("openai-chat", chat(a, b, a, c), max_images=2)
    assert [m.data for m in sent("openai-chat", without.body)] == [a, c]
    assert (without.record.deduplicated, without.record.pruned_for_count) == (0, 2)


def test_repeats_in_ollama_and_gemini() -> None:
    shot = image(30, 20, "PNG", seed=1)
    for fmt in ("ollama", "gemini"):
        outcome = run(fmt, session_body(fmt, 3, shot, "image/png"), dedupe=True)
        assert outcome.record.deduplicated == 2 and len(sent(fmt, outcome.body)) == 1
        assert b"repeated as image #2" in outcome.body and b"repeated as image #3" in outcome.body


# --- mime checks --------------------------------------------------------------------------------


def test_a_declared_type_that_is_not_the_real_one_is_counted_and_left_alone() -> None:
    jpeg, png = image(30, 20, "JPEG", seed=1), image(30, 20, "PNG", seed=2)
    raw = encode(chat(data_url(jpeg, "image/png"), data_url(jpeg, "image/jpg"), data_url(png, "IMAGE/PNG")))
    outcome = run("openai-chat", raw)
    assert outcome.body is raw and outcome.record.mime_mismatches == 1  # jpg is jpeg; case is ignored
    assert "1 mime mismatch" in outcome.record.summary()
    anth = encode(anthropic((b64(png), "image/jpeg"), (b64(jpeg), "image/jpeg")))
    assert run("anthropic", anth).record.mime_mismatches == 1


# --- the token budget ---------------------------------------------------------------------------------


def test_the_token_budget_prunes_the_oldest_until_the_estimate_fits() -> None:
    urls = [data_url(image(512, 512, "PNG", seed=i, noise=0.0), "image/png") for i in range(6)]
    body = chat(*urls)
    full = run("openai-chat", body).record.est_tokens_after
    assert image_tokens("openai-chat", "gpt-4o", 512, 512) == 255
    outcome = run("openai-chat", body, max_est_tokens=full - 2 * 255 - 1)  # room for three images fewer, minus one token
    record = outcome.record
    assert record.pruned == record.pruned_for_tokens == 3 and record.pruned_for_body == 0
    assert record.est_tokens_after <= full - 2 * 255 - 1 and not record.over_budget
    assert [m.data for m in sent("openai-chat", outcome.body)] == urls[3:]
    assert "[trimflow: image #1 omitted" in texts(outcome.body)[1]


def test_the_token_budget_never_prunes_keep_recent_and_says_when_unmet() -> None:
    body = chat(*(data_url(image(512, 512, "PNG", seed=i, noise=0.0), "image/png") for i in range(4)))
    outcome = run("openai-chat", body, max_est_tokens=10, keep_recent=2)
    assert outcome.record.images_after == 2 and outcome.record.over_budget and outcome.record.pruned_for_tokens == 2
    assert "OVER BUDGET" in outcome.record.summary()


def test_body_and_token_budgets_each_take_their_share() -> None:
    urls = [data_url(image(512, 512, "PNG", seed=i, noise=0.3), "image/png") for i in range(5)]
    raw = encode(chat(*urls))
    by_body = run("openai-chat", raw, max_images=None, keep_recent=0, max_body_bytes=len(raw) - 1)
    assert by_body.record.pruned_for_body == 1
    est = by_body.record.est_tokens_after
    both = run("openai-chat", raw, keep_recent=0, max_body_bytes=len(raw) - 1, max_est_tokens=est - 200)
    assert (both.record.pruned_for_body, both.record.pruned_for_tokens) == (1, 1)


# --- bodies and records ---------------------------------------------------------------------------


def test_ollama_body_budget_prunes_and_says_so() -> None:
    """An earlier size accounting failed on Ollama (its images leave their list): now exact and corrected."""
    raw = encode(session_body("ollama", 4, image(50, 50, "PNG", seed=1), "image/png"))
    outcome = run("ollama", raw, max_body_bytes=len(raw) - 10)
    assert outcome.record.reason is None and outcome.record.pruned == 1
    assert len(outcome.body) <= len(raw) - 10 == outcome.record.body_bytes_after + (len(raw) - 10 - len(outcome.body))


def test_the_record_reports_every_new_figure_and_no_base64(png_over_5mb: str, screens: list[bytes]) -> None:
    body = anthropic((png_over_5mb, "image/png"), (b64(screens[0]), "image/png"), (b64(screens[0]), "image/jpeg"))
    record = run("anthropic", body, max_image_bytes=FIVE_MB, thumbnail_side=256, dedupe=True).record
    fields = orjson.loads(record.to_json())
    for name in ("shrunk", "shrunk_bytes_saved", "thinned", "thinned_bytes_saved", "deduplicated",
                 "pruned_for_image_limit", "pruned_for_tokens", "mime_mismatches"):
        assert name in fields
    # #2 repeats #3 and goes; #1 is old: thinned (which also meets the 5 MB limit); #3 is whole.
    assert (record.deduplicated, record.thinned, record.shrunk, record.mime_mismatches) == (1, 1, 0, 1)
    assert record.pruned == 1 and record.images_after == 2
    assert png_over_5mb[:40].encode() not in record.to_json()


def test_summary_shows_the_estimate_over_the_provider_count() -> None:
    record = Record("t", "c", 1, "h", "/v1/messages", "anthropic", "claude-x", "defaults", "enforce",
                    est_tokens_before=3000, est_tokens_after=2160, usage_input_tokens=2000)
    assert record.est_to_usage_ratio() == pytest.approx(1.08)
    assert record.summary().endswith("in=2000 est/in=1.08")
    observed = Record("t", "c", 1, "h", "/", "anthropic", None, None, "observe", est_tokens_before=3000, est_tokens_after=10, usage_input_tokens=2000)
    assert "est/in=1.50" in observed.summary()  # observe sends the original: its estimate counts
    assert "est/in" not in Record("t", None, None, "h", "/", "anthropic", None, None, "enforce").summary()


def test_a_smaller_image_costs_fewer_estimated_tokens_by_the_providers_formula() -> None:
    big = data_url(image(1600, 1600, "PNG", seed=3, noise=0.0), "image/png")
    outcome = run("openai-chat", chat(big), max_image_side=512)
    [media] = sent("openai-chat", outcome.body)
    assert check_image("openai-chat", media, max_side=512).size == (512, 512)
    record = outcome.record
    # gpt-4o tiles: 1600x1600 -> 768x768 -> 4 tiles = 765; 512x512 -> 1 tile = 255. Text unchanged.
    assert record.est_tokens_before - record.est_tokens_after == 765 - 255
    assert record.shrunk == 1 and record.thinned == 0
