"""Fixtures of the end-to-end tests: the FakeProvider upstream, and the send-once tests' pair of proxies (helpers.py
has the processes and sessions)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trimflow.testing import FakeProvider

from .helpers import Proxy, start_all, stop_all


@pytest.fixture(scope="session")
def provider() -> Iterator[FakeProvider]:
    """The plain-HTTP upstream shared by the reverse-mode and script tests."""
    with FakeProvider() as p:
        yield p


@pytest.fixture
def fresh(provider: FakeProvider) -> FakeProvider:
    """The shared provider with no requests recorded yet, so a test sees exactly its own."""
    provider.clear()
    return provider


@pytest.fixture(scope="module")
def send_once_providers() -> Iterator[tuple[FakeProvider, FakeProvider]]:
    """Two fake providers with their prompt-cache model: one behind the send-once proxy, one behind the inline one."""
    with FakeProvider(cache=True) as once, FakeProvider(cache=True) as inline:
        yield once, inline


@pytest.fixture(scope="module")
def send_once_proxies(
    tmp_path_factory: pytest.TempPathFactory, send_once_providers: tuple[FakeProvider, FakeProvider]
) -> Iterator[tuple[Proxy, Proxy]]:
    """A mitmdump whose rules send every image once and one with the shipped rules, in front of `send_once_providers`."""
    once_provider, inline_provider = send_once_providers
    work = tmp_path_factory.mktemp("send-once")
    rules = work / "rules.yaml"
    rules.write_text("defaults:\n  send_once: true\n")
    once = Proxy(work / "once", "--mode", f"reverse:{once_provider.url}", rules=rules)
    inline = Proxy(work / "inline", "--mode", f"reverse:{inline_provider.url}", rules=None)
    start_all(once.mitm, inline.mitm)
    yield once, inline
    stop_all(once.mitm, inline.mitm)
