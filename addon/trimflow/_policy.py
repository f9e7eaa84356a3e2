"""The policy: which images of one request are sent, re-encoded or replaced by a placeholder.

Pure decisions over what the engine found (each image's wire size and header facts) and the limits
that apply. The policy never sees the format module or the parsed document: the engine hands it a
`BodyWriter` that writes and measures the body with a set of placeholders.

The steps, in order over the request's images (each sees what the ones before it left, and every image ends as
sent, re-encoded and sent, or a placeholder). "Oldest" is first in the order the engine gives the images in
(trimflow._value: cut before, then look-alike screens, then by arrival, the user's protected images last, the newest
last of all); a cut stops short of the protected images (`Plan.protected`) unless a cap or budget needs them, and a
look-alike's placeholder names the image after it (`Plan.later`, `lookalike_placeholder`):
1. Repeats (`dedupe`): an image whose base64 payload equals a later image's becomes
   `repeat_placeholder`, pointing at the next later copy (so its text never changes on later turns).
2. Count cap (`max_images`, `prune_batch`): the oldest survivors become placeholders; never the
   newest `keep_recent`.
3. Per-image limits: a survivor over `max_image_bytes` (its base64 length) or `max_image_side`, or
   over `many_images_max_side` when more than `many_images_threshold` images survive step 2, is
   shrunk; one that cannot be is dropped with a placeholder whose {reason} says why - even one of the
   newest `keep_recent`, since the provider would refuse the whole request. With `native_size`, a
   survivor larger than the size its model sees it at (trimflow._tokens.native_size) goes at that size,
   losslessly, unless it is smaller as it came; the model sees what it would have, so it gets no note.
4. Thinning (`thumbnail_side`): survivors older than the newest `keep_recent` go as thumbnails
   (one encode that also meets step 3's limits), so the budgets below drop fewer images.
5. Budgets (`max_body_bytes`, then `max_est_tokens`): the oldest survivors become placeholders
   while the body or the token estimate is over; never the newest `keep_recent`.

The cut (steps 2 and 5 drop the oldest images) decides what a provider's prompt cache can reuse: the
cached prefix ends at the first changed byte. With `low_water`, a conversation's cut is held from turn to
turn (`Plan.held`, from trimflow._conversation) while every cap and budget allows it; when one would
break, the steps run again with each at its low-water mark, so the following turns only append. With
`cache_ttl` too, a conversation idle past it (its cache is cold: everything is written again anyway) is
cut to the mark at once. Images dropped ahead of need that way have the cause CACHE.

Each step also says, from the image count, the payload sizes and the body size alone, whether it
might change the request (`might_change`); a request no step might change is forwarded without
sniffing an image (`nothing_to_change`), but for the native size, which reads each image's header when
the request's model has one. A new limit is one step, or one step's two methods.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from . import _shrink
from ._human import format_size
from ._imageinfo import sniff_media
from ._limits import Limits
from ._media import JsonPath, Media, data_url
from ._placeholder import MediaFacts, render, rescale_note
from ._tokens import Size, image_tokens, native_size, text_tokens


def count_pruned(images: int, limits: Limits) -> int:
    """How many of the oldest images the image count limit prunes."""
    prunable = max(0, images - limits.keep_recent)
    if limits.max_images is None or images <= limits.max_images:
        return 0
    excess = images - limits.max_images
    # Round the cut up to whole batches, so it only moves every prune_batch turns.
    batches = -(-excess // limits.prune_batch)
    return min(batches * limits.prune_batch, prunable)


# A budget: its limit (None = none) and the size with the oldest k candidates pruned.
Budget = tuple[int | None, Callable[[int], int] | None]


def prune_to_budgets(prunable: int, budgets: Sequence[Budget]) -> tuple[list[int], bool]:
    """Prune candidates oldest first while any budget is over.

    Returns which budget pruned each candidate (its index in `budgets`; the first budget over wins)
    and whether a budget is still over once `prunable` candidates are gone.
    """
    causes: list[int] = []
    while True:
        pruned = len(causes)
        cause = next(
            (i for i, (limit, size) in enumerate(budgets) if limit is not None and size is not None and size(pruned) > limit),
            None,
        )
        if cause is None:
            return causes, False
        if pruned >= prunable:
            return causes, True
        causes.append(cause)


class NeedsWorker(Exception):
    """Raised by an inline run (on an event loop) before work too slow for it; says which.

    Control flow, not an error: the caller runs the request again in a worker thread.
    """


class BodyWriter(Protocol):
    """What the policy needs of the request body; the engine implements it over the parsed document."""

    size: int  # the body's length as received

    def write(
        self, texts: Mapping[JsonPath, str], images: Mapping[JsonPath, tuple[str, str]], notes: Mapping[JsonPath, str] | None = None
    ) -> bytes | Any:
        """The body with each media at a path of `texts` replaced by that text and each image at a path
        of `images` carrying new bytes (base64, mime), with `notes` (by image path) beside their images
        (the formats' add_notes); the received bytes when all are empty. The result has a len() and
        becomes bytes() when sent."""
        ...

    def sizer(
        self, images: Mapping[JsonPath, tuple[str, str]], written: Any, paths: list[JsonPath], text: Callable[[int], str]
    ) -> Callable[[int], int]:
        """size_after(k): the compact body's length with `images` re-encoded and the media at the first k
        `paths` replaced by text(n), for n < k; size_after(0) is len(written), the body `write` gave
        with none of them."""
        ...


# Why an image became a placeholder: the record's counter and the placeholder's {reason}. CACHE: pruned
# ahead of need by the cache-aware cut (held from the last turn, or lowered to the low-water mark).
REPEAT, COUNT_CAP, IMAGE_LIMIT, BODY, TOKENS, CACHE = "repeat", "count", "image_limit", "body", "tokens", "cache"
_BUDGET_CAUSES = (BODY, TOKENS)  # in the order of the budgets handed to prune_to_budgets
_CUT_CAUSES = (COUNT_CAP, BODY, TOKENS, CACHE)  # the causes that drop the oldest images: where the cut is
_REASONS = {COUNT_CAP: "too many images", BODY: "request too large", TOKENS: "too many tokens", CACHE: "cut held for the prompt cache"}
_CHUNK = 1 << 20  # chars compared at a time when two payloads sit behind different data URL headers


class Plan:
    """What happens to each image of one request: dropped (with a placeholder and a cause), re-encoded, or kept.

    `inline`: raise NeedsWorker before re-encoding an image (the caller is on an event loop).
    `held` and `cold` come from the conversation's last turn (with `low_water` set): the images before
    position `held` were cut then, and stay cut so the cached prefix still matches; `cold` says the
    provider's cache has expired since, so cutting down to the low-water mark now costs nothing extra.
    """

    def __init__(
        self,
        images: list[MediaFacts],
        limits: Limits,
        fmt: str,
        model: str | None,
        *,
        inline: bool = False,
        held: int = 0,
        cold: bool = False,
        computer_use: bool = False,
        accepts_webp: bool = False,
        protected: frozenset[int] = frozenset(),
        later: Mapping[int, int] | None = None,
        uploaded: bool = False,
    ) -> None:
        self.images, self.limits, self.fmt, self.model, self.inline = images, limits, fmt, model, inline
        self.held, self.cold = held, cold
        # The user's protected images (trimflow._value): the cut takes them after every other image above the floor.
        self.protected = protected
        # Look-alikes (trimflow._lookalike): image -> the ordinal of the image after it, which shows the same screen;
        # the cut takes them first, and their placeholder names it.
        self.later = later or {}
        self.computer_use = computer_use  # the request declares a computer tool: the rescale note asks for its pixels
        self.accepts_webp = accepts_webp  # every provider behind the format decodes WebP (WireFormat.ACCEPTS_WEBP)
        self.uploaded = uploaded  # its images go up once and by reference after (send_once where the route has a Files API)
        self.dropped: dict[int, tuple[str, str]] = {}  # image index -> (cause, placeholder text)
        self.new: dict[int, _shrink.Shrunk] = {}  # image index -> its re-encoded bytes
        self.thinned: set[int] = set()  # of `new`, the ones made thumbnails by age
        self.native: set[int] = set()  # of `new`, the ones at the size the model sees them at and over no limit
        self.over_budget = False

    def run(self, body: BodyWriter, media_bytes: int) -> bytes | Any:
        """Every step in order; returns the body to send. `media_bytes`: the wire bytes of all the
        request's media (documents too), which the token estimate leaves out of the text.

        A conversation that has never gone over a cap (nothing held from an earlier cut, nothing cut by this
        request's caps) is sent as the steps leave it: no voluntary cap, no cold cut. Once it has, the steps
        run again under `max_images_after_overflow`, and with `low_water`, when a cap or budget still breaks
        (the cut must move) or the cache is cold, again with every cap and budget at its low-water mark, so
        the next turns only append until one breaks again."""
        survivors = _Repeats.apply(self, list(range(len(self.images))))
        need = count_pruned(len(survivors), self.limits)  # what the count cap alone asks for
        survivors = self._hold(survivors)
        base = dict(self.dropped)
        card = self.limits
        out = self._steps(survivors, body, media_bytes)
        moved = self._moved()
        overflowed = self.held > 0 or moved
        lean = card.after_overflow()
        if overflowed and lean is not card:
            out = self._again(lean, base, survivors, body, media_bytes)
            moved = self._moved()
        if card.low_water is not None and (moved or (self.cold and overflowed)):
            first, first_over, limits = set(self.dropped), self.over_budget, self.limits
            out = self._again(self._low_water(card, survivors), base, survivors, body, media_bytes)
            self.limits = limits
            for i, (cause, text) in list(self.dropped.items()):
                if cause in _CUT_CAUSES[:-1] and i not in first:
                    self.dropped[i] = (CACHE, text)
            # Pruning down to the low-water mark meets every budget the first pass met.
            self.over_budget = first_over and self.over_budget
        # Of the images the cut took, the oldest ones the count cap asked for count as its own; the rest went ahead
        # of need (a voluntary cap, the low-water mark).
        taken = 0
        for i in sorted(self.dropped):
            cause, text = self.dropped[i]
            if cause in (COUNT_CAP, CACHE):
                self.dropped[i] = (COUNT_CAP if taken < need else CACHE, text)
                taken += 1
        return out

    def _low_water(self, card: Limits, survivors: list[int]) -> Limits:
        """`card` at its low-water mark, the image mark raised where the user's protected images and the newest
        `keep_recent` need more (never past the cap held after an overflow): a cut ahead of need never takes them."""
        low = card.at_low_water()
        protected = sum(1 for i in survivors if i in self.protected)
        if not protected or low.max_images is None or protected + low.keep_recent <= low.max_images:
            return low
        cap = card.after_overflow().max_images
        mark = protected + low.keep_recent
        return dataclasses.replace(low, max_images=mark if cap is None else min(mark, cap))

    def _moved(self) -> bool:
        """Whether a cap or budget cut images beyond the held cut: the cut moves on this turn."""
        return any(cause in _CUT_CAUSES[:-1] for cause, _ in self.dropped.values())

    def _again(self, limits: Limits, base: dict[int, tuple[str, str]], survivors: list[int], body: BodyWriter, media_bytes: int) -> bytes | Any:
        """The steps run again from `base` (the repeats and the held cut) under `limits`, which the plan keeps."""
        self.dropped, self.new, self.thinned, self.native = dict(base), {}, set(), set()
        self.limits = limits
        return self._steps(survivors, body, media_bytes)

    def _steps(self, survivors: list[int], body: BodyWriter, media_bytes: int) -> bytes | Any:
        for step in STEPS[1:-1]:
            survivors = step.apply(self, survivors)
        return _Budgets.write(self, survivors, body, media_bytes)

    def _hold(self, survivors: list[int]) -> list[int]:
        """Drop the survivors before the held position (never the newest keep_recent); returns the rest."""
        if not self.held:
            return survivors
        prunable = max(0, len(survivors) - self.limits.keep_recent)
        held = [i for i in survivors[:prunable] if i < self.held]
        for i in held:
            self.drop(i, CACHE)
        return survivors[len(held) :]

    def cut(self) -> int:
        """The position the cut ends at: one past the newest image pruned from the oldest (0: no cut).
        The conversation keeps it for its next turn (the `held` of that turn's plan)."""
        return max((i + 1 for i, (cause, _) in self.dropped.items() if cause in _CUT_CAUSES), default=0)

    # -- helpers for the steps

    def drop(self, i: int, cause: str, reason: str | None = None) -> None:
        later = self.later.get(i) if cause in _CUT_CAUSES else None
        if later is not None:
            text = render(self.limits.lookalike_placeholder, self.images[i], reason or _REASONS[cause], later=later)
        else:
            text = render(self.limits.placeholder, self.images[i], reason or _REASONS[cause])
        self.dropped[i] = (cause, text)

    def fit(self, i: int, side: int | None, thumb: int | None) -> None:
        """Shrink image i under the per-image limits and, when `thumb` is set, to a thumbnail."""
        facts, max_bytes = self.images[i], self.limits.max_image_bytes
        m = facts.media
        if m.data is None:
            return  # nothing to shrink here: the provider fetches it
        info = facts.info
        long_side = max(info.width, info.height) if info is not None and info.width and info.height else None
        over_bytes = max_bytes is not None and m.payload_bytes > max_bytes
        over_side = side is not None and long_side is not None and long_side > side
        thinning = thumb is not None and long_side is not None and long_side > thumb
        native = self.native_target(i)
        if not (over_bytes or over_side or thinning or native):
            return  # within every limit and the size the model sees, by its header: never decoded
        if self.inline:
            raise NeedsWorker("an image to re-encode")
        sides = [s for s in (side, thumb) if s is not None]
        max_side = min(sides) if sides else None
        result = _shrink.shrink(
            m.data[m.data_offset :], max_side=max_side, max_bytes=max_bytes, webp=self.accepts_webp, size=native, once=self.uploaded
        )
        if result.data is not None:
            self.new[i] = result
            if thinning:
                self.thinned.add(i)
            elif not (over_bytes or over_side):
                self.native.add(i)
        elif result.reason is not None and (over_bytes or over_side):
            limit = f"over {format_size(max_bytes)}" if over_bytes and max_bytes is not None else f"over {side}px"
            self.drop(i, IMAGE_LIMIT, f"{limit}, {result.reason}")
        # else: a thumbnail that can't be made (undecodable, a pixel bomb): the image goes as it is

    def native_target(self, i: int) -> Size | None:
        """The size the model sees image i at, when the rules send it at that size (`native_size`) and it is larger."""
        facts = self.images[i]
        info = facts.info
        if not self.limits.native_size or facts.media.data is None or info is None or not info.width or not info.height:
            return None
        size = native_size(self.fmt, self.model, info.width, info.height, facts.media.detail)
        return size if size is not None and size != (info.width, info.height) else None

    def rescaled(self) -> list[int]:
        """The images sent at other dimensions than they came, to meet a per-image limit or at the size the model
        sees (thumbnails are not: they stand for old screens), in document order."""
        out = []
        for i, new in sorted(self.new.items()):
            info = self.images[i].info
            if i in self.dropped or i in self.thinned or info is None or not info.width or not info.height:
                continue
            if (new.width, new.height) != (info.width, info.height):
                out.append(i)
        return out

    def notes(self) -> dict[JsonPath, str]:
        """The rescale note of each rescaled image, by its path (none when the rule turns them off, and none for an
        image sent at the size its model sees it at: the model sees what it would have seen of the original)."""
        if not self.limits.rescale_note:
            return {}
        out: dict[JsonPath, str] = {}
        for i in self.rescaled():
            new = self.new[i]
            assert new.width is not None and new.height is not None
            if (new.width, new.height) == self.native_target(i):
                continue
            out[self.images[i].media.path] = rescale_note(self.images[i], new.width, new.height, self.computer_use)
        return out

    def new_images(self) -> dict[JsonPath, tuple[str, str]]:
        """The re-encoded images by path: (base64, mime)."""
        out: dict[JsonPath, tuple[str, str]] = {}
        for i, shrunk in self.new.items():
            assert shrunk.data is not None and shrunk.mime is not None
            out[self.images[i].media.path] = (shrunk.data, shrunk.mime)
        return out

    # -- what each image weighs as it would be sent

    def wire_bytes(self, i: int) -> int:
        m, new = self.images[i].media, self.new.get(i)
        if new is None:
            return m.wire_bytes
        assert new.data is not None and new.mime is not None
        # A data URL gets a new header with the new type; the other formats carry bare base64.
        return len(data_url(new.data, new.mime)) if m.data_offset else len(new.data)

    def tokens(self, i: int, as_sent: bool = True) -> int:
        facts = self.images[i]
        info = self.new[i].info if as_sent and i in self.new else facts.info
        width, height = (info.width, info.height) if info is not None else (None, None)
        return image_tokens(self.fmt, self.model, width, height, facts.media.detail)

    def media_bytes_after(self, media_bytes: int) -> int:
        """`media_bytes` (all media as received) as sent: placeholders weigh nothing here, re-encoded images their new size."""
        return media_bytes - sum(m.media.wire_bytes - (0 if i in self.dropped else self.wire_bytes(i)) for i, m in enumerate(self.images))


class _Repeats:
    """Step 1: an image repeated later in the request is sent once, at its latest place."""

    @staticmethod
    def might_change(images: Sequence[Media], limits: Limits, body_bytes: int) -> bool:
        return limits.dedupe and len(images) > 1

    @staticmethod
    def apply(plan: Plan, survivors: list[int]) -> list[int]:
        images, limits = plan.images, plan.limits
        if limits.dedupe:
            for i, later in _repeats(images).items():
                text = render(limits.repeat_placeholder, images[i], f"repeated as image #{images[later].ordinal}", later=images[later].ordinal)
                plan.dropped[i] = (REPEAT, text)
        return [i for i in survivors if i not in plan.dropped]


class _CountCap:
    """Step 2: the oldest survivors go while more than max_images are left (in prune_batch blocks)."""

    @staticmethod
    def might_change(images: Sequence[Media], limits: Limits, body_bytes: int) -> bool:
        return count_pruned(len(images), limits) > 0

    @staticmethod
    def apply(plan: Plan, survivors: list[int]) -> list[int]:
        limits = plan.limits
        by_count = count_pruned(len(survivors), limits)
        if by_count and plan.protected:
            # A batch stops short of the user's protected images (they sit last, before the newest) where the cap allows.
            assert limits.max_images is not None  # something is cut by count
            prunable = max(0, len(survivors) - limits.keep_recent)
            free = sum(1 for i in survivors[:prunable] if i not in plan.protected)
            by_count = max(min(by_count, free), min(len(survivors) - limits.max_images, prunable))
        for i in survivors[:by_count]:
            plan.drop(i, COUNT_CAP)
        return survivors[by_count:]


class _ImageLimits:
    """Steps 3 and 4: per-image byte and side limits, and thumbnails of the older images."""

    @staticmethod
    def might_change(images: Sequence[Media], limits: Limits, body_bytes: int) -> bool:
        if limits.thumbnail_side is not None or limits.image_side_limit(len(images)) is not None:
            return True  # needs each image's dimensions
        max_bytes = limits.max_image_bytes
        return max_bytes is not None and any(m.payload_bytes > max_bytes for m in images)

    @staticmethod
    def apply(plan: Plan, survivors: list[int]) -> list[int]:
        limits = plan.limits
        side = limits.image_side_limit(len(survivors))
        thumb = limits.thumbnail_side
        older = set(survivors[: max(0, len(survivors) - limits.keep_recent)]) if thumb is not None else set()
        if side is not None or limits.max_image_bytes is not None or older or limits.native_size:
            for i in survivors:
                plan.fit(i, side, thumb if i in older else None)
        return [i for i in survivors if i not in plan.dropped]


class _Budgets:
    """Step 5: the oldest survivors go while the body or the token estimate is over its budget."""

    @staticmethod
    def might_change(images: Sequence[Media], limits: Limits, body_bytes: int) -> bool:
        if limits.max_est_tokens is not None:
            return True  # needs each image's dimensions
        return limits.max_body_bytes is not None and body_bytes > limits.max_body_bytes

    @staticmethod
    def write(plan: Plan, candidates: list[int], body: BodyWriter, media_bytes: int) -> bytes | Any:
        """Prune the oldest candidates while a budget is over; returns the body to send."""
        images, limits = plan.images, plan.limits
        new = plan.new_images()
        fixed = {images[i].media.path: text for i, (_, text) in plan.dropped.items()}
        notes = plan.notes()

        def rewrite(k: int) -> bytes | Any:
            texts = dict(fixed)
            for i in candidates[:k]:
                texts[images[i].media.path] = plan.dropped[i][1]
            return body.write(texts, new, {path: note for path, note in notes.items() if path not in texts})

        out = rewrite(0)
        if limits.max_body_bytes is None and limits.max_est_tokens is None:
            return out
        prunable = max(0, len(candidates) - limits.keep_recent)

        def budget_text(n: int) -> str:
            return render(limits.placeholder, images[candidates[n]], _REASONS[BODY])

        size_after = body.sizer(new, out, [images[i].media.path for i in candidates], budget_text)
        # Media bytes and image tokens as sent, with the oldest k candidates pruned.
        media_base = plan.media_bytes_after(media_bytes)
        wire_prefix = [0]
        for i in candidates:
            wire_prefix.append(wire_prefix[-1] + plan.wire_bytes(i))
        token_suffix = [0]
        if limits.max_est_tokens is not None:
            for i in reversed(candidates):
                token_suffix.append(token_suffix[-1] + plan.tokens(i))
            token_suffix.reverse()

        def tokens_after(k: int) -> int:
            return text_tokens(size_after(k) - (media_base - wire_prefix[k])) + token_suffix[k]

        causes, _ = prune_to_budgets(prunable, [(limits.max_body_bytes, size_after), (limits.max_est_tokens, tokens_after)])
        for n, cause in enumerate(causes):
            plan.drop(candidates[n], _BUDGET_CAUSES[cause])
        if causes:
            out = rewrite(len(causes))
        # The accounting above is exact for every format but Ollama's joined notes and a fallback
        # codec: check the body as written and prune further while it is still over.
        k = len(causes)
        while True:
            over = _over(plan, out, media_base - wire_prefix[k], candidates, k)
            if over is None or k >= prunable:
                break
            plan.drop(candidates[k], over)
            k += 1
            out = rewrite(k)
        plan.over_budget = over is not None
        return out


def _over(plan: Plan, out: Any, media_after: int, candidates: list[int], k: int) -> str | None:
    """Which budget the written body `out` (with the oldest k candidates pruned) is over, if any."""
    limits = plan.limits
    if limits.max_body_bytes is not None and len(out) > limits.max_body_bytes:
        return BODY
    if limits.max_est_tokens is not None:
        tokens = text_tokens(len(out) - media_after) + sum(plan.tokens(i) for i in candidates[k:])
        if tokens > limits.max_est_tokens:
            return TOKENS
    return None


STEPS = (_Repeats, _CountCap, _ImageLimits, _Budgets)


def nothing_to_change(images: Sequence[Media], limits: Limits, body_bytes: int, fmt: str | None = None, model: str | None = None) -> bool:
    """Whether no step can change this request, known without sniffing an image; with its wire format and model,
    also that no image's header says it is larger than the model sees it (`native_size`)."""
    if any(step.might_change(images, limits, body_bytes) for step in STEPS):
        return False
    return fmt is None or not _over_native_size(images, limits, fmt, model)


def _over_native_size(images: Sequence[Media], limits: Limits, fmt: str, model: str | None) -> bool:
    """Whether an image's header says it is larger than the size its model sees it at (read only for a model that
    has one: the headers of the others are never read here)."""
    if not limits.native_size or native_size(fmt, model, 1 << 16, 1 << 16) is None:
        return False
    for m in images:
        info = None if m.data is None else sniff_media(m)
        if info is not None and info.width and info.height:
            size = native_size(fmt, model, info.width, info.height, m.detail)
            if size is not None and size != (info.width, info.height):
                return True
    return False


def _repeats(images: list[MediaFacts]) -> dict[int, int]:
    """Image index -> the index of the next later image with the same base64 payload."""
    groups: dict[tuple[int, str, str], list[int]] = {}
    for i, facts in enumerate(images):
        m = facts.media
        if m.data is None or m.payload_bytes < 1:
            continue
        # A cheap key first (length, head, tail); payloads are compared only within a group.
        key = (m.payload_bytes, m.data[m.data_offset : m.data_offset + 64], m.data[-64:])
        groups.setdefault(key, []).append(i)
    later: dict[int, int] = {}
    for members in groups.values():
        for pos, i in enumerate(members):
            for j in members[pos + 1 :]:
                if _same_payload(images[i].media, images[j].media):
                    later[i] = j
                    break
    return later


def _same_payload(a: Media, b: Media) -> bool:
    assert a.data is not None and b.data is not None
    if a.data == b.data:
        return True  # the usual repeat: the very same text, header included; no copy made
    n = a.payload_bytes
    if n != b.payload_bytes:
        return False
    # Same bytes behind different data URL headers: compare in slices rather than copy 10 MB twice.
    return all(
        a.data[a.data_offset + k : a.data_offset + k + _CHUNK] == b.data[b.data_offset + k : b.data_offset + k + _CHUNK] for k in range(0, n, _CHUNK)
    )
