"""Which images to keep: a pure decision over image sizes and the limits of one request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_PLACEHOLDER = "[trimflow: {kind} #{ordinal} omitted ({mime}, {dims}, {size})]"


@dataclass(frozen=True, slots=True)
class Limits:
    """The effective limits for one request, as resolved from the rules.

    A limit is the largest allowed value; None means no limit.
    """

    rule: str = "defaults"
    max_images: int | None = None
    max_body_bytes: int | None = None
    keep_recent: int = 1
    # Drop old images in blocks of this many, so the cut point (and the cached prefix) moves
    # every prune_batch turns instead of every turn.
    prune_batch: int = 1
    placeholder: str = DEFAULT_PLACEHOLDER


@dataclass(frozen=True, slots=True)
class Decision:
    """How many of the oldest images to prune, and why.

    Every limit prunes oldest first and the newest `keep_recent` are never pruned, so a decision is
    always a prefix of the images in document order.
    """

    pruned: int  # the oldest `pruned` images become placeholders
    by_count: int  # of those, how many the image count required; the rest the body budget
    over_budget: bool  # the body budget could not be met even after pruning all it may


def count_pruned(images: int, limits: Limits) -> int:
    """How many of the oldest images the image count limit prunes."""
    prunable = max(0, images - limits.keep_recent)
    if limits.max_images is None or images <= limits.max_images:
        return 0
    excess = images - limits.max_images
    # Round the cut up to whole batches, so it only moves every prune_batch turns.
    batches = -(-excess // limits.prune_batch)
    return min(batches * limits.prune_batch, prunable)


def decide(images: int, limits: Limits, body_bytes_after: Callable[[int], int]) -> Decision:
    """Prune by count, then oldest survivors while the body is over budget.

    `body_bytes_after(k)` is the size of the body with the oldest k images pruned.
    """
    by_count = count_pruned(images, limits)
    pruned = by_count
    budget = limits.max_body_bytes
    if budget is None:
        return Decision(pruned, by_count, False)
    prunable = max(0, images - limits.keep_recent)
    while body_bytes_after(pruned) > budget:
        if pruned >= prunable:
            return Decision(pruned, by_count, True)
        pruned += 1
    return Decision(pruned, by_count, False)
