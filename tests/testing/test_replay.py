"""trimflow.testing's replay: the request path of each format, the whole-history bodies of a screenshot session,
one row per turn from a real local FakeProvider, the message read out of an error answer, and the CLI's rows and
exit status. The run through a real mitmdump is in tests/e2e/test_replay.py."""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import orjson
import pytest

from trimflow.formats import FORMATS
from trimflow.testing import PATHS, FakeProvider, Received, Session, count_images, replay
from trimflow.testing._replay import answer_text, main, request_path

# What a web server in front of a provider answers to a body it will not take: an HTML page.
TOO_LARGE_PAGE = b"<html><head><title>413 Request Entity Too Large</title></head><body><center>nginx</center></body></html>"


def refuse_over_two_images(request: Received) -> tuple[int, str, bytes] | None:
    """A FakeProvider check hook: the third image and on get the HTML page, as a size limit would."""
    return (413, "text/html", TOO_LARGE_PAGE) if count_images(request.body) > 2 else None


def shots_in(wire_format: str, body: bytes) -> list[str]:
    """The base64 of each inline image in `body`, in document order, as trimflow's format module reads them."""
    return [m.data[m.data_offset :] for m in FORMATS[wire_format].find_media(orjson.loads(body)) if m.kind == "image"]


@contextmanager
def closed_port() -> Iterator[int]:
    """A port where a connection is refused: bound, never listening, and held for the block (a port bound and let go
    could be taken by another process meanwhile)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


# --- request_path ---------------------------------------------------------------------------------------------


def test_request_path_puts_the_model_where_the_format_keeps_it() -> None:
    assert request_path("gemini", "gemini-2.5-pro") == "/v1beta/models/gemini-2.5-pro:generateContent"
    assert request_path("bedrock-converse", "us.anthropic.claude-v2:1") == "/model/us.anthropic.claude-v2%3A1/converse"
    assert request_path("openai-chat", "gpt-4o") == PATHS["openai-chat"]  # the model goes in the body
    assert request_path("gemini") == PATHS["gemini"]


@pytest.mark.parametrize(("wire_format", "model"), [("gemini", "gemini-2.5-pro"), ("bedrock-converse", "us.anthropic.claude-v2:1")])
def test_the_model_in_the_path_is_the_one_trimflow_reads_back(wire_format: str, model: str) -> None:
    path = request_path(wire_format, model)
    assert FORMATS[wire_format].model({}, path) == model


# --- Session --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("wire_format", sorted(PATHS))
def test_each_turn_resends_the_history_with_one_new_real_image(wire_format: str) -> None:
    session = Session(wire_format, 3)
    bodies = [session.body(turn) for turn in (1, 2, 3)]
    shots = [session.shot(turn).decode() for turn in (1, 2, 3)]
    assert len(set(shots)) == 3  # a distinct image every turn
    for turn, body in enumerate(bodies, start=1):
        assert shots_in(wire_format, body) == shots[:turn]
    for shot in shots:
        assert base64.b64decode(shot)[8:12] == b"WEBP"  # a RIFF WebP file, the default screenshot encoding
    assert Session(wire_format, 3).body(2) == bodies[1]  # the same session every time


def test_screenshots_are_about_the_size_asked() -> None:
    session = Session("openai-chat", 40, image_format="PNG")
    raw = base64.b64decode(session.shot(1))
    assert raw.startswith(b"\x89PNG")
    assert 0.85 * 40 * 1024 <= len(raw) <= 1.15 * 40 * 1024


@pytest.mark.parametrize("wire_format", sorted(PATHS))
def test_system_kb_pads_the_system_prompt_of_every_format(wire_format: str) -> None:
    plain, padded = Session(wire_format, 2), Session(wire_format, 2, system_kb=3)
    grown = len(padded.body(2)) - len(plain.body(2))
    assert 3 * 1024 - 100 <= grown <= 3 * 1024 + 100  # JSON escaping aside, the prompt is 3 KB longer
    assert shots_in(wire_format, padded.body(2)) == shots_in(wire_format, plain.body(2))


# --- replay against a real FakeProvider -----------------------------------------------------------------------


@pytest.mark.parametrize("wire_format", sorted(PATHS))
def test_every_turn_is_answered_and_the_upstream_got_every_byte(wire_format: str) -> None:
    session = Session(wire_format, 2, model="m-1")
    with FakeProvider() as upstream:
        rows = list(replay(upstream.url, session, 3))
        received = list(upstream.received)
    assert [(r.turn, r.images, r.status, r.error) for r in rows] == [(1, 1, 200, None), (2, 2, 200, None), (3, 3, 200, None)]
    assert all(r.ok for r in rows)
    assert [r.sent_bytes for r in rows] == [len(session.body(t)) for t in (1, 2, 3)] == [r.upstream_bytes for r in rows]
    assert [(q.method, q.path) for q in received] == [("POST", request_path(wire_format, "m-1"))] * 3
    assert [q.body for q in received] == [session.body(t) for t in (1, 2, 3)]


def test_a_failing_turn_does_not_stop_the_run_and_its_row_says_why() -> None:
    with FakeProvider(check=refuse_over_two_images) as upstream:
        rows = list(replay(upstream.url, Session("anthropic", 2), 4))
    assert [(r.status, r.ok) for r in rows] == [(200, True), (200, True), (413, False), (413, False)]
    assert rows[2].error == "413 Request Entity Too Large"  # the HTML page's title, not the page
    assert rows[2].upstream_bytes == rows[2].sent_bytes  # the fake still says what it received


def test_a_base_url_path_and_an_explicit_path_make_the_request_target() -> None:
    with FakeProvider() as upstream:
        rows = list(replay(upstream.url + "/prefix/", Session("openai-chat", 2), 1, path="/v2/no-such-endpoint"))
        assert [q.path for q in upstream.received] == ["/prefix/v2/no-such-endpoint"]
    # The fake has no such route: its JSON error's message is the row's error.
    assert (rows[0].status, rows[0].error) == (404, "fake-provider: no route for POST /prefix/v2/no-such-endpoint")


def test_no_answer_is_a_row_too() -> None:
    with closed_port() as port:
        rows = list(replay(f"http://127.0.0.1:{port}", Session("openai-chat", 2), 2, timeout=5))
    assert [(r.turn, r.status, r.upstream_bytes, r.ok) for r in rows] == [(1, None, None, False), (2, None, None, False)]
    assert rows[0].error is not None and rows[0].error.startswith("no answer: ConnectionRefusedError")


@pytest.mark.parametrize("base_url", ["ftp://127.0.0.1:21", "127.0.0.1:8700", "http://"])
def test_a_base_url_that_is_not_http_is_refused(base_url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        next(replay(base_url, Session("openai-chat", 2), 1))


# --- answer_text ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "body", "text"),
    [
        ("application/json", b'{"type":"error","error":{"type":"invalid_request_error","message":"too many images"}}', "too many images"),
        ("application/json", b'{"message":"Input is too long for requested model."}', "Input is too long for requested model."),
        (
            "application/json; charset=utf-8",
            b'[{"error":{"code":400,"message":"Request payload size exceeds the limit"}}]',
            "Request payload size exceeds the limit",
        ),
        ("application/json", b'{"detail":{"message":"nested under detail"}}', "nested under detail"),
        ("application/json", b'{"error":"no message field"}\nsecond line', '{"error":"no message field"}'),
        ("application/json", b"not json\nat all", "not json"),
        ("text/html", b"<HTML><TITLE>\n 502 Bad Gateway </TITLE></HTML>", "502 Bad Gateway"),
        ("text/html", b"<p>no title</p>", "<p>no title</p>"),
        (
            "text/plain",
            b"\n  Failed to buffer the request body: length limit exceeded\nmore",
            "Failed to buffer the request body: length limit exceeded",
        ),
        ("", b"", ""),
    ],
)
def test_answer_text_is_the_message_of_an_error_answer(content_type: str, body: bytes, text: str) -> None:
    assert answer_text(content_type, body) == text


def test_answer_text_is_cut_to_the_limit() -> None:
    text = answer_text("text/plain", b"x" * 500, limit=20)
    assert text == "x" * 17 + "..."
    assert answer_text("text/plain", b"x" * 20, limit=20) == "x" * 20


# --- the CLI --------------------------------------------------------------------------------------------------


def test_the_cli_prints_json_rows_and_exits_1_when_a_turn_failed(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeProvider(check=refuse_over_two_images) as upstream:
        status = main(["--target", upstream.url, "--turns", "3", "--image-kb", "2", "--format", "gemini", "--json"])
    out, err = capsys.readouterr()
    assert status == 1
    rows = orjson.loads(out)
    assert [(r["turn"], r["images"], r["status"], r["error"]) for r in rows] == [
        (1, 1, 200, None),
        (2, 2, 200, None),
        (3, 3, 413, "413 Request Entity Too Large"),
    ]
    assert "first failure at turn 3 (413); 1 of 3 turns failed" in err


def test_the_cli_prints_a_table_and_exits_0_when_every_turn_succeeded(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeProvider() as upstream:
        status = main(["--proxy", upstream.url, "--turns", "2", "--image-kb", "2", "--format", "ollama"])
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert status == 0
    assert lines[0].split() == ["turn", "sent_bytes", "images", "status", "upstream_bytes", "answer"]
    cells = [line.split() for line in lines[1:]]
    assert [(c[0], c[2], c[3], c[5]) for c in cells] == [("1", "1", "200", "ok"), ("2", "2", "200", "ok")]
    assert all(c[1] == c[4] for c in cells)  # sent and received bytes, with thousands separators
    assert "no failure in 2 turns" in err and "via proxy" in err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--turns", "0", "--image-kb", "2"], "--turns must be at least 1"),
        (["--turns", "1", "--image-kb", "0"], "--image-kb must be at least 1"),
        (["--turns", "1", "--image-kb", "2", "--system-kb", "-1"], "--system-kb must not be negative"),
    ],
)
def test_the_cli_refuses_bad_numbers(args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--target", "http://127.0.0.1:9", "--format", "openai-chat", *args])
    assert caught.value.code == 2
    assert says in capsys.readouterr().err


def test_the_cli_exits_2_on_a_base_url_that_is_not_http(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--target", "ftp://127.0.0.1", "--turns", "1", "--image-kb", "2", "--format", "openai-chat", "--json"]) == 2
    assert "replay: not an http(s) base URL: 'ftp://127.0.0.1'" in capsys.readouterr().err
