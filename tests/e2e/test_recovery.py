"""Recovery end to end: a real mitmdump in front of the fake provider, whose limit profiles are tighter than the
rules, driven by the real openai and anthropic SDKs, streaming and not.

For each limit (an image count the answer names, a bare 413 for the body, one image's bytes, one image's pixel
size): the client gets 200; the provider got the refused request and then one within the limit; the learned
file has the entry; the next request is within the limit on its first try; a restarted proxy reads the learned
file and does the same. Other failures (400 bad model, 401, 429, 500) are forwarded after exactly one upstream
request; a SigV4-signed request is never sent again, and neither is any in observe mode.
"""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import orjson
import pytest
import yaml
from PIL import Image

from trimflow._limit_profiles import load_profiles, provider_check
from trimflow.testing import REPLY_TEXT, FakeProvider, Received

from ..helpers import wait_for
from .helpers import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    Proxy,
    anthropic_turn,
    direct_http_client,
    image_payloads,
    openai_chat_turn,
    post,
    session,
    shots,
    start_all,
    stop_all,
    write_rules,
)

pytestmark = pytest.mark.e2e

RULES_MAX_IMAGES = 8  # the rules allow 8 images and 16 MiB: every profile below is tighter
LIMIT_BYTES, LIMIT_SIDE = 96 * 1024, 300  # the per-image profiles' limits: above what a refusal may teach at least


def big_shots(count: int, seed: int) -> list[bytes]:
    """Noise PNGs of about 120 KB of base64 each."""
    return shots(count, seed=seed, width=200, height=150)


def wide_shots(count: int, seed: int) -> list[bytes]:
    """Noise PNGs 320 px wide: small in bytes, wider than the side profile allows."""
    return shots(count, seed=seed, width=320, height=60)


CLAUDE = "claude-sonnet-4-6"

# Each profile answers with a real provider's text (docs/providers.md), at limits the small test images break.
PROFILES = """\
profiles:
  count-4:
    max_images: 4
    status: 400
    content_type: application/json
    body: {error: {message: "too many images: maximum allowed for model {model} is {limit}, got {images}"}}
  body-64k:
    max_body_bytes: 64KiB
    status: 413
    content_type: text/html
    body: "<html><head><title>413 Request Entity Too Large</title></head><body><center><h1>413 Request Entity Too Large</h1></center></body></html>"
  bytes-96k:
    max_image_base64_bytes: 96KiB
    status: 400
    content_type: application/json
    body:
      type: error
      error:
        type: invalid_request_error
        message: "{image_path}.source.base64: image exceeds 5 MB maximum: {image_bytes} bytes > {limit} bytes"
  side-300:
    max_image_side: 300
    status: 400
    content_type: application/json
    body:
      type: error
      error:
        type: invalid_request_error
        message: "{image_path}.source.base64.data: At least one of the image dimensions exceed max allowed size: {limit} pixels"
"""
# Other failures, chosen by the request's model.
FAILURES = {
    "no-such-model": (400, {"error": {"message": "The model `no-such-model` does not exist", "type": "invalid_request_error"}}),
    "bad-key": (401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}),
    "busy-model": (429, {"error": {"message": "Rate limit reached for requests", "type": "requests"}}),
    "broken-model": (500, {"error": {"message": "The server had an error while processing your request", "type": "server_error"}}),
}


def dispatcher(profiles_path: Path) -> Callable[[Received], tuple[int, str, bytes] | None]:
    """The provider's check: the first path segment names the profile (/count/v1/chat/completions); /fail answers by model."""
    profiles = load_profiles(profiles_path)
    checks = {
        "count": provider_check(profiles.get("count-4")),
        "body": provider_check(profiles.get("body-64k")),
        "bytes": provider_check(profiles.get("bytes-96k")),
        "side": provider_check(profiles.get("side-300")),
    }

    def check(received: Received) -> tuple[int, str, bytes] | None:
        prefix = received.path.split("/")[1]
        if prefix == "fail":
            status, body = FAILURES[received.json()["model"]]
            return status, "application/json", orjson.dumps(body)
        return checks[prefix](received) if prefix in checks else None

    return check


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("recovery")
    (root / "profiles.yaml").write_text(PROFILES)
    write_rules(root / "rules.yaml", RULES_MAX_IMAGES)
    return root


@pytest.fixture(scope="module")
def provider(workdir: Path) -> Iterator[FakeProvider]:
    with FakeProvider(check=dispatcher(workdir / "profiles.yaml")) as fake:
        yield fake


class Proxies:
    """The module's mitmdumps, each with a learned file of its own; `restart` starts a new one on the same file."""

    def __init__(self, root: Path, provider: FakeProvider) -> None:
        self.root, self.provider = root, provider
        self.running: list[Proxy] = []
        self.learned: dict[int, Path] = {}  # id(proxy) -> its learned file

    def make(self, name: str, learned: Path | None = None, **options: str) -> Proxy:
        workdir = self.root / name
        workdir.mkdir(exist_ok=True)
        learned = learned or self.root / f"{name}.learned.yaml"
        proxy = Proxy(workdir, "--mode", f"reverse:{self.provider.url}", rules=self.root / "rules.yaml", trimflow_learned=str(learned), **options)
        self.running.append(proxy)
        self.learned[id(proxy)] = learned
        return proxy

    def restart(self, proxy: Proxy, name: str) -> Proxy:
        stop_all(proxy.mitm)
        again = self.make(name, self.learned[id(proxy)])
        start_all(again.mitm)
        return again


@pytest.fixture(scope="module")
def proxies(workdir: Path, provider: FakeProvider) -> Iterator[dict[str, Proxy]]:
    pool = Proxies(workdir, provider)
    started = {name: pool.make(name) for name in ("count", "body-json", "body-stream", "bytes", "side", "failures")}
    started["observe"] = pool.make("observe", trimflow_mode="observe")
    started["pool"] = pool  # type: ignore[assignment]
    start_all(*(p.mitm for p in pool.running))
    yield started
    stop_all(*(p.mitm for p in pool.running))


@pytest.fixture
def fresh(provider: FakeProvider) -> FakeProvider:
    provider.clear()
    return provider


def openai_client(proxy: Proxy, prefix: str) -> openai.OpenAI:
    return openai.OpenAI(api_key=OPENAI_KEY, base_url=f"{proxy.url}/{prefix}/v1", http_client=direct_http_client(), max_retries=0, timeout=60)


def anthropic_client(proxy: Proxy, prefix: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=ANTHROPIC_KEY, base_url=f"{proxy.url}/{prefix}", http_client=direct_http_client(), max_retries=0, timeout=60)


def learned_entry(proxies: dict[str, Any], proxy: Proxy, model: str | None) -> dict[str, Any]:
    """The file's entry for `model`, once the store's thread has written it."""
    path = proxies["pool"].learned[id(proxy)]

    def entry() -> dict[str, Any] | None:
        entries = (yaml.safe_load(path.read_text()) or {}).get("learned", []) if path.exists() else []
        return next((e for e in entries if e["model"] == model), None)

    return wait_for(entry, f"the learned limit for {model}", timeout=30)


def sides(payload: bytes) -> int:
    with Image.open(io.BytesIO(payload)) as img:
        return max(img.size)


def turn(proxy: Proxy, prefix: str, wire_format: str, images: list[bytes], model: str, stream: bool) -> str:
    body = session(wire_format, images, model)
    if wire_format == "openai-chat":
        with openai_client(proxy, prefix) as client:
            text, _ = openai_chat_turn(client, body, stream)
    else:
        with anthropic_client(proxy, prefix) as client:
            text, _ = anthropic_turn(client, body, stream)
    return text


# --- the four limits -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_image_count_the_answer_names(proxies: dict[str, Any], fresh: FakeProvider, stream: bool) -> None:
    proxy: Proxy = proxies["count"]
    model = f"gpt-4o-{'stream' if stream else 'json'}"  # per model: each variant learns its own
    images = shots(6, seed=1)
    with proxy.expect_records(1) as records:
        assert turn(proxy, "count", "openai-chat", images, model, stream) == REPLY_TEXT
    refused, retried = fresh.received
    assert len(image_payloads("openai-chat", refused.json())) == 6
    assert image_payloads("openai-chat", retried.json()) == images[2:]  # the newest 4
    (record,) = records
    assert record["status"] == 200
    assert record["images_after"] == 4
    assert (record["retries"], record["refused_status"], record["retry_limits"]) == (1, 400, "max_images=4")
    assert record["retry_reasons"] == "too many images (max 4, from the answer)"
    assert "retried: too many images (max 4, from the answer) 200" in proxy.log()
    entry = learned_entry(proxies, proxy, model)
    assert (entry["upstream"], entry["limit"], entry["value"]) == (fresh.url, "max_images", 4)
    assert entry["source"] == f"400 copilot-gemini-count: too many images: maximum allowed for model {model} is 4, got 6"
    audit = subprocess.run([sys.executable, "-m", "trimflow", "audit", str(proxy.metrics)], capture_output=True, text=True, timeout=120)
    assert "retried 1x (max_images=4)" in audit.stdout, audit.stdout + audit.stderr
    # the next turn goes within the limit on its first try
    fresh.clear()
    assert turn(proxy, "count", "openai-chat", shots(7, seed=2), model, stream) == REPLY_TEXT
    (only,) = fresh.received
    assert len(image_payloads("openai-chat", only.json())) == 4
    if not stream:
        again = proxies["pool"].restart(proxy, "count-restarted")
        fresh.clear()
        assert turn(again, "count", "openai-chat", shots(8, seed=3), model, stream) == REPLY_TEXT
        (only,) = fresh.received
        assert len(image_payloads("openai-chat", only.json())) == 4
        proxies["count"] = again


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_bare_413_for_the_body(proxies: dict[str, Any], fresh: FakeProvider, stream: bool) -> None:
    proxy: Proxy = proxies["body-stream" if stream else "body-json"]
    images = shots(6, seed=4)  # about 75 KB of base64: over the profile's 64 KiB
    with proxy.expect_records(1) as records:
        assert turn(proxy, "body", "anthropic", images, CLAUDE, stream) == REPLY_TEXT
    refused, retried = fresh.received
    assert len(refused.body) > 64 * 1024 >= len(retried.body)
    assert image_payloads("anthropic", retried.json()) == images[len(images) - len(image_payloads("anthropic", retried.json())) :]
    (record,) = records
    assert (record["status"], record["retries"], record["refused_status"], record["retry_limits"]) == (200, 1, 413, "max_body_bytes=65536")
    assert "retried: request too large (max 65,536 bytes, stepped down from what was refused) 200" in proxy.log()
    entry = learned_entry(proxies, proxy, None)
    assert (entry["upstream"], entry["model"], entry["limit"], entry["value"], entry["source"]) == (
        fresh.url,
        None,
        "max_body_bytes",
        65536,
        "413 bare-413",  # a bare 413's page is never kept
    )
    fresh.clear()
    assert turn(proxy, "body", "anthropic", shots(7, seed=5), CLAUDE, stream) == REPLY_TEXT
    (only,) = fresh.received
    assert len(only.body) <= 64 * 1024
    if not stream:
        again = proxies["pool"].restart(proxy, "body-restarted")
        fresh.clear()
        assert turn(again, "body", "anthropic", shots(8, seed=6), "claude-opus-4-1", stream) == REPLY_TEXT  # host-wide: any model
        (only,) = fresh.received
        assert len(only.body) <= 64 * 1024
        proxies["body-json"] = again


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_one_image_over_the_bytes_the_answer_names(proxies: dict[str, Any], fresh: FakeProvider, stream: bool) -> None:
    proxy: Proxy = proxies["bytes"]
    model = f"{CLAUDE}-{'stream' if stream else 'json'}"
    images = big_shots(3, seed=7)  # each about 120 KB of base64: over 96 KiB (a limit over the 64 KiB floor)
    with proxy.expect_records(1) as records:
        assert turn(proxy, "bytes", "anthropic", images, model, stream) == REPLY_TEXT
    refused, retried = fresh.received
    assert all(len(p) * 4 / 3 > LIMIT_BYTES for p in image_payloads("anthropic", refused.json()))
    sent = image_payloads("anthropic", retried.json())
    assert len(sent) == 3 and all(len(p) * 4 <= LIMIT_BYTES * 3 for p in sent)
    (record,) = records
    assert (record["shrunk"], record["retries"], record["retry_limits"]) == (3, 1, f"max_image_bytes={LIMIT_BYTES}")
    assert f"retried: image too large (max {LIMIT_BYTES:,} bytes, from the answer) 200" in proxy.log()
    entry = learned_entry(proxies, proxy, model)
    assert (entry["limit"], entry["value"]) == ("max_image_bytes", LIMIT_BYTES)
    fresh.clear()
    assert turn(proxy, "bytes", "anthropic", big_shots(4, seed=8), model, stream) == REPLY_TEXT
    (only,) = fresh.received
    assert all(len(p) * 4 <= LIMIT_BYTES * 3 for p in image_payloads("anthropic", only.json()))
    if not stream:
        again = proxies["pool"].restart(proxy, "bytes-restarted")
        fresh.clear()
        assert turn(again, "bytes", "anthropic", big_shots(2, seed=9), model, stream) == REPLY_TEXT
        (only,) = fresh.received
        assert all(len(p) * 4 <= LIMIT_BYTES * 3 for p in image_payloads("anthropic", only.json()))
        proxies["bytes"] = again


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_one_image_over_the_pixels_the_answer_names(proxies: dict[str, Any], fresh: FakeProvider, stream: bool) -> None:
    proxy: Proxy = proxies["side"]
    model = f"gpt-4.1-{'stream' if stream else 'json'}"
    images = wide_shots(3, seed=10)  # 320x60: over 300 px (a limit over the 256 px floor)
    with proxy.expect_records(1) as records:
        assert turn(proxy, "side", "openai-chat", images, model, stream) == REPLY_TEXT
    refused, retried = fresh.received
    assert [sides(p) for p in image_payloads("openai-chat", refused.json())] == [320, 320, 320]
    assert [sides(p) for p in image_payloads("openai-chat", retried.json())] == [LIMIT_SIDE] * 3
    (record,) = records
    assert (record["retries"], record["retry_limits"]) == (1, f"max_image_side={LIMIT_SIDE}")
    assert f"retried: image too wide (max {LIMIT_SIDE}px, from the answer) 200" in proxy.log()
    entry = learned_entry(proxies, proxy, model)
    assert (entry["limit"], entry["value"]) == ("max_image_side", LIMIT_SIDE)
    fresh.clear()
    assert turn(proxy, "side", "openai-chat", wide_shots(4, seed=11), model, stream) == REPLY_TEXT
    (only,) = fresh.received
    assert {sides(p) for p in image_payloads("openai-chat", only.json())} == {LIMIT_SIDE}
    if not stream:
        again = proxies["pool"].restart(proxy, "side-restarted")
        fresh.clear()
        assert turn(again, "side", "openai-chat", wide_shots(2, seed=12), model, stream) == REPLY_TEXT
        (only,) = fresh.received
        assert {sides(p) for p in image_payloads("openai-chat", only.json())} == {LIMIT_SIDE}
        proxies["side"] = again


# --- never retried -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", list(FAILURES))
def test_other_failures_go_to_the_client_after_one_request(proxies: dict[str, Any], fresh: FakeProvider, model: str) -> None:
    proxy: Proxy = proxies["failures"]
    status, answer = FAILURES[model]
    with proxy.expect_records(1) as records:
        got, body = post(proxy.port, "/fail/v1/chat/completions", orjson.dumps(session("openai-chat", shots(3, seed=13), model)))
    assert (got, orjson.loads(body)) == (status, answer)
    assert len(fresh.received) == 1
    assert (records[0]["status"], records[0]["retries"], records[0]["refused_status"]) == (status, 0, None)
    assert "retried" not in proxy.log()


def test_a_sigv4_signed_request_is_never_sent_again(proxies: dict[str, Any], fresh: FakeProvider) -> None:
    proxy: Proxy = proxies["failures"]
    headers = {"Authorization": "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261124/us-east-1/bedrock/aws4_request, Signature=abc"}
    body = orjson.dumps(session("openai-chat", shots(6, seed=14), "gpt-4o-signed"))
    got, answer = post(proxy.port, "/count/v1/chat/completions", body, headers)
    assert got == 400 and b"maximum allowed for model gpt-4o-signed is 4" in answer
    (only,) = fresh.received
    assert only.body == body  # byte for byte: the signature covers it


def test_observe_mode_never_sends_again(proxies: dict[str, Any], fresh: FakeProvider) -> None:
    proxy: Proxy = proxies["observe"]
    with proxy.expect_records(1) as records:
        got, answer = post(proxy.port, "/count/v1/chat/completions", orjson.dumps(session("openai-chat", shots(6, seed=15), "gpt-4o")))
    assert got == 400 and b"maximum allowed for model gpt-4o is 4, got 6" in answer
    assert len(fresh.received) == 1
    assert records[0]["retries"] == 0
