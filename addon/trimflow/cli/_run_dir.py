"""The run's folder and files, the user's alone (0700, 0600), from the start of a run to its removal.

A run's folder is marked with the launcher's host, pid and start time, and removed when the run ends or, once its
launcher is gone, at the next start; what the agent wrote into a private settings folder is kept beside it and
named in one line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._launch_error import LaunchError

LAUNCHER_FILE = "launcher"  # in a run's folder: the launcher's host, pid and start time, to tell a live run from a stale one
PRIVATE_FILE = "private.json"  # in a run's folder: what the launcher put in each private settings folder
PRIVATE_MODE = 0o600


def write_private(path: Path, data: bytes, mode: int = PRIVATE_MODE) -> None:
    """Write a file of the run with `mode` from its creation on (never through a link planted in its place)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def state_dir(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_STATE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "trimflow" / "runs"


def private_folder(path: Path) -> None:
    """Make `path` a folder only its owner can enter; a LaunchError when it is someone else's or not a folder."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.stat(path)
    except OSError as exc:
        raise LaunchError(f"trimflow run: cannot make {path} ({exc.strerror or type(exc).__name__})") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise LaunchError(f"trimflow run: {path} is not a folder of yours: the run's files cannot be kept private there")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)


def _start_time(pid: int) -> str | None:
    """A process's start time (Linux /proc), which tells it from a later process given the same pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else None


def _running(pid: int, started: str | None) -> bool:
    if Path("/proc/self/stat").exists():
        now = _start_time(pid)
        return now is not None and (started is None or now == started)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def new_run_dir(runs: Path, stem: str) -> Path:
    """The run's own folder (0700), marked with the launcher's host, pid and start time."""
    run_dir = runs / stem
    run_dir.mkdir(mode=0o700)
    write_private(run_dir / LAUNCHER_FILE, f"{socket.gethostname()} {os.getpid()} {_start_time(os.getpid()) or '-'}\n".encode())
    return run_dir


def clean_stale_runs(runs: Path) -> list[str]:
    """Remove the folders of runs whose launcher is gone (killed before it could clean up); lines to say."""
    lines: list[str] = []
    try:
        entries = sorted(runs.iterdir())
    except OSError:
        return lines
    for entry in entries:
        if entry.is_symlink() or not entry.is_dir():
            continue
        try:
            host, pid, started = (entry / LAUNCHER_FILE).read_text(encoding="utf-8").split()
        except (OSError, UnicodeDecodeError, ValueError):
            host, pid, started = socket.gethostname(), entry.name.rpartition("-")[2], "-"  # being made now, or older
        if host != socket.gethostname():  # a home shared with another machine: its pids are not this one's
            continue
        if pid.isdigit() and not _running(int(pid), None if started == "-" else started):
            lines += finish_run_dir(entry)
    return lines


def finish_run_dir(run_dir: Path) -> list[str]:
    """Remove a run's folder. What the agent wrote into a private settings folder (a changed settings file, a new
    one) is moved to `<run>.<folder>` beside it first and named in one line: it is the user's to keep or drop,
    and their own files are never overwritten."""
    lines = []
    try:
        folders = json.loads((run_dir / PRIVATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        folders = []
    for folder in folders if isinstance(folders, list) else []:
        try:
            relative = Path(str(folder["folder"]))
            if relative.is_absolute() or ".." in relative.parts:
                continue
            private, entries = run_dir / relative, dict(folder["entries"])
            changed = [entry for entry in sorted(private.iterdir()) if _changed(entry, entries.get(entry.name))]
        except (OSError, KeyError, TypeError, ValueError):
            continue
        if not changed:
            continue
        kept = run_dir.with_name(f"{run_dir.name}.{Path(str(folder['folder'])).name.lstrip('.')}")
        names = ", ".join(entry.name for entry in changed)
        try:
            private_folder(kept)
            for entry in changed:
                os.rename(entry, kept / entry.name)
        except (OSError, LaunchError) as exc:
            lines.append(f"trimflow run: {folder.get('agent')} wrote {names} in its private settings folder, left in {private} ({exc})")
            return lines  # the folder stays, with them
        lines.append(f"trimflow run: {folder.get('agent')} wrote {names} in its private settings folder, not in {folder.get('user')}: kept in {kept}")
    shutil.rmtree(run_dir, ignore_errors=True)  # links into the user's folder are removed, never followed
    return lines


def _changed(entry: Path, expected: str | None) -> bool:
    """Whether an entry of a private settings folder is not what the launcher put there."""
    if expected is None:
        return True
    if expected.startswith("link:"):
        return not entry.is_symlink() or os.readlink(entry) != expected.removeprefix("link:")
    if entry.is_symlink() or not entry.is_file():
        return True
    return digest(entry.read_bytes()) != expected


def digest(data: bytes) -> str:
    """What a file of a private settings folder held when the launcher wrote it, to tell whether the agent changed it."""
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def record_private(run_dir: Path, folder: dict[str, Any]) -> None:
    """Add a private settings folder to the run's list (PRIVATE_FILE): its agent, where it is and what each entry is."""
    path = run_dir / PRIVATE_FILE
    try:
        folders = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        folders = []
    write_private(path, json.dumps([*folders, folder]).encode())
