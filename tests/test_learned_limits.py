"""The learned-limits store (trimflow._learned_limits): tighten-only, per upstream and model, floors, expiry, bounds; the file
a person edits, read and written in the store's own thread only, under a lock it never waits on, never written over
when it cannot be read, followed through a link; and the engine's `tighten` hook that applies it before pruning."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from trimflow import Limits, RulesError, builtin_rules, prune
from trimflow._learned_limits import FLOORS, MAX_ENTRIES, MAX_PER_UPSTREAM, Entry, LearnedLimits, bounded, load_learned, upstream_key
from trimflow.testing import image, session_body

from .helpers import held_by_another_process, wait_for

COPILOT = upstream_key("https", "API.githubcopilot.com", 443)
SOURCE = "400 copilot-gemini-count"
H = upstream_key("https", "h.example.com", 443)
H2 = upstream_key("https", "h2.example.com", 443)


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def started() -> Iterator[Callable[..., LearnedLimits]]:
    """Stores whose worker thread runs, closed at the end of the test."""
    stores: list[LearnedLimits] = []

    def start(path: Path, **kwargs: object) -> LearnedLimits:
        store = LearnedLimits(path, **kwargs)  # type: ignore[arg-type]
        assert store.start(wait=10)
        stores.append(store)
        return store

    yield start
    for store in stores:
        store.close()


def test_the_upstream_key_names_scheme_host_and_port() -> None:
    assert COPILOT == "https://api.githubcopilot.com:443"
    assert upstream_key("http", "127.0.0.1", 8001) != upstream_key("http", "127.0.0.1", 8002)
    assert upstream_key("HTTP", "::1", 80) == "http://[::1]:80"


def test_a_learned_limit_tightens_its_upstream_and_model_only() -> None:
    learned = LearnedLimits(None)
    learned.learn(COPILOT, "gemini-3.1-pro-preview", {"max_images": 10}, SOURCE)
    rule = Limits(max_images=20)
    assert learned.tighten(COPILOT, "Gemini-3.1-pro-preview", rule).max_images == 10
    assert learned.tighten(COPILOT, "claude-sonnet-4", rule).max_images == 20
    assert learned.tighten(COPILOT, None, rule).max_images == 20
    assert learned.tighten(upstream_key("https", "api.githubcopilot.com", 8443), "gemini-3.1-pro-preview", rule) is rule
    assert learned.tighten(upstream_key("http", "api.githubcopilot.com", 443), "gemini-3.1-pro-preview", rule) is rule


def test_an_upstream_wide_limit_holds_for_every_model() -> None:
    learned = LearnedLimits(None)
    learned.learn("https://backend.example.com:443", None, {"max_body_bytes": 2 * 2**20}, "413 bare-413")
    assert learned.tighten("https://backend.example.com:443", "any-model", Limits()).max_body_bytes == 2 * 2**20
    assert learned.tighten("https://backend.example.com:443", None, Limits(max_body_bytes=16 * 2**20)).max_body_bytes == 2 * 2**20


def test_learned_limits_only_tighten() -> None:
    learned = LearnedLimits(None)
    learned.learn(H, None, {"max_images": 10}, "s")
    assert learned.tighten(H, None, Limits(max_images=8)).max_images == 8  # the rule is tighter: kept
    assert learned.learn(H, None, {"max_images": 12}, "s") == []  # a looser figure never replaces a tighter one
    assert [e.value for e in learned.entries] == [10]
    assert [e.value for e in learned.learn(H, None, {"max_images": 5}, "s")] == [5]
    assert learned.tighten(H, None, Limits(max_images=8)).max_images == 5


def test_the_many_image_side_comes_with_a_threshold() -> None:
    learned = LearnedLimits(None)
    learned.learn(H, "claude-x", {"many_images_max_side": 2000}, "s")
    limits = learned.tighten(H, "claude-x", Limits())
    assert (limits.many_images_threshold, limits.many_images_max_side) == (0, 2000)


@pytest.mark.parametrize(
    ("limit", "value"),
    [
        ("max_images", 0),
        ("keep_recent", 0),
        ("max_body_bytes", 65535),
        ("max_image_side", 255),
        ("many_images_max_side", 16),
        ("max_image_bytes", 1024),
    ],
)
def test_nothing_is_learned_under_a_floor(limit: str, value: int) -> None:
    learned = LearnedLimits(None)
    with pytest.raises(ValueError, match="under the floor"):
        learned.learn(H, None, {limit: value}, "s")
    assert learned.entries == ()
    assert learned.learn(H, None, {limit: FLOORS[limit]}, "s")  # the floor itself may be learned


def test_an_entry_expires_after_its_time_to_live() -> None:
    clock = Clock()
    learned = LearnedLimits(None, ttl=3600, clock=clock)
    learned.learn(H, None, {"max_images": 4}, "s")
    clock.now += 3599
    assert learned.tighten(H, None, Limits()).max_images == 4
    clock.now += 1
    assert learned.tighten(H, None, Limits()).max_images is None
    assert learned.live() == ()
    assert learned.learn(H, None, {"max_images": 6}, "s")  # an expired entry is learned again, looser or not
    assert learned.tighten(H, None, Limits()).max_images == 6


def test_one_upstream_flooding_model_names_never_pushes_another_out() -> None:
    clock = Clock()
    learned = LearnedLimits(None, clock=clock)
    learned.learn("https://good.example.com:443", "m", {"max_images": 4}, "s")
    for i in range(3 * MAX_PER_UPSTREAM):
        clock.now += 1
        learned.learn("https://flood.example.com:443", f"model-{i}", {"max_images": 4}, "s")
    by_upstream = [e.upstream for e in learned.entries]
    assert by_upstream.count("https://flood.example.com:443") == MAX_PER_UPSTREAM
    assert learned.tighten("https://good.example.com:443", "m", Limits()).max_images == 4
    assert learned.tighten("https://flood.example.com:443", f"model-{3 * MAX_PER_UPSTREAM - 1}", Limits()).max_images == 4  # newest kept
    assert learned.tighten("https://flood.example.com:443", "model-0", Limits()).max_images is None  # oldest gone


def test_the_total_bound_takes_from_the_largest_upstream() -> None:
    entries = [
        Entry(f"https://u{i}.example.com:443", f"m{j}", "max_images", 4, "s", f"2026-11-0{1 + j % 9}T00:00:00.000Z")
        for i in range(40)
        for j in range(30)
    ]
    entries.append(Entry("https://small.example.com:443", None, "max_images", 4, "s", "2020-01-01T00:00:00.000Z"))
    kept = bounded(entries)
    assert len(kept) == MAX_ENTRIES
    assert any(e.upstream == "https://small.example.com:443" for e in kept.values())  # the oldest, but alone at its upstream


def test_the_file_is_owner_only_readable_yaml(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "learned.yaml"
    learned = LearnedLimits(path)
    learned.learn(COPILOT, "gemini-3.1-pro-preview", {"max_images": 10}, SOURCE)
    learned.sync()
    text = path.read_text()
    assert text.startswith("# Limits trimflow learned")
    assert f"upstream: {COPILOT}\n" in text and "model: gemini-3.1-pro-preview\n" in text
    assert "limit: max_images\n" in text and "value: 10\n" in text and f"source: {SOURCE}\n" in text
    assert re.search(r"learned: '\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z'", text)
    assert path.stat().st_mode & 0o777 == 0o600
    (entry,) = load_learned(path)
    assert (entry.upstream, entry.model, entry.limit, entry.value, entry.source) == (COPILOT, "gemini-3.1-pro-preview", "max_images", 10, SOURCE)
    assert [p.name for p in path.parent.iterdir()] == ["learned.yaml"]  # no temporary file left behind


def test_learning_does_no_file_work_in_the_callers_thread(tmp_path: Path) -> None:
    path = tmp_path / "learned.yaml"
    learned = LearnedLimits(path)  # no worker started: only `sync` would write
    learned.learn(H, None, {"max_images": 4}, "s")
    assert not path.exists()
    assert learned.tighten(H, None, Limits()).max_images == 4  # applies at once, from memory
    learned.sync()
    assert [e.value for e in load_learned(path)] == [4]


def test_a_second_store_reads_what_the_first_learned(tmp_path: Path, started: Callable[..., LearnedLimits]) -> None:
    path = tmp_path / "learned.yaml"
    first = LearnedLimits(path)
    first.learn(H, "m", {"max_images": 4}, "s")
    first.sync()
    assert started(path).tighten(H, "m", Limits()).max_images == 4  # read before start returns


def test_a_write_merges_what_another_process_wrote_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / "learned.yaml"
    first, second = LearnedLimits(path), LearnedLimits(path)
    first.learn("https://a.example.com:443", None, {"max_body_bytes": 1_000_000}, "s")
    second.learn("https://b.example.com:443", None, {"max_images": 3}, "s")
    first.sync()
    second.sync()
    assert {(e.upstream, e.limit) for e in load_learned(path)} == {
        ("https://a.example.com:443", "max_body_bytes"),
        ("https://b.example.com:443", "max_images"),
    }
    first.sync()
    assert first.tighten("https://b.example.com:443", None, Limits()).max_images == 3


def test_an_edit_is_picked_up_and_a_deleted_file_forgets(tmp_path: Path, started: Callable[..., LearnedLimits]) -> None:
    path = tmp_path / "learned.yaml"
    learned = started(path, check_interval=0.05)
    learned.learn(H, None, {"max_images": 4}, "s")
    wait_for(lambda: path.exists() and "value: 4" in path.read_text(), "the entry written")
    path.write_text(path.read_text().replace("value: 4", "value: 6"))
    wait_for(lambda: learned.tighten(H, None, Limits()).max_images == 6, "the edit applied")  # a person may loosen what was learned
    path.unlink()
    wait_for(lambda: learned.tighten(H, None, Limits()).max_images is None, "the deleted file forgotten")


def test_a_file_that_cannot_be_parsed_is_never_written_over(
    tmp_path: Path, started: Callable[..., LearnedLimits], caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "learned.yaml"
    typo = "learned:\n- upstream: https://a.example.com:443\n  limit: max_images\n  value: 4\n  model: [oops\n"
    path.write_text(typo)
    with caplog.at_level(logging.WARNING, "trimflow"):
        learned = started(path, check_interval=0.05)
        for i in range(5):
            learned.learn(H, f"m{i}", {"max_images": 4}, "s")
            learned.sync()
    assert path.read_text() == typo
    assert learned.tighten(H, "m3", Limits()).max_images == 4  # kept in memory
    said = [r.getMessage() for r in caplog.records if "YAML syntax error" in r.getMessage()]
    assert len(said) == 1 and "left as it is" in said[0], said  # once, not once per learn


def test_a_link_is_followed_so_a_shared_file_stays_shared(tmp_path: Path) -> None:
    shared = tmp_path / "shared" / "learned.yaml"
    shared.parent.mkdir()
    link = tmp_path / "conf" / "learned.yaml"
    link.parent.mkdir()
    link.symlink_to(shared)
    learned = LearnedLimits(link)
    learned.learn(H, None, {"max_images": 4}, "s")
    learned.sync()
    assert link.is_symlink() and os.readlink(link) == str(shared)
    assert [e.value for e in load_learned(shared)] == [4]
    assert sorted(p.name for p in link.parent.iterdir()) == ["learned.yaml"] and sorted(p.name for p in shared.parent.iterdir()) == ["learned.yaml"]


def test_a_fifo_is_never_opened_for_reading(tmp_path: Path, started: Callable[..., LearnedLimits], caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "learned.yaml"
    os.mkfifo(path)
    with caplog.at_level(logging.WARNING, "trimflow"):
        learned = started(path)  # a blocking open would never return: start() waits for the first read
        learned.learn(H, None, {"max_images": 4}, "s")
        learned.sync()
    assert learned.tighten(H, None, Limits()).max_images == 4
    assert path.is_fifo()
    assert "not a regular file" in caplog.text


def test_a_lock_held_by_another_process_delays_the_write_never_the_learn(tmp_path: Path, started: Callable[..., LearnedLimits]) -> None:
    path = tmp_path / "learned.yaml"
    path.write_text("")
    with held_by_another_process(path):
        learned = started(path, check_interval=0.05)
        learned.learn(H, None, {"max_images": 4}, "s")  # returns while the lock is held: no file work here
        assert learned.tighten(H, None, Limits()).max_images == 4
        learned.sync()  # gives up on the lock after its patience, with the entry still pending
        assert path.read_text() == ""
    wait_for(lambda: [e.value for e in load_learned(path)] == [4], "the entry written once the lock was free")


def test_legacy_and_under_floor_entries_are_ignored_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "learned.yaml"
    path.write_text(
        "learned:\n"
        "- {host: api.openai.com, model: null, limit: max_images, value: 0}\n"
        "- {upstream: 'https://api.openai.com:443', model: null, limit: max_images, value: 0}\n"
        "- {upstream: 'https://api.openai.com:443', model: gpt-4o, limit: max_images, value: 10}\n"
    )
    with caplog.at_level(logging.WARNING, "trimflow"):
        learned = LearnedLimits(path)
        learned.sync()
    assert [(e.model, e.value) for e in learned.entries] == [("gpt-4o", 10)]
    assert "1 entries keyed by a host name alone are ignored" in caplog.text
    assert "1 entries under the floors" in caplog.text


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("learned:\n  - {upstream: 'http://h:1', limit: max_image, value: 3}\n", ":2: limit must be one of max_images"),
        ("learned:\n  - {upstream: 'http://h:1', limit: max_images}\n", ":2: a learned limit has no value"),
        ("learned:\n  - {upstream: 'http://h:1', limit: max_images, value: -1}\n", ":2: value of max_images must be a whole number"),
        ("learned:\n  - {upstream: h, limit: max_images, value: 3}\n", ":2: upstream must be scheme://host:port"),
        ("learned:\n  - {upstream: 'http://h:1', limit: max_images, value: 3, why: x}\n", ":2: unknown field 'why' in a learned limit"),
        ("learn: []\n", ":1: unknown top-level key 'learn'"),
    ],
)
def test_a_bad_file_names_its_line(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "learned.yaml"
    path.write_text(text)
    with pytest.raises(RulesError, match=re.escape(problem)):
        load_learned(path)


def test_an_empty_or_missing_file_has_no_entries(tmp_path: Path, started: Callable[..., LearnedLimits]) -> None:
    assert started(tmp_path / "missing.yaml").entries == ()
    (tmp_path / "empty.yaml").write_text("")
    assert started(tmp_path / "empty.yaml").entries == ()


def test_ten_thousand_entries_are_read_and_bounded(tmp_path: Path) -> None:
    path = tmp_path / "learned.yaml"
    lines = ["learned:"]
    for i in range(10_000):
        upstream, when = f"https://u{i % 50}.example.com:443", "2026-11-20T00:00:00.000Z"
        lines.append(f"- {{upstream: '{upstream}', model: 'model-{i}', limit: max_images, value: 4, learned: '{when}'}}")
    path.write_text("\n".join(lines) + "\n")
    learned = LearnedLimits(path)
    learned.sync()
    assert len(learned.entries) == min(MAX_ENTRIES, 50 * MAX_PER_UPSTREAM)
    learned.learn(H, None, {"max_images": 4}, "s")
    learned.sync()
    assert len(load_learned(path)) <= MAX_ENTRIES  # the file is bounded at its next write


def test_the_engine_applies_learned_limits_and_the_record_says_which() -> None:
    body = orjson.dumps(session_body("openai-chat", 6, image(32, 24, "PNG"), "image/png", "gpt-4o"))
    rules = builtin_rules()
    target = rules.target("api.example.com", "/v1/chat/completions")
    assert target is not None
    untouched = prune(target, {}, body, rules)
    assert untouched.record is not None and untouched.record.images_after == 6 and untouched.record.learned_limits is None
    learned = LearnedLimits(None)
    learned.learn("https://api.example.com:443", "gpt-4o", {"max_images": 2}, "s")

    def tighten(model: str | None, limits: Limits) -> Limits:
        return learned.tighten("https://api.example.com:443", model, limits)

    outcome = prune(target, {}, body, rules, tighten=tighten)
    assert outcome.record is not None and (outcome.record.images_before, outcome.record.images_after) == (6, 2)
    assert outcome.record.learned_limits == "max_images=2"
    assert "learned: max_images=2" in outcome.record.log_line()
    other = prune(target, {}, body.replace(b'"gpt-4o"', b'"gpt-4.1"'), rules, tighten=tighten)
    assert other.record is not None and other.record.images_after == 6 and other.record.learned_limits is None


# Several trimflow processes behind one balancer share the file: each learns on its own, at any moment.
_LEARNER = """\
import sys
from trimflow._learned_limits import LearnedLimits

path, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
learned = LearnedLimits(path)
for i in range(count):
    learned.learn(f"https://{name}-{i}.example.com:443", None, {"max_images": 5}, "s")
    learned.sync()
"""


def test_processes_learning_at_once_keep_every_entry(tmp_path: Path) -> None:
    """Each write reads the file and replaces it under a lock on it: no process's entry is lost to another's
    write in between (without the lock, two read-merge-replace cycles that overlap drop one side's entry)."""
    path = tmp_path / "learned.yaml"
    script = tmp_path / "learner.py"
    script.write_text(_LEARNER)
    names, count = ("a", "b", "c"), 20
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    workers = [subprocess.Popen([sys.executable, str(script), str(path), name, str(count)], env=env) for name in names]
    assert [w.wait(120) for w in workers] == [0] * len(names)
    upstreams = {entry.upstream for entry in load_learned(path)}
    assert upstreams == {f"https://{name}-{i}.example.com:443" for name in names for i in range(count)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["learned.yaml", "learner.py"]  # no temporary file left behind


def test_a_limit_another_process_learned_applies_here(tmp_path: Path, started: Callable[..., LearnedLimits]) -> None:
    path = tmp_path / "learned.yaml"
    here, there = started(path, check_interval=0.05), started(path, check_interval=0.05)
    assert here.tighten(H, None, Limits()).max_images is None
    there.learn(H, None, {"max_images": 3}, "s")
    wait_for(lambda: here.tighten(H, None, Limits()).max_images == 3, "the other process's limit applied here")


def test_a_new_version_of_the_file_keeps_its_permissions(tmp_path: Path) -> None:
    path = tmp_path / "learned.yaml"
    first = LearnedLimits(path)
    first.learn(H, None, {"max_images": 4}, "s")
    first.sync()
    path.chmod(0o660)  # shared by a group of service accounts
    second = LearnedLimits(path)
    second.learn(H2, None, {"max_images": 4}, "s")
    second.sync()
    assert path.stat().st_mode & 0o777 == 0o660


def test_close_writes_what_is_pending(tmp_path: Path) -> None:
    path = tmp_path / "learned.yaml"
    learned = LearnedLimits(path, check_interval=3600)
    assert learned.start()
    learned.learn(H, None, {"max_images": 4}, "s")
    learned.close()
    assert [e.value for e in load_learned(path)] == [4]
