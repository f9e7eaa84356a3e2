"""scripts/replay: drive a synthetic screenshot session through a proxy (or straight at a provider).

(`scripts/replay --policies` is the other mode, from a source checkout: tests/research/policy_runner.py, the
reference sessions through each pruning policy in process, against the prompt cache model.)

Each turn adds one real screenshot of about --image-kb KB (a distinct image per turn) and sends the
whole history again, as agents do, then prints one row: the turn, the body bytes sent, the images in
it, the HTTP status, and the body bytes the upstream received (the fake provider reports them in
X-Fake-Provider-Received-Bytes; "-" when the answer came from elsewhere, e.g. a simulated limit).
A failing turn does not stop the run: an agent keeps trying, and so does the replay.

Offline, with no key: scripts/fake-provider as the upstream, mitmdump in reverse mode in front of it.
Bodies and answers are never printed, only sizes, counts and the provider's error message.
"""

from __future__ import annotations

import argparse
import http.client
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from urllib.parse import quote, urlsplit

import orjson

from ..cli._status import fail
from ..formats import FORMATS
from ._fake_provider import RECEIVED_BYTES_HEADER
from ._synthetic import MIME, PATHS, b64, screenshot, session_body

# Built into the body in place of each screenshot, then swapped for that turn's own image: the
# synthetic session builders take one image for every turn, an agent sends a new one each turn.
_MARKER_SHOT = b"trimflow replay screenshot"
_MARKER = b64(_MARKER_SHOT).encode()
_SYSTEM = b'"You are a desktop assistant."'  # the system prompt of every synthetic session
_TOOL_TEXT = (
    "Tool computer(action, x, y, text): click, double_click, type or scroll at pixel x, y of the "
    "current screen; returns a screenshot of the screen afterwards. "
)


@dataclass(frozen=True, slots=True)
class ReplayedTurn:
    turn: int
    sent_bytes: int
    images: int
    status: int | None  # None: no HTTP answer at all (see error)
    upstream_bytes: int | None  # what the upstream says it received; None when it did not say
    error: str | None = None  # the failure's message (provider error text or connection error)

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def request_path(wire_format: str, model: str | None = None) -> str:
    """The synthetic session's request path, with `model` where the format keeps it in the URL (Gemini, Bedrock)."""
    path = PATHS[wire_format]
    named = FORMATS[wire_format].model({}, path)  # the model the path names, read as trimflow reads it
    if model and named:
        path = path.replace(quote(named, safe=""), quote(model, safe=""), 1)
    return path


class Session:
    """The bodies of one synthetic screenshot session: turn N re-sends turns 1..N, one image each."""

    def __init__(self, wire_format: str, image_kb: int, *, image_format: str = "WEBP", model: str | None = None, system_kb: int = 0) -> None:
        self.wire_format, self.image_kb, self.image_format, self.model = wire_format, image_kb, image_format, model
        self.mime = MIME[image_format]
        self.system = orjson.dumps(_system_text(system_kb)) if system_kb > 0 else None
        self._shots: list[bytes] = []  # base64 of turn 1's image, turn 2's, ...

    def shot(self, turn: int) -> bytes:
        while len(self._shots) < turn:
            seed = len(self._shots) + 1  # a different real image every turn
            self._shots.append(b64(screenshot(self.image_kb, self.image_format, seed)).encode())
        return self._shots[turn - 1]

    def body(self, turn: int) -> bytes:
        body = orjson.dumps(session_body(self.wire_format, turn, _MARKER_SHOT, self.mime, self.model))
        if self.system is not None:
            if body.count(_SYSTEM) != 1:
                raise RuntimeError(f"cannot find the system prompt of the {self.wire_format} session to pad it")
            body = body.replace(_SYSTEM, self.system)
        parts = body.split(_MARKER)
        if len(parts) != turn + 1:
            raise RuntimeError(f"expected {turn} screenshots in the {self.wire_format} session, found {len(parts) - 1}")
        out = [parts[0]]
        for i, part in enumerate(parts[1:], start=1):
            out += [self.shot(i), part]
        return b"".join(out)


def _system_text(kilobytes: int) -> str:
    """A system prompt of `kilobytes` KB: what an agent's instructions and tool definitions weigh."""
    target = kilobytes * 1024
    text = "You are a desktop assistant. "
    return (text + _TOOL_TEXT * (target // len(_TOOL_TEXT) + 1))[:target]


def replay(base_url: str, session: Session, turns: int, *, path: str | None = None, timeout: float = 300.0) -> Iterator[ReplayedTurn]:
    """Send turns 1..`turns` of `session` to `base_url` + `path`; one ReplayedTurn per turn, failures included."""
    url = urlsplit(base_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"not an http(s) base URL: {base_url!r}")
    target = url.path.rstrip("/") + (path or request_path(session.wire_format, session.model))
    for turn in range(1, turns + 1):
        body = session.body(turn)
        yield _send(url.scheme, url.hostname, url.port, target, body, turn, timeout)


def _send(scheme: str, host: str, port: int | None, target: str, body: bytes, turn: int, timeout: float) -> ReplayedTurn:
    connection_class = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    conn = connection_class(host, port, timeout=timeout)
    try:
        conn.request("POST", target, body=body, headers={"content-type": "application/json"})
        response = conn.getresponse()
        answer = response.read()
        received = response.getheader(RECEIVED_BYTES_HEADER)
        status = response.status
        error = None if 200 <= status < 300 else answer_text(response.getheader("content-type", ""), answer)
        upstream = int(received) if received and received.isdigit() else None
        return ReplayedTurn(turn, len(body), turn, status, upstream, error)
    except (OSError, http.client.HTTPException) as e:
        return ReplayedTurn(turn, len(body), turn, None, None, f"no answer: {type(e).__name__}: {e}"[:200])
    finally:
        conn.close()


def answer_text(content_type: str, body: bytes, limit: int = 160) -> str:
    """The message of an error answer: a JSON error's message, an HTML page's title, else the text."""
    text = None
    if "json" in content_type:
        try:
            text = _message(orjson.loads(body))
        except orjson.JSONDecodeError:
            pass
    elif "html" in content_type:
        title = re.search(rb"<title>(.*?)</title>", body, re.IGNORECASE | re.DOTALL)
        text = title.group(1).decode("utf-8", "replace").strip() if title else None
    if text is None:
        text = body.decode("utf-8", "replace").strip().splitlines()[0] if body.strip() else ""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _message(value: object) -> str | None:
    if isinstance(value, dict):
        if isinstance(value.get("message"), str):
            return value["message"]
        for key in ("error", "detail"):
            found = _message(value.get(key))
            if found is not None:
                return found
    if isinstance(value, list) and value:
        return _message(value[0])
    return None


# --- CLI ---------------------------------------------------------------------------------------


def _table_header() -> str:
    return f"{'turn':>4}  {'sent_bytes':>12}  {'images':>6}  {'status':>6}  {'upstream_bytes':>14}  answer"


def _table_row(row: ReplayedTurn) -> str:
    status = "-" if row.status is None else str(row.status)
    upstream = "-" if row.upstream_bytes is None else f"{row.upstream_bytes:,}"
    return (f"{row.turn:>4}  {row.sent_bytes:>12,}  {row.images:>6}  {status:>6}  {upstream:>14}  {'ok' if row.ok else row.error or ''}").rstrip()


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if "--policies" in args_in:
        # The other mode is research beside the bench (tests/research), which the package does not ship.
        return fail("replay", "--policies runs from a source checkout: scripts/replay --policies (docs/caching.md)")
    parser = argparse.ArgumentParser(
        prog="replay",
        epilog="scripts/replay --policies [--session NAME] [--policy NAME] [--json], from a source checkout, runs the "
        "reference sessions through each pruning policy against a model of the providers' prompt caching instead "
        "(see docs/caching.md).",
        description="Send a synthetic screenshot session turn by turn (one new real image per turn, the whole "
        "history every turn) and print one row per turn: body bytes sent, images, HTTP status, body bytes the "
        "upstream received. Exit status 0 when every turn succeeded, 1 when any failed.",
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--proxy", metavar="URL", help="base URL of trimflow in reverse mode, e.g. http://127.0.0.1:8080")
    where.add_argument("--target", metavar="URL", help="base URL of the provider itself, e.g. http://127.0.0.1:8700")
    parser.add_argument("--turns", type=int, required=True, help="how many turns to send")
    parser.add_argument("--image-kb", type=int, required=True, help="size of each screenshot in KB (1024 bytes)")
    parser.add_argument("--format", required=True, choices=sorted(PATHS), help="the wire format to speak")
    parser.add_argument("--model", help="model name (in the body, or in the URL for gemini and bedrock-converse)")
    parser.add_argument("--path", help="request path instead of the format's usual one, e.g. /v2/chat/completions")
    parser.add_argument("--image-format", default="WEBP", choices=sorted(MIME), help="screenshot encoding (default WEBP)")
    parser.add_argument(
        "--system-kb",
        type=int,
        default=0,
        help="pad the system prompt to this many KB, standing in for an agent's instructions and tool definitions (default 0: a one-line prompt)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each answer (default 300)")
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON array instead of a table")
    args = parser.parse_args(args_in)
    for name in ("turns", "image_kb"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.system_kb < 0:
        parser.error("--system-kb must not be negative")

    base_url = args.proxy or args.target
    session = Session(args.format, args.image_kb, image_format=args.image_format, model=args.model, system_kb=args.system_kb)
    via = "via proxy" if args.proxy else "direct to"
    print(
        f"replay: {args.turns} turns of {args.format}, one ~{args.image_kb} KB {args.image_format} screenshot per turn, {via} {base_url}",
        file=sys.stderr,
        flush=True,
    )
    rows: list[ReplayedTurn] = []
    started = time.monotonic()
    try:
        if not args.json:
            print(_table_header(), flush=True)
        for row in replay(base_url, session, args.turns, path=args.path, timeout=args.timeout):
            rows.append(row)
            if not args.json:
                print(_table_row(row), flush=True)
    except ValueError as e:
        return fail("replay", str(e))
    except KeyboardInterrupt:
        print("replay: interrupted", file=sys.stderr)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps([asdict(r) for r in rows], option=orjson.OPT_INDENT_2) + b"\n")
    failed = [r for r in rows if not r.ok]
    elapsed = time.monotonic() - started
    if failed:
        first = failed[0]
        print(
            f"replay: first failure at turn {first.turn} ({first.status or 'no answer'}); {len(failed)} of {len(rows)} turns failed; {elapsed:.1f}s",
            file=sys.stderr,
        )
    else:
        print(f"replay: no failure in {len(rows)} turns; {elapsed:.1f}s", file=sys.stderr)
    return 1 if failed or len(rows) < args.turns else 0


if __name__ == "__main__":
    sys.exit(main())
