"""The flow comment mitmweb shows in its flow list: the figures first, in short form, then the rest."""

from __future__ import annotations

from trimflow import Record
from trimflow.proxy.comment import flow_comment

KiB = 1024


def record(**fields) -> Record:
    base = Record(
        ts="2026-01-01T00:00:00.000Z",
        conversation="3f2a",
        turn=4,
        host="api.anthropic.com",
        path="/v1/messages",
        format="anthropic",
        model="claude-sonnet-4",
        rule="claude",
        mode="enforce",
    )
    for name, value in fields.items():
        setattr(base, name, value)
    return base


def test_the_figures_lead_then_the_rule_model_turn_and_what_was_done() -> None:
    pruned = record(
        images_before=10,
        images_after=8,
        body_bytes_before=562 * KiB,
        body_bytes_after=450 * KiB,
        thinned=2,
        est_tokens_before=120_400,
        est_tokens_after=98_000,
    )
    assert flow_comment(pruned) == "10->8 img, 562->450 KB; trimflow rule claude, claude-sonnet-4, conv 3f2a turn 4, 2 thinned, ~120k->98k tok"


def test_observe_over_budget_and_untouched_bodies_say_so_after_the_figures() -> None:
    observed = record(
        mode="observe",
        over_budget=True,
        images_before=3,
        images_after=3,
        body_bytes_before=9_856_000,
        body_bytes_after=9_856_000,
        reason="body is not JSON",
        model=None,
        conversation=None,
        rule=None,
    )
    comment = flow_comment(observed)
    assert comment.startswith("3->3 img, 9.4->9.4 MB; trimflow rule -, anthropic, ~0->0 tok")
    assert comment.endswith("observe: forwarded untouched, OVER BUDGET, untouched (body is not JSON)")
    assert "conv" not in comment


def test_a_token_count_and_a_later_segment_say_where_they_stand() -> None:
    count = record(kind="count_tokens", turn=None, images_before=2, images_after=2, body_bytes_before=KiB, body_bytes_after=KiB)
    assert "conv 3f2a count_tokens," in flow_comment(count) and "turn" not in flow_comment(count)
    restarted = record(segment=2, turn=1, images_before=1, images_after=1, body_bytes_before=KiB, body_bytes_after=KiB)
    assert "conv 3f2a segment 2 turn 1," in flow_comment(restarted)
