"""Helpers of the end-to-end tests: real mitmdump processes with the addon, screenshot sessions whose images
are all different (so "the newest images were kept" is checkable), the SDKs' HTTP clients, one turn through
each SDK, raw HTTP.

Processes are shared per module or session: each mitmdump start costs about a second.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import re
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

try:  # openai 3, anthropic 2 and google-genai 3 run on httpx2; their releases for older setups on httpx
    import httpx2 as httpx
except ImportError:
    import httpx

from trimflow import FORMATS
from trimflow.testing import FakeProvider, Received, b64, image, session_body

from ..helpers import wait_for
from ..mitmdump import ADDON, Mitmdump, mitmdump_binary

ROOT = Path(__file__).resolve().parents[2]

# Credentials the clients send. The tests check that none of them reaches a log or metrics line.
OPENAI_KEY = "sk-test-SECRET-openai-5f3a9c1e7d"
ANTHROPIC_KEY = "sk-ant-test-SECRET-anthropic-77d1b2"
GOOGLE_KEY = "AIzaSECRET-google-header-0c4e9a"
GOOGLE_QUERY_KEY = "AIzaSECRET-google-query-3b8f21"
SECRETS = (OPENAI_KEY, ANTHROPIC_KEY, GOOGLE_KEY)

# Text of the synthetic sessions (trimflow._synthetic): none of it may reach a log or metrics line.
PROMPT_TEXTS = ("What should I click next?", "I see the settings page", "You are a desktop assistant.")

PLACEHOLDER_MARK = b"[trimflow: image #"  # the start of the default placeholder text
METRICS_AT = re.compile(r"trimflow: Prometheus metrics at http://127\.0\.0\.1:(\d+)/metrics")


# --- sessions of distinct images ----------------------------------------------------------------------------


def shots(count: int, seed: int = 0, width: int = 64, height: int = 48) -> list[bytes]:
    """`count` different real PNGs (noise, so they do not compress away), oldest first."""
    return [image(width, height, "PNG", seed=seed * 1000 + i) for i in range(count)]


_MARKER_SHOT = image(16, 16, "PNG", seed=987654)


def session(wire_format: str, images: list[bytes], model: str | None = None) -> dict[str, Any]:
    """The whole-history body of turn len(images), with images[i] as the screenshot of turn i+1."""
    text = orjson.dumps(session_body(wire_format, len(images), _MARKER_SHOT, "image/png", model)).decode()
    marker = b64(_MARKER_SHOT)
    for shot in images:  # occurrences are in turn order, so replacing the first one each time numbers them
        text = text.replace(marker, b64(shot), 1)
    assert marker not in text
    return orjson.loads(text)


def decode_b64(payload: str) -> bytes:
    """Standard or urlsafe base64 (google-genai sends urlsafe)."""
    normalised = payload.replace("-", "+").replace("_", "/")
    return base64.b64decode(normalised + "=" * (-len(normalised) % 4), validate=True)


def image_payloads(wire_format: str, body: dict[str, Any]) -> list[bytes]:
    """The decoded bytes of every inline image in `body`, in document order."""
    out = []
    for media in FORMATS[wire_format].find_media(body):
        if media.kind == "image" and media.data is not None:
            try:
                out.append(decode_b64(media.data[media.data_offset :]))
            except binascii.Error:
                out.append(media.data.encode())
    return out


def assert_pruned_upstream(provider: FakeProvider, wire_format: str, images: list[bytes], kept: int) -> Received:
    """The one request the provider got carries only the newest `kept` images, placeholders for the rest."""
    assert len(provider.received) == 1, [r.path for r in provider.received]
    received = provider.received[0]
    assert image_payloads(wire_format, received.json()) == images[len(images) - kept :]
    assert received.body.count(PLACEHOLDER_MARK) == len(images) - kept
    return received


def assert_record(record: dict[str, Any], wire_format: str, before: int, after: int, usage: int | None, mode: str = "enforce") -> None:
    assert record["format"] == wire_format
    assert record["mode"] == mode
    assert (record["images_before"], record["images_after"]) == (before, after)
    assert record["pruned"] == before - after
    assert record["status"] == 200
    assert record["reason"] is None
    assert usage is not None and record["usage_input_tokens"] == usage


# --- the SDKs' HTTP clients: where they connect is said here, never left to the environment -----------------
# trust_env=False: HTTP(S)_PROXY, ALL_PROXY, NO_PROXY and SSL_CERT_FILE are ignored. The SDKs' own default clients
# read the proxy variables whatever they are given (anthropic's mounts NO_PROXY's hosts as direct, beating proxy=).


def direct_http_client() -> httpx.Client:
    """For an SDK that talks to its base_url itself (the reverse proxy, the fake provider): never via a proxy."""
    return httpx.Client(trust_env=False, timeout=30)


def proxied_http_client(proxy_url: str, verify: ssl.SSLContext) -> httpx.Client:
    """For an SDK that goes through the proxy under test at `proxy_url`, trusting `verify` alone."""
    return httpx.Client(proxy=proxy_url, verify=verify, trust_env=False, timeout=30)


def genai_client_args(proxy_url: str | None = None, verify: ssl.SSLContext | None = None) -> dict[str, Any]:
    """google-genai's client_args (handed to its httpx client): direct, or through `proxy_url` trusting `verify`."""
    args: dict[str, Any] = {"trust_env": False}
    if proxy_url is not None:
        args["proxy"] = proxy_url
    if verify is not None:
        args["verify"] = verify
    return args


# --- one turn through each SDK: (reply text, prompt tokens the SDK saw) -------------------------------------


def openai_chat_turn(client: Any, body: dict[str, Any], stream: bool) -> tuple[str, int]:
    if stream:
        chunks = list(
            client.chat.completions.create(model=body["model"], messages=body["messages"], stream=True, stream_options={"include_usage": True})
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1].usage.prompt_tokens
    reply = client.chat.completions.create(model=body["model"], messages=body["messages"])
    return reply.choices[0].message.content, reply.usage.prompt_tokens


def openai_responses_turn(client: Any, body: dict[str, Any], stream: bool) -> tuple[str, int]:
    args = {"model": body["model"], "instructions": body["instructions"], "input": body["input"]}
    if stream:
        events = list(client.responses.create(**args, stream=True))
        assert events[-1].type == "response.completed"
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text == events[-1].response.output_text
        return text, events[-1].response.usage.input_tokens
    reply = client.responses.create(**args)
    return reply.output_text, reply.usage.input_tokens


def anthropic_turn(client: Any, body: dict[str, Any], stream: bool) -> tuple[str, int]:
    args = {"model": body["model"], "max_tokens": body["max_tokens"], "system": body["system"], "messages": body["messages"]}
    if stream:
        with client.messages.stream(**args) as events:
            text = "".join(events.text_stream)
            return text, events.get_final_message().usage.input_tokens
    reply = client.messages.create(**args)
    return reply.content[0].text, reply.usage.input_tokens


def genai_contents(images: list[bytes]) -> list[Any]:
    """The session of trimflow._synthetic built with google-genai's own types, as a google-genai app does."""
    from google.genai import types  # only the tests that drive google-genai import it

    contents = []
    for turn, shot in enumerate(images, 1):
        parts = [
            types.Part.from_text(text=f"Turn {turn}: here is my screen. What should I click next?"),
            types.Part.from_bytes(data=shot, mime_type="image/png"),
        ]
        contents.append(types.Content(role="user", parts=parts))
        if turn < len(images):
            contents.append(types.Content(role="model", parts=[types.Part.from_text(text=f"On turn {turn} I see the settings page; click Save.")]))
    return contents


def google_genai_turn(client: Any, images: list[bytes], stream: bool) -> tuple[str, int]:
    contents = genai_contents(images)
    if stream:
        chunks = list(client.models.generate_content_stream(model="gemini-2.5-flash", contents=contents))
        return "".join(c.text or "" for c in chunks), chunks[-1].usage_metadata.prompt_token_count
    reply = client.models.generate_content(model="gemini-2.5-flash", contents=contents)
    return reply.text, reply.usage_metadata.prompt_token_count


# --- rules --------------------------------------------------------------------------------------------------


def write_rules(path: Path, max_images: int | str = 2) -> Path:
    """Small limits, so pruning shows with a few small images."""
    return replace_text(path, f"defaults:\n  max_images: {max_images}\n  keep_recent: 1\n  max_body_bytes: 16MiB\n")


def replace_text(path: Path, text: str) -> Path:
    """Write by rename, as editors do: a reader never sees a half-written file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


# --- processes ----------------------------------------------------------------------------------------------


class Proxy:
    """A mitmdump with the addon, writing metrics into `workdir`; `rules` None means the shipped default rules.

    Build several, then start_all() them together: each mitmdump start costs a second or more of CPU.
    """

    def __init__(self, workdir: Path, *args: str, rules: Path | None, **options: str) -> None:
        self.metrics = workdir / "metrics.jsonl"
        self.rules = rules
        options = {"trimflow_metrics": str(self.metrics), **options}
        if rules is not None:
            options["trimflow_rules"] = str(rules)
        self.mitm = Mitmdump(workdir, *args, options=options)

    @property
    def url(self) -> str:
        return self.mitm.url

    @property
    def port(self) -> int:
        return self.mitm.port

    def log(self) -> str:
        return self.mitm.log()

    def metrics_port(self) -> int:
        """The port of its Prometheus endpoint, started with trimflow_prometheus=127.0.0.1:0: trimflow says which
        port it got once it serves."""

        def logged() -> int | None:
            found = METRICS_AT.search(self.log())
            return int(found.group(1)) if found else None

        return wait_for(logged, "line saying where the Prometheus endpoint serves")

    def wait_sharing(self) -> None:
        """Until it says it shares through the store (started with trimflow_prometheus=127.0.0.1:0)."""
        port = self.metrics_port()
        wait_for(lambda: b"trimflow_conversations_file 1" in loopback_get(port, "/metrics")[1], "the instance sharing through the store")

    def records(self) -> list[dict[str, Any]]:
        """The records whose lines are whole: mitmdump may be writing the next one as it is read."""
        try:
            data = self.metrics.read_bytes()
        except FileNotFoundError:
            return []
        return [orjson.loads(line) for line in data[: data.rfind(b"\n") + 1].splitlines() if line.strip()]

    def settled_records(self, quiet: float = 0.1, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The records once none has come for `quiet` seconds: the addon writes a flow's record just
        after its answer (FLUSH_DELAY), so a count taken at once may miss the last request's."""
        deadline = time.monotonic() + timeout
        records = self.records()
        while True:
            time.sleep(quiet)
            now = self.records()
            if len(now) == len(records):
                return now
            assert time.monotonic() < deadline, f"records still coming after {timeout} s"
            records = now

    def records_after(self, before: int, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The records past the first `before`, once there are `count` of them; exactly `count`.

        A streamed flow's record is written when the stream ends, just after the client saw its last
        byte, hence the wait (long: a busy machine may not run mitmdump for seconds; it ends as the records come).
        """
        wait_for(lambda: len(self.records()) >= before + count, f"{count} new metrics records", timeout)
        new = self.records()[before:]
        assert len(new) == count, f"expected {count} new metrics records, got {len(new)}: {new}"
        return new

    @contextmanager
    def expect_records(self, count: int = 1, timeout: float = 30.0) -> Iterator[list[dict[str, Any]]]:
        """The records written by the requests made inside the block: exactly `count` of them."""
        before = len(self.settled_records())
        new: list[dict[str, Any]] = []
        yield new
        new.extend(self.records_after(before, count, timeout))


def start_all(*mitmdumps: Mitmdump, may_exit: tuple[Mitmdump, ...] = ()) -> None:
    """Start mitmdumps side by side (a start is mostly Python importing mitmproxy). Raises the first failure,
    except for those in `may_exit`, which are expected to stop on their own.

    They run as in a wide terminal (COLUMNS=400): mitmdump cuts its own flow lines to the terminal width,
    and an 80-column cut would hide whatever a longer URL leaks.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "400")
        with ThreadPoolExecutor(len(mitmdumps)) as pool:
            for m, future in [(m, pool.submit(m.start)) for m in mitmdumps]:
                try:
                    future.result()
                except RuntimeError:
                    if m not in may_exit:
                        raise


def start_proxy(workdir: Path, *args: str, rules: Path | None, **options: str) -> Proxy:
    """One Proxy, started (see Proxy and start_all)."""
    proxy = Proxy(workdir, *args, rules=rules, **options)
    start_all(proxy.mitm)
    return proxy


def stop_all(*mitmdumps: Mitmdump) -> None:
    """Signal every process first, then wait: they shut down side by side."""
    for m in mitmdumps:
        if m.process is not None and m.process.poll() is None:
            m.process.terminate()
    for m in mitmdumps:
        m.stop()


# --- a process's memory --------------------------------------------------------------------------------------


def peak_growth_during(pid: int, action: Callable[[], object]) -> int:
    """How far the process's peak resident memory rose above its resident memory before `action` (bytes)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets the peak (VmHWM) to the current resident size
    before = _status(pid)["VmRSS"]
    action()
    return _status(pid)["VmHWM"] - before


def _status(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


# --- raw HTTP -----------------------------------------------------------------------------------------------


def post(
    port: int,
    path: str,
    body: bytes,
    headers: dict[str, str] | None = None,
    *,
    tunnel: tuple[str, int] | None = None,
    context: ssl.SSLContext | None = None,
) -> tuple[int, bytes]:
    """POST through the proxy on 127.0.0.1:`port`; with `tunnel`, via CONNECT and TLS to that upstream."""
    conn = open_connection(port, tunnel=tunnel, context=context)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def deleting_before_turn_two(provider: FakeProvider, key: str, screen: bytes) -> Callable[[int], None]:
    """A session's `between` callback that deletes the file `key` uploaded for `screen` at the provider before turn 2,
    as a provider that lost or expired it."""

    def delete(turn: int) -> None:
        if turn == 2:
            (uploaded,) = [f for f in provider.files.files(key) if f.data == screen]
            assert provider.files.delete(uploaded.file_id)

    return delete


def loopback_get(port: int, path: str) -> tuple[int, bytes]:
    """GET on loopback, never through a proxy the environment names: (status, body), (0, b"") while nothing answers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    except OSError:
        return 0, b""
    finally:
        conn.close()


def open_connection(port: int, *, tunnel: tuple[str, int] | None = None, context: ssl.SSLContext | None = None) -> http.client.HTTPConnection:
    if tunnel is None:
        return http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=context)
    conn.set_tunnel(*tunnel)
    return conn


# --- a mitmdump that must refuse to start ---------------------------------------------------------------------


def start_wrong(workdir: Path, *args: str) -> tuple[int, list[str]]:
    """mitmdump's exit code and its output lines, but the one saying it loads the script."""
    done = subprocess.run(
        [
            mitmdump_binary(),
            "--listen-host",
            "127.0.0.1",
            "--listen-port",
            "0",
            "--set",
            f"confdir={workdir / 'confdir'}",
            "-s",
            str(ADDON),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=workdir,
        stdin=subprocess.DEVNULL,
    )
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip() and "Loading script" not in line]
    return done.returncode, lines


def wait_for_file(path: Path, process: subprocess.Popen[bytes], timeout: float = 90.0) -> str:
    """The text of `path` once `process` (a launcher run) has written it; fails if the process exits first."""

    def written() -> bool:
        assert process.poll() is None, f"the launcher exited with {process.returncode}"
        return path.exists()

    wait_for(written, path.name, timeout)
    return path.read_text()
