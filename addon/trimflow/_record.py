"""The metrics record: one per LLM request, shared by the engine's report, the proxy's JSONL and the audit.

No field ever holds a credential, prompt text or base64 data: only names, counts and sizes.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from ._sizes import format_size


@dataclass(slots=True)
class Record:
    ts: str
    conversation: str | None
    turn: int | None
    host: str
    path: str  # without the query string, which may hold a key
    format: str
    model: str | None
    rule: str | None
    mode: str  # enforce or observe: what was done with the body
    images_before: int = 0
    images_after: int = 0
    documents: int = 0  # documents, audio and video: counted, never pruned by an image limit
    media_bytes_before: int = 0
    media_bytes_after: int = 0
    body_bytes_before: int = 0
    body_bytes_after: int = 0
    est_tokens_before: int = 0
    est_tokens_after: int = 0
    pruned: int = 0
    pruned_for_count: int = 0
    pruned_for_body: int = 0
    over_budget: bool = False  # the body budget could not be met: the best effort was forwarded
    server_side_history: bool = False  # earlier turns live at the provider (previous_response_id)
    reason: str | None = None  # why the body was forwarded as it came, when it could not be handled
    status: int | None = None
    usage_input_tokens: int | None = None
    overhead_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> bytes:
        return orjson.dumps(self)

    def summary(self) -> str:
        """The per-turn log line: sizes and counts only."""
        parts = [f"conv {self.conversation or '-'} turn {self.turn if self.turn is not None else '-'}"]
        parts.append(self.model or self.format)
        if self.reason:
            parts.append(f"untouched ({self.reason})")
        parts.append(f"images {self.images_before}->{self.images_after}")
        parts.append(f"body {format_size(self.body_bytes_before)}->{format_size(self.body_bytes_after)}")
        parts.append(f"~{_thousands(self.est_tokens_before)}->{_thousands(self.est_tokens_after)} tok")
        if self.mode == "observe":
            parts.append("(observe)")
        if self.over_budget:
            parts.append("OVER BUDGET")
        if self.status is not None:
            parts.append(str(self.status))
        if self.usage_input_tokens is not None:
            parts.append(f"in={self.usage_input_tokens}")
        return " ".join(parts)


def _thousands(n: int) -> str:
    return f"{n / 1000:.0f}k" if n >= 1000 else str(n)


def utc_timestamp() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
