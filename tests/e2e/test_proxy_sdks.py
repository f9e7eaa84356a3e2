"""The real openai, anthropic and google-genai SDK clients, streaming and not, through a real mitmdump with the
addon, in each mode:

- reverse: the SDK's base_url is the proxy, which talks plain HTTP to the FakeProvider;
- forward: the SDK sends through mitmdump as its HTTPS proxy and trusts its CA; mitmdump intercepts TLS, prunes,
  and connects to an HTTPS FakeProvider whose self-signed certificate it verifies (ssl_verify_upstream_trusted_ca,
  never ssl_insecure).

What only one mode has is in test_proxy_reverse.py and test_proxy_forward.py."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
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
    assert_pruned_upstream,
    assert_record,
    direct_http_client,
    genai_client_args,
    google_genai_turn,
    openai_chat_turn,
    openai_responses_turn,
    proxied_http_client,
    session,
    shots,
    start_all,
    stop_all,
    write_rules,
)

pytestmark = pytest.mark.e2e

MAX_IMAGES = 2  # the small rules: 5 images in, the newest 2 out
CLAUDE = "claude-sonnet-4-6"  # the SDK warns about deprecated model names
MODES = ("reverse", "forward")


@dataclass
class Route:
    """A proxy in one mode and the upstream behind it, and how an SDK client reaches that upstream through it."""

    proxy: Proxy
    upstream: FakeProvider
    trust: ssl.SSLContext | None  # forward: mitmproxy's CA, and nothing else

    @property
    def base_url(self) -> str:
        return self.proxy.url if self.trust is None else self.upstream.url

    def http_client(self) -> Any:
        # Where the client connects is said here, never left to the environment (trust_env=False).
        return direct_http_client() if self.trust is None else proxied_http_client(self.proxy.url, self.trust)

    def genai_client_args(self) -> dict[str, Any]:
        return genai_client_args() if self.trust is None else genai_client_args(self.proxy.url, self.trust)


@pytest.fixture(scope="module", params=MODES)
def route(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Route]:
    mode = request.param
    workdir = tmp_path_factory.mktemp(mode)
    rules = write_rules(workdir / "rules.yaml", MAX_IMAGES)
    if mode == "reverse":
        with FakeProvider() as upstream:
            proxy = Proxy(workdir, "--mode", f"reverse:{upstream.url}", rules=rules)
            start_all(proxy.mitm)
            try:
                yield Route(proxy, upstream, None)
            finally:
                stop_all(proxy.mitm)
        return
    # Forward: regular mode, no --mode argument; the upstream on HTTPS as 127.0.0.1, which mitmdump trusts alone.
    cert, key = make_server_cert(workdir / "certs", "upstream")
    with FakeProvider(certfile=str(cert), keyfile=str(key)) as upstream:
        proxy = Proxy(workdir, rules=rules, ssl_verify_upstream_trusted_ca=str(cert))
        start_all(proxy.mitm)
        try:
            assert proxy.mitm.ca_cert.exists()  # created at its first start
            yield Route(proxy, upstream, ssl.create_default_context(cafile=str(proxy.mitm.ca_cert)))
        finally:
            stop_all(proxy.mitm)


@pytest.fixture
def fresh(route: Route) -> FakeProvider:
    """The route's upstream with no requests recorded yet, so a test sees exactly its own."""
    route.upstream.clear()
    return route.upstream


@pytest.fixture(scope="module")
def openai_client(route: Route) -> Iterator[openai.OpenAI]:
    # No retries: a retried request would be a second upstream request and a second record.
    base_url = f"{route.base_url}/v1"
    with openai.OpenAI(api_key=OPENAI_KEY, base_url=base_url, http_client=route.http_client(), max_retries=0, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def anthropic_client(route: Route) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(api_key=ANTHROPIC_KEY, base_url=route.base_url, http_client=route.http_client(), max_retries=0, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def genai_client(route: Route) -> Iterator[genai.Client]:
    # Held by the fixture while the tests use it: a collected genai.Client closes its HTTP client.
    options = types.HttpOptions(base_url=route.base_url, timeout=30_000, client_args=route.genai_client_args())
    with genai.Client(api_key=GOOGLE_KEY, http_options=options) as client:
        yield client


def anthropic_key_of(headers: dict[str, str]) -> str | None:
    # anthropic 0.x sends x-api-key; 2.x sends Authorization: Bearer.
    return headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_openai_chat_completions(route: Route, fresh: FakeProvider, openai_client: openai.OpenAI, stream: bool) -> None:
    images = shots(5, seed=1)
    body = session("openai-chat", images)
    with route.proxy.expect_records(1) as new:
        text, prompt_tokens = openai_chat_turn(openai_client, body, stream)
    assert text == REPLY_TEXT
    received = assert_pruned_upstream(fresh, "openai-chat", images, MAX_IMAGES)
    assert received.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert_record(new[0], "openai-chat", 5, MAX_IMAGES, prompt_tokens)
    assert (new[0]["model"], new[0]["host"], new[0]["path"]) == ("gpt-4o", "127.0.0.1", "/v1/chat/completions")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_openai_responses(route: Route, fresh: FakeProvider, openai_client: openai.OpenAI, stream: bool) -> None:
    images = shots(5, seed=2)
    body = session("openai-responses", images)
    with route.proxy.expect_records(1) as new:
        text, input_tokens = openai_responses_turn(openai_client, body, stream)
    assert text == REPLY_TEXT
    assert_pruned_upstream(fresh, "openai-responses", images, MAX_IMAGES)
    assert_record(new[0], "openai-responses", 5, MAX_IMAGES, input_tokens)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_anthropic_messages(route: Route, fresh: FakeProvider, anthropic_client: anthropic.Anthropic, stream: bool) -> None:
    images = shots(5, seed=3)
    body = session("anthropic", images, model=CLAUDE)
    with route.proxy.expect_records(1) as new:
        text, input_tokens = anthropic_turn(anthropic_client, body, stream)
    assert text == REPLY_TEXT
    received = assert_pruned_upstream(fresh, "anthropic", images, MAX_IMAGES)
    assert anthropic_key_of(received.headers) == ANTHROPIC_KEY
    assert_record(new[0], "anthropic", 5, MAX_IMAGES, input_tokens)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_google_genai_reply_usage_and_record(route: Route, fresh: FakeProvider, genai_client: genai.Client, stream: bool) -> None:
    with route.proxy.expect_records(1) as new:
        text, prompt_tokens = google_genai_turn(genai_client, shots(3, seed=4), stream)
    assert text == REPLY_TEXT
    assert len(fresh.received) == 1
    # A custom base_url makes google-genai call /v1/models/...; the stream asks for SSE.
    assert fresh.received[0].path.endswith("/models/gemini-2.5-flash:" + ("streamGenerateContent" if stream else "generateContent"))
    assert fresh.received[0].headers["x-goog-api-key"] == GOOGLE_KEY
    record = new[0]
    assert (record["format"], record["model"], record["rule"]) == ("gemini", "gemini-2.5-flash", "defaults")
    assert record["status"] == 200 and record["usage_input_tokens"] == prompt_tokens


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_google_genai_request_is_pruned(route: Route, fresh: FakeProvider, genai_client: genai.Client, stream: bool) -> None:
    images = shots(5, seed=5)
    with route.proxy.expect_records(1) as new:
        _, prompt_tokens = google_genai_turn(genai_client, images, stream)
    assert_record(new[0], "gemini", 5, MAX_IMAGES, prompt_tokens)
    assert_pruned_upstream(fresh, "gemini", images, MAX_IMAGES)
