"""trimflow.proxy._resend: mitmproxy's size check extended only while a hold runs (from its `running` hook to its
`done`, however many sets of addons run at once), and a retry for a client that has gone is never sent. A retry
sent and cancelled through a real mitmdump: tests/e2e/test_recovery*.py."""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any

import pytest
from mitmproxy import hooks
from mitmproxy.connection import ConnectionState
from mitmproxy.proxy.layers.http import HttpStream
from mitmproxy.test import taddons

from trimflow import proxy
from trimflow.proxy import _resend
from trimflow.proxy.recover import HoldErrorAnswers

from .flows import llm_flow

MITMPROXYS_CHECK = vars(HttpStream)["check_body_size"]


def size_check() -> Any:
    return vars(HttpStream)["check_body_size"]


def hold_of(addons: list[object]) -> HoldErrorAnswers:
    (hold,) = (a for a in addons if isinstance(a, HoldErrorAnswers))
    return hold


async def test_running_extends_the_size_check_and_done_after_the_last_hold_puts_mitmproxys_back() -> None:
    assert size_check() is MITMPROXYS_CHECK
    first, second = proxy.make_addons(), proxy.make_addons()  # as a reloaded script runs a second set before the first is done
    with taddons.context(*first) as tctx:
        assert size_check() is MITMPROXYS_CHECK  # built and loaded, not running: mitmproxy as it is
        await tctx.master.addons.trigger_event(hooks.RunningHook())
        extended = size_check()
        assert extended is not MITMPROXYS_CHECK and hold_of(first).bounded
        tctx.master.addons.invoke_addon_sync(hold_of(second), hooks.RunningHook())
        assert size_check() is extended and hold_of(second).bounded  # extended once, whatever the number of holds
        for addon in first:
            tctx.master.addons.remove(addon)  # mitmproxy runs each one's `done`
        assert size_check() is extended  # the second set still holds answers
        tctx.master.addons.invoke_addon_sync(hold_of(first), hooks.DoneHook())  # a second `done` undoes nothing more
        assert size_check() is extended
        tctx.master.addons.invoke_addon_sync(hold_of(second), hooks.DoneHook())
        assert size_check() is MITMPROXYS_CHECK and not hold_of(second).bounded
        tctx.master.addons.invoke_addon_sync(hold_of(second), hooks.RunningHook())  # running again: extended again
        assert size_check() is not MITMPROXYS_CHECK
        tctx.master.addons.invoke_addon_sync(hold_of(second), hooks.DoneHook())
    assert size_check() is MITMPROXYS_CHECK


def test_a_mitmproxy_whose_http_layer_differs_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def check_body_size(self: HttpStream, request: bool) -> bool:  # not the generator this mitmproxy has
        return False

    monkeypatch.setattr(HttpStream, "check_body_size", check_body_size)
    hold = hold_of(proxy.make_addons())
    with caplog.at_level(logging.WARNING, logger="trimflow"):
        hold.running()
    assert not hold.bounded and size_check() is check_body_size
    assert [r.getMessage() for r in caplog.records] == [
        "trimflow: this mitmproxy's HTTP layer is not as expected: error answers of unknown length are not retried"
    ]
    hold.done()
    assert size_check() is check_body_size


def test_a_method_put_over_the_extension_is_left_to_whoever_put_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(HttpStream, "check_body_size", MITMPROXYS_CHECK)  # undone last: mitmproxy's own after the test
    hold = hold_of(proxy.make_addons())
    hold.running()
    extended = size_check()

    def theirs(self: HttpStream, request: bool) -> Generator[Any, Any, bool]:
        return (yield from extended(self, request))

    monkeypatch.setattr(HttpStream, "check_body_size", theirs)
    hold.done()
    assert size_check() is theirs


async def test_a_retry_for_a_client_that_has_gone_is_not_sent() -> None:
    flow = llm_flow(turns=3)
    flow.client_conn.state = ConnectionState.CAN_WRITE  # it has closed its side: mitmproxy closes the rest
    assert await _resend.resend(flow.request, flow.client_conn) == _resend.CLIENT_GONE
    _resend.cancel_retries(flow.client_conn)  # none in flight: nothing to do
