"""The fake provider's Files APIs over HTTP: an upload per key (Anthropic's needs its beta header, Gemini's is
resumable), list, get and delete, 404 for an id the key does not own (Gemini's 403); a message that references a
file is answered with the usage, and the cache model's reads, of the same image inline; a reference to another key's
file is refused as the provider does."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from trimflow.testing import FakeProvider, image

KEY, OTHER = "sk-ant-fake-files-1", "sk-ant-fake-files-2"
SHOT = image(120, 90, "PNG", seed=8)
BETA = {"anthropic-beta": "files-api-2025-04-14"}


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProvider]:
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with FakeProvider(cache=True) as fake:
        yield fake


def call(provider: FakeProvider, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(f"{provider.url}{path}", data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, orjson.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read())


def claude(key: str, **extra: str) -> dict[str, str]:
    return {"x-api-key": key, "anthropic-version": "2023-06-01", **extra}


def upload(provider: FakeProvider, headers: dict[str, str], fields: bytes = b"") -> tuple[int, Any]:
    head = b'--B\r\nContent-Disposition: form-data; name="file"; filename="s.png"\r\nContent-Type: image/png\r\n\r\n'
    body = fields + head + SHOT + b"\r\n--B--\r\n"
    return call(provider, "POST", "/v1/files", {**headers, "content-type": "multipart/form-data; boundary=B"}, body)


def message(provider: FakeProvider, key: str, source: dict[str, Any], beta: bool = True) -> tuple[int, Any]:
    system = [{"type": "text", "text": "A long system prompt. " * 300, "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "user", "content": [{"type": "image", "source": source}]}]
    body = {"model": "claude-sonnet-4-6", "max_tokens": 10, "system": system, "messages": messages}
    return call(provider, "POST", "/v1/messages", {**claude(key, **(BETA if beta else {})), "content-type": "application/json"}, orjson.dumps(body))


def test_anthropic_upload_list_get_delete_per_key(provider: FakeProvider) -> None:
    assert upload(provider, claude(KEY))[0] == 400  # without the beta header
    status, uploaded = upload(provider, claude(KEY, **BETA))
    assert status == 200 and uploaded["type"] == "file" and uploaded["size_bytes"] == len(SHOT) and uploaded["mime_type"] == "image/png"
    file_id = uploaded["id"]
    assert call(provider, "GET", "/v1/files", claude(KEY, **BETA))[1]["data"][0]["id"] == file_id
    assert call(provider, "GET", "/v1/files", claude(OTHER, **BETA))[1]["data"] == []
    assert call(provider, "GET", f"/v1/files/{file_id}", claude(OTHER, **BETA))[0] == 404
    status, refused = call(provider, "DELETE", f"/v1/files/{file_id}", claude(OTHER, **BETA))
    assert status == 404 and file_id in refused["error"]["message"]
    assert call(provider, "DELETE", f"/v1/files/{file_id}", claude(KEY, **BETA)) == (200, {"id": file_id, "type": "file_deleted"})
    assert call(provider, "GET", f"/v1/files/{file_id}", claude(KEY, **BETA))[0] == 404


def test_openai_upload_needs_a_purpose_and_takes_an_expiry(provider: FakeProvider) -> None:
    headers = {"authorization": "Bearer sk-openai-fake"}
    assert upload(provider, headers)[0] == 400
    purpose = b'--B\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nvision\r\n'
    expiry = b'--B\r\nContent-Disposition: form-data; name="expires_after[anchor]"\r\n\r\ncreated_at\r\n'
    expiry += b'--B\r\nContent-Disposition: form-data; name="expires_after[seconds]"\r\n\r\n3600\r\n'
    status, uploaded = upload(provider, headers, purpose + expiry)
    assert status == 200 and uploaded["object"] == "file" and uploaded["purpose"] == "vision"
    assert uploaded["expires_at"] == uploaded["created_at"] + 3600 and uploaded["id"].startswith("file-")
    assert provider.files.files("sk-openai-fake")[0].data == SHOT


def test_a_reference_costs_what_the_inline_image_costs_and_another_keys_file_is_refused(provider: FakeProvider) -> None:
    file_id = upload(provider, claude(KEY, **BETA))[1]["id"]
    inline_source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(SHOT).decode()}
    status, inline = message(provider, KEY, inline_source)
    assert status == 200
    status, referenced = message(provider, KEY, {"type": "file", "file_id": file_id})
    assert status == 200 and referenced["usage"]["input_tokens"] + referenced["usage"]["cache_read_input_tokens"] == (
        inline["usage"]["input_tokens"] + inline["usage"]["cache_creation_input_tokens"]
    )
    assert referenced["usage"]["cache_read_input_tokens"] > 0  # the cache model reads the reference as the same image
    assert message(provider, KEY, {"type": "file", "file_id": file_id}, beta=False)[0] == 400
    status, refused = message(provider, OTHER, {"type": "file", "file_id": file_id})
    assert status == 404 and file_id in refused["error"]["message"]


# --- Gemini's ---------------------------------------------------------------------------------------------------

GKEY, GOTHER = "AIza-fake-files-1", "AIza-fake-files-2"
GEMINI_URI = "https://generativelanguage.googleapis.com/v1beta/files/"


def gemini_upload(provider: FakeProvider, headers: dict[str, str], query: str = "") -> tuple[int, Any]:
    start = {
        **headers,
        "x-goog-upload-protocol": "resumable",
        "x-goog-upload-command": "start",
        "x-goog-upload-header-content-length": str(len(SHOT)),
        "x-goog-upload-header-content-type": "image/png",
        "content-type": "application/json",
    }
    request = urllib.request.Request(
        f"{provider.url}/upload/v1beta/files{query}", data=b'{"file": {"display_name": "trimflow-x.png"}}', headers=start
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.read() == b""
        url = answer.headers["x-goog-upload-url"]
    assert url.startswith(f"{provider.url}/upload/v1beta/files?upload_id=")
    finish = {"x-goog-upload-command": "upload, finalize", "x-goog-upload-offset": "0", "content-type": "image/png"}
    return call(provider, "POST", url.removeprefix(provider.url), finish, SHOT)


def gemini_turn(provider: FakeProvider, key: str, part: dict[str, Any]) -> tuple[int, Any]:
    body = {
        "systemInstruction": {"parts": [{"text": "A long system prompt. " * 900}]},
        "contents": [{"role": "user", "parts": [part, {"text": "?"}]}],
    }
    headers = {"x-goog-api-key": key, "content-type": "application/json"}
    return call(provider, "POST", "/v1beta/models/gemini-2.5-flash:generateContent", headers, orjson.dumps(body))


def test_gemini_resumable_upload_list_get_delete_per_key(provider: FakeProvider) -> None:
    status, uploaded = gemini_upload(provider, {"x-goog-api-key": GKEY})
    file = uploaded["file"]
    name = file["name"]
    assert status == 200 and name.startswith("files/") and file["uri"] == GEMINI_URI + name.removeprefix("files/")
    assert file["state"] == "ACTIVE" and file["sizeBytes"] == str(len(SHOT)) and file["mimeType"] == "image/png"
    assert file["displayName"] == "trimflow-x.png" and file["expirationTime"] > file["createTime"]
    assert provider.files.files(GKEY)[0].data == SHOT
    assert call(provider, "GET", "/v1beta/files", {"x-goog-api-key": GKEY})[1]["files"][0]["name"] == name
    assert call(provider, "GET", f"/v1beta/files?key={GOTHER}", {})[1] == {}  # Gemini leaves an empty list out
    status, refused = call(provider, "GET", f"/v1beta/{name}", {"x-goog-api-key": GOTHER})
    assert status == 403 and refused["error"]["status"] == "PERMISSION_DENIED" and name.removeprefix("files/") in refused["error"]["message"]
    assert call(provider, "DELETE", f"/v1beta/{name}", {"x-goog-api-key": GOTHER})[0] == 403
    assert call(provider, "DELETE", f"/v1beta/{name}?key={GKEY}", {}) == (200, {})
    assert call(provider, "GET", f"/v1beta/{name}", {"x-goog-api-key": GKEY})[0] == 403
    assert gemini_upload(provider, {}, f"?key={GOTHER}")[0] == 200 and len(provider.files.files(GOTHER)) == 1  # the key as a query


def test_gemini_takes_only_the_resumable_protocol_in_one_finalizing_upload(provider: FakeProvider) -> None:
    multipart = {"x-goog-api-key": GKEY, "x-goog-upload-protocol": "multipart", "content-type": "multipart/related; boundary=B"}
    assert call(provider, "POST", "/upload/v1beta/files", multipart, b"--B--")[0] == 400
    assert (
        call(provider, "POST", "/upload/v1beta/files?upload_id=nope&upload_protocol=resumable", {"x-goog-upload-command": "upload, finalize"}, SHOT)[
            0
        ]
        == 404
    )


def test_a_gemini_reference_costs_what_the_inline_image_costs_and_another_keys_file_is_refused(provider: FakeProvider) -> None:
    uri = gemini_upload(provider, {"x-goog-api-key": GKEY})[1]["file"]["uri"]
    status, inline = gemini_turn(provider, GKEY, {"inline_data": {"mime_type": "image/png", "data": base64.b64encode(SHOT).decode()}})
    assert status == 200
    for part in ({"file_data": {"mime_type": "image/png", "file_uri": uri}}, {"fileData": {"mimeType": "image/png", "fileUri": uri}}):
        status, referenced = gemini_turn(provider, GKEY, part)
        assert status == 200 and referenced["usageMetadata"]["promptTokenCount"] == inline["usageMetadata"]["promptTokenCount"]
        assert referenced["usageMetadata"]["cachedContentTokenCount"] > 0  # the cache model reads the reference as the same image
    status, refused = gemini_turn(provider, GOTHER, {"file_data": {"mime_type": "image/png", "file_uri": uri}})
    assert status == 403 and uri.removeprefix(GEMINI_URI) in refused["error"]["message"]
    status, refused = gemini_turn(provider, GKEY, {"file_data": {"mime_type": "image/png", "file_uri": "https://elsewhere.example/v1beta/files/x"}})
    assert status == 403
