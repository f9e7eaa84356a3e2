"""Flows and rules files for the addon tests."""

from __future__ import annotations

from pathlib import Path

import orjson
from mitmproxy import http
from mitmproxy.test import tflow, tutils

from trimflow.testing import PATHS, image, session_body

SHOT = image(120, 80, "PNG", seed=5)


def write_rules(path: Path, max_images: int, extra: str = "") -> Path:
    path.write_text(f"defaults:\n  max_images: {max_images}\n  max_body_bytes: 16MiB\n  keep_recent: 1\n{extra}")
    return path


def llm_flow(
    wire_format: str = "openai-chat",
    turns: int = 5,
    *,
    host: str = "api.openai.com",
    path: str | None = None,
    headers: dict | None = None,
    body: bytes | None = None,
) -> http.HTTPFlow:
    content = body if body is not None else orjson.dumps(session_body(wire_format, turns, SHOT, "image/png"))
    request = tutils.treq(
        host=host,
        port=443,
        scheme=b"https",
        method=b"POST",
        authority=b"",
        path=(path or PATHS[wire_format]).encode(),
        content=content,
        headers=http.Headers(content_type="application/json", **(headers or {})),
    )
    return tflow.tflow(req=request)


def json_answer(content: bytes = b"{}", **headers: str) -> http.Response:
    return tutils.tresp(content=content, headers=http.Headers(content_type="application/json", **headers))


def images_in(flow: http.HTTPFlow) -> int:
    return flow.request.get_content().count(b"base64,") or flow.request.get_content().count(b'"data":"')
