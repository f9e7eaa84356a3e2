"""Image-token formulas pinned on the providers' documented examples, and the per-format chooser."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trimflow._tokens import (
    UNKNOWN_IMAGE_TOKENS,
    anthropic_image_tokens,
    anthropic_native_size,
    gemini3_image_tokens,
    gemini_image_tokens,
    image_tokens,
    native_size,
    openai_patch_size,
    openai_patch_tokens,
    openai_tile_size,
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
        (3000, 2000, 1536),  # scaled to 1344x896 = 48*32, the largest of its shape within 1568 patches
        (2880, 1800, 1550),  # a Retina screenshot: scaled to 1389x868 = 50*31, as Claude counts it
        (3136, 700, 728),  # scaled by 1/2 to 1568x350 = 56*13; unscaled would hit the cap
        (1092, 1092, 1521),  # 39*39, under the cap
    ],
)
def test_anthropic(w, h, tokens):
    assert anthropic_image_tokens(w, h) == tokens


def test_anthropic_high_resolution_tier_is_a_parameter():
    assert anthropic_image_tokens(2576, 1288, max_edge=2576, max_tokens=4784) == 92 * 46
    assert anthropic_image_tokens(2576, 1932, max_edge=2576, max_tokens=4784) == 79 * 60  # 92*69 is over: 2212x1659
    assert anthropic_image_tokens(2576, 1288) == 1568  # standard tier: 1568x784 = 56*28, capped


@given(sides, sides)
def test_anthropic_bounds(w, h):
    assert 1 <= anthropic_image_tokens(w, h) <= 1568


@pytest.mark.parametrize(
    ("size", "tier", "native"),
    [
        ((2880, 1800), (1568, 1568), (1389, 868)),  # the token budget binds, not the long edge
        ((5120, 2880), (1568, 1568), (1456, 819)),
        ((3136, 700), (1568, 1568), (1568, 350)),  # the long edge binds
        ((1280, 800), (1568, 1568), (1280, 800)),  # within: its own size
        ((1800, 2880), (1568, 1568), (868, 1389)),  # portrait: the same, turned
        ((8000, 20), (1568, 1568), (1568, 4)),
        ((1, 100_000), (1568, 1568), (1, 1568)),  # a one-pixel sliver keeps its pixel
        ((5120, 2880), (2576, 4784), (2576, 1449)),  # the high-resolution tier (Opus 4.7)
    ],
)
def test_anthropic_native_size(size, tier, native):
    assert anthropic_native_size(*size, *tier) == native


@given(sides, sides)
def test_anthropic_native_size_is_within_the_limits_and_the_image(w, h):
    nw, nh = anthropic_native_size(w, h)
    assert nw <= w and nh <= h and max(nw, nh) <= 1568 and -(-nw // 28) * -(-nh // 28) <= 1568


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


@pytest.mark.parametrize(
    ("w", "h", "detail", "size"),
    [
        (2880, 1800, "high", (1229, 768)),  # fits 2048x2048 (2048x1280), then the short side to 768
        (2880, 1800, None, (1229, 768)),  # auto: as high
        (2880, 1800, "low", (512, 320)),  # the 512 px version
        (4000, 1000, "high", (2048, 512)),  # the 2048 box binds; the short side is under 768 already
        (1024, 700, "high", (1024, 700)),  # within: its own size
    ],
)
def test_openai_tile_size(w, h, detail, size):
    assert openai_tile_size(w, h, detail) == size


def test_openai_patch_size_is_the_docs_example():
    assert openai_patch_size(1800, 2400) == (1056, 1408)  # 33 x 44 patches
    assert openai_patch_size(1024, 1024) == (1024, 1024)  # within the budget


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


def test_claude_estimates_count_the_models_tier():
    assert image_tokens("anthropic", "claude-sonnet-4-5", 5120, 2880) == 52 * 30  # 1456x819
    assert image_tokens("anthropic", "claude-opus-4-7", 5120, 2880) == 92 * 52  # 2576x1449
    assert image_tokens("bedrock-converse", "global.anthropic.claude-opus-4-7", 5120, 2880) == 92 * 52


# --- the size the model sees --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "model", "detail", "native"),
    [
        ("anthropic", "claude-sonnet-4-5", None, (1389, 868)),
        ("bedrock-converse", "us.anthropic.claude-sonnet-4-5-20250929-v1:0", None, (1389, 868)),
        ("anthropic", "claude-opus-4-7", None, (2420, 1512)),  # the high-resolution tier: 87*54 = 4698 patches
        ("openai-chat", "anthropic/claude-sonnet-4.5", None, (1389, 868)),  # Claude through a gateway
        ("openai-chat", "gpt-4o", "high", (1229, 768)),
        ("openai-chat", "gpt-4o-2024-11-20", "low", (512, 320)),
        ("openai-chat", "gpt-4.1", None, (1229, 768)),
        ("openai-responses", "computer-use-preview", "auto", (1229, 768)),
        ("openai-chat", "gpt-4.1-mini", None, (1536, 960)),  # 48 x 30 patches, within 1536
        ("openai-chat", "gpt-4.1-mini", "low", (1536, 960)),  # patch models ignore detail
        # Scaling not documented for the model, or documented otherwise: the image goes as it is.
        ("openai-chat", "gpt-4o", "original", None),
        ("openai-responses", "gpt-5", None, None),
        ("openai-responses", "gpt-5.4", None, None),
        ("openai-chat", "llava-1.6", None, None),
        ("openai-chat", None, None, None),
        ("anthropic", "glm-4.6", None, None),  # another provider's Messages API
        ("anthropic", None, None, None),
        ("gemini", "gemini-2.5-pro", None, None),
        ("openai-chat", "google/gemini-2.5-pro", None, None),
        ("ollama", "llava", None, None),
    ],
)
def test_native_size(fmt, model, detail, native):
    assert native_size(fmt, model, 2880, 1800, detail) == native


NATIVE_TARGETS = [
    ("anthropic", "claude-sonnet-4-5", None),
    ("anthropic", "claude-opus-4-7", None),
    ("openai-chat", "gpt-4o", "high"),
    ("openai-chat", "gpt-4o", "low"),
    ("openai-responses", "o3", None),
    ("openai-chat", "gpt-4.1-nano", None),
    ("openai-responses", "o4-mini", "auto"),
]


@given(sides, sides, st.sampled_from(NATIVE_TARGETS))
def test_an_image_at_its_native_size_stays_there_and_costs_the_same(w, h, target):
    # Sent at its native size, an image is not scaled again: the model sees what it would have seen of the
    # original, and the estimate (as the provider's count) is the same.
    fmt, model, detail = target
    native = native_size(fmt, model, w, h, detail)
    assert native is not None and native[0] <= w and native[1] <= h
    assert native_size(fmt, model, *native, detail) == native
    assert image_tokens(fmt, model, *native, detail) == image_tokens(fmt, model, w, h, detail)


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
