"""Learned limits: what providers' answers said their limits are, kept so that later requests are within them
before they are sent.

A YAML file a person can read, edit and delete (or none: in memory only). Each entry holds a host, a model
(none: every model at that host), a Limits field, its value, the answer's text that named it and when.
`tighten` applies the entries for a request on top of the limits its rule gives: a learned limit only ever
tightens, never loosens a rule. The file is reloaded when it changes on disk (checked at most once a
second), and `learn` merges into what is on disk at that moment and replaces the file in one rename, under an
exclusive lock on the file (flock), so trimflow processes sharing it, on one machine or on shared storage
behind a balancer, keep each other's entries and see them within a second. Pure Python, no mitmproxy.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import Node

from ._policy import Limits
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
# The Limits fields an answer can teach, and the smallest value each may take.
LEARNABLE: Mapping[str, int] = {
    "max_images": 0,
    "max_body_bytes": 0,
    "max_image_bytes": 1024,
    "max_image_side": 16,
    "many_images_threshold": 0,
    "many_images_max_side": 16,
    "keep_recent": 0,
}
_HEADER = """\
# Limits trimflow learned from providers' answers (docs/recovery.md). Each applies to later requests to
# its host (and model; none: every model), on top of the rules, and only ever tightens them. Edit or
# delete entries freely: trimflow reloads this file within a second. `source` is the answer's text
# that named the limit; `learned` is when (UTC).
"""
_ENTRY_KEYS = ("host", "model", "limit", "value", "source", "learned")


@dataclass(frozen=True, slots=True)
class Entry:
    host: str
    model: str | None  # None: every model at the host
    limit: str  # a Limits field
    value: int
    source: str = ""
    learned: str = ""

    @property
    def key(self) -> tuple[str, str | None, str]:
        return (self.host, self.model, self.limit)

    def to_yaml(self) -> dict[str, object]:
        return {"host": self.host, "model": self.model, "limit": self.limit, "value": self.value, "source": self.source, "learned": self.learned}


class LearnedLimits:
    """The learned limits of one file (`path`), or in memory only (`path` None). Safe to use from any thread."""

    def __init__(self, path: str | os.PathLike[str] | None, *, check_interval: float = CHECK_INTERVAL) -> None:
        self.path = Path(path) if path else None
        self.check_interval = check_interval
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str | None, str], Entry] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._next_check = 0.0
        if self.path is not None:
            self._stamp = _stat(self.path)
            if self._stamp is not None:
                self._entries = {e.key: e for e in load_learned(self.path)}  # a bad file at start is the caller's error
            self._next_check = time.monotonic() + check_interval
        self._index = _by_host(self._entries.values())

    @property
    def entries(self) -> tuple[Entry, ...]:
        self._refresh()
        return tuple(self._entries.values())

    def tighten(self, host: str, model: str | None, limits: Limits) -> Limits:
        """`limits` with the entries for this host and model applied, each only where it is tighter."""
        tighter: dict[str, Any] = dict(self.applied(host, model, limits))
        if not tighter:
            return limits
        if tighter.get("many_images_max_side") is not None and limits.many_images_threshold is None and "many_images_threshold" not in tighter:
            tighter["many_images_threshold"] = 0  # the pair only works together
        return dataclasses.replace(limits, **tighter)

    def applied(self, host: str, model: str | None, limits: Limits) -> dict[str, int]:
        """The fields the learned entries would tighten in `limits` for this host and model, with their values."""
        self._refresh()
        entries = self._index.get(host.lower())
        if not entries:
            return {}
        tighter: dict[str, int] = {}
        for entry in entries:
            if entry.model is not None and (model is None or entry.model.lower() != model.lower()):
                continue
            current = tighter.get(entry.limit, getattr(limits, entry.limit))
            if current is None or entry.value < current:
                tighter[entry.limit] = entry.value
        return tighter

    def learn(self, host: str, model: str | None, fields: Mapping[str, int], source: str) -> list[Entry]:
        """Keep `fields` (Limits field -> value) for `host` (and `model`; None: every model), each unless an
        entry already holds it as tight or tighter. Returns the entries added or tightened; the file is
        replaced with what is on disk now plus them."""
        when = utc_timestamp()
        with self._lock, _locked(self.path):
            if self.path is not None:
                self._reload_locked(force=True)
            changed = []
            for limit, value in fields.items():
                if limit not in LEARNABLE:
                    raise ValueError(f"{limit} is not a limit trimflow learns")
                entry = Entry(host.lower(), model, limit, int(value), source, when)
                old = self._entries.get(entry.key)
                if old is None or entry.value < old.value:
                    self._entries[entry.key] = entry
                    changed.append(entry)
            if changed:
                self._index = _by_host(self._entries.values())
                if self.path is not None:
                    try:
                        self._write_locked()
                    except OSError as exc:  # kept in memory: the file is only where it lasts
                        log.error("trimflow: cannot write learned limits to %s: %s", self.path, exc.strerror or type(exc).__name__)
        return changed

    # -- the file

    def _refresh(self) -> None:
        if self.path is None or time.monotonic() < self._next_check:
            return
        with self._lock:
            self._reload_locked(force=False)

    def _reload_locked(self, force: bool) -> None:
        """Read the file when it changed (`force`: whatever its stamp says: another process may have replaced it
        within the stamp's resolution, with a file of the same size on a reused inode)."""
        assert self.path is not None
        now = time.monotonic()
        if not force and now < self._next_check:
            return
        self._next_check = now + self.check_interval
        stamp = _stat(self.path)
        if stamp == self._stamp and (stamp is None or not force):
            return  # (no file still: what an unwritable file kept in memory stays)
        self._stamp = stamp
        if stamp is None:  # deleted: a person forgot every learned limit
            self._entries = {}
        else:
            try:
                self._entries = {e.key: e for e in load_learned(self.path)}
            except RulesError as exc:
                log.error("trimflow: %s; keeping the learned limits read before", exc)
                return
            log.info("trimflow: learned limits reloaded from %s (%d)", self.path, len(self._entries))
        self._index = _by_host(self._entries.values())

    def _write_locked(self) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        entries = sorted(self._entries.values(), key=lambda e: (e.host, e.model or "", e.limit))
        text = _HEADER + yaml.safe_dump({"learned": [e.to_yaml() for e in entries]}, sort_keys=False, allow_unicode=True, width=1000)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            os.fchmod(fd, _mode_of(self.path))
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)  # a reader sees the old file or the new one, never half of one
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._stamp = _stat(self.path)


@contextmanager
def _locked(path: Path | None) -> Iterator[None]:
    """Holds an exclusive lock on the file at `path` (made empty when missing) across processes. The lock is on the
    file, which a writer replaces: a lock taken on a file replaced meanwhile is let go and taken on the new one. On
    NFS, Linux takes a flock as a lock on the whole file at the server, so instances on several machines exclude
    each other too. A file that cannot be opened for writing is not locked (the write that follows fails and says so)."""
    if path is None or fcntl is None:
        yield
        return
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                yield
                return
        finally:
            os.close(fd)  # and with it the lock


def _mode_of(path: Path) -> int:
    """The permissions a new version of the file gets: those of the one it replaces (a group sharing it keeps
    its access), else read for all, write for the owner."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        return 0o644


def _by_host(entries: Iterable[Entry]) -> dict[str, list[Entry]]:
    index: dict[str, list[Entry]] = {}
    for entry in entries:
        index.setdefault(entry.host, []).append(entry)
    return index


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def load_learned(path: str | os.PathLike[str]) -> list[Entry]:
    """The entries of a learned-limits file; RulesError (file:line) when it cannot be read. An empty file has none."""
    text = read_text(path, RulesError)
    if not text.strip():
        return []
    return _LearnedReader(os.fspath(path)).parse(text)


class _LearnedReader(NodeReader[list[Entry]]):
    error_class = RulesError

    def top(self, root: Node | None) -> list[Entry]:
        if root is None or self.is_null(root):
            return []
        top = self.top_mapping(root, "the learned limits file", ("learned",), "")
        if "learned" not in top:
            return []
        return [self.entry(node) for node in self.sequence(top["learned"][1], "learned")]

    def entry(self, node: Node) -> Entry:
        fields = self.mapping(node, "a learned limit")
        self.reject_unknown(fields, _ENTRY_KEYS, "a learned limit")
        for key in ("host", "limit", "value"):
            if key not in fields:
                raise self.error(node, f"a learned limit has no {key}: each needs host, limit and value")
        host = self.scalar(fields["host"][1])
        if not isinstance(host, str) or not host.strip():
            raise self.error(fields["host"][1], f"host must be a host name, got {self.describe(fields['host'][1])}")
        model = self.scalar(fields["model"][1]) if "model" in fields else None
        if model is not None and not isinstance(model, str):
            raise self.error(fields["model"][1], f"model must be a model name or null (every model), got {self.describe(fields['model'][1])}")
        limit_node = fields["limit"][1]
        limit = self.scalar(limit_node)
        if limit not in LEARNABLE:
            raise self.error(limit_node, f"limit must be one of {', '.join(LEARNABLE)}, got {self.describe(limit_node)}")
        value_node = fields["value"][1]
        value = self.scalar(value_node)
        lowest = LEARNABLE[limit]
        if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
            raise self.error(value_node, f"value of {limit} must be a whole number >= {lowest}, got {self.describe(value_node)}")
        source = self.scalar(fields["source"][1]) if "source" in fields else ""
        learned = self.scalar(fields["learned"][1]) if "learned" in fields else ""
        if isinstance(learned, datetime.datetime):  # written unquoted by hand
            learned = learned.isoformat()
        return Entry(host.strip().lower(), model, limit, value, str(source or ""), str(learned or ""))
