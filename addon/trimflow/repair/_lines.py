"""A session file as lines of JSON, and the byte span of a value inside one line.

The agents append one JSON value per line. A repair changes a few values inside a few lines; every
other byte (the other lines, and the rest of a changed line) stays as the agent wrote it, because the
new values are spliced into the line's bytes at the spans of the old ones instead of the line being
written out again by another JSON writer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import _jsoncodec
from ..errors import SessionError
from ..formats import JsonPath


@dataclass(slots=True)
class Line:
    """One line of a session file: its bytes without the newline, and its JSON value (None when blank)."""

    number: int  # 1-based, as an editor shows it
    raw: bytes
    value: Any


def split_lines(data: bytes) -> list[Line]:
    """The file's lines, each parsed. A line that is not JSON is a SessionError; so is a last line with no
    newline that does not parse, which is what an agent killed (or still busy) writing it leaves."""
    pieces = data.split(b"\n")
    complete = pieces[-1] == b""
    if complete:
        pieces.pop()
    lines = []
    for number, raw in enumerate(pieces, start=1):
        if not raw.strip():
            lines.append(Line(number, raw, None))
            continue
        try:
            value, _ = _jsoncodec.loads(raw)
        except _jsoncodec.BodyError as exc:
            if number == len(pieces) and not complete:
                raise SessionError(f"the last line ({number}) is cut short: the agent may still be writing it, or was killed mid-write") from None
            raise SessionError(f"line {number} is not JSON ({_reason(exc)})") from None
        lines.append(Line(number, raw, value))
    return lines


def _reason(exc: Exception) -> str:
    """The codec's reason without its 'body is not JSON' framing: here it is a line."""
    text = str(exc)
    text = text.removeprefix("body is not JSON (").removesuffix(")") if text.startswith("body is not JSON (") else text.removeprefix("body ")
    return text.replace(" at line 1 column ", " at column ")  # the line is the one named


def join_lines(lines: Sequence[Line], ends_with_newline: bool) -> bytes:
    out = b"\n".join(line.raw for line in lines)
    return out + b"\n" if ends_with_newline and lines else out


# --- spans ------------------------------------------------------------------------------------------------

_WHITESPACE = b" \t\r\n"
_STRUCTURE = re.compile(rb'["\[\]{}]')
_SCALAR = re.compile(rb"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")


def value_span(raw: bytes, path: JsonPath) -> tuple[int, int]:
    """(start, end) of the value at `path` in the JSON text `raw`. A key that appears twice names its last
    occurrence, as JSON.parse, serde_json and orjson read it. KeyError when the path is not there."""
    pos = _skip_whitespace(raw, 0)
    for key in path:
        pos = _child(raw, pos, key)
    return pos, _value_end(raw, pos)


def splice(raw: bytes, edits: Iterable[tuple[JsonPath, bytes]]) -> bytes:
    """`raw` with the value at each path replaced by the given JSON text; every other byte as it was."""
    spans = sorted(((*value_span(raw, path), text) for path, text in edits), reverse=True)
    out = raw
    previous_start = len(raw) + 1
    for start, end, text in spans:
        if end > previous_start:
            raise ValueError("two edits of one line overlap")
        out = out[:start] + text + out[end:]
        previous_start = start
    return out


def _skip_whitespace(raw: bytes, pos: int) -> int:
    while pos < len(raw) and raw[pos] in _WHITESPACE:
        pos += 1
    return pos


def _expect(raw: bytes, pos: int, char: bytes) -> int:
    if raw[pos : pos + 1] != char:
        raise KeyError(f"expected {char.decode()} at {pos}")
    return pos + 1


def _child(raw: bytes, pos: int, key: str | int) -> int:
    """The start of the member `key` of the object (or element `key` of the array) starting at `pos`."""
    opening = raw[pos : pos + 1]
    if isinstance(key, int):
        if opening != b"[":
            raise KeyError(key)
        for index, start in enumerate(_members(raw, pos, b"]")):
            if index == key:
                return start
        raise KeyError(key)
    if opening != b"{":
        raise KeyError(key)
    found = None
    for start in _members(raw, pos, b"}"):
        key_end = _string_end(raw, start)
        if _string_value(raw[start:key_end]) == key:
            found = _skip_whitespace(raw, _expect(raw, _skip_whitespace(raw, key_end), b":"))
    if found is None:
        raise KeyError(key)
    return found


def _members(raw: bytes, pos: int, closing: bytes) -> Iterable[int]:
    """The start of each member (an object's key, an array's element) of the container at `pos`."""
    pos = _skip_whitespace(raw, pos + 1)
    if raw[pos : pos + 1] == closing:
        return
    while True:
        yield pos
        if closing == b"}":
            pos = _skip_whitespace(raw, _expect(raw, _skip_whitespace(raw, _string_end(raw, pos)), b":"))
        pos = _skip_whitespace(raw, _value_end(raw, pos))
        if raw[pos : pos + 1] == closing:
            return
        pos = _skip_whitespace(raw, _expect(raw, pos, b","))


def _string_value(text: bytes) -> str:
    if b"\\" not in text:
        return text[1:-1].decode("utf-8", "surrogatepass")
    value, _ = _jsoncodec.loads(text)
    return str(value)


def _string_end(raw: bytes, pos: int) -> int:
    """One past the closing quote of the string starting at `pos`: the long base64 strings are skipped with find."""
    if raw[pos : pos + 1] != b'"':
        raise KeyError(f"expected a string at {pos}")
    i = pos + 1
    while True:
        quote = raw.find(b'"', i)
        if quote < 0:
            raise KeyError("unterminated string")
        backslashes = 0
        while raw[quote - 1 - backslashes] == 0x5C:
            backslashes += 1
        if backslashes % 2 == 0:
            return quote + 1
        i = quote + 1


def _value_end(raw: bytes, pos: int) -> int:
    first = raw[pos : pos + 1]
    if first == b'"':
        return _string_end(raw, pos)
    if first in (b"{", b"["):
        depth = 0
        while True:
            found = _STRUCTURE.search(raw, pos)
            if found is None:
                raise KeyError("unterminated container")
            char, pos = found.group(), found.start()
            if char == b'"':
                pos = _string_end(raw, pos)
                continue
            depth += 1 if char in (b"{", b"[") else -1
            pos += 1
            if depth == 0:
                return pos
    scalar = _SCALAR.match(raw, pos)
    if scalar is None:
        raise KeyError(f"no JSON value at {pos}")
    return scalar.end()
