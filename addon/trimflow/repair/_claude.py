"""Claude Code's session transcripts: `<config dir>/projects/<cwd, / as ->/<session id>.jsonl`.

One JSON object per line. The conversation lines (`type` user or assistant) carry the Anthropic Messages
`message` that Claude Code sends again on resume, and link to the line before them by `parentUuid`; other
lines (attachments, the system prompt's shape, request records, queue operations) link in or stand
alone. Resuming sends the chain that ends at the newest conversation line, oldest first: a compaction
starts a new chain (its boundary has no parent), and a rewound branch is left out.

Each image the Read tool returned is stored twice on its line: the block in `message` that is sent, and a
display copy in `toolUseResult` (`file.base64`) that is never sent. When the block becomes a
placeholder, the copy becomes "" (what Claude Code itself writes when it strips a Read result for storage),
so the file shrinks by both.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..formats import JsonPath, anthropic
from ._lines import Line
from ._repair import Edit, Replay, Where

NAME = "claude"
HOST = "api.anthropic.com"
PATH = "/v1/messages"
_CONVERSATION = ("user", "assistant")


def recognises(lines: Sequence[Line]) -> bool:
    return any(_is_conversation(line.value) for line in lines)


def _is_conversation(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and value.get("type") in _CONVERSATION
        and isinstance(value.get("message"), dict)
        and "parentUuid" in value
        and isinstance(value.get("sessionId"), str)
    )


def chain(lines: Sequence[Line]) -> list[int]:
    """The indexes of the lines on the chain that resume sends, oldest first (every linked line, not only the
    conversation's). The newest conversation line of the main thread ends it; a subagent's transcript, all
    side chain, ends at its own newest."""
    by_uuid: dict[str, int] = {}
    main = side = None
    for index, line in enumerate(lines):
        value = line.value
        if not isinstance(value, dict):
            continue
        uuid = value.get("uuid")
        if isinstance(uuid, str):
            by_uuid[uuid] = index
        if _is_conversation(value):
            if value.get("isSidechain") is True:
                side = index
            else:
                main = index
    found: list[int] = []
    seen: set[int] = set()
    at = main if main is not None else side
    while at is not None and at not in seen:
        seen.add(at)
        found.append(at)
        parent = lines[at].value.get("parentUuid")
        at = by_uuid.get(parent) if isinstance(parent, str) else None
    found.reverse()
    return found


def replay(lines: Sequence[Line]) -> Replay:
    sent = [index for index in chain(lines) if _is_conversation(lines[index].value)]
    messages = [lines[index].value["message"] for index in sent]
    body: dict[str, Any] = {"messages": messages}
    model = next((m.get("model") for m in reversed(messages) if m.get("role") == "assistant" and isinstance(m.get("model"), str)), None)
    if model is not None:
        body = {"model": model, **body}

    def locate(path: JsonPath) -> Where | None:
        if len(path) < 2 or path[0] != "messages" or not isinstance(path[1], int):
            return None
        return sent[path[1]], ("message", *path[2:])

    return Replay(anthropic.NAME, HOST, PATH, body, locate)


def copies(lines: Sequence[Line], edits: Sequence[Edit]) -> list[Edit]:
    """The display copy of each image that became a placeholder, emptied."""
    out: list[Edit] = []
    for edit in edits:
        data = _image_data(edit.old)
        if data is None or _image_data(edit.new) is not None:
            continue  # not a pruned image (a re-encoded one keeps its copy: only what is sent must fit)
        index = edit.where[0]
        value = lines[index].value
        if isinstance(value, dict) and "toolUseResult" in value:
            for path in _strings_equal_to(value["toolUseResult"], data, ("toolUseResult",)):
                out.append(Edit((index, path), data, ""))
    return out


def _image_data(block: Any) -> str | None:
    if isinstance(block, dict) and block.get("type") == "image":
        source = block.get("source")
        if isinstance(source, dict) and isinstance(source.get("data"), str):
            return str(source["data"])
    return None


def _strings_equal_to(node: Any, text: str, path: JsonPath) -> Iterator[JsonPath]:
    if isinstance(node, str):
        if node == text:
            yield path
    elif isinstance(node, dict):
        for key, child in node.items():
            yield from _strings_equal_to(child, text, (*path, key))
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _strings_equal_to(child, text, (*path, i))


# --- where sessions are -----------------------------------------------------------------------------------


def config_dir(env: Mapping[str, str]) -> Path:
    configured = env.get("CLAUDE_CONFIG_DIR")
    return Path(configured).expanduser() if configured else Path(env.get("HOME", "~")).expanduser() / ".claude"


def session_roots(env: Mapping[str, str]) -> list[Path]:
    return [config_dir(env) / "projects"]


def find(session_id: str, env: Mapping[str, str]) -> list[Path]:
    """The transcripts of a session id: one per project folder it ran in (normally one)."""
    projects = config_dir(env) / "projects"
    if not projects.is_dir() or os.sep in session_id or session_id in (".", ".."):
        return []
    return sorted(p for p in projects.glob(f"*/{glob.escape(session_id)}.jsonl") if p.is_file())
