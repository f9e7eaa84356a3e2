"""Every wire format through the one interface: where media sit, in document order, how a placeholder replaces
them, the model, streamed paths and shape detection. What only one format does is in its own test_<format>.py."""

from __future__ import annotations

import copy

import pytest

from trimflow.formats import FORMATS, WireFormat, detect_shape, streamed_path
from trimflow.testing import b64

from .cases import AFTER_TOOL_CASES, CASES, ORIGINS, PNG


@pytest.mark.parametrize("name", sorted(CASES))
def test_find_media_in_document_order(name: str) -> None:
    body, expected = CASES[name]
    found = FORMATS[name].find_media(body)
    assert [(m.kind, m.path) for m in found] == expected


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_medium_says_where_it_came_from(name: str) -> None:
    """The user's attachments, a tool's output and what the agent attached beside a tool result or in its own turn."""
    body, _ = CASES[name]
    assert [m.origin for m in FORMATS[name].find_media(body)] == ORIGINS[name]


@pytest.mark.parametrize("name", sorted(AFTER_TOOL_CASES))
def test_a_message_of_nothing_but_images_after_a_tool_is_the_agents(name: str) -> None:
    body, expected = AFTER_TOOL_CASES[name]
    assert [m.origin for m in FORMATS[name].find_media(body) if m.kind == "image"] == expected


@pytest.mark.parametrize("name", sorted(CASES))
def test_base64_size_is_measured_on_the_wire_text(name: str) -> None:
    body, _ = CASES[name]
    first = FORMATS[name].find_media(body)[0]
    assert first.wire_bytes >= len(b64(PNG))
    assert first.base64_prefix(8) == b64(PNG)[:8]


@pytest.mark.parametrize("name", sorted(CASES))
def test_replace_media_keeps_everything_else_and_never_mutates(name: str) -> None:
    body, expected = CASES[name]
    pristine = copy.deepcopy(body)
    module = FORMATS[name]
    images = [m for m in module.find_media(body) if m.kind == "image"]
    texts = {m.path: f"[placeholder {i}]" for i, m in enumerate(images)}
    out = module.replace_media(body, texts)
    assert body == pristine, "the input was mutated"
    remaining = [m.kind for m in module.find_media(out)]
    assert "image" not in remaining
    assert sorted(remaining) == sorted(k for k, _ in expected if k != "image")
    # Top-level fields other than the conversation are the same objects, untouched.
    for key, value in body.items():
        if key not in ("messages", "input", "contents"):
            assert out[key] == value


@pytest.mark.parametrize(
    ("name", "path", "expected"),
    [
        ("openai-chat", "/v1/chat/completions", "gpt-4o"),
        ("openai-chat", "/openai/deployments/my-gpt4o/chat/completions", "gpt-4o"),
        ("gemini", "/v1beta/models/gemini-2.5-pro:streamGenerateContent", "gemini-2.5-pro"),
        ("gemini", "/v1/projects/p/locations/l/publishers/google/models/gemini-2.0-flash:generateContent", "gemini-2.0-flash"),
        ("bedrock-converse", "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse", "anthropic.claude-3-5-sonnet-20240620-v1:0"),
        ("ollama", "/api/chat", "llava"),
    ],
)
def test_model(name: str, path: str, expected: str) -> None:
    body, _ = CASES[name]
    assert FORMATS[name].model(body, path) == expected


@pytest.mark.parametrize(
    ("path", "streamed"),
    [
        ("/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", True),
        ("/v1beta/models/gemini-2.5-pro:generateContent", False),
        ("/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514:streamRawPredict", True),
        ("/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514:rawPredict", False),
        ("/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse-stream", True),
        ("/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse", False),
        ("/model/us.anthropic.claude-sonnet-4-20250514-v1%3A0/invoke-with-response-stream", True),
        ("/model/x/invoke", False),
        ("/v1/chat/completions", False),  # OpenAI, Anthropic's own API and Ollama ask in the body
        ("/v1/messages", False),
        ("/api/chat", False),
        ("/v1/chat/completions?x=:streamGenerateContent", False),  # the query is not the path
    ],
)
def test_streamed_path(path: str, streamed: bool) -> None:
    assert streamed_path(path) is streamed


def test_each_stream_suffix_ends_one_of_its_formats_endpoints() -> None:
    for module in FORMATS.values():
        for suffix in module.STREAM_SUFFIXES:
            assert any(glob.endswith(suffix) for glob in module.ENDPOINTS), (module.NAME, suffix)


@pytest.mark.parametrize("name", sorted(CASES))
def test_shape_detection_names_each_format(name: str) -> None:
    body, _ = CASES[name]
    assert detect_shape(body) == name


def test_shape_detection_refuses_what_is_not_an_llm_request() -> None:
    for body in ({"query": "x"}, [], {"messages": "x"}, {"contents": []}, None):
        assert detect_shape(body) is None


def test_embeddings_and_moderations_are_not_taken_for_responses() -> None:
    for body in ({"model": "text-embedding-3-small", "input": "hello"}, {"model": "omni-moderation-latest", "input": ["a", "b"]}):
        assert detect_shape(body) is None


def test_every_format_module_is_a_wire_format() -> None:
    members = [name for name in dir(WireFormat) if not name.startswith("_")]
    for name, module in FORMATS.items():
        assert all(hasattr(module, member) for member in members), (name, [m for m in members if not hasattr(module, m)])


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_format_says_whether_a_request_is_a_warmup_or_leaves_its_history_at_the_provider(name: str) -> None:
    body, _ = CASES[name]
    module = FORMATS[name]
    assert not module.is_warmup(body) and not module.server_side_history(body)
    if name == "openai-responses":
        assert module.is_warmup({**body, "generate": False}) and module.server_side_history({**body, "previous_response_id": "resp_1"})


# A longer prompt cache lifetime each format's requests can ask for, and where: (body fields, seconds).
LONGER_LIFETIMES = {
    "anthropic": ({"cache_control": {"type": "ephemeral", "ttl": "1h"}}, 3600.0),
    "openai-chat": ({"prompt_cache_retention": "24h"}, 86400.0),
    "openai-responses": ({"prompt_cache_retention": "24h"}, 86400.0),
    "bedrock-converse": ({"messages": [{"role": "user", "content": [{"cachePoint": {"type": "default", "ttl": "1h"}}]}]}, 3600.0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_format_says_how_long_a_request_asks_its_prompt_cache_to_live(name: str) -> None:
    body, _ = CASES[name]
    module = FORMATS[name]
    assert module.cache_lifetime(body) is None  # the provider's default: the rules' cache_ttl
    if name not in LONGER_LIFETIMES:
        return
    fields, seconds = LONGER_LIFETIMES[name]
    assert module.cache_lifetime({**body, **fields}) == seconds
    if name == "bedrock-converse":
        return  # its junk: test_a_bedrock_cache_point_among_the_messages_asks_for_its_ttl
    for junk in ({"ttl": 3600}, "1h", None, {"ttl": "forever"}):  # not what the API takes: the default
        key = "cache_control" if name == "anthropic" else "prompt_cache_retention"
        assert module.cache_lifetime({**body, key: junk}) is None, junk


def test_an_anthropic_breakpoint_counts_on_a_message_block_not_on_the_system_prompt_or_tools() -> None:
    """Images sit only in messages: a longer-lived system or tools breakpoint leaves them uncached all the same."""
    module = FORMATS["anthropic"]
    hour = {"type": "ephemeral", "ttl": "1h"}
    assert (
        module.cache_lifetime(
            {"system": [{"type": "text", "text": "s", "cache_control": hour}], "tools": [{"name": "t", "cache_control": hour}], "messages": []}
        )
        is None
    )
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "q", "cache_control": {"type": "ephemeral", "ttl": "5m"}},
            {"type": "text", "text": "r", "cache_control": hour},
        ],
    }
    assert module.cache_lifetime({"messages": [message]}) == 3600.0


def test_a_responses_message_over_a_websocket_asks_inside_its_request() -> None:
    module = FORMATS["openai-responses"]
    assert module.cache_lifetime({"type": "response.create", "response": {"input": [], "prompt_cache_retention": "24h"}}) == 86400.0


def test_a_bedrock_cache_point_among_the_messages_asks_for_its_ttl() -> None:
    module = FORMATS["bedrock-converse"]
    hour = {"cachePoint": {"type": "default", "ttl": "1h"}}
    assert module.cache_lifetime({"system": [hour], "toolConfig": {"tools": [hour]}, "messages": []}) is None
    message = {"role": "user", "content": [{"text": "q"}, {"cachePoint": {"type": "default"}}]}
    assert module.cache_lifetime({"messages": [message]}) is None  # the default: 5 minutes
    message["content"].append(hour)
    assert module.cache_lifetime({"messages": [message]}) == 3600.0
    for junk in ({"type": "default", "ttl": 3600}, "1h", {"ttl": "forever"}):
        assert module.cache_lifetime({"messages": [{"role": "user", "content": [{"cachePoint": junk}]}]}) is None, junk
