"""README.md and docs/: every relative link names a file that exists and, with a #fragment, a heading in it (as
GitHub makes anchors of headings), so a moved section or a renamed file shows here instead of as a dead link."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"```.*?```", re.S)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {anchor(m.group(1)) for m in re.finditer(r"^#+ (.*)$", page.read_text(encoding="utf-8"), re.MULTILINE)}


def test_anchors_are_made_as_github_makes_them() -> None:
    assert anchor("Computer use: the pixels a click refers to") == "computer-use-the-pixels-a-click-refers-to"
    assert anchor("An image's age") == "an-images-age"
    assert anchor("`scripts/run -- AGENT`") == "scriptsrun----agent"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for match in _LINK.finditer(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        target = match.group(1)
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, fragment = target.partition("#")
        destination = page.parent / path if path else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif fragment and destination.suffix == ".md" and fragment not in anchors(destination):
            broken.append(f"{target}: no such heading")
    assert broken == []
