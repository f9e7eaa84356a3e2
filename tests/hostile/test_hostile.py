"""Hostile request bodies (cases.py) through the engine and through the addons' hooks (mitmproxy's
taddons/tflow); runtime faults (rules file gone or broken, metrics unwritable, catastrophic globs).

Every hostile body is either pruned correctly or forwarded byte-identical with one log line saying why,
no log line quotes it, and the next request is served.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from mitmproxy import http
from mitmproxy.test import taddons, tflow, tutils

from trimflow import prune_request
from trimflow._rules_file import RulesFile, parse_rules
from trimflow.testing import PATHS, image

from ..bombs import MiB, gzip_bomb
from ..helpers import TrimflowAddons, answer_sent, requested
from .cases import (
    CHAT,
    HOST,
    HOSTILE,
    MAX_IMAGES,
    PRUNED,
    RULES,
    RULES_TEXT,
    SHOT,
    UNTOUCHED,
    Hostile,
    check_pruned,
    expected_body,
    image_count,
    marker,
    params,
    session_json,
)

# --- the engine ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", params([c for c in HOSTILE if c.engine]))
def test_engine_prunes_or_returns_the_same_bytes_with_a_reason(case: Hostile) -> None:
    body = case.wire()
    outcome = prune_request(case.url, case.request_headers(body), body, RULES)
    record = outcome.record
    assert record is not None  # an LLM path: always a record
    if case.outcome == PRUNED:
        assert record.reason is None and record.pruned > 0
        check_pruned(case, body, outcome.body)
        again = prune_request(case.url, {}, outcome.body, RULES)
        assert again.body == outcome.body  # idempotent
    else:
        assert outcome.body is body  # the very bytes: nothing re-serialised
        assert record.pruned == 0 or record.mode == "observe"
        if case.outcome == UNTOUCHED:
            assert record.reason and case.why in record.reason
        else:
            assert record.reason is None
    assert record.reason is None or "internal error" not in record.reason
    assert marker(case.id) not in (record.reason or "") and marker(case.id) not in record.log_line()


# --- the addon ----------------------------------------------------------------------------------------------


def make_flow(path: str, wire: bytes, headers: dict[str, str]) -> http.HTTPFlow:
    request = tutils.treq(
        host=HOST,
        port=443,
        scheme=b"https",
        method=b"POST",
        authority=b"",
        path=path.encode(),
        headers=http.Headers([(k.encode(), v.encode()) for k, v in headers.items()]),
        content=b"",
    )
    request.raw_content = wire  # as it came off the wire, content-encoding and all
    request.headers["content-length"] = str(len(wire))
    return tflow.tflow(req=request)


NORMAL = "normal-request-text-5b1"


def normal_flow(mark: str = NORMAL, shot: bytes = SHOT) -> http.HTTPFlow:
    return make_flow(PATHS[CHAT], session_json(CHAT, mark, shot=shot), {"content-type": "application/json"})


@pytest.fixture
def addon(tmp_path):
    instance = TrimflowAddons()
    with taddons.context(instance) as tctx:
        rules = tmp_path / "rules.yaml"
        rules.write_text(RULES_TEXT)
        tctx.configure(instance, trimflow_rules=str(rules), trimflow_metrics=str(tmp_path / "metrics.jsonl"), trimflow_max_decoded_bytes="16MiB")
        instance.tctx = tctx
        instance.metrics_path = tmp_path / "metrics.jsonl"
        yield instance
        instance.done()  # as mitmproxy at exit: the files the addons opened closed


def trimflow_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "trimflow"]


async def answer(addon, flow: http.HTTPFlow) -> None:
    """The provider's answer, through the response hooks, and the addon's flush after it (FLUSH_DELAY)."""
    flow.response = tutils.tresp(content=b'{"usage":{"prompt_tokens":7}}', headers=http.Headers(content_type="application/json"))
    addon.responseheaders(flow)
    addon.response(flow)
    await answer_sent()


@pytest.mark.parametrize("case", params(HOSTILE))
async def test_addon_prunes_or_forwards_byte_identical_with_one_line_why(addon, caplog, case: Hostile) -> None:
    plain = case.plain()
    wire = case.wire(plain)
    flow = make_flow(case.path, wire, case.request_headers(wire))
    with caplog.at_level(logging.INFO, logger="trimflow"):
        await requested(addon, flow)
        await answer(addon, flow)
    lines = trimflow_lines(caplog)
    warnings = [r.getMessage() for r in lines if r.levelno >= logging.WARNING]
    if case.outcome == PRUNED:
        out = flow.request.get_content()
        assert out == expected_body(case, plain)
        check_pruned(case, plain, out)
        assert flow.request.headers.get("content-encoding") == case.coding
        assert int(flow.request.headers["content-length"]) == len(flow.request.raw_content)
        assert warnings == []
    else:
        assert flow.request.raw_content == wire
        assert flow.request.headers.get("content-encoding") == case.coding
        if case.outcome == UNTOUCHED:
            assert len(warnings) == 1 and "forwarded untouched" in warnings[0] and case.why in warnings[0], warnings
        else:
            assert warnings == []
    assert all("internal error" not in r.getMessage() for r in lines)
    logged = "\n".join(r.getMessage() for r in lines) + (flow.comment or "") + json.dumps(flow.metadata.get("trimflow"))
    assert marker(case.id) not in logged
    if "trimflow" in flow.metadata:  # one metrics line, with the answer's status and the reason if any
        (line,) = addon.metrics_path.read_bytes().splitlines()
        record = orjson.loads(line)
        assert record["status"] == 200
        assert record["reason"] is None if case.outcome != UNTOUCHED else case.why in record["reason"]
    # The next request is served as usual.
    after = normal_flow()
    await requested(addon, after)
    assert image_count(CHAT, after.request.get_content()) == MAX_IMAGES


async def test_a_gzip_bomb_of_gigabytes_is_never_inflated_by_the_addon(addon, caplog) -> None:
    """A 8 GiB bomb at the default limit, sent only once the addon has shown it bounds a small one: an
    unbounded decoder (mitmproxy's own) would inflate the 8 GiB in this process."""
    with caplog.at_level(logging.WARNING, logger="trimflow"):
        addon.tctx.configure(addon, trimflow_max_decoded_bytes="1MiB")
        small = gzip_bomb(32 * MiB)
        flow = make_flow(PATHS[CHAT], small, {"content-type": "application/json", "content-encoding": "gzip"})
        await requested(addon, flow)
        assert "decodes to more than 1.0MB" in caplog.text
        addon.tctx.configure(addon, trimflow_max_decoded_bytes=addon.tctx.options._options["trimflow_max_decoded_bytes"].default)
        bomb = gzip_bomb(8 * 1024 * MiB)
        flow = make_flow(PATHS[CHAT], bomb, {"content-type": "application/json", "content-encoding": "gzip"})
        await requested(addon, flow)
    assert flow.request.raw_content is bomb
    assert "decodes to more than 256MB" in caplog.text


async def test_a_compressed_answer_past_the_limit_is_not_inflated_for_its_usage(addon) -> None:
    """Valid JSON with its usage up front, then 64 MiB of spaces: bounded at 16MiB, the usage stays unknown."""
    flow = normal_flow()
    await requested(addon, flow)
    answer = gzip.compress(b'{"usage":{"prompt_tokens":5}}' + b" " * (64 * MiB), compresslevel=1)
    flow.response = tutils.tresp(content=b"", headers=http.Headers(content_type="application/json", content_encoding="gzip"))
    flow.response.raw_content = answer
    addon.responseheaders(flow)
    addon.response(flow)
    assert flow.response.raw_content is answer  # the client gets it as it came
    assert flow.metadata["trimflow"]["status"] == 200 and flow.metadata["trimflow"]["usage_input_tokens"] is None


# --- runtime faults -------------------------------------------------------------------------------------------


def _touch_later(path: Path, seconds: float) -> None:
    os.utime(path, (time.time() + seconds, time.time() + seconds))


async def test_rules_file_deleted_while_running_keeps_the_last_good_rules(addon, caplog, tmp_path) -> None:
    path = Path(addon.rules.path)
    addon.rules = RulesFile(path, check_interval=0)  # look at the file on every request
    with caplog.at_level(logging.INFO, logger="trimflow"):
        path.unlink()
        for _ in range(3):
            flow = normal_flow()
            await requested(addon, flow)
            assert image_count(CHAT, flow.request.get_content()) == MAX_IMAGES
        errors = [r.getMessage() for r in trimflow_lines(caplog) if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and str(path) in errors[0] and "keeping the last good rules" in errors[0]
        path.write_text(RULES_TEXT.replace("max_images: 2", "max_images: 3"))  # back, edited
        # Another conversation, with other images: in this one (and for these images), what was cut stays cut.
        flow = normal_flow(f"{NORMAL}-new", image(40, 30, "PNG"))
        await requested(addon, flow)
    assert image_count(CHAT, flow.request.get_content()) == 3
    assert f"reloaded rules from {path}" in caplog.text


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("invalid-yaml", lambda p: p.write_text("defaults: [unclosed\n")),
        ("invalid-value", lambda p: p.write_text("defaults:\n  max_images: many\n")),
        ("emptied", lambda p: p.write_text("")),
        ("binary", lambda p: p.write_bytes(b"\xff\xfe\x00garbage")),
        ("replaced-by-a-directory", lambda p: (p.unlink(), p.mkdir())),
    ],
)
async def test_rules_file_made_invalid_while_running_keeps_the_last_good_rules(addon, caplog, name: str, damage) -> None:
    path = Path(addon.rules.path)
    addon.rules = RulesFile(path, check_interval=0)
    with caplog.at_level(logging.INFO, logger="trimflow"):
        damage(path)
        if path.is_file():
            _touch_later(path, 5)
        for _ in range(3):
            flow = normal_flow()
            await requested(addon, flow)
            assert image_count(CHAT, flow.request.get_content()) == MAX_IMAGES
    errors = [r.getMessage() for r in trimflow_lines(caplog) if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and str(path) in errors[0], errors
    assert NORMAL not in caplog.text


@pytest.mark.parametrize(
    "where",
    [
        pytest.param(lambda tmp: tmp / "a-file" / "metrics.jsonl", id="parent-is-a-regular-file"),
        pytest.param(lambda tmp: Path("/dev/full"), id="disk-full-dev-full"),
        pytest.param(lambda tmp: tmp, id="path-is-a-directory"),
    ],
)
async def test_unwritable_metrics_never_stop_forwarding_and_say_so_once(addon, caplog, tmp_path, where) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    path = where(tmp_path)
    with caplog.at_level(logging.INFO, logger="trimflow"):
        addon.tctx.configure(addon, trimflow_metrics=str(path))
        for _ in range(3):
            flow = normal_flow()
            await requested(addon, flow)
            await answer(addon, flow)
            assert image_count(CHAT, flow.request.get_content()) == MAX_IMAGES
            assert flow.metadata["trimflow"]["status"] == 200
    errors = [r.getMessage() for r in trimflow_lines(caplog) if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "cannot write metrics" in errors[0] and "forwarding continues" in errors[0], errors
    assert len([r for r in trimflow_lines(caplog) if "images 5->2" in r.getMessage()]) == 3  # the log line per flow stays


CATASTROPHIC = "*a*a*a*a*a*a*a*a*b"  # backtracks exponentially with a naive glob-to-regex translation


def _returns(fn: Callable[[], object], seconds: float = 60.0) -> object:
    """fn's result; fails (rather than hanging the suite) if it has not returned within `seconds`."""
    result: list[object] = []
    worker = threading.Thread(target=lambda: result.append(fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert result, f"did not return within {seconds}s: catastrophic backtracking"
    return result[0]


def test_catastrophic_globs_on_10000_char_inputs_return() -> None:
    rules = parse_rules(
        f'defaults:\n  max_images: 2\nrules:\n  - name: evil\n    match:\n      host: "{CATASTROPHIC}"\n      path: "{CATASTROPHIC}"\n'
        f'      model: "{CATASTROPHIC}"\n    max_images: 1\nendpoints:\n  - {{path: "{CATASTROPHIC}", format: openai-chat}}\n',
        "evil.yaml",
    )
    long = "a" * 10_000
    assert _returns(lambda: rules.limits_for(long, "/" + long, long)).rule == "defaults"
    assert _returns(lambda: rules.format_for(long, "/" + long)) is None
    assert _returns(lambda: rules.limits_for(long + "b", "/" + long + "b", long + "b")).rule == "evil"  # and it still matches


async def test_a_request_with_a_10000_char_path_and_model_under_catastrophic_rules_is_served(addon, tmp_path) -> None:
    path = Path(addon.rules.path)
    evil = f'rules:\n  - name: evil\n    match:\n      path: "{CATASTROPHIC}"\n      model: "{CATASTROPHIC}"\n    max_images: 1\n'
    path.write_text(RULES_TEXT + evil)
    addon.tctx.configure(addon, trimflow_rules=str(path))
    body = session_json(CHAT, "long").replace(b'"model":"gpt-4o"', b'"model":"' + b"a" * 10_000 + b'"')
    flow = make_flow("/" + "a" * 10_000 + "/chat/completions", body, {"content-type": "application/json"})
    await requested(addon, flow)
    assert image_count(CHAT, flow.request.get_content()) == MAX_IMAGES
