"""The rules file: which requests are LLM calls (endpoints) and what limits apply to them (rules).

Pure Python, no mitmproxy. The file is read with _yaml's line-aware reader, so every error names the
file and line it comes from; globs are compiled once at load because `limits_for` and `format_for`
run on every request.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from yaml.nodes import Node, SequenceNode

from ._placeholder import PLACEHOLDER_FIELDS, REPEAT_FIELDS
from ._policy import BOOL, COUNT, DURATION, FRACTION, LIMIT_FIELDS, SIDE, SIZE, TEMPLATE, Limits
from ._sizes import parse_duration, parse_size
from ._yaml import NodeReader, did_you_mean, line_of, read_text, shipped_file
from .errors import RulesError
from .formats import ENDPOINTS, FORMATS

log = logging.getLogger("trimflow")

DEFAULT_RULES_PATH: Path = shipped_file("default.yaml")

# Wire format names, in the formats package's order.
FORMAT_NAMES: tuple[str, ...] = tuple(FORMATS)

# Sample values for checking a placeholder template at load time, in the types _placeholder.render
# passes: numbers are ints so a format spec such as {bytes:,} is checked as it will be used, and
# the second set has width/height unknown ("?") as they are for an unreadable image.
_PLACEHOLDER_SAMPLES: tuple[Mapping[str, Any], ...] = (
    {
        "kind": "image",
        "ordinal": 3,
        "mime": "image/png",
        "dims": "1024x768",
        "size": "669KB",
        "bytes": 685_000,
        "width": 1024,
        "height": 768,
        "reason": "max_images",
    },
    {
        "kind": "document",
        "ordinal": 1,
        "mime": "unknown type",
        "dims": "unknown size",
        "size": "remote",
        "bytes": 120,
        "width": "?",
        "height": "?",
        "reason": "max_body_bytes",
    },
)

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
_MATCH_KEYS = ("host", "path", "model")
_ENDPOINT_KEYS = ("path", "format", "host")


# --- matching ---------------------------------------------------------------------------------


def _compile(globs: Iterable[str], *, ignore_case: bool) -> re.Pattern[str] | None:
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


def _bare_host(host: str) -> str:
    """Host without port, IPv6 brackets or trailing dot: "API.x.com:443" -> "API.x.com"."""
    if host.startswith("["):
        end = host.find("]")
        if end != -1:
            return host[1:end]
    elif host.count(":") == 1:  # more than one colon is a bare IPv6 address, not host:port
        host = host.partition(":")[0]
    return host.rstrip(".")


@dataclass(frozen=True, slots=True)
class Target:
    """Where an LLM request goes, resolved once per request: the host the client addressed (bare),
    the URL path without its query, and the wire format its endpoint names (None: the body's shape tells)."""

    host: str
    path: str
    format: str | None


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Requests to `path` (a glob on the URL path, case-sensitive) on `host` speak wire format `format`."""

    path: str
    format: str
    host: str = "*"
    _path_re: re.Pattern[str] | None = field(init=False, repr=False, compare=False)
    _host_re: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.format not in FORMAT_NAMES:
            raise ValueError(f"unknown format {self.format!r}; use one of {', '.join(FORMAT_NAMES)}")
        object.__setattr__(self, "_path_re", _compile([self.path], ignore_case=False))
        object.__setattr__(self, "_host_re", _compile([self.host], ignore_case=True))

    def matches(self, host: str, path: str) -> bool:
        return self._hit(_bare_host(host), path.partition("?")[0])

    def _hit(self, host: str, path: str) -> bool:
        return (self._path_re is None or self._path_re.match(path) is not None) and (self._host_re is None or self._host_re.match(host) is not None)


@dataclass(frozen=True, slots=True)
class Rule:
    """One entry of `rules:`: all given glob lists must match (any glob of a list); empty = any.

    `overrides` holds only the fields the rule sets; the rest come from the file's defaults.
    """

    name: str
    host: tuple[str, ...] = ()
    path: tuple[str, ...] = ()
    model: tuple[str, ...] = ()
    overrides: Mapping[str, Any] = field(default_factory=dict, hash=False)
    line: int = field(default=0, compare=False)
    _host_re: re.Pattern[str] | None = field(init=False, repr=False, compare=False)
    _path_re: re.Pattern[str] | None = field(init=False, repr=False, compare=False)
    _model_re: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        unknown = set(self.overrides) - set(LIMIT_FIELDS)
        if unknown:
            raise ValueError(f"rule {self.name!r}: unknown fields {sorted(unknown)}")
        for key in ("host", "path", "model"):
            object.__setattr__(self, key, tuple(getattr(self, key)))
        object.__setattr__(self, "overrides", MappingProxyType(dict(self.overrides)))
        object.__setattr__(self, "_host_re", _compile(self.host, ignore_case=True))
        object.__setattr__(self, "_path_re", _compile(self.path, ignore_case=False))
        object.__setattr__(self, "_model_re", _compile(self.model, ignore_case=True))

    def matches(self, host: str, path: str, model: str | None) -> bool:
        return self._hit(_bare_host(host), path.partition("?")[0], model)

    def _hit(self, host: str, path: str, model: str | None) -> bool:
        if self._host_re is not None and self._host_re.match(host) is None:
            return False
        if self._path_re is not None and self._path_re.match(path) is None:
            return False
        if self._model_re is not None and (model is None or self._model_re.match(model) is None):
            return False
        return True


@dataclass(frozen=True)
class Rules:
    """A loaded rules file. Lookups are first-match-wins over `rules` and `endpoints`."""

    source: str
    defaults: Limits
    rules: tuple[Rule, ...]
    endpoints: tuple[Endpoint, ...]
    detect_by_shape: bool = True
    # "file:line: problem" for each pattern that loads but likely never matches as meant (logged at load).
    warnings: tuple[str, ...] = field(default=(), compare=False)
    # Each rule with its fields already merged over the defaults, so a lookup only matches.
    _table: tuple[tuple[Rule, Limits], ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", tuple(self.rules))
        object.__setattr__(self, "endpoints", tuple(self.endpoints))
        table = tuple((r, dataclasses.replace(self.defaults, rule=r.name, **r.overrides)) for r in self.rules)
        object.__setattr__(self, "_table", table)

    def format_for(self, host: str, path: str) -> str | None:
        """Wire format of the first endpoint matching host and path (query ignored), else None."""
        host, path = _bare_host(host), path.partition("?")[0]
        for ep in self.endpoints:
            if ep._hit(host, path):
                return ep.format
        return None

    def target(self, host: str, path: str, *, method: str = "POST", content_type: str | None = None, wire_format: str | None = None) -> Target | None:
        """The request's Target when it is (or may be) an LLM request, else None: the one test the proxy,
        the audit and the tools share. A POST to an endpoint is one; any other POST may be, by its
        body's shape, when detect_by_shape is on and its content type (when known) is JSON.
        `wire_format` forces the format (a Responses WebSocket message, whatever its method)."""
        host, path = _bare_host(host), path.partition("?")[0]
        if wire_format is not None:
            return Target(host, path, wire_format)
        if method != "POST":
            return None
        fmt = self.format_for(host, path)
        if fmt is None and not (self.detect_by_shape and (content_type is None or "json" in content_type.lower())):
            return None
        return Target(host, path, fmt)

    def target_for_url(self, url: str, headers: Mapping[str, str] | None = None, wire_format: str | None = None) -> Target | None:
        """`target` for a POST to `url`; a Host header, when given, names the host as it does for the proxy."""
        parts = urlsplit(url)
        lowered = {k.lower(): v for k, v in (headers or {}).items()}
        host = lowered.get("host") or parts.hostname or ""
        return self.target(host, parts.path or "/", content_type=lowered.get("content-type"), wire_format=wire_format)

    def with_limits(self, **fields: Any) -> Rules:
        """These rules with `fields` forced on the defaults and on every rule (command-line overrides)."""
        rules = tuple(dataclasses.replace(r, overrides={**r.overrides, **fields}) for r in self.rules)
        return dataclasses.replace(self, defaults=dataclasses.replace(self.defaults, **fields), rules=rules)

    def limits_for(self, host: str, path: str, model: str | None) -> Limits:
        """Limits of the first matching rule (Limits.rule = its name), else the defaults."""
        host, path = _bare_host(host), path.partition("?")[0]
        for rule, limits in self._table:
            if rule._hit(host, path, model):
                return limits
        return self.defaults


# Wire formats by URL path, first match wins: each format module owns its path globs (formats.ENDPOINTS).
# rules/default.yaml spells the same list out (a test checks).
BUILTIN_ENDPOINTS: tuple[Endpoint, ...] = tuple(Endpoint(glob, fmt) for glob, fmt in ENDPOINTS)


@functools.cache
def builtin_rules() -> Rules:
    """The built-in endpoints and no limits at all, for tools and tests without a rules file."""
    return Rules("<builtin>", Limits(), (), BUILTIN_ENDPOINTS, True)


def _binary_size(n: int) -> str:
    """A byte count in the largest binary unit that divides it: 1024 -> "1KiB", 1000 -> "1000B"."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def check_placeholder(template: str, field: str = "placeholder") -> None:
    """Raise ValueError unless `template` formats with the known placeholder fields.

    `field` is the rules field it is for: "repeat_placeholder" also knows {later}.
    """
    known = REPEAT_FIELDS if field == "repeat_placeholder" else PLACEHOLDER_FIELDS
    fields = ", ".join("{" + f + "}" for f in known)
    for i, sample in enumerate(_PLACEHOLDER_SAMPLES):
        unknown_dims = "; {width} and {height} are '?' when an image's size is unknown" if i else ""
        try:
            template.format(**sample, **({"later": 7} if "later" in known else {}))
        except KeyError as e:
            name = str(e.args[0])
            raise ValueError(f"{field} has an unknown field {{{name}}}{did_you_mean(name, known)}; fields: {fields}") from None
        except IndexError:
            raise ValueError(f"{field} has a field without a name ({{}}); use one of {fields}") from None
        except ValueError as e:
            hint = unknown_dims or "; write {{ and }} for a literal brace"
            raise ValueError(f"{field} is not a valid template ({e}){hint}") from None
        except (AttributeError, TypeError) as e:
            raise ValueError(f"{field} is not a valid template ({e}){unknown_dims}") from None
    if not template.strip():
        # Some providers reject an empty text block; a placeholder must say something.
        raise ValueError(f"{field} must not be empty")


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

    def __init__(self, path: str | os.PathLike[str], *, check_interval: float = 1.0) -> None:
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
            _compile([glob], ignore_case=False)
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
