"""trimflow.proxy.prune: options, the request hook (inline or in a worker, the deferred record), rules
reload, and Codex's WebSocket `response.create` messages."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import os
import signal
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from mitmproxy import exceptions, http
from mitmproxy.test import taddons, tflow, tutils
from mitmproxy.websocket import WebSocketMessage
from wsproto.frame_protocol import Opcode

from trimflow import proxy
from trimflow._history import History, Images
from trimflow._human import format_size_change
from trimflow._last_turns import LastTurns
from trimflow._record import Record, utc_timestamp
from trimflow._rules_file import DEFAULT_RULES_PATH, RulesFile, load_rules
from trimflow._state_store import RedisState
from trimflow.proxy import prune as prune_module
from trimflow.testing import PATHS, session_body

from ..helpers import ROOT, RedisServer, TrimflowAddons, after_hooks, answer_sent, requested, wait_for_async
from .flows import SHOT, images_in, json_answer, llm_flow, write_rules


async def test_transparent_mode_matches_rules_on_the_host_the_client_addressed(tmp_path) -> None:
    # In transparent mode the request's host is the address connected to; the Host header names the API.
    rules = write_rules(tmp_path / "rules.yaml", 8, "rules:\n  - name: openai\n    match: {host: api.openai.com}\n    max_images: 2\n")
    instance = TrimflowAddons()
    with taddons.context(instance) as tctx:
        tctx.configure(instance, trimflow_rules=str(rules))
        flow = llm_flow(host="203.0.113.5", headers={"host": "api.openai.com"})
        assert flow.request.host == "203.0.113.5" and flow.request.pretty_host == "api.openai.com"
        instance.requestheaders(flow)
        await requested(instance, flow)
        record = flow.metadata[proxy.META]
        assert (record["rule"], record["host"], record["images_before"], record["images_after"]) == ("openai", "api.openai.com", 5, 2)
        assert images_in(flow) == 2


def test_options_have_defaults_and_help() -> None:
    flows = proxy.SharedState()
    prune = proxy.Prune(flows)
    with taddons.context(prune) as tctx:
        options = tctx.options
        assert Path(options.trimflow_rules) == ROOT / "rules" / "default.yaml"
        assert options.trimflow_mode == "enforce" and options.trimflow_max_decoded_bytes == "256MB"
        for name in ("trimflow_rules", "trimflow_mode", "trimflow_max_decoded_bytes"):
            assert options._options[name].help
        with pytest.raises(exceptions.OptionsError, match="trimflow_mode must be one of enforce, observe, not 'bogus'"):
            tctx.configure(prune, trimflow_mode="bogus")
        with pytest.raises(exceptions.OptionsError, match="trimflow_max_decoded_bytes needs a size"):
            tctx.configure(prune, trimflow_max_decoded_bytes="none")
        with pytest.raises(exceptions.OptionsError, match="trimflow_max_decoded_bytes: invalid size 'lots'"):
            tctx.configure(prune, trimflow_max_decoded_bytes="lots")
        tctx.configure(prune, trimflow_max_decoded_bytes="1MiB")
        assert flows.max_decoded_bytes == 2**20  # where the simulate and metrics addons read it


def test_how_often_the_rules_file_is_looked_at_is_an_option(tmp_path) -> None:
    flows = proxy.SharedState()
    prune = proxy.Prune(flows)
    with taddons.context(prune) as tctx:
        assert tctx.options.trimflow_rules_check == "1s" and tctx.options._options["trimflow_rules_check"].help
        tctx.configure(prune)
        assert flows.rules.check_interval == 1.0
        tctx.configure(prune, trimflow_rules_check="0.2s")
        assert flows.rules.check_interval == 0.2  # the rules file that runs follows the change
        tctx.configure(prune, trimflow_rules=str(write_rules(tmp_path / "rules.yaml", 3)))
        assert flows.rules.check_interval == 0.2  # and so does the next one
        tctx.configure(prune, trimflow_rules_check="0")
        assert flows.rules.check_interval == 0  # on every request
        for bad, message in [
            ("none", "trimflow_rules_check needs a duration"),
            ("-1", "trimflow_rules_check: invalid duration '-1'"),
            ("soon", "trimflow_rules_check: invalid duration 'soon'"),
        ]:
            with pytest.raises(exceptions.OptionsError, match=message):
                tctx.configure(prune, trimflow_rules_check=bad)


def test_the_default_rules_are_the_shipped_file() -> None:
    flows = proxy.SharedState()
    prune = proxy.Prune(flows)
    shipped = load_rules(DEFAULT_RULES_PATH)
    with taddons.context(prune) as tctx:
        tctx.configure(prune)  # mitmdump configures a script with all options once it is loaded
        rules = flows.rules.current()
        for host, path, model, rule in [
            ("generativelanguage.googleapis.com", PATHS["gemini"], "gemini-2.5-pro", "gemini"),
            ("api.openai.com", "/v1/chat/completions", "gpt-4o", "openai-cached-share"),
            ("api.anthropic.com", "/v1/messages", "claude-sonnet-4-5", "claude"),
        ]:
            limits = rules.limits_for(host, path, model)
            assert limits == shipped.limits_for(host, path, model) and limits.rule == rule
        assert rules.limits_for("api.anthropic.com", "/v1/messages", "claude-sonnet-4-5").max_images == 8


def test_a_bad_rules_file_is_refused_at_start_with_file_and_line(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("defaults:\n  max_images: 8\n  max_image: 3\n")
    prune = proxy.Prune(proxy.SharedState())
    with taddons.context(prune) as tctx:
        with pytest.raises(exceptions.OptionsError, match=r"bad\.yaml:3: .*max_image"):
            tctx.configure(prune, trimflow_rules=str(bad))


async def test_enforce_prunes_and_annotates_the_flow(addon) -> None:
    flow = llm_flow(turns=5)
    before = len(flow.request.content)
    await requested(addon, flow)
    assert images_in(flow) == 2
    assert int(flow.request.headers["content-length"]) == len(flow.request.raw_content) < before
    record = flow.metadata["trimflow"]
    assert record["images_before"] == 5 and record["images_after"] == 2 and record["turn"] == 1
    sizes = format_size_change(record["body_bytes_before"], record["body_bytes_after"])
    assert flow.comment.startswith(f"5->2 img, {sizes}; trimflow rule defaults, ")  # the figures lead, for the flow list


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
    assert addon.flows.get(flow) is None


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
    to_thread = prune_module.asyncio.to_thread

    async def counting(fn, *args, **kwargs):
        offloaded.append(getattr(fn, "__name__", "?"))
        return await to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(prune_module.asyncio, "to_thread", counting)
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


async def test_a_request_needing_nothing_goes_first_and_gets_its_record_once_its_answer_has_gone(addon) -> None:
    flow = llm_flow(turns=2)  # within the 2 images of the test rules
    original = flow.request.raw_content
    await addon.request(flow)
    assert flow.request.raw_content is original and "trimflow" not in flow.metadata  # mitmproxy forwards it now
    await after_hooks()
    assert "trimflow" not in flow.metadata  # nothing of its record or its turn while the provider answers
    flow.response = json_answer()
    addon.responseheaders(flow)
    await addon.response_async(flow)
    assert "trimflow" not in flow.metadata  # the answer goes to the client as this hook returns
    await after_hooks()
    assert "trimflow" not in flow.metadata  # nor while the client reads it: with the line, FLUSH_DELAY later
    await answer_sent()
    record = flow.metadata["trimflow"]
    assert record["images_before"] == record["images_after"] == 2 and record["pruned"] == 0 and record["turn"] == 1
    assert record["est_tokens_before"] > 0 and record["status"] == 200  # sniffed sizes, token estimates, the answer

    # Turns are numbered in the order they came, whichever answer comes first.
    second, third = llm_flow(turns=2), llm_flow(turns=2)
    await addon.request(second)
    await addon.request(third)
    third.response, second.response = json_answer(), json_answer()
    await addon.response_async(third)
    await addon.response_async(second)
    await answer_sent()
    assert (second.metadata["trimflow"]["turn"], third.metadata["trimflow"]["turn"]) == (2, 3)


async def test_a_deferred_record_is_logged_on_the_timer_that_completes_it(addon) -> None:
    # The record of a request that needed nothing is completed FLUSH_DELAY after its answer, and its line and JSONL
    # record go then, on that one timer: not FLUSH_DELAY later again.
    written = turns_written(addon)
    flow = llm_flow(turns=2)
    await requested_only(addon, flow)
    flow.response = json_answer()
    await addon.response_async(flow)
    await asyncio.sleep(proxy.FLUSH_DELAY)  # due after the addon's timer: timers fire in deadline order
    assert "trimflow" in flow.metadata and written == [1]


async def test_an_answer_counted_at_once_comes_after_the_answers_still_waiting(addon) -> None:
    # The cache breaks read a conversation's answers in order: a changed turn answered while the answer before it waits
    # for its line (FLUSH_DELAY) is counted after that one, not before.
    counted = turns_written(addon)
    first = llm_flow(turns=2)
    await requested_only(addon, first)
    first.response = json_answer()
    await addon.response_async(first)
    later = llm_flow(turns=3)  # over the rules' 2 images: changed, its record at once
    await addon.request(later)
    later.response = json_answer()
    await addon.response_async(later)
    await answer_sent()
    assert counted == [1, 2]


async def test_a_request_that_needs_the_memory_numbers_the_turns_before_it_first(addon) -> None:
    # A fast agent's next turn may come before the last one's answer has been accounted for: a turn with images to cut
    # reads when they came, so every pending turn is numbered before it.
    first = llm_flow(turns=2)
    await requested_only(addon, first)
    assert "trimflow" not in first.metadata
    later = llm_flow(turns=3)  # one image more than the rules' 2: cut, by arrival
    await addon.request(later)
    assert first.metadata["trimflow"]["turn"] == 1 and later.metadata["trimflow"]["turn"] == 2
    assert later.metadata["trimflow"]["pruned"] == 1


async def test_with_a_store_other_hosts_read_a_turn_is_in_it_before_its_request_goes(addon) -> None:
    # Behind a balancer across hosts the next turn may reach another instance as soon as this answer is back: its
    # turn cannot wait for the answer, as it does on one host.
    store = LastTurns(":memory:")
    store.across_hosts = True  # as the Redis store (trimflow._state_store.RedisState)
    addon.flows.conversations.shared = store
    try:
        flow = llm_flow(turns=2)
        await addon.request(flow)
        assert flow.metadata["trimflow"]["turn"] == 1  # before mitmproxy forwards it
        assert addon.flows.get(flow).history_line.row is not None  # and its turn went to the store
    finally:
        addon.flows.conversations.shared = None
        store.close()


class ReadsSeen(RedisState):
    """The Redis store, noting the thread of each read (and that one has begun, for a test that holds the server)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.threads: list[int] = []
        self.thread_names: list[str] = []
        self.reading = threading.Event()

    def get_many(self, keys):
        self.threads.append(threading.get_ident())
        self.thread_names.append(threading.current_thread().name)
        self.reading.set()
        return super().get_many(keys)


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:
    running = RedisServer(tmp_path)
    yield running
    running.stop()


@contextlib.contextmanager
def sharing(addon, server: RedisServer, deadline: float) -> Iterator[ReadsSeen]:
    store = ReadsSeen(server.url, deadline=deadline)
    assert store.wait_until_up(60)
    addon.flows.conversations.shared = store
    try:
        yield store
    finally:
        addon.flows.conversations.shared = None
        store.close()


def gzipped(flow: http.HTTPFlow) -> http.HTTPFlow:
    flow.request.headers["content-encoding"] = "gzip"
    flow.request.raw_content = gzip.compress(flow.request.raw_content)
    return flow


def response_create(turns: int) -> WebSocketMessage:
    body = session_body("openai-responses", turns, SHOT, "image/png")
    return WebSocketMessage(Opcode.TEXT, True, orjson.dumps({"type": "response.create", **body}))


async def test_with_the_redis_store_no_read_runs_on_the_event_loop(addon, redis_server) -> None:
    # A store on another machine may take its whole deadline to answer: the loop serves every other flow meanwhile. Turns
    # of each kind read it: one the memory cuts (inline), one sent as it came (its turn numbered before it goes), one run
    # in a worker (a compressed body), and Codex's WebSocket messages; each is numbered on what it read.
    loop = threading.get_ident()
    with sharing(addon, redis_server, deadline=30.0) as store:
        flows = [llm_flow(turns=2), llm_flow(turns=3), gzipped(llm_flow(turns=4)), llm_flow(turns=5)]
        for flow in flows:
            await requested(addon, flow)
            assert store.drained(30)
        assert [flow.metadata["trimflow"]["turn"] for flow in flows] == [1, 2, 3, 4]
        assert [flow.metadata["trimflow"]["pruned"] for flow in flows] == [0, 1, 2, 3]
        socket = tflow.twebsocketflow(messages=False)
        socket.request.path = "/backend-api/codex/responses"
        for turns in (4, 5):
            socket.websocket.messages.append(response_create(turns))
            await addon.websocket_message(socket)
            assert socket.websocket.messages[-1].content.count(b"base64,") == 2
        assert len(store.threads) >= len(flows) + 2 and loop not in store.threads
        # Inline turns read in the store's own threads, never queued behind a shrink in the engine's (the gzipped turn's
        # run in a worker reads there).
        assert sum(name.startswith("trimflow-state-read") for name in store.thread_names) >= len(flows) + 1
        assert all(addon.flows.get(flow).rows is None for flow in flows)  # the rows read for a turn go with it


async def test_a_hung_store_holds_up_only_the_request_that_reads_it(addon, redis_server) -> None:
    # A store that stops answering (SIGSTOP: connected, silent), as a swapped-out or overloaded server: the turn reading
    # it waits for it, or for its deadline; a request that reads nothing meanwhile is served at once.
    assert redis_server.process is not None
    with sharing(addon, redis_server, deadline=30.0) as store:
        await requested(addon, llm_flow(turns=2))
        assert store.drained(30)
        redis_server.process.send_signal(signal.SIGSTOP)
        try:
            store.reading.clear()
            waiting = asyncio.create_task(requested(addon, llm_flow(turns=3)))
            await wait_for_async(store.reading.is_set, "the turn reading the hung store")
            other = llm_flow(path="/v1/files", body=b'{"purpose": "batch"}')  # no LLM request: nothing to read
            await requested(addon, other)
            assert not waiting.done() and store.threads.count(threading.get_ident()) == 0
        finally:
            redis_server.process.send_signal(signal.SIGCONT)
        await waiting
    assert store.outages == 0


async def test_a_turn_whose_rows_were_not_read_ahead_is_numbered_without_a_read_on_the_loop(addon, redis_server) -> None:
    # The numbering runs on the loop: a turn that comes to it with no rows read for it is numbered on this instance's
    # own memory, as if the store had answered nothing (a read past its deadline), and the store is not read there.
    with sharing(addon, redis_server, deadline=30.0) as store:
        record = Record.untouched("api.example", "/v1/chat/completions", "openai-chat", "enforce", "", 10)
        line = addon.flows.number(record, History("api.example", None, 0, [1, 2], b"\x00" * 8, images=Images([], None)))
        assert record.turn == 1 and line is not None and line.row is not None  # its turn still goes to the store
        assert store.threads == []


async def test_pending_records_are_bounded_and_a_streamed_answer_does_not_hold_one(addon) -> None:
    # A pending record holds its parsed body: never more than the bound wait for their answers, and one whose answer
    # streams (for minutes, maybe) is worked out as the answer starts.
    flows = [llm_flow(turns=2) for _ in range(proxy.state.MAX_UNSETTLED + 1)]
    for flow in flows:
        await requested_only(addon, flow)
    assert "trimflow" in flows[0].metadata and "trimflow" not in flows[-1].metadata
    streamed = flows[-1]
    streamed.response = tutils.tresp(content=None, headers=http.Headers(content_type="text/event-stream"))
    addon.responseheaders(streamed)
    assert streamed.metadata["trimflow"]["turn"] == len(flows)


async def test_pending_bodies_are_bounded_in_bytes(addon, monkeypatch) -> None:
    first, second, third = (llm_flow(turns=2) for _ in range(3))
    monkeypatch.setattr(proxy.state, "MAX_UNSETTLED_BYTES", 2 * len(first.request.raw_content))
    await requested_only(addon, first)
    await requested_only(addon, second)
    assert "trimflow" not in first.metadata  # two bodies wait
    await requested_only(addon, third)
    assert "trimflow" in first.metadata and "trimflow" not in second.metadata  # a third pushes the oldest out


async def test_a_turn_worked_out_after_its_answer_is_timed_as_it_was_sent(addon, monkeypatch) -> None:
    # The conversations and the cache breaks read the idle time between an agent's turns: a slow answer is not idle.
    now = [1_000_000.0]
    monkeypatch.setattr(proxy.state, "time", types.SimpleNamespace(time=lambda: now[0]))
    flow = llm_flow(turns=2)
    await requested_only(addon, flow)
    now[0] += 600  # the provider answers ten minutes later, past any cache's lifetime
    flow.response = json_answer()
    await addon.response_async(flow)
    await answer_sent()
    state = addon.flows.get(flow)
    assert flow.metadata["trimflow"]["turn"] == 1 and state.history_line.sent_at == 1_000_000.0
    assert flow.metadata["trimflow"]["ts"] == utc_timestamp(1_000_000.0)  # where its OpenTelemetry span starts


def turns_written(addon) -> list[int | None]:
    """The turns of the records the metrics addon writes from now on, in the order it writes them."""
    written: list[int | None] = []
    addon.get(proxy.Metrics).listeners.append(lambda record, error: written.append(record.turn))
    return written


async def requested_only(addon, flow) -> None:
    await addon.request(flow)
    await after_hooks()


async def test_an_undecodable_body_is_forwarded_with_one_log_line(addon, caplog) -> None:
    flow = llm_flow(turns=4)
    flow.request.headers["content-encoding"] = "gzip"  # but the body is not gzip
    original = flow.request.raw_content
    with caplog.at_level(logging.WARNING, logger="trimflow"):
        await requested(addon, flow)
    assert flow.request.raw_content == original
    assert len([r for r in caplog.records if "forwarded untouched" in r.getMessage()]) == 1
    assert "not valid gzip" in flow.metadata["trimflow"]["reason"]  # in the metrics like any untouched request


async def test_an_internal_error_fails_open(addon, caplog, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("boom with secret body text")

    monkeypatch.setattr(prune_module, "prune", broken)
    flow = llm_flow(turns=4)
    original = flow.request.raw_content
    with caplog.at_level(logging.WARNING, logger="trimflow"):
        await requested(addon, flow)
    assert flow.request.raw_content == original
    messages = [r.getMessage() for r in caplog.records]
    assert any("RuntimeError" in m for m in messages) and not any("secret" in m for m in messages)


def test_stream_large_bodies_gets_one_clear_warning(addon, caplog) -> None:
    # Declared by mitmproxy's proxyserver addon, which taddons does not load.
    addon.tctx.options.add_option("stream_large_bodies", str | None, None, "as mitmproxy declares it")
    with caplog.at_level(logging.WARNING, logger="trimflow"):
        addon.tctx.configure(addon, stream_large_bodies="1m")
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "stream_large_bodies=1m" in warning and "unpruned" in warning


async def test_a_request_mitmproxy_streamed_is_warned_about_once_per_host(addon, caplog) -> None:
    addon.tctx.options.add_option("stream_large_bodies", str | None, "1m", "as mitmproxy declares it")
    with caplog.at_level(logging.WARNING, logger="trimflow"):
        caplog.clear()
        for _ in range(2):
            flow = llm_flow()
            flow.request.raw_content = None  # what mitmproxy leaves of a streamed body
            await requested(addon, flow)
            assert "trimflow" not in flow.metadata
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "an LLM request to api.openai.com was streamed by mitmproxy (stream_large_bodies=1m)" in warning


async def test_an_edited_rules_file_is_reloaded_and_a_bad_edit_keeps_the_last_good(addon, tmp_path, caplog) -> None:
    path = Path(addon.rules.path)
    addon.rules = RulesFile(path, check_interval=0)  # check on every request, not once a second
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


async def test_websocket_response_create_is_pruned_and_gets_its_line(addon, caplog) -> None:
    flow = tflow.twebsocketflow(messages=False)
    flow.request.path = "/backend-api/codex/responses"
    for turns in (4, 5):
        body = session_body("openai-responses", turns, SHOT, "image/png")
        message = orjson.dumps({"type": "response.create", **body})
        flow.websocket.messages.append(WebSocketMessage(Opcode.TEXT, True, message))
        with caplog.at_level(logging.INFO, logger="trimflow"):
            await addon.websocket_message(flow)
            assert flow.websocket.messages[-1].content.count(b"base64,") == 2
            # The line waits for the server's answer, which gives its status and usage.
            answer = {"type": "response.completed", "response": {"id": f"resp_{turns}", "status": "completed", "usage": {"input_tokens": 9}}}
            flow.websocket.messages.append(WebSocketMessage(Opcode.TEXT, False, orjson.dumps(answer)))
            await addon.websocket_message(flow)
            await answer_sent()
    lines = [r.getMessage() for r in caplog.records if "trimflow: conv" in r.getMessage()]
    assert [line.split(" turn ")[1].split()[0] for line in lines] == ["1", "2"] and "images 5->2" in lines[1]
    assert "trimflow" not in flow.metadata  # a record per message, none for the flow


def test_plain_headers_read_as_mitmproxy_reads_them() -> None:
    headers = http.Headers([(b"Content-Type", b"application/json"), (b"X-Session-Id", "caf\u00e9".encode()), (b"Accept", b"a"), (b"accept", b"b")])
    request = tutils.treq(headers=headers)
    plain = prune_module.plain_headers(request)
    names = ("content-type", "x-session-id", "accept")
    assert [plain[name] for name in names] == [request.headers[name.title()] for name in names]  # any case, joined alike


async def test_gemini_token_counts_are_pruned_as_their_turn_and_are_no_turn(addon) -> None:
    """Gemini CLI calls :countTokens with the next request's contents before each turn."""
    host, count_path = "generativelanguage.googleapis.com", PATHS["gemini"].replace(":generateContent", ":countTokens")
    records = []
    for turns in range(1, 5):
        contents = session_body("gemini", turns, SHOT, "image/png")["contents"]
        count = llm_flow("gemini", host=host, path=count_path, body=orjson.dumps({"contents": contents}))
        turn = llm_flow("gemini", turns=turns, host=host)
        for flow in (count, turn):
            await requested(addon, flow)
            records.append(flow.metadata["trimflow"])
        assert images_in(count) == images_in(turn) == min(turns, 2)  # the count measures what the turn sends
    counts, turns_ = records[0::2], records[1::2]
    assert [(r["kind"], r["turn"]) for r in counts] == [("count_tokens", None)] * 4
    assert [(r["kind"], r["turn"]) for r in turns_] == [("turn", t) for t in (1, 2, 3, 4)]
    (conversation,) = {r["conversation"] for r in turns_}
    assert [r["conversation"] for r in counts] == [None, conversation, conversation, conversation]


async def test_the_cache_aware_cut_holds_across_a_conversations_flows(tmp_path) -> None:
    """With low_water, the proxy's conversations carry each turn's cut to the next: the images cut on the turn
    the cap broke stay cut while the cap allows, so the cached prefix still matches."""
    rules = write_rules(tmp_path / "rules.yaml", 4, "  low_water: 0.5\n")
    instance = TrimflowAddons()
    sent = []
    with taddons.context(instance) as tctx:
        tctx.configure(instance, trimflow_rules=str(rules))
        for turns in range(1, 9):
            flow = llm_flow(turns=turns)
            instance.requestheaders(flow)
            await requested(instance, flow)
            sent.append(images_in(flow))
            assert flow.metadata[proxy.META]["turn"] == turns
    # Turn 5 breaks the cap of 4 and is cut to 2; turns 6 and 7 hold that cut; turn 8 breaks it again.
    assert sent == [1, 2, 3, 4, 2, 3, 4, 2]
