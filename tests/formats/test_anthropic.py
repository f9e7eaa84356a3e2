"""formats.anthropic: a placeholder keeps cache_control and stays inside its tool_result, new bytes carry their
media_type, and Vertex and Bedrock invoke paths name the model."""

from __future__ import annotations

from trimflow.formats import FORMATS
from trimflow.testing import b64

from .cases import CASES, JPEG

ANTHROPIC = FORMATS["anthropic"]
NEW = b64(JPEG)


def test_the_placeholder_keeps_cache_control_and_stays_in_tool_result() -> None:
    body, _ = CASES["anthropic"]
    out = ANTHROPIC.replace_media(body, {("messages", 0, "content", 0): "[a]", ("messages", 2, "content", 0, "content", 1): "[b]"})
    assert out["messages"][0]["content"][0] == {"type": "text", "text": "[a]", "cache_control": {"type": "ephemeral"}}
    result = out["messages"][2]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "t1"
    assert result["content"][1] == {"type": "text", "text": "[b]"}


def test_new_bytes_carry_their_media_type_and_cache_control_survives() -> None:
    anth = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                        "cache_control": {"type": "ephemeral"},
                    },
                ],
            }
        ]
    }
    out = ANTHROPIC.replace_data(anth, {("messages", 0, "content", 0): (NEW, "image/jpeg")})
    assert out["messages"][0]["content"][0] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/jpeg", "data": NEW},
        "cache_control": {"type": "ephemeral"},
    }


def test_vertex_and_bedrock_invoke_paths_name_the_model_when_the_body_does_not() -> None:
    vertex = "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514:streamRawPredict"
    assert ANTHROPIC.model({"anthropic_version": "vertex-2023-10-16", "messages": []}, vertex) == "claude-sonnet-4@20250514"
    bedrock_invoke = "/model/us.anthropic.claude-3-7-sonnet-20250219-v1%3A0/invoke"
    assert ANTHROPIC.model({"messages": []}, bedrock_invoke) == "us.anthropic.claude-3-7-sonnet-20250219-v1:0"
