"""What trimflow instances on many hosts share, in a Redis or Valkey server (`trimflow_state=redis://HOST:PORT/DB`).

One store per team: each conversation's last turn (trimflow._last_turns.TurnStore, as the one-host SQLite file holds
it), with its turn number and the conversation's id, so that instances number a conversation 1, 2, 3 as one; and
the learned limits (LearnedInStore, in place of the learned-limits file); and send-once's files (`put_file`,
`get_files`: trimflow._file_refs), so that an image one instance uploaded is referenced by the others. Keys are
namespaced (`trimflow:v1:...`) and expire (MAX_AGE for turns, the file's bound; a learned limit's lifetime for those;
a file's before its uploader deletes it). A turn's value is digests and counts: its time, cut, number and
conversation id (4 bytes), then its images' keys and CRC-32s in the file's encoding; a file's, until when it may be
referenced and its id, under the digests of its tenant and image; never a prompt, an image or a key. Whoever else
can write the store is not trusted: a value is read only up to the longest one trimflow writes (GETRANGE) and
checked as the file's rows are (trimflow._last_turns.checked), a file id as a provider's (its shape: the provider
refuses an id not of the request's own key, and send-once sends that request inline); one that is not what
trimflow writes is ignored.

The proxy never waits for the store past DEADLINE: a read on the request path ends by its deadline, the whole read
(its socket calls share it, so a store that answers a byte at a time is cut off too), and only while the store is
known to answer; it uses a connection the thread made ready, never one of its own (`_Ready`). The proxy reads in
a worker thread, never on its event loop (`across_hosts`: trimflow.proxy.state.SharedState.read_ahead). Writes wait in a
queue (the newest turn of each conversation, at most MAX_PENDING; as many file entries) for a thread of its own, and never put an older
turn of a conversation over a newer one another instance wrote (`_WRITE_NEWER`, compared in the store). A store that
is down, slow, full or answering garbage costs one warning, and the instance goes on with its own memory; the thread
connects again by itself (RETRY_FIRST, doubling to RETRY_MAX) and says so once when it answers. No request waits on
a (re)connection: only the thread connects. Needs the `redis` client (`pip install 'trimflow[team]'`). Pure Python,
no mitmproxy.
"""

from __future__ import annotations

import logging
import math
import os
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from ._last_turns import MAX_AGE, MAX_IMAGES_BYTES, MAX_PENDING, LastTurn, checked, kept, pack_images
from ._learned_limits import DEFAULT_TTL, Entry, Key, bounded, learned_text, merged, parse_learned
from ._send_once import MAX_FILE_ID, is_provider_file_id
from .errors import RulesError

log = logging.getLogger("trimflow")

SCHEMES = ("redis", "rediss", "unix")
PREFIX = b"trimflow:v1:"
PASSWORD_VARIABLE = "TRIMFLOW_STATE_PASSWORD"
DEADLINE = 0.005  # seconds a call on the request path may wait for the store, each socket operation
WRITE_DEADLINE = 0.5  # the writing thread's calls (off the request path)
RETRY_FIRST, RETRY_MAX = 0.05, 5.0  # seconds before a store that did not answer is tried again, doubling
CLOSE_WAIT = 1.0  # seconds `close` gives the writing thread to write what waits
LEARNED = PREFIX + b"learned"  # the learned limits, as one JSON text (the learned-limits file's fields)
LEARNED_VERSION = PREFIX + b"learned:version"  # counts their writes: a reader reads them again when it moves
MAX_LEARNED_BYTES = 1 << 20  # the longest learned limits read (1,024 entries of about 200 bytes each)
WRITE_TRIES = 4  # writes of the learned limits that another instance's write came between, before the next round
_HEAD = struct.Struct(">dII4s")  # a turn's time, cut, number and conversation id, before its packed images
FRONT_CONNECTIONS = 4  # the request path's connections, made ready by the thread: reads at once past these read nothing
MAX_TURN = 1 << 24  # the highest turn number read back (a hostile store's would skip every later number past it)
_TURN_VALUE = _HEAD.size + MAX_IMAGES_BYTES  # the longest turn value trimflow writes
_FILE_HEAD = struct.Struct(">d")  # until when a file may be referenced, before its id
_FILE_VALUE = _FILE_HEAD.size + MAX_FILE_ID  # the longest file value trimflow writes


class StateRefused(ValueError):
    """A trimflow_state value trimflow does not use (its message never shows the URL's secrets)."""


def checked_url(url: str) -> str:
    """The URL if trimflow can use it: redis://, rediss:// (TLS) or unix://, and no password in it (a command line is
    seen by every user of the host: the password comes from a file or the environment)."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
        parts.port  # noqa: B018 - raises for a port that is not a number
    except ValueError:
        raise StateRefused("trimflow_state: not a URL redis://HOST:PORT/DB, rediss://HOST:PORT/DB or unix://PATH") from None
    if password is not None:
        raise StateRefused(
            f"trimflow_state: a password in the URL is refused (the command line is no place for it): "
            f"give it in trimflow_state_password_file or {PASSWORD_VARIABLE}"
        )
    if parts.scheme not in SCHEMES:
        raise StateRefused("trimflow_state: not a URL redis://HOST:PORT/DB, rediss://HOST:PORT/DB or unix://PATH")
    return url


def where(url: str) -> str:
    """The store as a log line names it: its scheme, host and port, or its socket's path; no user, no password."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    host = parts.hostname or "localhost"
    return f"{parts.scheme}://{host}:{parts.port or 6379}"


def password_from(file: str | None, environ: dict[str, str] | None = None) -> str | None:
    """The store's password: the file's first line if one is named, else TRIMFLOW_STATE_PASSWORD, else none."""
    if file:
        try:
            with open(os.path.expanduser(file), encoding="utf-8") as handle:
                return handle.readline().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise StateRefused(f"trimflow_state_password_file: cannot read it: {getattr(exc, 'strerror', None) or type(exc).__name__}") from None
    return (os.environ if environ is None else environ).get(PASSWORD_VARIABLE) or None


# A turn's value set unless the store holds a newer turn of the same conversation: one with a higher number, or the same
# number sent later. Instances write each its own turns from a queue, so one's write of turn 4 can come after
# another's of turn 5; a value of another conversation (a row given to a new one) or not trimflow's is written over.
# The head is `_HEAD`'s big-endian fields: the time (bytes 1-8, ordered as bytes for a time past 1970), the cut, the
# number (13-16) and the conversation's id (17-20). Bytes by string.byte: Lua's `<` on strings follows the locale.
_WRITE_NEWER = """
local old = redis.call('GETRANGE', KEYS[1], 0, 19)
local new = ARGV[1]
if #old == 20 and string.sub(old, 17, 20) == string.sub(new, 17, 20) then
  local function number(s)
    local a, b, c, d = string.byte(s, 13, 16)
    return ((a * 256 + b) * 256 + c) * 256 + d
  end
  local was, now = number(old), number(new)
  if now < was then return 0 end
  if now == was then
    for i = 1, 8 do
      local x, y = string.byte(new, i), string.byte(old, i)
      if x ~= y then
        if x < y then return 0 end
        break
      end
    end
  end
end
redis.call('SET', KEYS[1], new, 'EX', ARGV[2])
return 1
"""


# A file's entry deleted only while it still names the file this instance means (another may have written its own since).
_FORGET_FILE = """
if redis.call('GETRANGE', KEYS[1], 8, 8 + #ARGV[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class StoredFile(NamedTuple):
    """A file another instance uploaded, as the store holds it: its id, and until when it may be referenced."""

    file_id: str
    until: float


def file_key(tenant: bytes, digest: bytes) -> bytes:
    return PREFIX + b"file:" + tenant.hex().encode() + b":" + digest.hex().encode()


def encode_file(file_id: str, until: float) -> bytes:
    return _FILE_HEAD.pack(until) + file_id.encode("ascii")


def decode_file(value: object, now: float) -> StoredFile | None:
    """A file value read back, or None where it is not what `encode_file` writes, or its time has passed."""
    if not isinstance(value, bytes) or not _FILE_HEAD.size < len(value) <= _FILE_VALUE:
        return None
    (until,) = _FILE_HEAD.unpack_from(value)
    try:
        file_id = value[_FILE_HEAD.size :].decode("ascii")
    except UnicodeDecodeError:
        return None
    if not math.isfinite(until) or until <= now or not is_provider_file_id(file_id):
        return None
    return StoredFile(file_id, until)


def turn_key(row: bytes) -> bytes:
    return PREFIX + b"turn:" + row.hex().encode()


def encode_turn(turn: LastTurn) -> bytes:
    cut, images = kept(turn)
    conversation = turn.conversation if len(turn.conversation) == 4 else bytes(4)
    return _HEAD.pack(turn.sent_at, cut, min(turn.turn, MAX_TURN), conversation) + pack_images(images)


def decode_turn(value: object, now: float) -> LastTurn | None:
    """A value read back, or None where it is not what `encode_turn` writes (another tenant's, or garbage)."""
    if not isinstance(value, bytes) or len(value) < _HEAD.size or len(value) > _TURN_VALUE:
        return None
    sent_at, cut, number, conversation = _HEAD.unpack_from(value)
    last = checked((sent_at, cut, value[_HEAD.size :]), now)
    if last is None or number > MAX_TURN:
        return None
    return last._replace(turn=number, conversation=conversation if any(conversation) else b"")


def client(url: str, password: str | None, timeout: float, call: threading.local | None = None) -> Any:
    """A client whose every socket call, connecting too, times out after `timeout`, and that never retries. With
    `call`, the request path's: while a thread's `call.until` is set, its socket calls together end by then and it
    never connects (`_Ready`)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.connection import Connection, parse_url
    from redis.retry import Retry

    options: dict[str, Any] = {}
    if call is not None:
        base = parse_url(url).get("connection_class", Connection)
        options["connection_class"] = type(f"Ready{base.__name__}", (_Ready, base), {"call": call})
    return redis.Redis.from_url(
        url,
        password=password,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
        health_check_interval=0,
        max_connections=FRONT_CONNECTIONS,
        **options,
    )


class NotReady(Exception):
    """The request path found no connection the thread made ready: it reads nothing, and leaves connecting to the thread."""


class _Ready:
    """Mixed into the request path's redis connection class: on a thread whose `call.until` is set (a read on the request
    path) it never connects (a dead or new connection raises NotReady), and its socket is a `_Deadlined` one."""

    call: threading.local
    _sock: Any

    def connect_check_health(self, *args: Any, **kwargs: Any) -> Any:
        if self._sock is None and getattr(self.call, "until", None) is not None:
            raise NotReady
        return super().connect_check_health(*args, **kwargs)  # type: ignore[misc]

    def _connect(self) -> Any:
        return _Deadlined(super()._connect(), self.call)  # type: ignore[misc]


class _Deadlined:
    """A socket whose calls on a thread with `call.until` set each wait at most what is left until then (never more than
    the socket's own timeout; redis's polls with 0 stay polls), so the calls of one read end by its deadline together."""

    __slots__ = ("_sock", "_call")

    def __init__(self, sock: Any, call: threading.local) -> None:
        self._sock, self._call = sock, call

    def _bounded(self, op: Callable[..., Any], *args: Any) -> Any:
        until = getattr(self._call, "until", None)
        if until is None:
            return op(*args)
        left = until - time.monotonic()
        if left <= 0:
            raise TimeoutError("the read's deadline passed")  # no errno: redis takes it for its own timeout
        before = self._sock.gettimeout()
        if before is not None and before <= left:
            return op(*args)
        self._sock.settimeout(left)
        try:
            return op(*args)
        finally:
            self._sock.settimeout(before)

    def recv(self, *args: Any) -> Any:
        return self._bounded(self._sock.recv, *args)

    def recv_into(self, *args: Any) -> Any:
        return self._bounded(self._sock.recv_into, *args)

    def sendall(self, *args: Any) -> Any:
        return self._bounded(self._sock.sendall, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class RedisState:
    """The shared store at `url` (see the module's docstring); a TurnStore."""

    across_hosts = True

    def __init__(
        self,
        url: str,
        password: str | None = None,
        deadline: float = DEADLINE,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        import redis  # here, so that a missing client is the caller's one line

        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError, ValueError)
        self._timeouts: tuple[type[BaseException], ...] = (redis.TimeoutError, TimeoutError, NotReady)
        self._busy: type[BaseException] = redis.exceptions.MaxConnectionsError
        self.url = checked_url(url)
        self.clock, self.monotonic = clock, monotonic
        self.writes_dropped = 0  # turns never written: the store did not answer, or the queue was full
        self.outages = 0  # times the store stopped answering (each cost one warning)
        self.deadline = deadline
        self.unready_reads = 0  # reads on the request path that found no connection ready, and read nothing
        self._call = threading.local()  # `until`: the deadline of the read this thread makes on the request path
        self._front = client(url, password, deadline, self._call)  # the request path's
        self._back = client(url, password, WRITE_DEADLINE)  # the writing thread's
        self._write_newer = self._back.register_script(_WRITE_NEWER)
        self._forget_file = self._back.register_script(_FORGET_FILE)
        self._wake = threading.Condition()  # guards what follows
        self._up = False  # the store answered the thread's last call: the request path may use it
        self._warned = False  # this outage was logged
        self._refusing = False  # the store refused the last writes, and that was logged (the thread's own)
        self._retry_at = 0.0
        self._retry_delay = RETRY_FIRST
        self._pending: dict[bytes, tuple[float, int, bytes]] = {}  # by store key: (time, cut, value)
        # By store key: (value, milliseconds to keep it) to set, or (file id, None) to delete if it still names that file.
        self._file_ops: dict[bytes, tuple[bytes, int | None]] = {}
        self._writing = False  # the thread writes what it took from the queue
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="trimflow-state", daemon=True)
        self._thread.start()

    @property
    def in_use(self) -> bool:
        """Whether turns are shared through the store now: it answers (False while it is down, and once closed)."""
        return self._up and not self._closed

    def wait_until_up(self, timeout: float) -> bool:
        """Whether the store answered within `timeout` seconds (for a caller that would rather start sharing)."""
        with self._wake:
            return self._wake.wait_for(lambda: self._up or self._closed, timeout) and self._up

    def drained(self, timeout: float) -> bool:
        """Whether every turn put so far was written (or dropped) within `timeout` seconds."""
        with self._wake:
            return self._wake.wait_for(lambda: not self._pending and not self._file_ops and not self._writing, timeout)

    def get_many(self, keys: Sequence[bytes]) -> list[LastTurn | None]:
        """The turns under these row keys (None: none, or not one trimflow writes); nothing while the store is down."""
        values = self._read([turn_key(key) for key in keys], _TURN_VALUE)
        now = self.clock()
        return [decode_turn(value, now) for value in values]

    def get_files(self, tenant: bytes, digests: Sequence[bytes]) -> list[StoredFile | None]:
        """The files other instances uploaded for these images of the tenant's (None: none, not one trimflow writes,
        or past its time); nothing while the store is down. On the request path: within the deadline, as `get_many`."""
        values = self._read([file_key(tenant, digest) for digest in digests], _FILE_VALUE)
        now = self.clock()
        return [decode_file(value, now) for value in values]

    def _read(self, names: Sequence[bytes], longest: int) -> list[object]:
        """The values under these store keys, each up to one byte past `longest` (too long is not ours), by the
        deadline; None for each while the store is down or does not answer in time."""
        if not self.in_use or not names:
            return [None] * len(names)
        self._call.until = time.monotonic() + self.deadline
        try:
            pipe = self._front.pipeline(transaction=False)
            for name in names:
                pipe.getrange(name, 0, longest)
            values = pipe.execute()
        except self._busy:  # more reads at once than connections: this one goes without
            with self._wake:
                self.unready_reads += 1
            return [None] * len(names)
        except NotReady as exc:
            # A connection the store closed (it went away, or came back): this read goes without, and the thread makes
            # the connections ready again (or finds the store gone, and warns).
            with self._wake:
                self.unready_reads += 1
            self._lost(exc)
            return [None] * len(names)
        except self._errors as exc:
            self._lost(exc)
            return [None] * len(names)
        finally:
            self._call.until = None
        if not isinstance(values, list) or len(values) != len(names):
            return [None] * len(names)
        return values

    def put_file(self, tenant: bytes, digest: bytes, file_id: str, until: float) -> None:
        """Queues the file this instance uploaded for the image, for the others to reference until `until` (the key
        expires then); dropped while the store is down, or when `until` has passed."""
        ttl = int((until - self.clock()) * 1000)
        if ttl > 0:
            self._queue_file(file_key(tenant, digest), (encode_file(file_id, until), ttl))

    def forget_file(self, tenant: bytes, digest: bytes, file_id: str) -> None:
        """Queues the deletion of the image's entry if it still names this file (deleted here, or refused by the
        provider); dropped while the store is down (the key expires by itself)."""
        self._queue_file(file_key(tenant, digest), (file_id.encode("ascii"), None))

    def _queue_file(self, name: bytes, op: tuple[bytes, int | None]) -> None:
        with self._wake:
            if self._closed or not self._up:
                self.writes_dropped += not self._closed
                return
            if name not in self._file_ops and len(self._file_ops) >= MAX_PENDING:
                self.writes_dropped += 1
                return
            self._file_ops[name] = op  # this instance's latest word on the key
            self._wake.notify_all()

    def put(self, key: bytes, turn: LastTurn) -> None:
        """Queues the turn for the writing thread (the newest of each conversation); dropped while the store is down."""
        value = encode_turn(turn)
        name = turn_key(key)
        with self._wake:
            if self._closed or not self._up:
                self.writes_dropped += not self._closed
                return
            waiting = self._pending.get(name)
            if waiting is not None:
                if (turn.sent_at, turn.cut) >= waiting[:2]:
                    self._pending[name] = (turn.sent_at, turn.cut, value)
            elif len(self._pending) < MAX_PENDING:
                self._pending[name] = (turn.sent_at, turn.cut, value)
            else:
                self.writes_dropped += 1
                return
            self._wake.notify_all()

    def __enter__(self) -> RedisState:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        self._thread.join(CLOSE_WAIT)
        for each in (self._front, self._back):
            try:
                each.close()
            except self._errors:
                pass

    # --- the thread ----------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wake:
                while (
                    not self._closed
                    and not (self._up and (self._pending or self._file_ops))
                    and not (not self._up and self.monotonic() >= self._retry_at)
                ):
                    self._wake.wait(None if self._up else max(0.0, self._retry_at - self.monotonic()))
                writes = list(self._pending.values()) if self._up else []
                names = list(self._pending) if self._up else []
                file_ops = list(self._file_ops.items()) if self._up else []
                self._pending, self._file_ops = {}, {}
                self._writing = bool(writes or file_ops)
                connect = not self._up and not self._closed
                closing = self._closed
            if writes or file_ops:
                self._write(names, writes, file_ops)
                with self._wake:
                    self._writing = False
                    self._wake.notify_all()
            elif connect:
                self._connect()
            if closing:
                return

    def _connect(self) -> None:
        """Tries the store: both clients connect, from this thread (so no request waits on it), and it answers."""
        try:
            self._back.ping()
            self._ready_front()
        except self._errors as exc:
            with self._wake:
                self._retry_at = self.monotonic() + self._retry_delay
                self._retry_delay = min(2 * self._retry_delay, RETRY_MAX)
            self._warn(exc)
            return
        with self._wake:
            self._up = True
            self._retry_delay = RETRY_FIRST
            warned, self._warned = self._warned, False
            self._wake.notify_all()
        if warned:
            log.warning("trimflow: shared state %s answers again; instances share conversations again", where(self.url))

    def _ready_front(self) -> None:
        """Connects each of the request path's connections and sees it answer (from this thread: no request connects);
        those a read holds meanwhile answered it."""
        pool = self._front.connection_pool
        taken = []
        try:
            for _ in range(FRONT_CONNECTIONS):
                try:
                    connection = pool.get_connection()
                except self._busy:
                    break
                taken.append(connection)
                connection.send_command("PING")
                connection.read_response()
        finally:
            for connection in taken:
                pool.release(connection)

    def _write(self, names: list[bytes], writes: list[tuple[float, int, bytes]], file_ops: list[tuple[bytes, tuple[bytes, int | None]]]) -> None:
        oldest = self.clock() - MAX_AGE
        try:
            pipe = self._back.pipeline(transaction=False)
            for name, (sent_at, _, value) in zip(names, writes, strict=True):
                if sent_at >= oldest:
                    self._write_newer(keys=[name], args=[value, int(MAX_AGE)], client=pipe)
            for name, (value, ttl) in file_ops:
                if ttl is None:
                    self._forget_file(keys=[name], args=[value], client=pipe)
                else:
                    pipe.set(name, value, px=ttl)
            results = pipe.execute(raise_on_error=False)
        except self._errors as exc:
            with self._wake:
                self.writes_dropped += len(writes) + len(file_ops)
            self._lost(exc, timeout_warns=True)
            return
        refused = [result for result in results if isinstance(result, BaseException)]
        if not refused:
            self._refusing = False
            return
        # The store answers, and refuses the writes (full with no eviction, or an ACL without a command): reads go on,
        # and one warning until a write is taken again.
        with self._wake:
            self.writes_dropped += len(refused)
        if not self._refusing:
            self._refusing = True
            log.warning(
                "trimflow: shared state %s refused to keep a turn (%s); each instance keeps its own turns until it takes them "
                "(docs/deployment.md#the-shared-store)",
                where(self.url),
                _reason(refused[0]),
            )

    def _lost(self, exc: BaseException, timeout_warns: bool = False) -> None:
        """A call failed: the request path stops using the store, and the thread tries it again at once (a single
        slow answer costs that one read; a store that still does not answer, a warning)."""
        with self._wake:
            was_up, self._up = self._up, False
            self.writes_dropped += len(self._pending) + len(self._file_ops)
            self._pending, self._file_ops = {}, {}
            self._retry_at = self.monotonic()
            self._wake.notify_all()
        if was_up and (timeout_warns or not isinstance(exc, self._timeouts)):
            self._warn(exc)

    def _warn(self, exc: BaseException) -> None:
        with self._wake:
            if self._warned or self._closed:
                return
            self._warned = True
            self.outages += 1
        log.warning(
            "trimflow: shared state %s not answering (%s); each instance keeps its own memory until it does (docs/deployment.md#the-shared-store)",
            where(self.url),
            _reason(exc),
        )


def _reason(exc: BaseException) -> str:
    """The error's class, and the system's words for a socket's: never the store's own text (a hostile store's
    answer could carry anything)."""
    cause = exc.__cause__ or exc.__context__
    strerror = getattr(exc, "strerror", None) or getattr(cause, "strerror", None)
    return f"{type(exc).__name__}: {strerror}" if isinstance(strerror, str) else type(exc).__name__


class LearnedInStore:
    """The learned limits of instances sharing the store (trimflow._learned_limits.LearnedBackend), in place of the
    learned-limits file: one key, a JSON text of the file's entries, and a counter of its writes that a reader looks
    at each round (CHECK_INTERVAL) before reading the entries again. A write merges what this instance learned into
    what the store holds in one optimistic transaction (WATCH), so no instance's limit is lost to another's write.
    Used from the learned limits' worker thread only: every call within WRITE_DEADLINE, never on the request path.
    Entries read back are checked as the file's are (the YAML reader on a text that is JSON, so no YAML alias);
    text that is not entries is never written over, and costs one warning."""

    def __init__(self, url: str, password: str | None = None, ttl: float | None = DEFAULT_TTL) -> None:
        import redis

        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._watch_error: type[BaseException] = redis.WatchError
        self.url = checked_url(url)
        self.lifetime = int(ttl) + 1 if ttl is not None else (30 * 24 * 3600)  # a key's: past its newest entry's
        self._client = client(url, password, WRITE_DEADLINE)
        self._version: bytes | None = None
        self._read_before = False
        self._problem: str | None = None
        self._said: set[str] = set()

    def writable(self) -> bool:
        return self._problem is None

    def read_if_changed(self) -> dict[Key, Entry] | None:
        try:
            version = self._client.get(LEARNED_VERSION)
            if self._read_before and version == self._version:
                return None
            raw = self._client.getrange(LEARNED, 0, MAX_LEARNED_BYTES)
        except self._errors as exc:
            self._say(f"trimflow: learned limits in shared state {where(self.url)} not read ({_reason(exc)}); each instance keeps its own")
            return None
        entries = self._parsed(raw)
        self._version = version
        if entries is None:
            self._read_before = True
            return None
        if self._problem is not None:
            log.info("trimflow: learned limits in shared state %s readable again", where(self.url))
        elif self._read_before:
            log.info("trimflow: learned limits reloaded from shared state %s (%d)", where(self.url), len(entries))
        self._problem = None
        self._read_before = True
        self._said.clear()
        return entries

    def merge_and_write(self, pending: Mapping[Key, Entry], expired: Callable[[Entry], bool]) -> dict[Key, Entry] | None:
        try:
            for _ in range(WRITE_TRIES):
                with self._client.pipeline(transaction=True) as pipe:
                    try:
                        pipe.watch(LEARNED)
                        held = self._parsed(pipe.getrange(LEARNED, 0, MAX_LEARNED_BYTES))
                        if held is None:
                            return None
                        kept = bounded(e for e in merged(held, pending).values() if not expired(e))
                        pipe.multi()
                        pipe.set(LEARNED, learned_text(kept.values()).encode(), ex=self.lifetime)
                        pipe.incr(LEARNED_VERSION)
                        pipe.expire(LEARNED_VERSION, self.lifetime)
                        results = pipe.execute()
                    except self._watch_error:
                        continue  # another instance wrote between: merge into what it wrote
                self._version = str(results[1]).encode()
                self._said.clear()
                return kept
        except self._errors as exc:
            self._say(f"trimflow: learned limits not written to shared state {where(self.url)} ({_reason(exc)}); kept in memory for now")
        return None

    def _parsed(self, raw: object) -> dict[Key, Entry] | None:
        """The entries of a value read back ({} for none), or None where it is not what trimflow writes."""
        if raw is None or raw == b"":
            return {}
        reason = None
        if not isinstance(raw, bytes) or len(raw) > MAX_LEARNED_BYTES:
            reason = "longer than trimflow writes"
        else:
            try:
                orjson.loads(raw)  # JSON, so the YAML reader meets no alias
                entries, warnings = parse_learned(raw.decode(), "shared state")
            except (orjson.JSONDecodeError, UnicodeDecodeError, RulesError):
                reason = "not learned limits"
            else:
                for warning in warnings:
                    self._say(f"trimflow: {warning}")
                return {e.key: e for e in entries}
        self._problem = reason
        self._say(f"trimflow: learned limits in shared state {where(self.url)} {reason}: left as they are, what is learned is kept in memory")
        return None

    def _say(self, line: str) -> None:
        """Log `line` once until a write succeeds (a store that stays down is one line, not one a second)."""
        if line not in self._said:
            self._said.add(line)
            log.warning("%s", line)
