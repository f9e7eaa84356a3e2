"""Test helpers: rules with given limits, requests built from synthetic sessions, and the addons."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import inspect
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar, cast

import orjson
import pytest
from mitmproxy import addonmanager, ctx, hooks
from mitmproxy.proxy.layers import http as http_layer
from mitmproxy.proxy.layers import websocket as websocket_layer

from trimflow import Limits, proxy
from trimflow._clicks import Screen
from trimflow._rules import Rules, builtin_rules
from trimflow._rules_file import RulesFile
from trimflow.testing import PATHS

T = TypeVar("T")


POLL = 0.02  # seconds between two looks at a condition
# Why the tests that drive the mcp SDK cannot run here, or "" when they can: pyproject.toml installs it on Python 3.12+
# only (mcp 2 needs h11 >= 0.16; mitmproxy 11, the newest for Python 3.11, pins h11 <= 0.14). On 3.12+ a missing SDK
# fails those tests rather than skipping them.
MCP_SDK_MISSING = "" if sys.version_info >= (3, 12) else "the mcp SDK cannot be installed beside mitmproxy 11 (Python 3.11): h11"


def wait_for(condition: Callable[[], T], what: str, timeout: float = 60.0) -> T:
    """`condition()`'s first true value, polled; fails naming `what` after `timeout` seconds. The one wait of the
    tests: long enough for a busy machine, and it ends as soon as the condition holds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(POLL)


async def wait_for_async(condition: Callable[[], T | Awaitable[T]], what: str, timeout: float = 60.0) -> T:
    """wait_for on the event loop, for a test that runs on it: the loop goes on between two looks, and
    `condition` may be a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return cast(T, value)
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        await asyncio.sleep(POLL)


def tcp_sockets(pid: int) -> list[tuple[int, str]]:
    """(local port, state) of each TCP socket that process `pid` holds, read from /proc (Linux); LISTEN is 0A."""
    inodes = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except FileNotFoundError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    held = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                held.append((int(fields[1].rsplit(":", 1)[1], 16), fields[3]))
    return held


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on: where a server bound to port 0 tells no one which port it got."""
    return {port for port, state in tcp_sockets(pid) if state == "0A"}


_PACKAGE = str(Path(__file__).resolve().parents[1] / "addon" / "trimflow")


def lines_run(call: Callable[[], object]) -> int:
    """How many lines of trimflow's own Python code `call()` runs: a measure of its work that a busy machine does
    not change, for checking how work grows with the input (a timing would fail under load)."""
    count = 0

    def tracer(frame: FrameType, event: str, arg: object) -> Callable[..., object] | None:
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    def calls(frame: FrameType, event: str, arg: object) -> Callable[..., object] | None:
        return tracer if frame.f_code.co_filename.startswith(_PACKAGE) else None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        call()
    finally:
        sys.settrace(previous)
    return count


@contextmanager
def held_by_another_process(path: Path) -> Iterator[None]:
    """`path` locked by another process (util-linux `flock --shared`, as any local user could) until the block ends."""
    holder = subprocess.Popen(
        ["flock", "--shared", str(path), "sh", "-c", "echo held; read _"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held", "flock could not hold the file"
        yield
    finally:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.wait(10)
        holder.stdout.close()


# A SQLite lock another process takes on a file: a write in progress (the other writers wait, readers go on, in
# WAL mode), or the whole file (an exclusive locking mode: nobody else reads it either).
SQLITE_LOCKS = {
    "a write in progress": "BEGIN IMMEDIATE",
    "the whole file": "PRAGMA locking_mode = EXCLUSIVE; BEGIN EXCLUSIVE; SELECT count(*) FROM sqlite_master",
}


@contextmanager
def sqlite_held_by_another_process(path: Path, lock: str = "a write in progress") -> Iterator[None]:
    """`path` held by another process's SQLite connection (one of SQLITE_LOCKS) until the block ends."""
    script = (
        "import sqlite3, sys\n"
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "for statement in sys.argv[2].split('; '):\n"
        "    db.execute(statement).fetchall()\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", script, str(path), SQLITE_LOCKS[lock]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held", "the other process could not hold the file"
        yield
    finally:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.stdout.close()
        holder.wait(10)


def rules_with(**limits: Any) -> Rules:
    """The built-in endpoints with these limits as the defaults."""
    return dataclasses.replace(builtin_rules(), defaults=Limits(**limits))


def url_for(wire_format: str, host: str = "api.example.test") -> str:
    return f"https://{host}{PATHS[wire_format]}"


def encode(body: Any) -> bytes:
    return orjson.dumps(body)


ROOT = Path(__file__).resolve().parents[1]


def load_addon_module():
    """addon/mitm.py as mitmdump loads it: a script beside the package, not an importable module."""
    spec = importlib.util.spec_from_file_location("trimflow_mitm_under_test", ROOT / "addon" / "mitm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TrimflowAddons:
    """A fresh set of trimflow.proxy's addons as one addon, for tests of the whole chain in a taddons
    context: load and configure reach each of them, and each hook runs in every addon that has it, in
    list order, through mitmproxy's own invoker, as mitmproxy runs a script's `addons`."""

    def __init__(self) -> None:
        self.chain = proxy.make_addons()
        self.flows: proxy.SharedState = self.get(proxy.Prune).flows

    def get(self, kind: type) -> Any:
        (addon,) = (a for a in self.chain if isinstance(a, kind))
        return addon

    @property
    def rules(self) -> RulesFile | None:
        return self.flows.rules

    @rules.setter
    def rules(self, rules: RulesFile) -> None:
        self.flows.rules = rules

    @property
    def simulated(self):
        return self.get(proxy.Simulate).profile

    def _run(self, hook: hooks.Hook) -> None:
        for addon in self.chain:
            ctx.master.addons.invoke_addon_sync(addon, hook)

    async def _run_async(self, hook: hooks.Hook) -> None:
        for addon in self.chain:
            await ctx.master.addons.invoke_addon(addon, hook)

    def load(self, loader) -> None:
        self._run(addonmanager.LoadHook(loader))

    def configure(self, updated: set[str]) -> None:
        self._run(hooks.ConfigureHook(updated))

    def running(self) -> None:
        self._run(hooks.RunningHook())

    def done(self) -> None:
        self._run(hooks.DoneHook())

    def requestheaders(self, flow) -> None:
        self._run(http_layer.HttpRequestHeadersHook(flow))

    async def request(self, flow) -> None:
        await self._run_async(http_layer.HttpRequestHook(flow))

    def responseheaders(self, flow) -> None:
        self._run(http_layer.HttpResponseHeadersHook(flow))

    def response(self, flow) -> None:
        self._run(http_layer.HttpResponseHook(flow))

    async def response_async(self, flow) -> None:
        """The response hook awaiting what an addon returns, as mitmproxy does (the clicks addon maps a large or
        compressed JSON answer in a worker thread)."""
        await self._run_async(http_layer.HttpResponseHook(flow))

    def error(self, flow) -> None:
        self._run(http_layer.HttpErrorHook(flow))

    async def websocket_message(self, flow) -> None:
        await self._run_async(websocket_layer.WebsocketMessageHook(flow))


async def requested(addon, flow) -> None:
    """The request hook and the turn of the event loop after it, as mitmproxy runs them, then the flow's record as a
    hook that reads it gets it (a request forwarded as it came has its record worked out once its answer has gone)."""
    await addon.request(flow)
    await after_hooks()
    state = addon.flows.get(flow)
    if state is not None:
        addon.flows.settle(flow, state)


async def after_hooks() -> None:
    """Past what the addons left for after mitmproxy forwarded a request or sent an answer (proxy.state.after_hook): a
    timer due at once runs on the loop's next turn, after the callbacks ready then (this task's among them), so the
    turn after that finds it done."""
    for _ in range(2):
        await asyncio.sleep(0)


async def answer_sent() -> None:
    """Past the metrics addon's flush: it logs and writes a record FLUSH_DELAY after the answer went out.
    Timers fire in deadline order, so a later one always finds the flush done."""
    await asyncio.sleep(proxy.FLUSH_DELAY * 2)


class RedisServer:
    """A redis-server on a Unix socket only (`--port 0`: no TCP port to race for), nothing saved to disk."""

    def __init__(self, workdir: Path, password: str | None = None, args: tuple[str, ...] = ()) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.access(binary, os.X_OK) or importlib.util.find_spec("redis") is None:
            message = "no redis-server or redis client: apt-get install redis-server (as root), pip install 'trimflow[team]'; or scripts/setup"
            if os.environ.get("TRIMFLOW_REQUIRE_TEAM_SERVERS") == "1":
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        self.binary, self.workdir, self.password, self.args = binary, workdir, password, args
        self.socket = workdir / "redis.sock"
        self.url = f"unix://{self.socket}"
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        command = [self.binary, "--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700"]
        command += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        if self.password is not None:
            command += ["--requirepass", self.password]
        command += self.args
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        wait_for(self.answers, "redis-server answering")

    def raw(self) -> Any:
        import redis

        return redis.Redis(unix_socket_path=str(self.socket), password=self.password, socket_timeout=5)

    def answers(self) -> bool:
        import redis

        assert self.process is not None and self.process.poll() is None, "redis-server exited"
        try:
            with self.raw() as raw:
                return bool(raw.ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


# Computer-use screens the clicks tests map through (trimflow._clicks.Screen): the screenshot went at 2000x1125.
CLAUDE_SCREEN = Screen("anthropic", "computer", (2000, 1125), (2560, 1440))  # x and y times 1.28
OPENAI_SCREEN = Screen("openai-responses", None, (2000, 1125), (5120, 2880))  # times 2.56
