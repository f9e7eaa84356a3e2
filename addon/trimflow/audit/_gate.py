"""The audit's CI gate: `--fail-on` expressions, each a condition that fails the build when it is true.

    EXPR   := ["after."] FIELD OP VALUE
    OP     := ">" | ">=" | "<" | "<=" | "=" | "==" | "!="
    FIELD  := per request:       body (bytes), media (bytes), images, tokens (estimated), input_tokens
                                 (provider-reported), status (HTTP status)
              per conversation:  growth (body bytes per turn), image_growth (images per turn), turns
    VALUE  := a size for body, media and growth (16MB, 2000000, 1.5MiB; binary units, as in the rules),
              with "/turn" allowed after growth and image_growth; a number otherwise.

Plain names are the request as recorded; "after." is the request after the rules' pruning (as
forwarded, for a recording made through trimflow). status, input_tokens and turns have no after.
growth and image_growth are the steady rate: the slope over each conversation's last 5 turns.

The gate also fails, with or without --fail-on, on an input with no LLM request (unless --allow-empty)
and on an input cut short (a dump or JSONL file that ends inside a flow or a line, a HAR file whose
JSON stops before its end): its figures are missing the part that was lost.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from .._human import format_size, parse_size
from ..errors import ExpressionError
from ._read import Row
from ._summary import CUT, EMPTY, Conversation, InputProblem, Summary

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "!=": operator.ne,
    "==": operator.eq,
    ">": operator.gt,
    "<": operator.lt,
    "=": operator.eq,
}
_EXPR = re.compile(r"\s*(after\.)?([A-Za-z_]+)\s*(>=|<=|!=|==|>|<|=)\s*(\S(?:.*\S)?)\s*")

SIZE, COUNT, RATE = "size", "count", "rate"


@dataclass(frozen=True, slots=True)
class _Field:
    scope: str  # request or conversation
    kind: str  # SIZE, COUNT or RATE
    before: str  # Record attribute, or growth key
    after: str | None


FIELDS: dict[str, _Field] = {
    "body": _Field("request", SIZE, "body_bytes_before", "body_bytes_after"),
    "media": _Field("request", SIZE, "media_bytes_before", "media_bytes_after"),
    "images": _Field("request", COUNT, "images_before", "images_after"),
    "tokens": _Field("request", COUNT, "est_tokens_before", "est_tokens_after"),
    "input_tokens": _Field("request", COUNT, "usage_input_tokens", None),
    "status": _Field("request", COUNT, "status", None),
    "growth": _Field("conversation", SIZE, "body_bytes", "after.body_bytes"),
    "image_growth": _Field("conversation", RATE, "images", "after.images"),
    "turns": _Field("conversation", COUNT, "turns", None),
}


@dataclass(frozen=True, slots=True)
class Expression:
    text: str
    field: str
    after: bool
    op: str
    value: float

    def holds_for(self, actual: float | None) -> bool:
        return actual is not None and _OPS[self.op](actual, self.value)

    def show(self, actual: float) -> str:
        """A measured value in the expression's own units, with enough digits that a value on the other side
        of the limit never reads as the limit itself (2,141,104 bytes against >2MB is not "2.0MB")."""
        kind = FIELDS[self.field].kind
        per_turn = "/turn" if kind == RATE or self.field == "growth" else ""
        for text, value in self._figures(actual, kind):
            if self.holds_for(actual) == self.holds_for(value):
                return text + per_turn
        return repr(actual) + per_turn

    @staticmethod
    def _figures(actual: float, kind: str) -> Iterator[tuple[str, float]]:
        """Ever more exact texts for a value, each with the value a reader would take it for."""
        if kind == SIZE:
            whole = round(actual)
            short = format_size(whole)
            magnitude = float(parse_size(short.lstrip("-")) or 0)  # "2.0MB" reads as 2MB, whatever it was rounded from
            yield short, -magnitude if short.startswith("-") else magnitude
            yield f"{whole:,} bytes", float(whole)
            for digits in range(1, 7):
                yield f"{actual:,.{digits}f} bytes", float(f"{actual:.{digits}f}")
        elif kind == RATE:
            for digits in range(2, 9):
                yield f"{actual:.{digits}f}", float(f"{actual:.{digits}f}")
        else:
            yield str(int(actual)), float(int(actual))

    def name(self) -> str:
        return ("after." if self.after else "") + self.field


@dataclass(frozen=True, slots=True)
class Breach:
    """An expression that is true somewhere: the first turn of one conversation where it is."""

    expression: str
    conversation: str
    turn: int | None
    value: str
    turns: int  # how many turns of the conversation it is true for (1 for conversation fields)

    def line(self) -> str:
        where = f"conversation {self.conversation}" + (f" turn {self.turn}" if self.turn is not None else "")
        more = f", and {self.turns - 1} later turn{'s' if self.turns > 2 else ''}" if self.turns > 1 else ""
        return f"{self.expression}: {where} ({self.value}{more})"

    def to_dict(self) -> dict[str, Any]:
        return {"expression": self.expression, "conversation": self.conversation, "turn": self.turn, "value": self.value, "turns": self.turns}


@dataclass
class Gate:
    """The --fail-on expressions and where they broke, and the inputs the gate fails on by themselves."""

    expressions: list[Expression] = field(default_factory=list)
    breaches: list[Breach] = field(default_factory=list)
    input_failures: list[InputProblem] = field(default_factory=list)  # an input with no LLM request, or cut short

    @property
    def ok(self) -> bool:
        return not self.breaches and not self.input_failures

    def broken(self, expr: Expression) -> list[Breach]:
        return [b for b in self.breaches if b.expression == expr.text]

    def to_dict(self) -> dict[str, Any]:
        return {
            "expressions": [e.text for e in self.expressions],
            "ok": self.ok,
            "broken": [b.to_dict() for b in self.breaches],
            "input_failures": [p.text for p in self.input_failures],
        }


def check_inputs(summary: Summary, *, allow_empty: bool) -> list[InputProblem]:
    """The inputs that fail the gate whatever the expressions: one cut short always (what it lost is not
    in the figures), one with no LLM request unless allow_empty."""
    failures = []
    for problem in summary.input_problems():
        if problem.kind == CUT:
            failures.append(problem)
        elif problem.kind == EMPTY and not allow_empty:
            failures.append(replace(problem, text=f"{problem.text} (--allow-empty lets this pass)"))
    return failures


def parse(text: str) -> Expression:
    match = _EXPR.fullmatch(text)
    if match is None:
        raise ExpressionError(
            f"--fail-on {text!r}: expected FIELD OP VALUE, e.g. 'body>16MB' or 'images>=9' (fields: {', '.join(FIELDS)}; ops: > >= < <= = !=)"
        )
    after, name, op, raw = bool(match.group(1)), match.group(2).lower(), match.group(3), match.group(4)
    spec = FIELDS.get(name)
    if spec is None:
        raise ExpressionError(f"--fail-on {text!r}: unknown field {name!r}; fields: {', '.join(FIELDS)}")
    if after and spec.after is None:
        raise ExpressionError(f"--fail-on {text!r}: {name} has no after. value (it is not changed by pruning)")
    per_turn = raw.lower().replace(" ", "").endswith("/turn")
    if per_turn:
        if spec.scope != "conversation" or name == "turns":
            raise ExpressionError(f"--fail-on {text!r}: '/turn' belongs to growth and image_growth only")
        raw = raw[: raw.lower().rindex("/")].strip()
    try:
        value = _value(spec.kind, raw)
    except ValueError as exc:
        raise ExpressionError(f"--fail-on {text!r}: {exc}") from None
    return Expression(text.strip(), name, after, op, value)


def _value(kind: str, raw: str) -> float:
    if kind == SIZE:
        if raw.startswith("-"):
            return -float(_size(raw[1:]))  # a shrinking conversation has a negative growth
        return float(_size(raw))
    try:
        value = float(raw) if kind == RATE else int(raw)
    except ValueError:
        what = "a number" if kind == RATE else "a whole number"
        raise ValueError(f"{raw!r} is not {what}") from None
    if not math.isfinite(value):
        raise ValueError(f"{raw!r} is not a finite number")
    return float(value)


def _size(raw: str) -> int:
    size = parse_size(raw)
    if size is None:
        raise ValueError(f"{raw!r} is not a size")
    return size


def evaluate(expressions: list[Expression], summary: Summary) -> list[Breach]:
    """Every (expression, conversation) pair where an expression is true, at its first turn."""
    breaches: list[Breach] = []
    for expr in expressions:
        spec = FIELDS[expr.field]
        for conversation in summary.conversations:
            if spec.scope == "request":
                breach = _request_breach(expr, spec, conversation)
            else:
                breach = _conversation_breach(expr, spec, conversation)
            if breach is not None:
                breaches.append(breach)
    return breaches


def _request_breach(expr: Expression, spec: _Field, conversation: Conversation) -> Breach | None:
    attribute = spec.after if expr.after else spec.before
    assert attribute is not None
    hits: list[tuple[Row, float]] = []
    for row in conversation.rows:
        actual = getattr(row.record, attribute)
        if expr.holds_for(actual):
            hits.append((row, actual))
    if not hits:
        return None
    row, actual = hits[0]
    return Breach(expr.text, conversation.id, row.record.turn, f"{expr.name()} {expr.show(actual)}", len(hits))


def _conversation_breach(expr: Expression, spec: _Field, conversation: Conversation) -> Breach | None:
    if expr.field == "turns":
        actual: float | None = conversation.turns
    else:
        key = spec.after if expr.after else spec.before
        assert key is not None
        actual = conversation.growth.get(key)
    if not expr.holds_for(actual):
        return None
    assert actual is not None
    return Breach(expr.text, conversation.id, conversation.last_turn, f"{expr.name()} {expr.show(actual)}", 1)
