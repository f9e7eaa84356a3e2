"""Computer-use clicks mapped back in a streamed answer (server-sent events), within bounds on what is held.

`ClickStream` maps each event's computer-tool coordinates through the `Screen` trimflow._clicks worked out for the
request, with the edits and the splice of that module, as the events pass on mitmproxy's event loop. What it holds
while a computer call streams is bounded twice: MAX_HELD for one answer, and one `HeldBytes` budget shared by every
answer of the process (JSON answers mapped in worker threads take their share of it too).
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from ._clicks import COMPUTER_CALL, Edit, Malformed, Path, Screen, apply, call_edits, input_edits, read_json
from .formats import anthropic

# --- what is held: one bound per answer, one budget across answers -------------------------------------------

MAX_HELD = 8 * 2**20  # bytes one answer may hold while its computer calls are read (events, held blocks)
HELD_BUDGET = 64 * 2**20  # bytes all answers of the process may hold together


class HeldBytes:
    """The bytes click mapping holds across every answer of the process, against one `limit`. Each answer holds
    its share through a `Lease`; a lease dropped without being closed (a flow that ends mid-stream) gives its
    share back when it is collected, so no answer can leak budget."""

    def __init__(self, limit: int = HELD_BUDGET) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()  # JSON answers are mapped in worker threads

    def lease(self) -> Lease:
        return Lease(self)

    def _resize(self, share: list[int], size: int) -> bool:
        with self._lock:
            if size > share[0] and self.held + size - share[0] > self.limit:
                return False
            self.held += size - share[0]
            share[0] = size
            return True


class Lease:
    """One answer's share of a HeldBytes budget."""

    __slots__ = ("__weakref__", "_budget", "_share")

    def __init__(self, budget: HeldBytes) -> None:
        self._budget = budget
        self._share = [0]
        weakref.finalize(self, budget._resize, self._share, 0)

    @property
    def size(self) -> int:
        return self._share[0]

    def resize(self, size: int) -> bool:
        """Hold `size` bytes in all; False (and the share unchanged) when the budget cannot give that much."""
        return self._budget._resize(self._share, size)

    def close(self) -> None:
        self._budget._resize(self._share, 0)


# The Python work of mapping a JSON text grows with its quotes, brackets, braces and commas (the members the
# splice steps through, the points mapped); its strings are stepped over at C speed. A streamed event (or a held
# block's input) is mapped on mitmproxy's event loop, so one with more of them than this is not mapped.
MAX_STRUCTURE = 50_000


def structure(text: bytes | str) -> int:
    """How many quotes, brackets, braces and commas `text` holds (a count at C speed, strings included)."""
    if isinstance(text, str):
        return text.count('"') + text.count("[") + text.count("{") + text.count(",")
    return text.count(b'"') + text.count(b"[") + text.count(b"{") + text.count(b",")


OVER_ANSWER = f"over the {MAX_HELD // 2**20} MiB one answer may hold while its clicks are read"
OVER_BUDGET = "over the memory all answers may hold while their clicks are read"
OVER_STRUCTURE = f"a computer call in an event of over {MAX_STRUCTURE:,} quotes, brackets and commas, too many to map on the event loop"


class _GiveUp(Exception):
    """The rest of the answer passes as it came, for the reason given."""


# --- server-sent events ----------------------------------------------------------------------------------------

_EVENT_ENDS = (b"\n\n", b"\r\n\r\n", b"\r\r")
_DATA = re.compile(rb"^data: ?(.*?)\r?$", re.MULTILINE)


def _event_end(buffer: bytearray, start: int) -> int:
    """One past the end of the first whole event in `buffer` (its blank line) looked for from `start`; -1 when there
    is none. Finds at memchr speed, where one regex of the three would step byte by byte; each after the first looks
    only before what was found, so finding every event of a buffer stays linear in its size."""
    first, length = len(buffer), 0
    for end in _EVENT_ENDS:
        at = buffer.find(end, start, first + len(end) - 1)
        if at >= 0:
            first, length = at, len(end)
    return first + length if length else -1


@dataclass(slots=True)
class _Event:
    """One server-sent event as it came: the bytes before its data, its data (one `data:` line), the bytes after."""

    before: bytes
    data: bytes
    after: bytes

    @classmethod
    def read(cls, raw: bytes) -> _Event | None:
        """None when the event has no data line, or more than one."""
        lines = list(_DATA.finditer(raw))
        if len(lines) != 1:
            return None
        match = lines[0]
        return cls(raw[: match.start(1)], match.group(1), raw[match.end(1) :])

    def with_data(self, data: bytes) -> bytes:
        return self.before + data + self.after


@dataclass(slots=True)
class _HeldToolUse:
    """An Anthropic computer tool_use block while its input streams: the raw events held back, its first delta
    (the framing the mapped one is written in), its JSON so far, the bytes all of it takes and its structure."""

    events: list[bytes]
    first_delta: _Event | None = None
    fragments: list[str] = field(default_factory=list)
    size: int = 0
    structure: int = 0


class ClickStream:
    """A streamed answer (server-sent events) in, the same events out with the computer-tool coordinates mapped.
    `feed(chunk)` returns the bytes to send on; `feed(b"")` at the end returns what is still held.

    Anthropic: a computer tool_use block's `input_json_delta` fragments are held until its content_block_stop, then
    sent as one delta of the mapped input. OpenAI Responses: each event that carries a `computer_call` item
    (output_item.added/done, response.completed, ...) is mapped. Other events pass byte for byte. What cannot be
    read passes as it came, and `problem` names why (the first time; `on_problem` is told).

    What it holds (the part of an event not yet whole, the held blocks) is bounded: MAX_HELD for this answer, and
    the `budget` shared by every answer. Past either, everything held goes on as it came and the rest of the answer
    passes unmapped. Each event is mapped in one pass over it, on the caller's thread (mitmproxy's event loop)."""

    def __init__(self, screen: Screen, on_problem: Callable[[str], None] | None = None, budget: HeldBytes | None = None) -> None:
        self.screen = screen
        self.mapped = 0  # computer calls whose coordinates were mapped
        self.problem: str | None = None
        self._on_problem = on_problem
        self._anthropic = screen.fmt == anthropic.NAME
        self._lease = (budget or HeldBytes()).lease()
        self._buffer = bytearray()  # the events not yet whole
        self._searched = 0  # how far the buffer holds no event's end
        self._held: dict[int, _HeldToolUse] = {}  # by content block index (Anthropic)
        self._held_size = 0  # the bytes of every held block
        self._counted: set[str] = set()  # computer_call ids counted (OpenAI repeats an item in several events)
        self._passing = False  # given up: everything passes as it comes

    def __call__(self, chunk: bytes) -> list[bytes]:
        """As mitmproxy's stream callable: a list, empty while events are held (mitmproxy would send an empty
        bytes as a chunk of its own, and in a chunked answer that is the end of the body)."""
        out = self.feed(chunk)
        return [out] if out else []

    def feed(self, chunk: bytes) -> bytes:
        if self._passing or not chunk:
            return chunk + self._flush()
        self._buffer += chunk
        out: list[bytes] = []
        while (end := _event_end(self._buffer, self._searched)) >= 0:
            raw = bytes(self._buffer[:end])
            del self._buffer[:end]
            self._searched = 0
            try:
                out.append(self._event(raw))
            except _GiveUp as exc:
                self._give_up(str(exc))
                return b"".join(out) + self._flush(raw)
            except Exception as exc:  # noqa: BLE001 - the answer must reach the client whatever it holds
                self._give_up(f"internal error {type(exc).__name__}")
                return b"".join(out) + self._flush(raw)
        self._searched = max(0, len(self._buffer) - 3)  # an event's end may be cut between two chunks
        held = self._held_size + len(self._buffer)
        if held > MAX_HELD or not self._lease.resize(held):
            self._give_up(OVER_ANSWER if held > MAX_HELD else OVER_BUDGET)
            out.append(self._flush())
        return b"".join(out)

    def close(self) -> None:
        """The answer ended without its last chunk (an error): what was held is let go."""
        self._held, self._held_size, self._buffer = {}, 0, bytearray()
        self._lease.close()

    def _give_up(self, why: str) -> None:
        """From here on everything passes as it comes."""
        self._passing = True
        self._report(why)

    def _flush(self, raw: bytes = b"") -> bytes:
        """Everything still held, then `raw`, then what is buffered: as it came."""
        held = [event for block in self._held.values() for event in block.events]
        out = b"".join([*held, raw, self._buffer])
        self.close()
        return out

    def _report(self, why: str) -> None:
        if self.problem is None:
            self.problem = why
            if self._on_problem is not None:
                self._on_problem(why)

    def _event(self, raw: bytes) -> bytes:
        if self._anthropic:
            relevant = bool(self._held) or b"content_block_start" in raw
        else:
            relevant = COMPUTER_CALL.encode() in raw
        if not relevant:
            return raw
        if structure(raw) > MAX_STRUCTURE:
            raise _GiveUp(OVER_STRUCTURE)
        event = _Event.read(raw)
        try:
            if event is None:
                raise Malformed("an event without one data line")
            return self._anthropic_event(raw, event) if self._anthropic else self._responses_event(raw, event)
        except Malformed as exc:
            self._report(str(exc))
            return raw

    def _anthropic_event(self, raw: bytes, event: _Event) -> bytes:
        data = read_json(event.data)
        if not isinstance(data, dict):
            return raw
        kind, index = data.get("type"), data.get("index")
        if not isinstance(index, int):
            return raw
        if kind == "content_block_start":
            block = data.get("content_block")
            if isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") == self.screen.tool and index not in self._held:
                self._held[index] = _HeldToolUse([raw], size=len(raw))
                self._held_size += len(raw)
                return b""
            return raw
        held = self._held.get(index)
        if held is None:
            return raw
        if kind == "content_block_delta":
            delta = data.get("delta")
            if not isinstance(delta, dict) or delta.get("type") != "input_json_delta" or not isinstance(delta.get("partial_json"), str):
                return self._release(index, raw, "a computer call delta that is not input_json_delta")
            held.structure += structure(delta["partial_json"])
            if held.structure > MAX_STRUCTURE:
                raise _GiveUp(OVER_STRUCTURE)
            held.events.append(raw)
            held.first_delta = held.first_delta or event
            held.fragments.append(delta["partial_json"])
            grown = len(raw) + len(delta["partial_json"])
            held.size += grown
            self._held_size += grown
            return b""
        if kind == "content_block_stop":
            return self._close(index, raw)
        return raw

    def _release(self, index: int, raw: bytes, why: str) -> bytes:
        """The held block's events as they came, then `raw`: this block is not mapped."""
        held = self._pop(index)
        self._report(why)
        return b"".join(held.events) + raw

    def _pop(self, index: int) -> _HeldToolUse:
        held = self._held.pop(index)
        self._held_size -= held.size
        return held

    def _close(self, index: int, stop: bytes) -> bytes:
        held = self._held[index]
        try:
            text = "".join(held.fragments).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no JSON writer would write it back
            return self._release(index, stop, "a computer call's input that cannot be read (not UTF-8)")
        try:
            edits = input_edits(self.screen, read_json(text)) if text else []
            mapped = apply(text, edits)
        except Malformed as exc:
            return self._release(index, stop, f"a computer call's input that cannot be read ({exc})")
        self._pop(index)
        if not edits or held.first_delta is None:
            return b"".join(held.events) + stop
        self.mapped += 1
        delta = {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": mapped.decode("utf-8")}}
        return held.events[0] + held.first_delta.with_data(orjson.dumps(delta)) + stop

    def _responses_event(self, raw: bytes, event: _Event) -> bytes:
        data = read_json(event.data)
        if not isinstance(data, dict):
            return raw
        items: list[tuple[Path, Any]] = []
        if isinstance(data.get("item"), dict):
            items.append((("item",), data["item"]))
        response = data.get("response")
        if isinstance(response, dict) and isinstance(response.get("output"), list):
            items += [(("response", "output", i), item) for i, item in enumerate(response["output"])]
        edits: list[Edit] = []
        for path, item in items:
            found = call_edits(self.screen, item, path)
            if found:
                edits += found
                key = str(item.get("call_id") or item.get("id"))
                if key not in self._counted:
                    self._counted.add(key)
                    self.mapped += 1
        if not edits:
            return raw
        return event.with_data(apply(event.data, edits))
