"""Which of a request's images the cut takes first: the order the policy's cut goes through (trimflow._policy cuts a
prefix of the images it is given, oldest first).

Age alone is the wrong order for the images that matter most: a user who attaches a mock-up in the first message and
lets an agent work through twenty screenshots would lose the mock-up at the first cut. So, given the images oldest
first by arrival (trimflow._conversation's `order`, or their places for a request of no known conversation):

1. the images cut on earlier turns come first: they stay cut (the held cut);
2. then the look-alikes the caller found (trimflow._lookalike: screenshots that show the same screen as the image
   after them), by arrival: a repeated screen goes before any distinct one;
3. then the others by arrival, a tool's output and the agent's screens (trimflow._media origins) and the user's
   older attachments alike;
4. then the user's protected images (`Limits.user_images_protected`: the newest so many the user attached that are
   older than the newest tool or agent image), by arrival: the cut reaches them only when nothing else is left above
   the floor;
5. the newest `keep_recent` by arrival last: never cut.

A user's image newer than every screen needs no protection: age already keeps it. A conversation of the user's
images only (a chat pasting screenshots) is cut by age, as before. The order depends only on the images, their
arrivals and the limits, so the held cut (step 1) and the turns that hold it see the same images kept and cut.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ._limits import Limits
from ._media import USER, Media


@dataclass(frozen=True, slots=True)
class CutOrder:
    """The images in the order the cut takes them (indices into the request's images, document order), and the
    positions in that order of the user's protected images, which the cut takes after every other one above the floor."""

    order: tuple[int, ...]
    protected: frozenset[int]


def cut_order(images: Sequence[Media], arrival: Sequence[int], held: int, limits: Limits, lookalikes: Collection[int] = ()) -> CutOrder:
    """`arrival`: the images' indices oldest first, the first `held` of them cut on an earlier turn; `lookalikes`: the
    images that show the same screen as the image after them."""
    fixed, rest = list(arrival[:held]), list(arrival[held:])
    keep = min(limits.keep_recent, len(rest))
    candidates, newest = rest[: len(rest) - keep], rest[len(rest) - keep :]
    alike = [i for i in candidates if i in lookalikes]
    if alike:
        fixed += alike
        candidates = [i for i in candidates if i not in lookalikes]
    bound = limits.user_images_protected()
    protected: list[int] = []
    if bound != 0:
        rank = {i: place for place, i in enumerate(arrival)}
        last_screen = max((rank[i] for i in arrival if images[i].origin != USER), default=-1)
        older = [i for i in candidates if images[i].origin == USER and rank[i] < last_screen]
        protected = older if bound is None else older[max(0, len(older) - bound) :]
    if not protected and not alike:
        return CutOrder(tuple(arrival), frozenset())
    chosen = set(protected)
    order = [*fixed, *(i for i in candidates if i not in chosen), *protected, *newest]
    start = len(order) - len(newest) - len(protected)
    return CutOrder(tuple(order), frozenset(range(start, start + len(protected))))
