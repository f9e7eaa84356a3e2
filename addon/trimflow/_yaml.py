"""YAML files read with line numbers: the one loader behind every YAML file trimflow reads (rules, profiles, prices,
limit errors, learned limits).

It walks PyYAML's node tree rather than plain dicts so that every error names the file and line it comes
from. Anchors and merge keys (`<<: *anchor`) work, an explicit key overrides a merged one, a key written
twice is an error, and an unknown name gets a did-you-mean hint. Top-level keys starting with "x-" are
ignored, as in docker compose: a place for anchors that entries share. A reader subclass names the error
class its file raises (`error_class`, built as error_class(source, line, problem)) and reads the root
node (`top`). `warn` notes what loads but is likely a mistake, as "file:line: problem" in `warnings`.
"""

from __future__ import annotations

import difflib
import importlib.resources
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

T = TypeVar("T")
Fields = dict[str, tuple[Node, Node]]
"""A mapping node's entries: key -> (key node, value node)."""

_MERGE_TAG = "tag:yaml.org,2002:merge"


def shipped_file(name: str) -> Path:
    """A file of the rules folder shipped in the package (trimflow/rules: in a checkout, a link to the
    repository's rules/, so both name the same file)."""
    return Path(str(importlib.resources.files("trimflow") / "rules" / name)).resolve()


def read_text(path: str | os.PathLike[str], error_class: type[Exception]) -> str:
    """The file's text; a file that cannot be read or is not UTF-8 raises error_class(file, None, why)."""
    source = os.fspath(path)
    try:
        return Path(path).read_text(encoding="utf-8-sig")  # -sig: tolerate a BOM from Windows editors
    except UnicodeDecodeError as e:
        raise error_class(source, None, f"cannot read: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise error_class(source, None, f"cannot read: {e.strerror or e}") from None


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice closest to `word` (case aside), or None when none is close."""
    close = difflib.get_close_matches(word.lower(), list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """ "; did you mean 'x'?" for the closest choice, or "" when none is close."""
    close = closest(word, choices)
    return f"; did you mean {close!r}?" if close else ""


def show(value: Any) -> str:
    """A value as the user wrote it in YAML terms, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return repr(value)
    return type(value).__name__


def line_of(node: Node) -> int:
    return node.start_mark.line + 1


@dataclass(frozen=True, slots=True)
class Collection:
    """Stands in for a list or mapping where a scalar was expected, so errors can say which."""

    kind: str

    def __str__(self) -> str:
        return self.kind


class NodeReader(Generic[T]):
    """Reads one YAML text into a T; every problem is an `error_class` naming the source and line."""

    error_class: ClassVar[type[Exception]]  # called as error_class(source, line, problem)
    # PyYAML's pure-Python parser by default; a file that can grow large may take libyaml's (yaml.CSafeLoader).
    loader_class: ClassVar[type[yaml.SafeLoader] | Any] = yaml.SafeLoader

    def __init__(self, source: str) -> None:
        self.source = source
        self.loader: Any = None
        self.warnings: list[str] = []  # "file:line: problem" for what loads but is likely a mistake
        self._mappings: dict[int, Fields] = {}

    def top(self, root: Node | None) -> T:
        """The file's value from its root node (None for an empty text)."""
        raise NotImplementedError

    def error(self, node_or_line: Node | int, problem: str) -> Exception:
        line = node_or_line if isinstance(node_or_line, int) else line_of(node_or_line)
        return type(self).error_class(self.source, line, problem)

    def warn(self, node: Node, problem: str) -> None:
        self.warnings.append(f"{self.source}:{line_of(node)}: {problem}")

    def parse(self, text: str) -> T:
        try:
            try:
                self.loader = self.loader_class(text)  # checks for unprintable characters at once
                return self.top(self.loader.get_single_node())
            except yaml.MarkedYAMLError as e:
                mark = e.problem_mark or e.context_mark
                what = e.problem or e.context or "invalid YAML"
                constructor = isinstance(e, yaml.constructor.ConstructorError)  # e.g. a !!python tag
                kind = "YAML error" if constructor else "YAML syntax error"
                raise self.error(mark.line + 1 if mark else 1, f"{kind}: {what}") from None
            except yaml.reader.ReaderError as e:  # e.g. a control character; has an offset, not a line
                line = text.count("\n", 0, max(e.position, 0)) + 1
                raise self.error(line, f"YAML syntax error: {e.reason}") from None
        finally:
            if self.loader is not None:
                self.loader.dispose()

    def top_mapping(self, root: Node | None, what: str, keys: tuple[str, ...], empty: str) -> Fields:
        """The root mapping without its "x-" keys; `empty` is the error for an empty file, and a key
        not in `keys` is an error too."""
        if root is None or self.is_null(root):  # "" or "---"
            raise self.error(1, empty)
        top = {k: v for k, v in self.mapping(root, what).items() if not k.startswith("x-")}
        self.reject_unknown(top, keys, what, noun="top-level key")
        return top

    def scalar(self, node: Node) -> Any:
        """The Python value of a scalar node; a list or mapping comes back as a Collection marker."""
        assert self.loader is not None
        if not isinstance(node, ScalarNode):
            return Collection("a list" if isinstance(node, SequenceNode) else "a mapping")
        try:
            return self.loader.construct_object(node, deep=True)
        except ValueError as e:  # e.g. a timestamp-looking scalar with month 13
            raise self.error(node, f"cannot read value {node.value!r}: {e}") from None

    def describe(self, node: Node) -> str:
        value = self.scalar(node)
        return str(value) if isinstance(value, Collection) else show(value)

    def mapping(self, node: Node, what: str) -> Fields:
        """Keys of a mapping node -> (key node, value node); YAML merge keys (<<: *x) are honoured."""
        if not isinstance(node, MappingNode):
            raise self.error(node, f"{what} must be a mapping, got {self.describe(node)}")
        cached = self._mappings.get(id(node))  # an alias reaches the same node again
        if cached is not None:
            return cached
        # Merge keys are resolved here rather than by PyYAML's flatten_mapping, whose order of several merged
        # mappings changed between PyYAML releases: of several merged, the first one named wins, and an
        # explicit key wins over a merged one wherever it is written.
        merged: Fields = {}
        out: Fields = {}
        for k, v in node.value:
            if k.tag == _MERGE_TAG:
                for source in v.value if isinstance(v, SequenceNode) else [v]:
                    if not isinstance(source, MappingNode):
                        raise self.error(
                            source, f"a merge key (<<) in {what} takes an anchored mapping or a list of them, got {self.describe(source)}"
                        )
                    for key, pair in self.mapping(source, what).items():
                        merged.setdefault(key, pair)
                continue
            key = self.scalar(k)
            if not isinstance(key, str):
                raise self.error(k, f"keys in {what} must be names, got {self.describe(k)}")
            prev = out.get(key)
            if prev is not None:
                raise self.error(k, f"duplicate key {key!r} in {what} (first on line {line_of(prev[0])})")
            out[key] = (k, v)
        out = {**merged, **out}
        self._mappings[id(node)] = out
        return out

    def reject_unknown(self, fields: Mapping[str, tuple[Node, Node]], allowed: tuple[str, ...], what: str, noun: str = "field") -> None:
        for key, (knode, _) in fields.items():
            if key not in allowed:
                hint = did_you_mean(key, allowed) or f" (known: {', '.join(allowed)})"
                raise self.error(knode, f"unknown {noun} {key!r} in {what}{hint}")

    def sequence(self, node: Node, what: str) -> list[Node]:
        """The items of a list node; null is an empty list."""
        if self.is_null(node):
            return []
        if not isinstance(node, SequenceNode):
            raise self.error(node, f"{what} must be a list, got {self.describe(node)}")
        return list(node.value)

    def is_null(self, node: Node) -> bool:
        return isinstance(node, ScalarNode) and self.scalar(node) is None
