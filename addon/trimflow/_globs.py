"""Globs in rules: a list of them compiled to one pattern, and a warning for one that looks like a regular
expression (with the glob it means) or has a '[' never closed."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable


def compile_globs(globs: Iterable[str], *, ignore_case: bool) -> re.Pattern[str] | None:
    """One regex for a list of globs (any of them); None when a glob is "*" (matches anything)."""
    globs = tuple(globs)
    if not globs or "*" in globs:
        return None
    flags = re.IGNORECASE if ignore_case else 0
    return re.compile("|".join(fnmatch.translate(g) for g in globs), flags)


_NOUNS = {"host": "host name", "model": "model name", "path": "URL path"}


def regex_warning(glob: str, key: str) -> str | None:
    """Why the `key` glob ("host", "model" or "path") looks like a regular expression or has a '[' never
    closed, with the glob to write instead when there is one; None when it reads as a glob."""
    signs = _regex_signs(glob, key)
    unclosed = _unclosed_bracket(glob)
    if not signs:
        if not unclosed:
            return None
        return f"'{glob}' has a '[' that is never closed, which a glob matches as a literal '['; close the set, or write '[[]' for a literal '['"
    if unclosed:
        signs.append("has a '[' never closed")
    instead = _glob_for(glob, key)
    advice = f"write '{instead}'" if instead else "rewrite it as a glob"
    # Quoted as written, not repr'd: a backslash shows once, as in the file.
    return f"'{glob}' looks like a regular expression ({', '.join(signs)}); rules use globs, matched against the whole {_NOUNS[key]}: {advice}"


def _regex_signs(glob: str, key: str) -> list[str]:
    signs = []
    if glob.startswith("^"):
        signs.append("starts with ^")
    if glob.endswith("$"):
        signs.append("ends with $")
    if key != "path" and len(glob) > 2 and glob[0] == glob[-1] == "/":
        signs.append("is wrapped in /.../")
    for m in re.finditer(r"\.[*+]", glob):
        before, after = glob[: m.start()], glob[m.end() :]
        if (
            m.group() == ".*"
            and (
                (key == "host" and before and (not after or after.startswith(".")))  # a whole label: api.*.com
                or (key == "model" and before[-1:].isdigit())  # the rest of a version: gpt-4.*
            )
        ):
            continue
        signs.append(f"has {m.group()}")
        break
    escape = re.search(r"\\.", glob)
    if escape:
        signs.append(f"has {escape.group()}")
    repeat = re.search(r"[\])]\+|\)[?*]", glob)  # [0-9]+ or (...)?: a glob's [...] is one character, [...]* one then any text
    if repeat:
        signs.append(f"has {repeat.group()}")
    if "|" in glob:
        signs.append("has |")
    return signs


def _glob_for(regex: str, key: str) -> str | None:
    """The glob a simple regular expression means (matched whole), or None when it has no glob spelling."""
    text = regex[1:-1] if key != "path" and len(regex) > 2 and regex[0] == regex[-1] == "/" else regex
    start, end = text.startswith("^"), text.endswith("$") and not text.endswith("\\$")
    text = text[1 if start else 0 : -1 if end else None]
    # An anchor on one side only leaves the other open: ^gpt-4o is gpt-4o*.
    text = f"{text}*" if start and not end else f"*{text}" if end and not start else text

    def glob_part(m: re.Match[str]) -> str:
        token = m.group()
        if token in (".*", ".*?"):
            return "*"
        if token in (".+", ".+?"):
            return "?*"
        if token.startswith("\\d"):
            return "[0-9]*" if token[2:] in ("+", "*") else "[0-9]"
        if token.endswith(("]+", "]*")):
            return token[:-1] + "*"
        if token[1].isalnum():  # \w, \s, \b: no glob spelling
            return token
        return token[1]  # an escaped character is itself: \. is a dot

    text = re.sub(r"\.[*+]\??|\\d[+*]?|\\.|\[[^\]]*\][+*]", glob_part, text)
    if re.search(r"[\\^$()|+{}]", text):
        return None
    return re.sub(r"\*{2,}", "*", text) or "*"


def _unclosed_bracket(glob: str) -> bool:
    """A '[' that fnmatch finds no ']' for, read as fnmatch reads a set: it matches that '[' literally."""
    i, n = 0, len(glob)
    while i < n:
        if glob[i] == "[":
            j = i + 1
            if j < n and glob[j] == "!":
                j += 1
            if j < n and glob[j] == "]":
                j += 1
            while j < n and glob[j] != "]":
                j += 1
            if j >= n:
                return True
            i = j
        i += 1
    return False
