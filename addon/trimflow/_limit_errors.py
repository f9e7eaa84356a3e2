"""Limit errors: recognise a provider's answer that refused a request for its size, and say which limit to tighten.

An answer is read in three passes over the provider's own message (trimflow._answer_messages: the error message
of the JSON, not every string of it, so that an echoed prompt or file name is never read as a verdict):

1. the named patterns (rules/limit_errors.yaml, and a user's file tried before it): per pattern the statuses
   it applies to, a regular expression, the kind of limit and how to get the number;
2. the general reader (trimflow._limit_reader), for wordings no pattern knows: the kinds of sentence that
   state a limit, with or without a number;
3. the catch-alls (a pattern whose `match` is empty: any 413).

`Patterns.recognise` turns an answer into a LimitError; `tightened` turns a LimitError and the limits the
refused request was pruned under into the Limits fields to send it again under, never below the floors
(`FLOORS`), and `why_not` says in one line why it did not. Pure Python, no mitmproxy.
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from yaml.nodes import Node, SequenceNode

from ._answer_messages import answer_messages
from ._learned_limits import FLOORS as LEARNED_FLOORS
from ._limit_reader import BODY_BYTES, IMAGE_BYTES, IMAGE_COUNT, IMAGE_SIDE, MANY_IMAGE_SIDE, Reading, read_limit
from ._limits import Limits
from ._yaml import NodeReader, read_text, shipped_file
from .errors import RulesError

DEFAULT_PATTERNS_PATH: Path = shipped_file("limit_errors.yaml")

# The Limits field each kind of limit (trimflow._limit_reader) tightens.
FIELDS = {
    IMAGE_COUNT: "max_images",
    BODY_BYTES: "max_body_bytes",
    IMAGE_BYTES: "max_image_bytes",
    IMAGE_SIDE: "max_image_side",
    MANY_IMAGE_SIDE: "many_images_max_side",
}
REASONS = {
    IMAGE_COUNT: "too many images",
    BODY_BYTES: "request too large",
    IMAGE_BYTES: "image too large",
    IMAGE_SIDE: "image too wide",
    MANY_IMAGE_SIDE: "image too wide for many images",
}
MODEL, HOST = "model", "host"
NEVER = frozenset({401, 403, 404, 407, 408, 429})  # auth, missing, rate limits: never about size
GENERAL_STATUSES = frozenset({400, 413, 422})  # the statuses the general reader reads

# The least a refusal may teach, per kind (trimflow._learned_limits.FLOORS says why): a figure under one is not applied.
FLOORS = {kind: LEARNED_FLOORS[field] for kind, field in FIELDS.items()}

# What a limit steps down to when the answer names no number: the largest common limit below the
# refused value (providers set round figures, decimal or binary), or 3/4 of it when none is near.
_MIB, _MB = 1 << 20, 1_000_000
BODY_STEPS = tuple(
    sorted(
        {n * (1 << 10) for n in (64, 128, 256, 512)}
        | {n * 1000 for n in (100, 250, 500)}
        | {n * unit for n in (1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 256, 512) for unit in (_MIB, _MB)}
    )
)
COUNT_STEPS = (1, 2, 3, 4, 5, 8, 10, 12, 16, 20, 32, 50, 60, 100, 250, 500, 600, 1000)
SIDE_STEPS = (256, 384, 512, 768, 1000, 1024, 1092, 1280, 1536, 1568, 1920, 2000, 2048, 2560, 3000, 3072, 3840, 4096, 5000, 6000, 7680, 8000, 8192)
_STEP_RATIO = 0.75

# Bytes of an error answer held back from the client to be read for a limit error: a larger answer, or one
# whose length is unknown and passes it, goes to the client as it comes and is never retried (docs/recovery.md).
ANSWER_MAX = 1 << 20
SOURCE_MESSAGE_MAX = 120  # a provider's message longer than this is not kept in a learned limit's source
# What is taken out of a message kept as a source: keys, bearer tokens, e-mail addresses, assignments of
# secrets, and any long run of letters and digits (request ids, tokens, base64; a hyphenated model name
# is no token).
_SECRET = re.compile(
    r"sk-[A-Za-z0-9_-]{8,}|AIza[0-9A-Za-z_-]{10,}|(?i:bearer)\s+\S+|[\w.+-]+@[\w-]+\.[\w.-]+"
    r"|(?i:api[_-]?key|token|secret|password)\s*[:=]\s*\S+"
    r"|(?=[A-Za-z0-9+/=_]*\d)(?=[A-Za-z0-9+/=_]*[A-Za-z])[A-Za-z0-9+/=_]{24,}"
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_TO_SENTENCE_END = re.compile(r".*?[.!?](?=\s|$)|.*")  # a dot inside a name ("example.com") ends nothing
# An answer about tokens, rates or quotas is no size limit, whatever its status (Groq answers a 413 for
# its tokens per minute): neither the general reader nor a catch-all reads it.
_NOT_SIZE = re.compile(
    r"\btokens?\b|\b[TRI]P[MD]\b|rate[ _-]?limit|\bquota\b|per (?:second|minute|hour|day)\b|context (?:length|window|size)|prompt is too long",
    re.IGNORECASE,
)
_TOP_KEYS = ("patterns",)
_PATTERN_KEYS = ("name", "provider", "status", "match", "limit", "per", "value", "threshold", "patch_px", "host", "example", "expect")


@dataclass(frozen=True, slots=True)
class Pattern:
    name: str
    status: frozenset[int]
    regex: re.Pattern[str]
    kind: str
    per: str = MODEL
    value: int | None = None  # the limit when the text names none
    threshold: int | None = None  # many_image_side: from how many images on
    patch_px: int | None = None  # the number counts patches of this side: a long side is worked out of it
    host: str | None = None  # a glob: the pattern applies to this host only
    provider: str = ""
    source: str = ""  # file:line

    def applies(self, status: int, host: str) -> bool:
        return status in self.status and (self.host is None or fnmatch.fnmatch(host.lower(), self.host.lower()))

    @property
    def catch_all(self) -> bool:
        """An empty `match`: the pattern takes any answer with its status, after every other reading failed."""
        return not self.regex.pattern


_NO_EXPRESSION = re.compile(r"(?!)")  # the general reader's patterns match nothing themselves: its grammar reads
# The general reader's results, one per kind: `pattern.name` is "general" in the log and the learned file.
GENERAL = {
    kind: Pattern("general", GENERAL_STATUSES, _NO_EXPRESSION, kind, HOST if kind == BODY_BYTES else MODEL, source="the general reader")
    for kind in (IMAGE_COUNT, BODY_BYTES, IMAGE_BYTES, IMAGE_SIDE)
}


@dataclass(frozen=True, slots=True)
class LimitError:
    """A provider's answer that refused a request for a limit: which, and the number it named (None: none)."""

    pattern: Pattern
    status: int
    value: int | None
    text: str  # the provider's short message, keys taken out ("" when long, or a catch-all's page): the source's

    @property
    def kind(self) -> str:
        return self.pattern.kind

    @property
    def field(self) -> str:
        return FIELDS[self.pattern.kind]

    @property
    def reason(self) -> str:
        return REASONS[self.pattern.kind]

    @property
    def source(self) -> str:
        """What a learned limit keeps of where it came from: the status and the pattern's name, and the
        provider's message only when it is short; never a page or a body."""
        return f"{self.status} {self.pattern.name}: {self.text}" if self.text else f"{self.status} {self.pattern.name}"


@dataclass(frozen=True, slots=True)
class Refused:
    """What the refused request sent: its body size and image count, from its record; the base64 length and
    long side of its largest image when they are known (None: unknown)."""

    body_bytes: int
    images: int
    largest_image_bytes: int | None = None
    largest_image_side: int | None = None


@dataclass(frozen=True, slots=True)
class Tightening:
    """The Limits fields to send the request again under, and where the number came from."""

    fields: Mapping[str, int]
    named: bool  # the answer (or the pattern) named the number; False: stepped down from what was refused

    def describe(self, error: LimitError) -> str:
        """e.g. "too many images (max 10, from the answer)"."""
        value = self.fields[error.field]
        shown = _format_value(error.kind, value)
        return f"{error.reason} (max {shown}, {'from the answer' if self.named else 'stepped down from what was refused'})"


@dataclass(frozen=True, slots=True)
class Rejected:
    """Why a refusal teaches nothing: one line with figures and no text of the answer, for the log."""

    reason: str


def _format_value(kind: str, value: int) -> str:
    if kind in (BODY_BYTES, IMAGE_BYTES):
        return f"{value:,} bytes"
    if kind in (IMAGE_SIDE, MANY_IMAGE_SIDE):
        return f"{value}px"
    return str(value)


class Patterns:
    """Named patterns tried in order (the first that applies to the status and host and matches one of the
    answer's messages wins), then the general reader, then the catch-alls."""

    def __init__(self, patterns: Iterable[Pattern], general: bool = True) -> None:
        self.patterns = tuple(patterns)
        self.general = general

    def recognise(self, status: int, body: bytes, host: str = "") -> LimitError | None:
        """The limit error the answer `body` (decoded) with `status` names, or None when it is no limit error."""
        if status in NEVER or status < 400 or status >= 500:
            return None
        candidates = [p for p in self.patterns if p.applies(status, host)]
        if not candidates and not (self.general and status in GENERAL_STATUSES):
            return None
        messages = answer_messages(body)
        for pattern in candidates:
            if pattern.catch_all:
                continue
            for message in messages:
                found = _search(pattern, message)
                if found is not None:
                    value, end = found
                    return LimitError(pattern, status, value, _excerpt(message, end))
        if any(_NOT_SIZE.search(message) for message in messages):
            return None
        if self.general and status in GENERAL_STATUSES:
            general = _general_reading(messages)
            # A 413 that names no number is the catch-all's: a bare 413 steps the body down, which a size the
            # answer names no figure for (an image's bytes or sides) could not do.
            if general is not None and not (general[0].value is None and status == 413 and any(p.catch_all for p in candidates)):
                reading, message = general
                return LimitError(GENERAL[reading.kind], status, reading.value, _excerpt(message, reading.end))
        for pattern in candidates:
            if pattern.catch_all:
                return LimitError(pattern, status, pattern.value, "")  # a page or a bare sentence: nothing of it is kept
        return None

    def __len__(self) -> int:
        return len(self.patterns)


def _general_reading(messages: list[str]) -> tuple[Reading, str] | None:
    """The general reader's reading of the first message that names a number, else of the first that names
    what was too large without one; with the message it read."""
    without_number: tuple[Reading, str] | None = None
    for message in messages:
        reading = read_limit(message)
        if reading is not None and reading.value is not None:
            return reading, message
        if reading is not None and without_number is None:
            without_number = reading, message
    return without_number


def _search(pattern: Pattern, message: str) -> tuple[int | None, int] | None:
    """(the number, where the match ends) of the pattern's first match in `message` whose number stands
    alone: "Max is 0.png" is a file name the answer echoes, not a number."""
    for match in pattern.regex.finditer(message):
        if "limit" in match.groupdict() and match.group("limit") is not None and _glued(message, match.end("limit")):
            continue
        return _number(pattern, match), match.end()
    return None


def _glued(text: str, end: int) -> bool:
    """Whether the number ending at `end` goes on into a word ("0.png", "4o")."""
    rest = text[end : end + 2]
    return bool(rest) and (rest[0].isalnum() or rest[0] == "_" or (rest[0] in ".-/" and len(rest) > 1 and rest[1].isalnum()))


def _number(pattern: Pattern, match: re.Match[str]) -> int | None:
    groups = match.groupdict()
    if groups.get("limit") is None:
        return pattern.value
    value = int(groups["limit"]) - int(groups.get("minus") or 0)
    if pattern.patch_px is not None:
        # A budget of N square patches holds a square image of floor(sqrt(N)) patches a side: any shape fits within it.
        value = math.isqrt(value) * pattern.patch_px
    return value


def _excerpt(message: str, end: int) -> str:
    """The message kept in a learned limit's source: only a short one, up to the end of the sentence that
    named the limit, with anything like a key, an address or a token taken out."""
    if len(message) > SOURCE_MESSAGE_MAX:
        return ""
    stop = _TO_SENTENCE_END.match(message, end)
    text = message[: stop.end() if stop is not None else end]
    return _SECRET.sub("[redacted]", " ".join(_CONTROL.sub(" ", text).split()))


# --- what a refusal may teach ---------------------------------------------------------------------


def step_down(kind: str, refused: int) -> int | None:
    """The limit to try after `refused` (a body or image size, an image count or side) was refused by a limit
    the answer did not name."""
    steps = BODY_STEPS if kind in (BODY_BYTES, IMAGE_BYTES) else SIDE_STEPS if kind in (IMAGE_SIDE, MANY_IMAGE_SIDE) else COUNT_STEPS
    below = [s for s in steps if s < refused]
    nearest = below[-1] if below else None
    fallback = math.floor(refused * _STEP_RATIO)
    if nearest is not None and nearest >= fallback:
        return nearest
    return fallback if fallback < refused else None


def assess(error: LimitError, limits: Limits, refused: Refused) -> Tightening | Rejected:
    """The fields to send the refused request again under, each tighter than `limits` and none under its
    floor; or why there are none."""
    kind, current = error.kind, getattr(limits, error.field)
    value, named = error.value, True
    measured = refused.body_bytes if kind == BODY_BYTES else refused.images if kind == IMAGE_COUNT else None
    if measured is not None and (value is None or value >= measured):
        # The answer named no number, or one the refused request was already within: step down from what was sent.
        value, named = step_down(kind, measured), False
        if value is None:
            return Rejected(f"{error.reason}: no lower step under the {_format_value(kind, measured)} refused")
    sent = refused.largest_image_bytes if kind == IMAGE_BYTES else refused.largest_image_side if kind in (IMAGE_SIDE, MANY_IMAGE_SIDE) else None
    if value is None:
        # One image's size with no figure: a step under the largest image sent, or under the limit that applied.
        below = min((v for v in (sent, current) if v is not None), default=None)
        value, named = (step_down(kind, below) if below is not None else None), False
        if value is None:
            return Rejected(f"{error.reason}: the answer names no number, and no image size is known to step down from")
    floor = FLOORS[kind]
    if value < floor:
        return Rejected(f"{error.reason}: {_format_value(kind, value)} is under the floor of {_format_value(kind, floor)}")
    if sent is not None and value >= sent:
        return Rejected(
            f"{error.reason}: the answer's {_format_value(kind, value)} is no lower than the largest image sent ({_format_value(kind, sent)})"
        )
    if current is not None and value >= current:
        return Rejected(f"{error.reason}: the limits that applied ({_format_value(kind, current)}) already held the request there")
    fields = {error.field: value}
    if kind == IMAGE_COUNT and limits.keep_recent > value:
        fields["keep_recent"] = value  # the newest images are kept whatever the cap: no more of them than it allows (>= 1: its floor)
    if kind == MANY_IMAGE_SIDE:
        threshold = error.pattern.threshold if error.pattern.threshold is not None else 0
        if limits.many_images_threshold is not None:
            threshold = min(threshold, limits.many_images_threshold)
        fields["many_images_threshold"] = threshold
    return Tightening(fields, named)


def tightened(error: LimitError, limits: Limits, refused: Refused) -> Tightening | None:
    """The fields to send the refused request again under, each tighter than `limits`; None when nothing can
    be tightened (no number under what applied, no step left, or a figure under a floor: `why_not` says which)."""
    result = assess(error, limits, refused)
    return result if isinstance(result, Tightening) else None


def why_not(error: LimitError, limits: Limits, refused: Refused) -> str | None:
    """Why `tightened` gives nothing, in one line with no text of the answer; None when it gives fields."""
    result = assess(error, limits, refused)
    return result.reason if isinstance(result, Rejected) else None


def scope(error: LimitError) -> str:
    """Whether a limit learned from `error` holds for the request's model at its host, or for the whole host."""
    return error.pattern.per


# --- loading -----------------------------------------------------------------------------------


def load_patterns(path: str | os.PathLike[str] | None = None) -> Patterns:
    """The shipped patterns, after those of `path` when one is given; RulesError (file:line) for a bad file."""
    shipped = _read(DEFAULT_PATTERNS_PATH)
    if not path:
        return Patterns(shipped)
    return Patterns(_read(path) + shipped)


def parse_patterns(text: str, source: str = "<string>") -> Patterns:
    return Patterns(_PatternsReader(source).parse(text))


def _read(path: str | os.PathLike[str]) -> list[Pattern]:
    return _PatternsReader(os.fspath(path)).parse(read_text(path, RulesError))


class _PatternsReader(NodeReader[list[Pattern]]):
    error_class = RulesError

    def top(self, root: Node | None) -> list[Pattern]:
        top = self.top_mapping(root, "the limit errors file", _TOP_KEYS, "empty limit errors file: write `patterns:` (see rules/limit_errors.yaml)")
        if "patterns" not in top:
            assert root is not None
            raise self.error(root, "no `patterns:` list")
        names: dict[str, int] = {}
        out = []
        for node in self.sequence(top["patterns"][1], "patterns"):
            pattern = self.pattern(node)
            if pattern.name in names:
                raise self.error(node, f"duplicate pattern name {pattern.name!r} (first on line {names[pattern.name]})")
            names[pattern.name] = node.start_mark.line + 1
            out.append(pattern)
        return out

    def pattern(self, node: Node) -> Pattern:
        fields = self.mapping(node, "a pattern")
        for key in ("name", "status", "match", "limit"):
            if key not in fields:
                raise self.error(node, f"pattern has no {key}: each pattern needs name, status, match and limit")
        name = self.text(fields["name"][1], "name")
        what = f"pattern {name!r}"
        self.reject_unknown(fields, _PATTERN_KEYS, what)
        kind = self.text(fields["limit"][1], "limit")
        if kind not in FIELDS:
            raise self.error(fields["limit"][1], f"{what}: limit must be one of {', '.join(FIELDS)}, got {kind!r}")
        status = self.statuses(fields["status"][1], what)
        match_node = fields["match"][1]
        expression = self.scalar(match_node)
        if not isinstance(expression, str):
            raise self.error(match_node, f"{what}: match must be a regular expression in quotes, got {self.describe(match_node)}")
        try:
            regex = re.compile(expression, re.IGNORECASE)
        except re.error as e:
            raise self.error(match_node, f"{what}: match is not a valid regular expression ({e})") from None
        unknown_groups = set(regex.groupindex) - {"limit", "minus"}
        if unknown_groups:
            raise self.error(match_node, f"{what}: match names groups {sorted(unknown_groups)}; only (?P<limit>...) and (?P<minus>...) are read")
        if "minus" in regex.groupindex and "limit" not in regex.groupindex:
            raise self.error(match_node, f"{what}: (?P<minus>...) is taken off (?P<limit>...), which match does not have")
        value = self.whole(fields, "value", what)
        if value is not None and "limit" in regex.groupindex:
            raise self.error(fields["value"][0], f"{what}: give the number either as (?P<limit>...) in match or as value, not both")
        if value is None and "limit" not in regex.groupindex and kind not in (IMAGE_COUNT, BODY_BYTES):
            raise self.error(
                node, f"{what}: a {kind} limit cannot step down from what was refused: name the number with (?P<limit>...) in match, or give value"
            )
        threshold = self.whole(fields, "threshold", what)
        if threshold is not None and kind != MANY_IMAGE_SIDE:
            raise self.error(fields["threshold"][0], f"{what}: threshold is for many_image_side only")
        patch_px = self.whole(fields, "patch_px", what)
        per = self.text(fields["per"][1], "per") if "per" in fields else (HOST if kind == BODY_BYTES else MODEL)
        if per not in (MODEL, HOST):
            raise self.error(fields["per"][1], f"{what}: per must be model or host, got {per!r}")
        host = self.text(fields["host"][1], "host") if "host" in fields else None
        provider = self.text(fields["provider"][1], "provider") if "provider" in fields else ""
        pattern = Pattern(name, status, regex, kind, per, value, threshold, patch_px, host, provider, f"{self.source}:{node.start_mark.line + 1}")
        if "example" in fields:
            self.check_example(pattern, fields, what)
        return pattern

    def check_example(self, pattern: Pattern, fields: Mapping[str, tuple[Node, Node]], what: str) -> None:
        """A pattern's example must be recognised, and give `expect` when that is given."""
        example_node = fields["example"][1]
        example = self.text(example_node, "example")
        status = min(pattern.status)
        found = Patterns([pattern], general=False).recognise(status, example.encode(), pattern.host.replace("*", "x") if pattern.host else "")
        if found is None or found.pattern is not pattern:
            raise self.error(example_node, f"{what}: match does not find its own example")
        expect = self.whole(fields, "expect", what)
        if expect is not None and found.value != expect:
            raise self.error(fields["expect"][1], f"{what}: the example gives {found.value}, not the expected {expect}")

    def text(self, node: Node, key: str) -> str:
        value = self.scalar(node)
        if not isinstance(value, str) or (key != "match" and not value.strip()):
            raise self.error(node, f"{key} must be text, got {self.describe(node)}")
        return value

    def whole(self, fields: Mapping[str, tuple[Node, Node]], key: str, what: str) -> int | None:
        if key not in fields:
            return None
        node = fields[key][1]
        value = self.scalar(node)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.error(node, f"{what}: {key} must be a whole number >= 0, got {self.describe(node)}")
        return value

    def statuses(self, node: Node, what: str) -> frozenset[int]:
        items = list(node.value) if isinstance(node, SequenceNode) else [node]
        out = set()
        for item in items:
            value = self.scalar(item)
            if isinstance(value, bool) or not isinstance(value, int) or not 400 <= value <= 499:
                raise self.error(item, f"{what}: status must be 4xx codes (a 5xx is never a limit error), got {self.describe(item)}")
            if value in NEVER:
                raise self.error(item, f"{what}: {value} is never a limit error (auth, a missing path or a rate limit)")
            out.add(value)
        if not out:
            raise self.error(node, f"{what}: status is an empty list")
        return frozenset(out)
