"""mitmweb with the addon, looked at in headless Chromium: with the `comment` column on (web_columns, as
docs/metrics.md shows), the flow list shows trimflow's comment, whose figures come first because the column
is narrow. A bad option set in the running mitmweb (its Options editor) is refused with trimflow's line.
Runs on mitmproxy 11 (no token) and 12 (the web server's URL carries a token)."""

from __future__ import annotations

import html
import http.client
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest

from trimflow._human import format_size_change
from trimflow.testing import FakeProvider, image, session_body

from ..browser import headless
from ..helpers import listening_ports, wait_for
from ..mitmdump import ADDON, listening_port, mitmdump_binary, stop_process
from .helpers import post

pytestmark = pytest.mark.e2e

COLUMNS = ("status", "method", "path", "size", "comment")
COMMENT_CELL = re.compile(r'<td class="col-comment">([^<]*)')


@pytest.fixture
def mitmweb(tmp_path: Path, provider: FakeProvider) -> Iterator[tuple[int, str, Path]]:
    """A mitmweb in reverse mode to the FakeProvider, on rules of 2 images: (proxy port, web UI URL, metrics file)."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("defaults:\n  max_images: 2\n  keep_recent: 1\n")
    metrics = tmp_path / "metrics.jsonl"
    command = [
        str(Path(mitmdump_binary()).with_name("mitmweb")),
        "--no-web-open-browser",
        "--web-host",
        "127.0.0.1",
        "--web-port",
        "0",
        "--listen-host",
        "127.0.0.1",
        "--listen-port",
        "0",
        "--mode",
        f"reverse:{provider.url}",
        "--set",
        f"confdir={tmp_path / 'confdir'}",
        "-s",
        str(ADDON),
        "--set",
        f"trimflow_rules={rules}",
        "--set",
        f"trimflow_metrics={metrics}",
    ]
    for column in COLUMNS:  # a list option: one --set per item
        command += ["--set", f"web_columns={column}"]
    log_path = tmp_path / "mitmweb.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:

        def ports() -> tuple[int, str] | None:
            text = log_path.read_text(errors="replace")
            assert process.poll() is None, text
            port = listening_port(text)
            found = re.search(r"Web server listening at http://127\.0\.0\.1:0(/\S*)", text)  # with ?token=... on mitmproxy 12
            if port is None or found is None:
                return None
            # The web server names the port it was given, 0: the one it got is the process's other listening port.
            (web_port,) = listening_ports(process.pid) - {port}
            return port, f"http://127.0.0.1:{web_port}{found.group(1)}"

        port, url = wait_for(ports, "mitmweb listening", 30)
        yield port, url, metrics
    finally:
        stop_process(process, 10)


def test_the_flow_list_shows_the_comment_with_its_figures_first(tmp_path: Path, mitmweb: tuple[int, str, Path]) -> None:
    port, url, metrics = mitmweb
    body = orjson.dumps(session_body("openai-chat", 5, image(120, 80, "PNG", seed=5), "image/png"))
    status, _ = post(port, "/v1/chat/completions", body)
    assert status == 200
    record = orjson.loads(wait_for(lambda: metrics.exists() and metrics.read_text(), "metrics record"))
    figures = f"5->2 img, {format_size_change(record['body_bytes_before'], record['body_bytes_after'])}; "

    def comment_cells() -> list[str]:
        dom = subprocess.run(
            headless(tmp_path / "chromium", "--virtual-time-budget=5000", "--dump-dom", url),
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        return [html.unescape(cell) for cell in COMMENT_CELL.findall(dom)]

    (cell,) = wait_for(comment_cells, "comment cell in the flow list")
    assert cell.startswith(figures + "trimflow rule defaults, gpt-4o, conv "), cell


def put_options(url: str, update: dict[str, str]) -> tuple[int, str]:
    """PUT /options as mitmweb's Options editor does: the token of mitmproxy 12 as a bearer, and tornado's
    double-submit XSRF check met with one value in the cookie (11's and 12's name) and the header."""
    parts = urlsplit(url)
    token = parse_qs(parts.query).get("token", [""])[0]
    xsrf = "5e11a7e5"
    headers = {"Content-Type": "application/json", "X-XSRFToken": xsrf, "Cookie": f"_xsrf={xsrf}; _mitmproxy_xsrf={xsrf}"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    try:
        conn.request("PUT", "/options", orjson.dumps(update), headers)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def test_a_bad_option_set_in_the_running_mitmweb_is_refused_with_its_line(tmp_path: Path, mitmweb: tuple[int, str, Path]) -> None:
    _, url, _ = mitmweb
    bad = tmp_path / "bad.yaml"
    bad.write_text("defaults:\n  max_images: lots\n")
    assert put_options(url, {"trimflow_mode": "bogus"}) == (400, "trimflow: trimflow_mode must be one of enforce, observe, not 'bogus'")
    assert put_options(url, {"trimflow_rules": str(bad)}) == (400, f"trimflow: {bad}:2: max_images must be a whole number >= 0 or null, got 'lots'")
    assert put_options(url, {"trimflow_mode": "observe"}) == (200, "")  # still running, and a good value still takes
