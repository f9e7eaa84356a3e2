"""mitmdump's command line, for `run` and the launcher alike.

The binary, trimflow's script and listen defaults, the user's arguments after them; an option dropped from them;
and a confdir of the run that carries an upstream's credentials, which never go on the command line."""

from __future__ import annotations

import itertools
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from ._launch_error import LaunchError
from ._run_dir import write_private

SCRIPT = Path(__file__).resolve().parents[1] / "proxy" / "mitmdump_script.py"
# Given as --set, not as flags: mitmdump applies --listen-host/-p after every --set, so the user's flag
# wins over these; a --set of the same option twice is an error, so one the user gives replaces ours.
DEFAULTS = {"listen_host": "127.0.0.1", "listen_port": "8080"}
MITMDUMP_CONFDIR = "mitmproxy"  # in a run's folder: the confdir whose config.yaml gives mitmdump the upstream's credentials


def mitmdump_binary() -> str | None:
    """The mitmdump of this Python's environment, else the one on PATH."""
    beside = Path(sys.executable).with_name("mitmdump")
    return str(beside) if beside.exists() else shutil.which("mitmdump")


def mitmdump_argv(args: list[str]) -> list[str] | None:
    """mitmdump's argv: the binary, the listen defaults `args` do not --set, trimflow's script, then `args`; None
    without a mitmdump."""
    binary = mitmdump_binary()
    if binary is None:
        return None
    given = {value.partition("=")[0] for flag, value in itertools.pairwise(args) if flag == "--set"}
    given |= {a.removeprefix("--set=").partition("=")[0] for a in args if a.startswith("--set=")}
    defaults = [item for name, value in DEFAULTS.items() if name not in given for item in ("--set", f"{name}={value}")]
    return [binary, *defaults, "-s", str(SCRIPT), *args]


def mitmdump_confdir(run_dir: Path, user_confdir: Path, auth: str) -> Path:
    """A confdir of the run whose config.yaml gives mitmdump `upstream_auth` off its command line: the user's own
    config.yaml (mitmdump reads it from the confdir), the credentials, and `confdir` back to the user's (its CA)."""
    options: dict[str, Any] = {}
    for name in ("config.yaml", "config.yml"):  # in mitmproxy's order, the later one winning
        path = user_confdir / name
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise LaunchError(f"trimflow run: cannot read {path} ({type(exc).__name__})") from None
        if loaded is None:
            continue
        if not isinstance(loaded, dict):
            raise LaunchError(f"trimflow run: {path} is not a mapping of mitmproxy options")
        if isinstance(loaded.get("scripts"), list):  # mitmproxy reads them relative to the file's folder
            loaded["scripts"] = [str(user_confdir / Path(str(script)).expanduser()) for script in loaded["scripts"]]
        options.update(loaded)
    options.update(confdir=str(user_confdir), upstream_auth=auth)
    confdir = run_dir / MITMDUMP_CONFDIR
    confdir.mkdir(mode=0o700)
    write_private(confdir / "config.yaml", yaml.safe_dump(options).encode())
    return confdir


def without_option(args: list[str], name: str) -> list[str]:
    """mitmdump's arguments without `--set NAME=...` (in either form)."""
    out, items = [], iter(args)
    for item in items:
        if item == "--set":
            value = next(items, "")
            if value.partition("=")[0] != name:
                out += [item, value]
        elif not (item.startswith("--set=") and item[len("--set=") :].partition("=")[0] == name):
            out.append(item)
    return out
