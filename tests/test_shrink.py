"""_shrink on real Pillow images: limits met (checked by decoding), format rules, determinism, cache, safety."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import logging
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest
from PIL import Image, ImageFile

from trimflow import DEFAULT_RULES_PATH, _shrink, load_rules, prune_request
from trimflow._pixel_budget import PixelBudget
from trimflow._shrink import DECODE_BUDGET, MAX_HEAVY_PIXELS, MAX_PIXELS, ShrinkCache, Shrunk, shrink
from trimflow.testing import b64, image

from . import shrink_bench
from .bombs import blank_png, png_header
from .helpers import ROOT

MiB = 2**20
FIVE_MB = 5 * MiB


@pytest.fixture(scope="module")
def small_noisy_png() -> str:
    """Noisy enough that every step of the ladder has work to do, small enough to be quick."""
    return b64(image(480, 300, "PNG", seed=13, noise=0.6))


@pytest.fixture(scope="module")
def wide_png() -> str:
    return b64(image(9000, 300, "PNG", seed=12, noise=0.0))


def decode(data: str) -> Image.Image:
    im = Image.open(io.BytesIO(base64.b64decode(data)))
    im.load()
    return im


def check(result: Shrunk, *, max_side: int | None = None, max_bytes: int | None = None) -> Image.Image:
    """The result meets its limits, and what it declares is what the bytes are."""
    assert result.data is not None and result.reason is None
    im = decode(result.data)
    assert _shrink._MIME[im.format] == result.mime
    assert im.size == (result.width, result.height)
    if max_side is not None:
        assert max(im.size) <= max_side
    if max_bytes is not None:
        assert len(result.data) <= max_bytes
    assert not (set(im.info) & {"exif", "icc_profile", "xmp", "comment"}), im.info
    return im


def test_the_bomb_limit_is_set_for_pillow_too() -> None:
    assert Image.MAX_IMAGE_PIXELS == MAX_PIXELS == 100_000_000


def test_noisy_png_over_5mb_becomes_jpeg_under_it_at_full_size(png_over_5mb: str) -> None:
    result = shrink(png_over_5mb, max_side=None, max_bytes=FIVE_MB, cache=ShrinkCache())
    im = check(result, max_bytes=FIVE_MB)
    assert im.format == "JPEG" and im.size == (1600, 1000)  # quality 85 sufficed: no downscale


def test_a_tight_byte_limit_walks_down_the_size_ladder(small_noisy_png: str) -> None:
    result = shrink(small_noisy_png, max_side=None, max_bytes=30_000, cache=ShrinkCache())
    im = check(result, max_bytes=30_000)
    assert im.format in ("JPEG", "PNG") and max(im.size) < 480
    # Aspect ratio kept (to a pixel of rounding).
    assert abs(im.size[0] / im.size[1] - 1.6) < 0.03


def test_a_side_over_8000_px_is_scaled_and_stays_png(wide_png: str) -> None:
    result = shrink(wide_png, max_side=8000, max_bytes=FIVE_MB, cache=ShrinkCache())
    im = check(result, max_side=8000, max_bytes=FIVE_MB)
    assert im.format == "PNG" and im.size == (8000, 267)


def test_a_thumbnail_has_the_exact_long_side() -> None:
    tall = b64(image(300, 2000, "JPEG", seed=3, noise=0.1))
    im = check(shrink(tall, max_side=512, max_bytes=None, cache=ShrinkCache()), max_side=512)
    assert im.format == "JPEG" and im.size == (77, 512)


@pytest.mark.parametrize(
    ("fmt", "out"),
    [("PNG", "PNG"), ("JPEG", "JPEG"), ("WEBP", "WEBP"), ("GIF", "PNG"), ("BMP", "PNG")],
)
def test_the_format_is_kept_where_providers_take_it(fmt: str, out: str) -> None:
    data = b64(image(240, 160, fmt, seed=4, noise=0.2))
    im = check(shrink(data, max_side=120, max_bytes=None, cache=ShrinkCache()), max_side=120)
    assert im.format == out and im.size == (120, 80)


def test_an_animated_gif_sends_its_first_frame() -> None:
    frames = [Image.new("RGB", (200, 100), color) for color in ((255, 0, 0), (0, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    im = check(shrink(b64(buf.getvalue()), max_side=50, max_bytes=None, cache=ShrinkCache()), max_side=50)
    assert im.format == "PNG" and im.convert("RGB").getpixel((10, 10))[0] > 200  # red: frame 1


def test_transparency_kept_as_png_and_flattened_on_white_for_jpeg() -> None:
    rgba = Image.open(io.BytesIO(image(400, 400, "PNG", seed=8, noise=0.8))).convert("RGBA")
    rgba.paste((0, 0, 0, 0), (0, 0, 200, 200))  # a transparent top-left quarter
    buf = io.BytesIO()
    rgba.save(buf, "PNG")
    data = b64(buf.getvalue())
    png = check(shrink(data, max_side=200, max_bytes=None, cache=ShrinkCache()), max_side=200)
    assert png.mode == "RGBA" and png.getpixel((0, 0))[3] == 0 and png.getpixel((150, 150))[3] == 255
    # Noise is too big as PNG at this limit, so it becomes JPEG: transparent pixels turn white.
    limit = len(data) // 3
    jpeg = check(shrink(data, max_side=None, max_bytes=limit, cache=ShrinkCache()), max_bytes=limit)
    assert jpeg.format == "JPEG" and all(v > 245 for v in jpeg.convert("RGB").getpixel((20, 20)))


def test_exif_is_stripped_after_its_orientation_is_applied() -> None:
    src = Image.new("RGB", (400, 200), (200, 30, 30))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    exif[0x010F] = "CameraMaker"
    buf = io.BytesIO()
    src.save(buf, "JPEG", exif=exif.tobytes(), quality=90)
    im = check(shrink(b64(buf.getvalue()), max_side=100, max_bytes=None, cache=ShrinkCache()), max_side=100)
    assert im.size == (50, 100)  # upright: the long side is now the height
    assert "exif" not in im.info and not im.getexif()


def test_an_image_within_its_limits_is_left_alone(wide_png: str) -> None:
    assert shrink(wide_png, max_side=9000, max_bytes=FIVE_MB, cache=ShrinkCache()) == Shrunk()


def test_a_result_is_within_the_limits_that_made_it(small_noisy_png: str) -> None:
    """So the engine never shrinks its own output again (idempotence)."""
    for max_side, max_bytes in ((None, 100_000), (400, 60_000), (256, None)):
        result = shrink(small_noisy_png, max_side=max_side, max_bytes=max_bytes, cache=ShrinkCache())
        check(result, max_side=max_side, max_bytes=max_bytes)
        assert shrink(result.data, max_side=max_side, max_bytes=max_bytes, cache=ShrinkCache()) == Shrunk()


def test_same_input_same_bytes_without_the_cache(small_noisy_png: str) -> None:
    for data, max_side, max_bytes in ((small_noisy_png, 400, 40_000), (small_noisy_png, 256, None)):
        first = shrink(data, max_side=max_side, max_bytes=max_bytes, cache=ShrinkCache())
        second = shrink(data, max_side=max_side, max_bytes=max_bytes, cache=ShrinkCache())
        assert first == second and first.data is not None


def test_the_cache_answers_the_second_time_without_encoding(small_noisy_png: str, monkeypatch: pytest.MonkeyPatch) -> None:
    encodes = []
    real = _shrink._encode
    monkeypatch.setattr(_shrink, "_encode", lambda *a: encodes.append(a[1:]) or real(*a))
    cache = ShrinkCache()
    first = shrink(small_noisy_png, max_side=240, max_bytes=None, cache=cache)
    assert len(encodes) == 1 and (cache.hits, cache.misses) == (0, 1)
    assert shrink(small_noisy_png, max_side=240, max_bytes=None, cache=cache) is first
    assert len(encodes) == 1 and (cache.hits, cache.misses) == (1, 1)
    # The limits are part of the key: other limits are another entry.
    shrink(small_noisy_png, max_side=120, max_bytes=None, cache=cache)
    assert len(encodes) == 2 and len(cache) == 2


def test_the_cache_is_bounded_by_bytes_and_evicts_the_least_recently_used() -> None:
    cache = ShrinkCache(max_bytes=3000)
    entry = lambda n: Shrunk("A" * n, "image/png", 1, 1)  # noqa: E731
    cache.put(b"a", entry(1000))
    cache.put(b"b", entry(1000))
    assert cache.get(b"a") is not None  # a is now the most recently used
    cache.put(b"c", entry(1000))
    assert cache.bytes <= 3000
    assert cache.get(b"b") is None and cache.get(b"a") is not None and cache.get(b"c") is not None
    cache.put(b"huge", entry(10_000))  # larger than the whole cache: not stored, nothing evicted
    assert cache.get(b"huge") is None and len(cache) == 2
    cache.put(b"a", entry(2000))  # replacing an entry re-counts its size
    assert cache.bytes <= 3000 and cache.get(b"a").data == "A" * 2000


def test_threads_share_one_cache_and_agree() -> None:
    data = b64(image(400, 300, "JPEG", seed=5, noise=0.3))
    cache = ShrinkCache()
    results: list[Shrunk] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for side in (300, 200, 100, 300, 200, 100):
                results.append(shrink(data, max_side=side, max_bytes=None, cache=cache))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    by_side = {r.width: r for r in results}
    assert sorted(by_side) == [100, 200, 300]
    assert all(r == by_side[r.width] for r in results)  # every thread got the same bytes
    assert len(cache) == 3 and cache.hits + cache.misses == 24


def test_a_header_over_100_megapixels_is_refused_before_anything_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_open(*args: object, **kwargs: object) -> None:
        raise AssertionError("Pillow must not open a bomb")

    monkeypatch.setattr(_shrink.Image, "open", no_open)
    result = shrink(b64(png_header(20_000, 20_000)), max_side=8000, max_bytes=None, cache=ShrinkCache())
    assert result.data is None and "20000x20000" in result.reason and "100-megapixel" in result.reason


def test_just_under_the_pixel_limit_is_not_refused_for_size() -> None:
    # 10,000 x 10,000 = exactly 100 MP: allowed by the header check, and grey fits the decoding budget (the data
    # is truncated, so it then fails to decode - which proves it got past both).
    result = shrink(b64(png_header(10_000, 10_000, color_type=0)), max_side=8000, max_bytes=None, cache=ShrinkCache())
    assert result.reason == "could not be decoded"


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ("not base64 at all!", "not valid base64"),
        ("QUJD" * 100, "could not be decoded"),  # valid base64 of text
        (b64(b"%PDF-1.7 not an image"), "could not be decoded"),
        (b64(image(64, 64, "PNG", seed=1)[:200]), "could not be decoded"),  # truncated
    ],
)
def test_undecodable_input_gives_a_reason_and_never_raises(payload: str, reason: str) -> None:
    result = shrink(payload, max_side=10, max_bytes=None, cache=ShrinkCache())
    assert result.data is None and result.reason == reason


def test_a_limit_too_small_for_any_image_says_so() -> None:
    data = b64(image(400, 300, "JPEG", seed=6, noise=0.5))
    result = shrink(data, max_side=None, max_bytes=200, cache=ShrinkCache())
    assert result.data is None and result.reason == "could not be shrunk under 200B"


def test_wrapped_and_urlsafe_base64_decode() -> None:
    raw = image(300, 200, "PNG", seed=7, noise=0.3)
    plain = b64(raw)
    wrapped = "\r\n".join(plain[i : i + 76] for i in range(0, len(plain), 76))
    urlsafe = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    results = [shrink(text, max_side=100, max_bytes=None, cache=ShrinkCache()) for text in (plain, wrapped, urlsafe)]
    assert results[0].data is not None and results[0] == results[1] == results[2]


def test_the_benchmark_functions_return_their_figures() -> None:
    speed = shrink_bench.shrink_speed({"tiny": ("screen", "PNG", 800, 450, 200, None)}, repeats=1)
    assert speed["tiny"]["result"] == "image/png 200x112" and speed["tiny"]["ms_per_megapixel"] > 0
    before = _shrink.CACHE
    session = shrink_bench.session_cache(turns=4, size=(800, 450))
    assert _shrink.CACHE is before  # the bench's own cache is gone again
    # Turn n thins n-1 screenshots, each encoded once: 1+2+3 = 6 lookups, 3 of them misses.
    assert (session["hits"], session["misses"], session["misses_minimum"]) == (3, 3, 3)
    assert session["hit_rate"] == 0.5 and session["thinned_images"] == 6


# --- the least lossy rescue first: encodings at full size before any downscale ---------------------------------


@pytest.fixture(scope="module")
def ui_2x() -> shrink_bench.Screenshot:
    return shrink_bench.screenshot("ui", 2)


def png_at(shot: shrink_bench.Screenshot, level: int) -> str:
    buf = io.BytesIO()
    shot.image.save(buf, "PNG", compress_level=level)
    return b64(buf.getvalue())


def test_a_ui_screenshot_over_the_byte_limit_goes_lossless_webp_at_full_size(ui_2x: shrink_bench.Screenshot) -> None:
    payload = png_at(ui_2x, 6)
    limit = len(payload) // 2  # far from PNG's reach, well within lossless WebP's
    result = shrink(payload, max_side=None, max_bytes=limit, webp=True, cache=ShrinkCache())
    im = check(result, max_bytes=limit)
    assert (im.format, im.size) == ("WEBP", ui_2x.image.size)
    assert im.convert("RGB").tobytes() == ui_2x.image.tobytes()  # lossless: every pixel as it was


def test_without_webp_the_same_screenshot_goes_256_colours_at_full_size(ui_2x: shrink_bench.Screenshot) -> None:
    payload = png_at(ui_2x, 6)
    limit = len(payload) // 2  # PNG8 is 2-3x smaller than PNG on a UI screenshot
    result = shrink(payload, max_side=None, max_bytes=limit, webp=False, cache=ShrinkCache())
    im = check(result, max_bytes=limit)
    assert (im.format, im.mode, im.size) == ("PNG", "P", ui_2x.image.size)
    assert shrink_bench.text_legibility(ui_2x, base64.b64decode(result.data or "")) > 0.99
    # Under what 256 colours give, no JPEG quality fits a UI screenshot at full size (JPEG 55 is 0.9x its PNG):
    # then, and only then, the dimensions go.
    buf = io.BytesIO()
    ui_2x.image.quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(buf, "PNG", compress_level=6)
    limit = 4 * -(-len(buf.getvalue()) // 3) - 100
    smaller = shrink(payload, max_side=None, max_bytes=limit, webp=False, cache=ShrinkCache())
    assert check(smaller, max_bytes=limit).size[0] < ui_2x.image.size[0] and smaller.mime != "image/webp"


def test_a_png_just_over_the_limit_is_compressed_again_losslessly(ui_2x: shrink_bench.Screenshot) -> None:
    fast, best = png_at(ui_2x, 1), png_at(ui_2x, 9)
    assert len(best) < len(fast) / _shrink.LOSSLESS_MARGIN  # the fixture leaves level 9 room to win
    limit = int(len(fast) / 1.04)  # over by 4%: within the margin
    result = shrink(fast, max_side=None, max_bytes=limit, webp=True, cache=ShrinkCache())
    im = check(result, max_bytes=limit)
    assert (im.format, im.size) == ("PNG", ui_2x.image.size) and im.convert("RGB").tobytes() == ui_2x.image.tobytes()


def test_a_photo_screenshot_goes_lossy_at_full_size_when_that_fits() -> None:
    """The issue's case at a quarter of the pixels: a photographic 2x screen, over the limit as PNG by 5x or more."""
    shot = shrink_bench.screenshot("photo", 2, size=(1280, 720))
    payload = b64(shot.png())
    limit = len(payload) // 5
    for webp, fmt in ((True, "WEBP"), (False, "JPEG")):
        result = shrink(payload, max_side=None, max_bytes=limit, webp=webp, cache=ShrinkCache())
        im = check(result, max_bytes=limit)
        assert (im.format, im.size) == (fmt, shot.image.size)
        assert shrink_bench.text_legibility(shot, base64.b64decode(result.data or "")) > 0.95


def test_it_downscales_only_when_no_encoding_fits_at_full_size(ui_2x: shrink_bench.Screenshot) -> None:
    payload = png_at(ui_2x, 6)
    smallest = shrink(payload, max_side=None, max_bytes=10**9, webp=True, cache=ShrinkCache())
    assert smallest.data is None  # within the limit: left alone
    # Under what both lossless and quality 55 give at full size, the dimensions must go.
    sizes = []
    for options in ({"quality": 55}, {"lossless": True, "quality": 80}):
        buf = io.BytesIO()
        ui_2x.image.save(buf, "WEBP", method=4, **options)
        sizes.append(4 * -(-len(buf.getvalue()) // 3))
    limit = min(sizes) - 1000
    result = shrink(payload, max_side=None, max_bytes=limit, webp=True, cache=ShrinkCache())
    im = check(result, max_bytes=limit)
    assert im.size[0] < ui_2x.image.size[0] and im.format == "WEBP"
    assert abs(im.size[0] / im.size[1] - 1.6) < 0.01


def test_a_jpeg_stays_jpeg_and_a_side_limit_alone_keeps_a_png_png() -> None:
    shot = shrink_bench.screenshot("code", 1)
    buf = io.BytesIO()
    shot.image.save(buf, "JPEG", quality=95)
    jpeg = b64(buf.getvalue())
    result = shrink(jpeg, max_side=None, max_bytes=len(jpeg) * 2 // 3, webp=True, cache=ShrinkCache())
    assert check(result, max_bytes=len(jpeg) * 2 // 3).format == "JPEG" and (result.width, result.height) == shot.image.size
    side = shrink(b64(shot.png()), max_side=1000, max_bytes=None, webp=True, cache=ShrinkCache())
    assert check(side, max_side=1000).format == "PNG"


def test_webp_or_not_is_part_of_the_cache_key(small_noisy_png: str) -> None:
    cache = ShrinkCache()
    limit = len(small_noisy_png) // 3
    as_webp = shrink(small_noisy_png, max_side=None, max_bytes=limit, webp=True, cache=cache)
    as_jpeg = shrink(small_noisy_png, max_side=None, max_bytes=limit, webp=False, cache=cache)
    assert (as_webp.mime, as_jpeg.mime) == ("image/webp", "image/jpeg") and cache.misses == 2


def retina_5120_to_claude() -> tuple[shrink_bench.Screenshot, bytes]:
    """A photographic 2x screen over Claude's 5 MiB as PNG, and a Messages request that sends it."""
    shot = shrink_bench.screenshot("photo", 2, size=(2560, 1440))
    png = shot.png()
    assert len(b64(png)) > FIVE_MB
    body = orjson.dumps(
        {
            "model": "claude-sonnet-4-6",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(png)}}]}],
        }
    )
    return shot, body


def test_a_5120x2880_retina_screenshot_to_claude_arrives_at_the_size_claude_sees() -> None:
    """The shipped rules send it at Claude's native size, losslessly, with no note (Claude would have scaled it to that
    size itself: nothing to tell, nothing to map back); over the byte limit as it came, it counts as shrunk."""
    shot, body = retina_5120_to_claude()
    out = prune_request("https://api.anthropic.com/v1/messages", {}, body, load_rules(DEFAULT_RULES_PATH))
    record = out.record
    assert record is not None and (record.shrunk, record.native_sized, record.images_rescaled, record.pruned) == (1, 0, 1, 0)
    [block] = orjson.loads(out.body)["messages"][0]["content"]
    im = decode(block["source"]["data"])
    assert (im.format, im.size, block["source"]["media_type"]) == ("WEBP", (1456, 819), "image/webp")
    lossless = shot.image.convert("RGB").resize((1456, 819), Image.Resampling.LANCZOS, reducing_gap=3.0)
    assert im.convert("RGB").tobytes() == lossless.tobytes()
    assert len(block["source"]["data"]) <= FIVE_MB and out.screen is None


def test_without_native_size_a_5120x2880_retina_screenshot_to_claude_arrives_at_full_size() -> None:
    """With `native_size: false` the byte limit alone acts: the image keeps its dimensions as WebP, with no note
    (nothing to map back), and the record says it was shrunk, not rescaled."""
    shot, body = retina_5120_to_claude()
    rules = load_rules(DEFAULT_RULES_PATH)
    rules = dataclasses.replace(rules, defaults=dataclasses.replace(rules.defaults, native_size=False))
    out = prune_request("https://api.anthropic.com/v1/messages", {}, body, rules)
    record = out.record
    assert record is not None and (record.shrunk, record.images_rescaled, record.pruned) == (1, 0, 0)
    [block] = orjson.loads(out.body)["messages"][0]["content"]
    im = decode(block["source"]["data"])
    assert (im.format, im.size, block["source"]["media_type"]) == ("WEBP", (5120, 2880), "image/webp")
    assert len(block["source"]["data"]) <= FIVE_MB
    assert shrink_bench.text_legibility(shot, base64.b64decode(block["source"]["data"])) > 0.99


# --- the size the model sees ----------------------------------------------------------------------------------

CLAUDE_SEES = (1389, 868)  # a 2880x1800 image at Claude's native size


def scaled(png: bytes, size: tuple[int, int]) -> bytes:
    return Image.open(io.BytesIO(png)).convert("RGB").resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0).tobytes()


@pytest.mark.parametrize(("webp", "fmt"), [(True, "WEBP"), (False, "PNG")])
def test_at_the_size_the_model_sees_an_image_goes_losslessly(retina_desktop: bytes, webp: bool, fmt: str) -> None:
    result = shrink(b64(retina_desktop), max_side=None, max_bytes=None, webp=webp, size=CLAUDE_SEES, cache=ShrinkCache())
    im = check(result)
    assert (im.format, im.size) == (fmt, CLAUDE_SEES) and im.convert("RGB").tobytes() == scaled(retina_desktop, CLAUDE_SEES)
    assert len(result.data or "") < len(b64(retina_desktop))


def test_the_original_goes_as_it_came_when_it_is_no_larger() -> None:
    photo = b64(image(2400, 1600, "JPEG", seed=4, noise=0.4))  # lossless at a smaller size is still larger than this JPEG
    assert shrink(photo, max_side=None, max_bytes=None, webp=True, size=(1307, 871), cache=ShrinkCache()) == Shrunk()


def test_a_size_the_image_is_within_changes_nothing(retina_desktop: bytes) -> None:
    payload = b64(retina_desktop)
    assert shrink(payload, max_side=None, max_bytes=None, webp=True, size=(2880, 1800), cache=ShrinkCache()) == Shrunk()


def test_a_side_limit_below_the_size_the_model_sees_wins(retina_desktop: bytes) -> None:
    result = shrink(b64(retina_desktop), max_side=1000, max_bytes=None, webp=True, size=CLAUDE_SEES, cache=ShrinkCache())
    assert (result.width, result.height) == (1000, 625)


def test_over_a_byte_limit_even_at_that_size_the_ladder_goes_on_from_it(png_over_5mb: str) -> None:
    # Noise: lossless at Claude's size (1254x784) is still over 1 MiB; the image came over a limit, so lossy steps
    # are allowed, from that size down.
    result = shrink(png_over_5mb, max_side=None, max_bytes=MiB, webp=True, size=(1254, 784), cache=ShrinkCache())
    im = check(result, max_bytes=MiB)
    assert im.format == "WEBP" and im.size[0] <= 1254 and im.size[1] <= 784


def test_the_size_is_part_of_the_cache_key(small_noisy_png: str) -> None:
    cache = ShrinkCache()
    shrink(small_noisy_png, max_side=None, max_bytes=None, webp=True, cache=cache)
    at_size = shrink(small_noisy_png, max_side=None, max_bytes=None, webp=True, size=(240, 150), cache=cache)
    assert cache.misses == 2 and (at_size.width, at_size.height) == (240, 150)


def test_the_size_the_model_sees_is_the_same_bytes_in_another_process(retina_desktop: bytes) -> None:
    """The prompt cache needs the same bytes on every turn, across restarts and instances: another interpreter
    encodes the same image at the same size to the same bytes (WebP and PNG)."""
    payload = b64(retina_desktop)
    digests = [
        hashlib.sha256(
            (shrink(payload, max_side=None, max_bytes=None, webp=webp, size=CLAUDE_SEES, cache=ShrinkCache()).data or "").encode()
        ).hexdigest()
        for webp in (True, False)
    ]
    code = (
        "import hashlib, sys\n"
        "from trimflow._shrink import ShrinkCache, shrink\n"
        "payload = sys.stdin.read()\n"
        "for webp in (True, False):\n"
        f"    result = shrink(payload, max_side=None, max_bytes=None, webp=webp, size={CLAUDE_SEES}, cache=ShrinkCache())\n"
        "    print(hashlib.sha256((result.data or '').encode()).hexdigest())\n"
    )
    other = subprocess.run([sys.executable, "-c", code], input=payload, capture_output=True, text=True, check=True, timeout=600)
    assert other.stdout.split() == digests


# --- memory: the decoding budget (trimflow._pixel_budget) -------------------------------------------------------


def test_an_image_that_may_need_more_than_the_budget_is_refused_before_it_decodes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Just under the pixel limit, all zeros: 400 KB of PNG that decodes to 400 MB of RGBA (and took 1.7 GB and 6 s of
    CPU to shrink to Claude's 8000 px side)."""

    def no_decoding(self: ImageFile.ImageFile) -> None:
        raise AssertionError("Pillow must not decode an image over the budget")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    data, cache = b64(blank_png(10_000, 9_999)), ShrinkCache()
    with caplog.at_level(logging.WARNING, "trimflow"):
        result = shrink(data, max_side=8000, max_bytes=FIVE_MB, webp=True, cache=cache)
        assert shrink(data, max_side=8000, max_bytes=FIVE_MB, webp=True, cache=cache) is result  # its own verdict: cached
    assert result.data is None and result.reason is not None
    assert result.reason.startswith("10000x9999 may need ") and result.reason.endswith("over the 1.0GB decoding budget")
    [line] = [r.getMessage() for r in caplog.records if r.name == "trimflow"]
    assert "10000x9999" in line and "decoding budget" in line


def test_a_budget_in_use_refuses_for_this_request_only(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    budget = PixelBudget(DECODE_BUDGET, wait=0.01, max_waiting=1, give_back_after=DECODE_BUDGET)
    monkeypatch.setattr(_shrink, "BUDGET", budget)
    data, cache = b64(image(900, 600, "PNG", seed=21)), ShrinkCache()
    assert budget.reserve(DECODE_BUDGET)  # other requests' images hold all of it
    with caplog.at_level(logging.WARNING, "trimflow"):
        busy = shrink(data, max_side=300, max_bytes=None, cache=cache)
    assert busy.data is None and busy.reason == "the 1.0GB decoding budget was in use by other images"
    assert len(cache) == 0 and budget.refused == 1  # a moment's verdict is not the image's
    assert any("had no room" in r.getMessage() and "900x600" in r.getMessage() for r in caplog.records)
    budget.release(DECODE_BUDGET)
    done = shrink(data, max_side=300, max_bytes=None, cache=cache)
    assert done.data is not None and (done.width, done.height) == (300, 200) and budget.reserved == 0


def test_images_that_do_not_fit_together_wait_their_turn_and_give_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four threads, a budget that holds one of their images at a time: each waits for the one before, none is
    refused, and each gets the bytes it gets alone."""
    sources = [b64(image(1200 + 40 * i, 900, "PNG", seed=30 + i, noise=0.3)) for i in range(4)]
    alone = [shrink(data, max_side=700, max_bytes=None, cache=ShrinkCache()) for data in sources]
    costs = [_shrink._open(data, 700, None, False) for data in sources]
    largest = max(c.cost for c in costs if isinstance(c, _shrink._Opened))
    budget = PixelBudget(largest + largest // 2, wait=120.0, max_waiting=4, give_back_after=DECODE_BUDGET)
    monkeypatch.setattr(_shrink, "BUDGET", budget)
    results: dict[int, Shrunk] = {}
    threads = [threading.Thread(target=lambda i=i: results.update({i: shrink(sources[i], max_side=700, max_bytes=None)})) for i in range(4)]
    with monkeypatch.context() as m:
        m.setattr(_shrink, "CACHE", ShrinkCache())
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [results[i] for i in range(4)] == alone and all(r.data is not None for r in alone)
    assert budget.refused == 0 and budget.reserved == 0 and budget.peak <= budget.limit


def test_a_frame_over_the_heavy_encoders_size_goes_png_or_jpeg() -> None:
    """libwebp and the median cut take 40-45 bytes per pixel: past MAX_HEAVY_PIXELS the ladder tries neither."""
    rescue = _shrink._Rescue("PNG", "WEBP", 6, recompress=False, lossless_webp=True, palette=True)
    assert {fmt for fmt, _ in rescue.steps(True, False, MAX_HEAVY_PIXELS)} == {"PNG", "WEBP", _shrink.PALETTE}
    assert {fmt for fmt, _ in rescue.steps(True, False, MAX_HEAVY_PIXELS + 1)} == {"PNG", "JPEG"}


def test_millions_of_colours_skip_the_median_cut(encodes: list[str]) -> None:
    """A gradient of a million colours that PNG stores in a few KB: the median cut would take seconds a megapixel."""
    side = 1024
    red = Image.frombytes("L", (side, side), bytes(range(256)) * (side * side // 256))
    blue = Image.frombytes("L", (side, side), b"".join(bytes([(x >> 8) | (y >> 8) << 2 for x in range(side)]) for y in range(side)))
    buf = io.BytesIO()
    Image.merge("RGB", (red, red.transpose(Image.Transpose.TRANSPOSE), blue)).save(buf, "PNG")
    data = b64(buf.getvalue())
    result = shrink(data, max_side=None, max_bytes=len(data) // 2, webp=False, cache=ShrinkCache())
    assert result.data is not None
    assert _shrink.PALETTE not in encodes and encodes[0] == "JPEG", encodes


# Each case shrunk in a child process, with what it held at its peak against what _peak_bytes reserved for it. The
# images are what makes each step hold the most it can: noise (nothing compresses), 65,536 colours and a gradient of
# 4 million that PNG stores in a few KB (the median cut at its most, and past it), progressive 4:4:4 JPEG (libjpeg's
# coefficients), WebP (libwebp's canvases), palette transparency, grey with alpha, a turned JPEG, and no byte limit
# (the whole PNG of a noisy frame, its base64 and its text).
_ESTIMATE_PROBE = """
import base64, ctypes, gc, io, json, random, sys
sys.path.insert(0, sys.argv[1])
from PIL import Image
from trimflow import _shrink

def noise(mode, w, h, seed):
    return Image.frombytes(mode, (w, h), random.Random(seed).randbytes(w * h * len(mode)))

def gradient(side):  # every pixel its own colour: x and y in red and green, their high bits in blue
    red = Image.frombytes("L", (side, side), bytes(range(256)) * (side * side // 256))
    green = red.transpose(Image.Transpose.TRANSPOSE)
    blue = Image.frombytes("L", (side, side), b"".join(bytes([(x >> 8) | (y >> 8) << 3 for x in range(side)]) for y in range(side)))
    return Image.merge("RGB", (red, green, blue))

def tiled(side):  # a tile of 65,536 colours, repeated: as many as the median cut takes, in a few bytes a row of PNG
    tile = Image.frombytes("RGB", (256, 256), bytes(v for y in range(256) for x in range(256) for v in (x, y, x ^ y)))
    out = Image.new("RGB", (side, side))
    for top in range(0, side, 256):
        for left in range(0, side, 256):
            out.paste(tile, (left, top))
    return out

def encoded(im, fmt, **options):
    out = io.BytesIO()
    im.save(out, fmt, **options)
    return base64.b64encode(out.getvalue()).decode()

turned = Image.Exif()
turned[0x0112] = 6
cases = [
    ("RGBA noise PNG, side and bytes, WebP", encoded(noise("RGBA", 1600, 1200, 1), "PNG"), 1300, 150_000, True),
    ("RGB noise PNG, bytes, JPEG", encoded(noise("RGB", 1600, 1200, 2), "PNG"), None, 150_000, False),
    ("65,536 colours PNG, 256 colours", encoded(tiled(2048), "PNG"), None, "half", False),
    ("gradient PNG, too many colours for 256", encoded(gradient(2048), "PNG"), None, "half", False),
    ("gradient RGBA PNG, lossless WebP", encoded(gradient(1024).convert("RGBA"), "PNG"), None, "half", True),
    ("progressive 4:4:4 JPEG, reduced", encoded(noise("RGB", 2400, 1600, 3), "JPEG", quality=30, progressive=True, subsampling=0), 400, None, False),
    ("RGBA noise WebP", encoded(noise("RGBA", 1200, 1200, 4), "WEBP", quality=30), None, 200_000, True),
    ("palette PNG with transparency", encoded(noise("L", 1600, 1600, 5).convert("P"), "PNG", transparency=7), None, 200_000, False),
    ("grey and alpha noise PNG, JPEG", encoded(noise("LA", 1600, 1600, 6), "PNG"), None, 200_000, False),
    ("turned JPEG", encoded(noise("RGB", 2400, 1600, 8), "JPEG", quality=60, exif=turned.tobytes()), None, 200_000, False),
    ("RGBA noise PNG, side only", encoded(noise("RGBA", 2400, 1800, 9), "PNG"), 2300, None, False),
    ("RGBA noise PNG at the size the model sees, lossless WebP", encoded(noise("RGBA", 2880, 1800, 10), "PNG"), None, None, True, (1389, 868)),
    ("RGB noise PNG at the size the model sees, PNG", encoded(noise("RGB", 2880, 1800, 11), "PNG"), None, None, False, (1229, 768)),
]
libc = ctypes.CDLL(None)

def resident(key):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(key + ":"))

for name, data, side, limit, webp, *native in cases:
    limit = len(data) // 2 if limit == "half" else limit  # over it, and near enough for lossless WebP
    size = native[0] if native else None
    opened = _shrink._open(data, side, limit, webp, size)
    cost = opened.cost
    del opened
    gc.collect()
    libc.malloc_trim(0)  # what earlier cases freed must not hide what this one takes
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # the peak (VmHWM) starts again from here
    before = resident("VmRSS")
    result = _shrink.shrink(data, max_side=side, max_bytes=limit, webp=webp, cache=_shrink.ShrinkCache(), size=size)
    print(json.dumps({"case": name, "cost": cost, "held": resident("VmHWM") - before, "sent": result.mime, "reason": result.reason}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="reads its peak from /proc (Linux)")
def test_what_an_image_reserves_covers_what_shrinking_it_holds() -> None:
    """The budget is only as good as each image's estimate: measured on the images that make each step hold the most."""
    out = subprocess.run([sys.executable, "-c", _ESTIMATE_PROBE, str(ROOT / "addon")], capture_output=True, text=True, check=True, timeout=600)
    cases = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(cases) == 13
    for case in cases:
        assert case["sent"] is not None, case  # each was shrunk
        assert case["held"] <= case["cost"], case
