"""trimflow.cli._processes without processes: the CA bundle the agent trusts in forward mode, the port, when mitmdump counts
as started. mitmdump and the agent running (signals, the terminal, a launcher killed) are in tests/e2e/test_launcher.py and
test_launch_hostile.py."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from trimflow.cli._agents import CA_VARIABLES
from trimflow.cli._launch_error import LaunchError
from trimflow.cli._processes import Proxy, ca_bundle, check_port, unread


def test_the_ca_bundle_holds_the_users_cas_and_mitmproxys(tmp_path: Path) -> None:
    theirs, ours = tmp_path / "theirs.pem", tmp_path / "ca.pem"
    theirs.write_text("-----BEGIN CERTIFICATE-----\nTHEIRS\n-----END CERTIFICATE-----")
    ours.write_text("-----BEGIN CERTIFICATE-----\nMITM\n-----END CERTIFICATE-----\n")
    bundle = ca_bundle(ours, {"SSL_CERT_FILE": str(theirs)}, tmp_path / "bundle.pem").read_text()
    assert bundle.index("THEIRS") < bundle.index("MITM") and bundle.count("BEGIN CERTIFICATE") == 2
    assert len(CA_VARIABLES) == 4


def test_the_ca_bundle_is_the_users_alone(tmp_path: Path) -> None:
    ours = tmp_path / "ca.pem"
    ours.write_text("-----BEGIN CERTIFICATE-----\nMITM\n-----END CERTIFICATE-----\n")
    bundle = ca_bundle(ours, {"SSL_CERT_FILE": str(tmp_path / "none.pem")}, tmp_path / "bundle.pem")
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o600


def test_a_taken_port_is_refused_in_one_line() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(LaunchError, match=rf"^trimflow run: 127\.0\.0\.1:{port} is taken \(.+\); leave -p out") as caught:
            check_port("127.0.0.1", port)
    assert "\n" not in str(caught.value)


def test_started_on_port_0_it_is_ready_at_the_port_its_log_says_after_what_the_log_held(tmp_path: Path) -> None:
    """mitmdump told port 0 binds one the kernel picks and says which: no port is picked and released before it binds."""
    log = tmp_path / "run.log"
    with socket.create_server(("127.0.0.1", 0)) as earlier, socket.create_server(("127.0.0.1", 0)) as listening:
        log.write_text(f"[10:00:00.000] HTTP(S) proxy listening at 127.0.0.1:{earlier.getsockname()[1]}.\n")  # a run before
        proxy = Proxy(["mitmdump"], log, "127.0.0.1", 0)
        proxy._log_start = log.stat().st_size  # as start() sets it
        assert not proxy.ready() and proxy.port == 0
        port = listening.getsockname()[1]
        with log.open("a") as out:
            out.write(f"[10:00:01.000] Reverse proxy to https://api.anthropic.com listening at 127.0.0.1:{port}.\n")
        assert proxy.ready() and proxy.port == port and proxy.listening


def test_mitmdump_is_ready_once_it_listens_has_its_ca_and_has_read_the_pipe_it_was_handed(tmp_path: Path) -> None:
    """mitmproxy listens before it loads trimflow's script, whose addon reads the pipe: listening is not enough."""
    ca = tmp_path / "mitmproxy-ca-cert.pem"
    read, write = os.pipe()
    os.write(write, b"corp-user:s3cr3t")
    os.close(write)
    try:
        with socket.create_server(("127.0.0.1", 0)) as listening:
            proxy = Proxy(["mitmdump"], tmp_path / "log", "127.0.0.1", listening.getsockname()[1])
            assert not proxy.ready(ca, read) and proxy.listening
            ca.write_text("-----BEGIN CERTIFICATE-----\nMITM\n-----END CERTIFICATE-----\n")
            assert proxy.ready(ca) and not proxy.ready(ca, read)
            assert unread(read) == len(b"corp-user:s3cr3t")
            assert os.read(read, 100) == b"corp-user:s3cr3t"  # as mitmdump reads it
            assert proxy.ready(ca, read)
    finally:
        os.close(read)
