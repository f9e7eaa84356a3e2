"""The cut and the prompt cache end to end: a computer-use loop (a new screenshot per turn in a tool_result,
Claude Code's breakpoints on the system prompt and the newest block) through a real mitmdump with the addon, by
the real anthropic client, to FakeProvider(cache=True), which caches as Anthropic documents. Under the shipped
rules (batches of 6) the cached prefix breaks only on the turn the cut moves; under rolling pruning it breaks on
every turn past the cap; with low_water the proxy holds each conversation's cut from turn to turn."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from trimflow.testing import FakeProvider, b64

from .helpers import ANTHROPIC_KEY, Proxy, direct_http_client, shots, start_all, stop_all

pytestmark = pytest.mark.e2e

TURNS = 16
EPHEMERAL = {"type": "ephemeral"}
# Over Anthropic's minimum cacheable prefix (1,024 to 4,096 tokens by model) from the first turn.
SYSTEM = "You operate a desktop through the computer tool. Look at each screenshot before you act. " * 200
POLICIES = {
    "shipped": None,
    "rolling": "defaults:\n  max_images: 8\n  prune_batch: 1\n",
    "low_water": "defaults:\n  max_images: 8\n  low_water: 0.5\n",
}


@pytest.fixture(scope="module")
def proxies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Proxy]]:
    """One proxy per policy, each in front of a provider of its own: the runs send the same prefixes, and a
    cache shared between them would serve one run from another's writes."""
    out: dict[str, Proxy] = {}
    with contextlib.ExitStack() as stack:
        for name, text in POLICIES.items():
            provider = stack.enter_context(FakeProvider(cache=True))
            workdir = tmp_path_factory.mktemp(name)
            rules = None
            if text is not None:
                rules = workdir / "rules.yaml"
                rules.write_text(text)
            out[name] = Proxy(workdir, "--mode", f"reverse:{provider.url}", rules=rules)
        start_all(*(p.mitm for p in out.values()))
        yield out
        stop_all(*(p.mitm for p in out.values()))


def computer_use(proxy: Proxy) -> list[dict[str, Any]]:
    """TURNS turns of the loop; returns the records, whose usage the SDK saw too (checked per turn)."""
    images = shots(TURNS, seed=41, width=320, height=200)
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Open the network settings."}]}]
    with (
        proxy.expect_records(TURNS) as records,
        anthropic.Anthropic(api_key=ANTHROPIC_KEY, base_url=proxy.url, http_client=direct_http_client(), max_retries=0, timeout=30) as client,
    ):
        seen = []
        for turn, shot in enumerate(images):
            messages.append(
                {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{turn}", "name": "computer", "input": {"action": "screenshot"}}]}
            )
            result = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(shot)}}
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{turn}", "content": [result]}]})
            for message in messages[:-1]:
                for block in message["content"]:
                    block.pop("cache_control", None)
            messages[-1]["content"][-1]["cache_control"] = EPHEMERAL
            reply = client.messages.create(
                model="claude-sonnet-4-6",
                max_tokens=100,
                system=[{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}],
                messages=messages,  # type: ignore[arg-type]
            )
            seen.append((reply.usage.cache_read_input_tokens, reply.usage.cache_creation_input_tokens))
    assert [(r["usage_cache_read_tokens"], r["usage_cache_write_tokens"]) for r in records] == seen
    return records


def broken(records: list[dict[str, Any]]) -> list[int]:
    """Turns that read less from the cache than the turn before them had in it: the cut moved."""
    out = []
    for before, record in itertools.pairwise(records):
        cached_before = before["usage_cache_read_tokens"] + before["usage_cache_write_tokens"]
        if record["usage_cache_read_tokens"] < cached_before:
            out.append(record["turn"])
    return out


@pytest.fixture(scope="module")
def runs(proxies: dict[str, Proxy]) -> dict[str, list[dict[str, Any]]]:
    return {name: computer_use(proxy) for name, proxy in proxies.items()}


def test_the_shipped_batches_break_the_cached_prefix_only_where_the_cut_moves(runs: dict) -> None:
    records = runs["shipped"]
    assert [r["images_after"] for r in records] == [*range(1, 9), *range(3, 9), 3, 4]
    assert broken(records) == [9, 15]


def test_rolling_pruning_breaks_it_on_every_turn_past_the_cap(runs: dict) -> None:
    records = runs["rolling"]
    assert [r["images_after"] for r in records] == [*range(1, 9), *[8] * 8]
    assert broken(records) == list(range(9, TURNS + 1))
    shipped = runs["shipped"]
    written = sum(r["usage_cache_write_tokens"] for r in records[8:])
    assert sum(r["usage_cache_write_tokens"] for r in shipped[8:]) * 2 < written


def test_low_water_holds_each_conversations_cut_through_the_proxy(runs: dict) -> None:
    records = runs["low_water"]
    assert [r["images_after"] for r in records] == [*range(1, 9), *range(4, 9), 4, 5, 6]
    assert broken(records) == [9, 14]
    assert [r["pruned_for_cache"] for r in records[8:10]] == [4, 3]


def test_every_turn_is_one_conversation(runs: dict) -> None:
    for records in runs.values():
        assert len({r["conversation"] for r in records}) == 1 and [r["turn"] for r in records] == list(range(1, TURNS + 1))
