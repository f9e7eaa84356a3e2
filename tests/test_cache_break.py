"""Why the cache broke (trimflow._cache_break): each cause named from the digests of this turn and the last, where the
agent's change is found, and what is remembered stays within its bounds."""

from __future__ import annotations

import orjson
import pytest

from trimflow import prune_request
from trimflow._cache_break import AGENT_PREFIX, CACHE_EXPIRED, FIRST_TURN, TRIMFLOW_CUT, UNEXPLAINED, CacheBreaks
from trimflow._history import History, Images
from trimflow._record import COUNT_TOKENS, ENFORCE, OBSERVE, Record
from trimflow.testing import PATHS, image, session_body

from .helpers import rules_with


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def hist(messages: list[str], system: str = "sys", tools: str = "tools") -> History:
    """A history of these messages, each with one image."""
    images = Images([m.encode() for m in messages])
    return History("api.example", None, hash(system), [hash(m) for m in messages], images=images, tools=hash(tools))


def turn(
    breaks: CacheBreaks, number: int, history: History, read: int, cut: frozenset[int] = frozenset(), conversation: str = "c1", mode: str = ENFORCE
) -> Record:
    """One turn through `breaks`: sent, then answered with `read` cache tokens; returns its record."""
    record = turn_record(number, conversation, mode)
    breaks.sent(record, history, cut)
    record.usage_input_tokens, record.usage_cache_read_tokens = read + 100, read
    breaks.answered(record)
    return record


def turn_record(number: int, conversation: str = "c1", mode: str = ENFORCE) -> Record:
    return Record(
        ts="ts",
        conversation=conversation,
        turn=number,
        host="api.example",
        path="/v1/messages",
        format="anthropic",
        model="m",
        rule="r",
        mode=mode,
        segment=1,
    )


def causes(records: list[Record]) -> list[tuple[str | None, str | None]]:
    return [(r.cache_break, r.cache_break_at) for r in records]


def test_a_first_turn_then_turns_whose_read_grows_name_nothing() -> None:
    breaks = CacheBreaks()
    records = [turn(breaks, n, hist([f"m{i}" for i in range(n)]), 1000 * n) for n in range(1, 5)]
    assert causes(records) == [(FIRST_TURN, None)] + [(None, None)] * 3


@pytest.mark.parametrize(
    ("changed", "where"),
    [
        (hist(["m0", "m1", "m2"], tools="other tools"), "tools"),
        (hist(["m0", "m1", "m2"], system="other system"), "system"),
        (hist(["m0", "edited", "m2"]), "message 2"),
    ],
)
def test_the_agents_first_changed_block_is_named(changed: History, where: str) -> None:
    breaks = CacheBreaks()
    turn(breaks, 1, hist(["m0"]), 0)
    turn(breaks, 2, hist(["m0", "m1"]), 5000)
    assert causes([turn(breaks, 3, changed, 200)]) == [(AGENT_PREFIX, where)]


def test_a_turn_sent_before_the_answer_to_the_one_before_is_counted_still_compares_with_its_read() -> None:
    # A fast agent's next turn can go before the proxy has counted the last answer: the fall is read once both are in.
    breaks = CacheBreaks()
    turn(breaks, 1, hist(["m0"]), 0)
    second, third = turn_record(2), turn_record(3)
    breaks.sent(second, hist(["m0", "m1"]), frozenset())
    breaks.sent(third, hist(["m0", "m1", "m2"]), frozenset({0}))  # its cut moved
    for record, read in ((second, 5000), (third, 200)):
        record.usage_cache_read_tokens = read
        breaks.answered(record)
    assert causes([second, third]) == [(None, None), (TRIMFLOW_CUT, "image 1")]


def test_a_moved_cut_names_the_first_image_sent_otherwise() -> None:
    """The cut takes images by value, not only the oldest: the first image the previous turn also sent whose state
    changed is named; an image new this turn, cut as it comes, moves nothing."""
    breaks = CacheBreaks()
    messages = [f"m{i}" for i in range(6)]
    turn(breaks, 1, hist(messages[:4]), 0, cut=frozenset({1}))
    turn(breaks, 2, hist(messages[:5]), 5000, cut=frozenset({1, 4}))  # the new image cut on arrival: no move
    moved = turn(breaks, 3, hist(messages), 300, cut=frozenset({1, 3, 4}))
    assert causes([moved]) == [(TRIMFLOW_CUT, "image 4")]


def test_in_observe_mode_no_cut_reached_the_provider() -> None:
    breaks = CacheBreaks()
    turn(breaks, 1, hist(["m0"]), 0, mode=OBSERVE)
    turn(breaks, 2, hist(["m0", "m1"]), 5000, cut=frozenset({0}), mode=OBSERVE)
    assert causes([turn(breaks, 3, hist(["m0", "m1", "m2"]), 300, cut=frozenset({0, 1}), mode=OBSERVE)]) == [(UNEXPLAINED, None)]


def test_idle_past_the_lifetime_is_the_cache_expiring_and_within_it_unexplained() -> None:
    clock = Clock()
    breaks = CacheBreaks(lifetime=300, clock=clock)
    turn(breaks, 1, hist(["m0"]), 0)
    turn(breaks, 2, hist(["m0", "m1"]), 5000)
    clock.now += 301
    expired = turn(breaks, 3, hist(["m0", "m1", "m2"]), 0)
    clock.now += 10
    turn(breaks, 4, hist(["m0", "m1", "m2", "m3"]), 6000)
    clock.now += 10
    dropped = turn(breaks, 5, hist(["m0", "m1", "m2", "m3", "m4"]), 0)
    assert causes([expired, dropped]) == [(CACHE_EXPIRED, None), (UNEXPLAINED, None)]


def test_a_request_asking_for_a_longer_lifetime_expires_only_past_it() -> None:
    clock = Clock()
    breaks = CacheBreaks(lifetime=300, clock=clock)

    def asking_an_hour(messages: list[str]) -> History:
        history = hist(messages)
        history.asked_lifetime = lambda: 3600.0
        return history

    turn(breaks, 1, asking_an_hour(["m0"]), 0)
    turn(breaks, 2, asking_an_hour(["m0", "m1"]), 5000)
    clock.now += 1200
    within = turn(breaks, 3, asking_an_hour(["m0", "m1", "m2"]), 0)
    turn(breaks, 4, asking_an_hour(["m0", "m1", "m2", "m3"]), 6000)
    clock.now += 3601
    past = turn(breaks, 5, asking_an_hour(["m0", "m1", "m2", "m3", "m4"]), 0)
    assert causes([within, past]) == [(UNEXPLAINED, None), (CACHE_EXPIRED, None)]


@pytest.mark.parametrize(("ttl", "seconds"), [(None, 0.0), ("5m", 300.0), ("1h", 3600.0)])
def test_the_engines_history_reads_the_lifetime_the_request_asks_for(ttl: str | None, seconds: float) -> None:
    body = session_body("anthropic", 3, image(24, 16, "PNG", seed=4), "image/png")
    if ttl is not None:
        body["messages"][-1]["content"][-1]["cache_control"] = {"type": "ephemeral", "ttl": ttl}
    outcome = prune_request(f"https://api.anthropic.com{PATHS['anthropic']}", {}, orjson.dumps(body), rules_with())
    assert outcome.history is not None
    assert outcome.history.asked_lifetime() == seconds


def test_a_new_conversation_that_goes_on_from_a_rewritten_one_is_the_agents_change() -> None:
    """Without a session id an edited system prompt starts a new conversation: its first turn goes on from the turn it
    shares its opening with. A rerun of the task's first turn (nothing after what it shares) is a first turn."""
    breaks = CacheBreaks()
    turn(breaks, 1, hist(["m0"]), 0)
    turn(breaks, 2, hist(["m0", "m1", "m2"]), 5000)
    rewritten = turn(breaks, 1, hist(["m0", "m1", "m2", "m3", "m4"], system="edited"), 0, conversation="c2")
    rerun = turn(breaks, 1, hist(["m0"]), 0, conversation="c3")
    assert causes([rewritten, rerun]) == [(AGENT_PREFIX, "system"), (FIRST_TURN, None)]


def test_an_answer_without_a_cache_read_or_a_request_that_is_no_turn_names_nothing() -> None:
    breaks = CacheBreaks()
    record = Record(ts="ts", conversation="c1", turn=1, host="h", path="/p", format="openai", model=None, rule=None, mode=ENFORCE)
    breaks.sent(record, hist(["m0"]), ())
    breaks.answered(record)  # no usage: the provider said nothing of its cache
    count = Record(
        ts="ts", conversation="c1", turn=None, host="h", path="/p", format="anthropic", model=None, rule=None, mode=ENFORCE, kind=COUNT_TOKENS
    )
    breaks.sent(count, hist(["m0"]), ())
    count.usage_cache_read_tokens = 0
    breaks.answered(count)
    assert causes([record, count]) == [(None, None), (None, None)]
    assert len(breaks) == 1


def test_memory_stays_within_its_bounds() -> None:
    breaks = CacheBreaks(max_turns=50, max_blocks=2000)
    for i in range(500):
        turn(breaks, 1, hist([f"c{i}-{m}" for m in range(100)]), 0, conversation=f"c{i}")
    assert len(breaks) <= 20  # 2,000 chain entries / 100 messages a turn
    assert breaks._blocks <= 2000
    assert sum(len(keys) for keys in breaks._by_opening.values()) == len(breaks)


def test_a_retry_that_cut_more_is_trimflows_doing_and_the_next_turn_is_compared_with_it() -> None:
    breaks = CacheBreaks()
    turn(breaks, 1, hist(["m0"]), 0)
    turn(breaks, 2, hist(["m0", "m1"]), 5000)
    retried = Record(
        ts="ts", conversation="c1", turn=3, host="api.example", path="/v1/messages", format="anthropic", model="m", rule="r", mode=ENFORCE, segment=1
    )
    breaks.sent(retried, hist(["m0", "m1", "m2"]), ())
    breaks.recut(retried, frozenset({0, 1}))  # refused for too many images, sent again with the two oldest cut
    retried.usage_cache_read_tokens = 100
    breaks.answered(retried)
    held = turn(breaks, 4, hist(["m0", "m1", "m2", "m3"]), 50, cut=frozenset({0, 1}))  # holds the retry's cut: no move of trimflow's
    assert causes([retried, held]) == [(TRIMFLOW_CUT, "image 1"), (UNEXPLAINED, None)]
