"""trimflow.proxy.otel: off by default and nothing built until on; without the SDK, one line and the proxy goes on;
the provider's name from the API and host; a span's attributes are the record's counts and names, none of them None.
The spans and metrics themselves, decoded by an OTLP receiver through a real mitmdump: tests/e2e/test_otel.py."""

from __future__ import annotations

import logging
import socket
import sys

import orjson
import pytest
from mitmproxy.test import taddons
from opentelemetry import trace

from trimflow import proxy
from trimflow._record import COUNT_TOKENS, ENFORCE, Record
from trimflow.proxy.otel import ENABLE, OnceAMinute, Telemetry, _sdk, provider_name, span_attributes

from ..helpers import TrimflowAddons, answer_sent, requested
from .flows import json_answer, llm_flow


def record(fmt: str = "anthropic", host: str = "api.anthropic.com", **fields: object) -> Record:
    r = Record(
        ts="2026-12-07T10:00:00.250Z",
        conversation="c0ffee00",
        turn=3,
        host=host,
        path="/v1/messages",
        format=fmt,
        model="claude-sonnet-4-6",
        rule="defaults",
        mode=ENFORCE,
        segment=1,
    )
    for name, value in fields.items():
        setattr(r, name, value)
    return r


@pytest.mark.parametrize(
    ("fmt", "host", "name"),
    [
        ("anthropic", "api.anthropic.com", "anthropic"),
        ("anthropic", "bedrock-runtime.us-east-1.amazonaws.com", "aws.bedrock"),  # InvokeModel with an Anthropic body
        ("bedrock-converse", "bedrock-runtime.eu-west-1.amazonaws.com", "aws.bedrock"),
        ("openai-chat", "api.openai.com", "openai"),
        ("openai-responses", "api.openai.com", "openai"),
        ("gemini", "generativelanguage.googleapis.com", "gcp.gemini"),
        ("gemini", "us-central1-aiplatform.googleapis.com", "gcp.vertex_ai"),
        ("ollama", "localhost:11434", "ollama"),
    ],
)
def test_the_provider_is_named_by_the_api_and_the_host(fmt: str, host: str, name: str) -> None:
    assert provider_name(record(fmt, host)) == name


def test_a_spans_attributes_are_the_records_counts_and_none_is_left_out() -> None:
    full = record(
        images_before=9,
        images_after=4,
        pruned=5,
        body_bytes_before=900,
        body_bytes_after=400,
        usage_input_tokens=5000,
        usage_cache_read_tokens=4000,
        usage_cache_write_tokens=800,
        usage_output_tokens=20,
        status=200,
        retries=1,
        cache_break="trimflow_cut",
        cache_break_at="image 5",
    )
    a = span_attributes(full)
    assert a["gen_ai.usage.cache_read.input_tokens"] == 4000 and a["gen_ai.usage.cache_creation.input_tokens"] == 800
    assert (a["trimflow.images.before"], a["trimflow.images.after"], a["trimflow.images.pruned"]) == (9, 4, 5)
    assert (a["trimflow.cache_break"], a["trimflow.cache_break_at"], a["trimflow.retries"]) == ("trimflow_cut", "image 5", 1)
    bare = span_attributes(record("openai-chat", "api.openai.com", kind=COUNT_TOKENS, model=None))
    assert None not in bare.values()
    assert "gen_ai.operation.name" not in bare and "gen_ai.usage.input_tokens" not in bare and "gen_ai.request.model" not in bare


def test_off_by_default_and_the_help_says_how_to_install() -> None:
    instance = TrimflowAddons()
    with taddons.context(instance) as tctx:
        assert tctx.options.trimflow_otel is False
        assert "pip install 'trimflow[otel]'" in tctx.options._options["trimflow_otel"].help
        assert instance.get(proxy.OpenTelemetry).telemetry is None


def test_on_it_builds_its_own_providers_and_off_shuts_them_down(addon, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: nothing is sent before off
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "3600000")
    otel = addon.get(proxy.OpenTelemetry)
    addon.tctx.configure(addon, trimflow_otel=True)
    telemetry = otel.telemetry
    assert telemetry is not None
    assert trace.get_tracer_provider() is not telemetry.tracer_provider  # the process's global provider is left alone
    addon.tctx.configure(addon, trimflow_otel=False)
    assert otel.telemetry is None


async def test_without_the_sdk_trimflow_runs_and_says_how_to_enable_it(
    addon, tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as in a Python that lacks it
    caplog.set_level(logging.INFO, "trimflow")
    addon.tctx.configure(addon, trimflow_otel=True, trimflow_metrics=str(tmp_path / "m.jsonl"))
    lines = [r.getMessage() for r in caplog.records if "opentelemetry" in r.getMessage().lower()]
    assert lines == [f"trimflow: trimflow_otel needs the OpenTelemetry SDK and its OTLP exporter, which this Python lacks: {ENABLE}"]
    assert addon.get(proxy.OpenTelemetry).telemetry is None
    flow = llm_flow()
    await requested(addon, flow)
    flow.response = json_answer(b'{"usage":{"prompt_tokens":321,"completion_tokens":5}}')
    addon.response(flow)
    await answer_sent()
    assert orjson.loads((tmp_path / "m.jsonl").read_bytes())["status"] == 200  # the proxy and its JSONL go on


def test_the_exporters_failures_come_once_a_minute() -> None:
    now = [0.0]
    quiet = OnceAMinute(60, clock=lambda: now[0])

    def line(n: int) -> logging.LogRecord:
        return logging.LogRecord("opentelemetry", logging.WARNING, __file__, 1, f"Transient error {n}", None, None)

    kept = []
    for n in range(10):
        record = line(n)
        if quiet.filter(record):
            kept.append(record.getMessage())
        now[0] += 15
    assert kept == ["Transient error 0", "Transient error 4 (and 3 more like it held back)", "Transient error 8 (and 3 more like it held back)"]


def test_with_the_collector_down_exit_waits_no_longer_than_its_deadline(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens there once this closes
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{closed}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "30")  # the exporter would retry for 30 s
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
    caplog.set_level(logging.INFO, "trimflow")
    telemetry = Telemetry(_sdk())
    telemetry.observe(record(status=200), None)
    telemetry.shutdown(deadline=0.2)
    lines = [r.getMessage() for r in caplog.records if r.name == "trimflow"]
    assert lines == ["trimflow: the OpenTelemetry collector did not take the last spans and metrics within 0.2 s: dropped"]
