"""Fixtures of the end-to-end tests: the FakeProvider upstream (helpers.py has the processes and sessions)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trimflow.testing import FakeProvider


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
