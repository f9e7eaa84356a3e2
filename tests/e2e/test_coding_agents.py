"""Coding agents on Node behind `scripts/run -- AGENT`, as a user runs them: pi, opencode, Qwen Code and OpenClaw
(CI), Kilo Code CLI and Cline CLI (on demand: `scripts/setup --agent-clis=all`), at the versions scripts/setup pins.

Each runs in a network namespace with loopback only (tests/e2e/agent_session.py), in forward mode: trimflow's
launcher gives it HTTPS_PROXY and a CA bundle; the fake provider serves TLS as localhost and plays a model that has
the agent look at a new screenshot with its own image tool each turn, cap + 3 turns. The agent is pointed at that
provider by its own configuration (an OpenAI-compatible base URL, a fake key), with its side traffic off.

Each test shows: the agent exits 0 with the final text; the provider never holds more images than the shipped
rules' cap for that host and model, while trimflow's records show the agent sent more; on every request the
screenshot just added arrives as the agent sent it: byte for byte the file, or, for Qwen Code, which re-encodes its
screenshots as JPEG, byte for byte what it sent in a control run without trimflow (which also shows it sending
more than the cap); no image arrives that the agent did not send.

They skip without the agent or `unshare -n`; TRIMFLOW_REQUIRE_AGENT_CLIS=1 (.ci/run) makes that a failure for the
CI set only: the on-demand agents skip, saying how to install them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from .agent_session import (
    FINAL,
    FORWARD_LAUNCHER_ARGS,
    KILO_SIDE_TRAFFIC_OFF,
    OPENCODE_ENV,
    PROMPT,
    ROOT,
    assert_one_conversation,
    assert_summary_is_what_the_provider_received,
    installed_version,
    launcher_records,
    npm_pins,
    opencode_config,
    require_agent,
    run_session,
    shipped_cap,
    turns,
)

pytestmark = pytest.mark.e2e

TOOLS = ROOT / ".tools"
NODE24_BIN = TOOLS / "node24" / "node_modules" / ".bin"
MODEL = "gpt-4o"
KEY = "sk-test-coding-agent"


@dataclass(frozen=True)
class Agent:
    command: str
    package: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    path: list[Path] = field(default_factory=list)  # folders first on PATH
    on_demand: bool = False
    prefix: Path = TOOLS


PI_MODELS = {
    "providers": {
        "fake": {
            "baseUrl": "{provider}/v1",
            "api": "openai-completions",
            "apiKey": KEY,
            "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
            "models": [{"id": MODEL, "input": ["text", "image"], "reasoning": False}],
        }
    }
}

OPENCODE_CONFIG = opencode_config(MODEL, KEY)

# Qwen Code: the OpenAI auth type, its usage statistics and update check off.
QWEN_SETTINGS = {
    "security": {"auth": {"selectedType": "openai"}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
}
QWEN_ENV = {"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": "{provider}/v1", "OPENAI_MODEL": MODEL}

# OpenClaw: its config (given with --config) with an OpenAI-compatible provider; no update check, no Bonjour.
OPENCLAW_CONFIG = {
    "agents": {"defaults": {"model": {"primary": f"fake/{MODEL}"}}},
    "models": {
        "providers": {
            "fake": {
                "baseUrl": "{provider}/v1",
                "apiKey": KEY,
                "api": "openai-completions",
                "models": [{"id": MODEL, "name": MODEL, "reasoning": False, "input": ["text", "image"], "contextWindow": 128000, "maxTokens": 8192}],
            }
        }
    },
}
OPENCLAW_ENV = {"OPENCLAW_NO_AUTO_UPDATE": "1", "OPENCLAW_DISABLE_BONJOUR": "1"}

# Kilo Code CLI (an opencode fork): the same provider config, its own variables.
KILO_ENV = {"KILO_CONFIG": "{work}/kilo.json", **KILO_SIDE_TRAFFIC_OFF}

# Cline CLI: its provider settings as `cline auth openai -k KEY -m MODEL -b URL` writes them.
CLINE_PROVIDERS = {
    "version": 1,
    "lastUsedProvider": "openai-compatible",
    "modes": {},
    "providers": {
        "openai-compatible": {
            "settings": {"provider": "openai-compatible", "apiKey": KEY, "model": MODEL, "baseUrl": "{provider}/v1"},
            "updatedAt": "2026-01-01T00:00:00.000Z",
            "tokenSource": "manual",
        }
    },
}
CLINE_ENV = {"CLINE_NO_AUTO_UPDATE": "1"}

AGENTS = {
    "pi": Agent(
        "pi",
        "@mariozechner/pi-coding-agent",
        ["-p", PROMPT, "--provider", "fake", "--model", MODEL, "--no-session", "--offline"],
        env={"PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0"},
        files={"home/.pi/agent/models.json": orjson.dumps(PI_MODELS).decode()},
    ),
    "opencode": Agent(
        "opencode",
        "opencode-ai",
        ["run", "-m", f"fake/{MODEL}", PROMPT],
        env=OPENCODE_ENV,
        files={"home/.config/opencode/opencode.json": orjson.dumps(OPENCODE_CONFIG).decode()},
    ),
    "qwen": Agent(
        "qwen",
        "@qwen-code/qwen-code",
        ["--auth-type", "openai", "--model", MODEL, PROMPT],
        env=QWEN_ENV,
        files={"home/.qwen/settings.json": orjson.dumps(QWEN_SETTINGS).decode()},
    ),
    "openclaw": Agent(
        "openclaw",
        "openclaw",
        ["agent", "exec", "--config", "{work}/openclaw.json", "--model", f"fake/{MODEL}", "--cwd", "{work}", PROMPT],
        env=OPENCLAW_ENV,
        files={"openclaw.json": orjson.dumps(OPENCLAW_CONFIG).decode()},
        path=[NODE24_BIN],
        prefix=TOOLS / "openclaw",
    ),
    "kilo": Agent(
        "kilo",
        "@kilocode/cli",
        ["run", "-m", f"fake/{MODEL}", PROMPT],
        env=KILO_ENV,
        files={"kilo.json": orjson.dumps(OPENCODE_CONFIG).decode()},
        on_demand=True,
    ),
    "cline": Agent(
        "cline",
        "cline",
        ["-P", "openai-compatible", "-m", MODEL, "--compaction", "off", PROMPT],
        env=CLINE_ENV,
        files={
            "home/.cline/data/settings/providers.json": orjson.dumps(CLINE_PROVIDERS).decode(),
            "home/.cline/data/settings/global-settings.json": '{"telemetryOptOut": true}',
        },
        on_demand=True,
    ),
}


def why_it_cannot_run(agent: Agent) -> str | None:
    pins = npm_pins()
    install = "scripts/setup --agent-clis=all" if agent.on_demand else "scripts/setup --agent-clis"
    wanted = [(agent.prefix, agent.package, agent.command)]
    if NODE24_BIN in agent.path:
        wanted.insert(0, (NODE24_BIN.parents[1], "node", "node"))
    for prefix, package, command in wanted:
        version = installed_version(prefix, package, command)
        if version is None:
            return f"{package} is not installed: {install} (needs npm)"
        if version != pins[package]:
            return f"{package} {version} is installed, scripts/setup pins {pins[package]}: {install}"
    return None


def need(agent: Agent) -> None:
    require_agent(why_it_cannot_run(agent), on_demand=agent.on_demand)


def run_agent(tmp_path: Path, name: str, *, through_trimflow: bool = True) -> dict[str, Any]:
    """One session of the agent: through `scripts/run --` (forward mode), or, as a control, straight to the provider
    (trusting its certificate)."""
    agent = AGENTS[name]
    need(agent)
    folder = tmp_path / ("trimflow" if through_trimflow else "control")
    folder.mkdir()
    env = dict(agent.env)
    session: dict[str, Any] = {}
    if through_trimflow:
        session["launcher_args"] = FORWARD_LAUNCHER_ARGS
    else:
        env["NODE_EXTRA_CA_CERTS"] = "{cert}"
    return run_session(
        folder,
        shots=shipped_cap(MODEL) + 3,
        tls=True,
        command=[agent.command, *agent.args],
        env=env,
        files=agent.files,
        path=[str(p) for p in [*agent.path, agent.prefix / "node_modules" / ".bin"]],
        **session,
    )


def assert_exited_with_the_final_answer(result: dict[str, Any]) -> None:
    output = f"stdout:\n{result['stdout'][-2000:]}\nstderr:\n{result['stderr'][-3000:]}"
    assert result["returncode"] == 0, output
    assert FINAL in result["stdout"], output
    assert result["tool_calls"] == len(result["shots"]), output  # every screenshot was asked for


def newest_by_screenshot(result: dict[str, Any]) -> dict[int, str]:
    """For each request after the agent looked at screenshot k: k -> the newest image of that request."""
    llm = [r for r in turns(result) if r["model"] == MODEL]
    newest = {r["tool_results"]: r["images"][-1] for r in llm if r["tool_results"] > 0}
    assert set(newest) == set(range(1, len(result["shots"]) + 1))  # a request after each screenshot
    return newest


def assert_capped_and_newest_as_sent(result: dict[str, Any], sent: list[str] | dict[int, str]) -> None:
    """Through trimflow: at most the cap on every request while the agent sent more (trimflow's records), and on
    every request the screenshot just added is the newest as the agent sent it: `sent`, screenshot k's bytes at
    index k - 1, or at key k (what the agent sent without trimflow, for an agent that re-encodes)."""
    assert_exited_with_the_final_answer(result)
    cap = shipped_cap(MODEL)
    llm = [r for r in turns(result) if r["model"] == MODEL]
    assert all(len(r["images"]) <= cap for r in llm), [len(r["images"]) for r in llm]
    records = [r for r in launcher_records(result["stderr"]) if r.get("model") == MODEL]
    assert max(r["images_before"] for r in records) == len(result["shots"]) > cap  # what the agent sent
    assert sum(r["pruned"] for r in records) > 0
    expected = sent if isinstance(sent, dict) else dict(enumerate(sent, 1))
    assert newest_by_screenshot(result) == expected
    assert {image for r in llm for image in r["images"]} <= set(expected.values())  # none altered on the way


def control_without_trimflow(tmp_path: Path, name: str) -> dict[int, str]:
    """The agent straight to the provider: it sends more than the cap; what it sent, by screenshot."""
    result = run_agent(tmp_path, name, through_trimflow=False)
    assert_exited_with_the_final_answer(result)
    llm = [r for r in turns(result) if r["model"] == MODEL]
    assert max(len(r["images"]) for r in llm) == len(result["shots"]) > shipped_cap(MODEL)
    return newest_by_screenshot(result)


def test_pi_through_the_launcher(tmp_path: Path) -> None:
    result = run_agent(tmp_path, "pi")
    assert_capped_and_newest_as_sent(result, result["shots"])
    assert_summary_is_what_the_provider_received(result, "pi")


def test_opencode_through_the_launcher(tmp_path: Path) -> None:
    result = run_agent(tmp_path, "opencode")
    assert_capped_and_newest_as_sent(result, result["shots"])
    assert_summary_is_what_the_provider_received(result, "opencode")


def test_qwen_code_through_the_launcher(tmp_path: Path) -> None:
    """Qwen Code re-encodes its screenshots as JPEG: the control run without trimflow says what it sends."""
    sent = control_without_trimflow(tmp_path, "qwen")
    result = run_agent(tmp_path, "qwen")
    assert_capped_and_newest_as_sent(result, sent)
    assert_summary_is_what_the_provider_received(result, "qwen")


def test_openclaw_through_the_launcher(tmp_path: Path) -> None:
    """OpenClaw on the Node it needs (.tools/node24). Each of its requests ends with a context message the next one
    drops: still one conversation, numbered 1..N in the records and the exit summary."""
    result = run_agent(tmp_path, "openclaw")
    assert_capped_and_newest_as_sent(result, result["shots"])
    assert_one_conversation(launcher_records(result["stderr"]), result["stderr"], "openclaw")
    assert_summary_is_what_the_provider_received(result, "openclaw")


def test_kilo_code_cli_through_the_launcher(tmp_path: Path) -> None:
    result = run_agent(tmp_path, "kilo")
    assert_capped_and_newest_as_sent(result, result["shots"])
    assert_summary_is_what_the_provider_received(result, "kilo")


def test_cline_cli_through_the_launcher(tmp_path: Path) -> None:
    result = run_agent(tmp_path, "cline")
    assert_capped_and_newest_as_sent(result, result["shots"])
    assert_summary_is_what_the_provider_received(result, "cline")
