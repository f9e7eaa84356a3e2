"""Image-token formulas pinned on the providers' documented examples, and the per-format chooser."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trimflow._tokens import (
    UNKNOWN_IMAGE_TOKENS,
    anthropic_image_tokens,
    gemini3_image_tokens,
    gemini_image_tokens,
    image_tokens,
    openai_patch_tokens,
    openai_tile_tokens,
    text_tokens,
)

sides = st.integers(min_value=1, max_value=20_000)


# --- Anthropic ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("w", "h", "tokens"),
    [
        (1000, 1000, 1296),  # the docs' example: ceil(1000/28)^2 = 36^2
        (200, 200, 64),  # ceil(200/28) = 8
        (28, 28, 1),
        (29, 28, 2),
        (1, 1, 1),
        (3000, 2000, 1568),  # scaled to 1568x1045 = 56*38 = 2128 patches, then capped
        (3136, 700, 728),  # scaled by 1/2 to 1568x350 = 56*13; unscaled would hit the cap
        (1092, 1092, 1521),  # 39*39, under the cap
    ],
)
def test_anthropic(w, h, tokens):
    assert anthropic_image_tokens(w, h) == tokens


def test_anthropic_high_resolution_tier_is_a_parameter():
    assert anthropic_image_tokens(2576, 1288, max_edge=2576, max_tokens=4784) == 92 * 46
    assert anthropic_image_tokens(2576, 1932, max_edge=2576, max_tokens=4784) == 4784  # 92*69 capped
    assert anthropic_image_tokens(2576, 1288) == 1568  # standard tier: 1568x784 = 56*28, capped


@given(sides, sides)
def test_anthropic_bounds(w, h):
    assert 1 <= anthropic_image_tokens(w, h) <= 1568


# --- OpenAI tiles -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("w", "h", "detail", "tokens"),
    [
        (1024, 1024, "high", 765),  # -> 768x768, 4 tiles
        (1024, 1024, "auto", 765),
        (1024, 1024, None, 765),
        (1024, 1024, "low", 85),
        (1024, 1024, "LOW", 85),
        (4096, 8192, "low", 85),  # the docs' low example
        (2048, 4096, "high", 1105),  # -> 1024x2048 -> 768x1536, 6 tiles
        (512, 512, "high", 255),
        (513, 512, "high", 425),
        (100, 100, "high", 255),  # never scaled up
        (1920, 1080, "high", 1105),  # -> 1365x768: 3x2 tiles
    ],
)
def test_openai_tiles(w, h, detail, tokens):
    assert openai_tile_tokens(w, h, detail) == tokens


def test_openai_tile_variants():
    assert openai_tile_tokens(1024, 1024, "high", 2833, 5667) == 2833 + 5667 * 4  # gpt-4o-mini
    assert openai_tile_tokens(1024, 1024, "high", 75, 150) == 75 + 150 * 4  # o1 / o3
    assert openai_tile_tokens(1024, 1024, "high", 70, 140) == 70 + 140 * 4  # gpt-5
    assert openai_tile_tokens(1024, 1024, "low", 70, 140) == 70


@given(sides, sides)
def test_openai_tiles_bounds(w, h):
    # At most 2048x768 after scaling: 4x2 tiles, or 3x3 when both scaled sides pass 1024.
    assert 85 + 170 <= openai_tile_tokens(w, h) <= 85 + 170 * 9


# --- OpenAI patches -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("w", "h", "patches"),
    [
        (1024, 1024, 1024),  # doc example: 32*32, under the budget
        (1800, 2400, 1452),  # doc example: shrink 0.603 -> 1086x1448 -> 33x44 patches
        (32, 32, 1),
        (33, 32, 2),
        (1, 1, 1),
        (1254, 1254, 1521),  # 40*40 = 1600 over budget -> 39*39
    ],
)
def test_openai_patches_doc_examples(w, h, patches):
    assert openai_patch_tokens(w, h, 1.0) == patches


def test_openai_patch_factors_round_up():
    assert openai_patch_tokens(1024, 1024, 1.62) == 1659  # 1658.88 (ceil and round agree)
    assert openai_patch_tokens(1800, 2400, 1.62) == 2353  # 1452 * 1.62 = 2352.24, ceil
    assert openai_patch_tokens(1800, 2400, 2.46) == 3572  # 3571.92
    assert openai_patch_tokens(1800, 2400, 1.72) == 2498  # 2497.44
    assert openai_patch_tokens(1000, 32, 1.62) == 52  # 32 patches * 1.62 = 51.84
    # Float noise must not add a token: 1000 patches * 1.62 is 1620.0000000000002 in binary.
    assert openai_patch_tokens(25 * 32, 40 * 32, 1.62) == 1620
    assert openai_patch_tokens(40_000, 40_000, 1.62) == 2465  # 39*39 = 1521 patches: 2464.02


@given(sides, sides)
def test_openai_patches_never_exceed_budget(w, h):
    assert 1 <= openai_patch_tokens(w, h, 1.0) <= 1536


# --- Gemini -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("w", "h", "tokens"),
    [
        (384, 384, 258),
        (1, 1, 258),
        (384, 200, 258),
        (1000, 1000, 1032),  # unit 666 -> 2x2 tiles
        (385, 385, 258 * 4),  # unit 256 -> 2x2
        (3000, 1500, 258 * 6),  # unit 1000 -> 3x2
        (10, 2000, 258 * 8),  # thin strip: unit floored at 256 -> 1x8
    ],
)
def test_gemini(w, h, tokens):
    assert gemini_image_tokens(w, h) == tokens


@pytest.mark.parametrize(
    ("value", "tokens"),
    [
        (None, 1120),
        ("low", 280),
        ("MEDIA_RESOLUTION_MEDIUM", 560),
        ("media_resolution_high", 1120),
        ("ultra_high", 2240),
        ("MEDIA_RESOLUTION_UNSPECIFIED", 1120),
        ("bogus", 1120),
    ],
)
def test_gemini3(value, tokens):
    assert gemini3_image_tokens(value) == tokens


# --- the chooser --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "model", "detail", "tokens"),
    [
        ("anthropic", "claude-sonnet-4-5", None, 1296),
        ("anthropic", None, None, 1296),  # Vertex rawPredict: no model in the body
        ("bedrock-converse", "us.anthropic.claude-3-7-sonnet-20250219-v1:0", None, 1296),
        ("gemini", "gemini-2.5-flash", None, 1032),
        ("gemini", "models/gemini-2.0-flash", None, 1032),
        ("gemini", "gemini-3-pro-preview", None, 1120),
        ("gemini", "gemini-3-flash-preview", "MEDIA_RESOLUTION_LOW", 280),
        ("gemini", None, None, 1032),
        ("openai-chat", "gpt-4o", "high", 765),
        ("openai-chat", "gpt-4o", "low", 85),
        ("openai-chat", "GPT-4o-2024-08-06", None, 765),
        ("openai-chat", "openai/gpt-4o", None, 765),
        ("openai-chat", "gpt-4.1", None, 765),
        ("openai-chat", "gpt-4o-mini", None, 2833 + 5667 * 4),
        ("openai-chat", "openai/gpt-4o-mini-2024-07-18", "low", 2833),
        ("openai-responses", "o1", None, 75 + 150 * 4),
        ("openai-responses", "o3-pro", None, 75 + 150 * 4),
        ("openai-responses", "o3-mini", None, 75 + 150 * 4),
        ("openai-responses", "gpt-5", None, 70 + 140 * 4),
        ("openai-responses", "gpt-5.1-codex", None, 70 + 140 * 4),
        ("openai-responses", "gpt-5-chat-latest", "low", 70),
        ("openai-responses", "computer-use-preview", None, 65 + 129 * 4),
        ("openai-chat", "gpt-4.1-mini", None, 1659),  # 32*32 patches * 1.62 = 1658.88
        ("openai-chat", "gpt-4.1-mini", "low", 1659),  # patch models ignore detail
        ("openai-chat", "azure/gpt-4.1-nano-2025-04-14", None, 2520),  # 1024 * 2.46 = 2519.04
        ("openai-responses", "o4-mini", None, 1762),  # 1024 * 1.72 = 1761.28
        ("openai-responses", "gpt-5-mini", None, 1659),
        ("openai-responses", "gpt-5-nano", None, 2520),
        ("openai-chat", "some-local-model", None, 765),
        ("openai-chat", None, None, 765),
        ("ollama", "llava:13b", None, 765),  # generic fallback: gpt-4o tiles
        ("openai-chat", "anthropic/claude-3.5-sonnet", None, 1296),  # OpenRouter
        ("openai-chat", "google/gemini-2.5-pro", None, 1032),
    ],
)
def test_image_tokens_routing(fmt, model, detail, tokens):
    assert image_tokens(fmt, model, 1000, 1000, detail) == tokens


@pytest.mark.parametrize("fmt", ["anthropic", "bedrock-converse", "gemini", "openai-chat", "openai-responses", "ollama"])
@pytest.mark.parametrize(("w", "h"), [(None, None), (1000, None), (None, 1000), (0, 0)])
def test_unknown_dimensions(fmt, w, h):
    assert image_tokens(fmt, "whatever", w, h) == UNKNOWN_IMAGE_TOKENS == 1600


def test_gemini3_needs_no_dimensions():
    assert image_tokens("gemini", "gemini-3-pro-preview", None, None) == 1120


# --- text ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("nbytes", "tokens"), [(0, 0), (1, 1), (4, 1), (5, 2), (4000, 1000), (-3, 0)])
def test_text_tokens(nbytes, tokens):
    assert text_tokens(nbytes) == tokens
