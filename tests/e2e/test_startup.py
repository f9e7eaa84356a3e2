"""A real mitmdump with the addon, started wrong: each mistake is one line, and mitmdump exits non-zero before
it says it is listening. Without the checks, a bool it cannot parse turned trimflow off silently, a misspelt
option was ignored, and a bad rules file printed a traceback after the proxy was already listening.
Bad patterns in a rules file are a warning, once, and the proxy runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..mitmdump import Mitmdump
from .helpers import start_wrong

pytestmark = pytest.mark.e2e

BOOL_HINT = "(--set trimflow_keep_memory=false; --set trimflow_keep_memory alone means true)"


@pytest.mark.parametrize(
    ("given", "line"),
    [
        ("trimflow_keep_memory=maybe", f"trimflow: trimflow_keep_memory must be true or false, not 'maybe' {BOOL_HINT}"),
        ("trimflow_keep_memory=False", f"trimflow: trimflow_keep_memory must be true or false, not 'False' {BOOL_HINT}"),
        ("trimflow_metrik=x.jsonl", "trimflow: unknown option trimflow_metrik; did you mean trimflow_metrics?"),
        ("trimflow-mode=observe", "trimflow: unknown option trimflow-mode; did you mean trimflow_mode?"),
        ("trimflow_mode=bogus", "trimflow: trimflow_mode must be one of enforce, observe, not 'bogus'"),
    ],
)
def test_a_bad_option_is_one_line_and_mitmdump_exits_before_listening(tmp_path: Path, given: str, line: str) -> None:
    code, lines = start_wrong(tmp_path, "--set", given)
    assert code != 0
    assert lines == [line]  # nothing else: no traceback, no "listening"


def test_a_bad_rules_file_is_its_file_line_problem_alone(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("defaults:\n  max_images: 4\nrules:\n  - name: gpt\n    max_image: 2\n")
    code, lines = start_wrong(tmp_path, "--set", f"trimflow_rules={rules}")
    assert code != 0
    assert lines == [f"trimflow: {rules}:5: unknown field 'max_image' in rule 'gpt'; did you mean 'max_images'?"]


def test_a_metrics_file_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    code, lines = start_wrong(tmp_path, "--set", f"trimflow_metrics={tmp_path}")
    assert code != 0
    # The rules load before the metrics option is checked: that info line comes first.
    assert [line for line in lines if "trimflow: rules from" not in line] == [f"trimflow: trimflow_metrics: cannot write {tmp_path}: Is a directory"]


def test_a_bad_value_in_config_yaml_is_caught_too(tmp_path: Path) -> None:
    (tmp_path / "confdir").mkdir()
    (tmp_path / "confdir" / "config.yaml").write_text("trimflow_keep_memory: maybe\n")
    code, lines = start_wrong(tmp_path)
    assert code != 0
    assert lines == [f"trimflow: trimflow_keep_memory must be true or false, not 'maybe' {BOOL_HINT}"]


def test_regex_looking_patterns_warn_once_and_the_proxy_runs(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text('defaults:\n  max_images: 4\nrules:\n  - name: gpt\n    match: {model: "^gpt-4o.*$"}\n    max_images: 2\n')
    proxy = Mitmdump(tmp_path, options={"trimflow_rules": str(rules)})
    with proxy:  # listening: the warning did not stop it
        pass
    warnings = [line for line in proxy.log().splitlines() if "regular expression" in line]
    assert len(warnings) == 1
    assert warnings[0].endswith(
        f"trimflow: {rules}:5: match.model of rule 'gpt' '^gpt-4o.*$' looks like a regular expression (starts with ^, ends with $, "
        "has .*); rules use globs, matched against the whole model name: write 'gpt-4o*'"
    )
