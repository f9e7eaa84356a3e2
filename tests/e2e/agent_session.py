"""One agent CLI session against the scripted fake provider, run inside a network namespace of its own.

`python -m tests.e2e.agent_session SESSION.json` (from the checkout, as `run_session` below runs it in
`unshare -n`): writes screenshots into the session's folder, starts FakeProvider with an AgentScript that has the
CLI look at each of them with its own image tool, runs the command (through `python -m trimflow run ... --`, or,
for a by-hand recipe, beside a `python -m trimflow run` proxy), and writes what happened to RESULT.json: the
command's status and output, and every request the provider received (its images as SHA-256 digests, the usage
it was answered with). The test reads that file: the session asserts nothing. The agent tests (test_agent_clis.py,
test_python_agents.py) share `run_session`, `turns` and the checks of the launcher's summary, defined here.

Placeholders in the session's command, environment, proxy arguments and files: {provider} (the fake's URL), {proxy}
(the by-hand proxy's URL), {work} (the session's folder, where the screenshots are), {cert} (with "tls": the
provider's certificate; it then serves HTTPS as localhost). In files only these names are replaced, so other braces
(JSON) stay as they are. "path" lists folders put first on the command's PATH.

"venv": NAME puts the bin folder of .tools/venvs/NAME (a Python agent, scripts/setup --agent-clis) on PATH;
"added_images": true scripts a model for an agent whose user adds the screenshots (AddedImagesScript) rather than
one that calls an image tool; "recall": true has the model call the recall tool after the screenshots (AgentScript);
"input": text for the command's standard input (a user typing).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from trimflow import DEFAULT_RULES_PATH, FORMATS, load_rules
from trimflow._rules import builtin_rules
from trimflow.testing import FakeProvider, Received, estimate_usage, image
from trimflow.testing._agent_script import UNKNOWN_ID, AddedImagesScript, AgentScript, offered_tools, tool_results

from ..certs import make_server_cert
from ..helpers import wait_for
from ..mitmdump import listening_port
from .helpers import decode_b64

ROOT = Path(__file__).resolve().parents[2]
RECALL_ID = re.compile(rb'recall_image\(\\"([a-z2-7]{10})\\"\)')  # a placeholder's id, as its text reads inside JSON
FILE_REFERENCE = re.compile(rb'"file_id"\s*:\s*"')  # an image part that names a file at the provider instead of carrying it
TOOLS_BIN = ROOT / ".tools" / "node_modules" / ".bin"
AGENT_VENVS = ROOT / ".tools" / "venvs"  # the Python agents, one venv each
# Claude Code's side traffic off: no telemetry, update check or error report tries the (absent) network.
SIDE_TRAFFIC_OFF = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
}
# Codex's config.toml with its side traffic off.
CODEX_CONFIG = """check_for_update_on_startup = false
[analytics]
enabled = false
[feedback]
enabled = false
[otel]
exporter = "none"
[features]
plugins = false
remote_plugin = false
apps = false
"""


# opencode and Kilo Code (its fork): an OpenAI-compatible provider of their own (a bundled SDK), the model taking
# images; `opencode_config(model, key)` fills the model and the key.
def opencode_config(model: str, key: str) -> dict[str, Any]:
    return {
        "provider": {
            "fake": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "fake",
                "options": {"baseURL": "{provider}/v1", "apiKey": key},
                "models": {model: {"name": model, "attachment": True, "modalities": {"input": ["text", "image"], "output": ["text"]}}},
            }
        },
        "model": f"fake/{model}",
        "autoupdate": False,
        "share": "disabled",
    }


# opencode's side traffic off: no update check, models.dev list, LSP download, default plugins (npm installs) or sharing.
OPENCODE_ENV = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_PURE": "1",
}
# Kilo Code's: the same, and its session ingest, codebase indexing, presence and telemetry.
KILO_SIDE_TRAFFIC_OFF = {
    "KILO_DISABLE_AUTOUPDATE": "1",
    "KILO_DISABLE_MODELS_FETCH": "1",
    "KILO_DISABLE_LSP_DOWNLOAD": "1",
    "KILO_DISABLE_DEFAULT_PLUGINS": "1",
    "KILO_DISABLE_SHARE": "1",
    "KILO_DISABLE_SESSION_INGEST": "1",
    "KILO_DISABLE_CODEBASE_INDEXING": "1",
    "KILO_DISABLE_PRESENCE": "1",
    "KILO_TELEMETRY_LEVEL": "off",
    "KILO_PURE": "1",
}


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fill(text: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        text = text.replace("{" + name + "}", value)
    return text


def request_facts(received: Received) -> dict[str, Any]:
    fmt = builtin_rules().format_for("", received.path)
    facts: dict[str, Any] = {"method": received.method, "path": received.path, "format": fmt, "images": [], "input_tokens": None}
    if fmt is None or received.method != "POST":
        return facts
    body = received.json()
    facts["model"] = body.get("model")
    facts["tool_results"] = tool_results(fmt, body)  # the screenshots looked at before this request
    facts["recall_ids"] = sorted({m.decode() for m in RECALL_ID.findall(received.body)})  # the ids its placeholders name
    facts["tools"] = sorted(offered_tools(fmt, body))
    facts["unknown_id_answered"] = f"no image {UNKNOWN_ID} in this run's store".encode() in received.body
    facts["references"] = len(FILE_REFERENCE.findall(received.body))  # images sent as a file id (send-once)
    for media in FORMATS[fmt].find_media(body):
        if media.kind == "image" and media.data is not None:
            facts["images"].append(digest(decode_b64(media.data[media.data_offset :])))
    facts["input_tokens"] = estimate_usage(received.body).input_tokens
    return facts


def proxy_port(process: subprocess.Popen[bytes], log: Path) -> int:
    """The port of the by-hand proxy, given port 0: the one it says it listens on."""

    def listening() -> int | None:
        if process.poll() is not None:
            raise RuntimeError(f"the proxy exited with {process.returncode}")
        return listening_port(log.read_text(errors="replace"))

    return wait_for(listening, "the proxy listening")


# --- for the tests: run a session in a network namespace and read what happened -------------------------------

SETUP = ROOT / "scripts" / "setup"
# Forward mode, as for any agent the launcher does not know; mitmproxy checks the provider's certificate.
FORWARD_LAUNCHER_ARGS = ["--set", "ssl_verify_upstream_trusted_ca={cert}", "--set", "confdir={work}/confdir"]


def npm_pins() -> dict[str, str]:
    """package -> version, as scripts/setup pins them (every AGENT_... list: CI's, on demand, OpenClaw and its Node)."""
    lists = re.findall(r"^AGENT_\w+=\(([^)]*)\)", SETUP.read_text(), re.MULTILINE)
    return dict(spec.rsplit("@", 1) for specs in lists for spec in specs.split())


def python_pins() -> dict[str, str]:
    """venv name -> pip requirement, as scripts/setup pins the Python agents."""
    entries = SETUP.read_text().split("PYTHON_AGENTS=(", 1)[1].split(")", 1)[0].split()
    return dict(entry.split("=", 1) for entry in entries)


PROMPT = "Look at the screenshots in this folder, one at a time."
FINAL = "All screenshots seen: the dialog moved each time."


# Loopback only (a network namespace), and a PID namespace of its own: when the session ends, so does every process
# an agent started, a daemon that left its process group included (Cline's hub).
UNSHARE = ["unshare", "--net", "--pid", "--fork", "--mount-proc"]


def unshare_works() -> bool:
    try:
        return subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def require_agent(why: str | None, *, on_demand: bool = False) -> None:
    """Skip the test when its agent cannot run here (`why`: not installed, another version), or when the namespaces
    cannot be made (that needs root); fail it instead where TRIMFLOW_REQUIRE_AGENT_CLIS=1 (CI) requires the agent,
    which an on-demand one never is."""
    if why is None and not unshare_works():
        why = "unshare --net --pid does not work here (it needs root): the agents run with loopback only"
    if why is None:
        return
    if os.environ.get("TRIMFLOW_REQUIRE_AGENT_CLIS") == "1" and not on_demand:
        pytest.fail(why)
    pytest.skip(why)


def installed_version(prefix: Path, package: str, command: str) -> str | None:
    """The version of `package` installed in the npm prefix, with its `command`, or None."""
    manifest = prefix / "node_modules" / package / "package.json"
    if not (prefix / "node_modules" / ".bin" / command).exists() or not manifest.exists():
        return None
    return str(orjson.loads(manifest.read_bytes())["version"])


# The npm agent CLIs the launcher sets up by name, by their command (Kilo Code's on demand).
PACKAGES = {
    "claude": "@anthropic-ai/claude-code",
    "codex": "@openai/codex",
    "gemini": "@google/gemini-cli",
    "opencode": "opencode-ai",
    "qwen": "@qwen-code/qwen-code",
    "kilo": "@kilocode/cli",
}
ON_DEMAND = {"kilo"}
# The Python agents (scripts/setup's PYTHON_AGENTS), each in .tools/venvs/NAME, by their command.
VENV_COMMANDS = {"aider": "aider", "hermes": "hermes"}


def need(cli: str) -> None:
    """Skip (or fail, where CI requires the CLIs) unless `cli` is installed at the version scripts/setup pins."""
    package = PACKAGES[cli]
    version = installed_version(ROOT / ".tools", package, cli)
    install = "scripts/setup --agent-clis=all" if cli in ON_DEMAND else "scripts/setup --agent-clis"
    why = None
    if version is None:
        why = f"{cli} is not installed: {install} (needs npm)"
    elif version != npm_pins()[package]:
        why = f"{cli} {version} is installed, scripts/setup pins {npm_pins()[package]}: {install}"
    require_agent(why, on_demand=cli in ON_DEMAND)


def need_venv(agent: str) -> None:
    """need() for a Python agent: its venv in .tools/venvs at the requirement scripts/setup pins."""
    why = None
    venv = AGENT_VENVS / agent
    stamp = venv / ".trimflow-stamp"
    installed = stamp.read_text().strip() if stamp.exists() else None
    if installed is None or not (venv / "bin" / VENV_COMMANDS[agent]).exists():
        why = f"{agent} is not installed: scripts/setup --agent-clis (puts {python_pins()[agent]} in .tools/venvs/{agent})"
    elif installed != python_pins()[agent]:
        why = f"{installed} is installed, scripts/setup pins {python_pins()[agent]}: scripts/setup --agent-clis"
    require_agent(why)


def shipped_cap(model: str, path: str = "/v1/chat/completions") -> int:
    """The image cap the shipped rules set for the fake provider's host (localhost), this path and this model."""
    cap = load_rules(DEFAULT_RULES_PATH).limits_for("localhost", path, model).max_images
    assert cap is not None
    return cap


def launcher_records(stderr: str) -> list[dict[str, Any]]:
    """The run's metrics records, from the file the launcher's exit summary names."""
    found = re.search(r"^trimflow: every turn: scripts/audit (.+?) · proxy log:", stderr, re.MULTILINE)
    assert found is not None, stderr[-3000:]
    (path,) = shlex.split(found.group(1))
    return [orjson.loads(line) for line in Path(path).read_bytes().splitlines() if line.strip()]


def assert_one_conversation(records: list[dict[str, Any]], stderr: str, agent: str) -> None:
    """The session's LLM requests are one conversation numbered 1..N in the records, and the exit summary says one."""
    turns = [r for r in records if r.get("turn") is not None]
    assert [r["turn"] for r in turns] == list(range(1, len(turns) + 1)), [(r["conversation"], r["turn"]) for r in turns]
    assert len({r["conversation"] for r in turns}) == 1
    assert re.search(rf"^trimflow: {agent} exited 0; \d+ LLM requests in 1 conversation through trimflow$", stderr, re.MULTILINE), stderr[-3000:]


def run_session(tmp_path: Path, **session: Any) -> dict[str, Any]:
    """Run one session in a new folder of `tmp_path` (see run_in)."""
    return run_in(tmp_path / "work", **session)


def run_in(work: Path, **session: Any) -> dict[str, Any]:
    """Run one session in `work` (made if new; its session file goes beside it), in namespaces of its own
    (UNSHARE): loopback only, and nothing left running after; its result."""
    work.mkdir(exist_ok=True)
    config = work.parent / "session.json"
    config.write_bytes(orjson.dumps({"workdir": str(work), "final": FINAL, **session}))
    inside = 'ip link set lo up && exec "$@"'
    command = [*UNSHARE, "sh", "-c", inside, "sh", sys.executable, "-m", "tests.e2e.agent_session", str(config)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, timeout=400)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    result: dict[str, Any] = orjson.loads((work / "result.json").read_bytes())
    result["work"] = work
    return result


def turns(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The LLM requests that are turns (token counts left out)."""
    return [r for r in result["requests"] if r["format"] is not None and not r["path"].endswith((":countTokens", "/count_tokens"))]


def summary_figures(stderr: str) -> tuple[int, int, int]:
    """(images sent, pruned, input tokens reported) over the summary's conversation lines."""
    lines = [line for line in stderr.splitlines() if line.startswith("trimflow:   ") and "all:" not in line]
    assert lines, stderr[-3000:]
    sent = sum(int(m.group(1).replace(",", "")) for m in (re.search(r"images sent ([\d,]+)", line) for line in lines) if m)
    pruned = sum(int(m.group(1).replace(",", "")) for m in (re.search(r"pruned ([\d,]+)", line) for line in lines) if m)
    reported = sum(int(m.group(1).replace(",", "")) for m in (re.search(r"reported in ([\d,]+)", line) for line in lines) if m)
    return sent, pruned, reported


def assert_summary_is_what_the_provider_received(result: dict[str, Any], agent: str) -> None:
    stderr = result["stderr"]
    assert re.search(rf"^trimflow: {agent} exited 0; ", stderr, re.MULTILINE), stderr[-3000:]
    sent, pruned, reported = summary_figures(stderr)
    llm = [r for r in result["requests"] if r["format"] is not None]
    assert sent == sum(len(r["images"]) for r in llm)
    assert pruned > 0
    assert reported == sum(r["input_tokens"] for r in turns(result))
    assert launcher_records(stderr)  # the file the summary names, with the run's records


# --- the session, inside the namespace ------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    session = orjson.loads(Path(argv[0]).read_bytes())
    work = Path(session["workdir"])
    home = work / "home"
    home.mkdir(parents=True, exist_ok=True)
    shots = []
    for i in range(session["shots"]):
        path = work / f"screen-{i + 1:02d}.png"
        path.write_bytes(image(200, 120, "PNG", seed=1000 + i))  # noise: each screenshot different, none compresses away
        shots.append(path)
    result: dict[str, Any] = {"shots": [digest(p.read_bytes()) for p in shots]}
    script: AgentScript | AddedImagesScript
    if session.get("added_images"):
        script = AddedImagesScript([str(p) for p in shots], session["final"])
    else:
        script = AgentScript([str(p) for p in shots], session["final"], recall=bool(session.get("recall")))
    tls: dict[str, str] = {}
    if session.get("tls"):  # the provider on HTTPS as localhost, its certificate in {cert}
        cert, key = make_server_cert(work / "certs", "provider")
        tls = {"certfile": str(cert), "keyfile": str(key)}
    with FakeProvider(script=script, **tls) as provider:
        url = provider.url.replace("127.0.0.1", "localhost") if tls else provider.url
        values = {"provider": url, "work": str(work), "proxy": "", "cert": tls.get("certfile", "")}
        for name, text in session.get("files", {}).items():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            (work / name).write_text(fill(text, values))  # JSON's own braces stay: only the placeholders are replaced
        proxy = None
        if "proxy_args" in session:  # a by-hand recipe: the proxy on its own, the command pointed at it
            args = [arg.format(**values) for arg in session["proxy_args"]]
            log = open(work / "proxy.log", "wb")  # noqa: SIM115 - handed to the child process
            proxy = subprocess.Popen([sys.executable, "-m", "trimflow", "run", "-p", "0", *args], stdout=log, stderr=subprocess.STDOUT, cwd=work)
            log.close()
            values["proxy"] = f"http://127.0.0.1:{proxy_port(proxy, work / 'proxy.log')}"
        command = [arg.format(**values) for arg in session["command"]]
        if "launcher_args" in session:
            launcher = [arg.format(**values) for arg in session["launcher_args"]]
            command = [sys.executable, "-m", "trimflow", "run", *launcher, "--", *command]
        # The agent's venv after trimflow's, whose python and mitmdump the launcher runs.
        venv = [str(AGENT_VENVS / session["venv"] / "bin")] if "venv" in session else []
        path = [*session.get("path", []), str(TOOLS_BIN), str(Path(sys.executable).parent), *venv, os.environ.get("PATH", "/usr/bin:/bin")]
        env = {
            "PATH": os.pathsep.join(path),
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(ROOT / "addon"),
            **{name: value.format(**values) for name, value in session.get("env", {}).items()},
        }
        started = time.monotonic()
        try:
            stdin: dict[str, Any] = {"input": session["input"].encode()} if "input" in session else {"stdin": subprocess.DEVNULL}
            done = subprocess.run(command, cwd=work, env=env, capture_output=True, timeout=session.get("timeout", 240), **stdin)
            result.update(returncode=done.returncode, stdout=done.stdout.decode(errors="replace"), stderr=done.stderr.decode(errors="replace"))
        except subprocess.TimeoutExpired as exc:
            result.update(returncode=None, stdout=(exc.stdout or b"").decode(errors="replace"), stderr=(exc.stderr or b"").decode(errors="replace"))
        result["seconds"] = round(time.monotonic() - started, 2)
        if proxy is not None:
            proxy.terminate()
            proxy.wait(30)
            result["proxy_log"] = (work / "proxy.log").read_text(errors="replace")
        result["requests"] = [request_facts(r) for r in provider.received]
        result["tool_calls"] = script.calls if isinstance(script, AgentScript) else None
        result["recalled"] = script.recalled if isinstance(script, AgentScript) else None
        result["answers"] = script.answers if isinstance(script, AddedImagesScript) else None
    (work / "result.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
