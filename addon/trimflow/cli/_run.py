"""`python -m trimflow run [MITMDUMP ARGS...]`: mitmdump with trimflow's addons on 127.0.0.1:8080.

Arguments go to mitmdump after the defaults, so a listen address given there, as a flag or with
--set, wins over them. With `-- COMMAND [ARGS...]` after them, the launcher (trimflow._launch) runs
COMMAND behind the proxy instead, on a free port, and stops the proxy when COMMAND ends.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "proxy" / "mitmdump_script.py"
# Given as --set, not as flags: mitmdump applies --listen-host/-p after every --set, so the user's flag
# wins over these; a --set of the same option twice is an error, so one the user gives replaces ours.
DEFAULTS = {"listen_host": "127.0.0.1", "listen_port": "8080"}


def mitmdump_binary() -> str | None:
    """The mitmdump of this Python's environment, else the one on PATH."""
    beside = Path(sys.executable).with_name("mitmdump")
    return str(beside) if beside.exists() else shutil.which("mitmdump")


def command(args: list[str]) -> list[str] | None:
    binary = mitmdump_binary()
    if binary is None:
        return None
    given = {value.partition("=")[0] for flag, value in itertools.pairwise(args) if flag == "--set"}
    given |= {a.removeprefix("--set=").partition("=")[0] for a in args if a.startswith("--set=")}
    defaults = [item for name, value in DEFAULTS.items() if name not in given for item in ("--set", f"{name}={value}")]
    return [binary, *defaults, "-s", str(SCRIPT), *args]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--" in args:
        from . import _launch  # only here: the plain proxy needs none of it

        return _launch.main(args)
    argv_run = command(args)
    if argv_run is None:
        print("trimflow run: mitmdump not found: pip install mitmproxy", file=sys.stderr)
        return 2
    os.execv(argv_run[0], argv_run)
    return 0  # not reached
