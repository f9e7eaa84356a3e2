"""The mitmproxy addon's hooks and options, with mitmproxy's own taddons/tflow helpers."""

from __future__ import annotations

import asyncio
import gzip
import threading
import logging
import os
import time
from pathlib import Path

import orjson
import pytest
from mitmproxy import exceptions, http
from mitmproxy.test import taddons, tflow, tutils
from mitmproxy.websocket import WebSocketMessage
from wsproto.frame_protocol import Opcode

from trimflow.testing import PATHS, image, session_body

from .helpers import ROOT, answer_sent, mitm, requested

SHOT = image(120, 80, "PNG", seed=5)


def write_rules(path: Path, max_images: int, extra: str = "") -> Path:
    path.write_text(f"defaults:\n  max_images: {max_images}\n  max_body_bytes: 16MiB\n  keep_recent: 1\n{extra}")
    return path


def llm_flow(wire_format: str = "openai-chat", turns: int = 5, *, host: str = "api.openai.com", path: str | None = None,
             headers: dict | None = None, body: bytes | None = None) -> http.HTTPFlow:
    content = body if body is not None else orjson.dumps(session_body(wire_format, turns, SHOT, "image/png"))
    request = tutils.treq(host=host, port=443, scheme=b"https", method=b"POST", authority=b"",
                          path=(path or PATHS[wire_format]).encode(), content=content,
                          headers=http.Headers(content_type="application/json", **(headers or {})))
    return tflow.tflow(req=request)


def images_in(flow: http.HTTPFlow) -> int:
    return flow.request.get_content().count(b"base64,") or flow.request.get_content().count(b'"data":"')


@pytest.fixture
def addon(tmp_path):
    instance = mitm.Trimflow()
    with taddons.context(instance) as tctx:
        tctx.configure(instance, trimflow_rules=str(write_rules(tmp_path / "rules.yaml", 2)))
        instance.tctx = tctx
        yield instance


async def test_transparent_mode_matches_rules_on_the_host_the_client_addressed(tmp_path) -> None:
    # In transparent mode the request's host is the address connected to; the Host header names the API.
    rules = write_rules(tmp_path / "rules.yaml", 8, "rules:\n  - name: openai\n    match: {host: api.openai.com}\n    max_images: 2\n")
    instance = mitm.Trimflow()
    with taddons.context(instance) as tctx:
        tctx.configure(instance, trimflow_rules=str(rules))
        flow = llm_flow(host="203.0.113.5", headers={"host": "api.openai.com"})
        assert flow.request.host == "203.0.113.5" and flow.request.pretty_host == "api.openai.com"
        instance.requestheaders(flow)
        await requested(instance, flow)
        record = flow.metadata[mitm.META]
        assert (record["rule"], record["host"], record["images_before"], record["images_after"]) == ("openai", "api.openai.com", 5, 2)
        assert images_in(flow) == 2


def test_options_have_defaults_and_help() -> None:
    instance = mitm.Trimflow()
    with taddons.context(instance) as tctx:
        options = tctx.options
        assert Path(options.trimflow_rules) == ROOT / "rules" / "default.yaml"
        assert options.trimflow_metrics == "" and options.trimflow_mode == "enforce"
        assert options.trimflow_keep_memory is True
        for name in ("trimflow_rules", "trimflow_metrics", "trimflow_mode", "trimflow_keep_memory"):
            assert options._options[name].help
        with pytest.raises(exceptions.OptionsError):
            tctx.configure(instance, trimflow_mode="bogus")


def test_the_default_rules_apply_gemini_10_and_others_8() -> None:
    instance = mitm.Trimflow()
    with taddons.context(instance) as tctx:
        tctx.configure(instance)  # mitmdump configures a script with all options once it is loaded
        rules = instance.rules.current()
        assert rules.limits_for("generativelanguage.googleapis.com", PATHS["gemini"], "gemini-2.5-pro").max_images == 10
        assert rules.limits_for("api.anthropic.com", "/v1/messages", "claude-sonnet-4-5").max_images == 8


def test_a_bad_rules_file_is_refused_at_start_with_file_and_line(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("defaults:\n  max_images: 8\n  max_image: 3\n")
    instance = mitm.Trimflow()
    with taddons.context(instance) as tctx:
        with pytest.raises(exceptions.OptionsError, match=r"bad\.yaml:3: .*max_image"):
            tctx.configure(instance, trimflow_rules=str(bad))


async def test_enforce_prunes_and_annotates_the_flow(addon) -> None:
    flow = llm_flow(turns=5)
    before = len(flow.request.content)
    await requested(addon, flow)
    assert images_in(flow) == 2
    assert int(flow.request.headers["content-length"]) == len(flow.request.raw_content) < before
    record = flow.metadata["trimflow"]
    assert record["images_before"] == 5 and record["images_after"] == 2 and record["turn"] == 1
    assert "images 5->2" in flow.comment


async def test_observe_forwards_untouched_but_records_what_enforce_would_do(addon) -> None:
    addon.tctx.configure(addon, trimflow_mode="observe")
    flow = llm_flow(turns=5)
    original = flow.request.raw_content
    await requested(addon, flow)
    assert flow.request.raw_content == original
    assert flow.metadata["trimflow"]["images_after"] == 2 and flow.metadata["trimflow"]["mode"] == "observe"


async def test_non_llm_traffic_is_never_touched(addon) -> None:
    flow = llm_flow(path="/upload")
    flow.request.headers["content-type"] = "image/png"
    original = flow.request.raw_content
    await requested(addon, flow)
    assert flow.request.raw_content == original and "trimflow" not in flow.metadata


async def test_gzip_bodies_are_decoded_pruned_and_reencoded(addon) -> None:
    flow = llm_flow(turns=4)
    flow.request.headers["content-encoding"] = "gzip"
    flow.request.raw_content = gzip.compress(flow.request.raw_content)
    await requested(addon, flow)
    assert flow.request.headers["content-encoding"] == "gzip"
    assert orjson.loads(gzip.decompress(flow.request.raw_content))
    assert images_in(flow) == 2
    assert int(flow.request.headers["content-length"]) == len(flow.request.raw_content)


async def test_light_work_runs_on_the_loop_and_slow_work_in_a_worker(addon, tmp_path, monkeypatch) -> None:
    offloaded: list[str] = []
    to_thread = mitm.asyncio.to_thread

    async def counting(fn, *args, **kwargs):
        offloaded.append(getattr(fn, "__name__", "?"))
        return await to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(mitm.asyncio, "to_thread", counting)
    set_in: list[str] = []  # the thread each new body is set (and, for gzip, compressed) in
    content = http.Request.content

    def setter(request, value) -> None:
        set_in.append("loop" if threading.current_thread() is threading.main_thread() else "worker")
        content.fset(request, value)

    monkeypatch.setattr(http.Request, "content", property(content.fget, setter))
    plain = llm_flow(turns=4)
    await requested(addon, plain)
    assert images_in(plain) == 2 and offloaded == [] and set_in == ["loop"]  # skeleton pass and placeholders: inline
    compressed = llm_flow(turns=4)
    compressed.request.headers["content-encoding"] = "gzip"
    compressed.request.raw_content = gzip.compress(compressed.request.raw_content)
    await requested(addon, compressed)
    assert images_in(compressed) == 2 and offloaded == ["_prune_in_worker"]  # inflating and compressing: a worker
    assert set_in == ["loop", "worker"]
    addon.tctx.configure(addon, trimflow_rules=str(write_rules(tmp_path / "shrink.yaml", 8, "  max_image_side: 60\n")))
    shrink = llm_flow(turns=2)
    await requested(addon, shrink)
    assert shrink.metadata["trimflow"]["shrunk"] == 2 and offloaded == ["_prune_in_worker"] * 2  # Pillow: a worker


async def test_a_request_needing_nothing_goes_first_and_gets_its_record_on_the_next_loop_turn(addon) -> None:
    flow = llm_flow(turns=2)  # within the 2 images of the test rules
    original = flow.request.raw_content
    await addon.request(flow)
    assert flow.request.raw_content is original and "trimflow" not in flow.metadata  # mitmproxy forwards it now
    await asyncio.sleep(0)
    record = flow.metadata["trimflow"]
    assert record["images_before"] == record["images_after"] == 2 and record["pruned"] == 0 and record["turn"] == 1
    assert record["est_tokens_before"] > 0  # the sniffed sizes and token estimates are all there

    fast = llm_flow(turns=2)
    await addon.request(fast)
    fast.response = tutils.tresp(content=b"{}", headers=http.Headers(content_type="application/json"))
    addon.responseheaders(fast)  # an answer before the loop turned: the record is worked out then
    assert fast.metadata["trimflow"]["turn"] == 2
    await asyncio.sleep(0)
    assert fast.metadata["trimflow"]["turn"] == 2  # once


async def test_an_undecodable_body_is_forwarded_with_one_log_line(addon, caplog) -> None:
    flow = llm_flow(turns=4)
    flow.request.headers["content-encoding"] = "gzip"  # but the body is not gzip
    original = flow.request.raw_content
    with caplog.at_level(logging.WARNING, logger="trimflow"):
        await requested(addon, flow)
    assert flow.request.raw_content == original
    assert len([r for r in caplog.records if "forwarded untouched" in r.getMessage()]) == 1


async def test_an_internal_error_fails_open(addon, caplog, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("boom with secret body text")

    monkeypatch.setattr(mitm, "prune", broken)
    flow = llm_flow(turns=4)
    original = flow.request.raw_content
    with caplog.at_level(logging.WARNING, logger="trimflow"):
        await requested(addon, flow)
    assert flow.request.raw_content == original
    messages = [r.getMessage() for r in caplog.records]
    assert any("RuntimeError" in m for m in messages) and not any("secret" in m for m in messages)


async def test_keep_memory_is_set_once_at_start_unless_turned_off(monkeypatch, caplog) -> None:
    calls: list[str] = []
    monkeypatch.setattr(mitm, "keep_freed_memory", lambda: calls.append("set"))  # the real one: tests/test_malloc.py
    instance = mitm.Trimflow()
    with taddons.context(instance) as tctx:
        instance.configure(set(tctx.options.keys()))  # as mitmdump configures a script it has loaded
        assert calls == ["set"]
        tctx.configure(instance, trimflow_keep_memory=False)
        tctx.configure(instance, trimflow_keep_memory=True)
        assert calls == ["set"]  # process-wide and for good: set once
    off = mitm.Trimflow()
    with taddons.context(off) as tctx:
        tctx.options.trimflow_keep_memory = False  # --set trimflow_keep_memory=false
        off.configure(set(tctx.options.keys()))
        assert calls == ["set"]

    monkeypatch.setattr(mitm, "keep_freed_memory", lambda: "not glibc")
    elsewhere = mitm.Trimflow()
    with taddons.context(elsewhere) as tctx, caplog.at_level(logging.INFO, logger="trimflow"):
        elsewhere.configure(set(tctx.options.keys()))
    assert [r.getMessage() for r in caplog.records if "keep_memory" in r.getMessage()] == [
        "trimflow: trimflow_keep_memory has no effect here: not glibc"
    ]


def test_stream_large_bodies_gets_one_clear_warning(addon, caplog) -> None:
    # Declared by mitmproxy's proxyserver addon, which taddons does not load.
    addon.tctx.options.add_option("stream_large_bodies", str | None, None, "as mitmproxy declares it")
    with caplog.at_level(logging.WARNING, logger="trimflow"):
        addon.tctx.configure(addon, stream_large_bodies="1m")
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "stream_large_bodies=1m" in warning and "unpruned" in warning


def test_gemini_query_key_moves_to_its_header(addon) -> None:
    flow = llm_flow("gemini", host="generativelanguage.googleapis.com", path=PATHS["gemini"] + "?alt=sse&key=AIzaSECRET")
    addon.requestheaders(flow)
    assert flow.request.headers["x-goog-api-key"] == "AIzaSECRET"
    assert "key" not in flow.request.query and flow.request.query["alt"] == "sse"
    same = llm_flow("gemini", path=PATHS["gemini"] + "?key=K", headers={"x-goog-api-key": "K"})
    addon.requestheaders(same)
    assert "key" not in same.request.query and same.request.headers["x-goog-api-key"] == "K"
    different = llm_flow("gemini", path=PATHS["gemini"] + "?key=Q", headers={"x-goog-api-key": "H"})
    addon.requestheaders(different)  # which key the provider would use is unknown: both stay
    assert different.request.query["key"] == "Q" and different.request.headers["x-goog-api-key"] == "H"
    other = llm_flow(path="/v1/chat/completions?key=kept")
    addon.requestheaders(other)
    assert other.request.query["key"] == "kept"


async def test_sse_responses_stream_through_and_usage_is_read(addon, tmp_path) -> None:
    addon.tctx.configure(addon, trimflow_metrics=str(tmp_path / "m.jsonl"))
    flow = llm_flow("anthropic", host="api.anthropic.com")
    await requested(addon, flow)
    flow.response = tutils.tresp(content=None, headers=http.Headers(content_type="text/event-stream"))
    addon.responseheaders(flow)
    scanner = flow.response.stream
    assert callable(scanner)
    events = [b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":1200,"cache_read_input_tokens":300}}}\n\n',
              b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":9}}\n\n']
    assert [scanner(e) for e in events] == events  # bytes pass through unchanged
    addon.response(flow)
    await answer_sent()
    (line,) = (tmp_path / "m.jsonl").read_bytes().splitlines()
    record = orjson.loads(line)
    assert record["usage_input_tokens"] == 1500 and record["status"] == 200


async def test_json_responses_give_usage_too(addon, tmp_path) -> None:
    addon.tctx.configure(addon, trimflow_metrics=str(tmp_path / "m.jsonl"))
    flow = llm_flow()
    await requested(addon, flow)
    flow.response = tutils.tresp(content=b'{"usage":{"prompt_tokens":321,"completion_tokens":5}}', headers=http.Headers(content_type="application/json"))
    addon.responseheaders(flow)
    assert not callable(flow.response.stream)
    addon.response(flow)
    await answer_sent()
    assert orjson.loads((tmp_path / "m.jsonl").read_bytes())["usage_input_tokens"] == 321


async def test_a_failed_flow_still_gets_its_record(addon, tmp_path) -> None:
    addon.tctx.configure(addon, trimflow_metrics=str(tmp_path / "m.jsonl"))
    flow = llm_flow()
    await requested(addon, flow)
    flow.error = tflow.terr("connection reset")
    addon.error(flow)
    await answer_sent()
    record = orjson.loads((tmp_path / "m.jsonl").read_bytes())
    assert record["status"] is None and record["error"] == "connection reset"


async def test_the_line_and_record_come_after_the_hook_and_none_is_lost_at_exit(addon, tmp_path, caplog) -> None:
    metrics = tmp_path / "m.jsonl"
    addon.tctx.configure(addon, trimflow_metrics=str(metrics))

    async def answered(turns: int) -> None:
        flow = llm_flow(turns=turns)
        await requested(addon, flow)
        flow.response = tutils.tresp(content=b"{}", headers=http.Headers(content_type="application/json"))
        addon.response(flow)

    with caplog.at_level(logging.INFO, logger="trimflow"):
        await answered(3)
        await answered(4)
        assert not metrics.exists() or metrics.read_bytes() == b""  # mitmproxy sends the answer first
        await answer_sent()
        assert len(metrics.read_bytes().splitlines()) == 2
        await answered(5)
        addon.done()  # mitmproxy stops before the loop turns again: what is pending is written now
    assert [orjson.loads(line)["turn"] for line in metrics.read_bytes().splitlines()] == [1, 2, 3]
    assert sum("trimflow: conv" in r.getMessage() for r in caplog.records) == 3


async def test_turns_are_numbered_per_conversation(addon) -> None:
    turns = []
    for n in (3, 4, 5):
        flow = llm_flow(turns=n)
        await requested(addon, flow)
        turns.append((flow.metadata["trimflow"]["conversation"], flow.metadata["trimflow"]["turn"]))
    other = llm_flow("anthropic", host="api.anthropic.com")
    await requested(addon, other)
    assert [t for _, t in turns] == [1, 2, 3] and len({c for c, _ in turns}) == 1
    assert other.metadata["trimflow"]["conversation"] != turns[0][0]


async def test_an_edited_rules_file_is_reloaded_and_a_bad_edit_keeps_the_last_good(addon, tmp_path, caplog) -> None:
    path = Path(addon.rules.path)
    addon.rules = mitm.RulesFile(path, check_interval=0)  # check on every request, not once a second
    write_rules(path, 1)
    os.utime(path, (time.time() + 5, time.time() + 5))
    flow = llm_flow(turns=4)
    await requested(addon, flow)
    assert images_in(flow) == 1
    path.write_text("defaults:\n  max_images: -1\n")
    os.utime(path, (time.time() + 10, time.time() + 10))
    with caplog.at_level(logging.ERROR, logger="trimflow"):
        for _ in range(2):
            flow = llm_flow(turns=4)
            await requested(addon, flow)
            assert images_in(flow) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "rules.yaml:2" in errors[0]


async def test_websocket_response_create_is_pruned(addon) -> None:
    flow = tflow.twebsocketflow(messages=False)
    flow.request.path = "/backend-api/codex/responses"
    body = session_body("openai-responses", 4, SHOT, "image/png")
    message = orjson.dumps({"type": "response.create", **body})
    flow.websocket.messages.append(WebSocketMessage(Opcode.TEXT, True, message))
    await addon.websocket_message(flow)
    assert flow.websocket.messages[-1].content.count(b"base64,") == 2


async def test_no_key_reaches_logs_or_metrics(addon, tmp_path, caplog) -> None:
    addon.tctx.configure(addon, trimflow_metrics=str(tmp_path / "m.jsonl"))
    secret = "sk-ant-TOPSECRET0123456789"
    flow = llm_flow("gemini", host="generativelanguage.googleapis.com",
                    path=PATHS["gemini"] + "?key=AIzaTOPSECRET", headers={"x-api-key": secret, "authorization": f"Bearer {secret}"})
    with caplog.at_level(logging.DEBUG):
        await requested(addon, flow)
        flow.response = tutils.tresp(content=b'{"usageMetadata":{"promptTokenCount":77}}')
        addon.responseheaders(flow)
        addon.response(flow)
        await answer_sent()
    logged = "\n".join(r.getMessage() for r in caplog.records) + (tmp_path / "m.jsonl").read_text() + flow.comment
    assert "TOPSECRET" not in logged and "AIza" not in logged
    assert "gemini-2.5-flash" in logged


def test_plain_headers_read_as_mitmproxy_reads_them() -> None:
    headers = http.Headers([(b"Content-Type", b"application/json"), (b"X-Session-Id", "caf\u00e9".encode()), (b"Accept", b"a"), (b"accept", b"b")])
    request = tutils.treq(headers=headers)
    plain = mitm._plain_headers(request)
    names = ("content-type", "x-session-id", "accept")
    assert [plain[name] for name in names] == [request.headers[name.title()] for name in names]  # any case, joined alike
