"""The core of a repair, on the session files the real CLIs wrote: the engine's own decisions written back in
place, nothing else of the file changed, the placeholders the proxy would write, and a second repair (or a
later turn through the proxy) finding nothing more to do."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from trimflow._engine import prune
from trimflow._jsoncodec import dumps
from trimflow._jsonsplice import value_span
from trimflow._rules import Target
from trimflow.formats import FORMATS
from trimflow.repair import _claude, _codex, _gemini
from trimflow.repair._lines import Line, SessionError, split_lines
from trimflow.repair._repair import Edit, Replay, apply_edits, repair_lines, value_at
from trimflow.testing import b64

from .helpers import FIXTURES, SESSIONS, shipped_cap, shipped_rules

MODULES = {"claude": _claude, "codex": _codex, "gemini": _gemini}


def load(name: str) -> list[Line]:
    return split_lines((SESSIONS / name).read_bytes())


def images_sent(lines: Sequence[Line], agent: str) -> int:
    replay = MODULES[agent].replay(lines)
    return sum(1 for m in FORMATS[replay.wire_format].find_media(replay.body) if m.kind == "image")


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_the_resumed_history_sends_the_images_the_cli_sends_and_the_repair_leaves_at_most_the_cap(name: str) -> None:
    agent, sent_by_the_cli, after = FIXTURES[name]
    lines = load(name)
    assert images_sent(lines, agent) == sent_by_the_cli
    repaired = repair_lines(lines, MODULES[agent], shipped_rules())
    assert (repaired.images_before, repaired.images_after) == (sent_by_the_cli, after)
    assert images_sent(repaired.lines, agent) == after
    assert after <= shipped_cap(agent)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_line_the_repair_does_not_edit_is_byte_identical_and_an_edited_one_changes_only_at_its_edits(name: str) -> None:
    agent = FIXTURES[name][0]
    lines = load(name)
    repaired = repair_lines(lines, MODULES[agent], shipped_rules())
    edited = {edit.where[0] for edit in repaired.edits}
    assert edited  # every fixture is over the cap
    for index, (before, after) in enumerate(zip(lines, repaired.lines, strict=True)):
        if index not in edited:
            assert after.raw == before.raw
            continue
        # Cut each edit's span out of both: what is left is the same bytes.
        spans_before = sorted(value_span(before.raw, e.where[1]) for e in repaired.edits if e.where[0] == index)
        spans_after = sorted(value_span(after.raw, e.where[1]) for e in repaired.edits if e.where[0] == index)
        assert _outside(before.raw, spans_before) == _outside(after.raw, spans_after)


def _outside(raw: bytes, spans: list[tuple[int, int]]) -> list[bytes]:
    pieces, at = [], 0
    for start, end in spans:
        pieces.append(raw[at:start])
        at = end
    return [*pieces, raw[at:]]


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_the_placeholders_are_the_text_the_proxy_writes_for_that_request(name: str) -> None:
    """The request resume would send, pruned by the engine as the proxy prunes it: the same text at each place."""
    agent = FIXTURES[name][0]
    lines = load(name)
    replay = MODULES[agent].replay(lines)
    outcome = prune(Target(replay.host, replay.path, replay.wire_format), {}, dumps(replay.body, False), shipped_rules())
    proxied = MODULES[agent].replay(repair_lines(lines, MODULES[agent], shipped_rules()).lines)
    assert dumps(proxied.body, False) == outcome.body


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_a_second_repair_and_a_later_turn_through_the_proxy_find_nothing_to_prune(name: str) -> None:
    agent = FIXTURES[name][0]
    once = repair_lines(load(name), MODULES[agent], shipped_rules())
    twice = repair_lines(once.lines, MODULES[agent], shipped_rules())
    assert not twice.changed and twice.images_before == once.images_after
    replay = MODULES[agent].replay(once.lines)
    outcome = prune(Target(replay.host, replay.path, replay.wire_format), {}, dumps(replay.body, False), shipped_rules())
    assert not outcome.changed


def test_a_session_under_the_cap_is_left_as_it_is() -> None:
    lines = load("claude-10.jsonl")
    loose = shipped_rules().with_limits(max_images=20)
    repaired = repair_lines(lines, _claude, loose)
    assert not repaired.changed and repaired.lines is lines and repaired.images_after == 10


def test_the_size_the_model_sees_is_no_reason_to_rewrite_a_session(retina_desktop: bytes) -> None:
    # The proxy sends a Retina screenshot at the size Claude sees it on the wire; in the saved session it stays as the
    # agent took it, and a session under the cap is still left as it is.
    raw = (SESSIONS / "claude-10.jsonl").read_bytes()
    replay = _claude.replay(split_lines(raw))
    first = next(m for m in FORMATS[replay.wire_format].find_media(replay.body) if m.kind == "image")
    assert first.data is not None
    lines = split_lines(raw.replace(first.data.encode(), b64(retina_desktop).encode()))
    repaired = repair_lines(lines, _claude, shipped_rules().with_limits(max_images=20))
    assert not repaired.changed and repaired.lines is lines


def test_a_rules_file_changes_what_is_kept() -> None:
    repaired = repair_lines(load("codex-10.jsonl"), _codex, shipped_rules().with_limits(max_images=2, prune_batch=1, low_water=None))
    assert (repaired.images_before, repaired.images_after) == (11, 2)


def test_apply_edits_puts_each_value_at_its_place_and_shares_the_other_lines() -> None:
    lines = split_lines(b'{"a":[{"x":1},{"y":2}]}\n{"b":3}\n')
    out = apply_edits(lines, [Edit((0, ("a", 1)), {"y": 2}, {"z": "new"})])
    assert out[0].raw == b'{"a":[{"x":1},{"z":"new"}]}' and out[0].value == {"a": [{"x": 1}, {"z": "new"}]}
    assert out[1] is lines[1]


def test_an_edit_at_a_path_the_line_lacks_is_a_session_error_naming_the_line() -> None:
    lines = split_lines(b'{"a":1}\n{"b":2}\n')
    with pytest.raises(SessionError, match="line 2 could not be rewritten in place"):
        apply_edits(lines, [Edit((1, ("nope",)), None, 1)])


def test_an_image_the_file_has_no_place_for_is_refused_rather_than_half_repaired() -> None:
    """A format reader that cannot place an image it found: the repair stops before writing anything."""
    lines = load("claude-10.jsonl")

    class Unplaced:
        NAME = "claude"

        @staticmethod
        def recognises(lines: Sequence[Line]) -> bool:
            return True

        @staticmethod
        def replay(lines: Sequence[Line]) -> Replay:
            real = _claude.replay(lines)
            return Replay(real.wire_format, real.host, real.path, real.body, lambda path: None)

        @staticmethod
        def copies(lines: Sequence[Line], edits: Sequence[Edit]) -> list[Edit]:
            return []

    with pytest.raises(SessionError, match="no place for that"):
        repair_lines(lines, Unplaced, shipped_rules())


def test_value_at_walks_a_path() -> None:
    assert value_at({"a": [0, {"b": "c"}]}, ("a", 1, "b")) == "c"


def test_the_fixture_table_covers_every_fixture() -> None:
    assert {p.name for p in Path(SESSIONS).glob("*.jsonl")} == set(FIXTURES)
