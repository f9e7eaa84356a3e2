"""The limits one request is pruned within (`Limits`), as the rules resolve them: each field with what the rules
parser checks of its value (kind, smallest value, null allowed, the field it goes with). Pure data: the planner
(trimflow._policy) applies them, the rules (trimflow._rules) read them, the learned limits tighten them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ._placeholder import DEFAULT_LOOKALIKE_PLACEHOLDER, DEFAULT_PLACEHOLDER, DEFAULT_REPEAT_PLACEHOLDER

# Kinds of limit, for the rules parser: what a value may be.
COUNT, SIZE, SIDE, BOOL, TEMPLATE = "count", "size", "side", "bool", "template"
FRACTION, DURATION = "fraction", "duration"  # a share in (0, 1]; seconds, written 300, 90s, 5m or 1h
MIN_IMAGE_BYTES = 1024  # a byte limit below this is a typo (5 instead of 5MiB), not a real limit
MIN_SIDE = 16  # the smallest long side the shrink ladder goes down to


def _limit(
    default: Any, kind: str, doc: str, *, minimum: int | None = None, nullable: bool = True, pair: str | None = None, needs: str | None = None
) -> Any:
    """A Limits field with what the rules parser needs to check a value: its kind, smallest value,
    whether null (no limit) is allowed, the field it only means something together with (`pair`: both
    or neither) and the field it cannot do without (`needs`)."""
    metadata = {"kind": kind, "doc": doc, "min": minimum, "nullable": nullable, "pair": pair, "needs": needs}
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True, slots=True)
class Limits:
    """The effective limits for one request, as resolved from the rules. None means no limit.

    Each field's metadata (kind, min, nullable, pair, doc) is what the rules parser validates
    against; a new limit is one field here and one step below.
    """

    rule: str = dataclasses.field(default="defaults", metadata={"kind": None})  # the rule's name, not a limit
    max_images: int | None = _limit(None, COUNT, "most images a request may send", minimum=0)
    max_body_bytes: int | None = _limit(None, SIZE, "body budget in bytes: the oldest images go while over", minimum=0)
    keep_recent: int = _limit(1, COUNT, "the newest N images are never pruned by count or budget", minimum=0, nullable=False)
    prune_batch: int = _limit(
        1, COUNT, "drop old images in blocks of N, so the cut (and a cached prefix) moves every N turns", minimum=1, nullable=False
    )
    placeholder: str = _limit(DEFAULT_PLACEHOLDER, TEMPLATE, "the text that stands where an image was", nullable=False)
    max_image_bytes: int | None = _limit(None, SIZE, "largest base64 length of one image; over it, shrunk", minimum=MIN_IMAGE_BYTES)
    max_image_side: int | None = _limit(None, SIDE, "largest long side of one image in px; over it, shrunk", minimum=MIN_SIDE)
    many_images_threshold: int | None = _limit(
        None, COUNT, "with more images than this, many_images_max_side applies", minimum=0, pair="many_images_max_side"
    )
    many_images_max_side: int | None = _limit(None, SIDE, "long side limit when many images are sent", minimum=MIN_SIDE, pair="many_images_threshold")
    thumbnail_side: int | None = _limit(None, SIDE, "images older than the newest keep_recent go as thumbnails this big", minimum=MIN_SIDE)
    max_est_tokens: int | None = _limit(None, COUNT, "budget on the estimated prompt tokens, pruning like max_body_bytes", minimum=0)
    dedupe: bool = _limit(False, BOOL, "an image byte-identical to a later one becomes repeat_placeholder", nullable=False)
    rescale_note: bool = _limit(
        True, BOOL, "an image shrunk to other dimensions gets a text part in its message: original and new size, scale", nullable=False
    )
    native_size: bool = _limit(
        True,
        BOOL,
        "an image larger than its model sees it is sent at the size the provider would scale it to (where that is documented)",
        nullable=False,
    )
    send_once: bool = _limit(
        False,
        BOOL,
        "each image goes up once: uploaded to the provider's Files API on its first appearance and referenced by file id "
        "from then on (Anthropic direct, OpenAI Responses)",
        nullable=False,
    )
    repeat_placeholder: str = _limit(DEFAULT_REPEAT_PLACEHOLDER, TEMPLATE, "the text that stands where a repeated image was", nullable=False)
    low_water: float | None = _limit(
        None,
        FRACTION,
        "when a cap or budget would break, cut down to this share of each and hold the cut until one would break again",
    )
    cache_ttl: float | None = _limit(
        None,
        DURATION,
        "a conversation idle longer than this has a cold prompt cache: once it has gone over a cap, cut it to the low-water mark at once",
        needs="low_water",
    )
    max_images_after_overflow: int | None = _limit(
        None,
        COUNT,
        "once a conversation has gone over a cap, send at most this many images (a voluntary cap within max_images, for a cheaper cache)",
        minimum=1,
    )
    protect_user_images: int | None = _limit(
        None,
        COUNT,
        "the newest N images the user attached (older than the newest tool or agent image) are cut last, after every other "
        "image above the floor; null: as many as fit under the cap with the floor kept; 0: none, every image by age",
        minimum=0,
    )
    cut_lookalikes: bool = _limit(
        True,
        BOOL,
        "a screenshot that shows the same screen as the image after it (a moved cursor, a later clock) is cut before any other",
        nullable=False,
    )
    lookalike_placeholder: str = _limit(
        DEFAULT_LOOKALIKE_PLACEHOLDER, TEMPLATE, "the text that stands where a look-alike screenshot was", nullable=False
    )

    def image_side_limit(self, images: int) -> int | None:
        """The long side limit for a request that sends `images` images."""
        sides = [self.max_image_side]
        if self.many_images_threshold is not None and images > self.many_images_threshold:
            sides.append(self.many_images_max_side)
        present = [s for s in sides if s is not None]
        return min(present) if present else None

    def after_overflow(self) -> Limits:
        """These limits for a conversation that has gone over a cap: `max_images_after_overflow` as its image cap
        (never above `max_images`). A conversation within every cap is sent as it came."""
        lean = self.max_images_after_overflow
        if lean is None or (self.max_images is not None and lean >= self.max_images):
            return self
        return dataclasses.replace(self, max_images=lean)

    def user_images_protected(self) -> int | None:
        """How many of the user's attached images the cut takes last (trimflow._value): `protect_user_images`, or by
        default as many as fit under the cap held after an overflow beside the floor a cut leaves (the low-water mark,
        else what a batch leaves: cap - prune_batch + 1). None: no bound (no image cap)."""
        if self.protect_user_images is not None:
            return self.protect_user_images
        cap = self.after_overflow().max_images
        if cap is None:
            return None
        floor = self.at_low_water().max_images if self.low_water is not None else cap - self.prune_batch + 1
        return max(0, cap - max(floor or 0, self.keep_recent))

    def at_low_water(self) -> Limits:
        """These limits with each cap and budget at its low-water mark: what a cut that moves cuts down to. The mark
        is a share of `max_images` (the cap a conversation may reach before its first cut), at most the cap held after
        an overflow."""
        share = self.low_water
        if share is None:
            return self

        def lowered(limit: int | None) -> int | None:
            return None if limit is None else int(limit * share)

        images = lowered(self.max_images)
        lean = self.max_images_after_overflow
        if images is not None and lean is not None:
            images = min(images, lean)
        return dataclasses.replace(
            self,
            max_images=images,
            max_body_bytes=lowered(self.max_body_bytes),
            max_est_tokens=lowered(self.max_est_tokens),
            prune_batch=1,
        )


LIMIT_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Limits) if f.metadata.get("kind"))


def changed_fields(before: Limits, after: Limits) -> str | None:
    """The limits `after` sets differently from `before`, as "max_images=4 keep_recent=4"; None when none."""
    changed = [f"{name}={getattr(after, name)}" for name in LIMIT_FIELDS if getattr(after, name) != getattr(before, name)]
    return " ".join(changed) or None
