"""The suite's own environment; images shared by the tests of the engine, the policy and _shrink (each made
once per run, some take seconds), and fixtures that watch _shrink's cache and encoder."""

from __future__ import annotations

import io
import random
import signal
from collections.abc import Iterator

import pytest
from PIL import Image

from trimflow import _shrink
from trimflow.testing import b64, image

from .research.cache_sessions import desktop_screenshot

FIVE_MB = 5 * 2**20  # Anthropic's limit on one image
RETINA = (2880, 1800)  # a 1440x900 desktop at 2x

PROXY_VARIABLES = tuple(name for base in ("http_proxy", "https_proxy", "all_proxy", "no_proxy") for name in (base, base.upper()))
CA_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")


@pytest.fixture(scope="session", autouse=True)
def no_user_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite runs alike whatever the user's shell exports: no proxy or CA variable of theirs reaches a
    client or a process a test starts, and HOME is an empty folder (mitmdump runs without a confdir write
    ~/.mitmproxy there, and no ~/.mitmproxy/config.yaml of theirs applies). A test that means a proxy gives
    it to its client (tests/e2e/helpers.py), which test_proxy_forward checks with these variables set.

    Run in the background (nohup, `&` in a script) the shell hands down SIGINT ignored, and so would every
    process a test starts: the tests that stop one with ctrl-C's signal need it back to the default."""
    interrupt = signal.getsignal(signal.SIGINT)
    if interrupt is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a child starts with SIGINT at its default
    try:
        with pytest.MonkeyPatch.context() as mp:
            for name in PROXY_VARIABLES + CA_VARIABLES:
                mp.delenv(name, raising=False)
            mp.setenv("HOME", str(tmp_path_factory.mktemp("home")))
            yield
    finally:
        signal.signal(signal.SIGINT, interrupt)


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


@pytest.fixture(scope="session")
def retina_desktop() -> bytes:
    """A 2880x1800 PNG like a Retina desktop's screenshot (1.7 MB): larger than any provider's model sees it."""
    return desktop_screenshot(1, RETINA)


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
