"""The shared store on Redis (trimflow._state_store), against a real redis-server on a Unix socket of the test's own."""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trimflow._conversation import Conversations
from trimflow._history import History, Images, Media, image_key
from trimflow._last_turns import MAX_AGE, LastTurn
from trimflow._learned_limits import DEFAULT_TTL, LearnedLimits
from trimflow._limits import Limits
from trimflow._record import TURN
from trimflow._state_store import (
    FRONT_CONNECTIONS,
    LEARNED,
    PASSWORD_VARIABLE,
    LearnedInStore,
    RedisState,
    StateRefused,
    StoredFile,
    checked_url,
    file_key,
    password_from,
    turn_key,
)

from .helpers import RedisServer, wait_for

# The request path's deadline in tests that look at what is shared: a busy machine's slow answer would read nothing
# that once (the instance's own memory), which is right for a proxy and no test of sharing.
PATIENT = 1.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    running = RedisServer(tmp_path)
    yield running
    running.stop()


def line(turn: int, keys: list[bytes]) -> History:
    """Turn `turn` of a synthetic conversation (one message a turn), sending images of these keys."""
    return History("api.example", None, 0, [hash((0, i)) for i in range(turn)], b"\x00" * 8, images=Images(keys, None))


def turn(sent_at: float, cut: int = 0, count: int = 3) -> LastTurn:
    return LastTurn(sent_at, cut, tuple((i.to_bytes(8, "big"), i * 7) for i in range(count)))


def test_a_turn_one_instance_puts_is_what_the_other_gets(server: RedisServer) -> None:
    now = [1000.0]
    with RedisState(server.url, deadline=PATIENT, clock=lambda: now[0]) as a, RedisState(server.url, deadline=PATIENT, clock=lambda: now[0]) as b:
        assert a.wait_until_up(30) and b.wait_until_up(30)
        assert b.get_many([b"k" * 16]) == [None]
        a.put(b"k" * 16, turn(999.0, cut=1))
        assert wait_for(lambda: b.get_many([b"x" * 16, b"k" * 16])[1], "the turn in the store") == turn(999.0, cut=1)
        assert a.writes_dropped == 0 and a.outages == 0


def test_keys_are_namespaced_and_expire_and_values_hold_digests_and_counts_only(server: RedisServer) -> None:
    with RedisState(server.url, deadline=PATIENT) as state, server.raw() as raw:
        assert state.wait_until_up(30)
        state.put(b"k" * 16, turn(time.time(), count=1024 + 5))
        wait_for(lambda: raw.exists(turn_key(b"k" * 16)), "the key")
        assert [key.startswith(b"trimflow:v1:turn:") for key in raw.keys("*")] == [True]
        assert 0 < raw.ttl(turn_key(b"k" * 16)) <= MAX_AGE
        # time, cut, turn number and conversation id, then each image's key and CRC-32
        assert raw.strlen(turn_key(b"k" * 16)) == 20 + 1024 * 12


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"x",
        b"\x00" * 11,
        struct.pack(">dII4s", math.nan, 0, 1, b"abcd"),
        struct.pack(">dII4s", 1000.0, 0, 1, b"abcd") + b"y" * 5,
        b"A" * (1 << 20),
        struct.pack(">dII4s", 1000.0, 9, 1, b"abcd"),
        struct.pack(">dII4s", 1000.0, 0, 0xFFFFFFFF, b"abcd"),
    ],
    ids=["empty", "short", "no-images-short", "nan", "ragged-images", "huge", "cut-past-images", "turn-far-ahead"],
)
def test_another_tenants_garbage_is_ignored(server: RedisServer, garbage: bytes) -> None:
    with RedisState(server.url, deadline=PATIENT, clock=lambda: 1000.0) as state, server.raw() as raw:
        assert state.wait_until_up(30)
        raw.set(turn_key(b"k" * 16), garbage)
        raw.set(turn_key(b"j" * 16), struct.pack(">dII4s", 1000.0, 0, 3, b"abcd"))  # a turn with no images: what trimflow writes
        assert state.get_many([b"k" * 16, b"j" * 16]) == [None, LastTurn(1000.0, 0, (), 3, b"abcd")]
        assert state.in_use


def test_a_password_in_the_url_is_refused_without_showing_it() -> None:
    with pytest.raises(StateRefused) as refused:
        checked_url("redis://user:hunter2-secret@cache.internal:6379/0")
    assert "hunter2" not in str(refused.value) and "cache.internal" not in str(refused.value)
    assert "trimflow_state_password_file" in str(refused.value)
    for bad in ("http://cache:6379", "redis://cache:port/0"):
        with pytest.raises(StateRefused):
            checked_url(bad)
    assert checked_url("rediss://team@cache:6380/2") == "rediss://team@cache:6380/2"


def test_the_password_comes_from_a_file_or_the_environment(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("from-file\n")
    assert password_from(str(secret), {PASSWORD_VARIABLE: "from-env"}) == "from-file"
    assert password_from(None, {PASSWORD_VARIABLE: "from-env"}) == "from-env"
    assert password_from("", {}) is None
    with pytest.raises(StateRefused) as refused:
        password_from(str(tmp_path / "missing"), {})
    assert "missing" not in str(refused.value)


def test_a_store_with_a_password_is_used_with_it_and_not_without(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = RedisServer(tmp_path, password="s3cret-pass")
    try:
        with RedisState(server.url, password="s3cret-pass", deadline=PATIENT) as good, caplog.at_level(logging.WARNING, "trimflow"):
            assert good.wait_until_up(30)
            with RedisState(server.url, password="wrong-pass") as wrong:
                wait_for(lambda: wrong.outages, "the refused store's warning")
                assert not wrong.in_use
        assert "s3cret" not in caplog.text and "wrong-pass" not in caplog.text
    finally:
        server.stop()


def test_a_store_that_goes_away_costs_one_warning_and_comes_back_by_itself(server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    with caplog.at_level(logging.WARNING, "trimflow"), RedisState(server.url, deadline=PATIENT, clock=lambda: now[0]) as state:
        assert state.wait_until_up(30)
        state.put(b"k" * 16, turn(999.0))
        wait_for(lambda: state.get_many([b"k" * 16])[0], "the turn in the store")
        server.stop()
        # The read finds its connection closed and reads nothing; the thread finds the store gone, and warns.
        wait_for(lambda: not state.get_many([b"k" * 16])[0] and not state.in_use and state.outages == 1, "the store given up")
        for _ in range(50):  # every request meanwhile reads nothing, writes nothing, and raises nothing
            assert state.get_many([b"k" * 16]) == [None]
            state.put(b"k" * 16, turn(999.5))
        assert state.outages == 1
        server.start()
        assert state.wait_until_up(60)
        state.put(b"k" * 16, turn(999.9))
        assert wait_for(lambda: state.get_many([b"k" * 16])[0], "the turn in the store again") == turn(999.9)
    lines = [r.getMessage() for r in caplog.records if r.name == "trimflow"]
    assert len([m for m in lines if "not answering" in m]) == 1, lines
    assert len([m for m in lines if "answers again" in m]) == 1, lines


def numbered(sent_at: float, number: int, conversation: bytes = b"abcd") -> LastTurn:
    return turn(sent_at)._replace(turn=number, conversation=conversation)


def test_an_older_turn_written_late_never_replaces_a_newer_one_of_its_conversation(server: RedisServer) -> None:
    """Each instance writes its turns from a queue of its own: instance b's turn 4 can reach the store after instance
    a's turn 5. The store keeps turn 5; a later turn, the same turn sent later, or another conversation given the row
    (the least recently sent gives way) is written."""
    row = b"k" * 16
    with RedisState(server.url, deadline=PATIENT, clock=lambda: 1100.0) as a, RedisState(server.url, deadline=PATIENT, clock=lambda: 1100.0) as b:
        assert a.wait_until_up(30) and b.wait_until_up(30)

        def write(state: RedisState, last: LastTurn) -> LastTurn | None:
            state.put(row, last)
            assert state.drained(30) and state.in_use
            return state.get_many([row])[0]

        assert write(a, numbered(1005.0, 5)) == numbered(1005.0, 5)
        assert write(b, numbered(1004.0, 4)) == numbered(1005.0, 5)  # late: not written
        assert write(b, numbered(1003.0, 5)) == numbered(1005.0, 5)  # the same turn, sent earlier
        assert write(b, numbered(1006.0, 5)) == numbered(1006.0, 5)  # the same turn, sent later (a retry)
        assert write(b, numbered(1007.0, 6)) == numbered(1007.0, 6)
        assert write(a, numbered(1008.0, 1, b"wxyz")) == numbered(1008.0, 1, b"wxyz")  # another conversation takes the row
        with server.raw() as raw:
            assert 0 < raw.ttl(turn_key(row)) <= MAX_AGE
        assert a.writes_dropped == b.writes_dropped == 0


def test_two_memories_sharing_the_store_recall_and_number_each_turn_as_one_memory_would(server: RedisServer) -> None:
    """Turns alternate between two processes' memories, as behind a round-robin balancer on two hosts: they recall
    what one memory recalls, and number the conversation's turns 1, 2, 3 under one id (apart: 1, 1, 2, 2)."""
    keys = [image_key(Media("image", (), f"{i:04d}" * 800)) for i in range(8)]
    now = [time.time()]
    one = Conversations(clock=lambda: now[0])
    with RedisState(server.url, deadline=PATIENT, clock=lambda: now[0]) as a, RedisState(server.url, deadline=PATIENT, clock=lambda: now[0]) as b:
        assert a.wait_until_up(30) and b.wait_until_up(30)
        pair = [Conversations(clock=lambda: now[0], shared=a), Conversations(clock=lambda: now[0], shared=b)]
        apart = [Conversations(clock=lambda: now[0]), Conversations(clock=lambda: now[0])]
        numbered, numbered_apart = [], []
        for number in range(1, 9):
            now[0] += 5.0
            history = line(number, keys[:number])
            expected = one.recall(history)
            found = pair[number % 2].recall(history)
            assert (found is None) == (expected is None), number
            if expected is not None:  # where the cut ended, how long ago, the order of arrival
                assert found is not None and (found.cut, found.idle, found.order) == (expected.cut, expected.idle, expected.order), number
            order = expected.order if expected is not None and expected.order is not None else tuple(range(number))
            cut = order[: number // 3]  # the first in the order one memory recalls
            one.assign(history, TURN, cut)
            assigned = pair[number % 2].assign(history, TURN, cut)
            numbered.append((assigned.conversation, assigned.turn))
            assigned = apart[number % 2].assign(history, TURN, cut)
            numbered_apart.append((assigned.conversation, assigned.turn))
            assert (a if number % 2 == 0 else b).drained(30)
        assert a.writes_dropped == b.writes_dropped == 0
    assert [turn for _, turn in numbered] == list(range(1, 9)) and len({cid for cid, _ in numbered}) == 1
    assert [turn for _, turn in numbered_apart] == [1, 1, 2, 2, 3, 3, 4, 4] and len({cid for cid, _ in numbered_apart}) == 2


# --- learned limits in the store ----------------------------------------------------------------------------------

UPSTREAM = "https://api.example:443"


def test_a_limit_one_instance_learns_applies_on_the_others_next_round(server: RedisServer) -> None:
    a = LearnedLimits(None, store=LearnedInStore(server.url))
    b = LearnedLimits(None, store=LearnedInStore(server.url))
    a.sync(), b.sync()
    assert b.tighten(UPSTREAM, "m", Limits(max_images=8)).max_images == 8
    a.learn(UPSTREAM, "m", {"max_images": 4}, "a 400")
    b.learn(UPSTREAM, None, {"max_body_bytes": 1 << 20}, "a 413")  # learned at once elsewhere: neither is lost
    a.sync(), b.sync(), a.sync()
    for each in (a, b):
        tightened = each.tighten(UPSTREAM, "m", Limits(max_images=8, max_body_bytes=4 << 20))
        assert (tightened.max_images, tightened.max_body_bytes) == (4, 1 << 20)
    with server.raw() as raw:
        assert 0 < raw.ttl(LEARNED) <= DEFAULT_TTL + 1
        assert b"a 400" in raw.get(LEARNED)  # the source line of the file, as the file would hold it


@pytest.mark.parametrize(
    "garbage",
    [b"\xff\xfe", b"[1, 2", b'{"learned": [{"upstream": "x"}]}', b"a: &a [*a, *a, *a]", b'{"learned": 1}'],
    ids=["not-utf8", "not-json", "not-an-entry", "yaml-alias", "wrong-type"],
)
def test_learned_limits_another_tenant_wrote_are_never_used_nor_written_over(
    server: RedisServer, garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with server.raw() as raw:
        raw.set(LEARNED, garbage)
        learned = LearnedLimits(None, store=LearnedInStore(server.url))
        with caplog.at_level(logging.WARNING, "trimflow"):
            learned.sync()
            learned.learn(UPSTREAM, "m", {"max_images": 4}, "a 400")
            learned.sync()
            learned.sync()
        assert raw.get(LEARNED) == garbage
        assert learned.tighten(UPSTREAM, "m", Limits(max_images=8)).max_images == 4  # kept in memory
        assert len([r for r in caplog.records if "shared state" in r.getMessage()]) == 1


def test_a_store_that_stops_answering_costs_reads_their_deadline_then_none_until_it_answers(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A store that hangs (SIGSTOP: connected, never answering), as a slow or swapped-out server: a read waits at most
    its deadline, then the store is given up with one warning and reads wait on nothing; it answers again, and the
    thread takes it back by itself."""
    assert server.process is not None
    with caplog.at_level(logging.WARNING, "trimflow"), RedisState(server.url, deadline=0.05) as state:
        assert state.wait_until_up(30)
        state.put(b"k" * 16, turn(time.time()))
        assert state.drained(30)
        server.process.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: state.get_many([b"k" * 16]) == [None] and state.outages == 1, "the hung store given up")
            for _ in range(20):
                assert state.get_many([b"k" * 16]) == [None] and not state.in_use
        finally:
            server.process.send_signal(signal.SIGCONT)
        assert state.wait_until_up(60)
        assert wait_for(lambda: state.get_many([b"k" * 16])[0], "the turn read again") is not None
        assert state.outages == 1


class DripProxy:
    """A Unix socket in front of the redis-server's: what the client sends goes at once; with `drip` set, the server's
    answers come a byte at a time, DRIP seconds apart (a store on a congested link, or one that means to hold a reader)."""

    DRIP = 0.002

    def __init__(self, workdir: Path, target: Path) -> None:
        self.path, self.target = workdir / "drip.sock", target
        self.drip = threading.Event()
        self.closed = threading.Event()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        self.listener.listen(16)
        self.url = f"unix://{self.path}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(str(self.target))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if answers and self.drip.is_set():
                    for i in range(len(data)):
                        sink.sendall(data[i : i + 1])
                        self.closed.wait(self.DRIP)
                else:
                    sink.sendall(data)
        for each in (source, sink):
            with contextlib.suppress(OSError):
                each.shutdown(socket.SHUT_RDWR)
        source.close()  # each socket is one pump's source

    def close(self) -> None:
        self.closed.set()
        self.listener.close()


def test_a_read_ends_by_its_deadline_though_the_store_answers_a_byte_at_a_time(server: RedisServer, tmp_path: Path) -> None:
    """Each socket call of the read waits far less than the deadline, the read as a whole far more: it reads nothing
    (the deadline is the whole read's), and the store is taken back once it answers at its pace again."""
    drip = DripProxy(tmp_path, server.socket)
    try:
        with RedisState(drip.url, deadline=0.05) as state:
            assert state.wait_until_up(30)
            state.put(b"k" * 16, turn(time.time()))
            assert state.drained(30) and wait_for(lambda: state.get_many([b"k" * 16])[0], "the turn read")
            drip.drip.set()  # an answer of 4 rows is over 50 bytes: over 0.1 s in all, 2 ms a call
            assert state.get_many([b"k" * 16, b"j" * 16, b"l" * 16, b"m" * 16]) == [None] * 4
            drip.drip.clear()
            assert wait_for(lambda: state.get_many([b"k" * 16])[0], "the turn read again") is not None
    finally:
        drip.close()


def test_no_read_waits_on_a_reconnection(server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """The store restarts while the instance is idle: the next read finds its connection closed and reads nothing,
    rather than connect on the request path; the thread connects again, and the store was never missing long enough
    to warn about."""
    with caplog.at_level(logging.WARNING, "trimflow"), RedisState(server.url, deadline=PATIENT) as state:
        assert state.wait_until_up(30)
        state.put(b"k" * 16, turn(time.time()))
        assert state.drained(30) and wait_for(lambda: state.get_many([b"k" * 16])[0], "the turn read")
        server.stop()
        server.start()
        assert state.get_many([b"k" * 16]) == [None] and state.unready_reads == 1
        state.put(b"k" * 16, turn(time.time()))  # dropped, or written once the thread is back
        assert state.wait_until_up(30)
        state.put(b"k" * 16, turn(time.time()))
        assert state.drained(30) and wait_for(lambda: state.get_many([b"k" * 16])[0], "a turn read on the thread's connection")
        assert state.unready_reads == 1 and state.outages == 0
    assert not [r for r in caplog.records if r.name == "trimflow"]


def test_more_reads_at_once_than_connections_go_without_and_cost_no_outage(server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """Reads on worker threads at once: past FRONT_CONNECTIONS a read reads nothing rather than connect, and the store
    stays in use."""
    with caplog.at_level(logging.WARNING, "trimflow"), RedisState(server.url, deadline=PATIENT) as state:
        assert state.wait_until_up(30)
        state.put(b"k" * 16, turn(time.time()))
        assert state.drained(30)
        pool = state._front.connection_pool
        held = [pool.get_connection() for _ in range(FRONT_CONNECTIONS)]  # as reads in flight would hold them
        try:
            assert state.get_many([b"k" * 16]) == [None] and state.unready_reads == 1 and state.in_use
        finally:
            for connection in held:
                pool.release(connection)
        assert state.get_many([b"k" * 16])[0] is not None
        assert state.outages == 0 and state.unready_reads == 1
    assert not [r for r in caplog.records if r.name == "trimflow"]


def test_a_full_store_costs_one_warning_and_reads_go_on(server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """Full with no eviction (maxmemory below what it holds): the store answers and refuses each write. One warning
    for the lot, no outage (reads go on), and the next write it takes is written; full again, one more warning."""
    row = b"k" * 16
    with caplog.at_level(logging.WARNING, "trimflow"), RedisState(server.url, deadline=PATIENT) as state, server.raw() as raw:
        assert state.wait_until_up(30)
        state.put(row, numbered(time.time(), 1))
        assert state.drained(30)
        raw.config_set("maxmemory-policy", "noeviction")
        raw.config_set("maxmemory", "1")
        try:
            for number in range(2, 6):
                state.put(row, numbered(time.time(), number))
                assert state.drained(30)
                last = state.get_many([row])[0]
                assert state.in_use and last is not None and last.turn == 1  # read, and not written over
        finally:
            raw.config_set("maxmemory", "0")
        state.put(row, numbered(time.time(), 6))
        assert state.drained(30) and wait_for(lambda: state.get_many([row])[0], "the turn written").turn == 6
        raw.config_set("maxmemory", "1")
        try:
            state.put(row, numbered(time.time(), 7))
            assert state.drained(30)
        finally:
            raw.config_set("maxmemory", "0")
        assert state.outages == 0 and state.writes_dropped == 5
    lines = [r.getMessage() for r in caplog.records if r.name == "trimflow"]
    assert len(lines) == 2 and all("refused to keep a turn (OutOfMemoryError)" in line for line in lines), lines


# --- send-once's files -------------------------------------------------------------------------------------------

TENANT, OTHER_TENANT, IMAGE = b"t" * 16, b"o" * 16, b"i" * 16


def test_a_file_one_instance_puts_is_what_the_other_gets_for_the_same_tenant_and_image_only(server: RedisServer) -> None:
    now = [1000.0]
    with RedisState(server.url, deadline=PATIENT, clock=lambda: now[0]) as a, RedisState(server.url, deadline=PATIENT, clock=lambda: now[0]) as b:
        assert a.wait_until_up(30) and b.wait_until_up(30)
        assert b.get_files(TENANT, [IMAGE]) == [None]
        a.put_file(TENANT, IMAGE, "file_011CNha8iCJcU1wXNR6q4V8w", 1060.0)
        assert a.drained(30)
        assert b.get_files(TENANT, [b"j" * 16, IMAGE]) == [None, StoredFile("file_011CNha8iCJcU1wXNR6q4V8w", 1060.0)]
        assert b.get_files(OTHER_TENANT, [IMAGE]) == [None]
        now[0] = 1060.0
        assert b.get_files(TENANT, [IMAGE]) == [None]  # its time has passed (the key expires then too)


def test_a_files_key_names_digests_expires_with_its_time_and_holds_the_time_and_id_only(server: RedisServer) -> None:
    with RedisState(server.url, deadline=PATIENT) as state, server.raw() as raw:
        assert state.wait_until_up(30)
        state.put_file(TENANT, IMAGE, "file-abc123", time.time() + 120)
        state.put_file(TENANT, b"j" * 16, "file-gone", time.time() - 1)  # its time passed: never written
        assert state.drained(30)
        assert raw.keys("*") == [file_key(TENANT, IMAGE)] == [b"trimflow:v1:file:" + b"74" * 16 + b":" + b"69" * 16]
        assert 0 < raw.pttl(file_key(TENANT, IMAGE)) <= 120_000
        assert raw.get(file_key(TENANT, IMAGE))[8:] == b"file-abc123" and raw.strlen(file_key(TENANT, IMAGE)) == 8 + 11


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        struct.pack(">d", 2000.0),
        struct.pack(">d", 2000.0) + b"file_" + b"a" * 200,
        struct.pack(">d", 2000.0) + b"A" * (1 << 20),
        struct.pack(">d", 2000.0) + b"file_\xc3\xa9",
        struct.pack(">d", 2000.0) + b"abc_123",
        struct.pack(">d", 2000.0) + b'file_a","type":"base64',
        struct.pack(">d", 2000.0) + b"file_a\n",
        struct.pack(">d", math.nan) + b"file_a",
        struct.pack(">d", math.inf) + b"file_a",
        struct.pack(">d", 999.0) + b"file_a",
    ],
    ids=["empty", "no-id", "id-too-long", "huge", "not-ascii", "not-a-file-id", "json", "newline", "nan", "forever", "past"],
)
def test_a_file_value_not_what_trimflow_writes_is_ignored(server: RedisServer, garbage: bytes) -> None:
    with RedisState(server.url, deadline=PATIENT, clock=lambda: 1000.0) as state, server.raw() as raw:
        assert state.wait_until_up(30)
        raw.set(file_key(TENANT, IMAGE), garbage)
        raw.set(file_key(TENANT, b"j" * 16), struct.pack(">d", 2000.0) + b"file_" + b"a" * 195)  # the longest taken
        assert state.get_files(TENANT, [IMAGE, b"j" * 16]) == [None, StoredFile("file_" + "a" * 195, 2000.0)]
        assert state.in_use


def test_a_files_entry_is_forgotten_only_while_it_names_that_file(server: RedisServer) -> None:
    with RedisState(server.url, deadline=PATIENT) as a, RedisState(server.url, deadline=PATIENT) as b, server.raw() as raw:
        assert a.wait_until_up(30) and b.wait_until_up(30)
        a.put_file(TENANT, IMAGE, "file_a", time.time() + 60)
        assert a.drained(30)
        b.put_file(TENANT, IMAGE, "file_b", time.time() + 60)  # another instance's upload of the same image, since
        assert b.drained(30)
        a.forget_file(TENANT, IMAGE, "file_a")
        assert a.drained(30)
        assert raw.get(file_key(TENANT, IMAGE))[8:] == b"file_b"
        b.forget_file(TENANT, IMAGE, "file_")  # a prefix of the id is not the id
        b.forget_file(TENANT, IMAGE, "file_b")  # the latest word on a key is the one written
        assert b.drained(30)
        assert raw.keys("*") == []


def test_while_the_store_is_down_files_are_neither_read_nor_written(tmp_path: Path) -> None:
    with RedisState(f"unix://{tmp_path}/nothing.sock", deadline=PATIENT) as state:
        assert not state.wait_until_up(0.2)
        assert state.get_files(TENANT, [IMAGE]) == [None]
        state.put_file(TENANT, IMAGE, "file_a", time.time() + 60)
        state.forget_file(TENANT, IMAGE, "file_a")
        assert state.writes_dropped == 2 and state.drained(0)


def test_the_user_deployment_md_gives_trimflow_may_share_turns_and_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    documented = (Path(__file__).parent.parent / "docs" / "deployment.md").read_text()
    (user,) = [line.strip() for line in documented.splitlines() if line.strip().startswith("user trimflow on ")]
    acl = tmp_path / "users.acl"
    acl.write_text("user default on nopass ~* &* +@all\n" + user.replace(">a-long-random-password", ">team-secret") + "\n")
    server = RedisServer(tmp_path, args=("--aclfile", str(acl)))
    try:
        with caplog.at_level(logging.WARNING, "trimflow"), RedisState(f"unix://trimflow@{server.socket}", "team-secret", deadline=PATIENT) as state:
            assert state.wait_until_up(30)
            state.put(b"k" * 16, turn(time.time()))
            state.put_file(TENANT, IMAGE, "file_a", time.time() + 60)
            assert state.drained(30)
            assert state.get_many([b"k" * 16])[0] is not None and state.get_files(TENANT, [IMAGE])[0] is not None
            state.forget_file(TENANT, IMAGE, "file_a")
            assert state.drained(30)
            assert state.get_files(TENANT, [IMAGE]) == [None]
        assert state.writes_dropped == 0 and not caplog.records
    finally:
        server.stop()
