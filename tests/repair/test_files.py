"""Replacing a session file without losing anything: the backup beside it (never overwriting an earlier one),
the original's mode, a file that changes while it is repaired, a file another process holds open."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from trimflow.repair import _files
from trimflow.repair._lines import SessionError

from ..helpers import wait_for
from .helpers import held_open

NOW = datetime(2026, 11, 24, 11, 30, 5, tzinfo=UTC)


def session(folder: Path, data: bytes = b'{"a":1}\n', mode: int = 0o640) -> Path:
    path = folder / "s.jsonl"
    path.write_bytes(data)
    path.chmod(mode)
    return path


def test_replace_puts_the_new_bytes_in_place_and_keeps_the_original_as_a_backup(tmp_path: Path) -> None:
    path = session(tmp_path, mode=0o604)
    snapshot = _files.read(path)
    backup = _files.replace(snapshot, b'{"a":2}\n', NOW).backup
    assert path.read_bytes() == b'{"a":2}\n'
    assert backup == tmp_path / "s.jsonl.trimflow-backup-20261124T113005Z"
    assert backup.read_bytes() == b'{"a":1}\n'
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(backup.stat().st_mode) == 0o604
    assert path.stat().st_uid == backup.stat().st_uid
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl", "s.jsonl.trimflow-backup-20261124T113005Z"]  # no temporary file left


def test_a_second_repair_in_the_same_second_never_overwrites_the_first_backup(tmp_path: Path) -> None:
    path = session(tmp_path)
    first = _files.replace(_files.read(path), b'{"a":2}\n', NOW).backup
    second = _files.replace(_files.read(path), b'{"a":3}\n', NOW).backup
    third = _files.replace(_files.read(path), b'{"a":4}\n', NOW).backup
    assert [first.read_bytes(), second.read_bytes(), third.read_bytes()] == [b'{"a":1}\n', b'{"a":2}\n', b'{"a":3}\n']
    assert second.name.endswith("Z-2") and third.name.endswith("Z-3")


def test_a_file_that_changes_after_it_was_read_is_not_replaced(tmp_path: Path) -> None:
    path = session(tmp_path)
    snapshot = _files.read(path)
    with path.open("ab") as file:  # the agent appends a line meanwhile
        file.write(b'{"b":2}\n')
    with pytest.raises(SessionError, match="changed while it was being repaired: the agent may still be running"):
        _files.replace(snapshot, b'{"a":2}\n', NOW)
    assert path.read_bytes() == b'{"a":1}\n{"b":2}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["s.jsonl"]  # no backup, no temporary file


def test_a_file_rewritten_with_the_same_size_and_time_is_caught_by_its_bytes(tmp_path: Path) -> None:
    path = session(tmp_path)
    snapshot = _files.read(path)
    st = path.stat()
    with path.open("r+b") as file:
        file.write(b'{"a":9}\n')
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(SessionError, match="changed while it was being repaired"):
        _files.replace(snapshot, b'{"a":2}\n', NOW)
    assert path.read_bytes() == b'{"a":9}\n'


@pytest.fixture
def no_hard_links(monkeypatch: pytest.MonkeyPatch) -> None:
    """link(2) refused, as some network and FUSE file systems refuse it."""

    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", refused)


@pytest.mark.usefixtures("no_hard_links")
def test_without_hard_links_the_backup_is_a_copy_with_the_same_mode(tmp_path: Path) -> None:
    path = session(tmp_path, mode=0o600)
    backup = _files.replace(_files.read(path), b'{"a":2}\n', NOW).backup
    assert backup.read_bytes() == b'{"a":1}\n' and stat.S_IMODE(backup.stat().st_mode) == 0o600
    assert backup.stat().st_ino != path.stat().st_ino


def test_read_names_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(SessionError, match=r"^no such file$"):
        _files.read(tmp_path / "missing.jsonl")
    with pytest.raises(SessionError, match=r"^not a regular file$"):
        _files.read(tmp_path)
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(SessionError, match=r"^not a regular file$"):
        _files.read(fifo)


def test_a_read_only_file_is_not_writable(tmp_path: Path) -> None:
    path = session(tmp_path, mode=0o444)
    with pytest.raises(SessionError, match=r"^is read-only"):
        _files.check_writable(_files.read(path))
    _files.check_writable(_files.read(session(tmp_path, mode=0o644)))


def test_holders_names_a_process_that_has_the_file_open(tmp_path: Path) -> None:
    path = session(tmp_path)
    assert _files.holders(path) == []
    with held_open(path) as pid:
        wait_for(lambda: _files.holders(path), "holder of the file")
        assert _files.holders(path) == [f"sleep (pid {pid})"]


# An agent that opens, appends one line and closes (as Claude Code does per entry), with a pause of up to a
# millisecond between lines: often enough that a line lands between the repair's last check and its rename.
WRITER = """
import os, random, sys, time
path, stop = sys.argv[1], sys.argv[2]
written = 0
while not os.path.exists(stop):
    with open(path, "ab") as file:
        file.write(b'{"written":%d}\\n' % written)
    written += 1
    time.sleep(random.uniform(0, 0.001))
print(written)
"""
TRIALS = 1500  # enough for the race to be hit many times over (docs/security.md#repair has the figures)


def test_a_line_appended_while_the_file_is_replaced_is_never_lost(tmp_path: Path) -> None:
    """Repairs, one after another, of a file an agent keeps appending to: each either refuses (the file changed)
    or replaces it, and every line the agent wrote is in the file at the end, once."""
    path = session(tmp_path, b'{"start":0}\n')
    stop = tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(stop)], stdout=subprocess.PIPE)
    replaced = races = 0
    try:
        while b'"written"' not in path.read_bytes():
            assert writer.poll() is None
        for trial in range(TRIALS):
            try:
                snapshot = _files.read(path)
                done = _files.replace(snapshot, snapshot.data + b'{"repaired":%d}\n' % trial)
            except SessionError as exc:
                assert "changed while it was being" in str(exc)
                continue
            replaced += 1
            races += done.carried > 0
            assert done.stranded == 0
            done.backup.unlink()
    finally:
        stop.touch()
        out, _ = writer.communicate(timeout=60)
    written = int(out)
    lines = path.read_bytes().splitlines()
    assert sorted(line for line in lines if line.startswith(b'{"written"')) == sorted(b'{"written":%d}' % i for i in range(written))
    assert sum(line.startswith(b'{"repaired"') for line in lines) == replaced
    assert len(lines) == len(set(lines)) == 1 + written + replaced  # nothing doubled either
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl", "stop"]
    assert races > 0, f"no line reached the original between the last check and the rename in {TRIALS} trials ({replaced} replaced)"


# No hard links (some network and FUSE file systems) and a disk that fills up during the copy: the file size
# limit (RLIMIT_FSIZE) lets the small repaired file be written and stops the copy of the larger original partway.
COPY_FAILS = """
import errno, json, os, resource, signal, sys
from pathlib import Path
from trimflow.repair import _files
from trimflow.repair._lines import SessionError

def no_links(*args, **kwargs):
    raise OSError(errno.EPERM, "Operation not permitted")

os.link = no_links
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
path = Path(sys.argv[1])
try:
    _files.replace(_files.read(path), b'{"a":2}\\n')
except SessionError as exc:
    print(json.dumps(str(exc)))
"""


def test_a_backup_copy_that_fails_partway_leaves_no_file_under_a_backup_name(tmp_path: Path) -> None:
    original = b"".join(b'{"line":%d,"pad":"%s"}\n' % (i, b"x" * 200) for i in range(300))
    path = session(tmp_path, original, mode=0o600)
    limit = len(original) // 3
    done = subprocess.run([sys.executable, "-c", COPY_FAILS, str(path), str(limit)], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == "could not be backed up (File too large)"
    assert path.read_bytes() == original
    assert [p.name for p in tmp_path.iterdir()] == ["s.jsonl"]  # no backup, no partial copy, no temporary file


@pytest.mark.usefixtures("no_hard_links")
def test_a_copied_backup_is_renamed_into_place_whole_next_to_an_earlier_one(tmp_path: Path) -> None:
    path = session(tmp_path, mode=0o600)
    first = _files.replace(_files.read(path), b'{"a":2}\n', NOW).backup
    second = _files.replace(_files.read(path), b'{"a":3}\n', NOW).backup
    assert (first.read_bytes(), second.read_bytes()) == (b'{"a":1}\n', b'{"a":2}\n')
    assert second.name.endswith("Z-2")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["s.jsonl", first.name, second.name])


def test_a_process_that_still_holds_the_original_after_the_wait_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = session(tmp_path)
    snapshot = _files.read(path)
    with held_open(path) as pid:
        wait_for(lambda: _files.holders(path), "holder of the file")
        monkeypatch.setattr(_files, "CARRY_WAIT", 0.0)  # it opened the file after the repair's check: no waiting it out here
        done = _files.replace(snapshot, b'{"a":2}\n', NOW)
    assert done.still_open == (f"sleep (pid {pid})",) and done.carried == done.stranded == 0
    assert path.read_bytes() == b'{"a":2}\n'
