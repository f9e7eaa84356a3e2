"""trimflow.proxy.websocket: trimflow_websocket=refuse answers a WebSocket upgrade on a Responses endpoint with
426 (what Codex falls back to HTTP on at once), nothing else; in pass mode a WebSocket that continues a
conversation held at the provider after images went over it gets one warning per host naming the option."""

from __future__ import annotations

import logging

import orjson
import pytest
from mitmproxy import exceptions, http
from mitmproxy.test import tflow, tutils
from mitmproxy.websocket import WebSocketMessage
from wsproto.frame_protocol import Opcode

from trimflow.testing import session_body

from ..helpers import requested
from .flows import SHOT

UPGRADE = {"upgrade": "websocket", "connection": "Upgrade", "sec-websocket-version": "13", "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ=="}


def upgrade_flow(path: str = "/v1/responses", host: str = "api.openai.com", headers: dict[str, str] | None = None) -> http.HTTPFlow:
    request = tutils.treq(
        host=host,
        port=443,
        scheme=b"https",
        method=b"GET",
        authority=b"",
        path=path.encode(),
        content=b"",
        headers=http.Headers(**(headers or UPGRADE)),
    )
    return tflow.tflow(req=request)


async def test_refuse_answers_the_upgrade_on_responses_endpoints_with_426(addon, caplog) -> None:
    addon.tctx.configure(addon, trimflow_websocket="refuse")
    codex = upgrade_flow("/backend-api/codex/responses", host="chatgpt.com")
    api = upgrade_flow("/v1/responses")
    with caplog.at_level(logging.INFO, logger="trimflow"):
        for flow in (codex, api, upgrade_flow("/v1/responses")):
            await requested(addon, flow)
            assert flow.response is not None and flow.response.status_code == 426
            assert orjson.loads(flow.response.content)["error"]["type"] == "websocket_refused"
    refused = [r.getMessage() for r in caplog.records if "refused a WebSocket" in r.getMessage()]
    assert len(refused) == 2  # one line per host
    assert "api.openai.com/v1/responses" in refused[1] and "trimflow_websocket=refuse" in refused[1]


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/v1/realtime", UPGRADE),  # a WebSocket, but not to a Responses endpoint
        ("/socket.io/", UPGRADE),
        ("/v1/responses", {"accept": "application/json"}),  # a plain GET of that path
    ],
)
async def test_refuse_leaves_everything_else_alone(addon, path: str, headers: dict[str, str]) -> None:
    addon.tctx.configure(addon, trimflow_websocket="refuse")
    flow = upgrade_flow(path, headers=headers)
    await requested(addon, flow)
    assert flow.response is None


async def test_pass_is_the_default_and_lets_the_upgrade_through(addon) -> None:
    flow = upgrade_flow()
    await requested(addon, flow)
    assert flow.response is None


def test_an_unknown_value_is_refused_with_the_choices(addon) -> None:
    with pytest.raises(exceptions.OptionsError, match="trimflow_websocket must be one of pass, refuse, not 'close'"):
        addon.tctx.configure(addon, trimflow_websocket="close")


def response_create(turns: int, previous: str | None) -> bytes:
    body = session_body("openai-responses", turns, SHOT, "image/png")
    if previous is not None:  # as Codex continues over a WebSocket: the earlier turns stay at the provider
        body["previous_response_id"] = previous
        body["input"] = body["input"][-1:]
    return orjson.dumps({"type": "response.create", **body})


async def send(addon, flow: http.HTTPFlow, message: bytes) -> None:
    assert flow.websocket is not None
    flow.websocket.messages.append(WebSocketMessage(Opcode.TEXT, True, message))
    await addon.websocket_message(flow)


def websocket_flow(host: str) -> http.HTTPFlow:
    flow = tflow.twebsocketflow(messages=False)
    flow.request.host = host
    flow.request.path = "/v1/responses"
    return flow


async def test_a_websocket_leaving_images_at_the_provider_is_warned_about_once_per_host(addon, caplog) -> None:
    first, second, other = websocket_flow("api.openai.com"), websocket_flow("api.openai.com"), websocket_flow("gateway.example")
    with caplog.at_level(logging.WARNING, logger="trimflow"):
        await send(addon, first, response_create(3, None))  # images, the history in the message: nothing held yet
        assert not [r for r in caplog.records if "keeps its conversation" in r.getMessage()]
        await send(addon, first, response_create(4, "resp_1"))
        await send(addon, second, response_create(3, None))
        await send(addon, second, response_create(4, "resp_2"))  # the same host: said already
        await send(addon, other, response_create(4, "resp_3"))  # the first message on it: no image went over it before
        await send(addon, other, response_create(4, "resp_4"))
    warnings = [r.getMessage() for r in caplog.records if "keeps its conversation" in r.getMessage()]
    assert len(warnings) == 2
    assert "api.openai.com" in warnings[0] and "the 3 image(s)" in warnings[0] and "--set trimflow_websocket=refuse" in warnings[0]
    assert "gateway.example" in warnings[1]
