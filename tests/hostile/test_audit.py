"""The audit on hostile recordings, as a CI job gets them from an untrusted artifact: a compression bomb in a
recorded body (request or answer) costs a bounded amount of memory, and free text a recording chose (model, host,
path, rule, reason, conversation, a file name) reaches no report or stderr line as anything but visible text: no
GitHub workflow command, no terminal escape sequence, no Markdown heading, link or HTML, no HTML markup.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path

import orjson
import pytest
from mitmproxy import http
from mitmproxy.test import tutils

from trimflow import prune_request
from trimflow._decode import DEFAULT_MAX_DECODED_BYTES

from ..audit.helpers import OK_ANSWER, audit, audit_json, body_of, llm_flow, markdown_as_text, markdown_html, write_dump
from ..bombs import GiB, MiB, gzip_bomb
from ..helpers import rules_with
from .cases import HOST, HOSTILE, marker

ROOT = Path(__file__).resolve().parents[2]

# --- compression bombs ------------------------------------------------------------------------------------------

BOMB_INFLATED = 2 * GiB  # about 2.1 MB on the wire
# The audit's peak may hold one decoding step past the limit on top of Python, mitmproxy and the engine; an
# audit that inflated the bomb would hold its 2 GiB (and more: mitmproxy's decoder copies it).
PEAK_BOUND = DEFAULT_MAX_DECODED_BYTES + 512 * MiB
# The child's address space, as a net: an audit that inflates without a bound fails here with a MemoryError
# instead of taking the machine's memory.
ADDRESS_SPACE = 3 * GiB


def bomb_recording(path: Path) -> Path:
    """Three Anthropic turns: a gzip bomb as the first request's body, one as the second's answer, a third as it should be."""
    bomb = gzip_bomb(BOMB_INFLATED)
    asked = llm_flow(turn=1, encoding="gzip")
    asked.request.raw_content = bomb
    answered = llm_flow(turn=2)
    answered.response = tutils.tresp(content=b"", headers=http.Headers(content_type="application/json", content_encoding="gzip"))
    answered.response.raw_content = bomb
    return write_dump(path, [asked, answered, llm_flow(turn=3)])


# The audit's own peak resident memory, written at its exit: VmHWM belongs to the address space the audit runs in.
# ru_maxrss would not do: Linux carries into it the high-water mark of the memory the child had before exec, which
# is this test process's (a child started with vfork runs in its parent's memory until exec).
MEASURED_AUDIT = """
import atexit, os, runpy, sys

def peak() -> None:
    with open("/proc/self/status") as status, open(os.environ["TRIMFLOW_TEST_PEAK"], "w") as out:
        out.write(next(line for line in status if line.startswith("VmHWM:")).split()[1])

atexit.register(peak)
sys.argv = ["trimflow", "audit", *sys.argv[1:]]
runpy.run_module("trimflow", run_name="__main__", alter_sys=True)
"""


def run_measured(args: list[str], cwd: Path) -> tuple[int, str, str, int]:
    """`python -m trimflow audit ARGS` in a child process: its exit code, stdout, stderr and peak RSS in bytes
    (VmHWM, from the child itself)."""
    out, err, peak = cwd / "audit.out", cwd / "audit.err", cwd / "audit.peak"
    env = {**os.environ, "TRIMFLOW_TEST_PEAK": str(peak)}
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-c", MEASURED_AUDIT, *args], stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, cwd=ROOT, env=env
        )
    resource.prlimit(child.pid, resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    watchdog = threading.Timer(300, child.kill)  # a hung audit fails the test instead of the suite
    watchdog.start()
    try:
        child.wait()
    finally:
        watchdog.cancel()
    return child.returncode, out.read_text(), err.read_text(), int(peak.read_text()) * 1024


def test_a_gzip_bomb_in_a_recorded_request_or_answer_is_never_inflated(tmp_path: Path) -> None:
    dump = bomb_recording(tmp_path / "bombs.mitm")
    assert dump.stat().st_size < 8 * MiB  # the bomb is small on disk; its 2 GiB exist only if something inflates it
    code, out, err, peak = run_measured([str(dump), "--format", "json"], tmp_path)
    assert code == 0, err[-2000:]
    assert peak < PEAK_BOUND, f"peak RSS {peak / MiB:.0f} MiB"
    summary = orjson.loads(out)["summary"]
    limit = "256MB"
    assert summary["unreadable"] == {f"request body inflates past {limit} (--max-decoded-bytes); not inflated": 1}
    assert summary["unread_answers"] == {f"inflates past {limit} (--max-decoded-bytes); not inflated": 1}
    assert summary["llm_requests"] == 2  # the second turn is measured; its answer's usage is unknown
    assert [r["usage_input_tokens"] for r in orjson.loads(out)["records"]] == [None, 1234]


def test_max_decoded_bytes_sets_the_bound_and_a_body_within_it_is_measured(tmp_path: Path, capsys) -> None:
    small_bomb = llm_flow(turn=1, encoding="gzip")
    small_bomb.request.raw_content = gzip_bomb(32 * MiB)
    compressed = llm_flow(turn=1, encoding="gzip", system="another conversation")
    dump = write_dump(tmp_path / "run.mitm", [small_bomb, compressed])
    code, report, err = audit_json(capsys, dump, "--max-decoded-bytes", "1MiB")
    assert code == 0, err
    assert report["summary"]["unreadable"] == {"request body inflates past 1.0MB (--max-decoded-bytes); not inflated": 1}
    assert [r["body_bytes_before"] for r in report["records"]] == [len(body_of("anthropic", 1, "another conversation"))]
    code, _, err = audit(capsys, dump, "--max-decoded-bytes", "none")
    assert code == 2 and "--max-decoded-bytes" in err and "needs a bound" in err
    answered = llm_flow(turn=1)
    assert answered.response is not None
    answered.response.headers["content-encoding"] = "gzip"
    answered.response.raw_content = gzip_bomb(32 * MiB)
    code, out, err = audit(capsys, write_dump(tmp_path / "answer.mitm", [answered]), "--max-decoded-bytes", "1MiB")
    assert code == 0, err
    assert "0 unreadable; answers not read: 1 inflates past 1.0MB (--max-decoded-bytes); not inflated" in out


def test_every_hostile_request_body_recorded_is_audited_without_an_internal_error(tmp_path: Path, capsys) -> None:
    """The named hostile bodies (cases.py), each recorded as it went on the wire: the audit measures each or counts
    it with a reason, quotes none of them, and a 16 MiB bound refuses the gzip bomb as the proxy does."""
    flows = []
    for case in HOSTILE:
        if not case.e2e:
            continue
        wire = case.wire()
        flow = llm_flow(case.fmt, host=HOST, path=case.path, body=b"")
        for name, value in case.request_headers(wire).items():
            flow.request.headers[name] = value
        flow.request.raw_content = wire
        flows.append(flow)
    dump = write_dump(tmp_path / "hostile.mitm", flows)
    code, out, err = audit(capsys, dump, "--max-decoded-bytes", "16MiB")
    assert code == 0, err
    check_text(out)
    code, report, _ = audit_json(capsys, dump, "--max-decoded-bytes", "16MiB")
    summary = report["summary"]
    assert summary["flows"] == len(flows) and summary["llm_requests"] + sum(summary["unreadable"].values()) == len(flows)
    assert not any("internal error" in reason for reason in summary["unreadable"]), summary["unreadable"]
    assert "request body inflates past 16.0MB (--max-decoded-bytes); not inflated" in summary["unreadable"]
    for case in HOSTILE:
        assert marker(case.id) not in out


# --- free text a recording chose --------------------------------------------------------------------------------

ESC = "\x1b"
# Each is a value a recording can hold; together they try every way out of a line and into markup.
HOSTILE_TEXT = {
    "model": f"gpt-4o\n::error title=Audit passed::all good\n::add-mask::{ESC}[2J{ESC}]0;owned\x07",
    "host": "api.openai.com\n## Injected heading\n[click here](https://evil.example/steal)",
    "path": "/v1/chat/completions\r\n::warning::x <img src=x onerror=alert(1)>",
    "rule": "defaults\n::notice::rule",
    "reason": "left as it came\u2028::notice::separator ##[error]v1 command\n- a list item\n> a quote\n"
    "<script>alert(1)</script> `code` **bold** | a | table |",
    "conversation": "c0ffee\n::stop-commands::token\u202etxt.exe",
    "format": "# openai-chat\n- listed",
    "kind": "turn",
}
# Text that, were it to survive as is, would act: a workflow command starting a line, a terminal escape.
_RUNNER_LINE = re.compile(r"^\s*::", re.MULTILINE)
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def jsonl(directory: Path, name: str, text: dict[str, str]) -> Path:
    """A metrics JSONL of three turns (the last refused) whose free-text fields are `text`."""
    lines = []
    for turn in (1, 2, 3):
        record = prune_request("https://api.openai.com/v1/chat/completions", {}, body_of("openai-chat", turn), rules_with(max_images=2)).record
        assert record is not None
        lines.append(orjson.dumps(record.to_dict() | text | {"turn": turn, "status": 413 if turn == 3 else 200}))
    path = directory / name
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def hostile_jsonl(directory: Path) -> Path:
    """HOSTILE_TEXT in every free-text field, under a file name with a newline and a workflow command."""
    return jsonl(directory, "run\n::error::name.jsonl", HOSTILE_TEXT)


def clean_jsonl(directory: Path) -> Path:
    """The same figures with harmless names: the blocks a report of it has. The model is the one the hostile name
    starts with, so the same rule applies to both."""
    return jsonl(directory, "clean.jsonl", dict.fromkeys(HOSTILE_TEXT, "plain") | {"kind": "turn", "model": "gpt-4o"})


def mitm(directory: Path, model: bytes) -> Path:
    text = body_of("openai-chat", 2).replace(b'"model":"gpt-4o"', b'"model":"' + model + b'"')
    flow = llm_flow("openai-chat", host="api.openai.com", body=text, answer=OK_ANSWER)
    return write_dump(directory / f"body-{len(model)}.mitm", [flow])


def hostile_mitm(directory: Path) -> Path:
    """A recorded request naming a model with a newline, a workflow command, an escape and a lone surrogate (valid JSON)."""
    return mitm(directory, b"gpt-4o\\n::error::from a body \\u001b[31m \\ud800")


def clean_mitm(directory: Path) -> Path:
    return mitm(directory, b"gpt-4o")


FAIL_ON = ("--fail-on", "status=413", "--fail-on", "images>0")


def check_text(output: str) -> None:
    assert not _RUNNER_LINE.search(output), [line for line in output.splitlines() if line.lstrip().startswith("::")]
    assert "##[" not in output
    assert not _CONTROL.search(output), repr(_CONTROL.search(output))


def test_text_and_stderr_show_free_text_as_visible_escapes(tmp_path: Path, capsys) -> None:
    jsonl = hostile_jsonl(tmp_path)
    code, out, err = audit(capsys, jsonl, *FAIL_ON)
    assert code == 1
    for output in (out, err):
        check_text(output)
    # Still there, made visible: a reader sees what the recording held.
    assert "gpt-4o\\n::error title=Audit passed::all good\\n::add-mask::\\x1b[2J\\x1b]0;owned\\x07" in out
    assert "left as it came\\u2028::notice::separator #\\x23[error]v1 command\\n- a list item" in out
    assert "c0ffee\\n::stop-commands::token\\u202etxt.exe" in err
    assert "run\\n::error::name.jsonl" in out
    code, out, err = audit(capsys, hostile_mitm(tmp_path), "--format", "text")
    assert code == 0, err
    check_text(out)
    assert "gpt-4o\\n::error::from a body \\x1b[31m \\ud800" in out


def test_an_unusable_input_s_name_is_escaped_in_its_one_line(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "x\n::error::y.jsonl"
    bad.write_bytes(b'{"a": 1}\n')
    code, out, err = audit(capsys, bad)
    assert code == 2 and out == ""
    check_text(err)
    assert len(err.splitlines()) == 1 and "x\\n::error::y.jsonl: not trimflow metrics JSONL" in err


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attributes: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.append(tag)
        self.attributes += [name for name, _ in attrs]


def markup_of(html: str) -> _Markup:
    parser = _Markup()
    parser.feed(html)
    return parser


@pytest.mark.parametrize(("source", "clean_source"), [(hostile_jsonl, clean_jsonl), (hostile_mitm, clean_mitm)], ids=["jsonl", "mitm"])
def test_markdown_renders_free_text_literally(tmp_path: Path, capsys, source, clean_source) -> None:
    code, out, err = audit(capsys, source(tmp_path), "--format", "markdown", *FAIL_ON)
    assert code == 1, err
    _, clean, _ = audit(capsys, clean_source(tmp_path), "--format", "markdown", *FAIL_ON)
    rendered = markup_of(markdown_html(out))
    expected = markup_of(markdown_html(clean))
    # The same blocks as a report of harmless names: no heading, link, image, HTML, quote or list of the recording's
    # (a code span may differ: a conversation id a code span cannot hold is shown as escaped text).
    for tag in ("h1", "h2", "h3", "h4", "a", "img", "script", "blockquote", "ul", "ol", "li", "table", "em", "strong", "details"):
        assert rendered.tags.count(tag) == expected.tags.count(tag), tag
    assert "onerror" not in rendered.attributes and "href" not in rendered.attributes
    text = markdown_as_text(out)
    assert not _RUNNER_LINE.search(out) and "\x1b" not in out
    if source is hostile_jsonl:
        for shown in [
            "api.openai.com\\n## Injected heading\\n[click here](https://evil.example/steal)",
            "/v1/chat/completions\\r\\n::warning::x <img src=x onerror=alert(1)>",
            "left as it came\\u2028::notice::separator ##[error]v1 command\\n- a list item\\n> a quote\\n"
            "<script>alert(1)</script> `code` **bold** | a | table |",
            "c0ffee\\n::stop-commands::token\\u202etxt.exe",
        ]:
            assert shown in text, shown
    else:
        assert "gpt-4o\\n::error::from a body \\x1b[31m \\ud800" in text
    assert re.search(r"(?<!\\)://|(?<!\\)@|www\.", out) is None  # nothing GitHub's extended autolinks would take


def test_html_keeps_free_text_out_of_markup(tmp_path: Path, capsys) -> None:
    code, out, err = audit(capsys, hostile_jsonl(tmp_path), "--format", "html", *FAIL_ON)
    assert code == 1, err
    _, clean, _ = audit(capsys, clean_jsonl(tmp_path), "--format", "html", *FAIL_ON)
    rendered, expected = markup_of(out), markup_of(clean)
    assert sorted(rendered.tags) == sorted(expected.tags) and sorted(rendered.attributes) == sorted(expected.attributes)
    assert "<img" not in out and "<script>alert" not in out and "\x1b" not in out
    assert "c0ffee\\n::stop-commands::token\\u202etxt.exe" in out


def test_json_keeps_the_values_as_recorded(tmp_path: Path, capsys) -> None:
    code, report, _ = audit_json(capsys, hostile_jsonl(tmp_path), *FAIL_ON)
    assert code == 1
    assert {r["model"] for r in report["records"]} == {HOSTILE_TEXT["model"]}  # JSON escapes; a reader gets the value
    assert report["summary"]["conversations"][0]["conversation"] == HOSTILE_TEXT["conversation"]
    # A model read from a recorded body is the engine's record of it: its control characters and a lone surrogate,
    # which orjson cannot write, as visible escapes.
    code, out, err = audit(capsys, hostile_mitm(tmp_path), "--format", "json")
    assert code == 0, err
    assert json.loads(out)["records"][0]["model"] == "gpt-4o\\n::error::from a body \\x1b[31m \\ud800"
