"""trimflow._limits: each limit carries what the rules parser checks, the many-image side rule, the low-water mark,
and the fields one set of limits changes from another."""

from __future__ import annotations

import dataclasses

from trimflow._limits import LIMIT_FIELDS, Limits, changed_fields


def test_image_side_limit_applies_the_many_image_rule_over_the_threshold() -> None:
    limits = Limits(max_image_side=8000, many_images_threshold=20, many_images_max_side=2000)
    assert [limits.image_side_limit(n) for n in (0, 20, 21, 100)] == [8000, 8000, 2000, 2000]
    assert Limits(many_images_threshold=2, many_images_max_side=500).image_side_limit(3) == 500
    assert Limits(many_images_threshold=2, many_images_max_side=500).image_side_limit(2) is None
    assert Limits().image_side_limit(1000) is None


def test_every_limit_field_carries_what_the_rules_parser_checks() -> None:
    fields = {f.name: f for f in dataclasses.fields(Limits)}
    assert "rule" not in LIMIT_FIELDS and set(LIMIT_FIELDS) == set(fields) - {"rule"}
    for name in LIMIT_FIELDS:
        meta = fields[name].metadata
        assert meta["kind"] in ("count", "size", "side", "bool", "template", "fraction", "duration") and meta["doc"], name
        if meta["pair"] is not None:
            assert fields[meta["pair"]].metadata["pair"] == name  # pairs name each other
        if meta["needs"] is not None:
            assert meta["needs"] in LIMIT_FIELDS and fields[meta["needs"]].metadata["needs"] is None, name


def test_the_low_water_mark_lowers_every_cap_and_budget_and_cuts_exactly() -> None:
    limits = Limits(max_images=10, max_body_bytes=16 * 2**20, max_est_tokens=1001, prune_batch=4, low_water=0.5)
    low = limits.at_low_water()
    assert (low.max_images, low.max_body_bytes, low.max_est_tokens, low.prune_batch) == (5, 8 * 2**20, 500, 1)
    assert Limits(max_images=8).at_low_water() == Limits(max_images=8)  # no mark: the limits as they are


def test_changed_fields_names_what_the_second_sets_differently() -> None:
    assert changed_fields(Limits(max_images=8), Limits(max_images=8)) is None
    assert changed_fields(Limits(max_images=8), Limits(max_images=4, keep_recent=4)) == "max_images=4 keep_recent=4"
