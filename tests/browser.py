"""Headless Chromium for the tests that look at a page as a browser shows it (Debian's `chromium` package).

Where chromium is missing those tests skip with one line saying how to install it; with
TRIMFLOW_REQUIRE_BROWSER=1 (set by .ci/run) they fail instead, so CI never passes with them skipped.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

MISSING = "chromium not installed: the browser tests need Debian's chromium (as root: apt-get install chromium, or scripts/setup)"
REQUIRE_VARIABLE = "TRIMFLOW_REQUIRE_BROWSER"


def chromium() -> str:
    """The chromium binary; skips the calling test where there is none (fails it when the browser is required)."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get(REQUIRE_VARIABLE) == "1":
        pytest.fail(f"{MISSING} ({REQUIRE_VARIABLE}=1)", pytrace=False)
    pytest.skip(MISSING)


def headless(profile: Path, *args: str) -> list[str]:
    """The command line of a headless Chromium with its own profile folder, then `args` (the page last).

    --no-proxy-server: the pages are local, and the user's proxy variables must not reach them (Chromium on
    Linux reads http_proxy and friends). --no-sandbox: CI runs as root, where the sandbox refuses to start.
    """
    return [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--no-first-run",
        "--no-proxy-server",
        f"--user-data-dir={profile}",
        *args,
    ]
