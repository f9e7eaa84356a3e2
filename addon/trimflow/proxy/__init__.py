"""trimflow's mitmproxy addons, one per job: the only part of trimflow that imports mitmproxy.

`make_addons()` builds the list mitmproxy loads; only the scripts mitmdump loads (`addon/mitm.py`,
`trimflow/proxy/mitmdump_script.py`) call it, so importing trimflow builds nothing and leaves mitmproxy as it is
(as mitmproxy's own `default_addons()`). mitmproxy runs each hook through them in list order, and they share one
`SharedState` (the rules and each LLM flow's state):

- GeminiKeyHeader: a Gemini `?key=` moves to the x-goog-api-key header (requestheaders).
- Recover: keeps each LLM request's body as the client sent it (before Prune), and answers a limit error with a
  retry within the limit it names, learning that limit (response, before Metrics); its HoldErrorAnswers, after Metrics,
  keeps such an error answer buffered (extending mitmproxy's size check from `running` to `done`).
- Prune: applies the rules (and the learned limits) to requests and to Codex's WebSocket `response.create` messages.
- WebSocket: refuses Codex's WebSocket upgrade on Responses endpoints when asked (trimflow_websocket), else warns
  once per host when a WebSocket leaves images at the provider (after Prune: it reads Prune's record).
- Simulate: answers with a limit profile's error instead of forwarding (after Prune: it checks what Prune forwards).
- SendOnce: uploads each image once to the provider's Files API and sends a reference to it from then on
  (trimflow_send_once; after Simulate, on the body Prune forwards); answers a refused reference by sending the
  request again inline (response, before Metrics); its HoldRefusals, after Metrics, holds such an answer back.
- Clicks: maps the coordinates of a computer-use answer back to the screenshot the agent took, when Prune sent it
  rescaled (before Metrics: its stream gets the events after Metrics read the usage, and its count is recorded).
- Metrics: completes each record with the answer's status and usage; the log line and the JSONL record.
- Prometheus: counts each record the metrics addon writes, served at /metrics (trimflow_prometheus).
- OpenTelemetry: a span per record the metrics addon writes, and the same counts as OTel metrics, over OTLP
  (trimflow_otel).
- ShareConversations: shares each conversation's last turn with the other instances naming the same file.
- Recall: keeps the images Prune cut, for the run's recall_image tool (trimflow_recall; on with a run's token).
- KeepMemory: keeps freed body memory in the process (glibc).
- UpstreamAuthPipe: mitmproxy's upstream_auth read once, at start, from a pipe the launcher hands over
  (trimflow_upstream_auth_fd), so that an upstream proxy's password is in no file.
- Options: last, so every trimflow option is declared: a misspelt trimflow_* name or a value mitmproxy
  cannot parse stops mitmproxy at start with one line (each addon's `configure` checks its own values).
"""

from .clicks import Clicks
from .conversations import ShareConversations
from .keys import GeminiKeyHeader
from .memory import KeepMemory
from .metrics import FLUSH_DELAY, Metrics
from .options import Options
from .otel import OpenTelemetry
from .prometheus import Prometheus
from .prune import Prune
from .recall import Recall
from .recover import Recover
from .send_once import HoldRefusals, SendOnce
from .simulate import Simulate
from .state import META, FlowState, SharedState
from .upstream_auth import UpstreamAuthPipe
from .websocket import WebSocket


def make_addons() -> list[object]:
    """A fresh set of trimflow's addons, in the order mitmproxy must run them, sharing one SharedState."""
    flows = SharedState()
    simulate = Simulate(flows)
    recover = Recover(flows, simulate)
    metrics = Metrics(flows)
    send_once = SendOnce(flows)
    return [
        GeminiKeyHeader(flows),
        recover,
        Prune(flows),
        WebSocket(flows),
        simulate,
        send_once,
        Clicks(flows),
        metrics,
        recover.hold,
        send_once.hold,
        Prometheus(metrics, recover),
        OpenTelemetry(metrics),
        ShareConversations(flows, recover),
        Recall(flows),
        KeepMemory(),
        UpstreamAuthPipe(),
        Options(),
    ]


__all__ = [
    "FLUSH_DELAY",
    "META",
    "Clicks",
    "FlowState",
    "GeminiKeyHeader",
    "HoldRefusals",
    "KeepMemory",
    "Metrics",
    "OpenTelemetry",
    "Options",
    "Prometheus",
    "Prune",
    "Recall",
    "Recover",
    "SendOnce",
    "ShareConversations",
    "SharedState",
    "Simulate",
    "UpstreamAuthPipe",
    "WebSocket",
    "make_addons",
]
