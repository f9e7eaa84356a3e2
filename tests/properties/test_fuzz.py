"""Fuzzing the engine: random valid requests of every wire format (tool results nesting images, mixed parts,
remote images, documents, unknown fields everywhere), then random corruptions of them.

Draws from tests/properties/strategies.py (the image pool, text and limits) as test_engine_properties does, with richer requests.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import orjson
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from trimflow import prune_request
from trimflow.formats import FORMATS
from trimflow.testing import b64, data_url

from ..helpers import rules_with, url_for
from .strategies import POOL, kept_in_order, limits, text

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, suppress_health_check=_HEALTH)


PDF = [b"%PDF-1.4\n" + bytes([i]) * 40 for i in range(4)]  # distinct document payloads

# --- valid requests ---------------------------------------------------------------------------------------------

# Unknown fields, at the top level, on messages and on parts: they must come out as they went in.
scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False), text)
unknown_value = st.one_of(scalar, st.lists(scalar, max_size=2), st.dictionaries(st.sampled_from(["k", "ü", ""]), scalar, max_size=2))
unknown = st.dictionaries(st.sampled_from(["x_extra", "metadata_x", "zz", "ünïcode", ""]), unknown_value, max_size=2)
# Parts carry fixed unknown fields: cheap to generate, and enough to show they pass through.
part_unknown = st.sampled_from([{}, {}, {"x_part": 1}, {"x_part": {"nested": [None, "v"]}}, {"metadata": "m"}])

# A part: text, an inline image (index into POOL), a remote image, an inline document; with unknown fields.
part = st.tuples(
    st.sampled_from(["text", "image", "image", "remote", "doc"]),
    st.one_of(text, st.integers(0, len(POOL) - 1)),
    part_unknown,
)
# A message: role, whether its parts sit inside a tool result, the parts, and the message's unknown fields.
message = st.tuples(st.sampled_from(["user", "assistant"]), st.booleans(), st.lists(part, min_size=1, max_size=5), part_unknown)
conversation = st.lists(message, min_size=1, max_size=7)


def _index(value: Any) -> int:
    return value if isinstance(value, int) else len(value) % len(POOL)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else f"text {value}"


def render_rich(fmt: str, conv: list, extra: dict) -> dict[str, Any]:
    """The conversation in one wire format, with the format's own shapes for each kind of part."""
    if fmt == "ollama":  # images ride beside the text, no parts, no documents, no remote images
        msgs = []
        for role, _tool, parts, more in conv:
            msg: dict[str, Any] = {**more, "role": role, "content": " ".join(_text(v) for k, v, _ in parts if k == "text")}
            images = [b64(POOL[_index(v)]) for k, v, _ in parts if k == "image"]
            if images:
                msg["images"] = images
            msgs.append(msg)
        return {**extra, "model": "llava", "messages": msgs}
    build = _PARTS[fmt]
    items = []
    for i, (role, tool, parts, more) in enumerate(conv):
        rendered = [{**x, **build(k, v)} for k, v, x in parts]
        items.append({**more, **_WRAP[fmt](i, role, tool, rendered)})
    top = {
        "openai-chat": ("messages", {"model": "gpt-4o"}),
        "openai-responses": ("input", {"model": "gpt-4.1"}),
        "anthropic": ("messages", {"model": "claude-x", "max_tokens": 10}),
        "gemini": ("contents", {}),
        "bedrock-converse": ("messages", {}),
    }
    key, fixed = top[fmt]
    return {**extra, **fixed, key: items}


def _chat_part(kind: str, v: Any) -> dict:
    if kind == "text":
        return {"type": "text", "text": _text(v)}
    if kind == "image":
        return {"type": "image_url", "image_url": {"url": data_url(POOL[_index(v)], "image/png"), "detail": "low"}}
    if kind == "remote":
        return {"type": "image_url", "image_url": {"url": f"https://img.example.test/{_index(v)}.png"}}
    return {"type": "file", "file": {"filename": "a.pdf", "file_data": data_url(PDF[_index(v) % 4], "application/pdf")}}


def _responses_part(kind: str, v: Any) -> dict:
    if kind == "text":
        return {"type": "input_text", "text": _text(v)}
    if kind == "image":
        return {"type": "input_image", "image_url": data_url(POOL[_index(v)], "image/png")}
    if kind == "remote":
        return {"type": "input_image", "image_url": f"https://img.example.test/{_index(v)}.png"}
    return {"type": "input_file", "filename": "a.pdf", "file_data": data_url(PDF[_index(v) % 4], "application/pdf")}


def _anthropic_part(kind: str, v: Any) -> dict:
    if kind == "text":
        return {"type": "text", "text": _text(v)}
    if kind == "image":
        source = {"type": "base64", "media_type": "image/png", "data": b64(POOL[_index(v)])}
        return {"type": "image", "source": source, "cache_control": {"type": "ephemeral"}}
    if kind == "remote":
        return {"type": "image", "source": {"type": "url", "url": f"https://img.example.test/{_index(v)}.png"}}
    return {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": b64(PDF[_index(v) % 4])}}


def _gemini_part(kind: str, v: Any) -> dict:
    if kind == "text":
        return {"text": _text(v)}
    if kind == "image":  # both spellings: the REST docs' snake_case and the SDKs' camelCase
        i = _index(v)
        if i % 2:
            return {"inlineData": {"mimeType": "image/png", "data": b64(POOL[i])}}
        return {"inline_data": {"mime_type": "image/png", "data": b64(POOL[i])}}
    if kind == "remote":
        return {"fileData": {"mimeType": "image/png", "fileUri": f"gs://bucket/{_index(v)}.png"}}
    return {"inlineData": {"mimeType": "application/pdf", "data": b64(PDF[_index(v) % 4])}}


def _bedrock_part(kind: str, v: Any) -> dict:
    if kind == "text":
        return {"text": _text(v)}
    if kind == "image":
        return {"image": {"format": "png", "source": {"bytes": b64(POOL[_index(v)])}}}
    if kind == "remote":
        return {"image": {"format": "png", "source": {"s3Location": {"uri": f"s3://bucket/{_index(v)}.png"}}}}
    return {"document": {"format": "pdf", "name": "doc", "source": {"bytes": b64(PDF[_index(v) % 4])}}}


_PARTS = {
    "openai-chat": _chat_part,
    "openai-responses": _responses_part,
    "anthropic": _anthropic_part,
    "gemini": _gemini_part,
    "bedrock-converse": _bedrock_part,
}
_WRAP = {
    "openai-chat": lambda i, role, tool, parts: (
        {"role": "tool", "tool_call_id": f"c{i}", "content": parts} if tool else {"role": role, "content": parts}
    ),
    "openai-responses": lambda i, role, tool, parts: (
        {"type": "function_call_output", "call_id": f"c{i}", "output": parts} if tool else {"role": role, "content": parts}
    ),
    "anthropic": lambda i, role, tool, parts: (
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": parts, "is_error": False}]}
        if tool
        else {"role": role, "content": parts}
    ),
    "gemini": lambda i, role, tool, parts: (
        {"role": "user", "parts": [{"functionResponse": {"name": "screenshot", "response": {"ok": True}, "parts": parts}}]}
        if tool
        else {"role": "user" if role == "user" else "model", "parts": parts}
    ),
    "bedrock-converse": lambda i, role, tool, parts: (
        {"role": "user", "content": [{"toolResult": {"toolUseId": f"t{i}", "content": parts, "status": "success"}}]}
        if tool
        else {"role": role, "content": parts}
    ),
}


def media_of(fmt: str, body: Any) -> tuple[list[bytes], list[bytes]]:
    """Identities of (images, other media) in document order: the serialised part (the data for Ollama)."""
    images, others = [], []
    for m in FORMATS[fmt].find_media(body):
        node = body
        for key in m.path:
            node = node[key]
        # The standard library: orjson refuses integers over 64 bits, which a corrupted part may hold.
        identity = json.dumps(node, sort_keys=True).encode() if fmt != "ollama" else node.encode()
        (images if m.kind == "image" else others).append(identity)
    return images, others


def texts_of(conv: list) -> list[str]:
    return [_text(v) for _, _, parts, _ in conv for k, v, _ in parts if k == "text" and _text(v)]


def allowed_images(lim: dict, before: int) -> int:
    return before if lim["max_images"] is None else max(lim["max_images"], min(lim["keep_recent"], before))


@fuzz(150)
@given(fmt=st.sampled_from(sorted(FORMATS)), conv=conversation, lim=limits, extra=unknown)
def test_valid_requests_of_every_format(fmt: str, conv: list, lim: dict, extra: dict) -> None:
    body = render_rich(fmt, conv, extra)
    pristine = copy.deepcopy(body)
    raw = orjson.dumps(body)
    rules = rules_with(**lim)
    outcome = prune_request(url_for(fmt), {}, raw, rules)  # never raises
    record = outcome.record
    assert record is not None and record.reason is None
    assert body == pristine
    out = orjson.loads(outcome.body)  # valid JSON
    (images, others), (kept, others_after) = media_of(fmt, body), media_of(fmt, out)
    assert record.images_before == len(images) and record.images_after == len(kept)
    assert kept_in_order(kept, images, lim["keep_recent"])  # in order, byte for byte, the newest keep_recent among them
    assert min(lim["keep_recent"], len(images)) <= len(kept) <= allowed_images(lim, len(images))
    assert others_after == others  # documents are never pruned by an image limit
    for t in texts_of(conv):  # text untouched
        assert orjson.dumps(t)[1:-1] in outcome.body
    for key, value in extra.items():  # unknown fields kept
        assert out[key] == value
    if record.pruned == 0:
        assert outcome.body is raw
    assert prune_request(url_for(fmt), {}, outcome.body, rules).body == outcome.body  # idempotent


# --- corruptions ------------------------------------------------------------------------------------------------


def _nodes(value: Any, path: tuple = ()) -> list[tuple]:
    """Every path in a parsed JSON value, the root included."""
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _nodes(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _nodes(v, (*path, i))
    return out


def _set(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, *rest = path
    copied = dict(value) if isinstance(value, dict) else list(value)
    copied[head] = _set(value[head], tuple(rest), new)
    return copied


# Values of every JSON type swapped in for whatever was there (huge integers included).
swap_value = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    text,
    st.just([]),
    st.just({}),
    st.lists(st.integers(0, 3), max_size=2),
    st.just({"type": "image_url"}),
    st.just("data:image/png;base64,!!"),
)


@st.composite
def corrupted(draw) -> tuple[str, bytes, dict]:
    fmt = draw(st.sampled_from(sorted(FORMATS)))
    body = render_rich(fmt, draw(conversation), draw(unknown))
    raw = orjson.dumps(body)
    how = draw(st.sampled_from(["flip", "truncate", "swap", "swap", "insert", "duplicate"]))
    if how == "flip":
        data = bytearray(raw)
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        raw = bytes(data)
    elif how == "truncate":
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    elif how == "swap":
        for _ in range(draw(st.integers(1, 3))):
            paths = _nodes(body)
            body = _set(body, paths[draw(st.integers(0, len(paths) - 1))], draw(swap_value))
        raw = json.dumps(body).encode()  # the stdlib writes integers of any size
    elif how == "insert":
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.sampled_from([b",", b'"', b"{", b"]", b"\\", b"\x00", b"\xff", b'"x":1,', b"null", b"\xc3"])) + raw[at:]
    else:
        at, n = draw(st.integers(0, len(raw))), draw(st.integers(1, 200))
        raw = raw[:at] + raw[at : at + n] + raw[at:]
    return fmt, raw, draw(limits)


def _parses(raw: bytes) -> Any:
    """The body as the engine's exact fallback parser reads it, or None when it is not JSON at all."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


@fuzz(300)
@given(case=corrupted())
def test_corrupted_requests_never_raise_and_stay_valid_or_untouched(case: tuple[str, bytes, dict]) -> None:
    fmt, raw, lim = case
    rules = rules_with(**lim)
    outcome = prune_request(url_for(fmt), {}, raw, rules)  # never raises
    record = outcome.record
    assert record is not None
    assert record.reason is None or "internal error" not in record.reason, record.reason
    if record.reason is not None or record.pruned == 0:
        assert outcome.body is raw  # the very bytes it came with
        return
    parsed_in, parsed_out = _parses(raw), _parses(outcome.body)
    assert parsed_in is not None and isinstance(parsed_out, dict)  # pruned only what parsed; the output is JSON
    images, _ = media_of(fmt, parsed_in)
    kept, _ = media_of(fmt, parsed_out)
    assert len(kept) <= allowed_images(lim, len(images))
    assert kept_in_order(kept, images, lim["keep_recent"])
    assert not _has_non_finite(parsed_out) or _has_non_finite(parsed_in)  # no Infinity/NaN that was not sent
    assert prune_request(url_for(fmt), {}, outcome.body, rules).body == outcome.body  # idempotent


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    return False


@settings(max_examples=10, deadline=None, suppress_health_check=_HEALTH, phases=[Phase.generate])  # no shrinking while it fails
@given(fmt=st.sampled_from(sorted(FORMATS)), conv=conversation, big=st.integers(2**64, 2**100) | st.integers(-(2**100), -(2**63) - 1))
def test_every_number_survives_pruning_exactly(fmt: str, conv: list, big: int) -> None:
    body = render_rich(fmt, [*conv, ("user", False, [("image", 0, {}), ("image", 1, {}), ("image", 2, {})], {})], {"seed": big})
    raw = json.dumps(body).encode()
    outcome = prune_request(url_for(fmt), {}, raw, rules_with(max_images=1, keep_recent=1))
    assert outcome.record.pruned > 0
    seed = json.loads(outcome.body)["seed"]
    assert type(seed) is int and seed == big  # 2**64 == float(2**64) in Python: compare the type too
