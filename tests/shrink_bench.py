"""Shrink benchmarks: time per megapixel, and the cache over a screenshot session. Figures only, no printing.

Called by scripts/bench; each function returns plain dicts of numbers so the caller can print,
compare or store them.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import random
import statistics
import time
from typing import Any

import orjson
from PIL import Image

from trimflow import _shrink
from trimflow._engine import prune_request
from trimflow._limits import Limits
from trimflow._rules import builtin_rules
from trimflow.formats import FORMATS
from trimflow.testing import PATHS, b64, image, session_body

# name -> (content, format, width, height, max_side, max_bytes): jobs the engine gives _shrink.
# "screen" is screenshot-like (flat areas, a busy window); "photo" is dense noise, the slow case.
Case = tuple[str, str, int, int, int | None, int | None]
CASES: dict[str, Case] = {
    # Thinning a full-HD screenshot to a thumbnail.
    "thumbnail-screen-png-1920x1080-to-512": ("screen", "PNG", 1920, 1080, 512, None),
    # Anthropic's many-image rule: a 2560 px screenshot to 2000 px.
    "side-screen-png-2560x1600-to-2000": ("screen", "PNG", 2560, 1600, 2000, None),
    "side-screen-jpeg-2560x1600-to-2000": ("screen", "JPEG", 2560, 1600, 2000, None),
    # Anthropic's 8000 px side on a very wide screenshot.
    "side-screen-png-9000x1200-to-8000": ("screen", "PNG", 9000, 1200, 8000, None),
    # A photo-like PNG over Anthropic's 5 MB of base64: becomes JPEG.
    "bytes-photo-png-2000x1500-to-5MiB": ("photo", "PNG", 2000, 1500, None, 5 * 2**20),
    # The worst case: a photo-like PNG that must stay PNG (a side limit only).
    "side-photo-png-2560x1600-to-2000": ("photo", "PNG", 2560, 1600, 2000, None),
}


def source(content: str, fmt: str, width: int, height: int, seed: int = 1) -> bytes:
    if content == "photo":
        return image(width, height, fmt, seed=seed, noise=0.6)
    shot = screens(1, width, height, first=seed)[0]
    if fmt == "PNG":
        return shot
    buf = io.BytesIO()
    Image.open(io.BytesIO(shot)).convert("RGB").save(buf, fmt, quality=90)
    return buf.getvalue()


def shrink_speed(cases: dict[str, Case] | None = None, repeats: int = 3) -> dict[str, dict[str, Any]]:
    """Per case: the best of `repeats` cold (uncached) shrinks, in ms and in ms per source megapixel."""
    out: dict[str, dict[str, Any]] = {}
    for name, (content, fmt, width, height, max_side, max_bytes) in (cases or CASES).items():
        data = b64(source(content, fmt, width, height))
        times = []
        result = _shrink.Shrunk()
        for _ in range(repeats):
            started = time.perf_counter()
            result = _shrink.shrink(data, max_side=max_side, max_bytes=max_bytes, cache=_shrink.ShrinkCache())
            times.append(time.perf_counter() - started)
        best_ms = min(times) * 1000
        megapixels = width * height / 1e6
        out[name] = {
            "megapixels": round(megapixels, 2),
            "ms": round(best_ms, 1),
            "ms_per_megapixel": round(best_ms / megapixels, 1),
            "base64_before": len(data),
            "base64_after": len(result.data) if result.data else None,
            "result": f"{result.mime} {result.width}x{result.height}" if result.data else result.reason or "unchanged",
        }
    return out


def screens(count: int, width: int = 1920, height: int = 1080, first: int = 0) -> list[bytes]:
    """Distinct screenshot-like PNGs: flat areas (a gradient), a window that moves, a busy patch in it."""
    base = Image.open(io.BytesIO(image(width, height, "PNG", noise=0.0))).convert("RGB")
    shots = []
    for i in range(first, first + count):
        screen = base.copy()
        x = (60 + 53 * i) % max(1, width - 700)
        screen.paste((40 * i % 256, 120, 200), (x, 100, x + 600, 500))
        busy = Image.frombytes("RGB", (400, 250), random.Random(i).randbytes(400 * 250 * 3))
        screen.paste(busy, (x + 100, 200))
        buf = io.BytesIO()
        screen.save(buf, "PNG")
        shots.append(buf.getvalue())
    return shots


def session_cache(
    turns: int = 30, wire_format: str = "anthropic", limits: Limits | None = None, size: tuple[int, int] = (1920, 1080)
) -> dict[str, Any]:
    """A screenshot session through the engine with thinning on: one new screenshot per turn.

    Every turn re-sends the whole history, so each older screenshot is thinned on every turn
    after it became old: the first time an encode, later turns cache hits. Returns the cache's
    hits, misses and hit rate over the session (at best every screenshot but the last is encoded
    once: `misses_minimum`), and the per-turn engine overhead. Swaps in a cold cache of its own
    for the run, so it is not meant to run beside live traffic.
    """
    limits = limits or Limits(max_images=20, keep_recent=1, thumbnail_side=512, max_image_bytes=5 * 2**20, max_image_side=8000)
    rules = dataclasses.replace(builtin_rules(), defaults=limits)
    shots = screens(turns, *size)
    url = f"https://api.example.test{PATHS[wire_format]}"
    saved_cache = _shrink.CACHE
    cache = _shrink.CACHE = _shrink.ShrinkCache()
    overheads, thinned, saved = [], 0, 0
    try:
        for turn in range(1, turns + 1):
            body = _session(wire_format, shots[:turn])
            outcome = prune_request(url, {}, orjson.dumps(body), rules)
            record = outcome.record
            assert record is not None
            overheads.append(record.overhead_ms)
            thinned += record.thinned
            saved += record.thinned_bytes_saved
    finally:
        _shrink.CACHE = saved_cache
    lookups = cache.hits + cache.misses
    return {
        "turns": turns,
        "hits": cache.hits,
        "misses": cache.misses,
        "misses_minimum": turns - 1,
        "hit_rate": round(cache.hits / lookups, 3) if lookups else None,
        "thinned_images": thinned,
        "thinned_bytes_saved": saved,
        "overhead_ms_median": round(statistics.median(overheads), 1),
        "overhead_ms_max": round(max(overheads), 1),
        "overhead_ms_last_turn": round(overheads[-1], 1),
        "cache_bytes": cache.bytes,
    }


def _session(wire_format: str, shots: list[bytes]) -> dict[str, Any]:
    """session_body with a distinct screenshot per turn (session_body repeats one)."""
    body = session_body(wire_format, len(shots), shots[0], "image/png")
    module = FORMATS[wire_format]
    paths = [m.path for m in module.find_media(body) if m.kind == "image"]
    return module.replace_data(body, {path: (b64(shot), "image/png") for path, shot in zip(paths, shots, strict=True)})


# --- real-looking screenshots, and what each rescue step keeps of their text ---------------------------------

# Logical desktop size; a 2x (Retina) display has twice as many pixels each way.
DESKTOP = (1440, 900)
_WORDS = (
    "settings account profile network display privacy update search filter export import project branch commit "
    "review status pending failed passed deploy window editor terminal preview invoice total amount customer order "
    "shipping address submit cancel apply open close save delete rename share download upload folder document"
).split()
_CODE = (
    "def", "return", "import", "class", "self", "for", "in", "if", "else", "None", "await", "async", "yield", "lambda",
    "value", "items", "result", "config", "request", "response", "=", "==", "(", ")", "[", "]", ":", "0", "1", "42",
)  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class Screenshot:
    """A rendered screen and where text was drawn on it (boxes in its own pixels)."""

    name: str
    image: Image.Image
    text_boxes: tuple[tuple[int, int, int, int], ...]

    def png(self) -> bytes:
        buf = io.BytesIO()
        self.image.save(buf, "PNG", compress_level=6)
        return buf.getvalue()


def screenshot(content: str, scale: int = 1, size: tuple[int, int] = DESKTOP, seed: int = 7) -> Screenshot:
    """A screen as an agent sees it: `ui` (a light app with forms and text), `code` (a dark editor), `photo`
    (a photographic wallpaper behind a text window). `scale` 2 renders a 2x display: the same layout, every
    length doubled, text as crisp as a Retina screenshot's."""
    from PIL import ImageDraw, ImageFilter, ImageFont

    rng = random.Random(seed)
    width, height = size[0] * scale, size[1] * scale
    boxes: list[tuple[int, int, int, int]] = []

    def font(px: int) -> Any:
        return ImageFont.load_default(size=px * scale)

    if content == "photo":
        # Smooth large shapes with fine grain: what a camera picture looks like to an encoder.
        small = Image.frombytes("RGB", (24, 15), rng.randbytes(24 * 15 * 3)).resize((width, height), Image.Resampling.BICUBIC)
        grain = Image.frombytes("RGB", (width // 2, height // 2), rng.randbytes(width // 2 * height // 2 * 3))
        grain = grain.filter(ImageFilter.GaussianBlur(1)).resize((width, height), Image.Resampling.BILINEAR)
        screen = Image.blend(small, grain, 0.22)
    else:
        screen = Image.new("RGB", (width, height), (236, 238, 242) if content == "ui" else (30, 32, 38))
    draw = ImageDraw.Draw(screen)

    def text(x: int, y: int, words: str, px: int, fill: tuple[int, int, int]) -> None:
        f = font(px)
        draw.text((x * scale, y * scale), words, fill=fill, font=f)
        box = draw.textbbox((x * scale, y * scale), words, font=f)
        boxes.append((box[0] - scale, box[1] - scale, box[2] + scale, box[3] + scale))

    def line(n: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(n)).capitalize()

    W, H = size
    # Menu bar and a window with a title bar.
    draw.rectangle((0, 0, width, 24 * scale), fill=(250, 250, 250))
    for i, name in enumerate(("File", "Edit", "View", "Window", "Help")):
        text(16 + 64 * i, 6, name, 12, (20, 20, 20))
    if content == "photo":
        left, top, right, bottom = 120, 120, 1120, 600
    else:
        left, top, right, bottom = 40, 48, W - 40, H - 30
    draw.rectangle((left * scale, top * scale, right * scale, bottom * scale), fill=(30, 32, 38) if content == "code" else (255, 255, 255))
    draw.rectangle((left * scale, top * scale, right * scale, (top + 28) * scale), fill=(222, 224, 228) if content != "code" else (44, 46, 54))
    text(left + 80, top + 8, line(4), 13, (40, 40, 40) if content != "code" else (200, 200, 200))
    if content == "code":
        for row in range((bottom - top - 50) // 18):
            y = top + 40 + 18 * row
            text(left + 12, y, f"{row + 1:4d}", 12, (110, 110, 120))
            x = left + 60 + 16 * rng.randint(0, 4)
            for _ in range(rng.randint(2, 9)):
                token = rng.choice(_CODE)
                colour = rng.choice(((220, 220, 170), (86, 156, 214), (206, 145, 120), (181, 206, 168), (212, 212, 212)))
                text(x, y, token, 13, colour)
                x += 9 * len(token) + 9
                if x > right - 120:
                    break
    else:
        # A sidebar, headings, paragraphs, buttons.
        draw.rectangle((left * scale, (top + 28) * scale, (left + 220) * scale, bottom * scale), fill=(246, 247, 249))
        for row in range((bottom - top - 60) // 26):
            text(left + 20, top + 44 + 26 * row, line(2), 13, (50, 50, 60))
        x0 = left + 250
        y = top + 48
        while y < bottom - 60:
            if rng.random() < 0.2:
                text(x0, y, line(3), 20, (10, 10, 10))
                y += 34
            elif rng.random() < 0.25:
                for b in range(3):
                    bx = x0 + 130 * b
                    draw.rounded_rectangle((bx * scale, y * scale, (bx + 110) * scale, (y + 28) * scale), 6 * scale, fill=(37, 99, 235))
                    text(bx + 14, y + 7, rng.choice(_WORDS).capitalize(), 13, (255, 255, 255))
                y += 42
            else:
                text(x0, y, line(rng.randint(6, 14)), 14, (40, 40, 48))
                y += 22
    return Screenshot(f"{content} {width}x{height}", screen, tuple(boxes))


def ssim(a: Image.Image, b: Image.Image, window: int = 8) -> float:
    """Mean structural similarity of two same-size greyscale images over window x window blocks (Wang et al.
    2004, constants for 8-bit), in pure Python: the text regions it is given are small."""
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    width, height = a.size
    pa, pb = a.tobytes(), b.tobytes()
    scores = []
    n = window * window
    for y0 in range(0, height - window + 1, window):
        for x0 in range(0, width - window + 1, window):
            xs = [pa[(y0 + dy) * width + x0 + dx] for dy in range(window) for dx in range(window)]
            ys = [pb[(y0 + dy) * width + x0 + dx] for dy in range(window) for dx in range(window)]
            mx, my = sum(xs) / n, sum(ys) / n
            vx = sum((v - mx) ** 2 for v in xs) / n
            vy = sum((v - my) ** 2 for v in ys) / n
            cov = sum((u - mx) * (v - my) for u, v in zip(xs, ys, strict=True)) / n
            scores.append(((2 * mx * my + c1) * (2 * cov + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2)))
    return sum(scores) / len(scores) if scores else 1.0


def text_legibility(shot: Screenshot, encoded: bytes, boxes: int = 40) -> float:
    """SSIM of the text regions of `shot` and of `encoded` (any format, any size: scaled back to the screen's
    size the way a reader zooms in), greyscale. 1.0 is identical; JPEG ringing and downscaling blur lower it."""
    with Image.open(io.BytesIO(encoded)) as im:
        seen = im.convert("L")
    if seen.size != shot.image.size:
        seen = seen.resize(shot.image.size, Image.Resampling.BICUBIC)
    original = shot.image.convert("L")
    step = max(1, len(shot.text_boxes) // boxes)
    scores = [ssim(original.crop(box), seen.crop(box)) for box in shot.text_boxes[::step][:boxes]]
    return round(statistics.mean(scores), 3)


# The rescue steps measured on each screenshot: (label, format, Pillow save options, scale of each side).
RESCUE_STEPS: tuple[tuple[str, str, dict[str, Any], float], ...] = (
    ("PNG level 9 (lossless)", "PNG", {"compress_level": 9}, 1.0),
    ("WebP lossless", "WEBP", {"lossless": True, "quality": 80, "method": 4}, 1.0),
    ("PNG 256 colours", _shrink.PALETTE, {}, 1.0),
    *((f"WebP q{q}", "WEBP", {"quality": q, "method": 4}, 1.0) for q in _shrink.QUALITIES),
    *((f"JPEG q{q}", "JPEG", {"quality": q}, 1.0) for q in _shrink.QUALITIES),
    ("downscale 0.75, WebP q85", "WEBP", {"quality": 85, "method": 4}, 0.75),
    ("downscale 0.5625, WebP q85", "WEBP", {"quality": 85, "method": 4}, 0.5625),
    ("downscale 0.5625, JPEG q85", "JPEG", {"quality": 85}, 0.5625),
)
RESCUE_SCREENS: tuple[tuple[str, int, tuple[int, int]], ...] = (
    ("ui", 1, DESKTOP),
    ("ui", 2, DESKTOP),
    ("code", 1, DESKTOP),
    ("code", 2, DESKTOP),
    ("photo", 1, DESKTOP),
    ("photo", 2, DESKTOP),
    ("photo", 2, (2560, 1440)),  # a 5120x2880 Retina screenshot
)


def _save(frame: Image.Image, fmt: str, options: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    frame.save(buf, fmt, **options)
    return buf.getvalue()


def rescue_table(screens: tuple[tuple[str, int, tuple[int, int]], ...] = RESCUE_SCREENS) -> list[dict[str, Any]]:
    """Per screenshot and rescue step: bytes, base64 length, dimensions, text legibility (SSIM of the text
    regions, tests.shrink_bench.text_legibility) and the encode time; then what `_shrink.shrink` picks under
    Anthropic's 5 MiB and under a quarter of the PNG's size, with WebP allowed and not."""
    rows: list[dict[str, Any]] = []
    for content, scale, size in screens:
        shot = screenshot(content, scale, size)
        png = shot.png()
        rows.append(
            {"screen": shot.name, "step": "PNG as captured", "bytes": len(png), "dims": "x".join(map(str, shot.image.size)), "legibility": 1.0}
        )
        for label, fmt, options, factor in RESCUE_STEPS:
            frame = shot.image
            if factor != 1.0:
                frame = frame.resize((round(frame.width * factor), round(frame.height * factor)), Image.Resampling.LANCZOS, reducing_gap=3.0)
            started = time.perf_counter()
            data = _shrink._encode(frame, fmt, 6) if fmt == _shrink.PALETTE else _save(frame, fmt, options)
            elapsed = time.perf_counter() - started
            rows.append(
                {
                    "screen": shot.name,
                    "step": label,
                    "bytes": len(data),
                    "dims": f"{frame.width}x{frame.height}",
                    "legibility": text_legibility(shot, data),
                    "encode_ms": round(elapsed * 1000),
                }
            )
        payload = b64(png)
        for limit_name, limit in (("5 MiB", 5 * 2**20), ("1/4 of the PNG", len(payload) // 4)):
            for webp in (True, False):
                picked = _shrink.shrink(payload, max_side=None, max_bytes=limit, webp=webp, cache=_shrink.ShrinkCache())
                data = base64.b64decode(picked.data) if picked.data else png
                rows.append(
                    {
                        "screen": shot.name,
                        "step": f"trimflow under {limit_name}, {'WebP allowed' if webp else 'no WebP'}",
                        "bytes": len(data),
                        "dims": f"{picked.width}x{picked.height}" if picked.data else "x".join(map(str, shot.image.size)),
                        "legibility": text_legibility(shot, data),
                        "result": picked.mime or "unchanged",
                    }
                )
    return rows
