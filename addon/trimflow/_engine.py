"""The engine: one request in (URL, headers, body bytes), the body to forward and a record out.

Pure Python with no mitmproxy import, so the proxy, the command-line tools and the audit share it.
It never raises on bad input: the caller gets the original bytes and a reason in the record.

The pipeline: resolve (the caller's Target, or `prune_request` from a URL), parse (the skeleton of
_body), find (the format module's media), plan (_policy: what happens to each image), write
(the document with placeholders and re-encoded images), record (the metrics Record).

A text body that shares its first messages with a body seen before (trimflow._seen_prefixes) is read from its
spliced document first (`_spliced_document`): those messages cut out, they held no media. Where that document tells that
nothing changes, the body goes as it came; else the body is read in full, as any other.

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

import functools
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from . import _body, _clicks, _jsoncodec
from ._conversation import Recall
from ._history import SEEN, History, Images, history_of, image_key, session_key
from ._human import format_size
from ._imageinfo import sniff_media
from ._limits import Limits, changed_fields
from ._lookalike import NeedsThumbnails, lookalikes
from ._media import AGENT, TOOL, USER
from ._placeholder import ImageIds, MediaFacts
from ._policy import BODY, CACHE, COUNT_CAP, IMAGE_LIMIT, REPEAT, TOKENS, NeedsWorker, Plan, nothing_to_change
from ._recall import Kept
from ._record import COUNT_TOKENS, ENFORCE, OBSERVE, WARMUP, Record, utc_timestamp
from ._rules import Rules, Target
from ._seen_prefixes import Match, Spliced, key_of
from ._send_once import files_api
from ._text import escape_controls
from ._tokens import text_tokens
from ._value import CutOrder, cut_order
from .formats import FORMATS, IMAGE, JsonPath, Media, WireFormat, counted_turn_path, detect_shape

# Inline limits: the skeleton pass runs at memory speed, a fraction of what mitmproxy spends reading the body; a
# full parse is an order of magnitude slower per byte, and re-encoding an image far slower still (figures:
# docs/performance.md), so those go to a worker thread.
INLINE_MAX_BODY = 16 * 2**20
INLINE_MAX_WHOLE = 2**20

# Limits to apply instead of the rule's for a request's model: the learned limits of the upstream the caller sends
# it to (trimflow._learned_limits), bound by the caller, which alone knows where the request goes.
Tighten = Callable[[str | None, Limits], Limits]


class Outcome:
    """What to forward, and the record (None when the request is not an LLM request).

    An inline run that finds nothing to change leaves the record to be worked out on first use
    (`record_pending`): the proxy forwards the request first and accounts for it while the provider works.
    `history` (trimflow._history) is worked out on first use too: only the proxy and the audit number turns.
    `screen` (trimflow._clicks): set when the request declares a computer tool and its newest screenshot goes at
    other dimensions than it came; the answer's coordinates map back through it.
    `kept` (with recall on, trimflow._recall): the images whose placeholder or note names their id, for the store,
    which the proxy hands them to once the request is on its way.
    """

    __slots__ = ("_body", "_record", "_account", "_history", "cut", "like", "screen", "kept")

    def __init__(
        self,
        body: bytes | _body.Written,
        record: Record | None,
        account: Callable[[], Record | None] | None = None,
        history: Callable[[], History | None] | History | None = None,
        cut: frozenset[int] = frozenset(),
        like: frozenset[int] = frozenset(),
    ) -> None:
        self._body, self._record, self._account = body, record, account
        self._history: History | Callable[[], History | None] | None = history
        # The images the cut took (trimflow._policy: Plan.cut, in the order trimflow._value gave), as indices into the
        # request's images in document order: the conversation keeps them for its next turn (Conversations.assign),
        # which holds them cut while the limits allow. `like`: of those, the look-alikes (trimflow._lookalike), whose
        # placeholder names the image after them.
        self.cut, self.like = cut, like
        self.screen: _clicks.Screen | None = None
        self.kept: list[Kept] = []

    @property
    def taken(self) -> tuple[frozenset[int], frozenset[int]]:
        """`cut` and `like`, as the conversation memory takes them (Conversations.assign)."""
        return self.cut, self.like

    @property
    def record(self) -> Record | None:
        if self._account is not None:
            self._record, self._account = self._account(), None
        return self._record

    @property
    def record_pending(self) -> bool:
        return self._account is not None

    @property
    def history(self) -> History | None:
        """The request's conversation as digests, for numbering its turn (None when the body could not be read)."""
        if callable(self._history):
            self._history = self._history()
        return self._history

    @property
    def body(self) -> bytes:
        """The body to forward: the input object itself when nothing changed. A rewritten body is
        joined here, on first use, in the caller's thread (see _body.Written)."""
        if not isinstance(self._body, bytes):
            self._body = bytes(self._body)
        return self._body

    @property
    def changed(self) -> bool:
        if self._account is not None:
            return False  # only a run that changes nothing leaves its record for later
        record = self._record
        return (
            record is not None
            and record.mode == ENFORCE
            and (record.pruned > 0 or record.shrunk > 0 or record.thinned > 0 or record.native_sized > 0)
        )


def is_sigv4(headers: Mapping[str, str]) -> bool:
    """AWS SigV4 signs a hash of the body: any rewrite would fail the signature."""
    auth = headers.get("authorization", "")
    return auth.startswith("AWS4-HMAC-SHA256") or "x-amz-content-sha256" in headers


class CutMemory(Protocol):
    """What the cut needs to know of the conversation a request continues: trimflow._conversation.Conversations,
    as the proxy keeps it. The order of its images by arrival and which were cut before (`recall`, `was_cut`), and
    for the cache-aware cut (the `low_water` setting) where its last cut ended and how long ago. `recall` may raise
    NeedsWorker in an inline run (what it knows is to be read off the event loop): the engine lets it through."""

    def recall(self, history: History) -> Recall | None: ...

    def was_cut(self, keys: Iterable[bytes]) -> bool: ...


def prune_request(
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    rules: Rules,
    mode: str = ENFORCE,
    wire_format: str | None = None,
    memory: CutMemory | None = None,
) -> Outcome:
    """Apply the rules to one request given by its URL (a Host header in `headers` names the host, as
    for the proxy). `wire_format` forces a format (a Responses WebSocket message); `memory` as for `prune`."""
    target = rules.target_for_url(url, headers, wire_format)
    return Outcome(body, None) if target is None else prune(target, headers, body, rules, mode, memory=memory)


def prune(
    target: Target,
    headers: Mapping[str, str],
    body: bytes,
    rules: Rules,
    mode: str = ENFORCE,
    inline: bool = False,
    memory: CutMemory | None = None,
    tighten: Tighten | None = None,
    recall: ImageIds | None = None,
) -> Outcome:
    """Apply the rules to one request whose Target the caller resolved (Rules.target).

    With `inline`, raises NeedsWorker instead of starting slow work (see the module's docstring).
    `tighten(model, limits)`, when given, gives the limits to apply instead of the rule's (learned limits); the
    record's `learned_limits` names the fields it changed.
    `memory`: the conversations the caller numbers turns in; with it, an image's age is when it first came in
    the conversation, not where it sits (the oldest by arrival are cut first, the newest kept), an image cut
    on an earlier turn stays cut, and a rule with `low_water` holds the conversation's last cut and knows when
    its cache went cold. The caller then numbers the turn with the outcome's history and `cut`
    (Conversations.assign). Without it, each request is cut on its own, its images aged by position.
    `recall`: recall is on (trimflow._recall.RecallIds): placeholders and notes name each image's id, and the
    outcome's `kept` lists the images they name. An inline caller's ids raise NeedsWorker before hashing much.
    """
    started = time.perf_counter()
    host, path, fmt = target.host, target.path, target.format
    if inline and len(body) > INLINE_MAX_BODY:
        raise NeedsWorker(f"a body over {format_size(INLINE_MAX_BODY)}")
    lowered = {name.lower(): value for name, value in headers.items()}

    def failed(exc: Exception) -> Outcome:
        # A payload is decoded only when read (_body.Payload): that is where a bad escape in one shows.
        assert fmt is not None  # only a request of a known format gets this far
        reason = str(exc) if isinstance(exc, _jsoncodec.BodyError) else f"internal error: {type(exc).__name__}"
        return _untouched(body, host, path, fmt, mode, reason, started)

    def guard(compute: Callable[[], Record]) -> Callable[[], Record | None]:
        def guarded() -> Record | None:
            try:
                return compute()
            except Exception as exc:  # noqa: BLE001 - as below: the record says what went wrong
                return failed(exc).record

        return guarded

    def prune_doc(doc: _body.ParsedBody, whole: bytes | None = None, spliced: Match | None = None) -> Outcome:
        assert fmt is not None
        return _prune(
            doc,
            host=host,
            path=path,
            headers=lowered,
            fmt=fmt,
            rules=rules,
            mode=mode,
            started=started,
            inline=inline,
            guard=guard if inline else None,
            memory=memory,
            tighten=tighten,
            recall=recall,
            whole=whole,
            spliced=spliced,
        )

    if fmt is not None and (spliced := SEEN.splice(key_of(host, body), body)) is not None:
        # Read from its spliced document: the outcome of a body nothing changes. Where the document does not tell that
        # (it holds media, a limit may change the body, it reads otherwise), the body is read in full below.
        try:
            doc = _spliced_document(spliced, inline)
            if doc is not None:
                return prune_doc(doc, body, spliced.match)
        except Exception:  # noqa: BLE001 - _Unspliced, or a document that reads otherwise: the body is read in full
            pass
    try:
        # Exact integers are only needed to write a body back: _DocumentWriter asks for them then.
        doc = _body.parse(body, INLINE_MAX_WHOLE if inline else None, exact=False)
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

    try:
        return prune_doc(doc)
    except NeedsWorker:
        raise
    except Exception as exc:  # noqa: BLE001 - the request must go through whatever the body holds
        return failed(exc)


def _spliced_document(spliced: Spliced, inline: bool) -> _body.ParsedBody | None:
    """A text body's spliced document (trimflow._seen_prefixes: the messages it shares with a body seen before cut
    out, but the first), parsed whole; None when it is not so read (a payload in it, too large inline, not an object).
    The messages cut out held no media (they were read before, in a body that held none) and need no reading."""
    doc = _body.parse(spliced.document, INLINE_MAX_WHOLE if inline else None, exact=False)
    return doc if doc is not None and not doc.is_skeleton and isinstance(doc.parsed, dict) else None


class _Unspliced(Exception):
    """A spliced document that does not tell the outcome (`prune`)."""


_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def _untouched(body: bytes, host: str, path: str, fmt: str, mode: str, reason: str, started: float) -> Outcome:
    record = Record.untouched(host, path, fmt, mode, reason, len(body))
    record.overhead_ms = _elapsed_ms(started)
    return Outcome(body, record)


def _elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def _prune(
    doc: _body.ParsedBody,
    *,
    host: str,
    path: str,
    headers: Mapping[str, str],
    fmt: str,
    rules: Rules,
    mode: str,
    started: float,
    inline: bool,
    guard: Callable[[Callable[[], Record]], Callable[[], Record | None]] | None = None,
    memory: CutMemory | None = None,
    tighten: Tighten | None = None,
    recall: ImageIds | None = None,
    whole: bytes | None = None,
    spliced: Match | None = None,
) -> Outcome:
    """`guard`, given when inline: wraps the deferred record's computation so it fails as this would. `whole` and
    `spliced`: `doc` is `whole` spliced, as `spliced` cut it (`_spliced_document`)."""
    parsed, body = doc.parsed, doc.body if whole is None else whole
    module = FORMATS[fmt]
    if spliced is not None and module.history(parsed).path != spliced.items_path:
        raise _Unspliced
    model = module.model(parsed, path)
    counted = counted_turn_path(fmt, path)
    # A token count is pruned as the turn it measures, so it counts what that turn will send.
    limits = rules.limits_for(host, path if counted is None else counted, model)
    learned_limits = None
    if tighten is not None:
        ruled, limits = limits, tighten(model, limits)
        if limits is not ruled:
            learned_limits = changed_fields(ruled, limits)
    media = [doc.resolve(m) for m in module.find_media(parsed)]
    if spliced is not None and media:
        raise _Unspliced
    images = [m for m in media if m.kind == IMAGE]
    media_bytes = sum(m.wire_bytes for m in media)

    def record_of(plan: Plan, out: bytes | _body.Written, started: float) -> Record:
        # The conversation is the session id's when one names it; the proxy and the audit assign the rest (Outcome.history).
        # The model name is the client's text: a control character or a lone surrogate must not reach a log or the JSONL.
        recorded_model = escape_controls(model) if model is not None else None
        record = Record(
            ts=utc_timestamp(),
            conversation=session_key(headers, module.history(parsed).request),
            turn=None,
            host=host,
            path=path,
            format=fmt,
            model=recorded_model,
            rule=limits.rule,
            mode=mode,
        )
        if counted is not None:
            record.kind = COUNT_TOKENS
        elif module.is_warmup(parsed):
            record.kind = WARMUP
        _fill_record(record, plan, len(media) - len(images), media_bytes, len(body), out)
        record.learned_limits = learned_limits
        if is_sigv4(headers):
            record.mode, record.reason = OBSERVE, "SigV4-signed body: any change would break its signature"
        record.server_side_history = module.server_side_history(parsed)
        record.overhead_ms = _elapsed_ms(started)
        return record

    # With a memory, the images go into the history, for their arrivals: by their keys, which read no payload through,
    # so a request that no limit changes and that holds no image cut before costs what it did.
    arrivals = Images.of(images) if memory is not None else None

    def history() -> History | None:
        try:
            unstub, read = (doc.unstubbed, None) if doc.is_skeleton else (None, body)
            made = history_of(host, headers, module.history(parsed), [m.path for m in media], unstub, arrivals, body=read, spliced=spliced)
        except Exception:  # noqa: BLE001 - a request left unnumbered, never a request lost
            return None
        made.asked_lifetime = functools.partial(_asked_lifetime, module, parsed)
        return made

    held, cold, known, order, cut_before = 0, False, None, None, 0
    recalled: Recall | None = None
    unchanged = nothing_to_change(images, limits, len(body), fmt, model)
    if spliced is not None:
        if not unchanged:
            raise _Unspliced

        # Nothing to plan: the record's facts only, later when inline.
        def account() -> Record:
            return record_of(Plan(_facts(images), limits, fmt, model), body, time.perf_counter())

        return Outcome(body, None, guard(account), history) if guard is not None else Outcome(body, account(), history=history)
    if memory is not None and arrivals and (not unchanged or _over_low_water(images, limits, len(body)) or _was_cut(memory, arrivals.keys)):
        # The cut needs the images' arrivals (and the cache-aware cut the last cut) now: the history is digested first.
        known = history()
        try:
            recalled = memory.recall(known) if known is not None else None
        except NeedsWorker:  # the memory's to read off the event loop (the proxy's shared store)
            raise
        except Exception:  # noqa: BLE001 - the conversation's memory lost, never the request: it is cut on its own
            recalled = None
        if recalled is not None:
            order, cut_before = recalled.order, recalled.cut
            if limits.low_water is not None:
                held = recalled.cut
                # Idle past the rules' lifetime and past any longer one the request asks for (read only then).
                # Only a conversation that has gone over a cap (cut before) is cut for a cold cache.
                cold = (
                    recalled.cut > 0
                    and limits.cache_ttl is not None
                    and recalled.idle > limits.cache_ttl
                    and recalled.idle > _asked_lifetime(module, parsed)
                )
    if guard is not None and not cut_before and not cold and unchanged:
        # The plan of a request nothing changes is empty: only the record's facts are left to work out.
        record_later = guard(lambda: record_of(Plan(_facts(images), limits, fmt, model), body, time.perf_counter()))
        return Outcome(body, None, record_later, known or history)
    # The order the cut takes the images in: those cut before, then look-alikes, then by arrival, the user's protected
    # images last (trimflow._value). The plan's "oldest" is the first of it; ordinals stay positions.
    arrival = order if order is not None else range(len(images))
    sniffed = _facts(images, recall)
    writer = _DocumentWriter(module, doc)
    computer_use = _clicks.computer_tool(fmt, parsed) is not None
    keys = arrivals.keys if arrivals is not None else None
    later: dict[int, int] = {}  # look-alike -> the image after it (the same screen)
    if limits.cut_lookalikes and cut_before:
        # A look-alike cut before keeps its placeholder: as the memory says, or as the thumbnails say where it cannot.
        said = recalled.like if recalled is not None and recalled.like is not None else (None,) * len(images)
        unknown = sorted(i for i in arrival[:cut_before] if said[i] is None)
        found = _lookalikes(sniffed, unknown, keys, images, inline) if unknown else set()
        later = {i: i + 1 for i in arrival[:cut_before] if (said[i] or i in found) and i + 1 < len(images)}

    def planned(chosen: CutOrder) -> tuple[Plan, bytes | _body.Written]:
        facts = [sniffed[i] for i in chosen.order]
        place = {i: k for k, i in enumerate(chosen.order)}
        marks = {place[i]: sniffed[j].ordinal for i, j in later.items()}

        def holding(cut: int) -> Plan:
            return Plan(
                facts,
                limits,
                fmt,
                model,
                inline=inline,
                held=cut,
                cold=cold,
                computer_use=computer_use,
                accepts_webp=module.ACCEPTS_WEBP,
                protected=chosen.protected,
                later=marks,
                uploaded=limits.send_once and files_api(fmt, path) is not None,
            )

        plan = holding(held)
        out = plan.run(writer, media_bytes)
        if cut_before > held and any(i not in plan.dropped for i in range(cut_before)):
            # An image cut on an earlier turn would go again (the agent sent fewer): it stays cut.
            plan = holding(cut_before)
            out = plan.run(writer, media_bytes)
        return plan, out

    chosen = cut_order(images, arrival, cut_before, limits)
    plan, out = planned(chosen)
    if limits.cut_lookalikes and plan.cut() > cut_before:
        # The cut moves: of the images it may take, the screenshots showing the same screen as the image after them
        # go first (only now are thumbnails made: between such turns every image stays as it was).
        may_take = sorted(chosen.order[cut_before : len(chosen.order) - min(limits.keep_recent, len(chosen.order) - cut_before)])
        found = _lookalikes(sniffed, may_take, keys, images, inline)
        if found:
            later.update((i, i + 1) for i in found)
            chosen = cut_order(images, arrival, cut_before, limits, found)
            plan, out = planned(chosen)
    record = record_of(plan, out, started)
    forward = out if record.mode == ENFORCE else body
    cut = frozenset(chosen.order[: plan.cut()])
    outcome = Outcome(forward, record, history=known or history, cut=cut, like=frozenset(i for i in cut if i in later))
    if record.mode == ENFORCE and record.images_rescaled:
        outcome.screen = _screen(plan, fmt, parsed, model)
    if recall is not None and record.mode == ENFORCE:
        outcome.kept = _kept(plan)
    return outcome


def _kept(plan: Plan) -> list[Kept]:
    """The images whose placeholder or rescale note, as sent, names their id (a rule's own template may not)."""
    texts = {i: text for i, (cause, text) in plan.dropped.items() if cause != REPEAT}
    notes = plan.notes()
    for i in plan.rescaled():
        texts[i] = notes.get(plan.images[i].media.path, "")
    kept = []
    for i, text in sorted(texts.items()):
        facts = plan.images[i]
        image = facts.recall_id()
        if image is not None and image in text:
            kept.append(Kept(image, facts.media, facts.mime))
    return kept


def _screen(plan: Plan, fmt: str, parsed: dict[str, Any], model: str | None) -> _clicks.Screen | None:
    """How the answer's coordinates map back, when the newest image (the screenshot the model answers about) was
    rescaled and the request declares a computer tool."""
    newest = max(range(len(plan.images)), key=lambda i: plan.images[i].ordinal)
    if newest not in plan.rescaled():
        return None
    info, new = plan.images[newest].info, plan.new[newest]
    # Rescaled: both sizes are known.
    assert info is not None and info.width is not None and info.height is not None and new.width is not None and new.height is not None
    return _clicks.screen_for(fmt, parsed, model, (info.width, info.height), (new.width, new.height))


def _asked_lifetime(module: WireFormat, parsed: dict[str, Any]) -> float:
    """Seconds of the prompt cache lifetime the request asks for beyond its provider's default (0: none)."""
    try:
        return module.cache_lifetime(parsed) or 0.0
    except Exception:  # noqa: BLE001 - a body the format cannot read asks for nothing: the rules' cache_ttl stands
        return 0.0


def _lookalikes(facts: list[MediaFacts], which: list[int], keys: Sequence[bytes] | None, images: list[Media], inline: bool) -> set[int]:
    """Of the images `which`, the look-alikes (trimflow._lookalike); NeedsWorker inline when a thumbnail is to be made."""
    try:
        return lookalikes(facts, which, keys if keys is not None else [image_key(m) for m in images], make=not inline)
    except NeedsThumbnails:
        raise NeedsWorker("a screenshot's thumbnail") from None


def _over_low_water(images: Sequence[Media], limits: Limits, body_bytes: int) -> bool:
    """Whether the request is over a low-water mark (with `low_water`): within every mark, where the last turn cut (a
    held cut, a cold cache cut to the mark) changes nothing it sends."""
    return limits.low_water is not None and not nothing_to_change(images, limits.at_low_water(), body_bytes)


def _was_cut(memory: CutMemory, keys: tuple[bytes, ...]) -> bool:
    try:
        return memory.was_cut(keys)
    except Exception:  # noqa: BLE001 - as a failed recall: the request is cut on its own
        return False


def _facts(images: list[Media], recall: ImageIds | None = None) -> list[MediaFacts]:
    return [MediaFacts(m, ordinal, None if m.remote else sniff_media(m), recall) for ordinal, m in enumerate(images, start=1)]


def _fill_record(record: Record, plan: Plan, documents: int, media_bytes: int, body_bytes: int, out: bytes | _body.Written) -> None:
    """The plan's outcome in the record: counts, sizes and token estimates before and after."""
    images = plan.images
    sent = [i for i in range(len(images)) if i not in plan.dropped]
    media_after = plan.media_bytes_after(media_bytes)
    causes = [cause for cause, _ in plan.dropped.values()]
    record.images_before = len(images)
    record.images_after = len(sent)
    record.documents = documents
    record.media_bytes_before = media_bytes
    record.media_bytes_after = media_after
    record.body_bytes_before = body_bytes
    record.body_bytes_after = len(out)
    record.est_tokens_before = text_tokens(body_bytes - media_bytes) + sum(plan.tokens(i, as_sent=False) for i in range(len(images)))
    record.est_tokens_after = text_tokens(len(out) - media_after) + sum(plan.tokens(i) for i in sent)
    record.pruned = len(plan.dropped)
    record.pruned_for_count = causes.count(COUNT_CAP)
    record.pruned_for_body = causes.count(BODY)
    record.over_budget = plan.over_budget
    record.pruned_for_tokens = causes.count(TOKENS)
    record.pruned_for_cache = causes.count(CACHE)
    record.pruned_for_image_limit = causes.count(IMAGE_LIMIT)
    record.deduplicated = causes.count(REPEAT)
    received = Counter(f.media.origin for f in images)
    pruned = Counter(images[i].media.origin for i in plan.dropped)
    record.images_user, record.images_tool, record.images_agent = (received[origin] for origin in (USER, TOOL, AGENT))
    record.pruned_user, record.pruned_tool, record.pruned_agent = (pruned[origin] for origin in (USER, TOOL, AGENT))
    for i in plan.new:
        if i in plan.dropped:
            continue
        saved = images[i].media.wire_bytes - plan.wire_bytes(i)
        if i in plan.thinned:
            record.thinned += 1
            record.thinned_bytes_saved += saved
        elif i in plan.native:
            record.native_sized += 1
            record.native_bytes_saved += saved
        else:
            record.shrunk += 1
            record.shrunk_bytes_saved += saved
    record.images_rescaled = len(plan.rescaled())
    record.mime_mismatches = sum(1 for f in images if _mime_mismatch(f))


_MIME_ALIASES = {"image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg", "image/x-png": "image/png"}


def _mime_mismatch(facts: MediaFacts) -> bool:
    """The declared type names another format than the bytes are (jpg/jpeg spellings agree)."""
    declared = facts.media.declared_mime
    if declared is None or facts.info is None:
        return False
    declared = declared.strip().lower()
    return _MIME_ALIASES.get(declared, declared) != facts.info.mime


class _DocumentWriter:
    """The policy's BodyWriter over one parsed document and its format module."""

    def __init__(self, module: WireFormat, doc: _body.ParsedBody) -> None:
        self._module, self._doc = module, doc
        self.size = len(doc.body)
        self._staged: tuple[Mapping[JsonPath, tuple[str, str]], Any] | None = None

    def _with_images(self, images: Mapping[JsonPath, tuple[str, str]]) -> Any:
        """The parsed body with `images` re-encoded (the same for every write of one plan: staged once)."""
        if not images:
            return self._doc.parsed
        if self._staged is None or self._staged[0] is not images:
            self._staged = (images, self._module.replace_data(self._doc.parsed, images))
        return self._staged[1]

    def write(
        self, texts: Mapping[JsonPath, str], images: Mapping[JsonPath, tuple[str, str]], notes: Mapping[JsonPath, str] | None = None
    ) -> bytes | _body.Written:
        if not texts and not images:
            return self._doc.body  # nothing changes: the very same bytes
        self._doc.make_exact()
        parsed = self._module.replace_media(self._with_images(images), texts)
        return self._doc.write(self._module.add_notes(parsed, notes) if notes else parsed)

    def sizer(
        self, images: Mapping[JsonPath, tuple[str, str]], written: Any, paths: list[JsonPath], text: Callable[[int], str]
    ) -> Callable[[int], int]:
        doc = self._doc

        def staged() -> Any:
            # Measuring a pruned body is writing it: from here on the document must be exact (make_exact).
            doc.make_exact()
            return self._with_images(images)

        # Pruning k >= 1 writes a compact body: measure from the compact size of this one.
        compact = (lambda: doc.size(doc.parsed)) if written is doc.body else (lambda: len(written))
        return _BodySizer(self._module, staged, doc, len(written), compact, paths, text).size_after


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
        stage: Callable[[], Any],
        doc: _body.ParsedBody,
        size: int,
        compact_size: Callable[[], int],
        paths: list[tuple[str | int, ...]],
        text: Callable[[int], str],
    ) -> None:
        self._module, self._stage, self._doc = module, stage, doc
        self._staged: Any = None  # the body with its new images: staged on the first k >= 1
        self._size, self._compact_size = size, compact_size
        self._compact: int | None = None  # measured on the first k >= 1
        self._paths, self._text = paths, text
        self._saved_total = [0]  # bytes saved by pruning the oldest k, for k = 0, 1, ...

    def size_after(self, k: int) -> int:
        if k == 0:
            return self._size  # the body as it goes with nothing pruned by a budget
        if self._compact is None:
            self._staged = self._stage()
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
