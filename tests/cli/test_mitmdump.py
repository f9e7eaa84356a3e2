"""trimflow.cli._mitmdump: mitmdump's command line for `python -m trimflow run`: 127.0.0.1:8080 unless the arguments
say otherwise, trimflow's script, the user's arguments after them, and mitmdump's own reading of it; an option
dropped from the arguments, and the pipe that carries an upstream's credentials."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
from mitmproxy import options
from mitmproxy.tools import cmdline
from mitmproxy.tools.dump import DumpMaster
from mitmproxy.tools.main import process_options

from trimflow.cli._launch_error import LaunchError
from trimflow.cli._mitmdump import AUTH_FD_OPTION, SCRIPT, auth_pipe, listening_port, mitmdump_argv, mitmdump_binary, without_option
from trimflow.proxy import upstream_auth

DEFAULTS = ["--set", "listen_host=127.0.0.1", "--set", "listen_port=8080"]


def test_the_binary_is_this_environments_mitmdump() -> None:
    binary = mitmdump_binary()
    assert binary is not None and Path(binary) == Path(sys.executable).with_name("mitmdump")


def test_no_arguments_listen_on_loopback_8080_with_trimflows_script() -> None:
    assert mitmdump_argv([]) == [mitmdump_binary(), *DEFAULTS, "-s", str(SCRIPT)]
    assert SCRIPT.is_file() and SCRIPT.name == "mitmdump_script.py"


@pytest.mark.parametrize(
    ("args", "defaults"),
    [
        (["--mode", "reverse:http://127.0.0.1:5000", "-q", "-p", "9000"], DEFAULTS),  # the flag wins over --set
        (["--set", "listen_port=9000"], ["--set", "listen_host=127.0.0.1"]),
        (["--set=listen_host=::1", "--set", "trimflow_mode=observe"], ["--set", "listen_port=8080"]),
    ],
)
def test_every_argument_follows_the_defaults_and_a_set_replaces_its_default(args: list[str], defaults: list[str]) -> None:
    assert mitmdump_argv(args) == [mitmdump_binary(), *defaults, "-s", str(SCRIPT), *args]


def as_mitmdump_reads(args: list[str]) -> tuple[str, int]:
    """Where mitmdump would listen with `python -m trimflow run ARGS`: its own parser and option handling."""
    argv = mitmdump_argv(args)
    assert argv is not None
    opts = options.Options()
    DumpMaster(opts)  # its addons declare the options the parser knows (-s among them)
    parser = cmdline.mitmdump(opts)
    parsed = parser.parse_args(argv[1:])
    opts.set(*parsed.setoptions, defer=True)
    process_options(parser, opts, parsed)
    return opts.listen_host, opts.listen_port


@pytest.mark.parametrize(
    ("args", "where"),
    [
        ([], ("127.0.0.1", 8080)),
        (["-p", "9000"], ("127.0.0.1", 9000)),
        (["-p9001"], ("127.0.0.1", 9001)),  # a form mitmdump_argv() does not see: the user's value comes last and wins
        (["--listen-port=9002"], ("127.0.0.1", 9002)),
        (["--listen-host", "::1", "-p", "9003"], ("::1", 9003)),
        (["--set", "listen_port=9004"], ("127.0.0.1", 9004)),
        (["--set", "listen_host=::1"], ("::1", 8080)),
        (["--set", "listen_port=9005", "-p", "9006"], ("127.0.0.1", 9006)),  # mitmdump's own order: the flag wins
        (["--set=listen_port=9007"], ("127.0.0.1", 9007)),
    ],
)
async def test_mitmdump_listens_where_the_user_said(args: list[str], where: tuple[str, int]) -> None:
    # async: a mitmproxy master wants a running event loop
    assert as_mitmdump_reads(args) == where


def open_descriptors() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


def test_the_credentials_pipe_holds_them_whole_and_no_writer_so_a_reader_never_waits() -> None:
    read = auth_pipe("corp-user:s3cr@t: x")
    try:
        assert stat.S_ISFIFO(os.fstat(read).st_mode)
        os.set_blocking(read, False)  # with a writer left, reading past the bytes would raise BlockingIOError
        assert os.read(read, 100) == b"corp-user:s3cr@t: x"
        assert os.read(read, 100) == b""  # the end: no writer is left
    finally:
        os.close(read)


def test_credentials_longer_than_a_pipe_takes_at_once_are_refused_without_showing_them() -> None:
    before = open_descriptors()
    with pytest.raises(LaunchError) as caught:
        auth_pipe("corp-user:" + "s3cr3t" * 200_000)
    assert str(caught.value) == "trimflow run: the credentials of the proxy in HTTPS_PROXY are too long (1200010 bytes)"
    assert open_descriptors() == before


def test_the_credentials_pipe_option_is_the_launchers_alone_to_give() -> None:
    assert AUTH_FD_OPTION == upstream_auth.OPTION  # the name the addon declares (cli may not import mitmproxy)
    args = ["--set", f"{AUTH_FD_OPTION}=7", "-q", f"--set={AUTH_FD_OPTION}=8", "--set", f"{AUTH_FD_OPTION}x=1", "--set=trimflow_mode=observe"]
    assert without_option(args, AUTH_FD_OPTION) == ["-q", "--set", f"{AUTH_FD_OPTION}x=1", "--set=trimflow_mode=observe"]


@pytest.mark.parametrize(
    ("log", "port"),
    [
        ("[10:00:00.000] HTTP(S) proxy listening at 127.0.0.1:41234.\n", 41234),
        ("Loading script trimflow\nReverse proxy to https://api.anthropic.com listening at [::1]:8080.\n", 8080),
        ("Upstream proxy to http://proxy.corp:3128 listening at *:5000.", 5000),
        ("HTTP(S) proxy listening at 127.0.0.1:7000 and [::1]:7001.\n", 7000),
        ("Web server listening at http://127.0.0.1:8081/?token=abc\n", None),  # mitmweb's UI, no proxy
        ("HTTP(S) proxy listening at 127.0.0.1:80", None),  # the line not yet whole
        ("", None),
    ],
)
def test_the_port_mitmdump_says_it_listens_on(log: str, port: int | None) -> None:
    assert listening_port(log) == port
