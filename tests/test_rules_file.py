"""trimflow._rules_file: every problem of a rules file named with its line, each limit field read and checked as its
metadata says, the shipped files, and a rules file that follows edits."""

import logging
import os
from pathlib import Path

import pytest
import yaml

from trimflow._limits import Limits
from trimflow._placeholder import DEFAULT_PLACEHOLDER, DEFAULT_REPEAT_PLACEHOLDER, check_placeholder
from trimflow._rules import BUILTIN_ENDPOINTS, LIMIT_FIELDS
from trimflow._rules_file import DEFAULT_RULES_PATH, RulesFile, load_rules, parse_rules
from trimflow.errors import RulesError

from .rules_files import REPO, SHIPPED, MiB, assert_error, error, load

# --- errors, each with its line -----------------------------------------------------------------


def test_error_message_format_matches_the_documented_example(tmp_path):
    text = "# x\n" * 10 + "defaults:\n  max_images: -3\n"
    err = error(tmp_path, text)
    assert str(err) == f"{tmp_path / 'rules.yaml'}:12: max_images must be a whole number >= 0 or null, got -3"
    assert isinstance(err, ValueError)
    assert (err.source, err.line) == (str(tmp_path / "rules.yaml"), 12)


def test_yaml_syntax_error_uses_the_line_yaml_reports(tmp_path):
    text = "defaults:\n  max_images: [1, 2\nrules: []\n"
    assert_error(tmp_path, text, 3, "YAML syntax error")


def test_yaml_bad_indentation(tmp_path):
    assert_error(tmp_path, "defaults:\n  max_images: 1\n   keep_recent: 1\n", 3, "YAML syntax error")


def test_yaml_unprintable_character(tmp_path):
    assert_error(tmp_path, 'defaults:\n  placeholder: "a\x07"\n', 2, "YAML syntax error")


def test_yaml_several_documents(tmp_path):
    assert_error(tmp_path, "defaults: {}\n---\ndefaults: {}\n", 2, "YAML syntax error")


def test_yaml_python_tag_is_refused(tmp_path):
    assert_error(tmp_path, "defaults:\n  max_images: !!python/object:os.system 1\n", 2, "YAML error")


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_empty_file(tmp_path, text):
    assert_error(tmp_path, text, 1, "empty rules file")


@pytest.mark.parametrize(("text", "shown"), [("- a\n- b\n", "a list"), ("just text\n", "'just text'"), ("42\n", "42")])
def test_top_level_not_a_mapping(tmp_path, text, shown):
    assert_error(tmp_path, text, 1, f"the rules file must be a mapping, got {shown}")


def test_unknown_top_level_key(tmp_path):
    message = "unknown top-level key 'rule' in the rules file; did you mean 'rules'?"
    assert_error(tmp_path, "defaults: {}\nrule: []\n", 2, message)


def test_unknown_top_level_key_without_a_close_match_lists_the_keys(tmp_path):
    message = "(known: defaults, rules, endpoints, detect_by_shape)"
    assert_error(tmp_path, "defaults: {}\nversion: 2\n", 2, message)


def test_unknown_field_in_defaults(tmp_path):
    text = "defaults:\n  max_images: 8\n  max_image: 3\n"
    assert_error(tmp_path, text, 3, "unknown field 'max_image' in defaults; did you mean 'max_images'?")


def test_unknown_field_in_a_rule(tmp_path):
    text = "rules:\n  - name: a\n    max_images: 1\n  - name: b\n    keep_recnt: 2\n"
    assert_error(tmp_path, text, 5, "unknown field 'keep_recnt' in rule 'b'; did you mean 'keep_recent'?")


def test_unknown_field_far_from_any_lists_the_fields(tmp_path):
    assert_error(tmp_path, "defaults:\n  colour: red\n", 2, "known: max_images, max_body_bytes")


def test_duplicate_key(tmp_path):
    text = "defaults:\n  max_images: 1\n  keep_recent: 1\n  max_images: 2\n"
    assert_error(tmp_path, text, 4, "duplicate key 'max_images' in defaults (first on line 2)")


def test_non_text_key(tmp_path):
    assert_error(tmp_path, "defaults:\n  ~: 3\n", 2, "keys in defaults must be names, got null")


@pytest.mark.parametrize("field", LIMIT_FIELDS)
def test_every_limit_field_is_read_and_checked_as_its_metadata_says(tmp_path, field):
    default = getattr(Limits(), field)
    r = load(tmp_path, yaml.safe_dump({"defaults": {field: default}}))
    assert getattr(r.defaults, field) == default
    assert_error(tmp_path, f"defaults:\n  {field}: [1]\n", 2, f"{field} must be")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_images", "yes", "max_images must be a whole number >= 0 or null, got true"),  # bool is not an int
        ("max_images", "true", "max_images must be a whole number >= 0 or null, got true"),
        ("max_images", "'8'", "max_images must be a whole number >= 0 or null, got '8'"),
        ("max_images", "8.0", "max_images must be a whole number >= 0 or null, got 8.0"),
        ("max_images", "[8]", "max_images must be a whole number >= 0 or null, got a list"),
        ("keep_recent", "false", "keep_recent must be a whole number >= 0, got false"),
        ("keep_recent", "null", "keep_recent must be a whole number >= 0, got null"),
        ("prune_batch", "'2'", "prune_batch must be a whole number >= 1, got '2'"),
        ("max_body_bytes", "true", "max_body_bytes must be a size like 16MiB or 2000000, or null, got true"),
        ("max_body_bytes", "1.5", "max_body_bytes must be a size like 16MiB or 2000000, or null, got 1.5"),
        ("max_body_bytes", "{a: 1}", "got a mapping"),
        ("placeholder", "5", "placeholder must be a text template, got 5"),
        ("placeholder", "null", "placeholder must be a text template, got null"),
    ],
)
def test_wrong_types(tmp_path, field, value, message):
    text = f"defaults:\n  # a comment line\n  {field}: {value}\n"
    assert_error(tmp_path, text, 3, message)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_images", "-1", "max_images must be a whole number >= 0 or null, got -1"),
        ("keep_recent", "-1", "keep_recent must be a whole number >= 0, got -1"),
        ("prune_batch", "-1", "prune_batch must be a whole number >= 1, got -1"),
        ("max_body_bytes", "-5", "max_body_bytes: invalid size -5: must not be negative"),
        ("max_body_bytes", "-5m", "max_body_bytes: invalid size '-5m': must not be negative"),
    ],
)
def test_negative_numbers(tmp_path, field, value, message):
    assert_error(tmp_path, f"rules:\n  - name: r\n    {field}: {value}\n", 3, message)


def test_prune_batch_zero(tmp_path):
    assert_error(tmp_path, "defaults:\n  prune_batch: 0\n", 2, "prune_batch must be a whole number >= 1, got 0")


def test_bad_size_string(tmp_path):
    assert_error(
        tmp_path,
        "defaults:\n  max_images: 8\n  max_body_bytes: 12x\n",
        3,
        "max_body_bytes: invalid size '12x': use bytes or a k/m/g, KB/MB/GB or KiB/MiB/GiB suffix",
    )


def test_defaults_not_a_mapping(tmp_path):
    assert_error(tmp_path, "defaults:\n  - max_images: 1\n", 2, "defaults must be a mapping, got a list")


def test_rules_not_a_list(tmp_path):
    assert_error(tmp_path, "defaults: {}\nrules:\n  name: a\n", 3, "rules must be a list, got a mapping")


def test_rule_not_a_mapping(tmp_path):
    assert_error(tmp_path, "rules:\n  - name: a\n  - gemini\n", 3, "rule #2 must be a mapping, got 'gemini'")


def test_rule_without_name(tmp_path):
    text = "rules:\n  - name: a\n  - match: {model: x}\n    max_images: 3\n"
    assert_error(tmp_path, text, 3, "rule #2 has no name")


@pytest.mark.parametrize("value", ["5", "''", "null", "[a]"])
def test_rule_name_not_text(tmp_path, value):
    text = f"rules:\n  - max_images: 1\n    name: {value}\n"
    assert_error(tmp_path, text, 3, "rule name must be non-empty text")


def test_rule_name_defaults_is_reserved(tmp_path):
    assert_error(tmp_path, "rules:\n  - name: defaults\n", 2, "reserved")


def test_duplicate_rule_name(tmp_path):
    text = "rules:\n  - name: a\n    max_images: 1\n  - name: b\n  - name: a\n"
    assert_error(tmp_path, text, 5, "duplicate rule name 'a' (first on line 2)")


def test_match_with_unknown_key(tmp_path):
    text = "rules:\n  - name: a\n    match:\n      host: x\n      models: gpt*\n"
    assert_error(tmp_path, text, 5, "unknown key 'models' in match of rule 'a'; did you mean 'model'?")


def test_match_not_a_mapping(tmp_path):
    text = "rules:\n  - name: a\n    match: gemini*\n"
    assert_error(tmp_path, text, 3, "match of rule 'a' must be a mapping")


@pytest.mark.parametrize(
    ("lines", "line", "message"),
    [
        ("      model: 5\n", 4, "match.model of rule 'a' must be a glob (quoted text) or a list of globs, got 5"),
        ("      host: null\n", 4, "match.host of rule 'a' must be a glob"),
        ("      model: 1.5\n", 4, "got 1.5"),  # an unquoted version number is a float
        ("      model:\n        - gpt*\n        - 4\n", 6, "match.model of rule 'a' must be a glob"),
        ("      path: {a: b}\n", 4, "got a mapping"),
        ("      model: []\n", 4, "match.model of rule 'a' is an empty list"),
        ("      model: ''\n", 4, "empty glob"),
    ],
)
def test_glob_not_a_string(tmp_path, lines, line, message):
    assert_error(tmp_path, "rules:\n  - name: a\n    match:\n" + lines, line, message)


def test_unknown_format_in_endpoints(tmp_path):
    text = 'endpoints:\n  - {path: "*/chat/completions", format: openai-chat}\n  - path: "*/x"\n'
    text += "    format: openai\n"
    assert_error(tmp_path, text, 4, "unknown format 'openai'; did you mean 'openai-chat'?")


def test_endpoint_without_format(tmp_path):
    assert_error(tmp_path, 'endpoints:\n  - {path: "*/x"}\n', 2, "endpoint has no format")


def test_endpoint_unknown_key(tmp_path):
    text = 'endpoints:\n  - {path: "*/x", format: gemini, hots: x}\n'
    assert_error(tmp_path, text, 2, "unknown key 'hots' in an endpoint; did you mean 'host'?")


def test_endpoint_path_not_text(tmp_path):
    text = "endpoints:\n  - path: 5\n    format: gemini\n"
    assert_error(tmp_path, text, 2, "endpoint path must be non-empty text, got 5")


def test_detect_by_shape_not_a_bool(tmp_path):
    text = "defaults: {}\ndetect_by_shape: 'yes'\n"
    assert_error(tmp_path, text, 2, "detect_by_shape must be true or false, got 'yes'")


def test_nothing_to_trim_is_an_error(tmp_path):
    assert_error(tmp_path, "endpoints: []\ndetect_by_shape: false\n", 2, "no request would ever be trimmed")


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("[{kind} {name}]", "placeholder has an unknown field {name}"),
        ("[{knd}]", "unknown field {knd}; did you mean 'kind'?"),
        ("[{kind]", "placeholder is not a valid template"),
        ("[{kind}}", "placeholder is not a valid template (Single '}' encountered in format string)"),
        ("[{}]", "placeholder has a field without a name"),
        ("[{0}]", "placeholder has a field without a name"),
        ("[{width:d}]", "{width} and {height} are '?' when an image's size is unknown"),
        ("[{kind.upper.x}]", "placeholder is not a valid template"),
        ("  ", "placeholder must not be empty"),
    ],
)
def test_bad_placeholder_template(tmp_path, template, message):
    text = f"defaults:\n  max_images: 8\n  placeholder: '{template}'\n"
    assert_error(tmp_path, text, 3, message)


def test_placeholder_error_in_a_rule_has_the_rules_line(tmp_path):
    text = "rules:\n  - name: a\n    max_images: 1\n    placeholder: >-\n      omitted {sise}\n"
    assert_error(tmp_path, text, 4, "did you mean 'size'?")


@pytest.mark.parametrize(
    "template",
    [
        DEFAULT_PLACEHOLDER,
        "[image omitted]",
        "{{literal}} {kind}",
        "{bytes:,} bytes, {width}x{height}, {reason}",
        "{ordinal:>3}",
    ],
)
def test_good_placeholder_templates(template):
    check_placeholder(template)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(RulesError) as e:
        load_rules(path)
    assert str(e.value).startswith(f"{path}: cannot read: ")
    assert e.value.line is None


def test_directory_is_unreadable(tmp_path):
    with pytest.raises(RulesError, match="cannot read"):
        load_rules(tmp_path)


def test_not_utf8(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("defaults:\n  placeholder: 'caf\xe9'\n".encode("latin-1"))
    with pytest.raises(RulesError, match="cannot read: not UTF-8"):
        load_rules(path)


def test_parse_rules_names_the_source():
    with pytest.raises(RulesError, match=r"^<string>:1: "):
        parse_rules("- x\n")
    with pytest.raises(RulesError, match=r"^my.yaml:2: "):
        parse_rules("defaults:\n  max_images: x\n", "my.yaml")


# --- the shipped files --------------------------------------------------------------------------


def test_default_rules_path():
    assert DEFAULT_RULES_PATH == REPO / "rules" / "default.yaml"
    assert DEFAULT_RULES_PATH.is_file()


def test_shipped_default():
    r = load_rules(DEFAULT_RULES_PATH)
    assert r.source == str(DEFAULT_RULES_PATH)
    gemini = r.limits_for("generativelanguage.googleapis.com", "/v1beta/models/gemini-2.5-pro:generateContent", "gemini-2.5-pro")
    # Copilot's cap of 10, 5 left after a cut, at most 8 held once over it (docs/caching.md).
    assert (gemini.rule, gemini.max_images, gemini.low_water, gemini.cache_ttl, gemini.max_images_after_overflow) == ("gemini", 10, 0.5, 300.0, 8)
    assert gemini.at_low_water().max_images == 5
    assert r.limits_for("openrouter.ai", "/api/v1/chat/completions", "google/gemini-2.5-pro").max_images == 10
    assert r.limits_for("api.githubcopilot.com", "/chat/completions", "gemini-3.1-pro-preview").max_images == 10
    # OpenAI models whose cached input costs a quarter or more of the input price: the card's 8, and at most 5 held once
    # over it, on chat and Responses, on any host; GPT-5 and later keep the default.
    for host, path, model in [
        ("api.openai.com", "/v1/chat/completions", "gpt-4o"),
        ("api.openai.com", "/v1/responses", "gpt-4.1-mini"),
        ("x.openai.azure.com", "/openai/deployments/d/chat/completions", "gpt-4o-2024-11-20"),
        ("openrouter.ai", "/api/v1/chat/completions", "openai/gpt-4o-mini"),
    ]:
        openai = r.limits_for(host, path, model)
        assert (openai.rule, openai.max_images, openai.low_water, openai.max_images_after_overflow) == ("openai-cached-share", 8, 0.4, 5), model
        assert openai.at_low_water().max_images == 3
    for model in ("gpt-5", "gpt-5-codex", "gpt-5.1", "o3"):
        limits = r.limits_for("api.openai.com", "/v1/responses", model)
        assert (limits.max_images, limits.max_images_after_overflow) == (8, None), model
    claude = r.limits_for("api.anthropic.com", "/v1/messages", "claude-sonnet-4")
    assert claude == Limits(
        "claude",
        8,
        16 * MiB,
        1,
        6,  # prune_batch: the cut moves every 6 turns (docs/caching.md)
        DEFAULT_PLACEHOLDER,
        max_image_bytes=5 * MiB,
        max_image_side=8000,
        many_images_threshold=20,
        many_images_max_side=2000,
        low_water=0.4,  # the cold cut: idle past cache_ttl, cut to 3 of 8 at once (docs/caching.md)
        cache_ttl=300.0,
    )
    assert gemini.max_body_bytes == 16 * MiB
    assert r.limits_for("h", "/", None).max_images == 8


def test_shipped_default_spells_out_the_builtin_endpoints():
    r = load_rules(DEFAULT_RULES_PATH)
    assert r.endpoints == BUILTIN_ENDPOINTS
    assert r.detect_by_shape is True
    assert "endpoints:" in DEFAULT_RULES_PATH.read_text()


def test_shipped_default_yaml_lists_the_builtin_endpoints_in_order():
    # Read with plain PyYAML, not the rules parser, so a parser that fell back to the built-in list would not pass.
    listed = yaml.safe_load(DEFAULT_RULES_PATH.read_text(encoding="utf-8"))["endpoints"]
    assert [(e["path"], e["format"]) for e in listed] == [(e.path, e.format) for e in BUILTIN_ENDPOINTS]
    assert all(set(e) == {"path", "format"} for e in listed)


def test_no_path_matches_two_builtin_endpoints():
    # Each built-in glob ends in a literal text; when no such ending is the ending of another,
    # no path matches two globs and the order of the list changes no answer.
    endings = [e.path.rpartition("*")[2] for e in BUILTIN_ENDPOINTS]
    assert all(endings)
    for i, a in enumerate(endings):
        for j, b in enumerate(endings):
            assert i == j or not a.endswith(b), (a, b)


# Rules files; rules/profiles.yaml holds limit profiles (another format, tested in test_profiles.py).


def test_the_example_files_are_there():
    names = {p.name for p in SHIPPED}
    assert names >= {
        "default.yaml",
        "screenshot-backend-2mb.yaml",
        "anthropic-max.yaml",
        "bedrock.yaml",
        "azure-openai.yaml",
        "vllm.yaml",
    }


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_file_loads(path):
    r = load_rules(path)
    assert r.rules, "an example without rules shows nothing"


def test_examples_give_their_limits():
    ex = REPO / "rules" / "examples"
    seed = load_rules(ex / "screenshot-backend-2mb.yaml").limits_for("backend", "/v2/chat/completions", "m")
    assert (seed.max_images, seed.keep_recent) == (1, 1)
    assert 1_900_000 <= seed.max_body_bytes < 2 * MiB
    anth = load_rules(ex / "anthropic-max.yaml").limits_for("api.anthropic.com", "/v1/messages", "claude-x")
    assert anth.max_images == 100 and anth.max_body_bytes < 32_000_000
    bedrock = load_rules(ex / "bedrock.yaml").limits_for("bedrock-runtime.us-east-1.amazonaws.com", "/model/x/converse", "x")
    assert bedrock.max_images == 20 and bedrock.max_body_bytes < 20_000_000
    azure = load_rules(ex / "azure-openai.yaml").limits_for("myres.openai.azure.com", "/openai/deployments/gpt4o/chat/completions", None)
    assert azure.max_images == 50
    vllm = load_rules(ex / "vllm.yaml").limits_for("localhost:8000", "/v1/chat/completions", "qwen")
    assert vllm.max_images == 5


# --- RulesFile: reload on edit --------------------------------------------------------------------


def _edit(path: Path, text: str) -> None:
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(before + 10**9, before + 10**9))  # a new mtime even on a coarse clock


def test_rules_file_reloads_when_edited(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("defaults: {max_images: 3}\n")
    rf = RulesFile(path, check_interval=0)
    assert rf.path == path
    first = rf.current()
    assert first.defaults.max_images == 3
    assert rf.current() is first  # unchanged file: the same object, not a re-parse
    _edit(path, "defaults: {max_images: 4}\n")
    assert rf.current().defaults.max_images == 4
    assert rf.error is None


def test_rules_file_keeps_the_last_good_rules_on_a_bad_edit(tmp_path, caplog):
    path = tmp_path / "r.yaml"
    path.write_text("defaults: {max_images: 3}\n")
    rf = RulesFile(path, check_interval=0)
    _edit(path, "defaults:\n  max_image: 4\n")
    with caplog.at_level(logging.WARNING, logger="trimflow"):
        assert rf.current().defaults.max_images == 3
        assert rf.current().defaults.max_images == 3  # warned once, not on every request
    assert rf.error is not None and rf.error.line == 2
    assert len(caplog.records) == 1
    assert f"{path}:2: unknown field 'max_image'" in caplog.records[0].getMessage()
    _edit(path, "defaults:\n  max_images: 5\n")
    assert rf.current().defaults.max_images == 5
    assert rf.error is None


def test_rules_file_survives_the_file_going_missing(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("defaults: {max_images: 3}\n")
    rf = RulesFile(path, check_interval=0)
    path.unlink()
    assert rf.current().defaults.max_images == 3
    assert rf.error is not None and "cannot read" in str(rf.error)
    _edit(path, "defaults: {max_images: 6}\n")
    assert rf.current().defaults.max_images == 6


def test_rules_file_checks_at_most_every_interval(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("defaults: {max_images: 3}\n")
    rf = RulesFile(path, check_interval=3600)
    _edit(path, "defaults: {max_images: 4}\n")
    assert rf.current().defaults.max_images == 3


def test_rules_file_first_load_must_succeed(tmp_path):
    with pytest.raises(RulesError, match="cannot read"):
        RulesFile(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("defaults: [\n")
    with pytest.raises(RulesError, match="YAML syntax error"):
        RulesFile(bad)


# --- per-image limits, thumbnails, the token budget and repeats ----------------------------------

IMAGE_FIELDS = (
    "max_image_bytes",
    "max_image_side",
    "many_images_threshold",
    "many_images_max_side",
    "thumbnail_side",
    "max_est_tokens",
    "dedupe",
    "repeat_placeholder",
)


def test_the_image_fields_are_rules_fields_and_off_by_default() -> None:
    assert set(IMAGE_FIELDS) <= set(LIMIT_FIELDS)
    limits = Limits()
    assert (limits.max_image_bytes, limits.max_image_side, limits.many_images_threshold, limits.many_images_max_side) == (None,) * 4
    assert (limits.thumbnail_side, limits.max_est_tokens, limits.dedupe) == (None, None, False)
    assert limits.repeat_placeholder == DEFAULT_REPEAT_PLACEHOLDER == "[trimflow: image #{ordinal} repeated as image #{later}]"


def test_every_field_parses_in_defaults_and_rules(tmp_path: Path) -> None:
    rules = load(
        tmp_path,
        """
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
""",
    )
    d = rules.defaults
    assert (d.max_image_bytes, d.max_image_side, d.many_images_threshold, d.many_images_max_side) == (5 * MiB, 8000, 20, 2000)
    assert (d.thumbnail_side, d.max_est_tokens, d.dedupe) == (512, 150_000, True)
    assert d.repeat_placeholder == "<same as #{later}: {mime} {dims}>"
    small = rules.limits_for("h", "/v1/chat/completions", "small-1")
    assert (small.rule, small.max_image_bytes, small.thumbnail_side, small.dedupe) == ("small", MiB, None, False)
    assert small.max_image_side == 8000 and small.max_est_tokens == 150_000  # inherited


def test_with_limits_forces_the_image_fields_too(tmp_path: Path) -> None:
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
    assert_error(tmp_path, "defaults:\n  repeat_placeholder: '#{latr}'\n", 2, "repeat_placeholder has an unknown field {latr}; did you mean 'later'?")
    assert_error(tmp_path, "defaults:\n  placeholder: '#{later}'\n", 2, "placeholder has an unknown field {later}")
    assert_error(tmp_path, "defaults:\n  repeat_placeholder: '  '\n", 2, "repeat_placeholder must not be empty")
    assert_error(tmp_path, "defaults:\n  repeat_placeholder: 3\n", 2, "repeat_placeholder must be a text template, got 3")


def test_the_many_image_rule_needs_both_fields(tmp_path: Path) -> None:
    assert_error(
        tmp_path,
        "defaults:\n  max_images: 8\n  many_images_threshold: 20\n",
        3,
        "many_images_threshold is set in defaults but many_images_max_side is not",
    )
    text = "defaults:\n  max_images: 8\nrules:\n  - name: r\n    many_images_max_side: 2000\n"
    assert_error(tmp_path, text, 5, "many_images_max_side is set in rule 'r' but many_images_threshold is not")


def test_the_cache_aware_cut_reads_a_share_and_a_duration(tmp_path: Path) -> None:
    rules = load(tmp_path, "defaults:\n  max_images: 8\n  low_water: 0.5\n  cache_ttl: 5m\nrules:\n  - name: r\n    cache_ttl: 1h\n")
    assert (rules.defaults.low_water, rules.defaults.cache_ttl) == (0.5, 300.0)
    assert rules.limits_for("h", "/", None).cache_ttl == 3600.0
    assert load(tmp_path, "defaults:\n  low_water: 1\n  cache_ttl: 90\n").defaults.cache_ttl == 90.0


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("defaults:\n  low_water: 0\n", 2, "low_water must be a share over 0 and at most 1, like 0.5 or null, got 0"),
        ("defaults:\n  low_water: 50%\n", 2, "low_water must be a share over 0 and at most 1, like 0.5 or null, got '50%'"),
        ("defaults:\n  low_water: true\n", 2, "low_water must be a share over 0 and at most 1"),
        ("defaults:\n  low_water: 0.5\n  cache_ttl: soon\n", 3, "cache_ttl: invalid duration 'soon': use seconds or an s/m/h/d suffix, like 5m"),
        ("defaults:\n  low_water: 0.5\n  cache_ttl: -5\n", 3, "cache_ttl: invalid duration -5: must not be negative"),
        ("defaults:\n  cache_ttl: 5m\n", 2, "cache_ttl is set in defaults but low_water is not: cache_ttl needs it"),
        ("defaults:\n  max_images: 8\nrules:\n  - name: r\n    cache_ttl: 5m\n", 5, "cache_ttl is set in rule 'r' but low_water is not"),
    ],
)
def test_the_cache_aware_cut_refuses_what_it_cannot_mean(tmp_path: Path, text: str, line: int, message: str) -> None:
    assert_error(tmp_path, text, line, message)


def test_the_many_image_pair_may_be_split_between_defaults_and_a_rule(tmp_path: Path) -> None:
    rules = load(
        tmp_path, "defaults:\n  many_images_max_side: 2000\n  many_images_threshold: 20\nrules:\n  - name: r\n    many_images_threshold: 5\n"
    )
    assert rules.limits_for("h", "/", None).many_images_threshold == 5
    # A rule that unsets one half of the pair is named with its own line.
    text = "defaults:\n  many_images_max_side: 2000\n  many_images_threshold: 20\nrules:\n  - name: r\n    many_images_threshold: null\n"
    assert_error(tmp_path, text, 5, "many_images_max_side is set in rule 'r' but many_images_threshold is not")


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
    for field in IMAGE_FIELDS:  # each documented, as a commented-out example
        assert f"# {field}: " in text, field


def test_anthropic_max_example_has_the_per_image_limits() -> None:
    rules = load_rules(REPO / "rules" / "examples" / "anthropic-max.yaml")
    limits = rules.limits_for("api.anthropic.com", "/v1/messages", "claude-opus-4")
    assert (limits.max_images, limits.max_image_bytes, limits.max_image_side) == (100, 5 * MiB, 8000)
    assert limits.image_side_limit(20) == 8000 and limits.image_side_limit(21) == 2000
