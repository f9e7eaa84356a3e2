"""trimflow.testing._replies: which wire format answers each path the fake provider serves, and which it refuses
(the replies themselves are checked against the real SDK clients in test_fake_provider.py)."""

from __future__ import annotations

import pytest

from trimflow._rules import builtin_rules
from trimflow.formats import ENDPOINTS, streamed_path
from trimflow.testing import PATHS
from trimflow.testing._replies import route


def test_route_table() -> None:
    assert route("/v1/chat/completions").fmt == "openai-chat"
    assert route("/openai/deployments/gpt4/chat/completions").fmt == "openai-chat"
    assert route("/backend-api/codex/responses").fmt == "openai-responses"
    assert route("/v1/messages").fmt == "anthropic"
    assert route("/v1/messages/count_tokens").fmt == "anthropic-count-tokens"
    r = route("/v1/projects/p/locations/l/publishers/anthropic/models/claude-x:rawPredict")
    assert (r.fmt, r.model, r.stream) == ("anthropic", "claude-x", None)
    r = route("/v1beta/models/gemini-2.5-pro:streamGenerateContent")
    assert (r.fmt, r.model, r.stream) == ("gemini", "gemini-2.5-pro", True)
    r = route("/model/us.anthropic.claude-v2%3A1/converse")
    assert (r.fmt, r.model) == ("bedrock-converse", "us.anthropic.claude-v2:1")
    assert route("/model/x/invoke").fmt == "anthropic"
    assert route("/api/chat").fmt == "ollama"
    assert route("/v1/models") is None
    assert route("/v1/threads/t1/messages") is None  # OpenAI Assistants: no built-in endpoint names it
    r = route("/model/x/invoke-with-response-stream")
    assert (r.fmt, r.stream) == ("anthropic", True) and "event-stream" in r.unsupported
    assert "compact" in route("/v1/responses/compact").unsupported
    assert route("/v1/responses").unsupported is None


@pytest.mark.parametrize("wire_format", sorted(PATHS))
def test_the_fake_answers_each_synthetic_path_in_its_format(wire_format: str) -> None:
    r = route(PATHS[wire_format])
    assert (r.fmt, r.unsupported) == (wire_format, None)
    assert builtin_rules().format_for("example.com", PATHS[wire_format]) == wire_format


@pytest.mark.parametrize(("glob", "fmt"), ENDPOINTS)
def test_the_fake_routes_every_builtin_endpoint(glob: str, fmt: str) -> None:
    path = glob.replace("*", "/v1/x", 1).replace("*", "m-1")
    r = route(path)
    assert r is not None and r.fmt in (fmt, f"{fmt}-count-tokens"), path  # Anthropic's token count has its own answer
    assert (r.stream is True) == streamed_path(path), path
