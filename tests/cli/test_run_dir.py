"""trimflow.cli._run_dir: the runs folder private to the user, and the folders of runs whose launcher is gone removed,
keeping what the agent wrote."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from trimflow.cli._agents import setup_for
from trimflow.cli._launch_error import LaunchError
from trimflow.cli._run_dir import LAUNCHER_FILE, clean_stale_runs, finish_run_dir, new_run_dir, private_folder

LISTEN = "http://127.0.0.1:41234"


def test_the_runs_folder_is_made_private_and_refused_when_it_is_someone_elses(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o755)
    runs.chmod(0o755)
    private_folder(runs)
    assert stat.S_IMODE(runs.stat().st_mode) == 0o700
    (tmp_path / "a-file").write_text("")
    with pytest.raises(LaunchError, match=r"cannot make .*a-file/runs \(Not a directory\)"):
        private_folder(tmp_path / "a-file" / "runs")
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 4321, 4321)
        with pytest.raises(LaunchError, match="is not a folder of yours"):
            private_folder(theirs)


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_the_folders_of_runs_whose_launcher_is_gone_are_removed_keeping_what_the_agent_wrote(tmp_path: Path) -> None:
    user, runs = tmp_path / "home" / ".gemini", tmp_path / "runs"
    user.mkdir(parents=True)
    (user / "GEMINI.md").write_text("mine")
    runs.mkdir()
    pid = dead_pid()
    stale = runs / f"20261124-112213-gemini-{pid}"
    stale.mkdir()
    (stale / LAUNCHER_FILE).write_text(f"{socket.gethostname()} {pid} 12345\n")
    setup_for("gemini", ["gemini"], {"GEMINI_API_KEY": "AIza-x"}, LISTEN, stale, home=tmp_path / "home")
    private = stale / "gemini-home" / ".gemini"
    (private / "trustedFolders.json").write_text("{}")  # new
    (private / "GEMINI.md").unlink()  # a link the agent replaced with a file of its own
    (private / "GEMINI.md").write_text("the agent's")
    live = new_run_dir(runs, f"20261124-112214-claude-{os.getpid()}")  # this process: running
    reused = runs / f"20261124-112215-claude-{os.getpid()}"  # this pid, but another process's start time
    reused.mkdir()
    (reused / LAUNCHER_FILE).write_text(f"{socket.gethostname()} {os.getpid()} 1\n")
    elsewhere = runs / f"20261124-112217-claude-{dead_pid()}"  # a launcher on another machine sharing the home
    elsewhere.mkdir()
    (elsewhere / LAUNCHER_FILE).write_text(f"not-{socket.gethostname()} {elsewhere.name.rpartition('-')[2]} 1\n")
    older = runs / f"20261124-112216-codex-{dead_pid()}"  # an older launcher's folder, with no marker
    older.mkdir()
    lines = clean_stale_runs(runs)
    kept = runs / f"{stale.name}.gemini"
    assert lines == [f"trimflow run: Gemini CLI wrote GEMINI.md, trustedFolders.json in its private settings folder, not in {user}: kept in {kept}"]
    assert sorted(p.name for p in runs.iterdir()) == sorted([kept.name, live.name, elsewhere.name])
    assert (kept / "GEMINI.md").read_text() == "the agent's" and (user / "GEMINI.md").read_text() == "mine"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o700


def test_a_run_whose_agent_changed_nothing_leaves_no_folder_and_no_line(tmp_path: Path) -> None:
    (tmp_path / "home" / ".gemini").mkdir(parents=True)
    (tmp_path / "home" / ".gemini" / "GEMINI.md").write_text("mine")
    run_dir = new_run_dir(tmp_path, "20261124-112213-gemini-1")
    setup_for("gemini", ["gemini"], {"GEMINI_API_KEY": "AIza-x"}, LISTEN, run_dir, home=tmp_path / "home")
    assert finish_run_dir(run_dir) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]
    assert (tmp_path / "home" / ".gemini" / "GEMINI.md").read_text() == "mine"  # links removed, never followed
