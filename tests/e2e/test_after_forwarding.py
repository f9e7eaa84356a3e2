"""What the addon leaves for after forwarding runs once mitmproxy has sent the answer: a real mitmdump with the addon
and a probe script loaded after it, in front of the FakeProvider."""

from __future__ import annotations

import re
from collections.abc import Iterator

import orjson
import pytest

from trimflow.testing import PATHS, FakeProvider

from ..helpers import wait_for
from .helpers import Proxy, post, start_all, stop_all

pytestmark = pytest.mark.e2e

# Loaded after trimflow: its response hook runs after the metrics addon's. It watches the flow's metadata, where the
# addon writes the record, and says whether mitmproxy had finished the response hook (sent the answer) by then.
PROBE = """
import asyncio
import logging


class Watched(dict):
    def __init__(self, items, hook):
        super().__init__(items)
        self.hook = hook

    def __setitem__(self, key, value):
        if key == "trimflow" and key not in self:
            logging.getLogger("probe").warning("probe: record made, answer sent: %s", self.hook.done())
        super().__setitem__(key, value)


class Probe:
    def response(self, flow):
        flow.metadata = Watched(flow.metadata, asyncio.current_task())


addons = [Probe()]
"""
RECORD_MADE = re.compile(r"probe: record made, answer sent: (True|False)")


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory, provider: FakeProvider) -> Iterator[Proxy]:
    workdir = tmp_path_factory.mktemp("after-forwarding")
    probe = workdir / "probe.py"
    probe.write_text(PROBE)
    proxy = Proxy(workdir, "--mode", f"reverse:{provider.url}", "-s", str(probe), rules=None)
    start_all(proxy.mitm)
    yield proxy
    stop_all(proxy.mitm)


def test_a_request_needing_nothing_gets_its_record_after_its_answer_went(probed: Proxy, fresh: FakeProvider) -> None:
    # A coding agent's turn: text only, nothing to change. Its record and its turn (the conversation digest) are
    # worked out after mitmproxy sent the answer, not on the loop turn before it.
    body = {"model": "gpt-4o", "messages": [{"role": "system", "content": "You code."}, {"role": "user", "content": "Fix the test."}]}
    for turn in range(3):
        status, _ = post(probed.port, PATHS["openai-chat"], orjson.dumps(body))
        assert status == 200
        body["messages"] += [{"role": "assistant", "content": f"Step {turn}."}, {"role": "user", "content": "Go on."}]
    seen = wait_for(lambda: (found := RECORD_MADE.findall(probed.log())) and len(found) >= 3 and found, "the probe's three lines")
    assert seen == ["True"] * 3
    assert [r["turn"] for r in probed.settled_records()] == [1, 2, 3]
