"""trimflow.cli._exit_summary: the lines printed at exit, read back from a metrics JSONL by the audit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson

from trimflow import load_rules, prune_request
from trimflow._rules_file import DEFAULT_RULES_PATH
from trimflow.cli._exit_summary import summary
from trimflow.testing import PATHS, image, session_body


def records(turns: int, usage: int) -> list[bytes]:
    """Metrics lines of an OpenAI chat session of `turns` turns pruned by the default rules, each answered with `usage` tokens."""
    rules = load_rules(DEFAULT_RULES_PATH)
    shot = image(64, 48, "PNG", seed=1)
    lines = []
    for turn in range(1, turns + 1):
        body = orjson.dumps(session_body("openai-chat", turn, shot, "image/png"))
        record = prune_request(f"https://api.openai.com{PATHS['openai-chat']}", {}, body, rules).record
        assert record is not None
        record = dataclasses.replace(record, status=200, usage_input_tokens=usage, conversation="c0ffee00", turn=turn)
        lines.append(orjson.dumps(record.to_dict()) + b"\n")
    return lines


def test_the_summary_counts_this_runs_records_only(tmp_path: Path) -> None:
    metrics, log = tmp_path / "mine.jsonl", tmp_path / "run.log"
    earlier, ours = records(3, 1000), records(10, 500)
    metrics.write_bytes(b"".join(earlier + ours))
    lines = summary(metrics, len(b"".join(earlier)), "python", 0, log)
    assert lines[0] == "trimflow: python exited 0; 10 LLM requests in 1 conversation through trimflow"
    conversation = lines[1]
    assert "conversation c0ffee00 (openai-chat, " in conversation and "10 turns, 10 requests" in conversation
    sent = sum(orjson.loads(line)["images_after"] for line in ours)
    pruned = sum(orjson.loads(line)["pruned"] for line in ours)
    assert pruned > 0 and sent + pruned == sum(range(1, 11))  # turn N sends N screenshots
    assert f"images sent {sent}, pruned {pruned}" in conversation and "reported in 5,000" in conversation
    assert lines[-1].startswith(f"trimflow: every turn: scripts/audit {metrics}")
    assert not (tmp_path / "run.jsonl").exists()  # the slice it read is gone


def test_a_run_with_no_llm_request_says_so(tmp_path: Path) -> None:
    lines = summary(tmp_path / "none.jsonl", 0, "true", 3, tmp_path / "run.log")
    assert lines == [f"trimflow: true exited 3; no LLM request went through trimflow (proxy log: {tmp_path / 'run.log'})"]
