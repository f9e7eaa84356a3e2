"""trimflow.cli._recall: the launcher's side of recall. A token per run in a 0600 file of the run and in the
environments of mitmdump and the agent, never on a command line; the store where the proxy keeps it (the user's
trimflow_recall, {confdir}); off when the user empties the option; the run's images removed at its end. The whole
run: tests/e2e/test_recall.py."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from trimflow._recall import STORE_VARIABLE, TOKEN_VARIABLE, parse_token, run_folder
from trimflow.cli import _recall
from trimflow.cli._recall import TOKEN_FILE, prepare


@pytest.fixture(autouse=True)
def mcp_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's side needs only to know the mcp package is there (on Python 3.11 it cannot be: pyproject.toml)."""
    monkeypatch.setattr(_recall, "has_mcp", lambda: True)


def test_a_run_gets_a_token_of_its_own_in_a_private_file(tmp_path: Path) -> None:
    first, why = prepare({}, tmp_path / "confdir", tmp_path)
    assert first is not None and why is None
    assert first.store == tmp_path / "confdir" / "trimflow-recall"
    token_file = tmp_path / TOKEN_FILE
    assert parse_token(token_file.read_text()) == first.token and stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert first.server[-4:] == ["--store", str(first.store), "--token-file", str(token_file)]
    assert first.token.hex() not in " ".join(first.server)  # a command line any local user can read
    assert first.proxy_env() == {TOKEN_VARIABLE: first.token.hex()}
    assert first.agent_env() == {TOKEN_VARIABLE: first.token.hex(), STORE_VARIABLE: str(first.store)}
    (tmp_path / "other").mkdir()
    second, _ = prepare({}, tmp_path / "confdir", tmp_path / "other")
    assert second is not None and second.token != first.token


def test_the_users_folder_is_the_store_and_empty_turns_recall_off(tmp_path: Path) -> None:
    recall, _ = prepare({"trimflow_recall": "{confdir}/elsewhere"}, tmp_path / "c", tmp_path)
    assert recall is not None and recall.store == tmp_path / "c" / "elsewhere"
    assert prepare({"trimflow_recall": ""}, tmp_path / "c", tmp_path) == (None, None)


def test_without_the_mcp_package_recall_is_off_and_said_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_recall, "has_mcp", lambda: False)
    recall, why = prepare({}, tmp_path, tmp_path)
    # Where it can be installed, how; on Python 3.11 (mitmproxy 11 pins h11 below what mcp needs), what it takes.
    fix = "pip install 'trimflow[recall]'" if sys.version_info >= (3, 12) else "Python 3.12 or newer"
    assert recall is None and why is not None and why.startswith("trimflow run: no recall_image for the agent: ") and fix in why
    assert not (tmp_path / TOKEN_FILE).exists()


def test_the_runs_images_go_with_the_run(tmp_path: Path) -> None:
    recall, _ = prepare({}, tmp_path / "confdir", tmp_path)
    assert recall is not None
    mine, theirs = recall.store / run_folder(recall.token), recall.store / run_folder(bytes(32))
    for folder in (mine, theirs):
        folder.mkdir(parents=True)
        (folder / "abcdefghij").write_bytes(b"x")
    recall.remove()
    assert not mine.exists() and theirs.exists()
