"""The launcher's command line, `run [OPTIONS] -- COMMAND`: its own options, the rest for mitmdump, and the command."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ._agents import AGENTS
from ._launch_error import LaunchError


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
