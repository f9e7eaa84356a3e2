"""The repair of one session: the proxy's rules applied to the history an agent will send again.

Each agent's module builds, from the file's lines, the request body the agent sends when the session
is resumed (a `Replay`), and says where each part of that body lives in the file. The engine prunes the
body exactly as the proxy would (`trimflow._engine.prune`: same rules, same placeholders, same cut); every
image the engine replaced or re-encoded is written back at its place in its line, and nothing else.
A second run over the repaired lines must change nothing: the session then sends at most the cap, and a
later turn through the proxy finds nothing more to prune.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .. import _jsoncodec
from .._engine import Outcome, prune
from .._jsonsplice import splice
from .._record import Record
from .._rules import Rules, Target
from ..formats import FORMATS, IMAGE, JsonPath
from ._lines import Line, SessionError

Where = tuple[int, JsonPath]
"""A place in the file: the index of a line in the list of lines, and the JSON path inside that line."""


@dataclass(frozen=True, slots=True)
class Replay:
    """The request an agent sends again on resume, as built from its session file.

    `locate(path)` maps the path of a part of `body` (a media part, as the format module finds it) to where
    that part is in the file; None for a part the agent makes up on resume rather than reads from the file.
    """

    wire_format: str
    host: str
    path: str
    body: dict[str, Any]
    locate: Callable[[JsonPath], Where | None]


@dataclass(frozen=True, slots=True)
class Edit:
    """A value of the file to change: at `where`, `old` becomes `new`."""

    where: Where
    old: Any
    new: Any


class Agent(Protocol):
    """What each agent's module provides (trimflow.repair._claude, _codex, _gemini)."""

    NAME: str

    def recognises(self, lines: Sequence[Line]) -> bool:
        """Whether the lines are a session file of this agent."""
        ...

    def replay(self, lines: Sequence[Line]) -> Replay:
        """The request the agent sends again when the session is resumed."""
        ...

    def copies(self, lines: Sequence[Line], edits: Sequence[Edit]) -> list[Edit]:
        """More edits that follow from `edits`: copies of a pruned image the agent keeps for display only."""
        ...


@dataclass(slots=True)
class Repaired:
    """What a repair did to one session's lines (or would do)."""

    lines: list[Line]
    images_before: int
    images_after: int
    edits: list[Edit] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.edits)


def repair_lines(lines: list[Line], agent: Agent, rules: Rules) -> Repaired:
    """The lines with the rules applied to the history they hold; a SessionError when that cannot be done.

    Without `native_size`: the size the model sees is the proxy's work on the wire, never a reason to rewrite a
    session, whose images stay as the agent took them unless a limit drops or shrinks them."""
    rules = rules.with_limits(native_size=False)
    replay = agent.replay(lines)
    outcome = _prune(replay, rules)
    record = _record(outcome)
    if not outcome.changed:
        return Repaired(lines, record.images_before, record.images_before)
    edits = _edits(replay, outcome)
    edits += agent.copies(lines, edits)
    repaired = apply_edits(lines, edits)
    # The check the proxy would make on the next turn: nothing more to prune, within every limit.
    again = _prune(agent.replay(repaired), rules)
    if again.changed or _record(again).images_before != record.images_after:
        raise SessionError("the repaired history would still be pruned: left untouched (please report this file's agent and version)")
    return Repaired(repaired, record.images_before, record.images_after, edits)


def _prune(replay: Replay, rules: Rules) -> Outcome:
    body = _jsoncodec.dumps(replay.body, False)
    return prune(Target(replay.host, replay.path, replay.wire_format), {}, body, rules)


def _record(outcome: Outcome) -> Record:
    record = outcome.record
    if record is None:
        raise SessionError("the history is not a request the engine recognises")
    if record.reason:
        raise SessionError(f"the engine could not read the history: {record.reason}")
    return record


def _edits(replay: Replay, outcome: Outcome) -> list[Edit]:
    """Each media part the engine changed (a placeholder now, or re-encoded), with its place in the file."""
    pruned, _ = _jsoncodec.loads(outcome.body)
    edits = []
    for media in FORMATS[replay.wire_format].find_media(replay.body):
        old, new = value_at(replay.body, media.path), value_at(pruned, media.path)
        if old == new:
            continue
        where = replay.locate(media.path)
        if where is None:
            if media.kind == IMAGE:
                raise SessionError("an image the agent adds on resume would be pruned, and the file has no place for that")
            continue
        edits.append(Edit(where, old, new))
    return edits


def apply_edits(lines: list[Line], edits: Sequence[Edit]) -> list[Line]:
    """New lines with the edits spliced in; the lines no edit touches are the same objects."""
    by_line: dict[int, list[Edit]] = {}
    for edit in edits:
        by_line.setdefault(edit.where[0], []).append(edit)
    out = list(lines)
    for index, changes in by_line.items():
        line = lines[index]
        try:
            raw = splice(line.raw, [(edit.where[1], _jsoncodec.dumps(edit.new, False)) for edit in changes])
            value, _ = _jsoncodec.loads(raw)
        except (KeyError, ValueError) as exc:
            raise SessionError(f"line {line.number} could not be rewritten in place ({type(exc).__name__})") from None
        for edit in changes:
            if value_at(value, edit.where[1]) != edit.new:
                raise SessionError(f"line {line.number} could not be rewritten in place (a value landed elsewhere)")
        out[index] = Line(line.number, raw, value)
    return out


def value_at(node: Any, path: JsonPath) -> Any:
    for key in path:
        node = node[key]
    return node
