"""formats.openai_responses: a placeholder is input_text, in a tool's output too; a WebSocket response.create is
read at the top level or nested; new bytes go in the data URL with the detail kept."""

from __future__ import annotations

from trimflow.formats import FORMATS
from trimflow.testing import b64, data_url

from .cases import CASES, JPEG, PNG

RESPONSES = FORMATS["openai-responses"]
NEW = b64(JPEG)


def test_the_placeholder_is_input_text_in_tool_output_too() -> None:
    body, _ = CASES["openai-responses"]
    out = RESPONSES.replace_media(body, {("input", 2, "output", 1): "[gone]"})
    assert out["input"][2]["output"][1] == {"type": "input_text", "text": "[gone]"}
    assert out["input"][2]["call_id"] == "c1"


def test_a_custom_tools_screenshots_are_found_and_replaced_like_a_functions() -> None:
    """Codex returns screenshots from its JavaScript `exec` tool as a custom tool's output parts."""
    shot = {"type": "input_image", "image_url": data_url(PNG, "image/png")}
    body = {
        "model": "gpt-5.1-codex",
        "input": [
            {"type": "custom_tool_call", "call_id": "c1", "name": "exec", "input": "await screenshot()"},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "done"}, shot]},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": "plain text"},
        ],
    }
    assert [(m.kind, m.path) for m in RESPONSES.find_media(body)] == [("image", ("input", 1, "output", 1))]
    out = RESPONSES.replace_media(body, {("input", 1, "output", 1): "[gone]"})
    assert out["input"][1]["output"] == [{"type": "input_text", "text": "done"}, {"type": "input_text", "text": "[gone]"}]
    assert out["input"][2] == body["input"][2]


def test_websocket_response_create_is_read_at_top_level_or_nested() -> None:
    item = {"role": "user", "content": [{"type": "input_image", "image_url": data_url(PNG, "image/png")}]}
    flat = {"type": "response.create", "model": "gpt-5", "input": [item]}
    nested = {"type": "response.create", "response": {"model": "gpt-5", "input": [item]}}
    assert [m.path for m in RESPONSES.find_media(flat)] == [("input", 0, "content", 0)]
    assert [m.path for m in RESPONSES.find_media(nested)] == [("response", "input", 0, "content", 0)]
    out = RESPONSES.replace_media(nested, {("response", "input", 0, "content", 0): "[gone]"})
    assert out["response"]["input"][0]["content"][0]["type"] == "input_text"


def test_new_bytes_go_in_the_data_url_and_the_detail_stays() -> None:
    resp = {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}]}]}
    out = RESPONSES.replace_data(resp, {("input", 0, "content", 0): (NEW, "image/jpeg")})
    assert out["input"][0]["content"][0] == {"type": "input_image", "image_url": "data:image/jpeg;base64," + NEW, "detail": "low"}
