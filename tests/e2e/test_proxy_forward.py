"""The proxy end to end in forward mode: clients send through mitmdump as their HTTPS proxy and trust its CA;
mitmdump intercepts TLS, prunes, and connects to an HTTPS upstream whose self-signed certificate it verifies
(ssl_verify_upstream_trusted_ca, never ssl_insecure). The SDKs' turns, in both modes: test_proxy_sdks.py."""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import orjson
import pytest
from google import genai
from google.genai import types

from trimflow.testing import REPLY_TEXT, FakeProvider

from ..certs import make_server_cert
from .helpers import (
    ANTHROPIC_KEY,
    GOOGLE_KEY,
    OPENAI_KEY,
    Proxy,
    anthropic_turn,
    genai_client_args,
    open_connection,
    openai_chat_turn,
    post,
    proxied_http_client,
    session,
    shots,
    start_all,
    stop_all,
    write_rules,
)

pytestmark = pytest.mark.e2e

MAX_IMAGES = 2
CLAUDE = "claude-sonnet-4-6"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("certs")


@pytest.fixture(scope="module")
def upstream(certs: Path) -> Iterator[FakeProvider]:
    """The HTTPS provider, on 127.0.0.1 (the certificate covers 127.0.0.1, ::1 and localhost)."""
    cert, key = make_server_cert(certs, "upstream")
    with FakeProvider(certfile=str(cert), keyfile=str(key)) as p:
        yield p


@pytest.fixture
def fresh(upstream: FakeProvider) -> FakeProvider:
    upstream.clear()
    return upstream


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, certs: Path, upstream: FakeProvider) -> Iterator[Proxy]:
    workdir = tmp_path_factory.mktemp("forward")
    # Regular mode: no --mode argument. mitmdump trusts exactly the upstream's own certificate.
    p = Proxy(workdir, rules=write_rules(workdir / "rules.yaml", MAX_IMAGES), ssl_verify_upstream_trusted_ca=str(certs / "upstream-cert.pem"))
    start_all(p.mitm)
    yield p
    stop_all(p.mitm)


@pytest.fixture(scope="module")
def trust_mitmproxy(proxy: Proxy) -> ssl.SSLContext:
    """What a client in forward mode trusts: mitmproxy's CA (created at its first start), nothing else."""
    assert proxy.mitm.ca_cert.exists()
    return ssl.create_default_context(cafile=str(proxy.mitm.ca_cert))


def test_clients_told_their_proxy_go_through_it_whatever_the_environment_says(
    proxy: Proxy,
    fresh: FakeProvider,
    upstream: FakeProvider,
    trust_mitmproxy: ssl.SSLContext,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The suite clears the user's proxy and CA variables (tests/conftest.py); this is why that hides nothing: with a
    dead proxy in every variable and NO_PROXY naming the upstream, each SDK's client still goes through the proxy
    under test, and the httpx clients trust its CA whatever SSL_CERT_FILE says."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # the discard port: nothing listens
        monkeypatch.setenv(name.lower(), "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing-ca.pem"))
    images = shots(MAX_IMAGES + 1, seed=27)
    options = types.HttpOptions(base_url=upstream.url, timeout=30_000, client_args=genai_client_args(proxy.url, trust_mitmproxy))
    with proxy.expect_records(3) as new:
        http_client = proxied_http_client(proxy.url, trust_mitmproxy)
        with anthropic.Anthropic(api_key=ANTHROPIC_KEY, base_url=upstream.url, http_client=http_client, max_retries=0, timeout=30) as client:
            assert anthropic_turn(client, session("anthropic", images, model=CLAUDE), stream=False)[0] == REPLY_TEXT
        http_client = proxied_http_client(proxy.url, trust_mitmproxy)
        with openai.OpenAI(api_key=OPENAI_KEY, base_url=f"{upstream.url}/v1", http_client=http_client, max_retries=0, timeout=30) as client:
            assert openai_chat_turn(client, session("openai-chat", images), stream=False)[0] == REPLY_TEXT
        # google-genai reads SSL_CERT_FILE for its websocket context whatever it is given: only the guard keeps a user's out.
        monkeypatch.delenv("SSL_CERT_FILE")
        with genai.Client(api_key=GOOGLE_KEY, http_options=options) as client:
            screens = [types.Part.from_bytes(data=shot, mime_type="image/png") for shot in images]
            reply = client.models.generate_content(model="gemini-2.5-flash", contents=[types.Content(role="user", parts=screens)])
            assert reply.text == REPLY_TEXT
    assert len(fresh.received) == 3
    assert sorted((r["format"], r["images_before"], r["images_after"]) for r in new) == [
        ("anthropic", MAX_IMAGES + 1, MAX_IMAGES),
        ("gemini", MAX_IMAGES + 1, MAX_IMAGES),
        ("openai-chat", MAX_IMAGES + 1, MAX_IMAGES),
    ]


def test_sse_events_arrive_one_by_one_through_the_tls_tunnel(proxy: Proxy, fresh: FakeProvider, trust_mitmproxy: ssl.SSLContext) -> None:
    body = {**session("anthropic", shots(3, seed=25), model=CLAUDE), "stream": True}
    arrivals: list[float] = []
    fresh.event_delay = 0.3
    try:
        with proxy.expect_records(1) as new:
            conn = open_connection(proxy.port, tunnel=(fresh.host, fresh.port), context=trust_mitmproxy)
            conn.request("POST", "/v1/messages", orjson.dumps(body), {"Content-Type": "application/json", "x-api-key": ANTHROPIC_KEY})
            response = conn.getresponse()
            assert response.status == 200 and response.headers["content-type"].startswith("text/event-stream")
            while line := response.readline():
                if line.startswith(b"data:"):
                    arrivals.append(time.monotonic())
            conn.close()
    finally:
        fresh.event_delay = 0.0
    assert len(arrivals) >= 6
    assert arrivals[-1] - arrivals[0] >= 0.6, [round(t - arrivals[0], 2) for t in arrivals]
    assert (new[0]["images_before"], new[0]["images_after"]) == (3, MAX_IMAGES)
    assert new[0]["usage_input_tokens"] is not None


def test_mitmproxy_verifies_the_upstream_certificate(proxy: Proxy, certs: Path, trust_mitmproxy: ssl.SSLContext) -> None:
    """An upstream with a certificate mitmdump was not told to trust is refused: TLS is checked on both legs."""
    cert, key = make_server_cert(certs, "stranger")
    with FakeProvider(certfile=str(cert), keyfile=str(key)) as stranger:
        status, answer = post(
            proxy.port,
            "/v1/chat/completions",
            orjson.dumps(session("openai-chat", shots(1, seed=26))),
            tunnel=(stranger.host, stranger.port),
            context=trust_mitmproxy,
        )
        assert stranger.received == []
    assert status == 502
    assert b"certificate" in answer.lower()
