"""Why the cache broke, end to end: the real anthropic client holds ten-turn screenshot conversations (a long system
prompt, Claude Code's cache breakpoints) through a real mitmdump in front of FakeProvider(cache=True), whose cache
model reports the reads. One agent edits its system prompt on turn 7; in another trimflow's cut (max_images 8, one
image a turn) moves on turn 9. Each record names whose doing a fall in the cache read was, and the audit and the exit
summary count them by cause."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest

from trimflow.cli._exit_summary import summary
from trimflow.testing import FakeProvider, b64

from .helpers import ANTHROPIC_KEY, ROOT, Proxy, direct_http_client, replace_text, shots, start_proxy, stop_all

pytestmark = pytest.mark.e2e

TURNS = 10
SYSTEM = "You are a careful desktop assistant. Read the screen before you act, then say which control to use. " * 200
EPHEMERAL = {"type": "ephemeral"}
CAP = 8


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProvider]:
    with FakeProvider(cache=True) as p:
        yield p


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, provider: FakeProvider) -> Iterator[Proxy]:
    workdir = tmp_path_factory.mktemp("cache-break")
    rules = replace_text(workdir / "rules.yaml", f"defaults:\n  max_images: {CAP}\n  prune_batch: 1\n  keep_recent: 1\n")
    started = start_proxy(workdir, "--mode", f"reverse:{provider.url}", rules=rules)
    yield started
    stop_all(started.mitm)


def session(proxy: Proxy, seed: int, system_on: dict[int, str], images: int) -> list[dict[str, Any]]:
    """A Claude Code-like session of TURNS turns; turn t sends `system_on[t]` (the latest given) as its system prompt
    and a screenshot while fewer than `images` have been sent. Returns its records in order."""
    screens = shots(TURNS, seed=seed)
    messages: list[dict[str, Any]] = []
    system = system_on[1]
    with (
        anthropic.Anthropic(api_key=ANTHROPIC_KEY, base_url=proxy.url, http_client=direct_http_client(), max_retries=0, timeout=30) as client,
        proxy.expect_records(TURNS) as records,
    ):
        for turn in range(1, TURNS + 1):
            system = system_on.get(turn, system)
            content: list[dict[str, Any]] = [{"type": "text", "text": f"Turn {turn}: what should I click next?"}]
            if turn <= images:
                content.insert(0, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(screens[turn - 1])}})
            for message in messages:
                for block in message["content"]:
                    block.pop("cache_control", None)
            messages.append({"role": "user", "content": content})
            messages[-1]["content"][-1]["cache_control"] = EPHEMERAL
            reply = client.messages.create(
                model="claude-sonnet-4-6", max_tokens=200, system=[{"type": "text", "text": system, "cache_control": EPHEMERAL}], messages=messages
            )
            messages.append({"role": "assistant", "content": [{"type": "text", "text": reply.content[0].text}]})
    return sorted(records, key=lambda r: r["ts"])


def breaks(records: list[dict[str, Any]]) -> dict[int, tuple[str, str | None]]:
    """Request number (1 = the session's first) -> (cause, where), for the records that name a cause."""
    return {i: (r["cache_break"], r["cache_break_at"]) for i, r in enumerate(records, 1) if r["cache_break"] is not None}


def test_an_agent_that_edits_its_system_prompt_is_named_for_the_break(proxy: Proxy) -> None:
    edited = "Today is Tuesday. " + SYSTEM
    records = session(proxy, 1, {1: f"Agent one. {SYSTEM}", 7: f"Agent one. {edited}"}, images=4)
    reads = [r["usage_cache_read_tokens"] for r in records]
    assert reads[6] < reads[5], reads  # the provider's cache read fell on turn 7
    assert breaks(records) == {1: ("first_turn", None), 7: ("agent_prefix", "system")}
    assert all(r["pruned"] == 0 for r in records)


def test_trimflow_is_named_when_its_cut_moves(proxy: Proxy) -> None:
    records = session(proxy, 2, {1: f"Agent two. {SYSTEM}"}, images=TURNS)
    reads = [r["usage_cache_read_tokens"] for r in records]
    assert [r["pruned"] for r in records] == [0] * 8 + [1, 2]  # the cut first moves on turn 9
    assert reads[8] < reads[7] and reads[8] <= reads[9], reads  # turn 10 reads what turn 9 cached: no fall
    assert breaks(records) == {1: ("first_turn", None), 9: ("trimflow_cut", "image 1")}


def test_the_audit_and_the_exit_summary_count_the_breaks_by_cause(proxy: Proxy, tmp_path: Path) -> None:
    session(proxy, 3, {1: f"Agent three. {SYSTEM}", 7: f"Agent three, edited. {SYSTEM}"}, images=4)
    session(proxy, 4, {1: f"Agent four. {SYSTEM}"}, images=TURNS)
    recorded = [orjson.loads(line) for line in proxy.metrics.read_bytes().splitlines()]
    expected: dict[str, int] = {}
    for record in recorded:
        if record["cache_break"]:
            expected[record["cache_break"]] = expected.get(record["cache_break"], 0) + 1
    assert expected["agent_prefix"] >= 2 and expected["trimflow_cut"] >= 2  # this test's sessions and the ones before it
    out = tmp_path / "audit.json"
    audit = [sys.executable, "-m", "trimflow", "audit", str(proxy.metrics), "--format", "json", "--out", str(out)]
    subprocess.run(audit, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert orjson.loads(out.read_bytes())["summary"]["totals"]["cache_breaks"] == expected
    lines = summary(proxy.metrics, 0, "claude", 0, tmp_path / "run.log")
    shown = ", ".join(f"{expected[cause]} {cause}" for cause in ("first_turn", "agent_prefix", "trimflow_cut") if cause in expected)
    assert f"cache breaks: {shown}" in lines[-2], lines
