"""`python -m trimflow`: the usage, an unknown command refused with exit 2, and every command reachable, run
as a user runs it: a subprocess of this Python, from a directory outside the repository."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from trimflow.__main__ import COMMANDS, main, usage

# command -> the arguments that make it answer at once with exit 0, and what its answer says.
REACHED = {
    "prune": (["--help"], "usage: scripts/prune"),
    "audit": (["--help"], "usage: scripts/audit"),
    "replay": (["--help"], "usage: replay"),
    "fake-provider": (["--help"], "usage: fake-provider"),
    "repair": (["--help"], "usage: scripts/repair"),
    "learned": (["--help"], "usage: python -m trimflow learned"),
    "files": (["--help"], "usage: python -m trimflow files"),
    "mcp": (["--help"], "usage: python -m trimflow mcp"),
    "run": (["--version"], "Mitmproxy: "),  # mitmdump itself answers: run hands it the arguments
}


def trimflow(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trimflow", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_every_command_is_tested() -> None:
    assert set(REACHED) == set(COMMANDS)


@pytest.mark.parametrize("args", [[], ["-h"], ["--help"], ["help"]])
def test_no_command_or_help_prints_the_usage_and_exits_0(tmp_path: Path, args: list[str]) -> None:
    done = trimflow(*args, cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout == usage()
    assert done.stdout.startswith("usage: python -m trimflow COMMAND [ARGS...]\n")
    for name, (_, summary) in COMMANDS.items():
        assert f"  {name} " in done.stdout and summary in done.stdout


def test_an_unknown_command_exits_2_naming_it_with_the_usage(tmp_path: Path) -> None:
    done = trimflow("prnue", "--url", "https://x", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("trimflow: unknown command 'prnue'\nusage: python -m trimflow")


@pytest.mark.parametrize("command", sorted(REACHED))
def test_each_command_is_reachable(tmp_path: Path, command: str) -> None:
    args, says = REACHED[command]
    done = trimflow(command, *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert says in done.stdout, done.stdout[:300]


def test_a_commands_exit_code_comes_through(tmp_path: Path) -> None:
    done = trimflow("prune", cwd=tmp_path)  # --url is required
    assert done.returncode == 2
    assert "--url" in done.stderr and "usage: scripts/prune" in done.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_module_has_a_main(command: str) -> None:
    module = importlib.import_module(COMMANDS[command][0])
    assert callable(module.main)


def test_main_in_process_returns_the_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert capsys.readouterr().out == usage()
    assert main(["nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err
