"""trimflow.audit._escape: text from a recording made safe for a terminal or CI log, Markdown and HTML, checked on
named attacks and on random text (Hypothesis), Markdown as markdown-it-py renders GitHub's flavour."""

from __future__ import annotations

import html
import re
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimflow._text import for_text
from trimflow.audit._escape import for_html, for_markdown, for_markdown_cell, for_markdown_code

from .helpers import markdown_html

# Characters chosen to hit every rule: controls, separators, bidi, Markdown's punctuation, the runner's prefixes.
ATTACK_ALPHABET = st.sampled_from(
    list("\n\r\t\x00\x07\x1b\x7f\x85\x9b\u2028\u2029\u202e\u2066\u200b\ufeff")
    + list("\\`*_[]()<>|#&~$!:@.-+=0123456789 ")
    + ["::", "##[", "www.", "https://", "mailto:", "&amp;", "<b>", "```", "---", "1. ", "> ", "# ", "a", "é", "日本"]
)
ATTACK = st.lists(ATTACK_ALPHABET, max_size=24).map("".join)
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\u200b-\u200f\ufeff]")


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("gpt-4o\n::error title=x::y", "gpt-4o\\n::error title=x::y"),
        ("::add-mask::secret", "\\x3a:add-mask::secret"),
        ("  ::warning::x", "  \\x3a:warning::x"),
        ("a ##[error]b", "a #\\x23[error]b"),
        ("\x1b[2J\x1b]0;title\x07", "\\x1b[2J\\x1b]0;title\\x07"),
        ("abc\u202etxt.exe", "abc\\u202etxt.exe"),
        ("line\u2028next\u2029", "line\\u2028next\\u2029"),
        ("lone \ud800", "lone \\ud800"),
        ("tag \U000e0041", "tag \\U000e0041"),
        ("C:\\runs\\a.mitm · claude-sonnet-4-5 → ok", "C:\\runs\\a.mitm · claude-sonnet-4-5 → ok"),
    ],
)
def test_text_shows_controls_and_runner_commands_as_visible_escapes(value: str, shown: str) -> None:
    assert for_text(value) == shown


@settings(max_examples=300, deadline=None)
@given(ATTACK)
def test_text_is_one_inert_line_and_escaping_it_again_changes_nothing(value: str) -> None:
    shown = for_text(value)
    assert not _UNSAFE.search(shown)
    assert not shown.lstrip().startswith("::") and "##[" not in shown
    assert for_text(shown) == shown
    shown.encode("utf-8")  # no lone surrogate left to fail the write


def rendered_text(markdown: str) -> tuple[list[str], str]:
    """The tags markdown-it-py makes of `markdown`, and the text a reader sees."""
    out = markdown_html(markdown)
    return re.findall(r"<(\w+)", out), html.unescape(re.sub(r"<[^>]*>", "", out))


@pytest.mark.parametrize(
    "value",
    [
        "## heading",
        "# h1 \\# h2",
        "- item",
        "+ item",
        "* item",
        "1. first",
        "12) twelfth",
        "> quote",
        "---",
        "===",
        "[link](https://evil.example)",
        "![img](x.png)",
        "<img src=x onerror=alert(1)>",
        "<https://evil.example>",
        "`code` and ``more``",
        "**bold** _em_ *em* ~~strike~~",
        "a | b | c",
        "&lt;script&gt; &amp; &#60;",
        "$x^2$ and $$y$$",
        "\\ backslash \\\\",
        "    four spaces",
        "::error::x",
    ],
)
def test_markdown_renders_the_value_as_its_own_text(value: str) -> None:
    tags, text = rendered_text(for_markdown(value))
    assert tags == ["p"], tags
    assert text.strip() == value.strip()


@settings(max_examples=300, deadline=None)
@given(ATTACK)
def test_markdown_of_any_text_is_one_paragraph_showing_that_text(value: str) -> None:
    shown = for_text_controls(value)
    tags, text = rendered_text("x " + for_markdown(value))  # after fixed text, as the reports put it
    assert set(tags) <= {"p"}, (value, tags)
    assert text.strip() == ("x " + shown).strip(), (value, text)
    tags, text = rendered_text(for_markdown(value) + "\n")  # at the start of a line
    assert set(tags) <= {"p"}, (value, tags)
    assert text.strip() == shown.strip(), (value, text)


def for_text_controls(value: str) -> str:
    """What the Markdown shows of a value: its control characters as for_text writes them, nothing else changed."""
    return "".join(
        for_text(c) if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs") else c
        for c in value  # each alone: a lone control character is never a "::" or "##[" of its own
    )


def test_a_table_cell_keeps_its_row() -> None:
    row = "| " + " | ".join(for_markdown_cell(v) for v in ["a | b", "-", "`x|y`", "<b>z</b>"]) + " |"
    out = markdown_html("| 1 | 2 | 3 | 4 |\n|---|---|---|---|\n" + row + "\n")
    cells = re.findall(r"<td>(.*?)</td>", out)
    assert [html.unescape(c) for c in cells] == ["a | b", "-", "`x|y`", "<b>z</b>"]


def test_a_code_span_only_for_a_value_it_can_hold() -> None:
    assert for_markdown_code("a8558df8") == "`a8558df8`"
    assert for_markdown_code("images>8") == "`images>8`"
    for value in ["a`b", "a|b", "c0ffee\n## x", " padded"]:
        tags, text = rendered_text(for_markdown_code(value))
        assert tags == ["p"] and text.strip() == for_text_controls(value).strip()


def test_html_escapes_markup_and_shows_controls() -> None:
    assert for_html("<img src=\"x\" onerror='a'>&\x1b") == "&lt;img src=&quot;x&quot; onerror=&#x27;a&#x27;&gt;&amp;\\x1b"
