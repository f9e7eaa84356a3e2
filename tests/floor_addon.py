"""A mitmdump script at the floor of any addon that reads LLM request bodies, for the bench's text floor
(`scripts/bench --only text`): it parses each request's body whole with orjson, as the engine parses a text body,
and logs one line per answer, as trimflow does. What trimflow costs over plain mitmdump beyond this, it costs for
its own work (the record, the conversation digest, the numbering), not for reading the body at all."""

from __future__ import annotations

import logging

import orjson
from mitmproxy import http

log = logging.getLogger("floor")


class ReadBody:
    def request(self, flow: http.HTTPFlow) -> None:
        body = orjson.loads(flow.request.content or b"{}")
        flow.metadata["floor_messages"] = len(body.get("messages") or ()) if isinstance(body, dict) else 0

    def response(self, flow: http.HTTPFlow) -> None:
        log.info("floor: %d messages, %d bytes", flow.metadata.get("floor_messages", 0), len(flow.request.raw_content or b""))


addons = [ReadBody()]
