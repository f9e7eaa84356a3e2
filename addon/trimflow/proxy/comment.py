"""The flow comment mitmweb shows: the figures first, short enough for the flow list's `comment` column
(`--set web_columns=...`, see docs/metrics.md), then the rest of what trimflow did."""

from __future__ import annotations

from .._human import format_size_change, format_thousands
from .._record import OBSERVE, Record


def flow_comment(record: Record) -> str:
    """e.g. "10->8 img, 562->450 KB; trimflow rule claude, claude-sonnet-4, conv 3f2a turn 4, 2 thinned, ~120k->98k tok".

    Sizes and counts only, like the log line: no prompt text, key or base64."""
    figures = f"{record.images_before}->{record.images_after} img, {format_size_change(record.body_bytes_before, record.body_bytes_after)}"
    rest = [f"trimflow rule {record.rule or '-'}", record.model or record.format]
    if record.conversation is not None:
        rest.append(f"conv {record.conversation} {record.place}")
    done = (
        (record.thinned, "thinned"),
        (record.native_sized, "at the model's size"),
        (record.shrunk, "shrunk"),
        (record.deduplicated, "repeated"),
        (record.pruned_for_image_limit, "too big"),
        (record.mime_mismatches, "mime mismatch"),
        (record.by_reference, "by reference"),
    )
    rest.extend(f"{n} {what}" for n, what in done if n)
    rest.append(f"~{format_thousands(record.est_tokens_before)}->{format_thousands(record.est_tokens_after)} tok")
    if record.mode == OBSERVE:
        rest.append("observe: forwarded untouched")
    if record.over_budget:
        rest.append("OVER BUDGET")
    if record.reason:
        rest.append(f"untouched ({record.reason})")
    return f"{figures}; {', '.join(rest)}"
