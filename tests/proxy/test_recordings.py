"""trimflow.proxy.recordings: the flows of a mitmproxy recording, for the audit."""

from __future__ import annotations

import io

import pytest
from mitmproxy import exceptions
from mitmproxy import io as mitmproxy_io
from mitmproxy.test import tflow

from trimflow import proxy
from trimflow.proxy.recordings import read_flows

from .flows import llm_flow


def recording(*flows) -> bytes:
    out = io.BytesIO()
    writer = mitmproxy_io.FlowWriter(out)
    for flow in flows:
        writer.add(flow)
    return out.getvalue()


def test_http_flows_come_back_in_order_and_other_kinds_as_none() -> None:
    first, second = llm_flow(turns=2), llm_flow("anthropic", host="api.anthropic.com")
    first.metadata[proxy.META] = {"images_before": 2}
    read = list(read_flows(io.BytesIO(recording(first, tflow.ttcpflow(), second, tflow.tdnsflow()))))
    assert [None if f is None else f.request.pretty_host for f in read] == ["api.openai.com", None, "api.anthropic.com", None]
    assert read[0].metadata[proxy.META] == {"images_before": 2} and read[2].request.content == second.request.content


def test_a_damaged_recording_raises_where_it_stops_being_readable() -> None:
    whole = recording(llm_flow(turns=1), llm_flow(turns=2))
    flows = read_flows(io.BytesIO(whole[: len(whole) - 100]))
    assert next(flows) is not None
    with pytest.raises(exceptions.FlowReadException):
        next(flows)
