"""Each agent's setup behind the proxy: mitmdump's mode, the agent's command line and environment.

Claude Code gets its base URL, Codex `-c` overrides (TOML), Gemini CLI a private copy of its settings (JSON with
comments); any other command, or an agent that signs in without an API key, forward mode with a CA bundle. The coding
agents known by name in forward mode (FORWARD_AGENTS) get the run's MCP server each its own way (docs/agents.md#recall)."""

from __future__ import annotations

import json
import os
import stat
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from .._recall import TOOL
from ._launch_error import LaunchError
from ._run_dir import PRIVATE_MODE, digest, record_private, write_private

# Forward mode, known by name for the run's MCP server (recall): those that take one for a run get it, the others a line.
FORWARD_AGENTS = ("opencode", "kilo", "qwen", "hermes", "cline", "openclaw", "pi")
AGENTS = ("claude", "codex", "gemini", *FORWARD_AGENTS, "proxy")
PROXY = "proxy"
CA_VARIABLES = ("NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CODEX_CA_CERTIFICATE")
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")
ALL_PROXY_VARIABLES = ("ALL_PROXY", "all_proxy")  # the way out for other schemes, left to the agent

ANTHROPIC_API = "https://api.anthropic.com"
OPENAI_API = "https://api.openai.com/v1"
GEMINI_API = "https://generativelanguage.googleapis.com"
GEMINI_API_KEY_AUTH = "gemini-api-key"
MCP_SERVER = "trimflow"  # the name the recall server is registered under
CLAUDE_MCP_FILE = "claude-mcp.json"  # in the run's folder
QWEN_SETTINGS_FILE = "qwen-system-settings.json"  # in the run's folder
QWEN_SYSTEM_SETTINGS = Path("/etc/qwen-code/settings.json")  # Qwen Code's on Linux, unless QWEN_CODE_SYSTEM_SETTINGS_PATH
HERMES_MANAGED_DIR = Path("/etc/hermes")  # Hermes Agent's managed scope on Linux, unless HERMES_MANAGED_DIR
# The proxy's address in a setup made before mitmdump has bound the port the kernel chose for it (Setup.at gives the
# setup at the real one): a reserved name (RFC 2606), so no address a user gives is taken for it.
PENDING = "http://trimflow-proxy.invalid"


@dataclass
class Setup:
    """How to run the command behind the proxy: mitmdump's mode and options, the command line, its environment."""

    agent: str
    mode: str  # "regular", "reverse:ORIGIN" or "upstream:PROXY"
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    options: dict[str, str] = field(default_factory=dict)  # --set values for mitmdump (the user's win)
    notes: list[str] = field(default_factory=list)  # said before the command starts
    ca_bundle: bool = False  # forward mode: the CA variables point at a bundle written once the proxy runs
    private_dirs: list[Path] = field(default_factory=list)  # made for this run, removed after it
    upstream: str | None = None  # where the requests go on to, without credentials
    upstream_auth: str | None = None  # user:password for an upstream proxy, never on mitmdump's command line

    def at(self, listen: str) -> Setup:
        """This setup, made for the proxy at PENDING, for the proxy at `listen` (http://HOST:PORT): in the
        command line and the environment, where the agent is told the proxy's address."""
        pending, bound = PENDING.removeprefix("http://"), listen.removeprefix("http://")
        command = [item.replace(pending, bound) for item in self.command]
        return replace(self, command=command, env={name: value.replace(pending, bound) for name, value in self.env.items()})


def agent_of(command: Sequence[str], chosen: str | None) -> str:
    if chosen is not None:
        return chosen
    name = Path(command[0]).name.removesuffix(".exe").removesuffix(".js")
    return name if name in AGENTS and name != PROXY else PROXY


def without_credentials(url: str) -> tuple[str, str | None]:
    """The URL without its `user:password@`, and those as mitmproxy's upstream_auth (`user:password`, decoded)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    return urlunsplit(parts._replace(netloc=host)), f"{unquote(user)}:{unquote(password)}"


def proxy_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """mitmdump's environment: the user's without the proxy variables that hold a `user:password@` (any of the
    user's processes can read it in /proc). mitmdump's way out is its mode, and an upstream proxy's credentials
    reach it through a pipe."""
    variables = {*PROXY_VARIABLES, *ALL_PROXY_VARIABLES}
    return {name: value for name, value in environ.items() if name not in variables or "@" not in value}


def userinfo(url: str) -> str:
    """The `user:password@` of a URL as written, or ''."""
    netloc = urlsplit(url).netloc
    return netloc.rpartition("@")[0] + "@" if "@" in netloc else ""


def split_url(url: str) -> tuple[str, str]:
    """(origin, path) of a base URL: reverse mode goes to the origin (without credentials), and the client keeps the path."""
    shown, _ = without_credentials(url)
    parts = urlsplit(shown)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise LaunchError(f"trimflow run: {shown!r} is not an http(s) URL")
    return f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")


def _at_proxy(listen: str, url: str, path: str) -> str:
    """The agent's base URL for the proxy: the credentials of its own base URL (the client sends them) and its path."""
    return listen.replace("://", "://" + userinfo(url), 1) + path


def setup_for(
    agent: str,
    command: Sequence[str],
    environ: Mapping[str, str],
    listen: str,
    run_dir: Path,
    home: Path | None = None,
    recall: Sequence[str] | None = None,
) -> Setup:
    """The setup of `agent` for `command`; `listen` is the proxy's http://HOST:PORT. `recall`: the argv of the run's
    MCP server (trimflow.cli._mcp), registered with the agents that take one (docs/agents.md#recall)."""
    home = home if home is not None else Path(environ.get("HOME") or Path.home())
    if agent == "claude":
        setup = _claude(command, environ, listen)
        if recall:
            _claude_recall(setup, recall, run_dir)
        return setup
    if agent == "codex":
        setup = _codex(command, environ, listen, home)
        if recall:
            _codex_recall(setup, recall)
        return setup
    if agent == "gemini":
        setup = _gemini(command, environ, listen, run_dir, home, recall)
        if recall and setup.ca_bundle:  # signed in otherwise: its own settings, which the launcher leaves alone
            setup.notes.append("trimflow run: recall_image is not registered with gemini: it signs in without an API key (docs/agents.md#recall)")
        return setup
    if agent in FORWARD_AGENTS:
        setup = forward_setup(agent, command, environ, listen)
        if recall:
            _forward_recall(setup, environ, run_dir, recall)
        return setup
    return forward_setup(PROXY, command, environ, listen)


def _before_separator(command: list[str], args: list[str]) -> list[str]:
    """`args` added to a command line at its end, or before its `--` (after which all is the command's operands)."""
    at = command.index("--", 1) if "--" in command[1:] else len(command)
    return command[:at] + args + command[at:]


def _claude_recall(setup: Setup, server: Sequence[str], run_dir: Path) -> None:
    """Claude Code: `--mcp-config` with a file of the run (its own servers stay), the tool always loaded (never deferred
    behind its tool search: the placeholders name it) and allowed (it only reads images this run cut), so `-p` can call it."""
    config = {"mcpServers": {MCP_SERVER: {"type": "stdio", "command": server[0], "args": list(server[1:]), "alwaysLoad": True}}}
    path = run_dir / CLAUDE_MCP_FILE
    write_private(path, json.dumps(config).encode())
    setup.command = _before_separator(setup.command, ["--mcp-config", str(path), "--allowedTools", f"mcp__{MCP_SERVER}__{TOOL}"])


def _codex_recall(setup: Setup, server: Sequence[str]) -> None:
    """Codex: a `-c` override before its subcommand; its tool approved (it only reads images this run cut)."""
    table = {"command": server[0], "args": list(server[1:]), "startup_timeout_sec": 30, "default_tools_approval_mode": "approve"}
    setup.command[1:1] = ["-c", f"mcp_servers.{MCP_SERVER}={_toml(table)}"]


def forward_setup(agent: str, command: Sequence[str], environ: Mapping[str, str], listen: str, note: str | None = None) -> Setup:
    theirs = next((environ[name] for name in PROXY_VARIABLES[:2] if environ.get(name)), None)
    auth = None
    if theirs is not None:
        # As curl reads it: a proxy without a scheme is http://.
        theirs, auth = without_credentials(theirs if "://" in theirs else f"http://{theirs}")
        if auth is not None and auth.startswith(":"):  # mitmproxy would refuse it, printing it whole
            raise LaunchError(f"trimflow run: the proxy {theirs} in HTTPS_PROXY has a password but no user name")
    mode = f"upstream:{theirs}" if theirs else "regular"
    setup = Setup(agent, mode, list(command), env=dict.fromkeys(PROXY_VARIABLES, listen), ca_bundle=True, upstream=theirs, upstream_auth=auth)
    if note:
        setup.notes.append(note)
    return setup


def _claude(command: Sequence[str], environ: Mapping[str, str], listen: str) -> Setup:
    upstream = environ.get("ANTHROPIC_BASE_URL") or ANTHROPIC_API
    origin, path = split_url(upstream)
    env = {"ANTHROPIC_BASE_URL": _at_proxy(listen, upstream, path)}
    return Setup("claude", f"reverse:{origin}", list(command), env=env, upstream=origin + path)


# Codex: -c overrides, parsed as TOML by Codex; a JSON string is a TOML basic string.
def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key} = {_toml(item)}" for key, item in value.items()) + "}"
    return json.dumps(value)


def codex_overrides(command: Sequence[str]) -> dict[str, str]:
    """The `-c key=value` / `--config key=value` overrides already on a Codex command line, values as written."""
    found: dict[str, str] = {}
    items = iter(command[1:])
    for item in items:
        if item == "--":
            break
        value = None
        if item in ("-c", "--config"):
            value = next(items, None)
        elif item.startswith("--config="):
            value = item[len("--config=") :]
        elif item.startswith("-c") and len(item) > 2:
            value = item[2:]
        if value is not None and "=" in value:
            key, _, raw = value.partition("=")
            found[key.strip()] = raw.strip()
    return found


def _toml_value(raw: str) -> Any:
    """A -c value as Codex reads it: TOML, else the raw text."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _codex(command: Sequence[str], environ: Mapping[str, str], listen: str, home: Path) -> Setup:
    codex_home = Path(environ.get("CODEX_HOME") or home / ".codex")
    config: dict[str, Any] = {}
    notes: list[str] = []
    try:
        config = tomllib.loads((codex_home / "config.toml").read_text(encoding="utf-8"))
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        notes.append(f"trimflow run: cannot read {codex_home / 'config.toml'} ({type(exc).__name__}): going by the defaults")
    given = {key: _toml_value(raw) for key, raw in codex_overrides(command).items()}
    provider = str(given.get("model_provider") or config.get("model_provider") or "openai")
    websocket = {"trimflow_websocket": "refuse"}
    head, tail = [command[0]], list(command[1:])
    if provider != "openai":
        table = dict((config.get("model_providers") or {}).get(provider) or {})
        prefix = f"model_providers.{provider}."
        table.update({key[len(prefix) :]: value for key, value in given.items() if key.startswith(prefix)})
        base = table.get("base_url")
        if not isinstance(base, str) or userinfo(base):
            why = "holds credentials (a -c override would show them to every local user)" if isinstance(base, str) else "is missing"
            note = f"trimflow run: the base_url of Codex's provider {provider!r} {why}: forward mode"
            setup = forward_setup("codex", command, environ, listen, note)
            setup.options.update(websocket)
            return setup
        origin, path = split_url(base)
        overrides = {f"{prefix}base_url": listen + path, f"{prefix}wire_api": "responses", f"{prefix}supports_websockets": False}
        args = [item for key, value in overrides.items() for item in ("-c", f"{key}={_toml(value)}")]
        return Setup("codex", f"reverse:{origin}", head + args + tail, options=websocket, notes=notes, upstream=origin + path)
    key = next((name for name in ("OPENAI_API_KEY", "CODEX_API_KEY") if environ.get(name)), None)
    if key is None:
        note = "trimflow run: no OPENAI_API_KEY for Codex, so it uses its sign-in (ChatGPT): forward mode, its CA in CODEX_CA_CERTIFICATE"
        setup = forward_setup("codex", command, environ, listen, note)
        setup.options.update(websocket)
        return setup
    base = given.get("openai_base_url") or config.get("openai_base_url") or environ.get("OPENAI_BASE_URL") or OPENAI_API
    if userinfo(str(base)):
        note = "trimflow run: Codex's base URL holds credentials (a -c override would show them to every local user): forward mode"
        setup = forward_setup("codex", command, environ, listen, note)
        setup.options.update(websocket)
        return setup
    origin, path = split_url(str(base))
    table = {"name": "trimflow", "base_url": listen + path, "wire_api": "responses", "env_key": key, "supports_websockets": False}
    args = ["-c", 'model_provider="trimflow"', "-c", f"model_providers.trimflow={_toml(table)}"]
    return Setup("codex", f"reverse:{origin}", head + args + tail, options=websocket, notes=notes, upstream=origin + path)


def _read_settings(path: Path) -> dict[str, Any] | None:
    """Gemini CLI's settings.json (JSON with comments); {} when there is none, None when it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError):
        return None
    return _json_object(text)


def _json_object(text: str) -> dict[str, Any] | None:
    """A JSON object (with comments), or None."""
    try:
        data = json.loads(_strip_json_comments(text))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _strip_json_comments(text: str) -> str:
    out, i, quoted = [], 0, False
    while i < len(text):
        c = text[i]
        if quoted:
            out.append(c)
            if c == "\\":
                out.append(text[i + 1 : i + 2])
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
            out.append(c)
        elif text.startswith("//", i):
            i = text.find("\n", i)
            i = len(text) if i < 0 else i - 1
        elif text.startswith("/*", i):
            i = text.find("*/", i + 2)
            i = len(text) if i < 0 else i + 1
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _gemini(command: Sequence[str], environ: Mapping[str, str], listen: str, run_dir: Path, home: Path, recall: Sequence[str] | None = None) -> Setup:
    user_home = Path(environ.get("GEMINI_CLI_HOME") or home)
    user_dir = user_home / ".gemini"
    settings = _read_settings(user_dir / "settings.json")
    if settings is None:
        note = f"trimflow run: cannot read {user_dir / 'settings.json'}: Gemini CLI in forward mode"
        return forward_setup("gemini", command, environ, listen, note)
    auth = settings.get("security", {}).get("auth", {}) if isinstance(settings.get("security"), dict) else {}
    selected = auth.get("selectedType") if isinstance(auth, dict) else None
    if not environ.get("GEMINI_API_KEY") or selected not in (None, GEMINI_API_KEY_AUTH):
        why = f"its settings select {selected!r}" if selected not in (None, GEMINI_API_KEY_AUTH) else "no GEMINI_API_KEY"
        note = f"trimflow run: Gemini CLI signs in without an API key ({why}): forward mode, its CA in NODE_EXTRA_CA_CERTS"
        return forward_setup("gemini", command, environ, listen, note)
    upstream = environ.get("GOOGLE_GEMINI_BASE_URL") or GEMINI_API
    origin, path = split_url(upstream)
    env = {"GOOGLE_GEMINI_BASE_URL": _at_proxy(listen, upstream, path)}
    setup = Setup("gemini", f"reverse:{origin}", list(command), env=env, upstream=origin + path)
    if selected is None or recall:
        private = run_dir / "gemini-home"
        entries = gemini_settings(settings, user_dir, private / ".gemini", recall)
        record_private(run_dir, {"agent": "Gemini CLI", "folder": "gemini-home/.gemini", "user": str(user_dir), "entries": entries})
        setup.env["GEMINI_CLI_HOME"] = str(private)
        setup.private_dirs.append(private)
    return setup


def gemini_settings(settings: dict[str, Any], user_dir: Path, private_dir: Path, recall: Sequence[str] | None = None) -> dict[str, str]:
    """A .gemini folder for GEMINI_CLI_HOME: the user's settings selecting the API key (with the mode of the user's
    file: it may hold MCP servers' tokens) and, with `recall`, the run's MCP server among theirs (trusted: it only reads
    images this run cut); every other entry a link into the user's own folder (its sessions and history land there,
    as without the launcher). Returns what each entry is, to find what the agent changed."""
    private_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    merged = dict(settings)
    security = dict(merged.get("security") or {})
    security["auth"] = {**(security.get("auth") or {}), "selectedType": GEMINI_API_KEY_AUTH}
    merged["security"] = security
    if recall:
        servers = merged.get("mcpServers")
        ours = {"command": recall[0], "args": list(recall[1:]), "trust": True}
        merged["mcpServers"] = {**(servers if isinstance(servers, dict) else {}), MCP_SERVER: ours}
    try:
        mode = stat.S_IMODE(os.stat(user_dir / "settings.json").st_mode)
    except OSError:
        mode = PRIVATE_MODE
    text = (json.dumps(merged, indent=2) + "\n").encode()
    write_private(private_dir / "settings.json", text, mode)
    entries = {"settings.json": digest(text)}
    for name in ("tmp", "history"):  # what Gemini CLI writes a session into, made where it would make it
        (user_dir / name).mkdir(parents=True, exist_ok=True)
    for entry in user_dir.iterdir():
        if entry.name != "settings.json":
            (private_dir / entry.name).symlink_to(entry)
            entries[entry.name] = f"link:{entry}"
    return entries


# --- recall for the coding agents in forward mode: each takes the run's server its own way, or gets one line why not


def _forward_recall(setup: Setup, environ: Mapping[str, str], run_dir: Path, server: Sequence[str]) -> None:
    how = {
        "opencode": lambda: _inline_config(setup, environ, server, "OPENCODE_CONFIG_CONTENT"),
        "kilo": lambda: _inline_config(setup, environ, server, "KILO_CONFIG_CONTENT"),
        "qwen": lambda: _qwen_recall(setup, environ, run_dir, server),
        "hermes": lambda: _hermes_recall(setup, environ, run_dir, server),
    }.get(setup.agent)
    why = how() if how is not None else NOT_REGISTERED[setup.agent]
    if why is not None:
        setup.notes.append(f"trimflow run: recall_image is not registered with {setup.agent}: {why} (docs/agents.md#recall)")


NOT_REGISTERED = {
    "pi": "pi takes no MCP server",
    "cline": "its sessions may run in its hub, a daemon that outlives the run with the settings it started with",
    "openclaw": "it takes MCP servers from its own config file only",
}


def _inline_config(setup: Setup, environ: Mapping[str, str], server: Sequence[str], variable: str) -> str | None:
    """opencode, Kilo Code: the config in `variable` (merged over every config file; mcp servers by name), the
    user's own inline config kept in it. The tool is allowed by default."""
    config = _json_object(environ.get(variable) or "{}")
    if config is None:
        return f"{variable} is not a JSON object"
    servers = config.get("mcp")
    config["mcp"] = {**(servers if isinstance(servers, dict) else {}), MCP_SERVER: {"type": "local", "command": list(server), "enabled": True}}
    setup.env[variable] = json.dumps(config)
    return None


def _qwen_recall(setup: Setup, environ: Mapping[str, str], run_dir: Path, server: Sequence[str]) -> str | None:
    """Qwen Code: its system settings (merged over the user's and the project's; mcpServers by name) a copy of the
    run, the system's own settings kept in it and its system defaults where they were. `--mcp-config` is no way:
    Qwen Code's subcommands (`qwen mcp list`) refuse it. Trusted (it only reads images this run cut) and always
    loaded, never deferred behind its tool search: the placeholders name it."""
    system = Path(environ.get("QWEN_CODE_SYSTEM_SETTINGS_PATH") or QWEN_SYSTEM_SETTINGS)
    settings = _read_settings(system)
    if settings is None:
        return f"cannot read {system}"
    servers, ours = settings.get("mcpServers"), {"command": server[0], "args": list(server[1:]), "trust": True, "alwaysLoadTools": True}
    settings["mcpServers"] = {**(servers if isinstance(servers, dict) else {}), MCP_SERVER: ours}
    # Goes with the run, changed or not: Qwen Code adds its `$version` to the settings it reads.
    write_private(run_dir / QWEN_SETTINGS_FILE, (json.dumps(settings, indent=2) + "\n").encode())
    setup.env["QWEN_CODE_SYSTEM_SETTINGS_PATH"] = str(run_dir / QWEN_SETTINGS_FILE)
    # Beside the system settings unless set: where they are, not in the run's folder.
    setup.env["QWEN_CODE_SYSTEM_DEFAULTS_PATH"] = environ.get("QWEN_CODE_SYSTEM_DEFAULTS_PATH") or str(system.with_name("system-defaults.json"))
    return None


def _hermes_recall(setup: Setup, environ: Mapping[str, str], run_dir: Path, server: Sequence[str]) -> str | None:
    """Hermes Agent: a managed scope of the run (HERMES_MANAGED_DIR, a config.yaml merged over the user's leaf by
    leaf), holding only the server. A managed scope already there (an administrator's) is not replaced."""
    theirs = environ.get("HERMES_MANAGED_DIR", "").strip()
    if theirs or HERMES_MANAGED_DIR.is_dir():
        return f"its managed scope ({theirs or HERMES_MANAGED_DIR}) is an administrator's, which the launcher does not replace"
    folder = run_dir / "hermes-managed"
    folder.mkdir(mode=0o700)
    config = {"mcp_servers": {MCP_SERVER: {"command": server[0], "args": list(server[1:])}}}
    write_private(folder / "config.yaml", json.dumps(config, indent=2).encode())  # JSON is YAML
    setup.env["HERMES_MANAGED_DIR"] = str(folder)
    return None
