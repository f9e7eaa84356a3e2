"""trimflow.audit._summary: growth per turn as the steady rate (the slope over the last turns) beside the whole-run
slope, and the turn each limit is (or would be) crossed, by the rules' what-if, the default rules or a limit profile."""

from __future__ import annotations

import orjson
import pytest

from trimflow._human import parse_size
from trimflow.audit._summary import STEADY_TURNS, slope
from trimflow.testing import image, session_body

from .helpers import audit, audit_json, body_of, llm_flow, only_conversation, rows, session, write_dump, write_rules

# --- growth ---------------------------------------------------------------------------------------------------

BIG_SHOT = image(400, 300, "PNG", seed=7)  # noise: about 350KB as PNG, 470KB in base64


def capped_session(tmp_path):
    """Twelve turns, one big screenshot more each turn, and rules that keep 6 images: the pruned body grows for
    six turns, then stays flat for the six turns that are pruned."""
    flows = [llm_flow(turn=t, body=orjson.dumps(session_body("anthropic", t, BIG_SHOT, "image/png"))) for t in range(1, 13)]
    return write_dump(tmp_path / "run.mitm", flows), write_rules(tmp_path / "rules.yaml", "defaults:\n  max_images: 6\n")


def test_growth_is_the_steady_rate_over_the_last_turns(tmp_path, capsys) -> None:
    dump, rules = capped_session(tmp_path)
    _, report, _ = audit_json(capsys, dump, "--rules", rules)
    conversation = only_conversation(report)
    after = [r["body_bytes_after"] for r in rows(report)]
    assert [r["images_after"] for r in rows(report)][5:] == [6] * 7
    steady, whole = conversation["growth_per_turn"], conversation["growth_per_turn_whole_run"]
    assert STEADY_TURNS == conversation["growth_per_turn_turns"] == report["summary"]["steady_turns"] == 5
    assert steady["after.body_bytes"] == pytest.approx(slope([8, 9, 10, 11, 12], after[-5:]))
    assert abs(steady["after.body_bytes"]) < 1024 and steady["after.images"] == pytest.approx(0)
    # The whole-run fit mixes the growing turns with the flat ones: it says the pruned body still grows fast.
    assert whole["after.body_bytes"] == pytest.approx(slope(list(range(1, 13)), after)) and whole["after.body_bytes"] > 100 * 1024
    assert steady["body_bytes"] == pytest.approx(whole["body_bytes"], rel=0.01)  # the recording grows all along
    assert steady["body_bytes"] > 300 * 1024
    assert "last 5 turns" in report["summary"]["growth_method"]


def test_the_gate_reads_the_steady_rate_so_a_run_pruned_flat_passes(tmp_path, capsys) -> None:
    dump, rules = capped_session(tmp_path)
    code, out, err = audit(capsys, dump, "--rules", rules, "--fail-on", "after.growth>100KB/turn", "--fail-on", "after.image_growth>0/turn")
    assert code == 0, err
    assert "gate: ok (0 of 2 --fail-on broken)" in out
    assert "growth per turn, steady over the last 5 turns: body +" in out
    assert "whole-run slope over 12 turns (not the gate's growth): body +" in out
    code, _, err = audit(capsys, dump, "--rules", rules, "--fail-on", "growth>100KB/turn")  # as recorded it does grow
    assert code == 1 and "FAIL growth>100KB/turn" in err


def test_a_short_conversation_grows_by_its_slope_over_all_its_turns(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", session(4))
    _, report, _ = audit_json(capsys, dump)
    conversation = only_conversation(report)
    sizes = [len(body_of("anthropic", t)) for t in range(1, 5)]
    assert conversation["growth_per_turn"]["images"] == pytest.approx(1.0)
    assert conversation["growth_per_turn"]["body_bytes"] == pytest.approx(slope([1, 2, 3, 4], sizes))
    assert conversation["growth_per_turn"] == conversation["growth_per_turn_whole_run"]
    assert conversation["growth_per_turn_turns"] == 4
    _, text, _ = audit(capsys, dump)
    assert "growth per turn over all 4 turns: body +" in text and "whole-run" not in text


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
    sizes = [len(body_of("anthropic", t)) for t in range(6, 11)]
    # The crossing extends the line fitted to the last turns: the first whole turn past the limit.
    b = slope(list(range(6, 11)), sizes)
    a = sum(sizes) / 5 - b * 8
    assert a + b * body["crossed_at"] > body["value"] >= a + b * (body["crossed_at"] - 1)


def test_a_limit_profile_adds_its_crossings(tmp_path, capsys) -> None:
    _, report, _ = audit_json(capsys, write_dump(tmp_path / "run.mitm", session(4)), "--profile", "generic-8")
    sources = {(c["limit"], c["source"]) for c in only_conversation(report)["limits"]}
    assert ("max_images", "profile generic-8") in sources
    assert [s for limit, s in sources if limit == "max_images" and s.startswith("rule ")]
