"""Keys planted in every place they travel never come out anywhere trimflow writes.

Planted: Authorization (OpenAI Bearer, AWS SigV4 credential), x-api-key, x-goog-api-key, Azure's api-key,
x-amz-security-token, Gemini's `?key=`, `api_key` fields in bodies (top level and nested), a provider error
that echoes the key, and bodies trimflow cannot handle (so their error messages are checked too).
Checked: mitmdump's output (at debug verbosity), the metrics JSONL, every flow's comment and metadata in a
`-w` recording read back with mitmproxy's FlowReader (the recorded request itself naturally holds its
headers), scripts/prune's stderr, and scripts/audit's output in every format over the recording, the HAR and
the metrics.
"""

from __future__ import annotations

import gzip
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from mitmproxy import io as mitmproxy_io

from trimflow.testing import PATHS, FakeProvider, Received, b64

from ..mitmdump import mitmdump_binary
from .helpers import PROMPT_TEXTS, ROOT, Proxy, post, session, shots, start_proxy, write_rules

pytestmark = pytest.mark.e2e

OPENAI_KEY = "sk-proj-PLANTED0openai0a1b2c3d4e5f6"
ANTHROPIC_KEY = "sk-ant-api03-PLANTED0anthropic09f8e7d"
GOOGLE_HEADER_KEY = "AIzaSyPLANTED0google0header01234"
GOOGLE_QUERY_KEY = "AIzaSyPLANTED0google0query05678"
AZURE_KEY = "PLANTED0azure0api0key0c0ffee0123"
BODY_KEY = "sk-PLANTED0body0api0key04242"
AWS_ACCESS_KEY = "AKIAPLANTED0AWS0ACCESS"
AWS_SESSION_TOKEN = "PLANTED0aws0session0token0IQoJb3JpZ2lu"
KEYS = (OPENAI_KEY, ANTHROPIC_KEY, GOOGLE_HEADER_KEY, GOOGLE_QUERY_KEY, AZURE_KEY, BODY_KEY, AWS_ACCESS_KEY, AWS_SESSION_TOKEN)
LONG_BASE64 = re.compile(r"[A-Za-z0-9+/]{100,}")
ECHO = "x-test-echo-key"  # asks the provider to answer 401 quoting the key, as OpenAI's errors do


def leaks(text: str, keys: tuple[str, ...] = KEYS) -> list[str]:
    """What of the planted secrets (or a recognisable tail of one) appears in `text`."""
    found = [key for key in keys if key in text or key[-12:] in text]
    found += [f"prompt: {p}" for p in PROMPT_TEXTS if p in text]
    found += [f"base64: {m[:20]}..." for m in LONG_BASE64.findall(text)]
    return found


def with_body_keys(body: dict) -> bytes:
    return orjson.dumps({**body, "api_key": BODY_KEY, "metadata": {"api_key": BODY_KEY, "user": "u1"}})


def echo_key(received: Received) -> tuple[int, str, bytes] | None:
    if ECHO not in received.headers:
        return None
    key = received.headers.get("authorization", "").removeprefix("Bearer ") or received.headers.get("x-api-key", "")
    return 401, "application/json", orjson.dumps({"error": {"type": "invalid_request_error", "message": f"Incorrect API key provided: {key}"}})


@dataclass
class Run:
    proxy: Proxy
    recording: Path
    har: Path
    provider: FakeProvider
    log: str


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """One proxy session carrying the keys every way they travel; stopped so the recording is complete."""
    workdir = tmp_path_factory.mktemp("secrets")
    recording, har = workdir / "flows.mitm", workdir / "flows.har"
    images = shots(4, seed=71)
    with FakeProvider(check=echo_key) as provider:
        proxy = start_proxy(
            workdir,
            "--mode",
            f"reverse:{provider.url}",
            "-w",
            str(recording),
            rules=write_rules(workdir / "rules.yaml", 2),
            termlog_verbosity="debug",
        )
        try:
            port = proxy.port
            chat, anthropic, gemini = (session(f, images) for f in ("openai-chat", "anthropic", "gemini"))
            sent = [
                post(port, PATHS["openai-chat"], with_body_keys(chat), {"Authorization": f"Bearer {OPENAI_KEY}"}),
                post(port, PATHS["anthropic"], with_body_keys(anthropic), {"x-api-key": ANTHROPIC_KEY}),
                post(port, f"{PATHS['gemini']}?key={GOOGLE_QUERY_KEY}", with_body_keys(gemini)),
                post(port, f"{PATHS['gemini']}?alt=sse&key={GOOGLE_HEADER_KEY}", with_body_keys(gemini), {"x-goog-api-key": GOOGLE_HEADER_KEY}),
                post(port, "/openai/deployments/gpt-4o/chat/completions?api-version=2024-06-01", with_body_keys(chat), {"api-key": AZURE_KEY}),
                post(
                    port,
                    PATHS["bedrock-converse"],
                    with_body_keys(session("bedrock-converse", images)),
                    {
                        "Authorization": f"AWS4-HMAC-SHA256 Credential={AWS_ACCESS_KEY}/20250101/us-east-1/bedrock/aws4_request, "
                        "SignedHeaders=host;x-amz-date, Signature=" + "ab" * 32,
                        "x-amz-security-token": AWS_SESSION_TOKEN,
                        "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
                    },
                ),
                # Bodies trimflow cannot handle, with the key next to the fault: their reasons must not quote it.
                post(
                    port,
                    PATHS["openai-chat"],
                    b'{"api_key": "' + BODY_KEY.encode() + b'", "messages": [,]}',
                    {"Authorization": f"Bearer {OPENAI_KEY}"},
                ),
                post(port, PATHS["anthropic"], b'{"api_key":"' + BODY_KEY.encode() + b'"\xff}', {"x-api-key": ANTHROPIC_KEY}),
                post(port, PATHS["openai-chat"], with_body_keys(chat), {"Authorization": f"Bearer {OPENAI_KEY}", "Content-Encoding": "gzip"}),
                post(
                    port,
                    PATHS["openai-chat"],
                    gzip.compress(with_body_keys(chat))[:-30],
                    {"Authorization": f"Bearer {OPENAI_KEY}", "Content-Encoding": "gzip"},
                ),
                # The provider's error quotes the key back.
                post(port, PATHS["openai-chat"], with_body_keys(chat), {"Authorization": f"Bearer {OPENAI_KEY}", ECHO: "1"}),
                post(port, PATHS["anthropic"], with_body_keys(anthropic), {"x-api-key": ANTHROPIC_KEY, ECHO: "1"}),
            ]
            assert [status for status, _ in sent] == [200, 200, 200, 200, 200, 200, 400, 400, 400, 400, 401, 401]
            assert OPENAI_KEY in sent[-2][1].decode()  # the client does get the provider's answer, key and all
        finally:
            proxy.mitm.stop()
        # The keys went through to the provider untouched.
        got = provider.received
        assert got[0].headers["authorization"] == f"Bearer {OPENAI_KEY}" and got[1].headers["x-api-key"] == ANTHROPIC_KEY
        # Gemini's query key travels as its header instead, so mitmdump's own flow line never shows it.
        assert got[2].query == "" and got[2].headers["x-goog-api-key"] == GOOGLE_QUERY_KEY
        assert got[3].query == "alt=sse" and got[3].headers["x-goog-api-key"] == GOOGLE_HEADER_KEY
        assert got[4].headers["api-key"] == AZURE_KEY and got[5].headers["x-amz-security-token"] == AWS_SESSION_TOKEN
        assert all(BODY_KEY.encode() in r.body for r in got if r.body.startswith(b"{"))
        # mitmdump's HAR export of the recording, offline (mitmproxy 11 writes no HAR on SIGTERM), without the
        # two flows whose gzip label is a lie: mitmproxy 11's HAR export stops at a body it cannot decode.
        decodable = workdir / "decodable.mitm"
        with open(recording, "rb") as f, open(decodable, "wb") as out:
            writer = mitmproxy_io.FlowWriter(out)
            for flow in mitmproxy_io.FlowReader(f).stream():
                if "content-encoding" not in flow.request.headers:
                    writer.add(flow)
        done = subprocess.run([mitmdump_binary(), "-n", "-q", "-r", str(decodable), "--set", f"hardump={har}"], capture_output=True, timeout=60)
        assert done.returncode == 0 and har.exists(), done.stdout + done.stderr
        yield Run(proxy, recording, har, provider, proxy.log())


def test_mitmdump_output_holds_no_key(run: Run) -> None:
    assert "trimflow: " in run.log and "forwarded untouched" in run.log  # the addon did log, at debug verbosity
    assert leaks(run.log, KEYS) == []


def test_mitmdump_output_holds_no_query_key(run: Run) -> None:
    assert leaks(run.log, (GOOGLE_QUERY_KEY,)) == []


def test_metrics_hold_no_key(run: Run) -> None:
    text = run.proxy.metrics.read_text()
    assert len(text.splitlines()) >= 10  # one per flow the addon could read, the failed ones included
    assert leaks(text) == []
    assert "?" not in "".join(r["path"] for r in run.proxy.records())  # paths without their query


def test_every_llm_flow_has_a_metrics_line_undecodable_bodies_included(run: Run) -> None:
    records = run.proxy.records()
    assert len(records) == 12
    assert sum(1 for r in records if r["reason"] and "gzip" in r["reason"]) == 2


def test_flow_comments_and_metadata_hold_no_key(run: Run) -> None:
    with open(run.recording, "rb") as f:
        flows = list(mitmproxy_io.FlowReader(f).stream())
    assert len(flows) == 12
    assert sum("trimflow" in flow.metadata for flow in flows) >= 10
    for flow in flows:
        assert leaks(flow.comment + orjson.dumps(flow.metadata, default=str).decode()) == []
    # The recording is the traffic: its requests hold the keys, as any mitmproxy recording does.
    assert flows[0].request.headers["authorization"] == f"Bearer {OPENAI_KEY}"


def scripts(*command: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(ROOT / "scripts" / command[0]), *command[1:]], input=stdin, capture_output=True, timeout=120)


def test_scripts_prune_stderr_holds_no_key() -> None:
    body = with_body_keys(session("gemini", shots(4, seed=72)))
    url = f"https://generativelanguage.googleapis.com{PATHS['gemini']}?key={GOOGLE_QUERY_KEY}"
    headers = ("--header", f"x-goog-api-key: {GOOGLE_HEADER_KEY}", "--header", f"Authorization: Bearer {OPENAI_KEY}")
    done = scripts("prune", "--url", url, *headers, "--max-images", "1", stdin=body)
    assert done.returncode == 0, done.stderr[-500:]
    assert BODY_KEY.encode() in done.stdout  # stdout is the body to forward, its own fields and all
    assert orjson.loads(done.stderr.splitlines()[-1])["images_after"] == 1
    assert leaks(done.stderr.decode()) == []
    for bad in (b'{"api_key": "' + BODY_KEY.encode() + b'", ]', b'{"k":"' + BODY_KEY.encode() + b'\xff"}'):
        failed = scripts("prune", "--url", url, *headers, stdin=bad)
        assert failed.returncode in (0, 2) and failed.stderr
        assert leaks(failed.stderr.decode() + (failed.stdout.decode(errors="replace") if failed.returncode else "")) == []


@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "html"])
def test_scripts_audit_output_holds_no_key(run: Run, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / f"report.{fmt}"
    inputs = [str(run.recording), str(run.har), str(run.proxy.metrics)]
    done = scripts("audit", *inputs, "--format", fmt, "--out", str(out), "--fail-on", "images>0")
    assert done.returncode == 1, done.stderr[-500:]  # the gate fired, naming conversations on stderr
    report = out.read_text()
    assert report.strip()
    assert leaks(report + done.stderr.decode() + done.stdout.decode()) == []


def test_scripts_audit_what_if_holds_no_key(run: Run) -> None:
    what_if = scripts("audit", str(run.recording), "--rules", str(ROOT / "rules" / "default.yaml"), "--format", "json")
    assert what_if.returncode == 0, what_if.stderr[-500:]
    assert leaks(what_if.stdout.decode() + what_if.stderr.decode()) == []


def test_scripts_audit_errors_hold_no_key(tmp_path: Path) -> None:
    bad = tmp_path / "broken.jsonl"
    bad.write_bytes(b'{"api_key": "' + BODY_KEY.encode() + b'", "path": "/v1/chat/completions?key=' + GOOGLE_QUERY_KEY.encode() + b'"\n')
    done = scripts("audit", str(bad))
    assert done.returncode == 2 and done.stderr
    assert leaks(done.stderr.decode() + done.stdout.decode()) == []


def test_the_checks_can_fail() -> None:
    """leaks() finds each key, a tail of one, prompt text and base64."""
    for key in KEYS:
        assert leaks(f"x {key} y") and leaks(f"...{key[-12:]}")
    assert leaks(PROMPT_TEXTS[0]) and leaks(b64(shots(1, seed=73)[0]))
