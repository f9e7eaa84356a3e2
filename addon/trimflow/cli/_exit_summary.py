"""The lines the launcher prints at exit: the run, one per conversation, where the records are; read by the audit."""

from __future__ import annotations

import shlex
from pathlib import Path

from .. import audit
from .._human import format_size
from .._rules import builtin_rules
from .._rules_file import DEFAULT_RULES_PATH, load_rules
from ._run_dir import write_private

MAX_CONVERSATIONS = 8


def summary(metrics: Path, offset: int, name: str, status: int, log: Path) -> list[str]:
    """One line for the run of the command `name`, one per conversation (the largest first), where the records are."""
    head = f"trimflow: {name} exited {status}"
    source = metrics
    if offset:  # the user's metrics file: only what this run appended
        source = log.with_suffix(".jsonl")
        with open(metrics, "rb") as f:
            f.seek(offset)
            write_private(source, f.read())
    if not source.exists() or source.stat().st_size == 0:
        return [f"{head}; no LLM request went through trimflow (proxy log: {log})"]
    try:
        reader = audit.Reader(builtin_rules(), load_rules(DEFAULT_RULES_PATH), what_if=False)
        result = audit.summarize(reader.rows(reader.check([str(source)])), reader.tallies, None, DEFAULT_RULES_PATH.name, [])
    except audit.InputError as exc:
        return [f"{head}; no summary: {exc} (records: {metrics})"]
    finally:
        if source != metrics:
            source.unlink(missing_ok=True)
    conversations = sorted(result.conversations, key=lambda c: c.totals.requests, reverse=True)
    n = len(conversations)
    lines = [f"{head}; {result.totals.requests:,} LLM requests in {n} conversation{'s' if n != 1 else ''} through trimflow"]
    for conversation in conversations[:MAX_CONVERSATIONS]:
        lines.append(f"trimflow:   {_conversation_line(conversation)}")
    if n > MAX_CONVERSATIONS:
        lines.append(f"trimflow:   and {n - MAX_CONVERSATIONS} more")
    if n > 1:
        lines.append(f"trimflow:   all: {_figures(result.totals, sum(_retries(c) for c in conversations))}")
    lines.append(f"trimflow: every turn: scripts/audit {shlex.quote(str(metrics))} · proxy log: {log}")
    return lines


def _retries(conversation: audit.Conversation) -> int:
    return sum(getattr(row.record, "retries", 0) or 0 for row in conversation.rows)


def _conversation_line(conversation: audit.Conversation) -> str:
    if conversation.id == audit.UNKNOWN_CONVERSATION:
        label = "outside any conversation (token counts, unreadable bodies)"
    else:
        label = f"conversation {conversation.id}"
    last = conversation.last.record
    turns = f"{conversation.turns:,} turn{'s' if conversation.turns != 1 else ''}, {conversation.totals.requests:,} requests"
    return f"{label} ({last.format}, {', '.join(conversation.models())}): {turns} · {_figures(conversation.totals, _retries(conversation))}"


def _figures(t: audit.Totals, retries: int) -> str:
    """Images sent and pruned, bytes not sent, trimflow's estimate of the tokens sent, and what the provider reported."""
    parts = [f"images sent {t.images_after:,}, pruned {t.pruned:,}", f"{format_size(t.body_bytes_saved)} not sent"]
    parts.append(f"~tokens sent {t.est_tokens_after:,}")
    if t.usage_requests:
        parts.append(f"reported {audit.usage_text(t)}")
    if retries:
        parts.append(f"{retries} recover{'y' if retries == 1 else 'ies'}")
    if t.recalls or t.recalls_refused:
        parts.append(audit.recalls_text(t))
    return " · ".join(parts)
