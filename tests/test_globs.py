"""trimflow._globs: a glob that looks like a regular expression (or has a '[' never closed) loads with a warning
naming the glob to write; one that means what it says gets none."""

import logging

import pytest

from trimflow._globs import regex_warning
from trimflow._rules_file import load_rules

from .rules_files import SHIPPED, load

# --- patterns that look like regular expressions ---------------------------------------------------------------


REGEX_RULES = """defaults:
  max_images: 8
rules:
  - name: gpt
    match:
      model: "^gpt-4o.*$"
    max_images: 2
  - name: claude
    match:
      model: ["claude-3.*", "/claude-.*/"]
    max_images: 3
  - name: bracket
    match:
      host: "api[.example.com"
      path: "^/v1/.*"
    max_images: 4
endpoints:
  - {path: "*/chat/completions", format: openai-chat, host: "^api\\\\.openai\\\\.com$"}
"""


def test_regex_looking_patterns_load_with_a_warning_naming_the_line_and_the_glob_to_write(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trimflow"):
        rules = load(tmp_path, REGEX_RULES)
    path = tmp_path / "rules.yaml"
    assert [r.getMessage() for r in caplog.records] == [f"trimflow: {w}" for w in rules.warnings]  # each logged once, at load
    assert rules.warnings == (
        f"{path}:6: match.model of rule 'gpt' '^gpt-4o.*$' looks like a regular expression (starts with ^, ends with $, has .*); "
        "rules use globs, matched against the whole model name: write 'gpt-4o*'",
        f"{path}:10: match.model of rule 'claude' '/claude-.*/' looks like a regular expression (is wrapped in /.../, has .*); "
        "rules use globs, matched against the whole model name: write 'claude-*'",
        f"{path}:14: match.host of rule 'bracket' 'api[.example.com' has a '[' that is never closed, which a glob matches as a "
        "literal '['; close the set, or write '[[]' for a literal '['",
        f"{path}:15: match.path of rule 'bracket' '^/v1/.*' looks like a regular expression (starts with ^, has .*); "
        "rules use globs, matched against the whole URL path: write '/v1/*'",
        f"{path}:18: endpoint host '^api\\.openai\\.com$' looks like a regular expression (starts with ^, ends with $, has \\.); "
        "rules use globs, matched against the whole host name: write 'api.openai.com'",
    )
    # Loaded as written: the globs match literally, as they would have without the warning.
    assert rules.limits_for("h", "/v1/chat/completions", "gpt-4o-mini").rule == "defaults"
    assert rules.limits_for("h", "/v1/chat/completions", "claude-3.5-sonnet").rule == "claude"  # claude-3.* is a glob


@pytest.mark.parametrize(
    ("glob", "key"),
    [
        ("*.openai.com", "host"),
        ("api.*.com", "host"),
        ("api.openai.*", "host"),
        ("gpt-4.*", "model"),
        ("[a-z]*-sonnet", "model"),
        ("claude-[0-9]*", "model"),
        ("gpt-[!4]*", "model"),
        ("*/v1/chat/completions", "path"),
        ("/v1/messages", "path"),
        ("*", "model"),
    ],
)
def test_globs_that_mean_what_they_say_get_no_warning(glob, key):
    assert regex_warning(glob, key) is None


@pytest.mark.parametrize(
    ("regex", "key", "glob"),
    [
        ("^gpt-4o", "model", "gpt-4o*"),
        ("openai.com$", "host", "*openai.com"),
        ("gpt-4\\d", "model", "gpt-4[0-9]"),
        ("claude-[0-9]+", "model", "claude-[0-9]*"),
        ("gpt-4o.+", "model", "gpt-4o?*"),
        ("^.*sonnet.*$", "model", "*sonnet*"),
    ],
)
def test_a_simple_regular_expression_gets_its_glob(regex, key, glob):
    warning = regex_warning(regex, key)
    assert warning is not None and warning.endswith(f": write '{glob}'")


def test_a_regular_expression_without_a_glob_spelling_is_told_to_be_rewritten():
    warning = regex_warning("(gpt|o1)-.*", "model")
    assert warning is not None and warning.endswith("(has .*, has |); rules use globs, matched against the whole model name: rewrite it as a glob")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_rules_have_no_pattern_warnings(path):
    assert load_rules(path).warnings == ()
