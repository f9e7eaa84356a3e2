"""Images shared by the tests of the engine, the policy and _shrink (each made once per run, some take
seconds), and fixtures that watch _shrink's cache and encoder."""

from __future__ import annotations

import io
import random

import pytest
from PIL import Image

from trimflow import _shrink
from trimflow.testing import b64, image

FIVE_MB = 5 * 2**20  # Anthropic's limit on one image


@pytest.fixture(scope="session")
def png_over_5mb() -> str:
    """A noisy PNG whose base64 is over Anthropic's 5 MB: incompressible, so only JPEG gets it under."""
    data = b64(image(1600, 1000, "PNG", seed=11, noise=1.0))
    assert len(data) > FIVE_MB
    return data


@pytest.fixture(scope="session")
def noisy_png() -> bytes:
    """Too noisy to stay PNG under 300 KB of base64, small enough to be quick."""
    raw = image(480, 300, "PNG", seed=22, noise=1.0)
    assert len(b64(raw)) > 300_000
    return raw


@pytest.fixture(scope="session")
def wide_2500() -> list[bytes]:
    """25 distinct images with a 2500 px side (the many-image rule's case)."""
    return [image(2500, 300 + i, "JPEG", seed=i, noise=0.0) for i in range(25)]


@pytest.fixture(scope="session")
def screens() -> list[bytes]:
    """Distinct screenshot-like PNGs of ~250 KB, one per turn: flat areas and a busy window that moves."""
    base = Image.open(io.BytesIO(image(1280, 800, "PNG", noise=0.0))).convert("RGB")
    shots = []
    for i in range(8):
        screen = base.copy()
        screen.paste((40 * i, 120, 200), (60 + 90 * i, 100, 460 + 90 * i, 400))
        busy = Image.frombytes("RGB", (300, 200), random.Random(i).randbytes(300 * 200 * 3))
        screen.paste(busy, (80 + 90 * i, 150))
        buf = io.BytesIO()
        screen.save(buf, "PNG")
        shots.append(buf.getvalue())
    return shots


@pytest.fixture
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> _shrink.ShrinkCache:
    cache = _shrink.ShrinkCache()
    monkeypatch.setattr(_shrink, "CACHE", cache)
    return cache


@pytest.fixture
def encodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every image encode, by format: counts the real work the ladder does."""
    calls: list[str] = []
    real = _shrink._encode
    monkeypatch.setattr(_shrink, "_encode", lambda im, fmt, q: calls.append(fmt) or real(im, fmt, q))
    return calls
