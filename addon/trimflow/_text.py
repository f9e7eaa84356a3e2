"""Text a client or a file chose, made safe for one line of a log, a terminal or a CI job's log: the one escaper for
plain text (the audit's Markdown and HTML writers build on it: trimflow.audit._escape).

Control and format characters (C0, C1, DEL, line and paragraph separators, bidi overrides, lone surrogates) are
written as visible escapes (`\\n`, `\\x1b`, `\\u202e`); a `::` that starts the line and every `##[` get an escaped
colon or hash, so GitHub's Actions runner reads no workflow command. The result is one line, valid UTF-8, and the
same when escaped again.
"""

from __future__ import annotations

import re
import unicodedata

# Cc: C0, DEL, C1; Cf: bidi overrides and isolates, zero-width characters, tag characters; Zl, Zp: U+2028/2029,
# which some terminals and editors break lines at; Cs: a lone surrogate (it cannot even be written as UTF-8).
_ESCAPED_CATEGORIES = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs"))
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_NEEDS_LOOK = re.compile(r"[^\x20-\x7e\u00a0-\u00ac\u00ae-\u05ff]")  # fast path: printable ASCII and Latin text

# GitHub Actions workflow commands: `::name ...::` after leading whitespace, `##[name ...]` anywhere in a line.
_RUNNER_LINE_COMMAND = re.compile(r"^(\s*):(?=:)")
_RUNNER_COMMAND = "##["


def escape_controls(value: str) -> str:
    """`value` with its control and format characters written as visible escapes."""
    if not _NEEDS_LOOK.search(value):
        return value
    out = []
    for char in value:
        if unicodedata.category(char) in _ESCAPED_CATEGORIES:
            code = ord(char)
            out.append(_SHORT.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"))
        else:
            out.append(char)
    return "".join(out)


def for_text(value: str) -> str:
    """One line of plain text for a terminal, a CI log or a file: see the module's docstring."""
    value = escape_controls(value)
    value = value.replace(_RUNNER_COMMAND, "#\\x23[")
    return _RUNNER_LINE_COMMAND.sub(r"\1\\x3a", value)
