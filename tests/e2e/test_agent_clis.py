"""The real agent CLIs behind trimflow: Claude Code, Codex and Gemini CLI at the versions scripts/setup pins, each
in a network namespace with loopback only, against the fake provider playing a model that has the CLI look at a
new screenshot with its own image tool each turn and then answers a final text (tests/e2e/agent_session.py).

Through `scripts/run -- <cli>` (python -m trimflow run -- <cli>): the CLI exits 0 with the final text, the provider
never holds more images than the shipped cap, the newest screenshot arrives byte for byte, and the summary's
figures are what the provider received; with send-once on, Claude Code and Codex send each screenshot once, through
the fake provider's Files API, and by reference on every turn. By hand (the README's recipes): the same CLI pointed at a proxy started on
its own; for Codex with trimflow_websocket=refuse, which it answers by going to HTTP at once.

They skip without the CLIs (scripts/setup --agent-clis installs them into .tools/) or without `unshare -n` (root);
TRIMFLOW_REQUIRE_AGENT_CLIS=1, which .ci/run sets, makes either a failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .agent_session import (
    CODEX_CONFIG,
    FINAL,
    PACKAGES,
    PROMPT,
    ROOT,
    SIDE_TRAFFIC_OFF,
    assert_summary_is_what_the_provider_received,
    launcher_records,
    need,
    npm_pins,
    run_session,
    turns,
)

pytestmark = pytest.mark.e2e

CLAUDE_ENV = {"ANTHROPIC_API_KEY": "sk-ant-test-agent-cli", **SIDE_TRAFFIC_OFF}
CODEX_ENV = {"OPENAI_API_KEY": "sk-test-agent-cli", "CODEX_HOME": "{work}/codex"}
# gpt-5 (a model Codex has no metadata for): its tools come as functions, view_image among them.
CODEX_EXEC = ["exec", "--skip-git-repo-check", "-m", "gpt-5", "--", PROMPT]
GEMINI_ENV = {"GEMINI_API_KEY": "AIza-test-agent-cli", "GEMINI_CLI_TRUST_WORKSPACE": "true"}
GEMINI_SETTINGS = '{"privacy": {"usageStatisticsEnabled": false}}'
# A model named, so no routing classifier runs before each turn.
GEMINI_ARGS = ["-m", "gemini-2.5-flash", "-p", PROMPT]


def assert_capped_session(result: dict[str, Any], cap: int) -> None:
    """Exit 0 with the final text; every turn the provider got within the cap, and pruning did happen; the
    newest screenshot of the last turn as the file holds it."""
    output = f"stdout:\n{result['stdout'][-2000:]}\nstderr:\n{result['stderr'][-3000:]}"
    assert result["returncode"] == 0, output
    assert FINAL in result["stdout"], output
    llm = turns(result)
    assert result["tool_calls"] == len(result["shots"])  # every screenshot was asked for, and read
    assert max(len(r["images"]) for r in llm) <= cap
    assert len(llm[-1]["images"]) < len(result["shots"])  # the last turn carried fewer than it had: pruned
    assert llm[-1]["images"][-1] == result["shots"][-1]  # the newest, byte for byte
    seen = {digest for r in llm for digest in r["images"]}
    assert seen == set(result["shots"])  # each arrived at least once


# --- through the launcher --------------------------------------------------------------------------------------


def test_claude_code_through_the_launcher(tmp_path: Path) -> None:
    need("claude")
    env = {**CLAUDE_ENV, "ANTHROPIC_BASE_URL": "{provider}"}  # the upstream the user set: the launcher goes in front
    result = run_session(tmp_path, shots=10, launcher_args=[], command=["claude", "-p", PROMPT, "--allowedTools", "Read"], env=env)
    assert_capped_session(result, cap=8)
    assert_summary_is_what_the_provider_received(result, "claude")


def test_codex_through_the_launcher_never_lets_the_provider_hold_more_than_8_images(tmp_path: Path) -> None:
    need("codex")
    env = {**CODEX_ENV, "OPENAI_BASE_URL": "{provider}/v1"}  # Codex ignores it; the launcher takes it as the upstream
    result = run_session(tmp_path, shots=10, launcher_args=[], command=["codex", *CODEX_EXEC], env=env, files={"codex/config.toml": CODEX_CONFIG})
    assert_capped_session(result, cap=8)
    assert_summary_is_what_the_provider_received(result, "codex")
    assert all(r["method"] == "POST" for r in result["requests"])  # no WebSocket: every turn over HTTP, whole history


def assert_sent_once(result: dict[str, Any]) -> None:
    """Exit 0 with the final text; each screenshot uploaded once, and no image inline in any turn: every one went by
    reference from its first request on, and none was refused."""
    output = f"stdout:\n{result['stdout'][-2000:]}\nstderr:\n{result['stderr'][-3000:]}"
    assert result["returncode"] == 0, output
    assert FINAL in result["stdout"], output
    assert result["tool_calls"] == len(result["shots"])
    uploads = [r for r in result["requests"] if r["method"] == "POST" and r["path"].endswith("/v1/files")]
    assert len(uploads) == len(result["shots"]), output
    llm = turns(result)
    assert all(r["images"] == [] for r in llm)  # nothing inline: the provider got every screenshot once, as a file
    assert max(r["references"] for r in llm) >= min(len(result["shots"]), 8)
    records = launcher_records(result["stderr"])
    assert sum(r["by_reference"] for r in records) > 0 and all(r["references_refused"] == 0 for r in records)


def test_claude_code_with_send_once_references_every_screenshot_after_its_upload(tmp_path: Path) -> None:
    need("claude")
    env = {**CLAUDE_ENV, "ANTHROPIC_BASE_URL": "{provider}"}
    command = ["claude", "-p", PROMPT, "--allowedTools", "Read"]
    result = run_session(tmp_path, shots=10, launcher_args=["--set", "trimflow_send_once=true"], command=command, env=env)
    assert_sent_once(result)


def test_codex_with_send_once_references_every_screenshot_after_its_upload(tmp_path: Path) -> None:
    need("codex")
    env = {**CODEX_ENV, "OPENAI_BASE_URL": "{provider}/v1"}
    launcher = ["--set", "trimflow_send_once=true"]
    result = run_session(
        tmp_path, shots=10, launcher_args=launcher, command=["codex", *CODEX_EXEC], env=env, files={"codex/config.toml": CODEX_CONFIG}
    )
    assert_sent_once(result)


def test_gemini_cli_through_the_launcher(tmp_path: Path) -> None:
    need("gemini")
    env = {**GEMINI_ENV, "GOOGLE_GEMINI_BASE_URL": "{provider}"}
    # The user's settings select no auth type: the launcher's private settings add it, keeping theirs.
    files = {"home/.gemini/settings.json": GEMINI_SETTINGS}
    result = run_session(tmp_path, shots=12, launcher_args=[], command=["gemini", *GEMINI_ARGS], env=env, files=files)
    assert_capped_session(result, cap=10)
    assert_summary_is_what_the_provider_received(result, "gemini")
    assert (result["work"] / "home" / ".gemini" / "settings.json").read_text() == GEMINI_SETTINGS  # untouched
    assert list((result["work"] / "home" / ".gemini" / "tmp").iterdir())  # its session went to the user's folder


def test_claude_code_through_forward_mode_trusting_the_ca_bundle(tmp_path: Path) -> None:
    """`scripts/run --agent proxy -- claude`: HTTPS_PROXY and the CA bundle in NODE_EXTRA_CA_CERTS, for an agent
    with no base URL setting; the provider's own TLS is checked by mitmproxy against its certificate."""
    need("claude")
    env = {**CLAUDE_ENV, "ANTHROPIC_BASE_URL": "{provider}"}  # https://localhost:PORT: through the proxy, as any host
    launcher_args = ["--agent", "proxy", "--set", "ssl_verify_upstream_trusted_ca={cert}", "--set", "confdir={work}/confdir"]
    command = ["claude", "-p", PROMPT, "--allowedTools", "Read"]
    result = run_session(tmp_path, shots=9, tls=True, launcher_args=launcher_args, command=command, env=env)
    assert_capped_session(result, cap=8)
    assert_summary_is_what_the_provider_received(result, "claude")


# --- by hand: the README's recipes ------------------------------------------------------------------------------


def test_claude_code_by_hand_with_anthropic_base_url(tmp_path: Path) -> None:
    need("claude")
    env = {**CLAUDE_ENV, "ANTHROPIC_BASE_URL": "{proxy}"}
    result = run_session(
        tmp_path, shots=9, proxy_args=["--mode", "reverse:{provider}"], command=["claude", "-p", PROMPT, "--allowedTools", "Read"], env=env
    )
    assert_capped_session(result, cap=8)
    assert "trimflow: conv " in result["proxy_log"]


def test_codex_by_hand_with_its_websocket_refused_falls_back_to_http_at_once(tmp_path: Path) -> None:
    """`codex -c openai_base_url=...` talks to the built-in OpenAI provider, which tries a WebSocket first; answered
    426 it goes to HTTP for the rest of the session without a retry, and every turn carries its whole history."""
    need("codex")
    proxy_args = ["--mode", "reverse:{provider}", "--set", "trimflow_websocket=refuse"]
    command = ["codex", "-c", 'openai_base_url="{proxy}/v1"', *CODEX_EXEC]
    result = run_session(tmp_path, shots=10, proxy_args=proxy_args, command=command, env=CODEX_ENV, files={"codex/config.toml": CODEX_CONFIG})
    assert_capped_session(result, cap=8)
    assert "refused a WebSocket to 127.0.0.1/v1/responses" in result["proxy_log"]
    assert all(r["method"] == "POST" for r in result["requests"])  # the upgrade never reached the provider
    assert "Reconnecting" not in result["stderr"]  # a 403 or a closed connection it retries 6 times first


def test_gemini_cli_by_hand_with_its_settings_selecting_the_api_key(tmp_path: Path) -> None:
    need("gemini")
    env = {**GEMINI_ENV, "GOOGLE_GEMINI_BASE_URL": "{proxy}"}
    files = {"home/.gemini/settings.json": '{"security": {"auth": {"selectedType": "gemini-api-key"}}}'}
    result = run_session(tmp_path, shots=11, proxy_args=["--mode", "reverse:{provider}"], command=["gemini", *GEMINI_ARGS], env=env, files=files)
    assert_capped_session(result, cap=10)
    assert "trimflow: conv " in result["proxy_log"]


def test_the_versions_docs_agents_md_names_are_the_ones_scripts_setup_pins() -> None:
    docs = (ROOT / "docs" / "agents.md").read_text()
    for package, version in npm_pins().items():
        assert f"`{package}@{version}`" in docs
    assert set(PACKAGES.values()) <= set(npm_pins())
