"""trimflow's options at startup: a bad value or a misspelt name stops mitmproxy with one line, before
the proxy listens.

mitmproxy parses the command line before it loads a script, so it keeps the `--set` values of options
no addon has declared yet ("deferred") and applies them once the script's addons are registered. There:
- a value mitmproxy cannot parse (`trimflow_keep_memory=maybe`) raises in the task that loads the
  script; nothing reads that task's error, and the script's addons never join the chain, so the proxy
  forwards everything untouched and says nothing;
- a name that no addon declares (`trimflow_metrik`) is kept for ever and never reported;
- an OptionsError from `configure` is logged with a traceback, and mitmproxy's errorcheck addon exits
  only once the proxy is listening.
So while mitmproxy starts, an error ends the process at once with its one line (sys.exit, as errorcheck
itself exits). Later (an option changed in mitmweb or the console) `configure` raises OptionsError, and
mitmproxy shows it and keeps the previous value.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from mitmproxy import ctx, exceptions
from mitmproxy.addonmanager import Loader

from .._yaml import closest

log = logging.getLogger("trimflow")

PREFIX = "trimflow_"
_BOOL_WORDS = ("true", "false", "toggle")  # what mitmproxy's --set takes for a bool; nothing, too (true)

A = TypeVar("A")


def confdir_path(option: str, confdir: str) -> str | None:
    """The file a path option names, `{confdir}` standing for mitmproxy's confdir: None for empty (no file)."""
    if not option:
        return None
    return os.path.expanduser(option.replace("{confdir}", confdir))


def starting() -> bool:
    """mitmproxy is starting: its errorcheck addon still watches the log, and would end the process for
    an error logged now, but only after the proxy is listening."""
    master = getattr(ctx, "master", None)
    checker = master.addons.get("errorcheck") if master is not None else None
    handler = getattr(checker, "logger", None)
    return handler is not None and handler in logging.getLogger().handlers


def exits_at_startup(configure: Callable[[A, set[str]], None]) -> Callable[[A, set[str]], None]:
    """For an addon's `configure`: its OptionsError ends mitmproxy with that one line while it starts,
    and is raised as usual once it runs."""

    @functools.wraps(configure)
    def checked(addon: A, updated: set[str]) -> None:
        try:
            configure(addon, updated)
        except exceptions.OptionsError as exc:
            if starting():
                sys.exit(str(exc))
            raise

    return checked


def check_writable(option: str, path: str) -> None:
    """OptionsError unless `path` can be appended to (its folder is made, as the writer would)."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise exceptions.OptionsError(f"trimflow: {option}: cannot write {path}: {exc.strerror or type(exc).__name__}") from None


class Options:
    """Checks the trimflow_* values given before the script was loaded (`--set`, config.yaml), and the
    names: last in the list, so every trimflow option is declared when its `load` runs, and before
    mitmproxy applies those values."""

    name = "trimflow_options"

    def load(self, loader: Loader) -> None:
        options = loader.master.options
        problems = deferred_problems(options.deferred, dict(options.items()))
        if not problems:
            return
        message = "trimflow: " + "; ".join(problem for _, problem in problems)
        if starting():
            sys.exit(message)
        # Loaded into a running mitmproxy: trimflow runs on its defaults for these rather than not at all.
        for name, _ in problems:
            options.deferred.pop(name, None)
        log.error("%s", message)


def deferred_problems(deferred: Mapping[str, Any], declared: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, problem) for each deferred trimflow option that is unknown or whose value mitmproxy would
    refuse. `declared` maps option names to mitmproxy's option objects (with `typespec`)."""
    ours = sorted(name for name in declared if name.startswith(PREFIX))
    problems = []
    for name, value in deferred.items():
        if not _looks_like_ours(name):
            continue  # another script's option, perhaps not loaded yet
        if name not in declared:
            problems.append((name, unknown_option(name, ours)))
            continue
        problem = bad_value(name, declared[name].typespec, value)
        if problem is not None:
            problems.append((name, problem))
    return problems


def _looks_like_ours(name: str) -> bool:
    return name.lower().replace("-", "_").replace(".", "_").startswith(PREFIX)


def unknown_option(name: str, known: list[str]) -> str:
    suffix = name[len(PREFIX) :].lower().replace("-", "_")
    match = closest(suffix, [option[len(PREFIX) :] for option in known])
    hint = f"; did you mean {PREFIX + match}?" if match else f" (trimflow's options: {', '.join(known)})"
    return f"unknown option {name}{hint}"


def bad_value(name: str, typespec: Any, value: Any) -> str | None:
    """Why mitmproxy would refuse `value` for the option, or None. A `--set` value comes as its strings
    (mitmproxy's deferred _UnconvertedStrings), a config.yaml value as YAML made it."""
    strings = getattr(value, "val", None)
    if isinstance(strings, list):
        if len(strings) > 1:
            return f"{name} is given {len(strings)} times ({', '.join(map(repr, strings))}): give it once"
        if typespec is bool and strings and strings[0] not in _BOOL_WORDS:
            return _not_a_bool(name, strings[0])
        return None
    if typespec is bool and not isinstance(value, bool):
        return _not_a_bool(name, value)
    if typespec is str and not isinstance(value, str):
        return f"{name} must be text, not {value!r}"
    return None


def _not_a_bool(name: str, value: Any) -> str:
    return f"{name} must be true or false, not {value!r} (--set {name}=false; --set {name} alone means true)"
