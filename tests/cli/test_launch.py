"""trimflow.cli._launch before any process starts: a missing command, a taken port or a runs folder that cannot be made
is one line and its exit status (trimflow.cli._launch_error), and a run that cannot start leaves no folder behind
while the folders of runs whose launcher is gone are removed. Runs with mitmdump and an agent are in tests/e2e."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from trimflow.cli import _recall
from trimflow.cli._launch import main
from trimflow.cli._launch_error import EXIT_CANNOT_START, EXIT_NOT_FOUND
from trimflow.cli._run_dir import LAUNCHER_FILE


def environ(tmp_path: Path) -> dict[str, str]:
    """An environment whose runs folder is under tmp_path and whose PATH is tmp_path/bin (and the system's, for `true`)."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    return {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "state")}


def test_a_command_not_found_exits_127_in_one_line_before_any_folder_is_made(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--", "no-such-agent"], environ(tmp_path)) == EXIT_NOT_FOUND == 127
    assert capsys.readouterr().err == "trimflow run: no-such-agent: command not found\n"
    assert not (tmp_path / "state").exists()


def test_a_taken_port_exits_2_in_one_line_before_any_folder_is_made(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["-p", str(port), "--", "true"], environ(tmp_path)) == EXIT_CANNOT_START == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trimflow run: 127.0.0.1:{port} is taken (") and err.count("\n") == 1
    assert not (tmp_path / "state").exists()


def test_a_runs_folder_that_cannot_be_made_exits_2_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = environ(tmp_path)
    (tmp_path / "state").write_text("a file where the folder would go")
    assert main(["--", "true"], env) == 2
    assert capsys.readouterr().err == f"trimflow run: cannot make {tmp_path / 'state' / 'trimflow' / 'runs'} (Not a directory)\n"


def test_a_run_that_cannot_start_leaves_no_folder_and_removes_those_of_launchers_gone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_recall, "has_mcp", lambda: True)  # no line about recall, wherever the mcp package cannot be
    env = environ(tmp_path)
    agent = tmp_path / "bin" / "claude"
    agent.write_text("#!/bin/sh\nexit 0\n")
    agent.chmod(0o755)
    runs = tmp_path / "state" / "trimflow" / "runs"
    runs.mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = runs / f"20261124-112213-codex-{gone.pid}"
    stale.mkdir()
    (stale / LAUNCHER_FILE).write_text(f"{socket.gethostname()} {gone.pid} 12345\n")
    env["ANTHROPIC_BASE_URL"] = "unix:/run/anthropic.sock"  # the setup refuses it, after the run's folder is made
    assert main(["--", "claude", "-p", "hi"], env) == 2
    assert capsys.readouterr().err == "trimflow run: 'unix:/run/anthropic.sock' is not an http(s) URL\n"
    assert list(runs.iterdir()) == []
    assert stat.S_IMODE(runs.stat().st_mode) == 0o700 and os.stat(runs).st_uid == os.geteuid()
