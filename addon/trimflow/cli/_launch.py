"""`python -m trimflow run [OPTIONS] -- COMMAND [ARGS...]`: run COMMAND with trimflow in front of its LLM provider.

The launcher starts mitmdump with trimflow's addons on a loopback port the kernel picks (in a session of its own, so
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
- The coding agents known by name (opencode, kilo, qwen, hermes, cline, openclaw, pi): forward mode, below; each
  is given the recall server its own way, or a line says why not.
- Anything else (or `--agent proxy`): forward mode, with HTTPS_PROXY and HTTP_PROXY pointing at the proxy and
  a CA bundle (the system's CAs and mitmproxy's) in NODE_EXTRA_CA_CERTS, SSL_CERT_FILE, REQUESTS_CA_BUNDLE and
  CODEX_CA_CERTIFICATE. An HTTPS_PROXY the user had stays their way out: mitmdump runs in upstream mode to it.

Credentials in a URL (`http://user:pass@proxy:3128`, a base URL with a user) never reach an argv, a log line or
a file: an upstream proxy's go to mitmdump as `upstream_auth` through a pipe it reads once as it starts
(trimflow_upstream_auth_fd), and neither mitmdump's environment nor the agent's holds them; a base URL's stay
with the agent, in the URL it is given for the proxy (its environment, which only the user can read).

The run's files are the user's alone: the runs folder is 0700 and every file the launcher writes 0600 (a
copied settings file keeps the mode of the user's). mitmdump and the agent get a signal when the launcher
dies, however it dies (PR_SET_PDEATHSIG, Linux), and a run folder whose launcher is gone is removed at the
next start. What the agent wrote into its private settings folder is kept beside the run and named in one line.

Recall (trimflow.cli._recall): with the `mcp` package, a token per run goes to mitmdump (its environment) and to the
MCP server registered with the agent (a 0600 file of the run), so that the model can ask for an image trimflow cut
(`recall_image`, docs/agents.md#recall); the run's images are removed when it ends.

Every request's metrics go to a JSONL file of this run (or the trimflow_metrics file given, from where it
stood at start), and at exit one summary per conversation is printed from it by the audit.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .._recall import TOKEN_VARIABLE
from ._agents import CA_VARIABLES, PENDING, Setup, agent_of, proxy_environment, setup_for
from ._exit_summary import summary
from ._invocation import Invocation, parse
from ._launch_error import EXIT_NOT_FOUND, LaunchError
from ._mitmdump import AUTH_FD_OPTION, auth_pipe, mitmdump_argv, without_option
from ._processes import Agent, Proxy, ca_bundle, check_port
from ._recall import RunRecall, prepare
from ._run_dir import clean_stale_runs, finish_run_dir, new_run_dir, private_folder, state_dir, write_private


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
    port = invocation.port or 0  # 0: mitmdump binds a port the kernel picks, and says which (Proxy.port)
    agent = agent_of(command, invocation.agent)
    runs = state_dir(environ)
    private_folder(runs)
    for line in clean_stale_runs(runs):
        say(line)
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{agent}-{os.getpid()}"
    run_dir = new_run_dir(runs, stem)
    recall = None
    try:
        recall, why_not = prepare(invocation.sets, confdir_of(invocation, environ), run_dir)
        if why_not is not None:
            say(why_not)
        # The agent is told the proxy's address once mitmdump has bound its port (Setup.at).
        setup = setup_for(agent, command, environ, PENDING, run_dir, recall=recall.server if recall is not None else None)
        return _run_with_proxy(invocation, environ, setup, run_dir, host, port, recall)
    finally:
        if recall is not None:
            recall.remove()
        for line in finish_run_dir(run_dir):
            say(line)


def confdir_of(invocation: Invocation, environ: Mapping[str, str]) -> Path:
    """mitmproxy's confdir for the run: the user's --set confdir, else ~/.mitmproxy."""
    return Path(invocation.confdir or Path(environ.get("HOME") or Path.home()) / ".mitmproxy").expanduser()


def _run_with_proxy(
    invocation: Invocation, environ: dict[str, str], setup: Setup, run_dir: Path, host: str, port: int, recall: RunRecall | None = None
) -> int:
    stem = run_dir.parent / run_dir.name
    metrics = Path(invocation.metrics) if invocation.metrics else stem.with_suffix(".jsonl")
    offset = metrics.stat().st_size if metrics.exists() else 0
    if not invocation.metrics:
        write_private(metrics, b"")  # mitmdump appends to it, keeping its mode
    log = stem.with_suffix(".log")
    confdir = confdir_of(invocation, environ)
    sets = {"listen_host": host, "listen_port": str(port), "trimflow_metrics": str(metrics), "flow_detail": "0", **setup.options}
    given = without_option(invocation.mitmdump_args, AUTH_FD_OPTION)  # the launcher's alone to give
    auth_fd = None
    if setup.upstream_auth is not None and "upstream_auth" not in invocation.sets:  # one the user gave wins
        auth_fd = auth_pipe(setup.upstream_auth)
        sets[AUTH_FD_OPTION] = str(auth_fd)
    ours = [item for name, value in sets.items() if name not in invocation.sets or name == AUTH_FD_OPTION for item in ("--set", f"{name}={value}")]
    ca = confdir / "mitmproxy-ca-cert.pem"
    try:
        mitmdump = mitmdump_argv(["--mode", setup.mode, *ours, *given])
        if mitmdump is None:
            raise LaunchError("trimflow run: mitmdump not found: pip install mitmproxy")
        for note in setup.notes:
            say(note)
        # The run's token, or none: a token the user's environment holds is not this run's.
        proxy_env = {name: value for name, value in proxy_environment(environ).items() if name != TOKEN_VARIABLE}
        proxy = Proxy(mitmdump, log, host, port, {**proxy_env, **(recall.proxy_env() if recall is not None else {})})
        proxy.start(ca if setup.ca_bundle else None, handed=auth_fd)  # back once mitmdump has read the pipe
    finally:
        if auth_fd is not None:
            os.close(auth_fd)
    try:
        setup = setup.at(f"http://{host}:{proxy.port}" if ":" not in host else f"http://[{host}]:{proxy.port}")
        env = {**environ, **setup.env, **(recall.agent_env() if recall is not None else {})}
        if setup.ca_bundle:
            env.update(dict.fromkeys(CA_VARIABLES, str(ca_bundle(ca, environ, stem.with_suffix(".ca.pem")))))
        status = Agent(setup.command, env).run()
    finally:
        died = proxy.process is not None and proxy.process.poll() is not None
        code = proxy.stop()
    if died:
        say(f"trimflow run: the proxy stopped while {setup.command[0]} ran (exit {code}); its log: {log}")
    for line in summary(metrics, offset, Path(setup.command[0]).name, status, log):
        say(line)
    return status
