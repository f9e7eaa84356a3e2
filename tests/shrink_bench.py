"""Shrink benchmarks: time per megapixel, and the cache over a screenshot session. Figures only, no printing.

Called by scripts/bench; each function returns plain dicts of numbers so the caller can print,
compare or store them.
"""

from __future__ import annotations

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
from trimflow._policy import Limits
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
