"""The engine: one request in (URL, headers, body bytes), the body to forward and a record out.

Pure Python with no mitmproxy import, so the proxy, the command-line tools and the audit share it.
It never raises on bad input: the caller gets the original bytes and a reason in the record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from . import _jsoncodec
from ._conversation import conversation_key
from ._imageinfo import sniff_base64
from ._placeholder import MediaFacts, render
from ._policy import Decision, Limits, count_pruned, decide
from ._record import Record, utc_timestamp
from ._rules import Rules
from ._tokens import image_tokens, text_tokens
from .formats import FORMATS, IMAGE, Media, WireFormat, detect_shape
from .formats import openai_responses

ENFORCE = "enforce"
OBSERVE = "observe"
MODES = (ENFORCE, OBSERVE)

# Enough base64 to reach a JPEG's frame header past a large EXIF block, without copying a whole image.
_SNIFF_CHARS = 256 * 1024


@dataclass(frozen=True, slots=True)
class Outcome:
    body: bytes  # what to forward: the input object itself when nothing changed
    record: Record | None  # None when the request is not an LLM request

    @property
    def changed(self) -> bool:
        return self.record is not None and self.record.mode == ENFORCE and self.record.pruned > 0


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
    """Apply the rules to one request. `wire_format` forces a format (WebSocket messages)."""
    started = time.perf_counter()
    parts = urlsplit(url)
    host, path = parts.hostname or "", parts.path or "/"
    lowered = {name.lower(): value for name, value in headers.items()}
    fmt = wire_format or rules.format_for(host, path)
    if fmt is None and not rules.detect_by_shape:
        return Outcome(body, None)
    try:
        parsed, fallback = _jsoncodec.loads(body)
    except _jsoncodec.BodyError as exc:
        if fmt is None:
            return Outcome(body, None)
        return _untouched(body, host, path, fmt, mode, str(exc), started)
    if fmt is None:
        fmt = detect_shape(parsed)
        if fmt is None:
            return Outcome(body, None)
    if not isinstance(parsed, dict):
        return _untouched(body, host, path, fmt, mode, f"body is a JSON {type(parsed).__name__}, not an object", started)
    try:
        return _prune(parsed, fallback, body, host, path, lowered, fmt, rules, mode, started)
    except Exception as exc:  # noqa: BLE001 - the request must go through whatever the body holds
        return _untouched(body, host, path, fmt, mode, f"internal error: {type(exc).__name__}", started)


def _untouched(body: bytes, host: str, path: str, fmt: str, mode: str, reason: str, started: float) -> Outcome:
    record = Record(utc_timestamp(), None, None, host, path, fmt, None, None, mode, reason=reason)
    record.body_bytes_before = record.body_bytes_after = len(body)
    record.overhead_ms = _elapsed_ms(started)
    return Outcome(body, record)


def _elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def _prune(
    parsed: dict[str, Any],
    fallback: bool,
    body: bytes,
    host: str,
    path: str,
    headers: Mapping[str, str],
    fmt: str,
    rules: Rules,
    mode: str,
    started: float,
) -> Outcome:
    module = FORMATS[fmt]
    model = module.model(parsed, path)
    limits = rules.limits_for(host, path, model)
    media = module.find_media(parsed)
    images = _facts([m for m in media if m.kind == IMAGE])
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
    reason = None
    if is_sigv4(headers):
        record.mode, reason = OBSERVE, "SigV4-signed body: any change would break its signature"
    by_count = count_pruned(len(images), limits)
    texts = _Placeholders(limits.placeholder, images, by_count)
    sizer = _BodySizer(module, parsed, fallback, body, images, texts)
    decision = decide(len(images), limits, sizer.size_after)
    out = body
    if decision.pruned:
        decision, out = _settle(decision, limits, len(images), lambda k: _rewrite(module, parsed, fallback, texts, k))
    _fill(record, fmt, model, media, images, decision, body, out, limits)
    record.reason = reason
    if fmt == openai_responses.NAME:
        record.server_side_history = openai_responses.server_side_history(parsed)
    record.overhead_ms = _elapsed_ms(started)
    forward = out if record.mode == ENFORCE else body
    return Outcome(forward, record)


def _facts(images: list[Media]) -> list[MediaFacts]:
    return [
        MediaFacts(m, ordinal, None if m.remote else sniff_base64(m.base64_prefix(_SNIFF_CHARS)))
        for ordinal, m in enumerate(images, start=1)
    ]


class _Placeholders:
    """The placeholder text of each image, rendered once when first needed."""

    def __init__(self, template: str, images: list[MediaFacts], by_count: int) -> None:
        self._template, self._images, self._by_count = template, images, by_count
        self._texts: dict[int, str] = {}

    def path(self, i: int) -> tuple[str | int, ...]:
        return self._images[i].media.path

    def text(self, i: int) -> str:
        if i not in self._texts:
            reason = "too many images" if i < self._by_count else "request too large"
            self._texts[i] = render(self._template, self._images[i], reason)
        return self._texts[i]

    def oldest(self, k: int) -> dict[tuple[str | int, ...], str]:
        return {self.path(i): self.text(i) for i in range(k)}


def _rewrite(module: WireFormat, parsed: Any, fallback: bool, texts: _Placeholders, k: int) -> bytes:
    return _jsoncodec.dumps(module.replace_media(parsed, texts.oldest(k)), fallback)


class _BodySizer:
    """The compact body size with the oldest k images pruned, without serializing the body per candidate.

    orjson writes a container as the concatenation of its items, so replacing one part changes the
    total by exactly the difference of the two parts' own serializations. (Ollama's note joins the
    message text instead; _settle corrects the few bytes that differ there.)
    """

    def __init__(self, module: WireFormat, parsed: Any, fallback: bool, body: bytes, images: list[MediaFacts], texts: _Placeholders) -> None:
        self._module, self._parsed, self._fallback, self._body = module, parsed, fallback, body
        self._texts = texts
        self._base: int | None = None
        self._saved_total = [0]  # bytes saved by pruning the oldest k, for k = 0, 1, ...

    def size_after(self, k: int) -> int:
        if k == 0:
            return len(self._body)  # nothing pruned: the body goes as it came
        if self._base is None:
            self._base = len(_jsoncodec.dumps(self._parsed, self._fallback))
        while len(self._saved_total) <= k:
            i = len(self._saved_total) - 1
            path = self._texts.path(i)
            old = _value_at(self._parsed, path)
            new = _value_at(self._module.replace_media(self._parsed, {path: self._texts.text(i)}), path)
            saved = len(_jsoncodec.dumps(old, self._fallback)) - len(_jsoncodec.dumps(new, self._fallback))
            self._saved_total.append(self._saved_total[-1] + saved)
        return self._base - self._saved_total[k]


def _value_at(node: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        node = node[key]
    return node


def _settle(decision: Decision, limits: Limits, images: int, rewrite: Callable[[int], bytes]) -> tuple[Decision, bytes]:
    """Write the pruned body and check its real size against the budget, pruning further where the
    size accounting fell short (a fallback codec, Ollama's joined notes)."""
    budget = limits.max_body_bytes
    prunable = max(0, images - limits.keep_recent)
    pruned = decision.pruned
    out = rewrite(pruned)
    while budget is not None and len(out) > budget and pruned < prunable:
        pruned += 1
        out = rewrite(pruned)
    return Decision(pruned, decision.by_count, budget is not None and len(out) > budget), out


def _fill(
    record: Record,
    fmt: str,
    model: str | None,
    media: list[Media],
    images: list[MediaFacts],
    decision: Decision,
    body: bytes,
    out: bytes,
    limits: Limits,
) -> None:
    media_bytes = sum(m.wire_bytes for m in media)
    pruned = images[: decision.pruned]
    pruned_bytes = sum(f.media.wire_bytes for f in pruned)
    image_tok = [_image_tokens(fmt, model, f) for f in images]
    record.images_before = len(images)
    record.images_after = len(images) - decision.pruned
    record.documents = len(media) - len(images)
    record.media_bytes_before = media_bytes
    record.media_bytes_after = media_bytes - pruned_bytes
    record.body_bytes_before = len(body)
    record.body_bytes_after = len(out)
    record.est_tokens_before = text_tokens(len(body) - media_bytes) + sum(image_tok)
    record.est_tokens_after = text_tokens(len(out) - record.media_bytes_after) + sum(image_tok[decision.pruned :])
    record.pruned = decision.pruned
    record.pruned_for_count = decision.by_count
    record.pruned_for_body = decision.pruned - decision.by_count
    record.over_budget = decision.over_budget


def _image_tokens(fmt: str, model: str | None, facts: MediaFacts) -> int:
    info = facts.info
    return image_tokens(fmt, model, info.width if info else None, info.height if info else None, facts.media.detail)
