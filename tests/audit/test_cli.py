"""trimflow.audit._cli: exit 2 with one line for unusable input, --out, and `python -m trimflow audit`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import audit, session, write_bytes, write_dump


@pytest.mark.parametrize(
    ("make", "args", "says"),
    [
        (lambda d: d / "missing.mitm", (), "missing.mitm: no such file"),
        (lambda d: d, (), "not a file"),
        (lambda d: write_bytes(d / "junk.mitm", b"PK\x03\x04 a zip, not a dump"), (), "junk.mitm: not a mitmproxy dump (invalid data)"),
        (lambda d: write_bytes(d / "junk.har", b'{"log": 5}'), (), "junk.har: not a HAR file"),
        (lambda d: write_bytes(d / "junk.jsonl", b'{"a": 1}\n'), (), "junk.jsonl: not trimflow metrics JSONL"),
        (lambda d: write_bytes(d / "ok.mitm", b""), ("--fail-on", "images>>8"), "--fail-on 'images>>8'"),
        (lambda d: write_bytes(d / "ok.mitm", b""), ("--rules", "/nonexistent/rules.yaml"), "rules.yaml: cannot read"),
        (lambda d: write_bytes(d / "ok.mitm", b""), ("--profile", "no-such-profile"), "unknown profile 'no-such-profile'"),
        (lambda d: write_bytes(d / "ok.mitm", b""), ("--format", "pdf"), "invalid choice: 'pdf'"),
    ],
)
def test_unusable_input_exits_2_with_one_line(tmp_path, capsys, make, args, says) -> None:
    code, out, err = audit(capsys, make(tmp_path), *args)
    assert code == 2
    assert out == ""
    reason = [line for line in err.splitlines() if line.startswith("trimflow audit:")]
    assert len(reason) == 1 and says in reason[0], err


def test_an_empty_recording_fails_without_a_fail_on_and_passes_with_allow_empty(tmp_path, capsys) -> None:
    empty = write_bytes(tmp_path / "empty.mitm", b"")
    code, _, err = audit(capsys, empty)
    assert (
        code == 1
        and err
        == f"trimflow audit: FAIL {empty}: no LLM request measured (0 flows); did the client go through the proxy? (--allow-empty lets this pass)\n"
    )
    code, _, err = audit(capsys, empty, "--allow-empty")
    assert code == 0 and err == f"trimflow audit: warning: {empty}: no LLM request measured (0 flows); did the client go through the proxy?\n"


def test_out_writes_a_file(recording, tmp_path, capsys) -> None:
    target = tmp_path / "report.md"
    code, out, _ = audit(capsys, recording, "--format", "markdown", "--out", target)
    assert code == 0 and out == "" and target.read_text().startswith("## trimflow audit")
    assert audit(capsys, recording, "--out", tmp_path / "no" / "such" / "dir.txt")[0] == 2


def test_scripts_audit_runs_the_module(tmp_path) -> None:
    dump = write_dump(tmp_path / "run.mitm", session(2))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "trimflow", "audit", str(dump), "--fail-on", "images>1"], capture_output=True, text=True, cwd=root, timeout=60
    )
    assert done.returncode == 1 and "FAIL images>1" in done.stderr
    assert (root / "scripts" / "audit").stat().st_mode & 0o111
    assert "-m trimflow audit" in (root / "scripts" / "audit").read_text()
