import logging
import os
import time
from pathlib import Path

import pytest
import yaml

from trimflow._policy import DEFAULT_PLACEHOLDER, DEFAULT_REPEAT_PLACEHOLDER, Limits
from trimflow._rules import (
    BUILTIN_ENDPOINTS,
    DEFAULT_RULES_PATH,
    FORMAT_NAMES,
    LIMIT_FIELDS,
    Endpoint,
    Rule,
    Rules,
    RulesError,
    RulesFile,
    builtin_rules,
    check_placeholder,
    load_rules,
    parse_rules,
    regex_warning,
)

REPO = Path(__file__).resolve().parents[1]
MiB = 1024**2


def load(tmp_path: Path, text: str) -> Rules:
    path = tmp_path / "rules.yaml"
    path.write_text(text, encoding="utf-8")
    return load_rules(path)


def error(tmp_path: Path, text: str) -> RulesError:
    with pytest.raises(RulesError) as e:
        load(tmp_path, text)
    return e.value


def assert_error(tmp_path: Path, text: str, line: int, message: str) -> None:
    """The error names the file and the line, and its text contains `message`."""
    err = error(tmp_path, text)
    prefix = f"{tmp_path / 'rules.yaml'}:{line}: "
    assert str(err).startswith(prefix), str(err)
    assert message in str(err), str(err)
    assert err.line == line


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


# --- matching -----------------------------------------------------------------------------------

RULES = """\
defaults:
  max_images: 8
  max_body_bytes: 16MiB
  keep_recent: 2
  prune_batch: 3
  placeholder: "[gone {ordinal}]"
rules:
  - name: local-vision
    match:
      host: "localhost"
      path: "/v1/chat/completions"
    max_images: 1
  - name: gemini
    match:
      model: ["gemini*", "*/gemini*"]
    max_images: 10
  - name: gemini-shadowed        # never used: "gemini" matches first
    match:
      model: "gemini-2.5-pro"
    max_images: 99
  - name: anthropic
    match:
      host: "api.anthropic.com"
    max_body_bytes: null          # explicitly no limit, overriding the default
  - name: any-model-ok
    match:
      host: "*.example.com"
      model: "*"
    keep_recent: 0
"""


@pytest.fixture
def rules(tmp_path) -> Rules:
    return load(tmp_path, RULES)


def test_defaults_when_nothing_matches(rules):
    limits = rules.limits_for("api.openai.com", "/v1/chat/completions", "gpt-4o")
    assert limits == Limits("defaults", 8, 16 * MiB, 2, 3, "[gone {ordinal}]")
    assert limits is rules.defaults


def test_first_match_wins(rules):
    assert rules.limits_for("h", "/v1/chat/completions", "gemini-2.5-pro").rule == "gemini"
    assert rules.limits_for("localhost", "/v1/chat/completions", "gemini-2.5-pro").rule == "local-vision"


def test_unset_fields_come_from_defaults(rules):
    limits = rules.limits_for("h", "/x", "gemini-2.5-flash")
    assert limits == Limits("gemini", 10, 16 * MiB, 2, 3, "[gone {ordinal}]")


def test_rule_can_set_a_limit_back_to_none(rules):
    limits = rules.limits_for("api.anthropic.com", "/v1/messages", "claude-sonnet-4")
    assert (limits.rule, limits.max_body_bytes, limits.max_images) == ("anthropic", None, 8)


def test_list_of_model_globs(rules):
    for model in (
        "gemini-2.5-pro",
        "google/gemini-2.5-pro",
        "openrouter/google/gemini-3-pro-preview",
        "models/gemini-2.0-flash",
    ):
        assert rules.limits_for("h", "/p", model).max_images == 10, model
    for model in ("gemma-3", "gpt-4o", "not-gemini/x"):
        assert rules.limits_for("h", "/p", model).rule == "defaults", model


def test_model_none_does_not_match_a_model_glob(rules):
    assert rules.limits_for("h", "/p", None).rule == "defaults"


def test_model_glob_star_matches_model_none(rules):
    assert rules.limits_for("api.example.com", "/p", None).rule == "any-model-ok"
    assert rules.limits_for("api.example.com", "/p", "x").rule == "any-model-ok"


def test_host_port_is_ignored(rules):
    assert rules.limits_for("localhost:8000", "/v1/chat/completions", "qwen").rule == "local-vision"
    assert rules.limits_for("api.anthropic.com:443", "/v1/messages", None).rule == "anthropic"
    assert rules.limits_for("api.anthropic.com.", "/v1/messages", None).rule == "anthropic"


def test_ipv6_host(tmp_path):
    r = load(tmp_path, 'rules:\n  - name: v6\n    match: {host: "::1"}\n')
    assert r.limits_for("[::1]:8080", "/", None).rule == "v6"
    assert r.limits_for("[::1]", "/", None).rule == "v6"
    assert r.limits_for("::1", "/", None).rule == "v6"


def test_host_and_model_ignore_case_path_does_not(rules):
    assert rules.limits_for("API.Anthropic.COM", "/v1/messages", None).rule == "anthropic"
    assert rules.limits_for("h", "/p", "Gemini-2.5-PRO").rule == "gemini"
    assert rules.limits_for("LOCALHOST", "/V1/CHAT/COMPLETIONS", "x").rule == "defaults"


def test_query_is_ignored(rules):
    assert rules.limits_for("localhost", "/v1/chat/completions?x=1", "m").rule == "local-vision"


def test_rule_without_match_matches_everything(tmp_path):
    r = load(tmp_path, "defaults: {max_images: 8}\nrules:\n  - name: all\n    max_images: 2\n  - name: never\n")
    assert r.limits_for("h", "/p", None) == Limits("all", 2)


def test_null_sections_are_like_absent_ones(tmp_path):
    r = load(tmp_path, "defaults:\nrules:\nendpoints:\n")
    assert r.defaults == Limits()
    assert r.rules == ()
    assert r.endpoints == BUILTIN_ENDPOINTS


def test_yaml_anchors_and_merge_keys(tmp_path):
    text = """\
x-vision: &vision
  max_images: 4
  keep_recent: 2
rules:
  - name: a
    <<: *vision
    match: &local {host: localhost}
  - name: b
    <<: *vision
    max_images: 5
    match: *local
"""
    r = load(tmp_path, text)
    assert dict(r.rules[0].overrides) == {"max_images": 4, "keep_recent": 2}
    assert dict(r.rules[1].overrides) == {"max_images": 5, "keep_recent": 2}
    assert r.rules[1].host == ("localhost",)


def test_rules_built_in_code():
    rules = Rules(
        "<code>",
        Limits(max_images=8),
        (Rule("g", model=["gemini*"], overrides={"max_images": 10}),),
        (Endpoint("/chat", "openai-chat", host="*.local"),),
    )
    assert rules.limits_for("h", "/", "gemini-x") == Limits("g", 10)
    assert rules.format_for("a.local:80", "/chat") == "openai-chat"
    assert rules.format_for("a.remote", "/chat") is None
    with pytest.raises(ValueError):
        Endpoint("/x", "openai")
    with pytest.raises(ValueError):
        Rule("r", overrides={"max_image": 1})


def test_matching_is_cheap():
    globs = [f"model-{i}-*" for i in range(19)]
    rules = Rules(
        "<perf>",
        Limits(),
        tuple(Rule(f"r{i}", host=["*.example.com"], model=[g, f"*/{g}"]) for i, g in enumerate(globs)) + (Rule("last", path=["*/chat/completions"]),),
        BUILTIN_ENDPOINTS,
    )
    n = 2000
    start = time.perf_counter()
    for _ in range(n):
        rules.limits_for("api.example.com:443", "/v1/chat/completions", "gpt-4o")
        rules.format_for("api.example.com:443", "/v1/messages")
    per_call = (time.perf_counter() - start) / (2 * n)
    assert rules.limits_for("api.example.com:443", "/v1/chat/completions", "gpt-4o").rule == "last"
    assert per_call < 50e-6, f"{per_call * 1e6:.1f} µs per lookup"


# --- endpoints ----------------------------------------------------------------------------------


VERTEX_CLAUDE = "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514"


@pytest.mark.parametrize(
    ("path", "fmt"),
    [
        ("/v1/chat/completions", "openai-chat"),
        ("/v2/chat/completions", "openai-chat"),
        ("/openai/deployments/gpt4o/chat/completions", "openai-chat"),
        ("/api/v1/chat/completions", "openai-chat"),
        ("/backend-api/codex/responses", "openai-responses"),
        ("/v1/responses", "openai-responses"),
        ("/v1/responses/compact", "openai-responses"),
        ("/backend-api/codex/responses/compact", "openai-responses"),
        ("/v1/messages", "anthropic"),
        ("/v1/messages/count_tokens", "anthropic"),  # token counts: pruned like the turn they measure
        ("/v1beta/models/gemini-2.5-pro:countTokens", "gemini"),
        ("/v1/responses/input_tokens", "openai-responses"),
        (VERTEX_CLAUDE + ":rawPredict", "anthropic"),
        (VERTEX_CLAUDE + ":streamRawPredict", "anthropic"),
        ("/v1beta/models/gemini-2.5-pro:generateContent", "gemini"),
        ("/v1beta/models/gemini-2.5-pro:streamGenerateContent", "gemini"),
        ("/v1/projects/p/locations/l/publishers/google/models/gemini-2.5-pro:generateContent", "gemini"),
        ("/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse", "bedrock-converse"),
        ("/model/x/converse-stream", "bedrock-converse"),
        ("/model/x/invoke", "anthropic"),
        ("/model/us.anthropic.claude-sonnet-4-20250514-v1%3A0/invoke-with-response-stream", "anthropic"),
        ("/api/chat", "ollama"),
    ],
)
def test_builtin_formats(path, fmt):
    assert builtin_rules().format_for("example.com", path) == fmt
    assert builtin_rules().format_for("example.com:8443", path + "?alt=sse&api-version=2024-10-21") == fmt


@pytest.mark.parametrize(
    "path",
    [
        "/v1/models",
        "/v1/embeddings",
        "/v1/threads/thread_abc/messages",  # OpenAI Assistants, not Anthropic
        "/api/tags",
        "/index.html",
        "/",
        "",
        "/v1/messages/batches",
        "/v1/responses/resp_123/input_items",
        "/api/generate",
        "/v1/chat/completions/extra",
    ],
)
def test_non_llm_paths(path):
    assert builtin_rules().format_for("example.com", path) is None


def test_endpoints_replace_the_builtin_list(tmp_path):
    text = """\
endpoints:
  - {path: "/agent/chat", format: anthropic, host: "*.corp"}
  - {path: "/agent/chat", format: openai-chat}
detect_by_shape: false
"""
    r = load(tmp_path, text)
    assert r.detect_by_shape is False
    assert r.format_for("bot.corp:9000", "/agent/chat") == "anthropic"
    assert r.format_for("elsewhere", "/agent/chat") == "openai-chat"
    assert r.format_for("elsewhere", "/v1/chat/completions") is None


def test_empty_endpoints_leaves_shape_detection(tmp_path):
    r = load(tmp_path, "endpoints: []\n")
    assert r.endpoints == ()
    assert r.detect_by_shape is True
    assert r.format_for("h", "/v1/messages") is None


def test_builtin_rules_have_no_limits():
    r = builtin_rules()
    assert r.source == "<builtin>"
    assert r.defaults == Limits()
    assert r.rules == ()
    assert r.endpoints == BUILTIN_ENDPOINTS
    assert r.detect_by_shape is True
    assert r.limits_for("h", "/v1/messages", "claude") == Limits()


def test_format_names_match_the_format_modules():
    from trimflow.formats import FORMATS

    assert FORMAT_NAMES == tuple(FORMATS)
    assert {e.format for e in BUILTIN_ENDPOINTS} == set(FORMAT_NAMES)
    assert [(e.path, e.format) for e in BUILTIN_ENDPOINTS] == [(glob, name) for name, module in FORMATS.items() for glob in module.ENDPOINTS]


# --- the shipped files --------------------------------------------------------------------------


def test_default_rules_path():
    assert DEFAULT_RULES_PATH == REPO / "rules" / "default.yaml"
    assert DEFAULT_RULES_PATH.is_file()


def test_shipped_default():
    r = load_rules(DEFAULT_RULES_PATH)
    assert r.source == str(DEFAULT_RULES_PATH)
    gemini = r.limits_for("generativelanguage.googleapis.com", "/v1beta/models/gemini-2.5-pro:generateContent", "gemini-2.5-pro")
    # A voluntary cap under Copilot's 10, in batches that leave 3 images after a cut (docs/caching.md).
    assert (gemini.rule, gemini.max_images, gemini.prune_batch) == ("gemini", 6, 4)
    assert r.limits_for("openrouter.ai", "/api/v1/chat/completions", "google/gemini-2.5-pro").max_images == 6
    assert r.limits_for("api.githubcopilot.com", "/chat/completions", "gemini-3.1-pro-preview").max_images == 6
    # OpenAI models whose cached input costs a quarter or more of the input price: a voluntary cap of 5 in
    # batches of 3, on chat and Responses, on any host; GPT-5 and later keep the default.
    for host, path, model in [
        ("api.openai.com", "/v1/chat/completions", "gpt-4o"),
        ("api.openai.com", "/v1/responses", "gpt-4.1-mini"),
        ("x.openai.azure.com", "/openai/deployments/d/chat/completions", "gpt-4o-2024-11-20"),
        ("openrouter.ai", "/api/v1/chat/completions", "openai/gpt-4o-mini"),
    ]:
        openai = r.limits_for(host, path, model)
        assert (openai.rule, openai.max_images, openai.prune_batch, openai.low_water) == ("openai-cached-share", 5, 3, None), model
    for model in ("gpt-5", "gpt-5-codex", "gpt-5.1", "o3"):
        assert r.limits_for("api.openai.com", "/v1/responses", model).max_images == 8, model
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
SHIPPED = [REPO / "rules" / "default.yaml"] + sorted((REPO / "rules" / "examples").glob("*.yaml"))


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


# --- patterns that look like regular expressions ---------------------------------------------------------------


REGEX_RULES = """defaults:
  max_images: 8
rules:
  - name: gpt
    match:
      model: "^gpt-4o.*$"
    max_images: 2
  - name: claude
    match:
      model: ["claude-3.*", "/claude-.*/"]
    max_images: 3
  - name: bracket
    match:
      host: "api[.example.com"
      path: "^/v1/.*"
    max_images: 4
endpoints:
  - {path: "*/chat/completions", format: openai-chat, host: "^api\\\\.openai\\\\.com$"}
"""


def test_regex_looking_patterns_load_with_a_warning_naming_the_line_and_the_glob_to_write(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trimflow"):
        rules = load(tmp_path, REGEX_RULES)
    path = tmp_path / "rules.yaml"
    assert [r.getMessage() for r in caplog.records] == [f"trimflow: {w}" for w in rules.warnings]  # each logged once, at load
    assert rules.warnings == (
        f"{path}:6: match.model of rule 'gpt' '^gpt-4o.*$' looks like a regular expression (starts with ^, ends with $, has .*); "
        "rules use globs, matched against the whole model name: write 'gpt-4o*'",
        f"{path}:10: match.model of rule 'claude' '/claude-.*/' looks like a regular expression (is wrapped in /.../, has .*); "
        "rules use globs, matched against the whole model name: write 'claude-*'",
        f"{path}:14: match.host of rule 'bracket' 'api[.example.com' has a '[' that is never closed, which a glob matches as a "
        "literal '['; close the set, or write '[[]' for a literal '['",
        f"{path}:15: match.path of rule 'bracket' '^/v1/.*' looks like a regular expression (starts with ^, has .*); "
        "rules use globs, matched against the whole URL path: write '/v1/*'",
        f"{path}:18: endpoint host '^api\\.openai\\.com$' looks like a regular expression (starts with ^, ends with $, has \\.); "
        "rules use globs, matched against the whole host name: write 'api.openai.com'",
    )
    # Loaded as written: the globs match literally, as they would have without the warning.
    assert rules.limits_for("h", "/v1/chat/completions", "gpt-4o-mini").rule == "defaults"
    assert rules.limits_for("h", "/v1/chat/completions", "claude-3.5-sonnet").rule == "claude"  # claude-3.* is a glob


@pytest.mark.parametrize(
    ("glob", "key"),
    [
        ("*.openai.com", "host"),
        ("api.*.com", "host"),
        ("api.openai.*", "host"),
        ("gpt-4.*", "model"),
        ("[a-z]*-sonnet", "model"),
        ("claude-[0-9]*", "model"),
        ("gpt-[!4]*", "model"),
        ("*/v1/chat/completions", "path"),
        ("/v1/messages", "path"),
        ("*", "model"),
    ],
)
def test_globs_that_mean_what_they_say_get_no_warning(glob, key):
    assert regex_warning(glob, key) is None


@pytest.mark.parametrize(
    ("regex", "key", "glob"),
    [
        ("^gpt-4o", "model", "gpt-4o*"),
        ("openai.com$", "host", "*openai.com"),
        ("gpt-4\\d", "model", "gpt-4[0-9]"),
        ("claude-[0-9]+", "model", "claude-[0-9]*"),
        ("gpt-4o.+", "model", "gpt-4o?*"),
        ("^.*sonnet.*$", "model", "*sonnet*"),
    ],
)
def test_a_simple_regular_expression_gets_its_glob(regex, key, glob):
    warning = regex_warning(regex, key)
    assert warning is not None and warning.endswith(f": write '{glob}'")


def test_a_regular_expression_without_a_glob_spelling_is_told_to_be_rewritten():
    warning = regex_warning("(gpt|o1)-.*", "model")
    assert warning is not None and warning.endswith("(has .*, has |); rules use globs, matched against the whole model name: rewrite it as a glob")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_rules_have_no_pattern_warnings(path):
    assert load_rules(path).warnings == ()
