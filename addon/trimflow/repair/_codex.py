"""Codex's rollout files: `$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<session id>.jsonl`.

One JSON object per line, `{"timestamp", "type", "payload"}`, the first a `session_meta`. Each
`response_item` payload is a Responses API input item, and resuming sends them again in order: user
messages (images attached with `-i` are `input_image` parts), function calls, and their outputs
(`view_image` answers with an `input_image` in `function_call_output.output`). A `compacted` line with a
`replacement_history` replaces everything before it; one without (an older summary) keeps no image.

Codex also keeps an index of each rollout in `$CODEX_HOME/thread_history_*.sqlite` (its thread history
projection: turns and items with their byte offsets in the file, and how far it has read). A repaired file
is shorter, so those offsets no longer hold: Codex then stops indexing the thread's new turns ("durable
rollout shrank"). The repair drops the thread's rows from that index, which Codex rebuilds from the file the
next time it opens the thread (resume does). Its `state_*.sqlite` names the file by path, which stays.
"""

from __future__ import annotations

import glob
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..formats import JsonPath, openai_responses
from ._lines import Line
from ._repair import Edit, Replay, Where

NAME = "codex"
HOST = "api.openai.com"
PATH = "/v1/responses"
# How long to wait for Codex's index while a Codex process writes to it (seconds).
_LOCK_WAIT = 5.0
# The index's tables that hold a thread's rows; Codex itself clears a thread from them by thread_id.
_INDEX_TABLES = ("thread_items", "thread_realtime_items", "thread_turns", "thread_history_projection_state")


def recognises(lines: Sequence[Line]) -> bool:
    first = next((line.value for line in lines if line.value is not None), None)
    return isinstance(first, dict) and first.get("type") == "session_meta" and isinstance(first.get("payload"), dict)


def thread_id(lines: Sequence[Line]) -> str | None:
    for line in lines:
        value = line.value
        if isinstance(value, dict) and value.get("type") == "session_meta":
            payload = value.get("payload")
            found = payload.get("id") if isinstance(payload, dict) else None
            return found if isinstance(found, str) else None
    return None


def replay(lines: Sequence[Line]) -> Replay:
    items: list[tuple[int, JsonPath, Any]] = []
    model = None
    for index, line in enumerate(lines):
        value = line.value
        if not isinstance(value, dict) or not isinstance(value.get("payload"), dict):
            continue
        kind, payload = value.get("type"), value["payload"]
        if kind == "response_item":
            items.append((index, ("payload",), payload))
        elif kind == "compacted":
            history = payload.get("replacement_history")
            history = history if isinstance(history, list) else []
            items = [(index, ("payload", "replacement_history", k), item) for k, item in enumerate(history) if isinstance(item, dict)]
        elif kind == "turn_context" and isinstance(payload.get("model"), str):
            model = payload["model"]
    body: dict[str, Any] = {"input": [item for _, _, item in items]}
    if model is not None:
        body = {"model": model, **body}

    def locate(path: JsonPath) -> Where | None:
        if len(path) < 2 or path[0] != "input" or not isinstance(path[1], int):
            return None
        index, prefix, _ = items[path[1]]
        return index, (*prefix, *path[2:])

    return Replay(openai_responses.NAME, HOST, PATH, body, locate)


def copies(lines: Sequence[Line], edits: Sequence[Edit]) -> list[Edit]:
    return []  # Codex keeps no second copy of an image: its events name the file


# --- where sessions are, and the index beside them --------------------------------------------------------


def home(env: Mapping[str, str]) -> Path:
    configured = env.get("CODEX_HOME")
    return Path(configured).expanduser() if configured else Path(env.get("HOME", "~")).expanduser() / ".codex"


def session_roots(env: Mapping[str, str]) -> list[Path]:
    return [home(env) / "sessions", home(env) / "archived_sessions"]


def find(session_id: str, env: Mapping[str, str]) -> list[Path]:
    found: list[Path] = []
    for root in session_roots(env):
        if root.is_dir():
            found += (p for p in root.rglob(f"rollout-*-{glob.escape(session_id)}.jsonl") if p.is_file())
    return sorted(found)


def home_of(rollout: Path) -> Path | None:
    """The CODEX_HOME a rollout file lives in (`<home>/sessions/YYYY/MM/DD/<file>`), when it is laid out so."""
    parents = rollout.parents
    if len(parents) > 4 and parents[3].name in ("sessions", "archived_sessions"):
        return parents[4]
    return None


@contextmanager
def index_reset(rollout: Path, lines: Sequence[Line]) -> Iterator[list[str]]:
    """Around the file's replacement: holds the write lock of Codex's thread index, drops the thread's rows,
    and commits once the new file is in place (rolls back when the replacement fails). Yields the notes
    to print: what was dropped, or why the index could not be reached (the file is repaired either way)."""
    notes: list[str] = []
    thread = thread_id(lines)
    codex_home = home_of(rollout)
    databases = sorted(codex_home.glob("thread_history_*.sqlite")) if codex_home is not None and thread is not None else []
    connections: list[tuple[Path, sqlite3.Connection]] = []
    try:
        for database in databases:
            try:
                connection = sqlite3.connect(database, timeout=_LOCK_WAIT, isolation_level=None)
            except sqlite3.Error as exc:
                notes.append(f"could not open Codex's thread index {database.name} ({exc}): Codex stops indexing this thread's new turns")
                continue
            try:
                connection.execute("BEGIN IMMEDIATE")
                dropped = 0
                for table in _INDEX_TABLES:
                    if _has_thread_column(connection, table):
                        dropped += connection.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread,)).rowcount
                connections.append((database, connection))
                if dropped:
                    notes.append(f"dropped the thread from Codex's index {database.name}: Codex rebuilds it from the file when it opens the thread")
            except sqlite3.Error as exc:
                connection.close()
                notes.append(f"could not update Codex's thread index {database.name} ({exc}): Codex stops indexing this thread's new turns")
        yield notes
    except BaseException:
        for _, connection in connections:
            connection.rollback()
            connection.close()
        raise
    for database, connection in connections:
        try:
            connection.commit()
        except sqlite3.Error as exc:
            notes.append(f"could not update Codex's thread index {database.name} ({exc}): Codex stops indexing this thread's new turns")
        finally:
            connection.close()


def _has_thread_column(connection: sqlite3.Connection, table: str) -> bool:
    columns = connection.execute(f"PRAGMA table_info({table})").fetchall()  # no rows: no such table
    return any(column[1] == "thread_id" for column in columns)
