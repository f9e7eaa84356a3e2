"""`python -m trimflow run -- COMMAND` as an attacker and an unlucky user meet it: an upstream proxy that wants
credentials works, and the credentials are in no process's command line, no environment but the launcher's, no
log and no file, not even while the proxy starts or after the launcher is killed then; the run's files are the
user's alone; a launcher killed with SIGKILL takes the proxy and the agent with it, and the next start removes
its folder; what the agent wrote into its private settings folder is kept and named."""

from __future__ import annotations

import base64
import json
import os
import re
import resource
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from trimflow.testing import FakeProvider

from ..certs import make_server_cert
from ..helpers import wait_for
from .helpers import wait_for_file

pytestmark = pytest.mark.e2e

PROXY_USER = "proxy-user"
PROXY_PASSWORD = "p@ss:w/rd-7Q2x"  # characters a URL must percent-encode
PROXY_URL_USERINFO = "proxy-user:p%40ss%3Aw%2Frd-7Q2x"


def secret_forms() -> list[bytes]:
    """Every form the proxy's credentials could leak in: as typed, as in the URL, as the header carries them."""
    pair = f"{PROXY_USER}:{PROXY_PASSWORD}".encode()
    return [PROXY_PASSWORD.encode(), PROXY_URL_USERINFO.encode(), base64.b64encode(pair), base64.b64encode(pair).rstrip(b"=")]


class AuthenticatingProxy:
    """An HTTP CONNECT proxy on loopback that answers 407 without the right Basic credentials and otherwise tunnels
    to a loopback port: a company proxy in small."""

    def __init__(self, user: str, password: str) -> None:
        self.expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.tunnels: list[str] = []
        self.refused = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> AuthenticatingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, rest = data.partition(b"\r\n\r\n")
            first, *lines = head.decode("latin-1").split("\r\n")
            method, target, _ = first.split(" ", 2)
            headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
            if headers.get("proxy-authorization") != self.expected:
                self.refused += 1
                conn.sendall(b'HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm="corp"\r\nContent-Length: 0\r\n\r\n')
                return
            host, _, port = target.rpartition(":")
            if method != "CONNECT" or host not in ("localhost", "127.0.0.1"):
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return
            with socket.create_connection(("127.0.0.1", int(port))) as upstream:
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                self.tunnels.append(target)
                if rest:
                    upstream.sendall(rest)
                back = threading.Thread(target=_pipe, args=(upstream, conn), daemon=True)
                back.start()
                _pipe(conn, upstream)
                back.join(30)


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def launcher(*args: str) -> list[str]:
    return [sys.executable, "-m", "trimflow", "run", *args]


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (parent := _parent(int(entry.name))) is not None:
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def environment(pid: int) -> bytes:
    """What the process was started with, as /proc shows it to the user's other processes."""
    return Path(f"/proc/{pid}/environ").read_bytes()


def core_files_on() -> None:
    """As for a user whose shell allows core files (systemd-coredump keeps them under /var/lib)."""
    hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))


def core_file_limit(pid: int) -> str:
    """The soft limit, which the kernel and systemd-coredump go by."""
    (line,) = [line for line in Path(f"/proc/{pid}/limits").read_text().splitlines() if line.startswith("Max core file size")]
    return line.split()[4]


def mitmdump_of(launcher_pid: int) -> int | None:
    """The launcher's mitmdump once it runs as mitmdump (started, the launcher's death signal set), else None."""
    found = [pid for pid in descendants(launcher_pid) if b"mitmdump" in cmdline(pid)]
    return found[0] if found else None


def gone(pid: int) -> bool:
    """Ended: no such process, or a zombie nobody has reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def files_under(*roots: Path) -> Iterator[Path]:
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                yield path


CLIENT = textwrap.dedent(
    """
    import os, ssl, sys, time, urllib.request
    work, url = sys.argv[1], sys.argv[2]
    open(os.path.join(work, "ready.tmp"), "w").write(str(os.getpid()))
    os.replace(os.path.join(work, "ready.tmp"), os.path.join(work, "ready"))
    while not os.path.exists(os.path.join(work, "go")):
        time.sleep(0.05)
    context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"https": os.environ["HTTPS_PROXY"]}),
                                         urllib.request.HTTPSHandler(context=context))
    request = urllib.request.Request(url + "/v1/chat/completions", data=b'{"model": "m", "messages": []}',
                                     headers={"content-type": "application/json"})
    with opener.open(request, timeout=30) as answer:
        open(os.path.join(work, "status"), "w").write(str(answer.status))
    """
)


def test_an_upstream_proxy_that_wants_credentials_works_and_they_leak_nowhere(tmp_path: Path) -> None:
    """HTTPS_PROXY=http://user:pass@proxy: mitmdump goes out through it with the credentials, which are on no
    command line of the launcher's processes, in no log or file the run leaves, and not on the terminal. The
    user's mitmproxy config.yaml (here: the CA mitmdump trusts for the provider) still applies."""
    home, work, confdir = tmp_path / "home", tmp_path / "work", tmp_path / "confdir"
    for folder in (home, work, confdir):
        folder.mkdir()
    cert, key = make_server_cert(tmp_path / "certs", "provider")
    (confdir / "config.yaml").write_text(f"ssl_verify_upstream_trusted_ca: {json.dumps(str(cert))}\n")
    (work / "client.py").write_text(CLIENT)
    with FakeProvider(certfile=str(cert), keyfile=str(key)) as provider, AuthenticatingProxy(PROXY_USER, PROXY_PASSWORD) as corp:
        corp_url = f"http://{PROXY_URL_USERINFO}@127.0.0.1:{corp.port}"
        env = {**os.environ, "HOME": str(home), "HTTPS_PROXY": corp_url, "HTTP_PROXY": corp_url}
        command = launcher(
            "--set", f"confdir={confdir}", "--", sys.executable, str(work / "client.py"), str(work), f"https://localhost:{provider.port}"
        )
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, preexec_fn=core_files_on)
        try:
            agent = int(wait_for_file(work / "ready", process))
            running = [process.pid, *descendants(process.pid)]
            lines = {pid: cmdline(pid) for pid in running}
            mitmdump = mitmdump_of(process.pid)
            assert mitmdump is not None, lines
            # The user gave the launcher the URL in its environment; the proxy and the agent get none of it.
            environments = {"mitmdump": environment(mitmdump), "agent": environment(agent)}
            assert b"\0HTTPS_PROXY=http://127.0.0.1:" in environments["agent"]
            if resource.getrlimit(resource.RLIMIT_CORE)[1] != 0:  # a machine may forbid core files altogether
                assert core_file_limit(process.pid) != "0"
            assert core_file_limit(mitmdump) == "0"  # a core file would hold its memory, the credentials with it
            for form in secret_forms():
                assert not any(form in line for line in lines.values()), (form, lines)
                assert [name for name, text in environments.items() if form in text] == [], form
            runs = home / ".local" / "state" / "trimflow" / "runs"
            assert stat.S_IMODE(runs.stat().st_mode) == 0o700
            (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
            assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
            for path in runs.iterdir():
                if path.is_file():
                    assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
            for form in secret_forms():
                assert [path for path in files_under(home, confdir) if form in path.read_bytes()] == [], form
            (work / "go").touch()
            stdout, stderr = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        received = list(provider.received)
    assert process.returncode == 0, stderr.decode(errors="replace")
    assert (work / "status").read_text() == "200"
    assert [r.path for r in received] == ["/v1/chat/completions"]
    assert corp.tunnels == [f"localhost:{provider.port}"] and corp.refused == 0
    assert re.search(rb"1 LLM requests? in 1 conversation", stderr), stderr
    for form in secret_forms():
        assert form not in stdout + stderr
        for path in files_under(home, confdir):
            assert form not in path.read_bytes(), path
    assert [p.name for p in runs.iterdir() if p.is_dir()] == []  # the run's folder went at exit


def test_a_launcher_killed_while_the_proxy_starts_leaves_the_upstream_proxys_password_in_no_file(tmp_path: Path) -> None:
    """SIGKILL to the launcher once mitmdump runs and before the agent starts: nothing removes the run's folder, and no
    file under the home, the temporary folder or anywhere else the run could write holds the password."""
    home, work, tmp = tmp_path / "home", tmp_path / "work", tmp_path / "tmp"
    for folder in (home, work, tmp):
        folder.mkdir()
    corp_url = f"http://{PROXY_URL_USERINFO}@127.0.0.1:9"  # never reached: the run ends before any request
    env = {k: v for k, v in os.environ.items() if k != "XDG_STATE_HOME"}
    env.update(HOME=str(home), TMPDIR=str(tmp), HTTPS_PROXY=corp_url, HTTP_PROXY=corp_url)
    started = work / "agent-started"
    command = launcher("--", sys.executable, "-c", f"open({str(started)!r}, 'w')")
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    mitmdump = None
    try:

        def started_mitmdump() -> int | None:
            assert process.poll() is None, f"the launcher exited with {process.returncode}"
            return mitmdump_of(process.pid)

        mitmdump = wait_for(started_mitmdump, "mitmdump started by the launcher")
        process.kill()
        process.wait()
        wait_for(lambda: gone(mitmdump), "end of mitmdump after the launcher's SIGKILL")  # its death signal: nothing is written after
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if mitmdump is not None and not gone(mitmdump):
            os.kill(mitmdump, signal.SIGKILL)
    assert not started.exists()  # killed while the proxy started: the agent never ran
    runs = home / ".local" / "state" / "trimflow" / "runs"
    assert [p.name for p in runs.iterdir() if p.is_dir()] != []  # the run's folder stays, for the next start to remove
    files = list(files_under(tmp_path))
    assert any(path.suffix == ".log" for path in files)  # the run's own files are among those read
    for form in secret_forms():
        assert [path for path in files if form in path.read_bytes()] == [], form


GEMINI_AGENT = textwrap.dedent(
    """
    import json, os, sys, time
    work, wait = sys.argv[1], sys.argv[2] == "wait"
    private = os.path.join(os.environ["GEMINI_CLI_HOME"], ".gemini")
    settings = os.path.join(private, "settings.json")
    mode = os.stat(settings).st_mode & 0o777
    data = json.load(open(settings))
    data["ui"] = {"theme": "changed-in-the-run"}
    with open(settings + ".tmp", "w") as file:  # as Gemini CLI saves a setting: a new file renamed over the old
        json.dump(data, file)
    os.replace(settings + ".tmp", settings)
    with open(os.path.join(private, "trustedFolders.json"), "w") as file:
        json.dump({work: "TRUST_FOLDER"}, file)
    open(os.path.join(work, "ready.tmp"), "w").write(f"{os.getpid()} {mode:o}")
    os.replace(os.path.join(work, "ready.tmp"), os.path.join(work, "ready"))
    deadline = time.monotonic() + 120
    while wait and time.monotonic() < deadline:
        time.sleep(0.05)
    """
)


def gemini_user(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A home whose ~/.gemini/settings.json is 0600 (it holds an MCP server's token) and selects no auth type."""
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".gemini").mkdir(parents=True)
    work.mkdir()
    settings = home / ".gemini" / "settings.json"
    settings.write_text('{"mcpServers": {"tools": {"headers": {"Authorization": "Bearer mcp-token-1f3e"}}}}')
    settings.chmod(0o600)
    (work / "agent.py").write_text(GEMINI_AGENT)
    env = {**os.environ, "HOME": str(home), "GEMINI_API_KEY": "AIza-test-key", "GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:9"}
    return home, work, env


def kept_line(home: Path, kept: Path) -> str:
    wrote = "settings.json, trustedFolders.json"
    return f"trimflow run: Gemini CLI wrote {wrote} in its private settings folder, not in {home / '.gemini'}: kept in {kept}"


def test_what_gemini_wrote_in_its_private_settings_is_kept_and_named_and_the_copy_kept_the_users_mode(tmp_path: Path) -> None:
    home, work, env = gemini_user(tmp_path)
    before = (home / ".gemini" / "settings.json").read_bytes()
    command = launcher("--agent", "gemini", "--", sys.executable, str(work / "agent.py"), str(work), "exit")
    done = subprocess.run(command, env=env, capture_output=True, timeout=120)
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr
    assert (work / "ready").read_text().split()[1] == "600"
    runs = home / ".local" / "state" / "trimflow" / "runs"
    (kept,) = [p for p in runs.iterdir() if p.is_dir()]
    lines = [line for line in stderr.splitlines() if "private settings folder" in line]
    assert lines == [kept_line(home, kept)]
    assert json.loads((kept / "settings.json").read_text())["ui"] == {"theme": "changed-in-the-run"}
    assert json.loads((kept / "trustedFolders.json").read_text()) == {str(work): "TRUST_FOLDER"}
    assert stat.S_IMODE(kept.stat().st_mode) == 0o700
    assert (home / ".gemini" / "settings.json").read_bytes() == before  # theirs, never overwritten
    assert sorted(p.name for p in (home / ".gemini").iterdir()) == ["history", "settings.json", "tmp"]


def test_a_launcher_killed_with_sigkill_takes_the_proxy_and_the_agent_with_it_and_its_folder_goes_at_the_next_start(tmp_path: Path) -> None:
    home, work, env = gemini_user(tmp_path)
    command = launcher("--agent", "gemini", "--", sys.executable, str(work / "agent.py"), str(work), "wait")
    process = subprocess.Popen(command, env=env, start_new_session=True)
    started: list[int] = []
    try:
        agent = int(wait_for_file(work / "ready", process).split()[0])
        (mitmdump,) = [pid for pid in descendants(process.pid) if b"mitmdump" in cmdline(pid)]
        started += [agent, mitmdump]
        runs = home / ".local" / "state" / "trimflow" / "runs"
        (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
        process.kill()
        process.wait()
        wait_for(lambda: gone(agent) and gone(mitmdump), "end of the agent and mitmdump after the launcher's SIGKILL")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in started:  # left behind when the test fails: not for the next tests to meet
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
    assert run_dir.is_dir()  # nothing could remove it: the next start does
    done = subprocess.run(launcher("--", "true"), env=env, capture_output=True, timeout=120)
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr
    assert not run_dir.exists()
    kept = run_dir.with_name(f"{run_dir.name}.gemini")
    assert kept_line(home, kept) in stderr.splitlines()
    assert sorted(p.name for p in kept.iterdir()) == ["settings.json", "trustedFolders.json"]
    assert [p for p in runs.iterdir() if p.is_dir()] == [kept]  # the second run's folder went at its exit
