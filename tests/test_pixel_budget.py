"""trimflow._pixel_budget: reservations within the limit go at once, the rest wait their turn or are refused, and the
last one out after a large decode gives the freed memory back."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from trimflow import _pixel_budget
from trimflow._pixel_budget import PixelBudget

MiB = 2**20
PATIENT = 60.0  # a wait no test runs out: a waiter in these tests goes when room is made, or the test fails


def until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


class Waiter(threading.Thread):
    """A reservation made in a thread of its own, as a shrink makes it in a worker thread."""

    def __init__(self, budget: PixelBudget, cost: int) -> None:
        super().__init__(daemon=True)
        self.budget, self.cost = budget, cost
        self.granted: bool | None = None
        self.start()

    def run(self) -> None:
        self.granted = self.budget.reserve(self.cost)


def budget(limit: int = 100 * MiB, wait: float = PATIENT, max_waiting: int = 2, give_back_after: int = 64 * MiB) -> PixelBudget:
    return PixelBudget(limit, wait=wait, max_waiting=max_waiting, give_back_after=give_back_after)


def test_reservations_within_the_limit_go_at_once_and_come_back() -> None:
    b = budget()
    assert b.reserve(60 * MiB) and b.reserve(40 * MiB)
    assert (b.reserved, b.peak, b.waiting) == (100 * MiB, 100 * MiB, 0)
    b.release(60 * MiB)
    b.release(40 * MiB)
    assert b.reserved == 0 and b.refused == 0


def test_a_cost_over_the_whole_limit_is_never_reserved() -> None:
    with pytest.raises(ValueError, match="can never fit"):
        budget().reserve(100 * MiB + 1)


def test_one_that_does_not_fit_waits_until_room_is_made() -> None:
    b = budget()
    assert b.reserve(70 * MiB)
    waiter = Waiter(b, 50 * MiB)
    until(lambda: b.waiting == 1)
    assert waiter.granted is None and b.reserved == 70 * MiB  # still waiting: the two would pass the limit
    b.release(70 * MiB)
    waiter.join(PATIENT)
    assert waiter.granted is True and b.reserved == 50 * MiB and b.peak == 70 * MiB


def test_a_small_one_goes_past_a_large_one_that_waits() -> None:
    b = budget()
    assert b.reserve(70 * MiB)
    large = Waiter(b, 60 * MiB)
    until(lambda: b.waiting == 1)
    assert b.reserve(20 * MiB)  # fits beside what is held: it does not queue behind the large one
    b.release(20 * MiB)
    b.release(70 * MiB)
    large.join(PATIENT)
    assert large.granted is True


def test_a_wait_that_runs_out_is_refused_and_reserves_nothing() -> None:
    b = budget(wait=0.05)
    assert b.reserve(90 * MiB)
    assert not b.reserve(20 * MiB)
    assert (b.reserved, b.refused, b.waiting) == (90 * MiB, 1, 0)


def test_past_max_waiting_the_next_is_refused_at_once() -> None:
    b = budget(max_waiting=2)
    assert b.reserve(100 * MiB)
    waiters = [Waiter(b, 10 * MiB) for _ in range(2)]
    until(lambda: b.waiting == 2)
    assert not b.reserve(10 * MiB)  # refused without waiting: each waiter holds a worker thread
    assert b.refused == 1 and all(w.granted is None for w in waiters)
    b.release(100 * MiB)
    for w in waiters:
        w.join(PATIENT)
    assert all(w.granted for w in waiters) and b.reserved == 20 * MiB


def test_the_last_one_out_after_a_large_decode_gives_memory_back(monkeypatch: pytest.MonkeyPatch) -> None:
    reserved_at_give_back: list[int] = []
    b = budget(give_back_after=64 * MiB)
    monkeypatch.setattr(_pixel_budget, "give_back_freed_memory", lambda: reserved_at_give_back.append(b.reserved) or True)
    assert b.reserve(10 * MiB)
    b.release(10 * MiB)
    assert reserved_at_give_back == []  # small decodes leave what they freed for the next ones
    assert b.reserve(40 * MiB) and b.reserve(30 * MiB)
    b.release(40 * MiB)
    assert reserved_at_give_back == []  # another decode still runs: it would take the memory again
    b.release(30 * MiB)
    assert reserved_at_give_back == [0]  # 80 MiB reserved since the last give-back, and nothing in flight
    assert b.reserve(10 * MiB)
    b.release(10 * MiB)
    assert reserved_at_give_back == [0]  # counted again from the give-back
