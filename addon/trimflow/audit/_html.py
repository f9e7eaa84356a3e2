"""The audit as one self-contained HTML page: charts of body size and image count per turn, before and
after pruning, with the limits drawn. Inline SVG made here, inline CSS and a few lines of inline JS
(hover readout); no external asset of any kind, so the page reads the same offline. Every text in it,
content or attribute, goes through _escape.for_html: a recording's names never become markup.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from .._human import format_size
from ._escape import for_html as escape
from ._gate import Gate
from ._read import Row
from ._report import (
    LEFT_COLUMNS,
    TURN_COLUMNS,
    cache_parts,
    conversation_title,
    cost_text,
    counts_text,
    crossing_text,
    failure_text,
    gate_verdict,
    growth_lines,
    inputs_text,
    mode_text,
    money,
    notes,
    percent,
    tokens,
    turn_cells,
    usage_text,
    warnings,
)
from ._summary import WITHOUT_METHOD, Conversation, Summary, Totals

WIDTH, HEIGHT = 560, 250
LEFT, RIGHT, TOP, BOTTOM = 62, 18, 44, 34
LABEL_HEIGHT = 14  # an 11px label's box (about 13px) and a pixel to spare: stacked labels are this far apart
LABEL_ASCENT, LABEL_DESCENT = 11, 3  # how far an 11px label's box reaches above and below its baseline
ABOVE_BASELINE = TOP - 12  # the line naming the limits above the chart, under the title

_CSS = """
:root { --fg:#1d2430; --muted:#5b6575; --line:#d8dde5; --before:#2563c9; --after:#e07a10; --limit:#c62828; --ok:#1b7f3b; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); margin: 0; background: #f5f6f8; }
main { max-width: 1320px; margin: 0 auto; padding: 20px 24px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 0 0 2px; } h3 { font-size: 15px; margin: 16px 0 6px; }
p { margin: 4px 0; } .muted { color: var(--muted); } code { font: 13px ui-monospace, SFMono-Regular, Menlo, monospace; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; margin: 14px 0; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; min-width: 170px; }
.card b { display: block; font-size: 18px; }
.gate { background: #fff; border: 1px solid var(--line); border-left: 5px solid var(--ok); border-radius: 8px; padding: 8px 14px; margin: 12px 0; }
.gate.fail { border-left-color: var(--limit); } .gate li.fail { color: var(--limit); }
.warn { background: #fff4e5; border: 1px solid #f0c36d; border-radius: 8px; padding: 6px 12px; margin: 8px 0; }
section { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 14px 16px; margin: 16px 0; }
ul.facts { margin: 6px 0 0; padding-left: 18px; }
.charts { display: flex; gap: 12px; flex-wrap: wrap; margin-top: 10px; }
svg.chart { background: #fff; border: 1px solid var(--line); border-radius: 6px; max-width: 100%; height: auto; }
svg text { font: 11px system-ui, sans-serif; fill: var(--muted); } svg .title { font-size: 12px; font-weight: 600; fill: var(--fg); }
.grid { stroke: #eceff3; } .axis { stroke: #9aa3b0; }
.series { fill: none; stroke-width: 2; } .series.before { stroke: var(--before); } .series.after { stroke: var(--after); stroke-dasharray: 6 4; }
circle.pt { stroke: #fff; stroke-width: 1; } circle.before { fill: var(--before); } circle.after { fill: var(--after); }
circle.pt:hover, circle.pt.hl { r: 5; }
.limit { stroke: var(--limit); stroke-width: 1.5; stroke-dasharray: 3 3; }
text.limit-label { fill: var(--limit); paint-order: stroke; stroke: #fff; stroke-width: 3px; stroke-linejoin: round; }
.failure { stroke: var(--limit); stroke-width: 6; stroke-opacity: .15; }
.key-before { fill: var(--before); } .key-after { fill: var(--after); }
.readout { min-height: 1.45em; color: var(--muted); font-variant-numeric: tabular-nums; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; margin-top: 6px; width: 100%; font-size: 13px; }
th, td { padding: 3px 5px; border-bottom: 1px solid #eceff3; text-align: right; vertical-align: top; }
th { color: var(--muted); font-weight: 600; } td.l, th.l { text-align: left; }
tr.hl td { background: #fff3c4; } tr.failed td { color: var(--limit); }
details summary { cursor: pointer; color: var(--muted); margin-top: 8px; }
"""

# Hover a point: highlight that turn in both charts and the table, and say its figures.
_JS = """
(function () {
  var points = document.querySelectorAll("circle.pt");
  function mark(section, turn, on) {
    section.querySelectorAll('[data-turn="' + turn + '"]').forEach(function (el) { el.classList.toggle("hl", on); });
  }
  points.forEach(function (pt) {
    var section = pt.closest("section");
    var readout = section.querySelector(".readout");
    pt.addEventListener("mouseenter", function () { mark(section, pt.dataset.turn, true); readout.textContent = pt.dataset.label; });
    pt.addEventListener("mouseleave", function () { mark(section, pt.dataset.turn, false); });
  });
  document.documentElement.dataset.points = String(points.length);
  document.documentElement.dataset.ready = "1";
})();
"""


def html(summary: Summary, gate: Gate | None) -> str:
    t = summary.totals
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>trimflow audit</title>",
        f"<style>{_CSS}</style></head><body><main>",
        "<h1>trimflow audit</h1>",
        f'<p class="muted">{escape(counts_text(summary))}</p>',
        f'<p class="muted">inputs: {escape(inputs_text(summary))}</p>',
        f'<p class="muted">{escape(mode_text(summary))}</p>',
    ]
    parts += [f'<p class="warn">{escape(w)}</p>' for w in warnings(summary, gate)]
    if gate is not None:
        parts.append(_gate(gate))
    parts += [
        '<div class="cards">',
        _card(
            "body",
            f"{format_size(t.body_bytes_before)} → {format_size(t.body_bytes_after)}",
            f"saved {format_size(t.body_bytes_saved)} ({percent(t.body_bytes_saved, t.body_bytes_before)})",
        ),
        _card("estimated tokens", f"{tokens(t.est_tokens_before)} → {tokens(t.est_tokens_after)}", f"saved {tokens(t.est_tokens_saved)}"),
        _card("images", f"{t.images_before:,} → {t.images_after:,}", f"{t.pruned:,} pruned"),
        _card("requests", f"{t.requests:,}", f"{len(summary.conversations)} conversations"),
        _card("cost", cost_text(t) if t.cost_usd is not None else "unknown", _cache_note(t)),
    ]
    without = t.cost_without_usd
    if without is not None and t.cost_usd is not None:
        parts.append(_card("without trimflow (estimated)", money(without), _saved(without, t.cost_usd)))
    parts += [
        "</div>",
        f'<p class="muted">usage: {escape(usage_text(t))} (prices: {escape(summary.prices_source)})</p>',
    ]
    if without is not None:
        parts.append(f'<p class="muted">without trimflow: {escape(WITHOUT_METHOD)}.</p>')
    for conversation in summary.conversations:
        parts.append(_section(conversation))
    parts.append(f"<script>{_JS}</script></main></body></html>")
    return "\n".join(parts) + "\n"


def _saved(without: float, cost: float) -> str:
    """What trimflow saved against the estimate of the same requests without it (or what it cost more)."""
    if without > cost:
        return f"{money(without - cost)} more than with trimflow ({percent(round((without - cost) * 1e6), round(without * 1e6))} saved)"
    return f"{money(cost - without)} less than with trimflow"


def _card(label: str, value: str, note: str) -> str:
    return f'<div class="card"><span class="muted">{escape(label)}</span><b>{escape(value)}</b><span class="muted">{escape(note)}</span></div>'


def _gate(gate: Gate) -> str:
    items = [f'<li class="fail">FAIL {escape(p.text)}</li>' for p in gate.input_failures]
    for expr in gate.expressions:
        hits = gate.broken(expr)
        if not hits:
            items.append(f"<li>ok <code>{escape(expr.text)}</code></li>")
        items += [f'<li class="fail">FAIL <code>{escape(b.expression)}</code>: {escape(b.line().split(": ", 1)[1])}</li>' for b in hits]
    verdict = "passed" if gate.ok else "failed"
    return (
        f'<div class="gate{"" if gate.ok else " fail"}"><b>Gate {verdict}</b> <span class="muted">({escape(gate_verdict(gate))})</span>'
        f"<ul>{''.join(items)}</ul></div>"
    )


def _section(conversation: Conversation) -> str:
    facts = growth_lines(conversation) + [f"usage: {usage_text(conversation.totals)}"]
    facts += [crossing_text(c, with_after=conversation.has_after) for c in conversation.crossings]
    if conversation.failures:
        facts.append(f"failures: {failure_text(conversation)}")
    facts += [f"note: {n}" for n in notes(conversation)]
    out = [
        f'<section data-conversation="{escape(conversation.id)}" data-turns="{conversation.turns}">',
        f"<h2>Conversation <code>{escape(conversation.id)}</code></h2>",
        f'<p class="muted">{escape(conversation_title(conversation))}</p>',
        '<ul class="facts">' + "".join(f"<li>{escape(f)}</li>" for f in facts) + "</ul>",
    ]
    numbered = [row for row in conversation.rows if row.record.turn is not None]
    if numbered:
        with_after = conversation.has_after

        def limits(name: str, show: Callable[[int], str]) -> list[tuple[int, str]]:
            """(value, label) per distinct limit value: a rule and a profile often agree."""
            sources: dict[int, list[str]] = {}
            for c in conversation.crossings:
                if c.limit == name:
                    sources.setdefault(c.value, []).append(c.source)
            return [(value, f"{show(value)} ({', '.join(names)})") for value, names in sources.items()]

        out += [
            '<div class="charts">',
            _chart(
                "Body size per turn",
                "body",
                numbered,
                lambda r: r.record.body_bytes_before,
                lambda r: r.record.body_bytes_after,
                limits("max_body_bytes", format_size),
                format_size,
                with_after,
            ),
            _chart(
                "Images per turn",
                "images",
                numbered,
                lambda r: r.record.images_before,
                lambda r: r.record.images_after,
                limits("max_images", str),
                str,
                with_after,
            ),
            "</div>",
            '<p class="readout">Hover a point for its figures.</p>',
        ]
    out.append(_table(conversation))
    out.append("</section>")
    return "\n".join(out)


def _cache_note(t: Totals) -> str:
    if not t.usage_requests:
        return "no usage reported"
    parts = cache_parts(t, read="cache read")
    return " · ".join(parts) or f"{t.input_tokens:,} tokens in"


# A figure's before and after: a narrow column breaks after the arrow, never before it.
_ARROW = "\u00a0→ "


def _table(conversation: Conversation) -> str:
    left = LEFT_COLUMNS
    head = "".join(f'<th class="{"l" if i in left else ""}">{escape(c)}</th>' for i, c in enumerate(TURN_COLUMNS))
    rows = []
    for row in conversation.rows:
        cells = "".join(f'<td class="{"l" if i in left else ""}">{escape(c)}</td>' for i, c in enumerate(turn_cells(row, _ARROW)))
        turn = row.record.turn if row.record.turn is not None else ""
        failed = ' class="failed"' if row.failure else ""
        rows.append(f'<tr data-turn="{turn}"{failed}>{cells}</tr>')
    opened = " open" if conversation.turns <= 30 else ""
    return f"<details{opened}><summary>Turns ({conversation.turns})</summary><table><tr>{head}</tr>{''.join(rows)}</table></details>"


def _chart(
    title: str,
    kind: str,
    rows: list[Row],
    before: Callable[[Row], int],
    after: Callable[[Row], int],
    limits: list[tuple[int, str]],
    show: Callable[[int], str],
    with_after: bool,
) -> str:
    """One chart; the after-pruning series only when some request has after figures of its own."""
    turns = [row.record.turn or 0 for row in rows]
    first, last = min(turns), max(turns)
    highest = max(max(before(r) for r in rows), max(after(r) for r in rows), 1)
    # Draw a limit inside the chart when it is near the data; far above, a label says where it is.
    limit_name = "max_body_bytes" if kind == "body" else "max_images"
    on_chart = [(f"{limit_name} {label}", value) for value, label in limits if value <= highest * 2.5]
    above = [label for value, label in limits if value > highest * 2.5]
    binary = kind == "body"
    top, unit = _nice_top(max([highest] + [value for _, value in on_chart]), binary=binary)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(turn: int) -> float:
        return LEFT + (plot_w / 2 if last == first else (turn - first) / (last - first) * plot_w)

    def y(value: float) -> float:
        return TOP + plot_h - value / top * plot_h

    svg = [
        f'<svg class="chart" data-chart="{kind}" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'role="img" aria-label="{escape(title)}">',
        f'<text class="title" x="{LEFT}" y="16">{escape(title)}</text>',
        f'<rect class="key-before" x="{WIDTH - 250}" y="8" width="12" height="4"/><text x="{WIDTH - 234}" y="14">as recorded</text>',
    ]
    if with_after:
        svg.append(f'<rect class="key-after" x="{WIDTH - 150}" y="8" width="12" height="4"/><text x="{WIDTH - 134}" y="14">after pruning</text>')
    series_list = (("before", before), ("after", after)) if with_after else (("before", before),)
    for i in range(5):
        value = top * i / 4
        svg.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(value):.1f}" y2="{y(value):.1f}"/>')
        svg.append(f'<text x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{_axis_label(value, unit, binary)}</text>')
    svg.append(f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + plot_h}" y2="{TOP + plot_h}"/>')
    step = max(1, math.ceil((last - first + 1) / 10))
    for tick in range(first, last + 1, step):
        svg.append(f'<text x="{x(tick):.1f}" y="{TOP + plot_h + 15}" text-anchor="middle">{tick}</text>')
    svg.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 4}" text-anchor="middle">turn</text>')
    for row in rows:
        if row.failure:
            tx = x(row.record.turn or 0)
            svg.append(
                f'<line class="failure" x1="{tx:.1f}" x2="{tx:.1f}" y1="{TOP}" y2="{TOP + plot_h}">'
                f"<title>turn {row.record.turn}: {escape(row.failure)}</title></line>"
            )
    on_chart.sort(key=lambda item: -item[1])  # top to bottom
    for _, value in on_chart:
        svg.append(f'<line class="limit" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(value):.1f}" y2="{y(value):.1f}"/>')
    if above:
        svg.append(f'<text class="limit-label" x="{LEFT}" y="{ABOVE_BASELINE}">{escape("limits above the chart: " + ", ".join(above))}</text>')
    # At the left (a growing conversation's points are low there), just above each line, stacked apart where lines are close.
    lowest = ABOVE_BASELINE + LABEL_HEIGHT if above else TOP - 4
    baselines = stack_labels([y(value) - 4 for _, value in on_chart], lowest, TOP + plot_h - 3, [y(value) for _, value in on_chart])
    for (label, _), baseline in zip(on_chart, baselines, strict=True):
        svg.append(f'<text class="limit-label" x="{LEFT + 4}" y="{baseline:.1f}">{escape(label)}</text>')
    for series, metric in series_list:
        points = " ".join(f"{x(r.record.turn or 0):.1f},{y(metric(r)):.1f}" for r in rows)
        svg.append(f'<polyline class="series {series}" points="{points}"/>')
    for series, metric in reversed(series_list):  # before drawn last, on top: it is the recording
        for row in rows:
            turn = row.record.turn
            label = f"turn {turn}: {kind} {show(before(row))}" + (f" → {show(after(row))} after pruning" if after(row) != before(row) else "")
            svg.append(
                f'<circle class="pt {series}" data-series="{series}" data-turn="{turn}" data-value="{metric(row)}" '
                f'data-label="{escape(label)}" cx="{x(turn or 0):.1f}" cy="{y(metric(row)):.1f}" r="3">'
                f"<title>{escape(label)}</title></circle>"
            )
    svg.append("</svg>")
    return "\n".join(svg)


def stack_labels(wanted: list[float], top: float, bottom: float, lines: Sequence[float] = ()) -> list[float]:
    """Baselines for labels in one column, wanted top to bottom: each as near its wanted baseline as its
    neighbours allow, LABEL_HEIGHT apart, not across one of `lines` (a label pushed off its own line goes
    below the next one instead), none above `top` and, room permitting, none below `bottom`."""
    out: list[float] = []
    for baseline in wanted:
        baseline = max(baseline, top, out[-1] + LABEL_HEIGHT if out else top)
        crossing = [y for y in lines if baseline - LABEL_ASCENT < y < baseline + LABEL_DESCENT]
        while crossing:
            baseline = max(crossing) + LABEL_ASCENT + 1
            crossing = [y for y in lines if baseline - LABEL_ASCENT < y < baseline + LABEL_DESCENT]
        out.append(baseline)
    for i in range(len(out) - 1, -1, -1):  # pushed past the bottom: move the stack up
        out[i] = min(out[i], bottom if i == len(out) - 1 else out[i + 1] - LABEL_HEIGHT)
    return out


def _nice_top(value: float, *, binary: bool) -> tuple[float, int]:
    """A round axis top at or above `value` in 4 even steps, and the unit of its labels: steps of
    1, 2, 2.5 or 5 times a power of ten, in bytes' binary units (KB, MB, ...) for sizes, whole for counts."""
    unit = 1024 ** min(3, max(0, math.floor(math.log(max(value, 1), 1024)))) if binary else 1
    raw = max(value / unit, 1) / 4
    magnitude = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        step = factor * magnitude
        if step >= raw and (binary or step == int(step)):
            return step * 4 * unit, unit
    return math.ceil(raw) * 4 * unit, unit


_UNIT_NAMES = {1: "B", 1024: "KB", 1024**2: "MB", 1024**3: "GB"}


def _axis_label(value: float, unit: int, binary: bool) -> str:
    if not binary:
        return f"{value:g}"
    return f"{value / unit:g}{_UNIT_NAMES[unit]}" if value else "0"
