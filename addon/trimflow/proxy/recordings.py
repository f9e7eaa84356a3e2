"""Flows read from a mitmproxy recording (`mitmdump -w`: .mitm, mitmproxy 11 and 12) or a HAR file.

The audit imports this only when it reads such a file, so the rest of trimflow runs without mitmproxy.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from mitmproxy import http, io


def read_flows(file: BinaryIO) -> Iterator[http.HTTPFlow | None]:
    """Each flow of the file, in order, one at a time: an HTTPFlow, or None for a flow of another kind
    (TCP, UDP, DNS). Raises what mitmproxy raises where the file stops being readable."""
    for flow in io.FlowReader(file).stream():
        yield flow if isinstance(flow, http.HTTPFlow) else None
