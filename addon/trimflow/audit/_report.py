"""The audit's reports as text (a terminal table), JSON and Markdown (for a CI step summary).

Cost is the price table's (rules/prices.yaml, or --prices): a request it cannot price is counted apart
and named, never priced at 0.

Every figure comes from the metrics records: names, counts and sizes, never a body, a header or a
URL's query string. The names are what the recording says, so every line goes out through _escape for
its format.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from .. import _jsoncodec
from .._cache_break import CAUSES, FIRST_TURN
from .._human import format_size
from .._text import for_text
from ._escape import for_markdown, for_markdown_cell, for_markdown_code
from ._gate import Gate
from ._read import PROXY, Row
from ._summary import Conversation, Crossing, Summary, Totals

# --- shared wording


def tokens(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def pair(before: Any, after: Any, show: Callable[[Any], str], arrow: str = "->") -> str:
    return show(before) if before == after else f"{show(before)}{arrow}{show(after)}"


def percent(part: int, whole: int) -> str:
    return f"{part * 100 / whole:.0f}%" if whole else "0%"


def money(usd: float) -> str:
    """$0.0123 under a dollar (a turn's cost), $12.34 above."""
    return f"${usd:,.4f}" if usd < 1 else f"${usd:,.2f}"


def cost_text(t: Totals) -> str:
    """What the requests cost, and what the figure leaves out: "$1.23", "$1.23 + unknown for 2 requests
    (no price for llava)", "unknown (no usage reported)"."""
    why = "; ".join(f"{reason}: {n:,}" if len(t.unpriced) > 1 else reason for reason, n in t.unpriced.items())
    if t.cost_usd is None:
        return f"unknown ({why})" if why else "-"
    if not t.unpriced:
        return money(t.cost_usd)
    n = sum(t.unpriced.values())
    return f"{money(t.cost_usd)} + unknown for {n:,} request{'s' if n != 1 else ''} ({why})"


def cache_parts(t: Totals, read: str = "cached") -> list[str]:
    """The cache reads and writes, each when some answer reported it: "cached 9,000", "written 2,000"."""
    parts = [(read, t.cache_read_tokens, t.cache_read_reported), ("written", t.cache_write_tokens, t.cache_write_reported)]
    return [f"{what} {n:,}" for what, n, said in parts if said]


def usage_text(t: Totals) -> str:
    """The provider's usage and its cost: "in 12,000 (cached 9,000, written 2,000) · out 300 · cost $0.0411"."""
    if not t.usage_requests:
        return f"none reported · cost {cost_text(t)}"
    cache = cache_parts(t)
    text = f"in {t.input_tokens:,}" + (f" ({', '.join(cache)})" if cache else "")
    breaks = cache_breaks_text(t)
    return f"{text} · out {t.output_tokens:,} · cost {cost_text(t)}" + (f" · cache breaks: {breaks}" if breaks else "")


def cache_breaks_text(t: Totals) -> str:
    """The turns whose cache read fell, by cause (trimflow._cache_break): "1 first_turn, 2 trimflow_cut"; "" when no turn
    after a first one broke the cache (every conversation has a first turn: alone, it says nothing)."""
    if not any(cause != FIRST_TURN for cause in t.cache_breaks):
        return ""
    known = [cause for cause in CAUSES if t.cache_breaks[cause]]
    other = sorted(cause for cause in t.cache_breaks if cause not in CAUSES)  # from a record file of another version
    return ", ".join(f"{t.cache_breaks[cause]:,} {for_text(cause)}" for cause in known + other)


# What the engine did beyond dropping images (Record fields; getattr: older records lack them).
_ALSO_DONE = (("shrunk", "shrunk"), ("native_sized", "at the model's size"), ("thinned", "thinned"), ("deduplicated", "repeats"))
_PRUNE_CAUSES = (
    ("pruned_for_count", "count"),
    ("pruned_for_body", "body"),
    ("pruned_for_tokens", "tokens"),
    ("pruned_for_image_limit", "image limit"),
)


def pruned_cell(row: Row) -> str:
    r = row.record
    parts = []
    if r.pruned:
        why = "+".join(label for name, label in _PRUNE_CAUSES if getattr(r, name, 0))
        parts.append(f"{r.pruned} ({why})" if why else str(r.pruned))
    parts += [f"{getattr(r, name, 0)} {label}" for name, label in _ALSO_DONE if getattr(r, name, 0)]
    if r.over_budget:
        parts.append("OVER BUDGET")
    if getattr(r, "retries", 0):  # refused for a limit and sent again within it (docs/recovery.md)
        parts.append(f"retried {r.retries}x ({r.retry_limits}){'' if (r.status or 0) < 400 else ', still refused'}")
    if getattr(r, "recalls", 0):  # images recall_image brought back before this request (docs/how-it-works.md#recall)
        parts.append(f"{r.recalls} recalled")
    return ", ".join(parts) or "-"


def growth_lines(conversation: Conversation) -> list[str]:
    """The steady rate (the gate's growth), and the whole-run slope beside it when the two cover different turns."""
    g = conversation.growth
    if g.get("body_bytes") is None:
        return ["growth per turn: -" + (" (one turn)" if conversation.first_turn is not None else " (no turn numbers)")]

    def body(v: float | None) -> str:
        return "-" if v is None else ("+" if v >= 0 else "-") + format_size(abs(round(v)))

    def images(v: float | None) -> str:
        return "-" if v is None else f"{v:+.2f}"

    def figures(g: dict[str, float | None]) -> str:
        text = f"body {body(g['body_bytes'])}, images {images(g['images'])}"
        if conversation.has_after:
            text += f" (after pruning: body {body(g['after.body_bytes'])}, images {images(g['after.images'])})"
        return text

    numbered = sum(1 for row in conversation.rows if row.record.turn is not None)
    if conversation.steady_turns >= numbered:
        return [f"growth per turn over all {numbered} turns: {figures(g)}"]
    return [
        f"growth per turn, steady over the last {conversation.steady_turns} turns: {figures(g)}",
        f"whole-run slope over {numbered} turns (not the gate's growth): {figures(conversation.growth_whole_run)}",
    ]


def limit_value(crossing: Crossing) -> str:
    return format_size(crossing.value) if crossing.limit == "max_body_bytes" else str(crossing.value)


def crossing_text(crossing: Crossing, *, with_after: bool) -> str:
    head = f"{crossing.limit} {limit_value(crossing)} ({crossing.source}): "
    if crossing.crossed_at is None:
        head += "not crossed, not growing towards it"
    elif crossing.projected:
        head += f"would be crossed at turn {crossing.crossed_at:,} (projected from the growth)"
    else:
        head += f"crossed at turn {crossing.crossed_at}"
    if with_after and crossing.crossed_at is not None and not crossing.projected:
        after = crossing.after_crossed_at
        head += f"; after pruning: {'never' if after is None else f'still crossed at turn {after}'}"
    return head


def failure_text(conversation: Conversation) -> str:
    return "; ".join(
        f"turn {f.turn if f.turn is not None else '-'}: {f.status if f.status is not None else '-'} {f.category}" for f in conversation.failures
    )


def conversation_title(conversation: Conversation) -> str:
    r = conversation.last.record
    turns = (
        f"turns {conversation.first_turn}-{conversation.last_turn}"
        if conversation.first_turn is not None
        else f"{conversation.turns} request{'s' if conversation.turns != 1 else ''}"
    )
    return f"{r.format} · {', '.join(conversation.models())} · {r.host}{r.path} · {turns}"


def inputs_text(summary: Summary) -> str:
    parts = [f"{t.path} ({t.kind}, {t.flows:,} {'lines' if t.kind == 'jsonl' else 'flows'})" for t in summary.inputs]
    return ", ".join(parts)


def counts_text(summary: Summary) -> str:
    n = len(summary.conversations)
    unreadable = summary.unreadable()
    text = (
        f"{summary.flows:,} flows: {summary.totals.requests:,} LLM requests in {n} conversation{'s' if n != 1 else ''}, "
        f"{summary.skipped:,} skipped (not LLM), {sum(unreadable.values()):,} unreadable"
    )
    if unreadable:
        text += " (" + "; ".join(f"{n} {reason}" for reason, n in unreadable.items()) + ")"
    unread = summary.unread_answers()
    if unread:
        text += "; answers not read: " + "; ".join(f"{n} {reason}" for reason, n in unread.items())
    return text


def mode_text(summary: Summary) -> str:
    if summary.what_if:
        return f"what-if: {summary.rules_source} applied offline to every recorded request; limits from the same file"
    limits = f"limits for crossings from {summary.limits_source}"
    recorded = [row for row in summary.rows() if row.after == PROXY]
    if not recorded:
        return f"as recorded (no pruning applied); {limits}"
    kinds = {summary.inputs[row.source].kind for row in recorded}
    sources = (["its metrics JSONL"] if "jsonl" in kinds else []) + (["its record in each flow"] if kinds - {"jsonl"} else [])
    where = " and ".join(sources)
    share = "" if len(recorded) == summary.totals.requests else f" ({len(recorded):,} of {summary.totals.requests:,} requests; the rest as recorded)"
    return (
        f"as trimflow pruned them{share}: before is what the client sent, after what trimflow forwarded "
        f"(or would have, in observe mode), from {where}; {limits}"
    )


def totals_text(t: Totals, arrow: str = "->") -> str:
    return _totals_text(t, arrow) + (f" · {recalls_text(t)}" if t.recalls or t.recalls_refused else "")


def recalls_text(t: Totals) -> str:
    """The images recall_image brought back, and the ids it refused: "2 recalled (1 refused)"."""
    return f"{t.recalls:,} recalled" + (f" ({t.recalls_refused:,} refused)" if t.recalls_refused else "")


def _totals_text(t: Totals, arrow: str) -> str:
    if (t.body_bytes_before, t.est_tokens_before, t.images_before) == (t.body_bytes_after, t.est_tokens_after, t.images_after):
        return (
            f"{t.requests:,} requests · body {format_size(t.body_bytes_before)} · ~tokens {tokens(t.est_tokens_before)} · "
            f"images {t.images_before:,} (nothing pruned)"
        )
    return (
        f"{t.requests:,} requests · body {format_size(t.body_bytes_before)}{arrow}{format_size(t.body_bytes_after)} "
        f"(saved {format_size(t.body_bytes_saved)}, {percent(t.body_bytes_saved, t.body_bytes_before)}) · "
        f"~tokens {tokens(t.est_tokens_before)}{arrow}{tokens(t.est_tokens_after)} (saved {tokens(t.est_tokens_saved)}) · "
        f"images {t.images_before:,}{arrow}{t.images_after:,}"
    )


def warnings(summary: Summary, gate: Gate | None = None) -> list[str]:
    """Inputs the figures cannot stand on that the gate does not already fail on."""
    failed = {(p.kind, p.path) for p in gate.input_failures} if gate is not None else set()
    return [p.text for p in summary.input_problems() if (p.kind, p.path) not in failed]


def notes(conversation: Conversation) -> list[str]:
    """Why requests were left as they came (engine reasons: fixed texts, no content)."""
    seen: dict[str, list[str]] = {}
    for row in conversation.rows:
        if row.record.reason:
            turn = row.record.turn
            seen.setdefault(row.record.reason, []).append(str(turn) if turn is not None else "-")
    return [f"turn{'s' if len(turns) > 1 else ''} {_ranges(turns)}: {reason}" for reason, turns in seen.items()]


def _ranges(turns: list[str]) -> str:
    return ", ".join(turns) if len(turns) <= 6 else f"{', '.join(turns[:5])} and {len(turns) - 5} more"


TURN_COLUMNS = (
    "turn",
    "model",
    "images",
    "media",
    "body",
    "~tokens",
    "status",
    "in tokens",
    "cache read",
    "cache write",
    "out tokens",
    "cost",
    "pruned",
    "failure",
)
LEFT_COLUMNS = frozenset(i for i, name in enumerate(TURN_COLUMNS) if name in ("model", "pruned", "failure"))  # the rest are figures


def cost_cell(row: Row) -> str:
    if row.cost is not None:
        return money(row.cost)
    return "?" if row.unpriced else "-"  # ? unknown; - not billed


def turn_cells(row: Row, arrow: str = "->") -> list[str]:
    r = row.record
    return [
        str(r.turn) if r.turn is not None else "-",
        r.model or "-",
        pair(r.images_before, r.images_after, str, arrow),
        pair(r.media_bytes_before, r.media_bytes_after, format_size, arrow),
        pair(r.body_bytes_before, r.body_bytes_after, format_size, arrow),
        pair(r.est_tokens_before, r.est_tokens_after, tokens, arrow),
        str(r.status) if r.status is not None else "-",
        tokens(r.usage_input_tokens),
        tokens(r.usage_cache_read_tokens),
        tokens(r.usage_cache_write_tokens),
        tokens(r.usage_output_tokens),
        cost_cell(row),
        pruned_cell(row),
        row.failure or "",
    ]


# --- text


def text(summary: Summary, gate: Gate | None) -> str:
    lines = ["trimflow audit", f"inputs: {inputs_text(summary)}", counts_text(summary), mode_text(summary)]
    lines += [f"warning: {w}" for w in warnings(summary, gate)]
    for conversation in summary.conversations:
        lines += ["", f"conversation {conversation.id} · {conversation_title(conversation)}"]
        cells = [[for_text(cell) for cell in turn_cells(r)] for r in conversation.rows]  # escaped before the widths are taken
        lines += ["  " + line for line in _table([list(TURN_COLUMNS), *cells])]
        lines += ["  " + line for line in growth_lines(conversation)]
        lines.append(f"  usage: {usage_text(conversation.totals)}")
        lines += [f"  {crossing_text(c, with_after=conversation.has_after)}" for c in conversation.crossings]
        if conversation.failures:
            lines.append(f"  failures: {failure_text(conversation)}")
        lines += [f"  note: {n}" for n in notes(conversation)]
    lines += ["", f"totals: {totals_text(summary.totals)}", f"usage: {usage_text(summary.totals)} (prices: {summary.prices_source})"]
    if gate is not None:
        lines.append("")
        lines += gate_lines(gate)
    return "".join(for_text(line) + "\n" for line in lines)


def gate_verdict(gate: Gate) -> str:
    broken = {b.expression for b in gate.breaches}
    text = f"{len(broken)} of {len(gate.expressions)} --fail-on broken"
    if gate.input_failures:
        n = len(gate.input_failures)
        text += f", {n} input{'s' if n != 1 else ''} failing"
    return text


def gate_lines(gate: Gate) -> list[str]:
    lines = [f"gate: {'ok' if gate.ok else 'FAIL'} ({gate_verdict(gate)})"]
    lines += [f"  FAIL  {p.text}" for p in gate.input_failures]
    for expr in gate.expressions:
        hits = gate.broken(expr)
        if not hits:
            lines.append(f"  ok    {expr.text}")
        for b in hits:
            lines.append(f"  FAIL  {b.line()}")
    return lines


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [cell.ljust(widths[i]) if i in LEFT_COLUMNS else cell.rjust(widths[i]) for i, cell in enumerate(row)]
        out.append("  ".join(cells).rstrip())
    return out


# --- JSON


def records(summary: Summary) -> list[dict[str, Any]]:
    out = []
    for row in summary.rows():
        record = row.record.to_dict()
        record["failure"] = row.failure
        record["cost_usd"] = row.cost
        record["cost_unknown"] = row.unpriced  # why a billed request has no cost; None when it has one, or is not billed
        out.append(record)
    return out


def json(summary: Summary, gate: Gate | None) -> str:
    body = summary.to_dict()
    body["gate"] = gate.to_dict() if gate is not None else None
    document = {"records": records(summary), "summary": body}
    try:
        return orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n"
    except TypeError:  # a lone surrogate (a "\ud800" escape in a recorded body), which only an escape can hold
        return _jsoncodec.dumps(document, fallback=True).decode() + "\n"


# --- Markdown


def markdown(summary: Summary, gate: Gate | None) -> str:
    """GitHub-flavoured Markdown: every block (blockquote, list, table, HTML) stands between blank lines, so
    none runs on into the next (a table straight after a blockquote would be read as its lazy continuation)."""
    arrow = " → "
    t = summary.totals
    lines = [
        "## trimflow audit",
        "",
        f"{for_markdown(counts_text(summary))}.  ",
        f"Inputs: {for_markdown(inputs_text(summary))}.  ",
        f"{for_markdown(mode_text(summary))}.",
        "",
    ]
    for w in warnings(summary, gate):
        lines += [f"> **Warning:** {for_markdown(w)}", ""]
    if gate is not None:
        lines += [f"### Gate: {'✅ passed' if gate.ok else '❌ failed'} ({for_markdown(gate_verdict(gate))})", ""]
        lines += [f"- ❌ {for_markdown(p.text)}" for p in gate.input_failures]
        for expr in gate.expressions:
            hits = gate.broken(expr)
            if not hits:
                lines.append(f"- ✅ {for_markdown_code(expr.text)}")
            for b in hits:
                lines.append(f"- ❌ {for_markdown_code(b.expression)}: {for_markdown(b.line().split(': ', 1)[1])}")
        lines.append("")
    lines += [
        "| | before | after | saved |",
        "|---|---:|---:|---:|",
        f"| body | {format_size(t.body_bytes_before)} | {format_size(t.body_bytes_after)} | "
        f"{format_size(t.body_bytes_saved)} ({percent(t.body_bytes_saved, t.body_bytes_before)}) |",
        f"| ~tokens | {tokens(t.est_tokens_before)} | {tokens(t.est_tokens_after)} | {tokens(t.est_tokens_saved)} |",
        f"| images | {t.images_before:,} | {t.images_after:,} | {t.images_before - t.images_after:,} |",
        "",
        f"Usage: {for_markdown(usage_text(t))} (prices: {for_markdown(summary.prices_source)}).",
        "",
    ]
    for conversation in summary.conversations:
        lines += [f"### Conversation {for_markdown_code(conversation.id)}", "", for_markdown(conversation_title(conversation)), ""]
        lines += [f"- {for_markdown(line)}" for line in growth_lines(conversation)]
        lines.append(f"- usage: {for_markdown(usage_text(conversation.totals))}")
        lines += [f"- {for_markdown(crossing_text(c, with_after=conversation.has_after))}" for c in conversation.crossings]
        if conversation.failures:
            lines.append(f"- failures: {for_markdown(failure_text(conversation))}")
        lines += [f"- note: {for_markdown(n)}" for n in notes(conversation)]
        lines += [
            "",
            "<details><summary>Turns</summary>",
            "",
            "| " + " | ".join(TURN_COLUMNS) + " |",
            "|" + "|".join("---" if i in LEFT_COLUMNS else "---:" for i in range(len(TURN_COLUMNS))) + "|",
        ]
        lines += ["| " + " | ".join(for_markdown_cell(c) for c in turn_cells(row, arrow)) + " |" for row in conversation.rows]
        lines += ["", "</details>", ""]
    return "\n".join(lines) + "\n"
