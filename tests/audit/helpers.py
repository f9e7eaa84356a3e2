"""Audit inputs made in-process with mitmproxy's own flow helpers and writers, and the audit run through main()."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import orjson
from markdown_it import MarkdownIt
from mitmproxy import http
from mitmproxy import io as mitm_io
from mitmproxy.addons.savehar import SaveHar
from mitmproxy.test import tflow, tutils

from trimflow.audit import main
from trimflow.testing import PATHS, image, session_body

SHOT = image(120, 80, "PNG", seed=5)
SECRET = "sk-test-SECRET-audit-4411"
QUERY_SECRET = "AIzaSECRET-query-9911"
PROMPT = "What should I click next?"
OK_ANSWER = b'{"id":"x","usage":{"input_tokens":1234,"output_tokens":5}}'
LIMIT_413 = b'{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum size"}}'


def body_of(wire_format: str, turn: int, system: str | None = None) -> bytes:
    body = session_body(wire_format, turn, SHOT, "image/png")
    if system is not None:  # a different head: another conversation
        body["system"] = system
    return orjson.dumps(body)


def llm_flow(
    wire_format: str = "anthropic",
    turn: int = 1,
    *,
    status: int | None = 200,
    answer: bytes = OK_ANSWER,
    encoding: str | None = None,
    host: str = "api.anthropic.com",
    path: str | None = None,
    body: bytes | None = None,
    system: str | None = None,
    method: bytes = b"POST",
) -> http.HTTPFlow:
    headers = http.Headers(content_type="application/json", x_api_key=SECRET)
    request = tutils.treq(
        host=host, port=443, scheme=b"https", method=method, authority=b"", path=(path or PATHS[wire_format]).encode(), headers=headers, content=b""
    )
    if encoding:
        request.headers["content-encoding"] = encoding
    request.content = body if body is not None else body_of(wire_format, turn, system)  # encoded as the header says
    response = None
    if status is not None:
        response = tutils.tresp(status_code=status, content=answer, headers=http.Headers(content_type="application/json"))
    return tflow.tflow(req=request, resp=response or False, err=status is None)


def write_dump(path: Path, flows) -> Path:
    with open(path, "wb") as f:
        writer = mitm_io.FlowWriter(f)
        for flow in flows:
            writer.add(flow)
    return path


def read_dump(path: Path) -> list:
    with open(path, "rb") as f:
        return list(mitm_io.FlowReader(f).stream())


def write_har(path: Path, flows) -> Path:
    path.write_text(json.dumps(SaveHar().make_har(flows)))
    return path


def session(turns: int = 10, **kwargs) -> list[http.HTTPFlow]:
    return [llm_flow(turn=t, **kwargs) for t in range(1, turns + 1)]


def audit(capsys, *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def audit_json(capsys, *args: str) -> tuple[int, dict, str]:
    code, out, err = audit(capsys, *args, "--format", "json")
    return code, orjson.loads(out), err


def rows(report: dict) -> list[dict]:
    return report["records"]


def only_conversation(report: dict) -> dict:
    conversations = report["summary"]["conversations"]
    assert len(conversations) == 1, conversations
    return conversations[0]


def write_rules(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def markdown_html(text: str) -> str:
    """Markdown rendered as GitHub's flavour does: CommonMark with tables and strikethrough (linkify needs a package
    of its own)."""
    return MarkdownIt("gfm-like", {"linkify": False}).disable("linkify").render(text)


def markdown_as_text(text: str) -> str:
    """What a reader sees of rendered Markdown: the text without its tags."""
    return html.unescape(re.sub(r"<[^>]*>", "", markdown_html(text)))
