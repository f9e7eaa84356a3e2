"""Estimated prompt tokens of an image, per provider, from its width and height; and the size each provider
scales an image to before its model sees it, which the token formulas count on.

Estimates, not bills: the true figure comes back in the response's usage. Every formula rounds up,
because these numbers decide what to prune and under-counting is the costlier mistake.
Sources are named per function; see also docs/providers.md ("Image tokens").

`native_size` is the one place that says which size a model sees an image at: the policy sends an image
over it at that size (the `native_size` rule), the estimates count it, and the click mapping
(trimflow._clicks) reads Claude's coordinates in it. It answers only where the provider documents its
resize for the model; elsewhere (Gemini, Ollama, models not listed here) it says nothing and nothing changes.
"""

from __future__ import annotations

import functools
import math
import re

__all__ = [
    "UNKNOWN_IMAGE_TOKENS",
    "anthropic_image_tokens",
    "anthropic_native_size",
    "claude_tier",
    "gemini3_image_tokens",
    "gemini_image_tokens",
    "image_tokens",
    "native_size",
    "openai_patch_size",
    "openai_patch_tokens",
    "openai_tile_size",
    "openai_tile_tokens",
    "text_tokens",
]

Size = tuple[int, int]

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


# Claude's native resolution (the vision docs): the long edge and the visual-token budget, a token being a 28x28 px
# patch. The high-resolution tier is the models named here; every other Claude model is standard.
CLAUDE_PATCH = 28
CLAUDE_STANDARD = (1568, 1568)
CLAUDE_HIGH_RES = (2576, 4784)
_CLAUDE_HIGH_RES_MODELS = re.compile(r"claude-opus-4-7")


def claude_tier(model: str | None) -> tuple[int, int]:
    """(long edge, visual-token budget) of a Claude model's native resolution; the standard tier for any other name."""
    return CLAUDE_HIGH_RES if model is not None and _CLAUDE_HIGH_RES_MODELS.search(model.lower()) else CLAUDE_STANDARD


def anthropic_native_size(width: int, height: int, max_edge: int = 1568, max_tokens: int = 1568) -> Size:
    """The size Claude scales an image to before the model sees it: the image itself when its long edge is at most
    ``max_edge`` and ``ceil(w/28) * ceil(h/28)`` at most ``max_tokens``; else the largest size of its aspect ratio
    within both (the long side in whole pixels, the short side rounded from it). 2880x1800 -> 1389x868 (1550 tokens).
    Source: Anthropic "Vision" (image size, the token formula) and "Coordinates and bounding boxes" (the image
    Claude sees, after its own resize); docs/providers.md.
    """
    w, h = _side(width), _side(height)

    def fits(a: int, b: int) -> bool:
        return max(a, b) <= max_edge and math.ceil(a / CLAUDE_PATCH) * math.ceil(b / CLAUDE_PATCH) <= max_tokens

    if fits(w, h):
        return w, h
    long_side, short_side = max(w, h), min(w, h)
    # The largest long side (the short one keeping the aspect ratio) within both limits, from the bound of the long
    # edge and of the area down.
    scale = min(max_edge / long_side, math.sqrt(max_tokens * CLAUDE_PATCH * CLAUDE_PATCH / (w * h)))
    for side in range(max(1, min(long_side, math.floor(long_side * scale))), 0, -1):
        other = max(1, round(short_side * side / long_side))
        size = (side, other) if w >= h else (other, side)
        if fits(*size):
            return size
    return (1, 1)


def anthropic_image_tokens(width: int, height: int, *, max_edge: int = 1568, max_tokens: int = 1568) -> int:
    """Claude: ``ceil(w/28) * ceil(h/28)`` of the image at its native size (`anthropic_native_size`).

    Newer Anthropic docs: ``ceil(w/28) * ceil(h/28)``, at most 1568 tokens (standard tier; the
    high-resolution tier allows 4784 - pass max_edge/max_tokens for it). 1000x1000 -> 36*36 = 1296.
    The older docs' formula was ``w*h/750`` after scaling the long edge to 1568 px (1000x1000 -> 1334).
    """
    w, h = anthropic_native_size(width, height, max_edge, max_tokens)
    return _ceil_div(w, CLAUDE_PATCH) * _ceil_div(h, CLAUDE_PATCH)


def _scaled(width: int, height: int, scale: float) -> Size:
    """Both sides times ``scale`` (at most 1), each rounded up to whole pixels: a side that lands on a tile or patch
    boundary stays on it, so the scaled size covers as many tiles or patches as the provider's formula counts."""
    if scale >= 1:
        return width, height
    return min(width, max(1, math.ceil(width * scale - 1e-6))), min(height, max(1, math.ceil(height * scale - 1e-6)))


def openai_tile_size(width: int, height: int, detail: str | None = "auto") -> Size:
    """The size OpenAI's tile models scale an image to: ``detail="low"`` fits it in 512x512; otherwise (high, auto,
    or anything unknown) it fits in 2048x2048, then its shortest side goes down to 768. Only ever scales down.
    2880x1800 -> 1229x768. Source: OpenAI "Images and vision" guide, "Calculating costs"."""
    w, h = _side(width), _side(height)
    if (detail or "").strip().lower() == "low":
        return _scaled(w, h, 512 / max(w, h))
    scale = min(1.0, 2048 / max(w, h))
    scale *= min(1.0, 768 / (min(w, h) * scale))
    return _scaled(w, h, scale)


def openai_tile_tokens(width: int, height: int, detail: str | None = "auto", base: int = 85, per_tile: int = 170) -> int:
    """OpenAI 512 px tiles (gpt-4o, gpt-4.1, gpt-4.5, o1/o3, gpt-5, gpt-4o-mini).

    ``detail="low"`` costs ``base``. Otherwise (high, auto, or anything unknown - assume the dearer
    case): fit within 2048x2048, scale the shortest side down to 768, then
    ``base + per_tile * tiles``. Only ever scales down. 1024x1024 -> 765; 2048x4096 -> 1105.
    Source: OpenAI "Images and vision" guide, "Calculating costs".
    """
    if (detail or "").strip().lower() == "low":
        return base
    w, h = openai_tile_size(width, height, "high")
    return base + per_tile * _ceil_div(w, 512) * _ceil_div(h, 512)


def openai_patch_size(width: int, height: int, budget: int = 1536) -> Size:
    """The size OpenAI's patch models scale an image to: the image itself within ``budget`` patches of 32x32 px, else
    scaled down to whole patches within it (the formula of `openai_patch_tokens`). 1800x2400 -> 1056x1408."""
    w, h = _side(width), _side(height)
    if _ceil_div(w, 32) * _ceil_div(h, 32) <= budget:
        return w, h
    r = math.sqrt(32 * 32 * budget / (w * h))
    pw, ph = w * r / 32, h * r / 32
    # max(1, ...): a sliver thinner than one patch would otherwise shrink to nothing.
    r *= min(max(1, math.floor(pw)) / pw, max(1, math.floor(ph)) / ph)
    return _scaled(w, h, r)


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
    w, h = openai_patch_size(width, height, budget)
    patches = min(_ceil_div(w, 32) * _ceil_div(h, 32), budget)
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
# Patch models are all scaled as the guide says (native_size); of the tile models, `scaled` says whether the guide's
# scaling is what the model sees. Not for gpt-5 and its point releases: they are costed with the tiles the guide gave
# at gpt-5's launch, which its later releases are not documented with (they take an `original` detail, docs/providers.md),
# so an image to them is never scaled down; nor for a model this table does not name.
_PATCH_FACTORS: tuple[tuple[re.Pattern[str], float], ...] = (
    (re.compile(r"gpt-4\.1-mini"), 1.62),
    (re.compile(r"gpt-4\.1-nano"), 2.46),
    # gpt-5-mini/nano: the current OpenAI guide lists them with the patch models (1.62 / 2.46).
    (re.compile(r"gpt-5-mini"), 1.62),
    (re.compile(r"gpt-5-nano"), 2.46),
    (re.compile(r"(?<![a-z0-9])o4-mini"), 1.72),
)
_PATCH_BUDGET = 1536
_TILE_COSTS: tuple[tuple[re.Pattern[str], int, int, bool], ...] = (
    (re.compile(r"gpt-4o-mini"), 2833, 5667, True),
    (re.compile(r"(?<![a-z0-9])o[13](?![a-z0-9])"), 75, 150, True),  # o1, o1-pro, o3, o3-mini, ...
    (re.compile(r"gpt-5"), 70, 140, False),  # gpt-5, gpt-5.1, gpt-5-chat-latest, gpt-5-codex, ...
    (re.compile(r"computer-use"), 65, 129, True),
    (re.compile(r"gpt-4o|gpt-4\.1|gpt-4\.5"), 85, 170, True),
)
_DETAILS = ("auto", "high", "low")  # the `detail` values the guide's formulas know


def _openai_tokens(model: str, width: int, height: int, detail: str | None) -> int:
    for pattern, factor in _PATCH_FACTORS:
        if pattern.search(model):
            return openai_patch_tokens(width, height, factor, _PATCH_BUDGET)  # patch models ignore `detail`
    for pattern, base, per_tile, _ in _TILE_COSTS:
        if pattern.search(model):
            return openai_tile_tokens(width, height, detail, base, per_tile)
    return openai_tile_tokens(width, height, detail)  # unknown: gpt-4o's 85/170


def _openai_native(model: str, width: int, height: int, detail: str | None) -> Size | None:
    shown = (detail or "auto").strip().lower()
    if shown not in _DETAILS:
        return None  # a detail the formulas do not know (gpt-5.4's "original"): the image goes as it is
    for pattern, _ in _PATCH_FACTORS:
        if pattern.search(model):
            size = openai_patch_size(width, height, _PATCH_BUDGET)
            # The guide's scaling can land a patch row over the budget, which the provider would scale again.
            return size if _ceil_div(size[0], 32) * _ceil_div(size[1], 32) <= _PATCH_BUDGET else None
    for pattern, _, _, scaled in _TILE_COSTS:
        if pattern.search(model):
            return openai_tile_size(width, height, shown) if scaled else None
    return None


@functools.lru_cache(maxsize=1024)  # a pure function of a few values; a session repeats the same sizes
def native_size(fmt: str, model: str | None, width: int | None, height: int | None, detail: str | None = None) -> Size | None:
    """The size the provider scales an image of ``width`` x ``height`` to before ``model`` sees it (the image's own
    size when it is within), where the provider documents that scaling for the model; None where it does not.

    - Claude, in any wire format but Gemini's and Ollama's (OpenRouter's "anthropic/claude-..." too):
      `anthropic_native_size` at the model's tier (`claude_tier`). A model without "claude" in its name behind the
      anthropic format (another provider's Messages API) is not Claude.
    - OpenAI chat and Responses: the patch models' budget, the tile models' `detail` (`openai_tile_size`), for the
      models of the tables above that say so; never for an unknown `detail` value.
    - Gemini (its tiles are counted on crops, not on a scaled image), Ollama, any other model, an unknown size: None.
    """
    name = (model or "").strip().lower()
    kind = (fmt or "").strip().lower()
    if not width or not height or not name or kind in ("gemini", "ollama") or "gemini" in name:
        return None
    if "claude" in name:
        return anthropic_native_size(width, height, *claude_tier(name))
    if kind in ("openai-chat", "openai-responses"):
        return _openai_native(name, width, height, detail)
    return None


@functools.lru_cache(maxsize=1024)  # a pure function of a few values; a session repeats the same sizes
def image_tokens(fmt: str, model: str | None, width: int | None, height: int | None, detail: str | None = None) -> int:
    """Estimated tokens of one image in a request of wire format ``fmt`` to ``model``.

    - anthropic, bedrock-converse (Claude on Bedrock): Anthropic's formula, at the model's tier.
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
        max_edge, max_tokens = claude_tier(name)
        return anthropic_image_tokens(width, height, max_edge=max_edge, max_tokens=max_tokens)
    return _openai_tokens(name, width, height, detail)


def text_tokens(nbytes: int) -> int:
    """Rough tokens of ``nbytes`` of text: ~4 bytes per token, rounded up."""
    return max(0, -(-int(nbytes) // 4))
