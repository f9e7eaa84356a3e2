"""trimflow.proxy.state: the Target resolved once per flow, turn numbers, state beside the flow and gone with it."""

from __future__ import annotations

import gc
import json

from mitmproxy.test import taddons

from trimflow import proxy
from trimflow._rules import Rules
from trimflow.testing import PATHS

from ..helpers import TrimflowAddons, answer_sent, requested
from .flows import json_answer, llm_flow, write_rules


async def test_the_target_is_resolved_once_per_flow_for_all_the_addons(addon, monkeypatch) -> None:
    resolved: list[str] = []
    target = Rules.target

    def counting(self, host, path, **kwargs):
        resolved.append(host)
        return target(self, host, path, **kwargs)

    monkeypatch.setattr(Rules, "target", counting)
    flow = llm_flow("gemini", host="generativelanguage.googleapis.com", path=PATHS["gemini"] + "?key=K")
    addon.requestheaders(flow)  # the keys addon needs the format first
    await requested(addon, flow)
    flow.response = json_answer(b'{"usageMetadata":{"promptTokenCount":5}}')
    addon.responseheaders(flow)
    addon.response(flow)
    assert resolved == ["generativelanguage.googleapis.com"]
    assert flow.metadata[proxy.META]["usage_input_tokens"] == 5 and "key" not in flow.request.query


async def test_turns_are_numbered_per_conversation(addon) -> None:
    turns = []
    for n in (3, 4, 5):
        flow = llm_flow(turns=n)
        await requested(addon, flow)
        turns.append((flow.metadata["trimflow"]["conversation"], flow.metadata["trimflow"]["turn"]))
    other = llm_flow("anthropic", host="api.anthropic.com")
    await requested(addon, other)
    assert [t for _, t in turns] == [1, 2, 3] and len({c for c, _ in turns}) == 1
    assert other.metadata["trimflow"]["conversation"] != turns[0][0]


async def test_each_set_of_addons_keeps_its_own_state(tmp_path) -> None:
    """Two proxies in one process (tests, a program embedding mitmproxy): each set numbers its own turns."""
    for instance in (TrimflowAddons(), TrimflowAddons()):
        with taddons.context(instance) as tctx:
            tctx.configure(instance, trimflow_rules=str(write_rules(tmp_path / "rules.yaml", 2)))
            flow = llm_flow(turns=3)
            await requested(instance, flow)
            assert flow.metadata[proxy.META]["turn"] == 1


async def test_the_state_stays_out_of_the_flow_and_goes_with_it(addon) -> None:
    flow = llm_flow(turns=3)
    await requested(addon, flow)
    flow.response = json_answer()
    addon.response(flow)
    await answer_sent()
    state = addon.flows.get(flow)
    assert state.record.images_after == 2 and state.target.host == "api.openai.com"
    assert list(flow.metadata) == [proxy.META] and json.loads(json.dumps(flow.metadata)) == flow.metadata  # as -w writes it
    assert len(addon.flows._states) == 1
    del flow, state
    gc.collect()
    assert len(addon.flows._states) == 0
