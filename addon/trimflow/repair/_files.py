"""Reading a session file and putting its repaired form in its place without losing anything.

- The original is read once, with its identity (device, inode, size, modification time).
- A file another process holds open (an agent still running: Codex keeps its rollout open) is refused.
- The new content goes to a temporary file in the same folder, with the original's mode (and owner, when
  allowed), and is flushed to disk.
- The backup is a hard link to the original beside it, `<name>.trimflow-backup-<UTC time>`, created
  exclusively, so an earlier backup is never overwritten. Where the file system has no hard links it is a
  copy, written under a temporary name and renamed into place once whole; a copy that fails is removed.
- Just before the rename, the file is checked again: a different identity or different bytes mean it
  changed while being repaired, and then nothing is replaced and the backup and the temporary file go.
- The rename replaces the file in one step; the folder is flushed after it.
- An append that reached the original between that check and the rename (an agent that opens, writes and
  closes per line) is carried over: once no process holds the original open, the bytes past what was read
  are appended to the new file. Its lines come after any line written to the new file meanwhile.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ._lines import SessionError

BACKUP_MARK = ".trimflow-backup-"
_TEMP_MARK = ".trimflow-tmp-"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A file's bytes as read, and what identifies that version of it."""

    path: Path
    data: bytes
    identity: tuple[int, int, int, int]  # device, inode, size, modification time (ns)
    mode: int
    uid: int
    gid: int


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def read(path: Path) -> Snapshot:
    """The file's bytes and identity; a SessionError naming why it cannot be read."""
    try:
        # Non-blocking, so that a FIFO in the file's place is refused rather than waited on.
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
            before = os.fstat(file.fileno())
            if not stat.S_ISREG(before.st_mode):
                raise SessionError("not a regular file")
            data = file.read()
            after = os.fstat(file.fileno())
    except PermissionError:
        raise SessionError("cannot be read (permission denied)") from None
    except FileNotFoundError:
        raise SessionError("no such file") from None
    except IsADirectoryError:
        raise SessionError("not a regular file") from None
    except OSError as exc:
        raise SessionError(f"cannot be read ({exc.strerror or type(exc).__name__})") from None
    if _identity(before) != _identity(after) or len(data) != after.st_size:
        raise SessionError("changed while it was being read: the agent may still be writing it")
    return Snapshot(path, data, _identity(after), stat.S_IMODE(after.st_mode), after.st_uid, after.st_gid)


def check_writable(snapshot: Snapshot) -> None:
    """A SessionError when the file may not be replaced: read-only, or a folder where nothing can be created."""
    path = snapshot.path
    if snapshot.mode & 0o222 == 0 or not os.access(path, os.W_OK):
        raise SessionError("is read-only (make it writable to repair it)")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise SessionError("its folder is not writable (the repaired file and the backup are made beside it)")


def holders(path: Path) -> list[str]:
    """The processes that hold the file open, as 'name (pid N)' (Linux /proc; elsewhere none are found)."""
    try:
        target = os.stat(path)
    except OSError:
        return []
    return _holders_of(target.st_dev, target.st_ino)


def _processes() -> Iterator[tuple[int, str]]:
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    own = os.getpid()
    for entry in entries:
        if not entry.isdigit() or int(entry) == own:
            continue
        try:
            with open(f"/proc/{entry}/comm", encoding="utf-8", errors="replace") as file:
                name = file.read().strip()
        except OSError:
            continue
        yield int(entry), name


def unchanged(snapshot: Snapshot) -> bool:
    """Whether the file is still the version read: same identity and same bytes."""
    try:
        with os.fdopen(os.open(snapshot.path, os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
            if _identity(os.fstat(file.fileno())) != snapshot.identity:
                return False
            return file.read() == snapshot.data
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class Replaced:
    """What `replace` did: where the backup is, and what the agent appended while the file was replaced."""

    backup: Path
    carried: int = 0  # bytes appended to the original during the repair, carried over to the new file
    stranded: int = 0  # bytes appended to the original that could not be carried over: they are in the backup only
    still_open: tuple[str, ...] = ()  # processes that still held the original once the wait for them ended


# How long the repair waits, after the rename, for processes that opened the original before it to close it.
CARRY_WAIT = 10.0


def replace(snapshot: Snapshot, data: bytes, now: datetime | None = None) -> Replaced:
    """Put `data` in place of the file, keeping a backup of the original beside it.

    A SessionError, with the file as it was, when it changed since it was read or a step fails. What an
    agent appends to the original between the last check and the rename lands in the original's inode: it
    is carried over to the end of the new file once no process holds the original open."""
    path = snapshot.path
    temp = path.with_name(f".{path.name}{_TEMP_MARK}{os.getpid()}")
    try:
        # Held to the end: the original's inode, whatever name it has after the rename (none, with a copied backup).
        original = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise SessionError(f"could not be replaced ({exc.strerror or type(exc).__name__})") from None
    try:
        backup: Path | None = None
        try:
            if _identity(os.fstat(original))[:2] != snapshot.identity[:2]:
                raise SessionError(_CHANGED)
            written = _write_new(temp, data, snapshot)
            backup = _backup(snapshot, now or datetime.now(UTC))
            if not unchanged(snapshot):
                raise SessionError(_CHANGED)
            os.replace(temp, path)
        except BaseException as exc:
            _remove(temp)
            if backup is not None:
                _remove(backup)
            if isinstance(exc, OSError):
                raise SessionError(f"could not be replaced ({exc.strerror or type(exc).__name__})") from None
            raise
        _sync_folder(path.parent)
        return _carry_over(original, snapshot, written, backup)
    finally:
        os.close(original)


_CHANGED = "changed while it was being repaired: the agent may still be running"


def _carry_over(original: int, snapshot: Snapshot, written: tuple[int, int], backup: Path) -> Replaced:
    """Append to the new file what reached the original after its last check (an agent's append that raced the rename)."""
    inode = os.fstat(original)
    deadline = time.monotonic() + CARRY_WAIT
    held = _holders_of(inode.st_dev, inode.st_ino)
    while held and time.monotonic() < deadline:
        time.sleep(0.01)
        held = _holders_of(inode.st_dev, inode.st_ino)
    start = len(snapshot.data)
    size = os.fstat(original).st_size
    if size <= start:
        return Replaced(backup, still_open=tuple(held))
    tail = _read_from(original, start, size)
    try:
        fd = os.open(snapshot.path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
    except OSError:
        return Replaced(backup, stranded=len(tail), still_open=tuple(held))
    try:
        if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != written:  # replaced again by someone else meanwhile
            return Replaced(backup, stranded=len(tail), still_open=tuple(held))
        _write_all(fd, tail)
        os.fsync(fd)
    except OSError:
        return Replaced(backup, stranded=len(tail), still_open=tuple(held))
    finally:
        os.close(fd)
    return Replaced(backup, carried=len(tail), still_open=tuple(held))


def _read_from(fd: int, start: int, end: int) -> bytes:
    parts = []
    while start < end:
        chunk = os.pread(fd, min(end - start, 1 << 20), start)
        if not chunk:
            break
        parts.append(chunk)
        start += len(chunk)
    return b"".join(parts)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_new(temp: Path, data: bytes, snapshot: Snapshot) -> tuple[int, int]:
    """A new file holding `data`, with the original's mode (and owner, as root); its device and inode."""
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, snapshot.mode)
        if os.geteuid() == 0:  # only root can give a file away; anyone else creates the new file as its own
            os.fchown(fd, snapshot.uid, snapshot.gid)
        _write_all(fd, data)
        os.fsync(fd)
        st = os.fstat(fd)
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)


def _backup(snapshot: Snapshot, now: datetime) -> Path:
    """A new name for the original beside it, never one that exists: `-2`, `-3` ... within the same second.

    A hard link where the file system has them; else a copy of the bytes read, written under a temporary name
    and renamed into place once whole, so that a backup name never holds a part of the original."""
    stamp = now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = snapshot.path
    copy: Path | None = None
    try:
        for attempt in range(1, 1000):
            backup = path.with_name(f"{path.name}{BACKUP_MARK}{stamp}{'' if attempt == 1 else f'-{attempt}'}")
            if copy is None:
                try:
                    os.link(path, backup, follow_symlinks=False)
                    return backup
                except FileExistsError:
                    continue
                except OSError:
                    pass  # no hard links here (some network and FUSE file systems): a copy of the bytes read
                copy = path.with_name(f".{path.name}{_TEMP_MARK}backup-{os.getpid()}")
                try:
                    _write_new(copy, snapshot.data, snapshot)
                except OSError as exc:
                    raise SessionError(f"could not be backed up ({exc.strerror or type(exc).__name__})") from None
            if os.path.lexists(backup):
                continue
            os.rename(copy, backup)
            copy = None
            return backup
    finally:
        if copy is not None:
            _remove(copy)
    raise SessionError("has too many backups from this second")


def _holders_of(device: int, inode: int) -> list[str]:
    found = []
    for pid, name in _processes():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if st.st_ino == inode and st.st_dev == device:
                found.append(f"{name} (pid {pid})")
                break
    return found


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
