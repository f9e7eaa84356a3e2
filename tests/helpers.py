"""Test helpers: rules with given limits, and requests built from synthetic sessions."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from trimflow import Limits
from trimflow._rules import Rules, builtin_rules
from trimflow._synthetic import PATHS


def rules_with(**limits: Any) -> Rules:
    """The built-in endpoints with these limits as the defaults."""
    return dataclasses.replace(builtin_rules(), defaults=Limits(**limits))


def url_for(wire_format: str, host: str = "api.example.test") -> str:
    return f"https://{host}{PATHS[wire_format]}"


def encode(body: Any) -> bytes:
    return orjson.dumps(body)
