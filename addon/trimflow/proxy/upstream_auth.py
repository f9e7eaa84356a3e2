"""The upstream-auth addon: mitmproxy's `upstream_auth` read once from a pipe (trimflow_upstream_auth_fd).

`python -m trimflow run -- COMMAND` hands mitmdump an upstream proxy's `user:password` this way, so that it is
in no file, on no command line and in no environment: the launcher writes it into a pipe, closes its writing
end and passes the reading end to mitmdump as file descriptor N, `--set trimflow_upstream_auth_fd=N` (the
number alone is on the command line). As mitmproxy loads trimflow's script, this addon reads the pipe to its
end without waiting, closes it and sets `upstream_auth`, which mitmproxy's own UpstreamAuth addon sends as
Proxy-Authorization. mitmproxy may listen before it loads the script: the launcher starts the agent only once
the pipe is empty. Nothing is left in the pipe, and a later value of the option is refused: it is read once.
No message names what the pipe held, and the process makes no core file from then on (it would hold them).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys

from mitmproxy import ctx, exceptions
from mitmproxy.addonmanager import Loader

from .options import exits_at_startup

if sys.platform != "win32":
    import resource

OPTION = "trimflow_upstream_auth_fd"
NO_PIPE = -1
_USER_AND_PASSWORD = re.compile(".+:")  # what mitmproxy's upstream_auth takes; its own error would print the value


class UpstreamAuthPipe:
    name = "trimflow_upstream_auth"

    def __init__(self) -> None:
        self.read_from: int | None = None  # the descriptor read, once

    def load(self, loader: Loader) -> None:
        loader.add_option(
            OPTION,
            int,
            NO_PIPE,
            "A pipe's file descriptor holding mitmproxy's upstream_auth (user:password), read once at start and closed: "
            "how `python -m trimflow run -- COMMAND` hands an upstream proxy's credentials over. -1: none.",
        )

    @exits_at_startup
    def configure(self, updated: set[str]) -> None:
        if OPTION not in updated:
            return
        fd = ctx.options.trimflow_upstream_auth_fd
        if fd == NO_PIPE:
            return
        if self.read_from is not None:
            raise exceptions.OptionsError(f"trimflow: {OPTION} is read once, at start")
        self.read_from = fd
        no_core_files()
        # The number goes back to none: the descriptor is closed, and a reloaded script must not read whatever
        # the process opens under that number next.
        ctx.options.update(upstream_auth=read_auth(fd), trimflow_upstream_auth_fd=NO_PIPE)


def read_auth(fd: int) -> str:
    """`user:password` from the pipe `fd`, read to its end and closed; an OptionsError that never holds the bytes
    when `fd` is not a pipe, its writer has not closed it, or it holds no `user:`."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            raise exceptions.OptionsError(f"trimflow: {OPTION}={fd} is not a pipe")
    except OSError as exc:
        raise exceptions.OptionsError(f"trimflow: {OPTION}={fd}: {exc.strerror or type(exc).__name__}") from None
    chunks = []
    try:
        os.set_blocking(fd, False)  # the writer closed its end before mitmproxy started: all of it is there
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    except BlockingIOError:
        raise exceptions.OptionsError(f"trimflow: {OPTION}={fd}: the pipe's writer has not closed it") from None
    except OSError as exc:
        raise exceptions.OptionsError(f"trimflow: {OPTION}={fd}: {exc.strerror or type(exc).__name__}") from None
    finally:
        os.close(fd)
    try:
        auth = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise exceptions.OptionsError(f"trimflow: {OPTION}={fd}: the pipe holds no UTF-8 text") from None
    if _USER_AND_PASSWORD.search(auth) is None:
        raise exceptions.OptionsError(f"trimflow: {OPTION}={fd}: the pipe holds no user:password")
    return auth


def no_core_files() -> None:
    """No core file of this process from now on, whatever the user's limit was: it would hold its memory. The
    kernel and systemd-coredump go by the soft limit; the hard one is left as it was."""
    if sys.platform != "win32":
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
