"""The OpenTelemetry addon: with `trimflow_otel` on, one span per LLM request and the Prometheus addon's counters and
histograms as OTel metrics, exported over OTLP/HTTP to the collector the standard OTEL_EXPORTER_OTLP_* variables name
(docs/deployment.md).

Like the Prometheus addon it is a listener of the metrics addon: each record, as it is written, becomes a span (from
the request's arrival to the answer's end) with the GenAI semantic conventions' attributes a record can honestly fill
(gen_ai.provider.name for the API the request speaks, the request's model, the usage the provider reported, cache
reads and writes included) and trimflow's own (images, bytes, retries, why the cache broke). A span carries counts,
names and digests only: never a prompt, an image, a header or a key (`span_attributes` is the one place that says
what goes out). The metrics' attributes are the Prometheus labels: bounded, no host, no conversation.

The OpenTelemetry SDK is imported here only, when the option is on: without it, trimflow runs as ever and says in one
line how to add it. Nothing is built at import; spans and metrics go out on the SDK's own threads (a batch span
processor, a periodic metric reader), never on mitmproxy's event loop, and what is still queued is flushed at exit.
The option alone turns it on: an OTEL_EXPORTER_OTLP_ENDPOINT exported for another program in the same shell does not.
"""

from __future__ import annotations

import calendar
import logging
import os
import threading
import time
from types import SimpleNamespace
from typing import Any

from mitmproxy import ctx
from mitmproxy.addonmanager import Loader

from .._cache_break import CAUSES
from .._record import COUNT_TOKENS, Record
from ..formats import anthropic, bedrock, gemini, ollama, openai_chat, openai_responses
from .metrics import Metrics
from .options import exits_at_startup
from .prometheus import BODY_BUCKETS, CACHE_BREAKS_DOC, OVERHEAD_BUCKETS, SUMS, model_family, outcome_of, status_class

log = logging.getLogger("trimflow")

OPTION = "trimflow_otel"
ENABLE = "pip install 'trimflow[otel]' (a pipx mitmproxy: pipx inject mitmproxy opentelemetry-sdk opentelemetry-exporter-otlp-proto-http)"
SERVICE_NAME = "trimflow"  # unless OTEL_SERVICE_NAME names another
SHUTDOWN_SECONDS = 3.0  # what mitmproxy's exit waits for the last export
# The exporters log each failed attempt (several per batch while a collector is down): one line a minute is kept.
EXPORTER_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.exporter.otlp.proto.http.metric_exporter")
QUIET_SECONDS = 60.0
# The GenAI semantic conventions' provider names (gen_ai.provider.name), by the API a request speaks; a Gemini request
# to Vertex AI's host is gcp.vertex_ai.
PROVIDERS = {
    anthropic.NAME: "anthropic",
    openai_chat.NAME: "openai",
    openai_responses.NAME: "openai",
    gemini.NAME: "gcp.gemini",
    bedrock.NAME: "aws.bedrock",
    ollama.NAME: "ollama",
}
_VERTEX_HOST = "aiplatform.googleapis.com"
_BEDROCK_HOST = "bedrock-runtime."  # InvokeModel speaks the model's own API (an Anthropic body) to Bedrock


def provider_name(record: Record) -> str | None:
    """The provider as the GenAI conventions name it: by the API the request speaks, and for Vertex AI and Bedrock
    (which speak others' APIs too) by the host. An OpenAI-compatible server elsewhere is named openai: the API it speaks."""
    host = record.host.lower()
    if host.startswith(_BEDROCK_HOST) or f".{_BEDROCK_HOST}" in host:
        return "aws.bedrock"
    name = PROVIDERS.get(record.format)
    if name == "gcp.gemini" and host.endswith(_VERTEX_HOST):
        return "gcp.vertex_ai"
    return name


def span_attributes(record: Record) -> dict[str, str | int | bool]:
    """What a request's span carries: the record's counts and names, never its body, headers or query string."""
    provider = provider_name(record)
    attributes: dict[str, str | int | bool | None] = {
        "gen_ai.operation.name": None if record.kind == COUNT_TOKENS else "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.system": provider,  # the provider's name before the conventions renamed it, which older backends read
        "gen_ai.request.model": record.model,
        "gen_ai.usage.input_tokens": record.usage_input_tokens,
        "gen_ai.usage.output_tokens": record.usage_output_tokens,
        "gen_ai.usage.cache_read.input_tokens": record.usage_cache_read_tokens,
        "gen_ai.usage.cache_creation.input_tokens": record.usage_cache_write_tokens,
        "http.response.status_code": record.status,
        "trimflow.format": record.format,
        "trimflow.rule": record.rule,
        "trimflow.mode": record.mode,
        "trimflow.kind": record.kind,
        "trimflow.conversation": record.conversation,  # a digest (trimflow._history.short_id)
        "trimflow.turn": record.turn,
        "trimflow.images.before": record.images_before,
        "trimflow.images.after": record.images_after,
        "trimflow.images.pruned": record.sent_pruned,
        "trimflow.bytes.before": record.body_bytes_before,
        "trimflow.bytes.after": record.sent_body_bytes,
        "trimflow.estimated_tokens.before": record.est_tokens_before,
        "trimflow.estimated_tokens.after": record.sent_est_tokens,
        "trimflow.retries": record.retries,
        "trimflow.cache_break": record.cache_break,
        "trimflow.cache_break_at": record.cache_break_at,
        "trimflow.outcome": outcome_of(record),
    }
    return {name: value for name, value in attributes.items() if value is not None}


def _start_ns(record: Record, end_ns: int) -> int:
    """When the request came, from the record's timestamp (milliseconds, UTC); the end when it cannot be read."""
    try:
        seconds = calendar.timegm(time.strptime(record.ts[:19], "%Y-%m-%dT%H:%M:%S")) + int(record.ts[20:23]) / 1000
    except (ValueError, IndexError):
        return end_ns
    return min(end_ns, int(seconds * 1e9))


def _sdk() -> Any:
    """The SDK's modules, or None when this Python lacks them."""
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        return None
    return SimpleNamespace(
        trace=trace,
        OTLPMetricExporter=OTLPMetricExporter,
        OTLPSpanExporter=OTLPSpanExporter,
        MeterProvider=MeterProvider,
        PeriodicExportingMetricReader=PeriodicExportingMetricReader,
        ExplicitBucketHistogramAggregation=ExplicitBucketHistogramAggregation,
        View=View,
        Resource=Resource,
        TracerProvider=TracerProvider,
        BatchSpanProcessor=BatchSpanProcessor,
    )


class OnceAMinute(logging.Filter):
    """Lets one record through per `seconds` (the rest are counted, and the next line says how many were held back)."""

    def __init__(self, seconds: float = QUIET_SECONDS, clock: Any = time.monotonic) -> None:
        super().__init__()
        self.seconds, self.clock = seconds, clock
        self._next = 0.0
        self._held = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        if now < self._next:
            self._held += 1
            return False
        if self._held:
            record.msg = f"{record.msg} (and {self._held} more like it held back)"
        self._next, self._held = now + self.seconds, 0
        return True


_QUIET = OnceAMinute()


def quiet_exporters() -> None:
    """The exporters' failures at most once a minute each (idempotent)."""
    for name in EXPORTER_LOGGERS:
        logger = logging.getLogger(name)
        if _QUIET not in logger.filters:
            logger.addFilter(_QUIET)


class Telemetry:
    """A tracer and a meter of their own (the process's global providers stay as they are), exporting over OTLP/HTTP."""

    def __init__(self, sdk: Any) -> None:
        resource = sdk.Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or SERVICE_NAME})
        self.tracer_provider = sdk.TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(sdk.BatchSpanProcessor(sdk.OTLPSpanExporter()))
        self.tracer = self.tracer_provider.get_tracer("trimflow")
        self.span_kind, self.error_status = sdk.trace.SpanKind.CLIENT, sdk.trace.Status(sdk.trace.StatusCode.ERROR)
        views = [
            sdk.View(instrument_name="trimflow_request_body_bytes", aggregation=sdk.ExplicitBucketHistogramAggregation(BODY_BUCKETS)),
            sdk.View(instrument_name="trimflow_overhead_seconds", aggregation=sdk.ExplicitBucketHistogramAggregation(OVERHEAD_BUCKETS)),
        ]
        reader = sdk.PeriodicExportingMetricReader(sdk.OTLPMetricExporter())
        self.meter_provider = sdk.MeterProvider(resource=resource, metric_readers=[reader], views=views)
        meter = self.meter_provider.get_meter("trimflow")
        self.requests = meter.create_counter("trimflow_requests", description="LLM requests finished: by kind, outcome and answer status class.")
        self.sums = [(meter.create_counter(name, description=doc), value) for name, doc, value in SUMS]
        self.cache_breaks = meter.create_counter("trimflow_cache_breaks", description=CACHE_BREAKS_DOC)
        self.body = meter.create_histogram("trimflow_request_body_bytes", unit="By", description="Request body size as received (decoded).")
        self.overhead = meter.create_histogram("trimflow_overhead_seconds", unit="s", description="Time trimflow spent on a request.")

    def observe(self, record: Record, error: str | None) -> None:
        end = time.time_ns()
        operation = "count_tokens" if record.kind == COUNT_TOKENS else "chat"
        name = f"{operation} {record.model}" if record.model else operation
        span = self.tracer.start_span(name, kind=self.span_kind, attributes=span_attributes(record), start_time=_start_ns(record, end))
        if error is not None or (record.status is not None and record.status >= 400):
            span.set_attribute("error.type", str(record.status) if record.status is not None else "no_answer")
            span.set_status(self.error_status)
        span.end(end_time=end)
        family = model_family(record.model)
        labels = {"format": record.format, "family": family, "rule": record.rule or "none"}
        self.requests.add(1, {**labels, "kind": record.kind, "outcome": outcome_of(record), "status": status_class(record.status)})
        for counter, value in self.sums:
            amount = value(record)
            if amount:
                counter.add(amount, labels)
        if record.cache_break in CAUSES:
            self.cache_breaks.add(1, {**labels, "cause": record.cache_break})
        by = {"format": record.format, "family": family}
        self.body.record(record.body_bytes_before, by)
        self.overhead.record(record.overhead_ms / 1000, by)

    def shutdown(self, deadline: float = SHUTDOWN_SECONDS) -> None:
        """Flush what is queued and stop the exporters' threads, within `deadline` seconds: a collector that is down has
        the exporter retrying for its whole timeout (OTEL_EXPORTER_OTLP_TIMEOUT, 10 s by default), which mitmproxy's
        exit does not wait for. What is left then is dropped, with one line."""
        stopping = [threading.Thread(target=p.shutdown, daemon=True) for p in (self.tracer_provider, self.meter_provider)]
        for thread in stopping:
            thread.start()
        end = time.monotonic() + deadline
        for thread in stopping:
            thread.join(max(0.0, end - time.monotonic()))
        if any(thread.is_alive() for thread in stopping):
            log.warning("trimflow: the OpenTelemetry collector did not take the last spans and metrics within %g s: dropped", deadline)


class OpenTelemetry:
    name = "trimflow_otel"

    def __init__(self, metrics: Metrics) -> None:
        self.telemetry: Telemetry | None = None
        self._failed = False
        metrics.listeners.append(self.observe)

    def load(self, loader: Loader) -> None:
        loader.add_option(
            OPTION,
            bool,
            False,
            "Export one span per LLM request and the request metrics over OTLP/HTTP, to the endpoint the standard "
            f"OTEL_EXPORTER_OTLP_* variables name (default http://localhost:4318); needs the OpenTelemetry SDK: {ENABLE}.",
        )

    @exits_at_startup
    def configure(self, updated: set[str]) -> None:
        if OPTION not in updated:
            return
        on = bool(getattr(ctx.options, OPTION))
        if on == (self.telemetry is not None):
            return
        self._stop()
        if not on:
            return
        sdk = _sdk()
        if sdk is None:
            log.warning("trimflow: %s needs the OpenTelemetry SDK and its OTLP exporter, which this Python lacks: %s", OPTION, ENABLE)
            return
        quiet_exporters()
        self.telemetry = Telemetry(sdk)
        self._failed = False

    def done(self) -> None:
        self._stop()

    def observe(self, record: Record, error: str | None) -> None:
        """A record as the metrics addon writes it: a span and the metrics' increments."""
        if self.telemetry is None:
            return
        try:
            self.telemetry.observe(record, error)
        except Exception as exc:  # noqa: BLE001 - the span and counts of this record are lost, nothing else
            if not self._failed:
                self._failed = True
                log.warning("trimflow: a record was not exported to OpenTelemetry: internal error %s", type(exc).__name__)

    def _stop(self) -> None:
        telemetry, self.telemetry = self.telemetry, None
        if telemetry is not None:
            telemetry.shutdown()


__all__ = ["OPTION", "OpenTelemetry", "provider_name", "span_attributes"]
