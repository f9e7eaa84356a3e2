"""Start and stop a real mitmdump process on loopback, with or without the trimflow addon.

Used by the end-to-end tests, the audit's tests and `scripts/bench`, so they all run the proxy the
way a user does.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from trimflow.cli import _mitmdump
from trimflow.cli._mitmdump import listening_port

from .helpers import wait_for

ADDON = Path(__file__).resolve().parents[1] / "addon" / "mitm.py"


def mitmdump_binary() -> str:
    """The mitmdump of this interpreter's environment, else the one on PATH."""
    found = _mitmdump.mitmdump_binary()
    if found is None:
        raise FileNotFoundError("mitmdump not found: run scripts/setup")
    return found


class Mitmdump:
    """A mitmdump process. `options` are `--set` values; `args` go to mitmdump as they are; `env` is
    added to this process's environment for it."""

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        *args: str,
        addon: bool = True,
        options: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        # Its output unbuffered: the port it listens on is read from its log as it starts.
        self.env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._port: int | None = None
        self.confdir = self.workdir / "confdir"
        fd, log_path = tempfile.mkstemp(prefix="mitmdump-", suffix=".log", dir=self.workdir)  # one of its own, however many share the folder
        os.close(fd)
        self.log_path = Path(log_path)
        command = [mitmdump_binary(), "--listen-host", "127.0.0.1", "--listen-port", "0", "--set", f"confdir={self.confdir}"]
        if addon:
            command += ["-s", str(ADDON)]
        for name, value in (options or {}).items():
            command += ["--set", f"{name}={value}"]
        self.command = command + list(args)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        """The port it listens on, known once it started."""
        if self._port is None:
            raise RuntimeError("mitmdump has no port until it started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ca_cert(self) -> Path:
        """mitmproxy's CA, created at first start: clients in forward mode trust this."""
        return self.confdir / "mitmproxy-ca-cert.pem"

    def start(self, timeout: float = 30.0) -> Mitmdump:
        """Start it and return once it listens (its port then known); RuntimeError if it exits first."""
        start = self.log_path.stat().st_size  # a restart appends to the log: its port is on a line after this
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env)
        log.close()
        process, self._port = self.process, None

        def listening() -> int | None:
            if process.poll() is not None:
                raise RuntimeError(f"mitmdump exited with {process.returncode}:\n{self.log()[-2000:]}")
            return listening_port(self.log_path.read_bytes()[start:].decode(errors="replace"))

        try:
            self._port = wait_for(listening, "mitmdump listening", timeout)
        except AssertionError:
            self.stop()
            raise TimeoutError(f"mitmdump did not listen within {timeout} s:\n{self.log()[-2000:]}") from None
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> int | None:
        return None if self.process is None else stop_process(self.process, 10)

    def __enter__(self) -> Mitmdump:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_process(process: subprocess.Popen[bytes], timeout: float = 5.0) -> int | None:
    """SIGTERM, then SIGKILL if it has not ended within `timeout` seconds; its exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    return process.returncode
