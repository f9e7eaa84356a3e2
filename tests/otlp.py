"""An OTLP/HTTP receiver for the tests: a small HTTP server on loopback that decodes what an exporter posts with the
official protobuf definitions (the opentelemetry-proto package) and keeps the spans and metrics it got."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest, ExportMetricsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

MAX_BODY = 64 << 20


def value_of(value: AnyValue) -> Any:
    """An attribute's value as Python: str, bool, int, float, bytes, or a list or dict of them."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value_of(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


class Receiver:
    """What came: `traces` and `metrics` (the decoded export requests), and every request's path."""

    def __init__(self) -> None:
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(min(length, MAX_BODY))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                answer: Any
                with receiver.lock:
                    receiver.paths.append(self.path)
                    if self.path == "/v1/traces":
                        receiver.traces.append(ExportTraceServiceRequest.FromString(body))
                        answer = ExportTraceServiceResponse()
                    elif self.path == "/v1/metrics":
                        receiver.metrics.append(ExportMetricsServiceRequest.FromString(body))
                        answer = ExportMetricsServiceResponse()
                    else:
                        answer = None
                if answer is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = answer.SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def spans(self) -> list[Any]:
        with self.lock:
            return [span for request in self.traces for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]

    def resource_attributes(self) -> list[dict[str, Any]]:
        with self.lock:
            found = [rs.resource.attributes for request in self.traces for rs in request.resource_spans]
            found += [rm.resource.attributes for request in self.metrics for rm in request.resource_metrics]
        return [{kv.key: value_of(kv.value) for kv in attributes} for attributes in found]

    def metric_points(self, name: str) -> list[Any]:
        """The data points of the metric `name` in the latest export that has it (cumulative sums: the latest is all)."""
        with self.lock:
            requests = list(self.metrics)
        for request in reversed(requests):
            points = [
                point
                for rm in request.resource_metrics
                for sm in rm.scope_metrics
                for metric in sm.metrics
                if metric.name == name
                for point in (metric.sum.data_points or metric.histogram.data_points)
            ]
            if points:
                return points
        return []

    def wait_for(self, condition: Any, timeout: float = 30.0) -> None:
        """Until `condition()` holds (AssertionError after `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"the OTLP receiver did not get what was expected in {timeout}s (got {self.paths})")
            time.sleep(0.05)


def attributes(span: Any) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in span.attributes}


@contextmanager
def receiver() -> Iterator[Receiver]:
    started = Receiver()
    thread = threading.Thread(target=started.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield started
    finally:
        started.server.shutdown()
        started.server.server_close()
        thread.join()
