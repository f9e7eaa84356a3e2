"""`scripts/bench [--quick] [--json]`: does trimflow cost less than it saves?

Every target is a ratio measured side by side in one run (the machines are shared and noisy):
the engine against the JSON parse and write it cannot avoid, and a real mitmdump with the addon
against a plain mitmdump with the same options, their runs interleaved (A B A B ...) so machine noise
hits both alike. Figures are medians of several runs.

The shaped-link section runs the 24-turn screenshot session through both proxies, each over a paced
and delayed link of its own to the upstream (tests/shaped_link.py, in a process per link), every
turn sent to both at the same moment: what trimflow saves in time on a real uplink, where the bytes
it does not send are what a turn costs.

The text section measures what coding agents send between screenshots: sessions of tool results (JSON,
code, diffs, logs) in every wire format, the engine against json.loads and orjson.loads of each body, and a
60-turn text session through both proxies, over shaped links as above and on loopback.

The bytes section counts what reaches the provider rather than time: a Claude computer-use session of Retina
screenshots through two mitmdumps with the addon, one with the rules' `native_size` on and one with it off, each
to a FakeProvider of its own (whose usage counts each image by Claude's formula, with its prompt-cache model).

The upstream is a minimal HTTP server in its own process (`serve_upstream`), not FakeProvider: it
reads and discards the body, so the only saving credited to the addon is the bytes that no longer
cross the proxy and the socket. FakeProvider parses every body and scans its base64; that per-byte
work would count as a saving of the addon, and in this process it would share a GIL with the clients.

Everything listens on 127.0.0.1; the processes started here are stopped on exit, Ctrl-C and SIGTERM.
Linux only: peak memory is read from /proc/<pid>/status (VmHWM).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import functools
import gc
import http.client
import importlib
import importlib.metadata
import importlib.util
import io
import itertools
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socketserver import TCPServer
from typing import Any, Self

import orjson
from PIL import Image

from tests.bombs import blank_png
from tests.mitmdump import Mitmdump, stop_process
from tests.research.cache_sessions import REFERENCE_SESSIONS, SCREEN, ReferenceSession, desktop_screenshot
from tests.research.optimum import batch_floor, price_for, priced_optima, ratios, session_cap
from tests.research.policy_runner import POLICIES, run_policy
from trimflow._click_stream import ClickStream
from trimflow._clicks import Screen, map_answer
from trimflow._conversation import Conversations
from trimflow._engine import prune_request
from trimflow._imageinfo import ImageInfo, sniff_base64
from trimflow._last_turns import LastTurn, LastTurns, conversation_key, row_keys
from trimflow._lookalike import THUMBNAILS, same_screen, thumbnail
from trimflow._malloc import MMAP_THRESHOLD, TRIM_THRESHOLD
from trimflow._prices import Price
from trimflow._record import utc_timestamp
from trimflow._rules_file import DEFAULT_RULES_PATH, load_rules
from trimflow.formats import FORMATS
from trimflow.testing import MIME, PATHS, FakeProvider, b64, data_url, image, screenshot, session_body
from trimflow.testing._screens import CHANGES, agent_session, app_screen, distinct_screens, repeating_screens

FORMAT = "openai-chat"
MODEL = "gpt-5"  # under the shipped default cap of 8 (gpt-4o holds at most 5 once over it)
PATH = PATHS[FORMAT]
URL = f"https://api.openai.com{PATH}"
HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-bench"}
MB = 2**20
# The shipped rules, as the proxied runs use them (for this model: 8 images, 16 MiB).
RULES = load_rules(DEFAULT_RULES_PATH)


def pruned_by_rules(body: bytes) -> int:
    """How many images the shipped rules prune from `body` (it depends on their cap and batch size)."""
    record = prune_request(URL, HEADERS, body, RULES).record
    return record.pruned if record is not None else 0


# Upstream protocol: a request with these headers is answered with a timed SSE stream.
EVENTS_HEADER = "X-Bench-Events"
INTERVAL_HEADER = "X-Bench-Interval-Ms"
RECEIVED_HEADER = "X-Bench-Received"  # the body bytes the upstream read
ERROR_BYTES_HEADER = "X-Bench-Error-Bytes"  # the upstream answers with a 400 event stream of this many bytes
MAX_IMAGES_HEADER = "X-Bench-Max-Images"  # the upstream refuses a request with more images, as a provider words it
ERROR_ANSWER_BYTES = 64 * MB
SHRINK_MODULE = "tests.shrink_bench"


# --- figures ------------------------------------------------------------------------------------------------


@dataclass
class Figure:
    name: str
    label: str
    value: float | None
    unit: str
    limit: float | None = None  # the target; None: a figure reported for context
    at_most: bool = True  # target direction: value <= limit, else value >= limit
    note: str = ""

    @property
    def target(self) -> str | None:
        if self.limit is None:
            return None
        return f"{'<=' if self.at_most else '>='} {self.limit:.3g}{_unit_suffix(self.unit)}"

    @property
    def ok(self) -> bool | None:
        if self.limit is None or self.value is None:
            return None
        return self.value <= self.limit if self.at_most else self.value >= self.limit

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"label": self.label, "value": self.value, "unit": self.unit, "target": self.target, "ok": self.ok}
        if self.note:
            out["note"] = self.note
        return out


def _unit_suffix(unit: str) -> str:
    return "x" if unit == "x" else f" {unit}"


def _fmt_value(figure: Figure) -> str:
    if figure.value is None:
        return "n/a"
    v = figure.value
    text = f"{v:.2f}" if figure.unit == "x" else (f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}")
    return f"{text}{_unit_suffix(figure.unit)}"


def render_table(figures: list[Figure]) -> str:
    rows = [("figure", "value", "target", "result")]
    for f in figures:
        result = "" if f.ok is None else ("pass" if f.ok else "MISS")
        if f.value is None:
            result = "n/a"
        rows.append((f.label, _fmt_value(f), f.target or "-", result))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    notes = [f"  {f.label}: {f.note}" for f in figures if f.note]
    return "\n".join(lines + (["", "notes:", *notes] if notes else []))


# --- settings ---------------------------------------------------------------------------------------------

# glibc reads these at start: the thresholds trimflow_keep_memory sets in the addon's process.
KEPT_MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}
# Requests per proxy and body before the timed ones: connections, the addon's first imports, and a
# fresh mitmdump's slow start (measured, 15.7 MB turns: medians of 50 ms over the first 20, then 44 ms).
LATENCY_WARMUP = 20
# Idle time (seconds) before each timed request, so that what a proxy does after its answer (the
# addon's log line, FLUSH_DELAY after it) is done before the other proxy's request: on two cores it
# would otherwise slow that request, which favours the addon.
LATENCY_GAP = 0.02


@dataclass(frozen=True)
class Settings:
    engine_reps: int
    scaling_reps: int
    scaling_mb: tuple[int, ...]
    latency_reps: int  # per proxy and body
    throughput_runs: int  # per proxy
    throughput_requests: int
    memory_rounds: int  # per proxy, each on a fresh mitmdump
    stream_runs: int  # per proxy
    stream_events: int
    stream_interval_ms: float
    shrink_scale: float  # sides of the shrink cases; ms per megapixel is comparable across scales
    shrink_repeats: int
    shrink_turns: int
    shaped_rates: tuple[int, ...]  # Mbit/s of the shaped link, one run of the session each
    shaped_turns: int  # turns of the screenshot session sent over it (at most 24)
    text_reps: int  # per text body
    text_sizes_kb: tuple[int, ...]  # sizes of the OpenAI chat coding session (the other formats: 1 MB)
    text_session_turns: int  # turns of the text session through the proxy
    text_session_mbit: int  # its shaped link's rate
    text_session_runs: int  # times it is sent to both proxies (fresh ones each time over the shaped link)
    native_turns: int  # turns of the Retina computer-use session sent with native_size on and off
    once_turns: int  # turns of the computer-use session sent with send-once on and off
    once_shaped_turns: int  # of those, the first ones sent again over a shaped link, timed
    soak_conversations: int  # new conversations sent through the proxy after the warm ones (its memory's soak)


QUICK = Settings(
    engine_reps=7,
    scaling_reps=5,
    scaling_mb=(1, 2, 4, 8, 16, 32, 64),
    latency_reps=5,
    throughput_runs=2,
    throughput_requests=48,
    memory_rounds=1,
    stream_runs=2,
    stream_events=40,
    stream_interval_ms=20,
    shrink_scale=0.5,
    shrink_repeats=1,
    shrink_turns=30,
    shaped_rates=(100,),
    shaped_turns=12,
    text_reps=5,
    text_sizes_kb=(100, 1024, 8192),
    text_session_turns=60,
    text_session_mbit=100,
    text_session_runs=1,
    native_turns=8,
    once_turns=12,
    once_shaped_turns=12,
    soak_conversations=2_000,
)
FULL = Settings(
    engine_reps=31,
    scaling_reps=11,
    scaling_mb=(1, 2, 4, 8, 16, 32, 64),
    latency_reps=41,
    throughput_runs=6,
    throughput_requests=96,
    memory_rounds=3,
    stream_runs=4,
    stream_events=100,
    stream_interval_ms=20,
    shrink_scale=1.0,
    shrink_repeats=2,
    shrink_turns=30,
    shaped_rates=(20, 50, 100),
    shaped_turns=24,
    text_reps=15,
    text_sizes_kb=(100, 300, 1024, 3072, 8192),
    text_session_turns=60,
    text_session_mbit=100,
    text_session_runs=3,
    native_turns=24,
    once_turns=60,
    once_shaped_turns=60,
    soak_conversations=16_000,
)


# --- request bodies -----------------------------------------------------------------------------------------


def distinct_session(turns: int, shots: list[bytes], mime: str) -> bytes:
    """The whole-history OpenAI chat body of turn `turns`, screenshot shots[i] in turn i+1: distinct images,
    as a real session has (one placeholder image is built, then each turn's is swapped in)."""
    body = session_body(FORMAT, turns, shots[0], mime, model=MODEL)
    user_turns = [m for m in body["messages"] if m["role"] == "user"]
    for message, shot in zip(user_turns, shots, strict=True):
        for part in message["content"]:
            if part["type"] == "image_url":
                part["image_url"]["url"] = data_url(shot, mime)
    return orjson.dumps(body)


def text_session(turns: int) -> bytes:
    """A text-only chat turn (no images): what most agent turns between screenshots look like."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a desktop assistant."}]
    for turn in range(1, turns + 1):
        messages.append({"role": "user", "content": f"Turn {turn}: the build failed again; here is the log tail. " + "error: x " * 40})
        if turn < turns:
            messages.append({"role": "assistant", "content": f"On turn {turn} the log shows a missing import; add it and rerun. " * 3})
    return orjson.dumps({"model": "gpt-4o", "messages": messages, "max_tokens": 512})


def scaled_shots(turns: int, kilobytes: int, fmt: str = "JPEG") -> list[bytes]:
    """`turns` distinct images of about `kilobytes` KB: the canvas is sized once, then each seed drawn on it."""
    first = screenshot(kilobytes, fmt, seed=0)
    width, height = Image.open(io.BytesIO(first)).size
    return [first] + [image(width, height, fmt, seed=seed) for seed in range(1, turns)]


@dataclass
class Bodies:
    pruned_16mb: bytes  # 24 turns, 24 distinct ~500 KB WEBP screenshots: images to prune past the cap of 8
    nochange_4mb: bytes  # the first 6 turns of the same session: under every limit
    text: bytes  # a text-only turn
    shots: list[bytes]  # the session's screenshots, turn 1's first: turn N of the session is distinct_session(N, shots[:N])
    scaling: dict[int, bytes] = field(default_factory=dict)  # MB -> body of 24 turns of larger images


def build_bodies(settings: Settings, say: Callable[[str], None], *, scaling: bool = True) -> Bodies:
    say("building request bodies (real images, distinct per turn)")
    shots = [screenshot(500, "WEBP", seed=turn) for turn in range(24)]
    bodies = Bodies(distinct_session(24, shots, MIME["WEBP"]), distinct_session(6, shots[:6], MIME["WEBP"]), text_session(20), shots)
    for mb in settings.scaling_mb if scaling else ():
        # 24 turns as in the 16 MB session; the images grow with the body. JPEG: WEBP would take minutes to encode.
        kb = max(4, int(mb * 1024 * 3 / 4 / 24))
        bodies.scaling[mb] = distinct_session(24, scaled_shots(24, kb), MIME["JPEG"])
    return bodies


# --- in-process engine figures ------------------------------------------------------------------------------


def _timed(fn: Callable[[], Any], loops: int = 1) -> float:
    """Milliseconds per call of `fn`, over `loops` calls."""
    gc.collect()
    started = time.perf_counter()
    for _ in range(loops):
        fn()
    return (time.perf_counter() - started) * 1000 / loops


def _loops_for(body: bytes) -> int:
    """Calls per sample: a sample of a small body spans about as much work as one of 16 MB, so timer and
    scheduler noise weigh alike on every size."""
    return max(1, round(16 * MB / len(body)))


def _engine(body: bytes) -> Callable[[], Any]:
    def run() -> Any:
        return prune_request(URL, HEADERS, body, RULES)

    return run


def _floor(body: bytes) -> Callable[[], Any]:
    def run() -> Any:
        return orjson.dumps(json.loads(body))

    return run


def _loads(body: bytes) -> Callable[[], Any]:
    def run() -> Any:
        return json.loads(body)

    return run


def interleaved_ms(reps: int, *runs: Callable[[], Any], loops: list[int] | None = None) -> list[float]:
    """Median milliseconds per call of each run, the runs taking turns (one warm-up round first)."""
    loops = loops or [1] * len(runs)
    for run in runs:
        run()
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(reps):
        for i, run in enumerate(runs):
            times[i].append(_timed(run, loops[i]))
    return [statistics.median(t) for t in times]


def engine_figures(bodies: Bodies, settings: Settings) -> list[Figure]:
    pruned = pruned_by_rules(bodies.pruned_16mb)
    assert pruned >= 16, f"the 16 MB session must prune at least 16 of its 24 images (the cap is 8), not {pruned}"
    assert not prune_request(URL, HEADERS, bodies.nochange_4mb, RULES).changed, "the 4 MB session must need nothing"
    size16, size4 = len(bodies.pruned_16mb) / MB, len(bodies.nochange_4mb) / MB
    engine16, floor16 = interleaved_ms(settings.engine_reps, _engine(bodies.pruned_16mb), _floor(bodies.pruned_16mb))
    loops4 = _loops_for(bodies.nochange_4mb)
    engine4, loads4 = interleaved_ms(settings.engine_reps, _engine(bodies.nochange_4mb), _loads(bodies.nochange_4mb), loops=[loops4, loops4])
    return [
        Figure("engine_prune_ms", f"engine, {size16:.1f} MB body, {pruned} of 24 images pruned", engine16, "ms"),
        Figure("floor_prune_ms", f"floor json.loads + orjson.dumps, same {size16:.1f} MB body", floor16, "ms"),
        Figure("engine_prune_vs_floor", "engine / floor (pruning body)", engine16 / floor16, "x", 1.5),
        Figure("engine_nochange_ms", f"engine, {size4:.1f} MB body needing no change", engine4, "ms"),
        Figure("loads_nochange_ms", f"json.loads alone, same {size4:.1f} MB body", loads4, "ms"),
        Figure("engine_nochange_vs_loads", "engine / json.loads (body needing no change)", engine4 / loads4, "x", 1.0),
    ]


CLICKS = 3000  # computer-tool calls in the JSON answer whose clicks are mapped
DRAG_POINTS = 600  # points of the streamed drag


def clicks_answer(clicks: int) -> bytes:
    """A Messages answer of `clicks` computer-tool calls, a text block before each."""
    blocks: list[dict[str, Any]] = []
    for i in range(clicks):
        blocks.append({"type": "text", "text": f"Step {i}: clicking the next field."})
        blocks.append(
            {"type": "tool_use", "id": f"toolu_{i:05d}", "name": "computer", "input": {"action": "left_click", "coordinate": [i % 2000, i % 1125]}}
        )
    return orjson.dumps({"id": "msg_1", "type": "message", "role": "assistant", "content": blocks, "usage": {"input_tokens": 1, "output_tokens": 1}})


def drag_stream(points: int) -> bytes:
    """A streamed Responses answer with one drag through `points` points, in its three events."""
    path = [{"x": i % 2000, "y": i % 1125} for i in range(points)]
    call = {"type": "computer_call", "id": "cu_1", "call_id": "call_1", "action": {"type": "drag", "path": path}, "status": "completed"}
    events = [
        {"type": "response.output_item.added", "item": {**call, "status": "in_progress"}},
        {"type": "response.output_item.done", "item": call},
        {"type": "response.completed", "response": {"output": [call]}},
    ]
    return b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events)


def clicks_figures(settings: Settings) -> list[Figure]:
    """Mapping a computer-use answer's clicks back (trimflow._clicks), in process: JSON answers of CLICKS calls and of half
    as many (the work must grow with the answer alone), against json.loads; and a streamed DRAG_POINTS-point drag, which
    the proxy maps on its event loop."""
    claude = Screen("anthropic", "computer", (2000, 1125), (2560, 1440))
    openai = Screen("openai-responses", None, (2000, 1125), (5120, 2880))
    answer, half, drag = clicks_answer(CLICKS), clicks_answer(CLICKS // 2), drag_stream(DRAG_POINTS)
    if map_answer(claude, answer)[1] != CLICKS:
        raise RuntimeError("the answer's clicks were not all mapped")

    def stream() -> None:
        clicks = ClickStream(openai)
        clicks(drag)
        clicks(b"")
        if clicks.mapped != 1:
            raise RuntimeError("the drag was not mapped")

    mapped, mapped_half, loads, streamed = interleaved_ms(
        settings.engine_reps, lambda: map_answer(claude, answer), lambda: map_answer(claude, half), _loads(answer), stream
    )
    size = len(answer) / MB
    return [
        Figure("clicks_json_ms", f"clicks mapped, JSON answer of {CLICKS:,} computer calls ({size:.2f} MB)", mapped, "ms"),
        Figure("clicks_json_doubling", f"clicks mapped, {CLICKS // 2:,} -> {CLICKS:,} calls", mapped / mapped_half, "x", 2.2),
        Figure("clicks_json_vs_loads", "clicks mapped / json.loads of the same answer", mapped / loads, "x"),
        Figure(
            "clicks_drag_ms",
            f"clicks mapped, streamed {DRAG_POINTS}-point drag ({len(drag) / 2**10:.0f} KB, on the event loop)",
            streamed,
            "ms",
            250.0,  # a quarter of the stall an unrelated request may see (docs/security.md, click mapping)
        ),
    ]


def sniff_figures() -> list[Figure]:
    """Reading an image's type and size from its base64 reads a prefix only: a 10 MB PNG costs what a 3 KB one does,
    and so does one whose base64 is wrapped in lines (a full decode of the 10 MB one takes over 10 ms)."""
    bodies = {}
    for name, size in (("small", (32, 24)), ("big", (2000, 1700))):  # random RGB, stored: the big one ~10 MB of PNG
        raw = io.BytesIO()
        Image.frombytes("RGB", size, random.Random(3).randbytes(size[0] * size[1] * 3)).save(raw, "PNG", compress_level=0)
        bodies[name] = (base64.b64encode(raw.getvalue()).decode(), size)
    big = bodies["big"][0]
    bodies["wrapped"] = ("\n".join(big[i : i + 76] for i in range(0, 760_000, 76)) + big[760_000:], bodies["big"][1])
    for text, size in bodies.values():
        assert sniff_base64(text) == ImageInfo("image/png", *size), "the sniffed type or size is wrong"
    small, big_ms, wrapped = interleaved_ms(7, *(functools.partial(sniff_base64, text) for text, _ in bodies.values()), loops=[200] * 3)
    return [
        Figure("sniff_small_png_us", "image type and size from a 3 KB PNG's base64", small * 1000, "us"),
        Figure("sniff_big_png_us", "same, from a 10 MB PNG's base64", big_ms * 1000, "us"),
        Figure("sniff_big_vs_small", "sniff 10 MB PNG / 3 KB PNG (a prefix is read)", big_ms / small, "x", 3.0),
        Figure("sniff_wrapped_png_us", "same, its base64 in 76-column lines for the first 760 KB", wrapped * 1000, "us"),
        Figure("sniff_wrapped_vs_small", "sniff wrapped 10 MB PNG / 3 KB PNG", wrapped / small, "x", 3.0),
    ]


def scaling_figures(bodies: Bodies, settings: Settings) -> list[Figure]:
    sizes = sorted(bodies.scaling)
    runs, loops = [], []
    for mb in sizes:  # the floor beside the engine: it shows what the machine itself does per doubling
        runs += [_engine(bodies.scaling[mb]), _floor(bodies.scaling[mb])]
        loops += [_loops_for(bodies.scaling[mb])] * 2
    medians = interleaved_ms(settings.scaling_reps, *runs, loops=loops)
    engine, floor = medians[0::2], medians[1::2]
    figures = []
    for mb, ms, floor_ms in zip(sizes, engine, floor, strict=True):
        pruned = pruned_by_rules(bodies.scaling[mb])
        figures.append(
            Figure(
                f"scaling_{mb}mb_ms",
                f"engine, {mb} MB body (24 turns, {pruned} pruned)",
                ms,
                "ms",
                note=f"floor {floor_ms:.1f} ms ({ms / floor_ms:.2f}x)",
            )
        )
    for n in range(1, len(sizes)):
        small, big = sizes[n - 1], sizes[n]
        steps = (big // small).bit_length() - 1  # doublings between the two sizes
        per_doubling = (engine[n] / engine[n - 1]) ** (1 / steps)
        floor_doubling = (floor[n] / floor[n - 1]) ** (1 / steps)
        figures.append(
            Figure(
                f"scaling_{small}_to_{big}mb",
                f"engine time per doubling, {small} -> {big} MB",
                per_doubling,
                "x",
                2.2,
                note=f"floor {floor_doubling:.2f}x",
            )
        )
    return figures


# --- text: what coding agents send between screenshots ----------------------------------------------------------

TEXT_FORMATS = ("openai-chat", "openai-responses", "anthropic", "gemini", "bedrock-converse", "ollama")
TOOL_OUTPUTS = ("json", "code", "diff", "log")  # what tool results hold, in turn


def _tool_output(kind: str, rng: random.Random, lines: int) -> str:
    """A tool result as coding agents get them: a JSON listing, Python source, a unified diff, a log.
    Quotes, backslashes and newlines, which JSON escapes, as often as real ones have them."""
    if kind == "json":
        entries = [
            {
                "path": f"src/pkg_{rng.randrange(40)}/module_{rng.randrange(1000)}.py",
                "size": rng.randrange(200_000),
                "mode": "rw-r--r--",
                "modified": f"2026-11-{rng.randrange(1, 28):02d}T{rng.randrange(24):02d}:{rng.randrange(60):02d}:00Z",
                "lines": rng.randrange(2000),
                "kind": rng.choice(["file", "symlink", "dir"]),
            }
            for _ in range(max(1, lines // 8))
        ]
        return json.dumps({"entries": entries, "truncated": False}, indent=2)
    if kind == "code":
        out = []
        for n in range(lines):
            name = f"value_{rng.randrange(100)}"
            out.append(
                rng.choice(
                    [
                        f'    {name} = re.compile(r"^\\s*(\\w+)=\\"([^\\"]*)\\"$")',
                        f'    log.info("loaded %s from \\"%s\\"", {name}, path)',
                        f"    if {name} is None:  # nothing cached yet",
                        f"def handle_{n}(request: dict[str, str]) -> str:",
                        f'        return f"{{{name}!r}}: {{request[\\"key\\"]}}\\n"',
                        f"    {name} = '\\\\'.join(parts)  # Windows paths",
                        "",
                    ]
                )
            )
        return "\n".join(out)
    if kind == "diff":
        out = [f"diff --git a/src/app_{rng.randrange(50)}.py b/src/app_{rng.randrange(50)}.py", "--- a/src/app.py", "+++ b/src/app.py"]
        for n in range(lines):
            if n % 12 == 0:
                out.append(f"@@ -{n},7 +{n},8 @@ class Handler:")
            sign = rng.choice([" ", " ", " ", "-", "+"])
            out.append(f'{sign}        self.headers["X-Request-{n}"] = "{rng.randrange(10**6)}"  # was \'{n}\'')
        return "\n".join(out)
    out = []
    for n in range(lines):
        ns = 1764201600_000_000_000 + n * 1_234_567  # nanosecond timestamps: 19-digit runs inside a string
        out.append(
            rng.choice(
                [
                    f'{ns} INFO  worker-{rng.randrange(8)} id="{rng.randrange(10**9):09d}" path="/api/v1/items" took={rng.random():.3f}s',
                    f'{ns} WARN  retry {n}: {{"error": "timeout", "after_ms": {rng.randrange(5000)}, "url": "https://example.test/x?q=1"}}',
                    f'{ns} ERROR Traceback (most recent call last):\\n  File "C:\\\\app\\\\main.py", line {n}, in <module>',
                ]
            )
        )
    return "\n".join(out)


def _tool_call(fmt: str, turn: int, output: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    """One tool call and its result, as `fmt` writes them into the history."""
    call_id, name = f"call_{turn:04d}", "run_tool"
    if fmt == "openai-chat":
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        return [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": call_id, "content": output}]
    if fmt == "openai-responses":
        return [
            {"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(args)},
            {"type": "function_call_output", "call_id": call_id, "output": output},
        ]
    if fmt == "anthropic":
        return [
            {"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": name, "input": args}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": output}]},
        ]
    if fmt == "gemini":
        return [
            {"role": "model", "parts": [{"functionCall": {"name": name, "args": args}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": name, "response": {"output": output}}}]},
        ]
    if fmt == "bedrock-converse":
        return [
            {"role": "assistant", "content": [{"toolUse": {"toolUseId": call_id, "name": name, "input": args}}]},
            {"role": "user", "content": [{"toolResult": {"toolUseId": call_id, "content": [{"text": output}]}}]},
        ]
    call = {"function": {"name": name, "arguments": args}}  # ollama
    return [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": output}]


def coding_session(fmt: str, turns: int, lines: int = 120, seed: int = 0) -> bytes:
    """The body of turn `turns` of a coding agent's session in `fmt`: the whole history, each turn a tool call
    whose result holds about `lines` lines of JSON, code, a diff or a log, in turn. No image in it."""
    rng = random.Random(seed)
    system = "You are a coding agent. Use the tools to read, run and change the repository. " * 20
    history: list[dict[str, Any]] = []
    user = {"role": "user", "content": "The tests fail on main; find out why and fix it."}
    for turn in range(1, turns + 1):
        kind = TOOL_OUTPUTS[(turn - 1) % len(TOOL_OUTPUTS)]
        args = {"command": f"cat src/app_{turn}.py" if kind == "code" else f"make {kind} --verbose", "timeout": 120}
        history += _tool_call(fmt, turn, _tool_output(kind, rng, lines), args)
    if fmt == "openai-chat":
        body: dict[str, Any] = {"model": "gpt-4o", "messages": [{"role": "system", "content": system}, user, *history], "stream": True}
    elif fmt == "openai-responses":
        body = {"model": "gpt-5-codex", "instructions": system, "input": [user, *history], "stream": True, "store": False}
    elif fmt == "anthropic":
        body = {"model": "claude-sonnet-4-5", "max_tokens": 32000, "system": [{"type": "text", "text": system}], "messages": [user, *history]}
    elif fmt == "gemini":
        first = {"role": "user", "parts": [{"text": user["content"]}]}
        body = {"contents": [first, *history], "systemInstruction": {"parts": [{"text": system}]}}
    elif fmt == "bedrock-converse":
        first = {"role": "user", "content": [{"text": user["content"]}]}
        body = {"messages": [first, *history], "system": [{"text": system}], "inferenceConfig": {"maxTokens": 4096}}
    else:
        body = {"model": "qwen3-coder", "messages": [{"role": "system", "content": system}, user, *history], "stream": False}
    return orjson.dumps(body)


def escaped_quotes_body(size: int, shot: bytes | None = None) -> bytes:
    """The worst case for any walk over quotes: a body that is almost all escaped quotes; with `shot`, a
    screenshot before them, so that the skeleton's walk starts (and must give up)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": '"' * (size // 2)}]
    if shot is not None:
        image_part = {"type": "image_url", "image_url": {"url": data_url(shot, MIME["WEBP"])}}
        messages.insert(0, {"role": "user", "content": [image_part]})
    return orjson.dumps({"model": "gpt-4o", "messages": messages})


def _turns_for(fmt: str, size: int) -> int:
    """Turns of `coding_session(fmt, ...)` that come nearest `size` bytes (from the size of a few turns)."""
    per_turn = (len(coding_session(fmt, 8)) - len(coding_session(fmt, 4))) / 4
    return max(1, round((size - len(coding_session(fmt, 0))) / per_turn))


def text_bodies(settings: Settings) -> dict[str, tuple[str, bytes]]:
    """name -> (format, body): each format at 1 MB, OpenAI chat from 100 KB to 8 MB, and the worst case, alone
    and after a screenshot (the one body here with an image; under every limit, it needs nothing either)."""
    bodies: dict[str, tuple[str, bytes]] = {}
    for fmt in TEXT_FORMATS:
        bodies[f"{fmt}_1mb"] = (fmt, coding_session(fmt, _turns_for(fmt, MB)))
    for kb in settings.text_sizes_kb:
        if kb != 1024:
            bodies[f"openai-chat_{kb}kb"] = ("openai-chat", coding_session("openai-chat", _turns_for("openai-chat", kb * 1024)))
    bodies["escaped_quotes_1mb"] = ("openai-chat", escaped_quotes_body(MB))
    bodies["escaped_quotes_screenshot_1mb"] = ("openai-chat", escaped_quotes_body(MB, screenshot(200, "WEBP", seed=1)))
    return bodies


def _text_url(fmt: str) -> str:
    return f"https://api.example.test{PATHS[fmt]}"


def _text_engine(fmt: str, body: bytes) -> Callable[[], Any]:
    url = _text_url(fmt)

    def run() -> Any:
        return prune_request(url, HEADERS, body, RULES)

    return run


def _orjson_loads(body: bytes) -> Callable[[], Any]:
    def run() -> Any:
        return orjson.loads(body)

    return run


def text_figures(settings: Settings, say: Callable[[str], None]) -> list[Figure]:
    """The engine on text bodies that need nothing, against json.loads and orjson.loads of the same body."""
    say("text bodies: coding sessions in every format, 100 KB to 8 MB")
    bodies = text_bodies(settings)
    figures: list[Figure] = []
    worst: tuple[float, str] = (0.0, "")
    for name, (fmt, body) in bodies.items():
        outcome = prune_request(_text_url(fmt), HEADERS, body, RULES)
        record = outcome.record
        if record is None or outcome.changed or record.images_before != ("screenshot" in name) or record.reason:
            raise RuntimeError(f"the text body {name} must be an LLM request with nothing to change")
        loops = max(1, round(4 * MB / len(body)))  # samples of about the same work at every size
        engine, loads, fast = interleaved_ms(settings.text_reps, _text_engine(fmt, body), _loads(body), _orjson_loads(body), loops=[loops] * 3)
        size = f"{len(body) / MB:.2f} MB" if len(body) >= MB else f"{len(body) // 1024} KB"
        what = f"{fmt} coding session"
        if name.startswith("escaped"):
            what = "mostly escaped quotes, after a screenshot" if "screenshot" in name else "mostly escaped quotes"
        escaped = body.count(b'\\"')
        figures += [
            Figure(f"text_{name}_engine_ms", f"engine, {what}, {size} ({escaped:,} escaped quotes)", engine, "ms"),
            Figure(f"text_{name}_loads_ms", "json.loads, same body", loads, "ms"),
            Figure(f"text_{name}_orjson_ms", "orjson.loads, same body", fast, "ms"),
            Figure(f"text_{name}_vs_loads", "engine / json.loads", engine / loads, "x", 1.5 if name.startswith("escaped") else 1.0),
            Figure(f"text_{name}_vs_orjson", "engine / orjson.loads", engine / fast, "x"),
        ]
        worst = max(worst, (engine / loads, name))
    figures.append(Figure("text_worst_vs_loads", "engine / json.loads, the worst text body", worst[0], "x", 1.5, note=worst[1]))
    return figures


def text_session_figures(workdir: Path, upstream: Upstream, settings: Settings, say: Callable[[str], None]) -> list[Figure]:
    """A coding agent's text session (OpenAI chat, the whole history every turn, nothing to change) through a
    fresh mitmdump with the addon and a fresh plain one, same upstream: over a shaped link each, every turn sent to
    both at the same moment, as the screenshot session is (`_session_turns`); then on loopback, where the upstream
    answers at once and nothing hides what the addon costs, each turn to one proxy then the other."""
    turns, rate, runs = settings.text_session_turns, settings.text_session_mbit, settings.text_session_runs
    session = [coding_session(FORMAT, turn) for turn in range(1, turns + 1)]
    sizes = f"{len(session[0]) // 1024} KB to {len(session[-1]) // 1024} KB"
    shaped: dict[str, list[float]] = {"addon": [], "plain": []}
    for run in range(runs):
        say(f"text session, {rate} Mbit/s {SHAPED_RTT_MS:g} ms RTT: {turns} turns through both proxies at once (run {run + 1} of {runs})")
        times, received, _ = _session_turns(workdir / f"text-{run}", upstream, session[0], lambda turn: session[turn - 1], turns, rate)
        if received["addon"] != received["plain"]:
            raise RuntimeError("the addon changed a text session that needs nothing")
        for name in shaped:
            shaped[name] += [t * 1000 for t in times[name]]
    say(f"text session on loopback: {turns} turns, each to one proxy then the other")
    loopback = _loopback_turns(workdir, upstream, session, runs)
    a, p = statistics.median(shaped["addon"]), statistics.median(shaped["plain"])
    la, lp = statistics.median(loopback["addon"]), statistics.median(loopback["plain"])
    what = f"{turns} turns x {runs}, {sizes}"
    return [
        Figure("text_session_addon_ms", f"text session turn with addon, {rate} Mbit/s {SHAPED_RTT_MS:g} ms RTT (median; {what})", a, "ms"),
        Figure("text_session_plain_ms", "text session turn plain mitmdump, same link (median)", p, "ms"),
        Figure("text_session_ratio", "text session turn, addon / plain (median)", a / p, "x", 1.05),
        Figure("text_session_loopback_addon_ms", "text session turn with addon on loopback (median)", la, "ms"),
        Figure("text_session_loopback_plain_ms", "text session turn plain mitmdump on loopback (median)", lp, "ms"),
        Figure(
            "text_session_loopback_ratio",
            "text session turn on loopback, addon / plain (median)",
            la / lp,
            "x",
            note=f"the addon's own time per turn, nothing hiding it: {la - lp:+.2f} ms",
        ),
    ]


FLOOR_ADDON = Path(__file__).with_name("floor_addon.py")  # a body-reading addon at its floor (its docstring)


def _loopback_turns(
    workdir: Path, upstream: Upstream, session: list[bytes], runs: int, cpu: dict[str, float] | None = None, *, floor: bool = False
) -> dict[str, list[float]]:
    """Turn times (ms) through a fresh mitmdump with the addon and a fresh plain one (and with `floor`, a third running
    FLOOR_ADDON), all straight to the upstream: each turn to one then the next (the order reverses every turn), after
    the same idle time. `cpu`, when given, gets each process's CPU milliseconds per request over the timed turns (what
    it does after an answer included)."""
    names = ("addon", "plain", "floor") if floor else ("addon", "plain")
    times: dict[str, list[float]] = {name: [] for name in names}
    received: dict[str, int] = dict.fromkeys(names, 0)
    with contextlib.ExitStack() as stack:
        clients, pids = {}, {}
        for name in names:
            scripts = ["-s", str(FLOOR_ADDON)] if name == "floor" else []
            mitmdump = Mitmdump(workdir / f"text-loopback-{name}", "--mode", f"reverse:{upstream.url}", *scripts, addon=name == "addon")
            proxy = Proxy(name, mitmdump.start())
            stack.callback(proxy.mitmdump.stop)
            client = Client(proxy.mitmdump.port)
            stack.callback(client.close)
            for _ in range(3):  # the connection to the upstream, the addon's first imports
                _post_ok(client, session[0])
            clients[name], pids[name] = client, proxy.pid
        time.sleep(LATENCY_GAP)
        cpu_before = {name: _cpu_seconds(pid) for name, pid in pids.items()}
        for run in range(runs):
            for turn, body in enumerate(session):
                for name in names if (turn + run) % 2 == 0 else names[::-1]:
                    gc.collect()
                    time.sleep(LATENCY_GAP)
                    started = time.perf_counter()
                    status, got, _ = clients[name].post(body)
                    times[name].append((time.perf_counter() - started) * 1000)
                    if status != 200:
                        raise RuntimeError(f"{name} mitmdump answered {status} on turn {turn + 1}")
                    received[name] += got
        time.sleep(0.2)  # what follows the last answers (the record, the log line) is done
        if cpu is not None:
            for name, pid in pids.items():
                cpu[name] = (_cpu_seconds(pid) - cpu_before[name]) * 1000 / (runs * len(session))
    if len(set(received.values())) != 1:
        raise RuntimeError("the addon changed a text session that needs nothing")
    return times


TEXT_FLOOR_KB = 890  # the coding agent's chat body the proxy's floor is measured on


def text_floor_figures(workdir: Path, upstream: Upstream, settings: Settings, say: Callable[[str], None]) -> list[Figure]:
    """On loopback, where nothing hides what the addon costs: a coding agent's text body and the text session's turns
    (nothing to change) through mitmdump with the addon, against plain mitmdump plus the engine's own time on the same
    body (in process); and the CPU each process spends per request, beside a third mitmdump running FLOOR_ADDON (what
    any addon that reads the body pays)."""
    body = coding_session(FORMAT, _turns_for(FORMAT, TEXT_FLOOR_KB * 1024))
    session = [coding_session(FORMAT, turn) for turn in range(1, settings.text_session_turns + 1)]
    figures: list[Figure] = []
    sizes = f"{len(session[0]) // 1024} KB to {len(session[-1]) // 1024} KB"
    for key, bodies, runs, what in (
        ("body", [body], settings.latency_reps, f"{len(body) // 1024} KB coding-agent chat body"),
        ("session", session, settings.text_session_runs, f"{len(session)}-turn text session, {sizes}"),
    ):
        say(f"text at the floor, loopback: {what}, with the addon, plain and the floor addon, side by side")
        cpu: dict[str, float] = {}
        times = _loopback_turns(workdir / f"floor-{key}", upstream, bodies, runs, cpu, floor=True)
        engine = statistics.median(
            interleaved_ms(settings.text_reps, _text_engine(FORMAT, b), loops=[max(1, round(4 * MB / len(b)))])[0] for b in bodies
        )
        a, p, f = (statistics.median(times[name]) for name in ("addon", "plain", "floor"))
        figures += [
            Figure(f"text_floor_{key}_addon_ms", f"loopback with addon, {what} (median)", a, "ms"),
            Figure(f"text_floor_{key}_plain_ms", "loopback plain mitmdump, same (median)", p, "ms"),
            Figure(f"text_floor_{key}_floor_ms", "loopback, mitmdump with an addon that parses the body, logs a line (median)", f, "ms"),
            Figure(f"text_floor_{key}_engine_ms", "the engine's own time on the same, in process (median)", engine, "ms"),
            Figure(f"text_floor_{key}_ratio", "addon / (plain + engine), medians", a / (p + engine), "x", 1.10),
            Figure(f"text_floor_{key}_cpu_addon_ms", "CPU per request, mitmdump with addon", cpu["addon"], "ms"),
            Figure(f"text_floor_{key}_cpu_plain_ms", "CPU per request, plain mitmdump", cpu["plain"], "ms"),
            Figure(f"text_floor_{key}_cpu_ratio", "CPU per request, addon / plain", cpu["addon"] / cpu["plain"], "x", 1.5),
            Figure(f"text_floor_{key}_cpu_floor_ms", "CPU per request, mitmdump with an addon that parses the body, logs a line", cpu["floor"], "ms"),
            Figure(f"text_floor_{key}_cpu_floor_ratio", "CPU per request, that addon / plain", cpu["floor"] / cpu["plain"], "x"),
            Figure(f"text_floor_{key}_cpu_over_floor", "CPU per request, trimflow / that addon", cpu["addon"] / cpu["floor"], "x"),
        ]
    return figures


SOAK_WARM = 1_000  # conversations sent before the warm figure
SOAK_IMAGES = 4  # images of each conversation's one turn, each its own
SOAK_CLIENTS = 4


def _soak_body(n: int) -> bytes:
    """Conversation `n`'s first turn: a system prompt of its own and SOAK_IMAGES small PNGs no other sends."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": "What changed on these screens?"}]
    shots = [image(8, 8, "PNG", seed=n * SOAK_IMAGES + i) for i in range(SOAK_IMAGES)]
    parts += [{"type": "image_url", "image_url": {"url": data_url(shot, "image/png")}} for shot in shots]
    messages = [{"role": "system", "content": f"You are agent {n}."}, {"role": "user", "content": parts}]
    return orjson.dumps({"model": "gpt-4o", "messages": messages})


def conversations_soak_figures(workdir: Path, upstream: Upstream, settings: Settings) -> list[Figure]:
    """The conversations' memory under a soak: SOAK_WARM conversations through a fresh mitmdump with the addon, its RSS
    then (the warm figure), then settings.soak_conversations new ones (more than the 10,000 it remembers), sent by
    SOAK_CLIENTS clients at once; its RSS after each third."""
    total = SOAK_WARM + settings.soak_conversations
    bodies = [_soak_body(n) for n in range(total)]
    proxy = start_proxy(workdir / "soak", "soak", upstream, addon=True)
    try:

        def send(first: int, last: int) -> None:
            def part(k: int) -> None:
                client = Client(proxy.mitmdump.port)
                try:
                    for n in range(first + k, last, SOAK_CLIENTS):
                        _post_ok(client, bodies[n])
                finally:
                    client.close()

            with ThreadPoolExecutor(SOAK_CLIENTS) as pool:
                list(pool.map(part, range(SOAK_CLIENTS)))
            time.sleep(0.2)  # the last records worked out after their answers

        send(0, SOAK_WARM)
        warm = _status_kb(proxy.pid, "VmRSS") / 1024
        thirds = [SOAK_WARM + settings.soak_conversations * k // 3 for k in range(4)]
        rss = []
        for first, last in itertools.pairwise(thirds):
            send(first, last)
            rss.append(_status_kb(proxy.pid, "VmRSS") / 1024)
    finally:
        proxy.mitmdump.stop()
    what = f"{settings.soak_conversations:,} conversations of {SOAK_IMAGES} images after {SOAK_WARM:,}"
    return [
        Figure("soak_rss_warm_mb", f"conversations soak: RSS after {SOAK_WARM:,} conversations (the warm figure)", warm, "MB"),
        Figure("soak_rss_growth_mb", f"conversations soak: RSS over the warm figure after {what}", rss[-1] - warm, "MB", 40.0),
        Figure("soak_rss_last_third_mb", "conversations soak: RSS growth over the last third", rss[-1] - rss[1], "MB", 4.0),
    ]


# --- the upstream ------------------------------------------------------------------------------------------


class _UpstreamServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def server_bind(self) -> None:
        TCPServer.server_bind(self)  # skip HTTPServer's reverse DNS lookup: offline, loopback only
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])


class _UpstreamHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    REPLY = orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "model": "gpt-4o",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )

    def setup(self) -> None:
        super().setup()
        # Small SSE writes must leave at once; the same for both proxies.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _discard_body(self) -> int:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            total = 0
            while True:
                size = int(self.rfile.readline(65537).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return total
                total += self._read(size)
                self.rfile.readline()
        return self._read(int(self.headers.get("Content-Length") or 0))

    def _read(self, length: int) -> int:
        done = 0
        while done < length:
            chunk = self.rfile.read(min(length - done, MB))
            if not chunk:
                break
            done += len(chunk)
        return done

    def do_POST(self) -> None:
        max_images = self.headers.get(MAX_IMAGES_HEADER)
        if max_images is not None:
            self._limit_images(int(max_images))
            return
        received = self._discard_body()
        error_bytes = int(self.headers.get(ERROR_BYTES_HEADER) or 0)
        if error_bytes:
            self._error_stream(error_bytes)
            return
        events = int(self.headers.get(EVENTS_HEADER) or 0)
        if events:
            self._stream(received, events, float(self.headers.get(INTERVAL_HEADER) or 20) / 1000)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.REPLY)))
        self.send_header(RECEIVED_HEADER, str(received))
        self.end_headers()
        self.wfile.write(self.REPLY)

    def _stream(self, received: int, events: int, interval: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header(RECEIVED_HEADER, str(received))
        self.end_headers()
        start = time.monotonic()
        for i in range(events):
            pause = start + i * interval - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            # CLOCK_MONOTONIC is system-wide on Linux: the client compares it with its own reading.
            event = b'data: {"sent_ns":%d,"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n' % time.monotonic_ns()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        done = b"data: [DONE]\n\n"
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))

    def _limit_images(self, limit: int) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if body.count(b'"image_url"') <= limit:
            status, answer = 200, self.REPLY
        else:
            message = f"Too many images in request. Max is {limit}."
            status, answer = 400, orjson.dumps({"error": {"message": message, "type": "invalid_request_error"}})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def _error_stream(self, size: int) -> None:
        """A 400 event stream of `size` bytes, chunked: an error answer far larger than the recover addon reads."""
        self.send_response(400)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        block = (b'data: {"error":"x"}\n\n' * 4096)[: 64 * 1024]
        for sent in range(0, size, len(block)):
            part = block[: size - sent]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        self.wfile.write(b"0\r\n\r\n")


def serve_upstream() -> None:
    """The bench upstream (a child process): prints its port, serves until terminated."""
    server = _UpstreamServer(("127.0.0.1", 0), _UpstreamHandler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(server.server_port, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever(poll_interval=0.2)


def _child_env() -> dict[str, str]:
    """This environment for a child `python -m tests....`: this checkout first, then what PYTHONPATH already holds
    (the bench run from a copy of a commit puts that copy's addon/ there)."""
    paths = [str(Path(__file__).resolve().parents[1]), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


class _ChildOnPort:
    """A `python -m tests....` child process that prints the port it listens on as its first line."""

    what = "child"

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> Self:
        self.process = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=_child_env())
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"the {self.what} did not start")
        self.port = int(line)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)


class Upstream(_ChildOnPort):
    """The upstream child process."""

    what = "bench upstream"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "tests.bench", "--serve-upstream"]


# --- clients ------------------------------------------------------------------------------------------------


class Client:
    """One persistent HTTP/1.1 connection to a proxy."""

    def __init__(self, port: int, timeout: float = 120.0) -> None:
        self.port, self.timeout = port, timeout
        self.conn: http.client.HTTPConnection | None = None

    def post(self, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, int, bytes]:
        """Send one request; (status, bytes the upstream received, response body)."""
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            try:
                self.conn.request("POST", PATH, body=body, headers={**HEADERS, "content-length": str(len(body)), **(headers or {})})
                response = self.conn.getresponse()
                data = response.read()
                return response.status, int(response.headers.get(RECEIVED_HEADER) or -1), data
            except (ConnectionError, http.client.RemoteDisconnected, http.client.CannotSendRequest):
                self.close()  # a kept-alive connection the proxy closed: reconnect once
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


@dataclass
class Proxy:
    name: str
    mitmdump: Mitmdump

    @property
    def pid(self) -> int:
        assert self.mitmdump.process is not None
        return self.mitmdump.process.pid

    def peak_rss_mb(self) -> float:
        return _status_kb(self.pid, "VmHWM") / 1024


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


# --- proxied figures ---------------------------------------------------------------------------------------


def latency_figures(addon: Proxy, plain: Proxy, plain_kept: Proxy, bodies: Bodies, settings: Settings) -> list[Figure]:
    """Addon against plain mitmdump, and against `plain_kept`: plain mitmdump started with
    KEPT_MEMORY_ENV, which keeps freed memory as the addon makes its process do."""
    figures = []
    proxies = [addon, plain, plain_kept]
    for key, body, limit, what in (
        ("prune", bodies.pruned_16mb, 1.0, f"{pruned_by_rules(bodies.pruned_16mb)} images pruned"),
        ("nochange", bodies.nochange_4mb, 1.10, "needing no change"),
    ):
        clients = {p.name: Client(p.mitmdump.port) for p in proxies}
        received: dict[str, int] = {}
        times: dict[str, list[float]] = {p.name: [] for p in proxies}
        try:
            for _ in range(LATENCY_WARMUP):
                for proxy in proxies:
                    clients[proxy.name].post(body)
            for _ in range(settings.latency_reps):
                for proxy in proxies:
                    client = clients[proxy.name]
                    gc.collect()
                    time.sleep(LATENCY_GAP)
                    started = time.perf_counter()
                    status, got, _ = client.post(body)
                    times[proxy.name].append((time.perf_counter() - started) * 1000)
                    if status != 200:
                        raise RuntimeError(f"{proxy.name} mitmdump answered {status}")
                    received[proxy.name] = got
        finally:
            for client in clients.values():
                client.close()
        size = len(body) / MB
        a, p = statistics.median(times[addon.name]), statistics.median(times[plain.name])
        figures += [
            Figure(f"latency_{key}_addon_ms", f"latency with addon, {size:.1f} MB body {what}", a, "ms"),
            Figure(f"latency_{key}_plain_ms", "latency plain mitmdump, same body", p, "ms"),
            Figure(f"latency_{key}_ratio", f"latency addon / plain ({what})", a / p, "x", limit),
        ]
        k = statistics.median(times[plain_kept.name])
        figures += [
            Figure(f"latency_{key}_plain_kept_ms", "latency plain mitmdump keeping freed memory, same body", k, "ms"),
            Figure(f"latency_{key}_ratio_kept", f"latency addon / plain keeping freed memory ({what})", a / k, "x"),
        ]
        if key == "prune":
            saved_mb = (received[plain.name] - received[addon.name]) / MB
            if saved_mb <= 0:
                raise RuntimeError("the addon did not prune the 16 MB session: check the rules")
            per_mb = (a - p) / saved_mb
            # On a real uplink each MB not sent saves 8/(Mbit/s) seconds: the addon wins below this rate.
            if per_mb > 0:
                breakeven = f"the addon wins on any uplink slower than {8000 / per_mb:.0f} Mbit/s"
            else:
                breakeven = "the addon is faster even on loopback"
            figures.append(
                Figure(
                    "latency_prune_ms_per_mb_saved",
                    "addon's extra latency per MB not uploaded",
                    per_mb,
                    "ms/MB",
                    note=f"upstream received {received[addon.name] / MB:.1f} MB through the addon, "
                    f"{received[plain.name] / MB:.1f} MB plain; {breakeven}",
                )
            )
    return figures


def _post_ok(client: Client, body: bytes) -> None:
    status, _, _ = client.post(body)
    if status != 200:
        raise RuntimeError(f"status {status}")


@contextlib.contextmanager
def _clients(port: int, count: int, work: Callable[[Client, threading.Event], None], what: str) -> Iterator[threading.Event]:
    """`count` threads, each with its own persistent connection to `port`, running `work(client, stop)`
    while the block runs. `stop` is set when one fails (and may be set by the block); leaving the block
    waits for every thread and raises the first failure."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        client = Client(port)
        try:
            work(client, stop)
        except BaseException as exc:  # noqa: BLE001 - raised when the block is left
            errors.append(exc)
            stop.set()
        finally:
            client.close()

    threads = [threading.Thread(target=run, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    try:
        yield stop
    finally:
        for t in threads:
            t.join()
    if errors:
        raise RuntimeError(f"{what} client failed: {type(errors[0]).__name__}: {errors[0]}")


def _throughput_run(port: int, requests: list[bytes], clients: int) -> tuple[float, int]:
    """Requests per second of `clients` threads with persistent connections sharing a fixed list."""
    lock = threading.Lock()
    pending = list(reversed(requests))
    start = threading.Barrier(clients + 1)

    def work(client: Client, stop: threading.Event) -> None:
        start.wait()
        while not stop.is_set():
            with lock:
                if not pending:
                    return
                body = pending.pop()
            _post_ok(client, body)

    with _clients(port, clients, work, "throughput"):
        start.wait()
        began = time.perf_counter()
    elapsed = time.perf_counter() - began
    return len(requests) / elapsed, len(requests)


def throughput_figures(addon: Proxy, plain: Proxy, bodies: Bodies, settings: Settings) -> list[Figure]:
    # 3 text turns for each screenshot turn, in a fixed order; the screenshot turns need pruning.
    pattern = [bodies.text, bodies.text, bodies.pruned_16mb, bodies.text]
    requests = [pattern[i % len(pattern)] for i in range(settings.throughput_requests)]
    rates: dict[str, list[float]] = {addon.name: [], plain.name: []}
    for _ in range(settings.throughput_runs):
        for proxy in (addon, plain):
            gc.collect()
            rate, _ = _throughput_run(proxy.mitmdump.port, requests, 16)
            rates[proxy.name].append(rate)
    a, p = statistics.median(rates[addon.name]), statistics.median(rates[plain.name])
    large = sum(1 for r in requests if r is bodies.pruned_16mb)
    what = f"16 clients, {len(requests)} requests: {len(requests) - large} text, {large} of {len(bodies.pruned_16mb) / MB:.1f} MB"
    return [
        Figure("throughput_addon_rps", f"throughput with addon ({what})", a, "req/s"),
        Figure("throughput_plain_rps", "throughput plain mitmdump, same requests", p, "req/s"),
        Figure("throughput_ratio", "throughput addon / plain", a / p, "x", 0.85, at_most=False),
    ]


def _burst(port: int, body: bytes, clients: int) -> None:
    start = threading.Barrier(clients)

    def work(client: Client, stop: threading.Event) -> None:
        start.wait()
        _post_ok(client, body)

    with _clients(port, clients, work, "memory"):
        pass  # each client sends once, all released together; leaving waits for them


def memory_figures(workdir: Path, upstream: Upstream, bodies: Bodies, settings: Settings) -> list[Figure]:
    peaks: dict[str, list[float]] = {"addon": [], "plain": []}
    baselines: dict[str, list[float]] = {"addon": [], "plain": []}
    afters: dict[str, list[float]] = {"addon": [], "plain": []}  # what the process keeps once idle (trimflow_keep_memory)
    body = bodies.pruned_16mb
    for round_ in range(settings.memory_rounds):
        for name in ("addon", "plain"):  # a fresh process each time: VmHWM is the peak of its whole life
            proxy = start_proxy(workdir / f"memory-{name}-{round_}", name, upstream, addon=name == "addon")
            try:
                Client(proxy.mitmdump.port).post(bodies.text)  # first flow: lazy imports and connection setup
                baselines[name].append(_status_kb(proxy.pid, "VmRSS") / 1024)
                _burst(proxy.mitmdump.port, body, 8)
                peaks[name].append(proxy.peak_rss_mb())
                time.sleep(0.5)
                afters[name].append(_status_kb(proxy.pid, "VmRSS") / 1024)
            finally:
                proxy.mitmdump.stop()
    a, p = statistics.median(peaks["addon"]), statistics.median(peaks["plain"])
    ba, bp = statistics.median(baselines["addon"]), statistics.median(baselines["plain"])
    aa, ap = statistics.median(afters["addon"]), statistics.median(afters["plain"])
    note = (
        f"RSS before the burst: addon {ba:.0f} MB, plain {bp:.0f} MB; growth addon {a - ba:.0f} MB, plain {p - bp:.0f} MB; "
        f"0.5 s after it: addon {aa:.0f} MB, plain {ap:.0f} MB"
    )
    return [
        Figure("memory_addon_mb", f"peak RSS with addon, 8 clients x {len(body) / MB:.1f} MB at once", a, "MB", note=note),
        Figure("memory_plain_mb", "peak RSS plain mitmdump, same burst", p, "MB"),
        Figure("memory_ratio", "peak RSS addon / plain", a / p, "x", 1.5),
    ]


# Blank RGBA PNGs just under the pixel limit (400 KB of PNG, 400 MB of pixels each): three at once, then a mix of eleven
# with three more of them, three of 22.5 MP that decode one at a time, and two real 2.5 MP images shrunk beside them.
SHRINK_BURST = ((10_000, 9_999), (9_999, 9_999), (9_998, 9_999))
SHRINK_MIX_BLANK = ((10_000, 9_998), (9_999, 9_998), (9_998, 9_998), (9_000, 2_500), (9_001, 2_500), (9_002, 2_500))
SHRINK_MODEL = "claude-sonnet-4-6"  # the shipped `claude` rule: 8000 px a side, 5 MiB an image
SHRINK_HELD_WAIT = 60.0


def _image_turn(png: bytes) -> bytes:
    content = [{"type": "image_url", "image_url": {"url": data_url(png, "image/png")}}, {"type": "text", "text": "What changed?"}]
    return orjson.dumps({"model": SHRINK_MODEL, "messages": [{"role": "user", "content": content}]})


def _all_at_once(port: int, bodies: list[bytes]) -> None:
    """Each body from a client of its own, all released together; returns once every one is answered (200)."""
    start = threading.Barrier(len(bodies))
    errors: list[str] = []

    def send(body: bytes) -> None:
        start.wait()
        client = Client(port, timeout=300)
        try:
            status, _, _ = client.post(body)
            if status != 200:
                errors.append(f"status {status}")
        except (OSError, http.client.HTTPException) as exc:
            errors.append(type(exc).__name__)
        finally:
            client.close()

    threads = [threading.Thread(target=send, args=(body,), daemon=True) for body in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"shrink memory: {len(errors)} of {len(bodies)} requests failed: {errors[0]}")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def shrink_memory_figures(workdir: Path, upstream: Upstream) -> list[Figure]:
    """A fresh mitmdump with the addon and the shipped rules, sent images whose decoding would take gigabytes: its peak
    resident size, what it still holds over its quiet figure once idle, and the CPU it spent (docs/security.md)."""
    proxy = start_proxy(workdir / "shrink-memory", "shrink-memory", upstream, addon=True)
    try:
        warm_up = _image_turn(image(8300, 300, "PNG", seed=69, noise=0.2))  # over 8000 px: Pillow loaded, one shrink
        _post_ok(Client(proxy.mitmdump.port), warm_up)
        quiet = _status_kb(proxy.pid, "VmRSS") / 1024
        before = _cpu_seconds(proxy.pid)
        _all_at_once(proxy.mitmdump.port, [_image_turn(blank_png(*size)) for size in SHRINK_BURST])
        burst_cpu, burst_peak = _cpu_seconds(proxy.pid) - before, proxy.peak_rss_mb()
        mix = [_image_turn(blank_png(*size)) for size in SHRINK_MIX_BLANK]
        mix += [_image_turn(image(8400 + 100 * i, 300, "PNG", seed=70 + i, noise=0.2)) for i in range(2)]
        before = _cpu_seconds(proxy.pid)
        _all_at_once(proxy.mitmdump.port, mix)
        mix_cpu, peak = _cpu_seconds(proxy.pid) - before, proxy.peak_rss_mb()
        deadline = time.monotonic() + SHRINK_HELD_WAIT
        while _status_kb(proxy.pid, "VmRSS") / 1024 > quiet + 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # what stays, not what is still on its way back
        held = _status_kb(proxy.pid, "VmRSS") / 1024 - quiet
    finally:
        proxy.mitmdump.stop()
    what = f"{len(SHRINK_BURST)} requests at once, each one blank ~100 MP PNG, then {len(mix)} mixed"
    peak_note, cpu_note = f"quiet {quiet:.0f} MB; after the first three {burst_peak:.0f} MB", f"for the {len(mix)} mixed: {mix_cpu:.1f} s"
    return [
        Figure("shrink_memory_peak_mb", f"peak RSS, {what}", peak, "MB", 2048, note=peak_note),
        Figure("shrink_memory_held_mb", "RSS over the quiet figure once idle", held, "MB", 200),
        Figure("shrink_memory_cpu_s", f"mitmdump CPU for the {len(SHRINK_BURST)} at once", burst_cpu, "s", note=cpu_note),
    ]


def _read_error_answer(port: int, body: bytes) -> int:
    """Send `body` asking the upstream for its large error answer; the answer's length, read and dropped as it comes."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", PATH, body=body, headers={**HEADERS, ERROR_BYTES_HEADER: str(ERROR_ANSWER_BYTES)})
        response = conn.getresponse()
        size = 0
        while block := response.read(MB):
            size += len(block)
        if response.status != 400 or size != ERROR_ANSWER_BYTES:
            raise RuntimeError(f"error answer: {response.status}, {size} bytes")
        return size
    finally:
        conn.close()


def error_answer_figures(workdir: Path, upstream: Upstream, bodies: Bodies, settings: Settings) -> list[Figure]:
    """How far a fresh mitmdump's peak RSS rises above its RSS while one large 400 event stream answers an LLM request:
    trimflow holds an error answer back only up to what it reads for a limit; plain mitmdump buffers it whole."""
    growth: dict[str, list[float]] = {"addon": [], "plain": []}
    for round_ in range(settings.memory_rounds):
        for name in ("addon", "plain"):  # a fresh process each time: freed memory kept from earlier would hide a peak
            proxy = start_proxy(workdir / f"error-answer-{name}-{round_}", name, upstream, addon=name == "addon")
            try:
                Client(proxy.mitmdump.port).post(bodies.text)  # first flow: lazy imports and connection setup
                Path(f"/proc/{proxy.pid}/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
                before = _status_kb(proxy.pid, "VmRSS")
                _read_error_answer(proxy.mitmdump.port, bodies.text)
                growth[name].append((_status_kb(proxy.pid, "VmHWM") - before) / 1024)
            finally:
                proxy.mitmdump.stop()
    a, p = statistics.median(growth["addon"]), statistics.median(growth["plain"])
    size = ERROR_ANSWER_BYTES // MB
    return [
        Figure("error_answer_addon_mb", f"peak RSS growth with addon, one {size} MiB 400 event stream", a, "MB"),
        Figure("error_answer_plain_mb", "peak RSS growth plain mitmdump, same answer", p, "MB"),
        Figure("error_answer_ratio", "peak RSS growth addon / plain, large error answer", a / p, "x", 0.1),
    ]


def _stream_delays(port: int, events: int, interval_ms: float) -> list[float]:
    """Per event: ms from the upstream's send to the client's receipt."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = orjson.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "Count to a hundred."}]})
    try:
        conn.request("POST", PATH, body=body, headers={**HEADERS, EVENTS_HEADER: str(events), INTERVAL_HEADER: str(interval_ms)})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"stream answered {response.status}")
        delays, buffer = [], b""
        while True:
            chunk = response.read1(65536)
            now = time.monotonic_ns()
            if not chunk:
                break
            buffer += chunk
            *complete, buffer = buffer.split(b"\n\n")
            for event in complete:
                if event.startswith(b"data: {"):
                    sent = orjson.loads(event[6:])["sent_ns"]
                    delays.append((now - sent) / 1e6)
        if len(delays) != events:
            raise RuntimeError(f"stream delivered {len(delays)} of {events} events")
        return delays
    finally:
        conn.close()


def _stream_delays_under_load(port: int, settings: Settings, body: bytes) -> tuple[list[float], int]:
    """SSE event delays while another client sends `body` to the same proxy back to back, and how many it sent."""
    sent = [0]

    def work(client: Client, stop: threading.Event) -> None:
        while not stop.is_set():
            _post_ok(client, body)
            sent[0] += 1

    with _clients(port, 1, work, "upload beside the stream") as stop:
        try:
            delays = _stream_delays(port, settings.stream_events, settings.stream_interval_ms)
        finally:
            stop.set()
    return delays, sent[0]


def _p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def streaming_figures(addon: Proxy, plain_stream: Proxy, bodies: Bodies, settings: Settings) -> list[Figure]:
    delays: dict[str, list[float]] = {addon.name: [], plain_stream.name: []}
    loaded: dict[str, list[float]] = {addon.name: [], plain_stream.name: []}
    uploads = {addon.name: 0, plain_stream.name: 0}
    for proxy in (addon, plain_stream):
        _stream_delays(proxy.mitmdump.port, 3, 1)  # warm-up
    for _ in range(settings.stream_runs):
        for proxy in (addon, plain_stream):
            delays[proxy.name] += _stream_delays(proxy.mitmdump.port, settings.stream_events, settings.stream_interval_ms)
    # The engine runs on mitmproxy's event loop (up to 16 MiB): what does pruning a 15.7 MB turn beside a
    # stream do to it? The plain mitmdump streams that upload through instead of buffering it.
    for _ in range(settings.stream_runs):
        for proxy in (addon, plain_stream):
            got, sent = _stream_delays_under_load(proxy.mitmdump.port, settings, bodies.pruned_16mb)
            loaded[proxy.name] += got
            uploads[proxy.name] += sent
    a, p = statistics.median(delays[addon.name]), statistics.median(delays[plain_stream.name])
    la, lp = statistics.median(loaded[addon.name]), statistics.median(loaded[plain_stream.name])
    what = f"{settings.stream_runs} x {settings.stream_events} events, every {settings.stream_interval_ms:g} ms"
    mb = len(bodies.pruned_16mb) / MB
    return [
        Figure(
            "stream_addon_ms",
            f"SSE event delay with addon ({what})",
            a,
            "ms",
            note="addon mitmdump on its defaults: trimflow streams LLM responses itself",
        ),
        Figure("stream_plain_ms", "SSE event delay plain mitmdump, stream_large_bodies=1", p, "ms"),
        Figure("stream_added_ms", "SSE delay added by the addon (median)", a - p, "ms", 5.0),
        Figure(
            "stream_loaded_addon_ms",
            f"SSE event delay with addon, {mb:.1f} MB turns uploaded alongside",
            la,
            "ms",
            note=f"p95 {_p95(loaded[addon.name]):.2f} ms; {uploads[addon.name]} turns pruned during the streams",
        ),
        Figure(
            "stream_loaded_plain_ms",
            "SSE event delay plain mitmdump, same uploads alongside",
            lp,
            "ms",
            note=f"p95 {_p95(loaded[plain_stream.name]):.2f} ms; {uploads[plain_stream.name]} turns streamed through",
        ),
        Figure("stream_loaded_added_ms", "SSE delay added by the addon with uploads alongside (median)", la - lp, "ms", 5.0),
    ]


# --- shaped link ---------------------------------------------------------------------------------------------

SHAPED_RTT_MS = 30.0
# Idle time (seconds) before each timed turn: what the previous proxy does after its answer is done.
SHAPED_GAP = 0.05
# The link's own check: one upload of this size straight through it, no proxy.
LINK_CHECK_BYTES = 8 * MB


class Link(_ChildOnPort):
    """tests/shaped_link.py in a child process between a proxy and `upstream`: one rate, one RTT."""

    what = "shaped link"

    def __init__(self, upstream: Upstream | FakeProvider, rate_mbit: int, rtt_ms: float) -> None:
        super().__init__()
        self.upstream, self.rate_mbit, self.rtt_ms = upstream, rate_mbit, rtt_ms

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "tests.shaped_link", "--upstream", f"127.0.0.1:{self.upstream.port}"]
        return [*command, "--rate-mbit", str(self.rate_mbit), "--rtt-ms", str(self.rtt_ms)]


def _together(*calls: Callable[[], float]) -> list[float]:
    """Run `calls` at the same moment, each in its own thread; their results in order, or the first failure raised."""
    start = threading.Barrier(len(calls))
    results: list[float | BaseException] = [0.0] * len(calls)

    def run(i: int) -> None:
        try:
            start.wait()
            results[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - raised in the calling thread below
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out = []
    for result in results:
        if isinstance(result, BaseException):
            raise result
        out.append(result)
    return out


def _timed_post(client: Client, body: bytes, received: list[int], what: str) -> Callable[[], float]:
    """A call that sends `body` and returns its seconds; the bytes the upstream received go to `received`."""

    def call() -> float:
        started = time.perf_counter()
        status, got, _ = client.post(body)
        elapsed = time.perf_counter() - started
        if status != 200:
            raise RuntimeError(f"{what} answered {status}")
        received.append(got)
        return elapsed

    return call


def _session_turns(
    workdir: Path, upstream: Upstream, warmup: bytes, turn_body: Callable[[int], bytes], turns: int, rate: int
) -> tuple[dict[str, list[float]], dict[str, list[int]], list[float]]:
    """Turn times (s) and bytes the upstream received per turn through each proxy, and the Mbit/s each link
    gave one upload straight through it (its round trip taken off). Each proxy is fresh (trimflow's state starts
    with the session) and has a link of its own at `rate`; every turn (turn_body(1) to turn_body(turns)) goes to
    both at the same moment; `warmup` is sent three times first."""
    names = ("addon", "plain")
    times: dict[str, list[float]] = {name: [] for name in names}
    received: dict[str, list[int]] = {name: [] for name in names}
    with contextlib.ExitStack() as stack:
        links = [Link(upstream, rate, SHAPED_RTT_MS).start() for _ in names]
        for link in links:
            stack.callback(link.stop)
        direct = [Client(link.port) for link in links]
        for client in direct:
            stack.callback(client.close)
            _post_ok(client, b"{}")  # the connection's handshake round trip, as the proxies pay it in their warm-up
        check = os.urandom(LINK_CHECK_BYTES)
        seconds = _together(*(_timed_post(client, check, [], "the bench upstream") for client in direct))
        measured = [len(check) * 8 / (s - SHAPED_RTT_MS / 1000) / 1e6 for s in seconds]
        clients = []
        for name, link in zip(names, links, strict=True):
            mitmdump = Mitmdump(workdir / f"{rate}-{name}", "--mode", f"reverse:{link.url}", addon=name == "addon").start()
            stack.callback(mitmdump.stop)
            client = Client(mitmdump.port)
            stack.callback(client.close)
            for _ in range(3):  # the connection to the upstream (and its handshake round trip), the addon's first imports
                _post_ok(client, warmup)
            clients.append(client)
        for turn in range(1, turns + 1):
            body = turn_body(turn)
            gc.collect()
            time.sleep(SHAPED_GAP)
            calls = [
                _timed_post(client, body, received[name], f"{name} mitmdump on turn {turn}") for name, client in zip(names, clients, strict=True)
            ]
            for name, elapsed in zip(names, _together(*calls), strict=True):
                times[name].append(elapsed)
    return times, received, measured


def shaped_figures(workdir: Path, upstream: Upstream, bodies: Bodies, settings: Settings, say: Callable[[str], None]) -> list[Figure]:
    turns = settings.shaped_turns
    if not 1 <= turns <= len(bodies.shots):
        raise ValueError(f"the shaped session has 1 to {len(bodies.shots)} turns, not {turns}")
    link = f"{SHAPED_RTT_MS:g} ms RTT"
    prunes = pruned_by_rules(distinct_session(turns, bodies.shots[:turns], MIME["WEBP"])) > 0
    figures: list[Figure] = []
    sent: dict[str, int] = {}
    for rate in settings.shaped_rates:
        say(f"shaped link, {rate} Mbit/s {link}: {turns} turns through both proxies at once, each over a link of its own")
        session = lambda turn: distinct_session(turn, bodies.shots[:turn], MIME["WEBP"])  # noqa: E731
        times, received, measured = _session_turns(workdir / "shaped", upstream, bodies.text, session, turns, rate)
        a, p = times["addon"], times["plain"]
        last = f"turn {turns}: {{:.2f}} s for {{:.1f}} MB"
        figures += [
            Figure(
                f"shaped_{rate}mbit_link_mbit",
                f"{rate} Mbit/s links alone: {LINK_CHECK_BYTES // MB} MB upload, one RTT off (slower link)",
                min(measured),
                "Mbit/s",
                note=f"the addon's link {measured[0]:.1f} Mbit/s, plain mitmdump's {measured[1]:.1f} Mbit/s",
            ),
            Figure(
                f"shaped_{rate}mbit_addon_median_s",
                f"turn time with trimflow, {rate} Mbit/s {link} (median of {turns})",
                statistics.median(a),
                "s",
                note=last.format(a[-1], received["addon"][-1] / MB),
            ),
            Figure(
                f"shaped_{rate}mbit_plain_median_s",
                "turn time plain mitmdump, same link (median)",
                statistics.median(p),
                "s",
                note=last.format(p[-1], received["plain"][-1] / MB),
            ),
            Figure(f"shaped_{rate}mbit_median_ratio", "turn time with / without trimflow (median)", statistics.median(a) / statistics.median(p), "x"),
            Figure(f"shaped_{rate}mbit_addon_total_s", f"session time with trimflow, {turns} turns", sum(a), "s"),
            Figure(f"shaped_{rate}mbit_plain_total_s", "session time plain mitmdump, same turns", sum(p), "s"),
            Figure(f"shaped_{rate}mbit_total_ratio", "session time with / without trimflow", sum(a) / sum(p), "x"),
        ]
        for name in ("addon", "plain"):
            total = sum(received[name])
            if sent.setdefault(name, total) != total:
                raise RuntimeError(f"the {name} proxy sent {total} bytes at {rate} Mbit/s, {sent[name]} at another rate")
    saved = sent["plain"] - sent["addon"]
    if prunes and saved <= 0:
        raise RuntimeError("the addon sent no fewer bytes over the shaped link than plain mitmdump: check the rules")
    rates = ", ".join(map(str, settings.shaped_rates))
    if (settings.shaped_rates, turns) == (FULL.shaped_rates, FULL.shaped_turns):
        scope = f"the same at {rates} Mbit/s"
    else:
        full = ", ".join(map(str, FULL.shaped_rates))
        scope = f"a shorter run: {rates} Mbit/s and the first {turns} turns only; the full run sends {FULL.shaped_turns} turns at {full} Mbit/s"
    figures += [
        Figure("shaped_sent_addon_mb", f"uploaded over the link with trimflow, {turns}-turn session", sent["addon"] / MB, "MB", note=scope),
        Figure("shaped_sent_plain_mb", "uploaded over the link plain mitmdump, same session", sent["plain"] / MB, "MB"),
        Figure(
            "shaped_sent_saved_mb",
            "not uploaded thanks to trimflow",
            saved / MB,
            "MB",
            note=f"{saved / sent['plain']:.0%} of the session's bytes",
        ),
    ]
    return figures


# --- bytes: what reaches the provider ----------------------------------------------------------------------

RETINA = (2880, 1800)  # a 1440x900 desktop at 2x
NATIVE_MODEL = "claude-sonnet-4-5"
NATIVE_WITHIN_TURNS = 4  # turns of the control session, whose 1280x800 screenshots Claude sees as they are
ANTHROPIC_HEADERS = {"content-type": "application/json", "x-api-key": "sk-ant-bench", "anthropic-version": "2023-06-01"}


def claude_computer_use(shots: list[bytes], screen: tuple[int, int]) -> list[bytes]:
    """The request bodies of a Claude computer-use session, one per screenshot: the task with shots[0], then each
    click's tool result with the next; the whole history every turn, a breakpoint on the system prompt and one on
    the last block (as Claude Code puts them)."""
    system = [{"type": "text", "text": "You operate a Mac desktop through the computer tool. " * 40, "cache_control": {"type": "ephemeral"}}]
    tools = [{"type": "computer_20250124", "name": "computer", "display_width_px": screen[0], "display_height_px": screen[1], "display_number": 1}]
    rng = random.Random("native-size")

    def shot(n: int) -> dict[str, Any]:
        return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(shots[n])}}

    task = "Open the billing page of the admin console and export last month's invoices as CSV."
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": task}, shot(0)]}]
    bodies = []
    for turn in range(1, len(shots) + 1):
        last = messages[-1]
        marked = [*messages[:-1], {**last, "content": [*last["content"][:-1], {**last["content"][-1], "cache_control": {"type": "ephemeral"}}]}]
        bodies.append(orjson.dumps({"model": NATIVE_MODEL, "max_tokens": 1024, "system": system, "tools": tools, "messages": marked}))
        if turn == len(shots):
            break
        x, y = rng.randrange(screen[0]), rng.randrange(screen[1])
        tool_id = f"toolu_{turn:04d}"
        click = {"type": "tool_use", "id": tool_id, "name": "computer", "input": {"action": "left_click", "coordinate": [x, y]}}
        messages += [
            {"role": "assistant", "content": [{"type": "text", "text": f"Step {turn}: clicking at ({x}, {y})."}, click]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": [shot(turn)]}]},
        ]
    return bodies


def _ask_claude(port: int, body: bytes) -> tuple[int, int]:
    """Send one Messages request through the proxy; the prompt tokens the provider counted (cache reads and writes
    included), and of those the ones read from its cache."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST", "/v1/messages", body=body, headers=ANTHROPIC_HEADERS)
        response = conn.getresponse()
        answer = response.read()
    finally:
        conn.close()
    if response.status != 200:
        raise RuntimeError(f"the proxy answered {response.status}")
    usage = orjson.loads(answer)["usage"]
    read = int(usage.get("cache_read_input_tokens") or 0)
    return int(usage["input_tokens"]) + read + int(usage.get("cache_creation_input_tokens") or 0), read


def _newest_image(body: bytes) -> str:
    images = [m for m in FORMATS["anthropic"].find_media(orjson.loads(body)) if m.kind == "image"]
    assert images and images[-1].data is not None, "the request holds an image"
    return images[-1].data[images[-1].data_offset :]


def native_size_figures(workdir: Path, settings: Settings, say: Callable[[str], None]) -> list[Figure]:
    """The same Claude computer-use session of Retina screenshots through the shipped rules with `native_size` on and
    off: bytes that reach the provider, the prompt tokens the provider counts per turn; and a control session of
    screenshots Claude sees as they are, whose newest must reach the provider byte for byte."""
    turns = settings.native_turns
    say(f"bytes: {turns}-turn Claude computer-use session of {RETINA[0]}x{RETINA[1]} screenshots, native_size on and off")
    shots = [desktop_screenshot(seed, RETINA) for seed in range(turns)]
    session = claude_computer_use(shots, RETINA)
    shipped = DEFAULT_RULES_PATH.read_text(encoding="utf-8")
    # The body budget lifted for both: off, 8 such PNGs are over 16 MiB and it would drop images the other keeps.
    lifted = shipped.replace("\n  max_body_bytes: 16MiB\n", "\n  max_body_bytes: null\n", 1)
    if lifted == shipped:
        raise RuntimeError("the shipped rules no longer set max_body_bytes: 16MiB under defaults; update the bench")
    rules = {"on": lifted, "off": lifted.replace("\ndefaults:\n", "\ndefaults:\n  native_size: false\n", 1)}
    sent: dict[str, list[int]] = {name: [] for name in rules}
    tokens: dict[str, list[tuple[int, int]]] = {name: [] for name in rules}
    with contextlib.ExitStack() as stack:
        providers = {name: stack.enter_context(FakeProvider(cache=True)) for name in rules}
        proxies = {}
        for name, text in rules.items():
            path = workdir / f"native-{name}.yaml"
            path.write_text(text, encoding="utf-8")
            options = {"trimflow_rules": str(path)}
            proxies[name] = Mitmdump(workdir / f"native-{name}", "--mode", f"reverse:{providers[name].url}", addon=True, options=options).start()
            stack.callback(proxies[name].stop)
        for body in session:
            for name in rules:
                tokens[name].append(_ask_claude(proxies[name].port, body))
                sent[name].append(providers[name].received[-1].wire_bytes)
        # The control: screenshots within Claude's native size reach it as they were sent.
        within = [desktop_screenshot(seed) for seed in range(100, 100 + NATIVE_WITHIN_TURNS)]
        changed = 0
        for body in claude_computer_use(within, SCREEN):
            _ask_claude(proxies["on"].port, body)
            changed += _newest_image(providers["on"].received[-1].body) != _newest_image(body)
    on, off = sum(sent["on"]), sum(sent["off"])
    differ = sum(a[0] != b[0] for a, b in zip(tokens["on"], tokens["off"], strict=True))
    reads_differ = sum(a[1] != b[1] for a, b in zip(tokens["on"], tokens["off"], strict=True))
    total = {name: (sum(t for t, _ in tokens[name]), sum(r for _, r in tokens[name])) for name in rules}
    last = f"turn {turns}: {sent['off'][-1] / MB:.1f} MB -> {sent['on'][-1] / MB:.2f} MB"
    return [
        Figure("native_sent_off_mb", f"to the provider, native_size off, {turns}-turn Retina Claude session", off / MB, "MB"),
        Figure("native_sent_on_mb", "to the provider, native_size on (shipped), same session", on / MB, "MB", note=last),
        Figure("native_sent_ratio", "bytes to the provider, off / on", off / on, "x", 3.5, at_most=False),
        Figure(
            "native_tokens_differ",
            "turns whose prompt tokens (the fake provider's usage) differ, on against off",
            differ,
            "turns",
            0,
            note=f"{total['on'][0]:,} tokens on, {total['off'][0]:,} off",
        ),
        Figure(
            "native_cache_reads_differ",
            "turns whose prompt-cache reads differ, on against off (the same bytes every turn)",
            reads_differ,
            "turns",
            0,
            note=f"{total['on'][1]:,} read on, {total['off'][1]:,} off",
        ),
        Figure(
            "native_within_changed",
            f"newest screenshots within Claude's native size ({SCREEN[0]}x{SCREEN[1]}) not byte-identical at the provider",
            changed,
            "turns",
            0,
            note=f"of {NATIVE_WITHIN_TURNS}",
        ),
    ]


# --- send once: each screenshot up the wire once ------------------------------------------------------------


def send_once_figures(workdir: Path, settings: Settings, say: Callable[[str], None]) -> list[Figure]:
    """The same Claude computer-use session (screenshots Claude sees as they are) through the shipped rules with
    send-once on and off, each in front of a fake provider with its Files API and cache model: the bytes that reach the
    provider per turn (uploads included), against the new screenshot and the turn's text; the prompt tokens and cache
    reads per turn."""
    turns = settings.once_turns
    say(f"send once: {turns}-turn Claude computer-use session of {SCREEN[0]}x{SCREEN[1]} screenshots, send_once on and off")
    shots = [desktop_screenshot(seed, SCREEN) for seed in range(200, 200 + turns)]
    session = claude_computer_use(shots, SCREEN)
    shipped = DEFAULT_RULES_PATH.read_text(encoding="utf-8")
    lifted = shipped.replace("\n  max_body_bytes: 16MiB\n", "\n  max_body_bytes: null\n", 1)
    if lifted == shipped:
        raise RuntimeError("the shipped rules no longer set max_body_bytes: 16MiB under defaults; update the bench")
    rules = {"off": lifted, "on": lifted.replace("\ndefaults:\n", "\ndefaults:\n  send_once: true\n", 1)}
    sent: dict[str, list[int]] = {name: [] for name in rules}
    usage: dict[str, list[tuple[int, int]]] = {name: [] for name in rules}
    with contextlib.ExitStack() as stack:
        providers = {name: stack.enter_context(FakeProvider(cache=True)) for name in rules}
        proxies = {}
        for name, text in rules.items():
            path = workdir / f"once-{name}.yaml"
            path.write_text(text, encoding="utf-8")
            proxies[name] = Mitmdump(
                workdir / f"once-{name}", "--mode", f"reverse:{providers[name].url}", options={"trimflow_rules": str(path)}
            ).start()
            stack.callback(proxies[name].stop)
        for body in session:
            for name in rules:
                before = len(providers[name].received)
                usage[name].append(_ask_claude(proxies[name].port, body))
                sent[name].append(sum(r.wire_bytes for r in providers[name].received[before:]))
    # What a turn cannot go below: its new screenshot, once, and its text (the body without its images' base64).
    floor = [
        len(shot) + len(body) - sum(len(m.data or "") for m in FORMATS["anthropic"].find_media(orjson.loads(body)))
        for shot, body in zip(shots, session, strict=True)
    ]
    over = [on / least for on, least in zip(sent["on"][1:], floor[1:], strict=True)]
    reads = [(on[1], off[1]) for on, off in zip(usage["on"], usage["off"], strict=True)]
    read_gap = max((abs(on - off) / off for on, off in reads if off), default=0.0)
    differ = sum(a[0] != b[0] for a, b in zip(usage["on"], usage["off"], strict=True))
    on, off = sum(sent["on"]), sum(sent["off"])
    last = f"turn {turns}: {sent['off'][-1] / MB:.2f} MB -> {sent['on'][-1] / MB:.3f} MB"
    shaped = settings.once_shaped_turns
    say(f"send once: the first {shaped} turns again, each proxy over a {ONCE_SHAPED_MBIT} Mbit/s {SHAPED_RTT_MS:g} ms RTT link of its own")
    times = _send_once_over_a_link(workdir / "once-shaped", rules, session[:shaped])
    timed = {name: statistics.median(seconds) for name, seconds in times.items()}
    # The Retina session as trimflow sent it before the model's size and send-once (native_size off, inline) and as
    # it does with both, over the same link: what a user on that uplink gains from the two together.
    say(f"send once: {shaped} turns of {RETINA[0]}x{RETINA[1]} screenshots, before (native_size off, inline) and with both, same link")
    retina = {"before": lifted.replace("\ndefaults:\n", "\ndefaults:\n  native_size: false\n", 1), "both": rules["on"]}
    for name, text in retina.items():
        (workdir / f"once-{name}.yaml").write_text(text, encoding="utf-8")
    retina_session = claude_computer_use([desktop_screenshot(seed, RETINA) for seed in range(shaped)], RETINA)
    retina_times = _send_once_over_a_link(workdir / "once-retina", retina, retina_session)
    retina_timed = {name: statistics.median(seconds) for name, seconds in retina_times.items()}
    return [
        Figure(
            "once_retina_shaped_ratio",
            f"turn time over the same link, {RETINA[0]}x{RETINA[1]} screenshots: before / with native_size and send_once (median)",
            retina_timed["before"] / retina_timed["both"],
            "x",
            5.0,
            at_most=False,
            note=f"{retina_timed['before']:.2f} s / {retina_timed['both']:.2f} s",
        ),
        Figure(
            "once_shaped_on_median_s",
            f"turn time with send_once, {ONCE_SHAPED_MBIT} Mbit/s {SHAPED_RTT_MS:g} ms RTT (median of {shaped})",
            timed["on"],
            "s",
            note=f"the last turn {times['on'][-1]:.2f} s",
        ),
        Figure(
            "once_shaped_off_median_s", "turn time without it, same link (median)", timed["off"], "s", note=f"the last turn {times['off'][-1]:.2f} s"
        ),
        Figure("once_shaped_median_ratio", "turn time without / with send_once (median)", timed["off"] / timed["on"], "x", 5.0, at_most=False),
        Figure("once_sent_off_mb", f"to the provider, send_once off, {turns}-turn Claude computer-use session", off / MB, "MB"),
        Figure("once_sent_on_mb", "to the provider, send_once on (uploads included), same session", on / MB, "MB", note=last),
        Figure("once_sent_ratio", "bytes to the provider, off / on", off / on, "x"),
        Figure(
            "once_turn_vs_floor",
            "bytes per turn after the first, send_once on, over the new screenshot plus the turn's text (worst turn)",
            max(over),
            "x",
            1.2,
            note=f"median {statistics.median(over):.3f}",
        ),
        Figure("once_tokens_differ", "turns whose prompt tokens (the fake provider's usage) differ, on against off", differ, "turns", 0),
        Figure(
            "once_cache_reads_gap_pct",
            "largest gap in a turn's prompt-cache reads, on against off",
            read_gap * 100,
            "%",
            1.0,
            note=f"{sum(r for r, _ in reads):,} read on, {sum(r for _, r in reads):,} off",
        ),
    ]


ONCE_SHAPED_MBIT = 50


def _send_once_over_a_link(workdir: Path, rules: dict[str, str], session: list[bytes]) -> dict[str, list[float]]:
    """Seconds per turn through a proxy per rules file, each in front of a fake provider of its own behind a shaped link
    of its own (the uploads go over it too); the turns alternate between the proxies."""
    times: dict[str, list[float]] = {name: [] for name in rules}
    warmup = orjson.dumps({"model": NATIVE_MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "Ready?"}]})
    with contextlib.ExitStack() as stack:
        ports = {}
        for name in rules:
            provider = stack.enter_context(FakeProvider(record=False))
            link = Link(provider, ONCE_SHAPED_MBIT, SHAPED_RTT_MS).start()
            stack.callback(link.stop)
            options = {"trimflow_rules": str(workdir.parent / f"once-{name}.yaml")}
            mitmdump = Mitmdump(workdir / name, "--mode", f"reverse:{link.url}", options=options).start()
            stack.callback(mitmdump.stop)
            ports[name] = mitmdump.port
            for _ in range(3):  # the addon's first imports and the link's first connection
                _ask_claude(mitmdump.port, warmup)
        for body in session:
            for name, port in ports.items():
                started = time.perf_counter()
                _ask_claude(port, body)
                times[name].append(time.perf_counter() - started)
    return times


# --- shrink -------------------------------------------------------------------------------------------------


def shrink_figures(settings: Settings) -> list[Figure]:
    """tests.shrink_bench's figures (measured by a module of their own), or a row saying they are not available."""
    if importlib.util.find_spec(SHRINK_MODULE) is None:
        return [Figure("shrink", "shrink: not available", None, "", note=f"{SHRINK_MODULE} does not exist in this checkout")]
    try:
        module = importlib.import_module(SHRINK_MODULE)
        cases = module.CASES
        if settings.shrink_scale != 1:
            cases = {name: _scaled_case(case, settings.shrink_scale) for name, case in cases.items()}
        speed = module.shrink_speed(cases, repeats=settings.shrink_repeats)
        session = module.session_cache(settings.shrink_turns)
    except Exception as exc:  # noqa: BLE001 - the module is new: report it, keep the other figures
        return [Figure("shrink", f"shrink: failed ({type(exc).__name__})", None, "", note=str(exc)[:200])]
    figures = [
        Figure(
            f"shrink_{name}_ms_per_mp", f"shrink {name}", entry["ms_per_megapixel"], "ms/MP", note=f"{entry['megapixels']} MP -> {entry['result']}"
        )
        for name, entry in speed.items()
    ]
    turns = session["turns"]
    figures += [
        Figure(
            "shrink_session_hit_rate",
            f"shrink cache hit rate, {turns}-turn session",
            session["hit_rate"],
            "",
            note=f"{session['hits']} hits, {session['misses']} misses",
        ),
        Figure(
            "shrink_session_overhead_ms",
            f"engine overhead per turn, {turns}-turn session (median)",
            session["overhead_ms_median"],
            "ms",
            note=f"max {session['overhead_ms_max']} ms",
        ),
    ]
    return figures


def _scaled_case(case: tuple[Any, ...], scale: float) -> tuple[Any, ...]:
    """A shrink case with sides (and the byte limit) scaled: ms per megapixel stays comparable."""
    fmt, noise, width, height, max_side, max_bytes = case
    side = lambda v: None if v is None else max(16, int(v * scale))  # noqa: E731
    return (fmt, noise, side(width), side(height), side(max_side), None if max_bytes is None else int(max_bytes * scale * scale))


# --- the run -------------------------------------------------------------------------------------------------


def start_proxy(
    workdir: Path, name: str, upstream: Upstream, *, addon: bool, options: dict[str, str] | None = None, env: dict[str, str] | None = None
) -> Proxy:
    return Proxy(name, Mitmdump(workdir, "--mode", f"reverse:{upstream.url}", addon=addon, options=options, env=env).start())


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
    info["python"] = platform.python_version()
    for package in ("mitmproxy", "orjson"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            info[package] = importlib.metadata.version(package)
    with contextlib.suppress(OSError):
        info["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    return info


SECTIONS = ("engine", "text", "proxy", "learned", "store", "recall", "shaped", "bytes", "send_once", "shrink", "cache")
LEARNED_ENTRIES = 10_000


# Steady computer use, on Anthropic, OpenAI chat and Responses: the shipped rules within 2% of the optimum at full length.
STEADY_SESSIONS = ("computer-use", "computer-use-openai", "computer-use-responses")
ROUND_ROBIN_SESSIONS = ("computer-use", "idle", "claude-code")  # two instances against one: pauses past the TTL on all
# An automatic cache (no write premium) priced with its reads at these shares of the input price too: what a model's cached
# input costs varies (gpt-4.1 a quarter, gpt-4o half, Gemini a quarter or a tenth as reported), and its rule must hold for
# the shares it is written for.
AUTOMATIC_READ_SHARES = (0.25, 0.5)
# GPT-5's cached input is a tenth of its input price, like Anthropic's reads: its rule (the defaults) is written for that,
# and at half it holds too many images (docs/caching.md); shown there without a target.
TENTH_PRICED_MODELS = ("gpt-5", "gpt-5-codex")


def cache_price_models(reference: ReferenceSession) -> dict[str, tuple[Price, bool]]:
    """The prices `reference` is priced at, by a name for its figures ("" for its model's own): each with whether the
    shipped rules are held to the targets there."""
    own = price_for(reference)
    out = {"": (own, True)}
    if own.cache_write == own.input:  # an automatic cache
        for share in AUTOMATIC_READ_SHARES:
            held = reference.model not in TENTH_PRICED_MODELS or share < 0.5
            out[f"reads_{int(share * 100)}"] = (dataclasses.replace(own, cache_write=own.input, cache_read=own.input * share), held)
    return out


def cache_figures() -> list[Figure]:
    """The shipped rules against rolling keep-8 and no pruning at all on the 60-turn computer-use reference session,
    billed by the prompt cache model (tests.research.policy_runner: run_policy); and on every reference session and price model, the
    shipped rules' cost over the cheapest cut schedule at the card's cap and floor (3 of 8, 5 of 10) that cuts nothing
    before the conversation's first overflow, as the rules promise (tests.research.optimum), at full length and
    averaged over the session's lengths, with the optimum free to cut before beside it. Deterministic: the same
    figures on any machine."""
    policies = {p.name: p for p in POLICIES}
    session = next(s for s in REFERENCE_SESSIONS if s.name == "computer-use")
    shipped, rolling, none = (run_policy(session, policies[name]) for name in ("shipped defaults", "rolling (batch 1)", "no pruning"))
    assert shipped.cost is not None and rolling.cost is not None and none.cost is not None, "the session's model has a price"
    figures = [
        Figure("cache_cost_shipped", "computer-use session cost, shipped rules", shipped.cost, "USD"),
        Figure("cache_cost_rolling", "same session, rolling keep-8 (prune_batch: 1)", rolling.cost, "USD"),
        Figure("cache_cost_none", "same session, no pruning (breaks a cap of 8 on 52 turns)", none.cost, "USD"),
        Figure(
            "cache_writes_vs_rolling",
            "cache-write tokens, shipped / rolling",
            shipped.cache_write_tokens / rolling.cache_write_tokens,
            "x",
            1 / 3,
        ),
        Figure("cache_cost_vs_cheaper", "cost, shipped / cheaper of rolling and no pruning", shipped.cost / min(rolling.cost, none.cost), "x", 1.0),
        Figure("cache_broken_share", "turns whose cached prefix broke, shipped", shipped.broken_turns / shipped.requests, "x", 1 / 6),
    ]
    for reference in REFERENCE_SESSIONS:
        result = shipped if reference is session else run_policy(reference, policies["shipped defaults"])
        cap = session_cap(reference, RULES)
        floor = batch_floor(cap)
        models = cache_price_models(reference)
        best = priced_optima(reference, {name: price for name, (price, _) in models.items()}, cap=cap, floor=floor)
        free = priced_optima(reference, {name: price for name, (price, _) in models.items()}, cap=cap, floor=floor, cut_before_overflow=True)
        steady = reference.name in STEADY_SESSIONS
        for model, (price, held) in models.items():
            against = ratios(result, best[model], price)
            unconstrained = ratios(result, free[model], price)
            name = reference.name.replace("-", "_") + (f"_{model}" if model else "")
            priced = f", reads at {model.removeprefix('reads_')}% of input" if model else ""
            where = f"{reference.name}{priced}, shipped / optimum at a floor of {floor} under a cap of {cap}"
            figures += [
                Figure(f"cache_optimum_{name}_full", f"{where}, full length", against.full, "x", 1.02 if steady and held else None),
                Figure(f"cache_optimum_{name}_by_length", f"{where}, averaged over lengths", against.averaged, "x", 1.05),
                Figure(
                    f"cache_optimum_{name}_full_free",
                    f"{where}, full length, the optimum free to cut before the first overflow",
                    unconstrained.full,
                    "x",
                ),
            ]
        base = reference.name.replace("-", "_")
        figures += [
            Figure(f"cache_optimum_{base}_over_cap", f"{reference.name}, shipped: turns over the cap", against.cap_broken, "turns", 0),
            Figure(
                f"cache_optimum_{base}_under_floor",
                f"{reference.name}, shipped: turns cut below the floor of {floor}",
                against.floor_broken,
                "turns",
                0,
            ),
        ]
    # Two instances behind a round-robin balancer, each seeing every other turn and sharing the conversations file, as
    # instances on one host do by default, against one instance.
    for name in ROUND_ROBIN_SESSIONS:
        reference = next(s for s in REFERENCE_SESSIONS if s.name == name)
        one = shipped if reference is session else run_policy(reference, policies["shipped defaults"])
        two = run_policy(reference, policies["shipped defaults"], instances=2)
        assert one.cost is not None and two.cost is not None, "the session's model has a price"
        label = f"{name}, shipped: two instances behind round robin sharing the conversations file / one"
        figures.append(Figure(f"cache_round_robin_{name.replace('-', '_')}", label, two.cost / one.cost, "x", 1.0))
    return figures


LOOKALIKE_SHOTS = 60  # screenshots of the repeated-screens session, every third the screen before it again
LOOKALIKE_DISTINCT = 48  # distinct screens whose every pair the look-alike test must tell apart


def lookalike_figures() -> list[Figure]:
    """Screens that look alike (trimflow._lookalike) on screens drawn for it (trimflow.testing._screens, 1280x800):
    the false matches among LOOKALIKE_DISTINCT distinct screens (PNG and JPEG), the share of the same screen a moment
    later (cursor moved, clock on, spinner frame) found; then an Anthropic computer-use session of LOOKALIKE_SHOTS
    screenshots, every third the screen before it again, under the shipped rules: the distinct screens the model sees
    per turn, against today's order (by age alone) and against the best any cut schedule reaches that moves its cut on
    today's turns (and only those: the prompt cache breaks no more often), sends as many images each turn, never cuts
    the newest and never brings back a cut image, found by search (`best_distinct`). Deterministic."""
    figures: list[Figure] = []
    false_matches = pairs = 0
    for fmt in ("PNG", "JPEG"):
        thumbs = [thumbnail(b64(s)) for s in distinct_screens(LOOKALIKE_DISTINCT, fmt=fmt)]
        for i, a in enumerate(thumbs):
            for b in thumbs[i + 1 :]:
                pairs += 1
                false_matches += a is not None and b is not None and same_screen(a, b)
    found = tried = 0
    for seed in range(8):
        base = thumbnail(b64(app_screen(seed)))
        for change in CHANGES:
            for variant in (1, 2, 5):
                again = thumbnail(b64(app_screen(seed, variant=variant, change=change)))
                tried += 1
                found += base is not None and again is not None and same_screen(base, again)
    figures += [
        Figure("lookalike_false_matches", f"look-alikes among {pairs:,} pairs of distinct screens (PNG, JPEG)", false_matches, "pairs", 0),
        Figure("lookalike_found", f"the same screen a moment later found a look-alike ({tried} pairs)", found / tried, "x", 1.0, at_most=False),
    ]
    shots, screens = repeating_screens(LOOKALIKE_SHOTS)
    on, made = _distinct_seen(shots, screens, lookalikes=True)
    today, _ = _distinct_seen(shots, screens, lookalikes=False)
    sizes = [len(sent) for sent in today]
    if sizes != [len(sent) for sent in on]:
        raise RuntimeError("look-alikes changed how many images a turn sends")
    moved = {turn for turn in range(1, len(today)) if _cut_moved(today, turn)}
    best = best_distinct(screens, sizes, moved)
    seen = statistics.fmean(len(set(sent)) for sent in on)
    before = statistics.fmean(len(set(sent)) for sent in today)
    where = f"{LOOKALIKE_SHOTS} screenshots, every third the screen before it again, shipped rules"
    figures += [
        Figure("lookalike_distinct_seen", f"{where}: distinct screens the model sees per turn", seen, "screens"),
        Figure("lookalike_distinct_vs_age", "same, over cutting by age alone", seen / before, "x", 1.1, at_most=False),
        Figure("lookalike_distinct_gap", "same, short of the best cut schedule on the same cache-breaking turns", best - seen, "screens", 0.01),
        Figure("lookalike_thumbnails_per_move", "thumbnails made per turn the cut moves", made / max(1, len(moved)), "images"),
    ]
    return figures


def _distinct_seen(shots: list[bytes], screens: list[int], lookalikes: bool) -> tuple[list[list[int]], int]:
    """Each turn of the session through the engine as the proxy runs it: the screens it sent; and the thumbnails made."""
    rules = load_rules(DEFAULT_RULES_PATH).with_limits(cut_lookalikes=lookalikes)
    screen_of = {b64(shot): screen for shot, screen in zip(shots, screens, strict=True)}
    conversations = Conversations()
    made = THUMBNAILS.made
    out = []
    for body in agent_session("anthropic", None, shots, "claude-sonnet-4-6"):
        outcome = prune_request("https://api.anthropic.com/v1/messages", {}, orjson.dumps(body), rules, memory=conversations)
        assert outcome.record is not None and outcome.history is not None
        conversations.assign(outcome.history, outcome.record.kind, *outcome.taken)
        media = FORMATS["anthropic"].find_media(orjson.loads(outcome.body))
        out.append([screen_of[m.data] for m in media if m.kind == "image" and isinstance(m.data, str)])
    return out, THUMBNAILS.made - made


def _cut_moved(sent: list[list[int]], turn: int) -> bool:
    """Whether the turn sent fewer images than the one before plus its new one: its cut moved."""
    return len(sent[turn]) < len(sent[turn - 1]) + 1


def best_distinct(screens: list[int], sizes: list[int], moved: set[int]) -> float:
    """The most distinct screens per turn, on average, of any cut schedule of the session (turn t holds the first t - 1
    screenshots) that sends sizes[t] images on turn t, moves its cut only on the turns `moved` (between them every
    image kept stays kept and each new one is sent), never cuts the newest and never brings a cut one back. A search
    over what each move keeps: the future depends only on the screens kept, so the states are their multisets."""
    states: dict[tuple[int, ...], int] = {(): 0}
    for turn in range(1, len(sizes)):
        new = screens[turn - 1]
        after: dict[tuple[int, ...], int] = {}
        for kept, total in states.items():
            if turn not in moved:
                options = [(*kept, new)]
            else:
                rest = sizes[turn] - 1  # the newest stays
                options = [(*chosen, new) for chosen in set(itertools.combinations(kept, rest))] if rest <= len(kept) else []
            for option in options:
                state = tuple(sorted(option))
                value = total + len(set(state))
                if value > after.get(state, -1):
                    after[state] = value
        states = after
    return max(states.values()) / len(sizes)


def run(settings: Settings, say: Callable[[str], None], sections: tuple[str, ...] = SECTIONS) -> tuple[list[Figure], dict[str, Any]]:
    info = machine()
    figures: list[Figure] = []
    bodies = build_bodies(settings, say, scaling="engine" in sections)
    if "engine" in sections:
        say("engine, in process")
        figures += engine_figures(bodies, settings)
        say("engine scaling")
        figures += scaling_figures(bodies, settings)
        say("clicks of a computer-use answer mapped back")
        figures += clicks_figures(settings)
        say("image type and size from a prefix of the base64")
        figures += sniff_figures()
    if "text" in sections:
        figures += text_figures(settings, say)
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="trimflow-bench-") as tmp:
        workdir = Path(tmp)
        upstream = Upstream().start()
        stack.callback(upstream.stop)
        if "proxy" in sections:
            figures += proxy_figures(workdir, upstream, bodies, settings, say, stack)
        if "learned" in sections:
            say(f"learned limits: {LEARNED_ENTRIES:,} entries in a file another process holds locked, learning meanwhile")
            figures += learned_figures(workdir, upstream, settings)
            say(f"conversations file: {CONVERSATIONS_ROWS:,} conversations, one turn's read and write")
            figures += conversations_file_figures(workdir, settings)
        if "store" in sections:
            say("shared store (trimflow_state): a screenshot conversation's turns with the store up, killed and hung, and none")
            figures += store_figures(workdir, upstream, settings)
        if "recall" in sections:
            say(f"recall store: {RECALL_CONVERSATIONS:,} conversations soaked through its bounds (a process of its own)")
            figures += recall_figures(workdir)
        if "text" in sections:
            figures += text_floor_figures(workdir, upstream, settings, say)
            say(f"conversations soak: {SOAK_WARM:,} conversations, then {settings.soak_conversations:,} more, through one mitmdump")
            figures += conversations_soak_figures(workdir, upstream, settings)
            figures += text_session_figures(workdir, upstream, settings, say)
        if "shaped" in sections:
            figures += shaped_figures(workdir, upstream, bodies, settings, say)
        if "bytes" in sections:
            figures += native_size_figures(workdir, settings, say)
        if "send_once" in sections:
            figures += send_once_figures(workdir, settings, say)
    if "shrink" in sections:
        say("shrink (tests.shrink_bench)")
        figures += shrink_figures(settings)
    if "cache" in sections:
        say("prompt cache cost (reference computer-use session, cache model)")
        figures += cache_figures()
        say("look-alike screens: the threshold's matches, and the distinct screens a session sees")
        figures += lookalike_figures()
    with contextlib.suppress(OSError):
        info["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return figures, info


def proxy_figures(
    workdir: Path, upstream: Upstream, bodies: Bodies, settings: Settings, say: Callable[[str], None], stack: contextlib.ExitStack
) -> list[Figure]:
    figures: list[Figure] = []
    say("starting mitmdump: with the addon, plain, plain with the addon's malloc thresholds, plain streaming")
    addon = start_proxy(workdir / "addon", "addon", upstream, addon=True)
    stack.callback(addon.mitmdump.stop)
    plain = start_proxy(workdir / "plain", "plain", upstream, addon=False)
    stack.callback(plain.mitmdump.stop)
    plain_kept = start_proxy(workdir / "plain-kept", "plain-kept", upstream, addon=False, env=KEPT_MEMORY_ENV)
    stack.callback(plain_kept.mitmdump.stop)
    plain_stream = start_proxy(workdir / "plain-stream", "plain-stream", upstream, addon=False, options={"stream_large_bodies": "1"})
    stack.callback(plain_stream.mitmdump.stop)
    say("latency through the proxy")
    figures += latency_figures(addon, plain, plain_kept, bodies, settings)
    plain_kept.mitmdump.stop()
    say("throughput, 16 clients")
    figures += throughput_figures(addon, plain, bodies, settings)
    say("streaming")
    figures += streaming_figures(addon, plain_stream, bodies, settings)
    for proxy in (addon, plain, plain_stream):
        proxy.mitmdump.stop()
    say("memory, 8 clients x 16 MB at once (fresh processes)")
    figures += memory_figures(workdir, upstream, bodies, settings)
    say(f"a {ERROR_ANSWER_BYTES // MB} MiB error answer (fresh processes)")
    figures += error_answer_figures(workdir, upstream, bodies, settings)
    say("shrinking images that decode to gigabytes, three at once and a mix (a fresh process)")
    figures += shrink_memory_figures(workdir, upstream)
    return figures


CONVERSATIONS_ROWS = 10_000  # conversations in the file of last turns
CONVERSATIONS_IMAGES = 60  # images of the turn read and written


def conversations_file_figures(workdir: Path, settings: Settings) -> list[Figure]:
    """What the file of last turns (trimflow._last_turns) adds to a turn: the read of the conversation's last turn
    before its cut and the write after it, on a file of CONVERSATIONS_ROWS conversations, by one connection while
    another (a second instance) reads and writes the same file between turns."""
    path = workdir / "conversations" / "trimflow-conversations.sqlite3"
    images = tuple((i.to_bytes(8, "big"), i) for i in range(CONVERSATIONS_IMAGES))
    keys = [conversation_key("api.anthropic.com", None, i.to_bytes(8, "big")) for i in range(CONVERSATIONS_ROWS)]
    times: list[float] = []
    with LastTurns(str(path)) as this, LastTurns(str(path)) as other:
        missing = keys
        for _ in range(100):  # written as fast as a loop goes, some wait for the checkpoint (or are dropped): again
            for key in missing:
                other.put(key, LastTurn(time.time(), 6, images))
            missing = [key for key in missing if this.get(key) is None]
            if not missing:
                break
        else:
            raise RuntimeError("the file was not filled")
        for rep in range(LATENCY_WARMUP + 20 * settings.latency_reps):
            key = keys[rep % len(keys)]
            other.put(key, LastTurn(time.time(), 6, images))  # the other instance's turn
            started = time.perf_counter()
            last = this.get_many(row_keys(key))[0]  # as a turn reads: every row under the conversation's key
            this.put(key, LastTurn(time.time(), 12, images))
            if rep >= LATENCY_WARMUP:
                times.append((time.perf_counter() - started) * 1000)
            if last is None or last.cut != 6:
                raise RuntimeError("the other connection's turn was not read")
    label = f"conversations file: a turn's read and write ({CONVERSATIONS_IMAGES} images, {CONVERSATIONS_ROWS:,} conversations), median"
    return [Figure("conversations_file_turn_ms", label, statistics.median(times), "ms", 0.5)]


def learned_figures(workdir: Path, upstream: Upstream, settings: Settings) -> list[Figure]:
    """An unrelated request's latency through a mitmdump whose learned-limits file holds LEARNED_ENTRIES entries and is
    held locked by another process (flock), while requests to other models are refused for a limit, retried and
    learned, against one with no learned file: the file's reads, the lock and the writes stay off the requests' path."""
    path = workdir / "learned" / "trimflow-learned.yaml"
    path.parent.mkdir(parents=True)
    when = utc_timestamp()
    entry = "- {{upstream: 'https://u{}.example.com:443', model: 'm-{}', limit: max_images, value: 4, learned: '{}'}}\n"
    path.write_text("learned:\n" + "".join(entry.format(i % 997, i, when) for i in range(LEARNED_ENTRIES)))
    command = ["flock", "--shared", str(path), "sh", "-c", "echo held; read _"]
    holder = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held", "flock could not hold the file"
        learning = start_proxy(workdir / "learned-file", "learned", upstream, addon=True, options={"trimflow_learned": str(path)})
        none = start_proxy(workdir / "learned-none", "no-learned", upstream, addon=True, options={"trimflow_learned": ""})
        unrelated = text_session(30)
        refused = distinct_session(6, scaled_shots(6, 40), "image/jpeg")
        clients = {p.name: Client(p.mitmdump.port) for p in (learning, none)}
        teacher = Client(learning.mitmdump.port)
        times: dict[str, list[float]] = {p.name: [] for p in (learning, none)}
        try:
            for rep in range(LATENCY_WARMUP + settings.latency_reps):
                # a limit learned for a model not seen before: the store has something to write, and the file stays locked
                status, _, _ = teacher.post(refused.replace(b'"model":"gpt-4o"', b'"model":"gpt-4o-%d"' % rep), {MAX_IMAGES_HEADER: "4"})
                if status != 200:
                    raise RuntimeError(f"a refusal was not recovered ({status})")
                for name, client in clients.items():
                    gc.collect()
                    time.sleep(LATENCY_GAP)
                    started = time.perf_counter()
                    status, _, _ = client.post(unrelated)
                    if status != 200:
                        raise RuntimeError(f"{name} mitmdump answered {status}")
                    if rep >= LATENCY_WARMUP:
                        times[name].append((time.perf_counter() - started) * 1000)
        finally:
            for client in (*clients.values(), teacher):
                client.close()
            learning.mitmdump.stop()
            none.mitmdump.stop()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(10)
    with_file, without = statistics.median(times[learning.name]), statistics.median(times[none.name])
    size = len(unrelated) / 1000
    return [
        Figure("learned_locked_ms", f"latency, {size:.0f} KB text turn, {LEARNED_ENTRIES:,} learned entries, file locked, learning", with_file, "ms"),
        Figure("learned_none_ms", "latency, same turn, no learned file", without, "ms"),
        Figure("learned_locked_ratio", "learned file locked and learning / none", with_file / without, "x", 1.10),
    ]


STORE_TURNS = 12  # turns of the screenshot conversation sent through each mitmdump, again and again
STORE_SHOT_KB = 40
STORE_STATES = ("none", "up", "down", "hung")


def _redis_server(workdir: Path, name: str) -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server on a Unix socket of its own (no TCP port, nothing saved), answering; and its trimflow_state URL."""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    path = workdir / f"{name}.sock"
    command = [binary, "--port", "0", "--unixsocket", str(path), "--unixsocketperm", "700", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen([*command, "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as probe:
            probe.settimeout(1)
            probe.connect(str(path))
            probe.sendall(b"PING\r\n")
            if probe.recv(16).startswith(b"+PONG"):
                return process, f"unix://{path}"
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("redis-server did not answer")
        time.sleep(0.05)


def store_figures(workdir: Path, upstream: Upstream, settings: Settings) -> list[Figure]:
    """A request's latency through a mitmdump sharing its conversations in Redis (trimflow_state, the default deadline)
    with the store up; killed after the warm-up (its socket refuses); hung after the warm-up (SIGSTOP: connections
    are accepted, nothing is answered); and through one with no store at all. Turns of a screenshot conversation
    past the default rules' 8 images (each reads the conversation's rows), interleaved over the four."""
    if shutil.which("redis-server") is None and not os.access("/usr/bin/redis-server", os.X_OK):
        return [Figure("store", "store: not available", None, "", note="no redis-server: scripts/setup installs it")]
    folder = workdir / "store"
    folder.mkdir()
    shots = scaled_shots(STORE_TURNS, STORE_SHOT_KB)
    bodies = [distinct_session(n, shots[:n], "image/jpeg") for n in range(1, STORE_TURNS + 1)]
    servers: dict[str, subprocess.Popen[bytes]] = {}
    proxies: dict[str, Proxy] = {}
    clients: dict[str, Client] = {}
    times: dict[str, list[float]] = {state: [] for state in STORE_STATES}
    try:
        options = {state: {"trimflow_conversations": ""} for state in STORE_STATES}
        for state in STORE_STATES[1:]:
            servers[state], options[state]["trimflow_state"] = _redis_server(folder, state)
        with ThreadPoolExecutor(len(STORE_STATES)) as pool:  # side by side: a start is mostly importing mitmproxy
            starting = {
                state: pool.submit(start_proxy, folder / state, f"store-{state}", upstream, addon=True, options=options[state])
                for state in STORE_STATES
            }
        for state, future in starting.items():  # every one that started is stopped below, whichever failed
            if future.exception() is None:
                proxies[state] = future.result()
        for future in starting.values():
            future.result()
        clients = {state: Client(proxies[state].mitmdump.port) for state in STORE_STATES}
        rounds = max(1, settings.latency_reps // 4)
        for rep in range(1 + rounds):
            if rep == 1:  # past the warm-up: one store killed, one hung, mid-conversation
                servers["down"].kill()
                servers["down"].wait(10)
                servers["hung"].send_signal(signal.SIGSTOP)
            for body in bodies:
                for state, client in clients.items():
                    gc.collect()
                    time.sleep(LATENCY_GAP)
                    started = time.perf_counter()
                    status, _, _ = client.post(body)
                    if status != 200:
                        raise RuntimeError(f"store {state}: mitmdump answered {status}")
                    if rep:
                        times[state].append((time.perf_counter() - started) * 1000)
    finally:
        for client in clients.values():
            client.close()
        for proxy in proxies.values():
            proxy.mitmdump.stop()
        for process in servers.values():
            with contextlib.suppress(OSError):
                process.send_signal(signal.SIGCONT)
            process.kill()
            process.wait(10)
    median = {state: statistics.median(values) for state, values in times.items()}
    most = {state: max(values) for state, values in times.items()}
    count = len(times["up"])
    what = f"{STORE_SHOT_KB} KB screenshot turns 1-{STORE_TURNS}, {count} requests"
    labels = {
        "none": "no store",
        "up": "store up",
        "down": "store killed (refusing)",
        "hung": "store hung (SIGSTOP: accepting, never answering)",
    }
    figures = [Figure(f"store_{state}_ms", f"latency, {what}, {labels[state]}, median", median[state], "ms") for state in STORE_STATES]
    figures += [Figure(f"store_{state}_max_ms", f"latency, same, {labels[state]}, largest", most[state], "ms") for state in STORE_STATES]
    figures += [
        Figure("store_up_vs_none", "store up / no store, medians", median["up"] / median["none"], "x", 1.10),
        Figure(
            "store_outage_vs_up",
            "store killed or hung (the slower) / store up, medians",
            max(median["down"], median["hung"]) / median["up"],
            "x",
            1.10,
        ),
    ]
    return figures


RECALL_CONVERSATIONS = 1_000  # conversations of the recall soak, each cutting RECALL_IMAGES images
RECALL_IMAGES = 8
RECALL_IMAGE_KB = 48
RECALL_MAX_MB = 64  # the store's bound in all, below what the soak offers (375 MB)
RECALL_CONVERSATION_KB = 4 * RECALL_IMAGE_KB + 4  # each conversation's bound: room for 4 of its 8 images


def recall_soak(folder: str) -> dict[str, float]:
    """In a process of its own (`--recall-soak`): RECALL_CONVERSATIONS conversations offer their cut images to a recall
    store, one request after another (a request's images written before the next, as requests come apart); the bytes
    the folder holds after each conversation, the process's RSS, and the time `offer` takes on the caller's thread."""
    from trimflow._recall import Kept, RecallStore, image_id, owner_of, run_folder
    from trimflow.formats import Media

    token = os.urandom(32)
    store = RecallStore(folder, token, max_bytes=RECALL_MAX_MB * MB, conversation_bytes=RECALL_CONVERSATION_KB * 1024)
    store.accepts(owner_of(token, HEADERS))
    rng = random.Random(7)
    started_kb, most_on_disk, offers = _status_kb(os.getpid(), "VmRSS"), 0, []
    run = Path(folder) / run_folder(token)
    for conversation in range(RECALL_CONVERSATIONS):
        kept = []
        for _ in range(RECALL_IMAGES):
            raw = rng.randbytes(RECALL_IMAGE_KB * 1024)
            kept.append(Kept(image_id(raw), Media("image", ("messages", 0), base64.b64encode(raw).decode()), "image/png"))
        began = time.perf_counter()
        store.offer(f"{conversation:08x}", kept)
        offers.append((time.perf_counter() - began) * 1000)
        if not store.flush(60):
            raise RuntimeError("the recall writer did not keep up within 60 s")
        if conversation % 50 == 49:
            most_on_disk = max(most_on_disk, sum(f.stat().st_size for f in run.iterdir()))
    on_disk = sum(f.stat().st_size for f in run.iterdir())
    files, _ = store.usage()
    result = {
        "offered_mb": RECALL_CONVERSATIONS * RECALL_IMAGES * RECALL_IMAGE_KB / 1024,
        "most_on_disk_mb": max(most_on_disk, on_disk) / MB,
        "on_disk_mb": on_disk / MB,
        "files": files,
        "stored": store.stored,
        "evicted": store.evicted,
        "skipped": store.skipped,
        "rss_growth_mb": (_status_kb(os.getpid(), "VmHWM") - started_kb) / 1024,
        "offer_ms": statistics.median(offers),
    }
    store.close()
    return result


def recall_figures(workdir: Path) -> list[Figure]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.bench", "--recall-soak", str(workdir / "recall")], capture_output=True, text=True, env=_child_env(), timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(f"the recall soak failed: {done.stderr[-2000:]}")
    soak = json.loads(done.stdout)
    note = (
        f"{RECALL_CONVERSATIONS:,} conversations x {RECALL_IMAGES} images of {RECALL_IMAGE_KB} KB offered ({soak['offered_mb']:.0f} MB), "
        f"{soak['stored']:,} written, {soak['evicted']:,} evicted, {soak['skipped']} skipped, {soak['files']:,} files left"
    )
    return [
        Figure(
            "recall_disk_vs_bound",
            f"recall soak: most bytes on disk / the bound ({RECALL_MAX_MB} MB)",
            soak["most_on_disk_mb"] / RECALL_MAX_MB,
            "x",
            1.0,
            note=note,
        ),
        Figure("recall_disk_mb", "recall soak: bytes on disk at the end", soak["on_disk_mb"], "MB"),
        Figure("recall_rss_growth_mb", "recall soak: peak RSS growth of the writing process", soak["rss_growth_mb"], "MB", 64.0),
        Figure(
            "recall_offer_ms", f"recall soak: one request's offer of {RECALL_IMAGES} images on the caller's thread, median", soak["offer_ms"], "ms"
        ),
    ]


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench",
        description="Benchmark trimflow: the engine in process and a real mitmdump with the addon against a plain one, "
        "all on 127.0.0.1, also over a shaped link to the upstream (20, 50 and 100 Mbit/s, 30 ms RTT). "
        "Prints a table of figures, targets and pass/miss; every target is a ratio from the same run.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer repetitions, and the shaped link at 100 Mbit/s for 12 turns only (about 2 minutes)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of the table")
    parser.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        help="run only this section (repeat for several): engine (in process, scaling), text (coding agents' text bodies "
        "in process, and a 60-turn text session through the proxy), proxy (latency, throughput, streaming, memory), "
        "learned (the learned-limits and conversations files), store (the shared store up, killed and hung), "
        "recall (the recall store's bounds under a soak), "
        "shaped (the screenshot session over a shaped link), bytes (a Retina session to Claude with native_size on and off), "
        "send_once (a computer-use session to Claude with send_once on and off), "
        "shrink, cache; default: all",
    )
    parser.add_argument("--serve-upstream", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--recall-soak", metavar="FOLDER", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_upstream:
        serve_upstream()
        return 0
    if args.recall_soak:
        print(json.dumps(recall_soak(args.recall_soak)))
        return 0

    began = time.monotonic()

    def say(message: str) -> None:
        print(f"bench: {time.monotonic() - began:5.0f}s {message}", file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    started = time.monotonic()
    try:
        figures, info = run(QUICK if args.quick else FULL, say, tuple(args.only or SECTIONS))
    except KeyboardInterrupt:
        say("interrupted; processes stopped")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    seconds = round(time.monotonic() - started, 1)
    if args.json:
        out = {
            "mode": "quick" if args.quick else "full",
            "sections": list(args.only or SECTIONS),
            "seconds": seconds,
            "machine": info,
            "figures": {f.name: f.to_dict() for f in figures},
        }
        print(json.dumps(out, indent=2))
    else:
        print(render_table(figures))
        only = f" of {', '.join(args.only)} only" if args.only else ""
        print(f"\n{'quick' if args.quick else 'full'} run{only}, {seconds:.0f} s; machine: {json.dumps(info)}")
    return 0  # a missed target is a finding in the table, not a failure of the run


if __name__ == "__main__":
    sys.exit(main())
