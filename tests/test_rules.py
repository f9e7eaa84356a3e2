"""trimflow._rules: which rule a request meets (host, path and model globs, the first match, the defaults) and
which endpoints are LLM calls."""

import time

import pytest

from trimflow._limits import Limits
from trimflow._rules import BUILTIN_ENDPOINTS, FORMAT_NAMES, Endpoint, Rule, Rules, builtin_rules

from .rules_files import MiB, load

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
