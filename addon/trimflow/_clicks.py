"""Computer-use clicks mapped back: when trimflow sent the newest screenshot of a computer-use request at other
dimensions than the agent took it, the coordinates in the model's computer-tool calls are in the pixels of the
image the model saw; this module maps them to the pixels the model would have answered in for the original, so
the agent clicks where the model meant (docs/providers.md, "Computer use: the pixels a click refers to").

- `screen_for` (the engine): the request declares a computer tool and its newest screenshot went rescaled: the
  `Screen` its answer's coordinates map through; None when nothing needs mapping.
- `map_answer` (a JSON answer; a streamed one: trimflow._click_stream): every coordinate of the
  model's computer-tool calls mapped, rounded and clamped to the original screen. Every other byte of the answer
  (text, other tool calls, framing) is left as it came: the new numbers are spliced in where the old ones stood.

Which pixels a model reads coordinates in (`view_of`): Claude, those of the image after the API's own resize to
the model's native resolution (so a screenshot over it reads the same whether trimflow shrank it or not); OpenAI,
those of the screenshot as sent. Pure Python: the proxy's clicks addon (trimflow.proxy.clicks) drives it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
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
COMPUTER_CALL = "computer_call"  # an OpenAI Responses computer call item's type


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
            return COMPUTER_CALL
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
    if not isinstance(item, dict) or item.get("type") != COMPUTER_CALL:
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


def read_json(data: bytes | str) -> Any:
    """An answer's JSON (or an event's, or a tool input's); Malformed when it is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise Malformed("not JSON") from exc


def map_answer(screen: Screen, body: bytes) -> tuple[bytes, int]:
    """A JSON answer with its computer-tool coordinates mapped, and the number of calls mapped (the same bytes
    object when there is none). Raises Malformed when the answer cannot be read."""
    edits, calls = answer_edits(screen, read_json(body))
    if not edits:
        return body, 0
    return apply(body, edits), calls
