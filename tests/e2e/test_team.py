"""trimflow run by a team, with the real servers (Debian's `prometheus` and `haproxy` packages) on loopback:

- a real Prometheus scrapes a real mitmdump's /metrics while a screenshot session goes through it to the fake
  provider, and its HTTP query API gives the JSONL's figures; the PromQL of docs/deployment.md runs on them;
- HAProxy in front of two mitmdumps sharing one learned-limits file: a limit learned through one instance holds
  on the other's next request; balancing on the session id keeps a conversation's turn numbers, spreading it
  does not; the health check on /metrics takes a stopped instance out;
- HAProxy's round robin in front of two mitmdumps sharing one conversations file, or as on two hosts (a confdir
  each, no file) one Redis store (Debian's `redis-server`, on a Unix socket the test names): a reference session
  costs what it costs through one mitmdump, and more when each keeps its own; through the store its turns are
  numbered 1..N once;
- without prometheus_client, mitmdump runs and says in one line how to add it.

Where prometheus, haproxy or redis-server is missing these tests skip with one line saying how to install them; with
TRIMFLOW_REQUIRE_TEAM_SERVERS=1 (set by .ci/run) they fail instead. Every wait is on a condition (a scrape, a
health check, a record), never a fixed sleep.
"""

from __future__ import annotations

import csv
import io
import itertools
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson
import pytest
import yaml

from trimflow._last_turns import FILE_NAME
from trimflow._limit_profiles import load_profiles, provider_check
from trimflow._prices import load_prices
from trimflow.testing import FakeProvider, Session, replay

from ..helpers import RedisServer, wait_for
from ..mitmdump import ADDON, Mitmdump
from ..research.cache_sessions import REFERENCE_SESSIONS
from .helpers import ROOT, Proxy, image_payloads, loopback_get, post, session, shots, start_all, start_wrong, stop_all, write_rules

pytestmark = pytest.mark.e2e

REQUIRE_VARIABLE = "TRIMFLOW_REQUIRE_TEAM_SERVERS"
MISSING = (
    "{name} not installed: the team tests need Debian's prometheus, haproxy and redis-server "
    "(as root: apt-get install prometheus haproxy redis-server, or scripts/setup)"
)
DEPLOYMENT = ROOT / "docs" / "deployment.md"


def server_binary(name: str) -> str:
    """The server's binary; skips the calling test where there is none (fails it when the servers are required)."""
    found = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None)
    if found:
        return found
    if os.environ.get(REQUIRE_VARIABLE) == "1":
        pytest.fail(f"{MISSING.format(name=name)} ({REQUIRE_VARIABLE}=1)", pytrace=False)
    pytest.skip(MISSING.format(name=name))


class Server:
    """A server process of its own, logging to a file in `workdir`; `pass_fds` are sockets it inherits."""

    def __init__(self, name: str, workdir: Path, command: list[str], pass_fds: tuple[int, ...] = ()) -> None:
        self.log_path = workdir / f"{name}.log"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir, pass_fds=pass_fds)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        assert self.process.poll() is None, f"exited with {self.process.returncode}:\n{self.log()[-2000:]}"
        return True

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


# --- Prometheus -------------------------------------------------------------------------------------------------


# Prometheus's line once its web server is bound (2.x and 3.x, from the exporter toolkit): the port it got for port 0.
PROMETHEUS_LISTENING = re.compile(r'msg="Listening on" address=127\.0\.0\.1:(\d+)')


class Prometheus(Server):
    """A Prometheus scraping `targets` every second, its API on the loopback port it was given by the kernel (it
    binds port 0 and says in its log which port it got)."""

    def __init__(self, workdir: Path, targets: list[str]) -> None:
        binary = server_binary("prometheus")
        workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "trimflow", "static_configs": [{"targets": targets}]}],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        super().__init__(
            "prometheus",
            workdir,
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                "--web.listen-address=127.0.0.1:0",
                "--log.level=info",  # for the line that gives the port
            ],
        )

        def listening() -> int | None:
            found = self.alive() and PROMETHEUS_LISTENING.search(self.log())
            return int(found.group(1)) if found else None

        self.port = wait_for(listening, "Prometheus listening")
        wait_for(lambda: self.alive() and loopback_get(self.port, "/-/ready")[0] == 200, "ready Prometheus")

    def query(self, promql: str) -> list[dict[str, Any]]:
        status, body = loopback_get(self.port, "/api/v1/query?" + urlencode({"query": promql}))
        assert status == 200, body
        answer = orjson.loads(body)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def value(self, promql: str) -> float | None:
        """The query's one value (a sum), or None while it has none."""
        result = self.query(promql)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None


def deployment_queries() -> dict[str, str]:
    """The PromQL blocks of docs/deployment.md, by the heading line above each (`# bytes saved per hour`)."""
    blocks = re.findall(r"```promql\n(.*?)```", DEPLOYMENT.read_text(), re.S)
    queries = {}
    for block in blocks:
        comment, _, query = block.partition("\n")
        queries[comment.lstrip("# ").strip()] = " ".join(query.split())
    return queries


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as fake:
        yield fake


def test_prometheus_reads_the_figures_of_the_jsonl(tmp_path: Path, provider: FakeProvider) -> None:
    proxy = Proxy(tmp_path / "proxy", "--mode", f"reverse:{provider.url}", rules=None, trimflow_prometheus="127.0.0.1:0")
    start_all(proxy.mitm)
    prometheus = None
    try:
        metrics_port = proxy.metrics_port()
        prometheus = Prometheus(tmp_path / "prometheus", [f"127.0.0.1:{metrics_port}"])
        wait_for(lambda: prometheus.value('up{job="trimflow"}') == 1, "scrape of trimflow's /metrics")
        # Two rounds of the same sessions, each scraped: a rate sees a counter move between two scrapes only.
        sessions = [(Session("openai-chat", 40, model="gpt-4o"), 14), (Session("anthropic", 40, model="claude-sonnet-4-6"), 5)]
        for _ in range(2):
            sent = len(proxy.records())
            rows = [row for s, turns in sessions for row in replay(proxy.url, s, turns)]
            assert all(row.ok for row in rows), [row for row in rows if not row.ok]
            count = sent + len(proxy.records_after(sent, len(rows)))
            wait_for(lambda c=count: prometheus.value("sum(trimflow_requests_total)") == c, "every request in Prometheus")
        records = proxy.records()

        def summed(field: str) -> int:
            return sum(r[field] or 0 for r in records)

        assert summed("pruned") > 0 and summed("pruned") < summed("images_before")  # the shipped rules cut the long session
        for metric, field in [
            ("trimflow_images_received_total", "images_before"),
            ("trimflow_images_pruned_total", "pruned"),
            ("trimflow_body_bytes_received_total", "body_bytes_before"),
            ("trimflow_body_bytes_forwarded_total", "body_bytes_after"),
            ("trimflow_estimated_tokens_received_total", "est_tokens_before"),
            ("trimflow_estimated_tokens_forwarded_total", "est_tokens_after"),
            ("trimflow_input_tokens_total", "usage_input_tokens"),
            ("trimflow_output_tokens_total", "usage_output_tokens"),
            ("trimflow_request_body_bytes_sum", "body_bytes_before"),
        ]:
            assert prometheus.value(f"sum({metric})") == summed(field), metric
        by_outcome = {r["metric"]["outcome"]: float(r["value"][1]) for r in prometheus.query("sum by (outcome) (trimflow_requests_total)")}
        pruned = sum(1 for r in records if r["pruned"])
        assert by_outcome == {"pruned": pruned, "untouched": len(records) - pruned}
        by_family = {r["metric"]["family"]: float(r["value"][1]) for r in prometheus.query("sum by (family) (trimflow_requests_total)")}
        assert by_family == {"gpt": 28, "claude": 10}
        assert prometheus.value("sum(trimflow_overhead_seconds_count)") == len(records)
        assert prometheus.value("sum(trimflow_overhead_seconds_sum)") == pytest.approx(summed("overhead_ms") / 1000, rel=1e-9)
        # The instance shares its turns through the conversations file in its confdir, and no write was dropped.
        assert prometheus.value("min(trimflow_conversations_file)") == 1
        assert prometheus.value("sum(trimflow_conversations_writes_dropped_total)") == 0

        # The deployment page's queries, as written there, give figures of the right kind.
        queries = deployment_queries()
        assert set(queries) == {"bytes saved per hour", "share of turns pruned", "p95 added latency (seconds)"}
        saved = prometheus.value(queries["bytes saved per hour"])
        assert saved is not None and saved > 0
        share = prometheus.value(queries["share of turns pruned"])
        assert share is not None and 0 < share < 1
        p95 = prometheus.value(queries["p95 added latency (seconds)"])
        assert p95 is not None and 0 < p95 <= 2.0
    finally:
        if prometheus is not None:
            prometheus.stop()
        stop_all(proxy.mitm)


# --- HAProxy in front of two instances ---------------------------------------------------------------------------

# The provider allows 4 images (the rules: 8), and says so as GitHub Copilot's API does: see docs/recovery.md.
PROFILES = """\
profiles:
  count-4:
    max_images: 4
    status: 400
    content_type: application/json
    body: {error: {message: "too many images: maximum allowed for model {model} is {limit}, got {images}"}}
"""
HAPROXY = """\
global
    maxconn 256
defaults
    mode http
    timeout connect 5s
    timeout client 120s
    timeout server 120s
frontend stats
    bind fd@{stats}
    stats enable
    stats uri /stats
frontend spread
    bind fd@{spread}
    default_backend spread
frontend by_session
    bind fd@{by_session}
    # As docs/deployment.md: the conversation's session id, else the client's address.
    http-request set-var(txn.affinity) req.hdr(x-claude-code-session-id)
    http-request set-var(txn.affinity) req.hdr(session_id) unless {{ var(txn.affinity) -m found }}
    http-request set-var(txn.affinity) req.hdr(x-session-id) unless {{ var(txn.affinity) -m found }}
    http-request set-var(txn.affinity) src unless {{ var(txn.affinity) -m found }}
    default_backend by_session
backend spread
    balance roundrobin
    option httpchk GET /metrics
    http-check expect status 200
    default-server check inter 300ms fall 2 rise 1
    server a 127.0.0.1:{a} port {a_metrics}
    server b 127.0.0.1:{b} port {b_metrics}
backend by_session
    balance hash var(txn.affinity)
    hash-type consistent
    option httpchk GET /metrics
    http-check expect status 200
    default-server check inter 300ms fall 2 rise 1
    server a 127.0.0.1:{a} port {a_metrics}
    server b 127.0.0.1:{b} port {b_metrics}
"""


class HAProxy(Server):
    """HAProxy in front of the instances a and b, given as (proxy port, metrics port).

    Its frontends listen on sockets this process bound to port 0 and hands over (`bind fd@N`): a port in its
    config file would have to be picked free beforehand, and another process could take it before HAProxy binds.
    Listening already, they queue connections from the start."""

    def __init__(self, workdir: Path, a: tuple[int, int], b: tuple[int, int]) -> None:
        binary = server_binary("haproxy")
        frontends = {name: socket.create_server(("127.0.0.1", 0)) for name in ("stats", "spread", "by_session")}
        self.stats, self.spread, self.by_session = (frontends[name].getsockname()[1] for name in ("stats", "spread", "by_session"))
        fds = {name: sock.fileno() for name, sock in frontends.items()}
        config = workdir / "haproxy.cfg"
        config.write_text(HAPROXY.format(**fds, a=a[0], a_metrics=a[1], b=b[0], b_metrics=b[1]))
        try:
            super().__init__("haproxy", workdir, [binary, "-db", "-f", str(config)], pass_fds=tuple(fds.values()))
        finally:
            for sock in frontends.values():
                sock.close()  # HAProxy holds its copies

    def states(self) -> dict[tuple[str, str], str]:
        """(backend, server) -> UP, DOWN, ... from the stats page's CSV."""
        status, body = loopback_get(self.stats, "/stats;csv")
        if status != 200:
            return {}
        rows = csv.DictReader(io.StringIO(body.decode().lstrip("# ")))
        return {(row["pxname"], row["svname"]): row["status"] for row in rows if row["svname"] in ("a", "b")}

    def wait_until(self, state: dict[str, str]) -> None:
        """Until the health checks put each server (a, b) in its state in both backends."""
        want = {(backend, server): s for backend in ("spread", "by_session") for server, s in state.items()}
        wait_for(lambda: self.alive() and all(self.states().get(key) == s for key, s in want.items()), f"servers {state}")


class Team:
    """The fake provider, two trimflow instances sharing one learned-limits file, HAProxy in front."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "profiles.yaml").write_text(PROFILES)
        write_rules(root / "rules.yaml", 8)
        self.provider = FakeProvider(check=provider_check(load_profiles(root / "profiles.yaml").get("count-4"))).start()
        self.learned = root / "shared" / "learned.yaml"
        self.metrics_ports: dict[str, int] = {}  # known once they started
        self.instances = {
            name: Proxy(
                root / name,
                "--mode",
                f"reverse:{self.provider.url}",
                rules=root / "rules.yaml",
                trimflow_learned=str(self.learned),
                trimflow_prometheus="127.0.0.1:0",
            )
            for name in ("a", "b")
        }
        self.haproxy: HAProxy | None = None

    def start(self) -> None:
        start_all(*(p.mitm for p in self.instances.values()))
        self.metrics_ports = {name: p.metrics_port() for name, p in self.instances.items()}
        a, b = self.instances["a"], self.instances["b"]
        self.haproxy = HAProxy(self.root, (a.port, self.metrics_ports["a"]), (b.port, self.metrics_ports["b"]))
        self.haproxy.wait_until({"a": "UP", "b": "UP"})

    def send(self, port: int, images: list[bytes], model: str, headers: dict[str, str] | None = None) -> tuple[str, dict[str, Any]]:
        """One request through HAProxy's frontend on `port`: which instance served it, and its record there."""
        before = {name: len(p.settled_records()) for name, p in self.instances.items()}
        status, answer = post(port, "/v1/chat/completions", orjson.dumps(session("openai-chat", images, model)), headers)
        assert status == 200, answer[:300]

        def served() -> tuple[str, dict[str, Any]] | None:
            for name, p in self.instances.items():
                records = p.records()
                if len(records) > before[name]:
                    return name, records[-1]
            return None

        return wait_for(served, "record of the request")

    def close(self) -> None:
        if self.haproxy is not None:
            self.haproxy.stop()
        stop_all(*(p.mitm for p in self.instances.values()))
        self.provider.stop()


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    server_binary("haproxy")
    running = Team(tmp_path_factory.mktemp("team"))
    try:
        running.start()
        yield running
    finally:
        running.close()


def test_a_limit_learned_through_one_instance_holds_on_the_other(team: Team) -> None:
    assert team.haproxy is not None
    team.provider.clear()
    reloads = {name: p.log().count("learned limits reloaded from") for name, p in team.instances.items()}
    first, record = team.send(team.haproxy.spread, shots(6, seed=1), "gpt-4o")
    # The provider refused 6 images; the instance learned 4, sent the newest 4 again, and wrote the shared file.
    refused, retried = team.provider.received
    assert [len(image_payloads("openai-chat", r.json())) for r in (refused, retried)] == [6, 4]
    assert (record["retries"], record["retry_limits"], record["images_after"]) == (1, "max_images=4", 4)
    (entry,) = wait_for(lambda: team.learned.exists() and (yaml.safe_load(team.learned.read_text()) or {}).get("learned"), "the shared file written")
    assert (entry["upstream"], entry["model"], entry["limit"], entry["value"]) == (team.provider.url, "gpt-4o", "max_images", 4)
    # The other instance looks at the file about once a second: once it has reloaded it, its next request is within the limit.
    other = next(name for name in team.instances if name != first)
    wait_for(lambda: team.instances[other].log().count("learned limits reloaded from") > reloads[other], "reload by the other instance")
    team.provider.clear()
    second, record = team.send(team.haproxy.spread, shots(7, seed=2), "gpt-4o")
    assert second == other  # round robin: the other instance
    (only,) = team.provider.received  # on its first try
    assert len(image_payloads("openai-chat", only.json())) == 4
    assert (record["retries"], record["images_before"], record["images_after"]) == (0, 7, 4)
    # Each instance's /metrics says the limit holds (the file), and which one learned it.
    learned = {}
    for name, port in team.metrics_ports.items():
        text = loopback_get(port, "/metrics")[1].decode()
        held = re.search(r"^trimflow_learned_limits (\S+)$", text, re.M)
        by_this = re.search(r"^trimflow_limits_learned_total (\S+)$", text, re.M)
        assert held is not None and by_this is not None
        learned[name] = (float(held.group(1)), float(by_this.group(1)))
    assert learned == {first: (1.0, 1.0), second: (1.0, 0.0)}


def turns(team: Team, port: int, count: int, model: str, seed: int, headers: dict[str, str] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """Turns 1..count of one screenshot conversation through HAProxy's frontend on `port`."""
    images = shots(count, seed=seed)
    return [team.send(port, images[:n], model, headers) for n in range(1, count + 1)]


def test_balanced_on_the_session_id_a_conversation_stays_on_one_instance(team: Team) -> None:
    assert team.haproxy is not None
    served = turns(team, team.haproxy.by_session, 4, "gpt-4.1", 10, {"x-session-id": "team-sticky-1"})
    assert len({name for name, _ in served}) == 1
    assert [r["turn"] for _, r in served] == [1, 2, 3, 4]
    assert len({r["conversation"] for _, r in served}) == 1


def test_spread_over_instances_a_conversation_keeps_its_id_only_when_named(team: Team) -> None:
    """The turn numbers count what each instance saw; a session id hashes to the same conversation everywhere,
    a history names a different one per instance (docs/deployment.md says so)."""
    assert team.haproxy is not None
    named = turns(team, team.haproxy.spread, 4, "gpt-4.1-mini", 20, {"x-session-id": "team-spread-1"})
    assert [name for name, _ in named][:2] in (["a", "b"], ["b", "a"])  # round robin
    assert len({r["conversation"] for _, r in named}) == 1
    assert [r["turn"] for _, r in named] == [1, 1, 2, 2]
    unnamed = turns(team, team.haproxy.spread, 4, "gpt-4.1-nano", 30)
    ids = {name: {r["conversation"] for n, r in unnamed if n == name} for name in ("a", "b")}
    assert all(len(v) == 1 for v in ids.values()) and ids["a"] != ids["b"]
    assert [r["turn"] for _, r in unnamed] == [1, 1, 2, 2]


def test_the_health_check_takes_a_stopped_instance_out(team: Team) -> None:
    """Last in the module: it stops instance b."""
    assert team.haproxy is not None
    stop_all(team.instances["b"].mitm)
    team.haproxy.wait_until({"a": "UP", "b": "DOWN"})
    served = [team.send(team.haproxy.spread, shots(2, seed=40 + i), "gpt-4o")[0] for i in range(3)]
    assert served == ["a", "a", "a"]


# --- two instances behind round robin against one, on a reference session ----------------------------------------


def billed(records: list[dict[str, Any]], model: str) -> float:
    """What the records' usage (the fake provider's prompt cache model) costs at rules/prices.yaml's prices."""
    price = load_prices().for_model(model)
    assert price is not None, model
    total = 0.0
    for r in records:
        read, write = r["usage_cache_read_tokens"] or 0, r["usage_cache_write_tokens"] or 0
        total += price.cost(r["usage_input_tokens"] - read - write, write, read, r["usage_output_tokens"] or 0)
    return total


# A reference session, or its first turns: computer use past two cuts of batches of 6 (bodies up to 5 MB); and what
# the pair shares: the conversations file, as instances on one host do by default ("file"), a Redis store, as instances
# on two hosts do ("store": each its own confdir and no file), or nothing (the control).
TEAM_SESSIONS = {"chat-anthropic": None, "computer-use": 16}
TEAM_CASES = [
    ("chat-anthropic", "file"),
    ("computer-use", "file"),
    ("chat-anthropic", "store"),
    ("computer-use", "store"),
    ("computer-use", "nothing"),
]
# The store's deadline on the request path in the byte-for-byte runs: a read past the shipped 5 ms (a busy machine)
# goes on with the instance's own memory, which is right for a proxy and not what these runs compare.
PATIENT = "1"


@pytest.mark.parametrize(("name", "shares"), TEAM_CASES, ids=["-".join(case) for case in TEAM_CASES])
def test_two_instances_behind_round_robin_cost_no_more_than_one(tmp_path: Path, name: str, shares: str) -> None:
    """One reference session through one trimflow, then through two behind HAProxy's round robin, each time to a
    fake provider that bills it with the prompt cache model. The shipped rules hold each conversation's cut from
    turn to turn (low_water) and the two instances share its last turn through the conversations file or the Redis
    store, so the pair forwards what the single instance forwarded, byte for byte, the provider's cache reads as
    much, and the pair costs no more; through the store they also number the turns 1..N once, under one id. Each on
    its own, the two hold different cuts, forward other bodies and number the turns 1, 1, 2, 2."""
    server_binary("haproxy")
    reference = next(s for s in REFERENCE_SESSIONS if s.name == name)
    length = TEAM_SESSIONS[name] or reference.length
    store = RedisServer(tmp_path) if shares == "store" else None
    one_provider, two_provider = FakeProvider(cache=True).start(), FakeProvider(cache=True).start()
    single = Proxy(tmp_path / "single", "--mode", f"reverse:{one_provider.url}", rules=None)
    files = {instance: tmp_path / ("shared" if shares == "file" else instance) / FILE_NAME for instance in ("a", "b")}
    sharing: dict[str, dict[str, str]] = {
        instance: {"trimflow_conversations": str(files[instance])}
        if store is None
        else {"trimflow_conversations": "", "trimflow_state": store.url, "trimflow_state_deadline": PATIENT}
        for instance in ("a", "b")
    }
    pair = {
        instance: Proxy(
            tmp_path / instance,
            "--mode",
            f"reverse:{two_provider.url}",
            rules=None,
            trimflow_prometheus="127.0.0.1:0",
            **sharing[instance],
        )
        for instance in ("a", "b")
    }
    start_all(single.mitm, *(p.mitm for p in pair.values()))
    haproxy = None
    try:
        metrics_ports = {instance: p.metrics_port() for instance, p in pair.items()}
        haproxy = HAProxy(tmp_path, (pair["a"].port, metrics_ports["a"]), (pair["b"].port, metrics_ports["b"]))
        haproxy.wait_until({"a": "UP", "b": "UP"})
        for port in (single.port, haproxy.spread):
            for turn in itertools.islice(reference.turns(), length):  # back to back: the provider's cache stays warm
                status, answer = post(port, reference.path, turn.body, {"content-type": "application/json"})
                assert status == 200, answer[:300]
        wait_for(lambda: len(single.records()) == length, "the single instance's records")
        wait_for(lambda: sum(len(p.records()) for p in pair.values()) == length, "the pair's records")
        one = single.records()
        by_instance = {instance: p.records() for instance, p in pair.items()}
        assert all(abs(len(records) - length / 2) <= 1 for records in by_instance.values()), {k: len(v) for k, v in by_instance.items()}
        in_order = sorted((r for records in by_instance.values() for r in records), key=lambda r: r["turn"])
        if store is not None:  # numbered as one instance numbers them
            assert [r["turn"] for r in in_order] == list(range(1, length + 1))
            assert len({r["conversation"] for r in in_order}) == 1
            assert not any(files[instance].exists() for instance in pair)  # no file: as on two hosts
        else:
            assert all(r["turn"] <= (length + 1) // 2 for r in in_order)  # each saw every other turn
        assert sum(r["pruned"] for r in one) > 0 and sum(r["usage_cache_read_tokens"] for r in one) > 0  # cuts, and a prefix read
        cost_one = billed(one, reference.model)
        cost_two = billed([r for records in by_instance.values() for r in records], reference.model)
        bodies_one, bodies_two = [r.body for r in one_provider.received], [r.body for r in two_provider.received]
        if shares != "nothing":
            # ... and forwarded what the single instance forwarded for it.
            assert bodies_two == bodies_one and (store is not None or all(f.is_file() for f in files.values()))
            assert 0 < cost_two <= cost_one
        else:
            assert bodies_two != bodies_one and cost_two > cost_one
    finally:
        if haproxy is not None:
            haproxy.stop()
        stop_all(single.mitm, *(p.mitm for p in pair.values()))
        one_provider.stop()
        two_provider.stop()
        if store is not None:
            store.stop()


def test_through_the_store_a_limit_one_instance_learns_applies_on_the_others_next_request(tmp_path: Path) -> None:
    """As on two hosts (a confdir each, no shared file): the learned limits live in the store too."""
    server_binary("haproxy")
    store = RedisServer(tmp_path)
    (tmp_path / "profiles.yaml").write_text(PROFILES)
    write_rules(tmp_path / "rules.yaml", 8)
    provider = FakeProvider(check=provider_check(load_profiles(tmp_path / "profiles.yaml").get("count-4"))).start()
    options = {"trimflow_conversations": "", "trimflow_state": store.url, "trimflow_prometheus": "127.0.0.1:0"}
    rules = tmp_path / "rules.yaml"
    pair = {instance: Proxy(tmp_path / instance, "--mode", f"reverse:{provider.url}", rules=rules, **options) for instance in ("a", "b")}
    start_all(*(p.mitm for p in pair.values()))
    haproxy = None
    try:
        metrics_ports = {instance: p.metrics_port() for instance, p in pair.items()}
        haproxy = HAProxy(tmp_path, (pair["a"].port, metrics_ports["a"]), (pair["b"].port, metrics_ports["b"]))
        haproxy.wait_until({"a": "UP", "b": "UP"})
        before = {name: len(p.records()) for name, p in pair.items()}
        status, _ = post(haproxy.spread, "/v1/chat/completions", orjson.dumps(session("openai-chat", shots(6, seed=70), "gpt-4o")))
        assert status == 200
        first = wait_for(lambda: next((n for n, p in pair.items() if len(p.records()) > before[n]), None), "the first record")
        assert pair[first].records()[-1]["retries"] == 1  # refused at 6, learned 4
        other = next(name for name in pair if name != first)
        wait_for(lambda: "learned limits reloaded from shared state" in pair[other].log(), "the other instance's reload")
        provider.clear()
        status, _ = post(haproxy.spread, "/v1/chat/completions", orjson.dumps(session("openai-chat", shots(7, seed=71), "gpt-4o")))
        assert status == 200
        record = wait_for(lambda: len(pair[other].records()) > before[other] and pair[other].records()[-1], "the other's record")
        (only,) = provider.received  # on its first try
        assert len(image_payloads("openai-chat", only.json())) == 4
        assert (record["retries"], record["images_before"], record["images_after"]) == (0, 7, 4)
        assert not any((tmp_path / name / "confdir" / "trimflow-learned.yaml").exists() for name in pair)
    finally:
        if haproxy is not None:
            haproxy.stop()
        stop_all(*(p.mitm for p in pair.values()))
        provider.stop()
        store.stop()


def test_a_store_killed_mid_session_costs_one_warning_and_sharing_resumes_when_it_is_back(tmp_path: Path) -> None:
    """Two instances as on two hosts behind round robin, sharing a Redis store. Killed mid-conversation: no request
    fails, each instance says so once and goes on from what it saw itself; started again, without anyone restarting
    an instance: each says so once, the next turn on one instance goes on from the turn the other wrote after the
    restart (one id, numbers one apart), and a new conversation is numbered 1..N once again."""
    server_binary("haproxy")
    store = RedisServer(tmp_path)
    provider = FakeProvider().start()
    options = {"trimflow_conversations": "", "trimflow_state": store.url, "trimflow_state_deadline": PATIENT}
    pair = {
        instance: Proxy(tmp_path / instance, "--mode", f"reverse:{provider.url}", rules=None, trimflow_prometheus="127.0.0.1:0", **options)
        for instance in ("a", "b")
    }
    start_all(*(p.mitm for p in pair.values()))
    haproxy = None

    def conversation(seed: int, turns: range) -> list[tuple[str, dict[str, Any]]]:
        """These turns of a screenshot conversation (turn n sends n screenshots): which instance served each, and its record."""
        assert haproxy is not None
        images = shots(turns.stop - 1, seed=seed)
        served = []
        for n in turns:
            before = {name: len(p.records()) for name, p in pair.items()}
            status, answer = post(haproxy.spread, "/v1/chat/completions", orjson.dumps(session("openai-chat", images[:n], "gpt-4o")))
            assert status == 200, answer[:300]  # never failed by the store

            def record() -> tuple[str, dict[str, Any]] | None:
                grown = [(name, p.records()) for name, p in pair.items() if len(p.records()) > before[name]]  # noqa: B023
                return (grown[0][0], grown[0][1][-1]) if grown else None

            served.append(wait_for(record, "the turn's record"))
        return served

    def said(text: str) -> dict[str, int]:
        return {name: sum(text in line for line in p.log().splitlines()) for name, p in pair.items()}

    try:
        metrics_ports = {instance: p.metrics_port() for instance, p in pair.items()}
        haproxy = HAProxy(tmp_path, (pair["a"].port, metrics_ports["a"]), (pair["b"].port, metrics_ports["b"]))
        haproxy.wait_until({"a": "UP", "b": "UP"})
        before = conversation(60, range(1, 5))
        assert [r["turn"] for _, r in before] == [1, 2, 3, 4] and len({r["conversation"] for _, r in before}) == 1
        (session_id,) = {r["conversation"] for _, r in before}
        store.stop()  # SIGKILL, mid-session
        during = conversation(60, range(5, 9))
        # Each instance goes on from its own memory of the conversation: 2 turns behind on each, the numbers apart.
        assert [r["turn"] for _, r in during] == [4, 5, 5, 6] and {r["conversation"] for _, r in during} == {session_id}
        other = conversation(61, range(1, 5))
        assert [r["turn"] for _, r in other] == [1, 1, 2, 2]  # a new conversation: each its own
        wait_for(lambda: said("not answering") == {"a": 1, "b": 1}, "one warning from each instance")
        store.start()
        wait_for(lambda: said("answers again") == {"a": 1, "b": 1}, "each instance back on the store")
        after = conversation(60, range(9, 13))
        # The first turn after the restart finds the store empty; from the next, each instance goes on from the turn
        # the other wrote: one id, each number one past the one before, on alternating instances.
        assert [name for name, _ in after[:2]] != [after[0][0]] * 2
        numbers = [r["turn"] for _, r in after]
        assert numbers[1:] == list(range(numbers[0] + 1, numbers[0] + 4)) and {r["conversation"] for _, r in after} == {session_id}
        fresh = conversation(62, range(1, 5))
        assert [r["turn"] for _, r in fresh] == [1, 2, 3, 4] and len({r["conversation"] for _, r in fresh}) == 1
        assert said("not answering") == {"a": 1, "b": 1}
        assert "Traceback" not in pair["a"].log() + pair["b"].log()
    finally:
        if haproxy is not None:
            haproxy.stop()
        stop_all(*(p.mitm for p in pair.values()))
        provider.stop()
        store.stop()


# --- without prometheus_client ----------------------------------------------------------------------------------


def test_without_prometheus_client_mitmdump_runs_and_says_how_to_enable_metrics(tmp_path: Path, provider: FakeProvider) -> None:
    blocker = tmp_path / "without.py"  # loaded first: the module is unimportable, as in a Python that lacks it
    blocker.write_text("import sys\nsys.modules['prometheus_client'] = None\n")
    mitm = Mitmdump(
        tmp_path,
        "-s",
        str(blocker),
        "-s",
        str(ADDON),
        "--mode",
        f"reverse:{provider.url}",
        addon=False,
        options={"trimflow_prometheus": "127.0.0.1:0"},
    )
    start_all(mitm)
    try:
        status, _ = post(mitm.port, "/v1/chat/completions", orjson.dumps(session("openai-chat", shots(2, seed=50), "gpt-4o")))
        assert status == 200
        lines = [line for line in mitm.log().splitlines() if "trimflow:" in line and "prometheus" in line.lower()]
        assert len(lines) == 1 and "pip install 'trimflow[prometheus]'" in lines[0], lines
        assert "Traceback" not in mitm.log()
    finally:
        stop_all(mitm)


def test_a_taken_metrics_port_is_one_line_and_mitmdump_exits_before_listening(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, lines = start_wrong(tmp_path, "--set", f"trimflow_prometheus=127.0.0.1:{port}")
    assert code != 0
    assert lines[-1] == f"trimflow: trimflow_prometheus: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert not [line for line in lines if "listening" in line or "Traceback" in line], lines  # it never listened
