"""`python -m trimflow run [MITMDUMP ARGS...]`: mitmdump with trimflow's addons on 127.0.0.1:8080.

Arguments go to mitmdump after the defaults, so a listen address given there, as a flag or with
--set, wins over them. With `-- COMMAND [ARGS...]` after them, the launcher (trimflow.cli._launch) runs
COMMAND behind the proxy instead, on a free port, and stops the proxy when COMMAND ends.
"""

from __future__ import annotations

import os
import sys

from ._mitmdump import mitmdump_argv
from ._status import fail


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--" in args:
        from . import _launch  # only here: the plain proxy needs none of it

        return _launch.main(args)
    argv_run = mitmdump_argv(args)
    if argv_run is None:
        return fail("trimflow run", "mitmdump not found: pip install mitmproxy")
    os.execv(argv_run[0], argv_run)
    return 0  # not reached
