"""Telling conversations apart without the client's address, and numbering their turns.

A conversation is named by an explicit session id when the agent sends one, else by a hash of
its stable head (system prompt and first messages), which every later turn re-sends unchanged.
Only a short hash is kept: never the id or the text itself.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import orjson

# Headers agents use for a session id (lower case).
SESSION_HEADERS = ("x-claude-code-session-id", "session_id", "session-id", "x-session-id", "conversation_id", "x-conversation-id")
# Body fields that name a conversation across turns.
SESSION_FIELDS = ("prompt_cache_key", "conversation")


def conversation_key(host: str, headers: Mapping[str, str], body: dict[str, Any], anchor: Any) -> str:
    """A short stable id for the conversation a request belongs to."""
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return _digest(b"h", name.encode(), value.encode())
    for name in SESSION_FIELDS:
        value = body.get(name)
        if isinstance(value, str) and value:
            return _digest(b"b", name.encode(), value.encode())
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        # Claude Code puts its session id into metadata.user_id.
        return _digest(b"u", metadata["user_id"].encode())
    try:
        head = orjson.dumps(anchor)
    except (orjson.JSONEncodeError, TypeError):
        head = repr(anchor).encode("utf-8", "replace")
    return _digest(b"a", host.encode(), head)


def _digest(*parts: bytes) -> str:
    return hashlib.blake2b(b"\0".join(parts), digest_size=4).hexdigest()


class TurnCounter:
    """Numbers the requests of each conversation; forgets the least recently seen past `capacity`."""

    def __init__(self, capacity: int = 4096) -> None:
        self._turns: OrderedDict[str, int] = OrderedDict()
        self._capacity = capacity

    def next(self, conversation: str) -> int:
        turn = self._turns.pop(conversation, 0) + 1
        self._turns[conversation] = turn
        if len(self._turns) > self._capacity:
            self._turns.popitem(last=False)
        return turn
