"""Claude Code's transcripts (files made by Claude Code 2.1.328): which lines resume sends, the display copy of
each pruned image emptied, and where sessions are found by id."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from trimflow.repair import _claude
from trimflow.repair._lines import Line, split_lines
from trimflow.repair._repair import repair_lines

from .helpers import SESSIONS, fixture, shipped_rules


def load(name: str) -> list[Line]:
    return split_lines((SESSIONS / name).read_bytes())


def image_lines(lines: list[Line]) -> list[int]:
    """Indexes of the lines whose message holds an image block."""
    return [i for i, line in enumerate(lines) if _claude._is_conversation(line.value) and b'"type":"image","source"' in line.raw]


def test_the_fixtures_are_claude_code_transcripts_and_no_other_agents() -> None:
    for name in ("claude-10.jsonl", "claude-10-resumed.jsonl", "claude-compacted.jsonl"):
        assert _claude.recognises(load(name))
    for name in ("codex-10.jsonl", "gemini-10.jsonl"):
        assert not _claude.recognises(load(name))


def test_resume_sends_the_chain_from_the_newest_conversation_line() -> None:
    lines = load("claude-10.jsonl")
    chain = _claude.chain(lines)
    assert chain == sorted(chain)  # oldest first
    assert lines[chain[-1]].value["type"] == "assistant"
    assert lines[chain[0]].value["parentUuid"] is None
    body = _claude.replay(lines).body
    assert body["model"] == "claude-opus-5-5"
    assert [m["role"] for m in body["messages"]][:2] == ["user", "assistant"]


def test_after_a_compaction_only_the_images_after_its_boundary_are_sent_and_pruned() -> None:
    lines = load("claude-compacted.jsonl")
    boundary = next(i for i, line in enumerate(lines) if isinstance(line.value, dict) and line.value.get("subtype") == "compact_boundary")
    chain = _claude.chain(lines)
    assert chain[0] == boundary
    repaired = repair_lines(lines, _claude, shipped_rules())
    before_boundary = [i for i in image_lines(lines) if i < boundary]
    assert len(before_boundary) == 10
    for i in before_boundary:
        assert repaired.lines[i].raw == lines[i].raw  # never sent again: left alone
    after = [i for i in image_lines(lines) if i > boundary]
    assert len(after) == 12
    assert [i for i in after if repaired.lines[i].raw != lines[i].raw] == after[:9]  # the oldest, down to the low-water mark of 3


def test_the_display_copy_of_each_pruned_image_is_emptied_and_a_kept_images_stays() -> None:
    lines = load("claude-10.jsonl")
    repaired = repair_lines(lines, _claude, shipped_rules())
    with_images = image_lines(lines)
    for i in with_images:
        before, after = lines[i].value, repaired.lines[i].value
        copy = before["toolUseResult"]["file"]["base64"]
        assert copy == before["message"]["content"][0]["content"][0]["source"]["data"]  # the same image twice on the line
        block = after["message"]["content"][0]["content"][0]
        if block["type"] == "text":
            assert block["text"].startswith("[trimflow: image #")
            assert after["toolUseResult"]["file"]["base64"] == ""
            assert after["toolUseResult"]["file"]["dimensions"] == before["toolUseResult"]["file"]["dimensions"]  # the rest as it was
        else:
            assert repaired.lines[i].raw == lines[i].raw
    pruned = [i for i in with_images if repaired.lines[i].raw != lines[i].raw]
    assert len(pruned) == 7  # 10 images, down to the low-water mark of 3
    # Both copies gone: each pruned line lost twice its image's base64.
    for i in pruned:
        data = lines[i].value["toolUseResult"]["file"]["base64"]
        assert len(lines[i].raw) - len(repaired.lines[i].raw) > 2 * len(data) - 200


def test_a_subagent_transcript_all_side_chain_is_read_from_its_own_newest_line(tmp_path: Path) -> None:
    """Subagents' transcripts (`<id>/subagents/*.jsonl`) are side chain throughout."""
    source = (SESSIONS / "claude-10.jsonl").read_bytes().replace(b'"isSidechain":false', b'"isSidechain":true')
    lines = split_lines(source)
    assert _claude.chain(lines) == _claude.chain(load("claude-10.jsonl"))


def test_a_rewound_branch_is_not_sent() -> None:
    """Two children of one message (a rewind, an edited prompt): only the newest line's chain is sent."""
    lines = load("claude-10.jsonl")
    chain = _claude.chain(lines)
    fork_parent = lines[chain[5]].value["uuid"]
    branch = {**lines[chain[-1]].value, "uuid": "branch-of-a-rewind", "parentUuid": fork_parent}
    lines = [*lines, Line(len(lines) + 1, orjson.dumps(branch), branch)]
    new_chain = _claude.chain(lines)
    assert new_chain == [*chain[:6], len(lines) - 1]


def test_find_looks_in_claude_config_dir_then_home(tmp_path: Path) -> None:
    session = "b2ef49b4-fbde-4459-8911-df53861ca13b"
    config = tmp_path / "config"
    fixture("claude-10.jsonl", config / "projects" / "-work-app", f"{session}.jsonl")
    assert _claude.find(session, {"CLAUDE_CONFIG_DIR": str(config)}) == [config / "projects" / "-work-app" / f"{session}.jsonl"]
    home = tmp_path / "home"
    fixture("claude-10.jsonl", home / ".claude" / "projects" / "-srv", f"{session}.jsonl")
    assert _claude.find(session, {"HOME": str(home)}) == [home / ".claude" / "projects" / "-srv" / f"{session}.jsonl"]
    assert _claude.session_roots({"HOME": str(home)}) == [home / ".claude" / "projects"]
    assert _claude.find("b2ef49b4", {"HOME": str(home)}) == []  # a whole id: the file name is the id


@pytest.mark.parametrize("session", ["*", "[b]*", "../x"])
def test_find_takes_an_id_literally(tmp_path: Path, session: str) -> None:
    fixture("claude-10.jsonl", tmp_path / "projects" / "-p", "abc.jsonl")
    assert _claude.find(session, {"CLAUDE_CONFIG_DIR": str(tmp_path)}) == []
