"""Gemini CLI's saved chats: `${GEMINI_CLI_HOME:-$HOME}/.gemini/tmp/<project>/chats/session-<time>-<id>.jsonl`.

A log of records, one JSON object per line, replayed in order when the chat is loaded: the first holds the
session's metadata (`sessionId`, `projectHash`); a record with an `id` is a message, and a later record with
the same id replaces it in place; `{"$set": {...}}` updates the metadata, and one that sets `messages`
replaces the whole list; `{"$rewindTo": id}` drops that message and every later one.

Resuming (`gemini --resume`) turns the messages into the Gemini API history: a `user` message's `content`
parts as they are (unless it is a command or context text Gemini CLI skips), a `gemini` message's content
and its tool calls, followed by a user turn made of the tool calls' `result` parts. A tool that read an
image answers with `[functionResponse, inlineData]`, stored both in the tool call's `result` and in the
user message recorded after it; Gemini CLI 0.61 sends both on resume (a session that showed the model 16
screenshots sends 32 when resumed), so both count, and both are pruned where the rules say.
"""

from __future__ import annotations

import glob
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from ..formats import JsonPath, gemini
from ._lines import Line
from ._repair import Edit, Replay, Where

NAME = "gemini"
HOST = "generativelanguage.googleapis.com"
# What Gemini CLI skips when it turns a saved user message back into history: commands and its own context.
_SKIPPED_PREFIXES = ("/", "?", "<session_context>", "<hook_context>")
# Parts that Gemini CLI's verbose text form names rather than reads (partToString with verbose on), in its order.
_NAMED_PARTS = ("videoMetadata", "thought", "codeExecutionResult", "executableCode", "fileData", "functionCall", "functionResponse", "inlineData")


def recognises(lines: Sequence[Line]) -> bool:
    first = next((line.value for line in lines if line.value is not None), None)
    return isinstance(first, dict) and isinstance(first.get("sessionId"), str) and isinstance(first.get("projectHash"), str)


Message = tuple[int, JsonPath, dict[str, Any]]  # the line it was read from, its path there, the message


def messages(lines: Sequence[Line]) -> list[Message]:
    """The chat's messages as Gemini CLI loads them (loadConversationRecord), in order."""
    found: dict[str, Message] = {}
    for index, line in enumerate(lines):
        record = line.value
        if not isinstance(record, dict):
            continue
        if isinstance(record.get("$rewindTo"), str):
            ids = list(found)
            cut = ids.index(record["$rewindTo"]) if record["$rewindTo"] in ids else 0
            for key in ids[cut:]:
                del found[key]
        elif isinstance(record.get("id"), str):
            found[record["id"]] = (index, (), record)  # a known id keeps its place, as in a JavaScript Map
        elif isinstance(record.get("$set"), dict):
            listed = record["$set"].get("messages")
            if isinstance(listed, list):
                found.clear()
                _add_listed(found, index, ("$set", "messages"), listed)
        elif isinstance(record.get("sessionId"), str) and isinstance(record.get("projectHash"), str):
            listed = record.get("messages")
            if isinstance(listed, list):
                _add_listed(found, index, ("messages",), listed)
    return list(found.values())


def _add_listed(found: dict[str, Message], index: int, path: JsonPath, listed: list[Any]) -> None:
    for k, message in enumerate(listed):
        if isinstance(message, dict) and isinstance(message.get("id"), str):
            found[message["id"]] = (index, (*path, k), message)


def replay(lines: Sequence[Line]) -> Replay:
    contents: list[dict[str, Any]] = []
    places: list[list[Where | None]] = []  # for each content, where each of its parts is in the file

    def add(role: str, parts: list[tuple[Any, Where | None]]) -> None:
        contents.append({"role": role, "parts": [part for part, _ in parts]})
        places.append([where for _, where in parts])

    model = None
    for index, path, message in messages(lines):
        kind = message.get("type")
        if kind == "user":
            if _skipped(message.get("content")):
                continue
            add("user", _part_array(message.get("content"), index, (*path, "content")))
        elif kind == "gemini":
            if isinstance(message.get("model"), str):
                model = message["model"]
            model_parts, results = _model_turn(message, index, path)
            if model_parts:
                add("model", model_parts)
                if results:
                    add("user", results)
    body = {"contents": contents}

    def locate(media_path: JsonPath) -> Where | None:
        if len(media_path) < 4 or media_path[0] != "contents" or media_path[2] != "parts":
            return None
        c, p = media_path[1], media_path[3]
        if not isinstance(c, int) or not isinstance(p, int):
            return None
        where = places[c][p]
        return None if where is None else (where[0], (*where[1], *media_path[4:]))

    return Replay(gemini.NAME, HOST, f"/v1beta/models/{model or ''}:streamGenerateContent", body, locate)


def _model_turn(message: dict[str, Any], index: int, path: JsonPath) -> tuple[list[tuple[Any, Where | None]], list[tuple[Any, Where | None]]]:
    """The model's parts and the tool results' parts of a `gemini` message (convertSessionToClientHistory)."""
    content = message.get("content")
    content_parts = _part_array(content, index, (*path, "content")) if _truthy(content) else []
    dict_parts = [part for part, _ in content_parts if isinstance(part, dict)]
    calls = message.get("toolCalls")
    calls = [(k, call) for k, call in enumerate(calls) if isinstance(call, dict)] if isinstance(calls, list) else []
    parts: list[tuple[Any, Where | None]] = []
    if any(_truthy(part.get("functionCall")) or _truthy(part.get("thought")) for part in dict_parts):
        parts = list(content_parts)
    else:
        thoughts = message.get("thoughts")
        for thought in thoughts if isinstance(thoughts, list) else []:
            parts.append(({"text": str(thought), "thought": True}, None))  # text only: its wording does not matter here
        parts += content_parts
        parts += [({"functionCall": {"name": call.get("name"), "args": call.get("args")}}, None) for _, call in calls]
    results: list[tuple[Any, Where | None]] = []
    for k, call in calls:
        result = call.get("result")
        if not _truthy(result):
            continue
        where: JsonPath = (*path, "toolCalls", k, "result")
        if isinstance(result, str):
            results.append(({"functionResponse": {"name": call.get("name"), "response": {"output": result}}}, None))
        elif isinstance(result, list):
            results += _part_array(result, index, where)
        else:
            results.append((result, (index, where)))
    return parts, results


def _truthy(value: Any) -> bool:
    """JavaScript's truthiness, which Gemini CLI's checks use: an empty list or object counts as a value."""
    if value is None or value is False or value == "":
        return False
    return not (isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0)


def _part_array(content: Any, index: int, path: JsonPath) -> list[tuple[Any, Where | None]]:
    """ensurePartArray: a list's items (a string becomes a text part), a string as one text part, else the value itself."""
    if isinstance(content, list):
        return [({"text": part}, None) if isinstance(part, str) else (part, (index, (*path, k))) for k, part in enumerate(content)]
    if isinstance(content, str):
        return [({"text": content}, None)]
    return [(content, (index, path))]


def _skipped(content: Any) -> bool:
    """Whether Gemini CLI leaves a saved user message out of the resumed history (isIgnoredUserContent)."""
    text = _verbose_text(content).strip()
    return not text or text.startswith(_SKIPPED_PREFIXES)


def _verbose_text(value: Any) -> str:
    if not _truthy(value):
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_verbose_text(part) for part in value)
    if isinstance(value, dict):
        if any(key in value for key in _NAMED_PARTS):
            return "[part]"
        text = value.get("text")
        return text if isinstance(text, str) else ""
    return ""


def copies(lines: Sequence[Line], edits: Sequence[Edit]) -> list[Edit]:
    return []  # both stored copies are sent on resume: the engine prunes each where it is


# --- where sessions are -----------------------------------------------------------------------------------


def gemini_dir(env: Mapping[str, str]) -> Path:
    base = env.get("GEMINI_CLI_HOME") or env.get("HOME", "~")
    return Path(base).expanduser() / ".gemini"


def session_roots(env: Mapping[str, str]) -> list[Path]:
    return [gemini_dir(env) / "tmp"]


def find(session_id: str, env: Mapping[str, str]) -> list[Path]:
    """The chats of a session id: the file name holds its first 8 characters, the first record the whole id."""
    root = gemini_dir(env) / "tmp"
    if not root.is_dir() or len(session_id) < 8:
        return []
    found = []
    for candidate in root.glob(f"*/chats/**/session-*-{glob.escape(session_id[:8])}.jsonl"):
        if candidate.is_file() and _session_id(candidate) == session_id:
            found.append(candidate)
    return sorted(found)


def _session_id(path: Path) -> str | None:
    try:
        with path.open("rb") as file:
            first = file.readline(1 << 20)
    except OSError:
        return None
    try:
        value = orjson.loads(first)
    except orjson.JSONDecodeError:
        return None
    return value.get("sessionId") if isinstance(value, dict) and isinstance(value.get("sessionId"), str) else None
