from __future__ import annotations

import pytest
from mitmproxy.test import taddons

from ..helpers import TrimflowAddons
from .flows import write_rules


@pytest.fixture
def addon(tmp_path):
    """All of trimflow's addons in a taddons context, on rules of 2 images; `.tctx` is the context."""
    instance = TrimflowAddons()
    with taddons.context(instance) as tctx:
        tctx.configure(instance, trimflow_rules=str(write_rules(tmp_path / "rules.yaml", 2)))
        instance.tctx = tctx
        yield instance
        instance.done()  # as mitmproxy at exit: the metrics file and the conversations file closed
