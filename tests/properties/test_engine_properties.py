"""Property tests of the engine's invariants over random conversations in every wire format."""

from __future__ import annotations

import copy

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trimflow import prune_request
from trimflow.formats import FORMATS

from ..helpers import rules_with, url_for
from .strategies import POOL, kept_in_order, limits, render, text

part = st.one_of(st.tuples(st.just("text"), text), st.tuples(st.just("image"), st.integers(0, len(POOL) - 1)))
# A message: its role, whether its parts sit inside a tool result, and the parts.
message = st.tuples(st.sampled_from(["user", "assistant"]), st.booleans(), st.lists(part, min_size=1, max_size=4))
conversation = st.lists(message, min_size=1, max_size=8)
unknown_value = st.one_of(st.integers(-(2**60), 2**60), st.floats(allow_nan=False, allow_infinity=False), text)
unknown = st.dictionaries(st.sampled_from(["x_extra", "metadata_x", "z"]), unknown_value, max_size=2)


def image_data(fmt: str, body: dict) -> list[str]:
    return [m.data[m.data_offset :] for m in FORMATS[fmt].find_media(body) if m.kind == "image"]


def texts_of(conv: list) -> list[str]:
    return [v for _, _, parts in conv for k, v in parts if k == "text" and v]


settings.register_profile("trimflow", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("trimflow")


@given(fmt=st.sampled_from(sorted(FORMATS)), conv=conversation, lim=limits, extra=unknown)
def test_invariants(fmt: str, conv: list, lim: dict, extra: dict) -> None:
    body = render(fmt, conv, extra)
    pristine = copy.deepcopy(body)
    raw = orjson.dumps(body)
    rules = rules_with(**lim)
    outcome = prune_request(url_for(fmt), {}, raw, rules)
    assert body == pristine  # the caller's structure is never touched
    out = orjson.loads(outcome.body)  # valid JSON
    before, after = image_data(fmt, body), image_data(fmt, out)
    # What survives is some of the images, in order, byte for byte, the newest keep_recent among them (not always the
    # newest len(after): the cut takes tool output and repeated screens before the user's images).
    assert kept_in_order(after, before, lim["keep_recent"])
    allowed = len(before) if lim["max_images"] is None else max(lim["max_images"], min(lim["keep_recent"], len(before)))
    assert len(after) <= allowed
    assert len(after) >= min(lim["keep_recent"], len(before))
    # Text untouched: every text the client sent is still there (JSON-escaped, as orjson writes it).
    for t in texts_of(conv):
        assert orjson.dumps(t)[1:-1] in outcome.body
    # Unknown fields keep their values.
    for key, value in extra.items():
        assert out[key] == value
    if outcome.record.pruned == 0:
        assert outcome.body is raw  # byte-identical, the same object
    again = prune_request(url_for(fmt), {}, outcome.body, rules)
    assert again.body == outcome.body  # idempotent


@given(fmt=st.sampled_from(sorted(FORMATS)), conv=conversation, budget=st.integers(0, 4000), keep=st.integers(0, 2))
def test_body_budget_is_met_or_said_unmet(fmt: str, conv: list, budget: int, keep: int) -> None:
    raw = orjson.dumps(render(fmt, conv, {}))
    outcome = prune_request(url_for(fmt), {}, raw, rules_with(max_body_bytes=budget, keep_recent=keep))
    record = outcome.record
    if len(outcome.body) > budget:
        # Over budget only when every prunable image is gone.
        assert record.over_budget or (record.pruned == 0 and record.images_before <= keep)
        assert record.images_after == min(keep, record.images_before)
    else:
        assert not record.over_budget
    assert record.body_bytes_after == len(outcome.body) or record.mode == "observe"
