"""Text made safe for the output it goes to: the one place the audit's writers (text, Markdown, HTML, the
lines on stderr) escape what they print.

A report quotes text a recording chose: a model name, a host, a path, a rule or conversation id or a reason
from a metrics JSONL, a file name. A recording may come from an untrusted CI artifact, so that text may hold
a newline and a line of its own, a terminal escape sequence, a GitHub workflow command (`::add-mask::`,
`::error::` at the start of a line, `##[error]` anywhere in one: the Actions runner acts on both in a job's
log) or Markdown that would render as a heading, a link or HTML in a step summary.

Each function takes one line of report text (fixed wording with quoted values in it, or a value alone) and
returns it so that the output shows it literally:

- `for_text`: control and format characters (C0, C1, DEL, line and paragraph separators, bidi overrides,
  lone surrogates) written as visible escapes (`\\n`, `\\x1b`, `\\u202e`); a `::` that starts the line and
  every `##[` get an escaped colon or hash, so the runner reads no command. The result is one line, free of
  what a terminal or the runner would act on, and the same when escaped again.
- `for_markdown`: the same escapes, then a backslash before every character that could start Markdown
  (CommonMark and GitHub's flavour: emphasis, code, links, autolinks, HTML, entities, tables,
  strikethrough, math) and before a line-start marker (heading, list, quote, setext underline); leading
  spaces as entities (four would make a code block).
- `for_markdown_cell`: the same but the line-start rule, for a table cell.
- `for_markdown_code`: a value in a code span when it can be one, else `for_markdown`.
- `for_html`: the same escapes, then HTML-escaped, quotes included (the value may go in an attribute).

JSON needs none of this: orjson escapes control characters, and a JSON reader gets the values as recorded.
"""

from __future__ import annotations

import html
import re

from .._text import escape_controls as _escape_controls

# Characters that can start inline Markdown anywhere in a line: backslash escapes, code, emphasis, links and
# images, autolinks and HTML, tables, entities, strikethrough, GitHub's math. Every one may be backslash-escaped.
_MARKDOWN_INLINE = re.compile(r"([\\`*_\[\]<>|#&~$])")
# GitHub's extended autolinks: a scheme's "://", "www.", an e-mail address.
_MARKDOWN_AUTOLINK = re.compile(r"(?i)(?<=[a-z])(:)(?=//)|(?<=www)(\.)|(@)|(?<=mailto)(:)|(?<=xmpp)(:)")
# Markers that make a block when they start a line: a list (-, +, "1." and "1)"), a setext underline (=), and a
# colon (a workflow command, when the Markdown is printed to a job's log too).
_MARKDOWN_LINE_START = re.compile(r"^(\s*)([-+=:]|\d{1,9}[.)])")


def for_markdown(value: str) -> str:
    """One line of Markdown, or what follows fixed text on one, that renders as the text it was given: see the
    module's docstring."""
    value = _MARKDOWN_LINE_START.sub(lambda m: m.group(1) + m.group(2)[:-1] + "\\" + m.group(2)[-1], for_markdown_cell(value))
    indent = len(value) - len(value.lstrip(" "))
    return "&#32;" * indent + value[indent:]  # spaces as entities: four of them would start a code block


def for_markdown_cell(value: str) -> str:
    """A table cell: `for_markdown` without the line-start rule, as a cell holds no block (a lone "-" stays "-")."""
    value = _MARKDOWN_INLINE.sub(r"\\\1", _escape_controls(value))
    return _MARKDOWN_AUTOLINK.sub(lambda m: "\\" + m.group(0), value)


def for_markdown_code(value: str) -> str:
    """A value as a code span, shown verbatim; a value a code span cannot hold (a backtick, a pipe, which a table
    would still split at, a control character) as escaped text instead."""
    if value and value == _escape_controls(value) and not any(c in value for c in "`|") and value.strip() == value:
        return f"`{value}`"
    return for_markdown(value)


def for_html(value: str) -> str:
    """Text for HTML content or a quoted attribute value."""
    return html.escape(_escape_controls(value), quote=True)
