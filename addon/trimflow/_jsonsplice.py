"""JSON text edited in place: the byte span of the value at a JSON path, and new values spliced in at many
paths at once, every other byte (spacing, escapes, key order, number spelling) as it was.

Both callers need the bytes they did not change to stay as they came: the clicks mapping (trimflow._clicks)
changes a few numbers of a provider's answer, a repair (trimflow.repair) a few values of an agent's session
line. `splice` finds every path in one pass over the text, descending only into the containers a path goes
through and stepping over every other value with `find` and a regex, so its cost is linear in the text's size
whatever the number of edits. A key that appears twice names its last occurrence, as JSON.parse, serde_json
and orjson read it. The text is not validated: callers parse it first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from . import _jsoncodec
from ._media import JsonPath


class NoValue(KeyError):
    """The text holds no value at a path (or is not JSON along it)."""


def value_span(raw: bytes, path: JsonPath) -> tuple[int, int]:
    """(start, end) of the value at `path` in the JSON text `raw`. NoValue (a KeyError) when it is not there."""
    return spans(raw, [path])[path]


def splice(raw: bytes, edits: Iterable[tuple[JsonPath, bytes]]) -> bytes:
    """`raw` with the value at each path replaced by the given JSON text; every other byte as it was. ValueError
    when two edits overlap (one path inside another, or the same path twice); NoValue when a path is not there."""
    edits = list(edits)
    found = spans(raw, [path for path, _ in edits])
    pieces: list[bytes] = []
    done = 0
    for start, end, text in sorted((*found[path], text) for path, text in edits):
        pieces += [raw[done:start], text]
        done = end
    pieces.append(raw[done:])
    return b"".join(pieces)


def spans(raw: bytes, paths: Iterable[JsonPath]) -> dict[JsonPath, tuple[int, int]]:
    """The (start, end) of the value at each path, found in one pass. ValueError when the paths overlap."""
    paths = list(paths)
    tree = _tree(paths)
    found: list[tuple[JsonPath, int, int]] = []
    try:
        _walk(raw, _skip_whitespace(raw, 0), tree, (), found)
    except IndexError:
        raise NoValue("the text ends inside a value") from None
    out = {path: (start, end) for path, start, end in found}
    if len(out) < len(paths):
        raise NoValue(next(path for path in paths if path not in out))
    return out


# --- the paths as a tree: what to look for under each container ------------------------------------------------

_Tree = dict[str | int, Any]  # key -> the subtree under it, or _TARGET where a path ends
_TARGET: _Tree = {}


def _tree(paths: Iterable[JsonPath]) -> _Tree | None:
    """The paths as a tree; None for the empty path (the whole text) alone. ValueError when they overlap."""
    root: _Tree = {}
    whole = False
    for path in paths:
        if not path:
            if whole or root:
                raise ValueError("two edits overlap")
            whole = True
            continue
        if whole:
            raise ValueError("two edits overlap")
        node = root
        for key in path[:-1]:
            child = node.setdefault(key, {})
            if child is _TARGET:
                raise ValueError("two edits overlap")
            node = child
        if path[-1] in node:
            raise ValueError("two edits overlap")
        node[path[-1]] = _TARGET
    return None if whole else root


# One step between members: the spaces, the comma or closing bracket, the spaces; an object's key up to its value.
_NEXT = re.compile(rb"[ \t\r\n]*([,\]}])[ \t\r\n]*")
_KEY = re.compile(rb'"([^"\\]*(?:\\.[^"\\]*)*)"[ \t\r\n]*:[ \t\r\n]*', re.DOTALL)


def _walk(raw: bytes, pos: int, tree: _Tree | None, path: JsonPath, found: list[tuple[JsonPath, int, int]]) -> int:
    """The end of the value starting at `pos`, adding to `found` the span of each path of `tree` under it."""
    if tree is None or tree is _TARGET:
        end = _value_end(raw, pos)
        found.append((path, pos, end))
        return end
    opening = raw[pos]
    if opening not in (0x5B, 0x7B):  # [ {
        return _value_end(raw, pos)  # a scalar: nothing under it
    closing = b"]" if opening == 0x5B else b"}"
    pos = _skip_whitespace(raw, pos + 1)
    if raw[pos : pos + 1] == closing:
        return pos + 1
    latest: dict[str, list[tuple[JsonPath, int, int]]] = {}  # a repeated key: its last value counts
    index = 0
    while True:
        key: str | int = index
        if opening == 0x7B:
            named = _KEY.match(raw, pos)
            if named is None:
                raise NoValue(f"expected a key at {pos}")
            text = named.group(1)
            key = text.decode("utf-8", "surrogatepass") if b"\\" not in text else _string_value(text)
            pos = named.end()
        child = tree.get(key)
        if child is None:
            pos = _value_end(raw, pos)
        elif child is _TARGET:  # the usual leaf, without a call of its own
            end = _value_end(raw, pos)
            if opening == 0x5B:
                found.append(((*path, key), pos, end))
            else:
                latest[str(key)] = [((*path, key), pos, end)]
            pos = end
        elif opening == 0x5B:
            pos = _walk(raw, pos, child, (*path, key), found)
        else:
            under: list[tuple[JsonPath, int, int]] = []
            latest[str(key)] = under
            pos = _walk(raw, pos, child, (*path, key), under)
        step = _NEXT.match(raw, pos)
        separator = step.group(1) if step is not None else None
        if step is None or (separator != b"," and separator != closing):
            raise NoValue(f"expected , or {closing.decode()} at {pos}")
        if separator == closing:
            for under in latest.values():
                found += under
            return step.start(1) + 1
        pos = step.end()
        index += 1


# --- stepping over values ------------------------------------------------------------------------------------

_SPACE = re.compile(rb"[ \t\r\n]*")
_STRUCTURE = re.compile(rb'["\[\]{}]')
_SCALAR = re.compile(rb"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")


def _skip_whitespace(raw: bytes, pos: int) -> int:
    if pos < len(raw) and raw[pos] > 0x20:  # no space to skip: the usual case, without the regex
        return pos
    match = _SPACE.match(raw, pos)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def _string_value(text: bytes) -> str:
    """The string whose JSON text, quotes left out, is `text` (a key with escapes)."""
    try:
        value, _ = _jsoncodec.loads(b'"' + text + b'"')
    except ValueError:
        raise NoValue("a key that is not a JSON string") from None
    return str(value)


def _string_end(raw: bytes, pos: int) -> int:
    """One past the closing quote of the string starting at `pos`: long strings (base64) are stepped over with find."""
    if raw[pos : pos + 1] != b'"':
        raise NoValue(f"expected a string at {pos}")
    i = pos + 1
    while True:
        quote = raw.find(b'"', i)
        if quote < 0:
            raise NoValue("unterminated string")
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
                raise NoValue("unterminated container")
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
        raise NoValue(f"no JSON value at {pos}")
    return scalar.end()
