"""trimflow.proxy._metrics_server: the /metrics endpoint over a real socket on the test's event loop, serving an
exposition of its own (the prometheus addon's, with prometheus_client: tests/proxy/test_prometheus.py): what it
answers, a render kept while nothing changed, a failed render, and what anyone who reaches the port can do.
Against a crowd on a real mitmdump: tests/hostile/test_metrics_endpoint.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from trimflow.proxy._metrics_server import MAX_CONNECTIONS, MetricsServer, listen

from .scrape import closed_by_the_server, scrape

OPENMETRICS = b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\r\n"


class Exposition:
    """An exposition with one figure, `up`: renders counted, and broken on demand."""

    def __init__(self) -> None:
        self.up = 1
        self.renders: list[str] = []
        self.broken = False

    def content_type(self, accept: str) -> str:
        return "application/openmetrics-text" if "openmetrics" in accept else "text/plain"

    def state(self) -> int:
        return self.up

    def render(self, accept: str) -> tuple[bytes, str]:
        self.renders.append(accept)
        if self.broken:
            raise RuntimeError("sk-secret-in-an-error")
        return f"up {self.up}\n".encode(), self.content_type(accept)


@pytest.fixture
async def server() -> AsyncIterator[MetricsServer]:
    served = MetricsServer(listen("127.0.0.1", 0), Exposition())
    served.start()
    yield served
    served.stop()


def exposition_of(server: MetricsServer) -> Exposition:
    assert isinstance(server.exposition, Exposition)
    return server.exposition


async def test_get_and_head_on_metrics_only(server: MetricsServer) -> None:
    port = server.address[1]
    assert await scrape(port) == (200, {"Content-Type": "text/plain", "Content-Length": "5", "Connection": "close"}, b"up 1\n")
    status, headers, body = await scrape(port, b"HEAD /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (status, headers["Content-Length"], body) == (200, "5", b"")
    assert (await scrape(port, b"GET / HTTP/1.1\r\n\r\n"))[0] == 404
    status, headers, _ = await scrape(port, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    assert (await scrape(port, b"hello\r\n\r\n"))[0] == 400
    assert (await scrape(port, b"GET /metrics HTTP/2.0\r\n\r\n"))[0] == 400


async def test_a_render_is_kept_while_the_state_is_the_same_and_each_format_has_its_own(server: MetricsServer) -> None:
    exposition = exposition_of(server)
    port = server.address[1]
    assert [(await scrape(port))[2] for _ in range(5)] == [b"up 1\n"] * 5
    assert len(exposition.renders) == 1
    status, headers, body = await scrape(port, OPENMETRICS)
    assert (status, headers["Content-Type"], body, len(exposition.renders)) == (200, "application/openmetrics-text", b"up 1\n", 2)
    exposition.up = 2
    assert (await scrape(port))[2] == b"up 2\n" and len(exposition.renders) == 3


async def test_a_failed_render_is_a_500_with_one_line_and_the_next_scrape_renders_again(
    server: MetricsServer, caplog: pytest.LogCaptureFixture
) -> None:
    exposition = exposition_of(server)
    exposition.broken = True
    with caplog.at_level(logging.WARNING, logger="trimflow"):
        assert (await scrape(server.address[1]))[:2] == (500, {"Content-Type": "text/plain", "Content-Length": "25", "Connection": "close"})
    assert [r.getMessage() for r in caplog.records] == ["trimflow: Prometheus metrics not rendered: internal error RuntimeError"]
    exposition.broken = False
    assert (await scrape(server.address[1]))[2] == b"up 1\n" and len(exposition.renders) == 2


async def test_idle_connections_past_the_bound_leave_room_for_a_scrape(server: MetricsServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "trimflow")
    port = server.address[1]
    idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(MAX_CONNECTIONS + 20)]
    # A scraper that sends its request at once is served while every slot is held by a connection that sent nothing.
    assert await scrape(port) == (200, {"Content-Type": "text/plain", "Content-Length": "5", "Connection": "close"}, b"up 1\n")
    assert all(await asyncio.gather(*(closed_by_the_server(reader) for reader, _ in idle)))
    lines = [r.getMessage() for r in caplog.records if "bound" in r.getMessage()]
    assert len(lines) == 1 and f"reached its bound of {MAX_CONNECTIONS} open connections" in lines[0], lines
    for _, writer in idle:
        writer.close()


async def test_a_connection_that_sends_part_of_its_head_is_closed(server: MetricsServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.address[1])
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
    await writer.drain()
    assert await closed_by_the_server(reader)
    writer.close()
    assert (await scrape(server.address[1]))[0] == 200


async def test_stop_closes_the_port_and_every_open_connection(server: MetricsServer) -> None:
    port = server.address[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert (await scrape(port))[0] == 200  # served after the idle one was accepted
    server.stop()
    assert not server.serving
    assert await closed_by_the_server(reader)
    writer.close()
    with pytest.raises(ConnectionRefusedError):
        await scrape(port)
