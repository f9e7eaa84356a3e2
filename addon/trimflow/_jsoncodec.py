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

# Every byte but a digit becomes a space: a run of 19 digits then shows as a run of b"0".
_DIGITS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_RUN = b"0" * 19  # 2**63 has 19 digits
_BEFORE_NUMBER = frozenset(b":,[")  # what stands before a number in JSON (spaces aside)


def loads(body: bytes) -> tuple[Any, bool]:
    """The parsed body and whether it needed the fallback parser."""
    # orjson reads an integer over 64 bits as a float, changing its value: such bodies take the exact parser.
    if not _may_hold_big_integer(body):
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


def _may_hold_big_integer(body: bytes) -> bool:
    """Whether the body may hold an integer of 19 digits or more: a run of that many digits where a number
    can stand, after ':', ',' or '[' (or at the start) with spaces and a sign between. A run inside a string
    (an id or a timestamp in a tool's output) is not a number; a run after a colon in quoted JSON may be
    taken for one, which only costs the exact parser's time."""
    digits = body.translate(_DIGITS)
    run = digits.find(_LONG_RUN)
    looked = 0
    while run >= 0:
        looked += 1
        if looked > 16 + len(body) // 2048:
            return True  # too many to look at: the exact parser it is
        start = run - 1 if run > 0 and body[run - 1] == 0x2D else run  # "-"
        before = body[max(0, start - 64) : start].rstrip(b" \t\r\n")
        if not before or before[-1] in _BEFORE_NUMBER:
            return True
        after = digits.find(b" ", run)
        if after < 0:
            return False
        run = digits.find(_LONG_RUN, after)
    return False


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
