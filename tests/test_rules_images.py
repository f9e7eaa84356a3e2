"""Rules fields for per-image limits, thumbnails, the token budget and repeats: parsing, errors, shipped files."""

from __future__ import annotations

from pathlib import Path

import pytest

from trimflow._policy import DEFAULT_REPEAT_PLACEHOLDER, Limits
from trimflow._rules import DEFAULT_RULES_PATH, LIMIT_FIELDS, Rules, RulesError, check_placeholder, load_rules

REPO = Path(__file__).resolve().parents[1]
MiB = 2**20
NEW_FIELDS = (
    "max_image_bytes",
    "max_image_side",
    "many_images_threshold",
    "many_images_max_side",
    "thumbnail_side",
    "max_est_tokens",
    "dedupe",
    "repeat_placeholder",
)


def load(tmp_path: Path, text: str) -> Rules:
    path = tmp_path / "rules.yaml"
    path.write_text(text, encoding="utf-8")
    return load_rules(path)


def assert_error(tmp_path: Path, text: str, line: int, message: str) -> None:
    """Loading `text` fails naming the file and the line, with `message` in its text."""
    with pytest.raises(RulesError) as caught:
        load(tmp_path, text)
    err = caught.value
    assert str(err).startswith(f"{tmp_path / 'rules.yaml'}:{line}: "), str(err)
    assert message in str(err), str(err)
    assert err.line == line


def test_the_new_fields_are_rules_fields_and_off_by_default() -> None:
    assert set(NEW_FIELDS) <= set(LIMIT_FIELDS)
    limits = Limits()
    assert (limits.max_image_bytes, limits.max_image_side, limits.many_images_threshold, limits.many_images_max_side) == (None,) * 4
    assert (limits.thumbnail_side, limits.max_est_tokens, limits.dedupe) == (None, None, False)
    assert limits.repeat_placeholder == DEFAULT_REPEAT_PLACEHOLDER == "[trimflow: image #{ordinal} repeated as image #{later}]"


def test_every_field_parses_in_defaults_and_rules(tmp_path: Path) -> None:
    rules = load(tmp_path, """
defaults:
  max_image_bytes: 5MiB
  max_image_side: 8000
  many_images_threshold: 20
  many_images_max_side: 2000
  thumbnail_side: 512
  max_est_tokens: 150_000
  dedupe: true
  repeat_placeholder: "<same as #{later}: {mime} {dims}>"
rules:
  - name: small
    match: {model: "small*"}
    max_image_bytes: 1048576
    thumbnail_side: null
    dedupe: false
""")
    d = rules.defaults
    assert (d.max_image_bytes, d.max_image_side, d.many_images_threshold, d.many_images_max_side) == (5 * MiB, 8000, 20, 2000)
    assert (d.thumbnail_side, d.max_est_tokens, d.dedupe) == (512, 150_000, True)
    assert d.repeat_placeholder == "<same as #{later}: {mime} {dims}>"
    small = rules.limits_for("h", "/v1/chat/completions", "small-1")
    assert (small.rule, small.max_image_bytes, small.thumbnail_side, small.dedupe) == ("small", MiB, None, False)
    assert small.max_image_side == 8000 and small.max_est_tokens == 150_000  # inherited


def test_with_limits_forces_the_new_fields_too(tmp_path: Path) -> None:
    rules = load(tmp_path, "defaults: {}\nrules:\n  - name: r\n    max_image_side: 100\n").with_limits(max_image_side=50, dedupe=True)
    assert rules.limits_for("h", "/", None).max_image_side == 50
    assert rules.limits_for("h", "/", None).dedupe is True


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1", "max_image_bytes: invalid size -1: must not be negative"),
        ("five", "max_image_bytes: invalid size 'five'"),
        ("true", "max_image_bytes must be a size like 5MiB or 5242880, or null, got true"),
        ("100", "max_image_bytes must be at least 1024 (1KiB): no image fits in less, got 100"),
        ("[1]", "max_image_bytes must be a size like 5MiB or 5242880, or null, got a list"),
    ],
)
def test_max_image_bytes_errors(tmp_path: Path, value: str, message: str) -> None:
    assert_error(tmp_path, f"# rules\ndefaults:\n  max_image_bytes: {value}\n", 3, message)


@pytest.mark.parametrize("key", ["max_image_side", "thumbnail_side"])
@pytest.mark.parametrize("value", ["0", "15", "8.5", "'big'", "yes"])
def test_side_fields_want_whole_pixels_of_16_or_more(tmp_path: Path, key: str, value: str) -> None:
    assert_error(tmp_path, f"defaults:\n  keep_recent: 1\n  {key}: {value}\n", 3, f"{key} must be a whole number of pixels >= 16 or null, got")


def test_many_images_max_side_is_checked_like_a_side(tmp_path: Path) -> None:
    text = "defaults:\n  many_images_threshold: 20\n  many_images_max_side: 3\n"
    assert_error(tmp_path, text, 3, "many_images_max_side must be a whole number of pixels >= 16 or null, got 3")


@pytest.mark.parametrize("key", ["many_images_threshold", "max_est_tokens"])
@pytest.mark.parametrize("value", ["-1", "1.5", "'1k'", "true"])
def test_counts_want_whole_numbers(tmp_path: Path, key: str, value: str) -> None:
    extra = "\n  many_images_max_side: 2000" if key == "many_images_threshold" else ""
    assert_error(tmp_path, f"defaults:\n  {key}: {value}{extra}\n", 2, f"{key} must be a whole number >= 0 or null, got")


@pytest.mark.parametrize("value", ["1", "'true'", "null"])
def test_dedupe_wants_a_boolean(tmp_path: Path, value: str) -> None:
    assert_error(tmp_path, f"defaults:\n  dedupe: {value}\n", 2, "dedupe must be true or false, got")


def test_repeat_placeholder_knows_later_and_placeholder_does_not(tmp_path: Path) -> None:
    check_placeholder("#{ordinal} = #{later} ({reason})", "repeat_placeholder")
    assert_error(tmp_path, "defaults:\n  repeat_placeholder: '#{latr}'\n", 2,
                 "repeat_placeholder has an unknown field {latr}; did you mean 'later'?")
    assert_error(tmp_path, "defaults:\n  placeholder: '#{later}'\n", 2, "placeholder has an unknown field {later}")
    assert_error(tmp_path, "defaults:\n  repeat_placeholder: '  '\n", 2, "repeat_placeholder must not be empty")
    assert_error(tmp_path, "defaults:\n  repeat_placeholder: 3\n", 2, "repeat_placeholder must be a text template, got 3")


def test_the_many_image_rule_needs_both_fields(tmp_path: Path) -> None:
    assert_error(tmp_path, "defaults:\n  max_images: 8\n  many_images_threshold: 20\n", 3,
                 "many_images_threshold is set in defaults but many_images_max_side is not")
    text = "defaults:\n  max_images: 8\nrules:\n  - name: r\n    many_images_max_side: 2000\n"
    assert_error(tmp_path, text, 5, "many_images_max_side is set in rule 'r' but many_images_threshold is not")


def test_the_many_image_pair_may_be_split_between_defaults_and_a_rule(tmp_path: Path) -> None:
    rules = load(tmp_path, "defaults:\n  many_images_max_side: 2000\n  many_images_threshold: 20\n"
                           "rules:\n  - name: r\n    many_images_threshold: 5\n")
    assert rules.limits_for("h", "/", None).many_images_threshold == 5
    # A rule that unsets one half of the pair is named with its own line.
    text = "defaults:\n  many_images_max_side: 2000\n  many_images_threshold: 20\nrules:\n  - name: r\n    many_images_threshold: null\n"
    assert_error(tmp_path, text, 5, "many_images_max_side is set in rule 'r' but many_images_threshold is not")


# --- the shipped files ----------------------------------------------------------------------------


def test_shipped_default_shrinks_only_for_claude_at_anthropics_own_limits() -> None:
    rules = load_rules(DEFAULT_RULES_PATH)
    for host, path, model in (
        ("api.anthropic.com", "/v1/messages", "claude-sonnet-4-5"),
        ("bedrock-runtime.us-east-1.amazonaws.com", "/model/x/converse", "anthropic.claude-3-5-sonnet-20240620-v1:0"),
        ("openrouter.ai", "/api/v1/chat/completions", "anthropic/claude-opus-4"),
    ):
        claude = rules.limits_for(host, path, model)
        assert claude.rule == "claude"
        assert (claude.max_image_bytes, claude.max_image_side) == (5 * MiB, 8000)
        assert (claude.many_images_threshold, claude.many_images_max_side) == (20, 2000)
        assert (claude.max_images, claude.max_body_bytes) == (8, 16 * MiB)  # the rest from defaults
    for model in ("gpt-4o", "gemini-2.5-pro", None):
        other = rules.limits_for("h", "/v1/chat/completions", model)
        assert other.max_image_bytes is None and other.max_image_side is None and other.many_images_threshold is None
    d = rules.defaults
    assert (d.thumbnail_side, d.max_est_tokens, d.dedupe) == (None, None, False)
    text = DEFAULT_RULES_PATH.read_text()
    for field in NEW_FIELDS:  # each documented, as a commented-out example
        assert f"# {field}: " in text, field


def test_anthropic_max_example_has_the_per_image_limits() -> None:
    rules = load_rules(REPO / "rules" / "examples" / "anthropic-max.yaml")
    limits = rules.limits_for("api.anthropic.com", "/v1/messages", "claude-opus-4")
    assert (limits.max_images, limits.max_image_bytes, limits.max_image_side) == (100, 5 * MiB, 8000)
    assert limits.image_side_limit(20) == 8000 and limits.image_side_limit(21) == 2000
