"""A dead session revived: each real agent CLI (the versions scripts/setup pins) makes a session of 16 screenshots
against the scripted fake provider with no trimflow in between, `scripts/repair` repairs it by its id, and the
CLI resumes it: the provider gets at most the cap and the CLI exits 0 with the model's answer.

Each CLI runs in a network namespace with loopback only (tests/e2e/agent_session.py). The tests skip without the
CLIs (scripts/setup --agent-clis installs them into .tools/) or without the namespaces they run in (root);
TRIMFLOW_REQUIRE_AGENT_CLIS=1, which .ci/run sets, makes either a failure.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from trimflow._limits import Limits
from trimflow._policy import count_pruned
from trimflow._rules_file import DEFAULT_RULES_PATH, load_rules

from .agent_session import CODEX_CONFIG, FINAL, PROMPT, ROOT, SIDE_TRAFFIC_OFF, TOOLS_BIN, require_agent, run_in, turns

pytestmark = pytest.mark.e2e

SHOTS = 16
CLAUDE_ENV = {"ANTHROPIC_API_KEY": "sk-ant-test-repair", "ANTHROPIC_BASE_URL": "{provider}", **SIDE_TRAFFIC_OFF}
# A provider of its own over HTTP: every turn sends the whole history (the built-in one would try a WebSocket first).
CODEX_PROVIDER = [
    "-c",
    'model_provider="fake"',
    "-c",
    'model_providers.fake={{name="fake", base_url="{provider}/v1", wire_api="responses", env_key="OPENAI_API_KEY", supports_websockets=false}}',
]
CODEX_ENV = {"OPENAI_API_KEY": "sk-test-repair", "CODEX_HOME": "{work}/codex"}
GEMINI_ENV = {"GEMINI_API_KEY": "AIza-test-repair", "GOOGLE_GEMINI_BASE_URL": "{provider}", "GEMINI_CLI_TRUST_WORKSPACE": "true"}
GEMINI_SETTINGS = '{"security": {"auth": {"selectedType": "gemini-api-key"}}, "privacy": {"usageStatisticsEnabled": false}}'
REPORT = re.compile(r"trimflow repair: (\S+): (Claude Code|Codex|Gemini CLI) session, images (\d+)->(\d+), file (.+) \(backup (\S+)\)")


def need(cli: str) -> None:
    require_agent(None if (TOOLS_BIN / cli).exists() else f"{cli} is not installed: scripts/setup --agent-clis (needs npm)")


def run_cli(work: Path, **session: Any) -> dict[str, Any]:
    """One CLI run in `work` (the same folder and home each time, as a user resumes in the folder they worked in)."""
    return run_in(work, shots=SHOTS, **session)


def repair(session_id: str, env: dict[str, str]) -> tuple[int, int, Path]:
    """`scripts/repair ID` as the user runs it; (images before, after, the file) from its line. The file shrank and
    its backup beside it is the file as the CLI left it."""
    done = subprocess.run([str(ROOT / "scripts" / "repair"), session_id], capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    found = REPORT.match(done.stdout)
    assert found is not None, done.stdout
    assert "iVBOR" not in done.stdout + done.stderr and PROMPT not in done.stdout + done.stderr
    path = Path(found[1])
    backup = Path(found[6])
    assert backup.parent == path.resolve().parent
    assert backup.stat().st_size > path.stat().st_size
    return int(found[3]), int(found[4]), path


def shipped_limits(model: str) -> Limits:
    return load_rules(DEFAULT_RULES_PATH).limits_for("", "", model)


def assert_resumed_within(result: dict[str, Any], made: dict[str, Any], cap: int, kept: int, newest: int) -> None:
    """Exit 0 with the model's answer; no turn over the cap; the first sends `kept` images, the `newest` screenshots."""
    output = f"stdout:\n{result['stdout'][-2000:]}\nstderr:\n{result['stderr'][-3000:]}"
    assert result["returncode"] == 0, output
    assert FINAL in result["stdout"], output
    resumed = turns(result)
    assert resumed and max(len(r["images"]) for r in resumed) <= cap
    assert len(resumed[0]["images"]) == kept
    assert set(resumed[0]["images"]) == set(made["shots"][-newest:])  # byte for byte


def test_a_claude_code_session_repaired_resumes_within_the_cap(tmp_path: Path) -> None:
    need("claude")
    work = tmp_path / "work"
    made = run_cli(work, command=["claude", "-p", PROMPT, "--allowedTools", "Read"], env=CLAUDE_ENV)
    assert made["returncode"] == 0 and len(turns(made)[-1]["images"]) == SHOTS  # no trimflow: every screenshot every turn
    (transcript,) = (work / "home" / ".claude" / "projects").glob("*/*.jsonl")
    before, after, repaired = repair(transcript.stem, {"HOME": str(work / "home")})
    kept = SHOTS - count_pruned(SHOTS, shipped_limits("claude-sonnet-4-5").at_low_water())  # down to the low-water mark
    assert (before, after, repaired) == (SHOTS, kept, transcript)
    resumed = run_cli(work, command=["claude", "-p", "--resume", transcript.stem, "continue", "--allowedTools", "Read"], env=CLAUDE_ENV)
    assert_resumed_within(resumed, made, cap=8, kept=kept, newest=kept)
    # Through the proxy from now on: the placeholders are the proxy's own, so nothing more is pruned.
    proxied = run_cli(work, launcher_args=[], command=["claude", "-p", "--resume", transcript.stem, "continue again"], env=CLAUDE_ENV)
    assert proxied["returncode"] == 0, proxied["stderr"][-3000:]
    summary = re.search(r"images sent (\d+), pruned (\d+)", proxied["stderr"])
    assert summary is not None and summary[2] == "0", proxied["stderr"][-3000:]


def test_a_codex_session_repaired_resumes_within_the_cap_and_codex_indexes_it_again(tmp_path: Path) -> None:
    need("codex")
    work = tmp_path / "work"
    files = {"codex/config.toml": CODEX_CONFIG}
    made = run_cli(work, command=["codex", *CODEX_PROVIDER, "exec", "--skip-git-repo-check", "-m", "gpt-5", "--", PROMPT], env=CODEX_ENV, files=files)
    assert made["returncode"] == 0 and len(turns(made)[-1]["images"]) == SHOTS
    (rollout,) = (work / "codex" / "sessions").rglob("rollout-*.jsonl")
    thread = orjson.loads(rollout.read_bytes().split(b"\n", 1)[0])["payload"]["id"]
    before, after, repaired = repair(thread, {"CODEX_HOME": str(work / "codex")})
    kept = SHOTS - count_pruned(SHOTS, shipped_limits("gpt-5").at_low_water())
    assert (before, after, repaired) == (SHOTS, kept, rollout)
    resume = ["codex", *CODEX_PROVIDER, "exec", "--skip-git-repo-check", "-m", "gpt-5", "resume", thread, "continue"]
    resumed = run_cli(work, command=resume, env=CODEX_ENV, files=files)
    assert_resumed_within(resumed, made, cap=8, kept=kept, newest=kept)
    # Codex read the repaired file into its thread index again: every turn's offsets lie within the file.
    (index,) = (work / "codex").glob("thread_history_*.sqlite")
    with contextlib.closing(sqlite3.connect(f"file:{index}?mode=ro", uri=True)) as connection:
        turn_ends = "SELECT rollout_end_byte_offset FROM thread_turns WHERE thread_id = ? ORDER BY rollout_ordinal"
        ends = connection.execute(turn_ends, (thread,)).fetchall()
        read = "SELECT next_rollout_byte_offset FROM thread_history_projection_state WHERE thread_id = ?"
        (read_to,) = connection.execute(read, (thread,)).fetchone()
    assert len(ends) == 2  # the first run's turn and the resumed one
    assert read_to == rollout.stat().st_size and ends[-1][0] == read_to


def test_a_gemini_cli_session_repaired_resumes_within_the_cap(tmp_path: Path) -> None:
    need("gemini")
    work = tmp_path / "work"
    files = {"home/.gemini/settings.json": GEMINI_SETTINGS}
    made = run_cli(work, command=["gemini", "-m", "gemini-2.5-flash", "-p", PROMPT], env=GEMINI_ENV, files=files)
    assert made["returncode"] == 0 and len(turns(made)[-1]["images"]) == SHOTS
    (chat,) = (work / "home" / ".gemini" / "tmp").glob("*/chats/session-*.jsonl")
    session_id = orjson.loads(chat.read_bytes().split(b"\n", 1)[0])["sessionId"]
    before, after, repaired = repair(session_id, {"HOME": str(work / "home")})
    # Resumed, Gemini CLI sends each tool's image twice (from the tool call and from the message after it): each first
    # copy shows the same screen as the image after it, so the shipped Gemini rule cuts those first, then the oldest,
    # down to its low-water mark: one copy each of as many of the newest screenshots.
    limits = shipped_limits("gemini-2.5-flash")
    assert limits.max_images is not None
    kept = 2 * SHOTS - count_pruned(2 * SHOTS, limits.at_low_water())
    assert (before, after, repaired) == (2 * SHOTS, kept, chat)
    resumed = run_cli(work, command=["gemini", "-m", "gemini-2.5-flash", "--resume", "latest", "-p", "continue"], env=GEMINI_ENV, files=files)
    assert_resumed_within(resumed, made, cap=limits.max_images, kept=kept, newest=kept)
