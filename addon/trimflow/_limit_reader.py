"""The general reader of limit errors: the limit a provider's message states, read by the kinds of sentence that
state one, for the wordings no named pattern (rules/limit_errors.yaml) knows.

A sentence states a limit when a number stands in a limiting relation to what it limits:

- a cue before the number, with a few words between: "max 20", "maximum allowed: 50", "(max 8)", "up to 10",
  "no more than 5", "fewer than 3600", "cannot exceed 30MB", "limit to 75 megapixels";
- a cue after it: "5 MB maximum", "10MB limit", "20 is the maximum";
- a comparison sign: the right side of "N > M" or "image_count > 20", of "must be <= 20";
- no number at all, but a size word and a too-large cue: "Request payload is too large", "Image exceeds max
  pixels allowed", "too many images": the limit steps down from what was refused.

What the number limits comes from its unit and the words of its sentence, not from their order: an image count
("20 images", "number of image files ... 6"), one image's bytes or the request body ("30MB", nearest to an image
or file word, or to a request or payload word), one image's side ("8000 pixels", "2048x2048", an area as the side
of its square). A relation of "fewer than" or "less than" keeps a count one under the number. The number a
sentence says was sent ("got 11", "47688287, which exceeds", the left side of ">") is never the limit.

Pure Python, no mitmproxy; `read_limit` is the one entry point (trimflow._limit_errors calls it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# The kinds of limit an answer can name.
IMAGE_COUNT, BODY_BYTES, IMAGE_BYTES, IMAGE_SIDE, MANY_IMAGE_SIDE = "image_count", "body_bytes", "image_bytes", "image_side", "many_image_side"
COUNT_MAX = 10_000  # an image count above this is no count a provider names (the largest documented: 3,600)


@dataclass(frozen=True, slots=True)
class Reading:
    """What the general reader found in a message: the kind of limit, its number (None: the message names
    none, and the limit steps down from what was refused), and where the reading ends."""

    kind: str
    value: int | None
    end: int


@dataclass(frozen=True, slots=True)
class Quantity:
    """A number in a message with its unit: "5 MB", "2048x2048", "20 images", "1048576"."""

    value: float
    unit: str  # "" (none), "bytes", "px", "area", "count", "tokens"
    start: int
    end: int
    second: float | None = None  # the height of "WxH"


@dataclass(frozen=True, slots=True)
class _Relation:
    """How surely a number is the limit (3 a comparison's right side, 2 after a cue, 1 before a cue, 0 not a
    limit), and whether the relation is strict ("fewer than 3600": at most 3599)."""

    strength: int
    strict: bool = False


_NONE = _Relation(0)

# A number standing alone (not part of a name such as "gpt-4o", "messages.19" or "0.png"), with its unit.
_QUANTITY = re.compile(
    r"(?<![\w.\-/:$])(?P<number>\d{1,3}(?:,\d{3})+(?![\d,])|\d+(?:\.\d+)?)"
    r"(?:\s*[x\u00d7]\s*(?P<second>\d+))?"  # "2048x2048", also with the multiplication sign
    r"(?:\s*(?P<unit>[kmgt]i?b|bytes?|px|pixels?|megapixels?|mp|image\(s\)|images?|pictures?|photos?|media|documents?|attachments?|tokens?))?"
    r"(?![\w]|[.\-/]\w)",
    re.IGNORECASE,
)
_BYTES = {"kb": 1000, "kib": 1 << 10, "mb": 1000**2, "mib": 1 << 20, "gb": 1000**3, "gib": 1 << 30, "tb": 1000**4, "tib": 1 << 40}
# A cue that the number after it is a limit, and the words it may take before the number ("maximum allowed
# file size of", "limit:", "(max", "fewer than", "supports up to"): at most 50 characters, with no other number
# and no end of clause among them.
_CUE_BEFORE = re.compile(
    r"\b(?P<cue>max(?:imum)?|limit(?:ed)?|at most|up to|no more than|not more than|(?:fewer|less|more) than"
    r"|(?:can ?not|can't|must not|may not|should not) exceed|exceed(?:s|ed|ing)?|over|above|below|under|allowed|only)\b[^.!?;]{0,50}$",
    re.IGNORECASE,
)
_STRICT_CUE = re.compile(r"^(?:fewer|less) than$|^(?:below|under)$", re.IGNORECASE)
# A cue after the number, or the number as the subject of one: "5 MB maximum", "10MB limit", "20 is the maximum".
_CUE_AFTER = re.compile(r"\s*(?:(?:is|are)\s+(?:the\s+)?)?(?:max(?:imum)?|limit)\b", re.IGNORECASE)
# A comparison sign just before the number: ">" (what was sent or counted is over the number), "<", "<=", "≤".
# After "must be" or "should be" a ">" states a minimum, never a limit.
_SIGN_BEFORE = re.compile(r"(?P<sign>>|<=|=<|\u2264|<)\s*$")
_MINIMUM_SIGN = re.compile(r"\b(?:must|should|needs? to|has to)\s+be\s*$", re.IGNORECASE)
# The left side of a comparison is what was sent ("15908784 bytes >", "47688287, which exceeds"); a limit
# that "was exceeded" is still the limit ("Maximum request body size 1048576 exceeded").
_ACTUAL_AFTER = re.compile(r"\s*(?:>|,?\s*(?:which\s+)?exceeds?\b)", re.IGNORECASE)
_ACTUAL = re.compile(r"\b(?:current|actual|got|provided|received|requested|contains?|your|you sent)\b", re.IGNORECASE)
_SIZE_WORDS = re.compile(r"\b(?:body|request|payload|file|upload|content|image|media|attachment|entity)\s+size\b", re.IGNORECASE)
_AREA_WORDS = re.compile(r"\btotal pixels\b|\bpixel (?:count|area)\b|\barea\b|\bmegapixels?\b", re.IGNORECASE)
# Words of a sentence about how many images: plural, a count or a number of them ("The image you provided
# requires 33174 patches" is about one image).
_COUNT_WORDS = re.compile(
    r"\b(?:images|image\(s\)|image (?:count|links|files|parts|inputs)|pictures|photos|media|attachments|number of (?:images?|pictures|photos))\b",
    re.IGNORECASE,
)
_NOT_COUNT = re.compile(r"\b(?:size|bytes?|[kmg]i?b|pixels?|px|dimensions?|width|height|length|resolution)\b", re.IGNORECASE)
_IMAGE_WORDS = re.compile(r"\b(?:images?|pictures?|photos?|media|multimodal|files?|attachments?|inline data|base64)\b", re.IGNORECASE)
_BODY_WORDS = re.compile(r"\b(?:request|body|payload|entity|upload|message)\b", re.IGNORECASE)
_SIDE_WORDS = re.compile(r"\b(?:dimensions?|width|height|side|resolution|size|limit|max(?:imum)?|exceed\w*)\b", re.IGNORECASE)
# A sentence with no number that still says which thing was too large: a too-large or exceeded cue (or "too
# many" for a count) with a word naming the thing. Words of the request alone ("request", "input") are not
# enough: "Input is too long for requested model" is about tokens; the request counts with a size word.
_TOO_LARGE = re.compile(r"\btoo (?:large|big)\b|\bexceed(?:s|ed|ing)?\b|\bover (?:the )?(?:limit|maximum)\b", re.IGNORECASE)
_TOO_MANY = re.compile(r"\btoo (?:many|much)\b", re.IGNORECASE)
_NO_NUMBER_SIDE = re.compile(r"\b(?:pixels?|megapixels?|dimensions?|resolution|width|height)\b", re.IGNORECASE)
_NO_NUMBER_IMAGE = re.compile(r"\b(?:images?|pictures?|photos?|files?|attachments?|media|inline data)\b", re.IGNORECASE)
_NO_NUMBER_BODY = re.compile(r"\b(?:payload|body|entity)\b|\brequest(?:'s)?\b(?=.*\b(?:size|length|bytes|too large|too big)\b)", re.IGNORECASE)
_NO_NUMBER_COUNT = re.compile(r"\b(?:images|media|pictures|photos|image (?:links|files|parts|inputs))\b", re.IGNORECASE)
# How many: "max images exceeded", "the number of images exceeds the limit", "image count over the limit".
_COUNT_PHRASE = re.compile(
    r"\b(?:max(?:imum)?|number of)\s+(?:images|pictures|photos|media|image (?:links|files|parts|inputs))\b|\bimage count\b", re.I
)
# A cue with a figure after it ("Max is 0.png"): when the figure is no quantity, the message states a limit the
# reader cannot read (an echoed file name), and a sentence of it without a number is no verdict to step down on.
_CUED_FIGURE = re.compile(r"\b(?:max(?:imum)?|limit|at most|up to|no more than|(?:fewer|less) than)\b[^.!?;\d]{0,12}(?=\d)", re.IGNORECASE)
# An HTTP status with its reason phrase, echoed in a message or a page's title ("[400 Bad Request]", "413
# Request Entity Too Large"): the status says nothing the reader does not know, and its number is no limit.
_STATUS_PHRASE = re.compile(
    r"\b[45]\d\d\s+(?:bad request|request entity too large|payload too large|content too large|unprocessable (?:entity|content))\b", re.IGNORECASE
)
# Echoes the reader skips: quoted spans (a file name, a model, the user's text) and dotted or slashed
# names ("messages.3.content", "image/png", "response.create").
_QUOTED = re.compile(r"`[^`]*`|\"[^\"]*\"|(?<![\w])'[^']*'(?![\w])")
_TOKEN = re.compile(r"\S+")
_NAME_JOINT = re.compile(r"\w[./]\w")
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+")
_QUANTITIES_MAX = 32  # numbers of one message read
_AREA_FROM = 65_536  # a pixel figure above this is an area: no image side is that long


def read_limit(message: str) -> Reading | None:
    """The limit a provider's message names, by the general reader's grammar (the module's docstring): the
    surest reading of a number, else a sentence with no number that names what was too large (value None).
    None when the message states no limit it can read."""
    text = _analysed(message)
    best: tuple[int, int, Reading] | None = None  # (strength, -position, reading)
    no_number: Reading | None = None
    offset, seen = 0, 0
    message_words: list[str] = []  # the whole message's words, worked out when a sentence has none of its own
    for sentence in _SENTENCE_END.split(text):
        start = text.find(sentence, offset)
        offset = start + len(sentence)
        found = _quantities(sentence)
        quantities = [q for q in found if q.unit != "tokens"][: _QUANTITIES_MAX - seen]
        seen += len(quantities)
        if not found and no_number is None:
            no_number = _no_number_reading(sentence, start)
        words = _without_names(sentence) if quantities else ""
        for index, quantity in enumerate(quantities):
            relation = _relation(sentence, quantity, quantities[index - 1] if index else None)
            if not relation.strength:
                continue
            reading = _reading(sentence, words, text, message_words, quantity, start, relation.strict)
            if reading is not None and (best is None or (relation.strength, -reading.end) > best[:2]):
                best = (relation.strength, -reading.end, reading)
        if seen >= _QUANTITIES_MAX:
            break  # no provider's message names this many numbers: the rest is not read
    if best is not None:
        return best[2]
    return None if _unreadable_figure(text) else no_number


def _analysed(message: str) -> str:
    """The message as the grammar reads it, every position kept: quoted spans and HTTP status phrases blanked,
    and "_" read as a space ("image_count", "max_images" are the words they join)."""
    text = _QUOTED.sub(lambda m: " " * len(m.group(0)), message)
    text = _STATUS_PHRASE.sub(lambda m: " " * len(m.group(0)), text)
    return text.replace("_", " ")


def _unreadable_figure(text: str) -> bool:
    """Whether a cue of `text` comes with a figure that is no quantity ("Max is 0.png")."""
    return any(_QUANTITY.match(text, cue.end()) is None for cue in _CUED_FIGURE.finditer(text))


def _without_names(text: str) -> str:
    """`text` with every word that is a dotted or slashed name blanked out (linear: no backtracking over a
    long word)."""
    return _TOKEN.sub(lambda m: " " if _NAME_JOINT.search(m.group(0)) else m.group(0), text)


def _quantities(sentence: str) -> list[Quantity]:
    out = []
    for match in _QUANTITY.finditer(sentence):
        number = float(match.group("number").replace(",", ""))
        unit = (match.group("unit") or "").lower()
        second = float(match.group("second")) if match.group("second") else None
        if unit in _BYTES:
            value, unit = number * _BYTES[unit], "bytes"
        elif unit.startswith("byte"):
            value, unit = number, "bytes"
        elif unit in ("px", "pixel", "pixels"):
            value = number
            unit = "area" if number > _AREA_FROM else "px"
        elif unit in ("megapixel", "megapixels", "mp"):
            value, unit = number * 1_000_000, "area"
        elif unit.startswith("token"):
            value, unit = number, "tokens"
        elif unit:
            value, unit = number, "count"
        else:
            value = number
        out.append(Quantity(value, unit, match.start(), match.end(), second))
    return out


def _relation(sentence: str, quantity: Quantity, previous: Quantity | None) -> _Relation:
    """How `quantity` stands to the limit its sentence states."""
    if _ACTUAL_AFTER.match(sentence, quantity.end):
        return _NONE  # "47688287, which exceeds", "15908784 bytes > ...": what was sent
    before = sentence[previous.end if previous is not None else 0 : quantity.start]
    sign = _SIGN_BEFORE.search(before)
    if sign is not None:
        ahead = before[: sign.start()]
        after_number = not ahead.strip() and previous is not None  # "120 + 0 > 100"
        after_noun = bool(ahead.strip()) and not _MINIMUM_SIGN.search(ahead)  # "image_count > 20", never "must be > 10"
        if sign.group("sign") == ">" and (after_number or after_noun):
            return _Relation(3)  # the right side is the limit
        if sign.group("sign") != ">":
            return _Relation(3, strict=sign.group("sign") == "<")  # "must be <= 20", "size < 5MB"
        return _NONE
    before = _without_names(before)  # "for model gemini-3.1-pro-preview is": a name, not words
    cue = _CUE_BEFORE.search(before)
    if cue is not None and not _ACTUAL.search(before, cue.end()):
        return _Relation(2, strict=bool(_STRICT_CUE.match(cue.group("cue"))))
    if _CUE_AFTER.match(sentence, quantity.end):
        return _Relation(1)
    return _NONE


def _reading(sentence: str, words: str, text: str, message_words: list[str], quantity: Quantity, offset: int, strict: bool) -> Reading | None:
    """The kind and number `quantity` limits, from its unit and its sentence's `words`; None when neither says."""
    end = offset + quantity.end
    value = quantity.value
    if quantity.second is not None:
        if not _SIDE_WORDS.search(words):
            return None
        return Reading(IMAGE_SIDE, int(max(value, quantity.second)), end)
    unit = quantity.unit
    if unit == "" and _AREA_WORDS.search(words) and value > _AREA_FROM:
        unit = "area"
    if unit == "area":
        # An area limit as a long side: a square of isqrt(area) a side holds any shape whose long side is
        # no longer, so the side is the one bound that keeps every image within the area.
        return Reading(IMAGE_SIDE, math.isqrt(int(value)), end)
    if unit == "px":
        return Reading(IMAGE_SIDE, int(value), end)
    if unit == "" and value >= 1024 and _SIZE_WORDS.search(sentence[: quantity.start]):
        unit = "bytes"  # "Maximum request body size 1048576", "max allowed file size of 31457280"
    if unit == "bytes":
        if not message_words:
            message_words.append(_without_names(text))
        return Reading(_bytes_kind(words, quantity.start, message_words[0]), int(value), end)
    if unit == "" and not (_COUNT_WORDS.search(words) or _NOT_COUNT.search(words)):
        if not message_words:
            message_words.append(_without_names(text))
        words = message_words[0]  # "Too many images in request. Max is 10.": the count's words are a sentence before
    if unit == "count" or (unit == "" and _COUNT_WORDS.search(words) and not _NOT_COUNT.search(words)):
        if value != int(value) or value > COUNT_MAX:
            return None
        return Reading(IMAGE_COUNT, int(value) - (1 if strict else 0), end)  # fewer than 3600: 3599 at most
    return None


def _bytes_kind(words: str, position: int, message_words: str) -> str:
    """One image's bytes when the nearest word before the figure (or, with none before, after it) names an
    image or a file; the request body when it names a request or a payload. A sentence that names neither
    ("Maximum size is 20 MB.") takes the message's first such word ("The image is too large."); with none
    at all, the request body."""
    before = [(m.start(), IMAGE_BYTES) for m in _IMAGE_WORDS.finditer(words, 0, position)]
    before += [(m.start(), BODY_BYTES) for m in _BODY_WORDS.finditer(words, 0, position)]
    if before:
        return max(before)[1]
    if _IMAGE_WORDS.search(words, position):
        return IMAGE_BYTES
    if _BODY_WORDS.search(words, position):
        return BODY_BYTES
    image, body = _IMAGE_WORDS.search(message_words), _BODY_WORDS.search(message_words)
    if image is not None and (body is None or image.start() < body.start()):
        return IMAGE_BYTES
    return BODY_BYTES


def _no_number_reading(sentence: str, offset: int) -> Reading | None:
    """A sentence with no number that says which thing was too large: "too many images" is a count, a too-large
    or exceeded cue with pixels or dimensions is one image's side, with an image or a file its bytes, with the
    request's payload, body or size the body (the nearest of them before the cue, else after it)."""
    words = _without_names(sentence)
    end = offset + len(sentence)
    many = _TOO_MANY.search(words)
    if many is not None and _NO_NUMBER_COUNT.search(words, many.end()):
        return Reading(IMAGE_COUNT, None, end)
    cue = _TOO_LARGE.search(words)
    if cue is None:
        return None
    if _COUNT_PHRASE.search(words):
        return Reading(IMAGE_COUNT, None, end)
    if _NO_NUMBER_SIDE.search(words):
        return Reading(IMAGE_SIDE, None, end)
    image = [m.start() for m in _NO_NUMBER_IMAGE.finditer(words)]
    body = [m.start() for m in _NO_NUMBER_BODY.finditer(words)]
    image_before, body_before = [p for p in image if p < cue.start()], [p for p in body if p < cue.start()]
    if image_before or body_before:
        return Reading(IMAGE_BYTES if max(image_before, default=-1) > max(body_before, default=-1) else BODY_BYTES, None, end)
    if image or body:
        return Reading(IMAGE_BYTES if min(image, default=len(words)) < min(body, default=len(words)) else BODY_BYTES, None, end)
    return None
