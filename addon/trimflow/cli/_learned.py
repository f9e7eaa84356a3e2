"""`python -m trimflow learned`: list the limits trimflow learned from providers' answers, say what each does, and
forget them (docs/recovery.md).

    learned [--file FILE] [--ttl 7d] [list]
    learned [--file FILE] forget (--all | [--upstream URL] [--model NAME] [--limit FIELD])

A running proxy sees a change within a second. The file is changed under its lock and replaced in one rename, as
the proxy writes it; a file that cannot be read is never changed.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from .._human import format_duration, parse_duration
from .._learned_limits import DEFAULT_TTL, FILE_NAME, FLOORS, Entry, LearnedFile, LearnedLimits, locked, ordered, write_entries
from .._text import for_text
from ..errors import RulesError
from ._status import FAILED, fail, say

DEFAULT_FILE = f"~/.mitmproxy/{FILE_NAME}"  # mitmproxy's default confdir: trimflow_learned's default
FORGET_PATIENCE = 10.0  # seconds to wait for the file's lock: a person can wait where a proxy must not


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m trimflow learned", description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", default=DEFAULT_FILE, help=f"the learned-limits file (default {DEFAULT_FILE}: trimflow_learned's)")
    parser.add_argument("--ttl", default=f"{DEFAULT_TTL / 86400:.0f}d", help="trimflow_learned_ttl, to tell what has expired (default %(default)s)")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("list", help="each entry, what it does and when it expires (the default)")
    forget = commands.add_parser("forget", help="remove entries: all of them, or those matching every filter given")
    forget.add_argument("--all", action="store_true", help="every entry")
    forget.add_argument("--upstream", help="e.g. https://api.openai.com:443")
    forget.add_argument("--model", help="a model name; 'every' for the entries that hold for every model")
    forget.add_argument("--limit", choices=sorted(FLOORS), help="one limit")
    args = parser.parse_args(argv)
    try:
        ttl = parse_duration(args.ttl)
    except ValueError as exc:
        parser.error(str(exc))
    path = Path(os.path.expanduser(args.file))
    if args.command == "forget":
        if not (args.all or args.upstream or args.model or args.limit):
            parser.error("forget needs --all or at least one of --upstream, --model, --limit")
        return _forget(path, args)
    return _list(path, ttl)


def _read(path: Path) -> list[Entry] | None:
    try:
        return list(LearnedFile(path).read().values()) if path.exists() else []
    except RulesError as exc:
        say("trimflow learned", str(exc))
        return None


def _list(path: Path, ttl: float | None) -> int:
    entries = _read(path)
    if entries is None:
        return FAILED
    if not entries:
        print(f"{for_text(str(path))}: no learned limits")
        return 0
    store = LearnedLimits(None, ttl=ttl)
    now = time.time()
    live = [e for e in entries if not store.expired(e, now)]
    print(f"{for_text(str(path))}: {len(entries)} learned limits, {len(live)} apply now")
    for entry in ordered(entries):
        model = for_text(entry.model) if entry.model is not None else "every model"
        if ttl is None:
            state = "never expires"
        else:
            state = "expired" if store.expired(entry, now) else f"expires in {format_duration(entry.learned_at + ttl - now)}"
        print(f"\n{for_text(entry.upstream)}  {model}  {entry.limit}={entry.value}")
        print(f"  learned {for_text(entry.learned) or 'at an unknown time'} ({state}), from: {for_text(entry.source) or 'not said'}")
        print(f"  requests for {model} sent to {for_text(entry.upstream)} are cut to {entry.limit}={entry.value} where the rules allow more")
    return 0


def _forget(path: Path, args: argparse.Namespace) -> int:
    if not path.exists():
        print(f"{for_text(str(path))}: no learned limits")
        return 0
    target = Path(os.path.realpath(path))
    with locked(target, FORGET_PATIENCE) as held:
        if not held:
            return fail("trimflow learned", f"{path} stays locked by another process; nothing changed", FAILED)
        entries = _read(path)
        if entries is None:
            return FAILED
        kept = [e for e in entries if not _matches(e, args)]
        if len(kept) != len(entries):
            write_entries(target, kept)
    print(f"{for_text(str(path))}: forgot {len(entries) - len(kept)} learned limits, {len(kept)} left")
    return 0


def _matches(entry: Entry, args: argparse.Namespace) -> bool:
    if args.all:
        return True
    if args.upstream and entry.upstream != args.upstream.lower():
        return False
    if args.model:
        wanted = None if args.model == "every" else args.model.lower()
        if (entry.model.lower() if entry.model is not None else None) != wanted:
            return False
    return not (args.limit and entry.limit != args.limit)
