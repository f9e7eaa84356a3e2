"""trimflow.proxy.conversations: trimflow_conversations names the file of last turns processes share
(trimflow._last_turns itself: tests/test_last_turns.py). Two sets of addons stand for two mitmdump processes
behind a round-robin balancer (the real ones: tests/e2e/test_team.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mitmproxy import exceptions
from mitmproxy.test import taddons

from trimflow import proxy
from trimflow._last_turns import FILE_NAME
from trimflow._state_store import RedisState

from ..helpers import RedisServer, TrimflowAddons, requested
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
        shared = instance.flows.conversations.shared
        if isinstance(shared, RedisState):  # its turns go from a queue: the next turn comes after the answer, by then written
            assert shared.drained(30)
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


async def test_two_processes_on_one_shared_store_forward_what_one_forwards(tmp_path: Path) -> None:
    """As on two hosts: no shared file, each its own confdir, one Redis store (trimflow_state)."""
    store = RedisServer(tmp_path)
    rules = write_rules(tmp_path / "rules.yaml", 4, HELD)
    single, a, b = (TrimflowAddons() for _ in range(3))
    try:
        with taddons.context(single) as tctx:
            tctx.options.update(trimflow_rules=str(rules), confdir=str(tmp_path / "confdir"))
            single.configure(set(tctx.options.keys()))
            tctx.options.update(trimflow_conversations="", trimflow_state=store.url, trimflow_state_deadline="1")
            for instance in (a, b):
                instance.configure(set(tctx.options.keys()))
            stores = [instance.flows.conversations.shared for instance in (a, b)]
            assert all(isinstance(each, RedisState) and each.wait_until_up(30) for each in stores)

            one = await forwarded([single], range(2, 14))
            assert await forwarded([a, b], range(2, 14)) == one
            for instance in (single, a, b):
                instance.done()
    finally:
        store.stop()


def test_a_password_in_the_state_url_stops_with_one_line_that_never_shows_it() -> None:
    instance = proxy.ShareConversations(proxy.SharedState())
    with taddons.context(instance) as tctx, pytest.raises(exceptions.OptionsError) as refused:
        tctx.options.update(trimflow_state="redis://team:hunter2@cache.internal:6379/0")
    assert "hunter2" not in str(refused.value) and "trimflow_state_password_file" in str(refused.value)
    with taddons.context(instance) as tctx, pytest.raises(exceptions.OptionsError, match="trimflow_state_deadline"):
        tctx.options.update(trimflow_state="redis://cache.internal:6379/0", trimflow_state_deadline="soon")
