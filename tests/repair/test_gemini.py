"""Gemini CLI's saved chats (files made by Gemini CLI 0.61.0: a chat of ten screenshots read with read_file, and
the same chat after one resume): the record log as Gemini CLI loads it, the history resume sends (both stored
copies of a tool's image), and where chats are found by id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from trimflow.formats import FORMATS
from trimflow.repair import _gemini
from trimflow.repair._lines import Line, split_lines
from trimflow.repair._repair import repair_lines

from .helpers import FIXTURES, SESSIONS, fixture, shipped_rules


def load(name: str) -> list[Line]:
    return split_lines((SESSIONS / name).read_bytes())


def records(*values: Any) -> list[Line]:
    return [Line(i + 1, orjson.dumps(v), v) for i, v in enumerate(values)]


META = {"sessionId": "s", "projectHash": "h"}


def text(id_: str, kind: str = "user", words: str = "hello") -> dict[str, Any]:
    return {"id": id_, "type": kind, "content": [{"text": words}]}


def test_the_fixtures_are_gemini_chats() -> None:
    assert _gemini.recognises(load("gemini-10.jsonl")) and _gemini.recognises(load("gemini-10-resumed.jsonl"))
    assert not _gemini.recognises(load("claude-10.jsonl"))


def test_a_later_record_of_a_message_replaces_it_in_place() -> None:
    lines = records(META, text("a"), text("b"), {**text("a"), "content": [{"text": "edited"}]})
    assert [(index, message["content"][0]["text"]) for index, _, message in _gemini.messages(lines)] == [(3, "edited"), (2, "hello")]


def test_set_messages_replaces_the_list_and_rewind_drops_from_a_message_on() -> None:
    lines = records(META, text("a"), {"$set": {"messages": [text("x"), text("y")]}}, text("z"), {"$rewindTo": "y"})
    assert [(index, path, message["id"]) for index, path, message in _gemini.messages(lines)] == [(2, ("$set", "messages", 0), "x")]
    assert _gemini.messages(records(META, text("a"), {"$rewindTo": "unknown"})) == []


def test_commands_and_context_are_not_sent_again() -> None:
    lines = records(META, text("a", words="/stats"), text("b", words="<session_context>x"), text("c", words="   "), text("d"))
    assert [c["parts"][0]["text"] for c in _gemini.replay(lines).body["contents"]] == ["hello"]


def test_a_tool_image_is_sent_twice_from_the_tool_call_and_from_the_user_message_after_it() -> None:
    lines = load("gemini-10.jsonl")
    replay = _gemini.replay(lines)
    assert replay.path == "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
    places = [replay.locate(media.path) for media in FORMATS["gemini"].find_media(replay.body)]
    assert len(places) == 20
    in_tool_calls = [p for p in places if p is not None and "toolCalls" in p[1]]
    in_user_messages = [p for p in places if p is not None and p[1][:1] == ("content",)]
    assert len(in_tool_calls) == len(in_user_messages) == 10


def test_after_a_resume_the_history_written_back_is_what_is_read_and_pruned() -> None:
    """Gemini CLI's resume writes the whole history back as one `$set` of messages: the copies in it are the ones
    sent from then on, and the records before it are never read again (left as they are)."""
    lines = load("gemini-10-resumed.jsonl")
    rewritten = max(i for i, line in enumerate(lines) if isinstance(line.value, dict) and "messages" in line.value.get("$set", {}))
    repaired = repair_lines(lines, _gemini, shipped_rules())
    touched = {edit.where[0] for edit in repaired.edits}
    assert min(touched) >= rewritten
    assert (repaired.images_before, repaired.images_after) == FIXTURES["gemini-10-resumed.jsonl"][1:]


def test_the_pruned_parts_are_text_parts_that_keep_the_function_response_beside_them() -> None:
    lines = load("gemini-10.jsonl")
    repaired = repair_lines(lines, _gemini, shipped_rules())
    first = repaired.edits[0]
    assert first.old["inlineData"]["mimeType"] == "image/png"
    # Gemini CLI sends each screenshot twice: the first copy shows the same screen as the image after it, and goes first.
    assert list(first.new) == ["text"] and first.new["text"] == "[trimflow: image #1 omitted: the same screen as image #2]"
    index, path = first.where
    parent = repaired.lines[index].value
    for key in path[:-1]:
        parent = parent[key]
    assert any("functionResponse" in part for part in parent)


@pytest.mark.parametrize(
    ("content", "skipped"),
    [([{"text": "/help"}], True), ([{"functionResponse": {"name": "x"}}], False), ([{"inlineData": {"data": "x"}}], False), ([], True), ("  ", True)],
)
def test_skipped_follows_gemini_clis_text_form_of_a_message(content: Any, skipped: bool) -> None:
    assert _gemini._skipped(content) is skipped


def test_find_matches_the_whole_id_inside_the_file(tmp_path: Path) -> None:
    session = orjson.loads((SESSIONS / "gemini-10.jsonl").read_bytes().split(b"\n", 1)[0])["sessionId"]
    chats = tmp_path / ".gemini" / "tmp" / "proj" / "chats"
    found = fixture("gemini-10.jsonl", chats, f"session-2026-11-24T11-00-{session[:8]}.jsonl")
    assert _gemini.find(session, {"GEMINI_CLI_HOME": str(tmp_path)}) == [found]
    assert _gemini.find(session, {"HOME": str(tmp_path)}) == [found]
    assert _gemini.find(session[:8] + "-0000-0000-0000-000000000000", {"HOME": str(tmp_path)}) == []  # same prefix, other chat
    assert _gemini.session_roots({"GEMINI_CLI_HOME": "/g", "HOME": "/h"}) == [Path("/g/.gemini/tmp")]
