"""`python -m trimflow learned`: lists each entry with what it does and when it expires, forgets what is asked and
nothing else, never changes a file it cannot read, and shows a hostile file's text as escapes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trimflow._learned_limits import Entry, load_learned, write_entries
from trimflow._record import utc_timestamp
from trimflow.cli._learned import main

OPENAI, LOCAL = "https://api.openai.com:443", "http://127.0.0.1:8001"


@pytest.fixture
def learned(tmp_path: Path) -> Path:
    path = tmp_path / "learned.yaml"
    now = utc_timestamp()
    write_entries(
        path,
        [
            Entry(OPENAI, "gpt-4o", "max_images", 10, "400 general: Too many images. Max is 10.", now),
            Entry(OPENAI, None, "max_body_bytes", 20 * 2**20, "413 bare-413", now),
            Entry(LOCAL, "m", "max_images", 4, "400 general", "2020-01-01T00:00:00.000Z"),
        ],
    )
    return path


def test_list_says_what_each_entry_does_and_when_it_expires(learned: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--file", str(learned)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{learned}: 3 learned limits, 2 apply now\n")
    assert f"{OPENAI}  gpt-4o  max_images=10" in out
    assert f"{OPENAI}  every model  max_body_bytes=20971520" in out
    assert "from: 400 general: Too many images. Max is 10." in out
    assert "expires in 6d 23h" in out and "(expired)" in out
    assert f"requests for gpt-4o sent to {OPENAI} are cut to max_images=10 where the rules allow more" in out


def test_forget_removes_what_matches_every_filter_and_nothing_else(learned: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--file", str(learned), "forget", "--upstream", OPENAI, "--model", "every"]) == 0
    assert capsys.readouterr().out == f"{learned}: forgot 1 learned limits, 2 left\n"
    assert sorted((e.upstream, e.model) for e in load_learned(learned)) == [(LOCAL, "m"), (OPENAI, "gpt-4o")]
    assert main(["--file", str(learned), "forget", "--all"]) == 0
    assert load_learned(learned) == []
    assert learned.stat().st_mode & 0o777 == 0o600


def test_forget_needs_a_filter(learned: Path) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["--file", str(learned), "forget"])
    assert raised.value.code == 2


def test_a_file_that_cannot_be_read_is_named_and_never_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "learned.yaml"
    path.write_text("learned: [\n")
    assert main(["--file", str(path), "forget", "--all"]) == 1
    assert path.read_text() == "learned: [\n"
    assert "YAML syntax error" in capsys.readouterr().err


def test_a_hostile_file_cannot_move_the_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "learned.yaml"
    write_entries(path, [Entry(OPENAI, "m\x1b[2J\n::error::x", "max_images", 4, "400 general: \x1b]0;owned\x07", utc_timestamp())])
    assert main(["--file", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\n::error" not in out
    assert "m\\x1b[2J\\n::error::x" in out


def test_it_runs_as_a_user_runs_it(learned: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "trimflow", "learned", "--file", str(learned), "list"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "3 learned limits" in done.stdout
