"""formats.bedrock (Converse): a placeholder inside a toolResult keeps its neighbours, and new bytes change the
block's format name."""

from __future__ import annotations

from trimflow.formats import FORMATS
from trimflow.testing import b64

from .cases import CASES, JPEG

BEDROCK = FORMATS["bedrock-converse"]
NEW = b64(JPEG)


def test_a_placeholder_inside_a_tool_result_keeps_its_neighbours() -> None:
    body, _ = CASES["bedrock-converse"]
    out = BEDROCK.replace_media(body, {("messages", 2, "content", 0, "toolResult", "content", 0): "[gone]"})
    assert out["messages"][2]["content"][0]["toolResult"]["content"] == [{"text": "[gone]"}, {"text": "ok"}]


def test_new_bytes_change_the_format_name() -> None:
    bed = {"messages": [{"role": "user", "content": [{"image": {"format": "png", "source": {"bytes": "AAAA"}}}]}]}
    out = BEDROCK.replace_data(bed, {("messages", 0, "content", 0): (NEW, "image/jpeg")})
    assert out["messages"][0]["content"][0] == {"image": {"format": "jpeg", "source": {"bytes": NEW}}}
