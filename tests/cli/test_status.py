"""trimflow.cli._status: the exit statuses every command returns, and the one line a command prints when it stops."""

from __future__ import annotations

import pytest

from trimflow.__main__ import main as trimflow_main
from trimflow.cli import _launch_error, _status


def test_fail_prints_one_line_naming_the_command_and_returns_the_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert _status.fail("trimflow prune", "no rules") == _status.USAGE_ERROR == 2
    assert _status.fail("trimflow learned", "locked", _status.FAILED) == 1
    assert capsys.readouterr().err == "trimflow prune: no rules\ntrimflow learned: locked\n"


def test_a_line_never_carries_a_control_character_from_its_input(capsys: pytest.CaptureFixture[str]) -> None:
    _status.say("trimflow repair", "ses\x1b[2Jsion.jsonl: bad\nline")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err


def test_the_launchers_statuses_are_the_shared_ones() -> None:
    assert (_launch_error.EXIT_NOT_FOUND, _launch_error.EXIT_CANNOT_START) == (_status.NOT_FOUND, _status.USAGE_ERROR) == (127, 2)


def test_an_unknown_command_says_so_first_then_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert trimflow_main(["nosuch"]) == _status.USAGE_ERROR
    err = capsys.readouterr().err
    assert err.startswith("trimflow: unknown command 'nosuch'\nusage: python -m trimflow")
