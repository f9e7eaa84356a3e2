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


# --- Gemini ---------------------------------------------------------------------------------------------------


def gemini_part(data: bytes, snake: bool, mime: str = "image/png") -> dict[str, Any]:
    if snake:
        return {"inline_data": {"mime_type": mime, "data": b64(data)}}
    return {"inlineData": {"mimeType": mime, "data": base64.urlsafe_b64encode(data).decode()}, "thoughtSignature": "sig"}


def gemini_body() -> dict[str, Any]:
    return {
        "contents": [
            {"role": "user", "parts": [{"text": "first"}, gemini_part(BIG, snake=True)]},
            {"role": "model", "parts": [{"text": "ok"}]},
            {"role": "user", "parts": [gemini_part(OTHER, snake=False), gemini_part(TINY, snake=True), gemini_part(BIG, True, "image/gif")]},
        ]
    }


def test_the_gemini_api_has_files_and_vertex_has_none() -> None:
    expected = so.FilesApi(so.GEMINI, "/v1beta/files", "/upload/v1beta/files")
    assert so.files_api("gemini", "/v1beta/models/gemini-2.5-flash:generateContent") == expected
    assert so.files_api("gemini", "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse") == expected
    assert so.files_api("gemini", "/v1/models/gemini-2.5-flash:generateContent") == so.FilesApi(so.GEMINI, "/v1/files", "/upload/v1/files")
    under_proxy = so.FilesApi(so.GEMINI, "/proxy/v1beta/files", "/proxy/upload/v1beta/files")
    assert so.files_api("gemini", "/proxy/v1beta/models/m:generateContent") == under_proxy
    for path in (
        "/v1beta/models/gemini-2.5-flash:countTokens",
        "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-flash:generateContent",  # Vertex
        "/v1beta1/projects/p/locations/global/publishers/google/models/gemini-2.5-flash:streamGenerateContent",
        "/v1/publishers/google/models/gemini-2.5-flash:generateContent",  # Vertex express
        "/v1internal:generateContent",  # Gemini CLI's Code Assist backend
    ):
        assert so.files_api("gemini", path) is None


def test_a_gemini_key_in_the_header_or_the_query_is_the_tenant() -> None:
    header = so.credentials_of({"x-goog-api-key": "AIza-one"})
    query = so.credentials_of({}, "AIza-one")
    assert header == query == (("x-goog-api-key", "AIza-one"),)
    other = so.credentials_of({}, "AIza-two")
    assert header is not None and other is not None and so.tenant_of(header, "https://g:443") != so.tenant_of(other, "https://g:443")
    assert so.credentials_of({}, None) is None


def test_gemini_candidates_are_png_jpeg_webp_after_the_models_last_content() -> None:
    found = so.candidates("gemini", gemini_body())  # no GIF (Gemini takes none), no tiny image
    assert [(c.path, c.new, c.mime) for c in found] == [
        (("contents", 0, "parts", 1), False, "image/png"),
        (("contents", 2, "parts", 0), True, "image/png"),
    ]
    assert found[0].decoded() == BIG and found[1].decoded() == OTHER  # urlsafe base64, as google-genai sends it


def test_gemini_references_take_the_parts_own_spelling() -> None:
    body = gemini_body()
    raw = orjson.dumps(body)
    refs = {("contents", 0, "parts", 1): "files/abc-1", ("contents", 2, "parts", 0): "files/def"}
    out = orjson.loads(so.with_references(raw, "gemini", body, refs))
    assert so.with_references(raw, "gemini", body, refs, "v1").count(b"https://generativelanguage.googleapis.com/v1/files/") == 2
    assert out["contents"][0]["parts"][1] == {
        "file_data": {"mime_type": "image/png", "file_uri": "https://generativelanguage.googleapis.com/v1beta/files/abc-1"}
    }
    assert out["contents"][2]["parts"][0] == {
        "fileData": {"mimeType": "image/png", "fileUri": "https://generativelanguage.googleapis.com/v1beta/files/def"},
        "thoughtSignature": "sig",
    }
    assert list(out["contents"][2]["parts"][0]) == ["fileData", "thoughtSignature"]  # in the inline part's place
    out["contents"][0]["parts"][1], out["contents"][2]["parts"][0] = body["contents"][0]["parts"][1], body["contents"][2]["parts"][0]
    assert out == body


def test_gemini_upload_is_the_resumable_protocol_held_to_its_own_host() -> None:
    (candidate,) = [c for c in so.candidates("gemini", gemini_body()) if c.new]
    headers, metadata = so.gemini_upload_start(candidate, len(OTHER))
    assert headers["x-goog-upload-protocol"] == "resumable" and headers["x-goog-upload-command"] == "start"
    assert headers["x-goog-upload-header-content-length"] == str(len(OTHER)) and headers["x-goog-upload-header-content-type"] == "image/png"
    assert orjson.loads(metadata) == {"file": {"display_name": candidate.filename}}
    url = "https://generativelanguage.googleapis.com/upload/v1beta/files?upload_id=AB-c_1&upload_protocol=resumable"
    finish = so.gemini_upload_finish(url, "https", "generativelanguage.googleapis.com", "/upload/v1beta/files")
    assert finish == (
        "/upload/v1beta/files?upload_id=AB-c_1&upload_protocol=resumable",
        {"x-goog-upload-command": "upload, finalize", "x-goog-upload-offset": "0"},
    )
    for hostile in (
        None,
        "",
        "https://evil.example/upload/v1beta/files?upload_id=1",
        "http://generativelanguage.googleapis.com/upload/v1beta/files?upload_id=1",
        "https://generativelanguage.googleapis.com/v1beta/models/m:generateContent?upload_id=1",
        "https://generativelanguage.googleapis.com@evil.example/upload/v1beta/files",
        "https://generativelanguage.googleapis.com/upload/v1beta/files?upload_id=1\r\nx: y",
    ):
        assert so.gemini_upload_finish(hostile, "https", "generativelanguage.googleapis.com", "/upload/v1beta/files") is None


def gemini_file(**fields: Any) -> bytes:
    file = {"name": "files/abc-123", "uri": "https://generativelanguage.googleapis.com/v1beta/files/abc-123", "state": "ACTIVE", **fields}
    return orjson.dumps({"file": file})


def test_a_gemini_upload_answer_names_an_active_file_by_its_own_uri() -> None:
    assert so.file_id_of(gemini_file(), so.GEMINI) == "files/abc-123"
    assert so.file_id_of(gemini_file(), so.GEMINI, "v1") is None  # an upload to v1 answers the v1 URI
    v1 = gemini_file(uri="https://generativelanguage.googleapis.com/v1/files/abc-123")
    assert so.file_id_of(v1, so.GEMINI, "v1") == "files/abc-123"
    no_state = {"file": {"name": "files/abc-123", "uri": "https://generativelanguage.googleapis.com/v1beta/files/abc-123"}}
    assert so.file_id_of(orjson.dumps(no_state), so.GEMINI) == "files/abc-123"
    for hostile in (
        gemini_file(state="PROCESSING"),
        gemini_file(uri="https://evil.example/v1beta/files/abc-123"),
        gemini_file(name="files/ABC", uri="https://generativelanguage.googleapis.com/v1beta/files/ABC"),
        gemini_file(name='files/a"b'),
        b'{"id": "file_1"}',
        b"[]",
    ):
        assert so.file_id_of(hostile, so.GEMINI) is None
    assert so.is_provider_file_id("files/abc-123") and not so.is_provider_file_id("files/../x")
    assert so.file_path("/v1beta/files", "files/abc-123") == "/v1beta/files/abc-123"
    assert so.file_path("/v1/files", "file_1") == "/v1/files/file_1"


def test_gemini_refuses_a_reference_with_403_naming_the_file() -> None:
    message = "You do not have permission to access the File abc-123 or it may not exist."
    answer = orjson.dumps({"error": {"code": 403, "message": message, "status": "PERMISSION_DENIED"}})
    assert so.refused_ids(403, answer, frozenset({"files/abc-123", "files/other"})) == {"files/abc-123"}


def test_gemini_lists_files_with_page_tokens_and_leaves_empty_fields_out() -> None:
    page = {
        "files": [{"name": "files/a1", "displayName": "trimflow-x.png", "sizeBytes": "12", "createTime": "2026-12-07T10:00:00.123456789Z"}],
        "nextPageToken": "t2",
    }
    files, token = so.listed_files(orjson.dumps(page), so.GEMINI)
    assert [(f.file_id, f.filename, f.size) for f in files] == [("files/a1", "trimflow-x.png", 12)] and token == "t2"
    assert files[0].created_at == pytest.approx(1796637600.123456)
    assert so.listed_files(b"{}", so.GEMINI) == ([], None)
    with pytest.raises(ValueError, match="not a list"):
        so.listed_files(b'{"files": 1}', so.GEMINI)


def test_gemini_files_are_referenced_for_at_most_47_hours() -> None:
    assert so.max_lifetime(so.GEMINI) == 47 * 3600 and so.max_lifetime(so.ANTHROPIC) is None
