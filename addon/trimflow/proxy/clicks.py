"""The clicks addon: the coordinates in a computer-use answer, mapped back to the screenshot the agent took.

When the prune addon sent a computer-use request's newest screenshot at other dimensions than it came, the
flow's state holds how the model's coordinates map back (FlowState.screen, trimflow._clicks). This addon applies
it to the provider's successful answer on its way to the agent: a streamed one (server-sent events) through a
ClickStream set as the response's stream callable in `responseheaders` (before the metrics addon, which reads the
usage first and hands it the events), a JSON one in `response` (before the metrics addon, which then records
`clicks_mapped`), in a worker thread when it is large or compressed. What the mapping holds is bounded per answer
and by one budget across all answers (`held`, trimflow._click_stream.HeldBytes). An answer it cannot read, or past
those bounds, passes as it came, with one log line and the reason in the record's `clicks_unmapped`. Nothing from
the answer outlives the flow. `trimflow_clicks=false` turns the mapping off (for an agent that maps coordinates
itself).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Coroutine

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

from .._click_stream import OVER_BUDGET, ClickStream, HeldBytes
from .._clicks import Malformed, map_answer
from .._decode import DecodeError, decode_body, is_identity
from .state import SharedState, path_of

log = logging.getLogger("trimflow")

OPTION = "trimflow_clicks"
_EVENT_STREAM = "text/event-stream"
# A JSON answer up to this size, not compressed, is mapped on the event loop (a thread costs more than the mapping);
# a larger one in a worker thread, as the mapping's Python work grows with it.
INLINE_JSON = 64 * 2**10


class Clicks:
    name = "trimflow_clicks"

    def __init__(self, flows: SharedState) -> None:
        self.flows = flows
        self.held = HeldBytes()  # what every answer's mapping holds, together
        self._streams: weakref.WeakKeyDictionary[http.HTTPFlow, ClickStream] = weakref.WeakKeyDictionary()
        self._passed: weakref.WeakKeyDictionary[http.HTTPFlow, str] = weakref.WeakKeyDictionary()  # why, for the record

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
            self._passed[flow] = why = "a compressed event stream"
            self._untouched(flow, why)
            return
        stream = ClickStream(state.screen, lambda why: self._untouched(flow, why), self.held)
        self._streams[flow] = stream
        response.stream = stream

    def response(self, flow: http.HTTPFlow) -> Coroutine[None, None, None] | None:
        # Not `async def`: an answer mapped on the loop, the usual case, makes no coroutine. mitmproxy awaits what a
        # hook returns when it is awaitable.
        state = self.flows.get(flow)
        response = flow.response
        if state is None or state.screen is None or response is None:
            return None
        stream = self._streams.pop(flow, None)
        if stream is not None:
            stream.close()
            self._settle(flow, stream.mapped, stream.problem)
            return None
        passed = self._passed.pop(flow, None)
        if passed is not None:
            self._settle(flow, 0, passed)
            return None
        if not (200 <= response.status_code < 300 and not response.stream and response.raw_content and ctx.options.trimflow_clicks):
            return None
        if len(response.raw_content) <= INLINE_JSON and is_identity(response.headers.get("content-encoding")):
            self._settle(flow, *self._map_json(flow, response))
            return None
        return self._map_json_in_worker(flow, response)

    async def _map_json_in_worker(self, flow: http.HTTPFlow, response: http.Response) -> None:
        self._settle(flow, *await asyncio.to_thread(self._map_json, flow, response))

    def error(self, flow: http.HTTPFlow) -> None:
        self._passed.pop(flow, None)
        stream = self._streams.pop(flow, None)
        if stream is not None:
            stream.close()

    def _map_json(self, flow: http.HTTPFlow, response: http.Response) -> tuple[int, str | None]:
        """The calls mapped and why the answer went unmapped (None when it did not); on the loop or in a worker.
        The decoded answer holds its size of the budget while it is mapped."""
        state = self.flows.get(flow)
        assert state is not None and state.screen is not None and response.raw_content is not None
        lease = self.held.lease()
        try:
            body = decode_body(response.raw_content, response.headers.get("content-encoding"), self.flows.max_decoded_bytes)
            if not lease.resize(len(body)):
                raise Malformed(OVER_BUDGET)
            mapped, calls = map_answer(state.screen, body)
            if calls:
                response.content = mapped  # encoded as the answer was (content-encoding), with its content-length
        except (DecodeError, Malformed) as exc:
            self._untouched(flow, str(exc))
            return 0, str(exc)
        except Exception as exc:  # noqa: BLE001 - fail open: the agent gets the answer as it came
            why = f"internal error {type(exc).__name__}"
            self._untouched(flow, why)
            return 0, why
        finally:
            lease.close()
        return calls, None

    def _settle(self, flow: http.HTTPFlow, mapped: int, why: str | None) -> None:
        state = self.flows.get(flow)
        record = self.flows.settle(flow, state) if state is not None else None
        if record is not None:
            record.clicks_mapped = mapped
            record.clicks_unmapped = why

    @staticmethod
    def _untouched(flow: http.HTTPFlow, why: str) -> None:
        log.warning("trimflow: %s%s computer-use answer passed unmapped: %s", flow.request.pretty_host, path_of(flow), why)


__all__ = ["Clicks"]
