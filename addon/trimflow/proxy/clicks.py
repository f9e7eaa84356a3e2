"""The clicks addon: the coordinates in a computer-use answer, mapped back to the screenshot the agent took.

When the prune addon sent a computer-use request's newest screenshot at other dimensions than it came, the
flow's state holds how the model's coordinates map back (FlowState.screen, trimflow._clicks). This addon applies
it to the provider's successful answer on its way to the agent: a streamed one (server-sent events) through a
ClickStream set as the response's stream callable in `responseheaders` (before the metrics addon, which reads the
usage first and hands it the events), a JSON one in `response` (before the metrics addon, which then records
`clicks_mapped`). An answer it cannot read passes as it came, with one log line. Nothing from the answer outlives
the flow. `trimflow_clicks=false` turns the mapping off (for an agent that maps coordinates itself).
"""

from __future__ import annotations

import logging
import weakref

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

from .._clicks import ClickStream, Malformed, map_answer
from .._decode import DecodeError, decode_body, is_identity
from .state import SharedState, path_of

log = logging.getLogger("trimflow")

OPTION = "trimflow_clicks"
_EVENT_STREAM = "text/event-stream"


class Clicks:
    name = "trimflow_clicks"

    def __init__(self, flows: SharedState) -> None:
        self.flows = flows
        self._streams: weakref.WeakKeyDictionary[http.HTTPFlow, ClickStream] = weakref.WeakKeyDictionary()

    def load(self, loader: Loader) -> None:
        loader.add_option(
            OPTION,
            bool,
            True,
            "When trimflow sent a computer-use request's newest screenshot at other dimensions, map the coordinates of the "
            "answer's computer-tool calls back to the screenshot the agent took. false: answers pass as they came.",
        )

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        state = self.flows.get(flow)
        if state is None or state.screen is None or response is None or not 200 <= response.status_code < 300 or not ctx.options.trimflow_clicks:
            return
        if not response.headers.get("content-type", "").startswith(_EVENT_STREAM):
            return  # buffered by mitmproxy: mapped whole in `response`
        if not is_identity(response.headers.get("content-encoding")):
            self._untouched(flow, "a compressed event stream")
            return
        stream = ClickStream(state.screen, lambda why: self._untouched(flow, why))
        self._streams[flow] = stream
        response.stream = stream

    def response(self, flow: http.HTTPFlow) -> None:
        state = self.flows.get(flow)
        response = flow.response
        if state is None or state.screen is None or response is None:
            return
        stream = self._streams.pop(flow, None)
        if stream is not None:
            mapped = stream.mapped
        elif 200 <= response.status_code < 300 and not response.stream and response.raw_content and ctx.options.trimflow_clicks:
            mapped = self._map_json(flow, response)
        else:
            return
        record = self.flows.settle(flow, state)
        if record is not None:
            record.clicks_mapped = mapped

    def error(self, flow: http.HTTPFlow) -> None:
        self._streams.pop(flow, None)

    def _map_json(self, flow: http.HTTPFlow, response: http.Response) -> int:
        state = self.flows.get(flow)
        assert state is not None and state.screen is not None and response.raw_content is not None
        try:
            body = decode_body(response.raw_content, response.headers.get("content-encoding"), self.flows.max_decoded_bytes)
            mapped, calls = map_answer(state.screen, body)
        except (DecodeError, Malformed) as exc:
            self._untouched(flow, str(exc))
            return 0
        except Exception as exc:  # noqa: BLE001 - fail open: the agent gets the answer as it came
            self._untouched(flow, f"internal error {type(exc).__name__}")
            return 0
        if calls:
            response.content = mapped  # encoded as the answer was (content-encoding), with its content-length
        return calls

    @staticmethod
    def _untouched(flow: http.HTTPFlow, why: str) -> None:
        log.warning("trimflow: %s%s computer-use answer passed unmapped: %s", flow.request.pretty_host, path_of(flow), why)


__all__ = ["Clicks"]
