"""The cheapest cut schedule: the dynamic program against exhaustive search with the real cache model."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from trimflow._prices import load_prices
from trimflow._rules_file import DEFAULT_RULES_PATH, load_rules
from trimflow.testing._synthetic import b64, data_url, image

from .cache_sessions import REFERENCE_SESSIONS, ReferenceSession, Turn
from .optimum import (
    CutTurn,
    batch_floor,
    cheapest,
    cut_requests,
    feasible_cuts,
    optima,
    optimum,
    policy_floor,
    price_for,
    ratios,
    schedule_cost,
    simulate,
)
from .policy_runner import POLICIES, run_policy

RULES = load_rules(DEFAULT_RULES_PATH)
CAP, FLOOR = 4, 2
TTL_PAST = (301.0, 900.0)


def _system_text(seed: int) -> str:
    rng = random.Random(seed)
    words = "the screen shows a window with a button a list of files and a search field".split()
    return " ".join(f"{n}. {' '.join(rng.choice(words) for _ in range(12))}." for n in range(90))  # ~1,600 tokens


def _think(rng: random.Random, turn: int) -> float:
    if turn == 0:
        return 0.0
    return round(rng.uniform(*TTL_PAST) if rng.random() < 0.25 else rng.uniform(2, 60), 1)


def _picture(rng: random.Random, seed: int) -> bytes:
    return image(rng.choice((300, 480, 640)), rng.choice((200, 360)), "PNG", seed, noise=0.2)


def _anthropic_turns(seed: int, turns: int) -> Iterator[Turn]:
    rng = random.Random(seed)
    system = [{"type": "text", "text": _system_text(seed), "cache_control": {"type": "ephemeral"}}]
    messages: list[dict[str, Any]] = []
    shots = 0
    for turn in range(turns):
        content: list[dict[str, Any]] = [{"type": "text", "text": f"step {turn} of task {seed}"}]
        for _ in range(rng.choice((0, 1, 2, 2, 2)) if turn else 1):
            shots += 1
            data = b64(_picture(rng, 1000 * seed + shots))
            content.append({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}})
        messages.append({"role": "user", "content": content})
        last = {**messages[-1], "content": [*content[:-1], {**content[-1], "cache_control": {"type": "ephemeral"}}]}
        body = {"model": "claude-sonnet-4-6", "max_tokens": 1024, "system": system, "messages": [*messages[:-1], last]}
        answer = [{"type": "text", "text": f"answer {turn}: " + "ok " * rng.randrange(10, 200)}]
        yield Turn(orjson.dumps(body), _think(rng, turn), 40)
        messages.append({"role": "assistant", "content": answer})


def _chat_turns(seed: int, turns: int) -> Iterator[Turn]:
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": _system_text(seed)}]
    shots = 0
    for turn in range(turns):
        content: list[dict[str, Any]] = [{"type": "text", "text": f"message {turn} of chat {seed}"}]
        for _ in range(rng.choice((0, 1, 2, 2, 2)) if turn else 1):
            shots += 1
            url = data_url(_picture(rng, 1000 * seed + shots), "image/png")
            content.append({"type": "image_url", "image_url": {"url": url, "detail": "high"}})
        messages.append({"role": "user", "content": content})
        yield Turn(orjson.dumps({"model": "gpt-4o", "messages": messages}), _think(rng, turn), 40)
        messages.append({"role": "assistant", "content": "answer " + "ok " * rng.randrange(10, 200)})


def small_session(fmt: str, seed: int, turns: int = 7) -> ReferenceSession:
    if fmt == "anthropic":
        return ReferenceSession(
            name=f"anthropic-{seed}",
            description="",
            fmt=fmt,
            host="api.anthropic.com",
            path="/v1/messages",
            model="claude-sonnet-4-6",
            length=turns,
            profiles=(),
            build=lambda: _anthropic_turns(seed, turns),
        )
    return ReferenceSession(
        name=f"chat-{seed}",
        description="",
        fmt=fmt,
        host="api.openai.com",
        path="/v1/chat/completions",
        model="gpt-4o",
        length=turns,
        profiles=(),
        build=lambda: _chat_turns(seed, turns),
    )


def every_schedule(turns: list[CutTurn], cap: int, floor: int) -> Iterator[tuple[int, ...]]:
    """Every schedule whose cut never moves back and keeps between the floor and the cap."""

    def extend(i: int, before: int) -> Iterator[tuple[int, ...]]:
        if i == len(turns):
            yield ()
            return
        for cut in feasible_cuts(turns[i].images, cap, floor):
            if cut >= before:
                for rest in extend(i + 1, cut):
                    yield (cut, *rest)

    yield from extend(0, 0)


@pytest.mark.parametrize(("fmt", "seed"), [("anthropic", s) for s in (1, 2, 3, 4)] + [("openai-chat", s) for s in (5, 6, 7)])
def test_the_dynamic_program_finds_what_exhaustive_search_finds(fmt: str, seed: int) -> None:
    session = small_session(fmt, seed)
    price = price_for(session)
    turns = cut_requests(session, RULES, lambda number, images: feasible_cuts(images, CAP, FLOOR))
    assert max(t.images for t in turns) > CAP, "the session must make a cut necessary"
    best = cheapest(session.name, turns, price, CAP, FLOOR)
    searched = {s: simulate(turns, s, price) for s in every_schedule(turns, CAP, FLOOR)}
    assert len(searched) > 20
    for length in range(1, len(turns) + 1):
        assert best.prefix_costs[length - 1] == pytest.approx(min(sum(costs[:length]) for costs in searched.values()), rel=1e-12)
    # The schedule it returns is feasible and costs, simulated turn after turn, what it says.
    assert best.cuts in searched
    assert searched[best.cuts] == pytest.approx(list(best.turn_costs), rel=1e-12)
    assert sum(best.turn_costs) == pytest.approx(best.cost, rel=1e-12)
    # Not every schedule costs the same: the search has something to find.
    assert max(sum(c) for c in searched.values()) > 1.05 * best.cost


def test_a_schedule_is_priced_from_the_engines_own_bodies() -> None:
    session = small_session("anthropic", 8)
    images = [t.images for t in cut_requests(session, RULES, lambda number, images: (0,))]
    cuts = [max(0, n - CAP) for n in images]  # rolling: the cut moves every turn past the cap
    rolling = schedule_cost(session, cuts)
    best = optimum(session, cap=CAP, floor=FLOOR)
    assert len(rolling) == len(images) and sum(rolling) >= best.cost
    with pytest.raises(ValueError, match="floor of 5 images under a cap of 4"):
        optimum(session, cap=CAP, floor=5)


def test_the_floor_of_batches_of_six() -> None:
    assert (batch_floor(8), batch_floor(10), batch_floor(3)) == (3, 5, 1)
    assert list(feasible_cuts(12, 8, 3)) == [4, 5, 6, 7, 8, 9]
    assert list(feasible_cuts(2, 8, 3)) == [0]


def test_the_optimum_cuts_nothing_before_the_first_overflow_unless_set_free() -> None:
    assert list(feasible_cuts(6, 8, 3, overflowed=False)) == [0]
    assert list(feasible_cuts(6, 8, 3, overflowed=True)) == [0, 1, 2, 3]
    assert list(feasible_cuts(12, 8, 3, overflowed=False)) == [4, 5, 6, 7, 8, 9]  # over the cap: overflowed whatever it says
    session = small_session("openai-chat", 8)
    bound, free = optimum(session, cap=CAP, floor=FLOOR), optimum(session, cap=CAP, floor=FLOOR, cut_before_overflow=True)
    first = next(turn for turn, images in enumerate(bound.images) if images > CAP)
    assert not any(bound.cuts[:first]), bound.cuts
    assert free.cost <= bound.cost
    assert any(free.cuts[:first]) or free.cost == pytest.approx(bound.cost, rel=1e-12)


def test_batches_of_six_are_within_two_percent_of_the_optimum_on_computer_use() -> None:
    session = next(s for s in REFERENCE_SESSIONS if s.name == "computer-use")
    best = optimum(session)
    assert (best.cap, best.floor) == (8, 3)
    assert all(best.floor <= n - c <= best.cap or n - c == n <= best.floor for n, c in zip(best.images, best.cuts, strict=True))
    policy = {p.name: p for p in POLICIES}
    price = price_for(session, load_prices())
    batch, rolling = (ratios(run_policy(session, policy[name]), best, price) for name in ("batch 6", "rolling (batch 1)"))
    assert 1.0 <= batch.full <= 1.02 and 1.0 <= batch.averaged <= 1.05 and batch.cap_broken == 0
    assert rolling.full > 2 * batch.full


def test_the_optimum_at_each_floor_and_a_policys_floor() -> None:
    session = small_session("anthropic", 3, turns=10)
    by_floor = optima(session, [1, 3, 8, 12])
    assert sorted(by_floor) == [1, 3, 8]  # within 1 and the cap of 8
    for floor, best in by_floor.items():
        assert best.cost == pytest.approx(optimum(session, floor=floor).cost, rel=1e-12)
    # A higher floor leaves fewer schedules: never cheaper.
    assert by_floor[1].cost <= by_floor[3].cost <= by_floor[8].cost
    policy = {p.name: p for p in POLICIES}
    images = by_floor[1].images
    assert max(images) > 8
    assert policy_floor(run_policy(session, policy["batch 6"]), images, 8) == 3
    assert policy_floor(run_policy(session, policy["rolling (batch 1)"]), images, 8) == 8
    assert policy_floor(run_policy(session, policy["no pruning"]), images, 8) == 8


def test_the_cold_cut_brings_the_idle_session_within_five_percent_of_the_optimum() -> None:
    """Batches of 6 miss the target when the user pauses past the TTL every 15 turns; cutting a cold
    conversation to the floor at once (low_water + cache_ttl) meets it, at the same floor of 3."""
    session = next(s for s in REFERENCE_SESSIONS if s.name == "idle")
    policy = {p.name: p for p in POLICIES}
    batch, cold = (run_policy(session, policy[name]) for name in ("batch 6", "batch 6 + cold cut"))
    best = optimum(session)
    assert best.floor == 3 and {policy_floor(r, best.images, best.cap) for r in (batch, cold)} == {3}
    price = price_for(session)
    assert ratios(batch, best, price).averaged > 1.05 >= ratios(cold, best, price).averaged >= 1.0
    assert cold.breaches == {}
