"""`scripts/prune`: apply the rules to one request body from stdin, offline.

stdout is the body that would be forwarded; stderr ends with one JSON line, the metrics record.
Exit 2 with a one-line reason (and nothing on stdout) for a body that is not JSON or a URL of no
known format.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .. import _jsoncodec
from .._engine import prune_request
from .._human import parse_size
from .._record import ENFORCE, MODES
from .._rules_file import DEFAULT_RULES_PATH, load_rules
from ..errors import RulesError
from ._status import fail

LIMIT_FLAGS = ("max_images", "max_body_bytes", "keep_recent", "prune_batch")


def _size(text: str) -> int | None:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(text: str) -> int | None:
    if text.lower() in ("none", "null"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or 'none', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {value}")
    return value


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError("a header is 'Name: value'")
    return name.strip(), value.strip()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/prune", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the request URL (its path picks the wire format, its host and model the rule)")
    p.add_argument("--header", action="append", type=_header, default=[], metavar="'NAME: VALUE'", help="a request header (repeatable)")
    p.add_argument("--rules", help=f"rules file (default: {DEFAULT_RULES_PATH} unless a limit flag is given)")
    # Limit flags override the rules' values; absent flags leave them (SUPPRESS: no attribute at all).
    p.add_argument("--max-images", type=_count, default=argparse.SUPPRESS, help="keep at most this many images ('none': no limit)")
    p.add_argument(
        "--max-body-bytes",
        type=_size,
        default=argparse.SUPPRESS,
        metavar="SIZE",
        help="body budget: bytes or k/m/g, KB/MB/GB, KiB/MiB/GiB (binary); 'none': no limit",
    )
    p.add_argument("--keep-recent", type=_count, default=argparse.SUPPRESS, help="never prune the newest N images")
    p.add_argument(
        "--prune-batch",
        type=_count,
        default=argparse.SUPPRESS,
        metavar="N",
        help="cut the oldest images N at a time (default: the rules', except with --max-images, which then keeps exactly that many)",
    )
    p.add_argument("--mode", choices=MODES, default=ENFORCE, help="observe: report only, output the body unchanged")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    overrides: dict[str, Any] = {field: getattr(args, field) for field in LIMIT_FLAGS if hasattr(args, field)}
    if overrides.get("keep_recent", 0) is None:
        return _fail("--keep-recent takes a whole number")
    if not overrides.get("prune_batch", 1):
        return _fail("--prune-batch takes a whole number >= 1")
    if "max_images" in overrides:
        # A cap given for one request means that many images: the rules' batches, low-water mark and cap after an
        # overflow are for a conversation's turns.
        overrides.setdefault("prune_batch", 1)
        overrides["low_water"] = None
        overrides["max_images_after_overflow"] = None
    try:
        rules = load_rules(args.rules or DEFAULT_RULES_PATH)
    except RulesError as exc:
        return _fail(str(exc))
    if overrides:
        rules = rules.with_limits(**overrides)
    body = sys.stdin.buffer.read()
    try:
        _jsoncodec.loads(body)
    except _jsoncodec.BodyError as exc:
        return _fail(str(exc))
    outcome = prune_request(args.url, dict(args.header), body, rules, args.mode)
    if outcome.record is None:
        return _fail(f"no known LLM format for {args.url.split('?', 1)[0]} (and the body has none of their shapes)")
    sys.stdout.buffer.write(outcome.body)
    sys.stdout.buffer.flush()
    if outcome.record.reason:
        print(f"trimflow: forwarded untouched: {outcome.record.reason}", file=sys.stderr)
    sys.stderr.buffer.write(outcome.record.to_json() + b"\n")
    return 0


def _fail(reason: str) -> int:
    return fail("trimflow prune", reason)


if __name__ == "__main__":
    sys.exit(main())
