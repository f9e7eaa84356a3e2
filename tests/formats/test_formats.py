"""Every wire format: where media sit, in document order, and how a placeholder replaces them."""

from __future__ import annotations

import copy

import pytest

from trimflow.formats import FORMATS, detect_shape, split_data_url, streamed_path
from trimflow.testing import b64, data_url

from .cases import CASES, JPEG, PNG


@pytest.mark.parametrize("name", sorted(CASES))
def test_find_media_in_document_order(name: str) -> None:
    body, expected = CASES[name]
    found = FORMATS[name].find_media(body)
    assert [(m.kind, m.path) for m in found] == expected


@pytest.mark.parametrize("name", sorted(CASES))
def test_base64_size_is_measured_on_the_wire_text(name: str) -> None:
    body, _ = CASES[name]
    first = FORMATS[name].find_media(body)[0]
    assert first.wire_bytes >= len(b64(PNG))
    assert first.base64_prefix(8) == b64(PNG)[:8]


def _value(node, path):
    for key in path:
        node = node[key]
    return node


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


def test_openai_chat_placeholder_is_a_text_part() -> None:
    body, _ = CASES["openai-chat"]
    out = FORMATS["openai-chat"].replace_media(body, {("messages", 1, "content", 1): "[gone]"})
    assert out["messages"][1]["content"] == [{"type": "text", "text": "look"}, {"type": "text", "text": "[gone]"}]
    assert out["messages"][0] is body["messages"][0]


def test_responses_placeholder_is_input_text_in_tool_output_too() -> None:
    body, _ = CASES["openai-responses"]
    out = FORMATS["openai-responses"].replace_media(body, {("input", 2, "output", 1): "[gone]"})
    assert out["input"][2]["output"][1] == {"type": "input_text", "text": "[gone]"}
    assert out["input"][2]["call_id"] == "c1"


def test_anthropic_placeholder_keeps_cache_control_and_stays_in_tool_result() -> None:
    body, _ = CASES["anthropic"]
    module = FORMATS["anthropic"]
    out = module.replace_media(body, {("messages", 0, "content", 0): "[a]", ("messages", 2, "content", 0, "content", 1): "[b]"})
    assert out["messages"][0]["content"][0] == {"type": "text", "text": "[a]", "cache_control": {"type": "ephemeral"}}
    result = out["messages"][2]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "t1"
    assert result["content"][1] == {"type": "text", "text": "[b]"}


def test_gemini_both_spellings_and_function_response_parts() -> None:
    body, _ = CASES["gemini"]
    out = FORMATS["gemini"].replace_media(body, {("contents", 2, "parts", 0, "functionResponse", "parts", 0): "[gone]"})
    response = out["contents"][2]["parts"][0]["functionResponse"]
    assert response["parts"] == [{"text": "[gone]"}] and response["name"] == "shot"


def test_bedrock_placeholder_inside_tool_result() -> None:
    body, _ = CASES["bedrock-converse"]
    out = FORMATS["bedrock-converse"].replace_media(body, {("messages", 2, "content", 0, "toolResult", "content", 0): "[gone]"})
    assert out["messages"][2]["content"][0]["toolResult"]["content"] == [{"text": "[gone]"}, {"text": "ok"}]


def test_ollama_image_leaves_images_and_note_joins_content() -> None:
    body, _ = CASES["ollama"]
    module = FORMATS["ollama"]
    out = module.replace_media(body, {("messages", 0, "images", 0): "[one]", ("messages", 2, "images", 0): "[three]"})
    assert out["messages"][0]["images"] == [b64(JPEG)]
    assert out["messages"][0]["content"] == "look\n[one]"
    # An empty message gets the note alone, never empty content.
    assert out["messages"][2]["content"] == "[three]"
    assert out["messages"][2]["images"] == [5]


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


def test_model_from_path_when_the_body_has_none() -> None:
    assert FORMATS["openai-chat"].model({"messages": []}, "/openai/deployments/dep1/chat/completions") == "dep1"
    vertex = "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514:streamRawPredict"
    assert FORMATS["anthropic"].model({"anthropic_version": "vertex-2023-10-16", "messages": []}, vertex) == "claude-sonnet-4@20250514"
    bedrock_invoke = "/model/us.anthropic.claude-3-7-sonnet-20250219-v1%3A0/invoke"
    assert FORMATS["anthropic"].model({"messages": []}, bedrock_invoke) == "us.anthropic.claude-3-7-sonnet-20250219-v1:0"


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("data:image/png;base64,AAAA", ("image/png", 22)),
        ("data:image/jpeg;name=shot.jpg;base64,/9j/", ("image/jpeg", 37)),
        ("data:;base64,AAAA", (None, 13)),
        ("data:image/png;base64,", ("image/png", 22)),
        ("data:image/png,AAAA", None),  # not base64
        ("data:text/plain;charset=utf-8,hello", None),
        ("data:image/png;base64", None),  # no comma
        ("https://example.com/a.png", None),
        ("", None),
    ],
)
def test_split_data_url(url: str, want: tuple[str | None, int] | None) -> None:
    assert split_data_url(url) == want
    if want is not None:
        assert url[want[1] - 1] == ","  # the offset is where the payload starts


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


def test_websocket_response_create_is_read_at_top_level_or_nested() -> None:
    module = FORMATS["openai-responses"]
    item = {"role": "user", "content": [{"type": "input_image", "image_url": data_url(PNG, "image/png")}]}
    flat = {"type": "response.create", "model": "gpt-5", "input": [item]}
    nested = {"type": "response.create", "response": {"model": "gpt-5", "input": [item]}}
    assert [m.path for m in module.find_media(flat)] == [("input", 0, "content", 0)]
    assert [m.path for m in module.find_media(nested)] == [("response", "input", 0, "content", 0)]
    out = module.replace_media(nested, {("response", "input", 0, "content", 0): "[gone]"})
    assert out["response"]["input"][0]["content"][0]["type"] == "input_text"


def test_gemini_mixed_spellings_from_google_genai() -> None:
    # google-genai sends inlineData with a snake_case mime_type; a rewrite keeps what it found.
    body = {"contents": [{"role": "user", "parts": [{"inlineData": {"data": b64(PNG), "mime_type": "image/png"}},
                                                    {"file_data": {"mimeType": "image/jpeg", "file_uri": "gs://b/x"}}]}]}
    found = FORMATS["gemini"].find_media(body)
    assert [(m.kind, m.declared_mime) for m in found] == [("image", "image/png"), ("image", None)]
    out = FORMATS["gemini"].replace_data(body, {("contents", 0, "parts", 0): (b64(JPEG), "image/jpeg")})
    assert out["contents"][0]["parts"][0] == {"inlineData": {"data": b64(JPEG), "mime_type": "image/jpeg"}}


def test_embeddings_and_moderations_are_not_taken_for_responses() -> None:
    for body in ({"model": "text-embedding-3-small", "input": "hello"}, {"model": "omni-moderation-latest", "input": ["a", "b"]}):
        assert detect_shape(body) is None
