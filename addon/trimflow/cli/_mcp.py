"""`python -m trimflow mcp [--store FOLDER] [--token-file FILE]`: the MCP server with the tool recall_image(id), over
stdio, which an agent CLI spawns (the launcher registers it, docs/agents.md#recall).

It answers from one run's images (trimflow._recall.RecallReader): the run whose token it is given, in a file
(`--token-file`, the launcher's: 0600 in the run's folder) or in TRIMFLOW_RECALL_TOKEN. There is no network
transport: a proxy's recall is served only to an agent on its machine, by a server that holds its run's token.
Needs the optional `mcp` package (`pip install 'trimflow[recall]'`).
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from .._recall import FOLDER_NAME, STORE_VARIABLE, TOKEN_VARIABLE, TOOL, RecallError, RecallReader, parse_token
from ._status import USAGE_ERROR, fail

COMMAND = "trimflow mcp"
MAX_TOKEN_FILE = 1024
DESCRIPTION = (
    "Bring back an image that trimflow cut from this conversation to keep requests within the provider's limits. "
    'A cut image\'s placeholder names its id: [trimflow: image #3 omitted (...); recall_image("ID") brings it back], '
    "where ID is 10 letters and digits: pass it. The image comes back as this tool's result."
)


def default_store(environ: dict[str, str] | None = None) -> Path:
    """The store the launcher names in the agent's environment, else a proxy's with mitmproxy's default confdir."""
    environ = dict(os.environ if environ is None else environ)
    named = environ.get(STORE_VARIABLE)
    return Path(named) if named else Path(environ.get("HOME") or Path.home()) / ".mitmproxy" / FOLDER_NAME


def read_token(path: str) -> bytes | None:
    """The token in a file of this user's that no one else can read; None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077 or st.st_size > MAX_TOKEN_FILE:
            return None
        return parse_token(os.read(fd, MAX_TOKEN_FILE).decode("ascii", "replace"))
    finally:
        os.close(fd)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m trimflow mcp", description="Serve recall_image over MCP (stdio).")
    parser.add_argument("--store", help=f"the proxy's trimflow_recall folder (default {STORE_VARIABLE}, else ~/.mitmproxy/{FOLDER_NAME})")
    parser.add_argument("--token-file", help=f"a file holding the run's token (0600); else {TOKEN_VARIABLE}")
    args = parser.parse_args(list(argv))
    if args.token_file:
        token = read_token(args.token_file)
        if token is None:
            return fail(COMMAND, "--token-file names no token file of this user's that only they can read")
    else:
        token = parse_token(os.environ.get(TOKEN_VARIABLE, ""))
        if token is None:
            return fail(COMMAND, f"no run token: give --token-file or set {TOKEN_VARIABLE} as for the proxy (docs/agents.md#recall)")
    store = Path(args.store).expanduser() if args.store else default_store()
    try:
        from mcp.server.mcpserver import Image, MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:
        return fail(COMMAND, "needs the mcp package (2.3 or newer): pip install 'trimflow[recall]'", USAGE_ERROR)
    reader = RecallReader(str(store), token)
    server: MCPServer = MCPServer("trimflow", instructions="trimflow's recall of the images it cut from requests to keep them within limits.")

    def recall_image(id: str) -> Image:
        try:
            recalled = reader.read(id)
        except RecallError as exc:
            raise ToolError(str(exc)) from None
        return Image(data=recalled.data, format=recalled.mime.removeprefix("image/"))

    recall_image.__annotations__ = {"id": str, "return": Image}  # the SDK reads them; `Image` is imported here, not at the top
    # Claude Code defers MCP tools behind its tool search unless a tool asks to be loaded: the placeholders name this one.
    server.add_tool(recall_image, name=TOOL, description=DESCRIPTION, meta={"anthropic/alwaysLoad": True})
    try:
        server.run("stdio")
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
