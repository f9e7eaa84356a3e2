"""The policy: its steps, the fast path derived from them, and the limits' metadata."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from trimflow import prune_request
from trimflow._policy import LIMIT_FIELDS, Limits, count_pruned, nothing_to_change, prune_to_budgets
from trimflow._rules import builtin_rules
from trimflow.formats import FORMATS, IMAGE
from trimflow.testing import image, session_body

from .helpers import rules_with, url_for


def test_budgets_prune_oldest_first_and_name_the_first_budget_over() -> None:
    body = lambda k: 1500 - 200 * k  # noqa: E731 - over 1000 until 3 pruned
    tokens = lambda k: 900 - 100 * k  # noqa: E731 - over 500 until 4 pruned
    assert prune_to_budgets(8, [(1000, body), (500, tokens)]) == ([0, 0, 0, 1], False)
    assert prune_to_budgets(8, [(1000, body), (None, tokens)]) == ([0, 0, 0], False)  # no limit: not applied
    assert prune_to_budgets(2, [(1000, body), (500, tokens)]) == ([0, 0], True)  # only 2 prunable: still over


@pytest.mark.parametrize(
    ("images", "max_images", "batch", "keep", "pruned"),
    [(8, 8, 1, 1, 0), (9, 8, 1, 1, 1), (9, 8, 6, 1, 6), (14, 8, 6, 1, 6), (15, 8, 6, 1, 12), (3, 0, 1, 1, 2), (3, 0, 1, 0, 3)],
)
def test_the_count_cap_cuts_in_whole_batches_and_keeps_the_newest(images, max_images, batch, keep, pruned) -> None:
    assert count_pruned(images, Limits(max_images=max_images, prune_batch=batch, keep_recent=keep)) == pruned


def test_every_limit_field_carries_what_the_rules_parser_checks() -> None:
    fields = {f.name: f for f in dataclasses.fields(Limits)}
    assert "rule" not in LIMIT_FIELDS and set(LIMIT_FIELDS) == set(fields) - {"rule"}
    for name in LIMIT_FIELDS:
        meta = fields[name].metadata
        assert meta["kind"] in ("count", "size", "side", "bool", "template") and meta["doc"], name
        if meta["pair"] is not None:
            assert fields[meta["pair"]].metadata["pair"] == name  # pairs name each other


# Limits that each make one step act on the request below, and one set that makes none act.
_SHOT = image(300, 200, "PNG", seed=3)
_BODY = orjson.dumps(session_body("openai-chat", 6, _SHOT, "image/png"))
_ACTING = {
    "count": {"max_images": 3},
    "body budget": {"max_body_bytes": len(_BODY) - 1},
    "image bytes": {"max_image_bytes": 2048},
    "image side": {"max_image_side": 100},
    "many images": {"many_images_threshold": 2, "many_images_max_side": 100},
    "thumbnails": {"thumbnail_side": 64},
    "tokens": {"max_est_tokens": 10},
}


def _images(raw: bytes):
    parsed = orjson.loads(raw)
    return [m for m in FORMATS["openai-chat"].find_media(parsed) if m.kind == IMAGE]


@pytest.mark.parametrize("name", sorted(_ACTING))
def test_the_fast_path_never_skips_a_limit_that_acts(name: str) -> None:
    limits = Limits(**_ACTING[name])
    outcome = prune_request(url_for("openai-chat"), {}, _BODY, rules_with(**_ACTING[name]))
    assert outcome.changed, name  # the limit does act on this request
    assert not nothing_to_change(_images(_BODY), limits, len(_BODY))


def test_the_fast_path_lets_through_what_no_step_changes() -> None:
    limits = Limits(max_images=8, max_body_bytes=len(_BODY), max_image_bytes=len(_BODY))
    assert nothing_to_change(_images(_BODY), limits, len(_BODY))
    assert not prune_request(url_for("openai-chat"), {}, _BODY, rules_with(max_images=8, max_body_bytes=len(_BODY))).changed


def test_the_shipped_defaults_send_a_short_session_as_it_came() -> None:
    rules = builtin_rules()
    outcome = prune_request(url_for("openai-chat"), {}, _BODY, rules)
    assert outcome.body is _BODY and not outcome.changed
