"""Codex's rollout files (a file made by Codex 0.169.0: one screenshot attached with -i, ten through view_image):
which items resume sends, compactions, the thread index beside the sessions, and where sessions are found."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import orjson
import pytest

from trimflow.repair import _codex
from trimflow.repair._lines import Line, split_lines
from trimflow.repair._repair import repair_lines

from .helpers import SESSIONS, fixture, make_index, shipped_rules

THREAD = "01a20d5a-0fe4-7bd1-a5d3-5b1fc1f0b6b0"


def load() -> list[Line]:
    return split_lines((SESSIONS / "codex-10.jsonl").read_bytes())


def test_the_fixture_is_a_codex_rollout() -> None:
    lines = load()
    assert _codex.recognises(lines)
    assert _codex.thread_id(lines) == orjson.loads((SESSIONS / "codex-10.jsonl").read_bytes().split(b"\n", 1)[0])["payload"]["id"]


def test_resume_sends_every_response_item_with_the_attached_image_and_the_tools() -> None:
    replay = _codex.replay(load())
    assert replay.body["model"] == "gpt-5"
    kinds = [item.get("type") for item in replay.body["input"]]
    assert kinds.count("function_call_output") == 10
    attached = [item for item in replay.body["input"] if item.get("role") == "user" and any(p.get("type") == "input_image" for p in item["content"])]
    assert len(attached) == 1


def test_the_attached_image_is_the_users_and_the_tools_screenshots_go_before_it() -> None:
    """The image attached with -i is the oldest, and the user's: the view_image outputs after it are cut first."""
    lines = load()
    repaired = repair_lines(lines, _codex, shipped_rules())
    edited = [lines[edit.where[0]].value["payload"]["type"] for edit in repaired.edits]
    assert edited and set(edited) == {"function_call_output"}
    first = repaired.edits[0]
    assert first.new["type"] == "input_text" and first.new["text"].startswith("[trimflow: image #2 omitted (image/png, 48x32,")


def _compacted(history: list[object]) -> Line:
    value = {"timestamp": "2026-11-24T12:00:00.000Z", "type": "compacted", "payload": {"message": "summary", "replacement_history": history}}
    return Line(0, orjson.dumps(value), value)


def test_a_compaction_with_a_replacement_history_starts_the_history_again() -> None:
    lines = load()
    outputs = [line.value["payload"] for line in lines if line.value["payload"].get("type") == "function_call_output"]
    lines = [*lines, _compacted(outputs[-9:])]
    replay = _codex.replay(lines)
    assert len(replay.body["input"]) == 9
    repaired = repair_lines(lines, _codex, shipped_rules())
    assert (repaired.images_before, repaired.images_after) == (9, 3)
    assert {edit.where[0] for edit in repaired.edits} == {len(lines) - 1}  # only the compacted line: the rest is never sent
    assert all(edit.where[1][:2] == ("payload", "replacement_history") for edit in repaired.edits)


def test_a_compaction_without_a_replacement_history_keeps_no_image() -> None:
    lines = [*load(), _compacted([])]
    lines[-1].value["payload"].pop("replacement_history")
    assert _codex.replay(lines).body["input"] == []


def rows(database: Path, thread: str) -> int:
    with contextlib.closing(sqlite3.connect(database)) as connection:
        tables = ("thread_turns", "thread_items", "thread_history_projection_state")
        return sum(connection.execute(f"SELECT count(*) FROM {table} WHERE thread_id = ?", (thread,)).fetchone()[0] for table in tables)


def rollout_in(home: Path) -> Path:
    return fixture("codex-10.jsonl", home / "sessions" / "2026" / "11" / "24", "rollout-2026-11-24T11-00-00-x.jsonl")


def test_the_thread_index_drops_this_thread_once_the_file_is_replaced(tmp_path: Path) -> None:
    rollout = rollout_in(tmp_path)
    thread = _codex.thread_id(load())
    assert thread is not None
    make_index(tmp_path / "thread_history_1.sqlite", [thread, "another-thread"])
    with _codex.index_reset(rollout, load()) as notes:
        assert rows(tmp_path / "thread_history_1.sqlite", thread) == 3  # not yet: committed after the replacement
    assert rows(tmp_path / "thread_history_1.sqlite", thread) == 0
    assert rows(tmp_path / "thread_history_1.sqlite", "another-thread") == 3
    assert notes == ["dropped the thread from Codex's index thread_history_1.sqlite: Codex rebuilds it from the file when it opens the thread"]


def test_a_failed_replacement_leaves_the_index_as_it_was(tmp_path: Path) -> None:
    rollout = rollout_in(tmp_path)
    thread = _codex.thread_id(load())
    assert thread is not None
    make_index(tmp_path / "thread_history_1.sqlite", [thread])
    with pytest.raises(OSError), _codex.index_reset(rollout, load()):
        raise OSError("the rename failed")
    assert rows(tmp_path / "thread_history_1.sqlite", thread) == 3


def test_an_index_another_process_holds_is_named_and_the_repair_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rollout = rollout_in(tmp_path)
    thread = _codex.thread_id(load())
    assert thread is not None
    make_index(tmp_path / "thread_history_1.sqlite", [thread])
    monkeypatch.setattr(_codex, "_LOCK_WAIT", 0.1)
    holder = sqlite3.connect(tmp_path / "thread_history_1.sqlite", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with _codex.index_reset(rollout, load()) as notes:
            pass
    finally:
        holder.rollback()
        holder.close()
    assert len(notes) == 1 and notes[0].startswith("could not update Codex's thread index thread_history_1.sqlite (database is locked)")
    assert rows(tmp_path / "thread_history_1.sqlite", thread) == 3


def test_a_rollout_outside_a_codex_home_has_no_index_to_reset(tmp_path: Path) -> None:
    rollout = fixture("codex-10.jsonl", tmp_path)
    assert _codex.home_of(rollout) is None
    with _codex.index_reset(rollout, load()) as notes:
        pass
    assert notes == []


def test_find_looks_in_codex_home_sessions_and_archived_sessions(tmp_path: Path) -> None:
    live = fixture("codex-10.jsonl", tmp_path / "sessions" / "2026" / "11" / "24", f"rollout-2026-11-24T11-00-00-{THREAD}.jsonl")
    archived = fixture("codex-10.jsonl", tmp_path / "archived_sessions", f"rollout-2026-10-01T09-00-00-{THREAD}.jsonl")
    assert _codex.find(THREAD, {"CODEX_HOME": str(tmp_path)}) == sorted([live, archived])
    assert _codex.find(THREAD, {"HOME": str(tmp_path)}) == []  # ~/.codex when CODEX_HOME is unset
    assert _codex.home({"HOME": "/h"}) == Path("/h/.codex")
