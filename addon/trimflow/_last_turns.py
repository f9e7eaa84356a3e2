"""Each conversation's last turn, in one SQLite file that every trimflow process using it shares.

The cache-aware cut (trimflow._policy: `low_water`, `cache_ttl`) needs to know where a conversation's last turn
cut and when it went. Behind a round-robin balancer the instance that gets a turn did not send the one before,
so each process writes its turns here and reads the one before from here (trimflow._conversation uses whichever
of this and its own memory is newer): several instances then cut a conversation as one does.

A row is keyed by a digest of the conversation (`conversation_key`: the host, the session id if the agent names
one, and the digest of its system prompt and first message) and holds the turn's time on the wall clock, how
many of its images were cut, and its images oldest first by arrival, each as its key and CRC-32
(trimflow._history: digests, never an image's bytes or any text). The provider's prompt cache is keyed by
content too: two runs of one conversation share a row as they share its cached prefix.

What is read from the file is checked before it is used (a row that is not what this module writes is ignored),
and nothing in it can make a cut go under the rules' own floors (the newest image is always sent). Rows older
than MAX_AGE go, and past MAX_ROWS the oldest. Any error of the file (a folder it cannot make, not a database,
locked past LOCK_TIMEOUT, full disk) costs only the sharing: one log line, and this process goes on with its
own memory. Pure Python (the standard library's sqlite3), no mitmproxy.
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ._history import digest

log = logging.getLogger("trimflow")

FILE_NAME = "trimflow-conversations.sqlite3"  # in mitmproxy's confdir, by default
MAX_AGE = 2 * 24 * 3600.0  # seconds a row is kept: past every prompt cache's lifetime (OpenAI's longest is a day)
# Conversations kept in all, the least recently sent going first: as many as one process remembers
# (trimflow._conversation.DEFAULT_CAPACITY), at most 12 KiB each (MAX_IMAGES), about 1 KiB for 60 images.
MAX_ROWS = 10_000
MAX_IMAGES = 1024  # images a row keeps (the oldest go first); a line of history remembers as many (trimflow._conversation)
# Seconds a write waits for another process's write (tens of microseconds each) before it is dropped: writes run on
# the proxy's event loop, which must not stall for a busy file.
LOCK_TIMEOUT = 0.05
CLEAN_EVERY = 512  # writes between two removals of old rows
_IMAGE = struct.Struct(">8sI")  # an image's key and CRC-32
_SCHEMA = 1


class LastTurn(NamedTuple):
    """A conversation's last turn: when it went (seconds on the wall clock), how many of its images were cut (the
    first `cut` of `images`), and its images oldest first by arrival as (key, CRC-32)."""

    sent_at: float
    cut: int
    images: tuple[tuple[bytes, int], ...]


def conversation_key(host: str, session: str | None, origin: bytes) -> bytes:
    """The row of a conversation: the same in every process (unlike the history's prefix chain)."""
    return digest(b"conversation", host.encode("utf-8", "surrogatepass"), (session or "").encode(), origin, size=16)


class LastTurns:
    """The shared file (`path`; ":memory:" for one process, as the policy runner's instances share it).

    `get` and `put` are safe from any thread (one connection, under a lock) and never raise: an error of the
    file is logged once and the file is no longer used."""

    def __init__(self, path: str, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        self._lock = threading.Lock()
        self._writes = 0
        self.writes_dropped = 0  # turns another process's write kept out of the file
        self._db: sqlite3.Connection | None = None
        self._failed = False  # the file could not be used (or was closed): not tried again

    @property
    def in_use(self) -> bool:
        """Whether turns are shared through the file: it works, or has not been needed yet."""
        return not self._failed

    def get(self, key: bytes) -> LastTurn | None:
        with self._lock:
            if not self._ready():
                return None
            assert self._db is not None
            try:
                row = self._db.execute("SELECT sent_at, cut, images FROM last_turn WHERE conversation = ?", (key,)).fetchone()
            except sqlite3.Error as exc:
                if not _busy(exc):  # a read held up (WAL recovery, rare) reads nothing this once
                    self._fail(exc)
                return None
        return _checked(row, self.clock()) if row is not None else None

    def put(self, key: bytes, turn: LastTurn) -> None:
        images = turn.images[-MAX_IMAGES:]
        cut = max(0, turn.cut - (len(turn.images) - len(images)))
        packed = b"".join(_IMAGE.pack(k, crc & 0xFFFFFFFF) for k, crc in images)
        with self._lock:
            if not self._ready():
                return
            assert self._db is not None
            try:
                with self._db:
                    self._db.execute(
                        "INSERT INTO last_turn (conversation, sent_at, cut, images) VALUES (?, ?, ?, ?) "
                        "ON CONFLICT (conversation) DO UPDATE SET sent_at = excluded.sent_at, cut = excluded.cut, images = excluded.images",
                        (key, turn.sent_at, cut, packed),
                    )
                self._writes += 1
                if self._writes % CLEAN_EVERY == 0:
                    self._clean()
            except sqlite3.Error as exc:
                if _busy(exc):  # another process held the file too long: this turn is not shared, the next one is
                    self.writes_dropped += 1
                else:
                    self._fail(exc)

    def __enter__(self) -> LastTurns:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._failed = True  # closed for good
            if self._db is not None:
                self._db.close()
                self._db = None

    def _ready(self) -> bool:
        """Opened on first use (a proxy that numbers no conversation makes no file); False once it failed."""
        if self._db is None and not self._failed:
            try:
                self._db = self._open(self.path)
            except (OSError, sqlite3.Error) as exc:
                self._fail(exc)
        return self._db is not None

    def _open(self, path: str) -> sqlite3.Connection:
        if path != ":memory:":
            # Created private, in a private folder if it has none yet (mitmproxy's confdir is made so too): it tells
            # which images a conversation holds (digests), nobody else's business.
            os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        db = sqlite3.connect(path, timeout=LOCK_TIMEOUT, isolation_level=None, check_same_thread=False)
        try:
            if path != ":memory:":
                db.execute("PRAGMA journal_mode = WAL")  # readers never wait for a writer
                db.execute("PRAGMA synchronous = NORMAL")  # a lost last turn costs one cut, never the file
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, _SCHEMA):
                raise sqlite3.DatabaseError(f"schema version {version}, not {_SCHEMA}")
            with db:
                db.execute(
                    "CREATE TABLE IF NOT EXISTS last_turn (conversation BLOB PRIMARY KEY, sent_at REAL NOT NULL, "
                    "cut INTEGER NOT NULL, images BLOB NOT NULL) WITHOUT ROWID"
                )
                db.execute("CREATE INDEX IF NOT EXISTS last_turn_sent_at ON last_turn (sent_at)")
                db.execute(f"PRAGMA user_version = {_SCHEMA}")
        except BaseException:
            db.close()
            raise
        return db

    def _clean(self) -> None:
        assert self._db is not None
        with self._db:
            self._db.execute("DELETE FROM last_turn WHERE sent_at < ?", (self.clock() - MAX_AGE,))  # by the index
            # Past MAX_ROWS, down to it: the least recently sent go (the oldest time kept found by the index).
            kept_from = self._db.execute("SELECT sent_at FROM last_turn ORDER BY sent_at DESC LIMIT 1 OFFSET ?", (MAX_ROWS - 1,)).fetchone()
            if kept_from is not None:
                self._db.execute("DELETE FROM last_turn WHERE sent_at < ?", kept_from)

    def _fail(self, exc: BaseException) -> None:
        self._failed = True
        log.warning(
            "trimflow: conversations file %s not used: %s; each instance keeps its own (docs/caching.md#several-instances)",
            self.path,
            _reason(exc),
        )
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass
        self._db = None


def _checked(row: Sequence[object], now: float) -> LastTurn | None:
    """The row as a LastTurn, or None where it is not what `put` writes (a file edited or written by another program)."""
    sent_at, cut, images = row
    if not isinstance(sent_at, float | int) or isinstance(sent_at, bool) or not math.isfinite(sent_at):
        return None
    if not isinstance(images, bytes) or len(images) % _IMAGE.size or len(images) > MAX_IMAGES * _IMAGE.size:
        return None
    if not isinstance(cut, int) or not 0 <= cut <= len(images) // _IMAGE.size:
        return None
    if not now - MAX_AGE <= sent_at <= now + 1.0:  # a time to come is no last turn (clocks of one host agree)
        return None
    return LastTurn(float(sent_at), cut, tuple(_IMAGE.iter_unpack(images)))


def _busy(exc: sqlite3.Error) -> bool:
    """Another connection held the file past LOCK_TIMEOUT: a moment's wait, not a broken file."""
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


def _reason(exc: BaseException) -> str:
    """The error without a path or an SQL text: its class and SQLite's short message."""
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return str(exc).split(":", 1)[0][:120] or type(exc).__name__
