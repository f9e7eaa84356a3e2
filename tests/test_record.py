"""trimflow._record.Record: its dict and JSON forms, the per-turn log line, and what it never holds."""

from __future__ import annotations

import dataclasses
import re

import orjson
import pytest

from trimflow import Record, prune_request
from trimflow._record import ENFORCE, OBSERVE, TURN, utc_timestamp
from trimflow.testing import b64, screenshot, session_body

from .helpers import encode, rules_with

SHOT = screenshot(30, "PNG", seed=7)
SECRET_KEY = "sk-test-SECRET-record-81c2"


def record(**fields) -> Record:
    return Record(
        ts="2025-01-01T00:00:00.000Z",
        conversation="c0ffee00",
        turn=3,
        host="api.example.test",
        path="/v1/messages",
        format="anthropic",
        model="claude-x",
        rule="defaults",
        mode="enforce",
        **fields,
    )


def every_field_set() -> Record:
    """A record with no field left at its default, so a round trip that drops or renames one shows."""
    values = {}
    for f in dataclasses.fields(Record)[9:]:
        if f.type == "bool":
            values[f.name] = True
        elif f.type == "float":
            values[f.name] = 12.5
        elif "str" in f.type:
            values[f.name] = f"{f.name}-value"
        else:
            values[f.name] = len(values) + 1
    return record(**values)


def test_to_dict_has_every_field_in_declaration_order() -> None:
    full = every_field_set()
    assert list(full.to_dict()) == [f.name for f in dataclasses.fields(Record)]
    assert full.to_dict() == dataclasses.asdict(full)


def test_to_json_round_trips_through_the_dict() -> None:
    full = every_field_set()
    parsed = orjson.loads(full.to_json())
    assert parsed == full.to_dict()
    assert Record(**parsed) == full
    assert parsed["overhead_ms"] == 12.5 and parsed["over_budget"] is True and parsed["reason"] == "reason-value"


def test_a_fresh_record_says_none_for_what_only_the_answer_tells() -> None:
    fields = orjson.loads(record().to_json())
    assert (fields["status"], fields["usage_input_tokens"], fields["reason"], fields["simulated"]) == (None, None, None, None)
    assert fields["usage_cache_read_tokens"] is fields["usage_cache_write_tokens"] is fields["usage_output_tokens"] is None
    assert fields["pruned"] == fields["images_before"] == 0 and fields["over_budget"] is False


def test_log_line_names_the_conversation_turn_model_and_the_figures() -> None:
    line = record(
        images_before=12,
        images_after=8,
        body_bytes_before=16 * 2**20,
        body_bytes_after=3 * 2**20 + 2**19,
        est_tokens_before=23_456,
        est_tokens_after=9_100,
        status=200,
        usage_input_tokens=9_000,
    ).log_line()
    assert line.startswith("conv c0ffee00 turn 3 claude-x images 12->8 body ")
    assert "body 16.0MB->3.5MB" in line
    assert "~23k->9k tok" in line
    assert line.endswith(" 200 in=9000 est/in=1.01")


def test_log_line_shows_the_cache_and_output_the_provider_reported() -> None:
    usage = {"usage_input_tokens": 12_000, "usage_cache_read_tokens": 9_000, "usage_cache_write_tokens": 2_000, "usage_output_tokens": 300}
    line = record(status=200, **usage).log_line()
    assert " 200 in=12000 (cached 9000, written 2000) out=300" in line
    # OpenAI and Gemini report a read, never a write: only what is known is shown
    assert "in=12000 (cached 9000) out=300" in record(usage_input_tokens=12_000, usage_cache_read_tokens=9_000, usage_output_tokens=300).log_line()
    assert "in=500 out=3" in record(usage_input_tokens=500, usage_output_tokens=3).log_line()
    assert "cached" not in record(usage_input_tokens=500).log_line() and "out=" not in record(usage_input_tokens=500).log_line()


def test_log_line_without_a_conversation_or_model_uses_dashes_and_the_format() -> None:
    line = Record(
        ts="t",
        conversation=None,
        turn=None,
        host="h",
        path="/",
        format="gemini",
        model=None,
        rule=None,
        mode="enforce",
        est_tokens_before=999,
        est_tokens_after=999,
    ).log_line()
    assert line.startswith("conv - turn - gemini images 0->0 body ")
    assert "~999->999 tok" in line  # under a thousand: the plain count


def test_log_line_lists_what_was_done_to_the_images() -> None:
    line = record(images_before=6, images_after=4, thinned=2, shrunk=1, deduplicated=2, pruned_for_image_limit=1, mime_mismatches=3).log_line()
    assert "images 6->4 (2 thinned, 1 shrunk, 2 repeated, 1 too big, 3 mime mismatch)" in line
    assert "(" not in record(images_before=6, images_after=4).log_line()  # nothing done: no brackets


@pytest.mark.parametrize(
    ("fields", "shown", "absent"),
    [
        ({"mode": "observe"}, "(observe)", "OVER BUDGET"),
        ({"over_budget": True}, "OVER BUDGET", "(observe)"),
        ({"reason": "body is not JSON"}, "untouched (body is not JSON)", "OVER BUDGET"),
    ],
)
def test_log_line_flags_observe_over_budget_and_untouched(fields: dict, shown: str, absent: str) -> None:
    line = dataclasses.replace(record(), **fields).log_line()
    assert shown in line and absent not in line


def test_log_line_shows_the_estimate_over_the_provider_count() -> None:
    record = Record(
        ts="t",
        conversation="c",
        turn=1,
        host="h",
        path="/v1/messages",
        format="anthropic",
        model="claude-x",
        rule="defaults",
        mode="enforce",
        est_tokens_before=3000,
        est_tokens_after=2160,
        usage_input_tokens=2000,
    )
    assert record.est_to_usage_ratio() == pytest.approx(1.08)
    assert record.log_line().endswith("in=2000 est/in=1.08")
    observed = Record(
        ts="t",
        conversation="c",
        turn=1,
        host="h",
        path="/",
        format="anthropic",
        model=None,
        rule=None,
        mode="observe",
        est_tokens_before=3000,
        est_tokens_after=10,
        usage_input_tokens=2000,
    )
    assert "est/in=1.50" in observed.log_line()  # observe sends the original: its estimate counts
    assert (
        "est/in"
        not in Record(ts="t", conversation=None, turn=None, host="h", path="/", format="anthropic", model=None, rule=None, mode="enforce").log_line()
    )


def test_no_ratio_without_a_usage_or_an_estimate() -> None:
    assert record(usage_input_tokens=0, est_tokens_after=100).est_to_usage_ratio() is None
    assert record(usage_input_tokens=100, est_tokens_after=0).est_to_usage_ratio() is None
    assert "est/in" not in record(usage_input_tokens=100).log_line()


def test_a_record_of_a_real_request_holds_no_key_prompt_or_base64() -> None:
    body = session_body("gemini", 4, SHOT, "image/png")
    url = f"https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-pro:generateContent?key={SECRET_KEY}"
    headers = {"x-goog-api-key": SECRET_KEY, "authorization": f"Bearer {SECRET_KEY}"}
    made = prune_request(url, headers, encode(body), rules_with(max_images=1)).record
    assert made is not None and made.pruned == 3
    for text in (made.to_json().decode(), made.log_line(), repr(made)):
        assert SECRET_KEY not in text and "key=" not in text
        assert "What should I click next?" not in text and "You are a desktop assistant." not in text
        assert b64(SHOT)[:40] not in text
        assert not re.search(r"[A-Za-z0-9+/]{100,}", text)


def test_every_field_is_a_scalar_and_none_is_named_for_a_credential_or_prompt() -> None:
    # Bytes, lists or dicts could carry a body; names and counts cannot.
    scalars = {"str", "str | None", "int", "int | None", "bool", "float"}
    assert {f.name: f.type for f in dataclasses.fields(Record) if f.type not in scalars} == {}
    assert not [f.name for f in dataclasses.fields(Record) if re.search(r"key|auth|header|prompt|query|url|text", f.name)]


def test_utc_timestamp_is_iso_8601_with_milliseconds() -> None:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", utc_timestamp())


def test_what_was_sent_is_the_rewritten_body_in_enforce_and_the_body_as_received_in_observe() -> None:
    figures = {"body_bytes_before": 900, "body_bytes_after": 300, "est_tokens_before": 90, "est_tokens_after": 30, "pruned": 4}
    enforced, observed = record(**figures), dataclasses.replace(record(**figures), mode=OBSERVE)
    assert (enforced.sent_body_bytes, enforced.sent_est_tokens, enforced.sent_pruned) == (300, 30, 4)
    assert (observed.sent_body_bytes, observed.sent_est_tokens, observed.sent_pruned) == (900, 90, 0)


def test_an_untouched_record_says_why_and_that_the_body_went_as_it_came() -> None:
    untouched = Record.untouched("api.example.test", "/v1/messages", "anthropic", ENFORCE, "body is a JSON array, not an object", 1234)
    assert (untouched.body_bytes_before, untouched.body_bytes_after, untouched.images_before) == (1234, 1234, 0)
    assert (untouched.kind, untouched.mode, untouched.conversation) == (TURN, ENFORCE, None)
    assert "untouched (body is a JSON array, not an object)" in untouched.log_line()
