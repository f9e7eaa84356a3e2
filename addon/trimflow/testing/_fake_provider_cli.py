"""`python -m trimflow fake-provider` (scripts/fake-provider): the fake provider on a port of its own, one log line
per request (method, path without the query, status, sizes, image count; never a header or the body), until
interrupted."""

from __future__ import annotations

import argparse
import signal
import ssl
import sys
import time
from typing import Any

from .._limit_profiles import DEFAULT_PROFILES_PATH, load_profiles, provider_check
from ..cli._status import FAILED, fail
from ._fake_provider import DEFAULT_PORT, FakeProvider, is_loopback

# --- CLI ---------------------------------------------------------------------------------------------------


def _stderr_log(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fake-provider",
        description="An offline LLM provider on loopback (OpenAI chat/Responses, Anthropic, Gemini, Ollama, "
        "Bedrock Converse) that answers a fixed reply with realistic usage. Runs until Ctrl-C.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0: any free")
    parser.add_argument("--event-delay-ms", type=float, default=0.0, help="pause between streamed events")
    parser.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-key", help="the certificate's private key (PEM)")
    parser.add_argument(
        "--profile",
        help="refuse requests that break this limit profile, with the provider's own status, content type and text (names: rules/profiles.yaml)",
    )
    parser.add_argument("--profiles", default=str(DEFAULT_PROFILES_PATH), help="the profiles file (default: %(default)s)")
    parser.add_argument(
        "--cache",
        action="store_true",
        help="model each provider's prompt caching (reads, writes, TTL) and report it in the usage as the real API does",
    )
    args = parser.parse_args(argv)

    if not is_loopback(args.host):
        return fail("fake-provider", f"refusing to listen on {args.host!r}: only loopback hosts (127.0.0.1, ::1, localhost) are allowed")
    if bool(args.tls_cert) != bool(args.tls_key):
        return fail("fake-provider", "--tls-cert and --tls-key go together")
    check = None
    if args.profile:
        try:
            check = provider_check(load_profiles(args.profiles).get(args.profile))
        except ValueError as e:  # ProfilesError (file:line: problem) or UnknownProfile (lists the names)
            return fail("fake-provider", str(e))
    try:
        provider = FakeProvider(
            args.host,
            args.port,
            certfile=args.tls_cert,
            keyfile=args.tls_key,
            event_delay=max(args.event_delay_ms, 0.0) / 1000,
            log=_stderr_log,
            check=check,
            record=False,
            cache=args.cache,
        )
    except (OSError, ssl.SSLError) as e:
        return fail("fake-provider", f"cannot listen on {args.host}:{args.port}: {e}", FAILED)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    provider.start()
    enforcing = f", refusing like profile {args.profile}" if args.profile else ""
    caching = ", modelling prompt caching" if args.cache else ""
    print(f"fake-provider listening on {provider.url}{enforcing}{caching}", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        provider.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
