"""The fake provider's Files APIs, Anthropic's, OpenAI's and Gemini's, as the real ones behave (docs/providers.md#files-api):

- POST */v1/files: a multipart upload (`file`; OpenAI's also `purpose` and optionally `expires_after[...]`); Anthropic's
  needs the `anthropic-beta: files-api-2025-04-14` header (400 without it). The answer is the file object each
  provider returns (Anthropic: id `file_...`, `type`, `filename`, `mime_type`, `size_bytes`, `created_at` in
  RFC 3339, `downloadable`; OpenAI: id `file-...`, `object`, `bytes`, `created_at` in seconds, `filename`,
  `purpose`, `expires_at`).
- GET */v1/files (paged: `limit`, then Anthropic's `after_id` or OpenAI's `after`), GET */v1/files/{id},
  DELETE */v1/files/{id}; an id the key does not own is a 404 (Anthropic `not_found_error`, OpenAI
  `invalid_request_error`), naming the id.
- A message that references a file (`"source": {"type": "file", "file_id": ...}` in an Anthropic image block, with the
  beta header; `file_id` in an OpenAI `input_image`) is answered as if the image were inline (`resolve`): the usage
  and the cache model see the same image either way. A reference to a file the key does not own is refused as the
  provider refuses it (404 for Anthropic, 400 for OpenAI, naming the id).

Gemini's (its paths: */upload/v1beta/files and */v1beta/files, or v1: google-genai's default; a */v1/files request is
Gemini's when it carries `x-goog-api-key` or `?key=`):
- POST */upload/v1beta/files with the resumable protocol: the start (`X-Goog-Upload-Protocol: resumable`,
  `X-Goog-Upload-Command: start`, the size and type in `X-Goog-Upload-Header-Content-Length`/`-Type`, a JSON body
  `{"file": {"display_name": ...}}`) is answered with an empty body and the `X-Goog-Upload-URL` to POST the bytes to
  (`X-Goog-Upload-Command: upload, finalize`, `X-Goog-Upload-Offset: 0`); that answers `{"file": File}` (`name`
  `files/...`, `uri` https://generativelanguage.googleapis.com/v1beta/files/..., `mimeType`, `sizeBytes` as a string,
  `createTime`, `expirationTime` 48 hours on, `state` ACTIVE). Any other protocol is a 400 here.
- GET */v1beta/files (`pageSize`, `pageToken`; `{}` when there is none), GET and DELETE */v1beta/files/{id}
  (DELETE answers `{}`). A file unknown, expired, deleted or another key's is a 403 PERMISSION_DENIED naming its id,
  as Gemini answers it, here and for a reference to it in generateContent (`file_data.file_uri`, or `fileData.fileUri`).

Files are per API key (`x-api-key`, else `x-goog-api-key`, else a `?key=` query, else `Authorization`): a key cannot
see, reference or delete another key's file. The Flavour (Anthropic's or OpenAI's) is the request's: `x-api-key` or
`anthropic-version` make it Anthropic's; Gemini's is by its paths. Nothing is written to disk; `FakeFiles.files()`
lets a test look.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import re
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

import orjson

from .._jsonsplice import splice
from .._media import JsonPath
from ..formats import anthropic, gemini, openai_responses
from ._replies import error_body

ANTHROPIC_BETA = "files-api-2025-04-14"
_FILES_PATH = re.compile(r"^(?P<base>.*)/v1/files(?:/(?P<id>[^/]+))?$")
_GEMINI_FILES_PATH = re.compile(r"^(?P<base>.*?)(?P<upload>/upload)?/(?P<version>v1|v1beta)/files(?:/(?P<id>[^/]+))?$")
# What Gemini names a file by in a request: under the API version it was uploaded with (either is taken).
GEMINI_URI = re.compile(r"https://generativelanguage\.googleapis\.com/(?:v1|v1beta)/files/(?P<id>[a-z0-9-]+)")
GEMINI_LIFETIME = 48 * 3600  # seconds Gemini keeps a file from its upload

# (status, content type, body), and the headers to send with them (Gemini's upload URL).
Answer = tuple[int, str, bytes]
HeadedAnswer = tuple[int, str, bytes, dict[str, str]]


@dataclass(frozen=True, slots=True)
class StoredFile:
    file_id: str
    owner: str
    filename: str
    mime: str
    data: bytes
    created_at: float
    purpose: str | None = None
    expires_at: float | None = None
    version: str = "v1beta"  # Gemini's: the API version of its upload, which its URI names


def _is_anthropic(headers: dict[str, str]) -> bool:
    return "x-api-key" in headers or "anthropic-version" in headers


def owner_of(headers: dict[str, str], query: str = "") -> str | None:
    """The API key a request carries (`x-api-key`, else `x-goog-api-key`, else a `?key=`, else a bearer token), whose
    files it may use."""
    key = headers.get("x-api-key") or headers.get("x-goog-api-key") or (parse_qs(query).get("key") or [""])[0]
    key = key or headers.get("authorization", "").removeprefix("Bearer ").strip()
    return key or None


def _gemini_refused(file_id: str) -> Answer:
    message = f"You do not have permission to access the File {file_id} or it may not exist."
    return 403, "application/json", orjson.dumps({"error": {"code": 403, "message": message, "status": "PERMISSION_DENIED"}})


def _gemini_error(status: int, message: str) -> Answer:
    state = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 404: "NOT_FOUND"}.get(status, "FAILED_PRECONDITION")
    return status, "application/json", orjson.dumps({"error": {"code": status, "message": f"fake-provider: {message}", "status": state}})


def _not_found(anthropic_flavour: bool, file_id: str, status: int = 404) -> Answer:
    if anthropic_flavour:
        return status, "application/json", error_body("not_found_error", f"File not found: {file_id}")
    body = orjson.dumps({"error": {"message": f"No such File object: {file_id}", "type": "invalid_request_error", "param": "id", "code": None}})
    return status, "application/json", body


class ReferenceRefused(Exception):
    """A message references a file its key cannot use: `answer` is the provider's refusal."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer[0])
        self.answer = answer


class FakeFiles:
    """Every key's files, in memory. Thread-safe: the fake provider answers each connection in a thread of its own."""

    def __init__(self, clock: Any = time.time) -> None:
        self.clock = clock
        self._files: dict[str, StoredFile] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._gemini_uploads: dict[str, tuple[str, str, str, int, str]] = {}  # upload id: (key, display name, type, size, version)
        self.scheme = "http"

    def files(self, owner: str | None = None) -> list[StoredFile]:
        """The files stored (one key's when given), oldest first."""
        with self._lock:
            return [f for f in self._files.values() if owner is None or f.owner == owner]

    def delete(self, file_id: str) -> bool:
        """Delete a file as if its owner had (a test's way to make a reference go stale)."""
        with self._lock:
            return self._files.pop(file_id, None) is not None

    # --- the Files API's own endpoints

    def route(self, method: str, path: str, query: str, headers: dict[str, str], body: bytes) -> Answer | HeadedAnswer | None:
        """The answer to a request to a Files API endpoint; None for any other path."""
        gemini_match = _GEMINI_FILES_PATH.match(path)
        googles = "x-goog-api-key" in headers or "key" in parse_qs(query)
        if gemini_match is not None and (gemini_match.group("version") == "v1beta" or gemini_match.group("upload") or googles):
            return self._gemini_route(gemini_match, method, path, query, headers, body)
        match = _FILES_PATH.match(path)
        if match is None:
            return None
        flavour = _is_anthropic(headers)
        owner = owner_of(headers)
        if owner is None:
            return 401, "application/json", error_body("authentication_error", "fake-provider: no API key")
        if flavour and ANTHROPIC_BETA not in headers.get("anthropic-beta", ""):
            return 400, "application/json", error_body("invalid_request_error", f"the Files API needs the anthropic-beta header {ANTHROPIC_BETA}")
        file_id = match.group("id")
        if file_id is None:
            if method == "POST":
                return self._upload(flavour, owner, headers, body)
            if method == "GET":
                return self._list(flavour, owner, parse_qs(query))
        elif method == "GET":
            found = self._owned(owner, file_id)
            return (200, "application/json", orjson.dumps(_file_object(flavour, found))) if found else _not_found(flavour, file_id)
        elif method == "DELETE":
            with self._lock:
                found = self._files.get(file_id)
                if found is None or found.owner != owner:
                    return _not_found(flavour, file_id)
                del self._files[file_id]
            deleted = {"id": file_id, "type": "file_deleted"} if flavour else {"id": file_id, "object": "file", "deleted": True}
            return 200, "application/json", orjson.dumps(deleted)
        return 405, "application/json", error_body("invalid_request_error", f"fake-provider: {method} not allowed here")

    def _owned(self, owner: str, file_id: str) -> StoredFile | None:
        with self._lock:
            found = self._files.get(file_id)
        if found is None or found.owner != owner:
            return None
        if found.expires_at is not None and found.expires_at <= self.clock():
            self.delete(file_id)
            return None
        return found

    def _upload(self, flavour: bool, owner: str, headers: dict[str, str], body: bytes) -> Answer:
        try:
            fields, upload = _multipart(headers.get("content-type", ""), body)
        except ValueError as exc:
            return 400, "application/json", error_body("invalid_request_error", f"fake-provider: {exc}")
        if upload is None:
            return 400, "application/json", error_body("invalid_request_error", "fake-provider: no file in the upload")
        filename, mime, data = upload
        now = self.clock()
        purpose = expires_at = None
        if not flavour:
            purpose = fields.get("purpose")
            if not purpose:
                return 400, "application/json", error_body("invalid_request_error", "fake-provider: purpose is required")
            seconds = fields.get("expires_after[seconds]")
            if seconds is not None:
                if not seconds.isdigit() or not 3600 <= int(seconds) <= 2592000 or fields.get("expires_after[anchor]") != "created_at":
                    return 400, "application/json", error_body("invalid_request_error", "fake-provider: expires_after out of range")
                expires_at = now + int(seconds)
        number = next(self._ids)
        file_id = f"file_{number:024d}" if flavour else f"file-{number:022d}"
        stored = StoredFile(
            file_id=file_id, owner=owner, filename=filename, mime=mime, data=data, created_at=now, purpose=purpose, expires_at=expires_at
        )
        with self._lock:
            self._files[file_id] = stored
        return 200, "application/json", orjson.dumps(_file_object(flavour, stored))

    def _list(self, flavour: bool, owner: str, query: dict[str, list[str]]) -> Answer:
        files = [f for f in self.files(owner) if f.expires_at is None or f.expires_at > self.clock()]
        files.reverse()  # newest first, as both list them
        after = (query.get("after_id") or query.get("after") or [""])[0]
        if after:
            ids = [f.file_id for f in files]
            files = files[ids.index(after) + 1 :] if after in ids else []
        limit = int((query.get("limit") or ["20"])[0])
        page, more = files[:limit], len(files) > limit
        data = [_file_object(flavour, f) for f in page]
        answer: dict[str, Any] = {
            "data": data,
            "has_more": more,
            "first_id": page[0].file_id if page else None,
            "last_id": page[-1].file_id if page else None,
        }
        if not flavour:
            answer = {"object": "list", **answer}
        return 200, "application/json", orjson.dumps(answer)

    # --- Gemini's

    def _gemini_route(self, match: re.Match[str], method: str, path: str, query: str, headers: dict[str, str], body: bytes) -> Answer | HeadedAnswer:
        upload, file_id = match.group("upload") is not None, match.group("id")
        owner = owner_of(headers, query)
        params = parse_qs(query)
        if upload and file_id is None and method == "POST":
            if "upload_id" in params:
                return self._gemini_finish(params["upload_id"][0], owner, headers, body)
            if owner is None:
                return _gemini_error(401, "no API key")
            return self._gemini_start(path, owner, headers, body, match.group("version"))
        if owner is None:
            return _gemini_error(401, "no API key")
        if upload:
            return _gemini_error(404, f"no route for {method} {path}")
        if file_id is None:
            if method == "GET":
                return self._gemini_list(owner, params)
            return _gemini_error(400, f"{method} not allowed here")
        found = self._owned(owner, f"files/{file_id}")
        if found is None:
            return _gemini_refused(file_id)
        if method == "GET":
            return 200, "application/json", orjson.dumps(_gemini_file(found))
        if method == "DELETE":
            self.delete(found.file_id)
            return 200, "application/json", b"{}"
        return _gemini_error(400, f"{method} not allowed here")

    def _gemini_start(self, path: str, owner: str, headers: dict[str, str], body: bytes, version: str) -> Answer | HeadedAnswer:
        if headers.get("x-goog-upload-protocol") != "resumable" or headers.get("x-goog-upload-command") != "start":
            return _gemini_error(400, "only the resumable upload protocol is served here")
        size, mime = headers.get("x-goog-upload-header-content-length", ""), headers.get("x-goog-upload-header-content-type", "")
        try:
            metadata = orjson.loads(body) if body else {}
        except orjson.JSONDecodeError:
            return _gemini_error(400, "the metadata is not JSON")
        file = metadata.get("file") if isinstance(metadata, dict) else None
        name = (file.get("display_name") or file.get("displayName") or "") if isinstance(file, dict) else ""
        if not size.isdigit() or not mime or not isinstance(name, str):
            return _gemini_error(400, "the upload's size and type are required")
        upload_id = f"fake-upload-{next(self._ids)}"
        with self._lock:
            self._gemini_uploads[upload_id] = (owner, name, mime, int(size), version)
        host = headers.get("host", "")
        url = f"{self.scheme}://{host}{path}?upload_id={upload_id}&upload_protocol=resumable"
        return 200, "text/plain", b"", {"X-Goog-Upload-URL": url, "X-Goog-Upload-Status": "active"}

    def _gemini_finish(self, upload_id: str, owner: str | None, headers: dict[str, str], body: bytes) -> Answer:
        commands = {c.strip() for c in headers.get("x-goog-upload-command", "").split(",")}
        with self._lock:
            pending = self._gemini_uploads.get(upload_id)
        if pending is None:
            return _gemini_error(404, "no such upload")
        key, name, mime, size, version = pending
        if owner is not None and owner != key:
            return _gemini_error(401, "the upload is another key's")
        if commands != {"upload", "finalize"} or headers.get("x-goog-upload-offset") != "0" or len(body) != size:
            return _gemini_error(400, "the bytes of a resumable upload go in one upload, finalize at offset 0")
        now = self.clock()
        number = next(self._ids)
        stored = StoredFile(
            file_id=f"files/fake{number:08d}",
            owner=key,
            filename=name,
            mime=mime,
            data=body,
            created_at=now,
            expires_at=now + GEMINI_LIFETIME,
            version=version,
        )
        with self._lock:
            del self._gemini_uploads[upload_id]
            self._files[stored.file_id] = stored
        return 200, "application/json", orjson.dumps({"file": _gemini_file(stored)})

    def _gemini_list(self, owner: str, query: dict[str, list[str]]) -> Answer:
        files = [f for f in self.files(owner) if f.file_id.startswith("files/") and (f.expires_at is None or f.expires_at > self.clock())]
        files.reverse()
        token = (query.get("pageToken") or [""])[0]
        start = int(token) if token.isdigit() else 0
        size = min(int((query.get("pageSize") or ["10"])[0]), 100)
        page = files[start : start + size]
        answer: dict[str, Any] = {}
        if page:
            answer["files"] = [_gemini_file(f) for f in page]
        if start + size < len(files):
            answer["nextPageToken"] = str(start + size)
        return 200, "application/json", orjson.dumps(answer)

    # --- references in messages

    def resolve(self, fmt: str, headers: dict[str, str], raw: bytes, body: dict[str, Any], query: str = "") -> tuple[bytes, dict[str, Any]]:
        """The body with each file reference replaced by its image inline, as the provider reads it (a body that
        references no file comes back as it is). ReferenceRefused for a reference the key cannot use."""
        found = _references(fmt, body)
        if not found:
            return raw, body
        if fmt == gemini.NAME:
            return self._gemini_resolve(owner_of(headers, query) or "", raw, body, found)
        flavour = fmt == anthropic.NAME
        if flavour and ANTHROPIC_BETA not in headers.get("anthropic-beta", ""):
            raise ReferenceRefused((400, "application/json", error_body("invalid_request_error", "source type file needs the Files API beta header")))
        owner = owner_of(headers) or ""
        edits: list[tuple[JsonPath, bytes]] = []
        for path, part, file_id in found:
            stored = self._owned(owner, file_id)
            if stored is None:
                raise ReferenceRefused(_not_found(flavour, file_id, 404 if flavour else 400))
            data = base64.b64encode(stored.data).decode()
            if flavour:
                new = {**part, "source": {"type": "base64", "media_type": stored.mime, "data": data}}
            else:
                new = {key: value for key, value in part.items() if key != "file_id"}
                new["image_url"] = f"data:{stored.mime};base64,{data}"
            edits.append((path, orjson.dumps(new)))
        resolved = splice(raw, edits)
        return resolved, orjson.loads(resolved)

    def _gemini_resolve(
        self, owner: str, raw: bytes, body: dict[str, Any], found: list[tuple[JsonPath, dict[str, Any], str]]
    ) -> tuple[bytes, dict[str, Any]]:
        edits: list[tuple[JsonPath, bytes]] = []
        for path, part, uri in found:
            named = GEMINI_URI.fullmatch(uri)
            stored = self._owned(owner, f"files/{named.group('id')}") if named is not None else None
            if stored is None:
                raise ReferenceRefused(_gemini_refused(named.group("id") if named is not None else uri.rsplit("/", 1)[-1]))
            key = "file_data" if "file_data" in part else "fileData"
            reference = part[key]
            snake = key == "file_data"
            mime = reference.get("mime_type", reference.get("mimeType", stored.mime))
            inline = {"mime_type" if snake else "mimeType": mime, "data": base64.b64encode(stored.data).decode()}
            new = {("inline_data" if snake else "inlineData") if k == key else k: inline if k == key else v for k, v in part.items()}
            edits.append((path, orjson.dumps(new)))
        resolved = splice(raw, edits)
        return resolved, orjson.loads(resolved)


def _references(fmt: str, body: dict[str, Any]) -> list[tuple[JsonPath, dict[str, Any], str]]:
    """(path, part, file id) of each image that references a file."""
    found: list[tuple[JsonPath, dict[str, Any], str]] = []
    if fmt == anthropic.NAME:
        for media in anthropic.find_media(body):
            part = _at(body, media.path)
            source = part.get("source") if part.get("type") == "image" else None
            if isinstance(source, dict) and source.get("type") == "file" and isinstance(source.get("file_id"), str):
                found.append((media.path, part, source["file_id"]))
    elif fmt == openai_responses.NAME:
        for media in openai_responses.find_media(body):
            part = _at(body, media.path)
            if part.get("type") == "input_image" and isinstance(part.get("file_id"), str) and "image_url" not in part:
                found.append((media.path, part, part["file_id"]))
    elif fmt == gemini.NAME:
        for media in gemini.find_media(body):
            part = _at(body, media.path)
            reference = part.get("file_data", part.get("fileData"))
            uri = reference.get("file_uri", reference.get("fileUri")) if isinstance(reference, dict) else None
            if isinstance(uri, str):
                found.append((media.path, part, uri))
    return found


def _at(node: Any, path: JsonPath) -> Any:
    for key in path:
        node = node[key]
    return node


def _file_object(flavour: bool, f: StoredFile) -> dict[str, Any]:
    if flavour:
        created = datetime.fromtimestamp(f.created_at, UTC).isoformat().replace("+00:00", "Z")
        return {
            "id": f.file_id,
            "type": "file",
            "filename": f.filename,
            "mime_type": f.mime,
            "size_bytes": len(f.data),
            "created_at": created,
            "downloadable": False,
        }
    return {
        "id": f.file_id,
        "object": "file",
        "bytes": len(f.data),
        "created_at": int(f.created_at),
        "filename": f.filename,
        "purpose": f.purpose,
        "expires_at": int(f.expires_at) if f.expires_at is not None else None,
    }


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _gemini_file(f: StoredFile) -> dict[str, Any]:
    created = _rfc3339(f.created_at)
    return {
        "name": f.file_id,
        "displayName": f.filename,
        "mimeType": f.mime,
        "sizeBytes": str(len(f.data)),
        "createTime": created,
        "updateTime": created,
        "expirationTime": _rfc3339(f.expires_at if f.expires_at is not None else f.created_at + GEMINI_LIFETIME),
        "sha256Hash": base64.b64encode(hashlib.sha256(f.data).digest()).decode(),
        "uri": f"https://generativelanguage.googleapis.com/{f.version}/{f.file_id}",
        "state": "ACTIVE",
        "source": "UPLOADED",
    }


def _multipart(content_type: str, body: bytes) -> tuple[dict[str, str], tuple[str, str, bytes] | None]:
    """The text fields of a multipart/form-data body, and its file part (filename, type, bytes). ValueError when the
    body is not one."""
    match = re.search(r'boundary="?([^";]+)"?', content_type)
    if not content_type.lower().startswith("multipart/form-data") or match is None:
        raise ValueError("the upload is not multipart/form-data")
    delimiter = b"--" + match.group(1).encode()
    fields: dict[str, str] = {}
    upload = None
    for chunk in body.split(delimiter)[1:]:
        if chunk.startswith(b"--"):
            break
        head, sep, content = chunk.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        if not sep:
            raise ValueError("a part of the upload has no headers")
        content = content.removesuffix(b"\r\n")
        text = head.decode("utf-8", "replace")
        name = re.search(r'name="([^"]*)"', text)
        filename = re.search(r'filename="([^"]*)"', text)
        mime = re.search(r"(?im)^content-type:\s*([^\r\n;]+)", text)
        if name is None:
            continue
        if filename is not None:
            upload = (filename.group(1), mime.group(1).strip() if mime else "application/octet-stream", content)
        else:
            fields[name.group(1)] = content.decode("utf-8", "replace")
    return fields, upload


__all__ = ["ANTHROPIC_BETA", "GEMINI_URI", "FakeFiles", "ReferenceRefused", "StoredFile", "owner_of"]
