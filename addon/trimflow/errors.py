"""The errors trimflow raises to its users, in one place.

Every one is a TrimflowError, so `except TrimflowError` catches any of them; each also keeps the
built-in base its callers have always caught (ValueError), so `except ValueError` still works:

    TrimflowError
    ├── RulesError (ValueError)        a rules file problem: "FILE:LINE: what is wrong"
    │   └── ProfilesError              a profiles file problem, same form (a RulesError, so one
    │                                  `except RulesError` refuses a bad rules or profiles file)
    ├── UnknownProfile (ValueError)    a profile name the profiles file does not define
    ├── BodyError (ValueError)         a request body that cannot be parsed or written as JSON
    ├── DecodeError (ValueError)       a Content-Encoding that cannot be undone; _decode's
    │   ├── UnsupportedEncoding        own subclasses say which case: a coding it does not decode,
    │   └── BodyTooLarge               or a body that would inflate past the limit
    ├── ExpressionError (ValueError)   an audit --fail-on expression that does not parse
    ├── InputError                     an audit input that cannot be used at all
    └── SessionError                   an agent's saved session that `repair` cannot repair

No message quotes a body, a key or a prompt: they name files, lines, encodings and sizes.

Not here: NeedsWorker (trimflow._policy, re-exported by trimflow) is control flow, not an error for
users: the engine raises it on the event loop to ask the proxy to run the same request on a worker
thread, and the proxy always catches it.
"""

from __future__ import annotations


class TrimflowError(Exception):
    """The base of every error trimflow raises to its users."""


class RulesError(TrimflowError, ValueError):
    """A rules file problem; str() is "FILE:LINE: what is wrong" ("FILE: ..." when there is no line)."""

    def __init__(self, source: str, line: int | None, problem: str) -> None:
        self.source = source
        self.line = line
        self.problem = problem
        super().__init__(f"{source}:{line}: {problem}" if line is not None else f"{source}: {problem}")


class ProfilesError(RulesError):
    """A profiles file problem; str() is "FILE:LINE: what is wrong" ("FILE: ..." when there is no line)."""


class UnknownProfile(TrimflowError, ValueError):
    """A profile name that the profiles file does not define; the message lists the known names."""


class BodyError(TrimflowError, ValueError):
    """The body cannot be handled; the message says why without quoting it."""


class DecodeError(TrimflowError, ValueError):
    """The body cannot be decoded; the message says why without quoting it."""


class ExpressionError(TrimflowError, ValueError):
    """A --fail-on expression that does not parse; str() says what is wrong."""


class InputError(TrimflowError):
    """An input the audit cannot use at all; str() is a one-line reason naming the file."""


class SessionError(TrimflowError):
    """A session file that cannot be repaired; str() is one line naming the problem, never the file's text."""


__all__ = [
    "BodyError",
    "DecodeError",
    "ExpressionError",
    "InputError",
    "ProfilesError",
    "RulesError",
    "SessionError",
    "TrimflowError",
    "UnknownProfile",
]
