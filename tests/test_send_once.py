"""trimflow._send_once: which images may go by reference (large, of a type the Files API takes, new in this request or
already mapped), the body with references in place (every other byte as it came, per format), the tenant (a digest
that differs per key and never holds it), the upload form, and which error answers refuse a reference."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from trimflow import _send_once as so
from trimflow.testing import image

BIG = image(200, 150, "PNG", seed=3)
OTHER = image(200, 150, "PNG", seed=4)
TINY = image(8, 8, "PNG", seed=5)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def claude_block(data: bytes, mime: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": mime, "data": b64(data)}, "cache_control": {"type": "ephemeral"}}


def claude_body() -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-6",
        "messages": [
            {"role": "user", "content": [claude_block(BIG), {"type": "text", "text": "first"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": [claude_block(OTHER)]},
                    claude_block(TINY),
                    claude_block(BIG, "image/bmp"),
                ],
            },
        ],
    }


def test_files_api_only_beside_the_direct_endpoints() -> None:
    assert so.files_api("anthropic", "/v1/messages") == so.FilesApi(so.ANTHROPIC, "/v1/files")
    assert so.files_api("anthropic", "/gateway/anthropic/v1/messages?beta=true") == so.FilesApi(so.ANTHROPIC, "/gateway/anthropic/v1/files")
    assert so.files_api("openai-responses", "/v1/responses") == so.FilesApi(so.OPENAI, "/v1/files")
    for fmt, path in (
        ("anthropic", "/v1/messages/count_tokens"),
        ("anthropic", "/model/anthropic.claude-sonnet-4/invoke"),  # Bedrock
        ("anthropic", "/v1/projects/p/locations/l/publishers/anthropic/models/claude:rawPredict"),  # Vertex
        ("openai-responses", "/backend-api/codex/responses"),  # ChatGPT's backend: no Files API
        ("openai-chat", "/v1/chat/completions"),
    ):
        assert so.files_api(fmt, path) is None


def test_candidates_are_large_images_of_a_taken_type_and_the_newest_message_is_new() -> None:
    found = so.candidates("anthropic", claude_body())
    assert [(c.path, c.new, c.mime) for c in found] == [
        (("messages", 0, "content", 0), False, "image/png"),
        (("messages", 2, "content", 0, "content", 0), True, "image/png"),
    ]
    assert found[0].decoded() == BIG and found[0].filename == f"trimflow-{found[0].digest.hex()}.png"
    again = so.candidates("anthropic", claude_body())
    assert [c.digest for c in again] == [c.digest for c in found] and found[0].digest != found[1].digest


def test_references_replace_only_the_image_parts_keeping_every_other_byte() -> None:
    body = claude_body()
    raw = orjson.dumps(body, option=orjson.OPT_INDENT_2)  # spacing of its own, which stays
    refs = {("messages", 2, "content", 0, "content", 0): "file_abc"}
    out = so.with_references(raw, "anthropic", body, refs)
    parsed = orjson.loads(out)
    block = parsed["messages"][2]["content"][0]["content"][0]
    assert block == {"type": "image", "source": {"type": "file", "file_id": "file_abc"}, "cache_control": {"type": "ephemeral"}}
    parsed["messages"][2]["content"][0]["content"][0] = body["messages"][2]["content"][0]["content"][0]
    assert parsed == body
    assert out.startswith(raw[: raw.index(b'"type": "tool_result"')])  # the bytes before the edit as they came
    assert b64(OTHER) not in out.decode()


def responses_body(previous: bool = False) -> dict[str, Any]:
    url = f"data:image/webp;base64,{b64(BIG)}"
    body: dict[str, Any] = {
        "model": "gpt-5",
        "input": [
            {"role": "user", "content": [{"type": "input_image", "image_url": url, "detail": "high"}]},
            {"type": "function_call", "call_id": "c", "name": "shot", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image", "image_url": url.replace("webp", "png")}]},
            {"type": "computer_call_output", "call_id": "d", "output": {"type": "computer_screenshot", "image_url": url}},
        ],
    }
    if previous:
        body["previous_response_id"] = "resp_1"
    return body


def test_responses_input_images_after_the_models_last_item_are_new_and_keep_their_detail() -> None:
    body = responses_body()
    found = so.candidates("openai-responses", body)  # the computer screenshot is not an input_image: it stays
    assert [(c.path, c.new) for c in found] == [(("input", 0, "content", 0), False), (("input", 2, "output", 0), True)]
    assert all(c.new for c in so.candidates("openai-responses", responses_body(previous=True)))
    out = orjson.loads(so.with_references(orjson.dumps(body), "openai-responses", body, {("input", 0, "content", 0): "file-1"}))
    assert out["input"][0]["content"][0] == {"type": "input_image", "detail": "high", "file_id": "file-1"}


def test_the_tenant_differs_per_key_and_upstream_and_holds_no_key() -> None:
    one = so.credentials_of({"x-api-key": "sk-one", "anthropic-version": "2023-06-01"})
    two = so.credentials_of({"authorization": "Bearer sk-two", "openai-organization": "org-1"})
    assert one == (("x-api-key", "sk-one"),) and two == (("authorization", "Bearer sk-two"), ("openai-organization", "org-1"))
    assert so.credentials_of({"anthropic-version": "2023-06-01"}) is None
    assert one is not None and two is not None
    tenants = {so.tenant_of(one, "https://a:443"), so.tenant_of(two, "https://a:443"), so.tenant_of(one, "https://b:443")}
    assert len(tenants) == 3 and all(b"sk-" not in t for t in tenants)
    org_two = so.credentials_of({"authorization": "Bearer sk-two", "openai-organization": "org-2"})
    assert org_two is not None and so.tenant_of(org_two, "https://a:443") != so.tenant_of(two, "https://a:443")


def test_the_beta_header_is_merged() -> None:
    assert so.with_files_beta(None) == "files-api-2025-04-14"
    assert so.with_files_beta("prompt-caching-2024-07-31") == "prompt-caching-2024-07-31, files-api-2025-04-14"
    assert so.with_files_beta("files-api-2025-04-14,x") == "files-api-2025-04-14, x"


def test_upload_forms_and_answers() -> None:
    (candidate,) = [c for c in so.candidates("anthropic", claude_body()) if c.new]
    content_type, form = so.upload_form(so.FilesApi(so.OPENAI, "/v1/files"), candidate, BIG, 60)
    assert content_type.startswith("multipart/form-data; boundary=")
    assert b'name="purpose"\r\n\r\nvision' in form and b'name="expires_after[seconds]"\r\n\r\n3600' in form and BIG in form
    _, form = so.upload_form(so.FilesApi(so.ANTHROPIC, "/v1/files"), candidate, BIG, 60)
    assert b"purpose" not in form and f'filename="{candidate.filename}"'.encode() in form
    assert so.file_id_of(b'{"id": "file_011CNha8iCJcU1wXNR6q4V8w", "type": "file"}') == "file_011CNha8iCJcU1wXNR6q4V8w"
    for hostile in (b'{"id": "x\\", \\"type\\": \\"base64"}', b"[]", b"nope", b'{"id": 5}', b'{"id": ""}'):
        assert so.file_id_of(hostile) is None


@pytest.mark.parametrize(
    ("status", "answer", "refused"),
    [
        (404, b'{"type":"error","error":{"type":"not_found_error","message":"File not found: file_1"}}', {"file_1"}),
        (400, b'{"error":{"message":"No such File object: file_2"}}', {"file_2"}),
        (400, b'{"error":{"message":"prompt is too long"}}', set()),
        (500, b"file_1", set()),
    ],
)
def test_refused_ids_are_the_referenced_ids_an_error_names(status: int, answer: bytes, refused: set[str]) -> None:
    assert so.refused_ids(status, answer, frozenset({"file_1", "file_2"})) == refused


def test_listed_files_read_both_providers_lists() -> None:
    anthropic = b'{"data":[{"id":"file_1","filename":"trimflow-a.png","size_bytes":5,"created_at":"2026-12-07T10:00:00Z"}],"has_more":true}'
    files, after = so.listed_files(anthropic)
    assert files[0].size == 5 and files[0].created_at == pytest.approx(1796637600.0) and after == "file_1"
    openai = b'{"object":"list","data":[{"id":"file-1","filename":"x","bytes":7,"created_at":100},{"id":"bad id"}],"has_more":false}'
    files, after = so.listed_files(openai)
    assert [(f.file_id, f.size, f.created_at) for f in files] == [("file-1", 7, 100.0)] and after is None
    with pytest.raises(ValueError, match="not a list"):
        so.listed_files(b"{}")
