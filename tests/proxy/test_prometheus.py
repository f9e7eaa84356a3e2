"""trimflow.proxy.prometheus: the counters are the JSONL record's figures, read back over a real socket from the
endpoint on the event loop; bounded labels; the option's checks; and without prometheus_client, one line."""

from __future__ import annotations

import logging
import socket
import sys

import orjson
import pytest
from mitmproxy import exceptions
from mitmproxy.flow import Error
from mitmproxy.test import taddons

from trimflow import proxy
from trimflow._record import Record
from trimflow.proxy.prometheus import ENABLE, model_family, outcome_of, parse_address, status_class

from ..helpers import TrimflowAddons, answer_sent, requested, wait_for_async
from .flows import json_answer, llm_flow
from .scrape import scrape


def samples(text: bytes) -> dict[str, float]:
    """`name{labels}` -> value, for every sample of an exposition."""
    out = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def total(values: dict[str, float], name: str) -> float:
    return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))


def port_of(addon: TrimflowAddons) -> int:
    address = addon.get(proxy.Prometheus).address
    assert address is not None
    return address[1]


# --- bounded labels ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "family"),
    [
        ("claude-sonnet-4-6", "claude"),
        ("anthropic.claude-3-5-sonnet-20241022-v2:0", "claude"),
        ("us.anthropic.claude-opus-4-1-20250805-v1:0", "claude"),
        ("gpt-4o", "gpt"),
        ("openai/gpt-5.1-codex", "gpt"),
        ("o3-mini", "gpt"),
        ("codex-mini-latest", "gpt"),
        ("gemini-3.1-pro-preview", "gemini"),
        ("publishers/google/models/gemini-2.5-flash", "gemini"),
        ("llama3.2-vision", "other"),
        ("my-company-finetune-7b-2026-11-24", "other"),
        (None, "other"),
        ("", "other"),
    ],
)
def test_a_model_name_falls_into_one_of_four_families(model: str | None, family: str) -> None:
    assert model_family(model) == family


def record(**fields: object) -> Record:
    base = Record(
        ts="2026-11-24T12:00:00.000Z",
        conversation="c",
        turn=1,
        host="h",
        path="/v1/chat/completions",
        format="openai-chat",
        model="gpt-4o",
        rule="defaults",
        mode="enforce",
    )
    for name, value in fields.items():
        setattr(base, name, value)
    return base


@pytest.mark.parametrize(
    ("fields", "outcome"),
    [
        ({}, "untouched"),
        ({"pruned": 3}, "pruned"),
        ({"shrunk": 1}, "pruned"),
        ({"thinned": 2}, "pruned"),
        ({"mode": "observe", "pruned": 3}, "observed"),
        ({"reason": "body is not JSON (Expecting value at line 1 column 1)"}, "failed_open"),
        ({"mode": "observe", "reason": "SigV4-signed body: any change would break its signature"}, "failed_open"),
        ({"retries": 1, "pruned": 2, "refused_status": 413}, "retried"),
        ({"simulated": "axum-2mb", "status": 413}, "simulated"),
    ],
)
def test_each_request_has_one_outcome(fields: dict[str, object], outcome: str) -> None:
    assert outcome_of(record(**fields)) == outcome


def test_the_status_label_is_a_class() -> None:
    assert [status_class(s) for s in (200, 201, 400, 413, 500, None, 999)] == ["2xx", "2xx", "4xx", "4xx", "5xx", "none", "none"]


@pytest.mark.parametrize(
    ("value", "address"), [("127.0.0.1:9101", ("127.0.0.1", 9101)), ("[::1]:9101", ("::1", 9101)), ("0.0.0.0:0", ("0.0.0.0", 0))]
)
def test_an_address_is_host_and_port(value: str, address: tuple[str, int]) -> None:
    assert parse_address(value) == address


@pytest.mark.parametrize("value", ["9101", ":9101", "localhost", "127.0.0.1:http", "127.0.0.1:70000", "127.0.0.1:-1"])
def test_anything_else_is_refused_with_examples(value: str) -> None:
    with pytest.raises(ValueError, match=r"trimflow_prometheus must be HOST:PORT \(127\.0\.0\.1:9101, "):
        parse_address(value)


# --- the option ----------------------------------------------------------------------------------------------


def test_off_by_default_and_the_help_says_how_to_install() -> None:
    instance = TrimflowAddons()
    with taddons.context(instance) as tctx:
        assert tctx.options.trimflow_prometheus == ""
        assert "pip install 'trimflow[prometheus]'" in tctx.options._options["trimflow_prometheus"].help
        assert instance.get(proxy.Prometheus).address is None


async def test_a_bad_address_or_a_taken_port_is_refused(addon) -> None:
    with pytest.raises(exceptions.OptionsError, match="trimflow_prometheus must be HOST:PORT"):
        addon.tctx.configure(addon, trimflow_prometheus="9101")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(exceptions.OptionsError, match=f"trimflow_prometheus: cannot listen on 127.0.0.1:{port}: Address already in use"):
            addon.tctx.configure(addon, trimflow_prometheus=f"127.0.0.1:{port}")


async def test_without_prometheus_client_trimflow_runs_and_says_how_to_enable_it(
    addon, tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as in a Python that lacks it
    caplog.set_level(logging.INFO, "trimflow")
    addon.tctx.configure(addon, trimflow_prometheus="127.0.0.1:0", trimflow_metrics=str(tmp_path / "m.jsonl"))
    lines = [r.getMessage() for r in caplog.records if "prometheus" in r.getMessage().lower()]
    assert lines == [f"trimflow: trimflow_prometheus needs prometheus_client, which this Python lacks: {ENABLE}"]
    assert addon.get(proxy.Prometheus).address is None
    flow = llm_flow()
    await requested(addon, flow)
    flow.response = json_answer(b'{"usage":{"prompt_tokens":321,"completion_tokens":5}}')
    addon.response(flow)
    await answer_sent()
    assert orjson.loads((tmp_path / "m.jsonl").read_bytes())["status"] == 200  # the proxy and its JSONL go on


# --- the figures -----------------------------------------------------------------------------------------------


async def test_the_counters_are_the_sums_of_the_jsonl_records(addon, tmp_path) -> None:
    jsonl = tmp_path / "m.jsonl"
    addon.tctx.configure(addon, trimflow_prometheus="127.0.0.1:0", trimflow_metrics=str(jsonl))
    answers = [
        ("openai-chat", "api.openai.com", b'{"usage":{"prompt_tokens":1000,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":600}}}'),
        ("openai-chat", "api.openai.com", b'{"usage":{"prompt_tokens":1500,"completion_tokens":9}}'),
        (
            "anthropic",
            "api.anthropic.com",
            b'{"usage":{"input_tokens":10,"cache_read_input_tokens":800,"cache_creation_input_tokens":90,"output_tokens":4}}',
        ),
    ]
    for wire_format, host, answer in answers:
        flow = llm_flow(wire_format, host=host)
        await requested(addon, flow)
        flow.response = json_answer(answer)
        addon.response(flow)
    await answer_sent()
    records = [orjson.loads(line) for line in jsonl.read_bytes().splitlines()]
    assert len(records) == 3 and all(r["pruned"] > 0 for r in records)  # rules of 2 images, sessions of 5
    status, headers, body = await scrape(port_of(addon))
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    values = samples(body)

    def summed(field: str) -> int:
        return sum(r[field] or 0 for r in records)

    assert total(values, "trimflow_requests_total") == 3
    assert values['trimflow_requests_total{family="gpt",format="openai-chat",kind="turn",outcome="pruned",rule="defaults",status="2xx"}'] == 2
    assert records[2]["model"].startswith("claude")
    assert values['trimflow_requests_total{family="claude",format="anthropic",kind="turn",outcome="pruned",rule="defaults",status="2xx"}'] == 1
    for name, field in [
        ("trimflow_images_received_total", "images_before"),
        ("trimflow_images_pruned_total", "pruned"),
        ("trimflow_body_bytes_received_total", "body_bytes_before"),
        ("trimflow_body_bytes_forwarded_total", "body_bytes_after"),
        ("trimflow_estimated_tokens_received_total", "est_tokens_before"),
        ("trimflow_estimated_tokens_forwarded_total", "est_tokens_after"),
        ("trimflow_input_tokens_total", "usage_input_tokens"),
        ("trimflow_cache_read_tokens_total", "usage_cache_read_tokens"),
        ("trimflow_cache_write_tokens_total", "usage_cache_write_tokens"),
        ("trimflow_output_tokens_total", "usage_output_tokens"),
    ]:
        assert total(values, name) == summed(field), name
    assert summed("usage_cache_read_tokens") == 1400 and summed("usage_cache_write_tokens") == 90
    assert total(values, "trimflow_request_body_bytes_count") == 3
    assert total(values, "trimflow_request_body_bytes_sum") == summed("body_bytes_before")
    assert total(values, "trimflow_overhead_seconds_sum") == pytest.approx(summed("overhead_ms") / 1000)
    assert values["trimflow_learned_limits"] == 0 and values["trimflow_limits_learned_total"] == 0
    breaks = [r for r in records if r["cache_break"]]
    assert breaks and total(values, "trimflow_cache_breaks_total") == len(breaks)
    by_cause = {k: v for k, v in values.items() if k.startswith("trimflow_cache_breaks_total{")}
    assert all('cause="first_turn"' in k and 'rule="defaults"' in k for k in by_cause), by_cause  # each its conversation's first
    # Bounded labels: no model name, host, path or conversation id, let alone a key or prompt text.
    for leak in [b"gpt-4o", b"claude-", b"api.openai.com", b"/v1/", *(r["conversation"].encode() for r in records)]:
        assert leak not in body, leak


async def test_a_record_that_cannot_be_counted_is_logged_once_and_the_proxy_goes_on(
    addon, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "trimflow")
    addon.tctx.configure(addon, trimflow_prometheus="127.0.0.1:0")
    instruments = addon.get(proxy.Prometheus).instruments

    def broken(record: Record) -> None:
        raise KeyError("x")

    monkeypatch.setattr(instruments, "observe", broken)
    for _ in range(2):
        flow = llm_flow()
        await requested(addon, flow)
        flow.response = json_answer()
        addon.response(flow)
    await answer_sent()
    assert [r.getMessage() for r in caplog.records if "not counted" in r.getMessage()] == [
        "trimflow: a record was not counted for Prometheus: internal error KeyError"
    ]
    assert caplog.text.count("trimflow: conv ") == 2  # both log lines, as ever


async def test_a_failed_flow_counts_with_no_status(addon, tmp_path) -> None:
    addon.tctx.configure(addon, trimflow_prometheus="127.0.0.1:0")
    flow = llm_flow()
    await requested(addon, flow)
    flow.error = Error("server closed connection")
    addon.error(flow)
    await answer_sent()
    values = samples((await scrape(port_of(addon)))[2])
    assert values['trimflow_requests_total{family="gpt",format="openai-chat",kind="turn",outcome="pruned",rule="defaults",status="none"}'] == 1


async def test_learned_limits_are_read_when_scraped(addon, tmp_path) -> None:
    learned = tmp_path / "learned.yaml"
    addon.tctx.configure(addon, trimflow_prometheus="127.0.0.1:0", trimflow_learned=str(learned))
    recover = addon.get(proxy.Recover)
    recover.learned.learn("api.openai.com", "gpt-4o", {"max_images": 4}, "s")
    recover.learned.learn("api.openai.com", None, {"max_body_bytes": 2 << 20}, "s")
    values = samples((await scrape(port_of(addon)))[2])
    assert values["trimflow_learned_limits"] == 2


async def test_the_conversations_file_is_read_when_scraped(addon, tmp_path) -> None:
    """1 while turns are shared through the file; 0 when it cannot be used or none is named."""
    broken = tmp_path / "not-a-database.sqlite3"
    broken.write_bytes(b"not sqlite" * 512)
    addon.tctx.configure(addon, trimflow_prometheus="127.0.0.1:0", trimflow_conversations=str(tmp_path / "c.sqlite3"))
    for path, expected in [(str(tmp_path / "c.sqlite3"), 1), (str(broken), 0), ("", 0)]:
        addon.tctx.configure(addon, trimflow_conversations=path)
        await requested(addon, llm_flow())  # a turn: written to the file, if any
        values = samples((await scrape(port_of(addon)))[2])
        assert values["trimflow_conversations_file"] == expected, path
        assert values["trimflow_conversations_writes_dropped_total"] == 0


# --- the endpoint -------------------------------------------------------------------------------------------


async def test_the_endpoint_answers_get_and_head_on_metrics_only(addon) -> None:
    addon.tctx.configure(addon, trimflow_prometheus="127.0.0.1:0")
    port = port_of(addon)
    status, headers, body = await scrape(port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200 and int(headers["Content-Length"]) > 0 and body == b""
    assert (await scrape(port, b"GET / HTTP/1.1\r\n\r\n"))[0] == 404
    status, headers, _ = await scrape(port, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    assert (await scrape(port, b"hello\r\n\r\n"))[0] == 400
    status, headers, body = await scrape(port, b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\r\n")
    assert status == 200 and headers["Content-Type"].startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")


async def test_a_refused_change_leaves_the_endpoint_where_it_was(addon) -> None:
    addon.tctx.configure(addon, trimflow_prometheus="127.0.0.1:0")
    serving = port_of(addon)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(exceptions.OptionsError, match="Address already in use"):
            addon.tctx.configure(addon, trimflow_prometheus=f"127.0.0.1:{taken.getsockname()[1]}")
    assert addon.tctx.options.trimflow_prometheus == "127.0.0.1:0"  # mitmproxy rolled the option back
    assert port_of(addon) == serving and (await scrape(serving))[0] == 200


async def refused(port: int, host: str = "127.0.0.1") -> bool:
    try:
        await scrape(port, host=host)
    except ConnectionRefusedError:
        return True
    return False


async def test_moving_or_clearing_the_address_frees_the_port(addon) -> None:
    addon.tctx.configure(addon, trimflow_prometheus="127.0.0.1:0")
    first = port_of(addon)
    assert (await scrape(first))[0] == 200
    # Another loopback address (Linux answers on all of 127/8), port 0 again: the port it got is read back.
    addon.tctx.configure(addon, trimflow_prometheus="127.0.0.2:0")
    second = port_of(addon)
    assert (await scrape(second, host="127.0.0.2"))[0] == 200
    await wait_for_async(lambda: refused(first), "the first address refused")
    addon.tctx.configure(addon, trimflow_prometheus="")
    assert addon.get(proxy.Prometheus).address is None
    await wait_for_async(lambda: refused(second, "127.0.0.2"), "the second address refused")


# --- what anyone who reaches the port can do ----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0:0", "0.0.0.0:0"])
def test_binding_every_interface_says_so_in_one_warning(addon, caplog: pytest.LogCaptureFixture, value: str) -> None:
    caplog.set_level(logging.INFO, "trimflow")
    addon.tctx.configure(addon, trimflow_prometheus=value)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        f"trimflow: trimflow_prometheus={value} serves /metrics on every interface: anyone who can reach this machine can read it "
        "(127.0.0.1:PORT keeps it on this machine)"
    ]
    caplog.clear()
    addon.tctx.configure(addon, trimflow_prometheus="127.0.0.1:0")
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_scrapes_with_nothing_new_reuse_the_last_render_and_a_new_record_is_in_the_next(
    addon, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    addon.tctx.configure(addon, trimflow_prometheus="127.0.0.1:0", trimflow_metrics=str(tmp_path / "m.jsonl"))
    instruments = addon.get(proxy.Prometheus).instruments
    renders = []
    render = instruments.render
    monkeypatch.setattr(instruments, "render", lambda accept: renders.append(accept) or render(accept))  # counts, renders as ever
    port = port_of(addon)
    first = [await scrape(port) for _ in range(10)]
    assert len(renders) == 1 and all(answer == first[0] for answer in first)
    flow = llm_flow()
    await requested(addon, flow)
    flow.response = json_answer()
    addon.response(flow)
    await answer_sent()
    status, _, body = await scrape(port)
    assert status == 200 and len(renders) == 2 and total(samples(body), "trimflow_requests_total") == 1
    assert (await scrape(port, b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\r\n"))[2].endswith(b"# EOF\n")
    assert len(renders) == 3  # another format is its own render
