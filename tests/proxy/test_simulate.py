"""trimflow.proxy.simulate: a limit profile answers for the provider, on the body the prune addon forwards.
The options and the observe/enforce answers: tests/test_limit_profiles.py."""

from __future__ import annotations

import gzip

import orjson
import pytest
from mitmproxy.test import taddons

from trimflow import proxy

from ..helpers import TrimflowAddons, requested
from .flows import llm_flow, write_rules


@pytest.fixture
def simulated(tmp_path):
    """All the addons, playing generic-8 (8 images at most) over rules that leave 20: the profile decides."""
    instance = TrimflowAddons()
    with taddons.context(instance) as tctx:
        tctx.configure(instance, trimflow_rules=str(write_rules(tmp_path / "rules.yaml", 20)), trimflow_simulate="generic-8")
        yield instance
        instance.done()  # as mitmproxy at exit: the files the addons opened closed


async def test_a_request_needing_no_change_is_answered_once_its_deferred_record_is_worked_out(simulated) -> None:
    flow = llm_flow(turns=9)  # 9 images, nothing to prune under the rules' 20
    original = flow.request.raw_content
    await simulated.request(flow)  # no loop turn: the simulate addon works the record out itself
    record = flow.metadata[proxy.META]
    assert flow.request.raw_content is original and flow.response.status_code == 400
    assert (record["images_after"], record["simulated"], record["status"], record["turn"]) == (9, "generic-8", 400, 1)
    within = llm_flow("anthropic", turns=8, host="api.anthropic.com")
    await requested(simulated, within)
    assert within.response is None and within.metadata[proxy.META]["simulated"] is None


async def test_a_compressed_body_is_checked_as_it_decodes(simulated) -> None:
    flow = llm_flow(turns=9)
    flow.request.headers["content-encoding"] = "gzip"
    flow.request.raw_content = gzip.compress(flow.request.raw_content)
    await requested(simulated, flow)
    assert flow.response.status_code == 400
    assert "Max images exceeded" in orjson.loads(flow.response.content)["error"]["message"]


async def test_off_the_request_hook_makes_no_coroutine(tmp_path) -> None:
    flows = proxy.SharedState()
    simulate = proxy.Simulate(flows)
    with taddons.context(simulate) as tctx:
        tctx.configure(simulate)
        assert simulate.profile is None and simulate.request(llm_flow()) is None
