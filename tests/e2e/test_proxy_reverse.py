"""The proxy end to end in reverse mode: a real mitmdump with the addon in front of the FakeProvider, driven by
raw HTTP and by the real SDK clients (their turns in both modes: test_proxy_sdks.py)."""

from __future__ import annotations

import gzip
import http.client
import json
import re
import subprocess
import time
from collections.abc import Iterator
from urllib.parse import parse_qs

import anthropic
import openai
import orjson
import pytest
from google import genai
from google.genai import types

from trimflow._rules_file import DEFAULT_RULES_PATH, load_rules
from trimflow.formats import FORMATS
from trimflow.testing import PATHS, REPLY_TEXT, FakeProvider, Received, b64

from ..helpers import wait_for
from ..mitmdump import Mitmdump
from .helpers import (
    ANTHROPIC_KEY,
    GOOGLE_KEY,
    GOOGLE_QUERY_KEY,
    OPENAI_KEY,
    PROMPT_TEXTS,
    ROOT,
    SECRETS,
    Proxy,
    assert_pruned_upstream,
    assert_record,
    direct_http_client,
    genai_client_args,
    genai_contents,
    image_payloads,
    post,
    replace_text,
    session,
    shots,
    start_all,
    stop_all,
    write_rules,
)

pytestmark = pytest.mark.e2e

MAX_IMAGES = 2  # the small rules: 5 images in, the newest 2 out
CLAUDE = "claude-sonnet-4-6"  # the SDK warns about deprecated model names


@pytest.fixture(scope="module")
def proxies(tmp_path_factory: pytest.TempPathFactory, provider: FakeProvider) -> Iterator[dict[str, Proxy | Mitmdump]]:
    """Every mitmdump of this module, started side by side; each configuration's fixture picks its own."""
    root = tmp_path_factory.mktemp("reverse")
    upstream = ("--mode", f"reverse:{provider.url}")

    def small_rules(name: str, **options: str) -> Proxy:
        workdir = root / name
        workdir.mkdir()
        return Proxy(workdir, *upstream, rules=write_rules(workdir / "rules.yaml", MAX_IMAGES), **options)

    bad_rules = root / "bad-rules.yaml"
    bad_rules.write_text("defaults:\n  max_images: 2\n  keep_recent: lots\n")
    started: dict[str, Proxy | Mitmdump] = {
        "enforce": small_rules("enforce"),
        "observe": small_rules("observe", trimflow_mode="observe"),
        "large_bodies": small_rules("large-bodies", stream_large_bodies="1k"),
        "reload": small_rules("reload", trimflow_rules_check="0"),
        "default_rules": Proxy(root / "default-rules", *upstream, rules=None),
        "bad_rules": Mitmdump(root / "bad-rules", *upstream, options={"trimflow_rules": str(bad_rules)}),
    }
    mitmdumps = [p.mitm if isinstance(p, Proxy) else p for p in started.values()]
    # mitmdump logs the addon's error, opens its port for a moment, then exits: its start() may see either.
    start_all(*mitmdumps, may_exit=(started["bad_rules"],))
    yield started
    stop_all(*mitmdumps)


@pytest.fixture(scope="module")
def proxy(proxies: dict) -> Proxy:
    """Enforce, with the small rules."""
    return proxies["enforce"]


@pytest.fixture(scope="module")
def openai_client(proxy: Proxy) -> Iterator[openai.OpenAI]:
    # No retries: a retried request would be a second upstream request and a second record.
    with openai.OpenAI(api_key=OPENAI_KEY, base_url=f"{proxy.url}/v1", http_client=direct_http_client(), max_retries=0, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def anthropic_client(proxy: Proxy) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(api_key=ANTHROPIC_KEY, base_url=proxy.url, http_client=direct_http_client(), max_retries=0, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def genai_client(proxy: Proxy) -> Iterator[genai.Client]:
    # Held by the fixture while the tests use it: a collected genai.Client closes its HTTP client.
    options = types.HttpOptions(base_url=proxy.url, timeout=30_000, client_args=genai_client_args())
    with genai.Client(api_key=GOOGLE_KEY, http_options=options) as client:
        yield client


def anthropic_key_of(headers: dict[str, str]) -> str | None:
    # anthropic 0.x sends x-api-key; 2.x sends Authorization: Bearer.
    return headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")


def google_key_of(received: Received) -> str | None:
    """The Gemini key as the provider got it: in the query, or moved to the header Google takes it in too."""
    return parse_qs(received.query).get("key", [received.headers.get("x-goog-api-key")])[0]


# --- raw requests of each format ------------------------------------------------------------------------------


def test_gemini_raw_request_with_snake_case_parts_is_pruned(proxy: Proxy, fresh: FakeProvider) -> None:
    """The REST shape of Google's docs (inline_data{mime_type}), which the engine knows, through the proxy."""
    images = shots(5, seed=6)
    status, _ = post(proxy.port, PATHS["gemini"], orjson.dumps(session("gemini", images)), {"x-goog-api-key": GOOGLE_KEY})
    assert status == 200
    assert_pruned_upstream(fresh, "gemini", images, MAX_IMAGES)


def test_ollama_chat_ndjson_stream(proxy: Proxy, fresh: FakeProvider) -> None:
    images = shots(5, seed=7)
    body = {**session("ollama", images), "stream": True}
    with proxy.expect_records(1) as new:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        conn.request("POST", "/api/chat", orjson.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200 and response.headers["content-type"] == "application/x-ndjson"
        lines = [orjson.loads(line) for line in response.read().splitlines() if line.strip()]
        conn.close()
    assert "".join(line["message"]["content"] for line in lines) == REPLY_TEXT
    assert lines[-1]["done"] is True
    assert_pruned_upstream(fresh, "ollama", images, MAX_IMAGES)
    assert_record(new[0], "ollama", 5, MAX_IMAGES, lines[-1]["prompt_eval_count"])


# --- streaming passes through event by event ---------------------------------------------------------------


def test_sse_events_arrive_one_by_one(proxy: Proxy, fresh: FakeProvider) -> None:
    """With a pause between the provider's events, a buffering proxy would hand them over all at once."""
    body = {**session("openai-chat", shots(3, seed=8)), "stream": True, "stream_options": {"include_usage": True}}
    arrivals: list[tuple[float, bytes]] = []
    fresh.event_delay = 0.3
    try:
        with proxy.expect_records(1) as new:
            conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
            conn.request(
                "POST", "/v1/chat/completions", orjson.dumps(body), {"Content-Type": "application/json", "Authorization": f"Bearer {OPENAI_KEY}"}
            )
            response = conn.getresponse()
            assert response.headers["content-type"].startswith("text/event-stream")
            while line := response.readline():
                if line.startswith(b"data:"):
                    arrivals.append((time.monotonic(), line))
            conn.close()
    finally:
        fresh.event_delay = 0.0
    assert len(arrivals) >= 6 and arrivals[-1][1].strip() == b"data: [DONE]"
    assert arrivals[-1][0] - arrivals[0][0] >= 0.6, [round(t - arrivals[0][0], 2) for t, _ in arrivals]
    usage = orjson.loads(arrivals[-2][1][5:])["usage"]
    assert new[0]["usage_input_tokens"] == usage["prompt_tokens"]


# --- observe, content-encoding, non-LLM traffic -------------------------------------------------------------


@pytest.fixture(scope="module")
def observe_proxy(proxies: dict) -> Proxy:
    return proxies["observe"]


def test_observe_forwards_the_bytes_as_sent_and_records_what_enforce_would_do(observe_proxy: Proxy, fresh: FakeProvider) -> None:
    # Indented JSON: a proxy that parsed and re-serialised the body would change these bytes.
    sent = json.dumps(session("anthropic", shots(5, seed=9), model=CLAUDE), indent=1).encode()
    with observe_proxy.expect_records(1) as new:
        status, _ = post(observe_proxy.port, "/v1/messages", sent, {"x-api-key": ANTHROPIC_KEY})
    assert status == 200
    assert len(fresh.received) == 1 and fresh.received[0].body == sent
    record = new[0]
    assert record["mode"] == "observe"
    assert (record["images_before"], record["images_after"], record["pruned"]) == (5, MAX_IMAGES, 3)
    assert record["body_bytes_before"] == len(sent) > record["body_bytes_after"]
    assert record["usage_input_tokens"] is not None and record["status"] == 200


def test_gzip_request_body_is_pruned_and_re_encoded(proxy: Proxy, fresh: FakeProvider) -> None:
    images = shots(5, seed=10)
    wire = gzip.compress(orjson.dumps(session("anthropic", images, model=CLAUDE)))
    with proxy.expect_records(1) as new:
        status, _ = post(proxy.port, "/v1/messages", wire, {"Content-Encoding": "gzip", "x-api-key": ANTHROPIC_KEY})
    assert status == 200
    received = assert_pruned_upstream(fresh, "anthropic", images, MAX_IMAGES)  # the provider decodes the gzip
    assert received.headers["content-encoding"] == "gzip"
    assert int(received.headers["content-length"]) == received.wire_bytes < len(wire)
    assert (new[0]["images_before"], new[0]["images_after"]) == (5, MAX_IMAGES)


def _non_llm_then_llm(proxy: Proxy, provider: FakeProvider, path: str, body: bytes, content_type: str) -> list[dict]:
    """POST a non-LLM body, then an LLM one; the records the two produced."""
    with proxy.expect_records(1) as new:
        post(proxy.port, path, body, {"Content-Type": content_type, "Authorization": f"Bearer {OPENAI_KEY}"})
        # The one record the block may produce comes from this LLM request, sent after the other finished.
        status, _ = post(proxy.port, "/v1/chat/completions", orjson.dumps(session("openai-chat", shots(3, seed=12))))
    assert status == 200
    assert (provider.received[0].path, provider.received[0].body) == (path, body)  # byte-identical
    return new


@pytest.mark.parametrize(
    ("path", "body", "content_type"),
    [
        ("/upload", shots(1, seed=11)[0], "image/png"),
        ("/v1/files", b'{"purpose": "vision", "filename": "screen.png", "bytes": 9000}', "application/json"),
        ("/v1/images/generations", b'{"model": "gpt-image-1", "prompt": "a cat", "n": 1}', "application/json"),
    ],
    ids=["binary-upload", "json-files", "json-images"],
)
def test_non_llm_posts_pass_byte_identical_without_a_record(proxy: Proxy, fresh: FakeProvider, path: str, body: bytes, content_type: str) -> None:
    new = _non_llm_then_llm(proxy, fresh, path, body, content_type)
    assert [r["path"] for r in new] == ["/v1/chat/completions"]


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v1/moderations"])
def test_embeddings_and_moderations_get_no_record(proxy: Proxy, fresh: FakeProvider, path: str) -> None:
    body = b'{"model": "text-embedding-3-small", "input": ["hello", "world"]}'
    new = _non_llm_then_llm(proxy, fresh, path, body, "application/json")
    assert [r["path"] for r in new] == ["/v1/chat/completions"]


# --- secrets ------------------------------------------------------------------------------------------------


LONG_BASE64 = re.compile(r"[A-Za-z0-9+/]{64,}")


def assert_nothing_secret(text: str, images: list[bytes], *secrets: str) -> None:
    for secret in secrets:
        assert secret not in text and secret[-12:] not in text
    for shot in images:
        assert b64(shot)[200:240] not in text
    assert LONG_BASE64.search(text) is None
    for prompt in PROMPT_TEXTS:
        assert prompt not in text


def test_keys_prompts_and_base64_stay_out_of_log_and_metrics(
    proxy: Proxy, fresh: FakeProvider, openai_client: openai.OpenAI, anthropic_client: anthropic.Anthropic, genai_client: genai.Client
) -> None:
    images = shots(4, seed=13)
    with proxy.expect_records(5):
        body = session("openai-chat", images)
        list(openai_client.chat.completions.create(model=body["model"], messages=body["messages"], stream=True))
        body = session("anthropic", images, model=CLAUDE)
        anthropic_client.messages.create(model=CLAUDE, max_tokens=64, system=body["system"], messages=body["messages"])
        post(proxy.port, "/v1/messages", orjson.dumps(body), {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"})
        genai_client.models.generate_content(model="gemini-2.5-flash", contents=genai_contents(images))
        post(proxy.port, f"{PATHS['gemini']}?key={GOOGLE_QUERY_KEY}", orjson.dumps(session("gemini", images)))
    # The keys went through to the provider, untouched.
    assert fresh.received[0].headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert anthropic_key_of(fresh.received[1].headers) == ANTHROPIC_KEY
    assert fresh.received[2].headers["x-api-key"] == ANTHROPIC_KEY
    assert fresh.received[3].headers["x-goog-api-key"] == GOOGLE_KEY
    assert google_key_of(fresh.received[4]) == GOOGLE_QUERY_KEY
    assert_nothing_secret(proxy.metrics.read_text(), images, *SECRETS, GOOGLE_QUERY_KEY)
    # The query key is left to the test below: mitmdump's own flow line shows it.
    assert_nothing_secret(proxy.log(), images, *SECRETS)


def test_gemini_query_key_stays_out_of_the_log(proxy: Proxy, fresh: FakeProvider) -> None:
    images = shots(3, seed=14)
    with proxy.expect_records(1):
        status, _ = post(proxy.port, f"{PATHS['gemini']}?key={GOOGLE_QUERY_KEY}", orjson.dumps(session("gemini", images)))
    assert status == 200 and google_key_of(fresh.received[0]) == GOOGLE_QUERY_KEY
    assert_nothing_secret(proxy.log(), images, GOOGLE_QUERY_KEY)


# --- stream_large_bodies ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def large_bodies_proxy(proxies: dict) -> Proxy:
    """stream_large_bodies=1k: mitmproxy would stream every request body over 1 KiB."""
    return proxies["large_bodies"]


def _large_request(proxy: Proxy, seed: int) -> tuple[list[bytes], list]:
    images = shots(4, seed=seed, width=128, height=96)  # ~37 KB each: a ~200 KB body, far over 1k
    body = session("openai-chat", images)
    assert len(orjson.dumps(body)) > 190_000
    with openai.OpenAI(api_key=OPENAI_KEY, base_url=f"{proxy.url}/v1", http_client=direct_http_client(), max_retries=0, timeout=30) as client:
        chunks = list(
            client.chat.completions.create(model=body["model"], messages=body["messages"], stream=True, stream_options={"include_usage": True})
        )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == REPLY_TEXT
    return images, chunks


def test_stream_large_bodies_never_breaks_a_request_and_says_why_once(large_bodies_proxy: Proxy, fresh: FakeProvider) -> None:
    """mitmproxy streams a body over stream_large_bodies itself, chunk by chunk, with no per-flow way to keep it
    whole, so trimflow cannot prune it: the request goes whole, with one warning at start and one per host."""
    for seed in (16, 17):
        fresh.clear()
        images, _ = _large_request(large_bodies_proxy, seed)
        assert len(fresh.received) == 1
        kept = image_payloads("openai-chat", fresh.received[0].json())
        assert kept in (images, images[-MAX_IMAGES:])
        assert kept == images
    warnings = [line for line in large_bodies_proxy.log().splitlines() if "stream_large_bodies" in line]
    assert len(warnings) == 2, warnings
    assert "above your largest LLM request" in warnings[0] and "went upstream unpruned" in warnings[1]


# --- the shipped default rules ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def default_rules_proxy(proxies: dict) -> Proxy:
    """No trimflow_rules option: the shipped rules/default.yaml."""
    return proxies["default_rules"]


# Two images over each model's cap in the shipped rules (8, 10 on Gemini): the cut moves down to the rule's low-water
# mark (3 of 8, 5 of 10); at the cap, the request goes as it came.
@pytest.mark.parametrize("wire_format", ["gemini", "openai-chat", "anthropic", "openai-responses"])
def test_default_rules_cut_each_models_cap_down_to_its_low_water_mark(default_rules_proxy: Proxy, fresh: FakeProvider, wire_format: str) -> None:
    model = FORMATS[wire_format].model(session(wire_format, shots(1, seed=16)), PATHS[wire_format])
    limits = load_rules(DEFAULT_RULES_PATH).limits_for("127.0.0.1", PATHS[wire_format], model)
    assert limits.max_images is not None and limits.low_water is not None
    cap = limits.max_images
    assert cap == (10 if wire_format == "gemini" else 8)
    at_cap = orjson.dumps(session(wire_format, shots(cap, seed=160)))
    with default_rules_proxy.expect_records(1) as new:
        status, _ = post(default_rules_proxy.port, PATHS[wire_format], at_cap)
    assert status == 200 and fresh.received[-1].body == at_cap, "a fresh conversation at its cap goes byte for byte"
    assert (new[0]["images_before"], new[0]["images_after"]) == (cap, cap)
    fresh.clear()
    images = shots(cap + 2, seed=16)
    body = session(wire_format, images)
    kept = int(cap * limits.low_water)
    assert kept == (5 if wire_format == "gemini" else 3)
    with default_rules_proxy.expect_records(1) as new:
        status, _ = post(default_rules_proxy.port, PATHS[wire_format], orjson.dumps(body))
    assert status == 200
    assert_pruned_upstream(fresh, wire_format, images, kept)
    assert (new[0]["images_before"], new[0]["images_after"], new[0]["rule"]) == (cap + 2, kept, limits.rule)
    assert f"trimflow: rules from {ROOT / 'rules' / 'default.yaml'}" in default_rules_proxy.log()


# --- rules files --------------------------------------------------------------------------------------------


def test_rules_are_reloaded_and_an_invalid_edit_keeps_the_last_good_ones(proxies: dict, fresh: FakeProvider) -> None:
    proxy: Proxy = proxies["reload"]  # trimflow_rules_check=0: the file is looked at on every request
    rules = proxy.rules
    assert rules is not None
    provider = fresh
    seeds = iter(range(17, 10_000))
    turn_lines = lambda: proxy.log().count("trimflow: conv ")  # noqa: E731
    error_lines = lambda: [line for line in proxy.log().splitlines() if "keeping the last good rules" in line]  # noqa: E731

    def images_upstream() -> int:
        # Each time a conversation of its own: within one, an image once cut stays cut whatever the rules say next.
        body = orjson.dumps(session("openai-chat", shots(5, seed=next(seeds)), f"gpt-4o-{next(seeds)}"))
        provider.clear()
        before = turn_lines()
        status, _ = post(proxy.port, "/v1/chat/completions", body)
        assert status == 200
        # Its turn's line is logged after its look at the rules file: whatever that look logged is in the log by then.
        wait_for(lambda: turn_lines() > before, "the request's log line")
        return len(image_payloads("openai-chat", provider.received[0].json()))

    assert images_upstream() == MAX_IMAGES
    write_rules(rules, 3)
    assert images_upstream() == 3
    assert f"trimflow: reloaded rules from {rules}" in proxy.log()

    replace_text(rules, "defaults:\n  max_images: 1\n  keep_recent: lots\n")
    assert images_upstream() == 3
    (error,) = error_lines()
    assert f"{rules}:3:" in error and "keep_recent" in error
    assert images_upstream() == 3  # looked at again: the unchanged bad file is not reported again
    assert len(error_lines()) == 1


def test_a_bad_rules_file_stops_mitmdump_at_start_naming_file_and_line(proxies: dict) -> None:
    mitm: Mitmdump = proxies["bad_rules"]
    assert mitm.process is not None
    try:
        code = mitm.process.wait(15)
    except subprocess.TimeoutExpired:
        code = None  # still serving with no rules: the failure below says so
    assert code not in (None, 0)
    assert f"{mitm.workdir.parent / 'bad-rules.yaml'}:3: keep_recent must be a whole number" in mitm.log()
