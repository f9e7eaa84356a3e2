"""scripts/audit over real recordings: a real mitmdump (`-w`), with and without the addon, in reverse mode
in front of the FakeProvider, driven by a synthetic screenshot session over http.client. The audit's
numbers are checked against what the client sent and what the provider got; the same recording
exported to HAR by mitmdump itself must give the same report; the HTML report is rendered in
headless Chromium (Debian's `chromium` package, installed by scripts/setup).
"""

from __future__ import annotations

import gzip
import http.client
import json
import re
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import orjson
import pytest

from trimflow._policy import count_pruned
from trimflow._rules_file import DEFAULT_RULES_PATH, load_rules
from trimflow.audit import main
from trimflow.formats import FORMATS
from trimflow.testing import PATHS, FakeProvider, Received, count_images, estimate_usage, image, session_body

from ..browser import headless
from ..mitmdump import Mitmdump, mitmdump_binary

pytestmark = pytest.mark.e2e

TURNS = 10
GATEWAY_MAX_IMAGES = 8  # the upstream refuses more, like a gateway with a cap of 8 (providers.md)
REFUSAL = b"HTTP 400 \xe2\x80\x93 Max images exceeded"
SHOT = image(96, 64, "PNG", seed=11)
API_KEY = "sk-ant-test-SECRET-audit-e2e-1f2e"
QUERY_KEY = "SECRET-query-key-audit-e2e-77"
# Interleaved conversations: Anthropic sent plainly, OpenAI chat gzip-compressed as some SDKs do.
SESSIONS = {"anthropic": None, "openai-chat": "gzip"}
SHIPPED_RULES = load_rules(DEFAULT_RULES_PATH)
# The shipped rules' limits for each session's model (a cap of 8 in batches of 6; gpt-4o's voluntary 5 in batches of 3).
SHIPPED = {
    fmt: SHIPPED_RULES.limits_for("127.0.0.1", PATHS[fmt], FORMATS[fmt].model(session_body(fmt, 1, SHOT, "image/png"), PATHS[fmt]))
    for fmt in SESSIONS
}


def gateway(received: Received) -> tuple[int, str, bytes] | None:
    if received.method == "POST" and count_images(received.body) > GATEWAY_MAX_IMAGES:
        return 400, "text/plain; charset=utf-8", REFUSAL
    return None


@dataclass
class Recording:
    dump: Path
    metrics: Path | None
    sent: dict[tuple[str, int], bytes] = field(default_factory=dict)  # (format, turn) -> body as the client sent it
    received: dict[tuple[str, int], Received] = field(default_factory=dict)  # what the provider got
    statuses: dict[tuple[str, int], int] = field(default_factory=dict)


def drive(port: int, provider: FakeProvider, recording: Recording) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/v1/models")  # not an LLM request: skipped and counted
        conn.getresponse().read()
        for turn in range(1, TURNS + 1):
            for wire_format, encoding in SESSIONS.items():
                body = orjson.dumps(session_body(wire_format, turn, SHOT, "image/png"))
                headers = {"Content-Type": "application/json", "x-api-key": API_KEY}
                wire = body
                if encoding:
                    headers["Content-Encoding"] = encoding
                    wire = gzip.compress(body)
                before = len(provider.received)
                conn.request("POST", f"{PATHS[wire_format]}?key={QUERY_KEY}", wire, headers)
                response = conn.getresponse()
                response.read()
                recording.sent[(wire_format, turn)] = body
                recording.statuses[(wire_format, turn)] = response.status
                (received,) = provider.received[before:]
                recording.received[(wire_format, turn)] = received
    finally:
        conn.close()


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> dict[str, Recording]:
    """The same session recorded twice: through plain mitmdump, and through mitmdump with the addon."""
    work = tmp_path_factory.mktemp("audit-recordings")
    out = {}
    with FakeProvider(check=gateway) as provider:
        for name, addon in (("plain", False), ("trimflow", True)):
            recording = Recording(work / f"{name}.mitm", work / f"{name}-metrics.jsonl" if addon else None)
            options = {"trimflow_metrics": str(recording.metrics)} if addon else {}
            proxy = Mitmdump(work / name, "--mode", f"reverse:{provider.url}", "-w", str(recording.dump), addon=addon, options=options)
            with proxy:
                drive(proxy.port, provider, recording)
            assert recording.dump.stat().st_size > 0, proxy.log()[-2000:]
            out[name] = recording
    return out


def audit(capsys, *args: object) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def audit_json(capsys, *args: object) -> dict:
    code, out, err = audit(capsys, *args, "--format", "json")
    assert code == 0, err
    return orjson.loads(out)


def by_turn(report: dict, wire_format: str) -> dict[int, dict]:
    return {r["turn"]: r for r in report["records"] if r["format"] == wire_format}


def test_the_session_really_hit_the_gateway_limit_without_trimflow(recordings) -> None:
    plain, through = recordings["plain"], recordings["trimflow"]
    assert {plain.statuses[(f, t)] for f in SESSIONS for t in range(GATEWAY_MAX_IMAGES + 1, TURNS + 1)} == {400}
    assert set(through.statuses.values()) == {200}


@pytest.mark.parametrize("name", ["plain", "trimflow"])
def test_the_audit_counts_what_the_client_sent(recordings, capsys, name) -> None:
    recording = recordings[name]
    report = audit_json(capsys, recording.dump)
    summary = report["summary"]
    assert summary["llm_requests"] == TURNS * len(SESSIONS)
    assert summary["skipped_not_llm"] == 1 and summary["unreadable"] == {}
    assert len(summary["conversations"]) == len(SESSIONS)
    for wire_format in SESSIONS:
        rows = by_turn(report, wire_format)
        assert sorted(rows) == list(range(1, TURNS + 1))
        for turn, row in rows.items():
            assert row["images_before"] == turn
            assert row["body_bytes_before"] == len(recording.sent[(wire_format, turn)])
            assert row["status"] == recording.statuses[(wire_format, turn)]
            if row["status"] == 200:
                assert row["usage_input_tokens"] == estimate_usage(recording.received[(wire_format, turn)].body).input_tokens
                assert row["failure"] is None
            else:
                assert row["failure"] == "too many images"


def test_without_the_addon_nothing_was_pruned_and_the_failures_are_listed(recordings, capsys) -> None:
    report = audit_json(capsys, recordings["plain"].dump)
    for row in report["records"]:
        assert (row["images_after"], row["body_bytes_after"]) == (row["images_before"], row["body_bytes_before"])
    crossings = []
    for conversation in report["summary"]["conversations"]:
        assert conversation["failures"] == [{"turn": t, "status": 400, "category": "too many images"} for t in (9, 10)]
        crossing = next(c for c in conversation["limits"] if c["limit"] == "max_images")
        crossings.append((crossing["value"], crossing["crossed_at"], crossing["projected"]))
        assert conversation["growth_per_turn"]["images"] == pytest.approx(1.0)
    # Each conversation crosses its model's cap in the shipped rules on the turn after it.
    assert sorted(crossings) == sorted((cap, cap + 1, False) for cap in (limits.max_images for limits in SHIPPED.values()))


def test_through_the_addon_the_after_side_is_what_the_provider_got(recordings, capsys) -> None:
    recording = recordings["trimflow"]
    report = audit_json(capsys, recording.dump)
    assert report["summary"]["inputs"][0]["proxy_records"] == TURNS * len(SESSIONS)
    for wire_format in SESSIONS:
        for turn, row in by_turn(report, wire_format).items():
            received = recording.received[(wire_format, turn)]
            kept = turn - count_pruned(turn, SHIPPED[wire_format])  # the shipped cap, cut in whole batches
            assert row["images_after"] == kept == count_images(received.body) <= GATEWAY_MAX_IMAGES
            assert row["body_bytes_after"] == len(received.body)
            assert row["pruned"] == turn - kept
    for conversation in report["summary"]["conversations"]:
        assert conversation["failures"] == []
        assert conversation["growth_per_turn"]["after.images"] < conversation["growth_per_turn"]["images"]


def test_the_addons_metrics_jsonl_gives_the_same_figures(recordings, capsys) -> None:
    recording = recordings["trimflow"]
    from_dump = audit_json(capsys, recording.dump)
    from_jsonl = audit_json(capsys, recording.metrics)
    keys = ("conversation", "turn", "images_before", "images_after", "body_bytes_before", "body_bytes_after", "status", "usage_input_tokens")
    project = lambda report: sorted(tuple(r[k] for k in keys) for r in report["records"])  # noqa: E731
    assert project(from_jsonl) == project(from_dump)


def test_a_har_export_by_mitmdump_gives_the_same_report(recordings, capsys, tmp_path) -> None:
    dump = recordings["plain"].dump
    har = tmp_path / "plain.har"
    done = subprocess.run(
        [mitmdump_binary(), "-n", "-q", "-r", str(dump), "--set", f"hardump={har}", "--set", f"confdir={tmp_path / 'confdir'}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and har.exists(), done.stdout + done.stderr
    from_dump = audit_json(capsys, dump)
    from_har = audit_json(capsys, har)

    def comparable(report: dict) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in ("ts", "overhead_ms")} for r in report["records"]]

    assert comparable(from_har) == comparable(from_dump)
    assert from_har["summary"]["conversations"] == from_dump["summary"]["conversations"]
    assert from_har["summary"]["inputs"][0]["kind"] == "har"


def test_a_what_if_shows_the_bytes_the_rules_would_save(recordings, capsys, tmp_path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("defaults:\n  max_images: 4\n  keep_recent: 1\n")
    report = audit_json(capsys, recordings["plain"].dump, "--rules", rules)
    saved = 0
    for wire_format in SESSIONS:
        for turn, row in by_turn(report, wire_format).items():
            assert row["images_after"] == min(turn, 4)
            assert (row["body_bytes_after"] < row["body_bytes_before"]) == (turn > 4)
            saved += row["body_bytes_before"] - row["body_bytes_after"]
    totals = report["summary"]["totals"]
    assert totals["body_bytes_saved"] == saved > 0 and totals["est_tokens_saved"] > 0
    code, text, _ = audit(capsys, recordings["plain"].dump, "--rules", rules)
    assert code == 0 and re.search(r"totals: 20 requests · body \S+->\S+ \(saved \S+, \d+%\)", text)


def test_the_gate(recordings, capsys) -> None:
    plain, through = recordings["plain"].dump, recordings["trimflow"].dump
    code, _, err = audit(capsys, plain, "--fail-on", "images>8", "--fail-on", "status=400", "--fail-on", "body>16MB")
    assert code == 1
    conversations = re.findall(r"FAIL images>8: conversation (\w+) turn 9 \(images 9, and 1 later turn\)", err)
    assert len(set(conversations)) == 2
    assert len(re.findall(r"FAIL status=400: conversation \w+ turn 9 ", err)) == 2
    assert "body>16MB" not in err
    assert audit(capsys, through, "--fail-on", "after.images>8", "--fail-on", "status=400", "--fail-on", "growth>1MB/turn")[0] == 0
    assert audit(capsys, through, "--fail-on", "images>8")[0] == 1  # the client still sent 10
    assert audit(capsys, plain, "--fail-on", "images>8 images")[0] == 2


def test_nothing_printed_holds_the_key_or_the_query(recordings, capsys) -> None:
    for fmt in ("text", "json", "markdown", "html"):
        for recording in recordings.values():
            _, out, err = audit(capsys, recording.dump, "--format", fmt, "--fail-on", "status=400")
            for text in (out, err):
                assert API_KEY not in text and QUERY_KEY not in text and "key=" not in text
                assert "What should I click next?" not in text
                assert not re.search(r"[A-Za-z0-9+/]{200,}", text)


# --- the HTML report in headless Chromium ---------------------------------------------------------------------


def render(page: Path, workdir: Path) -> tuple[str, list[str]]:
    """The DOM after the page's script ran, and the URLs of the network requests the page started."""
    netlog = workdir / "netlog.json"
    done = subprocess.run(
        headless(
            workdir / "profile",
            "--disable-component-update",
            "--disable-sync",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--log-net-log={netlog}",
            "--dump-dom",
            page.resolve().as_uri(),
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    log = json.loads(netlog.read_text())
    event_types = {number: name for name, number in log["constants"]["logEventTypes"].items()}
    requested = []
    for event in log["events"]:
        params = event.get("params") or {}
        # The browser's own background requests have another isolation key; the page's are keyed by file://.
        if event_types.get(event["type"]) == "URL_REQUEST_START_JOB" and "file://" in str(params.get("network_isolation_key", "")):
            requested.append(params.get("url", ""))
    return done.stdout, requested


class _Dom(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.html: dict[str, str | None] = {}
        self.sections: list[dict[str, str | None]] = []
        self.charts: list[tuple[int, str]] = []  # (section index, chart kind)
        self.points: list[tuple[int, str, str, int]] = []  # (section index, chart kind, series, turn)

    def handle_starttag(self, tag, attrs) -> None:
        a = dict(attrs)
        if tag == "html":
            self.html = a
        elif tag == "section":
            self.sections.append(a)
        elif tag == "svg" and "chart" in (a.get("class") or ""):
            self.charts.append((len(self.sections) - 1, a["data-chart"]))
        elif tag == "circle" and a.get("data-series"):
            section, chart = self.charts[-1]
            self.points.append((section, chart, a["data-series"], int(a["data-turn"])))


def test_the_html_report_in_chromium_has_one_point_per_turn_and_no_network(recordings, capsys, tmp_path) -> None:
    page = tmp_path / "report.html"
    code, _, err = audit(capsys, recordings["trimflow"].dump, "--format", "html", "--out", page)
    assert code == 0, err
    html = page.read_text()
    assert not re.search(r"\b(src|href)\s*=|url\(|@import|https?://", html)
    dom_text, requested = render(page, tmp_path)
    assert requested == []
    dom = _Dom()
    dom.feed(dom_text)
    assert dom.html.get("data-ready") == "1", "the page's script did not run"
    assert len(dom.sections) == len(SESSIONS)
    for index, section in enumerate(dom.sections):
        assert section["data-turns"] == str(TURNS)
        for chart in ("body", "images"):
            for series in ("before", "after"):  # through the addon, the after side is what was forwarded
                turns = [turn for s, c, ser, turn in dom.points if (s, c, ser) == (index, chart, series)]
                assert turns == list(range(1, TURNS + 1)), (section, chart, series)
    assert dom.html.get("data-points") == str(len(dom.points))


def test_the_network_check_sees_a_page_that_fetches(tmp_path) -> None:
    """The control for the test above: the same check catches a page that loads an image."""
    page = tmp_path / "fetches.html"
    page.write_text('<!DOCTYPE html><html><body><img src="http://audit-check.invalid/pixel.png"></body></html>')
    _, requested = render(page, tmp_path)
    assert "http://audit-check.invalid/pixel.png" in requested
