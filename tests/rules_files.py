"""Rules files written for a test and read back, and the error a bad one gives (tests of trimflow._rules and
trimflow._rules_file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trimflow._rules import Rules
from trimflow._rules_file import load_rules
from trimflow.errors import RulesError

REPO = Path(__file__).resolve().parents[1]
MiB = 1024**2
# The rules files the project ships: the default and the examples.
SHIPPED = [REPO / "rules" / "default.yaml"] + sorted((REPO / "rules" / "examples").glob("*.yaml"))


def load(tmp_path: Path, text: str) -> Rules:
    path = tmp_path / "rules.yaml"
    path.write_text(text, encoding="utf-8")
    return load_rules(path)


def error(tmp_path: Path, text: str) -> RulesError:
    with pytest.raises(RulesError) as e:
        load(tmp_path, text)
    return e.value


def assert_error(tmp_path: Path, text: str, line: int, message: str) -> None:
    """The error names the file and the line, and its text contains `message`."""
    err = error(tmp_path, text)
    prefix = f"{tmp_path / 'rules.yaml'}:{line}: "
    assert str(err).startswith(prefix), str(err)
    assert message in str(err), str(err)
    assert err.line == line
