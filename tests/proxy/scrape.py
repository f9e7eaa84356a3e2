"""A scraper of the /metrics endpoint (trimflow.proxy._metrics_server), for the tests of the endpoint and of the
prometheus addon."""

from __future__ import annotations

import asyncio


async def scrape(port: int, request: bytes | None = None, host: str = "127.0.0.1") -> tuple[int, dict[str, str], bytes]:
    """One HTTP exchange with the endpoint: (status, headers, body)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(request or b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain;version=0.0.4\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


async def closed_by_the_server(reader: asyncio.StreamReader) -> bool:
    """Whether the endpoint closes a connection that sends nothing (read until EOF or a reset; a generous net so a
    connection left open fails the test rather than hanging it)."""
    try:
        return await asyncio.wait_for(reader.read(), 30) == b""
    except ConnectionError:
        return True
