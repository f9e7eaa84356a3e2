"""Recall end to end: real agent CLIs (Claude Code, Codex, Gemini CLI) behind `scripts/run --` (python -m trimflow
run --) ask the MCP server the launcher registered for an image trimflow cut, and get it back byte for byte; two
launcher runs side by side cannot recall each other's images.

The agent sessions (tests/e2e/agent_session.py, loopback only) script the fake provider's model to look at every
screenshot, then call the recall tool with an id no placeholder names (the tool's error comes back and the session
goes on), then with the id of the first screenshot's placeholder: the next request carries that screenshot again,
as the file holds it, and the session ends with the final text. They skip without the CLIs or `unshare` (root), and
fail instead where TRIMFLOW_REQUIRE_AGENT_CLIS=1 (CI)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest

from trimflow._recall import FOLDER_NAME, image_id
from trimflow.testing import FakeProvider, data_url, image
from trimflow.testing._agent_script import UNKNOWN_ID

from ..helpers import MCP_SDK_MISSING, wait_for
from .agent_session import (
    CODEX_CONFIG,
    FINAL,
    PROMPT,
    RECALL_ID,
    SIDE_TRAFFIC_OFF,
    digest,
    launcher_records,
    need,
    run_session,
    turns,
)

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(bool(MCP_SDK_MISSING), reason=MCP_SDK_MISSING)]


def assert_recalled(result: dict[str, Any]) -> None:
    """The session ended with the final text; the model asked for an unknown id, got the tool's error, then asked for
    the first screenshot's id and the next request carried that screenshot byte for byte; the record counts both."""
    output = f"stdout:\n{result['stdout'][-2000:]}\nstderr:\n{result['stderr'][-3000:]}"
    assert result["returncode"] == 0, output
    assert FINAL in result["stdout"], output
    first = (result["work"] / "screen-01.png").read_bytes()
    assert result["recalled"] == [UNKNOWN_ID, image_id(first)], output
    llm = turns(result)
    named = [r for r in llm if image_id(first) in r["recall_ids"]]
    assert named, "no request named the first screenshot's id"
    answered = [i for i, r in enumerate(llm) if r["unknown_id_answered"]]
    assert answered, "the unknown id's error never reached the model"
    after = llm[-1]  # the final turn: it carries the recall's result, the newest image
    assert after["images"][-1] == digest(first) == result["shots"][0]
    assert all(result["shots"][0] not in r["images"] for r in llm[answered[0] - 1 : -1])  # cut before the recall brought it back
    records = launcher_records(result["stderr"])
    assert sum(r["recalls"] for r in records) == 1 and sum(r["recalls_refused"] for r in records) == 1
    assert "1 recalled" in result["stderr"], output
    store = result["work"] / "home" / ".mitmproxy" / FOLDER_NAME
    assert store.is_dir() and not list(store.iterdir())  # the run's images went with the run


def test_claude_code_recalls_an_image_trimflow_cut(tmp_path: Path) -> None:
    need("claude")
    env = {"ANTHROPIC_API_KEY": "sk-ant-test-recall", **SIDE_TRAFFIC_OFF, "ANTHROPIC_BASE_URL": "{provider}"}
    command = ["claude", "-p", PROMPT, "--allowedTools", "Read"]
    result = run_session(tmp_path, shots=10, launcher_args=[], command=command, env=env, recall=True)
    assert_recalled(result)


def test_codex_recalls_an_image_trimflow_cut(tmp_path: Path) -> None:
    need("codex")
    env = {"OPENAI_API_KEY": "sk-test-recall", "CODEX_HOME": "{work}/codex", "OPENAI_BASE_URL": "{provider}/v1"}
    command = ["codex", "exec", "--skip-git-repo-check", "-m", "gpt-5", "--", PROMPT]
    result = run_session(tmp_path, shots=10, launcher_args=[], command=command, env=env, files={"codex/config.toml": CODEX_CONFIG}, recall=True)
    assert_recalled(result)


# -- two runs side by side

AGENT = textwrap.dedent(
    """
    # A run's agent: one request with 12 screenshots through the proxy, then, once the test names the ids, each asked
    # of the recall server its launcher's environment names (as a user's own MCP config would spawn it).
    import asyncio, base64, json, os, sys, time, urllib.request
    from pathlib import Path
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    work = Path(sys.argv[1])
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": os.environ["HTTP_PROXY"]}))
    request = urllib.request.Request(sys.argv[2], data=(work / "body.json").read_bytes(), method="POST")
    request.add_header("content-type", "application/json")
    request.add_header("authorization", "Bearer " + sys.argv[3])
    opener.open(request, timeout=60).read()
    (work / "sent").write_text("")
    deadline = time.monotonic() + 120
    while not (work / "ids.json").exists():
        if time.monotonic() > deadline:
            sys.exit("no ids")
        time.sleep(0.05)
    ids = json.loads((work / "ids.json").read_text())
    env = {name: os.environ[name] for name in ("TRIMFLOW_RECALL_TOKEN", "TRIMFLOW_RECALL_STORE", "PATH", "HOME")}

    async def ask():
        out = {}
        async with Client(StdioServerParameters(command=sys.executable, args=["-m", "trimflow", "mcp"], env=env)) as client:
            for wanted in ids:
                result = await client.call_tool("recall_image", {"id": wanted})
                out[wanted] = None if result.is_error else base64.b64decode(result.content[0].data).hex()
        return out

    (work / "recalled.json").write_text(json.dumps(asyncio.run(ask())))
    """
)


def _chat(run: int) -> dict[str, Any]:
    """An OpenAI chat with 12 screenshots, one per user turn, none of them in the other run's."""
    messages: list[dict[str, Any]] = []
    for i in range(12):
        shot = image(40 + i, 30, "PNG", seed=1000 * (run + 1) + i)
        content = [{"type": "text", "text": f"run {run} turn {i}"}, {"type": "image_url", "image_url": {"url": data_url(shot, "image/png")}}]
        messages += [{"role": "user", "content": content}, {"role": "assistant", "content": f"answer {i}"}]
    return {"model": "gpt-4o", "messages": messages}


def _images_of(body: dict[str, Any]) -> list[bytes]:
    return [
        base64.b64decode(p["image_url"]["url"].split(",", 1)[1])
        for m in body["messages"]
        if isinstance(m["content"], list)
        for p in m["content"]
        if p.get("type") == "image_url"
    ]


def test_two_launcher_runs_side_by_side_cannot_recall_each_others_images(tmp_path: Path) -> None:
    """Both runs' proxies keep their images in one store (one confdir), both alive at once; each run's agent asks the
    recall server its launcher's environment names for its own ids and the other run's: its own come back byte for
    byte, the other run's are unknown to it."""
    confdir = tmp_path / "confdir"
    (tmp_path / "agent.py").write_text(AGENT)
    runs = {name: tmp_path / name for name in ("a", "b")}
    bodies = {name: _chat(n) for n, name in enumerate(runs)}
    environ = {name: value for name, value in os.environ.items() if not name.lower().endswith("_proxy")}
    environ.update(HOME=str(tmp_path / "home"))
    with FakeProvider() as provider:
        processes = {}
        for name, work in runs.items():
            work.mkdir()
            (work / "body.json").write_bytes(orjson.dumps(bodies[name]))
            command = [sys.executable, "-m", "trimflow", "run", "--set", f"confdir={confdir}", "--"]
            command += [sys.executable, str(tmp_path / "agent.py"), str(work), f"{provider.url}/v1/chat/completions", f"sk-run-{name}"]
            log = open(work / "launcher.log", "wb")  # noqa: SIM115 - handed to the child process
            processes[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environ, cwd=work)
            log.close()
        for work in runs.values():
            wait_for(lambda work=work: (work / "sent").exists() or processes[work.name].poll() is not None, f"{work.name}'s request", timeout=120)
        forwarded = {r.headers["authorization"].removeprefix("Bearer sk-run-"): r.body for r in provider.received if r.method == "POST"}
        assert set(forwarded) == set(runs), [(runs[n] / "launcher.log").read_text()[-2000:] for n in runs]
        ids = {name: [m.decode() for m in RECALL_ID.findall(body)] for name, body in forwarded.items()}
        assert all(len(found) == 9 for found in ids.values()) and not set(ids["a"]) & set(ids["b"]), ids
        for name, work in runs.items():
            other = "b" if name == "a" else "a"
            (work / "ids.json").write_bytes(orjson.dumps(ids[name] + ids[other]))
        for name, process in processes.items():
            assert process.wait(timeout=180) == 0, (runs[name] / "launcher.log").read_text()[-3000:]
    for name, work in runs.items():
        other = "b" if name == "a" else "a"
        recalled = orjson.loads((work / "recalled.json").read_bytes())
        assert [bytes.fromhex(recalled[i]) if recalled[i] else None for i in ids[name]] == _images_of(bodies[name])[:9]  # its own
        assert [recalled[i] for i in ids[other]] == [None] * 9  # the other run's: unknown to this run's server
    assert not list((confdir / FOLDER_NAME).iterdir())  # each run's images went with it


def test_gemini_cli_recalls_an_image_trimflow_cut(tmp_path: Path) -> None:
    need("gemini")
    env = {"GEMINI_API_KEY": "AIza-test-recall", "GEMINI_CLI_TRUST_WORKSPACE": "true", "GOOGLE_GEMINI_BASE_URL": "{provider}"}
    files = {"home/.gemini/settings.json": '{"privacy": {"usageStatisticsEnabled": false}}'}
    command = ["gemini", "-m", "gemini-2.5-flash", "-p", PROMPT]
    result = run_session(tmp_path, shots=12, launcher_args=[], command=command, env=env, files=files, recall=True)
    assert_recalled(result)
