"""trimflow.cli._run: `python -m trimflow run` hands its arguments to mitmdump, or with `--` to the launcher; without a
mitmdump it says how to get one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trimflow.cli import _run
from trimflow.cli._mitmdump import mitmdump_argv, mitmdump_binary


def test_without_mitmdump_run_exits_2_saying_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert mitmdump_binary() is None and mitmdump_argv(["-p", "9000"]) is None
    assert _run.main(["-p", "9000"]) == 2
    assert capsys.readouterr().err == "trimflow run: mitmdump not found: pip install mitmproxy\n"


def test_a_double_dash_goes_to_the_launcher_not_to_mitmdump(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run.main(["-q", "--"]) == 2
    assert capsys.readouterr().err == "trimflow run: nothing to run after --: trimflow run [OPTIONS] -- COMMAND [ARGS...]\n"
