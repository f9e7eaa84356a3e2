"""The learned-limits store (trimflow._learned): tighten-only, per host and model, a file a person edits, atomic
replace, merge on write, reload on change; and the engine's `tighten` hook that applies it before pruning."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from trimflow import Limits, RulesError, builtin_rules, prune
from trimflow._learned import LearnedLimits, load_learned
from trimflow.testing import image, session_body

SOURCE = "400 copilot-gemini-count: too many images: maximum allowed for model gemini-3.1-pro-preview is 10, got 11"


def test_a_learned_limit_tightens_its_host_and_model_only() -> None:
    learned = LearnedLimits(None)
    learned.learn("API.githubcopilot.com", "gemini-3.1-pro-preview", {"max_images": 10}, SOURCE)
    rule = Limits(max_images=20)
    assert learned.tighten("api.githubcopilot.com", "gemini-3.1-pro-preview", rule).max_images == 10
    assert learned.tighten("api.githubcopilot.com", "claude-sonnet-4", rule).max_images == 20
    assert learned.tighten("api.githubcopilot.com", None, rule).max_images == 20
    assert learned.tighten("other.example.com", "gemini-3.1-pro-preview", rule) is rule


def test_a_host_wide_limit_holds_for_every_model() -> None:
    learned = LearnedLimits(None)
    learned.learn("backend.example.com", None, {"max_body_bytes": 2 * 2**20}, "413 bare-413")
    assert learned.tighten("backend.example.com", "any-model", Limits()).max_body_bytes == 2 * 2**20
    assert learned.tighten("backend.example.com", None, Limits(max_body_bytes=16 * 2**20)).max_body_bytes == 2 * 2**20


def test_learned_limits_only_tighten() -> None:
    learned = LearnedLimits(None)
    learned.learn("h", None, {"max_images": 10}, "s")
    assert learned.tighten("h", None, Limits(max_images=8)).max_images == 8  # the rule is tighter: kept
    assert learned.learn("h", None, {"max_images": 12}, "s") == []  # a looser figure never replaces a tighter one
    assert [e.value for e in learned.entries] == [10]
    assert [e.value for e in learned.learn("h", None, {"max_images": 5}, "s")] == [5]
    assert learned.tighten("h", None, Limits(max_images=8)).max_images == 5


def test_the_many_image_side_comes_with_a_threshold() -> None:
    learned = LearnedLimits(None)
    learned.learn("api.anthropic.com", "claude-x", {"many_images_max_side": 2000}, "s")
    limits = learned.tighten("api.anthropic.com", "claude-x", Limits())
    assert (limits.many_images_threshold, limits.many_images_max_side) == (0, 2000)


def test_the_file_is_readable_yaml_with_source_and_time(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "learned.yaml"
    learned = LearnedLimits(path)
    learned.learn("api.githubcopilot.com", "gemini-3.1-pro-preview", {"max_images": 10}, SOURCE)
    text = path.read_text()
    assert text.startswith("# Limits trimflow learned")
    assert "host: api.githubcopilot.com\n" in text and "model: gemini-3.1-pro-preview\n" in text
    assert "limit: max_images\n" in text and "value: 10\n" in text
    assert f"source: '{SOURCE}'" in text
    assert re.search(r"learned: '\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z'", text)
    (entry,) = load_learned(path)
    assert (entry.host, entry.model, entry.limit, entry.value, entry.source) == (
        "api.githubcopilot.com",
        "gemini-3.1-pro-preview",
        "max_images",
        10,
        SOURCE,
    )
    assert [p.name for p in path.parent.iterdir()] == ["learned.yaml"]  # no temporary file left behind


def test_a_second_store_reads_what_the_first_learned(tmp_path: Path) -> None:
    path = tmp_path / "learned.yaml"
    LearnedLimits(path).learn("h", "m", {"max_images": 4}, "s")
    assert LearnedLimits(path).tighten("h", "m", Limits()).max_images == 4


def test_a_write_merges_what_another_process_wrote_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / "learned.yaml"
    first, second = LearnedLimits(path, check_interval=3600), LearnedLimits(path, check_interval=3600)
    first.learn("a.example.com", None, {"max_body_bytes": 1_000_000}, "s")
    second.learn("b.example.com", None, {"max_images": 3}, "s")
    assert {(e.host, e.limit) for e in load_learned(path)} == {("a.example.com", "max_body_bytes"), ("b.example.com", "max_images")}


def test_an_edit_is_picked_up_and_a_deleted_file_forgets(tmp_path: Path) -> None:
    path = tmp_path / "learned.yaml"
    learned = LearnedLimits(path, check_interval=0)
    learned.learn("h", None, {"max_images": 4}, "s")
    text = path.read_text().replace("value: 4", "value: 6")
    time.sleep(0.01)
    path.write_text(text)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert learned.tighten("h", None, Limits()).max_images == 6  # a person may loosen what was learned
    path.unlink()
    assert learned.tighten("h", None, Limits()).max_images is None


def test_a_bad_edit_keeps_the_last_good_entries(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "learned.yaml"
    learned = LearnedLimits(path, check_interval=0)
    learned.learn("h", None, {"max_images": 4}, "s")
    path.write_text("learned:\n  - {host: h, limit: max_images, value: -1}\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert learned.tighten("h", None, Limits()).max_images == 4
    assert "learned.yaml:2: value of max_images must be a whole number >= 0, got -1; keeping the learned limits read before" in caplog.text


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("learned:\n  - {host: h, limit: max_image, value: 3}\n", ":2: limit must be one of max_images"),
        ("learned:\n  - {host: h, limit: max_images}\n", ":2: a learned limit has no value"),
        ("learned:\n  - {host: h, limit: max_image_bytes, value: 10}\n", ":2: value of max_image_bytes must be a whole number >= 1024"),
        ("learned:\n  - {host: h, limit: max_images, value: 3, why: x}\n", ":2: unknown field 'why' in a learned limit"),
        ("learn: []\n", ":1: unknown top-level key 'learn'"),
    ],
)
def test_a_bad_file_names_its_line(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "learned.yaml"
    path.write_text(text)
    with pytest.raises(RulesError, match=re.escape(problem)):
        LearnedLimits(path)


def test_an_empty_or_missing_file_has_no_entries(tmp_path: Path) -> None:
    assert LearnedLimits(tmp_path / "missing.yaml").entries == ()
    (tmp_path / "empty.yaml").write_text("")
    assert LearnedLimits(tmp_path / "empty.yaml").entries == ()


def test_the_engine_applies_learned_limits_before_pruning() -> None:
    body = orjson.dumps(session_body("openai-chat", 6, image(32, 24, "PNG"), "image/png", "gpt-4o"))
    rules = builtin_rules()
    target = rules.target("api.example.com", "/v1/chat/completions")
    assert target is not None
    untouched = prune(target, {}, body, rules)
    assert untouched.record is not None and untouched.record.images_after == 6
    learned = LearnedLimits(None)
    learned.learn("api.example.com", "gpt-4o", {"max_images": 2}, "s")
    outcome = prune(target, {}, body, rules, tighten=learned.tighten)
    assert outcome.record is not None and (outcome.record.images_before, outcome.record.images_after) == (6, 2)
    other = prune(target, {}, body.replace(b'"gpt-4o"', b'"gpt-4.1"'), rules, tighten=learned.tighten)
    assert other.record is not None and other.record.images_after == 6


# Several trimflow processes behind one balancer share the file: each learns on its own, at any moment.
_LEARNER = """\
import sys
from trimflow._learned import LearnedLimits

path, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
learned = LearnedLimits(path, check_interval=3600)
for i in range(count):
    learned.learn(f"{name}-{i}.example.com", None, {"max_images": 5}, "s")
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
    hosts = {entry.host for entry in load_learned(path)}
    assert hosts == {f"{name}-{i}.example.com" for name in names for i in range(count)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["learned.yaml", "learner.py"]  # no temporary file left behind


def test_a_limit_another_process_learned_applies_here_within_the_check_interval(tmp_path: Path) -> None:
    path = tmp_path / "learned.yaml"
    here, there = LearnedLimits(path, check_interval=0.2), LearnedLimits(path, check_interval=0.2)
    assert here.tighten("h", None, Limits()).max_images is None
    there.learn("h", None, {"max_images": 3}, "s")
    deadline = time.monotonic() + 5
    while here.tighten("h", None, Limits()).max_images != 3:
        assert time.monotonic() < deadline, "the other process's limit never applied"
        time.sleep(0.02)
    assert time.monotonic() - (deadline - 5) < 1.0  # one check interval, and the file's read


def test_a_new_version_of_the_file_keeps_its_permissions(tmp_path: Path) -> None:
    path = tmp_path / "learned.yaml"
    LearnedLimits(path).learn("h", None, {"max_images": 4}, "s")
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644 & ~umask
    path.chmod(0o664)  # shared by a group of service accounts
    LearnedLimits(path).learn("h2", None, {"max_images": 4}, "s")
    assert path.stat().st_mode & 0o777 == 0o664
