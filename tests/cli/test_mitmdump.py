"""trimflow.cli._mitmdump: mitmdump's command line for `python -m trimflow run`: 127.0.0.1:8080 unless the arguments
say otherwise, trimflow's script, the user's arguments after them, and mitmdump's own reading of it; an option
dropped from the arguments, and the confdir of a run that carries an upstream's credentials."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest
import yaml
from mitmproxy import options
from mitmproxy.tools import cmdline
from mitmproxy.tools.dump import DumpMaster
from mitmproxy.tools.main import process_options

from trimflow.cli._mitmdump import SCRIPT, mitmdump_argv, mitmdump_binary, mitmdump_confdir, without_option

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


def test_mitmdumps_confdir_of_the_run_holds_the_users_config_and_the_credentials_readable_by_them_alone(tmp_path: Path) -> None:
    user, run_dir = tmp_path / "user-confdir", tmp_path / "run"
    user.mkdir()
    run_dir.mkdir()
    (user / "config.yaml").write_text("ssl_insecure: false\nscripts: [mine.py]\nupstream_cert: false\n")
    confdir = mitmdump_confdir(run_dir, user, "corp-user:s3cr@t: x")
    assert stat.S_IMODE(confdir.stat().st_mode) == 0o700
    config = confdir / "config.yaml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert yaml.safe_load(config.read_text()) == {
        "ssl_insecure": False,
        "scripts": [str(user / "mine.py")],  # mitmproxy reads them relative to the file that names them
        "upstream_cert": False,
        "confdir": str(user),  # the CA stays the user's
        "upstream_auth": "corp-user:s3cr@t: x",
    }


def test_a_users_confdir_option_makes_way_for_the_runs(tmp_path: Path) -> None:
    args = ["--set", "confdir=/c", "-q", "--set=confdir=/d", "--set", "confdirx=1", "--set=trimflow_mode=observe"]
    assert without_option(args, "confdir") == ["-q", "--set", "confdirx=1", "--set=trimflow_mode=observe"]
