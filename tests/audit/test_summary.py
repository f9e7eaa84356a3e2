"""trimflow.audit._summary: growth per turn as a least-squares slope, and the turn each limit is (or would be)
crossed, by the rules' what-if, the default rules or a limit profile."""

from __future__ import annotations

import pytest

from trimflow._sizes import parse_size
from trimflow.audit._summary import slope

from .helpers import audit_json, body_of, only_conversation, rows, session, write_dump, write_rules

# --- growth ---------------------------------------------------------------------------------------------------


def test_growth_is_the_least_squares_slope_per_turn(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", session(5))
    _, report, _ = audit_json(capsys, dump)
    growth = only_conversation(report)["growth_per_turn"]
    sizes = [len(body_of("anthropic", t)) for t in range(1, 6)]
    assert growth["images"] == pytest.approx(1.0)
    assert growth["body_bytes"] == pytest.approx(slope([1, 2, 3, 4, 5], sizes))
    assert report["summary"]["growth_method"].startswith("least-squares")


def test_slope() -> None:
    assert slope([1, 2, 3], [10, 20, 30]) == pytest.approx(10)
    assert slope([1, 2, 3, 4], [0, 10, 0, 10]) == pytest.approx(2)  # reads through the zigzag
    assert slope([1], [5]) is None and slope([2, 2], [1, 3]) is None


# --- what-if and limits crossed -------------------------------------------------------------------------------


def test_rules_give_a_what_if_with_the_bytes_and_tokens_saved(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", session(6))
    rules = write_rules(tmp_path / "rules.yaml", "defaults:\n  max_images: 2\n  keep_recent: 1\n")
    code, report, err = audit_json(capsys, dump, "--rules", rules)
    assert code == 0, err
    records = rows(report)
    assert [r["images_after"] for r in records] == [1, 2, 2, 2, 2, 2]
    assert all(r["body_bytes_after"] < r["body_bytes_before"] for r in records[2:])
    totals = report["summary"]["totals"]
    assert totals["body_bytes_saved"] == sum(r["body_bytes_before"] - r["body_bytes_after"] for r in records) > 0
    assert totals["est_tokens_saved"] > 0
    crossing = next(c for c in only_conversation(report)["limits"] if c["limit"] == "max_images")
    assert (crossing["value"], crossing["crossed_at"], crossing["after_crossed_at"]) == (2, 3, None)
    assert report["summary"]["what_if_rules"] == str(rules)


def test_without_rules_the_default_rules_give_the_limits_to_cross(tmp_path, capsys) -> None:
    _, report, _ = audit_json(capsys, write_dump(tmp_path / "run.mitm", session(10)))
    limits = {c["limit"]: c for c in only_conversation(report)["limits"]}
    assert (limits["max_images"]["value"], limits["max_images"]["crossed_at"], limits["max_images"]["projected"]) == (8, 9, False)
    body = limits["max_body_bytes"]
    assert body["value"] == parse_size("16MiB") and body["projected"] is True
    sizes = [len(body_of("anthropic", t)) for t in range(1, 11)]
    # The crossing extends the fitted line: the first whole turn past the limit.
    b = slope(list(range(1, 11)), sizes)
    a = sum(sizes) / 10 - b * 5.5
    assert a + b * body["crossed_at"] > body["value"] >= a + b * (body["crossed_at"] - 1)


def test_a_limit_profile_adds_its_crossings(tmp_path, capsys) -> None:
    _, report, _ = audit_json(capsys, write_dump(tmp_path / "run.mitm", session(4)), "--profile", "generic-8")
    sources = {(c["limit"], c["source"]) for c in only_conversation(report)["limits"]}
    assert ("max_images", "profile generic-8") in sources
    assert [s for limit, s in sources if limit == "max_images" and s.startswith("rule ")]
