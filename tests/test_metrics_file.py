"""trimflow._metrics_file.MetricsFile: one JSON line per record, appended across reopenings; a write error is said
once and never raised; no line ever holds a prompt, a key or base64."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import orjson
import pytest

from trimflow import prune_request
from trimflow._metrics_file import MetricsFile
from trimflow.testing import PATHS, b64, image, session_body

from .helpers import encode, rules_with

SHOT = image(40, 30, "PNG", seed=6)
KEY = "sk-test-SECRET-metrics-2f7a"
PROMPT = "What should I click next?"


def real_record(turns: int, fmt: str = "openai-chat"):
    """The engine's record of a real session body sent with a key in its headers and its URL."""
    url = f"https://api.example.test{PATHS[fmt]}?key={KEY}"
    body = encode(session_body(fmt, turns, SHOT, "image/png"))
    record = prune_request(url, {"authorization": f"Bearer {KEY}", "x-api-key": KEY}, body, rules_with(max_images=2)).record
    assert record is not None
    record.turn, record.status, record.usage_input_tokens = turns, 200, 100 * turns
    return record


def lines(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return [orjson.loads(line) for line in data.split(b"\n")[:-1]]


def trimflow_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "trimflow" and r.levelno >= logging.ERROR]


def test_one_json_line_per_record_in_order(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    metrics = MetricsFile(str(path))
    records = [real_record(t) for t in (1, 2, 3)]
    for written, record in enumerate(records, 1):
        metrics.write(record)
        assert len(lines(path)) == written  # flushed at once: a reader sees it now
    metrics.close()
    assert lines(path) == [r.to_dict() for r in records]
    assert [line["images_after"] for line in lines(path)] == [1, 2, 2]


def test_an_error_is_one_more_field_of_the_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    metrics = MetricsFile(str(path))
    record = real_record(2)
    metrics.write(record, error="upstream closed the connection")
    metrics.close()
    [line] = lines(path)
    assert line == {**record.to_dict(), "error": "upstream closed the connection"}


def test_a_reopened_file_is_appended_to_never_truncated(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    first = MetricsFile(str(path))
    first.write(real_record(1))
    first.close()
    first.write(real_record(2))  # written after close: opened again
    first.close()
    second = MetricsFile(str(path))  # as after a restart of the proxy
    second.write(real_record(3))
    second.close()
    assert [line["turn"] for line in lines(path)] == [1, 2, 3]


def test_missing_directories_are_made(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "trimflow" / "metrics.jsonl"
    metrics = MetricsFile(str(path))
    metrics.write(real_record(1))
    metrics.close()
    assert len(lines(path)) == 1


def test_no_line_holds_a_prompt_a_key_or_base64(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    metrics = MetricsFile(str(path))
    for turns in (1, 4):
        metrics.write(real_record(turns))
        metrics.write(real_record(turns, "anthropic"), error="client went away")
    metrics.close()
    text = path.read_text()
    assert len(text.splitlines()) == 4
    assert KEY not in text and "key=" not in text and "Bearer" not in text
    assert PROMPT not in text and "You are a desktop assistant." not in text
    assert b64(SHOT)[:40] not in text and not re.search(r"[A-Za-z0-9+/]{100,}", text)


def test_a_write_error_is_logged_once_and_a_later_write_recovers(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "logs"
    blocker.write_text("a file where the directory should be")
    path = blocker / "metrics.jsonl"
    metrics = MetricsFile(str(path))
    with caplog.at_level(logging.INFO, logger="trimflow"):
        for turns in (1, 2, 3):
            metrics.write(real_record(turns))  # never raises
        errors = trimflow_errors(caplog)
        assert len(errors) == 1 and str(path) in errors[0] and "forwarding continues" in errors[0], errors
        blocker.unlink()
        metrics.write(real_record(4))
    metrics.close()
    assert [line["turn"] for line in lines(path)] == [4]
    assert f"metrics file {path} is writable again" in caplog.text
    assert len(trimflow_errors(caplog)) == 1


def test_a_full_disk_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    metrics = MetricsFile("/dev/full")
    with caplog.at_level(logging.INFO, logger="trimflow"):
        for turns in (1, 2, 3):
            metrics.write(real_record(turns))
    metrics.close()
    errors = trimflow_errors(caplog)
    assert len(errors) == 1 and "cannot write metrics to /dev/full" in errors[0], errors
    assert KEY not in caplog.text and PROMPT not in caplog.text
