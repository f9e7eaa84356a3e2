"""`scripts/repair` (python -m trimflow repair): what it prints per file, PATH as a file, a folder or a session id,
--dry-run, --agent, --rules, and each bad input: one line saying why, the file untouched, exit 1."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

from trimflow.repair import _files
from trimflow.repair._cli import _replace_notes, main

from ..helpers import wait_for
from .helpers import FIXTURES, PROMPT, SESSIONS, fixture, held_open, make_index

ROOT = Path(__file__).resolve().parents[2]
CLAUDE_ID = "b2ef49b4-fbde-4459-8911-df53861ca13b"
# As root, file permissions only hold once the capabilities that override them are dropped.
AS_A_USER = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
LINE = re.compile(
    r"trimflow repair: (?P<path>\S+): (?P<agent>Claude Code|Codex|Gemini CLI) session, images (?P<before>\d+)->(?P<after>\d+), "
    r"file (?P<size>[\d.]+(?: [KMG]?B)?->[\d.]+ [KMG]?B) \((?P<done>backup \S+|dry run, nothing written)\)"
)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_no_session_text(text: str) -> None:
    assert PROMPT not in text and "iVBOR" not in text and "base64" not in text


def test_a_file_is_repaired_with_one_line_saying_what_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = fixture("claude-10.jsonl", tmp_path)
    original = path.read_bytes()
    code, out, err = run(capsys, str(path))
    assert code == 0 and err == ""
    found = LINE.fullmatch(out.strip())
    assert found is not None, out
    assert (found["agent"], found["before"], found["after"]) == ("Claude Code", "10", str(FIXTURES["claude-10.jsonl"][2]))
    backup = tmp_path / found["done"].removeprefix("backup ")
    assert backup.read_bytes() == original
    assert len(path.read_bytes()) < len(original)
    assert_no_session_text(out)


def test_dry_run_says_what_would_change_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = fixture("gemini-10.jsonl", tmp_path)
    code, out, _ = run(capsys, "--dry-run", str(path))
    found = LINE.fullmatch(out.strip())
    assert code == 0 and found is not None and found["done"] == "dry run, nothing written"
    _, before, after = FIXTURES["gemini-10.jsonl"]
    assert (found["before"], found["after"]) == (str(before), str(after))
    assert path.read_bytes() == (SESSIONS / "gemini-10.jsonl").read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["gemini-10.jsonl"]


def test_a_session_within_the_rules_is_left_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = fixture("codex-10.jsonl", tmp_path)
    rules = tmp_path / "loose.yaml"
    rules.write_text("defaults:\n  max_images: 20\n")
    code, out, _ = run(capsys, "--rules", str(rules), str(path))
    assert code == 0
    assert out == f"trimflow repair: {path}: Codex session, images 11->11, file 106KB: nothing to prune\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["codex-10.jsonl", "loose.yaml"]


def test_a_folder_repairs_every_session_in_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in FIXTURES:
        fixture(name, tmp_path / "sessions" / name.split("-")[0])
    code, out, err = run(capsys, str(tmp_path / "sessions"))
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert len(lines) == len(FIXTURES)
    for line in lines:
        found = LINE.fullmatch(line)
        assert found is not None, line
        _, before, after = FIXTURES[Path(found["path"]).name]
        assert (int(found["before"]), int(found["after"])) == (before, after)


def test_a_folder_skips_files_of_json_lines_that_are_no_session(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Pointed at ~/.codex or ~/.claude, the prompt history (history.jsonl) beside the sessions is passed over."""
    history = tmp_path / "codex" / "history.jsonl"
    history.parent.mkdir()
    history.write_bytes(b'{"session_id":"x","ts":1,"text":"a prompt"}\n')
    fixture("codex-10.jsonl", tmp_path / "codex" / "sessions")
    code, out, err = run(capsys, str(tmp_path / "codex"))
    assert code == 0 and err == ""
    assert out.splitlines()[0] == f"trimflow repair: {history}: skipped: is not a session file of a known agent (Claude Code, Codex or Gemini CLI)"
    assert LINE.fullmatch(out.splitlines()[1]) is not None
    assert history.read_bytes() == b'{"session_id":"x","ts":1,"text":"a prompt"}\n'


def test_a_session_id_is_found_in_each_agents_default_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "claude"))
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "codex"))
    monkeypatch.setenv("GEMINI_CLI_HOME", str(tmp_path / "gemini"))
    claude = fixture("claude-10.jsonl", tmp_path / "claude" / "projects" / "-work", f"{CLAUDE_ID}.jsonl")
    codex_id = orjson.loads((SESSIONS / "codex-10.jsonl").read_bytes().split(b"\n", 1)[0])["payload"]["id"]
    codex = fixture("codex-10.jsonl", tmp_path / "codex" / "sessions" / "2026" / "11" / "24", f"rollout-2026-11-24T11-00-00-{codex_id}.jsonl")
    gemini_id = orjson.loads((SESSIONS / "gemini-10.jsonl").read_bytes().split(b"\n", 1)[0])["sessionId"]
    gemini = fixture("gemini-10.jsonl", tmp_path / "gemini" / ".gemini" / "tmp" / "work" / "chats", f"session-2026-11-24T11-00-{gemini_id[:8]}.jsonl")
    code, out, err = run(capsys, CLAUDE_ID, codex_id, gemini_id)
    assert code == 0 and err == ""
    assert [LINE.fullmatch(line)["path"] for line in out.splitlines()] == [str(claude), str(codex), str(gemini)]  # type: ignore[index]
    code, _, err = run(capsys, "--agent", "codex", CLAUDE_ID)
    assert code == 1
    roots = f"{tmp_path}/codex/sessions, {tmp_path}/codex/archived_sessions"
    assert err == f"trimflow repair: {CLAUDE_ID}: no such file, and no session with this id in {roots}\n"


def test_agent_names_what_the_file_must_be(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = fixture("claude-10.jsonl", tmp_path)
    code, out, err = run(capsys, "--agent", "codex", str(path))
    assert (code, out) == (1, "")
    assert err == f"trimflow repair: {path}: is not a Codex session file; file untouched\n"


def bad(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "s.jsonl"
    path.write_bytes(data)
    return path


CLAUDE = (SESSIONS / "claude-10.jsonl").read_bytes()
LAST_LINE = CLAUDE.count(b"\n")  # the cut copy below keeps every newline but the last line's
CUT_SHORT = f"the last line ({LAST_LINE}) is cut short: the agent may still be writing it, or was killed mid-write"


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b'{"event":"start"}\n{"event":"stop"}\n', "is not a session file of a known agent (Claude Code, Codex or Gemini CLI)"),
        (CLAUDE[: len(CLAUDE) - 300], CUT_SHORT),
        (CLAUDE.replace(b"\n", b"\nnot json at all\n", 1), "line 2 is not JSON ("),
        (b"", "is not a session file of a known agent"),
    ],
    ids=["unknown format", "cut short", "not JSON", "empty"],
)
def test_a_broken_file_gets_one_line_and_is_untouched(tmp_path: Path, capsys: pytest.CaptureFixture[str], data: bytes, says: str) -> None:
    path = bad(tmp_path, data)
    code, out, err = run(capsys, str(path))
    assert (code, out) == (1, "")
    assert err.startswith(f"trimflow repair: {path}: {says}") and err.endswith("; file untouched\n") and err.count("\n") == 1
    assert path.read_bytes() == data and [p.name for p in tmp_path.iterdir()] == ["s.jsonl"]
    assert_no_session_text(err)


def test_a_read_only_file_is_untouched(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = fixture("codex-10.jsonl", tmp_path)
    path.chmod(0o444)
    code, _, err = run(capsys, str(path))
    assert code == 1 and err == f"trimflow repair: {path}: is read-only (make it writable to repair it); file untouched\n"
    assert path.read_bytes() == (SESSIONS / "codex-10.jsonl").read_bytes()
    code, out, _ = run(capsys, "--dry-run", str(path))  # a dry run writes nothing: it may look
    assert code == 0 and "dry run" in out


def cli_as_a_user(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "addon")}
    return subprocess.run([*AS_A_USER, sys.executable, "-m", "trimflow", "repair", *args], capture_output=True, text=True, env=env, timeout=120)


def test_an_unreadable_file_is_untouched(tmp_path: Path) -> None:
    path = fixture("gemini-10.jsonl", tmp_path)
    path.chmod(0)
    done = cli_as_a_user(str(path))
    path.chmod(0o600)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"trimflow repair: {path}: cannot be read (permission denied); file untouched\n"
    assert path.read_bytes() == (SESSIONS / "gemini-10.jsonl").read_bytes()


def test_a_file_in_a_folder_it_cannot_write_to_is_untouched(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    path = fixture("claude-10.jsonl", folder)
    folder.chmod(0o555)
    try:
        done = cli_as_a_user(str(path))
    finally:
        folder.chmod(0o755)
    assert done.returncode == 1
    why = "its folder is not writable (the repaired file and the backup are made beside it)"
    assert done.stderr == f"trimflow repair: {path}: {why}; file untouched\n"
    assert [p.name for p in folder.iterdir()] == ["claude-10.jsonl"]


def test_a_file_an_agent_still_holds_open_is_untouched(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = fixture("codex-10.jsonl", tmp_path)
    with held_open(path, ">>") as pid:
        code, _, err = run(capsys, str(path))
    assert code == 1
    assert err == f"trimflow repair: {path}: is open in sleep (pid {pid}): the agent may still be running; close it first; file untouched\n"


def test_a_file_an_agent_appends_to_while_it_is_repaired_loses_no_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Claude Code opens its transcript for each line it appends; lines keep coming during the repair."""
    path = fixture("claude-10.jsonl", tmp_path)
    original = path.read_bytes()
    stop, appended = threading.Event(), []

    def agent() -> None:
        while not stop.is_set():
            line = orjson.dumps({"type": "progress", "n": len(appended)}) + b"\n"
            with path.open("ab") as file:
                file.write(line)
            appended.append(line)
            time.sleep(0.001)

    writer = threading.Thread(target=agent)
    writer.start()
    try:
        wait_for(lambda: appended, "line appended by the agent")
        code, _, err = run(capsys, str(path))
    finally:
        stop.set()
        writer.join()
    assert code == 1
    assert re.fullmatch(rf"trimflow repair: {re.escape(str(path))}: changed while it was being (read|repaired)\S*.*; file untouched\n", err)
    assert path.read_bytes() == original + b"".join(appended)
    assert [p.name for p in tmp_path.iterdir()] == ["claude-10.jsonl"]


def test_one_bad_file_among_good_ones_exits_1_and_the_good_ones_are_repaired(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = fixture("claude-10.jsonl", tmp_path)
    broken = bad(tmp_path, b"{}\n")
    code, out, err = run(capsys, str(good), str(broken), str(tmp_path / "missing.jsonl"))
    assert code == 1
    assert LINE.fullmatch(out.strip()) is not None
    assert err.splitlines() == [
        f"trimflow repair: {broken}: is not a session file of a known agent (Claude Code, Codex or Gemini CLI); file untouched",
        f"trimflow repair: {tmp_path / 'missing.jsonl'}: no such file; file untouched",
    ]


def test_a_bad_rules_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules = tmp_path / "bad.yaml"
    rules.write_text("defaults:\n  max_images: -3\n")
    code, out, err = run(capsys, "--rules", str(rules), str(fixture("claude-10.jsonl", tmp_path)))
    assert (code, out) == (2, "")
    assert err.startswith(f"trimflow repair: {rules}:2: max_images")


def test_a_codex_rollout_in_its_home_says_the_index_was_dropped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rollout = fixture("codex-10.jsonl", tmp_path / "sessions" / "2026" / "11" / "24", "rollout-x.jsonl")
    make_index(tmp_path / "thread_history_1.sqlite", [orjson.loads(rollout.read_bytes().split(b"\n", 1)[0])["payload"]["id"]])
    code, out, _ = run(capsys, str(rollout))
    assert code == 0
    note = "dropped the thread from Codex's index thread_history_1.sqlite: Codex rebuilds it from the file when it opens the thread"
    assert out.splitlines()[1] == f"trimflow repair: {rollout}: {note}"


def test_the_command_runs_as_python_m_trimflow_repair(tmp_path: Path) -> None:
    path = fixture("gemini-10.jsonl", tmp_path)
    done = subprocess.run(
        [str(ROOT / "scripts" / "repair"), "--dry-run", str(path)], capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**os.environ}
    )
    assert done.returncode == 0, done.stderr
    assert LINE.fullmatch(done.stdout.strip()) is not None


def test_an_internal_error_in_one_file_names_only_its_kind_and_the_next_file_is_repaired(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trimflow.repair import _gemini

    def broken(lines: object) -> None:
        raise KeyError("a key from the file: Look at the screenshots")

    monkeypatch.setattr(_gemini, "replay", broken)
    gemini, claude = fixture("gemini-10.jsonl", tmp_path), fixture("claude-10.jsonl", tmp_path)
    code, out, err = run(capsys, str(gemini), str(claude))
    assert code == 1
    assert err == f"trimflow repair: {gemini}: internal error (KeyError); file untouched\n"
    assert gemini.read_bytes() == (SESSIONS / "gemini-10.jsonl").read_bytes()
    assert LINE.fullmatch(out.strip()) is not None


def test_the_backup_of_a_symlinked_session_is_printed_where_it_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The repair replaces the file the link points at and keeps the backup beside it, not beside the link."""
    real = fixture("claude-10.jsonl", tmp_path / "store")
    original = real.read_bytes()
    link = tmp_path / "projects" / "s.jsonl"
    link.parent.mkdir()
    link.symlink_to(real)
    code, out, err = run(capsys, str(link))
    found = LINE.fullmatch(out.strip())
    assert code == 0 and err == "" and found is not None, out + err
    backup = Path(found["done"].removeprefix("backup "))
    assert backup.is_absolute() and backup.parent == real.parent and backup.read_bytes() == original
    assert link.is_symlink() and len(real.read_bytes()) < len(original)
    assert [p.name for p in link.parent.iterdir()] == ["s.jsonl"]


def test_what_happened_to_the_agents_appends_is_said() -> None:
    replaced = _files.Replaced(Path("/s.jsonl.trimflow-backup-x"), carried=2048, stranded=10, still_open=("node (pid 7)",))
    assert _replace_notes(replaced) == [
        "the agent appended 2KB during the repair: carried over to the repaired file",
        "the agent appended 10B during the repair that is in the backup only (the file was replaced again meanwhile)",
        "the original is still open in node (pid 7): what it writes there goes to the backup",
    ]
    assert _replace_notes(_files.Replaced(Path("/b"))) == []
