"""Repair an agent's saved session: the proxy's rules applied to the history it sends again when resumed.

`python -m trimflow repair PATH...` (scripts/repair) is the command; `repair_file` does one file. The
agents' formats: Claude Code's transcripts (trimflow.repair._claude), Codex's rollout files (_codex) and
Gemini CLI's saved chats (_gemini). docs/repair.md says what each keeps, what is changed and how a file is
replaced safely.
"""

from __future__ import annotations

from ._cli import AGENTS, FileReport, repair_file, session_paths
from ._lines import SessionError
from ._repair import Repaired, Replay, repair_lines

__all__ = ["AGENTS", "FileReport", "Repaired", "Replay", "SessionError", "repair_file", "repair_lines", "session_paths"]
