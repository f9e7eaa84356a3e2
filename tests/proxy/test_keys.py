"""trimflow.proxy.keys: a Gemini `?key=` moves to the x-goog-api-key header."""

from __future__ import annotations

from mitmproxy.test import taddons

from trimflow import proxy
from trimflow._rules_file import RulesFile
from trimflow.testing import PATHS

from .flows import llm_flow, write_rules

GEMINI = "generativelanguage.googleapis.com"


def keys_on(tmp_path, extra: str = "") -> proxy.GeminiKeyHeader:
    """The keys addon alone, on a SharedState whose rules the prune addon would have set."""
    flows = proxy.SharedState()
    flows.rules = RulesFile(write_rules(tmp_path / "rules.yaml", 2, extra))
    return proxy.GeminiKeyHeader(flows)


def test_gemini_query_key_moves_to_its_header(tmp_path) -> None:
    keys = keys_on(tmp_path)
    with taddons.context(keys):
        flow = llm_flow("gemini", host=GEMINI, path=PATHS["gemini"] + "?alt=sse&key=AIzaSECRET")
        keys.requestheaders(flow)
        assert flow.request.headers["x-goog-api-key"] == "AIzaSECRET"
        assert "key" not in flow.request.query and flow.request.query["alt"] == "sse"
        same = llm_flow("gemini", path=PATHS["gemini"] + "?key=K", headers={"x-goog-api-key": "K"})
        keys.requestheaders(same)
        assert "key" not in same.request.query and same.request.headers["x-goog-api-key"] == "K"
        different = llm_flow("gemini", path=PATHS["gemini"] + "?key=Q", headers={"x-goog-api-key": "H"})
        keys.requestheaders(different)  # which key the provider would use is unknown: both stay
        assert different.request.query["key"] == "Q" and different.request.headers["x-goog-api-key"] == "H"
        other = llm_flow(path="/v1/chat/completions?key=kept")
        keys.requestheaders(other)
        assert other.request.query["key"] == "kept"


def test_the_format_comes_from_the_rules_endpoints(tmp_path) -> None:
    # A gateway path the built-in endpoints do not know, declared Gemini in the rules file.
    keys = keys_on(tmp_path, "endpoints:\n  - {path: /gw/generate, format: gemini}\n")
    with taddons.context(keys):
        flow = llm_flow("gemini", host="gateway.example.test", path="/gw/generate?key=GWKEY")
        keys.requestheaders(flow)
        assert flow.request.headers["x-goog-api-key"] == "GWKEY" and "key" not in flow.request.query
        fetch = llm_flow("gemini", host=GEMINI, path=PATHS["gemini"] + "?key=G")
        fetch.request.method = "GET"  # not an LLM request: left as it is
        keys.requestheaders(fetch)
        assert fetch.request.query["key"] == "G" and "x-goog-api-key" not in fetch.request.headers
