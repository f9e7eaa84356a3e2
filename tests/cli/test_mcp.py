"""trimflow.cli._mcp: `python -m trimflow mcp`, driven by the MCP SDK's own client over stdio as an agent spawns it:
recall_image brings an image back byte for byte as an image block; an unknown id, an id of another run and an
expired image are tool errors that say so, and the server goes on; a missing or readable-by-others token stops it
with one line. The store: tests/test_recall.py."""

from __future__ import annotations

import base64
import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trimflow._recall import TOKEN_VARIABLE, Kept, RecallStore, image_id, owner_of, run_folder
from trimflow.formats import Media
from trimflow.testing import image

from ..helpers import MCP_SDK_MISSING

if MCP_SDK_MISSING:
    pytest.skip(MCP_SDK_MISSING, allow_module_level=True)
Client = importlib.import_module("mcp").Client
StdioServerParameters = importlib.import_module("mcp.client.stdio").StdioServerParameters

TOKEN = bytes(range(32))
OTHER = bytes(range(2, 34))


def store_images(folder: Path, token: bytes, *raws: bytes) -> None:
    store = RecallStore(str(folder), token, lifetime=3600.0)
    assert store.accepts(owner_of(token, {}))
    store.offer("aaaaaaaa", [Kept(image_id(raw), Media("image", ("x",), base64.b64encode(raw).decode()), "image/png") for raw in raws])
    assert store.flush()
    store.close()


def token_file(path: Path, token: bytes, mode: int = 0o600) -> Path:
    path.write_text(token.hex() + "\n")
    os.chmod(path, mode)
    return path


def server(store: Path, token: Path) -> Any:
    return StdioServerParameters(command=sys.executable, args=["-m", "trimflow", "mcp", "--store", str(store), "--token-file", str(token)])


async def test_recall_image_brings_the_image_back_and_says_why_it_cannot(tmp_path: Path) -> None:
    mine, old, theirs = (image(120, 90, "PNG", seed=seed) for seed in (1, 2, 3))
    store_images(tmp_path / "store", TOKEN, mine, old)
    store_images(tmp_path / "store", OTHER, theirs)
    past = os.path.getmtime(tmp_path / "store") - 2 * 3600  # last used two hours ago, with a lifetime of one
    os.utime(tmp_path / "store" / run_folder(TOKEN) / image_id(old), (past, past))
    async with Client(server(tmp_path / "store", token_file(tmp_path / "token", TOKEN))) as client:
        (tool,) = (await client.list_tools()).tools
        assert tool.name == "recall_image" and "placeholder" in (tool.description or "")
        assert list(tool.input_schema["properties"]) == ["id"]

        result = await client.call_tool("recall_image", {"id": image_id(mine)})
        assert not result.is_error
        (block,) = result.content
        assert block.type == "image" and block.mime_type == "image/png"
        assert base64.b64decode(block.data) == mine

        unknown = await client.call_tool("recall_image", {"id": "aaaaaaaaaa"})
        assert unknown.is_error and "no image aaaaaaaaaa in this run's store" in unknown.content[0].text
        other_run = await client.call_tool("recall_image", {"id": image_id(theirs)})
        assert other_run.is_error and "in this run's store" in other_run.content[0].text
        expired = await client.call_tool("recall_image", {"id": image_id(old)})
        assert expired.is_error and f"image {image_id(old)} expired" in expired.content[0].text

        again = await client.call_tool("recall_image", {"id": image_id(mine)})  # the server went on
        assert base64.b64decode(again.content[0].data) == mine
    assert (tmp_path / "store" / run_folder(TOKEN) / "recalls").read_text().split() == ["ok", "refused", "refused", "refused", "ok"]


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        ([], {}, f"no run token: give --token-file or set {TOKEN_VARIABLE}"),
        (["--token-file", "{shared}"], {}, "--token-file names no token file of this user's that only they can read"),
        (["--token-file", "{missing}"], {}, "--token-file names no token file"),
        ([], {TOKEN_VARIABLE: "abc"}, "no run token"),
    ],
)
def test_without_a_token_of_its_own_it_stops_with_one_line(tmp_path: Path, args: list[str], env: dict[str, str], said: str) -> None:
    shared = token_file(tmp_path / "shared", TOKEN, 0o644)
    values = {"shared": str(shared), "missing": str(tmp_path / "missing")}
    environ = {name: value for name, value in os.environ.items() if name != TOKEN_VARIABLE}
    done = subprocess.run(
        [sys.executable, "-m", "trimflow", "mcp", "--store", str(tmp_path), *(a.format(**values) for a in args)],
        env={**environ, **env},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("trimflow mcp: ") and said in line
    assert TOKEN.hex() not in line


async def test_the_token_may_come_from_the_environment(tmp_path: Path) -> None:
    raw = image(64, 64, "PNG", seed=9)
    store_images(tmp_path, TOKEN, raw)
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "trimflow", "mcp", "--store", str(tmp_path)], env={TOKEN_VARIABLE: TOKEN.hex(), "HOME": str(tmp_path)}
    )
    async with Client(params) as client:
        result = await client.call_tool("recall_image", {"id": image_id(raw)})
    assert base64.b64decode(result.content[0].data) == raw


def test_without_the_mcp_package_it_says_how_to_get_it(tmp_path: Path) -> None:
    token = token_file(tmp_path / "token", TOKEN)
    script = f"import sys; sys.modules['mcp'] = None; from trimflow.cli._mcp import main; sys.exit(main(['--token-file', {str(token)!r}]))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode == 2
    assert done.stderr == "trimflow mcp: needs the mcp package (2.3 or newer): pip install 'trimflow[recall]'\n"
