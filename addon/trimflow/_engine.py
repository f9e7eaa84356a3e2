"""The engine: one request in (URL, headers, body bytes), the body to forward and a record out.

Pure Python with no mitmproxy import, so the proxy, the command-line tools and the audit share it.
It never raises on bad input: the caller gets the original bytes and a reason in the record.

Order of operations over the request's images, in document order (each step sees what the ones
before it left, and every image ends as sent, re-encoded and sent, or a placeholder):
1. Repeats (`dedupe`): an image whose base64 payload equals a later image's becomes
   `repeat_placeholder`, pointing at the next later copy (so its text never changes on later turns).
2. Count cap (`max_images`, `prune_batch`): the oldest survivors become placeholders; never the
   newest `keep_recent`.
3. Per-image limits: a survivor over `max_image_bytes` (its base64 length) or `max_image_side`, or
   over `many_images_max_side` when more than `many_images_threshold` images survive step 2, is
   shrunk (_shrink); one that cannot be is dropped with a placeholder whose {reason} says why -
   even one of the newest `keep_recent`, since the provider would refuse the whole request.
4. Thinning (`thumbnail_side`): survivors older than the newest `keep_recent` go as thumbnails
   (one encode that also meets step 3's limits), so the budgets below drop fewer images.
5. Budgets (`max_body_bytes`, then `max_est_tokens`): the oldest survivors become placeholders
   while the body or the token estimate is over; never the newest `keep_recent`.
A declared type that differs from the bytes' real type is only counted (`mime_mismatches`).

Where it runs: `inline=True` is for a caller on an event loop (the proxy). Work at memchr speed over
a body of up to INLINE_MAX_BODY runs there; a larger body, one that needs a full JSON parse over
INLINE_MAX_WHOLE, or an image to re-encode raises NeedsWorker before that work starts, and the
caller runs the request again in a worker thread (without `inline`). An inline run that can tell
from the image count and body size alone that nothing changes stops there: the body goes as it
came, and the record (header sniffing, token estimates) is worked out on first use of
`Outcome.record`, which the proxy does once the request is on its way.

Fidelity: when nothing changes the output is the input bytes object itself; the input is never
mutated; running on its own output changes nothing (shrunk images and thumbnails are within the
limits that made them, and re-encoding is deterministic and cached by content hash).
Only images over a limit (or thinned) are ever decoded; the rest is header sniffing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from . import _document, _jsoncodec, _shrink
from ._conversation import conversation_key
from ._imageinfo import ImageInfo, sniff_base64
from ._placeholder import MediaFacts, render
from ._policy import Limits, count_pruned, prune_to_budgets
from ._record import Record, utc_timestamp
from ._sizes import format_size
from ._rules import Rules, Target
from ._tokens import image_tokens, text_tokens
from .formats import FORMATS, IMAGE, Media, WireFormat, detect_shape
from .formats import openai_responses

ENFORCE = "enforce"
OBSERVE = "observe"
MODES = (ENFORCE, OBSERVE)

# Inline limits. The skeleton pass costs ~0.15 ms per MB timed inside mitmdump (memory speed), and a
# 15.7 MB turn pruned holds the loop ~5 ms in all, a fraction of what mitmproxy spends reading that body.
# A full parse runs ~10x slower per byte; image re-encoding takes 25-250 ms per megapixel.
INLINE_MAX_BODY = 16 * 2**20
INLINE_MAX_WHOLE = 2**20


class NeedsWorker(Exception):
    """Raised by prune_request(inline=True) before work too slow for an event loop; says which."""


# Enough base64 to reach a JPEG's frame header past a large EXIF block, without copying a whole image.
_SNIFF_CHARS = 256 * 1024
_SNIFF_FIRST = 4096


class Outcome:
    """What to forward, and the record (None when the request is not an LLM request).

    An inline run that finds nothing to change leaves the record to be worked out on first use
    (`record_pending`): the proxy forwards the request first and accounts for it while the provider works.
    """

    __slots__ = ("_body", "_record", "_account")

    def __init__(self, body: bytes | _document.Written, record: Record | None, account: Callable[[], Record | None] | None = None) -> None:
        self._body, self._record, self._account = body, record, account

    @property
    def record(self) -> Record | None:
        if self._account is not None:
            self._record, self._account = self._account(), None
        return self._record

    @property
    def record_pending(self) -> bool:
        return self._account is not None

    @property
    def body(self) -> bytes:
        """The body to forward: the input object itself when nothing changed. A rewritten body is
        joined here, on first use, in the caller's thread (see _document.Written)."""
        if not isinstance(self._body, bytes):
            self._body = bytes(self._body)
        return self._body

    @property
    def changed(self) -> bool:
        if self._account is not None:
            return False  # only a run that changes nothing leaves its record for later
        record = self._record
        return record is not None and record.mode == ENFORCE and (record.pruned > 0 or record.shrunk > 0 or record.thinned > 0)


def is_sigv4(headers: Mapping[str, str]) -> bool:
    """AWS SigV4 signs a hash of the body: any rewrite would fail the signature."""
    auth = headers.get("authorization", "")
    return auth.startswith("AWS4-HMAC-SHA256") or "x-amz-content-sha256" in headers


def prune_request(
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    rules: Rules,
    mode: str = ENFORCE,
    wire_format: str | None = None,
) -> Outcome:
    """Apply the rules to one request given by its URL (a Host header in `headers` names the host, as
    for the proxy). `wire_format` forces a format (a Responses WebSocket message)."""
    target = rules.target_for_url(url, headers, wire_format)
    return Outcome(body, None) if target is None else prune(target, headers, body, rules, mode)


def prune(
    target: Target,
    headers: Mapping[str, str],
    body: bytes,
    rules: Rules,
    mode: str = ENFORCE,
    inline: bool = False,
) -> Outcome:
    """Apply the rules to one request whose Target the caller resolved (Rules.target).

    With `inline`, raises NeedsWorker instead of starting slow work (see the module's docstring).
    """
    started = time.perf_counter()
    host, path, fmt = target.host, target.path, target.format
    if inline and len(body) > INLINE_MAX_BODY:
        raise NeedsWorker(f"a body over {format_size(INLINE_MAX_BODY)}")
    try:
        doc = _document.parse(body, INLINE_MAX_WHOLE if inline else None)
    except _jsoncodec.BodyError as exc:
        if fmt is None:
            return Outcome(body, None)
        return _untouched(body, host, path, fmt, mode, str(exc), started)
    if doc is None:
        raise NeedsWorker(f"a full parse of a body over {format_size(INLINE_MAX_WHOLE)}")
    parsed = doc.parsed
    if fmt is None:
        fmt = detect_shape(parsed)
        if fmt is None:
            return Outcome(body, None)
    if not isinstance(parsed, dict):
        return _untouched(body, host, path, fmt, mode, f"body is a JSON {_JSON_TYPES.get(type(parsed), 'value')}, not an object", started)
    lowered = {name.lower(): value for name, value in headers.items()}

    def failed(exc: Exception) -> Outcome:
        # A payload is decoded only when read (_document.Payload): that is where a bad escape in one shows.
        reason = str(exc) if isinstance(exc, _jsoncodec.BodyError) else f"internal error: {type(exc).__name__}"
        return _untouched(body, host, path, fmt, mode, reason, started)

    def guard(compute: Callable[[], Record]) -> Callable[[], Record | None]:
        def guarded() -> Record | None:
            try:
                return compute()
            except Exception as exc:  # noqa: BLE001 - as below: the record says what went wrong
                return failed(exc).record

        return guarded

    try:
        return _prune(doc, host, path, lowered, fmt, rules, mode, started, inline, guard if inline else None)
    except NeedsWorker:
        raise
    except Exception as exc:  # noqa: BLE001 - the request must go through whatever the body holds
        return failed(exc)


_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def _untouched(body: bytes, host: str, path: str, fmt: str, mode: str, reason: str, started: float) -> Outcome:
    record = Record(utc_timestamp(), None, None, host, path, fmt, None, None, mode, reason=reason)
    record.body_bytes_before = record.body_bytes_after = len(body)
    record.overhead_ms = _elapsed_ms(started)
    return Outcome(body, record)


def _elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def _prune(
    doc: _document.Document,
    host: str,
    path: str,
    headers: Mapping[str, str],
    fmt: str,
    rules: Rules,
    mode: str,
    started: float,
    inline: bool,
    guard: Callable[[Callable[[], Record]], Callable[[], Record | None]] | None = None,
) -> Outcome:
    """`guard`, given when inline: wraps the deferred record's computation so it fails as this would."""
    parsed, body = doc.parsed, doc.body
    module = FORMATS[fmt]
    model = module.model(parsed, path)
    limits = rules.limits_for(host, path, model)
    media = [doc.resolve(m) for m in module.find_media(parsed)]
    images = [m for m in media if m.kind == IMAGE]

    def record_of(plan: _Plan, out: bytes | _document.Written, started: float) -> Record:
        record = Record(
            utc_timestamp(),
            conversation_key(host, headers, parsed, module.conversation_anchor(parsed)),
            None,
            host,
            path,
            fmt,
            model,
            limits.rule,
            mode,
        )
        plan.fill(record, media, body, out)
        if is_sigv4(headers):
            record.mode, record.reason = OBSERVE, "SigV4-signed body: any change would break its signature"
        if fmt == openai_responses.NAME:
            record.server_side_history = openai_responses.server_side_history(parsed)
        record.overhead_ms = _elapsed_ms(started)
        return record

    if guard is not None and _nothing_to_change(images, limits, len(body)):
        # The plan of a request nothing changes is empty: only the record's facts are left to work out.
        return Outcome(body, None, guard(lambda: record_of(_Plan(_facts(images), limits, fmt, model), body, time.perf_counter())))
    plan = _Plan(_facts(images), limits, fmt, model, inline)
    candidates = plan.reduce()
    out = plan.apply_budgets(candidates, module, doc, sum(m.wire_bytes for m in media))
    record = record_of(plan, out, started)
    forward = out if record.mode == ENFORCE else body
    return Outcome(forward, record)


def _nothing_to_change(images: list[Media], limits: Limits, body_bytes: int) -> bool:
    """Whether no rule can change this request, known without sniffing an image: within the image
    count and body size, and no rule that needs the images' sizes, tokens or repeats."""
    if limits.dedupe or limits.thumbnail_side is not None or limits.max_est_tokens is not None:
        return False
    if limits.image_side_limit(len(images)) is not None or count_pruned(len(images), limits):
        return False
    if limits.max_body_bytes is not None and body_bytes > limits.max_body_bytes:
        return False
    max_bytes = limits.max_image_bytes
    return max_bytes is None or all(m.wire_bytes - m.data_offset <= max_bytes for m in images)


def _facts(images: list[Media]) -> list[MediaFacts]:
    return [MediaFacts(m, ordinal, None if m.remote else _sniff(m)) for ordinal, m in enumerate(images, start=1)]


def _sniff(media: Media) -> ImageInfo | None:
    # PNG, GIF and WebP say their size in the first bytes; a JPEG's frame header may sit past a large
    # EXIF block: only then is the longer prefix copied.
    info = sniff_base64(media.base64_prefix(_SNIFF_FIRST))
    if info is not None and info.width is None and media.wire_bytes - media.data_offset > _SNIFF_FIRST:
        info = sniff_base64(media.base64_prefix(_SNIFF_CHARS)) or info
    return info


# Why an image became a placeholder: the record's counter and the placeholder's {reason}.
_REPEAT, _COUNT, _IMAGE_LIMIT, _BODY, _TOKENS = "repeat", "count", "image_limit", "body", "tokens"
_BUDGET_CAUSES = (_BODY, _TOKENS)  # in the order of the budgets handed to prune_to_budgets
_REASONS = {_COUNT: "too many images", _BODY: "request too large", _TOKENS: "too many tokens"}
_CHUNK = 1 << 20  # chars compared at a time when two payloads sit behind different data URL headers


class _Plan:
    """What happens to each image of one request: dropped (with a placeholder and a cause), re-encoded, or kept."""

    def __init__(self, images: list[MediaFacts], limits: Limits, fmt: str, model: str | None, inline: bool = False) -> None:
        self.images, self.limits, self.fmt, self.model, self.inline = images, limits, fmt, model, inline
        self.dropped: dict[int, tuple[str, str]] = {}  # image index -> (cause, placeholder text)
        self.new: dict[int, _shrink.Shrunk] = {}  # image index -> its re-encoded bytes
        self.thinned: set[int] = set()  # of `new`, the ones made thumbnails by age
        self.over_budget = False

    # -- steps 1 to 4

    def reduce(self) -> list[int]:
        """Repeats, count cap, per-image limits, thinning; returns the survivors for the budgets."""
        images, limits = self.images, self.limits
        if limits.dedupe:
            for i, later in _repeats(images).items():
                text = render(limits.repeat_placeholder, images[i], f"repeated as image #{images[later].ordinal}", later=images[later].ordinal)
                self.dropped[i] = (_REPEAT, text)
        survivors = [i for i in range(len(images)) if i not in self.dropped]
        by_count = count_pruned(len(survivors), limits)
        for i in survivors[:by_count]:
            self._drop(i, _COUNT)
        kept = survivors[by_count:]
        side = limits.image_side_limit(len(kept))
        thumb = limits.thumbnail_side
        older = set(kept[: max(0, len(kept) - limits.keep_recent)]) if thumb is not None else set()
        if side is not None or limits.max_image_bytes is not None or older:
            for i in kept:
                self._fit(i, side, thumb if i in older else None)
        return [i for i in kept if i not in self.dropped]

    def _drop(self, i: int, cause: str, reason: str | None = None) -> None:
        self.dropped[i] = (cause, render(self.limits.placeholder, self.images[i], reason or _REASONS[cause]))

    def _fit(self, i: int, side: int | None, thumb: int | None) -> None:
        """Shrink image i under the per-image limits and, when `thumb` is set, to a thumbnail."""
        facts, max_bytes = self.images[i], self.limits.max_image_bytes
        m = facts.media
        if m.remote:
            return  # nothing to shrink here: the provider fetches it
        info = facts.info
        long_side = max(info.width, info.height) if info is not None and info.width and info.height else None
        over_bytes = max_bytes is not None and m.wire_bytes - m.data_offset > max_bytes
        over_side = side is not None and long_side is not None and long_side > side
        thinning = thumb is not None and long_side is not None and long_side > thumb
        if not (over_bytes or over_side or thinning):
            return  # within every limit by its header: never decoded
        if self.inline:
            raise NeedsWorker("an image to re-encode")
        sides = [s for s in (side, thumb) if s is not None]
        result = _shrink.shrink(m.data[m.data_offset :], max_side=min(sides) if sides else None, max_bytes=max_bytes)  # type: ignore[index]
        if result.data is not None:
            self.new[i] = result
            if thinning:
                self.thinned.add(i)
        elif result.reason is not None and (over_bytes or over_side):
            limit = f"over {format_size(max_bytes)}" if over_bytes else f"over {side}px"  # type: ignore[arg-type]
            self._drop(i, _IMAGE_LIMIT, f"{limit}, {result.reason}")
        # else: a thumbnail that can't be made (undecodable, a pixel bomb): the image goes as it is

    # -- what each image weighs as it would be sent

    def wire_bytes(self, i: int) -> int:
        m, new = self.images[i].media, self.new.get(i)
        if new is None:
            return m.wire_bytes
        assert new.data is not None and new.mime is not None
        # A data URL gets a new header with the new type; the other formats carry bare base64.
        return len(new.data) + (len(f"data:{new.mime};base64,") if m.data_offset else 0)

    def tokens(self, i: int, as_sent: bool = True) -> int:
        facts = self.images[i]
        info = self.new[i].info if as_sent and i in self.new else facts.info
        width, height = (info.width, info.height) if info is not None else (None, None)
        return image_tokens(self.fmt, self.model, width, height, facts.media.detail)

    # -- step 5 and the rewrite

    def apply_budgets(
        self, candidates: list[int], module: WireFormat, doc: _document.Document, media_bytes: int
    ) -> bytes | _document.Written:
        """Prune the oldest candidates while a budget is over; returns the body to send."""
        images, limits = self.images, self.limits
        parsed, body = doc.parsed, doc.body
        staged = parsed
        if self.new:
            staged = module.replace_data(parsed, {images[i].media.path: (s.data, s.mime) for i, s in self.new.items()})  # type: ignore[misc]
        fixed = {images[i].media.path: text for i, (_, text) in self.dropped.items()}

        def rewrite(k: int) -> bytes | _document.Written:
            if not fixed and not self.new and k == 0:
                return body  # nothing changes: the very same bytes
            texts = dict(fixed)
            for i in candidates[:k]:
                texts[images[i].media.path] = self.dropped[i][1]
            return doc.write(module.replace_media(staged, texts))

        out = rewrite(0)
        if limits.max_body_bytes is None and limits.max_est_tokens is None:
            return out
        prunable = max(0, len(candidates) - limits.keep_recent)
        # Pruning k >= 1 writes a compact body: measure from the compact size of this one.
        compact = (lambda: doc.size(parsed)) if out is body else (lambda: len(out))
        sizer = _BodySizer(module, staged, doc, len(out), compact, [images[i].media.path for i in candidates], self._budget_text(candidates))
        # Media bytes and image tokens as sent, with the oldest k candidates pruned.
        media_base = media_bytes - sum(images[i].media.wire_bytes for i in self.dropped) - sum(images[i].media.wire_bytes - self.wire_bytes(i) for i in self.new)
        wire_prefix = [0]
        for i in candidates:
            wire_prefix.append(wire_prefix[-1] + self.wire_bytes(i))
        token_suffix = [0]
        if limits.max_est_tokens is not None:
            for i in reversed(candidates):
                token_suffix.append(token_suffix[-1] + self.tokens(i))
            token_suffix.reverse()

        def tokens_after(k: int) -> int:
            return text_tokens(sizer.size_after(k) - (media_base - wire_prefix[k])) + token_suffix[k]

        causes, _ = prune_to_budgets(prunable, [(limits.max_body_bytes, sizer.size_after), (limits.max_est_tokens, tokens_after)])
        for n, cause in enumerate(causes):
            self._drop(candidates[n], _BUDGET_CAUSES[cause])
        if causes:
            out = rewrite(len(causes))
        # The accounting above is exact for every format but Ollama's joined notes and a fallback
        # codec: check the body as written and prune further while it is still over.
        k = len(causes)
        while True:
            cause = self._over(out, media_base - wire_prefix[k], candidates, k)
            if cause is None or k >= prunable:
                break
            self._drop(candidates[k], cause)
            k += 1
            out = rewrite(k)
        self.over_budget = cause is not None
        return out

    def _budget_text(self, candidates: list[int]) -> Callable[[int], str]:
        return lambda n: render(self.limits.placeholder, self.images[candidates[n]], _REASONS[_BODY])

    def _over(self, out: bytes | _document.Written, media_after: int, candidates: list[int], k: int) -> str | None:
        """Which budget the written body `out` (with the oldest k candidates pruned) is over, if any."""
        limits = self.limits
        if limits.max_body_bytes is not None and len(out) > limits.max_body_bytes:
            return _BODY
        if limits.max_est_tokens is not None:
            tokens = text_tokens(len(out) - media_after) + sum(self.tokens(i) for i in candidates[k:])
            if tokens > limits.max_est_tokens:
                return _TOKENS
        return None

    # -- the record

    def fill(self, record: Record, media: list[Media], body: bytes, out: bytes | _document.Written) -> None:
        images = self.images
        media_bytes = sum(m.wire_bytes for m in media)
        sent = [i for i in range(len(images)) if i not in self.dropped]
        media_after = media_bytes - sum(images[i].media.wire_bytes - (0 if i in self.dropped else self.wire_bytes(i)) for i in range(len(images)))
        causes = [cause for cause, _ in self.dropped.values()]
        record.images_before = len(images)
        record.images_after = len(sent)
        record.documents = len(media) - len(images)
        record.media_bytes_before = media_bytes
        record.media_bytes_after = media_after
        record.body_bytes_before = len(body)
        record.body_bytes_after = len(out)
        record.est_tokens_before = text_tokens(len(body) - media_bytes) + sum(self.tokens(i, as_sent=False) for i in range(len(images)))
        record.est_tokens_after = text_tokens(len(out) - media_after) + sum(self.tokens(i) for i in sent)
        record.pruned = len(self.dropped)
        record.pruned_for_count = causes.count(_COUNT)
        record.pruned_for_body = causes.count(_BODY)
        record.over_budget = self.over_budget
        record.pruned_for_tokens = causes.count(_TOKENS)
        record.pruned_for_image_limit = causes.count(_IMAGE_LIMIT)
        record.deduplicated = causes.count(_REPEAT)
        for i in self.new:
            if i in self.dropped:
                continue
            saved = images[i].media.wire_bytes - self.wire_bytes(i)
            if i in self.thinned:
                record.thinned += 1
                record.thinned_bytes_saved += saved
            else:
                record.shrunk += 1
                record.shrunk_bytes_saved += saved
        record.mime_mismatches = sum(1 for f in images if _mime_mismatch(f))


def _repeats(images: list[MediaFacts]) -> dict[int, int]:
    """Image index -> the index of the next later image with the same base64 payload."""
    groups: dict[tuple[int, str, str], list[int]] = {}
    for i, facts in enumerate(images):
        m = facts.media
        if m.data is None or m.wire_bytes - m.data_offset < 1:
            continue
        # A cheap key first (length, head, tail); payloads are compared only within a group.
        key = (m.wire_bytes - m.data_offset, m.data[m.data_offset : m.data_offset + 64], m.data[-64:])
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
    n = a.wire_bytes - a.data_offset
    if n != b.wire_bytes - b.data_offset:
        return False
    # Same bytes behind different data URL headers: compare in slices rather than copy 10 MB twice.
    return all(
        a.data[a.data_offset + k : a.data_offset + k + _CHUNK] == b.data[b.data_offset + k : b.data_offset + k + _CHUNK]
        for k in range(0, n, _CHUNK)
    )


_MIME_ALIASES = {"image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg", "image/x-png": "image/png"}


def _mime_mismatch(facts: MediaFacts) -> bool:
    """The declared type names another format than the bytes are (jpg/jpeg spellings agree)."""
    declared = facts.media.declared_mime
    if declared is None or facts.info is None:
        return False
    declared = declared.strip().lower()
    return _MIME_ALIASES.get(declared, declared) != facts.info.mime


class _BodySizer:
    """The compact body size with the oldest k candidates pruned, without serializing the body per candidate.

    orjson writes a container as the concatenation of its items, so replacing one part changes the
    total by exactly the difference of the two parts' own serializations. Where the part leaves
    its list instead (Ollama's images, whose note joins the message text), the message holding it
    is compared; the few bytes that joining several notes differs by are corrected by the caller.
    """

    def __init__(
        self,
        module: WireFormat,
        staged: Any,
        doc: _document.Document,
        size: int,
        compact_size: Callable[[], int],
        paths: list[tuple[str | int, ...]],
        text: Callable[[int], str],
    ) -> None:
        self._module, self._staged, self._doc = module, staged, doc
        self._size, self._compact_size, self._compact = size, compact_size, None
        self._paths, self._text = paths, text
        self._saved_total = [0]  # bytes saved by pruning the oldest k, for k = 0, 1, ...

    def size_after(self, k: int) -> int:
        if k == 0:
            return self._size  # the body as it goes with nothing pruned by a budget
        if self._compact is None:
            self._compact = self._compact_size()
        while len(self._saved_total) <= k:
            n = len(self._saved_total) - 1
            path = self._paths[n]
            replaced = self._module.replace_media(self._staged, {path: self._text(n)})
            unit = _changed_unit(self._staged, replaced, path)
            size = self._doc.size
            saved = size(_value_at(self._staged, unit)) - size(_value_at(replaced, unit))
            self._saved_total.append(self._saved_total[-1] + saved)
        return self._compact - self._saved_total[k]


def _changed_unit(old: Any, new: Any, path: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """`path` when the part was replaced in place; the message holding it when it left its list."""
    parent = path[:-1]
    a, b = _value_at(old, parent), _value_at(new, parent)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return path
    return path[:-2]


def _value_at(node: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        node = node[key]
    return node
