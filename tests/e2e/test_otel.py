"""OpenTelemetry end to end: a real mitmdump with trimflow_otel on, the OTLP endpoint from OTEL_EXPORTER_OTLP_ENDPOINT,
exports to an OTLP/HTTP receiver in the test (tests/otlp.py: the official protobuf definitions) while the real
anthropic and openai clients hold screenshot conversations with FakeProvider(cache=True). One span per request with
the GenAI conventions' attributes and trimflow's; the Prometheus counters as OTel metrics; and no attribute anywhere
carries the key, a prompt's text or an image."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from trimflow.testing import FakeProvider, b64

from ..otlp import Receiver, attributes, receiver
from .helpers import ANTHROPIC_KEY, OPENAI_KEY, Proxy, direct_http_client, replace_text, shots, start_all, stop_all

pytestmark = pytest.mark.e2e

TURNS = 4
CAP = 2
SECRET = "PROMPT-TEXT-7f3a"  # in every prompt: must reach no attribute
SYSTEM = f"You are a careful desktop assistant ({SECRET}). Read the screen, then say which control to use. " * 150


@pytest.fixture(scope="module")
def collector() -> Iterator[Receiver]:
    with receiver() as r:
        yield r


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, collector: Receiver) -> Iterator[Proxy]:
    workdir = tmp_path_factory.mktemp("otel")
    rules = replace_text(workdir / "rules.yaml", f"defaults:\n  max_images: {CAP}\n  keep_recent: 1\n")
    with FakeProvider(cache=True) as provider:
        started = Proxy(workdir, "--mode", f"reverse:{provider.url}", rules=rules, trimflow_otel="true")
        started.mitm.env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "50",  # milliseconds: spans go out soon after each request
            "OTEL_METRIC_EXPORT_INTERVAL": "200",
            "OTEL_SERVICE_NAME": "trimflow-test",
        }
        start_all(started.mitm)
        try:
            yield started
        finally:
            stop_all(started.mitm)


def claude(proxy: Proxy, images: list[bytes]) -> None:
    messages: list[dict[str, Any]] = []
    with anthropic.Anthropic(api_key=ANTHROPIC_KEY, base_url=proxy.url, http_client=direct_http_client(), max_retries=0, timeout=30) as client:
        for turn, shot in enumerate(images, 1):
            image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(shot)}}
            messages.append({"role": "user", "content": [image, {"type": "text", "text": f"{SECRET} turn {turn}"}]})
            system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
            reply = client.messages.create(model="claude-sonnet-4-6", max_tokens=100, system=system, messages=messages)
            messages.append({"role": "assistant", "content": [{"type": "text", "text": reply.content[0].text}]})


def chat(proxy: Proxy, images: list[bytes]) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    with openai.OpenAI(api_key=OPENAI_KEY, base_url=f"{proxy.url}/v1", http_client=direct_http_client(), max_retries=0, timeout=30) as client:
        for turn, shot in enumerate(images, 1):
            url = f"data:image/png;base64,{b64(shot)}"
            messages.append(
                {"role": "user", "content": [{"type": "text", "text": f"{SECRET} turn {turn}"}, {"type": "image_url", "image_url": {"url": url}}]}
            )
            reply = client.chat.completions.create(model="gpt-4o", messages=messages)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})


@pytest.fixture(scope="module")
def sessions(proxy: Proxy, collector: Receiver) -> tuple[list[dict[str, Any]], list[bytes]]:
    """Both sessions' records, once every span has come; and the screenshots they sent."""
    images = shots(TURNS, seed=71) + shots(TURNS, seed=72)
    with proxy.expect_records(2 * TURNS) as records:
        claude(proxy, images[:TURNS])
        chat(proxy, images[TURNS:])
    collector.wait_for(lambda: len(collector.spans()) >= 2 * TURNS)
    return records, images


def test_one_span_per_request_with_the_genai_and_trimflow_attributes(collector: Receiver, sessions: tuple) -> None:
    records, _ = sessions
    spans = collector.spans()
    assert len(spans) == len(records) == 2 * TURNS
    by_turn = {(a["gen_ai.provider.name"], a["trimflow.turn"]): a for a in map(attributes, spans)}
    for record in records:
        provider = "anthropic" if record["format"] == "anthropic" else "openai"
        a = by_turn[provider, record["turn"]]
        assert a["gen_ai.system"] == provider
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.request.model"] == record["model"]
        assert a["gen_ai.usage.input_tokens"] == record["usage_input_tokens"] > 0
        assert a["gen_ai.usage.output_tokens"] == record["usage_output_tokens"] > 0
        assert a.get("gen_ai.usage.cache_read.input_tokens") == record["usage_cache_read_tokens"]
        assert a.get("gen_ai.usage.cache_creation.input_tokens") == record["usage_cache_write_tokens"]
        assert (a["trimflow.images.before"], a["trimflow.images.after"]) == (record["images_before"], record["images_after"])
        assert (a["trimflow.bytes.before"], a["trimflow.bytes.after"]) == (record["body_bytes_before"], record["body_bytes_after"])
        assert a["trimflow.retries"] == 0
        assert a.get("trimflow.cache_break") == record["cache_break"]
        assert a["trimflow.conversation"] == record["conversation"]
    anthropic_turns = [by_turn["anthropic", t] for t in range(1, TURNS + 1)]
    assert anthropic_turns[0]["trimflow.cache_break"] == "first_turn"
    assert anthropic_turns[-1]["trimflow.images.after"] < anthropic_turns[-1]["trimflow.images.before"]  # the cap pruned
    assert anthropic_turns[-1]["gen_ai.usage.cache_read.input_tokens"] > 0
    assert {span.name for span in spans} == {"chat claude-sonnet-4-6", "chat gpt-4o"}
    assert all(span.end_time_unix_nano >= span.start_time_unix_nano > 0 for span in spans)
    assert {a["service.name"] for a in collector.resource_attributes()} == {"trimflow-test"}


def test_no_attribute_carries_a_key_a_prompt_or_an_image(collector: Receiver, sessions: tuple) -> None:
    _, images = sessions
    collector.wait_for(lambda: bool(collector.metric_points("trimflow_requests")))
    values: list[str] = []
    for span in collector.spans():
        values.append(span.name)
        values += [str(v) for v in attributes(span).values()]
    for resource in collector.resource_attributes():
        values += [str(v) for v in resource.values()]
    with collector.lock:
        exports = [r.SerializeToString() for r in collector.traces + collector.metrics]
    values += [str(point.attributes) for name in ("trimflow_requests", "trimflow_images_received") for point in collector.metric_points(name)]
    forbidden = [ANTHROPIC_KEY, OPENAI_KEY, SECRET, "turn 1"] + [b64(shot)[:64] for shot in images] + [b64(shot)[-64:] for shot in images]
    for value in values:
        assert not any(word in value for word in forbidden), value
    for raw in exports:  # what went over the wire, every field of it
        assert not any(word.encode() in raw for word in forbidden)


def test_the_prometheus_counters_arrive_as_otel_metrics(collector: Receiver, sessions: tuple) -> None:
    records, _ = sessions

    def total(name: str) -> float:
        return sum(point.as_int or point.as_double for point in collector.metric_points(name))

    collector.wait_for(lambda: total("trimflow_requests") == len(records))
    assert total("trimflow_images_received") == sum(r["images_before"] for r in records)
    assert total("trimflow_body_bytes_forwarded") == sum(r["body_bytes_after"] for r in records)
    assert total("trimflow_cache_read_tokens") == sum(r["usage_cache_read_tokens"] or 0 for r in records)
    labels = {kv.key for point in collector.metric_points("trimflow_requests") for kv in point.attributes}
    assert labels == {"format", "family", "rule", "kind", "outcome", "status"}
    assert total("trimflow_cache_breaks") == sum(1 for r in records if r["cache_break"]) > 0
    body = collector.metric_points("trimflow_request_body_bytes")
    assert sum(point.count for point in body) == len(records)
