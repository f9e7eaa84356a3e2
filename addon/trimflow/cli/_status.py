"""The exit statuses of trimflow's commands, and the one way a command says why it stops: a line on stderr that
names the command, with control characters escaped (a path or a model name comes from the user or a file)."""

from __future__ import annotations

import sys

from .._text import for_text

SUCCESS = 0
FAILED = 1  # the command ran and the answer is no: an audit gate broken, a file it could not use as asked
USAGE_ERROR = 2  # it cannot run: its arguments, a rules file, the input it was given
NOT_FOUND = 127  # the launcher's command was not found, as a shell says it


def say(command: str, line: str) -> None:
    """Print `command: line` to stderr: a warning, or why one of several inputs was skipped."""
    print(for_text(f"{command}: {line}"), file=sys.stderr)


def fail(command: str, reason: str, status: int = USAGE_ERROR) -> int:
    """Print `command: reason` to stderr and return `status`, for `return fail(...)` from a command's main."""
    say(command, reason)
    return status
