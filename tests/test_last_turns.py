"""trimflow._last_turns: the file of each conversation's last turn that trimflow processes share. What one process
writes another reads; what is read is checked first; the file stays bounded and private; and no error of the file
ever reaches a request (one log line, then each process keeps its own memory)."""

from __future__ import annotations

import ast
import logging
import math
import os
import sqlite3
import stat
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trimflow import _last_turns
from trimflow._last_turns import MAX_AGE, MAX_IMAGES, LastTurn, LastTurns, conversation_key, row_keys

from .helpers import ROOT, SQLITE_LOCKS, sqlite_held_by_another_process, wait_for

KEY = conversation_key("api.example.test", None, b"origin01")
OTHER = conversation_key("api.example.test", None, b"origin02")
TURN = LastTurn(1000.0, 2, ((b"key-0001", 1), (b"key-0002", 0), (b"key-0003", 0xFFFFFFFF)))


@pytest.fixture
def path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "conversations.sqlite3"


def opened(path: Path, now: float = 1000.0) -> LastTurns:
    return LastTurns(str(path), clock=lambda: now)


def cuts_seen_elsewhere(path: Path) -> dict[bytes, int]:
    """Each conversation's cut, as a process of its own reads the file (one of this process's could share its view)."""
    script = "import sqlite3, sys; print(dict(sqlite3.connect(sys.argv[1]).execute('SELECT conversation, cut FROM last_turn')))"
    found = subprocess.run([sys.executable, "-c", script, str(path)], check=True, capture_output=True, text=True, timeout=60)
    return ast.literal_eval(found.stdout)


def rows(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT count(*) FROM last_turn").fetchone()[0]
    finally:
        db.close()


def test_what_one_process_writes_another_reads(path: Path) -> None:
    """Two connections in this process, and a Python process of its own, on one file."""
    with opened(path) as first, opened(path) as second:
        assert first.get(KEY) is None
        first.put(KEY, TURN)
        assert second.get(KEY) == TURN
        script = (
            "import sys; from trimflow._last_turns import LastTurns, LastTurn, conversation_key\n"
            "with LastTurns(sys.argv[1], clock=lambda: 1000.5) as t:\n"
            "    key = conversation_key('api.example.test', None, b'origin01')\n"
            "    assert t.get(key).cut == 2\n"
            "    t.put(key, LastTurn(1000.5, 3, t.get(key).images + ((b'key-0004', 7),)))\n"
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT / "addon")}
        subprocess.run([sys.executable, "-c", script, str(path)], check=True, env=env, timeout=60)
        assert second.get(KEY) == LastTurn(1000.5, 3, (*TURN.images, (b"key-0004", 7)))


def test_a_read_is_what_this_connection_read_or_wrote_last_until_another_one_writes(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    read = LastTurns._read
    monkeypatch.setattr(LastTurns, "_read", staticmethod(lambda db, keys: reads.append(len(keys)) or read(db, keys)))
    newer = TURN._replace(sent_at=1000.5)
    with opened(path, now=1000.5) as turns, opened(path, now=1000.5) as other:
        turns.put(KEY, TURN)
        assert turns.get_many([KEY, OTHER]) == [TURN, None] and reads == [2]  # OTHER not known yet
        assert turns.get_many([KEY, OTHER]) == [TURN, None] and reads == [2]
        turns.put(KEY, newer)
        assert turns.get(KEY) == newer and reads == [2]  # its own write
        turns.put(KEY, TURN)  # an older turn: the file keeps the newer, and so does what it knows
        assert turns.get(KEY) == newer and reads == [2]
        other.put(OTHER, TURN)  # another connection wrote: everything is read again
        assert turns.get_many([KEY, OTHER]) == [newer, TURN] and reads == [2, 2]
        assert rows(path) == 2


def test_the_file_is_made_on_first_use_and_private(tmp_path: Path) -> None:
    path = tmp_path / "confdir" / "conversations.sqlite3"
    with opened(path) as turns:
        assert not path.parent.exists()
        turns.put(KEY, TURN)
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        # The file and SQLite's own beside it (-wal, -shm) while it is open.
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in path.parent.iterdir()}
        assert modes == {path.name: 0o600, f"{path.name}-wal": 0o600, f"{path.name}-shm": 0o600}


def test_a_row_that_is_not_what_put_writes_is_ignored(path: Path) -> None:
    with opened(path) as turns:
        turns.put(KEY, TURN)
        db = sqlite3.connect(path)
        bad = {
            "text time": ("sent_at", "'yesterday'"),
            "no time at all": ("sent_at", "9e999"),  # infinity
            "a time to come": ("sent_at", "1900.0"),
            "too old": ("sent_at", str(1000.0 - MAX_AGE - 1)),
            "cut past the images": ("cut", "4"),
            "negative cut": ("cut", "-1"),
            "text cut": ("cut", "'all'"),
            "torn images": ("images", "x'00112233'"),
            "text images": ("images", "'abc'"),
            "too many images": ("images", f"zeroblob({(MAX_IMAGES + 1) * 12})"),
        }
        for why, (column, value) in bad.items():
            with db:
                db.execute(
                    f"UPDATE last_turn SET sent_at = 1000.0, cut = 2, images = ?, {column} = {value}",
                    (b"".join(k + c.to_bytes(4, "big") for k, c in TURN.images),),
                )
            assert turns.get(KEY) is None, why
        db.close()


def test_past_max_images_the_oldest_go_and_the_cut_follows(path: Path) -> None:
    images = tuple((i.to_bytes(8, "big"), i) for i in range(MAX_IMAGES + 10))
    with opened(path) as turns:
        turns.put(KEY, LastTurn(1000.0, 15, images))
        kept = turns.get(KEY)
    assert kept is not None and kept.images == images[10:] and kept.cut == 5


def test_old_rows_go_and_past_max_rows_the_least_recently_sent(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_last_turns, "CLEAN_EVERY", 5)
    monkeypatch.setattr(_last_turns, "MAX_ROWS", 3)
    now = [1000.0]
    with LastTurns(str(path), clock=lambda: now[0]) as turns:
        keys = [conversation_key("h", None, bytes([i])) for i in range(5)]
        turns.put(keys[0], TURN._replace(sent_at=now[0] - MAX_AGE - 5))  # past its age
        for i in range(1, 5):  # the fifth write cleans
            turns.put(keys[i], TURN._replace(sent_at=now[0] + i))
        now[0] += 5
        wait_for(lambda: rows(path) == 3, "old rows removed by the writing thread")
        assert [turns.get(k) is not None for k in keys] == [False, False, True, True, True]


def test_a_file_that_is_not_a_database_costs_the_sharing_only(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path.write_bytes(b"these are not the rows you are looking for" * 100)
    with caplog.at_level(logging.WARNING, "trimflow"), opened(path) as turns:
        assert turns.in_use  # not tried yet
        assert turns.get(KEY) is None
        turns.put(KEY, TURN)
        assert turns.get(KEY) is None and not turns.in_use
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"trimflow: conversations file {path} not used: file is not a database; each instance keeps its own (docs/caching.md#several-instances)"
    ]


def test_a_folder_it_cannot_make_or_a_newer_schema_is_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "a-file").write_bytes(b"")
    newer = tmp_path / "newer.sqlite3"
    with sqlite3.connect(newer) as db:
        db.execute("PRAGMA user_version = 2")
    db.close()
    with caplog.at_level(logging.WARNING, "trimflow"):
        for where in (tmp_path / "a-file" / "c.sqlite3", newer):
            with opened(where) as turns:
                turns.put(KEY, TURN)
                assert turns.get(KEY) is None
    assert [r.getMessage().split(" not used: ")[1].split(";")[0] for r in caplog.records] == ["File exists", "schema version 2, not 1"]


def test_a_write_another_process_holds_up_goes_once_the_lock_is_gone(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Never waited for where the turn is numbered (the proxy's event loop): queued, and written by the writing thread
    once the other process lets go; meanwhile reads go on (WAL) and find the turn before."""
    with opened(path) as turns:
        turns.put(KEY, TURN)
        with caplog.at_level(logging.WARNING, "trimflow"):
            with sqlite_held_by_another_process(path):
                turns.put(KEY, TURN._replace(cut=1))
                turns.put(KEY, TURN._replace(cut=3))  # the conversation's newer turn takes its place in the queue
                assert turns.get(KEY) == TURN
            wait_for(lambda: turns.get(KEY) == TURN._replace(cut=3), "the held write, once the lock was gone")
        assert turns.writes_dropped == 0 and turns.in_use and cuts_seen_elsewhere(path) == {KEY: 3}
    assert caplog.records == []


def test_turns_the_writing_thread_is_trying_count_toward_max_pending(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the writing thread tries the held file, what it took from the queue still waits: a new conversation finds
    no room, and a newer turn of one of those it holds goes in its place (not behind an older one put back)."""
    monkeypatch.setattr(_last_turns, "MAX_PENDING", 2)
    trying, go_on = threading.Event(), threading.Event()
    write_waiting = LastTurns._write_waiting

    def held_in_the_attempt(self: LastTurns, *args: Any) -> None:
        trying.set()
        go_on.wait(60)
        write_waiting(self, *args)

    monkeypatch.setattr(LastTurns, "_write_waiting", held_in_the_attempt)
    keys = [conversation_key("h", None, bytes([i])) for i in range(3)]
    with opened(path) as turns:
        turns.put(keys[0], TURN)
        with sqlite_held_by_another_process(path):
            turns.put(keys[0], TURN._replace(cut=1))
            assert trying.wait(60)  # the writing thread holds the turn of keys[0]
            turns.put(keys[1], TURN._replace(cut=1))
            turns.put(keys[2], TURN._replace(cut=1))
            turns.put(keys[0], TURN._replace(cut=2))
            assert turns.writes_dropped == 1
            go_on.set()
        wait_for(lambda: turns.get(keys[1]) is not None and turns.get(keys[0]) == TURN._replace(cut=2), "the waiting writes")
        assert turns.get(keys[2]) is None


def test_past_max_pending_conversations_a_held_write_is_dropped_and_counted(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_last_turns, "MAX_PENDING", 2)
    keys = [conversation_key("h", None, bytes([i])) for i in range(3)]
    with opened(path) as turns:
        turns.put(keys[0], TURN)
        with sqlite_held_by_another_process(path):
            for key in keys:
                turns.put(key, TURN._replace(cut=1))
            turns.put(keys[0], TURN._replace(cut=2))  # a newer turn of a waiting conversation: no room needed
            assert turns.writes_dropped == 1
        wait_for(lambda: turns.get(keys[1]) is not None and turns.get(keys[0]) == TURN._replace(cut=2), "the waiting writes")
        assert turns.get(keys[2]) is None


def test_an_older_turn_never_replaces_a_newer_one_nor_the_same_turn_cut_further(path: Path) -> None:
    """A write that waited for the file may go after another process wrote the conversation's next turn, or after the
    same turn again with more cut (a retry's): turns may be written in any order."""
    with opened(path, now=1000.5) as turns, opened(path, now=1000.5) as other:
        other.put(KEY, TURN._replace(sent_at=1000.5, cut=3))
        turns.put(KEY, TURN)
        turns.put(KEY, TURN._replace(sent_at=1000.5, cut=1))
        assert turns.get(KEY) == TURN._replace(sent_at=1000.5, cut=3)
        other.put(KEY, TURN._replace(sent_at=1000.5, cut=3))  # the same row again: written
        assert turns.writes_dropped == other.writes_dropped == 0


@pytest.mark.parametrize("lock", SQLITE_LOCKS)
def test_a_file_held_when_first_used_is_a_moment_and_sharing_resumes_once_it_is_free(path: Path, lock: str, caplog: pytest.LogCaptureFixture) -> None:
    with opened(path) as first:
        first.put(KEY, TURN)
    other = conversation_key("h", None, b"other")
    with caplog.at_level(logging.WARNING, "trimflow"), opened(path) as turns:
        with sqlite_held_by_another_process(path, lock):
            found = turns.get(KEY)  # the whole file held: nothing read this once
            assert found == (TURN if lock == "a write in progress" else None)
            turns.put(other, TURN)
            assert turns.in_use
        wait_for(lambda: turns.get(KEY) == TURN and turns.get(other) == TURN, "the file read and written once it was free")
        assert turns.in_use and turns.writes_dropped == 0 and cuts_seen_elsewhere(path) == {KEY: 2, other: 2}
    assert caplog.records == []


PLANTED = {
    "trigger": "CREATE TABLE seen (x); CREATE TRIGGER spy AFTER INSERT ON last_turn BEGIN INSERT INTO seen VALUES (zeroblob(1000)); END",
    "update trigger": "CREATE TABLE seen (x); CREATE TRIGGER spy BEFORE UPDATE ON last_turn BEGIN INSERT INTO seen VALUES (1); END",
    "view": "CREATE VIEW last_turn_view AS SELECT * FROM last_turn",
    "extra index": "CREATE INDEX slow ON last_turn (length(zeroblob(1000000)))",
    "extra table": "CREATE TABLE notes (x)",
    "changed table": "DROP TABLE last_turn; "
    "CREATE TABLE last_turn (conversation BLOB PRIMARY KEY, sent_at REAL NOT NULL, cut INTEGER NOT NULL, images BLOB NOT NULL, "
    "x BLOB AS (zeroblob(1000000)) STORED) WITHOUT ROWID",
}


def plant(path: Path, sql: str) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(sql)
    db.close()


def planted_ran(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT count(*) FROM seen").fetchone()[0]
    except sqlite3.OperationalError:  # no such table
        return 0
    finally:
        db.close()


@pytest.mark.parametrize("what", PLANTED)
def test_a_file_with_a_schema_object_trimflow_did_not_make_is_refused_with_one_line(path: Path, what: str, caplog: pytest.LogCaptureFixture) -> None:
    with opened(path) as first:
        first.put(KEY, TURN)
    plant(path, PLANTED[what])
    with caplog.at_level(logging.WARNING, "trimflow"), opened(path) as turns:
        assert turns.get(KEY) is None
        for cut in (1, 2, 3):
            turns.put(KEY, TURN._replace(cut=cut))
        assert not turns.in_use
    assert planted_ran(path) == 0
    (line,) = [r.getMessage() for r in caplog.records]
    assert "not used: schema objects trimflow did not make (" in line, line


def test_a_trigger_planted_while_the_file_is_in_use_never_runs(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "trimflow"), opened(path) as turns:
        turns.put(KEY, TURN)
        assert turns.get(KEY) == TURN
        plant(path, PLANTED["update trigger"])
        turns.put(KEY, TURN._replace(cut=3))
        assert turns.get(KEY) is None and not turns.in_use
    assert planted_ran(path) == 0 and len(caplog.records) == 1


def test_a_huge_value_in_a_row_is_never_read_into_memory(path: Path) -> None:
    with opened(path) as turns:
        turns.put(KEY, TURN)
        db = sqlite3.connect(path)
        with db:
            db.execute("UPDATE last_turn SET images = zeroblob(8 << 20), cut = 'x' || zeroblob(4 << 20)")
            db.execute("INSERT INTO last_turn VALUES (?, zeroblob(8 << 20), 0, x'')", (OTHER,))
        db.close()
        tracemalloc.start()
        try:
            assert turns.get(KEY) is None and turns.get(OTHER) is None
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20
        turns.put(KEY, TURN)  # written over: it was never read
        turns.put(OTHER, TURN)  # cannot be (its time would have to be read): this turn is not shared
        assert turns.get_many([KEY, OTHER]) == [TURN, None] and turns.in_use and turns.writes_dropped == 1


def test_a_fifo_in_place_of_the_file_or_its_log_is_refused_by_name(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fifo = tmp_path / "fifo.sqlite3"
    os.mkfifo(fifo)
    logged = tmp_path / "logged.sqlite3"
    os.mkfifo(f"{logged}-wal")
    with caplog.at_level(logging.WARNING, "trimflow"):
        for where in (fifo, logged):
            with opened(where) as turns:
                assert turns.get(KEY) is None and not turns.in_use
    reasons = [r.getMessage().split(" not used: ")[1].split(";")[0] for r in caplog.records]
    assert reasons == ["not a regular file", "its wal file is not a regular file"]


def test_keys_are_the_same_in_every_process_and_tell_conversations_apart() -> None:
    script = "from trimflow._last_turns import conversation_key; print(conversation_key('h', 's', b'o').hex())"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "addon"), "PYTHONHASHSEED": "random"}
    other = subprocess.run([sys.executable, "-c", script], check=True, env=env, capture_output=True, text=True, timeout=60)
    assert other.stdout.strip() == conversation_key("h", "s", b"o").hex()
    keys = {conversation_key(h, s, o) for h in ("h", "g") for s in (None, "s") for o in (b"o", b"p")}
    assert len(keys) == 8 and all(len(k) == 16 for k in keys)
    rows = {row for key in keys for row in row_keys(key)}  # the rows of conversations that open alike
    assert len(rows) == 8 * _last_turns.SLOTS and all(len(row) == 16 and row_keys(row[:16]) for row in rows)
    assert all(row_keys(key)[0] == key for key in keys)
    assert not math.isnan(TURN.sent_at)


def test_a_turn_with_no_image_after_one_the_file_holds_so_is_not_written_again(path: Path) -> None:
    text = LastTurn(1000.0, 0, ())
    with opened(path, now=1010.0) as turns, opened(path, now=1010.0) as other:
        turns.put(KEY, text)
        assert turns.get(KEY) == text
        turns.put(KEY, text._replace(sent_at=1001.0))  # nothing another process reads but the time: not written
        assert other.get(KEY) == text
        other.put(OTHER, text)  # another connection wrote: what this one knows is read again, and the turn written
        turns.put(KEY, text._replace(sent_at=1002.0))
        assert other.get(KEY) == text._replace(sent_at=1002.0)
        turns.put(KEY, TURN._replace(sent_at=1003.0))  # images: written
        assert other.get(KEY) == TURN._replace(sent_at=1003.0)
        turns.put(KEY, text._replace(sent_at=1004.0))  # none after a row with images: written
        assert other.get(KEY) == text._replace(sent_at=1004.0)
        assert turns.writes_dropped == other.writes_dropped == 0


def test_a_turn_with_no_image_is_written_while_an_earlier_one_waits(path: Path) -> None:
    text = LastTurn(1000.0, 0, ())
    with opened(path, now=1010.0) as turns:
        turns.put(KEY, text)
        assert turns.get(KEY) == text
        with sqlite_held_by_another_process(path):
            turns.put(KEY, TURN._replace(sent_at=1001.0))  # held: it waits for the writing thread
            turns.put(KEY, text._replace(sent_at=1002.0))  # waits too, as the newer turn: never skipped
        wait_for(lambda: turns.get(KEY) == text._replace(sent_at=1002.0), "the newer turn written once the file is free")
