"""What recovery learns, attacked through a real mitmdump and a real upstream of the test's own (the fake provider,
answering by the path's first segment): a Host header naming another provider, answers that echo "0", a gateway
answering a bare 413 to everything, another port of the same host, a simulated profile, a FIFO, a file another
process holds locked, a typo'd file and a linked one. None of them teaches a limit where it does not belong, and
the proxy serves on through each. A genuine refusal from the genuine upstream is still learned, applies on the next
turn and after a restart, and expires.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from trimflow._learned_limits import upstream_key
from trimflow.testing import FakeProvider, Received

from ..certs import make_server_cert
from ..helpers import held_by_another_process, wait_for
from .helpers import Proxy, image_payloads, post, session, shots, start_all, stop_all, write_rules

pytestmark = pytest.mark.e2e

LIMIT = 4
Upstreams = tuple[FakeProvider, FakeProvider]
CHAT = "/v1/chat/completions"


def error(message: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}})


OUTAGE_PAGE = b"<html><head><title>413 Request Entity Too Large</title></head><body><h1>413 Request Entity Too Large</h1></body></html>"


def answer(received: Received) -> tuple[int, str, bytes] | None:
    """The provider's check: by the path's first segment, a limit it enforces and how it words its refusal."""
    stage = received.path.split("/")[1]
    images = len(image_payloads("openai-chat", received.json()))
    if stage == "limit" and images > LIMIT:
        return 400, "application/json", error(f"Too many images in request. Max is {LIMIT}.")
    if stage == "zero" and images:
        return 400, "application/json", error("Too many images in request. Max is 0.")
    if stage == "echo" and images:
        return 400, "application/json", error("Too many images in request. Max is 0.png")
    if stage == "zero-bytes":
        return 413, "application/json", error("Request body cannot exceed 0 bytes")
    if stage == "outage":
        return 413, "text/html", OUTAGE_PAGE
    return None


@pytest.fixture(scope="module")
def upstreams() -> Iterator[tuple[FakeProvider, FakeProvider]]:
    """Two upstreams on the same host, on two ports."""
    with FakeProvider(check=answer) as first, FakeProvider(check=answer) as second:
        yield first, second


@pytest.fixture
def fresh(upstreams: tuple[FakeProvider, FakeProvider]) -> tuple[FakeProvider, FakeProvider]:
    for upstream in upstreams:
        upstream.clear()
    return upstreams


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    """Starts mitmdumps with rules of 20 images (nothing pruned by the rules) and a learned file of the test's."""
    started: list[Proxy] = []
    rules = write_rules(tmp_path / "rules.yaml", 20)

    def make(*args: str, learned: Path | None = None, name: str = "proxy", **options: str) -> Proxy:
        workdir = tmp_path / f"{name}-{len(started)}"
        workdir.mkdir()
        proxy = Proxy(workdir, *args, rules=rules, trimflow_learned=str(learned or tmp_path / "learned.yaml"), **options)
        start_all(proxy.mitm)
        started.append(proxy)
        return proxy

    yield make
    stop_all(*(p.mitm for p in started))


def body(images: int, seed: int, model: str = "gpt-4o") -> bytes:
    return orjson.dumps(session("openai-chat", shots(images, seed=seed), model))


def sent_images(received: Received) -> int:
    return len(image_payloads("openai-chat", received.json()))


def entries(path: Path) -> list[dict[str, Any]]:
    if not path.exists() or path.is_fifo():
        return []
    return (yaml.safe_load(path.read_text()) or {}).get("learned") or []


def learned_file_holds(path: Path, **wanted: Any) -> bool:
    return any(all(e.get(k) == v for k, v in wanted.items()) for e in entries(path))


def reverse(upstream: FakeProvider) -> tuple[str, str]:
    return ("--mode", f"reverse:{upstream.url}")


# --- what must not be learned ---------------------------------------------------------------------------------------


def test_a_host_header_naming_another_provider_teaches_only_the_server_it_went_to(start: Any, fresh: Upstreams, tmp_path: Path) -> None:
    attacker, genuine = fresh
    proxy = start("--mode", "regular")
    spoofed = {"Host": "api.openai.com"}
    status, _ = post(proxy.port, f"{attacker.url}/limit{CHAT}", body(6, seed=1), spoofed)
    assert status == 200  # refused, then accepted within 4: a limit genuinely learned, for the attacker's own server
    learned = tmp_path / "learned.yaml"
    wait_for(lambda: learned_file_holds(learned, limit="max_images", value=LIMIT), "the attacker's limit in the file")
    assert {e["upstream"] for e in entries(learned)} == {attacker.url}
    # a request to another server, naming the same Host, is not touched by it
    status, _ = post(proxy.port, f"{genuine.url}/ok{CHAT}", body(6, seed=2), spoofed)
    assert status == 200 and sent_images(genuine.received[-1]) == 6


def test_through_a_tls_tunnel_the_key_is_the_connect_target_not_the_host_header(start: Any, tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    (attacker_cert, attacker_key), (genuine_cert, genuine_key) = make_server_cert(certs, "attacker"), make_server_cert(certs, "genuine")
    bundle = certs / "trusted.pem"
    bundle.write_bytes(attacker_cert.read_bytes() + genuine_cert.read_bytes())
    with (
        FakeProvider(check=answer, certfile=str(attacker_cert), keyfile=str(attacker_key)) as attacker,
        FakeProvider(check=answer, certfile=str(genuine_cert), keyfile=str(genuine_key)) as genuine,
    ):
        proxy = start("--mode", "regular", ssl_verify_upstream_trusted_ca=str(bundle))
        trust = ssl.create_default_context(cafile=str(proxy.mitm.ca_cert))
        spoofed = {"Host": "api.openai.com"}
        status, _ = post(proxy.port, f"/limit{CHAT}", body(6, seed=1), spoofed, tunnel=(attacker.host, attacker.port), context=trust)
        assert status == 200
        learned = tmp_path / "learned.yaml"
        wait_for(lambda: learned_file_holds(learned, value=LIMIT), "the attacker's limit in the file")
        assert {e["upstream"] for e in entries(learned)} == {attacker.url}
        assert attacker.url.startswith("https://127.0.0.1:")
        status, _ = post(proxy.port, f"/ok{CHAT}", body(6, seed=2), spoofed, tunnel=(genuine.host, genuine.port), context=trust)
        assert status == 200 and sent_images(genuine.received[-1]) == 6


@pytest.mark.parametrize("stage", ["zero", "echo", "zero-bytes"])
def test_a_figure_under_the_floor_is_never_learned(start: Any, fresh: Upstreams, tmp_path: Path, stage: str) -> None:
    upstream, _ = fresh
    proxy = start(*reverse(upstream))
    status, answered = post(proxy.port, f"/{stage}{CHAT}", body(6, seed=3))
    assert status in (400, 413) and (b"Max is 0" in answered or b"0 bytes" in answered)  # the provider's answer, as it came
    assert len(upstream.received) == 1  # never retried
    if stage != "echo":  # "0.png" is a file name, read as no limit at all
        assert "not retried" in proxy.log() and "under the floor" in proxy.log()
    status, _ = post(proxy.port, f"/ok{CHAT}", body(6, seed=4))
    assert status == 200 and sent_images(upstream.received[-1]) == 6
    assert entries(tmp_path / "learned.yaml") == []


def test_a_gateway_answering_413_to_everything_teaches_nothing(start: Any, fresh: Upstreams, tmp_path: Path) -> None:
    upstream, _ = fresh
    proxy = start(*reverse(upstream))
    for seed in range(5):
        assert post(proxy.port, f"/outage{CHAT}", body(0, seed=seed))[0] == 413  # text only: nothing to cut, nothing to retry
        assert post(proxy.port, f"/outage{CHAT}", body(6, seed=seed))[0] == 413  # retried smaller, refused again
    assert entries(tmp_path / "learned.yaml") == []
    before = len(upstream.received)
    assert post(proxy.port, f"/ok{CHAT}", body(6, seed=9))[0] == 200  # the outage is over: every image goes
    assert len(upstream.received) == before + 1 and sent_images(upstream.received[-1]) == 6


def test_a_limit_learned_from_one_port_never_applies_to_another(start: Any, fresh: Upstreams, tmp_path: Path) -> None:
    first, second = fresh
    proxy = start("--mode", "regular")
    assert post(proxy.port, f"{first.url}/limit{CHAT}", body(6, seed=1))[0] == 200
    wait_for(lambda: learned_file_holds(tmp_path / "learned.yaml", upstream=first.url), "the limit in the file")
    assert post(proxy.port, f"{second.url}/ok{CHAT}", body(6, seed=2))[0] == 200
    assert sent_images(second.received[-1]) == 6
    assert post(proxy.port, f"{first.url}/ok{CHAT}", body(6, seed=3))[0] == 200
    assert sent_images(first.received[-1]) == LIMIT  # where it was learned, it holds


def test_a_simulated_profile_never_touches_the_learned_file(start: Any, fresh: Upstreams, tmp_path: Path) -> None:
    upstream, _ = fresh
    learned = tmp_path / "learned.yaml"
    proxy = start(*reverse(upstream), trimflow_simulate="generic-8")
    with proxy.expect_records(1) as records:
        assert post(proxy.port, f"/ok{CHAT}", body(12, seed=5))[0] == 200
    assert records[0]["retries"] >= 1 and records[0]["simulated"] is None  # the profile refused, the upstream accepted the retry
    assert "in memory (simulated)" in proxy.log()
    with proxy.expect_records(1) as records:
        assert post(proxy.port, f"/ok{CHAT}", body(12, seed=6))[0] == 200
    assert records[0]["retries"] == 0 and records[0]["learned_limits"] is not None  # applied, from memory
    assert not learned.exists()


# --- the file ------------------------------------------------------------------------------------------------------


def learn_and_apply(proxy: Proxy, upstream: FakeProvider, model: str = "gpt-4o") -> None:
    """A genuine refusal is recovered, and the next turn goes within its limit on its first try."""
    with proxy.expect_records(1):  # its record can come after its answer: the next block's records are the next turn's
        assert post(proxy.port, f"/limit{CHAT}", body(6, seed=11, model=model))[0] == 200
    before = len(upstream.received)
    with proxy.expect_records(1) as records:
        assert post(proxy.port, f"/limit{CHAT}", body(7, seed=12, model=model))[0] == 200
    assert len(upstream.received) == before + 1 and sent_images(upstream.received[-1]) == LIMIT
    assert (records[0]["learned_limits"] or "").startswith(f"max_images={LIMIT}")
    assert f"learned: max_images={LIMIT}" in proxy.log()


def test_a_genuine_refusal_is_learned_applied_kept_across_a_restart_and_expires(start: Any, fresh: Upstreams, tmp_path: Path) -> None:
    upstream, _ = fresh
    learned = tmp_path / "learned.yaml"
    proxy = start(*reverse(upstream))
    learn_and_apply(proxy, upstream)
    wait_for(lambda: learned_file_holds(learned, upstream=upstream.url, model="gpt-4o", value=LIMIT), "the limit in the file")
    assert learned.stat().st_mode & 0o777 == 0o600
    stop_all(proxy.mitm)
    again = start(*reverse(upstream), name="restarted")
    assert post(again.port, f"/limit{CHAT}", body(8, seed=13))[0] == 200
    assert sent_images(upstream.received[-1]) == LIMIT  # first try, after the restart
    # a week later: the entry lapses and every image goes again
    reloads = again.log().count("learned limits reloaded")
    text = learned.read_text()
    stamp = entries(learned)[0]["learned"]
    learned.write_text(text.replace(stamp, "2020-01-01T00:00:00.000Z"))
    wait_for(lambda: again.log().count("learned limits reloaded") > reloads, "the edited file reloaded")
    upstream.clear()
    assert post(again.port, f"/ok{CHAT}", body(6, seed=14))[0] == 200
    assert sent_images(upstream.received[-1]) == 6


def test_a_fifo_is_never_read_and_the_proxy_serves_on(start: Any, fresh: Upstreams, tmp_path: Path) -> None:
    upstream, _ = fresh
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    proxy = start(*reverse(upstream), learned=fifo)
    learn_and_apply(proxy, upstream)  # in memory
    assert fifo.is_fifo() and "not a regular file" in proxy.log()


def test_a_file_another_process_holds_locked_delays_only_the_write(start: Any, fresh: Upstreams, tmp_path: Path) -> None:
    upstream, _ = fresh
    learned = tmp_path / "learned.yaml"
    learned.write_text("")
    with held_by_another_process(learned):
        proxy = start(*reverse(upstream))
        learn_and_apply(proxy, upstream)  # served while the lock is held
        wait_for(lambda: "stays locked by another process" in proxy.log(), "the one line about the lock")
        assert learned.read_text() == ""
    wait_for(lambda: learned_file_holds(learned, value=LIMIT), "the entry written once the lock was free")


def test_a_typod_file_is_never_written_over(start: Any, fresh: Upstreams, tmp_path: Path) -> None:
    upstream, _ = fresh
    learned = tmp_path / "learned.yaml"
    typo = f"learned:\n- upstream: '{upstream.url}'\n  limit: max_images\n  value: 6\n  model: [gpt-4o\n"
    learned.write_text(typo)
    proxy = start(*reverse(upstream))
    learn_and_apply(proxy, upstream)
    assert learned.read_text() == typo
    assert proxy.log().count("left as it is") == 1


def test_a_linked_file_stays_linked_and_shared(start: Any, fresh: Upstreams, tmp_path: Path) -> None:
    upstream, _ = fresh
    shared = tmp_path / "shared" / "learned.yaml"
    shared.parent.mkdir()
    link = tmp_path / "link.yaml"
    link.symlink_to(shared)
    proxy = start(*reverse(upstream), learned=link)
    learn_and_apply(proxy, upstream)
    wait_for(lambda: learned_file_holds(shared, value=LIMIT), "the entry in the link's target")
    assert link.is_symlink() and os.readlink(link) == str(shared)


def test_ten_thousand_entries_are_read_bounded_and_served_through(start: Any, fresh: Upstreams, tmp_path: Path) -> None:
    upstream, _ = fresh
    learned = tmp_path / "learned.yaml"
    other = upstream_key("https", "other.example.com", 443)
    when = "2026-11-20T00:00:00.000Z"
    learned.write_text(
        "learned:\n" + "".join(f"- {{upstream: '{other}', model: 'm-{i}', limit: max_images, value: 4, learned: '{when}'}}\n" for i in range(10_000))
    )
    proxy = start(*reverse(upstream))
    learn_and_apply(proxy, upstream)
    wait_for(lambda: learned_file_holds(learned, upstream=upstream.url), "the new entry written")
    assert len(entries(learned)) < 10_000  # bounded at the write
