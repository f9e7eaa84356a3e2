"""Conversations through a real mitmdump with the addon: two identical runs of one session back to back, a
session without a system prompt, Gemini CLI's token counts before each turn, and Codex's Responses WebSocket
(a warm-up, then turns chained by previous_response_id). The metrics JSONL, the `-w` recording and a HAR
export of it (by mitmdump itself) are audited, and each must number the conversations alike.
"""

from __future__ import annotations

import http.client
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.sync.client import connect  # installed with google-genai (the test extra)
from websockets.sync.server import ServerConnection, serve

from trimflow.audit import main
from trimflow.testing import PATHS, FakeProvider, image, session_body

from ..mitmdump import Mitmdump, mitmdump_binary

pytestmark = pytest.mark.e2e

SHOT = image(64, 48, "PNG", seed=21)
RUN_TURNS = 4
GEMINI_TURNS = 3
GEMINI_COUNT_PATH = PATHS["gemini"].replace(":generateContent", ":countTokens")


def post(conn: http.client.HTTPConnection, path: str, body: dict[str, Any]) -> int:
    conn.request("POST", path, orjson.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    return response.status


def no_system(wire_format: str, turns: int) -> dict[str, Any]:
    body = session_body(wire_format, turns, SHOT, "image/png")
    body["messages"] = [m for m in body["messages"] if m["role"] != "system"]
    return body


def drive_http(port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for _ in range(2):  # the same CI test, run twice
            for turn in range(1, RUN_TURNS + 1):
                assert post(conn, PATHS["anthropic"], session_body("anthropic", turn, SHOT, "image/png")) == 200
        for turn in range(1, RUN_TURNS + 1):
            assert post(conn, PATHS["openai-chat"], no_system("openai-chat", turn)) == 200
        for turn in range(1, GEMINI_TURNS + 1):  # Gemini CLI: countTokens with the next contents, then the turn
            body = session_body("gemini", turn, SHOT, "image/png")
            assert post(conn, GEMINI_COUNT_PATH, {"contents": body["contents"]}) == 200
            assert post(conn, PATHS["gemini"], body) == 200
    finally:
        conn.close()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Iterator[dict[str, Path]]:
    work = tmp_path_factory.mktemp("conversations")
    paths = {"mitm": work / "through.mitm", "jsonl": work / "metrics.jsonl", "har": work / "through.har"}
    with FakeProvider() as provider:
        proxy = Mitmdump(
            work / "http",
            "--mode",
            f"reverse:{provider.url}",
            "-w",
            str(paths["mitm"]),
            options={"trimflow_metrics": str(paths["jsonl"]), "trimflow_rules": str(write_rules(work / "rules.yaml"))},
        )
        with proxy:
            drive_http(proxy.port)
    har = subprocess.run(
        [mitmdump_binary(), "-n", "-q", "-r", str(paths["mitm"]), "--set", f"hardump={paths['har']}", "--set", f"confdir={work / 'confdir'}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert har.returncode == 0 and paths["har"].exists(), har.stdout + har.stderr
    yield paths


def write_rules(path: Path) -> Path:
    path.write_text("defaults:\n  max_images: 2\n  keep_recent: 1\n")
    return path


def audit_records(capsys, path: Path) -> list[dict[str, Any]]:
    code = main([str(path), "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return orjson.loads(out)["records"]


def grouped(records: list[dict[str, Any]]) -> list[tuple[str, str, list[tuple[str, int | None]]]]:
    """Each conversation as (format, path, [(kind, turn), ...]) in order of its first record: comparable across
    sources, whose ids differ (each proxy process salts its own; the audit of a HAR numbers afresh)."""
    order: dict[str | None, list[dict[str, Any]]] = {}
    for record in sorted(records, key=lambda r: r["ts"]):
        order.setdefault(record["conversation"], []).append(record)
    return [(group[0]["format"], group[-1]["path"], [(r["kind"], r["turn"]) for r in group]) for group in order.values()]


EXPECTED = [
    ("anthropic", PATHS["anthropic"], [("turn", t) for t in range(1, RUN_TURNS + 1)]),
    ("anthropic", PATHS["anthropic"], [("turn", t) for t in range(1, RUN_TURNS + 1)]),  # the rerun: a conversation of its own
    ("openai-chat", PATHS["openai-chat"], [("turn", t) for t in range(1, RUN_TURNS + 1)]),  # no system message
    ("gemini", GEMINI_COUNT_PATH, [("count_tokens", None)]),  # the first count: no conversation yet
    ("gemini", PATHS["gemini"], [("turn", 1), ("count_tokens", None), ("turn", 2), ("count_tokens", None), ("turn", 3)]),
]


def test_the_proxy_numbers_reruns_apart_and_counts_as_no_turns(recorded) -> None:
    records = [orjson.loads(line) for line in recorded["jsonl"].read_bytes().splitlines()]
    assert grouped(records) == EXPECTED
    counts = [r for r in records if r["kind"] == "count_tokens"]
    turns = [r for r in records if r["format"] == "gemini" and r["kind"] == "turn"]
    # Pruned as the turn they measure: the count after turn 2 carries turn 3's contents, as turn 3 sends them.
    assert [r["images_after"] for r in counts] == [r["images_after"] for r in turns] == [1, 2, 2]
    assert all(r["status"] == 200 for r in records)


@pytest.mark.parametrize("source", ["mitm", "har"])
def test_the_audit_of_the_recording_numbers_as_the_proxy_did(recorded, capsys, source) -> None:
    assert grouped(audit_records(capsys, recorded[source])) == EXPECTED


def test_the_audit_of_the_metrics_numbers_as_the_proxy_did(recorded, capsys) -> None:
    from_jsonl, from_dump = audit_records(capsys, recorded["jsonl"]), audit_records(capsys, recorded["mitm"])
    keys = ("conversation", "turn", "kind", "segment", "images_before", "images_after")
    assert sorted((tuple(r[k] for k in keys) for r in from_jsonl), key=repr) == sorted((tuple(r[k] for k in keys) for r in from_dump), key=repr)


# --- Codex's Responses WebSocket -------------------------------------------------------------------------------


class ResponsesSocket:
    """A Responses WebSocket upstream: each response.create gets response.created, a text delta and response.completed,
    with usage.input_tokens = 100 + the message's length / 1000 (a warm-up, generate: false, 7)."""

    def __init__(self) -> None:
        self.usage: list[int] = []
        self._server = serve(self._handle, "127.0.0.1", 0)
        self.port = self._server.socket.getsockname()[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> ResponsesSocket:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._thread.join(10)

    def _handle(self, ws: ServerConnection) -> None:
        for n, message in enumerate(ws, 1):
            request = orjson.loads(message)
            rid = f"resp_{n}"
            tokens = 7 if request.get("generate") is False else 100 + len(message) // 1000
            self.usage.append(tokens)
            ws.send(orjson.dumps({"type": "response.created", "response": {"id": rid, "status": "in_progress"}}).decode())
            if request.get("generate") is not False:
                ws.send(orjson.dumps({"type": "response.output_text.delta", "delta": "Click Save."}).decode())
            usage = {"input_tokens": tokens, "output_tokens": 3}
            ws.send(orjson.dumps({"type": "response.completed", "response": {"id": rid, "status": "completed", "usage": usage}}).decode())


def test_a_codex_websocket_session_records_its_answers_and_no_warmup_turn(tmp_path, capsys) -> None:
    metrics, dump = tmp_path / "ws.jsonl", tmp_path / "ws.mitm"
    with ResponsesSocket() as upstream:
        proxy = Mitmdump(
            tmp_path / "ws",
            "--mode",
            f"reverse:http://127.0.0.1:{upstream.port}",
            "-w",
            str(dump),
            options={"trimflow_metrics": str(metrics), "trimflow_rules": str(write_rules(tmp_path / "rules.yaml"))},
        )
        with proxy, connect(f"ws://127.0.0.1:{proxy.port}/backend-api/codex/responses", open_timeout=10) as ws:
            previous = None
            messages = [{"model": "gpt-5", "instructions": "You are Codex.", "input": [], "generate": False}]
            for turn in range(1, 4):  # each turn sends its new items only, chained to the answer before it
                items = session_body("openai-responses", turn, SHOT, "image/png")["input"]
                messages.append({"model": "gpt-5", "input": items if turn == 1 else items[-2:]})
            for message in messages:
                ws.send(orjson.dumps({"type": "response.create", **message, "previous_response_id": previous}).decode())
                while (event := orjson.loads(ws.recv(timeout=10)))["type"] != "response.completed":
                    pass
                previous = event["response"]["id"]
    records = [orjson.loads(line) for line in metrics.read_bytes().splitlines()]
    assert [(r["kind"], r["turn"], r["status"]) for r in records] == [("warmup", None, 200)] + [("turn", t, 200) for t in (1, 2, 3)]
    assert [r["usage_input_tokens"] for r in records] == upstream.usage
    assert len({r["conversation"] for r in records}) == 1
    assert [r["images_before"] for r in records] == [0, 1, 1, 1]  # new items only: the history stays at the provider
    audited = audit_records(capsys, dump)
    assert [(r["kind"], r["turn"], r["status"], r["usage_input_tokens"]) for r in audited] == [
        (r["kind"], r["turn"], r["status"], r["usage_input_tokens"]) for r in records
    ]
    assert len({r["conversation"] for r in audited}) == 1
