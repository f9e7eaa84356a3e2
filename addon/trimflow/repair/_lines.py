"""A session file as lines of JSON.

The agents append one JSON value per line. A repair changes a few values inside a few lines; every
other byte (the other lines, and the rest of a changed line) stays as the agent wrote it, because the
new values are spliced into the line's bytes at the spans of the old ones (trimflow._jsonsplice) instead
of the line being written out again by another JSON writer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import _jsoncodec
from ..errors import SessionError


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
