"""The keys addon: a Gemini API key sent as `?key=` moves to the `x-goog-api-key` header.

In the query string the key would show in mitmproxy's own flow log and in recordings. The API takes
the same key as the header, which is how Google's own SDK always sends it, so gateways accept it too.
"""

from __future__ import annotations

from mitmproxy import http

from ..formats import gemini
from .state import SharedState


class GeminiKeyHeader:
    name = "trimflow_keys"

    def __init__(self, flows: SharedState) -> None:
        self.flows = flows

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if "key=" not in flow.request.path:
            return
        state = self.flows.state(flow)
        if state is not None and state.target.format == gemini.NAME:
            move_query_key_to_header(flow.request)


def move_query_key_to_header(request: http.Request) -> None:
    """A query key beside a different header key is left alone: which one the provider uses is unknown."""
    key = request.query.get("key")
    if not key:
        return
    header = request.headers.get("x-goog-api-key")
    if header is None:
        request.headers["x-goog-api-key"] = key
    if header is None or header == key:
        del request.query["key"]
