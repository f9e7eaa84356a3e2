"""The rules: which requests are LLM calls (endpoints, each naming a wire format) and what limits apply to each
(rules matched by host, path and model globs, the first match winning, else the defaults). Globs are compiled once
when the rules are built, because `limits_for` and `format_for` run on every request. Read from YAML by
trimflow._rules_file.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from ._globs import compile_globs
from ._limits import LIMIT_FIELDS, Limits
from .formats import ENDPOINTS, FORMATS

# Wire format names, in the formats package's order.
FORMAT_NAMES: tuple[str, ...] = tuple(FORMATS)

# --- matching ---------------------------------------------------------------------------------


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
        object.__setattr__(self, "_path_re", compile_globs([self.path], ignore_case=False))
        object.__setattr__(self, "_host_re", compile_globs([self.host], ignore_case=True))

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
        object.__setattr__(self, "_host_re", compile_globs(self.host, ignore_case=True))
        object.__setattr__(self, "_path_re", compile_globs(self.path, ignore_case=False))
        object.__setattr__(self, "_model_re", compile_globs(self.model, ignore_case=True))

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
