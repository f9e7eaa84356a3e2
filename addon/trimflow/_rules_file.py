"""Reading the rules file: the YAML parsed with line-aware errors (every problem names the file and line), each
limit checked against its field's metadata (trimflow._limits), globs checked, and a file that follows edits
(`RulesFile`). The model it builds: trimflow._rules."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from yaml.nodes import Node, SequenceNode

from ._globs import compile_globs, regex_warning
from ._human import parse_duration, parse_size
from ._limits import BOOL, COUNT, DURATION, FRACTION, LIMIT_FIELDS, SIDE, SIZE, TEMPLATE, Limits
from ._placeholder import check_placeholder
from ._rules import BUILTIN_ENDPOINTS, FORMAT_NAMES, Endpoint, Rule, Rules
from ._yaml import NodeReader, did_you_mean, line_of, read_text, shipped_file
from .errors import RulesError

log = logging.getLogger("trimflow")

DEFAULT_RULES_PATH: Path = shipped_file("default.yaml")

# The limit fields and what each value may be come from Limits' field metadata (kind, min, nullable,
# pair): a new limit is one field of Limits, and the rules file accepts and checks it.
_LIMIT_META: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {f.name: f.metadata for f in dataclasses.fields(Limits) if f.metadata.get("kind") is not None}
)
# Fields that only mean something together, each pair once in field order: one set without the other is an error.
_PAIRS: tuple[tuple[str, str], ...] = tuple(
    (name, meta["pair"]) for name, meta in _LIMIT_META.items() if meta.get("pair") and LIMIT_FIELDS.index(name) < LIMIT_FIELDS.index(meta["pair"])
)
# Fields that need another one set (in the merged limits of a rule).
_NEEDS: tuple[tuple[str, str], ...] = tuple((name, meta["needs"]) for name, meta in _LIMIT_META.items() if meta.get("needs"))
# Wording only, for a limit that has an entry: the example a size error gives, and why a value under
# the minimum is refused. A limit without one gets _SIZE_EXAMPLE and no reason.
_SIZE_EXAMPLE = "16MiB or 2000000"
_SIZE_EXAMPLES = {"max_image_bytes": "5MiB or 5242880"}
_UNDER_MIN_REASONS = {"max_image_bytes": "no image fits in less"}
_TOP_KEYS = ("defaults", "rules", "endpoints", "detect_by_shape")
CHECK_INTERVAL = 1.0  # seconds between two looks at a rules file for edits, at most (option trimflow_rules_check)
_MATCH_KEYS = ("host", "path", "model")
_ENDPOINT_KEYS = ("path", "format", "host")


def _binary_size(n: int) -> str:
    """A byte count in the largest binary unit that divides it: 1024 -> "1KiB", 1000 -> "1000B"."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


# --- parsing ----------------------------------------------------------------------------------


def load_rules(path: str | os.PathLike[str]) -> Rules:
    """Read and parse a rules file; any problem is a RulesError naming the file (and line)."""
    return parse_rules(read_text(path, RulesError), os.fspath(path))


def parse_rules(text: str, source: str = "<string>") -> Rules:
    """Parse rules from YAML text; `source` names the file in error messages. Each of the rules'
    `warnings` is logged once, here."""
    rules = _RulesReader(source).parse(text)
    for warning in rules.warnings:
        log.warning("trimflow: %s", warning)
    return rules


class RulesFile:
    """A rules file that follows edits: `current()` reloads it when it changed on disk.

    The first load must succeed (RulesError otherwise). A later invalid edit, or the file going
    missing, logs one error and keeps the last good rules, so a typo never stops the proxy.
    The file is checked at most every `check_interval` seconds; safe to call from any thread.
    """

    def __init__(self, path: str | os.PathLike[str], *, check_interval: float = CHECK_INTERVAL) -> None:
        self.path = Path(path)
        self.check_interval = check_interval
        self.error: RulesError | None = None  # why the last reload failed; None once a good one loads
        self._stamp = self._stat()
        self._rules = load_rules(self.path)
        self._next_check = time.monotonic() + check_interval
        self._lock = threading.Lock()

    def current(self) -> Rules:
        if time.monotonic() < self._next_check:  # the common case: no system call at all
            return self._rules
        with self._lock:
            now = time.monotonic()
            if now >= self._next_check:
                self._next_check = now + self.check_interval
                stamp = self._stat()
                if stamp != self._stamp:
                    self._stamp = stamp
                    self._reload()
        return self._rules

    def _reload(self) -> None:
        try:
            self._rules = load_rules(self.path)
        except RulesError as e:
            self.error = e
            log.error("trimflow: %s; keeping the last good rules", e)
            return
        self.error = None
        log.info("trimflow: reloaded rules from %s", self.path)

    def _stat(self) -> tuple[int, int, int] | None:
        # The inode too: editors that save by renaming a new file over the old one may keep mtime.
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)


class _RulesReader(NodeReader[Rules]):
    """Reads a rules file; _yaml.NodeReader walks the YAML and makes the file:line errors."""

    error_class = RulesError

    def top(self, root: Node | None) -> Rules:
        top = self.top_mapping(root, "the rules file", _TOP_KEYS, "empty rules file: write at least `defaults:` (see rules/default.yaml)")

        defaults = Limits()
        if "defaults" in top and not self.is_null(top["defaults"][1]):
            fields = self.mapping(top["defaults"][1], "defaults")
            self.reject_unknown(fields, LIMIT_FIELDS, "defaults")
            defaults = Limits(rule="defaults", **self.limit_fields(fields))
            self.check_pairs(defaults, fields, top["defaults"][1], "defaults")

        rules: list[Rule] = []
        if "rules" in top:
            seen: dict[str, int] = {}
            for i, item in enumerate(self.sequence(top["rules"][1], "rules"), 1):
                rule = self.rule(item, i, seen)
                merged = dataclasses.replace(defaults, **rule.overrides)
                self.check_pairs(merged, self.mapping(item, f"rule #{i}"), item, f"rule {rule.name!r}")
                rules.append(rule)

        endpoints = BUILTIN_ENDPOINTS
        if "endpoints" in top and not self.is_null(top["endpoints"][1]):
            endpoints = tuple(self.endpoint(n) for n in self.sequence(top["endpoints"][1], "endpoints"))

        detect = True
        if "detect_by_shape" in top:
            node = top["detect_by_shape"][1]
            detect = self.scalar(node)
            if not isinstance(detect, bool):
                raise self.error(node, f"detect_by_shape must be true or false, got {self.describe(node)}")
            if not detect and not endpoints:
                raise self.error(node, "no endpoints and detect_by_shape: false: no request would ever be trimmed")

        return Rules(self.source, defaults, tuple(rules), endpoints, detect, tuple(self.warnings))

    def limit_fields(self, fields: Mapping[str, tuple[Node, Node]]) -> dict[str, Any]:
        return {k: self.limit_value(k, v) for k, (_, v) in fields.items() if k in LIMIT_FIELDS}

    def limit_value(self, key: str, node: Node) -> Any:
        """The value of limit `key`, checked as its Limits metadata says."""
        meta = _LIMIT_META[key]
        kind, lowest, nullable = meta["kind"], meta.get("min"), meta.get("nullable", True)
        value = self.scalar(node)
        if value is None and nullable:
            return None
        is_int = isinstance(value, int) and not isinstance(value, bool)  # YAML `yes` is a bool, not 1
        or_null = " or null" if nullable else ""
        if kind in (COUNT, SIDE):
            if is_int and (lowest is None or value >= lowest):
                return value
            unit = " of pixels" if kind == SIDE else ""
            at_least = "" if lowest is None else f" >= {lowest}"
            raise self.error(node, f"{key} must be a whole number{unit}{at_least}{or_null}, got {self.describe(node)}")
        if kind == SIZE:
            example = _SIZE_EXAMPLES.get(key, _SIZE_EXAMPLE)
            if not is_int and not isinstance(value, str):
                raise self.error(node, f"{key} must be a size like {example}{',' if nullable else ''}{or_null}, got {self.describe(node)}")
            try:
                size = parse_size(value)
            except ValueError as e:
                raise self.error(node, f"{key}: {e}") from None
            if size is None and not nullable:
                raise self.error(node, f"{key} must be a size like {example}, got {self.describe(node)}")
            if size is not None and lowest is not None and size < lowest:
                reason = _UNDER_MIN_REASONS.get(key)
                raise self.error(
                    node, f"{key} must be at least {lowest} ({_binary_size(lowest)}){': ' + reason if reason else ''}, got {self.describe(node)}"
                )
            return size
        if kind == TEMPLATE:
            if not isinstance(value, str):
                raise self.error(node, f"{key} must be a text template, got {self.describe(node)}")
            try:
                check_placeholder(value, key)
            except ValueError as e:
                raise self.error(node, str(e)) from None
            return value
        if kind == BOOL:
            if isinstance(value, bool):
                return value
            raise self.error(node, f"{key} must be true or false, got {self.describe(node)}")
        if kind == FRACTION:
            if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1:
                return float(value)
            raise self.error(node, f"{key} must be a share over 0 and at most 1, like 0.5{or_null}, got {self.describe(node)}")
        if kind == DURATION:
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise self.error(node, f"{key} must be a duration like 5m or 300 (seconds){or_null}, got {self.describe(node)}")
            try:
                seconds = parse_duration(value)
            except ValueError as e:
                raise self.error(node, f"{key}: {e}") from None
            if seconds is None and not nullable:
                raise self.error(node, f"{key} must be a duration like 5m, got {self.describe(node)}")
            return seconds
        raise AssertionError(f"limit {key} has kind {kind!r}, which the rules parser does not know")

    def check_pairs(self, limits: Limits, fields: Mapping[str, tuple[Node, Node]], fallback: Node, what: str) -> None:
        """Fields that go together (the many-image rule's two) must both be set once merged over the defaults,
        and a field that needs another (cache_ttl needs low_water) must have it."""
        for name, needed in _NEEDS:
            if getattr(limits, name) is not None and getattr(limits, needed) is None:
                node = fields[name][0] if name in fields else fallback
                raise self.error(node, f"{name} is set in {what} but {needed} is not: {name} needs it ({needed}: {_LIMIT_META[needed]['doc']})")
        for first, second in _PAIRS:
            if (getattr(limits, first) is None) != (getattr(limits, second) is None):
                given, missing = (first, second) if getattr(limits, first) is not None else (second, first)
                node = fields[given][0] if given in fields else fallback
                raise self.error(
                    node, f"{given} is set in {what} but {missing} is not: the two only work together ({first}: {_LIMIT_META[first]['doc']})"
                )

    def rule(self, node: Node, index: int, seen: dict[str, int]) -> Rule:
        what = f"rule #{index}"
        fields = self.mapping(node, what)
        if "name" not in fields:
            raise self.error(node, f"{what} has no name: add `name: <unique name>`")
        name_node = fields["name"][1]
        name = self.scalar(name_node)
        if not isinstance(name, str) or not name.strip():
            raise self.error(name_node, f"rule name must be non-empty text, got {self.describe(name_node)}")
        if name == "defaults":
            raise self.error(name_node, "rule name 'defaults' is reserved for the defaults section")
        if name in seen:
            raise self.error(name_node, f"duplicate rule name {name!r} (first on line {seen[name]})")
        seen[name] = line_of(name_node)
        what = f"rule {name!r}"
        self.reject_unknown(fields, ("name", "match", *LIMIT_FIELDS), what)

        globs: dict[str, tuple[str, ...]] = {}
        if "match" in fields and not self.is_null(fields["match"][1]):
            match = self.mapping(fields["match"][1], f"match of {what}")
            self.reject_unknown(match, _MATCH_KEYS, f"match of {what}", noun="key")
            for key, (_, vnode) in match.items():
                globs[key] = self.globs(vnode, key, f"match.{key} of {what}")
        return Rule(name, overrides=self.limit_fields(fields), line=line_of(node), **globs)

    def globs(self, node: Node, key: str, what: str) -> tuple[str, ...]:
        if isinstance(node, SequenceNode):
            items = list(node.value)
            if not items:
                raise self.error(node, f"{what} is an empty list, which would never match; remove it to match any")
        else:
            items = [node]
        out = []
        for item in items:
            value = self.scalar(item)
            if not isinstance(value, str):
                raise self.error(item, f"{what} must be a glob (quoted text) or a list of globs, got {self.describe(item)}")
            if not value:
                raise self.error(item, f'{what} has an empty glob; use "*" to match anything')
            self.check_glob(item, value, key, what)
            out.append(value)
        return tuple(out)

    def check_glob(self, node: Node, glob: str, key: str, what: str) -> None:
        """A glob that cannot compile is an error; one that looks like a regular expression, a warning."""
        try:
            compile_globs([glob], ignore_case=False)
        except re.error as e:
            raise self.error(node, f"{what} {glob!r} is not a valid glob ({e})") from None
        warning = regex_warning(glob, key)
        if warning is not None:
            self.warn(node, f"{what} {warning}")

    def endpoint(self, node: Node) -> Endpoint:
        fields = self.mapping(node, "an endpoint")
        self.reject_unknown(fields, _ENDPOINT_KEYS, "an endpoint", noun="key")
        for key in ("path", "format"):
            if key not in fields:
                raise self.error(node, f'endpoint has no {key}: write {{path: "*/chat/completions", format: openai-chat}}')
        values: dict[str, str] = {}
        for key, (_, vnode) in fields.items():
            value = self.scalar(vnode)
            if not isinstance(value, str) or not value:
                raise self.error(vnode, f"endpoint {key} must be non-empty text, got {self.describe(vnode)}")
            values[key] = value
            if key in ("host", "path"):
                self.check_glob(vnode, value, key, f"endpoint {key}")
        if values["format"] not in FORMAT_NAMES:
            fmt_node = fields["format"][1]
            fmt = values["format"]
            raise self.error(fmt_node, f"unknown format {fmt!r}{did_you_mean(fmt, FORMAT_NAMES)} (formats: {', '.join(FORMAT_NAMES)})")
        return Endpoint(**values)
