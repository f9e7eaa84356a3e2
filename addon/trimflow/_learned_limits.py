"""Learned limits: what providers' answers said their limits are, kept so that later requests are within them
before they are sent.

Each entry holds the upstream it was learned from (scheme, host and port of the server trimflow connected
to: `upstream_key`), a model (none: every model there), a Limits field, its value, where the number came
from and when. `tighten` applies the entries for a request on top of the limits its rule gives: a learned
limit only ever tightens a rule, never goes under a floor (`FLOORS`: the newest image is always sent), and
lapses after a time to live.

The entries live in memory; a YAML file a person can read, edit and delete (or none) keeps them across
restarts and shares them between processes. All file work happens in one worker thread, never in the
caller's: it looks at the file about once a second and reloads it when it changed, and writes what this
process learned merged into what is on disk, replacing the file in one rename, under an exclusive lock that
it only ever tries to take (another process holding it delays the write, never a request). A file that
cannot be read or parsed is never written over; a symbolic link is followed, so a shared file stays
shared. Pure Python, no mitmproxy.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import logging
import os
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import orjson
import yaml
from yaml.nodes import Node

from ._limits import Limits
from ._record import utc_timestamp
from ._yaml import NodeReader, read_text
from .errors import RulesError

try:
    import fcntl
except ImportError:  # Windows: one process per file
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("trimflow")

FILE_NAME = "trimflow-learned.yaml"  # in mitmproxy's confdir, by default
CHECK_INTERVAL = 1.0  # seconds between two looks at the file: what another process learned applies here within it
DEFAULT_TTL = 7 * 24 * 3600.0  # a limit is learned again after a week: providers raise limits, and a wrong entry heals
MAX_PER_UPSTREAM = 64  # entries kept for one upstream: its models times the fields they taught
MAX_ENTRIES = 1024  # entries kept in all
LOCK_PATIENCE = 2.0  # seconds the writer tries for the file's lock before it leaves the write for its next round
# The Limits fields an answer can teach, and the least each may be taught. Each floor is far under any limit a provider
# documents, so a lower figure is a misread or a hostile answer ("Max is 0", an echoed file name, a gateway's outage),
# and applying it would wreck every later request to the upstream:
# - one image: the newest is never dropped (keep_recent >= 1 too);
# - 64 KiB of body holds a system prompt, a few turns and one small screenshot; the smallest body limit seen in the
#   wild is 1 MiB (Gemini CLI's backend);
# - 64 KiB of base64 is 48 KiB of image, a legible 1000 px JPEG screenshot; the smallest per-image limit documented
#   is 4 MB (Gemini inline data), and the shrink ladder turns anything smaller into mush;
# - 256 px is the smallest side on which a screenshot's text still reads; providers' side limits start at 1120 px
#   (Llama 3.2 vision on Bedrock).
FLOORS: Mapping[str, int] = {
    "max_images": 1,
    "keep_recent": 1,
    "max_body_bytes": 64 * 1024,
    "max_image_bytes": 64 * 1024,
    "max_image_side": 256,
    "many_images_max_side": 256,
    "many_images_threshold": 0,
}
_HEADER = """\
# Limits trimflow learned from providers' answers (docs/recovery.md). Each applies to later requests to
# its upstream (and model; none: every model), on top of the rules, and only ever tightens them, until it
# expires. Edit or delete entries freely: trimflow reloads this file within a second; `python -m trimflow
# learned` lists and forgets them. `source` says which answer named the limit; `learned` is when (UTC).
"""
_ENTRY_KEYS = ("upstream", "model", "limit", "value", "source", "learned")
_LEGACY_KEYS = ("host",)  # entries keyed by the Host header alone: any client could name any host


def upstream_key(scheme: str, host: str, port: int) -> str:
    """The upstream a limit is learned from and applied to: "https://api.openai.com:443"."""
    host = host.lower().strip("[]")
    return f"{scheme.lower()}://{f'[{host}]' if ':' in host else host}:{port}"


Key = tuple[str, str | None, str]  # an entry's upstream, model (lower case; None: every model) and limit


@dataclass(frozen=True, slots=True)
class Entry:
    upstream: str
    model: str | None  # None: every model at the upstream
    limit: str  # a Limits field
    value: int
    source: str = ""
    learned: str = ""  # when, UTC ISO 8601
    learned_at: float = field(default=0.0, compare=False, repr=False)  # `learned` in seconds since the epoch; 0: unreadable, old

    def __post_init__(self) -> None:
        object.__setattr__(self, "learned_at", _epoch(self.learned))

    @property
    def key(self) -> Key:
        return (self.upstream, self.model.lower() if self.model is not None else None, self.limit)

    def to_yaml(self) -> dict[str, object]:
        return {
            "upstream": self.upstream,
            "model": self.model,
            "limit": self.limit,
            "value": self.value,
            "source": self.source,
            "learned": self.learned,
        }


def _epoch(iso: str) -> float:
    try:
        when = datetime.datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


def tighter(old: Entry | None, new: Entry) -> bool:
    return old is None or new.value < old.value


def merged(base: Mapping[Key, Entry], newer: Mapping[Key, Entry]) -> dict[Key, Entry]:
    """`base` with each entry of `newer` that is tighter than base's for its key."""
    out = dict(base)
    for key, entry in newer.items():
        if tighter(out.get(key), entry):
            out[key] = entry
    return out


def bounded(entries: Iterable[Entry], per_upstream: int = MAX_PER_UPSTREAM, total: int = MAX_ENTRIES) -> dict[Key, Entry]:
    """`entries` cut to the bounds, the oldest going first: each upstream keeps at most `per_upstream`, and while
    there are more than `total`, the upstream with the most entries loses its oldest, so that one upstream's
    flood of model names never pushes another's entries out."""
    groups: dict[str, list[Entry]] = {}
    for entry in sorted(entries, key=lambda e: e.learned_at, reverse=True):
        group = groups.setdefault(entry.upstream, [])
        if len(group) < per_upstream:
            group.append(entry)
    count = sum(len(g) for g in groups.values())
    while count > total:
        largest = max(groups.values(), key=len)
        largest.pop()  # newest first: the last is the oldest
        count -= 1
    return {e.key: e for group in groups.values() for e in group}


class LearnedBackend(Protocol):
    """Where learned limits are kept and shared, used from the worker thread only: a file (LearnedFile) or the shared
    store of many hosts (trimflow._state_store.LearnedInStore)."""

    def writable(self) -> bool: ...

    def read_if_changed(self) -> dict[Key, Entry] | None: ...

    def merge_and_write(self, pending: Mapping[Key, Entry], expired: Callable[[Entry], bool]) -> dict[Key, Entry] | None: ...


class LearnedLimits:
    """The learned limits of one file (`path`) or store (`store`), or in memory only (neither). Safe to use from any
    thread; with a file or store, `start` starts the worker thread that reads and writes it, and `close` stops it."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        ttl: float | None = DEFAULT_TTL,
        check_interval: float = CHECK_INTERVAL,
        clock: Callable[[], float] = time.time,
        store: LearnedBackend | None = None,
    ) -> None:
        self.path = Path(path) if path else None
        self.ttl = ttl
        self.check_interval = check_interval
        self.clock = clock
        self._lock = threading.Lock()  # held for dict work only, never across file work
        self._entries: dict[Key, Entry] = {}
        self._pending: dict[Key, Entry] = {}  # learned here, not yet in the file
        self._index: dict[str, tuple[Entry, ...]] = {}  # replaced whole: a reader needs no lock
        self._file: LearnedBackend | None = store if store is not None else LearnedFile(self.path) if self.path is not None else None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._loaded = threading.Event()
        self._thread: threading.Thread | None = None
        if self._file is None:
            self._loaded.set()

    # -- lifecycle

    def start(self, wait: float = 2.0) -> bool:
        """Start the worker thread, which reads the file at once; wait up to `wait` seconds for that first read.
        Returns whether it was read in that time (a file on a hung mount is read when it answers)."""
        if self._file is None or self._thread is not None:
            return True
        self._thread = threading.Thread(target=self._run, name="trimflow-learned", daemon=True)
        self._thread.start()
        return self._loaded.wait(wait)

    def close(self, wait: float = LOCK_PATIENCE + 1.0) -> None:
        """Write what is still pending (one try) and stop the worker thread."""
        if self._thread is None:
            return
        self._stop.set()
        self._wake.set()
        self._thread.join(wait)
        self._thread = None

    def sync(self) -> None:
        """One round of the worker's file work, in the caller's thread: for tests and the command line."""
        if self._file is not None:
            self._round()

    # -- reading

    @property
    def entries(self) -> tuple[Entry, ...]:
        """Every entry held now, expired ones included."""
        with self._lock:
            return tuple(self._entries.values())

    def live(self) -> tuple[Entry, ...]:
        """The entries that apply now."""
        now = self.clock()
        return tuple(e for e in self.entries if not self.expired(e, now))

    def expired(self, entry: Entry, now: float | None = None) -> bool:
        return self.ttl is not None and entry.learned_at + self.ttl <= (self.clock() if now is None else now)

    def tighten(self, upstream: str, model: str | None, limits: Limits) -> Limits:
        """`limits` with the entries for this upstream and model applied, each only where it is tighter."""
        fields: dict[str, Any] = dict(self.applied(upstream, model, limits))
        if not fields:
            return limits
        if fields.get("many_images_max_side") is not None and limits.many_images_threshold is None and "many_images_threshold" not in fields:
            fields["many_images_threshold"] = 0  # the pair only works together
        return replace(limits, **fields)

    def applied(self, upstream: str, model: str | None, limits: Limits) -> dict[str, int]:
        """The fields the live entries would tighten in `limits` for this upstream and model, with their values."""
        entries = self._index.get(upstream)
        if not entries:
            return {}
        now = self.clock()
        wanted = model.lower() if model is not None else None
        out: dict[str, int] = {}
        for entry in entries:
            if entry.model is not None and entry.model.lower() != wanted:
                continue
            if self.expired(entry, now):
                continue
            current = out.get(entry.limit, getattr(limits, entry.limit))
            if current is None or entry.value < current:
                out[entry.limit] = entry.value
        return out

    # -- learning

    def learn(self, upstream: str, model: str | None, fields: Mapping[str, int], source: str) -> list[Entry]:
        """Keep `fields` (Limits field -> value) for `upstream` (and `model`; None: every model), each unless a live
        entry already holds it as tight or tighter. Returns the entries added or tightened. No file work here: the
        worker thread writes them. ValueError for a field that cannot be learned or a value under its floor."""
        when = utc_timestamp(self.clock())
        now = self.clock()
        new = []
        for limit, value in fields.items():
            if limit not in FLOORS:
                raise ValueError(f"{limit} is not a limit trimflow learns")
            if int(value) < FLOORS[limit]:
                raise ValueError(f"{limit}={value} is under the floor of {FLOORS[limit]}")
            new.append(Entry(upstream, model, limit, int(value), source, when))
        changed = []
        with self._lock:
            for entry in new:
                old = self._entries.get(entry.key)
                if old is not None and self.expired(old, now):
                    old = None
                if tighter(old, entry):
                    self._entries[entry.key] = self._pending[entry.key] = entry
                    changed.append(entry)
            if changed:
                self._entries = bounded(self._entries.values())
                self._reindex()
        if changed and self._file is not None:
            self._wake.set()
        return changed

    def _reindex(self) -> None:
        index: dict[str, list[Entry]] = {}
        for entry in self._entries.values():
            index.setdefault(entry.upstream, []).append(entry)
        self._index = {k: tuple(v) for k, v in index.items()}

    # -- the worker thread

    def _run(self) -> None:
        while True:
            try:
                self._round()
            except Exception as exc:  # noqa: BLE001 - the thread must outlive one bad round; requests never wait on it
                log.warning("trimflow: learned limits: internal error %s", type(exc).__name__)
            self._loaded.set()
            if self._stop.is_set():
                return
            self._wake.wait(self.check_interval)
            self._wake.clear()

    def _round(self) -> None:
        assert self._file is not None
        disk = self._file.read_if_changed()
        if disk is not None:
            self._take(disk)
        with self._lock:
            pending = dict(self._pending)
        if pending and self._file.writable():
            now = self.clock()
            written = self._file.merge_and_write(pending, lambda entry: self.expired(entry, now))
            if written is not None:
                self._take(written, written_here=pending)

    def _take(self, disk: dict[Key, Entry], written_here: Mapping[Key, Entry] | None = None) -> None:
        """What is on disk now becomes the entries, with what this process learned and has not yet written on top."""
        with self._lock:
            if written_here is not None:
                for key, entry in written_here.items():
                    if self._pending.get(key) == entry:
                        del self._pending[key]
            self._entries = bounded(merged(disk, self._pending).values())
            self._reindex()


class LearnedFile:
    """The file behind LearnedLimits, used from its worker thread only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._problem: str | None = None  # why the file is not written: it could not be read or parsed
        self._said: set[str] = set()  # problems already logged
        self._read_before = False  # a later read is a reload, and says so

    def target(self) -> Path:
        """The file a write replaces: the link's target when the path is a symbolic link (a shared file stays shared)."""
        return Path(os.path.realpath(self.path))

    def writable(self) -> bool:
        return self._problem is None

    def read_if_changed(self) -> dict[Key, Entry] | None:
        """The file's entries when it changed since the last look (an empty dict when it is gone), else None."""
        stamp = _stat(self.path)
        if stamp == self._stamp and self._read_before:
            return None
        self._stamp = stamp
        if stamp is None:
            self._problem = None
            self._read_before = True
            return {}  # deleted: a person forgot every learned limit
        try:
            entries = self.read()
        except RulesError as exc:
            self._problem = str(exc)
            self._read_before = True  # read again when it changes, not every round
            self._say(f"trimflow: {exc}; the file is left as it is and what is learned now is kept in memory only")
            return None
        if self._problem is not None:
            log.info("trimflow: learned limits file %s is readable again", self.path)
        elif self._read_before:
            log.info("trimflow: learned limits reloaded from %s (%d)", self.path, len(entries))
        self._problem = None
        self._read_before = True
        return entries

    def read(self) -> dict[Key, Entry]:
        text = _read_regular(self.path)
        reader = _LearnedReader(os.fspath(self.path))
        entries = reader.parse(text) if text.strip() else []
        for warning in reader.warnings:
            self._say(f"trimflow: {warning}")
        return {e.key: e for e in entries}

    def merge_and_write(self, pending: Mapping[Key, Entry], expired: Callable[[Entry], bool]) -> dict[Key, Entry] | None:
        """Under the file's lock: what is on disk, with `pending` merged in, expired entries dropped and the bounds
        applied, replaces the file. Returns what was written; None when the lock could not be had or the file could
        not be read or written (then nothing was changed)."""
        target = self.target()
        try:
            return self._merge_and_write_locked(target, pending, expired)
        except RulesError as exc:  # the path became something other than a regular file
            self._problem = str(exc)
            self._say(f"trimflow: {exc}; the file is left as it is and what is learned now is kept in memory only")
            return None

    def _merge_and_write_locked(self, target: Path, pending: Mapping[Key, Entry], expired: Callable[[Entry], bool]) -> dict[Key, Entry] | None:
        with locked(target) as held:
            if not held:
                self._say(f"trimflow: learned limits file {self.path} stays locked by another process; what is learned is kept in memory for now")
                return None
            try:
                disk = self.read() if _stat(self.path) is not None else {}
            except RulesError as exc:
                self._problem = str(exc)
                self._say(f"trimflow: {exc}; the file is left as it is and what is learned now is kept in memory only")
                return None
            kept = bounded(e for e in merged(disk, pending).values() if not expired(e))
            try:
                write_entries(target, kept.values())
            except OSError as exc:
                self._say(f"trimflow: cannot write learned limits to {self.path}: {exc.strerror or type(exc).__name__}; kept in memory")
                return None
            self._stamp = _stat(self.path)
            self._said.clear()  # the file is well again: a later lock or failure is a new episode, and is said
            return kept

    def _say(self, line: str) -> None:
        """Log `line` once until a write succeeds: a file that stays broken or locked is one line, not one a second."""
        if line not in self._said:
            self._said.add(line)
            log.warning("%s", line)


def ordered(entries: Iterable[Entry]) -> list[Entry]:
    """Entries as the file lists them: by upstream, model (every model first) and limit."""
    return sorted(entries, key=lambda e: (e.upstream, e.model or "", e.limit))


def write_entries(target: Path, entries: Iterable[Entry]) -> None:
    """Replace `target` (no link: the caller resolved it) with `entries`, in one rename; the mode of the file it
    replaces is kept, a new one is the owner's alone."""
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    in_order = ordered(entries)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    text = _HEADER + yaml.dump({"learned": [e.to_yaml() for e in in_order]}, Dumper=dumper, sort_keys=False, allow_unicode=True, width=1000)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        os.fchmod(fd, _mode_of(target))
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)  # a reader sees the old file or the new one, never half of one
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def locked(path: Path, patience: float = LOCK_PATIENCE) -> Iterator[bool]:
    """Tries for an exclusive lock on the file at `path` (made empty, owner-only, when missing) for up to `patience`
    seconds without ever blocking on it; yields whether it is held. The lock is on the file, which a writer
    replaces: a lock taken on a file replaced meanwhile is let go and taken on the new one. A file that cannot be
    opened for writing is not locked (the write that follows fails and says so)."""
    if fcntl is None:
        yield True
        return
    deadline = time.monotonic() + patience
    pause = 0.01
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except OSError:
            yield True
            return
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise RulesError(os.fspath(path), None, "cannot read: not a regular file")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() + pause > deadline:
                    yield False
                    return
                time.sleep(pause)  # the worker thread's own time: no request waits on it
                pause = min(pause * 2, 0.2)
                continue
            try:
                current = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                yield True
                return
        finally:
            os.close(fd)  # and with it the lock


def _read_regular(path: Path) -> str:
    """The text of the file at `path`, refused unless it is a regular file: a FIFO or a device would block the read."""
    source = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise RulesError(source, None, f"cannot read: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RulesError(source, None, "cannot read: not a regular file")
    finally:
        os.close(fd)
    return read_text(path, RulesError)


def _mode_of(path: Path) -> int:
    """The permissions a new version of the file gets: those of the one it replaces (a group sharing it keeps its
    access), else the owner's alone."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        return 0o600


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def parse_learned(text: str, source: str) -> tuple[list[Entry], list[str]]:
    """The entries of a learned-limits text and the reader's warnings; RulesError when it is not one."""
    reader = _LearnedReader(source)
    entries = reader.parse(text) if text.strip() else []
    return entries, [str(warning) for warning in reader.warnings]


def learned_text(entries: Iterable[Entry]) -> str:
    """Entries as one line of JSON (which the YAML reader takes), ordered as the file lists them."""
    return orjson.dumps({"learned": [e.to_yaml() for e in ordered(entries)]}).decode()


def load_learned(path: str | os.PathLike[str]) -> list[Entry]:
    """The entries of a learned-limits file; RulesError (file:line) when it cannot be read. An empty file has none."""
    text = _read_regular(Path(path))
    if not text.strip():
        return []
    return _LearnedReader(os.fspath(path)).parse(text)


class _LearnedReader(NodeReader[list[Entry]]):
    """Reads with libyaml's parser where PyYAML has it: a file of many entries is read in a fraction of the time."""

    error_class = RulesError
    loader_class = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    def top(self, root: Node | None) -> list[Entry]:
        if root is None or self.is_null(root):
            return []
        top = self.top_mapping(root, "the learned limits file", ("learned",), "")
        if "learned" not in top:
            return []
        entries = []
        legacy = under_floor = 0
        for node in self.sequence(top["learned"][1], "learned"):
            fields = self.mapping(node, "a learned limit")
            if "upstream" not in fields and any(k in fields for k in _LEGACY_KEYS):
                legacy += 1
                continue
            entry = self.entry(node, fields)
            if entry.value < FLOORS[entry.limit]:
                under_floor += 1
                continue
            entries.append(entry)
        if legacy:
            self.warn(
                top["learned"][1],
                f"{legacy} entries keyed by a host name alone are ignored (a client chooses its Host header): learned again by upstream",
            )
        if under_floor:
            self.warn(top["learned"][1], f"{under_floor} entries under the floors of docs/recovery.md are ignored")
        return entries

    def entry(self, node: Node, fields: Mapping[str, tuple[Node, Node]]) -> Entry:
        self.reject_unknown(fields, _ENTRY_KEYS, "a learned limit")
        for key in ("upstream", "limit", "value"):
            if key not in fields:
                raise self.error(node, f"a learned limit has no {key}: each needs upstream, limit and value")
        upstream = self.scalar(fields["upstream"][1])
        if not isinstance(upstream, str) or "://" not in upstream:
            raise self.error(fields["upstream"][1], f"upstream must be scheme://host:port, got {self.describe(fields['upstream'][1])}")
        model = self.scalar(fields["model"][1]) if "model" in fields else None
        if model is not None and not isinstance(model, str):
            raise self.error(fields["model"][1], f"model must be a model name or null (every model), got {self.describe(fields['model'][1])}")
        limit_node = fields["limit"][1]
        limit = self.scalar(limit_node)
        if limit not in FLOORS:
            raise self.error(limit_node, f"limit must be one of {', '.join(FLOORS)}, got {self.describe(limit_node)}")
        value_node = fields["value"][1]
        value = self.scalar(value_node)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.error(value_node, f"value of {limit} must be a whole number, got {self.describe(value_node)}")
        source = self.scalar(fields["source"][1]) if "source" in fields else ""
        learned = self.scalar(fields["learned"][1]) if "learned" in fields else ""
        if isinstance(learned, datetime.datetime):  # written unquoted by hand
            learned = learned.isoformat()
        return Entry(upstream.strip().lower(), model, limit, value, str(source or ""), str(learned or ""))
