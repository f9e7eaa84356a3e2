"""JSON in and out: orjson for speed, the standard library for what orjson refuses.

orjson reads integers over 64 bits as floats and rejects NaN, Infinity and nesting deeper than 1024;
those bodies are still valid for many servers, so they go to `json`, which keeps them exact, instead
of failing the request or changing a value.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

from .errors import BodyError

# A number stands after ':', ',' or '[', with spaces or a sign between. Mapped through this table, a digit becomes
# b"0", those three b":", a space or sign b" " and anything else b"x": a long integer shows as b":" then spaces
# then a run of b"0", which bytes.find meets at C speed.
_NUMBER_CONTEXT = bytes(0x30 if 0x30 <= b <= 0x39 else 0x3A if b in b":,[" else 0x20 if b in b" \t\r\n-" else 0x78 for b in range(256))
_LONG_RUN = b"0" * 19  # 2**63 has 19 digits


def loads(body: bytes, exact: bool = True) -> tuple[Any, bool]:
    """The parsed body and whether it needed the fallback parser.

    orjson reads an integer over 64 bits as a float, changing its value: such bodies take the exact parser.
    With `exact=False` they do not (no scan for them), for a caller that checks `may_hold_big_integer`
    before it writes the value back (trimflow._body: ParsedBody.make_exact)."""
    if not (exact and may_hold_big_integer(body)):
        try:
            return orjson.loads(body), False
        except orjson.JSONDecodeError:
            pass
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(f"body is not UTF-8 (invalid byte at offset {exc.start})") from None
    try:
        return json.loads(text, parse_float=_finite_float), True
    except _Overflow:
        raise BodyError("body has a number too large for a double; a rewrite could not keep it") from None
    except RecursionError:
        raise BodyError("body is JSON nested too deeply to parse") from None
    except json.JSONDecodeError as exc:
        raise BodyError(f"body is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None


def may_hold_big_integer(body: bytes) -> bool:
    """Whether the body may hold an integer of 19 digits or more where a number stands. A digit run in a string
    (an id, a timestamp in a tool's output) does not count unless a colon, comma or bracket comes before it,
    as in quoted JSON: taking it for a number only costs the exact parser's time."""
    marks = body.translate(_NUMBER_CONTEXT)
    if marks[:64].lstrip(b" ")[:1] in (b"0", b"") or b":" + _LONG_RUN in marks:
        return True  # a bare number (or too much space to tell), or a long integer right after its colon
    spaced = b" " + _LONG_RUN
    run = marks.find(spaced)
    for _ in range(64 + len(body) // 8192):
        if run < 0:
            return False
        if marks[max(0, run - 64) : run].rstrip(b" ")[-1:] in (b":", b""):
            return True
        run = marks.find(spaced, run + len(spaced))
    return run >= 0  # too many to look at one by one: the exact parser it is


class _Overflow(Exception):
    pass


def _finite_float(text: str) -> float:
    # 1e400 would read as inf and be written back as Infinity, which is not JSON.
    value = float(text)
    if math.isinf(value):
        raise _Overflow
    return value


def dumps(value: Any, fallback: bool) -> bytes:
    """Compact JSON; with `fallback` the standard library writes what orjson cannot."""
    if not fallback:
        try:
            return orjson.dumps(value)
        except (orjson.JSONEncodeError, TypeError):
            pass
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (from a "\ud800" escape) only survives as an escape.
        return json.dumps(value, separators=(",", ":")).encode("ascii")
    except RecursionError:
        raise BodyError("body is JSON nested too deeply to write") from None
