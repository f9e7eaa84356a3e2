"""Send once: what a request's images become when each goes up once, to its provider's Files API, and is referenced
by file id from then on (the `send_once` rule field, option trimflow_send_once; docs/how-it-works.md#send-once).

Pure Python, no mitmproxy, no I/O: the proxy (trimflow.proxy.send_once) uploads and sends; this module says

- where a request's provider keeps files (`files_api`: Anthropic's Messages API direct, OpenAI's Responses API, the
  Gemini API; never Bedrock, Vertex or Codex's ChatGPT backend, which have no Files API), for how long at most
  (`max_lifetime`: Gemini deletes its files 48 hours after their upload), and whose they are (`tenant_of`: a digest
  of the request's credentials, never a credential itself);
- which images of a request may go by reference (`candidates`): base64 images of a type the Files API takes, large
  enough to be worth a reference, each with the digest of its bytes as sent, and whether it is new in this request
  (in its newest input, after the model's last message, where an image makes its first appearance); an older image that never went by reference
  stays inline, so that the cached prefix never changes because of send-once;
- the body with the references in place (`with_references`, every other byte as it came: trimflow._jsonsplice);
- the upload (`upload_form`: a multipart form; Gemini's resumable protocol, `gemini_upload_start` and
  `gemini_upload_finish`) and its answer (`file_id_of`), the deletion (`file_path`), the list;
- whether an error answer refuses one of the references the request carried (`refused_ids`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import orjson

from ._jsonsplice import splice
from ._media import IMAGE, JsonPath, Media
from .formats import anthropic, gemini, openai_responses

ANTHROPIC = "anthropic"
OPENAI = "openai"
GEMINI = "gemini"
# The Files API's beta feature, sent with every upload and with every request that references a file.
ANTHROPIC_FILES_BETA = "files-api-2025-04-14"
BETA_HEADER = "anthropic-beta"
# Image types the Files APIs take as an image (docs/providers.md#files-api): Gemini takes no GIF.
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
GEMINI_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/webp"})
_EXTENSIONS = {"image/jpeg": "jpg", "image/png": "png", "image/gif": "gif", "image/webp": "webp"}
# Smallest base64 payload worth a reference: below it the upload's round trip costs more than the bytes it saves.
MIN_UPLOAD_CHARS = 4096
FILENAME_PREFIX = "trimflow-"  # every file trimflow uploads is named so: `python -m trimflow files` lists them by it
OPENAI_PURPOSE = "vision"  # images meant for model input (docs/providers.md#files-api)
OPENAI_MIN_EXPIRY = 3600  # seconds: the least `expires_after` OpenAI takes (and at most 30 days)
OPENAI_MAX_EXPIRY = 30 * 86400
MAX_FILE_ID = 200  # characters of the longest file id taken
_FILE_ID = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_FILE_ID}}}")  # a file id as both providers spell them: spliced into JSON, so checked
# A Gemini file's id is its resource name: `files/` and up to 40 lower-case letters, digits and dashes.
_GEMINI_NAME = re.compile(r"files/[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?")
FILE_ID_PREFIXES = ("file_", "file-", "files/")  # Anthropic's ids start `file_`, OpenAI's `file-`, Gemini's `files/`
# What a Gemini request references a file by: its `uri`, the API's own address of the name under the API version the
# request and the upload went to (v1beta, or v1: google-genai's default), whatever host they went to (the upload's
# answer is held to it).
GEMINI_FILE_URI = "https://generativelanguage.googleapis.com/{version}/{name}"
# Gemini deletes a file 48 hours after its upload, and its lifetime cannot be extended: trimflow references one for at
# most 47 hours (an hour's margin for a request in flight, and for the clocks), then sends its image inline again.
GEMINI_MAX_LIFETIME = 47 * 3600.0
# Credentials a request carries, by header: the key, and the organisation or project it acts for. The digest of all of
# them is the request's tenant: a file uploaded for one set is referenced only by requests that carry the same.
CREDENTIAL_HEADERS = ("x-api-key", "authorization", "x-goog-api-key", "openai-organization", "openai-project", "anthropic-workspace")
_KEY_HEADERS = ("x-api-key", "authorization", "x-goog-api-key")
GEMINI_KEY_HEADER = "x-goog-api-key"  # where a Gemini key given as `?key=` goes in the Files API's requests
# Gemini's models endpoints (the Gemini API, not Vertex: its paths name a project or a publisher, and it has no Files API).
_GEMINI_TURN = re.compile(r"(?P<base>.*)/(?P<version>v1|v1beta)/models/[^/:]+:(?:generateContent|streamGenerateContent)")


@dataclass(frozen=True, slots=True)
class FilesApi:
    """Where a request's provider keeps files: the provider's flavour of the API and its path on the request's host."""

    provider: str  # ANTHROPIC, OPENAI or GEMINI
    path: str  # e.g. /v1/files, under the request's own base path
    upload_path: str | None = None  # where an upload goes, when not to `path`: Gemini's /upload/v1beta/files

    @property
    def upload(self) -> str:
        return self.upload_path or self.path

    @property
    def version(self) -> str:
        """The API version in the path (Gemini's v1beta or v1: its file URIs name it)."""
        return self.path.rsplit("/", 2)[-2]


def files_api(wire_format: str | None, path: str) -> FilesApi | None:
    """The Files API beside a request's endpoint, or None: Anthropic's Messages API direct (`.../v1/messages`), OpenAI's
    Responses API (`.../v1/responses`), the Gemini API (`.../v1beta/models/{model}:generateContent`, and
    `:streamGenerateContent`; v1 as well). Bedrock, Vertex and Codex's ChatGPT backend have none; a token count is never worth an
    upload."""
    path = path.partition("?")[0]
    if wire_format == anthropic.NAME and path.endswith("/v1/messages"):
        return FilesApi(ANTHROPIC, path[: -len("/messages")] + "/files")
    if wire_format == openai_responses.NAME and path.endswith("/v1/responses"):
        return FilesApi(OPENAI, path[: -len("/responses")] + "/files")
    turn = _GEMINI_TURN.fullmatch(path) if wire_format == gemini.NAME else None
    if turn is not None:
        base, version = turn.group("base"), turn.group("version")
        return FilesApi(GEMINI, f"{base}/{version}/files", f"{base}/upload/{version}/files")
    return None


def max_lifetime(provider: str) -> float | None:
    """The longest a provider's file may be referenced from its upload (None: as long as trimflow keeps it)."""
    return GEMINI_MAX_LIFETIME if provider == GEMINI else None


def credentials_of(headers: Mapping[str, str], query_key: str | None = None) -> tuple[tuple[str, str], ...] | None:
    """The request's credential headers (lower-case names), or None when it carries no key. A Gemini key given in the
    query (`query_key`, `?key=`) counts as its header, which is where the Files API's requests carry it."""
    if query_key and not headers.get(GEMINI_KEY_HEADER):
        headers = {**headers, GEMINI_KEY_HEADER: query_key}
    if not any(headers.get(name) for name in _KEY_HEADERS):
        return None
    return tuple((name, headers[name]) for name in CREDENTIAL_HEADERS if headers.get(name))


def tenant_of(credentials: tuple[tuple[str, str], ...], upstream: str) -> bytes:
    """Whose files: a digest of the credentials and of the upstream they go to (never the credentials themselves)."""
    text = orjson.dumps([upstream, credentials])
    return hashlib.blake2b(text, digest_size=16, person=b"trimflow-tenant").digest()


# --- the images that may go by reference ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    """An image that may go by reference: where it is, the digest of its bytes as sent, its type, its base64 length
    (what a reference saves), and whether it is new in this request (may be uploaded)."""

    media: Media
    digest: bytes
    mime: str
    chars: int
    new: bool

    @property
    def path(self) -> JsonPath:
        return self.media.path

    def decoded(self) -> bytes | None:
        """The image's bytes (None when its base64 does not decode). Standard or urlsafe base64 (google-genai sends
        urlsafe), padded or not."""
        assert self.media.data is not None
        data = self.media.data[self.media.data_offset :]
        altchars = b"-_" if "-" in data or "_" in data else None
        try:
            return base64.b64decode(data + "=" * (-len(data) % 4), altchars=altchars, validate=True)
        except (binascii.Error, ValueError):
            return None

    @property
    def filename(self) -> str:
        return f"{FILENAME_PREFIX}{self.digest.hex()}.{_EXTENSIONS[self.mime]}"


def candidates(wire_format: str, body: dict[str, Any]) -> list[Candidate]:
    """The images of a parsed body that may go by reference, in document order."""
    types = IMAGE_TYPES
    if wire_format == anthropic.NAME:
        media, newest = anthropic.find_media(body), _anthropic_newest(body)
    elif wire_format == openai_responses.NAME:
        media, newest = openai_responses.find_media(body), _responses_newest(body)
        media = [m for m in media if _is_input_image(body, m.path)]
    elif wire_format == gemini.NAME:
        media, newest, types = gemini.find_media(body), _gemini_newest(body), GEMINI_IMAGE_TYPES
    else:
        return []
    found = []
    for m in media:
        if m.kind != IMAGE or m.data is None or m.payload_bytes < MIN_UPLOAD_CHARS:
            continue
        mime = (m.declared_mime or "").lower()
        if mime not in types:
            continue
        digest = hashlib.blake2b(m.data[m.data_offset :].encode("ascii", "surrogateescape"), digest_size=16).digest()
        found.append(Candidate(m, digest, mime, m.payload_bytes, newest(m.path)))
    return found


def may_hold_images(wire_format: str, raw: bytes) -> bool:
    """Whether a body may hold an inline image (a coding agent's text does not: not worth a parse). Gemini's base64
    goes without a `base64` mark, in `inlineData` or `inline_data`."""
    if wire_format == gemini.NAME:
        return b"inlineData" in raw or b"inline_data" in raw
    return b"base64" in raw


def _anthropic_newest(body: dict[str, Any]) -> Any:
    """The messages after the model's last are the newest input (the user's turn, a tool's result, what the agent adds)."""
    messages = body.get("messages")
    last_model = -1
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        if isinstance(message, dict) and message.get("role") == "assistant":
            last_model = i
    return lambda path: isinstance(path[1], int) and path[1] > last_model


def _responses_newest(body: dict[str, Any]) -> Any:
    """The items after the model's last (its message, a tool call, its reasoning) are the newest input; with
    previous_response_id the whole input is."""
    request, root = openai_responses.request_of(body)
    items = request.get("input")
    if not isinstance(items, list) or request.get("previous_response_id"):
        return lambda path: True
    last_model = -1
    for i, item in enumerate(items):
        if isinstance(item, dict) and (item.get("role") == "assistant" or str(item.get("type", "")).endswith(("_call", "reasoning"))):
            last_model = i
    at = len(root) + 1
    return lambda path: isinstance(path[at], int) and path[at] > last_model


def _gemini_newest(body: dict[str, Any]) -> Any:
    """The contents after the model's last are the newest input (the user's turn, a function's response)."""
    request, root = gemini.request_of(body)
    contents = request.get("contents")
    last_model = -1
    for i, content in enumerate(contents if isinstance(contents, list) else ()):
        if isinstance(content, dict) and content.get("role") == "model":
            last_model = i
    at = len(root) + 1
    return lambda path: isinstance(path[at], int) and path[at] > last_model


def _is_input_image(body: dict[str, Any], path: JsonPath) -> bool:
    part = _at(body, path)
    return isinstance(part, dict) and part.get("type") == "input_image"


def _at(node: Any, path: JsonPath) -> Any:
    for key in path:
        node = node[key]
    return node


# --- the body with its references ---------------------------------------------------------------------------


def with_references(raw: bytes, wire_format: str, body: dict[str, Any], references: Mapping[JsonPath, str], version: str = "v1beta") -> bytes:
    """`raw` (the JSON text `body` was parsed from) with the image at each path referencing its file id: Anthropic's
    `{"type": "image", "source": {"type": "file", "file_id": ...}}`, OpenAI's `{"type": "input_image", "file_id": ...}`
    (its `detail` kept), Gemini's `{"file_data": {"mime_type": ..., "file_uri": ...}}` (spelled as the part spelled its
    `inline_data`, in its place, its URI under the API `version`); every other field of the part, and every other byte
    of the body, as it came."""
    edits = []
    for path, file_id in references.items():
        part = _at(body, path)
        if wire_format == anthropic.NAME:
            new = {**part, "source": {"type": "file", "file_id": file_id}}
        elif wire_format == gemini.NAME:
            new = _gemini_reference(part, gemini_file_uri(file_id, version))
        else:
            new = {key: value for key, value in part.items() if key != "image_url"}
            new["file_id"] = file_id
        edits.append((path, orjson.dumps(new)))
    return splice(raw, edits)


def _gemini_reference(part: dict[str, Any], uri: str) -> dict[str, Any]:
    snake = "inline_data" in part
    inline_key = "inline_data" if snake else "inlineData"
    inline = part[inline_key]
    mime_key = next((key for key in ("mime_type", "mimeType") if key in inline), "mime_type" if snake else "mimeType")
    reference = {mime_key: inline[mime_key], "file_uri" if snake else "fileUri": uri}
    file_key = "file_data" if snake else "fileData"
    return {file_key if key == inline_key else key: reference if key == inline_key else value for key, value in part.items()}


def gemini_file_uri(name: str, version: str = "v1beta") -> str:
    """The URI a Gemini request references a file by (`files/abc` -> https://generativelanguage.googleapis.com/v1beta/files/abc)."""
    return GEMINI_FILE_URI.format(version=version, name=name)


def with_files_beta(value: str | None) -> str:
    """An anthropic-beta header value with the Files API's feature in it (the others kept, in their order)."""
    betas = [beta.strip() for beta in (value or "").split(",") if beta.strip()]
    return ", ".join(betas if ANTHROPIC_FILES_BETA in betas else [*betas, ANTHROPIC_FILES_BETA])


# --- the Files API's requests and answers ------------------------------------------------------------------


def upload_form(api: FilesApi, candidate: Candidate, data: bytes, expires_in: float) -> tuple[str, bytes]:
    """(content type, body) of the multipart upload of one image. OpenAI's carries its purpose and an expiry (its
    own deletion, for when trimflow is gone before the lifetime ends); Anthropic's files live until deleted."""
    fields: list[tuple[str, str]] = []
    if api.provider == OPENAI:
        seconds = int(min(max(expires_in, OPENAI_MIN_EXPIRY), OPENAI_MAX_EXPIRY))
        fields = [("purpose", OPENAI_PURPOSE), ("expires_after[anchor]", "created_at"), ("expires_after[seconds]", str(seconds))]
    boundary = f"trimflow-{candidate.digest.hex()}"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode() for name, value in fields]
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{candidate.filename}"\r\nContent-Type: {candidate.mime}\r\n\r\n'
    ).encode()
    body = b"".join([*parts, head, data, f"\r\n--{boundary}--\r\n".encode()])
    return f"multipart/form-data; boundary={boundary}", body


# Gemini's resumable upload (docs/providers.md#files-api): a start request with the file's metadata, answered with
# the URL to send the bytes to (a header), then one request with every byte, which finalizes the upload.
UPLOAD_URL_HEADER = "x-goog-upload-url"


def gemini_upload_start(candidate: Candidate, size: int) -> tuple[dict[str, str], bytes]:
    """(headers, body) of the resumable upload's start: the file's display name (trimflow's file name), size and type."""
    headers = {
        "x-goog-upload-protocol": "resumable",
        "x-goog-upload-command": "start",
        "x-goog-upload-header-content-length": str(size),
        "x-goog-upload-header-content-type": candidate.mime,
        "content-type": "application/json",
    }
    return headers, orjson.dumps({"file": {"display_name": candidate.filename}})


def gemini_upload_finish(upload_url: str | None, scheme: str, authority: str, upload_path: str) -> tuple[str, dict[str, str]] | None:
    """(path and query, headers) of the request that sends the bytes, to the URL the start answered: None unless that
    URL is on the start's own scheme and host and under its path (an upstream does not send an image, nor the key
    with it, anywhere else)."""
    if not upload_url or len(upload_url) > 4096:
        return None
    url = urlsplit(upload_url)
    if url.scheme != scheme or url.netloc.lower() != authority.lower() or url.path != upload_path or url.fragment:
        return None
    target = url.path + (f"?{url.query}" if url.query else "")
    if any(ord(c) < 0x21 or ord(c) > 0x7E for c in target):
        return None
    return target, {"x-goog-upload-command": "upload, finalize", "x-goog-upload-offset": "0"}


def file_id_of(answer: bytes, provider: str = ANTHROPIC, version: str = "v1beta") -> str | None:
    """The id of the file an upload's answer names, or None when the answer is not one (a hostile or broken upstream
    gets no text of its own into a request: the id is checked before it is spliced in). Gemini's answer is
    `{"file": {"name": "files/abc", "uri": ..., "state": ...}}`: its name, when its URI is the one references use
    (under the upload's API `version`) and the file is ready (an image is, at once)."""
    try:
        data = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    if provider == GEMINI:
        file = data.get("file")
        name = file.get("name") if isinstance(file, dict) else None
        if not isinstance(file, dict) or not isinstance(name, str) or not _GEMINI_NAME.fullmatch(name):
            return None
        if file.get("uri") != gemini_file_uri(name, version) or file.get("state", "ACTIVE") != "ACTIVE":
            return None
        return name
    file_id = data.get("id")
    return file_id if isinstance(file_id, str) and _FILE_ID.fullmatch(file_id) else None


def is_file_id(text: str) -> bool:
    return _FILE_ID.fullmatch(text) is not None or _GEMINI_NAME.fullmatch(text) is not None


def file_path(files_path: str, file_id: str) -> str:
    """The path of one file under its Files API's path (Gemini's name starts `files/` already)."""
    return f"{files_path}/{file_id.removeprefix('files/')}"


def is_provider_file_id(text: str) -> bool:
    """A file id as a provider hands them out: its prefix too (what another instance wrote to the shared store is held
    to it: a value that is not one is not spliced into a request)."""
    return text.startswith(FILE_ID_PREFIXES) and is_file_id(text)


# Statuses of an answer that refuses a file reference: OpenAI's 400, Anthropic's 404, Gemini's 403 (its
# PERMISSION_DENIED, for a file deleted, expired or another key's).
REFUSAL_STATUSES = frozenset({400, 403, 404})


def refused_ids(status: int, answer: bytes, file_ids: frozenset[str]) -> frozenset[str]:
    """The file ids an error answer names, of those the request referenced: a reference the provider refuses (a file
    unknown, expired or deleted: Anthropic says 404, OpenAI 400, Gemini 403, each naming the id; Gemini without its
    `files/`). Empty for any other answer."""
    if status not in REFUSAL_STATUSES:
        return frozenset()
    return frozenset(file_id for file_id in file_ids if file_id.removeprefix("files/").encode() in answer)


@dataclass(frozen=True, slots=True)
class ListedFile:
    """A file the Files API lists: its id, name, size and creation (seconds since the epoch, when it says)."""

    file_id: str
    filename: str
    size: int
    created_at: float | None


def listed_files(answer: bytes, provider: str = ANTHROPIC) -> tuple[list[ListedFile], str | None]:
    """The files of one page of a list answer, and where the next page starts (the id to ask it after, Gemini's page
    token; None: the last page). ValueError when the answer is not a list."""
    data = orjson.loads(answer)
    if provider == GEMINI:
        return _gemini_listed(data)
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ValueError("the answer is not a list of files")
    files = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not is_file_id(item["id"]):
            continue
        size = item.get("size_bytes", item.get("bytes"))
        files.append(ListedFile(item["id"], str(item.get("filename") or ""), size if isinstance(size, int) else 0, _epoch(item.get("created_at"))))
    more = data.get("has_more") is True and files
    return files, (files[-1].file_id if more else None)


def _gemini_listed(data: Any) -> tuple[list[ListedFile], str | None]:
    """Gemini's list: `{"files": [...], "nextPageToken": ...}`, both left out when empty; a size is a string."""
    items = data.get("files", []) if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ValueError("the answer is not a list of files")
    files = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not _GEMINI_NAME.fullmatch(item["name"]):
            continue
        size = item.get("sizeBytes")
        size_bytes = int(size) if isinstance(size, str) and size.isdigit() else 0
        files.append(ListedFile(item["name"], str(item.get("displayName") or ""), size_bytes, _epoch(item.get("createTime"))))
    token = data.get("nextPageToken")
    return files, (token if isinstance(token, str) and token and files else None)


def _epoch(value: Any) -> float | None:
    """OpenAI says when in seconds, Anthropic and Gemini in RFC 3339."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


__all__ = [
    "ANTHROPIC",
    "ANTHROPIC_FILES_BETA",
    "BETA_HEADER",
    "FILENAME_PREFIX",
    "GEMINI",
    "GEMINI_FILE_URI",
    "GEMINI_IMAGE_TYPES",
    "GEMINI_KEY_HEADER",
    "GEMINI_MAX_LIFETIME",
    "IMAGE_TYPES",
    "MAX_FILE_ID",
    "MIN_UPLOAD_CHARS",
    "OPENAI",
    "REFUSAL_STATUSES",
    "UPLOAD_URL_HEADER",
    "Candidate",
    "FilesApi",
    "ListedFile",
    "candidates",
    "credentials_of",
    "file_id_of",
    "file_path",
    "files_api",
    "gemini_file_uri",
    "gemini_upload_finish",
    "gemini_upload_start",
    "is_file_id",
    "is_provider_file_id",
    "listed_files",
    "max_lifetime",
    "may_hold_images",
    "refused_ids",
    "tenant_of",
    "upload_form",
    "with_files_beta",
    "with_references",
]
