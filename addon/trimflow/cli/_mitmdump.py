"""mitmdump's command line, for `run` and the launcher alike.

The binary, trimflow's script and listen defaults, the user's arguments after them; an option dropped from them;
and the pipe that carries an upstream's credentials, which never go on the command line or into a file."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import sys
from pathlib import Path

from ._launch_error import LaunchError

SCRIPT = Path(__file__).resolve().parents[1] / "proxy" / "mitmdump_script.py"
# Given as --set, not as flags: mitmdump applies --listen-host/-p after every --set, so the user's flag
# wins over these; a --set of the same option twice is an error, so one the user gives replaces ours.
DEFAULTS = {"listen_host": "127.0.0.1", "listen_port": "8080"}
AUTH_FD_OPTION = "trimflow_upstream_auth_fd"  # trimflow.proxy.upstream_auth's: the pipe mitmdump reads upstream_auth from
# mitmproxy's line once a proxy server is bound, on 11 and 12 alike ("HTTP(S) proxy listening at 127.0.0.1:41234.",
# "Reverse proxy to http://... listening at [::1]:41234."; "*:41234" for every address): told port 0, it gives the
# port the kernel chose. Of several addresses ("... and ..."), the first.
_LISTENING = re.compile(r" listening at (?:\[[^\]\s]*\]|[^\s\[\]]+):(\d+)(?: and \S+)*\.$", re.M)


def listening_port(log: str) -> int | None:
    """The port mitmdump says it listens on in `log` (its output), or None before it says so. Told --listen-port 0,
    it keeps the port from the kernel's choice on, where a port picked by binding and closing a socket of our own
    could be taken by another process before mitmdump binds it."""
    found = _LISTENING.search(log)
    return int(found.group(1)) if found else None


def mitmdump_binary() -> str | None:
    """The mitmdump of this Python's environment, else the one on PATH."""
    beside = Path(sys.executable).with_name("mitmdump")
    return str(beside) if beside.exists() else shutil.which("mitmdump")


def mitmdump_argv(args: list[str]) -> list[str] | None:
    """mitmdump's argv: the binary, the listen defaults `args` do not --set, trimflow's script, then `args`; None
    without a mitmdump."""
    binary = mitmdump_binary()
    if binary is None:
        return None
    given = {value.partition("=")[0] for flag, value in itertools.pairwise(args) if flag == "--set"}
    given |= {a.removeprefix("--set=").partition("=")[0] for a in args if a.startswith("--set=")}
    defaults = [item for name, value in DEFAULTS.items() if name not in given for item in ("--set", f"{name}={value}")]
    return [binary, *defaults, "-s", str(SCRIPT), *args]


def auth_pipe(auth: str) -> int:
    """The reading end of a pipe that holds `auth` whole, its writing end closed: what mitmdump reads, once, as
    `upstream_auth` (AUTH_FD_OPTION), so the credentials are in no file. The caller passes it to mitmdump and
    closes its own copy once mitmdump has read it."""
    data = auth.encode()
    read, write = os.pipe()
    try:
        os.set_blocking(write, False)  # an empty pipe takes a few KiB at once: never wait for a reader
        try:
            written = os.write(write, data)
        except BlockingIOError:
            written = 0
    except OSError as exc:
        os.close(read)
        raise LaunchError(f"trimflow run: cannot hand the proxy's credentials to mitmdump ({exc.strerror or type(exc).__name__})") from None
    finally:
        os.close(write)
    if written < len(data):
        os.close(read)
        raise LaunchError(f"trimflow run: the credentials of the proxy in HTTPS_PROXY are too long ({len(data)} bytes)")
    return read


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
