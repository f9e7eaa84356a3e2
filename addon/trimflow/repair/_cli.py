"""`scripts/repair`: apply the rules to an agent's saved session, so that resuming it sends what the proxy would.

Prints one line per session file: its agent, the images its resumed history sends before and after, the
file's size before and after, and the backup. A file that cannot be repaired gets one line saying why and
is left as it was. Exit 0 when every file was repaired or had nothing to prune, 1 when one could not be,
2 for a usage error (a bad rules file, no PATH).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import ModuleType

from .._human import format_size, format_size_change
from .._rules import Rules
from .._rules_file import DEFAULT_RULES_PATH, load_rules
from ..cli._status import FAILED, SUCCESS, fail, say
from ..errors import RulesError
from . import _claude, _codex, _files, _gemini
from ._lines import SessionError, join_lines, split_lines
from ._repair import Agent, repair_lines

# The agents, in the order a file is tried against them: the two whose first line names them, then Claude Code.
AGENTS: dict[str, ModuleType] = {"codex": _codex, "gemini": _gemini, "claude": _claude}
AGENT_NAMES = {"claude": "Claude Code", "codex": "Codex", "gemini": "Gemini CLI"}
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(slots=True)
class FileReport:
    """What the repair of one file did (or, with dry_run, would do)."""

    path: Path
    agent: str
    images_before: int
    images_after: int
    bytes_before: int
    bytes_after: int
    backup: Path | None = None
    dry_run: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.images_after != self.images_before or self.bytes_after != self.bytes_before

    def line(self) -> str:
        images = f"images {self.images_before}->{self.images_after}"
        if not self.changed:
            return f"{AGENT_NAMES[self.agent]} session, {images}, file {format_size(self.bytes_before)}: nothing to prune"
        size = format_size_change(self.bytes_before, self.bytes_after)
        done = "dry run, nothing written" if self.dry_run else f"backup {self.backup if self.backup else '?'}"
        return f"{AGENT_NAMES[self.agent]} session, {images}, file {size} ({done})"


class NotASession(SessionError):
    """A file of JSON lines that is no session of the agents asked for (a folder also holds prompt histories)."""


def detect(lines: Sequence[object], wanted: str = "auto") -> ModuleType:
    """The agent module whose session the lines are; NotASession naming what was expected otherwise."""
    candidates = AGENTS if wanted == "auto" else {wanted: AGENTS[wanted]}
    for module in candidates.values():
        if module.recognises(lines):
            return module
    if wanted != "auto":
        raise NotASession(f"is not a {AGENT_NAMES[wanted]} session file")
    raise NotASession("is not a session file of a known agent (Claude Code, Codex or Gemini CLI)")


def repair_file(path: Path, rules: Rules, agent: str = "auto", dry_run: bool = False, now: datetime | None = None) -> FileReport:
    """Repair one session file in place (see trimflow.repair); a SessionError, with the file untouched, when it cannot be."""
    real = path.resolve()
    snapshot = _files.read(real)
    lines = split_lines(snapshot.data)
    module = detect(lines, agent)
    if not dry_run:
        _files.check_writable(snapshot)
        held = _files.holders(real)
        if held:
            raise SessionError(f"is open in {', '.join(held)}: the agent may still be running; close it first")
    engine_agent: Agent = module
    repaired = repair_lines(lines, engine_agent, rules)
    report = FileReport(path, module.NAME, repaired.images_before, repaired.images_after, len(snapshot.data), len(snapshot.data), dry_run=dry_run)
    if not repaired.changed:
        return report
    data = join_lines(repaired.lines, snapshot.data.endswith(b"\n"))
    report.bytes_after = len(data)
    if dry_run:
        return report
    around: AbstractContextManager[list[str]] = _codex.index_reset(real, repaired.lines) if module is _codex else nullcontext([])
    with around as notes:
        replaced = _files.replace(snapshot, data, now)
    report.backup = replaced.backup
    report.notes = [*notes, *_replace_notes(replaced)]
    return report


def _replace_notes(replaced: _files.Replaced) -> list[str]:
    notes = []
    if replaced.carried:
        notes.append(f"the agent appended {format_size(replaced.carried)} during the repair: carried over to the repaired file")
    if replaced.stranded:
        size = format_size(replaced.stranded)
        notes.append(f"the agent appended {size} during the repair that is in the backup only (the file was replaced again meanwhile)")
    if replaced.still_open:
        notes.append(f"the original is still open in {', '.join(replaced.still_open)}: what it writes there goes to the backup")
    return notes


def session_paths(target: str, agent: str, env: Mapping[str, str]) -> tuple[list[Path], bool]:
    """The files PATH names: a file, the *.jsonl files under a folder, or the sessions with that id in the agents'
    default folders; and whether they were found in a folder. A SessionError when it names none."""
    path = Path(target).expanduser()
    if path.is_dir():
        found = sorted(p for p in path.rglob("*.jsonl") if p.is_file() and not p.name.startswith("."))
        if not found:
            raise SessionError("has no session files (*.jsonl)")
        return found, True
    if path.exists() or os.sep in target or not _SESSION_ID.fullmatch(target):
        return [path], False  # a file, or a path that is not there (reading it says so)
    modules = AGENTS.values() if agent == "auto" else [AGENTS[agent]]
    found = [p for module in modules for p in module.find(target, env)]
    if not found:
        roots = ", ".join(str(root) for module in modules for root in module.session_roots(env))
        raise SessionError(f"no such file, and no session with this id in {roots}")
    return found, False


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/repair", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", metavar="PATH", help="a session file, a folder of them, or a session id")
    p.add_argument("--rules", help=f"rules file (default: {DEFAULT_RULES_PATH})")
    p.add_argument("--dry-run", action="store_true", help="say what would change, write nothing")
    p.add_argument("--agent", choices=("auto", *AGENT_NAMES), default="auto", help="the agent whose sessions these are (default: auto, by content)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        rules = load_rules(args.rules or DEFAULT_RULES_PATH)
    except RulesError as exc:
        return fail("trimflow repair", str(exc))
    failed = False
    for target in args.paths:
        try:
            paths, in_folder = session_paths(target, args.agent, os.environ)
        except SessionError as exc:
            say("trimflow repair", f"{target}: {exc}")
            failed = True
            continue
        for path in paths:
            try:
                report = repair_file(path, rules, args.agent, args.dry_run)
            except NotASession as exc:
                if not in_folder:
                    say("trimflow repair", f"{path}: {exc}; file untouched")
                    failed = True
                else:  # ~/.claude and ~/.codex also keep a history.jsonl of prompts
                    print(f"trimflow repair: {path}: skipped: {exc}")
                continue
            except SessionError as exc:
                say("trimflow repair", f"{path}: {exc}; file untouched")
                failed = True
                continue
            except Exception as exc:  # noqa: BLE001 - one file's surprise must not stop the others; its text never printed
                say("trimflow repair", f"{path}: internal error ({type(exc).__name__}); file untouched")
                failed = True
                continue
            print(f"trimflow repair: {path}: {report.line()}")
            for note in report.notes:
                print(f"trimflow repair: {path}: {note}")
    return FAILED if failed else SUCCESS


if __name__ == "__main__":
    sys.exit(main())
