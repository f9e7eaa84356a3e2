"""trimflow._last_turns: the file of each conversation's last turn that trimflow processes share. What one process
writes another reads; what is read is checked first; the file stays bounded and private; and no error of the file
ever reaches a request (one log line, then each process keeps its own memory)."""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trimflow import _last_turns
from trimflow._last_turns import MAX_AGE, MAX_IMAGES, LastTurn, LastTurns, conversation_key

from .helpers import ROOT

KEY = conversation_key("api.example.test", None, b"origin01")
TURN = LastTurn(1000.0, 2, ((b"key-0001", 1), (b"key-0002", 0), (b"key-0003", 0xFFFFFFFF)))


@pytest.fixture
def path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "conversations.sqlite3"


def opened(path: Path, now: float = 1000.0) -> LastTurns:
    return LastTurns(str(path), clock=lambda: now)


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
        db = sqlite3.connect(path)
        left = db.execute("SELECT count(*) FROM last_turn").fetchone()[0]
        db.close()
        assert left == 3 and [turns.get(k) is not None for k in keys] == [False, False, True, True, True]


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


def test_a_write_another_process_holds_up_is_dropped_not_waited_for_without_end(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with opened(path) as turns:
        turns.put(KEY, TURN)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process's write, in progress
        try:
            with caplog.at_level(logging.WARNING, "trimflow"):
                turns.put(KEY, TURN._replace(cut=3))
            assert turns.get(KEY) == TURN  # readers never wait (WAL): the turn before
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert turns.writes_dropped == 1
        turns.put(KEY, TURN._replace(cut=3))
        assert turns.get(KEY).cut == 3 and turns.in_use  # the file is still used
    assert caplog.records == []


def test_keys_are_the_same_in_every_process_and_tell_conversations_apart() -> None:
    script = "from trimflow._last_turns import conversation_key; print(conversation_key('h', 's', b'o').hex())"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "addon"), "PYTHONHASHSEED": "random"}
    other = subprocess.run([sys.executable, "-c", script], check=True, env=env, capture_output=True, text=True, timeout=60)
    assert other.stdout.strip() == conversation_key("h", "s", b"o").hex()
    keys = {conversation_key(h, s, o) for h in ("h", "g") for s in (None, "s") for o in (b"o", b"p")}
    assert len(keys) == 8 and all(len(k) == 16 for k in keys)
    assert not math.isnan(TURN.sent_at)
