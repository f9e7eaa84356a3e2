"""Shared by the repair tests: the session fixtures made by the real CLIs (tests/data/make_sessions.py), the
shipped rules, what a file's lines look like to compare them, and a process that holds a file open."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

from trimflow._rules import Rules
from trimflow._rules_file import DEFAULT_RULES_PATH, load_rules

SESSIONS = Path(__file__).resolve().parents[1] / "data" / "sessions"
# The fixtures, with the images each agent's resume sends (measured with the real CLIs against the fake
# provider) and the images it sends once repaired under the shipped rules: a cap of 8 (Claude, Codex's GPT-5), 10
# (Gemini). Over the cap, the cut moves down to the shipped low-water mark: 3 of 8, 5 of 10 (a resumed session's
# prompt cache is cold, as after any pause past its lifetime).
FIXTURES = {
    "claude-10.jsonl": ("claude", 10, 3),
    "claude-10-resumed.jsonl": ("claude", 10, 3),
    "claude-compacted.jsonl": ("claude", 12, 3),
    "codex-10.jsonl": ("codex", 11, 3),
    "gemini-10.jsonl": ("gemini", 20, 5),
    "gemini-10-resumed.jsonl": ("gemini", 20, 5),
}
# A model of each agent's fixtures, for the rule that applies to them.
MODELS = {"claude": "claude-sonnet-4-5", "codex": "gpt-5-codex", "gemini": "gemini-2.5-pro"}
PROMPT = "Look at the screenshots in this folder"  # the fixtures' prompt: never in any output


def shipped_rules() -> Rules:
    return load_rules(DEFAULT_RULES_PATH)


def shipped_cap(agent: str) -> int:
    """The most images the shipped rules let a request of `agent`'s model send."""
    cap = shipped_rules().limits_for("", "", MODELS[agent]).max_images
    assert cap is not None
    return cap


def fixture(name: str, folder: Path, as_name: str | None = None) -> Path:
    """A copy of a fixture in `folder` (the tests change copies only)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / (as_name or name)
    shutil.copyfile(SESSIONS / name, target)
    return target


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")


@contextlib.contextmanager
def held_open(path: Path, redirect: str = "<") -> Iterator[int]:
    """A `sleep` process holding `path` open (`redirect`: the shell's "<" to read, ">>" to append) while the block runs;
    yields its pid once the file is open, and kills it (its pipe closed) after."""
    with subprocess.Popen(["sh", "-c", f'exec 3{redirect}"$1"; echo ready; exec sleep 30', "sh", str(path)], stdout=subprocess.PIPE) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"ready\n"
            yield holder.pid
        finally:
            holder.kill()


def make_index(database: Path, threads: list[str]) -> None:
    """A Codex thread index (its thread_history_*.sqlite) holding rows of `threads`, and a table of no thread."""
    with contextlib.closing(sqlite3.connect(database)) as connection, connection:
        connection.executescript(
            "CREATE TABLE thread_turns (thread_id TEXT, turn_id TEXT, rollout_byte_offset INTEGER);"
            "CREATE TABLE thread_items (thread_id TEXT, item_id TEXT);"
            "CREATE TABLE thread_history_projection_state (thread_id TEXT PRIMARY KEY, next_rollout_byte_offset INTEGER);"
            "CREATE TABLE unrelated (id TEXT);"
        )
        for thread in threads:
            connection.execute("INSERT INTO thread_turns VALUES (?, 't1', 21807)", (thread,))
            connection.execute("INSERT INTO thread_items VALUES (?, 'i1')", (thread,))
            connection.execute("INSERT INTO thread_history_projection_state VALUES (?, 1623017)", (thread,))
