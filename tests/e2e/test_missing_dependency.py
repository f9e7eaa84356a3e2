"""addon/mitm.py in a mitmproxy whose Python lacks one of trimflow's packages (a pipx or Homebrew mitmproxy)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ..mitmdump import ADDON, mitmdump_binary

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(("module", "package"), [("orjson", "orjson"), ("yaml", "pyyaml"), ("PIL", "pillow")])
def test_a_missing_package_is_named_in_one_line_and_mitmdump_exits(tmp_path: Path, module: str, package: str) -> None:
    # A script loaded first makes the module unimportable, as it is in a Python that lacks it.
    blocker = tmp_path / "without.py"
    blocker.write_text(f"import sys\nsys.modules[{module!r}] = None\n")
    done = subprocess.run(
        [mitmdump_binary(), "--listen-host", "127.0.0.1", "--listen-port", "0", "-s", str(blocker), "-s", str(ADDON)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    lines = [line for line in output.splitlines() if "trimflow needs" in line]
    assert len(lines) == 1 and f"pipx inject mitmproxy {package}" in lines[0], output
    assert "Traceback" not in output
