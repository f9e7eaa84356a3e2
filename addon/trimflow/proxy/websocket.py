"""The websocket addon: Codex's Responses WebSocket, and the images it leaves at the provider.

Over a WebSocket, Codex sends each turn as a `response.create` message naming `previous_response_id`
with only the new items: the earlier turns, their images with them, stay at the provider, where no
proxy can prune them (the prune addon records such a message with server_side_history). Over HTTP the
same client sends the whole history every turn, and the rules cap it. `trimflow_websocket`:

- `pass` (the default): the upgrade goes through. The first time a WebSocket to a host continues a
  conversation held at the provider after images went over it, one warning names the option.
- `refuse`: the upgrade to a Responses endpoint (the rules' endpoints of that format) is answered
  426 Upgrade Required. Codex 0.169 takes a 426 as "no WebSocket here" and uses HTTP for the rest of
  the session at once; a 403 or a closed connection it retries 6 times over about 6 seconds first.
"""

from __future__ import annotations

import logging
import weakref

import orjson
from mitmproxy import ctx, exceptions, http
from mitmproxy.addonmanager import Loader

from ..formats import openai_responses
from .options import exits_at_startup
from .state import SharedState, path_of

log = logging.getLogger("trimflow")

OPTION = "trimflow_websocket"
PASS, REFUSE = "pass", "refuse"
CHOICES = (PASS, REFUSE)
STATUS = 426  # Upgrade Required: the one answer Codex falls back on without retrying
BODY = orjson.dumps(
    {
        "error": {
            "type": "websocket_refused",
            "message": f"trimflow: no WebSocket for Responses requests here ({OPTION}={REFUSE}); send them over HTTP",
        }
    }
)


def is_websocket_upgrade(request: http.Request) -> bool:
    return request.method == "GET" and "websocket" in request.headers.get("upgrade", "").lower()


class WebSocket:
    name = "trimflow_websocket"

    def __init__(self, flows: SharedState) -> None:
        self.flows = flows
        self.refuse = False
        self._refused_hosts: set[str] = set()
        self._warned_hosts: set[str] = set()
        # Per WebSocket flow: images its client messages carried so far.
        self._images: weakref.WeakKeyDictionary[http.HTTPFlow, int] = weakref.WeakKeyDictionary()

    def load(self, loader: Loader) -> None:
        loader.add_option(
            OPTION,
            str,
            PASS,
            "pass: let WebSocket upgrades through (Codex then keeps earlier turns, images included, at the provider); "
            "refuse: answer the upgrade on Responses endpoints with 426, so Codex sends every turn over HTTP with its whole history.",
            choices=CHOICES,
        )

    @exits_at_startup
    def configure(self, updated: set[str]) -> None:
        if OPTION in updated:
            value = getattr(ctx.options, OPTION)
            if value not in CHOICES:
                raise exceptions.OptionsError(f"trimflow: {OPTION} must be one of {', '.join(CHOICES)}, not {value!r}")
            self.refuse = value == REFUSE

    def request(self, flow: http.HTTPFlow) -> None:
        if not self.refuse or flow.response is not None or not is_websocket_upgrade(flow.request):
            return
        assert self.flows.rules is not None
        host = flow.request.pretty_host
        if self.flows.rules.current().format_for(host, flow.request.path) != openai_responses.NAME:
            return
        flow.response = http.Response.make(STATUS, BODY, {"content-type": "application/json"})
        if host not in self._refused_hosts:
            self._refused_hosts.add(host)
            log.info("trimflow: refused a WebSocket to %s%s (%s=%s): the client sends its turns over HTTP", host, path_of(flow), OPTION, REFUSE)

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        # After the prune addon, which leaves the record of the client message it just read in the flow's state.
        state = self.flows.get(flow)
        if state is None or state.record is None or not flow.websocket or not flow.websocket.messages[-1].from_client:
            return
        record = state.record
        earlier = self._images.get(flow, 0)
        self._images[flow] = earlier + record.images_before
        host = flow.request.pretty_host
        if record.server_side_history and earlier and host not in self._warned_hosts:
            self._warned_hosts.add(host)
            log.warning(
                "trimflow: a WebSocket to %s keeps its conversation at the provider (previous_response_id): the %d image(s) "
                "sent on it earlier stay there, out of any proxy's reach; --set %s=%s makes Codex send every turn over HTTP, "
                "whole history included, where the rules cap it",
                host,
                earlier,
                OPTION,
                REFUSE,
            )
