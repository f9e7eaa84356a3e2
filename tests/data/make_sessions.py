"""Make the session fixtures in tests/data/sessions/ with the real agent CLIs (the versions scripts/setup pins).

    unshare -n sh -c 'ip link set lo up; exec .venv/bin/python -m tests.data.make_sessions'

Each CLI runs in a network namespace with loopback only against the fake provider, playing a model that has
it look at one small screenshot per turn with its own image tool (trimflow.testing._agent_script), and its
session file is copied here. Only one thing is changed in a copy: long texts in lines that hold no image (the
agents' own system prompts, tool and skill descriptions, which are the vendors' text and most of the bytes)
are cut to their first 60 characters and a note of their length. Lines with images are as the CLI wrote them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from trimflow.testing import FakeProvider, image
from trimflow.testing._agent_script import AgentScript

from ..e2e.agent_session import CODEX_CONFIG, SIDE_TRAFFIC_OFF, TOOLS_BIN

OUT = Path(__file__).resolve().parent / "sessions"
PROMPT = "Look at the screenshots in this folder, one at a time."
FINAL = "All screenshots seen."
LONG = 400  # characters: a longer text in a line without images is shortened
GEMINI_ENV = {"GEMINI_CLI_TRUST_WORKSPACE": "true", "GEMINI_CLI_NO_RELAUNCH": "true"}
GEMINI_SETTINGS = '{"security": {"auth": {"selectedType": "gemini-api-key"}}, "privacy": {"usageStatisticsEnabled": false}}'


def run(agent: str, work: Path, shots: int, *args: str) -> None:
    """One CLI run in `work` (its home there too) against a fresh fake provider."""
    home = work / "home"
    (home / ".gemini").mkdir(parents=True, exist_ok=True)
    (home / ".gemini" / "settings.json").write_text(GEMINI_SETTINGS)
    (work / "codex").mkdir(exist_ok=True)
    (work / "codex" / "config.toml").write_text(CODEX_CONFIG)
    paths = []
    for i in range(shots):
        path = work / f"screen-{i + 1:02d}.png"
        path.write_bytes(image(48, 32, "PNG", seed=2000 + i))  # noise: every screenshot different
        paths.append(str(path))
    with FakeProvider(script=AgentScript(paths, FINAL)) as provider:
        env = {
            "PATH": f"{TOOLS_BIN}{os.pathsep}/usr/bin:/bin",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            **SIDE_TRAFFIC_OFF,
            **GEMINI_ENV,
            "ANTHROPIC_API_KEY": "sk-ant-fixture",
            "ANTHROPIC_BASE_URL": provider.url,
            "OPENAI_API_KEY": "sk-fixture",
            "CODEX_HOME": str(work / "codex"),
            "GEMINI_API_KEY": "AIza-fixture",
            "GOOGLE_GEMINI_BASE_URL": provider.url,
        }
        if agent == "codex":
            provider_table = (
                f'{{name="fake", base_url="{provider.url}/v1", wire_api="responses", env_key="OPENAI_API_KEY", supports_websockets=false}}'
            )
            command = ["codex", "-c", 'model_provider="fake"', "-c", f"model_providers.fake={provider_table}", *args]
        else:
            command = [agent, *args]
        done = subprocess.run(command, cwd=work, env=env, capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            sys.exit(f"{agent} exited {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}")


def session_file(agent: str, work: Path) -> Path:
    patterns = {
        "claude": "home/.claude/projects/*/*.jsonl",
        "codex": "codex/sessions/*/*/*/rollout-*.jsonl",
        "gemini": "home/.gemini/tmp/*/chats/session-*.jsonl",
    }
    found = sorted(work.glob(patterns[agent]), key=lambda p: p.stat().st_size)
    return found[-1]  # Gemini CLI leaves a small new file per resume beside the chat


def shortened(data: bytes) -> bytes:
    out = []
    for raw in data.split(b"\n"):
        if raw and b'"data"' not in raw and b"base64" not in raw and len(raw) > LONG:
            raw = orjson.dumps(_shorten(orjson.loads(raw)))
        out.append(raw)
    return b"\n".join(out)


def _shorten(node: Any) -> Any:
    if isinstance(node, str) and len(node) > LONG:
        return f"{node[:60]}[... {len(node)} characters of the agent's own text shortened for the fixture]"
    if isinstance(node, dict):
        return {key: _shorten(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_shorten(value) for value in node]
    return node


def session_id(agent: str, path: Path) -> str:
    first = orjson.loads(path.read_bytes().split(b"\n", 1)[0])
    if agent == "codex":
        return str(first["payload"]["id"])
    return path.stem if agent == "claude" else str(first["sessionId"])


def main() -> int:
    OUT.mkdir(exist_ok=True)
    made = {
        "claude": ["-p", PROMPT, "--allowedTools", "Read"],
        # One screenshot attached to the prompt (a user message image), then the tool's.
        "codex": ["exec", "--skip-git-repo-check", "-m", "gpt-5", "-i", "screen-01.png", "--", PROMPT],
        "gemini": ["-m", "gemini-2.5-flash", "-p", PROMPT],
    }
    for agent, args in made.items():
        with tempfile.TemporaryDirectory(prefix=f"trimflow-{agent}-") as folder:
            work = Path(folder)
            if agent == "codex":
                (work / "screen-01.png").write_bytes(image(48, 32, "PNG", seed=2000))
            run(agent, work, 10, *args)
            path = session_file(agent, work)
            (OUT / f"{agent}-10.jsonl").write_bytes(shortened(path.read_bytes()))
            if agent in ("claude", "gemini"):
                # Resumed once more: Claude Code appends to the same file; Gemini CLI writes the history back.
                resume = ["-p", "--resume", session_id(agent, path), "continue", "--allowedTools", "Read"] if agent == "claude" else []
                if agent == "gemini":
                    resume = ["-m", "gemini-2.5-flash", "--resume", "latest", "-p", "continue"]
                run(agent, work, 10, *resume)
                (OUT / f"{agent}-10-resumed.jsonl").write_bytes(shortened(session_file(agent, work).read_bytes()))
            if agent == "claude":
                run(agent, work, 10, "-p", "--resume", session_id(agent, path), "/compact")
                run(agent, work, 12, "-p", "--resume", session_id(agent, path), PROMPT, "--allowedTools", "Read")
                (OUT / "claude-compacted.jsonl").write_bytes(shortened(session_file(agent, work).read_bytes()))
            shutil.rmtree(work / "home", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
