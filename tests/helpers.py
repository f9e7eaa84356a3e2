"""Test helpers: rules with given limits, requests built from synthetic sessions, and the addon module."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import orjson

from trimflow import Limits
from trimflow._rules import Rules, builtin_rules
from trimflow.proxy import _addon as proxy_addon
from trimflow.testing import PATHS


def rules_with(**limits: Any) -> Rules:
    """The built-in endpoints with these limits as the defaults."""
    return dataclasses.replace(builtin_rules(), defaults=Limits(**limits))


def url_for(wire_format: str, host: str = "api.example.test") -> str:
    return f"https://{host}{PATHS[wire_format]}"


def encode(body: Any) -> bytes:
    return orjson.dumps(body)


ROOT = Path(__file__).resolve().parents[1]


def load_addon_module():
    """addon/mitm.py as mitmdump loads it: a script beside the package, not an importable module."""
    spec = importlib.util.spec_from_file_location("trimflow_mitm_under_test", ROOT / "addon" / "mitm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mitm = proxy_addon


async def requested(addon, flow) -> None:
    """The request hook and the turn of the event loop after it, as mitmproxy runs them: a request
    forwarded as it came gets its record on that turn, before any answer can arrive."""
    await addon.request(flow)
    await asyncio.sleep(0)


async def answer_sent() -> None:
    """Past the addon's flush: it logs and writes a record FLUSH_DELAY after the answer went out.
    Timers fire in deadline order, so a later one always finds the flush done."""
    await asyncio.sleep(mitm.FLUSH_DELAY * 2)
