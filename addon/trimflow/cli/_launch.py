"""`python -m trimflow run [OPTIONS] -- COMMAND [ARGS...]`: run COMMAND with trimflow in front of its LLM provider.

The launcher starts mitmdump with trimflow's addons on a free loopback port (in a session of its own, so
the terminal's signals do not reach it), waits until it listens, runs COMMAND pointed at it, stops it when
COMMAND ends and exits with COMMAND's status (128+N when a signal N ended it; 127 when there is no such
command). COMMAND runs in a process group of its own that gets the terminal: Ctrl-C reaches the agent and
nothing else, and a SIGINT, SIGTERM, SIGHUP or SIGQUIT sent to the launcher is passed on to the agent.

Known agents get their own setup, and no file of the user's is edited:
- `claude` (Claude Code): reverse mode in front of ANTHROPIC_BASE_URL (default https://api.anthropic.com).
- `codex` (Codex): reverse mode, and a provider with `wire_api = "responses"` given with `-c` overrides, over
  HTTP, so every turn carries its whole history; in front of the provider's base URL in Codex's config, or
  `openai_base_url`, or OPENAI_BASE_URL, else https://api.openai.com/v1. trimflow_websocket=refuse answers a
  WebSocket upgrade with 426 all the same. Signed in with ChatGPT (no API key in the environment), forward mode.
- `gemini` (Gemini CLI): reverse mode in front of GOOGLE_GEMINI_BASE_URL (default the Gemini API), with
  GEMINI_API_KEY; when the user's settings select no auth type, a private GEMINI_CLI_HOME whose settings are
  theirs plus `security.auth.selectedType = "gemini-api-key"` (everything else in it links to their ~/.gemini).
  Signed in with Google or Vertex AI, forward mode.
- Anything else (or `--agent proxy`): forward mode, with HTTPS_PROXY and HTTP_PROXY pointing at the proxy and
  a CA bundle (the system's CAs and mitmproxy's) in NODE_EXTRA_CA_CERTS, SSL_CERT_FILE, REQUESTS_CA_BUNDLE and
  CODEX_CA_CERTIFICATE. An HTTPS_PROXY the user had stays their way out: mitmdump runs in upstream mode to it.

Credentials in a URL (`http://user:pass@proxy:3128`, a base URL with a user) never reach an argv, a log line or
a file that outlives the run: an upstream proxy's go to mitmdump as `upstream_auth` in a config.yaml of a confdir
of the run (0600, read at start and removed once mitmdump listens); a base URL's stay with the agent, in the
URL it is given for the proxy (its environment, which only the user can read).

The run's files are the user's alone: the runs folder is 0700 and every file the launcher writes 0600 (a
copied settings file keeps the mode of the user's). mitmdump and the agent get a signal when the launcher
dies, however it dies (PR_SET_PDEATHSIG, Linux), and a run folder whose launcher is gone is removed at the
next start. What the agent wrote into its private settings folder is kept beside the run and named in one line.

Every request's metrics go to a JSONL file of this run (or the trimflow_metrics file given, from where it
stood at start), and at exit one summary per conversation is printed from it by the audit.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import yaml

from . import _run
from .._rules import DEFAULT_RULES_PATH, builtin_rules, load_rules
from .._sizes import format_size
from ..audit import _report
from ..audit._read import InputError, Reader
from ..audit._summary import UNKNOWN_CONVERSATION, Conversation, Totals, summarize

AGENTS = ("claude", "codex", "gemini", "proxy")
PROXY = "proxy"
LISTEN_TIMEOUT = 30.0  # seconds mitmdump may take to listen (a cold start on a busy machine takes a few)
STOP_TIMEOUT = 10.0
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
CA_VARIABLES = ("NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CODEX_CA_CERTIFICATE")
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")
EXIT_NOT_FOUND = 127
EXIT_CANNOT_START = 2

ANTHROPIC_API = "https://api.anthropic.com"
OPENAI_API = "https://api.openai.com/v1"
GEMINI_API = "https://generativelanguage.googleapis.com"
GEMINI_API_KEY_AUTH = "gemini-api-key"

LAUNCHER_FILE = "launcher"  # in a run's folder: the launcher's host, pid and start time, to tell a live run from a stale one
PRIVATE_FILE = "private.json"  # in a run's folder: what the launcher put in each private settings folder
PR_SET_PDEATHSIG = 1  # prctl(2)
MITMDUMP_CONFDIR = "mitmproxy"  # in a run's folder: the confdir whose config.yaml gives mitmdump the upstream's credentials
PRIVATE_MODE = 0o600


class LaunchError(Exception):
    """Why the launcher cannot start: one line, and the exit status."""

    def __init__(self, message: str, status: int = EXIT_CANNOT_START) -> None:
        super().__init__(message)
        self.status = status


# --- the command line ----------------------------------------------------------------------------------------


@dataclass
class Invocation:
    """`run [OPTIONS] -- COMMAND`: the launcher's own options, the rest for mitmdump, and the command."""

    command: list[str]
    mitmdump_args: list[str]
    agent: str | None = None  # --agent: a setup chosen by name, not by the command's name
    host: str = "127.0.0.1"
    port: int | None = None  # the user's -p / --listen-port / --set listen_port
    metrics: str | None = None  # the user's --set trimflow_metrics
    confdir: str | None = None  # the user's --set confdir (where mitmproxy's CA is)
    sets: dict[str, str] = field(default_factory=dict)  # every --set NAME=VALUE the user gave


def parse(args: Sequence[str]) -> Invocation:
    """Split `OPTIONS -- COMMAND`; raise LaunchError for what the launcher must decide itself."""
    split = list(args).index("--")
    options, command = list(args[:split]), list(args[split + 1 :])
    if not command:
        raise LaunchError("trimflow run: nothing to run after --: trimflow run [OPTIONS] -- COMMAND [ARGS...]")
    invocation = Invocation(command, [])
    i = 0
    while i < len(options):
        start, item = i, options[i]
        i += 1
        name, eq, value = item.partition("=")  # --set=NAME=VALUE gives the value NAME=VALUE
        if name in ("--agent", "--mode", "-m", "-p", "--listen-port", "--listen-host", "--set"):
            if not eq:
                value = options[i] if i < len(options) else ""
                i += 1
        elif item.startswith("-p") and item[2:].isdigit():  # -p9000
            name, value = "-p", item[2:]
        elif item.startswith("-m") and not item.startswith("--"):  # -mreverse:URL
            name = "-m"
        else:
            invocation.mitmdump_args.append(item)
            continue
        if name == "--agent":
            if value not in AGENTS:
                raise LaunchError(f"trimflow run: --agent takes one of {', '.join(AGENTS)}, not {value!r}")
            invocation.agent = value
            continue
        if name in ("--mode", "-m"):
            raise LaunchError("trimflow run: with -- the launcher picks the mode for the command; leave --mode out (--agent proxy for forward mode)")
        invocation.mitmdump_args += options[start:i]
        if name == "--set":
            key, _, setting = value.partition("=")
            invocation.sets[key] = setting
            name, value = {"listen_port": "-p", "listen_host": "--listen-host"}.get(key, key), setting
        if name in ("-p", "--listen-port"):
            if not value.isdigit():
                raise LaunchError(f"trimflow run: the listen port must be a number, not {value!r}")
            invocation.port = int(value)
        elif name == "--listen-host":
            invocation.host = value
    invocation.metrics = invocation.sets.get("trimflow_metrics") or None
    invocation.confdir = invocation.sets.get("confdir") or None
    return invocation


# --- what each agent needs -----------------------------------------------------------------------------------


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


def setup_for(agent: str, command: Sequence[str], environ: Mapping[str, str], listen: str, run_dir: Path, home: Path | None = None) -> Setup:
    """The setup of `agent` for `command`; `listen` is the proxy's http://HOST:PORT."""
    home = home if home is not None else Path(environ.get("HOME") or Path.home())
    if agent == "claude":
        return _claude(command, environ, listen)
    if agent == "codex":
        return _codex(command, environ, listen, home)
    if agent == "gemini":
        return _gemini(command, environ, listen, run_dir, home)
    return forward_setup(PROXY, command, environ, listen)


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


def _gemini(command: Sequence[str], environ: Mapping[str, str], listen: str, run_dir: Path, home: Path) -> Setup:
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
    if selected is None:
        private = run_dir / "gemini-home"
        entries = gemini_settings(settings, user_dir, private / ".gemini")
        _record_private(run_dir, {"agent": "Gemini CLI", "folder": "gemini-home/.gemini", "user": str(user_dir), "entries": entries})
        setup.env["GEMINI_CLI_HOME"] = str(private)
        setup.private_dirs.append(private)
    return setup


def gemini_settings(settings: dict[str, Any], user_dir: Path, private_dir: Path) -> dict[str, str]:
    """A .gemini folder for GEMINI_CLI_HOME: the user's settings selecting the API key (with the mode of the user's
    file: it may hold MCP servers' tokens), every other entry a link into the user's own folder (its sessions and
    history land there, as without the launcher). Returns what each entry is, to find what the agent changed."""
    private_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    merged = dict(settings)
    security = dict(merged.get("security") or {})
    security["auth"] = {**(security.get("auth") or {}), "selectedType": GEMINI_API_KEY_AUTH}
    merged["security"] = security
    try:
        mode = stat.S_IMODE(os.stat(user_dir / "settings.json").st_mode)
    except OSError:
        mode = PRIVATE_MODE
    text = (json.dumps(merged, indent=2) + "\n").encode()
    write_private(private_dir / "settings.json", text, mode)
    entries = {"settings.json": _digest(text)}
    for name in ("tmp", "history"):  # what Gemini CLI writes a session into, made where it would make it
        (user_dir / name).mkdir(parents=True, exist_ok=True)
    for entry in user_dir.iterdir():
        if entry.name != "settings.json":
            (private_dir / entry.name).symlink_to(entry)
            entries[entry.name] = f"link:{entry}"
    return entries


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _record_private(run_dir: Path, folder: dict[str, Any]) -> None:
    path = run_dir / PRIVATE_FILE
    try:
        folders = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        folders = []
    write_private(path, json.dumps([*folders, folder]).encode())


def write_private(path: Path, data: bytes, mode: int = PRIVATE_MODE) -> None:
    """Write a file of the run with `mode` from its creation on (never through a link planted in its place)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


# --- the run -------------------------------------------------------------------------------------------------


def state_dir(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_STATE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "trimflow" / "runs"


def private_folder(path: Path) -> None:
    """Make `path` a folder only its owner can enter; a LaunchError when it is someone else's or not a folder."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.stat(path)
    except OSError as exc:
        raise LaunchError(f"trimflow run: cannot make {path} ({exc.strerror or type(exc).__name__})") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise LaunchError(f"trimflow run: {path} is not a folder of yours: the run's files cannot be kept private there")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)


def _start_time(pid: int) -> str | None:
    """A process's start time (Linux /proc), which tells it from a later process given the same pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else None


def _running(pid: int, started: str | None) -> bool:
    if Path("/proc/self/stat").exists():
        now = _start_time(pid)
        return now is not None and (started is None or now == started)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def new_run_dir(runs: Path, stem: str) -> Path:
    """The run's own folder (0700), marked with the launcher's host, pid and start time."""
    run_dir = runs / stem
    run_dir.mkdir(mode=0o700)
    write_private(run_dir / LAUNCHER_FILE, f"{socket.gethostname()} {os.getpid()} {_start_time(os.getpid()) or '-'}\n".encode())
    return run_dir


def clean_stale_runs(runs: Path) -> list[str]:
    """Remove the folders of runs whose launcher is gone (killed before it could clean up); lines to say."""
    lines: list[str] = []
    try:
        entries = sorted(runs.iterdir())
    except OSError:
        return lines
    for entry in entries:
        if entry.is_symlink() or not entry.is_dir():
            continue
        try:
            host, pid, started = (entry / LAUNCHER_FILE).read_text(encoding="utf-8").split()
        except (OSError, UnicodeDecodeError, ValueError):
            host, pid, started = socket.gethostname(), entry.name.rpartition("-")[2], "-"  # being made now, or older
        if host != socket.gethostname():  # a home shared with another machine: its pids are not this one's
            continue
        if pid.isdigit() and not _running(int(pid), None if started == "-" else started):
            lines += finish_run_dir(entry)
    return lines


def finish_run_dir(run_dir: Path) -> list[str]:
    """Remove a run's folder. What the agent wrote into a private settings folder (a changed settings file, a new
    one) is moved to `<run>.<folder>` beside it first and named in one line: it is the user's to keep or drop,
    and their own files are never overwritten."""
    lines = []
    try:
        folders = json.loads((run_dir / PRIVATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        folders = []
    for folder in folders if isinstance(folders, list) else []:
        try:
            relative = Path(str(folder["folder"]))
            if relative.is_absolute() or ".." in relative.parts:
                continue
            private, entries = run_dir / relative, dict(folder["entries"])
            changed = [entry for entry in sorted(private.iterdir()) if _changed(entry, entries.get(entry.name))]
        except (OSError, KeyError, TypeError, ValueError):
            continue
        if not changed:
            continue
        kept = run_dir.with_name(f"{run_dir.name}.{Path(str(folder['folder'])).name.lstrip('.')}")
        names = ", ".join(entry.name for entry in changed)
        try:
            private_folder(kept)
            for entry in changed:
                os.rename(entry, kept / entry.name)
        except (OSError, LaunchError) as exc:
            lines.append(f"trimflow run: {folder.get('agent')} wrote {names} in its private settings folder, left in {private} ({exc})")
            return lines  # the folder stays, with them
        lines.append(f"trimflow run: {folder.get('agent')} wrote {names} in its private settings folder, not in {folder.get('user')}: kept in {kept}")
    shutil.rmtree(run_dir, ignore_errors=True)  # links into the user's folder are removed, never followed
    return lines


def _changed(entry: Path, expected: str | None) -> bool:
    """Whether an entry of a private settings folder is not what the launcher put there."""
    if expected is None:
        return True
    if expected.startswith("link:"):
        return not entry.is_symlink() or os.readlink(entry) != expected.removeprefix("link:")
    if entry.is_symlink() or not entry.is_file():
        return True
    return _digest(entry.read_bytes()) != expected


def mitmdump_confdir(run_dir: Path, user_confdir: Path, auth: str) -> Path:
    """A confdir of the run whose config.yaml gives mitmdump `upstream_auth` off its command line: the user's own
    config.yaml (mitmdump reads it from the confdir), the credentials, and `confdir` back to the user's (its CA)."""
    options: dict[str, Any] = {}
    for name in ("config.yaml", "config.yml"):  # in mitmproxy's order, the later one winning
        path = user_confdir / name
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise LaunchError(f"trimflow run: cannot read {path} ({type(exc).__name__})") from None
        if loaded is None:
            continue
        if not isinstance(loaded, dict):
            raise LaunchError(f"trimflow run: {path} is not a mapping of mitmproxy options")
        if isinstance(loaded.get("scripts"), list):  # mitmproxy reads them relative to the file's folder
            loaded["scripts"] = [str(user_confdir / Path(str(script)).expanduser()) for script in loaded["scripts"]]
        options.update(loaded)
    options.update(confdir=str(user_confdir), upstream_auth=auth)
    confdir = run_dir / MITMDUMP_CONFDIR
    confdir.mkdir(mode=0o700)
    write_private(confdir / "config.yaml", yaml.safe_dump(options).encode())
    return confdir


def without_option(args: list[str], name: str) -> list[str]:
    """mitmdump's arguments without `--set NAME=...` (in either form)."""
    out, items = [], iter(args)
    for item in items:
        if item == "--set":
            value = next(items, "")
            if value.partition("=")[0] != name:
                out += [item, value]
        elif not (item.startswith("--set=") and item[len("--set=") :].partition("=")[0] == name):
            out.append(item)
    return out


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def check_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise LaunchError(f"trimflow run: {host}:{port} is taken ({exc.strerror}); leave -p out and trimflow picks a free port") from None


def ca_bundle(mitmproxy_ca: Path, environ: Mapping[str, str], out: Path) -> Path:
    """The CAs the command trusted (SSL_CERT_FILE, else the system's) and mitmproxy's, in one PEM file."""
    theirs = environ.get("SSL_CERT_FILE") or ssl.get_default_verify_paths().openssl_cafile
    parts = []
    with contextlib.suppress(OSError):
        parts.append(Path(theirs).read_bytes().rstrip() + b"\n")
    parts.append(mitmproxy_ca.read_bytes())
    write_private(out, b"".join(parts))
    return out


def _parent_death_signal(sig: signal.Signals) -> Any:
    """A preexec_fn that has the child get `sig` when the launcher dies (Linux prctl PR_SET_PDEATHSIG); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def child() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before the call: the signal would never come
            os.kill(os.getpid(), sig)

    return child


class Proxy:
    """mitmdump with trimflow's addons, in a session of its own (the terminal's signals never reach it)."""

    def __init__(self, command: list[str], log: Path, host: str, port: int) -> None:
        self.command, self.log, self.host, self.port = command, log, host, port
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, ca: Path | None = None, timeout: float = LISTEN_TIMEOUT) -> None:
        """Start mitmdump and return once it listens (and, given `ca`, once it has written its CA there)."""
        out = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, PRIVATE_MODE)
        try:
            self.process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_parent_death_signal(signal.SIGTERM),  # SIGTERM: it writes the records it holds
            )
        finally:
            os.close(out)
        deadline = time.monotonic() + timeout
        listening = False
        while True:
            if self.process.poll() is not None:
                raise LaunchError(f"trimflow run: the proxy did not start (exit {self.process.returncode}): {self.last_line()}", 1)
            if not listening:
                with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), timeout=0.5):
                    listening = True
            if listening and (ca is None or _written_pem(ca)):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise LaunchError(f"trimflow run: the proxy did not listen on {self.host}:{self.port} within {timeout:.0f} s; its log: {self.log}", 1)
            time.sleep(0.05)

    def last_line(self) -> str:
        try:
            lines = [line.strip() for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return f"see {self.log}"
        return lines[-1] if lines else f"see {self.log}"

    def stop(self) -> int | None:
        """SIGTERM (mitmdump writes the records it still holds), SIGKILL if it does not end in STOP_TIMEOUT."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def _written_pem(path: Path) -> bool:
    """mitmproxy writes its CA once it runs, after it listens: whole once its last line is there."""
    try:
        return path.read_bytes().rstrip().endswith(b"-----END CERTIFICATE-----")
    except OSError:
        return False


class Agent:
    """The command, in a process group of its own that has the terminal while it runs (as a shell runs a job)."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.command, self.env = command, env
        self.process: subprocess.Popen[bytes] | None = None
        self.terminal: int | None = None  # the terminal it was given, to take back

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._forward) for sig in FORWARDED}
        try:
            # SIGHUP when the launcher dies: the agent's proxy is gone, as when a terminal hangs up.
            self.process = subprocess.Popen(self.command, env=self.env, process_group=0, preexec_fn=_parent_death_signal(signal.SIGHUP))
            self._give_terminal()
            return self._wait()
        finally:
            self._take_terminal()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _forward(self, signum: int, frame: Any) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signum)

    def _wait(self) -> int:
        assert self.process is not None
        while True:
            _, status = os.waitpid(self.process.pid, os.WUNTRACED)
            if os.WIFSTOPPED(status):  # Ctrl-Z: stop as a job, and go on with it when continued
                self._take_terminal()
                os.kill(os.getpid(), signal.SIGSTOP)
                self._give_terminal()
                os.killpg(self.process.pid, signal.SIGCONT)
                continue
            self.process.returncode = os.waitstatus_to_exitcode(status)
            code = self.process.returncode
            return 128 - code if code < 0 else code

    def _give_terminal(self) -> None:
        assert self.process is not None
        fd = _terminal()
        if fd is not None:
            _set_foreground(fd, self.process.pid)
            self.terminal = fd

    def _take_terminal(self) -> None:
        if self.terminal is not None:
            _set_foreground(self.terminal, os.getpgrp())
            self.terminal = None


def _terminal() -> int | None:
    """The terminal on stdin when this process's group is in its foreground, else None."""
    try:
        return 0 if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp() else None
    except OSError:
        return None


def _set_foreground(fd: int, pgrp: int) -> None:
    # A process group that is not in the foreground gets SIGTTOU for tcsetpgrp: ignored for the call.
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(fd, pgrp)
    finally:
        signal.signal(signal.SIGTTOU, old)


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(args: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    environ = dict(os.environ if environ is None else environ)
    try:
        invocation = parse(args)
        return launch(invocation, environ)
    except LaunchError as exc:
        say(str(exc))
        return exc.status


def launch(invocation: Invocation, environ: dict[str, str]) -> int:
    command = invocation.command
    if shutil.which(command[0], path=environ.get("PATH")) is None:
        raise LaunchError(f"trimflow run: {command[0]}: command not found", EXIT_NOT_FOUND)
    host = invocation.host
    if invocation.port is not None:
        check_port(host, invocation.port)
    port = invocation.port or free_port(host)
    listen = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"
    agent = agent_of(command, invocation.agent)
    runs = state_dir(environ)
    private_folder(runs)
    for line in clean_stale_runs(runs):
        say(line)
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{agent}-{os.getpid()}"
    run_dir = new_run_dir(runs, stem)
    try:
        setup = setup_for(agent, command, environ, listen, run_dir)
        return _run_with_proxy(invocation, environ, setup, run_dir, listen, host, port)
    finally:
        for line in finish_run_dir(run_dir):
            say(line)


def _run_with_proxy(invocation: Invocation, environ: dict[str, str], setup: Setup, run_dir: Path, listen: str, host: str, port: int) -> int:
    stem = run_dir.parent / run_dir.name
    metrics = Path(invocation.metrics) if invocation.metrics else stem.with_suffix(".jsonl")
    offset = metrics.stat().st_size if metrics.exists() else 0
    if not invocation.metrics:
        write_private(metrics, b"")  # mitmdump appends to it, keeping its mode
    log = stem.with_suffix(".log")
    confdir = Path(invocation.confdir or Path(environ.get("HOME") or Path.home()) / ".mitmproxy").expanduser()
    sets = {"listen_host": host, "listen_port": str(port), "trimflow_metrics": str(metrics), "flow_detail": "0", **setup.options}
    given = invocation.mitmdump_args
    options_dir = None
    if setup.upstream_auth is not None and "upstream_auth" not in invocation.sets:  # one the user gave wins
        options_dir = mitmdump_confdir(run_dir, confdir, setup.upstream_auth)
        sets["confdir"] = str(options_dir)
        given = without_option(given, "confdir")
    ours = [item for name, value in sets.items() if name not in invocation.sets or name == "confdir" for item in ("--set", f"{name}={value}")]
    mitmdump = _run.command(["--mode", setup.mode, *ours, *given])
    if mitmdump is None:
        raise LaunchError("trimflow run: mitmdump not found: pip install mitmproxy")
    for note in setup.notes:
        say(note)
    proxy = Proxy(mitmdump, log, host, port)
    ca = confdir / "mitmproxy-ca-cert.pem"
    try:
        proxy.start(ca if setup.ca_bundle else None)
    finally:
        if options_dir is not None:  # read once, at start: the credentials stay on disk no longer than that
            shutil.rmtree(options_dir, ignore_errors=True)
    try:
        env = {**environ, **setup.env}
        if setup.ca_bundle:
            env.update(dict.fromkeys(CA_VARIABLES, str(ca_bundle(ca, environ, stem.with_suffix(".ca.pem")))))
        status = Agent(setup.command, env).run()
    finally:
        died = proxy.process is not None and proxy.process.poll() is not None
        code = proxy.stop()
    if died:
        say(f"trimflow run: the proxy stopped while {setup.command[0]} ran (exit {code}); its log: {log}")
    for line in summary(metrics, offset, setup, status, log):
        say(line)
    return status


# --- the summary at exit -------------------------------------------------------------------------------------

MAX_CONVERSATIONS = 8


def summary(metrics: Path, offset: int, setup: Setup, status: int, log: Path) -> list[str]:
    """One line for the run, one per conversation (the largest first), where the records are."""
    name = Path(setup.command[0]).name
    head = f"trimflow: {name} exited {status}"
    source = metrics
    if offset:  # the user's metrics file: only what this run appended
        source = log.with_suffix(".jsonl")
        with open(metrics, "rb") as f:
            f.seek(offset)
            write_private(source, f.read())
    if not source.exists() or source.stat().st_size == 0:
        return [f"{head}; no LLM request went through trimflow (proxy log: {log})"]
    try:
        reader = Reader(builtin_rules(), load_rules(DEFAULT_RULES_PATH), what_if=False)
        result = summarize(reader.rows(reader.check([str(source)])), reader.tallies, None, DEFAULT_RULES_PATH.name, [])
    except InputError as exc:
        return [f"{head}; no summary: {exc} (records: {metrics})"]
    finally:
        if source != metrics:
            source.unlink(missing_ok=True)
    conversations = sorted(result.conversations, key=lambda c: c.totals.requests, reverse=True)
    n = len(conversations)
    lines = [f"{head}; {result.totals.requests:,} LLM requests in {n} conversation{'s' if n != 1 else ''} through trimflow"]
    for conversation in conversations[:MAX_CONVERSATIONS]:
        lines.append(f"trimflow:   {_conversation_line(conversation)}")
    if n > MAX_CONVERSATIONS:
        lines.append(f"trimflow:   and {n - MAX_CONVERSATIONS} more")
    if n > 1:
        lines.append(f"trimflow:   all: {_figures(result.totals, sum(_retries(c) for c in conversations))}")
    lines.append(f"trimflow: every turn: scripts/audit {shlex.quote(str(metrics))} · proxy log: {log}")
    return lines


def _retries(conversation: Conversation) -> int:
    return sum(getattr(row.record, "retries", 0) or 0 for row in conversation.rows)


def _conversation_line(conversation: Conversation) -> str:
    if conversation.id == UNKNOWN_CONVERSATION:
        label = "outside any conversation (token counts, unreadable bodies)"
    else:
        label = f"conversation {conversation.id}"
    last = conversation.last.record
    turns = f"{conversation.turns:,} turn{'s' if conversation.turns != 1 else ''}, {conversation.totals.requests:,} requests"
    return f"{label} ({last.format}, {', '.join(conversation.models())}): {turns} · {_figures(conversation.totals, _retries(conversation))}"


def _figures(t: Totals, retries: int) -> str:
    """Images sent and pruned, bytes not sent, trimflow's estimate of the tokens sent, and what the provider reported."""
    parts = [f"images sent {t.images_after:,}, pruned {t.pruned:,}", f"{format_size(t.body_bytes_saved)} not sent"]
    parts.append(f"~tokens sent {t.est_tokens_after:,}")
    if t.usage_requests:
        parts.append(f"reported {_report.usage_text(t)}")
    if retries:
        parts.append(f"{retries} recover{'y' if retries == 1 else 'ies'}")
    return " · ".join(parts)
