"""The launcher's processes: mitmdump and the agent started, supervised and stopped.

mitmdump runs in a session of its own until it listens, the agent in a process group that has the terminal
(signals passed on, Ctrl-Z as a job), both signalled when the launcher dies (PR_SET_PDEATHSIG); and what they
are started with: a checked port (or port 0, the kernel's choice, read from mitmdump's output), the CA bundle the
agent trusts."""

from __future__ import annotations

import array
import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import ssl
import subprocess
import sys
import termios
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._launch_error import LaunchError
from ._mitmdump import listening_port
from ._run_dir import PRIVATE_MODE, write_private

LISTEN_TIMEOUT = 30.0  # seconds mitmdump may take to listen (a cold start on a busy machine takes a few)
STOP_TIMEOUT = 10.0
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
PR_SET_PDEATHSIG = 1  # prctl(2)


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
    """mitmdump with trimflow's addons, in a session of its own (the terminal's signals never reach it). Started with
    `port` 0, it listens where the kernel chose: `port` is that port once it says so in its output (the log)."""

    def __init__(self, command: list[str], log: Path, host: str, port: int, env: dict[str, str] | None = None) -> None:
        self.command, self.log, self.host, self.port, self.env = command, log, host, port, env
        self.process: subprocess.Popen[bytes] | None = None
        self.listening = False
        self._log_start = 0  # where this start's output begins in the log (a log may hold an earlier run's)

    def start(self, ca: Path | None = None, timeout: float = LISTEN_TIMEOUT, handed: int | None = None) -> None:
        """Start mitmdump and return once it is ready: it listens, has written its CA to `ca` (given one) and has
        read the pipe `handed` (given one, passed to it) to its end."""
        out = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, PRIVATE_MODE)
        self._log_start = os.fstat(out).st_size
        try:
            self.process = subprocess.Popen(
                self.command,
                # Its output unbuffered: the port it listens on is read from its log as it starts.
                env={**(os.environ if self.env is None else self.env), "PYTHONUNBUFFERED": "1"},
                pass_fds=() if handed is None else (handed,),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_parent_death_signal(signal.SIGTERM),  # SIGTERM: it writes the records it holds
            )
        finally:
            os.close(out)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise LaunchError(f"trimflow run: the proxy did not start (exit {self.process.returncode}): {self.last_line()}", 1)
            if self.ready(ca, handed):
                return
            if time.monotonic() > deadline:
                self.stop()
                where = f"{self.host}:{self.port}"
                why = f"did not listen on {where}"
                if self.listening:
                    why = f"listens on {where} but did not finish starting (its CA, trimflow's addons)"
                elif self.port == 0:
                    why = f"did not say which port it listens on at {self.host} (a quiet log: give -p PORT)"
                raise LaunchError(f"trimflow run: the proxy {why} within {timeout:.0f} s; its log: {self.log}", 1)
            time.sleep(0.05)

    def ready(self, ca: Path | None = None, handed: int | None = None) -> bool:
        """It listens, its CA is in `ca` (given one), and the pipe `handed` (given one) is empty. mitmproxy loads
        trimflow's script in a task of its own, which may run after it listens; the script's addons read the pipe."""
        if self.port == 0:
            self.port = self._said_port() or 0
        if not self.listening and self.port:
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), timeout=0.5):
                self.listening = True
        return self.listening and (ca is None or _written_pem(ca)) and (handed is None or unread(handed) == 0)

    def _said_port(self) -> int | None:
        """The port mitmdump says in its log it listens on, once it has."""
        try:
            with self.log.open("rb") as log:
                log.seek(self._log_start)
                return listening_port(log.read().decode(errors="replace"))
        except OSError:
            return None

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


def unread(pipe: int) -> int:
    """How many bytes wait in `pipe` for a reader (FIONREAD)."""
    count = array.array("i", [0])
    fcntl.ioctl(pipe, termios.FIONREAD, count)
    return count[0]


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
