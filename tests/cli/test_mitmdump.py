"""trimflow._run: the mitmdump command line of `python -m trimflow run`: 127.0.0.1:8080 unless the arguments
say otherwise, trimflow's script, the user's arguments after them; and mitmdump's own reading of it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mitmproxy import options
from mitmproxy.tools import cmdline
from mitmproxy.tools.dump import DumpMaster
from mitmproxy.tools.main import process_options

from trimflow.cli import _run
from trimflow.cli._run import SCRIPT, command, mitmdump_binary

DEFAULTS = ["--set", "listen_host=127.0.0.1", "--set", "listen_port=8080"]


def test_the_binary_is_this_environments_mitmdump() -> None:
    binary = mitmdump_binary()
    assert binary is not None and Path(binary) == Path(sys.executable).with_name("mitmdump")


def test_no_arguments_listen_on_loopback_8080_with_trimflows_script() -> None:
    assert command([]) == [mitmdump_binary(), *DEFAULTS, "-s", str(SCRIPT)]
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
    assert command(args) == [mitmdump_binary(), *defaults, "-s", str(SCRIPT), *args]


def as_mitmdump_reads(args: list[str]) -> tuple[str, int]:
    """Where mitmdump would listen with `python -m trimflow run ARGS`: its own parser and option handling."""
    argv = command(args)
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
        (["-p9001"], ("127.0.0.1", 9001)),  # a form command() does not see: the user's value comes last and wins
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


def test_without_mitmdump_run_exits_2_saying_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert mitmdump_binary() is None and command(["-p", "9000"]) is None
    assert _run.main(["-p", "9000"]) == 2
    assert capsys.readouterr().err == "trimflow run: mitmdump not found: pip install mitmproxy\n"
