"""The process-wide budget of memory that decoding and re-encoding images may hold at once.

Each shrink (trimflow._shrink) works out from the image's header how much memory it can need at
most, and reserves that here before it decodes anything; it gives it back when it is done. So the
shrinks of all requests together never hold more than the budget, whatever images they carry and
however many arrive at once.

An image that needs more than the whole budget is never decoded (the shrink refuses it before
asking). One that does not fit beside those being decoded waits, in the worker thread the shrink
runs in (never on the event loop), until it fits or its wait runs out; at most `max_waiting` wait
at once, since each holds a worker thread, and the next is refused at once. Whichever fits goes
first: a small image is not held up behind a large one, and a large one waits at most `wait`.

When the last reservation is given back after at least `give_back_after` bytes were reserved, the
memory the decoding freed goes back to the system (trimflow._malloc): a process that kept it
(trimflow_keep_memory, and glibc's per-thread arenas) would otherwise hold a burst's peak for good.
"""

from __future__ import annotations

import threading
import time

from ._malloc import give_back_freed_memory

__all__ = ["PixelBudget"]


class PixelBudget:
    """Bytes reserved by the shrinks in flight, within `limit`. Thread-safe."""

    def __init__(self, limit: int, *, wait: float, max_waiting: int, give_back_after: int) -> None:
        self.limit, self.wait, self.max_waiting, self.give_back_after = limit, wait, max_waiting, give_back_after
        self.reserved = 0  # bytes held by shrinks in flight
        self.waiting = 0  # shrinks waiting for room
        self.peak = 0  # the most ever reserved at once
        self.refused = 0  # reservations refused: no room within `wait`, or too many waiting
        self._since_given_back = 0  # bytes reserved since memory last went back to the system
        self._room = threading.Condition()

    def reserve(self, cost: int) -> bool:
        """Reserve `cost` bytes, waiting up to `wait` seconds for room; False when refused (nothing reserved).
        A `cost` over the whole limit is the caller's to refuse: it is never reserved."""
        if cost > self.limit:
            raise ValueError(f"a reservation of {cost} bytes can never fit a budget of {self.limit}")
        with self._room:
            if self.reserved + cost > self.limit:
                if self.waiting >= self.max_waiting:
                    self.refused += 1
                    return False
                deadline = time.monotonic() + self.wait
                self.waiting += 1
                try:
                    while self.reserved + cost > self.limit:
                        left = deadline - time.monotonic()
                        if left <= 0 or not self._room.wait(left):
                            if self.reserved + cost <= self.limit:
                                break  # room came just as the wait ran out
                            self.refused += 1
                            return False
                finally:
                    self.waiting -= 1
            self.reserved += cost
            self._since_given_back += cost
            self.peak = max(self.peak, self.reserved)
            return True

    def release(self, cost: int) -> None:
        """Give back what `reserve(cost)` took; the last one out after a large decode returns the freed memory."""
        with self._room:
            self.reserved -= cost
            give_back = self.reserved == 0 and self._since_given_back >= self.give_back_after
            if give_back:
                self._since_given_back = 0
            self._room.notify_all()
        if give_back:
            give_back_freed_memory()  # outside the lock: it walks the whole heap
