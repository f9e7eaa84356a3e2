"""Estimated prompt tokens of an image, per provider, from its width and height.

Estimates, not bills: the true figure comes back in the response's usage. Every formula rounds up,
because these numbers decide what to prune and under-counting is the costlier mistake.
Sources are named per function; see also docs/providers.md ("Image tokens").
"""

from __future__ import annotations

import functools
import math
import re

__all__ = [
    "UNKNOWN_IMAGE_TOKENS",
    "anthropic_image_tokens",
    "gemini3_image_tokens",
    "gemini_image_tokens",
    "image_tokens",
    "openai_patch_tokens",
    "openai_tile_tokens",
    "text_tokens",
]

# When an image's size can't be read (a URL or file id, or a header we don't parse), assume a
# large screenshot: that is the common case for agents, and ~1,600 is where Anthropic's own
# downscaling tops out (1568 tokens) and a full-HD screenshot lands on gpt-4o (1105) and Gemini 3
# (1120). Guessing high keeps the estimate on the safe side of a token limit.
UNKNOWN_IMAGE_TOKENS = 1600


def _ceil_div(x: float, unit: float) -> int:
    # Scaled sizes are floats; 1535.9999999 and 1536.0000001 must both count as 1536/512 = 3.
    return max(1, math.ceil(x / unit - 1e-9))


def _side(v: int) -> int:
    return max(1, int(v))


def anthropic_image_tokens(width: int, height: int, *, max_edge: int = 1568, max_tokens: int = 1568) -> int:
    """Claude: scale the long edge down to ``max_edge``, count 28x28 px patches, cap at ``max_tokens``.

    Newer Anthropic docs: ``ceil(w/28) * ceil(h/28)``, capped at 1568 tokens (standard tier; the
    high-resolution tier caps at 4784 - pass max_edge/max_tokens for it). 1000x1000 -> 36*36 = 1296.
    The older docs' formula was ``w*h/750`` after the same long-edge scaling (1000x1000 -> 1334).
    """
    w, h = _side(width), _side(height)
    long_edge = max(w, h)
    if long_edge > max_edge:
        # Claude resizes before encoding, keeping the aspect ratio.
        scale = max_edge / long_edge
        w, h = max(1, round(w * scale)), max(1, round(h * scale))
    return min(_ceil_div(w, 28) * _ceil_div(h, 28), max_tokens)


def openai_tile_tokens(width: int, height: int, detail: str | None = "auto", base: int = 85, per_tile: int = 170) -> int:
    """OpenAI 512 px tiles (gpt-4o, gpt-4.1, gpt-4.5, o1/o3, gpt-5, gpt-4o-mini).

    ``detail="low"`` costs ``base``. Otherwise (high, auto, or anything unknown - assume the dearer
    case): fit within 2048x2048, scale the shortest side down to 768, then
    ``base + per_tile * tiles``. Only ever scales down. 1024x1024 -> 765; 2048x4096 -> 1105.
    Source: OpenAI "Images and vision" guide, "Calculating costs".
    """
    if (detail or "").strip().lower() == "low":
        return base
    w, h = float(_side(width)), float(_side(height))
    if max(w, h) > 2048:
        s = 2048 / max(w, h)
        w, h = w * s, h * s
    if min(w, h) > 768:
        s = 768 / min(w, h)
        w, h = w * s, h * s
    return base + per_tile * _ceil_div(w, 512) * _ceil_div(h, 512)


def openai_patch_tokens(width: int, height: int, factor: float, budget: int = 1536) -> int:
    """OpenAI 32 px patches (gpt-4.1-mini/nano, o4-mini, gpt-5-mini/nano), times a model factor.

    Implemented as in OpenAI's "Images and vision" guide, "Calculating costs":
      patches = ceil(w/32) * ceil(h/32); if that exceeds the budget (1536):
        r = sqrt(32*32*budget / (w*h))
        r = r * min(floor(w*r/32) / (w*r/32), floor(h*r/32) / (h*r/32))   # whole patches
        patches = ceil(w*r/32) * ceil(h*r/32), capped at the budget
      tokens = patches * factor, rounded UP (ceil; the doc gives no rounding rule).
    Doc examples: 1024x1024 -> 1024 patches; 1800x2400 -> 1452 patches (33 x 44).
    """
    w, h = _side(width), _side(height)
    patches = _ceil_div(w, 32) * _ceil_div(h, 32)
    if patches > budget:
        r = math.sqrt(32 * 32 * budget / (w * h))
        pw, ph = w * r / 32, h * r / 32
        # max(1, ...): a sliver thinner than one patch would otherwise shrink to nothing.
        r *= min(max(1, math.floor(pw)) / pw, max(1, math.floor(ph)) / ph)
        patches = min(_ceil_div(w * r, 32) * _ceil_div(h * r, 32), budget)
    # round() first so 1000 * 1.62 = 1620.0000000000002 does not ceil to 1621.
    return math.ceil(round(patches * factor, 6))


def gemini_image_tokens(width: int, height: int) -> int:
    """Gemini (1.5 / 2.x): 258 if both sides <= 384 px, else 258 per tile.

    Tiles: crop unit = floor(min(w, h) / 1.5), tiles = ceil(w/unit) * ceil(h/unit); each tile is
    scaled to 768x768. 1000x1000 -> unit 666 -> 2x2 tiles -> 1032.
    Judgement call, not from the docs: the unit is floored at 256 px so a thin strip (say 10x2000)
    is not cut into hundreds of tiles; it only changes images whose short side is under 384 px.
    """
    w, h = _side(width), _side(height)
    if w <= 384 and h <= 384:
        return 258
    unit = max(256, math.floor(min(w, h) / 1.5))
    return 258 * _ceil_div(w, unit) * _ceil_div(h, unit)


_GEMINI3_RESOLUTION = {"low": 280, "medium": 560, "high": 1120, "ultra_high": 2240}


def gemini3_image_tokens(media_resolution: str | None = None) -> int:
    """Gemini 3: a fixed budget per image set by ``media_resolution`` (default high = 1120).

    Accepts ``low``/``medium``/``high``/``ultra_high`` and the API's ``MEDIA_RESOLUTION_*`` enum
    names, any case; anything else (None, unspecified) is the default.
    """
    key = (media_resolution or "").strip().lower().removeprefix("media_resolution_")
    return _GEMINI3_RESOLUTION.get(key, 1120)


# OpenAI models by family, first match wins (so "gpt-4o-mini" before "gpt-4o"). Patterns search the
# lower-cased model name anywhere, which tolerates "openai/", "azure/", date suffixes and the like.
_PATCH_FACTORS: tuple[tuple[re.Pattern[str], float], ...] = (
    (re.compile(r"gpt-4\.1-mini"), 1.62),
    (re.compile(r"gpt-4\.1-nano"), 2.46),
    # gpt-5-mini/nano: the current OpenAI guide lists them with the patch models (1.62 / 2.46).
    (re.compile(r"gpt-5-mini"), 1.62),
    (re.compile(r"gpt-5-nano"), 2.46),
    (re.compile(r"(?<![a-z0-9])o4-mini"), 1.72),
)
_TILE_COSTS: tuple[tuple[re.Pattern[str], int, int], ...] = (
    (re.compile(r"gpt-4o-mini"), 2833, 5667),
    (re.compile(r"(?<![a-z0-9])o[13](?![a-z0-9])"), 75, 150),  # o1, o1-pro, o3, o3-mini, ...
    (re.compile(r"gpt-5"), 70, 140),  # gpt-5, gpt-5.1, gpt-5-chat-latest, gpt-5-codex, ...
    (re.compile(r"computer-use"), 65, 129),
)


def _openai_tokens(model: str, width: int, height: int, detail: str | None) -> int:
    for pattern, factor in _PATCH_FACTORS:
        if pattern.search(model):
            return openai_patch_tokens(width, height, factor)  # patch models ignore `detail`
    for pattern, base, per_tile in _TILE_COSTS:
        if pattern.search(model):
            return openai_tile_tokens(width, height, detail, base, per_tile)
    return openai_tile_tokens(width, height, detail)  # gpt-4o, gpt-4.1, gpt-4.5, unknown: 85/170


@functools.lru_cache(maxsize=1024)  # a pure function of a few values; a session repeats the same sizes
def image_tokens(fmt: str, model: str | None, width: int | None, height: int | None, detail: str | None = None) -> int:
    """Estimated tokens of one image in a request of wire format ``fmt`` to ``model``.

    - anthropic, bedrock-converse (Claude on Bedrock): Anthropic's formula.
    - gemini: Gemini's tiles; gemini-3* models use the fixed media-resolution budget, read from
      ``detail`` (default 1120).
    - openai-chat, openai-responses, ollama: by model name (patch models, the tile variants,
      else 85/170 tiles). Ollama has no published image cost, so the common gpt-4o tiles stand
      in as a generic guess. A Claude or Gemini model reached through an OpenAI-compatible
      endpoint (OpenRouter "anthropic/claude-...") is costed as that provider counts it.
    - unknown dimensions: UNKNOWN_IMAGE_TOKENS; gemini-3 needs no dimensions at all.
    """
    name = (model or "").strip().lower()
    kind = (fmt or "").strip().lower()
    if kind == "gemini" or (kind != "anthropic" and "gemini" in name):
        if re.search(r"gemini-3", name):
            return gemini3_image_tokens(detail)
        if not width or not height:
            return UNKNOWN_IMAGE_TOKENS
        return gemini_image_tokens(width, height)
    if not width or not height:
        return UNKNOWN_IMAGE_TOKENS
    if kind in ("anthropic", "bedrock-converse") or "claude" in name:
        return anthropic_image_tokens(width, height)
    return _openai_tokens(name, width, height, detail)


def text_tokens(nbytes: int) -> int:
    """Rough tokens of ``nbytes`` of text: ~4 bytes per token, rounded up."""
    return max(0, -(-int(nbytes) // 4))
