"""Computer-use clicks mapped back: when trimflow sent the newest screenshot of a computer-use request at other
dimensions than the agent took it, the coordinates in the model's computer-tool calls are in the pixels of the
image the model saw; this module maps them to the pixels the model would have answered in for the original, so
the agent clicks where the model meant (docs/providers.md, "Computer use: the pixels a click refers to").

- `screen_for` (the engine): the request declares a computer tool and its newest screenshot went rescaled: the
  `Screen` its answer's coordinates map through; None when nothing needs mapping.
- `map_answer` (a JSON answer) and `ClickStream` (a streamed one, server-sent events): every coordinate of the
  model's computer-tool calls mapped, rounded and clamped to the original screen. Every other byte of the answer
  (text, other tool calls, framing) is left as it came: the new numbers are spliced in where the old ones stood.

Which pixels a model reads coordinates in (`view_of`): Claude, those of the image after the API's own resize to
the model's native resolution (so a screenshot over it reads the same whether trimflow shrank it or not); OpenAI,
those of the screenshot as sent. Pure Python: the proxy's clicks addon (trimflow.proxy.clicks) drives it.
"""

from __future__ import annotations

import math
import re
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from ._jsonsplice import splice
from ._tokens import anthropic_native_size, claude_tier
from .formats import anthropic, openai_responses

Size = tuple[int, int]
Path = tuple[str | int, ...]

# Anthropic's computer tool types are `computer_YYYYMMDD`; OpenAI's are these.
_ANTHROPIC_TOOL = re.compile(r"computer_\d{8}")
_OPENAI_TOOLS = frozenset(("computer_use_preview", "computer-preview", "computer", "computer_use"))
# Keys of an Anthropic computer tool's input that hold a point [x, y], or a region [x1, y1, x2, y2] (zoom).
_POINT_KEYS = ("coordinate", "start_coordinate", "region")
_CALL = "computer_call"


@dataclass(frozen=True, slots=True)
class Screen:
    """How one answer's coordinates map: from `seen` (the pixels the model read coordinates in for the screenshot as
    trimflow sent it) to `target` (those it would have read them in for the original). `tool`: the name of the
    Anthropic computer tool whose calls carry them (None for OpenAI Responses, whose computer calls are items)."""

    fmt: str
    tool: str | None
    seen: Size
    target: Size

    def point(self, x: float, y: float) -> tuple[int, int]:
        """A point the model gave, in the target's pixels: rounded, and clamped to the target screen."""
        (sw, sh), (tw, th) = self.seen, self.target
        # Clamped to the image first: a number no screen holds cannot overflow the product.
        x, y = min(max(x, 0), sw), min(max(y, 0), sh)
        return _clamp(round(x * tw / sw), tw), _clamp(round(y * th / sh), th)


def _clamp(value: int, size: int) -> int:
    return min(max(value, 0), size - 1)


def view_of(fmt: str, model: str | None, size: Size) -> Size:
    """The pixels a model of `fmt` reads coordinates in for an image sent at `size` (docs/providers.md)."""
    if fmt != anthropic.NAME:
        return size  # OpenAI: the screenshot as sent
    return anthropic_native_size(*size, *claude_tier(model))  # Claude: its own resize (trimflow._tokens)


def computer_tool(fmt: str, body: dict[str, Any]) -> str | None:
    """The computer tool the request declares: its name (Anthropic), `computer_call` (OpenAI Responses); else None."""
    if fmt == openai_responses.NAME:
        body = openai_responses.request_of(body)[0]
    tools = body.get("tools")
    if not isinstance(tools, list):
        return None
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            continue
        if fmt == anthropic.NAME and _ANTHROPIC_TOOL.fullmatch(tool["type"]) and isinstance(tool.get("name"), str):
            return str(tool["name"])
        if fmt == openai_responses.NAME and tool["type"] in _OPENAI_TOOLS:
            return _CALL
    return None


def screen_for(fmt: str, body: dict[str, Any], model: str | None, original: Size, sent: Size) -> Screen | None:
    """The Screen of a request whose newest screenshot went at `sent` instead of `original`, when it declares a
    computer tool and the model reads the two in different pixels; else None."""
    tool = computer_tool(fmt, body)
    if tool is None or min(*original, *sent) <= 0:
        return None
    seen, target = view_of(fmt, model, sent), view_of(fmt, model, original)
    if seen == target:
        return None  # e.g. Claude resizes both to the same native size: the answer reads the same
    return Screen(fmt, tool if fmt == anthropic.NAME else None, seen, target)


# --- what to change: (path, new integer) edits over a parsed value --------------------------------------------

Edit = tuple[Path, int]


def _point_edits(screen: Screen, path: Path, point: Any) -> list[Edit]:
    """Edits for a point [x, y] or region [x1, y1, x2, y2] at `path` (an Anthropic input value)."""
    if not isinstance(point, list) or len(point) not in (2, 4) or not all(_is_number(v) for v in point):
        return []
    edits: list[Edit] = []
    for i in range(0, len(point), 2):
        x, y = screen.point(point[i], point[i + 1])
        edits += [((*path, i), x), ((*path, i + 1), y)]
    return edits


def _xy_edits(screen: Screen, path: Path, holder: Any) -> list[Edit]:
    """Edits for an object with `x` and `y` at `path` (an OpenAI action or a drag path's point)."""
    if not isinstance(holder, dict) or not _is_number(holder.get("x")) or not _is_number(holder.get("y")):
        return []
    x, y = screen.point(holder["x"], holder["y"])
    return [((*path, "x"), x), ((*path, "y"), y)]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def input_edits(screen: Screen, tool_input: Any, path: Path = ()) -> list[Edit]:
    """Edits for an Anthropic computer tool's input at `path`."""
    if not isinstance(tool_input, dict):
        return []
    return [edit for key in _POINT_KEYS if key in tool_input for edit in _point_edits(screen, (*path, key), tool_input[key])]


def call_edits(screen: Screen, item: Any, path: Path = ()) -> list[Edit]:
    """Edits for an OpenAI `computer_call` item at `path`: its `action`, or each of its `actions`."""
    if not isinstance(item, dict) or item.get("type") != _CALL:
        return []
    actions: list[tuple[Path, Any]] = [((*path, "action"), item.get("action"))]
    if isinstance(item.get("actions"), list):
        actions += [((*path, "actions", i), action) for i, action in enumerate(item["actions"])]
    edits: list[Edit] = []
    for where, action in actions:
        if not isinstance(action, dict):
            continue
        edits += _xy_edits(screen, where, action)
        if isinstance(action.get("path"), list):
            for j, point in enumerate(action["path"]):
                edits += _xy_edits(screen, (*where, "path", j), point)
    return edits


def answer_edits(screen: Screen, answer: Any) -> tuple[list[Edit], int]:
    """The edits of a whole answer (a Messages message, a Responses response) and how many calls they map."""
    if not isinstance(answer, dict):
        return [], 0
    edits: list[Edit] = []
    calls = 0
    if screen.fmt == anthropic.NAME:
        for i, block in enumerate(answer.get("content") or []):
            if isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") == screen.tool:
                found = input_edits(screen, block.get("input"), ("content", i, "input"))
                edits += found
                calls += bool(found)
    else:
        for i, item in enumerate(answer.get("output") or []):
            found = call_edits(screen, item, ("output", i))
            edits += found
            calls += bool(found)
    return edits, calls


# --- applying the edits to the JSON text ---------------------------------------------------------------------


class Malformed(ValueError):
    """The answer is not the JSON its format promises: it passes as it came."""


def apply(raw: bytes, edits: list[Edit]) -> bytes:
    """`raw` (one JSON value) with the number at each edit's path replaced; every other byte as it was. One pass over
    the text whatever the number of edits (trimflow._jsonsplice)."""
    try:
        return splice(raw, [(path, b"%d" % value) for path, value in edits])
    except (KeyError, ValueError) as exc:  # NoValue (a KeyError), overlapping edits
        raise Malformed(f"no value where a coordinate was read ({type(exc).__name__})") from None


def _loads(data: bytes | str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise Malformed("not JSON") from exc


def map_answer(screen: Screen, body: bytes) -> tuple[bytes, int]:
    """A JSON answer with its computer-tool coordinates mapped, and the number of calls mapped (the same bytes
    object when there is none). Raises Malformed when the answer cannot be read."""
    edits, calls = answer_edits(screen, _loads(body))
    if not edits:
        return body, 0
    return apply(body, edits), calls


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
            relevant = _CALL.encode() in raw
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
        data = _loads(event.data)
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
            edits = input_edits(self.screen, _loads(text)) if text else []
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
        data = _loads(event.data)
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
