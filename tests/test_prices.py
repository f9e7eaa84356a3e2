"""The price table: the shipped file loads and covers the families it names, first match wins on the whole
model name (Bedrock and Vertex spellings too), a model with no entry has no price, cost adds each kind of
token at its rate (long prompts at the long rates), and a bad file is refused with its file and line."""

from __future__ import annotations

import datetime

import pytest

from trimflow._prices import DEFAULT_PRICES_PATH, Price, load_prices, parse_prices
from trimflow.errors import RulesError

GOOD = """\
prices:
  - family: big
    match: ["big-2*", "vendor.big-2*"]
    input: 3
    cache_write: 3.75
    cache_write_1h: 6
    cache_read: 0.30
    output: 15
    source: https://example.com/pricing
    as_of: 2026-11-24
  - family: big-old
    match: "big-*"
    input: 10
    cache_read: 5
    output: 40
    source: https://example.com/pricing
    as_of: 2026-11-24
    long_prompt: {above_tokens: 200000, input: 20, cache_read: 10, output: 60}
"""


def test_first_matching_family_wins_on_the_whole_name_case_aside():
    table = parse_prices(GOOD)
    assert table.for_model("big-2-latest").family == "big"
    assert table.for_model("VENDOR.BIG-2-v1:0").family == "big"
    assert table.for_model("big-1").family == "big-old"
    assert table.for_model("my-big-2") is None  # globs match the whole name
    assert table.for_model("") is None
    assert table.for_model(None) is None


def test_cost_prices_each_kind_of_token_at_its_rate():
    price = parse_prices(GOOD).for_model("big-2")
    assert price == Price("big", 3.0, 3.75, 0.30, 15.0, "https://example.com/pricing", "2026-11-24", cache_write_1h=6.0)
    # 1M uncached at 3, 2M written at 3.75, 10M read at 0.30, 0.1M out at 15
    assert price.cost(1_000_000, 2_000_000, 10_000_000, 100_000) == pytest.approx(3 + 7.5 + 3 + 1.5)
    assert price.cost(0, 0, 0, 0) == 0.0


def test_no_write_premium_means_a_write_costs_the_input_price():
    price = parse_prices(GOOD).for_model("big-1")
    assert price.cache_write == price.input == 10.0
    assert price.cache_write_1h is None


def test_a_long_prompt_is_priced_whole_at_the_long_rates():
    price = parse_prices(GOOD).for_model("big-1")
    at_threshold = price.cost(150_000, 0, 50_000, 1_000)
    assert at_threshold == pytest.approx((150_000 * 10 + 50_000 * 5 + 1_000 * 40) / 1e6)
    above = price.cost(150_001, 0, 50_000, 1_000)
    assert above == pytest.approx((150_001 * 20 + 50_000 * 10 + 1_000 * 60) / 1e6)


def test_shipped_table_loads_and_every_entry_names_its_source_and_date():
    table = load_prices()
    assert load_prices(DEFAULT_PRICES_PATH).prices == table.prices
    assert len(table) >= 5
    for price in table.prices:
        assert price.source.startswith("https://")
        datetime.date.fromisoformat(price.as_of)
        assert price.cache_read <= price.input <= price.cache_write


@pytest.mark.parametrize(
    "model, family",
    [
        ("claude-opus-4-5-20251101", "claude-opus-4.5"),
        ("claude-opus-4-1-20250805", "claude-opus-4"),
        ("us.anthropic.claude-opus-4-1-20250805-v1:0", "claude-opus-4"),
        ("claude-sonnet-4-5@20250929", "claude-sonnet-4"),
        ("claude-3-5-haiku-20241022", "claude-haiku-3.5"),
        ("claude-haiku-4-5", "claude-haiku-4.5"),
        ("claude-opus-5", "claude-opus-5"),
        ("claude-sonnet-5[1m]", "claude-sonnet-5"),
        ("gpt-5", "gpt-5"),
        ("gpt-5-mini-2025-08-07", "gpt-5-mini"),
        ("gpt-4.1-2025-04-14", "gpt-4.1"),
        ("gpt-4.1-mini", "gpt-4.1-mini"),
        ("gpt-4o", "gpt-4o"),
        ("gpt-4o-mini", "gpt-4o-mini"),
    ],
)
def test_shipped_table_families(model, family):
    assert load_prices().for_model(model).family == family


@pytest.mark.parametrize("model", ["claude-opus-5-5", "claude-sonnet-5-5", "gpt-5.4", "gpt-4o-2024-05-13", "o3", "gemini-2.5-pro", "llava"])
def test_shipped_table_has_no_price_it_could_not_confirm(model):
    # families whose figures were not found on the provider's pages stay out (rules/prices.yaml says which)
    assert load_prices().for_model(model) is None


def test_shipped_anthropic_rates_are_the_documented_multiples():
    # Anthropic: 5-minute write 1.25x input, 1-hour write 2x, read 0.1x (Haiku 3's page figures are rounded)
    for price in load_prices().prices:
        if price.family.startswith("claude") and price.family != "claude-haiku-3":
            assert price.cache_write == pytest.approx(price.input * 1.25)
            assert price.cache_write_1h == pytest.approx(price.input * 2)
            assert price.cache_read == pytest.approx(price.input * 0.1)


@pytest.mark.parametrize(
    "text, line, problem",
    [
        ("", 1, "empty prices file"),
        ("prices: []\n", 1, "`prices` has no entry"),
        ("other: 1\n", 1, "unknown top-level key 'other'"),
        (GOOD.replace("    output: 15\n", "    output: -1\n"), 8, "`output` must be a price"),
        (GOOD.replace("    output: 15\n", "    output: cheap\n"), 8, "`output` must be a price"),
        (GOOD.replace("    output: 15\n", ""), 2, "price entry has no `output`"),
        (GOOD.replace("as_of: 2026-11-24\n  - family: big-old", "as_of: last week\n  - family: big-old"), 10, "`as_of` must be a date"),
        (GOOD.replace("source: https://example.com/pricing", "source: the web", 1), 9, "`source` must be"),
        (GOOD.replace("family: big-old", "family: big"), 11, "family 'big' is listed twice (first on line 2)"),
        (GOOD.replace("cache_read: 0.30", "cache_reads: 0.30"), 7, "did you mean 'cache_read'"),
        (GOOD.replace("above_tokens: 200000", "above_tokens: 0"), 18, "`above_tokens` must be a positive whole number"),
        (GOOD.replace('match: "big-*"', "match: []"), 12, "`match` must list at least one"),
    ],
)
def test_bad_file_names_file_and_line(tmp_path, text, line, problem):
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(RulesError) as info:
        load_prices(path)
    assert info.value.source == str(path)
    assert info.value.line == line
    assert problem in info.value.problem


def test_missing_file_is_a_rules_error_naming_it(tmp_path):
    with pytest.raises(RulesError, match="cannot read"):
        load_prices(tmp_path / "none.yaml")
