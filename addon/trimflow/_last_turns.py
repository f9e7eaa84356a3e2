"""Each conversation's last turn, in one SQLite file that every trimflow process using it shares.

The cache-aware cut (trimflow._policy: `low_water`, `cache_ttl`) needs to know where a conversation's last turn
cut and when it went. Behind a round-robin balancer the instance that gets a turn did not send the one before,
so each process writes its turns here and reads the one before from here (trimflow._conversation decides when a
row goes before its own memory): several instances then cut a conversation as one does.

A row is keyed by a digest of the conversation (`conversation_key`: the host, the session id if the agent names
one, and the digest of its system prompt and first message) and holds the turn's time on the wall clock, how
many of its images were cut, and its images oldest first by arrival, each as its key and CRC-32
(trimflow._history: digests, never an image's bytes or any text). Conversations that open alike (two runs of one
task) have one key, and up to SLOTS rows under it (`row_keys`): trimflow._conversation tells which is whose.

Whoever can write the file is not trusted. The file is used only while its schema is exactly the one this module
makes (`_OBJECTS`, checked in the snapshot each read and write runs in), SQLite runs nothing of the file's own
(no trigger, no view: `PRAGMA trusted_schema = OFF` and an authorizer that refuses them), it and its log must be
regular files, and a row is checked before it is used (one that is not what `put` writes is ignored, its values
never longer than `put` writes read into memory).

A read is answered from the rows the request path's connection read or wrote last while no other connection has
written the file since (SQLite's `data_version`): a turn then costs one statement to read, not a transaction. A turn
with no image after a row that holds none (a text conversation's) is not written again: only its time would change,
and another process reads that time only with a cut.

The proxy's event loop never waits for the file: every connection has no busy timeout. A read another process
holds up reads nothing that once; a write it holds up waits in a queue (one per conversation, the newest turn,
at most MAX_PENDING, past which a write is dropped and counted) for a thread of its own, which also removes old
rows (past MAX_AGE, and past MAX_ROWS the least recently sent) and checkpoints SQLite's log. A file held at its
opening is opened again later (RETRY_FIRST, doubling to RETRY_MAX). Any other error of the file (a folder it
cannot make, not a database, a schema it did not make, full disk) costs only the sharing: one log line, and this
process goes on with its own memory. Pure Python (the standard library's sqlite3), no mitmproxy.
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple, Protocol

from ._history import digest

log = logging.getLogger("trimflow")

FILE_NAME = "trimflow-conversations.sqlite3"  # in mitmproxy's confdir, by default
MAX_AGE = 2 * 24 * 3600.0  # seconds a row is kept: past every prompt cache's lifetime (OpenAI's longest is a day)
# Conversations kept in all, the least recently sent going first: as many as one process remembers
# (trimflow._conversation.DEFAULT_CAPACITY), at most 12 KiB each (MAX_IMAGES), about 1 KiB for 60 images.
MAX_ROWS = 10_000
MAX_IMAGES = 1024  # images a row keeps (the oldest go first); a line of history remembers as many (trimflow._conversation)
SLOTS = 4  # rows under one conversation key: conversations that open alike, each its own (the least recently sent gives way)
MAX_PENDING = 1024  # conversations whose last turn waits for a file another process holds (12 MiB at most)
RETRY_FIRST, RETRY_MAX = 0.05, 1.0  # seconds before a held file is tried again, doubling
# Writes between two checkpoints of SQLite's log, by the writing thread (one on the request path would sync the file),
# and between two removals of old rows. A checkpoint copies the log into the file beside the writers; a log past
# LOG_LIMIT (turns that never pause) is copied and emptied with the writers held off, which queue their turns meanwhile.
CHECKPOINT_EVERY = 64
CLEAN_EVERY = 256
LOG_LIMIT = 4 << 20
KNOWN_ROWS, KNOWN_BYTES = 4096, 1 << 20  # rows the request path's connection keeps as it read or wrote them, their images' bytes
CLOSE_WAIT = 1.0  # seconds `close` gives the writing thread to write what waits (it never waits for the file itself)
_MAX_VALUE = 1 << 20  # the longest text or blob SQLite reads from the file at all (a row's images: 12 KiB)
_IMAGE = struct.Struct(">8sI")  # an image's key and CRC-32
MAX_IMAGES_BYTES = MAX_IMAGES * _IMAGE.size  # the longest images a row holds
_SCHEMA = 1
_TABLE = "CREATE TABLE last_turn (conversation BLOB PRIMARY KEY, sent_at REAL NOT NULL, cut INTEGER NOT NULL, images BLOB NOT NULL) WITHOUT ROWID"
_INDEX = "CREATE INDEX last_turn_sent_at ON last_turn (sent_at)"
# The file's whole schema, as sqlite_master holds it (type, name, table, SQL): anything more or else is not ours.
_OBJECTS = frozenset({("table", "last_turn", "last_turn", _TABLE), ("index", "last_turn_sent_at", "last_turn", _INDEX)})
_KINDS = ("table", "index", "view", "trigger")
# Each value read only when it is of the type `put` writes, and the images only up to what a row may hold.
_READ = (
    "SELECT conversation, CASE WHEN typeof(sent_at) IN ('real', 'integer') THEN sent_at END, "
    "CASE WHEN typeof(cut) = 'integer' THEN cut END, CASE WHEN typeof(images) = 'blob' AND length(images) <= ? THEN images END "
    "FROM last_turn WHERE conversation IN ({})"
)
# A turn never replaces a newer one (a write that waited for the file goes after the next turn's), nor the same turn
# cut further (a retry's, trimflow._conversation's recut), unless that one is no row a reader takes: so turns may be
# written in any order.
_WRITE = (
    "INSERT INTO last_turn (conversation, sent_at, cut, images) VALUES (?, ?, ?, ?) ON CONFLICT (conversation) DO UPDATE SET "
    "sent_at = excluded.sent_at, cut = excluded.cut, images = excluded.images WHERE NOT "
    "(typeof(last_turn.sent_at) IN ('real', 'integer') AND typeof(last_turn.cut) = 'integer' AND last_turn.sent_at <= ? AND "
    "(last_turn.sent_at > excluded.sent_at OR (last_turn.sent_at = excluded.sent_at AND last_turn.cut > excluded.cut)))"
)

Row = tuple[bytes, float, int, bytes]  # a turn as written: key, time, cut, packed images


class LastTurn(NamedTuple):
    """A conversation's last turn: when it went (seconds on the wall clock), how many of its images were cut (the
    first `cut` of `images`), and its images oldest first by arrival as (key, CRC-32). A store that keeps them
    (trimflow._state_store; not the file) also holds its turn number and the conversation's id (the 4 bytes of
    trimflow._history.short_id; empty: none), so that instances number a conversation as one."""

    sent_at: float
    cut: int
    images: tuple[tuple[bytes, int], ...]
    turn: int = 0
    conversation: bytes = b""


class TurnStore(Protocol):
    """Where instances share each conversation's last turn: this module's file (`LastTurns`, one host) or a Redis or
    Valkey server (trimflow._state_store, many hosts). `get_many` and `put` are safe from any thread, never raise and
    never wait past the store's deadline; a store that cannot be used reads nothing and writes nothing."""

    writes_dropped: int
    # A server other hosts share: a read may wait on the network (up to its deadline), so a caller on an event loop
    # reads in a worker thread; and instances elsewhere read it, so a turn must be in it before its answer is back.
    across_hosts: bool

    @property
    def in_use(self) -> bool: ...

    def get_many(self, keys: Sequence[bytes]) -> list[LastTurn | None]: ...

    def put(self, key: bytes, turn: LastTurn) -> None: ...

    def close(self) -> None: ...


def pack_images(images: Sequence[tuple[bytes, int]]) -> bytes:
    """A turn's images as a row holds them: each its key and CRC-32."""
    return b"".join(_IMAGE.pack(k, crc & 0xFFFFFFFF) for k, crc in images)


def kept(turn: LastTurn) -> tuple[int, tuple[tuple[bytes, int], ...]]:
    """What a row keeps of a turn: its newest MAX_IMAGES images, and the cut among them."""
    images = turn.images[-MAX_IMAGES:]
    return max(0, turn.cut - (len(turn.images) - len(images))), images


def conversation_key(host: str, session: str | None, origin: bytes) -> bytes:
    """The row of a conversation: the same in every process (unlike the history's prefix chain)."""
    return digest(b"conversation", host.encode("utf-8", "surrogatepass"), (session or "").encode(), origin, size=16)


def row_keys(key: bytes) -> tuple[bytes, ...]:
    """The rows of the conversations with this key (conversation_key), the first the key itself."""
    return (key, *(digest(b"row", key, bytes([slot]), size=16) for slot in range(1, SLOTS)))


class Refused(Exception):
    """A file trimflow does not use (its reason names no row, path or SQL of it)."""


class _Link:
    """One connection to the file, with its lock, the schema version it checked, when to open it again, and the rows
    it read or wrote last (`known`, as `_read` gives them) while no other connection wrote (`version`: the file's
    data_version then)."""

    __slots__ = ("lock", "db", "checked", "retry_at", "delay", "known", "known_bytes", "version")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.db: sqlite3.Connection | None = None
        self.checked: int | None = None  # the schema version (PRAGMA schema_version) found to be exactly ours
        self.retry_at = 0.0  # monotonic seconds before which a held file is not opened again
        self.delay = RETRY_FIRST
        self.known: dict[bytes, Sequence[object] | None] = {}  # oldest first
        self.known_bytes = 0
        self.version: int | None = None

    def forget(self) -> None:
        self.known.clear()
        self.known_bytes, self.version = 0, None

    def learn(self, key: bytes, row: Sequence[object] | None) -> None:
        """`row` is what the file holds for `key` (None: no row), within KNOWN_BYTES of images over all keys."""
        old = self.known.pop(key, None)
        self.known_bytes -= _row_bytes(old)
        self.known[key] = row
        self.known_bytes += _row_bytes(row)
        while self.known_bytes > KNOWN_BYTES or len(self.known) > KNOWN_ROWS:
            self.known_bytes -= _row_bytes(self.known.pop(next(iter(self.known))))


_UNKNOWN: Sequence[object] = ()


def _holds_nothing(row: Sequence[object] | None) -> bool:
    """Whether a row as `_read` gives it holds no image and no cut (False for no row, or one not known)."""
    return row is not None and len(row) == 3 and row[1] == 0 and row[2] == b""


def _row_bytes(row: Sequence[object] | None) -> int:
    images = row[2] if row is not None else None
    return len(images) if isinstance(images, bytes) else 0


class LastTurns:
    """The shared file (`path`; ":memory:" for one process, as the policy runner's instances share it).

    `get` and `put` are safe from any thread, never wait for the file and never raise: a read it holds up finds
    nothing, a write waits in the writing thread's queue, and any other error of the file is logged once and the file
    is no longer used. `close` writes what waits, if the file lets it at once."""

    # A read is a lookup in a file on this host, in microseconds, that never waits for another process (no busy
    # timeout: a file held up reads nothing): it stays on the event loop, where a worker thread would cost more than it.
    across_hosts = False

    def __init__(self, path: str, clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.clock = clock
        self.monotonic = monotonic
        self.writes_dropped = 0  # turns never written: the queue was full, or still waited when the file was closed
        self._front = _Link()  # reads and writes on the request path
        # The writing thread's own, so that the request path never waits for it; in memory there is one database
        # per connection, and no other process.
        self._back = self._front if path == ":memory:" else _Link()
        self._wake = threading.Condition()  # guards what follows
        self._pending: dict[bytes, Row] = {}  # turns waiting for the file, by conversation
        # Those the writing thread has taken from `_pending` and is writing: still waiting (they go back if the file is
        # held), so they count toward MAX_PENDING and a newer turn of one of them takes no more room.
        self._in_flight: dict[bytes, Row] = {}
        self._retry_at = 0.0  # monotonic seconds before which the writing thread does not try the file again
        self._retry_delay = RETRY_FIRST
        self._written = 0  # rows written since the last checkpoint
        self._uncleaned = 0  # and since the last removal of old rows
        self._writer: threading.Thread | None = None
        self._failed = False  # the file could not be used: not tried again
        self._closed = False

    @property
    def in_use(self) -> bool:
        """Whether turns are shared through the file: it is open and works, is held by another process for now, or has
        not been needed yet."""
        return not self._failed and not self._closed

    def get(self, key: bytes) -> LastTurn | None:
        return self.get_many((key,))[0]

    def get_many(self, keys: Sequence[bytes]) -> list[LastTurn | None]:
        """The rows of these keys, read in one snapshot (None: no row, or not one `put` writes)."""
        rows: list[Sequence[object] | None] = [None] * len(keys)
        link = self._front
        with link.lock:
            db = self._ready(link) if not self._closed else None
            if db is None:
                return [None] * len(keys)
            try:
                if self._unchanged(link) and all(key in link.known for key in keys):
                    rows = [link.known[key] for key in keys]
                else:
                    with _transaction(db, "BEGIN"):
                        if self._ours(link):
                            rows = self._read(db, keys)
                    for key, row in zip(keys, rows, strict=True):
                        link.learn(key, row)
            except (sqlite3.Error, Refused) as exc:
                if not _busy(exc):  # a read held up (the whole file locked, WAL recovery) reads nothing this once
                    self._fail(link, exc)
                return [None] * len(keys)
        now = self.clock()
        return [checked(row, now) if row is not None else None for row in rows]

    @staticmethod
    def _read(db: sqlite3.Connection, keys: Sequence[bytes]) -> list[Sequence[object] | None]:
        """The rows of these keys in one statement, or each in its own where one holds a value too long to read
        (_MAX_VALUE): that row is not what `put` writes, and the others are read."""
        limit = MAX_IMAGES_BYTES
        try:
            found = {row[0]: row[1:] for row in db.execute(_READ.format(", ".join("?" * len(keys))), (limit, *keys))}
        except sqlite3.DataError as exc:
            if not _too_long(exc):
                raise
            return [None] if len(keys) == 1 else [LastTurns._read(db, [key])[0] for key in keys]
        return [found.get(key) for key in keys]

    @staticmethod
    def _unchanged(link: _Link) -> bool:
        """Whether no other connection wrote the file since the link's rows were known; else they are forgotten."""
        assert link.db is not None
        version = link.db.execute("PRAGMA data_version").fetchone()[0]
        if version == link.version:
            return True
        link.forget()
        link.version = version
        return False

    def _written_already(self, link: _Link, key: bytes) -> bool:
        """Whether the file holds a row for `key` with no image and no cut, and no turn of it waits to be written."""
        with self._wake:
            waiting = key in self._pending or key in self._in_flight
        return not waiting and _holds_nothing(link.known.get(key, _UNKNOWN)) and self._unchanged(link)

    def put(self, key: bytes, turn: LastTurn) -> None:
        """Writes the turn now if the file lets it at once, else queues it for the writing thread."""
        if not self.in_use:
            return
        cut, images = kept(turn)
        row = (key, turn.sent_at, cut, pack_images(images))
        link = self._front
        with link.lock:
            if self._closed:
                return
            db = self._ready(link)
            if db is not None:
                try:
                    if not images and not cut and self._written_already(link, key):
                        # A text conversation's turn after one the file holds: a row with no image and no cut tells
                        # another process nothing new (its time is read only with a cut), and is not written again.
                        return
                    written = self._write(link, [row])
                except (sqlite3.Error, Refused) as exc:
                    if not _busy(exc):
                        self._fail(link, exc)
                        return
                else:
                    self._wrote([row], written)
                    return
        self._defer([row])

    def __enter__(self) -> LastTurns:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify_all()
            writer = self._writer
        if writer is not None:
            writer.join(CLOSE_WAIT)
        for link in {id(self._front): self._front, id(self._back): self._back}.values():
            with link.lock:
                _close(link)

    # --- the connections ------------------------------------------------------------------------------------------

    def _ready(self, link: _Link) -> sqlite3.Connection | None:
        """The link's connection, opened on first use (a proxy that numbers no conversation makes no file) and, after a
        file held at its opening, again once its delay is over; None while it is held, or once it failed."""
        if self._failed:
            _close(link)
            return None
        if link.db is None and self.monotonic() >= link.retry_at:
            try:
                link.db = _connect(self.path)
            except (OSError, sqlite3.Error, Refused) as exc:
                if not _busy(exc):
                    self._fail(link, exc)
                    return None
                link.retry_at = self.monotonic() + link.delay
                link.delay = min(2 * link.delay, RETRY_MAX)
            else:
                link.checked, link.delay = None, RETRY_FIRST
        return link.db

    def _ours(self, link: _Link) -> bool:
        """Whether the file holds trimflow's table (False: an empty file, none made yet); raises Refused for a file with
        anything else. Run inside a transaction: what it checks is what the statements after it see."""
        assert link.db is not None
        version = link.db.execute("PRAGMA schema_version").fetchone()[0]
        if version == link.checked:
            return True
        objects = set(link.db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))
        user_version = link.db.execute("PRAGMA user_version").fetchone()[0]
        if not objects and user_version == 0:
            return False
        if user_version != _SCHEMA:
            raise Refused(f"schema version {user_version}, not {_SCHEMA}")
        if objects != _OBJECTS:
            kinds = sorted({kind if kind in _KINDS else "other" for kind, *_ in objects - _OBJECTS} or {"a changed table or index"})
            raise Refused(f"schema objects trimflow did not make ({', '.join(kinds)})")
        link.checked = version
        return True

    def _write(self, link: _Link, rows: Sequence[Row]) -> int:
        """Writes the rows in one transaction; returns how many of them went (a conversation whose row holds a value
        too long to read, _MAX_VALUE, cannot be written over)."""
        db = link.db
        assert db is not None
        until = self.clock() + 1.0  # a newer row past this is no time a reader takes (see checked)
        written = 0
        changed: list[Row] = []  # the rows the file now holds as written (a newer turn there is left as it is)
        with _transaction(db, "BEGIN IMMEDIATE"):
            if not self._ours(link):
                db.execute(_TABLE)
                db.execute(_INDEX)
                db.execute(f"PRAGMA user_version = {_SCHEMA}")
            for row in rows:
                before = db.total_changes
                try:
                    db.execute(_WRITE, (*row, until))
                except sqlite3.DataError as exc:
                    if not _too_long(exc):
                        raise
                else:
                    written += 1
                    if db.total_changes != before:
                        changed.append(row)
        if link is self._front:
            for row in changed:
                link.learn(row[0], row[1:])
        return written

    def _fail(self, link: _Link, exc: BaseException) -> None:
        _close(link)
        with self._wake:
            if self._failed or self._closed:
                return
            self._failed = True
            self._wake.notify_all()
        log.warning(
            "trimflow: conversations file %s not used: %s; each instance keeps its own (docs/caching.md#several-instances)",
            self.path,
            _reason(exc),
        )

    # --- the writing thread ---------------------------------------------------------------------------------------

    def _wrote(self, rows: Sequence[Row], written: int) -> None:
        with self._wake:
            for row in rows:
                waiting = self._pending.get(row[0])
                if waiting is not None and not _newer(waiting, row):
                    del self._pending[row[0]]
            self._count(written, len(rows) - written)
            if self._upkeep_due():
                self._start()

    def _defer(self, rows: Sequence[Row]) -> None:
        """Queues rows the file would not take at once: the newest turn of each conversation, at most MAX_PENDING."""
        with self._wake:
            if self._failed or self._closed:
                return
            for row in rows:
                waiting = self._pending.get(row[0])
                if waiting is not None:
                    if not _newer(waiting, row):
                        self._pending[row[0]] = row
                elif row[0] in self._in_flight or self._waiting() < MAX_PENDING:
                    self._pending[row[0]] = row
                else:
                    self.writes_dropped += 1
            self._start()

    def _waiting(self) -> int:
        """Conversations whose turn waits for the file, in the queue or being written (under `_wake`)."""
        return len(self._pending) + sum(1 for key in self._in_flight if key not in self._pending)

    def _start(self) -> None:
        """Wakes the writing thread, started on first need (under `_wake`)."""
        if self._writer is None:
            self._writer = threading.Thread(target=self._run, name="trimflow-conversations", daemon=True)
            self._writer.start()
        self._wake.notify_all()

    def _run(self) -> None:
        link = self._back
        while True:
            with self._wake:
                while not self._stopping() and not self._due():
                    work = self._pending or self._upkeep_due()
                    self._wake.wait(max(0.0, self._retry_at - self.monotonic()) if work else None)
                closing = self._stopping()
                rows = list(self._pending.values())
                self._in_flight, self._pending = self._pending, {}
                upkeep = self._upkeep_due() and not closing
                clean = upkeep and self._uncleaned >= CLEAN_EVERY
                if upkeep:
                    self._written = 0
                    if clean:
                        self._uncleaned = 0
            with link.lock:
                if rows and not self._failed:
                    self._write_waiting(link, rows, closing)
                if upkeep:
                    self._maintain(link, clean)
                if closing:
                    _close(link)
            with self._wake:
                self._in_flight = {}
            if closing:
                return

    def _stopping(self) -> bool:
        return self._closed or self._failed

    def _due(self) -> bool:
        return (bool(self._pending) or self._upkeep_due()) and self.monotonic() >= self._retry_at

    def _upkeep_due(self) -> bool:
        return self._written >= CHECKPOINT_EVERY or self._uncleaned >= CLEAN_EVERY

    def _write_waiting(self, link: _Link, rows: list[Row], closing: bool) -> None:
        oldest = self.clock() - MAX_AGE
        fresh = [row for row in rows if row[1] >= oldest]  # a turn past its age is no last turn
        db = self._ready(link) if fresh else None
        if db is not None or not fresh:
            try:
                written = self._write(link, fresh) if fresh else 0
            except (sqlite3.Error, Refused) as exc:
                if not _busy(exc):
                    self._fail(link, exc)
                    return
            else:
                with self._wake:
                    self._count(written, len(rows) - written)
                    self._retry_delay = RETRY_FIRST
                return
        with self._wake:
            if closing:
                self.writes_dropped += len(rows) + len(self._pending)
                self._pending = {}
                return
            self.writes_dropped += len(rows) - len(fresh)
            for row in fresh:  # back in the queue, unless a newer turn of the conversation came meanwhile
                waiting = self._pending.get(row[0])
                if waiting is None or _newer(row, waiting):
                    self._pending[row[0]] = row
            self._later(link)

    def _maintain(self, link: _Link, clean: bool) -> None:
        """SQLite's log checkpointed and emptied, and with `clean` old rows out (past MAX_AGE, and past MAX_ROWS the least
        recently sent). A file held now is tried again after a delay."""
        db = self._ready(link)
        try:
            if db is None:
                raise sqlite3.OperationalError("database is locked")  # held at its opening
            if clean:
                with _transaction(db, "BEGIN IMMEDIATE"):
                    if self._ours(link):
                        now = self.clock()
                        # By the index, over times only (a text or blob sorts after every number: never read).
                        db.execute("DELETE FROM last_turn WHERE sent_at < ?", (now - MAX_AGE,))
                        # Past MAX_ROWS, down to it: the least recently sent go (the oldest time kept found by the index).
                        kept_from = db.execute(
                            "SELECT sent_at FROM last_turn WHERE sent_at <= ? ORDER BY sent_at DESC LIMIT 1 OFFSET ?",
                            (now + 1.0, MAX_ROWS - 1),
                        ).fetchone()
                        if kept_from is not None:
                            db.execute("DELETE FROM last_turn WHERE sent_at < ?", kept_from)
            if self.path != ":memory:":
                db.execute(f"PRAGMA wal_checkpoint({'TRUNCATE' if _size(self.path + '-wal') > LOG_LIMIT else 'PASSIVE'})").fetchall()
        except (sqlite3.Error, Refused) as exc:
            if _busy(exc):
                with self._wake:
                    self._written += CHECKPOINT_EVERY  # due again, after a delay
                    self._uncleaned += CLEAN_EVERY if clean else 0
                    self._later(link)
            elif not _too_long(exc):
                self._fail(link, exc)

    def _count(self, written: int, dropped: int) -> None:
        """Rows written and dropped (under `_wake`)."""
        self._written += written
        self._uncleaned += written
        self.writes_dropped += dropped

    def _later(self, link: _Link) -> None:
        """The file was held: the writing thread tries it again after a delay (under `_wake`)."""
        self._retry_at = max(self.monotonic() + self._retry_delay, link.retry_at)
        self._retry_delay = min(2 * self._retry_delay, RETRY_MAX)


def _newer(row: Row, other: Row) -> bool:
    """Whether `row` is a later turn of the conversation than `other`, or the same turn cut further (as _WRITE)."""
    return (row[1], row[2]) > (other[1], other[2])


def _connect(path: str) -> sqlite3.Connection:
    if path != ":memory:":
        _regular(path)
    db = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
    try:
        db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE)
        db.set_authorizer(_authorize)
        db.execute("PRAGMA trusted_schema = OFF")  # belt and braces: _ours refuses a file with anything of its own
        if path != ":memory:":
            db.execute("PRAGMA journal_mode = WAL")  # readers never wait for a writer
            db.execute("PRAGMA synchronous = NORMAL")  # a lost last turn costs one cut, never the file
            db.execute("PRAGMA wal_autocheckpoint = 0")  # the writing thread checkpoints (LastTurns._maintain)
            db.execute(f"PRAGMA journal_size_limit = {LOG_LIMIT}")
    except BaseException:
        db.close()
        raise
    return db


def _regular(path: str) -> None:
    """Makes the file if it is missing: private, in a private folder if it has none yet (mitmproxy's confdir is made
    so too), as it tells which images a conversation holds (digests), nobody else's business. Refuses a file, log or
    shared-memory file that is not a regular file (a FIFO, a device).

    An existing file is only looked at, never opened here: closing a descriptor of it would drop every POSIX lock
    this process holds on it, those of the connections open already included."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NONBLOCK, 0o600))
    except FileExistsError:
        pass
    for suffix in ("", "-wal", "-shm"):
        try:
            found = os.stat(path + suffix)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(found.st_mode):
            raise Refused(f"its {suffix[1:]} file is not a regular file" if suffix else "not a regular file")


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _authorize(action: int, arg1: str | None, arg2: str | None, database: str | None, source: str | None) -> int:
    """Nothing runs on behalf of a trigger or a view: the file's schema is checked to hold none, and this keeps one
    planted after the check from running at all."""
    return sqlite3.SQLITE_DENY if source is not None else sqlite3.SQLITE_OK


@contextmanager
def _transaction(db: sqlite3.Connection, begin: str) -> Iterator[None]:
    """A transaction that never outlives an error (one left open would hold the file)."""
    db.execute(begin)
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        raise


def _close(link: _Link) -> None:
    if link.db is not None:
        try:
            link.db.close()
        except sqlite3.Error:
            pass
        link.db = None
        link.checked = None
    link.forget()


def checked(row: Sequence[object], now: float) -> LastTurn | None:
    """The row (time, cut, packed images) as a LastTurn, or None where it is not what `put` writes (a file or store
    edited or written by another program)."""
    sent_at, cut, images = row
    if not isinstance(sent_at, float | int) or isinstance(sent_at, bool) or not math.isfinite(sent_at):
        return None
    if not isinstance(images, bytes) or len(images) % _IMAGE.size or len(images) > MAX_IMAGES_BYTES:
        return None
    if not isinstance(cut, int) or not 0 <= cut <= len(images) // _IMAGE.size:
        return None
    if not now - MAX_AGE <= sent_at <= now + 1.0:  # a time to come is no last turn (clocks of one host agree)
        return None
    return LastTurn(float(sent_at), cut, tuple(_IMAGE.iter_unpack(images)))


def _busy(exc: BaseException) -> bool:
    """Another connection holds the file: a moment, not a broken file."""
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


def _too_long(exc: BaseException) -> bool:
    """A value of the file longer than _MAX_VALUE: its row is not what `put` writes, and is never read."""
    return getattr(exc, "sqlite_errorname", None) == "SQLITE_TOOBIG"


def _reason(exc: BaseException) -> str:
    """The error without a path or an SQL text: its class and SQLite's short message."""
    if isinstance(exc, Refused):
        return str(exc)
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return str(exc).split(":", 1)[0][:120] or type(exc).__name__
