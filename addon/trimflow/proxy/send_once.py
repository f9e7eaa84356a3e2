"""The send-once addon: each image of a conversation goes up once, to its provider's Files API, and by reference
from then on (option trimflow_send_once, or a rule's `send_once`; docs/how-it-works.md#send-once).

- `request` (after the prune addon, on the body it forwards): the images that may go by reference
  (trimflow._send_once), each looked up in the mapping (trimflow._file_refs) under the request's tenant. An image
  new in this request that has no file yet is uploaded first, with the request's own credentials to the Files API
  beside its endpoint, through mitmproxy's connection machinery (trimflow.proxy._resend, as a retry goes), while the
  hook waits (an `async` hook: the event loop serves every other flow meanwhile), at most trimflow_send_once_deadline.
  An upload that fails or times out leaves that image inline, in this request and in the later ones of its tenant,
  so its conversation's cached prefix never changes because of it. The same image uploaded by two requests at once
  is uploaded once.
- `response` (before the metrics addon): an error answer naming a file the request referenced (a file unknown,
  expired or deleted) drops those entries and sends the request once more with its images inline, as the prune addon
  forwarded it; the client gets that answer. `HoldRefusals`, after the metrics addon, holds such an answer back from
  the client (as the recover addon's hold does) so that it can be replaced.
- With a shared store (trimflow_state), each file uploaded is offered to the instances sharing it (trimflow._state_store
  `put_file`) until shortly before its deletion here, and an image this instance has no entry for is looked up there
  (within the store's deadline, in the worker thread that reads the body): another instance's file for the same tenant
  and image is referenced, never deleted from here. An entry the provider refused, or whose file this instance deletes,
  is taken out of the store too.
- Gemini's upload is its resumable protocol (a start, then the bytes to the URL the start answered, which must be on
  the same host and path); its files go by `file_data.file_uri`, and are referenced for at most 47 hours (Gemini
  deletes them at 48), after which their images go inline again.
- Every file uploaded is deleted at the end of its lifetime (trimflow_send_once_lifetime), or when the mapping's
  bound pushes it out, with the credentials that uploaded it, which are kept in memory for that and nowhere else.
  Files left when the proxy stops stay at the provider: `python -m trimflow files` lists and deletes them (OpenAI's
  expire on their own, an hour after the lifetime: trimflow asks for that when it uploads).

A turn never fails because of this: any error leaves the request as the prune addon forwarded it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from mitmproxy import ctx, exceptions, http
from mitmproxy.addonmanager import Loader
from mitmproxy.net.http.http1 import expected_http_body_size

from .. import ENFORCE
from .._decode import DecodeError, decode_body
from .._engine import is_sigv4
from .._file_refs import DEFAULT_LIFETIME, Entry, FileRefs, Owner
from .._human import parse_duration
from .._limit_errors import ANSWER_MAX
from .._record import Record
from .._send_once import (
    ANTHROPIC,
    BETA_HEADER,
    GEMINI,
    GEMINI_KEY_HEADER,
    REFUSAL_STATUSES,
    UPLOAD_URL_HEADER,
    Candidate,
    FilesApi,
    candidates,
    credentials_of,
    file_id_of,
    file_path,
    files_api,
    gemini_upload_finish,
    gemini_upload_start,
    may_hold_images,
    refused_ids,
    tenant_of,
    upload_form,
    with_files_beta,
    with_references,
)
from .._state_store import RedisState, StoredFile
from ._resend import HeldAnswer, detached_client, held_answer_body, held_answers, resend, size_check_extended
from .comment import flow_comment
from .options import exits_at_startup
from .prune import plain_headers
from .state import FlowState, SharedState, path_of, upstream_of, write

log = logging.getLogger("trimflow")

DEFAULT_DEADLINE = 10.0  # seconds an upload may take before its image goes inline
DELETE_DEADLINE = 30.0  # seconds a deletion may take (nobody waits for it)
DONE_DEADLINE = 5.0  # seconds the proxy's exit waits for the deletion of the files still mapped
SWEEP_EVERY = 60.0  # seconds between two looks for files past their lifetime (at most; a quarter of a short lifetime)
MAX_UPLOADS = 8  # uploads in flight at once, across every request: each holds its image twice (decoded, and as a form)
UPLOAD_ANSWER_MAX = 64 << 10  # an upload's answer is a few hundred bytes of JSON: a longer one is not read
# Headers the Files API's requests carry beside the credentials: the API version Anthropic requires.
_KEPT_HEADERS = ("anthropic-version", "host", "user-agent")
_BODY_HEADERS = ("content-type", "content-length", "content-encoding", "transfer-encoding", "accept-encoding")


# A request's body as the prune addon forwards it (decoded), parsed, its images that may go by reference, and the files
# the shared store holds for those of them this instance has no entry for.
_Plan = tuple[bytes, dict[str, Any], list[Candidate], dict[bytes, StoredFile]]


@dataclass(slots=True)
class _Referenced:
    """A request that went with references: whose, the body as it went before them (decoded), the files it named,
    and the anthropic-beta header it came with."""

    tenant: bytes
    inline: bytes
    file_ids: frozenset[str]
    beta: str | None


class SendOnce:
    name = "trimflow_send_once"

    def __init__(self, flows: SharedState) -> None:
        self.flows = flows
        self.refs = FileRefs()
        self.deadline = DEFAULT_DEADLINE
        self.hold = HoldRefusals(self)
        self.sent: weakref.WeakKeyDictionary[http.HTTPFlow, _Referenced] = weakref.WeakKeyDictionary()
        self._uploading: dict[tuple[bytes, bytes], asyncio.Future[str | None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._slots: asyncio.Semaphore | None = None  # made on mitmproxy's loop, with the first upload
        self.uploaded = self.upload_failures = self.refused = self.deleted = self.borrowed = 0

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "trimflow_send_once",
            bool,
            False,
            "Upload each image once to the provider's Files API (Anthropic direct, OpenAI Responses, the Gemini API) with the request's own "
            "credentials and send a reference to it from then on, for every rule (a rule's send_once: true does it for its own).",
        )
        loader.add_option(
            "trimflow_send_once_lifetime",
            str,
            f"{DEFAULT_LIFETIME / 86400:g}d",
            "How long a file send-once uploaded is kept at the provider before trimflow deletes it (e.g. 12h, 1d; Gemini's at most 47h).",
        )
        loader.add_option(
            "trimflow_send_once_deadline",
            str,
            f"{DEFAULT_DEADLINE:g}s",
            "How long an upload may take; past it (or when it fails) the image goes inline, as without send-once.",
        )

    @exits_at_startup
    def configure(self, updated: set[str]) -> None:
        for option in ("trimflow_send_once_lifetime", "trimflow_send_once_deadline"):
            if option not in updated:
                continue
            try:
                seconds = parse_duration(getattr(ctx.options, option))
            except ValueError as exc:
                raise exceptions.OptionsError(f"trimflow: {option}: {exc}") from None
            if seconds is None or seconds <= 0:
                raise exceptions.OptionsError(f"trimflow: {option} needs a duration above 0")
            if option == "trimflow_send_once_lifetime":
                self.refs.lifetime = seconds
            else:
                self.deadline = seconds

    def done(self) -> Coroutine[None, None, None] | None:
        # Not `async def`: with no file left, the usual case, it makes no coroutine (and runs where a hook must be sync).
        # mitmproxy awaits what a hook returns when it is awaitable.
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        left = self.refs.take_all()
        return self._delete_left(left) if left else None

    async def _delete_left(self, left: list[Entry]) -> None:
        """The mapping goes with the process, so nothing will reference its files again: they are deleted now, for at
        most DONE_DEADLINE (mitmproxy waits for this hook before it exits)."""
        deleted = self.deleted
        self._delete(left)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=DONE_DEADLINE)
        remaining = len(left) - (self.deleted - deleted)
        if remaining:
            log.info("trimflow: send-once: %d uploaded files are left at their providers (python -m trimflow files deletes them)", remaining)

    # -- the request

    def request(self, flow: http.HTTPFlow) -> Coroutine[None, None, None] | None:
        # Not `async def`: with send-once off, the usual case, no coroutine is made per request. mitmproxy awaits what a
        # hook returns when it is awaitable.
        if flow.response is not None or flow.request.method != "POST" or flow.request.raw_content is None:
            return None
        state = self.flows.get(flow)
        if state is None or ctx.options.trimflow_mode != ENFORCE or not self._wanted():
            return None
        api = files_api(state.target.format, flow.request.path)
        if api is None:
            return None
        headers = plain_headers(flow.request)
        credentials = credentials_of(headers, flow.request.query.get("key") if api.provider == GEMINI else None)
        if credentials is None or is_sigv4(headers):
            return None
        return self._send_once_failing_open(flow, state, api, headers, credentials)

    async def _send_once_failing_open(
        self, flow: http.HTTPFlow, state: FlowState, api: FilesApi, headers: dict[str, str], credentials: tuple[tuple[str, str], ...]
    ) -> None:
        try:
            await self._send_once(flow, state, api, headers, credentials)
        except Exception as exc:  # noqa: BLE001 - fail open: the images go inline, as the prune addon forwarded them
            log.warning("trimflow: %s%s images sent inline: internal error %s", flow.request.pretty_host, path_of(flow), type(exc).__name__)

    def _wanted(self) -> bool:
        """Send-once is on for some request: by the option, or by the rules' defaults or a rule."""
        if ctx.options.trimflow_send_once:
            return True
        assert self.flows.rules is not None
        rules = self.flows.rules.current()
        return rules.defaults.send_once or any(rule.overrides.get("send_once") for rule in rules.rules)

    def _store(self) -> RedisState | None:
        """The store instances share their files through, when one is set and answers."""
        shared = self.flows.conversations.shared
        return shared if isinstance(shared, RedisState) and shared.in_use else None

    async def _send_once(
        self, flow: http.HTTPFlow, state: FlowState, api: FilesApi, headers: dict[str, str], credentials: tuple[tuple[str, str], ...]
    ) -> None:
        tenant = tenant_of(credentials, upstream_of(flow))
        plan = await asyncio.to_thread(self._plan, flow, state, tenant)
        if plan is None:
            return
        raw, body, found, stored = plan
        request = flow.request
        kept = tuple((name, headers[name]) for name in _KEPT_HEADERS if name in headers)
        owner = Owner(
            tenant=tenant,
            provider=api.provider,
            scheme=request.scheme,
            host=request.host,
            port=request.port,
            files_path=api.path,
            sni=flow.server_conn.sni,
            headers=(*credentials, *kept),
        )
        references: dict[tuple[str | int, ...], str] = {}
        to_upload: dict[bytes, Candidate] = {}
        for candidate in found:
            entry = self.refs.get(tenant, candidate.digest)
            if entry is None and candidate.digest in stored:
                entry = self._borrow(owner, candidate.digest, stored[candidate.digest])
            if entry is not None:
                if entry.file_id is not None:
                    references[candidate.path] = entry.file_id
            elif candidate.new:
                to_upload.setdefault(candidate.digest, candidate)
        uploaded: dict[bytes, str | None] = {}
        if to_upload:
            ids = await asyncio.gather(*(self._upload(flow, api, owner, c) for c in to_upload.values()))
            uploaded = dict(zip(to_upload, ids, strict=True))
            for candidate in found:
                file_id = uploaded.get(candidate.digest)
                if file_id is not None:
                    references[candidate.path] = file_id
        if not references:
            return
        new_body = await asyncio.to_thread(self._rewrite, flow, raw, state, body, references, api.version)
        beta = request.headers.get(BETA_HEADER)
        if api.provider == ANTHROPIC:
            request.headers[BETA_HEADER] = with_files_beta(beta)
        self.sent[flow] = _Referenced(tenant, raw, frozenset(references.values()), beta)
        record = state.record if state.pending is None else self.flows.settle(flow, state)
        if record is not None:
            record.by_reference = len(references)
            record.uploaded = sum(1 for file_id in uploaded.values() if file_id is not None)
            record.reference_bytes_saved = len(raw) - len(new_body)
            record.body_bytes_after = len(new_body)
            _keep(flow, state, record)

    def _borrow(self, owner: Owner, digest: bytes, stored: StoredFile) -> Entry | None:
        """The entry of a file another instance uploaded, kept here until the store's time for it (at most this
        instance's lifetime); None when the provider refused that file here before."""
        if self.refs.refused(owner.tenant, stored.file_id):
            return None
        now = self.refs.clock()
        entry = Entry(owner=owner, digest=digest, file_id=stored.file_id, size=0, uploaded_at=now, borrowed_until=stored.until)
        self._delete(self.refs.put(entry))
        self.borrowed += 1
        return entry

    def _plan(self, flow: http.HTTPFlow, state: FlowState, tenant: bytes) -> _Plan | None:
        """In a worker thread: the body as the prune addon forwards it (decoded), parsed, its images that may go by
        reference when send-once is on for its rule (None when there are none), and the files the shared store holds
        for those this instance has no entry for."""
        assert self.flows.rules is not None
        request, target = flow.request, state.target
        try:
            raw = decode_body(request.raw_content or b"", request.headers.get("content-encoding"), self.flows.max_decoded_bytes)
            if target.format is None or not may_hold_images(target.format, raw):
                return None
            body = orjson.loads(raw)
        except (DecodeError, orjson.JSONDecodeError):
            return None
        if not isinstance(body, dict):
            return None
        if not ctx.options.trimflow_send_once:
            model = body.get("model")
            limits = self.flows.rules.current().limits_for(target.host, request.path, model if isinstance(model, str) else None)
            if not limits.send_once:
                return None
        found = candidates(target.format, body)
        if not found:
            return None
        stored: dict[bytes, StoredFile] = {}
        store = self._store()
        if store is not None:
            missing = list(dict.fromkeys(c.digest for c in found if self.refs.get(tenant, c.digest) is None))
            if missing:
                files = store.get_files(tenant, missing)
                stored = {digest: file for digest, file in zip(missing, files, strict=True) if file is not None}
        return raw, body, found, stored

    @staticmethod
    def _rewrite(
        flow: http.HTTPFlow, raw: bytes, state: FlowState, body: dict[str, Any], references: dict[tuple[str | int, ...], str], version: str
    ) -> bytes:
        """In a worker thread: the body with its references, set on the request (encoded as it came)."""
        assert state.target.format is not None
        new_body = with_references(raw, state.target.format, body, references, version)
        flow.request.content = new_body  # re-encodes with the request's content-encoding, fixes content-length
        return new_body

    async def _upload(self, flow: http.HTTPFlow, api: FilesApi, owner: Owner, candidate: Candidate) -> str | None:
        """The file id of the image, uploaded now (or by the request uploading it already); None when it could not be."""
        key = (owner.tenant, candidate.digest)
        running = self._uploading.get(key)
        if running is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._uploading[key] = future
        file_id: str | None = None
        try:
            file_id = await self._post(flow, api, owner, candidate)
        finally:
            del self._uploading[key]
            future.set_result(file_id)
            if file_id is None:
                self.upload_failures += 1
            else:
                self.uploaded += 1
            if self._sweeper is None:  # from the first upload on, on mitmproxy's loop
                self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
            # An image that could not go up stays inline for this tenant, so its conversation's prefix stays as it went.
            size = candidate.chars * 3 // 4 if file_id else 0
            uploaded_at = self.refs.clock()
            entry = Entry(owner=owner, digest=candidate.digest, file_id=file_id, size=size, uploaded_at=uploaded_at)
            self._delete(self.refs.put(entry))
            store = self._store()
            if file_id is not None and store is not None:
                store.put_file(owner.tenant, candidate.digest, file_id, self.refs.shared_until(uploaded_at, entry.max_lifetime))
        return file_id

    async def _post(self, flow: http.HTTPFlow, api: FilesApi, owner: Owner, candidate: Candidate) -> str | None:
        if self._slots is None:
            self._slots = asyncio.Semaphore(MAX_UPLOADS)
        try:
            await asyncio.wait_for(self._slots.acquire(), self.deadline)
        except TimeoutError:
            log.warning("trimflow: send-once: %d uploads in flight for the deadline: the image goes inline", MAX_UPLOADS)
            return None
        try:
            return await self._post_now(flow, api, owner, candidate)
        finally:
            self._slots.release()

    async def _post_now(self, flow: http.HTTPFlow, api: FilesApi, owner: Owner, candidate: Candidate) -> str | None:
        data = await asyncio.to_thread(candidate.decoded)
        if data is None:
            return None
        original = flow.request
        headers = original.headers.copy()
        for name in _BODY_HEADERS:
            headers.pop(name, None)
        headers["accept-encoding"] = "identity"  # the answer is read here: never a compressed one to inflate
        where = f"{original.pretty_host}{api.upload}"
        if api.provider == GEMINI:
            return await self._post_gemini(flow, api, owner, candidate, data, headers, where)
        content_type, form = upload_form(api, candidate, data, self.refs.lifetime + 3600)
        headers["content-type"] = content_type
        if api.provider == ANTHROPIC:
            headers[BETA_HEADER] = with_files_beta(original.headers.get(BETA_HEADER))
        answer = await resend(_beside(original, api.upload, headers, form), flow.client_conn, flow.server_conn.sni, self.deadline)
        raw = _upload_answer(answer, where)
        file_id = file_id_of(raw) if raw is not None else None
        if raw is not None and file_id is None:
            log.warning("trimflow: send-once: upload to %s answered no file id: the image goes inline", where)
        return file_id

    async def _post_gemini(
        self, flow: http.HTTPFlow, api: FilesApi, owner: Owner, candidate: Candidate, data: bytes, headers: http.Headers, where: str
    ) -> str | None:
        """Gemini's resumable upload: the start (the file's metadata), answered with the URL to send the bytes to, then
        the bytes in one request that finalizes it; both within the one deadline. The key goes as its header (a `?key=`
        of the request's own included), never in a URL."""
        original = flow.request
        key = dict(owner.headers).get(GEMINI_KEY_HEADER)
        if key is not None:
            headers[GEMINI_KEY_HEADER] = key
        start_headers, metadata = gemini_upload_start(candidate, len(data))
        start = headers.copy()
        for name, value in start_headers.items():
            start[name] = value
        ends = asyncio.get_running_loop().time() + self.deadline
        answer = await resend(_beside(original, api.upload, start, metadata), flow.client_conn, flow.server_conn.sni, self.deadline)
        if _upload_answer(answer, where) is None:
            return None
        assert not isinstance(answer, str)
        authority = original.host_header or f"{original.host}:{original.port}"
        finish = gemini_upload_finish(answer.headers.get(UPLOAD_URL_HEADER), original.scheme, authority, api.upload)
        if finish is None:
            log.warning("trimflow: send-once: upload to %s answered no upload URL on its own host: the image goes inline", where)
            return None
        target, finish_headers = finish
        for name, value in finish_headers.items():
            headers[name] = value
        headers["content-type"] = candidate.mime
        left = ends - asyncio.get_running_loop().time()
        if left <= 0:
            log.warning("trimflow: send-once: upload to %s failed (%s): the image goes inline", where, "timed out")
            return None
        answer = await resend(_beside(original, target, headers, data), flow.client_conn, flow.server_conn.sni, left)
        raw = _upload_answer(answer, where)
        file_id = file_id_of(raw, GEMINI, api.version) if raw is not None else None
        if raw is not None and file_id is None:
            log.warning("trimflow: send-once: upload to %s answered no active file: the image goes inline", where)
        return file_id

    # -- deleting files

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(SWEEP_EVERY, max(self.refs.lifetime / 4, 0.05)))
            self._delete(self.refs.expired())

    def _delete(self, entries: Iterable[Entry]) -> None:
        """Delete these files at their providers, in the background, each with the credentials that uploaded it, and
        their entries in the shared store (no other instance references them from then on)."""
        store = self._store()
        for entry in entries:
            if store is not None and entry.file_id is not None:
                store.forget_file(entry.owner.tenant, entry.digest, entry.file_id)
            task = asyncio.get_running_loop().create_task(self._delete_one(entry))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _delete_one(self, entry: Entry) -> None:
        owner = entry.owner
        assert entry.file_id is not None
        headers = http.Headers()
        for name, value in owner.headers:
            headers[name] = value
        if owner.provider == ANTHROPIC:
            headers[BETA_HEADER] = with_files_beta(None)
        headers["accept-encoding"] = "identity"
        authority = dict(owner.headers).get("host", "")
        request = _request(
            scheme=owner.scheme,
            host=owner.host,
            port=owner.port,
            authority=authority,
            method="DELETE",
            path=file_path(owner.files_path, entry.file_id),
            headers=headers,
            content=b"",
            http_version="HTTP/1.1",
        )
        answer = await resend(request, detached_client(), owner.sni, DELETE_DEADLINE)
        # A file already gone is deleted: Anthropic and OpenAI say 404, Gemini 403.
        gone = (404, 403) if owner.provider == GEMINI else (404,)
        if isinstance(answer, str) or (answer.status_code >= 300 and answer.status_code not in gone):
            why = answer if isinstance(answer, str) else f"status {answer.status_code}"
            log.warning("trimflow: send-once: could not delete a file at %s (%s): python -m trimflow files lists it", owner.host, why)
            return
        self.deleted += 1

    # -- the answer

    def response(self, flow: http.HTTPFlow) -> Coroutine[None, None, None] | None:
        # Not `async def`: an answer that refuses no reference, the usual case, makes no coroutine.
        sent = self.sent.pop(flow, None)
        response = flow.response
        if sent is None or response is None or response.stream or response.status_code not in REFUSAL_STATUSES:
            return None
        answer = held_answer_body(response)
        if answer is None:
            return None
        refused = refused_ids(response.status_code, answer, sent.file_ids)
        return self._send_inline(flow, sent, refused) if refused else None

    async def _send_inline(self, flow: http.HTTPFlow, sent: _Referenced, refused: frozenset[str]) -> None:
        dropped = self.refs.drop(sent.tenant, refused)
        store = self._store()
        if store is not None:
            for entry in dropped:
                assert entry.file_id is not None
                store.forget_file(sent.tenant, entry.digest, entry.file_id)
        self.refused += 1
        log.info("trimflow: %s%s: the provider refused %d file references; sent again inline", flow.request.pretty_host, path_of(flow), len(refused))
        retry = flow.request.copy()
        retry.content = sent.inline  # encoded as the request was (content-encoding), with its content-length
        if sent.beta is None:
            retry.headers.pop(BETA_HEADER, None)
        else:
            retry.headers[BETA_HEADER] = sent.beta
        retry.timestamp_start, retry.timestamp_end = time.time(), None
        try:
            answer = await resend(retry, flow.client_conn, flow.server_conn.sni)
        except Exception as exc:  # noqa: BLE001 - the client gets the provider's refusal as it came
            log.warning("trimflow: %s%s not sent again inline: internal error %s", flow.request.pretty_host, path_of(flow), type(exc).__name__)
            return
        if isinstance(answer, str):
            log.warning("trimflow: %s%s not sent again inline: %s", flow.request.pretty_host, path_of(flow), answer)
            return
        flow.response = answer
        state = self.flows.get(flow)
        record = self.flows.settle(flow, state) if state is not None else None
        if state is not None and record is not None:
            record.references_refused = len(refused)
            record.body_bytes_after += record.reference_bytes_saved
            record.by_reference = record.uploaded = record.reference_bytes_saved = 0
            record.status = answer.status_code
            _keep(flow, state, record)

    def error(self, flow: http.HTTPFlow) -> None:
        self.sent.pop(flow, None)


class HoldRefusals:
    """After the metrics addon: holds back from the client an error answer to a request that went with references,
    up to ANSWER_MAX bytes, so that the send-once addon can answer with the inline request's answer instead (a
    streamed answer could not be taken back). The recover addon's hold, when it holds the same answer, governs it."""

    name = "trimflow_send_once_hold"

    def __init__(self, send_once: SendOnce) -> None:
        self.send_once = send_once

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response, sent = flow.response, self.send_once.sent
        if response is None or flow not in sent:
            return
        if response.status_code not in REFUSAL_STATUSES:
            sent.pop(flow, None)  # the inline body can go now, not when a long answer ends
            return
        if flow in held_answers:
            return
        try:
            length = expected_http_body_size(flow.request, response)  # None or -1: unknown until the answer ends
        except ValueError:
            length = None
        if (length is not None and length > ANSWER_MAX) or (length in (None, -1) and not size_check_extended()):
            sent.pop(flow, None)
            response.stream = response.stream or True
            return
        held_answers[flow] = HeldAnswer(response.stream, sent)
        response.stream = False

    def response(self, flow: http.HTTPFlow) -> None:
        held_answers.pop(flow, None)

    def error(self, flow: http.HTTPFlow) -> None:
        held_answers.pop(flow, None)


def _keep(flow: http.HTTPFlow, state: FlowState, record: Record) -> None:
    write(flow, state)
    flow.comment = flow_comment(record)


def _beside(original: http.Request, path: str, headers: http.Headers, content: bytes) -> http.Request:
    """A POST to `path` on the original request's upstream, as the original went (scheme, host, HTTP version)."""
    return _request(
        scheme=original.scheme,
        host=original.host,
        port=original.port,
        authority=original.authority,
        method="POST",
        path=path,
        headers=headers,
        content=content,
        http_version=original.http_version,
    )


def _upload_answer(answer: http.Response | str, where: str) -> bytes | None:
    """The body of an upload's answer when it is a success of a sane size; None (and a log line) when not."""
    if isinstance(answer, str):
        log.warning("trimflow: send-once: upload to %s failed (%s): the image goes inline", where, answer)
        return None
    raw = answer.raw_content or b""
    if not 200 <= answer.status_code < 300 or len(raw) > UPLOAD_ANSWER_MAX:
        log.warning("trimflow: send-once: upload to %s answered %d: the image goes inline", where, answer.status_code)
        return None
    return raw


def _request(
    *, scheme: str, host: str, port: int, authority: str, method: str, path: str, headers: http.Headers, content: bytes, http_version: str
) -> http.Request:
    request = http.Request(
        host=host,
        port=port,
        method=method.encode(),
        scheme=scheme.encode(),
        authority=authority.encode(),
        path=path.encode(),
        http_version=http_version.encode(),
        headers=headers,
        content=None,
        trailers=None,
        timestamp_start=time.time(),
        timestamp_end=None,
    )
    request.content = content  # with its content-length
    return request


__all__ = ["DEFAULT_DEADLINE", "HoldRefusals", "SendOnce"]
