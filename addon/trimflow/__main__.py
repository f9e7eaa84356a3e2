"""`python -m trimflow COMMAND [ARGS...]`: every trimflow tool behind one entry point.

The scripts in `scripts/` are thin wrappers over these commands.
"""

from __future__ import annotations

import importlib
import sys

from .cli._status import fail

# command -> (module with main(argv) -> int, one line of help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("trimflow.cli._run", "start the proxy (mitmdump with trimflow's addons); run [OPTIONS] -- COMMAND runs COMMAND behind it"),
    "prune": ("trimflow.cli._prune", "apply the rules to one request body offline"),
    "audit": ("trimflow.audit._cli", "audit recorded LLM traffic (mitmproxy dumps, HAR, metrics JSONL)"),
    "replay": ("trimflow.testing._replay", "send a synthetic screenshot session turn by turn"),
    "fake-provider": ("trimflow.testing._fake_provider_cli", "run the offline fake LLM provider"),
    "learned": ("trimflow.cli._learned", "list the limits learned from providers' refusals, and forget them"),
    "repair": ("trimflow.repair._cli", "apply the rules to an agent's saved session, so that resuming it works again"),
    "files": ("trimflow.cli._files", "list the files send-once uploaded to a provider's Files API, and delete them"),
    "mcp": ("trimflow.cli._mcp", "serve recall_image over MCP (stdio): the images a run cut, back for its agent"),
}


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    return "usage: python -m trimflow COMMAND [ARGS...]\n\ncommands:\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(usage())
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        status = fail("trimflow", f"unknown command {command!r}")
        sys.stderr.write(usage())
        return status
    module = importlib.import_module(COMMANDS[command][0])
    return int(module.main(rest))


if __name__ == "__main__":
    sys.exit(main())
