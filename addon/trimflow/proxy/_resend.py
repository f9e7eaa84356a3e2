"""Where the recover addon (proxy/recover.py) reaches into mitmproxy's proxy core, past the addon API.

- `resend` sends a retry upstream through mitmproxy's own connection machinery, as client replay sends a flow,
  without running the addons' HTTP hooks for it (the original flow went through them); `cancel_retries` ends
  those in flight for a client whose connection has closed. The send-once addon sends its uploads this way too
  (with a deadline), and its deletions for no client (`detached_client`).
- `extend_size_check` makes mitmproxy's HTTP layer stream an error answer held back from the client
  (`held_answers`) once it passes ANSWER_MAX, as it streams any answer past `stream_large_bodies`
  (`held_answer_body` reads one that stayed within it). The layer is mitmproxy's class, shared by the whole
  process: it is extended while a HoldErrorAnswers addon runs (its `running` hook) and mitmproxy's own method is
  put back when the last one is done (`restore_size_check`); nothing here changes mitmproxy when imported.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import weakref
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any

from mitmproxy import connection, ctx, http
from mitmproxy.addons.clientplayback import ReplayHandler
from mitmproxy.connection import ConnectionState
from mitmproxy.proxy import commands
from mitmproxy.proxy.layers import http as http_layers

from .._decode import DecodeError, decode_body
from .._limit_errors import ANSWER_MAX

log = logging.getLogger("trimflow")

CLIENT_GONE = "the client closed its connection; cancelled"
TIMED_OUT = "no answer before the deadline; cancelled"
_FLOW_HOOKS = (
    http_layers.HttpRequestHeadersHook,
    http_layers.HttpRequestHook,
    http_layers.HttpResponseHeadersHook,
    http_layers.HttpResponseHook,
    http_layers.HttpErrorHook,
)


# -- the held error answers' bound in mitmproxy's HTTP layer


@dataclass(slots=True)
class HeldAnswer:
    """An error answer held back from the client: how to stream it if it passes ANSWER_MAX (the metrics addon's
    scanner, or True), and the originals to drop its flow from then."""

    stream: bool | Callable[[bytes], Iterable[bytes] | bytes]
    originals: weakref.WeakKeyDictionary[http.HTTPFlow, Any]


held_answers: weakref.WeakKeyDictionary[http.HTTPFlow, HeldAnswer] = weakref.WeakKeyDictionary()


def held_answer_body(response: http.Response) -> bytes | None:
    """A held error answer's body, decoded within ANSWER_MAX; None when it passed that (it went on streamed, or is
    too long to read) or cannot be decoded."""
    raw = response.raw_content
    if raw is None or len(raw) > ANSWER_MAX:
        return None
    try:
        return decode_body(raw, response.headers.get("content-encoding"), ANSWER_MAX)
    except DecodeError:
        return None


_extended_by = 0  # the addons running with the size check extended: mitmproxy's is back when none is left
_mitmproxy_check: Callable[..., Any] | None = None  # HttpStream's own size check, while extended
_extended_check: Callable[..., Any] | None = None  # what HttpStream runs instead, while extended


def extend_size_check() -> bool:
    """Make mitmproxy stop buffering a held answer at ANSWER_MAX and stream it from there: its headers and the held
    part go to the client, then the rest as it comes. mitmproxy does this for every answer over its global
    stream_large_bodies, and only buffering holds back an answer's headers (a stream callable gets the body after
    they are sent), so its size check is extended for the flows in `held_answers`. Each call that returns True is
    paired with one `restore_size_check`. False when this mitmproxy's HTTP layer is not built as expected: then
    nothing is changed, and an answer of unknown length is never held."""
    global _extended_by, _mitmproxy_check, _extended_check
    if _extended_by:
        _extended_by += 1
        return True
    stream_class = http_layers.HttpStream
    check = vars(stream_class).get("check_body_size")  # its own method, not one inherited: that is what is put back
    if not inspect.isgeneratorfunction(check) or not callable(getattr(stream_class, "start_response_stream", None)):
        log.warning("trimflow: this mitmproxy's HTTP layer is not as expected: error answers of unknown length are not retried")
        return False

    def check_body_size(self: http_layers.HttpStream, request: bool) -> Generator[commands.Command, Any, bool]:
        stopped = yield from check(self, request)
        if stopped or request:
            return stopped
        held = held_answers.get(self.flow)
        if held is None or self.flow.response is None or self.flow.response.stream or len(self.response_body_buf) <= ANSWER_MAX:
            return stopped
        del held_answers[self.flow]
        held.originals.pop(self.flow, None)  # no retry: the client's body can go
        self.flow.response.stream = held.stream or True
        body = bytes(self.response_body_buf)
        self.response_body_buf.clear()
        yield from self.start_response_stream()
        yield from self.handle_event(http_layers.ResponseData(self.stream_id, body))
        return False

    stream_class.check_body_size = check_body_size  # type: ignore[method-assign]  # extended, see above
    _mitmproxy_check, _extended_check, _extended_by = check, check_body_size, 1
    return True


def size_check_extended() -> bool:
    """Whether mitmproxy's size check streams a held answer past ANSWER_MAX (a hold is running): only then may an
    answer of unknown length be held."""
    return _extended_by > 0


def restore_size_check() -> None:
    """Undo one `extend_size_check` that returned True; after the last, HttpStream runs mitmproxy's own size check
    again (unless someone else has put a method of theirs over the extension since: that one is theirs to undo)."""
    global _extended_by, _mitmproxy_check, _extended_check
    if not _extended_by:
        return
    _extended_by -= 1
    if _extended_by:
        return
    stream_class, own = http_layers.HttpStream, _mitmproxy_check
    if own is not None and vars(stream_class).get("check_body_size") is _extended_check:
        stream_class.check_body_size = own  # type: ignore[method-assign]  # mitmproxy's own, as it was
    _mitmproxy_check = _extended_check = None


# -- a retry sent through mitmproxy's connection machinery


class _Resend(ReplayHandler):
    """Sends one flow upstream through mitmproxy's proxy core, as client replay does, without running the
    addons' HTTP hooks for it: the request already went through them as the original flow."""

    cancelled = False

    async def handle_hook(self, hook: commands.StartHook) -> None:
        if isinstance(hook, _FLOW_HOOKS) and hook.args()[0] is self.flow:
            if isinstance(hook, (http_layers.HttpResponseHook, http_layers.HttpErrorHook)):
                handlers = [t.handler for t in self.transports.values() if t.handler]
                for handler in handlers:
                    handler.cancel()
                if handlers:
                    await asyncio.wait(handlers)
                self.done.set()
            return
        await super().handle_hook(hook)

    def cancel(self) -> None:
        """Ends the retry at once: its upstream connection closes (or stops opening), and `replay` returns."""
        self.cancelled = True
        for transport in self.transports.values():
            if transport.handler:
                transport.handler.cancel(CLIENT_GONE)
        self.done.set()


_retries: dict[str, set[_Resend]] = {}  # the retries in flight, by the id of the client connection they answer


async def resend(request: http.Request, client: connection.Client, sni: str | None = None, deadline: float | None = None) -> http.Response | str:
    """The upstream's answer to `request`, sent for `client` (the original flow's), or why there is none. `sni`: the
    server name the original request's TLS connection gave and verified (mitmproxy's replay would take the Host
    header, which the client chose and the upstream's certificate need not name).
    A retry for a client that has closed its connection is not sent, and one in flight when it closes is cancelled
    (`cancel_retries`); so is one without an answer `deadline` seconds after it started (TIMED_OUT)."""
    if not client.state & ConnectionState.CAN_READ:
        return CLIENT_GONE
    retry = http.HTTPFlow(client, connection.Server(address=(request.host, request.port)))
    retry.request = request
    retry.is_replay = "request"
    handler = _Resend(retry, ctx.options)
    server = handler.layer.context.server  # the one Server the replay's layers share
    if sni is not None and server.tls:
        server.sni = sni
    running = _retries.setdefault(client.id, set())
    running.add(handler)
    timed_out = False
    replay = asyncio.ensure_future(handler.replay())
    try:
        done, _ = await asyncio.wait({replay}, timeout=deadline)
        if not done:
            timed_out = True
            handler.cancel()
        await replay
    except asyncio.CancelledError:
        handler.cancel()  # the hook waiting for it is cancelled: so is the request it sent
        raise
    finally:
        running.discard(handler)
        if not running and _retries.get(client.id) is running:
            del _retries[client.id]
    if handler.cancelled:
        return TIMED_OUT if timed_out else CLIENT_GONE
    if retry.response is not None:
        return retry.response
    return retry.error.msg if retry.error is not None else "no answer"


def detached_client() -> connection.Client:
    """A client for a request trimflow sends on its own (a deletion when a file's lifetime ends): no connection of a
    client's is behind it, so none closes it."""
    client = connection.Client(peername=("127.0.0.1", 0), sockname=("127.0.0.1", 0))
    client.state = ConnectionState.OPEN
    return client


def cancel_retries(client: connection.Client) -> None:
    """Cancel the retries in flight for `client`, whose connection has closed: nobody is left to read their answers."""
    for handler in _retries.pop(client.id, ()):
        handler.cancel()


__all__ = [
    "CLIENT_GONE",
    "TIMED_OUT",
    "HeldAnswer",
    "cancel_retries",
    "detached_client",
    "extend_size_check",
    "held_answers",
    "resend",
    "restore_size_check",
    "size_check_extended",
]
