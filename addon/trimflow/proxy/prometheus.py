"""The prometheus addon: `trimflow_prometheus` (HOST:PORT) serves counters and histograms of the LLM requests at
/metrics, for Prometheus to scrape (docs/deployment.md).

The figures are the JSONL's: the metrics addon hands each record to this addon as it writes it (its `listeners`),
so a counter is the sum of one record field over the records written. Labels stay few and bounded: the wire
format, the model's family (claude, gpt, gemini or other: never the free-form name), the rule that applied (the
rules file names them), and for the request count the kind, the outcome and the status class; never a host, a
conversation or anything a request carries.

prometheus_client is imported here only, when the option is set: without it, trimflow runs as ever and says in
one line how to add it. The endpoint is proxy/_metrics_server.py, on mitmproxy's own event loop: an answer from
/metrics also says that the proxy's loop runs, and anyone who can reach the port is held to little there.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mitmproxy import ctx, exceptions
from mitmproxy.addonmanager import Loader

from .._cache_break import CAUSES
from .._record import ENFORCE, Record
from ._metrics_server import MetricsServer, listen
from .metrics import Metrics
from .options import exits_at_startup
from .recover import Recover
from .state import SharedState

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("trimflow")

OPTION = "trimflow_prometheus"
ENABLE = "pip install 'trimflow[prometheus]' (a pipx mitmproxy: pipx inject mitmproxy prometheus-client)"
FAMILIES = ("claude", "gpt", "gemini", "other")
# Upper bounds: request bodies around the limits providers and gateways set (2 MiB axum, 16 MiB the shipped
# budget, 32 MiB Anthropic), and trimflow's time per request from a fraction of a millisecond to a slow re-encode.
BODY_BUCKETS = (64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20, 64 << 20)
OVERHEAD_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
# What a render depends on: records counted, learned limits held and learned, the conversations file in use and its
# writes dropped.
RenderState = tuple[int, int, int, bool, int]


def model_family(model: str | None) -> str:
    """claude, gpt (OpenAI's gpt-*, chatgpt-*, o1/o3/o4..., codex-*), gemini, or other: a bounded label for any model name."""
    if not model:
        return "other"
    name = model.lower().rsplit("/", 1)[-1]  # publishers/google/models/gemini-..., openai/gpt-4o
    if "claude" in name:
        return "claude"
    if "gemini" in name:
        return "gemini"
    if "gpt" in name or name.startswith(("codex", "o1", "o3", "o4")):
        return "gpt"
    return "other"


def outcome_of(record: Record) -> str:
    """What happened to the request, the first that applies: simulated (a limit profile answered), retried (refused
    for a limit and sent again), failed_open (forwarded as it came for the reason the log line gives), observed
    (observe mode: measured, forwarded as it came), pruned (images dropped, shrunk, thinned or sent at the model's size), untouched."""
    if record.simulated:
        return "simulated"
    if record.retries:
        return "retried"
    if record.reason is not None:
        return "failed_open"
    if record.mode != ENFORCE:
        return "observed"
    if record.pruned or record.shrunk or record.thinned or record.native_sized:
        return "pruned"
    return "untouched"


def status_class(status: int | None) -> str:
    """2xx, 4xx, ...; none when the flow ended without an answer."""
    return f"{status // 100}xx" if status is not None and 100 <= status < 600 else "none"


def parse_address(value: str) -> tuple[str, int]:
    """HOST:PORT ([::1]:PORT for IPv6) as (host, port); ValueError says what is wrong."""
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{OPTION} must be HOST:PORT (127.0.0.1:9101, [::1]:9101, 0.0.0.0:9101 for every interface), not {value!r}")
    return host, int(port)


# The counters that sum a record field (each labelled format, family, rule): name (Prometheus adds _total), help, value.
# What was forwarded is the record's to say (Record.sent_*): in observe mode, the body as received.
SUMS: tuple[tuple[str, str, Callable[[Record], int | None]], ...] = (
    ("trimflow_images_received", "Images in the LLM requests as received.", lambda r: r.images_before),
    ("trimflow_images_pruned", "Images replaced by a placeholder in what was forwarded.", lambda r: r.sent_pruned),
    ("trimflow_body_bytes_received", "Request body bytes as received (decoded).", lambda r: r.body_bytes_before),
    ("trimflow_body_bytes_forwarded", "Request body bytes as forwarded upstream (decoded).", lambda r: r.sent_body_bytes),
    ("trimflow_estimated_tokens_received", "trimflow's input token estimate of the requests as received.", lambda r: r.est_tokens_before),
    ("trimflow_estimated_tokens_forwarded", "trimflow's input token estimate of what was forwarded.", lambda r: r.sent_est_tokens),
    ("trimflow_input_tokens", "Input tokens the provider reported, cache reads and writes included.", lambda r: r.usage_input_tokens),
    ("trimflow_cache_read_tokens", "Input tokens the provider reported reading from its prompt cache.", lambda r: r.usage_cache_read_tokens),
    ("trimflow_cache_write_tokens", "Input tokens the provider reported writing to its prompt cache.", lambda r: r.usage_cache_write_tokens),
    ("trimflow_output_tokens", "Output tokens the provider reported.", lambda r: r.usage_output_tokens),
    ("trimflow_limit_refusals", "Requests the provider refused for a limit (docs/recovery.md).", lambda r: int(r.refused_status is not None)),
    ("trimflow_retries", "Times requests were sent again within a limit the provider named.", lambda r: r.retries),
)


CACHE_BREAKS_DOC = "Turns whose provider-reported cache read fell below the previous turn's (or first turns), by cause (docs/metrics.md)."


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        return None
    return prometheus_client


class Instruments:
    """The counters and histograms of one registry, and how a record adds to them."""

    def __init__(self, client: Any, recover: Recover, flows: SharedState) -> None:
        self.registry: CollectorRegistry = client.CollectorRegistry()
        self._choose_encoder: Callable[[str], tuple[Callable[[CollectorRegistry], bytes], str]] = client.exposition.choose_encoder
        registry, labels = self.registry, ("format", "family", "rule")
        requests_by, requests_doc = (*labels, "kind", "outcome", "status"), "LLM requests finished: by kind, outcome and answer status class."
        self.requests = client.Counter("trimflow_requests", requests_doc, requests_by, registry=registry)
        self._sums = [(client.Counter(name, doc, labels, registry=registry), value) for name, doc, value in SUMS]
        by = ("format", "family")
        body_doc, overhead_doc = "Request body size as received (decoded).", "Time trimflow spent on a request."
        self.cache_breaks = client.Counter("trimflow_cache_breaks", CACHE_BREAKS_DOC, (*labels, "cause"), registry=registry)
        self.body = client.Histogram("trimflow_request_body_bytes", body_doc, by, buckets=BODY_BUCKETS, registry=registry)
        self.overhead = client.Histogram("trimflow_overhead_seconds", overhead_doc, by, buckets=OVERHEAD_BUCKETS, registry=registry)
        self.registry.register(_Learned(client, recover))
        self.registry.register(_SharedConversations(client, flows))
        self.recover, self.flows = recover, flows
        self.observed = 0  # records counted: with the learned limits, what a render depends on
        self._children: dict[tuple[str, str, str], tuple[list[Any], Any, Any]] = {}

    def observe(self, record: Record) -> None:
        self.observed += 1
        family = model_family(record.model)
        key = (record.format, family, record.rule or "none")
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                [counter.labels(*key) for counter, _ in self._sums],
                self.body.labels(record.format, family),
                self.overhead.labels(record.format, family),
            )
        sums, body, overhead = children
        self.requests.labels(*key, record.kind, outcome_of(record), status_class(record.status)).inc()
        for child, (_, value) in zip(sums, self._sums, strict=True):
            amount = value(record)
            if amount:
                child.inc(amount)
        if record.cache_break in CAUSES:
            self.cache_breaks.labels(*key, record.cache_break).inc()
        body.observe(record.body_bytes_before)
        overhead.observe(record.overhead_ms / 1000)

    def render(self, accept: str) -> tuple[bytes, str]:
        """The exposition in the format the scraper asks for (Accept), and its content type."""
        encoder, content_type = self._choose_encoder(accept)
        return encoder(self.registry), content_type

    def content_type(self, accept: str) -> str:
        """The content type `render` answers `accept` with."""
        return self._choose_encoder(accept)[1]

    def state(self) -> RenderState:
        """What a render shows changes only with this: the records counted, the learned limits and the conversations
        file's state."""
        return self.observed, len(self.recover.learned.live()), self.recover.limits_learned, *_conversations_file(self.flows)


class _Learned:
    """The learned limits, read when scraped: how many hold now (the file, which instances may share), and how many
    this process learned."""

    def __init__(self, client: Any, recover: Recover) -> None:
        self.client, self.recover = client, recover

    def collect(self) -> list[Any]:
        held = self.client.metrics_core.GaugeMetricFamily(
            "trimflow_learned_limits", "Learned limits that apply now (the learned-limits file, shared by the instances that use it)."
        )
        held.add_metric([], len(self.recover.learned.live()))
        learned = self.client.metrics_core.CounterMetricFamily("trimflow_limits_learned", "Limits this process learned from providers' answers.")
        learned.add_metric([], self.recover.limits_learned)
        return [held, learned]


def _conversations_file(flows: SharedState) -> tuple[bool, int]:
    """Whether this instance shares its turns through the conversations file, and how many writes a busy file dropped."""
    shared = flows.conversations.shared
    return (shared.in_use, shared.writes_dropped) if shared is not None else (False, 0)


class _SharedConversations:
    """The conversations file (trimflow._last_turns), read when scraped: whether this instance shares each
    conversation's last turn through it, and how many of its turns a busy file kept from being shared."""

    def __init__(self, client: Any, flows: SharedState) -> None:
        self.client, self.flows = client, flows

    def collect(self) -> list[Any]:
        sharing, dropped_writes = _conversations_file(self.flows)
        in_use = self.client.metrics_core.GaugeMetricFamily(
            "trimflow_conversations_file",
            "1 when this instance shares each conversation's last turn through the conversations file or the shared "
            "store (trimflow_state), 0 when it keeps its own only (neither set, or it cannot be used now: see the log).",
        )
        in_use.add_metric([], 1 if sharing else 0)
        dropped = self.client.metrics_core.CounterMetricFamily(
            "trimflow_conversations_writes_dropped",
            "Turns never written to the conversations file or the shared store: too many waited for it, or the store did not answer.",
        )
        dropped.add_metric([], dropped_writes)
        return [in_use, dropped]


class Prometheus:
    name = "trimflow_prometheus"

    def __init__(self, metrics: Metrics, recover: Recover) -> None:
        self.recover, self.flows = recover, metrics.flows
        self.instruments: Instruments | None = None
        self.server: MetricsServer | None = None  # the endpoint, once bound
        self._failed = False
        self._value = ""  # the option's value in effect
        metrics.listeners.append(self.observe)

    @property
    def address(self) -> tuple[str, int] | None:
        """Where /metrics is served, once bound."""
        return self.server.address if self.server is not None else None

    def load(self, loader: Loader) -> None:
        loader.add_option(
            OPTION,
            str,
            "",
            f"HOST:PORT to serve Prometheus metrics on, at /metrics (counters and histograms of the LLM requests); "
            f"needs prometheus_client: {ENABLE}. Empty: off.",
        )

    @exits_at_startup
    def configure(self, updated: set[str]) -> None:
        if OPTION not in updated:
            return
        value = getattr(ctx.options, OPTION).strip()
        if value == self._value:
            return  # a refused change rolled back: what runs stays
        address = None
        if value:
            try:
                address = parse_address(value)
            except ValueError as exc:
                raise exceptions.OptionsError(f"trimflow: {exc}") from None
        client = _client() if address is not None else None
        if address is not None and client is None:
            log.warning("trimflow: %s needs prometheus_client, which this Python lacks: %s", OPTION, ENABLE)
        sock = _bind(*address) if address is not None and client is not None else None  # before the old one stops: a refusal leaves it
        self._stop()
        self.instruments, self._value = None, value
        if sock is None:
            return
        self.instruments = Instruments(client, self.recover, self.flows)
        self.server = MetricsServer(sock, self.instruments)
        if every_interface(self.server.address[0]):
            log.warning(
                "trimflow: %s=%s serves /metrics on every interface: anyone who can reach this machine can read it "
                "(127.0.0.1:PORT keeps it on this machine)",
                OPTION,
                value,
            )
        self._failed = False
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop yet: `running` starts serving
            return
        self.server.start()

    def running(self) -> None:
        if self.server is not None and not self.server.serving:
            self.server.start()

    def done(self) -> None:
        self._stop()

    def observe(self, record: Record, error: str | None) -> None:
        """A record as the metrics addon writes it (`error`, when the flow failed, is in its status: none)."""
        if self.instruments is None:
            return
        try:
            self.instruments.observe(record)
        except Exception as exc:  # noqa: BLE001 - the counters are lost for this record, nothing else
            if not self._failed:
                self._failed = True
                log.warning("trimflow: a record was not counted for Prometheus: internal error %s", type(exc).__name__)

    def _stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server = None


def every_interface(host: str) -> bool:
    """Whether a bound address is the unspecified one (0.0.0.0, ::): every interface of the machine."""
    try:
        return ipaddress.ip_address(host.partition("%")[0]).is_unspecified
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    """The endpoint's listening socket, bound now, so that a taken port or a wrong address stops mitmproxy at start."""
    try:
        return listen(host, port)
    except OSError as exc:
        raise exceptions.OptionsError(f"trimflow: {OPTION}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None


__all__ = [
    "OPTION",
    "Instruments",
    "Prometheus",
    "every_interface",
    "model_family",
    "outcome_of",
    "parse_address",
    "status_class",
]
