"""`python -m trimflow run [OPTIONS] -- COMMAND` as a process: COMMAND's exit status comes back, the proxy is gone
once it ends, Ctrl-C (from a real terminal) and signals sent to the launcher reach the agent once and first (the
proxy still serves its last request), a taken port and a missing command are one line each; any other command
gets forward mode that its HTTPS requests go through, trusting the CA bundle, and the summary counts what the
provider received. The agents here are small Python scripts; the real CLIs are in test_agent_clis.py."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from trimflow.testing import FakeProvider, estimate_usage

from ..certs import make_server_cert
from .helpers import PLACEHOLDER_MARK, session, shots, wait_for_file

pytestmark = pytest.mark.e2e

# An agent: says where the proxy is, whether it has the terminal, and that it is ready; handles SIGINT and SIGTERM by sending one last request
# through the proxy (the proxy must still be there), counts the signals it got, and exits 130 + what it counted.
AGENT = textwrap.dedent(
    """
    import os, signal, sys, time, urllib.request
    work = sys.argv[1]
    got = []

    def last_request(signum, frame):
        got.append(signum)
        if len(got) > 1:
            return
        time.sleep(0.3)  # a second delivery, had there been one, would be counted by now
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": os.environ["HTTP_PROXY"]}))
        request = urllib.request.Request(os.environ["UPSTREAM"] + "/v1/chat/completions", data=b'{"model": "m", "messages": []}',
                                         headers={"content-type": "application/json"})
        with opener.open(request, timeout=20) as answer:
            status = answer.status
        open(os.path.join(work, "agent.out"), "w").write(f"{signum} {len(got)} {status}")
        sys.exit(128 + signum)

    signal.signal(signal.SIGINT, last_request)
    signal.signal(signal.SIGTERM, last_request)
    foreground = os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()  # the terminal's keys signal this process group
    open(os.path.join(work, "proxy"), "w").write(f"{os.environ['HTTP_PROXY']} {foreground}")
    os.replace(os.path.join(work, "proxy"), os.path.join(work, "ready"))
    time.sleep(60)
    sys.exit(3)
    """
)


@pytest.fixture
def agent(tmp_path: Path) -> Path:
    path = tmp_path / "agent.py"
    path.write_text(AGENT)
    return path


def launcher(*args: str) -> list[str]:
    return [sys.executable, "-m", "trimflow", "run", *args]


def listening(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def test_the_commands_status_comes_back_and_the_proxy_is_gone_after_it(tmp_path: Path) -> None:
    script = "import os, pathlib, sys; pathlib.Path(sys.argv[1]).write_text(os.environ['HTTPS_PROXY']); sys.exit(7)"
    # Python's output buffered, as a user's shell leaves it: the port mitmdump picked is read from its log all the same.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    done = subprocess.run(launcher("--", sys.executable, "-c", script, str(tmp_path / "proxy")), capture_output=True, timeout=120, env=env)
    assert done.returncode == 7, done.stderr
    proxy = (tmp_path / "proxy").read_text()
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", proxy) and not listening(proxy)
    assert f"trimflow: {Path(sys.executable).name} exited 7; no LLM request went through trimflow".encode() in done.stderr


def test_a_command_that_does_not_exist_is_one_line_and_127(tmp_path: Path) -> None:
    done = subprocess.run(
        launcher("--", "no-such-agent-4f2a", "-p", "hi"), capture_output=True, timeout=60, env={**os.environ, "HOME": str(tmp_path)}
    )
    assert done.returncode == 127
    assert done.stderr.decode() == "trimflow run: no-such-agent-4f2a: command not found\n"
    assert not (tmp_path / ".local").exists()  # no proxy was started, no run file written


def test_a_taken_port_is_one_line_and_the_command_does_not_run(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        marker = tmp_path / "ran"
        done = subprocess.run(launcher("-p", str(port), "--", "touch", str(marker)), capture_output=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port} is taken" in lines[0] and "leave -p out" in lines[0]
    assert not marker.exists()


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeProvider]:
    with FakeProvider() as provider:
        yield provider


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_launcher_reaches_the_agent_once_while_the_proxy_still_serves(
    tmp_path: Path, agent: Path, upstream: FakeProvider, sig: signal.Signals
) -> None:
    env = {**os.environ, "UPSTREAM": upstream.url}
    # A session of its own: the signal below goes to the launcher's process group, as a shell's kill of a job does.
    process = subprocess.Popen(launcher("--", sys.executable, str(agent), str(tmp_path)), env=env, stderr=subprocess.PIPE, start_new_session=True)
    proxy, foreground = wait_for_file(tmp_path / "ready", process).split()
    assert foreground == "False"
    os.killpg(process.pid, sig)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + sig, stderr
    assert (tmp_path / "agent.out").read_text() == f"{sig} 1 200"  # once, and its last request went through
    assert not listening(proxy)


def test_ctrl_c_in_a_terminal_reaches_the_agent_alone(tmp_path: Path, agent: Path, upstream: FakeProvider) -> None:
    """The agent's process group has the terminal: the terminal's SIGINT goes to it, not to the launcher or the
    proxy, which serves the agent's last request and stops after it."""
    main, terminal = os.openpty()
    env = {**os.environ, "UPSTREAM": upstream.url}
    # setsid -c: a session whose controlling terminal is this pty, as a login shell's.
    command = ["setsid", "-c", *launcher("--", sys.executable, str(agent), str(tmp_path))]
    process = subprocess.Popen(command, env=env, stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    output = b""
    try:
        proxy, foreground = wait_for_file(tmp_path / "ready", process).split()
        assert foreground == "True"  # given the terminal: Ctrl-C signals the agent's group, not the launcher's
        os.write(main, b"\x03")  # Ctrl-C, as typed
        deadline = time.monotonic() + 60
        while process.poll() is None or select.select([main], [], [], 0)[0]:
            assert time.monotonic() < deadline
            if select.select([main], [], [], 0.1)[0]:
                try:
                    output += os.read(main, 65536)
                except OSError:  # the terminal's last process closed it
                    break
        process.wait(30)
    finally:
        os.close(main)
    assert process.returncode == 130, output.decode(errors="replace")
    assert (tmp_path / "agent.out").read_text() == f"{signal.SIGINT} 1 200"
    assert not listening(proxy)
    assert b"exited 130" in output


def test_any_other_command_goes_through_forward_mode_and_the_summary_counts_what_the_provider_got(tmp_path: Path) -> None:
    """An HTTPS client of its own (urllib, trusting SSL_CERT_FILE), through HTTPS_PROXY: the CA bundle lets it trust
    mitmproxy, and the provider's TLS stays checked by mitmproxy."""
    cert, key = make_server_cert(tmp_path / "certs", "provider")
    images = shots(10, seed=7)
    bodies = tmp_path / "bodies"
    bodies.mkdir()
    for turn in range(1, 11):
        (bodies / f"{turn:02d}.json").write_bytes(orjson.dumps(session("openai-chat", images[:turn])))
    client = textwrap.dedent(
        """
        import os, ssl, sys, urllib.request
        from pathlib import Path
        context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({"https": os.environ["HTTPS_PROXY"]}),
                                             urllib.request.HTTPSHandler(context=context))
        for body in sorted(Path(sys.argv[2]).iterdir()):
            request = urllib.request.Request(sys.argv[1] + "/v1/chat/completions", data=body.read_bytes(),
                                             headers={"content-type": "application/json"})
            with opener.open(request, timeout=30) as answer:
                assert answer.status == 200
        """
    )
    (tmp_path / "client.py").write_text(client)
    with FakeProvider(certfile=str(cert), keyfile=str(key)) as provider:
        url = f"https://localhost:{provider.port}"
        args = ["--set", f"ssl_verify_upstream_trusted_ca={cert}", "--set", f"confdir={tmp_path / 'confdir'}"]
        command = launcher(*args, "--", sys.executable, str(tmp_path / "client.py"), url, str(bodies))
        done = subprocess.run(command, capture_output=True, timeout=180)
        received = list(provider.received)
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr
    assert len(received) == 10
    sent = sum(r.body.count(b'"type":"image_url"') for r in received)
    pruned = sum(r.body.count(PLACEHOLDER_MARK) for r in received)
    assert max(r.body.count(b'"type":"image_url"') for r in received) <= 8  # the shipped cap
    summary = [line for line in stderr.splitlines() if line.startswith("trimflow:   conversation ")]
    assert len(summary) == 1 and "10 turns, 10 requests" in summary[0], stderr
    assert f"images sent {sent}, pruned {pruned}" in summary[0] and pruned > 0
    assert f"reported in {sum(estimate_usage(r.body).input_tokens for r in received):,}" in summary[0]
