"""Which images went up once, and as which file: the send-once mapping (trimflow._send_once says what goes by reference).

An entry is keyed by the tenant (trimflow._send_once.tenant_of: a digest of the credentials and the upstream, never a
credential) and the digest of the image's bytes as sent, so the same image under the same credentials is the same
file on every turn, and no request ever references a file uploaded under other credentials. An entry whose image
could not be uploaded (`file_id` None) keeps that image inline in its conversation, so its cached prefix does not
change when a later upload would work.

Bounded together across every request: at most `max_entries` entries and `max_bytes` uploaded bytes, the least
recently used going first (`put` returns those, for the caller to delete at the provider). An entry lives `lifetime`
seconds from its upload, or its provider's `max_lifetime` when shorter (trimflow._send_once: Gemini deletes its files
on its own, and the entry goes first), and `expired` takes those out. The credentials that uploaded a file are kept beside it, in
memory only, to delete it with: nothing here is ever written anywhere. Pure Python, no I/O; one lock, never held
while anything but this memory is touched.

Instances sharing a store (trimflow._state_store) share their entries: one this instance uploaded is offered to the
others until `shared_until` (SHARE_MARGIN before its deletion here, so that no other instance references a file
about to be deleted); one read from the store is `borrowed`: referenced until the store's time, never deleted from
here (it is the uploader's to delete, with the credentials it holds). A file the provider refused is remembered
(`refused`, as many as `max_entries`), so that a store still naming it is not believed again.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ._send_once import max_lifetime

DEFAULT_MAX_ENTRIES = 4096
DEFAULT_MAX_BYTES = 1 << 30  # uploaded bytes the mapping answers for at once: a day of screenshots of a busy team
DEFAULT_LIFETIME = 86400.0  # seconds a file is kept at the provider from its upload
# Seconds before its deletion that a file stops being offered to other instances (at most a quarter of the lifetime):
# a request that went with the reference is answered before the uploader deletes the file.
SHARE_MARGIN = 600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Owner:
    """Whom a file belongs to, to delete it with: the upstream (scheme://host:port), the Files API's path there, the
    server name its TLS gave, and the credential headers (in memory only: repr hides them)."""

    tenant: bytes
    provider: str
    scheme: str
    host: str
    port: int
    files_path: str
    sni: str | None
    headers: tuple[tuple[str, str], ...]

    def __repr__(self) -> str:
        return f"Owner({self.provider} {self.scheme}://{self.host}:{self.port}{self.files_path}, tenant {self.tenant.hex()[:8]})"


@dataclass(slots=True, kw_only=True)
class Entry:
    """One image under one tenant: its file (None: it stays inline), the bytes uploaded, when, and whose. A borrowed
    entry (another instance uploaded it) is referenced until `borrowed_until`, and never deleted from here."""

    owner: Owner
    digest: bytes
    file_id: str | None
    size: int
    uploaded_at: float
    borrowed_until: float | None = None

    @property
    def max_lifetime(self) -> float | None:
        """The longest its provider keeps the file (None: until it is deleted)."""
        return max_lifetime(self.owner.provider)

    @property
    def deletable(self) -> bool:
        """Whether this instance deletes the entry's file at the provider: it uploaded it."""
        return self.file_id is not None and self.borrowed_until is None


class FileRefs:
    """The mapping, bounded (see the module docstring)."""

    def __init__(
        self,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        lifetime: float = DEFAULT_LIFETIME,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.max_entries, self.max_bytes, self.lifetime, self.clock = max_entries, max_bytes, lifetime, clock
        self._entries: OrderedDict[tuple[bytes, bytes], Entry] = OrderedDict()
        self._refused: OrderedDict[tuple[bytes, str], None] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """Bytes of the files the mapping holds."""
        return self._bytes

    def get(self, tenant: bytes, digest: bytes) -> Entry | None:
        """The tenant's entry for the image, made the most recently used; None when there is none or it has expired."""
        key = (tenant, digest)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if self._expired(entry, self.clock()):
                return None  # `expired` takes it out, and the file with it
            self._entries.move_to_end(key)
            return entry

    def put(self, entry: Entry) -> list[Entry]:
        """Add (or replace) the entry; returns the entries that had to go for it to fit, whose files the caller
        deletes. An entry larger than the whole byte bound is not kept (and is returned)."""
        key = (entry.owner.tenant, entry.digest)
        with self._lock:
            gone = []
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.size
                if old.file_id != entry.file_id:
                    gone.append(old)
            if entry.size > self.max_bytes:
                return [*gone, entry]
            self._entries[key] = entry
            self._bytes += entry.size
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.size
                gone.append(evicted)
            return [e for e in gone if e.deletable]

    def drop(self, tenant: bytes, file_ids: frozenset[str]) -> list[Entry]:
        """Take out the tenant's entries for these files (the provider refused them), and remember the files as
        refused; returns the entries."""
        with self._lock:
            for file_id in file_ids:
                self._refused[(tenant, file_id)] = None
                self._refused.move_to_end((tenant, file_id))
            while len(self._refused) > self.max_entries:
                self._refused.popitem(last=False)
            keys = [key for key, e in self._entries.items() if key[0] == tenant and e.file_id in file_ids]
            return [self._pop(key) for key in keys]

    def refused(self, tenant: bytes, file_id: str) -> bool:
        """Whether the provider refused this file of the tenant's (a reference to it is not believed again)."""
        with self._lock:
            return (tenant, file_id) in self._refused

    def expired(self) -> list[Entry]:
        """Take out every entry past its lifetime; returns those whose files this instance deletes."""
        now = self.clock()
        with self._lock:
            keys = [key for key, e in self._entries.items() if self._expired(e, now)]
            return [e for e in (self._pop(key) for key in keys) if e.deletable]

    def take_all(self) -> list[Entry]:
        """Take out every entry; returns those whose files this instance deletes."""
        with self._lock:
            entries = [e for e in self._entries.values() if e.deletable]
            self._entries.clear()
            self._bytes = 0
            return entries

    def lifetime_of(self, max_lifetime: float | None) -> float:
        """The lifetime of an entry whose provider keeps its file at most `max_lifetime` (None: no limit)."""
        return self.lifetime if max_lifetime is None else min(self.lifetime, max_lifetime)

    def shared_until(self, uploaded_at: float, max_lifetime: float | None = None) -> float:
        """Until when other instances may reference a file uploaded here at `uploaded_at`: SHARE_MARGIN (at most a
        quarter of the lifetime) before its deletion."""
        lifetime = self.lifetime_of(max_lifetime)
        return uploaded_at + lifetime - min(SHARE_MARGIN, lifetime / 4)

    def _expired(self, entry: Entry, now: float) -> bool:
        if entry.borrowed_until is not None and now >= entry.borrowed_until:
            return True
        return now - entry.uploaded_at >= self.lifetime_of(entry.max_lifetime)

    def _pop(self, key: tuple[bytes, bytes]) -> Entry:
        entry = self._entries.pop(key)
        self._bytes -= entry.size
        return entry


__all__ = ["DEFAULT_LIFETIME", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_ENTRIES", "SHARE_MARGIN", "Entry", "FileRefs", "Owner"]
