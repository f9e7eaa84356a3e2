"""The prompt cache model against the providers' documented behaviour.

Anthropic (platform.claude.com/docs/en/build-with-claude/prompt-caching): a multi-turn conversation with a
breakpoint on the last block reads the previous turn's prefix; below the minimum nothing is cached; entries
live 5 minutes (or an hour), refreshed by each read; a fifth breakpoint is a 400; a change at block N means
everything after N is written again, and a read looks back about 20 blocks. OpenAI
(platform.openai.com/docs/guides/prompt-caching): cached tokens from 1,024 in steps of 128. Gemini
(ai.google.dev/gemini-api/docs/caching): implicit caching from 2.5 on, above a minimum by model.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
from PIL import Image

from trimflow._tokens import anthropic_image_tokens, openai_tile_tokens, text_tokens
from trimflow.testing import b64, data_url
from trimflow.testing._cache_model import (
    LOOKBACK_BLOCKS,
    MAX_BREAKPOINTS_TEXT,
    CacheModel,
    CacheUsage,
    TooManyBreakpoints,
    caching_for,
    prompt_of,
)

ANTHROPIC = "/v1/messages"
EPHEMERAL = {"type": "ephemeral"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache(clock: Clock) -> CacheModel:
    return CacheModel(clock)


def text(tokens: int, tag: str = "") -> str:
    """About `tokens` tokens of text (4 bytes each), different for each tag."""
    return (tag + " " + "word " * tokens)[: tokens * 4]


def block(tokens: int, tag: str, cached: bool = False) -> dict[str, Any]:
    b: dict[str, Any] = {"type": "text", "text": text(tokens, tag)}
    if cached:
        b["cache_control"] = EPHEMERAL
    return b


def conversation(turns: int, *, model: str = "claude-sonnet-4-6", system_tokens: int = 1500, turn_tokens: int = 300) -> dict[str, Any]:
    """Claude Code's shape: a breakpoint on the system prompt and one on the last block of the last message."""
    messages: list[dict[str, Any]] = []
    for t in range(1, turns + 1):
        messages.append({"role": "user", "content": [block(turn_tokens, f"question {t}")]})
        if t < turns:
            messages.append({"role": "assistant", "content": [block(turn_tokens, f"answer {t}")]})
    messages[-1]["content"][-1]["cache_control"] = EPHEMERAL
    return {"model": model, "max_tokens": 100, "system": [block(system_tokens, "system", cached=True)], "messages": messages}


def prefix_tokens(body: dict[str, Any], units: int, fmt: str = "anthropic", path: str = ANTHROPIC) -> int:
    prompt = prompt_of(fmt, path, body)
    assert prompt is not None
    return sum(u.tokens for u in prompt.units[:units])


def use(cache: CacheModel, body: dict[str, Any], fmt: str = "anthropic", path: str = ANTHROPIC) -> CacheUsage:
    usage = cache.request(fmt, path, body)
    assert usage is not None
    assert usage.cache_read_tokens + usage.cache_write_tokens + usage.uncached_tokens == usage.prompt_tokens
    return usage


# --- Anthropic --------------------------------------------------------------------------------------------


def test_multi_turn_conversation_reads_the_previous_turns_prefix(cache: CacheModel, clock: Clock) -> None:
    first = use(cache, conversation(1))
    # Turn 1 writes everything up to its last breakpoint (the last block): nothing after it.
    assert first.cache_read_tokens == 0 and first.cache_write_tokens == first.prompt_tokens and first.uncached_tokens == 0
    clock.now += 30
    second = use(cache, conversation(2))
    assert second.cache_read_tokens == first.prompt_tokens  # turn 1's whole prompt, read at 0.1x
    assert second.cache_write_tokens == second.prompt_tokens - first.prompt_tokens  # the answer and the new question
    clock.now += 30
    third = use(cache, conversation(3))
    assert third.cache_read_tokens == second.prompt_tokens and third.stored_tokens == third.prompt_tokens


def test_input_tokens_are_what_follows_the_last_breakpoint(cache: CacheModel) -> None:
    body = conversation(1)
    body["messages"][0]["content"] = [block(300, "cached", cached=True), block(200, "after")]
    usage = use(cache, body)
    assert usage.uncached_tokens == prefix_tokens(body, 3) - prefix_tokens(body, 2) > 190
    assert usage.cache_write_tokens == prefix_tokens(body, 2)


def test_cache_control_is_not_part_of_the_prefix(cache: CacheModel) -> None:
    """Agents move their breakpoint every turn: the block that lost its cache_control still matches."""
    first = use(cache, conversation(2))
    body = conversation(2)
    body["messages"][-1]["content"].append(block(50, "more", cached=True))
    del body["messages"][-1]["content"][0]["cache_control"]
    assert use(cache, body).cache_read_tokens == first.prompt_tokens


def test_below_the_minimum_nothing_is_cached(cache: CacheModel) -> None:
    small = conversation(1, system_tokens=400, turn_tokens=300)  # ~700 tokens: under Sonnet's 1,024
    for _ in range(2):
        usage = use(cache, small)
        assert usage.cache_read_tokens == usage.cache_write_tokens == 0 and usage.uncached_tokens == usage.prompt_tokens
    assert len(cache) == 0


@pytest.mark.parametrize(
    ("model", "minimum"),
    [
        ("claude-sonnet-4-6", 1024),
        ("claude-sonnet-4-5-20250929", 1024),
        ("claude-opus-4-1", 1024),
        ("claude-opus-4-5", 4096),
        ("claude-opus-4-6", 4096),
        ("claude-haiku-4-5", 4096),
        ("claude-3-5-haiku-latest", 2048),
        ("claude-3-haiku-20240307", 2048),
        ("anthropic.claude-haiku-4-5-20251001-v1:0", 4096),
    ],
)
def test_minimum_cacheable_length_by_model(model: str, minimum: int, clock: Clock) -> None:
    assert (caching := caching_for("anthropic", model)) is not None and caching.minimum == minimum
    cache = CacheModel(clock)
    body = conversation(1, model=model, system_tokens=minimum - 200, turn_tokens=400)  # the system prompt alone is under it
    usage = use(cache, body)
    assert prefix_tokens(body, 1) < minimum <= usage.prompt_tokens
    # Only the last breakpoint's prefix is long enough: it is written from the start, the system one is not.
    assert usage.cache_write_tokens == usage.prompt_tokens and len(cache) == 1


def test_five_minute_ttl_refreshed_by_each_read(cache: CacheModel, clock: Clock) -> None:
    body = conversation(1)
    written = use(cache, body).cache_write_tokens
    for _ in range(3):
        clock.now += 299  # each read within 5 minutes of the last use keeps the entry alive
        assert use(cache, body).cache_read_tokens == written
    clock.now += 300  # 5 minutes without a use: gone
    expired = use(cache, body)
    assert expired.cache_read_tokens == 0 and expired.cache_write_tokens == written


def test_one_hour_ttl(cache: CacheModel, clock: Clock) -> None:
    body = conversation(2)
    body["system"][0]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    first = use(cache, body)
    system = prefix_tokens(body, 1)
    assert first.cache_write_1h_tokens == system and first.cache_write_tokens == first.prompt_tokens
    clock.now += 1800  # the 5-minute entry is gone, the 1-hour one is not
    later = use(cache, body)
    assert later.cache_read_tokens == system and later.cache_write_tokens == first.prompt_tokens - system
    clock.now += 3600
    assert use(cache, body).cache_read_tokens == 0


def test_more_than_four_breakpoints_is_refused(cache: CacheModel) -> None:
    body = conversation(2)
    body["tools"] = [
        {"name": f"tool{i}", "description": text(50, f"tool {i}"), "input_schema": {"type": "object"}, "cache_control": EPHEMERAL} for i in range(2)
    ]
    use(cache, body)  # 4 markers: tools x2, system, last block
    body["messages"][0]["content"][0]["cache_control"] = EPHEMERAL
    with pytest.raises(TooManyBreakpoints) as refused:
        cache.request("anthropic", ANTHROPIC, body)
    assert str(refused.value) == MAX_BREAKPOINTS_TEXT.format(found=5) == "A maximum of 4 blocks with cache_control may be provided. Found 5."


def test_automatic_caching_marks_the_last_block(cache: CacheModel) -> None:
    body = conversation(2)
    for message in body["messages"]:
        for b in message["content"]:
            b.pop("cache_control", None)
    body["cache_control"] = EPHEMERAL
    usage = use(cache, body)
    assert usage.cache_write_tokens == usage.prompt_tokens


def test_a_change_at_block_n_writes_everything_after_it_again(cache: CacheModel, clock: Clock) -> None:
    body = conversation(10)  # 19 message blocks after the system prompt
    first = use(cache, body)
    system = prefix_tokens(body, 1)
    changed = conversation(10)
    changed["messages"][4]["content"][0]["text"] = text(300, "an image became a placeholder")
    clock.now += 10
    usage = use(cache, changed)
    # The entries are at the breakpoints (the system prompt, the last block): the read falls back to the system prompt.
    assert usage.cache_read_tokens == system
    assert usage.cache_write_tokens == usage.prompt_tokens - system
    assert usage.prompt_tokens == first.prompt_tokens


def test_the_read_looks_back_twenty_blocks_from_a_breakpoint(cache: CacheModel, clock: Clock) -> None:
    def body(blocks: int) -> dict[str, Any]:
        content = [block(40, f"block {i}") for i in range(blocks)]
        content[-1]["cache_control"] = EPHEMERAL
        return {"model": "claude-sonnet-4-6", "system": [block(1500, "system", cached=True)], "messages": [{"role": "user", "content": content}]}

    start = use(cache, body(5)).prompt_tokens
    clock.now += 10
    # A read checks 20 block boundaries, the breakpoint's own and 19 before it: the previous breakpoint is the 20th.
    assert use(cache, body(5 + LOOKBACK_BLOCKS - 1)).cache_read_tokens == start
    far = CacheModel(clock)
    use(far, body(5))
    # One block further: out of the window, so only the system prompt's entry is read.
    assert use(far, body(5 + LOOKBACK_BLOCKS)).cache_read_tokens == prefix_tokens(body(5), 1)


def test_a_screenshot_costs_what_the_estimator_says(cache: CacheModel) -> None:
    out = io.BytesIO()
    Image.new("RGB", (1280, 800), (200, 200, 200)).save(out, "PNG")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(out.getvalue())}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [image]}
    body = {"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": [result]}]}
    prompt = prompt_of("anthropic", ANTHROPIC, body)
    assert prompt is not None and len(prompt.units) == 1
    unit = prompt.units[0]
    assert unit.image_tokens == anthropic_image_tokens(1280, 800) == 46 * 29
    assert unit.image_tokens < unit.tokens < unit.image_tokens + text_tokens(200)  # the image, and the JSON around it


def test_the_same_image_costs_the_same_as_png_or_webp() -> None:
    # The type an image is declared as is billed with it: sent at its native size as WebP instead of PNG, a turn
    # costs what it did. Tool ids of four lengths: "webp" is a character longer than "png", which one of them rounds
    # to one more token of text were it counted as text.
    def prompt_tokens(fmt: str, tool_id: str) -> int:
        out = io.BytesIO()
        Image.new("RGB", (1389, 868), (200, 200, 200)).save(out, fmt)
        image = {"type": "image", "source": {"type": "base64", "media_type": f"image/{fmt.lower()}", "data": b64(out.getvalue())}}
        result = {"type": "tool_result", "tool_use_id": tool_id, "content": [image]}
        prompt = prompt_of("anthropic", ANTHROPIC, {"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": [result]}]})
        assert prompt is not None
        return sum(unit.tokens for unit in prompt.units)

    for tool_id in ("t1", "t12", "t123", "t1234"):
        assert prompt_tokens("PNG", tool_id) == prompt_tokens("WEBP", tool_id), tool_id


def test_entries_are_per_model(cache: CacheModel) -> None:
    use(cache, conversation(2))
    other = use(cache, conversation(2, model="claude-opus-4-1"))
    assert other.cache_read_tokens == 0


def test_bedrock_cache_point_marks_the_block_before_it(cache: CacheModel) -> None:
    path = "/model/anthropic.claude-sonnet-4-6/converse"
    body = {
        "system": [{"text": text(1500, "system")}, {"cachePoint": {"type": "default"}}],
        "messages": [{"role": "user", "content": [{"text": text(200, "q")}]}],
    }
    first = use(cache, body, "bedrock-converse", path)
    system = prefix_tokens(body, 1, "bedrock-converse", path)
    assert first.cache_write_tokens == system and first.uncached_tokens == first.prompt_tokens - system
    assert use(cache, body, "bedrock-converse", path).cache_read_tokens == system


# --- OpenAI -----------------------------------------------------------------------------------------------

CHAT = "/v1/chat/completions"


def chat(*contents: str) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(contents)]}


@pytest.mark.parametrize("tokens", [1024, 1100, 1151, 1152, 1300, 5000])
def test_openai_caches_from_1024_tokens_in_128_token_steps(cache: CacheModel, tokens: int) -> None:
    body = chat(text(tokens, "prompt"))
    prompt_tokens = use(cache, body, "openai-chat", CHAT).prompt_tokens
    again = use(cache, body, "openai-chat", CHAT)
    assert again.cache_write_tokens == 0  # no write premium, nothing reported
    expected = prompt_tokens // 128 * 128 if prompt_tokens >= 1024 else 0
    assert again.cache_read_tokens == expected and (expected == 0 or (expected - 1024) % 128 == 0)


def test_openai_below_1024_tokens_is_never_cached(cache: CacheModel) -> None:
    body = chat(text(900, "short"))
    use(cache, body, "openai-chat", CHAT)
    assert use(cache, body, "openai-chat", CHAT).cache_read_tokens == 0 and len(cache) == 0


def test_openai_reads_the_common_prefix_of_a_longer_prompt(cache: CacheModel, clock: Clock) -> None:
    first = chat(text(3000, "history"))
    use(cache, first, "openai-chat", CHAT)
    clock.now += 60
    longer = chat(text(3000, "history"), text(100, "answer"), text(50, "next question"))
    usage = use(cache, longer, "openai-chat", CHAT)
    common = prefix_tokens(first, 1, "openai-chat", CHAT)
    assert usage.cache_read_tokens == common // 128 * 128 and usage.prompt_tokens > common
    clock.now += 301  # five minutes idle: gone
    assert use(cache, longer, "openai-chat", CHAT).cache_read_tokens == 0


def test_openai_images_count_with_their_tiles(cache: CacheModel) -> None:
    out = io.BytesIO()
    Image.new("RGB", (1280, 800), (10, 20, 30)).save(out, "PNG")
    part = {"type": "image_url", "image_url": {"url": data_url(out.getvalue(), "image/png"), "detail": "auto"}}
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": [part]}]}
    prompt = prompt_of("openai-chat", CHAT, body)
    assert prompt is not None and prompt.units[0].image_tokens == openai_tile_tokens(1280, 800) == 85 + 170 * 6


def test_openai_extended_retention(cache: CacheModel, clock: Clock) -> None:
    body = {**chat(text(2000, "prompt")), "prompt_cache_retention": "24h"}
    use(cache, body, "openai-chat", CHAT)
    clock.now += 6 * 3600
    assert use(cache, body, "openai-chat", CHAT).cache_read_tokens > 1024


def test_openai_responses_instructions_are_part_of_the_prefix(cache: CacheModel) -> None:
    path = "/v1/responses"
    body = {"model": "gpt-5", "instructions": text(2000, "instructions"), "input": "hi"}
    use(cache, body, "openai-responses", path)
    assert use(cache, body, "openai-responses", path).cache_read_tokens >= 1920
    assert use(cache, {**body, "instructions": text(2000, "other")}, "openai-responses", path).cache_read_tokens == 0


# --- Gemini -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "minimum"), [("gemini-2.5-flash", 2048), ("gemini-2.5-pro", 2048), ("gemini-3-pro-preview", 4096)])
def test_gemini_implicit_caching_minimum(model: str, minimum: int, clock: Clock) -> None:
    path = f"/v1beta/models/{model}:generateContent"

    def body(tokens: int) -> dict[str, Any]:
        return {"contents": [{"role": "user", "parts": [{"text": text(tokens, "prompt")}]}]}

    below, above = CacheModel(clock), CacheModel(clock)
    for _ in range(2):
        low = use(below, body(minimum - 100), "gemini", path)
        high = use(above, body(minimum + 100), "gemini", path)
    assert low.cache_read_tokens == 0
    assert high.cache_read_tokens == high.prompt_tokens  # token-exact: Gemini documents no step


def test_gemini_before_2_5_has_no_implicit_caching() -> None:
    assert caching_for("gemini", "gemini-2.0-flash") is None
    assert prompt_of("gemini", "/v1beta/models/gemini-2.0-flash:generateContent", {"contents": []}) is None


def test_no_caching_where_the_provider_has_none() -> None:
    assert prompt_of("ollama", "/api/chat", {"model": "llava", "messages": []}) is None
    assert prompt_of("anthropic", "/v1/messages/count_tokens", conversation(1)) is None  # a count is not a turn
