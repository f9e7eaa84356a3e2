"""formats.openai_chat: a placeholder is a text part, new bytes go in the data URL with the detail kept, and an
Azure deployment path names the model when the body does not."""

from __future__ import annotations

from trimflow.formats import FORMATS
from trimflow.testing import b64

from .cases import CASES, JPEG

CHAT = FORMATS["openai-chat"]
NEW = b64(JPEG)


def test_the_placeholder_is_a_text_part() -> None:
    body, _ = CASES["openai-chat"]
    out = CHAT.replace_media(body, {("messages", 1, "content", 1): "[gone]"})
    assert out["messages"][1]["content"] == [{"type": "text", "text": "look"}, {"type": "text", "text": "[gone]"}]
    assert out["messages"][0] is body["messages"][0]


def test_new_bytes_go_in_the_data_url_in_either_spelling_of_image_url() -> None:
    chat = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;name=a.png;base64,AAAA", "detail": "high"}},
                    {"type": "image_url", "image_url": "data:image/png;base64,AAAA"},
                ],
            }
        ]
    }
    paths = {("messages", 0, "content", 0): (NEW, "image/jpeg"), ("messages", 0, "content", 1): (NEW, "image/jpeg")}
    out = CHAT.replace_data(chat, paths)
    assert out["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + NEW, "detail": "high"}},
        {"type": "image_url", "image_url": "data:image/jpeg;base64," + NEW},
    ]


def test_an_azure_deployment_path_names_the_model_when_the_body_does_not() -> None:
    assert CHAT.model({"messages": []}, "/openai/deployments/dep1/chat/completions") == "dep1"
