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

import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

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


# --- splicing the edits into the JSON text ---------------------------------------------------------------------

_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")


class Malformed(ValueError):
    """The answer is not the JSON its format promises: it passes as it came."""


def splice(text: str, edits: list[Edit]) -> str:
    """`text` (one JSON value) with the number at each edit's path replaced; every other character as it was."""
    spans = sorted(((*_span(text, path), str(value)) for path, value in edits), reverse=True)
    for start, end, number in spans:
        text = text[:start] + number + text[end:]
    return text


def _span(text: str, path: Path) -> tuple[int, int]:
    """Where the value at `path` stands in `text` (the last of repeated keys, as a JSON reader takes it)."""
    start = _skip(text, 0)
    for key in path:
        found = None
        for member, value_start, value_end in _children(text, start):
            if member == key:
                found = (value_start, value_end)
        if found is None:
            raise Malformed(f"no value at {path}")
        start = found[0]
    try:
        _, end = _DECODER.raw_decode(text, start)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise Malformed(f"not JSON: {type(exc).__name__}") from None
    return start, end


def _skip(text: str, i: int) -> int:
    match = _SPACE.match(text, i)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def _children(text: str, i: int) -> Iterator[tuple[str | int, int, int]]:
    """(key or index, start, end) of each member of the object or array starting at `i`."""
    try:
        opening = text[i]
        closing = {"{": "}", "[": "]"}[opening]
        i = _skip(text, i + 1)
        if text[i] == closing:
            return
        index = 0
        while True:
            key: str | int = index
            if opening == "{":
                key, i = _DECODER.raw_decode(text, i)
                i = _skip(text, i)
                if not isinstance(key, str) or text[i] != ":":
                    raise Malformed("not an object member")
                i = _skip(text, i + 1)
            _, end = _DECODER.raw_decode(text, i)
            yield key, i, end
            index += 1
            i = _skip(text, end)
            if text[i] == closing:
                return
            if text[i] != ",":
                raise Malformed("no comma between members")
            i = _skip(text, i + 1)
    except (IndexError, KeyError, json.JSONDecodeError, RecursionError) as exc:
        raise Malformed(f"not JSON: {type(exc).__name__}") from None


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
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Malformed("not UTF-8") from exc
    return splice(text, edits).encode("utf-8"), calls


# --- server-sent events ----------------------------------------------------------------------------------------

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_DATA = re.compile(rb"^data: ?(.*?)\r?$", re.MULTILINE)
MAX_EVENT = 8 * 2**20  # an event (or a computer call's held input) larger than this is passed on as it comes


@dataclass(slots=True)
class _Event:
    """One server-sent event as it came: the bytes before its data, its data (one `data:` line), the bytes after."""

    before: bytes
    data: str
    after: bytes

    @classmethod
    def read(cls, raw: bytes) -> _Event | None:
        """None when the event has no data line, more than one, or data that is not UTF-8."""
        lines = list(_DATA.finditer(raw))
        if len(lines) != 1:
            return None
        match = lines[0]
        try:
            data = match.group(1).decode("utf-8")
        except UnicodeDecodeError:
            return None
        return cls(raw[: match.start(1)], data, raw[match.end(1) :])

    def with_data(self, data: str) -> bytes:
        return self.before + data.encode("utf-8") + self.after


@dataclass(slots=True)
class _Held:
    """An Anthropic computer tool_use block while its input streams: the raw events held back, its first delta
    (the framing the mapped one is written in), its JSON so far."""

    events: list[bytes]
    first_delta: _Event | None = None
    fragments: list[str] = field(default_factory=list)
    size: int = 0


class ClickStream:
    """A streamed answer (server-sent events) in, the same events out with the computer-tool coordinates mapped.
    `feed(chunk)` returns the bytes to send on; `feed(b"")` at the end returns what is still held.

    Anthropic: a computer tool_use block's `input_json_delta` fragments are held until its content_block_stop, then
    sent as one delta of the mapped input. OpenAI Responses: each event that carries a `computer_call` item
    (output_item.added/done, response.completed, ...) is mapped. Other events pass byte for byte. What cannot be
    read passes as it came, and `problem` names why (the first time; `on_problem` is told)."""

    def __init__(self, screen: Screen, on_problem: Callable[[str], None] | None = None) -> None:
        self.screen = screen
        self.mapped = 0  # computer calls whose coordinates were mapped
        self.problem: str | None = None
        self._on_problem = on_problem
        self._anthropic = screen.fmt == anthropic.NAME
        self._buffer = b""
        self._held: dict[int, _Held] = {}  # by content block index (Anthropic)
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
        while (match := _EVENT_END.search(self._buffer)) is not None:
            raw, self._buffer = self._buffer[: match.end()], self._buffer[match.end() :]
            try:
                out.append(self._event(raw))
            except Exception as exc:  # noqa: BLE001 - the answer must reach the client whatever it holds
                held, self._held = b"".join(b"".join(h.events) for h in self._held.values()), {}
                self._give_up(f"internal error {type(exc).__name__}")
                return b"".join(out) + held + raw + self._flush()
        if len(self._buffer) > MAX_EVENT:
            self._give_up("an event over the size a computer call is read at")
            out.append(self._flush())
        return b"".join(out)

    def _give_up(self, why: str) -> None:
        """From here on everything passes as it comes."""
        self._passing = True
        self._report(why)

    def _flush(self) -> bytes:
        """Everything still held or buffered, as it came."""
        held = b"".join(b"".join(h.events) for h in self._held.values())
        out, self._buffer, self._held = held + self._buffer, b"", {}
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
        event = _Event.read(raw)
        try:
            if event is None:
                raise Malformed("an event without one data line of UTF-8")
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
            if isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") == self.screen.tool:
                self._held[index] = _Held([raw], size=len(raw))
                return b""
            return raw
        held = self._held.get(index)
        if held is None:
            return raw
        if kind == "content_block_delta":
            delta = data.get("delta")
            if not isinstance(delta, dict) or delta.get("type") != "input_json_delta" or not isinstance(delta.get("partial_json"), str):
                return self._release(index, raw, "a computer call delta that is not input_json_delta")
            held.events.append(raw)
            held.first_delta = held.first_delta or event
            held.fragments.append(delta["partial_json"])
            held.size += len(raw)
            if held.size > MAX_EVENT:
                return self._release(index, b"", "a computer call's input over the size it is read at")
            return b""
        if kind == "content_block_stop":
            return self._close(index, raw)
        return raw

    def _release(self, index: int, raw: bytes, why: str) -> bytes:
        """The held block's events as they came, then `raw`: this block is not mapped."""
        held = self._held.pop(index)
        self._report(why)
        return b"".join(held.events) + raw

    def _close(self, index: int, stop: bytes) -> bytes:
        held = self._held[index]
        text = "".join(held.fragments)
        try:
            edits = input_edits(self.screen, _loads(text)) if text else []
            mapped = splice(text, edits)
        except Malformed as exc:
            return self._release(index, stop, f"a computer call's input that cannot be read ({exc})")
        del self._held[index]
        if not edits or held.first_delta is None:
            return b"".join(held.events) + stop
        self.mapped += 1
        delta = {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": mapped}}
        return held.events[0] + held.first_delta.with_data(orjson.dumps(delta).decode("utf-8")) + stop

    def _responses_event(self, raw: bytes, event: _Event) -> bytes:
        data = _loads(event.data)
        if not isinstance(data, dict):
            return raw
        edits: list[Edit] = []
        items: list[Any] = []
        if isinstance(data.get("item"), dict):
            items.append(data["item"])
            edits += call_edits(self.screen, data["item"], ("item",))
        response = data.get("response")
        if isinstance(response, dict) and isinstance(response.get("output"), list):
            items += response["output"]
            edits += [(("response", *path), value) for path, value in answer_edits(self.screen, response)[0]]
        if not edits:
            return raw
        for item in items:
            if isinstance(item, dict) and call_edits(self.screen, item):
                key = str(item.get("call_id") or item.get("id"))
                if key not in self._counted:
                    self._counted.add(key)
                    self.mapped += 1
        return event.with_data(splice(event.data, edits))
