"""`scripts/audit`: how fast recorded LLM traffic grows per turn, which turn crosses which limit, what a
rules file would change, and a CI gate on all of it.

    scripts/audit FILE... [--rules FILE] [--profile NAME]... [--prices FILE] [--format text|json|markdown|html]
                  [--fail-on EXPR]... [--allow-empty] [--max-decoded-bytes SIZE] [--out PATH]

Inputs are mitmproxy dumps (`mitmdump -w`), HAR files and trimflow's metrics JSONL, several at once.
Exit 0 when every --fail-on expression holds nowhere, 1 when one is true somewhere (each named with
its conversation and turn on stderr) or when an input holds no LLM request (unless --allow-empty) or
is cut short (one line each on stderr), 2 for unusable input (a one-line reason on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

from .._decode import DEFAULT_MAX_DECODED_BYTES
from .._decode import OPTION as DECODE_OPTION
from .._human import format_size, parse_size
from .._limit_profiles import DEFAULT_PROFILES_PATH, UnknownProfile, load_profiles
from .._prices import DEFAULT_PRICES_PATH, load_prices
from .._rules import builtin_rules
from .._rules_file import DEFAULT_RULES_PATH, load_rules
from ..cli._status import FAILED, SUCCESS, USAGE_ERROR, fail, say
from ..errors import RulesError
from . import _gate, _html, _report
from ._gate import Gate
from ._read import InputError, Reader
from ._summary import ProfileLimits, summarize

FORMATS = {
    "text": _report.text,
    "json": _report.json,
    "markdown": _report.markdown,
    "html": _html.html,
}

EXIT_OK, EXIT_GATE, EXIT_UNUSABLE = SUCCESS, FAILED, USAGE_ERROR


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        say("trimflow audit", message)
        raise SystemExit(EXIT_UNUSABLE)


def parser() -> _Parser:
    p = _Parser(
        prog="scripts/audit",
        description=__doc__.split("\n\n")[0],
        epilog=_gate.__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="+", metavar="FILE", help=".mitm dump (mitmproxy 11 or 12), .har, or trimflow metrics .jsonl")
    p.add_argument(
        "--rules",
        metavar="FILE",
        help="what-if: apply this rules file offline to every recorded request and report before and after "
        f"(default: the recording as it is, with the limits of rules/{DEFAULT_RULES_PATH.name} for crossings)",
    )
    p.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="NAME",
        help="also report when each conversation crosses this limit profile's image and body limits (repeatable; e.g. axum-2mb, generic-8)",
    )
    p.add_argument(
        "--profiles",
        metavar="FILE",
        default=str(DEFAULT_PROFILES_PATH),
        help=f"the limit profiles file (default: rules/{DEFAULT_PROFILES_PATH.name})",
    )
    p.add_argument(
        "--prices",
        metavar="FILE",
        help=f"token prices per model family for the cost figures (default: rules/{DEFAULT_PRICES_PATH.name}); "
        "a model it does not price has an unknown cost",
    )
    p.add_argument("--format", choices=tuple(FORMATS), default="text", help="report format (default: text)")
    p.add_argument(
        "--fail-on",
        action="append",
        default=[],
        metavar="EXPR",
        help="exit 1 when EXPR is true for any request or conversation, e.g. 'images>8' (repeatable; quote it)",
    )
    p.add_argument(
        "--allow-empty",
        action="store_true",
        help="pass an input with no LLM request (by default it fails: the client may not have gone through "
        "the proxy); an input cut short fails all the same",
    )
    p.add_argument(
        "--max-decoded-bytes",
        type=_size,
        default=DEFAULT_MAX_DECODED_BYTES,
        metavar="SIZE",
        help="largest size a recorded compressed body (request or answer) is inflated to, as the proxy's "
        f"{DECODE_OPTION}; a request past it is counted unreadable, an answer past it unread "
        f"(default: {format_size(DEFAULT_MAX_DECODED_BYTES)}; bytes or k/m/g, binary)",
    )
    p.add_argument("--out", metavar="PATH", help="write the report to PATH instead of stdout")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): a code to return, like every other outcome
        return exc.code if isinstance(exc.code, int) else EXIT_UNUSABLE
    try:
        expressions = [_gate.parse(text) for text in args.fail_on]
    except _gate.ExpressionError as exc:
        return _fail(str(exc))
    try:
        if args.rules:
            engine_rules = limit_rules = load_rules(args.rules)
            limits_source = args.rules
        else:
            engine_rules, limit_rules = builtin_rules(), load_rules(DEFAULT_RULES_PATH)
            limits_source = f"{DEFAULT_RULES_PATH.parent.name}/{DEFAULT_RULES_PATH.name}"
        profiles = _profile_limits(args.profile, args.profiles)
        prices = load_prices(args.prices)
    except (RulesError, UnknownProfile) as exc:  # ProfilesError is a RulesError, and so is a prices file's error
        return _fail(str(exc))
    reader = Reader(engine_rules, limit_rules, what_if=bool(args.rules), max_decoded_bytes=args.max_decoded_bytes)
    try:
        inputs = reader.check(args.files)
        summary = summarize(reader.rows(inputs), reader.tallies, args.rules, limits_source, profiles, prices)
    except InputError as exc:
        return _fail(str(exc))
    input_failures = _gate.check_inputs(summary, allow_empty=args.allow_empty)
    gate = Gate(expressions, _gate.evaluate(expressions, summary), input_failures) if expressions or input_failures else None
    report = FORMATS[args.format](summary, gate)
    try:
        _write(report, args.out)
    except OSError as exc:
        return _fail(f"cannot write {args.out}: {exc.strerror or type(exc).__name__}")
    for warning in _report.warnings(summary, gate):
        say("trimflow audit", f"warning: {warning}")
    if gate is not None and not gate.ok:
        for failure in gate.input_failures:
            say("trimflow audit", f"FAIL {failure.text}")
        for breach in gate.breaches:
            say("trimflow audit", f"FAIL {breach.line()}")
        return EXIT_GATE
    return EXIT_OK


def _profile_limits(names: list[str], path: str) -> list[ProfileLimits]:
    if not names:
        return []
    profiles = load_profiles(path)
    out = []
    for name in names:
        profile = profiles.get(name)
        out.append(ProfileLimits(profile.name, profile.max_images, profile.max_body_bytes))
    return out


def _size(value: str) -> int:
    """A --max-decoded-bytes value: a size, never unbounded."""
    try:
        size = parse_size(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if size is None or size <= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: a compressed body needs a bound (a size such as 256MB)")
    return size


def _write(report: str, out: str | None) -> None:
    if out is None:
        # As UTF-8 bytes whatever the locale: the reports use a few non-ASCII signs (·, →, ✅).
        sys.stdout.flush()
        sys.stdout.buffer.write(report.encode("utf-8"))
        sys.stdout.buffer.flush()
        return
    path = Path(out)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(report, encoding="utf-8")
    os.replace(tmp, path)  # a CI step never picks up half a report


def _fail(reason: str) -> int:
    return fail("trimflow audit", reason)


if __name__ == "__main__":
    sys.exit(main())
