"""A shaped link on loopback: a TCP relay that paces and delays what it forwards, in user space.

`scripts/bench` puts it between a proxy and the upstream to stand for a real uplink (these machines'
kernels have no netem qdisc). Each direction of the link has its own token bucket at the given rate,
shared by every connection on the link, with a small burst (BURST bytes), so a 10 MB body takes its
4 s at 20 Mbit/s; every chunk then waits half the round trip before it is written out, so a request
and its answer see the whole RTT. A new connection costs one round trip before its first byte is
forwarded, as TCP's handshake does. Not modelled: TCP slow start and loss.

Bytes go through untouched; an end-of-stream is forwarded as a half-close once the bytes before it
have arrived, and a connection is closed when both directions have ended or either one fails.

    python -m tests.shaped_link --upstream 127.0.0.1:8700 --rate-mbit 20 --rtt-ms 30 [--port N]

prints the port it listens on (127.0.0.1) and relays until SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time

BURST = 64 * 1024  # bytes a direction may send at once after an idle spell
CHUNK = 16 * 1024  # at most this much is read, paced and delayed as one piece
# Chunks a delay line holds: a peer that stops reading stops the reading of its direction, as a full
# TCP window would. Room for a round trip at 1 Gbit/s, far more than the link is run at.
LINE_CHUNKS = 256


class TokenBucket:
    """`rate` bytes per second with at most `burst` saved up; a waiter sleeps only as long as its bytes need."""

    def __init__(self, rate: float, burst: int) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.stamp = time.monotonic()
        self.lock = asyncio.Lock()  # connections sharing the link take their turns

    async def take(self, size: int) -> None:
        async with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            self.tokens -= size  # below zero: this piece is sent once the debt is paid
            if self.tokens < 0:
                await asyncio.sleep(-self.tokens / self.rate)


class ShapedLink:
    """Listens on `host`:`port` (0: any free port) and relays each connection to `upstream` over the shaped link."""

    def __init__(
        self, upstream: tuple[str, int], *, rate_mbit: float, rtt_ms: float, host: str = "127.0.0.1", port: int = 0, burst: int = BURST
    ) -> None:
        if rtt_ms < 0:
            raise ValueError("rtt_ms must not be negative")
        self.upstream, self.host, self.requested_port = upstream, host, port
        self.rate_mbit, self.rtt_ms = rate_mbit, rtt_ms
        self.one_way = rtt_ms / 2000
        self.up = TokenBucket(rate_mbit * 1e6 / 8, burst)  # client -> upstream
        self.down = TokenBucket(rate_mbit * 1e6 / 8, burst)  # upstream -> client
        self.bytes_up = self.bytes_down = 0
        self.server: asyncio.Server | None = None
        self.port = 0
        self.tasks: set[asyncio.Task[None]] = set()

    @property
    def open_connections(self) -> int:
        return len(self.tasks)

    async def start(self) -> ShapedLink:
        self.server = await asyncio.start_server(self._accept, self.host, self.requested_port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """Stop listening, close every connection and wait for them: nothing of the link stays open."""
        if self.server is not None:
            self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.server is not None:
            await self.server.wait_closed()
            self.server = None

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        writers = [client_writer]
        ended = False  # both directions delivered their end-of-stream: close gently, else drop what is buffered
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
            writers.append(upstream_writer)
            await asyncio.sleep(2 * self.one_way)  # the handshake's round trip
            async with asyncio.TaskGroup() as group:
                for reader, writer, bucket, up in (
                    (client_reader, upstream_writer, self.up, True),
                    (upstream_reader, client_writer, self.down, False),
                ):
                    line: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue(LINE_CHUNKS)
                    group.create_task(self._pace(reader, line, bucket, up))
                    group.create_task(self._deliver(line, writer))
            ended = True
        except* OSError:
            pass  # refused, reset, or a write to a closed peer: the connection ends, both sides are closed below
        except* asyncio.CancelledError:
            pass  # stop(): this task is the top of the connection, nothing above it waits for the cancellation
        finally:
            for writer in writers:
                if ended:
                    writer.close()
                else:
                    writer.transport.abort()
            for writer in writers:
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
            self.tasks.discard(task)

    async def _pace(self, reader: asyncio.StreamReader, line: asyncio.Queue[tuple[float, bytes | None]], bucket: TokenBucket, up: bool) -> None:
        """Read one direction and put each chunk on its delay line once the bucket lets it go; None at the end."""
        while chunk := await reader.read(CHUNK):
            await bucket.take(len(chunk))
            if up:
                self.bytes_up += len(chunk)
            else:
                self.bytes_down += len(chunk)
            await line.put((time.monotonic() + self.one_way, chunk))
        await line.put((time.monotonic() + self.one_way, None))

    async def _deliver(self, line: asyncio.Queue[tuple[float, bytes | None]], writer: asyncio.StreamWriter) -> None:
        """Write each chunk of the delay line when it is due; the end-of-stream becomes a half-close."""
        while True:
            due, chunk = await line.get()
            pause = due - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            if chunk is None:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(chunk)
            await writer.drain()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {text!r}")
    return host, int(port)


async def _serve(args: argparse.Namespace) -> None:
    link = await ShapedLink(args.upstream, rate_mbit=args.rate_mbit, rtt_ms=args.rtt_ms, port=args.port).start()
    print(link.port, flush=True)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    await stopped.wait()
    await link.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shaped_link", description="Relay TCP on 127.0.0.1 to an upstream at a paced rate with a round-trip delay.")
    parser.add_argument("--upstream", type=_address, required=True, help="HOST:PORT to forward to")
    parser.add_argument("--rate-mbit", type=float, required=True, help="rate of each direction, Mbit/s")
    parser.add_argument("--rtt-ms", type=float, default=30.0, help="round-trip time added, ms (default 30)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: any free one)")
    args = parser.parse_args(argv)
    if args.rate_mbit <= 0 or args.rtt_ms < 0:
        parser.error("--rate-mbit must be positive and --rtt-ms not negative")
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
