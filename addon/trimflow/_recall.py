"""The recall store: every image trimflow cuts (or shrinks) kept as it was sent, so that the model can ask for it back.

An image is known by its id (`image_id`): 10 base32 characters of the SHA-256 of its bytes, which its placeholder
names (trimflow._placeholder). The proxy writes (`RecallStore`), `python -m trimflow mcp` reads (`RecallReader`).

Where: a folder (the proxy's `trimflow_recall` option), 0700, holding one folder per run, 0700, named by a keyed
digest of the run's token (`run_folder`): the launcher makes a token per run and hands it to mitmdump
(TOKEN_VARIABLE in its environment) and to the MCP server it registers (a 0600 file of the run), so a server
reads the images of its own run and no other. A run serves one set of credentials: the first request's (a keyed
digest of its API key or Authorization header, `owner_of`, never the key) binds the run; a request with other
credentials gets no recall. Each image is one 0600 file named by its id: a header line (its type, the
conversation's short id, the SHA-256 of the bytes, its lifetime) and the bytes; never a key or any text of a request.

Bounds: bytes per conversation and in all, the least recently used going first (every request that carries the
image again, every recall, counts as a use); a lifetime since the last use (the file's mtime), past which the
reader answers that it expired and the writer removes it. Writes happen in a thread of their own, fed through a
queue bounded in bytes, after the request is on its way; an error of the folder (a full disk, no permission)
turns recall off with one log line, and requests go on as with recall off. A folder or file that is not what
this module makes (a link, someone else's, too big, garbage, bytes that do not hash to their id) is never read.
Pure Python, no mitmproxy.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import stat
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import orjson

from ._body import Payload
from ._history import image_crc, image_key
from ._media import JsonPath, Media

log = logging.getLogger("trimflow")

FOLDER_NAME = "trimflow-recall"  # in mitmproxy's confdir, by default
TOKEN_VARIABLE = "TRIMFLOW_RECALL_TOKEN"  # the run's token, hex, in mitmdump's environment
STORE_VARIABLE = "TRIMFLOW_RECALL_STORE"  # the store's folder, in the agent's environment, for a server registered by hand
TOOL = "recall_image"  # the MCP tool a placeholder names
ID_CHARS = 10  # base32 characters: 50 bits, against a few thousand images of one run
DEFAULT_LIFETIME = 24 * 3600.0
DEFAULT_MAX_BYTES = 1024 * 2**20
DEFAULT_CONVERSATION_BYTES = 256 * 2**20
MAX_IMAGE_BYTES = 32 * 2**20  # larger images are not kept (every provider refuses far smaller ones)
MAX_ENTRIES = 100_000  # files known in all: the index's memory (about 200 bytes each)
QUEUE_BYTES = 64 * 2**20  # base64 waiting for the writer; past it an image waits for its next request
INLINE_HASH_BYTES = 2**20  # base64 an inline run may hash for new ids before it moves to a worker
MEMO_ENTRIES = 8192  # ids remembered by the image's key (trimflow._history), so a turn hashes only new images
MAX_LIFETIME = 30 * 24 * 3600.0  # a header asking for longer is not one this module wrote
RECALLS_FILE = "recalls"  # in a run's folder: one line per answer of its MCP server, for the record
MAX_RECALLS_FILE = 2**20
TOUCH_STEPS = 96  # a file's mtime moves on with its uses in steps of its lifetime / this: it expires that much early at most
SCAN_EVERY = 256  # writes between two looks at the whole folder (other runs' files count towards the bound)
_MAGIC = b"trimflow-recall 1\n"
_MAX_HEADER = 512
_ID = re.compile(rf"[a-z2-7]{{{ID_CHARS}}}")
_RUN = re.compile(r"run-[0-9a-f]{32}")
_MIME = re.compile(r"image/[a-z0-9.+-]{1,40}")
_TEMP = ".tmp-"
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "x-goog-api-key", "api-key")


class RecallError(Exception):
    """Why an id brings no image back: `kind` is "unknown", "expired" or "unavailable"; the message says it for the model."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def image_id(data: bytes) -> str:
    """The id a placeholder names: 10 base32 characters (lower case) of the SHA-256 of the image's bytes."""
    return base64.b32encode(hashlib.sha256(data).digest()).decode("ascii")[:ID_CHARS].lower()


def is_id(text: str) -> bool:
    return _ID.fullmatch(text) is not None


def parse_token(text: str) -> bytes | None:
    """A run's token as given (hex, at least 16 bytes), or None."""
    try:
        token = bytes.fromhex(text.strip())
    except ValueError:
        return None
    return token if len(token) >= 16 else None


def run_folder(token: bytes) -> str:
    """The folder of a run's images: a keyed digest of its token (the token itself is in no file name)."""
    return "run-" + hmac.new(token, b"trimflow recall run folder", hashlib.sha256).hexdigest()[:32]


def owner_of(token: bytes, headers: Mapping[str, str]) -> bytes:
    """A keyed digest of a request's credentials (lower-case header names): the run's images are those of one owner."""
    parts = [f"{name}\0{headers[name]}".encode("utf-8", "surrogateescape") for name in CREDENTIAL_HEADERS if name in headers]
    return hmac.new(token, b"trimflow recall owner\0" + b"\0".join(parts), hashlib.sha256).digest()[:16]


def base64_of(media: Media) -> bytes | memoryview | str:
    """An image's base64 as written, read in place where it can be (no escape in it)."""
    data, offset = media.data, media.data_offset
    assert data is not None
    if isinstance(data, Payload) and data.body.find(b"\\", data.start + offset, data.end) < 0:
        return memoryview(data.body)[data.start + offset : data.end]
    return data[offset:]


def decode(b64: bytes | memoryview | str) -> bytes | None:
    """The bytes of base64 text, or None when it is not base64 (or not ASCII)."""
    try:
        return binascii.a2b_base64(b64)
    except (binascii.Error, ValueError):
        return None


class IdMemo:
    """Ids already worked out, by the image's key (trimflow._history: its length and ends, and the CRC-32 of a
    payload that is not a PNG) and the owner: a conversation re-sends its cut images every turn, hashed once.
    Bounded (the least recently used go); safe from any thread."""

    def __init__(self, capacity: int = MEMO_ENTRIES) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[tuple[bytes, bytes, int], str | None] = OrderedDict()
        self._lock = threading.Lock()

    def ids(self, owner: bytes, slow: Callable[[], None] | None = None) -> RecallIds:
        return RecallIds(self, owner, slow)

    def _get(self, key: tuple[bytes, bytes, int]) -> tuple[bool, str | None]:
        with self._lock:
            if key not in self._ids:
                return False, None
            self._ids.move_to_end(key)
            return True, self._ids[key]

    def _put(self, key: tuple[bytes, bytes, int], value: str | None) -> None:
        with self._lock:
            self._ids[key] = value
            while len(self._ids) > self.capacity:
                self._ids.popitem(last=False)


class RecallIds:
    """The ids of one request's images, for its placeholders: the request's owner, and `slow`, which an inline run
    gives to leave for a worker thread (it raises) before hashing more than INLINE_HASH_BYTES of new images."""

    def __init__(self, memo: IdMemo, owner: bytes, slow: Callable[[], None] | None) -> None:
        self.memo, self.owner, self._slow = memo, owner, slow
        self._hashed = 0
        self._found: dict[JsonPath, str | None] = {}  # this request's, by the image's place

    def of(self, media: Media) -> str | None:
        """The image's id, or None when it has no bytes here (remote, not base64)."""
        if media.data is None:
            return None
        if media.path in self._found:
            return self._found[media.path]
        key = (self.owner, image_key(media), image_crc(media))
        known, value = self.memo._get(key)
        if known:
            self._found[media.path] = value
            return value
        self._hashed += media.payload_bytes
        if self._slow is not None and self._hashed > INLINE_HASH_BYTES:
            self._slow()
        data = decode(base64_of(media))
        value = image_id(data) if data else None
        self.memo._put(key, value)
        self._found[media.path] = value
        return value


@dataclass(frozen=True, slots=True)
class Kept:
    """An image a request's placeholder or note names: its id, where its base64 is, its type."""

    id: str
    media: Media
    mime: str | None


@dataclass(slots=True)
class _Entry:
    size: int  # bytes on disk
    used: float  # the last use (a request that carried it, a recall), on the wall clock
    touched: float  # the file's mtime as last set
    conversation: str | None  # None: a file of another run or an earlier process, counted in all only


@dataclass(frozen=True, slots=True)
class _Job:
    id: str
    b64: bytes
    mime: str
    conversation: str


class RecallStore:
    """The writer: images offered after their request went (`offer`), written by a thread of its own.

    `accepts(owner)` binds the run to the first owner and says whether a request's images are kept (and its
    placeholders name their ids); False once the folder failed. Safe from any thread."""

    def __init__(
        self,
        folder: str,
        token: bytes,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        conversation_bytes: int = DEFAULT_CONVERSATION_BYTES,
        lifetime: float = DEFAULT_LIFETIME,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.folder = os.path.abspath(folder)
        self.run = run_folder(token)
        self.token = token
        self.max_bytes, self.conversation_bytes, self.lifetime = max_bytes, min(conversation_bytes, max_bytes), lifetime
        self.clock = clock
        self.memo = IdMemo()
        self.failed: str | None = None  # why the folder is not used
        self.stored = 0  # images written
        self.skipped = 0  # images not kept: the queue was full, or too big
        self.evicted = 0  # files removed for a bound or the lifetime
        self._owner: bytes | None = None
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._jobs: deque[_Job] = deque()
        self._queued: set[str] = set()
        self._queued_bytes = 0
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._index: OrderedDict[tuple[str, str], _Entry] = OrderedDict()  # (run folder, id), least recently used first
        self._total = 0
        self._conversations: dict[str, int] = {}  # this run's bytes per conversation
        self._ready = False
        self._writes = 0
        self._recalls_read = 0  # bytes of the recalls file counted so far

    # -- on the request path

    @property
    def in_use(self) -> bool:
        return self.failed is None and not self._closed

    def accepts(self, owner: bytes) -> bool:
        with self._lock:
            if self._owner is None:
                self._owner = owner
            return self.failed is None and not self._closed and hmac.compare_digest(owner, self._owner)

    def ids(self, owner: bytes, slow: Callable[[], None] | None = None) -> RecallIds:
        return self.memo.ids(owner, slow)

    def offer(self, conversation: str | None, kept: Iterable[Kept]) -> None:
        """Keep the images a request's placeholders named: a known one is used again, a new one queued (its base64
        copied, so the request's body can go). Never raises."""
        now = self.clock()
        try:
            with self._lock:
                if self.failed is not None or self._closed:
                    return
                for item in kept:
                    entry = self._index.get((self.run, item.id))
                    if entry is not None:
                        entry.used = now
                        self._index.move_to_end((self.run, item.id))
                        if now - entry.touched > self.lifetime / TOUCH_STEPS:  # the file's mtime says when it was last used
                            entry.touched = now
                            self._queue(_Job(item.id, b"", "", ""))
                        continue
                    if item.id in self._queued or item.media.data is None:
                        continue
                    size = item.media.payload_bytes
                    if size * 3 // 4 > MAX_IMAGE_BYTES or self._queued_bytes + size > QUEUE_BYTES:
                        self.skipped += 1
                        continue
                    b64 = base64_of(item.media)
                    copied = bytes(b64) if not isinstance(b64, str) else b64.encode("latin-1", "replace")
                    self._queue(_Job(item.id, copied, _mime(item.mime), conversation or "-"))
        except Exception as exc:  # noqa: BLE001 - recall lost, never a request
            self._fail(exc)

    def _queue(self, job: _Job) -> None:
        self._jobs.append(job)
        if job.b64:
            self._queued.add(job.id)
            self._queued_bytes += len(job.b64)
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="trimflow-recall", daemon=True)
            self._thread.start()
        self._wake.notify()

    def take_recalls(self) -> tuple[int, int]:
        """(images recalled, recalls refused) by the run's MCP server since the last call: its recalls file's new lines."""
        if self.failed is not None:
            return 0, 0
        path = os.path.join(self.folder, self.run, RECALLS_FILE)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return 0, 0
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size <= self._recalls_read or st.st_size > MAX_RECALLS_FILE:
                return 0, 0
            new = os.pread(fd, st.st_size - self._recalls_read, self._recalls_read)
        finally:
            os.close(fd)
        lines = new[: new.rfind(b"\n") + 1]
        self._recalls_read += len(lines)
        answers = lines.split()
        served = answers.count(b"ok")
        return served, len(answers) - served

    # -- the writer thread

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._jobs and not self._closed:
                    self._wake.wait()
                if self._closed and not self._jobs:
                    return
                job = self._jobs.popleft()
                self._busy = True
            try:
                self._do(job)
            except OSError as exc:
                self._fail(exc)
            except Exception as exc:  # noqa: BLE001 - recall lost, never the proxy
                self._fail(exc)
            finally:
                with self._lock:
                    if job.b64:
                        self._queued.discard(job.id)
                        self._queued_bytes -= len(job.b64)
                    self._busy = False
                    self._wake.notify_all()
                    if self.failed is not None:
                        self._jobs.clear()
                        self._queued.clear()
                        self._queued_bytes = 0

    def _do(self, job: _Job) -> None:
        if self.failed is not None:
            return
        if not self._ready:
            self._prepare()
            self._ready = True
        run = os.path.join(self.folder, self.run)
        now = self.clock()
        if not job.b64:  # a use: the file's mtime moves on
            with self._lock:
                entry = self._index.get((self.run, job.id))
            if entry is not None:
                try:
                    os.utime(os.path.join(run, job.id), (now, now), follow_symlinks=False)
                except FileNotFoundError:
                    self._forget((self.run, job.id))
            return
        data = decode(job.b64)
        if not data or image_id(data) != job.id or len(data) > MAX_IMAGE_BYTES:
            self.skipped += 1  # not the image its id names (a key's collision, junk): never stored under it
            return
        digest = hashlib.sha256(data).hexdigest()
        header = orjson.dumps({"mime": job.mime, "conversation": job.conversation, "sha256": digest, "lifetime": self.lifetime})
        _write_file(run, job.id, _MAGIC + header + b"\n" + data)
        size = len(_MAGIC) + len(header) + 1 + len(data)
        with self._lock:
            self._forget((self.run, job.id))
            self._index[(self.run, job.id)] = _Entry(size, now, now, job.conversation)
            self._total += size
            self._conversations[job.conversation] = self._conversations.get(job.conversation, 0) + size
        self.stored += 1
        self._writes += 1
        self._evict(job.conversation, now)
        if self._writes % SCAN_EVERY == 0:
            self._scan()

    def _prepare(self) -> None:
        """The folders made (or checked) private, and what they hold already indexed."""
        _private_folder(self.folder, make_parents=True)
        _private_folder(os.path.join(self.folder, self.run))
        self._scan()

    def _scan(self) -> None:
        """Index the files of every run in the folder (this process's own are known), removing what is past its
        lifetime or not what this module writes, and empty folders of other runs; then the bounds."""
        now = self.clock()
        seen: set[tuple[str, str]] = set()
        found: list[tuple[float, tuple[str, str]]] = []  # files new to the index, by mtime
        whole, visited = True, 0
        with os.scandir(self.folder) as runs:
            for run in runs:
                if not _RUN.fullmatch(run.name) or not run.is_dir(follow_symlinks=False):
                    continue
                if not _ours(run.stat(follow_symlinks=False)):
                    continue
                empty = True
                with os.scandir(run.path) as files:
                    for file in files:
                        empty = False
                        visited += 1
                        if len(seen) >= MAX_ENTRIES or visited > 2 * MAX_ENTRIES:  # a folder of junk costs a bounded look
                            whole = False
                            break
                        self._scan_file(run.name, file, now, seen, found)
                if empty and run.name != self.run:
                    try:
                        os.rmdir(run.path)
                    except OSError:
                        pass
        with self._lock:
            # A file this process never used sits by its mtime among the least recently used, before every one it did.
            for _, key in sorted(found, reverse=True):
                if key in self._index:
                    self._index.move_to_end(key, last=False)
            if whole:  # what the folder no longer holds (removed by another process) is forgotten
                for key in [key for key in self._index if key not in seen]:
                    self._forget(key)
        self._evict(None, now)

    def _scan_file(
        self, run: str, file: os.DirEntry[str], now: float, seen: set[tuple[str, str]], found: list[tuple[float, tuple[str, str]]]
    ) -> None:
        key = (run, file.name)
        if file.name == RECALLS_FILE:
            return
        try:
            st = file.stat(follow_symlinks=False)
        except FileNotFoundError:
            return
        stale = now - st.st_mtime > self.lifetime
        if file.name.startswith(_TEMP):  # a write cut short (a killed process): gone after a while
            if now - st.st_mtime > 60:
                _unlink(file.path)
            return
        if not is_id(file.name) or not stat.S_ISREG(st.st_mode) or not _ours(st) or st.st_size > MAX_IMAGE_BYTES + _MAX_HEADER or stale:
            if is_id(file.name):
                _unlink(file.path)  # an entry's name, not an entry: it can only mislead
                with self._lock:
                    self._forget(key)
            return
        seen.add(key)
        with self._lock:
            entry = self._index.get(key)
            if entry is None:
                self._index[key] = entry = _Entry(st.st_size, st.st_mtime, st.st_mtime, None)
                self._total += st.st_size
                found.append((st.st_mtime, key))
            elif st.st_mtime > entry.used:  # recalled since: a use
                entry.used = entry.touched = st.st_mtime

    def _evict(self, conversation: str | None, now: float) -> None:
        """Remove the least recently used files while over a bound, and every file past its lifetime."""
        doomed: list[tuple[str, str]] = []
        with self._lock:
            for key, entry in self._index.items():
                if now - entry.used > self.lifetime:
                    doomed.append(key)
            for key in doomed:
                self._forget(key)
            if conversation is not None:
                over = self._conversations.get(conversation, 0) - self.conversation_bytes
                for key, entry in list(self._index.items()):
                    if over <= 0:
                        break
                    if entry.conversation == conversation:
                        over -= entry.size
                        doomed.append(key)
                        self._forget(key)
            while self._total > self.max_bytes or len(self._index) > MAX_ENTRIES:
                key, _ = next(iter(self._index.items()))
                doomed.append(key)
                self._forget(key)
        for run, name in doomed:
            _unlink(os.path.join(self.folder, run, name))
            self.evicted += 1

    def _forget(self, key: tuple[str, str]) -> None:
        entry = self._index.pop(key, None)
        if entry is None:
            return
        self._total -= entry.size
        if entry.conversation is not None:
            left = self._conversations.get(entry.conversation, 0) - entry.size
            if left > 0:
                self._conversations[entry.conversation] = left
            else:
                self._conversations.pop(entry.conversation, None)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.failed is not None:
                return
            self.failed = _reason(exc)
        log.warning("trimflow: recall off: %s in %s; placeholders no longer offer recall_image", self.failed, self.folder)

    # -- for the proxy's end and the tests

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued image is written (or dropped); whether it came to that within `timeout`."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._jobs or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(left)
        return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(5)

    def usage(self) -> tuple[int, int]:
        """(files, bytes) the store knows of."""
        with self._lock:
            return len(self._index), self._total


@dataclass(frozen=True, slots=True)
class Recalled:
    data: bytes
    mime: str


class RecallReader:
    """The MCP server's side: one run's images (`token`), read and checked; each answer a line of the recalls file."""

    def __init__(self, folder: str, token: bytes, clock: Callable[[], float] = time.time) -> None:
        self.folder = os.path.abspath(folder)
        self.run = os.path.join(self.folder, run_folder(token))
        self.clock = clock

    def read(self, wanted: str) -> Recalled:
        """The image with id `wanted`, or RecallError saying why not."""
        try:
            recalled = self._read(wanted.strip().lower())
        except RecallError as exc:
            self._count(exc.kind)
            raise
        self._count("ok")
        return recalled

    def _read(self, wanted: str) -> Recalled:
        if not is_id(wanted):
            why = f"an id is {ID_CHARS} letters and digits, as a trimflow placeholder gives it"
            raise RecallError("unknown", f"that is not an image id: {why}")
        unknown = RecallError(
            "unknown",
            f"no image {wanted} in this run's store: it was not cut in this session, or it was removed to keep the store within "
            "its bounds or past its lifetime",
        )
        try:
            for folder in (self.folder, self.run):
                if not _ours(os.stat(folder, follow_symlinks=False), folder=True):
                    raise RecallError("unavailable", "trimflow's recall store is not a private folder of this user: not read")
            fd = os.open(os.path.join(self.run, wanted), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            raise unknown from None
        except OSError as exc:
            if exc.errno is not None and exc.errno == getattr(os, "ELOOP", -1):
                raise unknown from None
            raise RecallError("unavailable", f"trimflow's recall store cannot be read ({exc.strerror or type(exc).__name__})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not _ours(st) or st.st_size > MAX_IMAGE_BYTES + _MAX_HEADER:
                raise unknown
            data = _read_all(fd, st.st_size)
            parsed = _parse(data)
            if parsed is None:
                raise unknown
            mime, lifetime, image = parsed
            if image_id(image) != wanted:
                raise unknown
            now = self.clock()
            if now - st.st_mtime > lifetime:
                hours = lifetime / 3600
                raise RecallError("expired", f"image {wanted} expired: trimflow keeps an image {hours:g} h after the last request that carried it")
            try:
                os.utime(fd, (now, now))  # a recall is a use
            except OSError:
                pass
            return Recalled(image, mime)
        finally:
            os.close(fd)

    def _count(self, kind: str) -> None:
        """One line in the run's recalls file, for the proxy's record (bounded; never fails a recall)."""
        try:
            path = os.path.join(self.run, RECALLS_FILE)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_size < MAX_RECALLS_FILE:
                os.write(fd, (kind if kind == "ok" else "refused").encode() + b"\n")
        except OSError:
            pass
        finally:
            os.close(fd)


def _parse(data: bytes) -> tuple[str, float, bytes] | None:
    """(mime, lifetime, image) of a file as `_write_file` writes it, or None."""
    if not data.startswith(_MAGIC):
        return None
    end = data.find(b"\n", len(_MAGIC), len(_MAGIC) + _MAX_HEADER)
    if end < 0:
        return None
    try:
        header = orjson.loads(data[len(_MAGIC) : end])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(header, dict):
        return None
    mime, digest, lifetime = header.get("mime"), header.get("sha256"), header.get("lifetime")
    if not isinstance(mime, str) or _MIME.fullmatch(mime) is None or not isinstance(digest, str):
        return None
    if isinstance(lifetime, bool) or not isinstance(lifetime, int | float) or not 0 < lifetime <= MAX_LIFETIME:
        return None
    image = data[end + 1 :]
    if not hmac.compare_digest(hashlib.sha256(image).hexdigest(), digest):
        return None
    return mime, float(lifetime), image


def _mime(mime: str | None) -> str:
    mime = (mime or "").strip().lower()
    return mime if _MIME.fullmatch(mime) else "image/png"


def _ours(st: os.stat_result, folder: bool = False) -> bool:
    """A file or folder of this user (a folder also private: no one else may add to it)."""
    if st.st_uid != os.geteuid():
        return False
    if folder:
        return stat.S_ISDIR(st.st_mode) and not st.st_mode & 0o077
    return True


def _private_folder(path: str, make_parents: bool = False) -> None:
    """Made 0700 if missing; an OSError when it is a link, not a folder, or someone else's. One this user made
    with a wider mode is narrowed."""
    if make_parents:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.stat(path, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise NotADirectoryError(f"{path} is not a folder of this user")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700, follow_symlinks=False)


def _write_file(folder: str, name: str, data: bytes) -> None:
    """Written whole under a temporary name (0600 from its creation, never through a link), then renamed into place."""
    temp = os.path.join(folder, f"{_TEMP}{name}-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.close(fd)
        fd = -1
        os.rename(temp, os.path.join(folder, name))
    except BaseException:
        if fd >= 0:
            os.close(fd)
        _unlink(temp)
        raise


def _read_all(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _reason(exc: BaseException) -> str:
    """The error without a path: its class or the system's short message."""
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return type(exc).__name__
