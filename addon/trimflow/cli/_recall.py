"""The launcher's side of recall (trimflow._recall): the run's token, where the store is, the MCP server each agent
is given, and the run's images removed when it ends.

The token (32 random bytes) goes to mitmdump in its environment (TOKEN_VARIABLE, which only the user can read), to
the registered MCP server in a 0600 file of the run's folder (`--token-file`: a path on a command line gives nothing
away), and to the agent's environment with the store's folder (STORE_VARIABLE), for an MCP server the user
registered by hand (`python -m trimflow mcp` reads both). Nothing of it is in a log or on a command line."""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .._recall import FOLDER_NAME, STORE_VARIABLE, TOKEN_VARIABLE, run_folder
from ._run_dir import write_private

OPTION = "trimflow_recall"
TOKEN_FILE = "recall-token"  # in the run's folder


@dataclass(frozen=True)
class RunRecall:
    """One run's recall: its token, the store's folder, the token's file and the MCP server's command line."""

    token: bytes
    store: Path
    token_file: Path

    @property
    def server(self) -> list[str]:
        """The MCP server's argv, as an agent spawns it."""
        return [sys.executable, "-m", "trimflow", "mcp", "--store", str(self.store), "--token-file", str(self.token_file)]

    def proxy_env(self) -> dict[str, str]:
        return {TOKEN_VARIABLE: self.token.hex()}

    def agent_env(self) -> dict[str, str]:
        return {TOKEN_VARIABLE: self.token.hex(), STORE_VARIABLE: str(self.store)}

    def remove(self) -> None:
        """The run's images: no server can read them once the run's token is gone."""
        shutil.rmtree(self.store / run_folder(self.token), ignore_errors=True)


def has_mcp() -> bool:
    return importlib.util.find_spec("mcp") is not None


def prepare(sets: dict[str, str], confdir: Path, run_dir: Path) -> tuple[RunRecall | None, str | None]:
    """The run's recall, or None with the line to say why not (None: nothing to say, the user turned it off)."""
    folder = sets.get(OPTION, "{confdir}/" + FOLDER_NAME)
    if not folder:
        return None, None
    if not has_mcp():
        if sys.version_info < (3, 12):  # mcp 2 needs h11 >= 0.16; mitmproxy 11, the newest for Python 3.11, pins it lower
            return None, "trimflow run: no recall_image for the agent: it needs Python 3.12 or newer (the mcp package)"
        return None, "trimflow run: no recall_image for the agent: the mcp package is missing (pip install 'trimflow[recall]')"
    store = Path(os.path.expanduser(folder.replace("{confdir}", str(confdir)))).absolute()
    token = secrets.token_bytes(32)
    token_file = run_dir / TOKEN_FILE
    write_private(token_file, token.hex().encode() + b"\n")
    return RunRecall(token, store, token_file), None
