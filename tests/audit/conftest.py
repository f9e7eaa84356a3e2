"""The audit's shared recording: four turns and a 413, every request URL carrying a key in its query string."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import LIMIT_413, QUERY_SECRET, llm_flow, session, write_dump


@pytest.fixture
def recording(tmp_path) -> Path:
    flows = session(4) + [llm_flow(turn=5, status=413, answer=LIMIT_413)]
    for flow in flows:
        flow.request.path += f"?key={QUERY_SECRET}"
    return write_dump(tmp_path / "run.mitm", flows)
