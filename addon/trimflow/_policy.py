"""Which images to keep: a pure decision over image sizes and the limits of one request."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

DEFAULT_PLACEHOLDER = "[trimflow: {kind} #{ordinal} omitted ({mime}, {dims}, {size})]"
# Stands where an image was that the same request sends again later; {later} is that image's ordinal.
DEFAULT_REPEAT_PLACEHOLDER = "[trimflow: image #{ordinal} repeated as image #{later}]"

# A budget: its limit (None = none) and the size with the oldest k candidates pruned.
Budget = tuple[int | None, Callable[[int], int] | None]


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
    # Per image (see _engine for the order they apply in): the base64 length of one image's data,
    # the long side in px, and the many-image rule (more than `many_images_threshold` images in
    # the request: no side over `many_images_max_side`). Over a limit, an image is shrunk.
    max_image_bytes: int | None = None
    max_image_side: int | None = None
    many_images_threshold: int | None = None
    many_images_max_side: int | None = None
    # Older images than the newest keep_recent are sent as thumbnails with this long side.
    thumbnail_side: int | None = None
    # A budget on the estimated prompt tokens, pruning like max_body_bytes.
    max_est_tokens: int | None = None
    # An image byte-identical to a later one in the request becomes repeat_placeholder.
    dedupe: bool = False
    repeat_placeholder: str = DEFAULT_REPEAT_PLACEHOLDER

    def image_side_limit(self, images: int) -> int | None:
        """The long side limit for a request that sends `images` images."""
        sides = [self.max_image_side]
        if self.many_images_threshold is not None and images > self.many_images_threshold:
            sides.append(self.many_images_max_side)
        present = [s for s in sides if s is not None]
        return min(present) if present else None


@dataclass(frozen=True, slots=True)
class Decision:
    """How many of the oldest images to prune, and why.

    Every limit prunes oldest first and the newest `keep_recent` are never pruned, so a decision is
    always a prefix of the images in document order.
    """

    pruned: int  # the oldest `pruned` images become placeholders
    by_count: int  # of those, how many the image count required; the rest the budgets
    over_budget: bool  # a budget could not be met even after pruning all it may
    by_tokens: int = 0  # of the budget's share, how many the token budget required (the rest: body)


def count_pruned(images: int, limits: Limits) -> int:
    """How many of the oldest images the image count limit prunes."""
    prunable = max(0, images - limits.keep_recent)
    if limits.max_images is None or images <= limits.max_images:
        return 0
    excess = images - limits.max_images
    # Round the cut up to whole batches, so it only moves every prune_batch turns.
    batches = -(-excess // limits.prune_batch)
    return min(batches * limits.prune_batch, prunable)


def decide(
    images: int,
    limits: Limits,
    body_bytes_after: Callable[[int], int],
    est_tokens_after: Callable[[int], int] | None = None,
) -> Decision:
    """Prune by count, then oldest survivors while the body or the token estimate is over budget.

    `body_bytes_after(k)` is the size of the body with the oldest k images pruned, and
    `est_tokens_after(k)` its estimated tokens (the token budget is ignored without it).
    """
    by_count = count_pruned(images, limits)
    prunable = max(0, images - limits.keep_recent)
    causes, over = prune_to_budgets(
        prunable, [(limits.max_body_bytes, body_bytes_after), (limits.max_est_tokens, est_tokens_after)], by_count
    )
    return Decision(by_count + len(causes), by_count, over, causes.count(1))


def prune_to_budgets(prunable: int, budgets: Sequence[Budget], start: int = 0) -> tuple[list[int], bool]:
    """Prune candidates oldest first, from `start` on, while any budget is over.

    Returns which budget pruned each further candidate (its index in `budgets`; the first budget
    over wins) and whether a budget is still over once `prunable` candidates are gone.
    """
    causes: list[int] = []
    pruned = start
    while True:
        cause = next(
            (i for i, (limit, size) in enumerate(budgets) if limit is not None and size is not None and size(pruned) > limit),
            None,
        )
        if cause is None:
            return causes, False
        if pruned >= prunable:
            return causes, True
        causes.append(cause)
        pruned += 1
