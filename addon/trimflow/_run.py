"""`python -m trimflow run [MITMDUMP ARGS...]`: mitmdump with trimflow's addons on 127.0.0.1:8080.

Arguments go to mitmdump; a --listen-host or --listen-port given there wins over the default.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "proxy" / "mitmdump_script.py"
# flag -> (its other spellings, the default): each is added unless the arguments set it
DEFAULT_LISTEN = {"--listen-host": ((), "127.0.0.1"), "--listen-port": (("-p",), "8080")}


def mitmdump_binary() -> str | None:
    """The mitmdump of this Python's environment, else the one on PATH."""
    beside = Path(sys.executable).with_name("mitmdump")
    return str(beside) if beside.exists() else shutil.which("mitmdump")


def command(args: list[str]) -> list[str] | None:
    binary = mitmdump_binary()
    if binary is None:
        return None
    listen: list[str] = []
    for flag, (aliases, default) in DEFAULT_LISTEN.items():
        if not any(a == name or a.startswith(f"{name}=") for a in args for name in (flag, *aliases)):
            listen += [flag, default]
    return [binary, *listen, "-s", str(SCRIPT), *args]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    argv_run = command(args)
    if argv_run is None:
        print("trimflow run: mitmdump not found: pip install mitmproxy", file=sys.stderr)
        return 2
    os.execv(argv_run[0], argv_run)
    return 0  # not reached
