"""trimflow.proxy.conversations: trimflow_conversations names the file of last turns processes share
(trimflow._last_turns itself: tests/test_last_turns.py). Two sets of addons stand for two mitmdump processes
behind a round-robin balancer (the real ones: tests/e2e/test_team.py)."""

from __future__ import annotations

from pathlib import Path

from mitmproxy.test import taddons

from trimflow import proxy
from trimflow._last_turns import FILE_NAME

from ..helpers import TrimflowAddons, requested
from .flows import llm_flow, write_rules

# A cut held for the prompt cache, moved to the low-water mark when a cap breaks: where the last turn cut decides.
HELD = "  prune_batch: 1\n  low_water: 0.5\n"


async def forwarded(instances: list[TrimflowAddons], turns: range) -> list[bytes]:
    """The bodies the instances forward for one conversation's turns, turn k through instance k mod their number."""
    bodies = []
    for turn in turns:
        instance = instances[turn % len(instances)]
        flow = llm_flow("anthropic", turn, host="api.anthropic.com")
        instance.requestheaders(flow)
        await requested(instance, flow)
        bodies.append(flow.request.get_content())
    return bodies


async def test_two_processes_naming_one_file_forward_what_one_forwards(tmp_path: Path) -> None:
    rules = write_rules(tmp_path / "rules.yaml", 4, HELD)
    single, a, b, c, d = (TrimflowAddons() for _ in range(5))
    with taddons.context(single) as tctx:  # one loads the options; the others need only be configured
        tctx.options.update(trimflow_rules=str(rules), confdir=str(tmp_path / "confdir"))
        for instance in (single, a, b):
            instance.configure(set(tctx.options.keys()))
        for instance in (c, d):  # each its own memory only
            tctx.options.update(trimflow_conversations="")
            instance.configure(set(tctx.options.keys()))
        shared = tmp_path / "confdir" / FILE_NAME
        assert a.flows.conversations.shared is not None and a.flows.conversations.shared.path == str(shared)
        assert c.flows.conversations.shared is None

        one = await forwarded([single], range(2, 14))
        assert await forwarded([a, b], range(2, 14)) == one
        apart = await forwarded([c, d], range(2, 14))
        assert apart != one  # without the file each cuts where it last cut, not where the other did
        assert shared.is_file()

        for instance in (single, a, b, c, d):
            instance.done()
        assert a.flows.conversations.shared is None


def test_the_option_has_a_default_in_the_confdir_and_help() -> None:
    instance = proxy.ShareConversations(proxy.SharedState())
    with taddons.context(instance) as tctx:
        assert tctx.options.trimflow_conversations == "{confdir}/" + FILE_NAME
        assert "several behind a balancer" in tctx.options._options["trimflow_conversations"].help
