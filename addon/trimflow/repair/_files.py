"""Reading a session file and putting its repaired form in its place without losing anything.

- The original is read once, with its identity (device, inode, size, modification time).
- A file another process holds open (an agent still running: Codex keeps its rollout open) is refused.
- The new content goes to a temporary file in the same folder, with the original's mode (and owner, when
  allowed), and is flushed to disk.
- The backup is a hard link to the original beside it, `<name>.trimflow-backup-<UTC time>` (a copy where
  the file system has no hard links), created exclusively, so an earlier backup is never overwritten.
- Just before the rename, the file is checked again: a different identity or different bytes mean it
  changed while being repaired, and then nothing is replaced and the backup and the temporary file go.
- The rename replaces the file in one step; the folder is flushed after it.
"""

from __future__ import annotations

import os
import stat
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
            if st.st_ino == target.st_ino and st.st_dev == target.st_dev:
                found.append(f"{name} (pid {pid})")
                break
    return found


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


def replace(snapshot: Snapshot, data: bytes, now: datetime | None = None) -> Path:
    """Put `data` in place of the file, keeping a backup of the original beside it; returns the backup's path.

    A SessionError, with the file as it was, when it changed since it was read or a step fails."""
    path = snapshot.path
    temp = path.with_name(f".{path.name}{_TEMP_MARK}{os.getpid()}")
    backup: Path | None = None
    try:
        _write_new(temp, data, snapshot)
        backup = _backup(snapshot, now or datetime.now(UTC))
        if not unchanged(snapshot):
            raise SessionError("changed while it was being repaired: the agent may still be running")
        os.replace(temp, path)
    except BaseException as exc:
        _remove(temp)
        if backup is not None:
            _remove(backup)
        if isinstance(exc, OSError):
            raise SessionError(f"could not be replaced ({exc.strerror or type(exc).__name__})") from None
        raise
    _sync_folder(path.parent)
    return backup


def _write_new(temp: Path, data: bytes, snapshot: Snapshot) -> None:
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, snapshot.mode)
        if os.geteuid() == 0:  # only root can give a file away; anyone else creates the new file as its own
            os.fchown(fd, snapshot.uid, snapshot.gid)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _backup(snapshot: Snapshot, now: datetime) -> Path:
    """A new name for the original beside it, never one that exists: `-2`, `-3` ... within the same second."""
    stamp = now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = snapshot.path
    for attempt in range(1, 1000):
        backup = path.with_name(f"{path.name}{BACKUP_MARK}{stamp}{'' if attempt == 1 else f'-{attempt}'}")
        try:
            os.link(path, backup, follow_symlinks=False)
            return backup
        except FileExistsError:
            continue
        except OSError:
            pass  # no hard links here (some network and FUSE file systems): a copy of the bytes read
        try:
            _write_new(backup, snapshot.data, snapshot)
            return backup
        except FileExistsError:
            continue
    raise SessionError("has too many backups from this second")


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
