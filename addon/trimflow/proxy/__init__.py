"""trimflow's mitmproxy addons, one per job: the only part of trimflow that imports mitmproxy.

`addons` is the list mitmproxy loads (through `addon/mitm.py` or `trimflow/proxy/mitmdump_script.py`).
mitmproxy runs each hook through them in list order, and they share one `Flows` (the rules and each
LLM flow's state):

- Keys: a Gemini `?key=` moves to the x-goog-api-key header (requestheaders).
- Prune: applies the rules to requests and to Codex's WebSocket `response.create` messages.
- Simulate: answers with a limit profile's error instead of forwarding (after Prune: it checks what Prune forwards).
- Metrics: completes each record with the answer's status and usage; the log line and the JSONL record.
- Memory: keeps freed body memory in the process (glibc).
- Options: last, so every trimflow option is declared: a misspelt trimflow_* name or a value mitmproxy
  cannot parse stops mitmproxy at start with one line (each addon's `configure` checks its own values).
"""

from .keys import Keys
from .memory import Memory
from .metrics import FLUSH_DELAY, Metrics
from .options import Options
from .prune import Prune
from .simulate import Simulate
from .state import META, Flows, FlowState


def make_addons() -> list[object]:
    """A fresh set of trimflow's addons, in the order mitmproxy must run them, sharing one Flows."""
    flows = Flows()
    return [Keys(flows), Prune(flows), Simulate(flows), Metrics(flows), Memory(), Options()]


addons = make_addons()

__all__ = [
    "FLUSH_DELAY",
    "META",
    "FlowState",
    "Flows",
    "Keys",
    "Memory",
    "Metrics",
    "Options",
    "Prune",
    "Simulate",
    "addons",
    "make_addons",
]
