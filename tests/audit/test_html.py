"""trimflow.audit._html: one self-contained page, a point per turn, the what-if drawn beside the recording, and
labels that never cover one another (measured in headless Chromium)."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import orjson

from trimflow._record import ENFORCE, Record
from trimflow.audit._html import LABEL_ASCENT, LABEL_HEIGHT, stack_labels

from ..browser import headless
from .helpers import audit, session, write_dump, write_rules


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.append((tag, dict(attrs)))


def test_html_is_self_contained_with_one_point_per_turn(recording, tmp_path, capsys) -> None:
    out_path = tmp_path / "report.html"
    code, out, _ = audit(capsys, recording, "--format", "html", "--out", out_path)
    assert code == 0 and out == ""
    page = out_path.read_text()
    parser = _Elements()
    parser.feed(page)
    circles = [attrs for tag, attrs in parser.tags if tag == "circle"]
    assert sorted(int(c["data-turn"]) for c in circles if c["data-series"] == "before") == sorted([1, 2, 3, 4, 5] * 2)
    assert not [c for c in circles if c["data-series"] == "after"]  # no rules: nothing to compare
    assert not re.search(r"\b(src|href)\s*=|url\(|@import|https?://", page)
    assert [a.get("class") for t, a in parser.tags if t == "line" and "limit" in (a.get("class") or "")]


def test_html_what_if_draws_both_series(recording, tmp_path, capsys) -> None:
    rules = write_rules(tmp_path / "rules.yaml", "defaults:\n  max_images: 2\n")
    _, page, _ = audit(capsys, recording, "--format", "html", "--rules", rules)
    parser = _Elements()
    parser.feed(page)
    after = [a for t, a in parser.tags if t == "circle" and a["data-series"] == "after"]
    assert [int(a["data-value"]) for a in after if a["data-label"].startswith("turn") and "images" in a["data-label"]] == [1, 2, 2, 2, 2]


# --- labels ---------------------------------------------------------------------------------------------------


def test_stacked_labels_keep_apart_and_inside() -> None:
    assert stack_labels([100, 200], 40, 210) == [100, 200]  # far apart: each at its line
    assert stack_labels([100, 101, 102], 40, 210) == [100, 100 + LABEL_HEIGHT, 100 + 2 * LABEL_HEIGHT]
    assert stack_labels([30, 31], 40, 210) == [40, 40 + LABEL_HEIGHT]  # none above the top
    assert stack_labels([205, 206], 40, 210) == [210 - LABEL_HEIGHT, 210]  # moved up from the bottom
    # Lines at 100 and 101: the first label sits above its line, the second goes below both instead of across one.
    assert stack_labels([96, 97], 40, 210, [100, 101]) == [96, 101 + LABEL_ASCENT + 1]


# Writes the box of every text of every chart into the chart, for --dump-dom to carry out.
_MEASURE = """<script>
document.querySelectorAll("svg.chart").forEach(function (svg) {
  var boxes = [];
  svg.querySelectorAll("text").forEach(function (text) {
    var r = text.getBoundingClientRect();
    boxes.push({cls: text.getAttribute("class") || "", text: text.textContent, left: r.left, top: r.top, right: r.right, bottom: r.bottom});
  });
  svg.setAttribute("data-boxes", JSON.stringify(boxes));
});
</script>"""


def text_boxes(page: Path, workdir: Path) -> dict[str, list[dict]]:
    """Per chart (by data-chart), the boxes of its texts as Chromium lays them out."""
    measured = workdir / "measured.html"
    measured.write_text(page.read_text().replace("</body>", _MEASURE + "</body>"))
    done = subprocess.run(
        headless(workdir / "profile", "--window-size=1400,1000", "--dump-dom", measured.resolve().as_uri()),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    parser = _Elements()
    parser.feed(done.stdout)
    charts = [attrs for tag, attrs in parser.tags if tag == "svg" and attrs.get("data-boxes")]
    assert charts, "the measuring script did not run"
    return {attrs["data-chart"]: json.loads(attrs["data-boxes"]) for attrs in charts}


def overlap(a: dict, b: dict) -> bool:
    return a["left"] < b["right"] and b["left"] < a["right"] and a["top"] < b["bottom"] and b["top"] < a["bottom"]


def test_limit_labels_of_close_limits_do_not_overlap_in_chromium(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", session(10))
    # Rules and two profiles whose limits sit a few pixels apart on the charts, and one far above them.
    rules = write_rules(tmp_path / "rules.yaml", "defaults:\n  max_images: 8\n  max_body_bytes: 600KB\n")
    answer = "    status: 413\n    content_type: text/plain\n    body: too big\n"
    profiles = write_rules(
        tmp_path / "profiles.yaml",
        "profiles:\n"
        f"  gateway-9:\n    max_images: 9\n    max_body_bytes: 610KB\n{answer}"
        f"  edge-16m:\n    max_images: 10\n    max_body_bytes: 16MB\n{answer}",
    )
    page = tmp_path / "report.html"
    code, _, err = audit(
        capsys, dump, "--rules", rules, "--profiles", profiles, "--profile", "gateway-9", "--profile", "edge-16m", "--format", "html", "--out", page
    )
    assert code == 0, err
    parser = _Elements()
    parser.feed(page.read_text())
    lines: dict[str, list[float]] = {}
    for tag, attrs in parser.tags:
        if tag == "svg":
            chart = lines.setdefault(attrs["data-chart"], [])
        elif tag == "line" and attrs.get("class") == "limit":
            chart.append(float(attrs["y1"]))
    # The control: each chart's limit lines are closer than a label is tall, so labels at their lines would collide.
    assert {name: len(ys) for name, ys in lines.items()} == {"body": 2, "images": 3}  # 16MB is far above the body chart
    assert all(max(abs(a - b) for a, b in itertools.pairwise(ys)) < LABEL_HEIGHT for ys in lines.values())
    for chart, texts in text_boxes(page, tmp_path).items():
        labels = [t for t in texts if t["cls"] == "limit-label"]
        assert len(labels) == 3, (chart, labels)  # the body chart's third says which limit is above it
        assert all(t["bottom"] - t["top"] < LABEL_HEIGHT for t in labels)
        for i, a in enumerate(texts):
            for b in texts[i + 1 :]:
                assert not overlap(a, b), (chart, a, b)


# --- the turn table ----------------------------------------------------------------------------------------------

# Writes each turn table's width and its section's (the card it sits in) into the page, for --dump-dom to carry out.
_MEASURE_TABLES = """<script>
document.documentElement.setAttribute("data-tables", JSON.stringify(Array.prototype.map.call(
  document.querySelectorAll("details table"),
  function (t) { return {table: t.scrollWidth, details: t.parentElement.clientWidth, section: t.closest("section").clientWidth}; })));
</script>"""


def wide_records(turns: int) -> bytes:
    """Metrics lines whose every turn-table cell is as wide as real ones get: a long Bedrock model id, hundreds of
    images, bodies of a hundred MB and more, seven-digit token counts, every prune cause, a failure."""
    lines = []
    for turn in range(1, turns + 1):
        r = Record(
            ts=f"2026-12-07T10:00:{turn:02d}.000Z",
            conversation="c0ffee00",
            turn=turn,
            host="bedrock-runtime.us-east-1.amazonaws.com",
            path="/model/m/converse",
            format="bedrock-converse",
            model="us.anthropic.claude-sonnet-4-5-20250929-v1:0",
            rule="defaults",
            mode=ENFORCE,
            segment=1,
        )
        r.images_before, r.images_after, r.pruned = 120 + turn, 20, 100 + turn
        r.pruned_for_count, r.pruned_for_body, r.pruned_for_tokens, r.pruned_for_image_limit = 50, 30, 20, 1
        r.shrunk, r.thinned, r.deduplicated = 3, 2, 1
        r.media_bytes_before, r.media_bytes_after, r.body_bytes_before, r.body_bytes_after = 157_000_000, 20_000_000, 158_000_000, 21_000_000
        r.est_tokens_before, r.est_tokens_after = 1_234_567, 123_456
        r.status = 400 if turn == 5 else 200
        r.usage_input_tokens, r.usage_cache_read_tokens, r.usage_cache_write_tokens, r.usage_output_tokens = 1_234_567, 1_000_000, 234_000, 12_345
        lines.append(orjson.dumps(r.to_dict()))
    return b"\n".join(lines) + b"\n"


def test_the_turn_table_fits_its_card_at_1400_px_in_chromium(tmp_path, capsys) -> None:
    records = tmp_path / "metrics.jsonl"
    records.write_bytes(wide_records(12))
    page = tmp_path / "report.html"
    code, _, err = audit(capsys, records, "--format", "html", "--out", page)
    assert code == 0, err
    measured = tmp_path / "measured.html"
    measured.write_text(page.read_text().replace("</body>", _MEASURE_TABLES + "</body>"))
    done = subprocess.run(
        headless(tmp_path / "profile", "--window-size=1400,1000", "--dump-dom", measured.resolve().as_uri()),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'data-tables="([^"]*)"', done.stdout)
    assert found, "the measuring script did not run"
    (table,) = json.loads(found.group(1).replace("&quot;", '"'))
    assert table["table"] <= table["details"] <= table["section"], table
