"""trimflow.audit._html: one self-contained page, a point per turn, and the what-if drawn beside the recording."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from .helpers import audit, write_rules


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
