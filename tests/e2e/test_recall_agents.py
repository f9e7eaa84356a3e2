"""Recall with the coding agents in forward mode: under `scripts/run --` (python -m trimflow run --), each agent's own
`mcp list` shows the run's server (`trimflow`, the launcher's `python -m trimflow mcp`) beside the user's own, which
stays, and the user's files are as they were. opencode, Kilo Code and Qwen Code start the server to list it, so
"connected" is the server answering them; Hermes Agent lists what its config holds. And opencode, given a model
that calls the tool (tests/e2e/agent_session.py), gets an image trimflow cut back byte for byte.

The agents run in a network namespace with loopback only (tests/e2e/agent_session.py), their side traffic off. They
skip without the CLIs or `unshare` (root), and fail instead where TRIMFLOW_REQUIRE_AGENT_CLIS=1 (CI) requires them
(Kilo Code is on demand: scripts/setup --agent-clis=all)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from trimflow._recall import FOLDER_NAME, image_id
from trimflow.testing._agent_script import UNKNOWN_ID

from ..helpers import MCP_SDK_MISSING
from .agent_session import (
    FINAL,
    FORWARD_LAUNCHER_ARGS,
    KILO_SIDE_TRAFFIC_OFF,
    OPENCODE_ENV,
    PROMPT,
    digest,
    launcher_records,
    need,
    need_venv,
    opencode_config,
    run_session,
    shipped_cap,
    turns,
)

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(bool(MCP_SDK_MISSING), reason=MCP_SDK_MISSING)]

# The user's own server, disabled where the agent can say so: listed, never started.
THEIRS = {"docs": {"type": "local", "command": ["docs-server"], "enabled": False}}
QWEN_SETTINGS = {
    "mcpServers": {"docs": {"command": "docs-server"}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
}
HERMES_CONFIG = "mcp_servers:\n  docs:\n    command: docs-server\n"


def listed(tmp_path: Path, command: list[str], **session: Any) -> tuple[str, dict[str, Any]]:
    """The agent's `mcp list` under the launcher: its output (colours off), and the session's result."""
    result = run_session(tmp_path, shots=0, launcher_args=[], command=command, **session)
    output = re.sub(r"\x1b\[[0-9;]*m", "", result["stdout"] + result["stderr"])
    assert result["returncode"] == 0, output[-3000:]
    assert re.search(rf"^trimflow: {command[0]} exited 0; ", result["stderr"], re.MULTILINE), output[-3000:]
    return output, result


def server_line(output: str, name: str) -> str:
    lines = [line for line in output.splitlines() if re.search(rf"\b{name}\b", line) and "trimflow run" not in line]
    assert lines, output[-3000:]
    return " ".join(lines)


INLINE = [("opencode", "OPENCODE_CONFIG_CONTENT", OPENCODE_ENV), ("kilo", "KILO_CONFIG_CONTENT", KILO_SIDE_TRAFFIC_OFF)]


@pytest.mark.parametrize(("agent", "variable", "env"), INLINE)
def test_opencode_and_kilo_list_the_runs_server_beside_the_users_own(tmp_path: Path, agent: str, variable: str, env: dict[str, str]) -> None:
    need(agent)
    theirs = orjson.dumps({"mcp": THEIRS}).decode().replace("{", "{{").replace("}", "}}")  # the session fills {names}
    output, result = listed(tmp_path, [agent, "mcp", "list"], env={**env, variable: theirs})
    assert "connected" in server_line(output, "trimflow") and "-m trimflow mcp --store" in output
    assert "disabled" in server_line(output, "docs")
    assert not list((result["work"] / "home" / ".config").rglob("*.json*"))  # no config file written (its .gitignore only)


def test_qwen_code_lists_the_runs_server_connected_beside_the_users_own(tmp_path: Path) -> None:
    need("qwen")
    settings = orjson.dumps(QWEN_SETTINGS).decode()
    output, result = listed(tmp_path, ["qwen", "mcp", "list"], files={"home/.qwen/settings.json": settings})
    assert "Connected" in server_line(output, "trimflow") and "-m trimflow mcp --store" in output
    assert "docs-server" in server_line(output, "docs")
    written = orjson.loads((result["work"] / "home" / ".qwen" / "settings.json").read_bytes())
    assert {key: value for key, value in written.items() if key != "$version"} == QWEN_SETTINGS  # Qwen Code adds its $version


def test_hermes_agent_lists_the_runs_server_beside_the_users_own(tmp_path: Path) -> None:
    need_venv("hermes")
    env = {"HERMES_HOME": "{work}/hermes", "HERMES_DISABLE_LAZY_INSTALLS": "1"}
    output, result = listed(tmp_path, ["hermes", "mcp", "list"], venv="hermes", env=env, files={"hermes/config.yaml": HERMES_CONFIG})
    assert "enabled" in server_line(output, "trimflow")
    assert "enabled" in server_line(output, "docs")
    assert (result["work"] / "hermes" / "config.yaml").read_text() == HERMES_CONFIG


MODEL = "gpt-4o"
OPENCODE_CONFIG = opencode_config(MODEL, "sk-test-recall-opencode")


def test_opencode_recalls_an_image_trimflow_cut(tmp_path: Path) -> None:
    """opencode in forward mode (HTTPS to the provider): the model looks at more screenshots than the cap, then calls
    `trimflow_recall_image` with an id no placeholder names (its error comes back) and with the first screenshot's,
    which arrives in the next request as the file holds it."""
    need("opencode")
    files = {"home/.config/opencode/opencode.json": orjson.dumps(OPENCODE_CONFIG).decode()}
    command = ["opencode", "run", "-m", f"fake/{MODEL}", PROMPT]
    shots = shipped_cap(MODEL) + 3
    session = {"launcher_args": FORWARD_LAUNCHER_ARGS, "env": OPENCODE_ENV, "files": files}
    result = run_session(tmp_path, shots=shots, tls=True, command=command, recall=True, **session)
    output = f"stdout:\n{result['stdout'][-2000:]}\nstderr:\n{result['stderr'][-3000:]}"
    assert result["returncode"] == 0 and FINAL in result["stdout"], output
    first = (result["work"] / "screen-01.png").read_bytes()
    assert result["recalled"] == [UNKNOWN_ID, image_id(first)], output
    llm = [r for r in turns(result) if r["model"] == MODEL]
    assert any(r["unknown_id_answered"] for r in llm), "the unknown id's error never reached the model"
    assert any(image_id(first) in r["recall_ids"] for r in llm)  # a placeholder named it: trimflow had cut it
    assert llm[-1]["images"][-1] == digest(first) == result["shots"][0]  # back, byte for byte
    records = launcher_records(result["stderr"])
    assert sum(r["recalls"] for r in records) == 1 and sum(r["recalls_refused"] for r in records) == 1
    store = result["work"] / "confdir" / FOLDER_NAME
    assert store.is_dir() and not list(store.iterdir())  # the run's images went with the run


QWEN_ENV = {"OPENAI_API_KEY": "sk-test-recall-qwen", "OPENAI_BASE_URL": "{provider}/v1", "OPENAI_MODEL": MODEL}
QWEN_RUN_SETTINGS = {**QWEN_SETTINGS, "security": {"auth": {"selectedType": "openai"}}}


def test_qwen_code_recalls_an_image_trimflow_cut(tmp_path: Path) -> None:
    """Qwen Code in forward mode calls `recall_image` without asking (the server is trusted). It re-encodes the
    screenshots it reads as JPEG, so what comes back is the image it sent, as trimflow kept it."""
    need("qwen")
    files = {"home/.qwen/settings.json": orjson.dumps(QWEN_RUN_SETTINGS).decode()}
    command = ["qwen", "--auth-type", "openai", "--model", MODEL, PROMPT]
    session = {"launcher_args": FORWARD_LAUNCHER_ARGS, "env": QWEN_ENV, "files": files}
    result = run_session(tmp_path, shots=shipped_cap(MODEL) + 3, tls=True, command=command, recall=True, **session)
    output = f"stdout:\n{result['stdout'][-2000:]}\nstderr:\n{result['stderr'][-3000:]}"
    assert result["returncode"] == 0 and FINAL in result["stdout"], output
    llm = [r for r in turns(result) if r["model"] == MODEL]
    sent_first = next(r["images"][-1] for r in llm if r["tool_results"] == 1)  # screenshot 1 as Qwen Code sent it
    named = {i for r in llm for i in r["recall_ids"]}  # the ids the placeholders name
    assert result["recalled"][0] == UNKNOWN_ID and result["recalled"][1] in named and len(result["recalled"]) == 2, output
    assert any(r["unknown_id_answered"] for r in llm), "the unknown id's error never reached the model"
    assert all(sent_first not in r["images"] for r in llm if r["recall_ids"] and r is not llm[-1])  # cut
    assert llm[-1]["images"][-1] == sent_first  # back, byte for byte as Qwen Code sent it
    records = launcher_records(result["stderr"])
    assert sum(r["recalls"] for r in records) == 1 and sum(r["recalls_refused"] for r in records) == 1
