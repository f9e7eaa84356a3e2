"""Send once: what a request's images become when each goes up once, to its provider's Files API, and is referenced
by file id from then on (the `send_once` rule field, option trimflow_send_once; docs/how-it-works.md#send-once).

Pure Python, no mitmproxy, no I/O: the proxy (trimflow.proxy.send_once) uploads and sends; this module says

- where a request's provider keeps files (`files_api`: Anthropic's Messages API direct, OpenAI's Responses API;
  never Bedrock, Vertex or Codex's ChatGPT backend, which have no Files API), and whose they are (`tenant_of`: a
  digest of the request's credentials, never a credential itself);
- which images of a request may go by reference (`candidates`): base64 images of a type the Files API takes, large
  enough to be worth a reference, each with the digest of its bytes as sent, and whether it is new in this request
  (in its newest input, after the model's last message, where an image makes its first appearance); an older image that never went by reference
  stays inline, so that the cached prefix never changes because of send-once;
- the body with the references in place (`with_references`, every other byte as it came: trimflow._jsonsplice);
- the upload (`upload_form`: a multipart form) and its answer (`file_id_of`), the deletion, the list;
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

import orjson

from ._jsonsplice import splice
from ._media import IMAGE, JsonPath, Media
from .formats import anthropic, openai_responses

ANTHROPIC = "anthropic"
OPENAI = "openai"
# The Files API's beta feature, sent with every upload and with every request that references a file.
ANTHROPIC_FILES_BETA = "files-api-2025-04-14"
BETA_HEADER = "anthropic-beta"
# Image types both Files APIs take as an image (docs/providers.md#files-api).
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_EXTENSIONS = {"image/jpeg": "jpg", "image/png": "png", "image/gif": "gif", "image/webp": "webp"}
# Smallest base64 payload worth a reference: below it the upload's round trip costs more than the bytes it saves.
MIN_UPLOAD_CHARS = 4096
FILENAME_PREFIX = "trimflow-"  # every file trimflow uploads is named so: `python -m trimflow files` lists them by it
OPENAI_PURPOSE = "vision"  # images meant for model input (docs/providers.md#files-api)
OPENAI_MIN_EXPIRY = 3600  # seconds: the least `expires_after` OpenAI takes (and at most 30 days)
OPENAI_MAX_EXPIRY = 30 * 86400
MAX_FILE_ID = 200  # characters of the longest file id taken
_FILE_ID = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_FILE_ID}}}")  # a file id as both providers spell them: spliced into JSON, so checked
FILE_ID_PREFIXES = ("file_", "file-")  # Anthropic's ids start `file_`, OpenAI's `file-`
# Credentials a request carries, by header: the key, and the organisation or project it acts for. The digest of all of
# them is the request's tenant: a file uploaded for one set is referenced only by requests that carry the same.
CREDENTIAL_HEADERS = ("x-api-key", "authorization", "openai-organization", "openai-project", "anthropic-workspace")
_KEY_HEADERS = ("x-api-key", "authorization")


@dataclass(frozen=True, slots=True)
class FilesApi:
    """Where a request's provider keeps files: the provider's flavour of the API and its path on the request's host."""

    provider: str  # ANTHROPIC or OPENAI
    path: str  # e.g. /v1/files, under the request's own base path


def files_api(wire_format: str | None, path: str) -> FilesApi | None:
    """The Files API beside a request's endpoint, or None: Anthropic's Messages API direct (`.../v1/messages`), OpenAI's
    Responses API (`.../v1/responses`). Bedrock, Vertex and Codex's ChatGPT backend have none; a token count is
    never worth an upload."""
    path = path.partition("?")[0]
    if wire_format == anthropic.NAME and path.endswith("/v1/messages"):
        return FilesApi(ANTHROPIC, path[: -len("/messages")] + "/files")
    if wire_format == openai_responses.NAME and path.endswith("/v1/responses"):
        return FilesApi(OPENAI, path[: -len("/responses")] + "/files")
    return None


def credentials_of(headers: Mapping[str, str]) -> tuple[tuple[str, str], ...] | None:
    """The request's credential headers (lower-case names), or None when it carries no key."""
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
        """The image's bytes (None when its base64 does not decode)."""
        assert self.media.data is not None
        try:
            return base64.b64decode(self.media.data[self.media.data_offset :], validate=True)
        except (binascii.Error, ValueError):
            return None

    @property
    def filename(self) -> str:
        return f"{FILENAME_PREFIX}{self.digest.hex()}.{_EXTENSIONS[self.mime]}"


def candidates(wire_format: str, body: dict[str, Any]) -> list[Candidate]:
    """The images of a parsed body that may go by reference, in document order."""
    if wire_format == anthropic.NAME:
        media, newest = anthropic.find_media(body), _anthropic_newest(body)
    elif wire_format == openai_responses.NAME:
        media, newest = openai_responses.find_media(body), _responses_newest(body)
        media = [m for m in media if _is_input_image(body, m.path)]
    else:
        return []
    found = []
    for m in media:
        if m.kind != IMAGE or m.data is None or m.payload_bytes < MIN_UPLOAD_CHARS:
            continue
        mime = (m.declared_mime or "").lower()
        if mime not in IMAGE_TYPES:
            continue
        digest = hashlib.blake2b(m.data[m.data_offset :].encode("ascii", "surrogateescape"), digest_size=16).digest()
        found.append(Candidate(m, digest, mime, m.payload_bytes, newest(m.path)))
    return found


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


def _is_input_image(body: dict[str, Any], path: JsonPath) -> bool:
    part = _at(body, path)
    return isinstance(part, dict) and part.get("type") == "input_image"


def _at(node: Any, path: JsonPath) -> Any:
    for key in path:
        node = node[key]
    return node


# --- the body with its references ---------------------------------------------------------------------------


def with_references(raw: bytes, wire_format: str, body: dict[str, Any], references: Mapping[JsonPath, str]) -> bytes:
    """`raw` (the JSON text `body` was parsed from) with the image at each path referencing its file id: Anthropic's
    `{"type": "image", "source": {"type": "file", "file_id": ...}}`, OpenAI's `{"type": "input_image", "file_id": ...}`
    (its `detail` kept); every other field of the part, and every other byte of the body, as it came."""
    edits = []
    for path, file_id in references.items():
        part = _at(body, path)
        if wire_format == anthropic.NAME:
            new = {**part, "source": {"type": "file", "file_id": file_id}}
        else:
            new = {key: value for key, value in part.items() if key != "image_url"}
            new["file_id"] = file_id
        edits.append((path, orjson.dumps(new)))
    return splice(raw, edits)


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


def file_id_of(answer: bytes) -> str | None:
    """The id of the file an upload's answer names, or None when the answer is not one (a hostile or broken upstream
    gets no text of its own into a request: the id is checked before it is spliced in)."""
    try:
        data = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return None
    file_id = data.get("id") if isinstance(data, dict) else None
    return file_id if isinstance(file_id, str) and _FILE_ID.fullmatch(file_id) else None


def is_file_id(text: str) -> bool:
    return _FILE_ID.fullmatch(text) is not None


def is_provider_file_id(text: str) -> bool:
    """A file id as a provider hands them out: its prefix too (what another instance wrote to the shared store is held
    to it: a value that is not one is not spliced into a request)."""
    return text.startswith(FILE_ID_PREFIXES) and is_file_id(text)


def refused_ids(status: int, answer: bytes, file_ids: frozenset[str]) -> frozenset[str]:
    """The file ids an error answer names, of those the request referenced: a reference the provider refuses (a file
    unknown, expired or deleted: Anthropic says 404, OpenAI 400, each naming the id). Empty for any other answer."""
    if status not in (400, 404):
        return frozenset()
    return frozenset(file_id for file_id in file_ids if file_id.encode() in answer)


@dataclass(frozen=True, slots=True)
class ListedFile:
    """A file the Files API lists: its id, name, size and creation (seconds since the epoch, when it says)."""

    file_id: str
    filename: str
    size: int
    created_at: float | None


def listed_files(answer: bytes) -> tuple[list[ListedFile], str | None]:
    """The files of one page of a list answer, and the id to ask the next page after (None: the last page).
    ValueError when the answer is not a list."""
    data = orjson.loads(answer)
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


def _epoch(value: Any) -> float | None:
    """OpenAI says when in seconds, Anthropic in RFC 3339."""
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
    "IMAGE_TYPES",
    "MAX_FILE_ID",
    "MIN_UPLOAD_CHARS",
    "OPENAI",
    "Candidate",
    "FilesApi",
    "ListedFile",
    "candidates",
    "credentials_of",
    "file_id_of",
    "files_api",
    "is_file_id",
    "is_provider_file_id",
    "listed_files",
    "refused_ids",
    "tenant_of",
    "upload_form",
    "with_files_beta",
    "with_references",
]
