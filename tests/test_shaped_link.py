"""The shaped link relays bytes intact both ways, passes each side's close on, and leaves no socket open.

Real TCP on loopback: an asyncio upstream, the relay, and clients in the same event loop (the CLI test runs
the relay in its own process). Its timing is the bench's business (scripts/bench, shaped-link section):
nothing here asserts how long anything took.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.shaped_link import CHUNK, ShapedLink

from .helpers import wait_for_async

ROOT = Path(__file__).resolve().parents[1]
# Fast enough that the bulk tests take well under a second, slow enough that every chunk waits for the bucket.
RATE_MBIT, RTT_MS = 1000.0, 2.0

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def upstream(handler: Handler) -> AsyncIterator[tuple[str, int]]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield "127.0.0.1", server.sockets[0].getsockname()[1]
    finally:
        server.close()
        if sys.version_info >= (3, 13):
            server.close_clients()  # 3.12's wait_closed waits for every connection; the tests' own close as they end
        await server.wait_closed()


@asynccontextmanager
async def shaped(address: tuple[str, int]) -> AsyncIterator[ShapedLink]:
    link = await ShapedLink(address, rate_mbit=RATE_MBIT, rtt_ms=RTT_MS).start()
    try:
        yield link
    finally:
        await link.stop()


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Echo until the client's end-of-stream, then close."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


async def test_a_large_body_comes_back_intact() -> None:
    body = random.Random(7).randbytes(8 * 2**20 + 123)  # many chunks, and a last one that is not whole
    async with upstream(echo) as address, shaped(address) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)

        async def send() -> None:
            for start in range(0, len(body), 100_000):
                writer.write(body[start : start + 100_000])
                await writer.drain()
            writer.write_eof()

        sending = asyncio.create_task(send())
        echoed = await reader.read()  # to the end: the upstream closes once it has echoed everything
        await sending
        writer.close()
        assert len(echoed) == len(body)
        assert hashlib.sha256(echoed).digest() == hashlib.sha256(body).digest()
        assert link.bytes_up == link.bytes_down == len(body)


async def test_many_small_messages_come_back_in_order() -> None:
    rng = random.Random(11)
    messages = [rng.randbytes(rng.randint(1, 300)) for _ in range(2000)]
    async with upstream(echo) as address, shaped(address) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        # One at a time, each answered before the next goes: a conversation, every piece smaller than a chunk.
        for message in messages[:40]:
            writer.write(message)
            assert await reader.readexactly(len(message)) == message
        # Then all the rest written at once, read back as one stream.
        for message in messages[40:]:
            writer.write(message)
        await writer.drain()
        rest = b"".join(messages[40:])
        assert await reader.readexactly(len(rest)) == rest
        writer.close()
        await writer.wait_closed()


async def test_the_upstream_closing_reaches_the_client_and_frees_the_connection() -> None:
    async def greet_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"x" * (3 * CHUNK) + b"bye")
        await writer.drain()
        writer.close()

    async with upstream(greet_and_close) as address, shaped(address) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        assert await reader.read() == b"x" * (3 * CHUNK) + b"bye"  # everything sent before the close, then end-of-stream
        assert link.open_connections == 1  # the client has not closed its side: it may still send
        writer.close()
        await writer.wait_closed()
        await wait_for_async(lambda: link.open_connections == 0, "the relay closes the connection once both sides have")


async def test_an_upstream_reset_closes_the_client_side() -> None:
    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(5)
        # Linger on with a zero timeout: the close sends RST, not FIN.
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async with upstream(reset) as address, shaped(address) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        writer.write(b"hello")
        await writer.drain()
        try:
            assert await reader.read() == b""
        except ConnectionResetError:
            pass  # the relay aborts its side too: a reset is as good an end as an end-of-stream
        await wait_for_async(lambda: link.open_connections == 0, "the relay drops the connection after the reset")
        writer.close()


async def test_the_client_closing_reaches_the_upstream_after_its_bytes() -> None:
    received: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def collect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.set_result(await reader.read())  # until the end-of-stream the relay passes on
        writer.close()

    body = random.Random(3).randbytes(5 * CHUNK + 17)
    async with upstream(collect) as address, shaped(address) as link:
        _, writer = await asyncio.open_connection("127.0.0.1", link.port)
        writer.write(body)
        writer.close()  # a full close right after the write: the bytes in flight still arrive
        await writer.wait_closed()
        assert await asyncio.wait_for(received, 10) == body
        await wait_for_async(lambda: link.open_connections == 0, "the relay closes the connection after both ends closed")


async def test_a_half_closed_client_still_gets_its_answer() -> None:
    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()
        writer.write(b"%d" % len(data))
        await writer.drain()
        writer.close()

    async with upstream(count) as address, shaped(address) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        writer.write(b"a" * 100_000)
        writer.write_eof()
        assert await reader.read() == b"100000"
        writer.close()
        await wait_for_async(lambda: link.open_connections == 0, "the relay closes the connection")


async def test_a_refused_upstream_closes_the_client() -> None:
    async with upstream(echo) as address:
        pass  # the port is free again: nothing listens there
    async with shaped(address) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        assert await reader.read() == b""
        writer.close()
        await wait_for_async(lambda: link.open_connections == 0, "the relay forgets the connection")


async def test_stop_closes_every_connection() -> None:
    async with upstream(echo) as address:
        link = await ShapedLink(address, rate_mbit=1.0, rtt_ms=20.0).start()  # slow: transfers are still running at stop
        clients = [await asyncio.open_connection("127.0.0.1", link.port) for _ in range(4)]
        for _, writer in clients:
            writer.write(b"z" * 200_000)
        await wait_for_async(lambda: link.open_connections == 4, "four connections open")
        await link.stop()
        assert link.open_connections == 0
        for reader, writer in clients:
            try:
                await asyncio.wait_for(reader.read(), 10)  # an end: the relay's side of each connection is gone
            except ConnectionResetError:
                pass
            writer.close()
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", link.port)


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open descriptors in /proc")
async def test_the_relay_process_frees_its_sockets() -> None:
    async with upstream(echo) as address:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.shaped_link",
                "--upstream",
                f"{address[0]}:{address[1]}",
                "--rate-mbit",
                str(RATE_MBIT),
                "--rtt-ms",
                str(RTT_MS),
            ],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
        )
        try:
            assert process.stdout is not None
            port = int(await asyncio.to_thread(process.stdout.readline))
            idle = _fds(process.pid)
            for round_ in range(3):
                clients = [await asyncio.open_connection("127.0.0.1", port) for _ in range(5)]
                for reader, writer in clients:
                    payload = (b"%d" % round_) * 50_000
                    writer.write(payload)
                    assert await reader.readexactly(len(payload)) == payload
                await wait_for_async(lambda: _fds(process.pid) >= idle + 10, "two sockets per connection")
                for _, writer in clients:
                    writer.close()  # the echo upstream closes in turn: both ends close the relay's pair
                await wait_for_async(lambda: _fds(process.pid) == idle, f"the relay back to {idle} descriptors after round {round_}")
            process.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(process.wait, 10) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(5)
            if process.stdout is not None:
                process.stdout.close()
